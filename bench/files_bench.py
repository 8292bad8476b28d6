#!/usr/bin/env python3
"""FILES: big single files read through format converters (issue 17, item 7).

    ./run bench --scenario FILES [--quick] [--delays 0,25] [--repeat 3]

Data, generated once per bucket and kept (s3://wharf-bench/files-v1/...):
  t.parquet  ~1 GiB (quick: ~128 MiB), 20 int64/float64 columns of random values, row groups
             of 256 Ki rows, written by pyarrow (snappy)
  t.csv      ~1 GiB (quick: ~128 MiB), 10 numeric columns and a text column, written by
             pyarrow.csv

Clients, each one fresh process per run, through the latency proxy at each delay:
  Parquet, 3 of 20 columns, the whole file into a pyarrow Table:
    wharf-open     pq.ParquetFile(wharf.open(uri)).read(columns)      (adaptive read-ahead)
    wharf-fsspec   pq.read_table(path, columns, filesystem=wharf.fsspec's s3 filesystem)
    wharf-rows     IterableDataset.from_files(uri, columns): row groups, coalesced ranged GETs
    s3fs           pq.read_table(path, columns, filesystem=s3fs.S3FileSystem(...))
    pyarrow-s3     pq.read_table(path, columns, filesystem=pyarrow.fs.S3FileSystem(...))
                   (Arrow's C++ S3 client, pre_buffer on, as read_table does by default)
  CSV, pandas.read_csv in chunks of 100,000 rows from each client's file object; the time
  spent inside the file object's read calls is the I/O wait, the rest is parse time:
    wharf-open, wharf-fsspec, s3fs, pyarrow-s3 (open_input_stream)
  Sequential read of the CSV object (the ">= 90% of wharf fetch" target):
    wharf-read     wharf.open(uri).read(): the whole object, one call
    wharf-fetch    `wharf fetch --json` of the object (the engine's own rate)

Reported per client: median seconds, MB/s of the file (Parquet: of the bytes a reader of those
columns must move), peak RSS, and for CSV the I/O wait and parse time; ratios against the best
peer in the same run.
"""
from __future__ import annotations

import io
import json
import os
import sys
import resource
import time
from pathlib import Path

import scenario

REPO = Path(__file__).resolve().parent.parent
PREFIX = "files-v1/"
COLUMNS = ["c1", "c7", "c13"]
MiB = 1 << 20
PARQUET_CLIENTS = ["wharf-open", "wharf-fsspec", "wharf-rows", "s3fs", "pyarrow-s3"]
CSV_CLIENTS = ["wharf-open", "wharf-fsspec", "s3fs", "pyarrow-s3"]
READ_CLIENTS = ["wharf-read", "wharf-fetch"]


# ---------------------------------------------------------------------------- the workers
def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _s3fs(endpoint):
    import s3fs
    return s3fs.S3FileSystem(endpoint_url=endpoint, key=os.environ["AWS_ACCESS_KEY_ID"],
                             secret=os.environ["AWS_SECRET_ACCESS_KEY"],
                             client_kwargs={"region_name": "us-east-1"})


def _arrow_s3(endpoint):
    from pyarrow import fs
    host = endpoint.split("://", 1)[1]
    return fs.S3FileSystem(endpoint_override=host, scheme="http", region="us-east-1",
                           access_key=os.environ["AWS_ACCESS_KEY_ID"],
                           secret_key=os.environ["AWS_SECRET_ACCESS_KEY"])


def _wharf_fs():
    from wharf.fsspec import WharfS3FileSystem
    return WharfS3FileSystem()


class _Timed(io.RawIOBase):
    """A file object's reads, timed: the I/O wait a parser sees."""

    def __init__(self, f):
        self._f, self.wait = f, 0.0

    def readable(self):
        return True

    def read(self, n=-1):
        t = time.perf_counter()
        b = self._f.read(n)
        self.wait += time.perf_counter() - t
        return b

    def readinto(self, b):
        t = time.perf_counter()
        n = self._f.readinto(b)
        self.wait += time.perf_counter() - t
        return n


def worker(spec: dict) -> dict:
    import importlib
    import pyarrow.parquet as pq
    for module in ("pandas", "s3fs", "wharf.fsspec", "wharf.torch"):
        importlib.import_module(module)  # imports are not what is measured: before the clock
    bucket, key, client, op = spec["bucket"], spec["key"], spec["client"], spec["op"]
    endpoint = os.environ["WHARF_S3_ENDPOINT"]
    uri, path = f"s3://{bucket}/{key}", f"{bucket}/{key}"
    t0 = time.perf_counter()
    out = {}
    if op == "parquet":
        if client == "wharf-open":
            import wharf
            with wharf.open(uri) as f:
                table = pq.ParquetFile(f).read(columns=COLUMNS)
                out["bytes_fetched"] = f.stats()["bytes_fetched"]
        elif client == "wharf-rows":
            import pyarrow as pa
            from wharf.torch import IterableDataset
            ds = IterableDataset.from_files(uri, columns=COLUMNS, shuffle=False,
                                            batch_rows=1 << 20)
            table = pa.Table.from_batches(list(ds))
            out["bytes_fetched"] = ds._ranges.stats()["bytes_fetched"]
        else:
            fs = {"wharf-fsspec": _wharf_fs, "s3fs": lambda: _s3fs(endpoint),
                  "pyarrow-s3": lambda: _arrow_s3(endpoint)}[client]()
            table = pq.read_table(path, columns=COLUMNS, filesystem=fs)
        out["rows"] = table.num_rows
    elif op == "csv":
        import pandas as pd
        if client == "wharf-open":
            import wharf
            f = wharf.open(uri)
        elif client == "pyarrow-s3":
            f = _arrow_s3(endpoint).open_input_stream(path)
        else:
            fs = _wharf_fs() if client == "wharf-fsspec" else _s3fs(endpoint)
            f = fs.open(path, "rb")
        timed = _Timed(f)
        rows = 0
        for chunk in pd.read_csv(timed, chunksize=100_000):
            rows += len(chunk)
        f.close()
        out.update(rows=rows, io_wait_s=timed.wait)
    elif op == "read":
        import wharf
        with wharf.open(uri) as f:
            n = len(f.read())  # one read() of the whole object, as the target says
        out["bytes"] = n
    else:
        raise SystemExit(f"unknown op {op}")
    out.update(wall_s=time.perf_counter() - t0, maxrss_mib=_maxrss_mib())
    return out


# ---------------------------------------------------------------------------- the driver
def _generate(rb, server, quick: bool) -> dict:
    """The two files, made once per size and kept; returns their keys and sizes."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    import numpy as np
    import tempfile
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError
    s3 = rb.boto3_client(server)
    try:
        s3.create_bucket(Bucket=rb.BUCKET)
    except ClientError:
        pass  # it exists
    size = "128M" if quick else "1G"
    keys = {"parquet": f"{PREFIX}{size}/t.parquet", "csv": f"{PREFIX}{size}/t.csv"}
    target = (128 if quick else 1024) * MiB
    sizes = {}
    for kind, key in keys.items():
        try:
            sizes[kind] = s3.head_object(Bucket=rb.BUCKET, Key=key)["ContentLength"]
            continue
        except ClientError:
            pass
        rng = np.random.default_rng(17)
        t0 = time.time()
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as d:
            local = Path(d) / kind
            if kind == "parquet":
                rows = 256 << 10  # one row group per write
                schema = pa.schema([(f"c{i}", pa.int64() if i % 2 else pa.float64())
                                    for i in range(20)])
                with pq.ParquetWriter(local, schema) as w:
                    written = 0
                    while written < target:
                        cols = [pa.array(rng.integers(0, 1 << 62, rows)) if i % 2
                                else pa.array(rng.random(rows)) for i in range(20)]
                        w.write_table(pa.Table.from_arrays(cols, schema=schema),
                                      row_group_size=rows)
                        written += rows * 20 * 8  # random values: snappy keeps them whole
            else:
                rows = 200_000
                with pcsv.CSVWriter(local, pa.schema(
                        [(f"n{i}", pa.int64() if i % 2 else pa.float64()) for i in range(10)]
                        + [("text", pa.string())])) as w:
                    while not local.exists() or local.stat().st_size < target:
                        cols = [pa.array(rng.integers(0, 1 << 40, rows)) if i % 2
                                else pa.array(np.round(rng.random(rows) * 1e6, 3))
                                for i in range(10)]
                        cols.append(pa.array([f"row {j}, \"q\"" if j % 50 == 0 else f"t{j}"
                                              for j in range(rows)]))
                        w.write_batch(pa.RecordBatch.from_arrays(
                            cols, names=[f"n{i}" for i in range(10)] + ["text"]))
            s3.upload_file(str(local), rb.BUCKET, key, Config=TransferConfig(
                multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB, max_concurrency=4))
            sizes[kind] = local.stat().st_size
        rb.log(f"FILES: generated and uploaded {key} ({sizes[kind] / MiB:.0f} MiB) in "
               f"{time.time() - t0:.0f} s")
    return {"keys": keys, "sizes": sizes}


def _env(server, endpoint: str) -> dict:
    env = dict(os.environ)
    env.update(server.env)
    env.update(AWS_ENDPOINT_URL=endpoint, WHARF_S3_ENDPOINT=endpoint,
               AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO / "python"))
    env.setdefault("AWS_REGION", "us-east-1")
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(k, None)
    return env


def _fetch(rb, a, env, uri: str) -> dict:
    m = rb.run_measured([a.wharf, "fetch", "--json", uri], env, a.timeout)
    if m.rc != 0 or m.timed_out:
        return {"status": "failed", "error": [(m.stderr.strip() or f"exit {m.rc}")[-300:]]}
    j = rb.parse_json_line(m.stdout)
    return {"status": "ok", "wall_s": m.wall, "engine_s": float(j["seconds"]),
            "bytes": int(j["bytes"]), "maxrss_mib": m.maxrss_kib / 1024}


def run(rb, a, server, proxy_bin, avail: dict, results: list) -> list[str]:
    delays = [float(x) for x in a.delays.split(",")] if a.delays else [0.0, 25.0]
    data = _generate(rb, server, a.quick)
    results.append({"scenario": "FILES", "part": "data", **data})
    parts = set(filter(None, a.files_parts.split(",")))
    plan = ([("parquet", c) for c in PARQUET_CLIENTS if "parquet" in parts]
            + [("csv", c) for c in CSV_CLIENTS if "csv" in parts]
            + [("read", c) for c in READ_CLIENTS if "read" in parts])
    script = Path(__file__).resolve()
    for delay in delays:
        with rb.Proxy(proxy_bin, server.endpoint, delay, a.proxy_arg) as proxy:
            env = _env(server, proxy.url)
            rb.log(f"FILES at {delay:g} ms through {proxy.url}")
            for rnd in range(a.repeat):
                k = rnd % len(plan)
                for op, client in plan[k:] + plan[:k]:  # rotated: no client always first
                    key = data["keys"]["parquet" if op == "parquet" else "csv"]
                    if client == "wharf-fetch":
                        r = _fetch(rb, a, env, f"s3://{rb.BUCKET}/{key}")
                    else:
                        r = scenario.run_worker(rb.VENV_PY, script, {
                            "op": op, "client": client, "bucket": rb.BUCKET, "key": key},
                            env, a.timeout, cwd=REPO)
                    r.update(scenario="FILES", part=op, client=client, delay_ms=delay,
                             round=rnd)
                    results.append(r)
                    rb.log(f"  FILES {op} {client}: " + (
                        f"{r['wall_s']:.2f} s, RSS {r.get('maxrss_mib', 0):.0f} MiB"
                        if r["status"] == "ok" else f"{r['status']} {r.get('error')}"))
    section = render(results)
    print("\n" + section, flush=True)
    return [section]


def render(results: list) -> str:
    rs = [r for r in results if r.get("scenario") == "FILES"]
    data = next((r for r in rs if r.get("part") == "data"), None)
    if data is None:
        return "### FILES\n\nno data\n"
    sizes = data["sizes"]
    out = ["### FILES: big files through format converters\n",
           f"Parquet {sizes['parquet'] / MiB:.0f} MiB (3 of 20 columns read), CSV "
           f"{sizes['csv'] / MiB:.0f} MiB (pandas.read_csv, chunks of 100,000 rows). "
           "Medians of each client's runs; ratio = best peer's time / this client's "
           "(> 1: faster than every peer).\n"]
    for delay in sorted({r["delay_ms"] for r in rs if "delay_ms" in r}):
        for part, clients, title in (("parquet", PARQUET_CLIENTS, "Parquet, 3 of 20 columns"),
                                     ("csv", CSV_CLIENTS, "CSV in chunks"),
                                     ("read", READ_CLIENTS, "sequential read of the CSV")):
            per = {c: [r for r in rs if r.get("part") == part and r.get("client") == c
                       and r.get("delay_ms") == delay] for c in clients}
            if not any(per.values()):
                continue  # a part this run left out (--files-parts)
            med = {c: scenario.median_ok(v, "wall_s") for c, v in per.items()}
            peers = [t for c, t in med.items() if t and not c.startswith("wharf")]
            best_peer = min(peers) if peers else None
            mb = sizes["csv" if part != "parquet" else "parquet"] / 1e6
            out.append(f"\n**{title}, {delay:g} ms each way**\n")
            head = "| client | s | MB/s of file | peak RSS MiB |"
            if part == "csv":
                head += " I/O wait s | parse s |"
            if part == "parquet":
                head += " bytes fetched MB |"
            if part != "read":
                head += " vs best peer |"
            out.append(head)
            out.append("|" + "---|" * (head.count("|") - 1))
            for c in clients:
                t = med[c]
                if t is None:
                    err = next((r.get("error") for r in per[c] if r.get("status") != "ok"),
                               "not run")
                    out.append(f"| {c} | {err} |")
                    continue
                row = (f"| {c} | {t:.2f} | {mb / t:.0f} | "
                       f"{scenario.median_ok(per[c], 'maxrss_mib'):.0f} |")
                if part == "csv":
                    w = scenario.median_ok(per[c], "io_wait_s") or 0.0
                    row += f" {w:.2f} | {t - w:.2f} |"
                if part == "parquet":
                    f = scenario.median_ok(per[c], "bytes_fetched")
                    row += f" {f / 1e6:.0f} |" if f else " - |"
                if part != "read":
                    row += f" {best_peer / t:.2f}x |" if best_peer else " - |"
                out.append(row)
            if part == "read" and med.get("wharf-read") and med.get("wharf-fetch"):
                out.append(f"\nwharf.open read() rate / wharf fetch rate: "
                           f"{med['wharf-fetch'] / med['wharf-read']:.2f} (target >= 0.90; "
                           "fetch timed as its whole process, as read is)\n")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        # The result first, then out without the interpreter's shutdown: pyarrow reading a
        # Python file object (any fsspec filesystem: s3fs and wharf.fsspec alike) may release
        # a buffer on one of its I/O threads while the interpreter exits, which aborts the
        # process ("terminate called without an active exception") after the work is done.
        print(json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
        os._exit(0)
    scenario.main(worker, render, "FILES", "files_bench.py")
