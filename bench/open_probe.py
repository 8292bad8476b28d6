"""Latency of opening and reading small objects one at a time: `wharf.open(uri).read()`
against one `Store.get` of the same object (the floor: one round trip), through an endpoint
of the caller's (a latency proxy in front of the S3 server); then `Store.get_many` of the
same objects by key and by their listed entries (obj/s, and the store requests each took).
Writes N objects of 100 KiB under URI first.

  build/tools/latency_proxy/wharf-latency-proxy --listen 127.0.0.1:17999 \\
      --upstream 127.0.0.1:17080 --delay-ms 25 &
  AWS_ENDPOINT_URL=http://127.0.0.1:17999 .venv/bin/python bench/open_probe.py s3://BUCKET/open-probe/
"""
import argparse
import os
import statistics
import time

import wharf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("uri", help="a prefix to write the objects under, ending in /")
    ap.add_argument("-n", type=int, default=100, help="objects (default 100)")
    ap.add_argument("--size", type=int, default=100 << 10, help="bytes each (default 100 KiB)")
    args = ap.parse_args()
    store = wharf.Store(args.uri)
    keys = [f"o{i:05d}.bin" for i in range(args.n)]
    for k in keys:
        store.put(k, os.urandom(args.size))

    def timed(read) -> float:
        times = []
        for k in keys:
            t = time.perf_counter()
            data = read(k)
            times.append(time.perf_counter() - t)
            assert len(data) == args.size, k
        return statistics.median(times) * 1e3

    def via_open(k: str) -> bytes:
        with wharf.open(args.uri + k) as f:
            return f.read()

    opened = timed(via_open)
    got = timed(store.get)
    print(f"{args.n} objects of {args.size:,} B, one at a time: wharf.open().read() median "
          f"{opened:.1f} ms, Store.get median {got:.1f} ms ({opened / got:.2f}x)")

    def requests() -> dict:
        out = {}
        for k, v in wharf.metrics()["counters"].items():
            if k.startswith("wharf_store_requests_total{"):
                op = k.split('op="')[1].split('"')[0]
                out[op] = out.get(op, 0) + v
        return out

    listed = store.list()
    for name, items in (("keys", keys), ("listed entries", listed)):
        before = requests()
        t = time.perf_counter()
        bufs = store.get_many(items)
        seconds = time.perf_counter() - t
        assert all(len(b) == args.size for b in bufs)
        after = requests()
        spent = {op: after[op] - before.get(op, 0) for op in after if after[op] != before.get(op, 0)}
        print(f"get_many of {len(items)} {name}: {len(items) / seconds:,.0f} obj/s, requests {spent}")


if __name__ == "__main__":
    main()
