#!/usr/bin/env python3
"""Training-loop benchmark: accelerator utilization of PyTorch data loaders over S3.

Usage (from the repository root, after ./run setup, ./run build and the bench requirements):

    .venv/bin/python bench/train_bench.py [--quick] [--delay-ms 25] [--out bench-results/]
                                          [--loaders a,b,...] [--compute-ms 200,100,...]
                                          [--search bisect|all] [--batches N]
    ./run bench --scenario TRAIN [--quick]          (the same, through run_bench.py)

What it simulates (as DLIO / MLPerf Storage do)
-----------------------------------------------
A training loop over a torch DataLoader (batch 64) where every batch "computes" for a fixed
time (sleep). Accelerator utilization AU = compute time / wall time. A demand point is a
compute time per batch, i.e. a demand of batch/compute samples/s; a loader sustains it when
AU >= 90% (--au-target). Per loader the benchmark reports the highest demand sustained.

Loaders (bench/train_peer.py, one subprocess per run; --loaders picks; * = default):
  * wharf-iter       wharf.torch.IterableDataset.from_prefix(shuffle, seed), num_workers=0
                     (the engine reads in parallel in-process)
  * wharf-iter-w2    the same, num_workers=2
  * wharf-map        wharf.torch.MapDataset + wharf's DistributedSampler, num_workers=0: the
                     sampler gives the dataset its order, so it reads ahead of the loop
  * wharf-map-w8     the same, num_workers=8 (the boto3 / s3torch settings)
  * boto3-map-w8     the common recipe: map-style Dataset whose __getitem__ does
                     get_object()['Body'].read(), one boto3 client per worker (lazy), 8 workers
  * s3torch-map-w8   s3torchconnector S3MapDataset (S3ClientConfig(force_path_style)), 8 workers
  * wharf-tar        IterableDataset.from_shards(format="tar", shuffle, seed, shuffle_buffer=1000)
                     over tar shards of the same samples, num_workers=0
    wharf-iter-p64, wharf-iter-p256 (read-ahead other than the default), wharf-map-w2,
    wharf-tar-w2, boto3-map-w16, s3torch-map-w16  (variants)
Every loader yields (keys, uint8 tensor [64, 102400]): the same collate function stacks the
samples (one copy, in shared memory when a worker runs it, as default_collate does).

Data: the I/O benchmark's S1 set (10,000 x 100 KiB, s3://wharf-bench/s1/, generated with
boto3 when missing) and tar shards of exactly those samples (--tar-shards 100 shards of 100
members <stem>.bin under s1-tar/, built once from the S1 objects and rebuilt when S1 changes:
s1-tar/source.json holds a digest of S1's keys and ETags). Server: scripts/s3-server with
WHARF_S3_PORT=27080 and WHARF_S3_BASE=<repo>/.wharf/bench-s3 unless the environment says
otherwise (what ./run bench uses); started if not running and then stopped at the end
(--keep-server leaves it). Every client goes through wharf-latency-proxy at --delay-ms each way.

Procedure per loader
--------------------
1. An unthrottled run (compute 0): the loader's delivered samples/s (its supply).
2. The demand grid (--compute-ms, default 800 ms down to ~5 ms in steps of 2^(1/4), i.e.
   ~19% apart; demand = 64 / compute) is searched for the highest demand with AU >= 90%:
   --search bisect (default) first tries the highest point at or below 0.9 x the unthrottled
   rate, walks up while it passes, else bisects below it (AU falls as demand rises), so the
   answer is bracketed by a pass and the next grid point's fail; --search all runs the grid
   from high compute to low until two points in a row fail.
3. Runs per point: W warm-up batches + ceil(8 s / compute) measured batches, clamped to
   [24, 50] (50 unthrottled; --quick: 3 s, [10, 20]; --batches N fixes the measured part).
   W = 2 x num_workers (at least 1): what DataLoader workers (prefetch_factor 2) can bank
   while the first batch is awaited. AU is the steady state over the measured batches (see
   train_peer.py); the time to the first batch is reported as TTFB and the AU of the whole
   run, start-up included, as "AU epoch".
A run that read fewer samples or bytes than asked, repeated a key, exited non-zero or timed
out is FAILED and counts as no throughput.

Reference: `build/wharf fetch -r --json s3://wharf-bench/s1/` through the same proxy once: the
engine's raw small-object throughput (objects/s); "% raw" = sustained samples/s / that.

Measured per run (run_bench.run_measured): CPU s of the process tree (imports subtracted),
peak RSS (ru_maxrss of the largest process, GNU time) and tree PSS (sampled peak of the summed
PSS of the tree; DataLoader workers share pages with their parent), server and proxy CPU.

Output: a markdown table per loader and a summary table, printed and written to
OUT/train-<timestamp>.md, raw results in OUT/train-<timestamp>.json.
Exit status: 0 when every run passed verification, 1 when any FAILED, 2 on setup errors.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import hashlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench as rb  # noqa: E402

REPO, BENCH, VENV_PY, BUCKET, MiB = rb.REPO, rb.BENCH, rb.VENV_PY, rb.BUCKET, rb.MiB
TAR_PREFIX = "s1-tar/"
DEFAULT_GRID = [round(800 * 2 ** (-k / 4), 1) for k in range(30)]  # 800 .. 5.3 ms


@dataclass
class Loader:
    name: str
    kind: str  # train_peer.py --loader
    workers: int
    tar: bool = False
    extra: list[str] = field(default_factory=list)
    default: bool = True


LOADERS = [
    Loader("wharf-iter", "wharf-iter", 0),
    Loader("wharf-iter-w2", "wharf-iter", 2),
    Loader("wharf-map", "wharf-map", 0),
    Loader("wharf-map-w8", "wharf-map", 8),
    Loader("boto3-map-w8", "boto3-map", 8),
    Loader("s3torch-map-w8", "s3torch-map", 8),
    Loader("wharf-tar", "wharf-tar", 0, tar=True),
    Loader("wharf-iter-p64", "wharf-iter", 0, extra=["--prefetch", "64"], default=False),
    Loader("wharf-iter-p256", "wharf-iter", 0, extra=["--prefetch", "256"], default=False),
    Loader("wharf-map-w2", "wharf-map", 2, default=False),
    Loader("wharf-tar-w2", "wharf-tar", 2, tar=True, default=False),
    Loader("boto3-map-w16", "boto3-map", 16, default=False),
    Loader("s3torch-map-w16", "s3torch-map", 16, default=False),
]
BOTO3_REF, S3TORCH_REF = "boto3-map-w8", "s3torch-map-w8"


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- tar shards
def list_with_etags(client, prefix: str) -> dict[str, tuple[int, str]]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = (o["Size"], o["ETag"])
    return out


def member_name(key: str) -> str:
    return Path(key).stem + ".bin"  # s1/shard-07/obj-00042.bin -> obj-00042.bin (key obj-00042)


def build_tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def ensure_tar_shards(server: rb.Server, objects: dict[str, int], nshards: int) -> list[str]:
    """Tar shards of exactly the S1 objects (sorted keys, consecutive groups); returns keys."""
    client = rb.boto3_client(server)  # straight to RGW, not through the proxy
    s1 = list_with_etags(client, "s1/")
    keys = sorted(objects)
    if set(s1) != set(keys):
        raise rb.SetupError("S1 listing does not match the expected objects")
    per = math.ceil(len(keys) / nshards)
    digest = hashlib.sha256(json.dumps([[k, s1[k][1]] for k in keys]).encode()).hexdigest()
    want_shards = [f"{TAR_PREFIX}shard-{j:04d}.tar" for j in range(math.ceil(len(keys) / per))]
    source = {"source": "s1/", "objects": len(keys), "digest": digest,
              "per_shard": per, "shards": len(want_shards)}
    have = list_with_etags(client, TAR_PREFIX)
    try:
        cur = json.loads(client.get_object(Bucket=BUCKET, Key=TAR_PREFIX + "source.json")
                         ["Body"].read())
    except Exception:  # noqa: BLE001 - missing or unreadable: rebuild
        cur = None
    if cur == source and all(k in have for k in want_shards) and \
            len([k for k in have if k.endswith(".tar")]) == len(want_shards):
        log(f"tar shards present ({len(want_shards)} x {per} samples under {TAR_PREFIX})")
        return want_shards
    if have:
        log(f"deleting {len(have)} stale keys under {TAR_PREFIX}")
        old = list(have)
        for i in range(0, len(old), 1000):
            client.delete_objects(Bucket=BUCKET, Delete={
                "Objects": [{"Key": k} for k in old[i:i + 1000]], "Quiet": True})
    log(f"building {len(want_shards)} tar shards of {per} samples from s1/ ...")
    t0 = time.time()

    def get(k: str) -> bytes:
        data = client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
        if len(data) != objects[k]:
            raise rb.SetupError(f"{k}: read {len(data)} bytes, expected {objects[k]}")
        return data

    def shard(j: int) -> None:
        group = keys[j * per:(j + 1) * per]
        body = build_tar([(member_name(k), get(k)) for k in group])
        client.put_object(Bucket=BUCKET, Key=want_shards[j], Body=body)

    with cf.ThreadPoolExecutor(16) as pool:
        for j, _ in enumerate(pool.map(shard, range(len(want_shards))), 1):
            if j % 25 == 0:
                log(f"  {j}/{len(want_shards)} shards")
    client.put_object(Bucket=BUCKET, Key=TAR_PREFIX + "source.json",
                      Body=json.dumps(source).encode())
    log(f"tar shards uploaded in {time.time() - t0:.1f} s")
    return want_shards


# ----------------------------------------------------------------------------- runs
def warmup_for(ld: Loader) -> int:
    """Batches DataLoader workers can bank before the first is consumed (prefetch_factor 2)."""
    return max(1, 2 * ld.workers)


def batches_for(a, ld: Loader, compute_ms: float) -> int:
    """Warm-up + measured batches: ceil(target / compute) measured, clamped."""
    w = warmup_for(ld)
    if a.batches:
        return w + a.batches
    target, lo, hi = (3.0, 10, 20) if a.quick else (8.0, 24, 50)
    if compute_ms <= 0:
        return w + hi
    return w + max(lo, min(hi, math.ceil(target / (compute_ms / 1000))))


def run_point(a, ld: Loader, compute_ms: float, ctx: rb.Ctx, server: rb.Server,
              proxy: rb.Proxy) -> dict:
    n = batches_for(a, ld, compute_ms)
    w = warmup_for(ld)
    argv = [str(VENV_PY), str(BENCH / "train_peer.py"), "--loader", ld.kind,
            "--workers", str(ld.workers), "--endpoint", ctx.endpoint, "--bucket", BUCKET,
            "--prefix", TAR_PREFIX if ld.tar else "s1/", "--batch-size", str(a.batch_size),
            "--batches", str(n), "--warmup", str(w), "--compute-ms", f"{compute_ms:g}",
            "--seed", str(a.seed),
            "--expect-size", str(a._sample_size), *ld.extra]
    rec = {"loader": ld.name, "compute_ms": compute_ms, "batches_asked": n,
           "demand": a.batch_size / (compute_ms / 1000) if compute_ms > 0 else None,
           "expected_samples": n * a.batch_size, "load_before": os.getloadavg()[0]}
    s_cpu0, p_cpu0 = server.cpu(), proxy.cpu()
    # PSS sampled once a second, not every 0.2 s: reading smaps_rollup of ~10 torch processes
    # 5 times a second took ~15% of a core here, from the 2 the loader and server share.
    m = rb.run_measured(argv, ctx.base_env(), a.timeout, sample_every=1.0)
    rec.update(server_cpu_s=server.cpu() - s_cpu0, proxy_cpu_s=proxy.cpu() - p_cpu0,
               rc=m.rc, process_wall_s=m.wall, maxrss_mib=m.maxrss_kib / 1024,
               tree_rss_mib=m.tree_rss_peak / MiB, timed_out=m.timed_out)
    problems = []
    try:
        j = rb.parse_json_line(m.stdout)
        rec.update({k: v for k, v in j.items() if k not in ("loader",)})
        rec["cpu_s"] = max(0.0, m.cpu_user + m.cpu_sys - float(j.get("cpu_before_s", 0)))
        problems += j.get("problems", [])
    except ValueError as e:
        problems.append(f"unreadable output ({e})")
    if m.timed_out:
        problems.append(f"timed out after {a.timeout:.0f} s")
    if m.rc != 0 and not problems:
        problems.append(f"exit {m.rc}")
    if rec.get("samples") != n * a.batch_size and not any("samples" in p for p in problems):
        problems.append(f"read {rec.get('samples', 0)}/{n * a.batch_size} samples")
    rec["problems"] = problems
    rec["status"] = "FAILED" if problems else "ok"
    if problems:
        rec["stderr_tail"] = (m.stderr.strip() or m.stdout.strip())[-800:]
    else:
        rec["cpu_ms_per_sample"] = 1000 * rec["cpu_s"] / max(1, rec["samples"])
        if compute_ms > 0:
            rec["pass"] = rec["au"] >= a.au_target
    what = (f"AU {100 * rec['au']:.1f}% ({'pass' if rec['pass'] else 'fail'}), "
            if rec.get("pass") is not None else "")
    log(f"  {ld.name} compute {compute_ms:g} ms"
        + (f" (demand {rec['demand']:,.0f}/s)" if rec["demand"] else " (unthrottled)")
        + f", {n} batches: {rec['status']} "
        + (what + f"{rec['rate']:,.0f} samples/s, TTFB {rec['ttfb_s']:.2f} s, "
           f"RSS {rec['maxrss_mib']:.0f} MiB" if rec["status"] == "ok" else
           "; ".join(problems)))
    if problems and rec.get("stderr_tail"):
        log("    " + rec["stderr_tail"][-400:].replace("\n", "\n    "))
    return rec


def sweep(a, ld: Loader, ctx, server, proxy) -> dict:
    """Runs the unthrottled point and the demand search for one loader."""
    runs = [run_point(a, ld, 0.0, ctx, server, proxy)]
    base = runs[0]
    out = {"loader": ld.name, "kind": ld.kind, "workers": ld.workers, "extra": ld.extra,
           "runs": runs, "config": base.get("config")}
    if base["status"] != "ok":
        out["status"] = "FAILED"
        return out
    supply = base["rate"]
    grid = sorted(set(a._grid), reverse=True)  # compute ms, high to low = demand low to high
    demand = {c: a.batch_size / (c / 1000) for c in grid}
    results: dict[float, dict] = {}

    def probe(i: int) -> bool:
        c = grid[i]
        if c not in results:
            results[c] = run_point(a, ld, c, ctx, server, proxy)
            runs.append(results[c])
        r = results[c]
        return r["status"] == "ok" and bool(r.get("pass"))

    if a.search == "all":
        fails = 0
        for i in range(len(grid)):
            fails = 0 if probe(i) else fails + 1
            if fails == 2:
                break
    elif grid:
        # grid[i]: demand rises with i. Start at the highest demand <= 0.9 x the unthrottled
        # rate; walk up while it passes (the unthrottled run is no hard ceiling here: at
        # compute 0 the loop takes CPU the server needs), else bisect below (AU falls as
        # demand rises).
        start = max([i for i, c in enumerate(grid) if demand[c] <= 0.9 * supply] or [0])
        if probe(start):
            i = start
            while i + 1 < len(grid) and probe(i + 1):
                i += 1
        else:
            lo, hi = -1, start  # lo: highest index known to pass (-1: none), hi: known to fail
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if probe(mid):
                    lo = mid
                else:
                    hi = mid
    out["not_run"] = [c for c in grid if c not in results]
    passed = [r for r in runs if r.get("pass")]
    failed_d = [r["demand"] for r in runs if r.get("demand") and not r.get("pass")]
    best = max(passed, key=lambda r: r["demand"]) if passed else None
    out.update(
        status="FAILED" if any(r["status"] != "ok" for r in runs) else "ok",
        supply=supply, ttfb_s=base.get("ttfb_s"), setup_s=base.get("setup_s"),
        cpu_ms_per_sample=base.get("cpu_ms_per_sample"),
        max_sustained=best["demand"] if best else None,
        max_sustained_compute_ms=best["compute_ms"] if best else None,
        first_fail_above=min([d for d in failed_d if not best or d > best["demand"]],
                             default=None),
        lowest_tested=min((r["demand"] for r in runs if r.get("demand")), default=None),
        maxrss_mib=max(r.get("maxrss_mib", 0) for r in runs),
        tree_rss_mib=max(r.get("tree_rss_mib", 0) for r in runs))
    return out


# ----------------------------------------------------------------------------- report
def f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def loader_table(res: dict, a) -> str:
    head = (f"### {res['loader']}: {res.get('config') or res['kind']}, "
            f"num_workers={res['workers']}\n\n")
    cols = ["compute ms/batch", "demand samples/s", "batches (warm-up+measured)", "status", "AU", "samples/s",
            "AU epoch", "TTFB s", "wait p50 / p95 ms", "CPU s", "RSS MiB", "tree PSS MiB"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows = sorted(res["runs"], key=lambda r: -r["compute_ms"] if r["compute_ms"] else math.inf)
    for r in rows:
        ok = r["status"] == "ok"
        st = r["status"] if not ok else ("unthrottled" if not r["compute_ms"] else
                                         "pass" if r.get("pass") else "fail")
        lines.append("| " + " | ".join([
            f"{r['compute_ms']:g}" if r["compute_ms"] else "0",
            f"{r['demand']:,.0f}" if r.get("demand") else "-",
            (f"{r['warmup']}+{r['batches'] - r['warmup']}" if "warmup" in r and "batches" in r
             else str(r["batches_asked"])), st,
            f"{100 * r['au']:.1f}%" if ok and r["compute_ms"] else "-",
            f(r.get("rate") if ok else None, ",.0f"),
            f"{100 * r['au_epoch']:.1f}%" if ok and r["compute_ms"] else "-",
            f(r.get("ttfb_s") if ok else None, ".2f"),
            (f"{r['wait_p50_ms']:.1f} / {r['wait_p95_ms']:.1f}" if ok and "wait_p50_ms" in r
             else "-"),
            f(r.get("cpu_s"), ".2f"), f(r.get("maxrss_mib"), ",.0f"),
            f(r.get("tree_rss_mib"), ",.0f")]) + " |")
    notes = []
    if res.get("not_run"):
        nr = res["not_run"]
        notes.append(f"- {len(nr)} other grid points not run: the search brackets the highest "
                     f"sustained demand between a pass and the next grid point's fail")
    for r in res["runs"]:
        if r["status"] != "ok":
            notes.append(f"- compute {r['compute_ms']:g} ms FAILED: {'; '.join(r['problems'])}"
                         + (f" -- `{r['stderr_tail'][-300:]}`" if r.get("stderr_tail") else ""))
    return head + "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def sustained_text(res: dict | None) -> str:
    if not res or res.get("max_sustained") is None:
        if res and res.get("lowest_tested"):
            return f"< {res['lowest_tested']:,.0f}"
        return "-"
    return f"{res['max_sustained']:,.0f}"


def ratio(x: dict, y: dict | None) -> str:
    if not y or x.get("max_sustained") is None:
        return "-"
    if y.get("max_sustained") is None:
        return f"> {x['max_sustained'] / y['lowest_tested']:.1f}x" if y.get("lowest_tested") \
            else "-"
    return f"{x['max_sustained'] / y['max_sustained']:.1f}x"


def summary_table(results: list[dict], raw: dict | None, a) -> str:
    by = {r["loader"]: r for r in results}
    raw_ops = raw.get("obj_per_s") if raw and raw.get("status") == "ok" else None
    head = (f"### Summary: highest demand sustained at AU >= {100 * a.au_target:.0f}% "
            f"(batch {a.batch_size}, {a.delay_ms:g} ms each way)\n\n")
    cols = ["loader", "status", "max sustained samples/s", "at compute ms", "next demand (fail)",
            "unthrottled samples/s", "TTFB s", f"vs {BOTO3_REF}", f"vs {S3TORCH_REF}",
            "% of raw engine", "peak RSS MiB", "tree PSS MiB", "CPU ms/sample"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        ok = r["status"] == "ok"
        ms = r.get("max_sustained")
        lines.append("| " + " | ".join([
            r["loader"], r["status"], sustained_text(r),
            f(r.get("max_sustained_compute_ms"), "g"), f(r.get("first_fail_above"), ",.0f"),
            f(r.get("supply"), ",.0f"), f(r.get("ttfb_s"), ".2f"),
            ratio(r, by.get(BOTO3_REF)), ratio(r, by.get(S3TORCH_REF)),
            f"{100 * ms / raw_ops:.0f}%" if ms and raw_ops else "-",
            f(r.get("maxrss_mib"), ",.0f"), f(r.get("tree_rss_mib"), ",.0f"),
            f(r.get("cpu_ms_per_sample") if ok else None, ".3f")]) + " |")
    foot = ""
    if raw:
        foot = (f"\nRaw engine reference: `wharf fetch -r --json s3://{BUCKET}/s1/` through the "
                f"same proxy: " + (f"{raw['objects']:,} objects in {raw['wall_s']:.2f} s = "
                                   f"**{raw['obj_per_s']:,.0f} objects/s** "
                                   f"({raw['mb_per_s']:,.0f} MB/s, CPU {raw['cpu_s']:.2f} s, "
                                   f"RSS {raw['maxrss_mib']:.0f} MiB)"
                                   if raw.get("status") == "ok" else
                                   f"{raw.get('status')}: {'; '.join(raw.get('problems', []))}")
                + "\n")
    return head + "\n".join(lines) + "\n" + foot


# ----------------------------------------------------------------------------- main
def tool_versions() -> dict:
    v = {}
    try:
        v["python"] = subprocess.run(
            [str(VENV_PY), "-c", "import importlib.metadata as m;print(' '.join(f'{p}=='"
             "+m.version(p) for p in ('boto3','botocore','s3torchconnector','torch','numpy')))"],
            capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        v["python"] = "?"
    try:
        v["git"] = rb.check_output(["git", "rev-parse", "--short", "HEAD"]).strip()
    except (OSError, subprocess.CalledProcessError):
        v["git"] = "?"
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (bench/train_bench.py).")
    ap.add_argument("--quick", action="store_true",
                    help="fewer batches per point (3 s of compute, 12..24 batches)")
    ap.add_argument("--delay-ms", type=float, default=25.0, help="proxy delay, each way")
    ap.add_argument("--out", default=str(REPO / "bench-results"))
    ap.add_argument("--loaders", help="comma-separated, default: "
                    + ",".join(ld.name for ld in LOADERS if ld.default) + "; also: "
                    + ",".join(ld.name for ld in LOADERS if not ld.default))
    ap.add_argument("--compute-ms", help="demand grid, ms per batch, e.g. 200,100,50,30,20,10,5 "
                    "(default: 800 down to 5.3 in steps of 2^(1/4))")
    ap.add_argument("--search", choices=["bisect", "all"], default="bisect")
    ap.add_argument("--batches", type=int, help="batches per run (default: by compute time)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--au-target", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tar-shards", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=300, help="per run, seconds")
    ap.add_argument("--no-raw", action="store_true", help="skip the wharf fetch reference")
    ap.add_argument("--wharf", default=os.environ.get("WHARF_BIN", str(REPO / "build/wharf")))
    ap.add_argument("--proxy-bin", help="wharf-latency-proxy binary (default: build/tools/...)")
    ap.add_argument("--keep-server", action="store_true",
                    help="leave a server this run started running (its data stays)")
    a = ap.parse_args(argv)
    a.wharf = str(Path(a.wharf).resolve()) if Path(a.wharf).exists() else a.wharf
    a._grid = ([float(x) for x in a.compute_ms.split(",")] if a.compute_ms else DEFAULT_GRID)
    if any(c <= 0 for c in a._grid):
        ap.error("--compute-ms values must be > 0")
    names = a.loaders.split(",") if a.loaders else [ld.name for ld in LOADERS if ld.default]
    known = {ld.name: ld for ld in LOADERS}
    if set(names) - set(known):
        ap.error(f"unknown loaders {sorted(set(names) - set(known))}")
    loaders = [known[n] for n in names]
    if not VENV_PY.exists():
        log(f"error: {VENV_PY} missing (./run setup)")
        return 2

    # The benchmark's own server, as ./run bench uses it.
    os.environ.setdefault("WHARF_S3_PORT", "27080")
    os.environ.setdefault("WHARF_S3_BASE", str(REPO / ".wharf" / "bench-s3"))
    signal.signal(signal.SIGTERM, rb._on_signal)
    signal.signal(signal.SIGHUP, rb._on_signal)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    server = rb.Server(keep=a.keep_server)
    results: list[dict] = []
    sections: list[str] = []
    raw = None
    versions: dict | None = None
    failed = False
    objectstore = "?"
    t_start = time.time()
    try:
        proxy_bin = rb.find_proxy(a.proxy_bin)
        server.start(big=False)
        objectstore = server.objectstore()  # read now: stop() removes the base dir
        versions = tool_versions()
        s1 = rb.make_scenarios(False)["S1"]
        try:
            objects = rb.ensure_data(server, s1)
            if any(ld.tar for ld in loaders):
                ensure_tar_shards(server, objects, a.tar_shards)
        except rb.SetupError:
            raise
        except Exception as e:  # noqa: BLE001 - botocore errors, memstore full, ...
            raise rb.SetupError(f"generating the data failed: {e!r}") from e
        sizes = set(objects.values())
        if len(sizes) != 1:
            raise rb.SetupError(f"S1 objects have several sizes: {sorted(sizes)[:5]}")
        a._sample_size = sizes.pop()
        a._objects = len(objects)
        log(f"loaders: {', '.join(ld.name for ld in loaders)}; proxy {a.delay_ms:g} ms each way")
        with rb.Proxy(proxy_bin, server.endpoint, a.delay_ms, []) as proxy:
            a._delay = a.delay_ms
            a.wharf_inflight, a.drop_caches, a._scratch = 0, False, None
            ctx = rb.Ctx(sc=s1, endpoint=proxy.url, direct=server.endpoint,
                         server_env=server.env, objects=objects, args=a)
            if not a.no_raw:
                why = rb.avail_wharf_fetch(a)
                if why:
                    raw = {"status": why}
                    log(f"raw engine reference: {why}")
                else:
                    c = next(c for c in rb.CLIENTS if c.name == "wharf")
                    raw = rb.run_one(c, ctx, server, proxy)
                    log(f"raw engine reference (wharf fetch): {raw['status']}"
                        + (f" {raw['obj_per_s']:,.0f} objects/s" if raw["status"] == "ok"
                           else f" {'; '.join(raw.get('problems', []))}"))
                    failed |= raw["status"] != "ok"
            for ld in loaders:
                log(f"{ld.name}: sweep")
                res = sweep(a, ld, ctx, server, proxy)
                results.append(res)
                failed |= res["status"] != "ok"
                sections.append(loader_table(res, a))
                print("\n" + sections[-1], flush=True)
        summary = summary_table(results, raw, a)
        sections.insert(0, summary)
        print("\n" + summary, flush=True)
    except rb.SetupError as e:
        log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        failed = True
    finally:
        rb.shut_down(server)
        if results or raw:
            header = (f"# wharf training-loop benchmark {stamp}\n\n"
                      f"- command: `{' '.join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))}`\n"
                      f"- machine: {rb.machine_line()}; server objectstore "
                      f"{objectstore}; latency proxy {a.delay_ms:g} ms each way; "
                      f"total wall {time.time() - t_start:.0f} s\n"
                      f"- data: {getattr(a, '_objects', 0):,} "
                      f"objects of {getattr(a, '_sample_size', 0):,} B (s3://{BUCKET}/s1/) "
                      f"and {a.tar_shards} tar shards of the same samples ({TAR_PREFIX})\n"
                      f"- AU = compute / wall in the steady state (after W = 2 x num_workers "
                      f"warm-up batches, min 1); AU epoch = the whole run, start-up (TTFB) "
                      f"included; sustained = AU >= "
                      f"{100 * a.au_target:.0f}%; demand = batch / compute; batch "
                      f"{a.batch_size}; {'quick: ' if a.quick else ''}batches per point "
                      f"{'fixed ' + str(a.batches) if a.batches else 'by compute time'}; "
                      f"search {a.search}\n"
                      f"- CPU = user+sys of the loader's process tree (imports excluded, "
                      f"listing included); RSS = ru_maxrss of its largest process; tree PSS = "
                      f"sampled peak of the tree's summed PSS\n")
            rb.write_report(out_dir, f"train-{stamp}", header, versions, sections,
                            {"argv": sys.argv, "stamp": stamp, "delay_ms": a.delay_ms,
                             "batch_size": a.batch_size, "au_target": a.au_target,
                             "quick": a.quick, "grid_ms": a._grid, "raw": raw,
                             "loaders": results})
    return 1 if failed else 0


if __name__ == "__main__":
    rb.raise_open_files_limit()
    sys.exit(main())
