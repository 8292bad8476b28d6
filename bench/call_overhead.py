"""Per-call cost of wharf's Python edge: small gets and heads on file:// and s3://, get_many,
and one dataset-stream epoch, timed in one process. Run it against two builds (PYTHONPATH to
each one's python/ folder), alternated, to A/B a change of the edge (docs/benchmarks.md, "The
cost of interruptible calls").

    .venv/bin/python bench/call_overhead.py --s3 s3://BUCKET/overhead/ [--rounds 5]

Prints one JSON line: microseconds per call (medians of the rounds) and the module's path."""
import argparse
import json
import os
import statistics
import tempfile
import time

import wharf


def timed(fn, n):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--s3", help="an s3:// prefix to write 1,000 objects of 1 KiB under")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        local = wharf.Store(f"file://{tmp}/")
        keys = [f"o/{i:05d}" for i in range(2000)]
        for k in keys:
            local.put(k, os.urandom(1024))
        stores = [("file", local)]
        if args.s3:
            s3 = wharf.Store(args.s3)
            if not s3.list("o/"):
                for k in keys[:1000]:
                    s3.put(k, os.urandom(1024))
            stores.append(("s3", s3))
        index = wharf.SampleIndex.from_prefix(f"file://{tmp}/o/")
        for _ in range(args.rounds):
            for name, store in stores:
                ks = keys if name == "file" else keys[:1000]
                n = len(ks)
                results.setdefault(f"{name} get us", []).append(
                    timed(lambda: [store.get(k) for k in ks], n))
                results.setdefault(f"{name} head us", []).append(
                    timed(lambda: [store.head(k) for k in ks], n))
                results.setdefault(f"{name} get_many us/object", []).append(
                    timed(lambda: store.get_many(ks), n))
            results.setdefault("file stream us/sample", []).append(
                timed(lambda: sum(1 for _ in wharf.SampleStream(index, seed=0, epoch=0)), 2000))
    out = {k: round(statistics.median(v), 2) for k, v in results.items()}
    out["module"] = wharf._wharf.__file__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
