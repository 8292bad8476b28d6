#!/usr/bin/env python3
"""GCS: one DataLoader epoch over many small objects on gs://, wharf against Dataflux (issue 16).

Usage (from the repository root, after ./run setup, ./run build and the bench requirements):

    .venv/bin/python bench/gcs_bench.py [--quick] [--objects N] [--delay-ms 25] [--repeat 3]
    ./run bench --scenario GCS [--quick]            (the same, through run_bench.py)

The server is the GCS emulator (scripts/gcs-server, gcp-storage-emulator) on its own port and
base dir, behind the latency proxy (tools/latency_proxy) at --delay-ms each way, so every
request pays a round trip as on a remote store. The emulator is one single-threaded Python
process whose writes get slower as it holds more objects: absolute numbers say little, so the
table counts the requests each loader sent (from the emulator's request log) as well as time.

Data: --objects (default 4,000; quick 1,000) objects of 10 KiB under gs://wharf-bench-gcs/e/,
uploaded once per run with google-cloud-storage straight to the emulator.

Loaders, each in its own process, one epoch (listing included), batches of 32, num_workers=0:
  wharf           wharf.torch.IterableDataset.from_prefix, WHARF_GS_COMPOSE=off
  wharf-composed  the same with WHARF_GS_COMPOSE=on: 32 objects composed on the server, one GET
  dataflux        gcs-torch-dataflux 1.4.0 DataFluxMapStyleDataset (its composed download,
                  __getitems__ per batch), Google's Dataflux, the seed's system
  gcsfs           a map-style dataset whose __getitems__ is gcsfs's cat() of the batch's paths
                  (fsspec's concurrent async reads), the common fsspec recipe
Each loader runs --repeat times (interleaved); medians are reported, with peak RSS and the
requests per kind: object GETs (alt=media), compose calls, listings, deletes.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv" / "bin" / "python"
BUCKET = "wharf-bench-gcs"
PREFIX = "e/"
OBJECT_BYTES = 10 << 10
BATCH = 32
PROJECT = "wharf-bench"
LOADERS = ["wharf", "wharf-composed", "dataflux", "gcsfs"]


# ---------------------------------------------------------------- one epoch (a subprocess)

def worker(spec: dict) -> dict:
    import resource

    import torch.utils.data as tud

    name, uri = spec["loader"], f"gs://{BUCKET}/{PREFIX}"
    start = time.perf_counter()
    samples = nbytes = 0
    if name.startswith("wharf"):
        import wharf.torch
        ds = wharf.torch.IterableDataset.from_prefix(uri)
        loader = tud.DataLoader(ds, batch_size=BATCH, num_workers=0, collate_fn=lambda b: b)
        for batch in loader:
            samples += len(batch)
            nbytes += sum(len(memoryview(s.data)) for s in batch)
    elif name == "dataflux":
        from dataflux_pytorch import dataflux_mapstyle_dataset as dfm
        ds = dfm.DataFluxMapStyleDataset(
            project_name=PROJECT, bucket_name=BUCKET,
            config=dfm.Config(prefix=PREFIX, num_processes=1, sort_listing_results=True))
        loader = tud.DataLoader(ds, batch_size=BATCH, num_workers=0, collate_fn=lambda b: b)
        for batch in loader:
            samples += len(batch)
            nbytes += sum(len(s) for s in batch)
    elif name == "gcsfs":
        import gcsfs
        fs = gcsfs.GCSFileSystem(project=PROJECT, token="anon",
                                 endpoint_url=os.environ["STORAGE_EMULATOR_HOST"])
        paths = sorted(fs.find(f"{BUCKET}/{PREFIX}"))

        class Files(tud.Dataset):
            def __len__(self):
                return len(paths)

            def __getitem__(self, i):
                return fs.cat_file(paths[i])

            def __getitems__(self, idx):
                got = fs.cat([paths[i] for i in idx])
                return [got[paths[i]] for i in idx]

        loader = tud.DataLoader(Files(), batch_size=BATCH, num_workers=0,
                                collate_fn=lambda b: b)
        for batch in loader:
            samples += len(batch)
            nbytes += sum(len(s) for s in batch)
    else:
        raise SystemExit(f"unknown loader {name}")
    seconds = time.perf_counter() - start
    return {"loader": name, "seconds": seconds, "samples": samples, "bytes": nbytes,
            "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ---------------------------------------------------------------- the driver

def sh(argv, env=None, timeout=120):
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          check=True).stdout


class Emulator:
    """scripts/gcs-server on its own port and base dir; counts requests from its log."""

    def __init__(self, port: int):
        self.base = Path(tempfile.mkdtemp(prefix="wharf-bench-gcs-"))
        self.env = dict(os.environ, WHARF_GCS_BASE=str(self.base), WHARF_GCS_PORT=str(port),
                        WHARF_GCS_QUIET="0")
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self):
        sh([str(REPO / "scripts" / "gcs-server"), "start"], env=self.env)
        return self

    def __exit__(self, *exc):
        subprocess.run([str(REPO / "scripts" / "gcs-server"), "stop"], env=self.env,
                       capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)

    def log_lines(self) -> list[str]:
        return (self.base / "log" / "gcs.log").read_text(errors="replace").splitlines()

    @staticmethod
    def count(lines: list[str]) -> dict:
        kinds = {"get": 0, "compose": 0, "list": 0, "delete": 0, "other": 0}
        for line in lines:
            m = re.match(r'"(GET|POST|PUT|DELETE|PATCH) (\S+) HTTP', line)
            if not m:
                continue
            method, path = m.groups()
            if method == "GET" and "alt=media" in path or path.startswith("/download/"):
                kinds["get"] += 1
            elif method == "POST" and "/compose" in path:
                kinds["compose"] += 1
            elif method == "GET" and re.search(r"/o(\?|$)", path):
                kinds["list"] += 1
            elif method == "DELETE":
                kinds["delete"] += 1
            else:
                kinds["other"] += 1
        return kinds


class Proxy:
    def __init__(self, upstream: str, delay_ms: float):
        binary = REPO / "build" / "tools" / "latency_proxy" / "wharf-latency-proxy"
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: ./run build")
        self.p = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0", "--upstream",
             upstream.split("://", 1)[1], "--delay-ms", f"{delay_ms:g}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.p.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise SystemExit(f"latency proxy: {line}")
        self.url = "http://" + line.split()[-1]

    def stop(self):
        self.p.terminate()
        self.p.wait(10)


def upload(emulator_url: str, n: int) -> None:
    os.environ["STORAGE_EMULATOR_HOST"] = emulator_url
    from google.cloud import storage
    client = storage.Client(project=PROJECT)
    bucket = client.create_bucket(BUCKET)
    payload = os.urandom(OBJECT_BYTES)

    def put(i):
        bucket.blob(f"{PREFIX}{i:06d}.bin").upload_from_string(payload[i % 256:] +
                                                               payload[:i % 256])
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(n)))


def run_loader(name: str, proxy_url: str, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WHARF_GS_", "GOOGLE_APPLICATION"))}
    env.update(STORAGE_EMULATOR_HOST=proxy_url, GOOGLE_CLOUD_PROJECT=PROJECT,
               PYTHONPATH=str(REPO / "python"))
    if name.startswith("wharf"):
        env["WHARF_GS_COMPOSE"] = "on" if name == "wharf-composed" else "off"
    if name == "gcsfs":
        # gcsfs 2026.10 first asks the gRPC storage-control API for the bucket's type (TLS, 60 s
        # timeout per try against an emulator); its documented switch turns that off.
        env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    spec = json.dumps({"loader": name})
    proc = subprocess.run([str(VENV_PY), __file__, "--worker", spec], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        return {"loader": name, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(results: list[dict], n: int, delay: float) -> str:
    by = {}
    for r in results:
        by.setdefault(r["loader"], []).append(r)
    ok = {k: [r for r in v if "error" not in r] for k, v in by.items()}
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in ok.items() if v}
    out = [f"{n:,} x 10 KiB objects on the GCS emulator through the latency proxy at "
           f"{delay:g} ms each way; one epoch (listing included), batches of {BATCH}; "
           f"median of {max(len(v) for v in by.values())} runs.", "",
           "| loader | epoch s | samples/s | vs dataflux | object GETs | composes | listings "
           "| deletes | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for name in LOADERS:
        runs = ok.get(name, [])
        if not runs:
            errs = [r.get("error") for r in by.get(name, [])]
            out.append(f"| {name} | failed: {errs[:1]} | | | | | | | |")
            continue
        last = runs[len(runs) // 2]
        req = last.get("requests", {})
        ratio = (med["dataflux"] / med[name]) if "dataflux" in med else float("nan")
        out.append(f"| {name} | {med[name]:.2f} | {n / med[name]:,.0f} | {ratio:.2f}x "
                   f"| {req.get('get', 0)} | {req.get('compose', 0)} | {req.get('list', 0)} "
                   f"| {req.get('delete', 0)} | {last['rss_peak'] / 2**20:,.0f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--objects", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=25.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--port", type=int, default=27480)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=str(REPO / "bench-results"))
    a = ap.parse_args(argv)
    n = a.objects or (1000 if a.quick else 4000)
    loaders = a.loaders.split(",")
    results = []
    with Emulator(a.port) as emu:
        t0 = time.perf_counter()
        upload(emu.url, n)
        print(f"uploaded {n} objects in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        proxy = Proxy(emu.url, a.delay_ms)
        try:
            for rep in range(a.repeat):
                for name in loaders:
                    before = len(emu.log_lines())
                    r = run_loader(name, proxy.url, a.timeout)
                    r["requests"] = Emulator.count(emu.log_lines()[before:])
                    r["repeat"] = rep
                    if "error" not in r and r["samples"] != n:
                        r["error"] = f"{r['samples']} samples, expected {n}"
                    print(json.dumps(r), file=sys.stderr)
                    results.append(r)
            # Listing: the emulator ignores startOffset/endOffset and page tokens, so a
            # work-stealing listing costs it more, not less; report requests and check the
            # result (the bounds are tested on canned responses, gcs_json_store_test).
            listing = []
            wharf_bin = str(REPO / "build" / "wharf")
            env = {k: v for k, v in os.environ.items() if not k.startswith("WHARF_GS_")}
            env.update(STORAGE_EMULATOR_HOST=proxy.url, GOOGLE_CLOUD_PROJECT=PROJECT)
            for parallel in (None, 8):
                before = len(emu.log_lines())
                argv = [wharf_bin, "ls", "-r", f"gs://{BUCKET}/{PREFIX}"]
                argv += ["--parallel", str(parallel)] if parallel else []
                t0 = time.perf_counter()
                out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
                listing.append({"parallel": parallel or 1, "seconds": time.perf_counter() - t0,
                                "keys": len(out.stdout.splitlines()),
                                "list_requests": Emulator.count(emu.log_lines()[before:])["list"]})
        finally:
            proxy.stop()
        # Litter: objects outside the data set that the loaders' runs left behind.
        from google.cloud import storage
        left = [b.name for b in storage.Client(project=PROJECT).list_blobs(BUCKET)
                if not b.name.startswith(PREFIX)]
    table = render(results, n, a.delay_ms)
    table += "\n\n| wharf ls -r | keys | list requests | s |\n|---|---|---|---|\n"
    table += "\n".join(f"| --parallel {r['parallel']} | {r['keys']} | {r['list_requests']} | "
                       f"{r['seconds']:.2f} |" for r in listing)
    table += f"\n\nObjects left in the bucket outside the data set after all runs: {len(left)}"
    if left:
        table += f" (e.g. {left[:3]})"
    print(table)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    (out / f"gcs-{stamp}.json").write_text(json.dumps({"results": results, "listing": listing,
                                                       "objects": n,
                                                       "delay_ms": a.delay_ms}, indent=1))
    (out / f"gcs-{stamp}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
