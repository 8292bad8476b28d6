"""TIER: the tier benchmarks of issue 12, run by bench/run_bench.py (its server, proxy,
measurement and report):

    .venv/bin/python bench/run_bench.py --scenario TIER [--quick] [--repeat N]
                                        [--tier-parts a,b,c] [--clients ...] [--delays 25]

Data: 10,000 x 100 KiB random objects (the S1 set, s1/; --quick: 2,000 under tier-quick/),
through wharf-latency-proxy at 25 ms each way (--delays: the first value). Every part runs
N rounds (default 3), clients interleaved and their order rotated each round; medians.

(a) import into a local directory, each client into a fresh directory each round:
      wharf       wharf fetch -r --json (into memory: what wharf reaches on these objects)
      curl        curl --parallel 300 given the keys, to /dev/null (the native ceiling)
      wharf-tier  wharf tier import --json SRC DIR (durable: syncfs per batch, verified)
      wharf-cp    wharf cp -r SRC DIR
      aws-sync    aws s3 sync SRC DIR (50 concurrent requests)
      rclone      rclone copy --transfers 64 SRC DIR
      s5cmd       s5cmd --numworkers 256 cp 'SRC*' DIR/
    Only the import makes its files durable before it exits; for the others the time of a
    syncfs() on the directory's file system right after they exit is reported beside their
    wall time ("then syncfs s"). The disk's own rate is measured in the same run, once per
    round: dd if=/dev/zero of=FILE bs=1M count=1024 conv=fsync in the same scratch directory;
    and the file system's own small-file rate: 2,000 files of the objects' size written by
    one Python process as an importer writes them (create in a temporary directory, one
    write, rename into a tree, one syncfs), with no network.
(b) one epoch three ways, on a fresh tier each round: wharf fetch -r without a cache (the
    same loader with no tier), cold through the read-through tier (wharf --cache T fetch -r),
    warm from it (the same command again: every read a hit), and plain Python open() + read()
    of every file of the same objects imported into the tier (the local file system's rate;
    the files were just written, so both warm reads come from the page cache). The same
    three ways again as a Python training loader (wharf.SampleIndex.from_prefix(uri[,
    cache=T]) + one shuffled SampleStream epoch, timed after its imports), and fsspec's
    filecache::s3:// cold and warm as the peer cache (fs.find, then fs.cat in batches).
    Then both wharf loaders once more through `cache=T` on the tier holding the completed
    import, which also answers their listing. open() and these two take ~0.2 s each, so each
    runs 3 times per round (in turn, each a fresh process) and its median is over all runs.
(c) 4 processes reading the same data set cold through one fresh tier at once (4 x wharf
    --cache T fetch -r in parallel): the bytes the tier fetched from the bucket (`wharf tier
    status --json T`: fill_bytes) as a multiple of the data set (target 1.0x), and the wall
    time of the four together.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

# Runs per round of the ~0.2 s reads of the imported files (open() and the two loaders on the
# import), in turn: see part_bc.
WARM_PASSES = 3

A_ORDER = ["wharf", "curl", "wharf-tier", "wharf-cp", "aws-sync", "rclone", "s5cmd"]
A_LABEL = {
    "wharf": "wharf fetch -r (into memory)",
    "curl": "curl --parallel 300, keys given (ceiling)",
    "wharf-tier": "**wharf tier import** (durable)",
    "wharf-cp": "wharf cp -r",
    "aws-sync": "aws s3 sync",
    "rclone": "rclone copy --transfers 64",
    "s5cmd": "s5cmd cp (256 workers)",
}
_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path: Path) -> float:
    """syncfs(2) on the file system holding path; returns the seconds it took."""
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        _libc.syncfs(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def disk_rate(scratch: Path) -> dict:
    """The disk's own sequential write rate: dd 1 GiB of zeros with conv=fsync."""
    f = scratch / f"wharf-bench-dd-{os.getpid()}.bin"
    syncfs(scratch)
    try:
        r = subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=1M", "count=1024",
                            "conv=fsync"], capture_output=True, text=True, timeout=600)
    finally:
        f.unlink(missing_ok=True)
        syncfs(scratch)
    m = re.search(r"copied, ([\d.,]+) s", r.stderr)
    if r.returncode or not m:
        return {"error": r.stderr.strip()[-300:]}
    secs = float(m.group(1).replace(",", "."))
    return {"seconds": secs, "mb_per_s": 1024**3 / secs / 1e6,
            "dd": r.stderr.strip().splitlines()[-1]}


def small_file_rate(scratch: Path, discard, count: int, size: int) -> dict:
    """What the file system itself takes to write small files the way an importer does,
    with no network and no client: `count` files of `size` random bytes, each created in a
    temporary directory (O_EXCL, mode 0600), written with one write, closed and renamed into
    a tree, then one syncfs. One Python process (its own overhead is a few us per call);
    the directory is set aside with the clients' (`discard`), not deleted mid-run."""
    d = Path(tempfile.mkdtemp(prefix="wharf-bench-files-", dir=scratch))
    tmp, tree = d / "tmp", d / "tree"
    tmp.mkdir()
    tree.mkdir()
    data = os.urandom(size)
    syncfs(scratch)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    try:
        for i in range(count):
            p = os.path.join(tmp, f"t{i}")
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.rename(p, os.path.join(tree, f"f{i:06d}"))
        written = time.perf_counter() - t0
        syncfs(d)
    except OSError as e:
        discard(d)
        return {"error": str(e)}
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    discard(d)
    cpu_s = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"files": count, "size": size, "wall_s": wall, "written_s": written,
            "files_per_s": count / wall, "cpu_ms_per_file": 1000 * cpu_s / count,
            "sys_ms_per_file": 1000 * (r1.ru_stime - r0.ru_stime) / count}


def sync_then_record(ctx, rec: dict) -> None:
    """Before a disk-writing client's directory is deleted: how long making it durable takes."""
    rec["syncfs_s"] = syncfs(ctx.tmpdir)


READERS_SH = r'''
W=$1 T=$2 U=$3 O=$4 N=$5 pids=""
for i in $(seq 1 "$N"); do
  "$W" --cache "$T" fetch -r --json "$U" >"$O/out.$i" 2>"$O/err.$i" & pids="$pids $!"
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
exit $rc
'''

OPEN_PY = r'''
import json, os, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
before = cpu()
t0 = time.perf_counter()
n = b = 0
for root, dirs, files in os.walk(sys.argv[1]):
    if root == sys.argv[1] and ".wharf" in dirs:
        dirs.remove(".wharf")
    for f in files:
        with open(os.path.join(root, f), "rb") as fh:
            b += len(fh.read())
        n += 1
print(json.dumps({"objects": n, "bytes": b, "seconds": time.perf_counter() - t0,
                  "cpu_before_s": before}))
'''

# The same epoch as a Python training loader: wharf's dataset path (what wharf.torch's
# IterableDataset runs): SampleIndex.from_prefix lists the prefix (sizes included, so no HEAD
# per object), then one shuffled SampleStream epoch over it, each Buffer read and dropped as a
# training step would; with or without cache=TIER (the listing through the tier too).
PY_WHARF = r'''
import json, resource, sys, time
import wharf
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
before = cpu()
uri, cache = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
kw = {"cache": cache} if cache else {}
index = wharf.SampleIndex.from_prefix(uri, **kw)
n = b = 0
for _, _, buf in wharf.SampleStream(index, seed=0, epoch=0, shuffle=True):
    n += 1
    b += len(memoryview(buf))
print(json.dumps({"objects": n, "bytes": b, "seconds": time.perf_counter() - t0,
                  "cpu_before_s": before}))
'''


# fsspec's whole-file cache in front of s3fs (`filecache::s3://`), the peer cache: fs.find of
# the prefix (one listing, kept in s3fs's listings cache: without it fs.cat asks the bucket
# about each path one at a time, ~20 paths/s at 25 ms), then fs.cat in batches of 1,000 (the
# misses of a batch fetched by s3fs.get, concurrently), timed with the listing, as the CLI.
FSSPEC_PY = r'''
import json, os, resource, sys, time
import fsspec
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
before = cpu()
endpoint, base, cache = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
fs = fsspec.filesystem(
    "filecache", target_protocol="s3", cache_storage=cache,
    target_options={"key": os.environ["AWS_ACCESS_KEY_ID"],
                    "secret": os.environ["AWS_SECRET_ACCESS_KEY"], "endpoint_url": endpoint,
                    "client_kwargs": {"region_name": os.environ.get("AWS_REGION", "us-east-1")},
                    "config_kwargs": {"s3": {"addressing_style": "path"},
                                      "max_pool_connections": 64}})
paths = sorted(fs.find(base))
n = b = 0
for i in range(0, len(paths), 1000):
    out = fs.cat(paths[i:i + 1000])
    n += len(out)
    b += sum(len(v) for v in out.values())
    del out
print(json.dumps({"objects": n, "bytes": b, "seconds": time.perf_counter() - t0,
                  "cpu_before_s": before}))
'''


def py_fsspec(rb, name: str, cache: Path):
    def build(ctx):
        def parse(m):
            j = rb.parse_json_line(m.stdout)
            return int(j["objects"]), int(j["bytes"]), j
        base = ctx.uri[len("s3://"):]
        return rb.Invocation([str(rb.VENV_PY), "-c", FSSPEC_PY, ctx.endpoint, base, str(cache)],
                             ctx.base_env(), parse, python_peer=True)
    return rb.Client(name, ("tier",), "fsspec filecache::s3 fs.find + fs.cat", False,
                     rb.avail_module("s3fs"), build)


def py_wharf(rb, name: str, tier: Path | None):
    def build(ctx):
        env = ctx.base_env()
        env["PYTHONPATH"] = str(rb.REPO / "python")

        def parse(m):
            j = rb.parse_json_line(m.stdout)
            return int(j["objects"]), int(j["bytes"]), j
        return rb.Invocation([str(rb.VENV_PY), "-c", PY_WHARF, ctx.uri, str(tier or "")], env,
                             parse, python_peer=True)
    return rb.Client(name, ("tier",), "wharf SampleIndex.from_prefix + SampleStream", False,
                     lambda a: None, build)


def readers(rb, name: str, tier: Path, procs: int):
    """A client: `procs` x wharf --cache TIER fetch -r at once (one measured process tree)."""
    def build(ctx):
        out = Path(tempfile.mkdtemp(prefix="wharf-bench-readers-", dir=ctx.workdir))

        def parse(m):
            per = [rb.parse_json_line((out / f"out.{i}").read_text())
                   for i in range(1, procs + 1)]
            errs = [(out / f"err.{i}").read_text()[-300:] for i in range(1, procs + 1)]
            if m.rc and any(errs):
                m.stderr += "\n".join(e for e in errs if e)
            # every process must have read the whole set: count the one that read least
            low = min(per, key=lambda j: (int(j["objects"]), int(j["bytes"])))
            return int(low["objects"]), int(low["bytes"]), {
                "per_process_s": [j.get("seconds") for j in per]}
        return rb.Invocation(["bash", "-c", READERS_SH, "bash", ctx.args.wharf, str(tier),
                              ctx.uri, str(out), str(procs)], ctx.base_env(), parse)
    return rb.Client(name, ("tier",), f"{procs} x wharf --cache T fetch -r", False,
                     lambda a: None, build)


def open_reader(rb, tree: Path):
    def build(ctx):
        def parse(m):
            j = rb.parse_json_line(m.stdout)
            return int(j["objects"]), int(j["bytes"]), j
        return rb.Invocation([str(rb.VENV_PY), "-c", OPEN_PY, str(tree)], ctx.base_env(),
                             parse, python_peer=True)
    return rb.Client("open", ("tier",), "Python open().read() of the imported files", False,
                     lambda a: None, build)


def tier_status(rb, a, tier: Path) -> dict:
    return json.loads(rb.check_output([a.wharf, "tier", "status", "--json", str(tier)]))


def median(runs: list[dict], key: str):
    vals = [r[key] for r in runs if r.get("status") == "ok" and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def log_run(rb, r: dict) -> None:
    if r["status"] == "ok":
        rb.log(f"  {r['client']}: {r['wall_s']:.2f} s, {r['obj_per_s']:,.0f} obj/s, "
               f"{r['mb_per_s']:,.1f} MB/s, CPU {r['cpu_s']:.2f} s, RSS {r['maxrss_mib']:.0f} MiB"
               + (f", then syncfs {r['syncfs_s']:.2f} s" if "syncfs_s" in r else ""))
    else:
        rb.log(f"  {r['client']}: {r['status']} {'; '.join(r.get('problems', []))} "
               f"{r.get('stderr_tail', '')[-300:]}")


def measure(rb, client, ctx, server, proxy, results: list, rnd: int, part: str) -> dict:
    r = rb.run_one(client, ctx, server, proxy)
    r.update(round=rnd, part=part, describe=client.describe, scenario="TIER")
    results.append(r)
    log_run(rb, r)
    return r


# ----------------------------------------------------------------------------- (a)
def part_a(rb, a, sc, ctx_for, server, proxy, avail, results) -> str:
    clients = [c for n in A_ORDER for c in rb.CLIENTS if c.name == n and n in avail]
    for c in clients:
        if avail[c.name]:
            rb.log(f"TIER (a) {c.name}: {avail[c.name]}")
    clients = [c for c in clients if not avail[c.name]]
    per: dict[str, list[dict]] = {c.name: [] for c in clients}
    disk: list[dict] = []
    files: list[dict] = []
    for rnd in range(a.repeat):
        rb.log(f"TIER (a) round {rnd + 1}/{a.repeat}")
        d = disk_rate(a._scratch)
        d["round"] = rnd
        disk.append(d)
        rb.log("  disk (dd 1 GiB conv=fsync): " + (f"{d['mb_per_s']:,.0f} MB/s" if
                                                     "mb_per_s" in d else d["error"]))
        f = small_file_rate(a._scratch, rb.TRASH.discard, min(sc.count, 2000), sc.size)
        f["round"] = rnd
        files.append(f)
        rb.log("  file system (small files, no network): " + (
            f"{f['files_per_s']:,.0f} files/s, {f['cpu_ms_per_file']:.3f} ms CPU per file"
            if "files_per_s" in f else f["error"]))
        k = rnd % max(1, len(clients))
        for c in clients[k:] + clients[:k]:
            ctx = ctx_for(before_cleanup=sync_then_record if c.writes_disk else None)
            per[c.name].append(measure(rb, c, ctx, server, proxy, results, rnd, "a"))
    results.append({"scenario": "TIER", "part": "a-disk", "runs": disk})
    results.append({"scenario": "TIER", "part": "a-files", "runs": files})

    med = {n: {k: median(runs, k) for k in ("obj_per_s", "mb_per_s", "wall_s", "cpu_s",
                                            "cpu_ms_per_obj", "maxrss_mib", "server_cpu_s",
                                            "syncfs_s")}
           for n, runs in per.items()}
    imp = med.get("wharf-tier", {}).get("obj_per_s")
    fetch = med.get("wharf", {}).get("obj_per_s")
    total = sum(sc.size for _ in range(sc.count))
    lines = [f"### TIER (a) import into a directory: {sc.count:,} x {sc.size // 1024} KiB "
             f"({total / 1e6:,.0f} MB), {a._delay:g} ms each way, medians of {a.repeat} rounds\n",
             "| client | ok | obj/s | MB/s | wall s | then syncfs s | CPU s | CPU ms/obj | "
             "peak RSS MiB | server CPU s | % of wharf fetch | import / X |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in clients:
        m, runs = med[c.name], per[c.name]
        ok = sum(r["status"] == "ok" for r in runs)
        v = m["obj_per_s"]
        lines.append("| " + " | ".join([
            A_LABEL.get(c.name, c.name), f"{ok}/{len(runs)}", fmt(v, ",.0f"),
            fmt(m["mb_per_s"], ",.1f"), fmt(m["wall_s"], ".2f"), fmt(m["syncfs_s"], ".2f"),
            fmt(m["cpu_s"], ".2f"), fmt(m["cpu_ms_per_obj"], ".3f"), fmt(m["maxrss_mib"], ",.0f"),
            fmt(m["server_cpu_s"], ".2f"),
            f"{100 * v / fetch:.0f}%" if v and fetch else "-",
            f"{imp / v:.2f}x" if v and imp else "-"]) + " |")
    rates = [d["mb_per_s"] for d in disk if "mb_per_s" in d]
    lines.append("")
    lines.append(f"- disk (`dd if=/dev/zero bs=1M count=1024 conv=fsync` in {a._scratch}, once "
                 f"per round): " + (", ".join(f"{x:,.0f}" for x in rates) + " MB/s, median "
                                    f"{statistics.median(rates):,.0f} MB/s" if rates else
                                    "failed"))
    ok_files = [f for f in files if "files_per_s" in f]
    if ok_files:
        lines.append(
            f"- file system alone ({ok_files[0]['files']:,} files of {sc.size // 1024} KiB "
            "written by one Python process as an importer writes them: create in a temporary "
            "directory, one write, rename into a tree, one syncfs; no network, once per round): "
            + ", ".join(f"{f['files_per_s']:,.0f}" for f in ok_files) + " files/s, CPU "
            + ", ".join(f"{f['cpu_ms_per_file']:.3f}" for f in ok_files) + " ms per file "
            "(the import's CPU per object is this plus the fetch's)")
    lines.append("- rounds (obj/s): " + "; ".join(
        f"{n} " + "/".join(fmt(r.get("obj_per_s"), ",.0f") for r in runs)
        for n, runs in per.items()))
    for n, runs in per.items():
        for r in runs:
            if r["status"] != "ok":
                lines.append(f"- {n} round {r['round'] + 1}: {'; '.join(r.get('problems', []))}"
                             f" `{r.get('stderr_tail', '')[-300:]}`")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- (b), (c)
def part_bc(rb, a, sc, ctx_for, server, proxy, avail, results, parts: set[str]) -> str:
    total = sum(sc.size for _ in range(sc.count))
    per: dict[str, list[dict]] = {}
    fills: list[dict] = []
    fetch = next(c for c in rb.CLIENTS if c.name == "wharf")
    tier_import = next(c for c in rb.CLIENTS if c.name == "wharf-tier")
    for rnd in range(a.repeat):
        rb.log(f"TIER ({'/'.join(sorted(parts))}) round {rnd + 1}/{a.repeat}")
        if "b" in parts:
            t = Path(tempfile.mkdtemp(prefix="wharf-bench-tier-b-", dir=a._scratch))
            tp = Path(tempfile.mkdtemp(prefix="wharf-bench-tier-bpy-", dir=a._scratch))
            tf = Path(tempfile.mkdtemp(prefix="wharf-bench-tier-fsspec-", dir=a._scratch))
            try:
                steps = [("no-cache", fetch), ("cold", readers(rb, "cold", t, 1)),
                         ("warm", readers(rb, "warm", t, 1)),
                         ("py-no-cache", py_wharf(rb, "py-no-cache", None)),
                         ("py-cold", py_wharf(rb, "py-cold", tp)),
                         ("py-warm", py_wharf(rb, "py-warm", tp)),
                         ("fsspec-cold", py_fsspec(rb, "fsspec-cold", tf)),
                         ("fsspec-warm", py_fsspec(rb, "fsspec-warm", tf))]
                for label, c in steps:
                    why = c.available(a) if callable(getattr(c, "available", None)) else None
                    if why:
                        rb.log(f"    {label}: {why}")
                        continue
                    r = measure(rb, c, ctx_for(), server, proxy, results, rnd, "b")
                    r["way"] = label
                    per.setdefault(label, []).append(r)
                    if "no-cache" not in label and not label.startswith("fsspec"):
                        st = tier_status(rb, a, tp if label.startswith("py") else t)
                        r["tier_status"] = st
                        rb.log(f"    tier: fills {st['fills']}, fill_bytes {st['fill_bytes']:,}, "
                               f"hits {st['hits']}, misses {st['misses']}")
                # the same objects imported into the tier, then read with plain open()
                tree = t / "train"
                tree.mkdir()
                ctx = ctx_for()
                ctx.tmpdir = tree  # the import's destination (run here, not timed)
                inv = tier_import.build(ctx)
                rb.check_output(inv.argv, inv.env, timeout=a.timeout)
                # open() of the imported files, and (the import completed, so the tier also
                # answers the listing) the same two loaders through `cache=` on the tier that
                # holds the import. Each takes ~0.2 s, where one scheduling hiccup of this
                # shared machine moves a run by 25%: WARM_PASSES runs of each per round, in
                # turn, each a fresh process as every other run.
                shutil.rmtree(t / ".wharf" / "stats", ignore_errors=True)
                for _ in range(WARM_PASSES):
                    for label, c in [("open", open_reader(rb, tree)),
                                     ("imported", readers(rb, "imported", t, 1)),
                                     ("py-imported", py_wharf(rb, "py-imported", t))]:
                        r = measure(rb, c, ctx_for(), server, proxy, results, rnd, "b")
                        r["way"] = label
                        per.setdefault(label, []).append(r)
                        if label == "open":
                            continue
                        st = tier_status(rb, a, t)
                        r["tier_status"] = st
                        rb.log(f"    tier: fills {st['fills']}, hits {st['hits']}, "
                               f"misses {st['misses']}")
                        shutil.rmtree(t / ".wharf" / "stats", ignore_errors=True)
            finally:
                for d in (t, tp, tf):
                    rb.TRASH.discard(d)
                syncfs(a._scratch)
        if "c" in parts:
            t = Path(tempfile.mkdtemp(prefix="wharf-bench-tier-c-", dir=a._scratch))
            try:
                r = measure(rb, readers(rb, "4 readers", t, 4), ctx_for(), server, proxy,
                            results, rnd, "c")
                st = tier_status(rb, a, t)
                r["tier_status"] = st
                fills.append({"round": rnd, "wall_s": r.get("wall_s"), "status": r["status"],
                              "cpu_s": r.get("cpu_s"), "maxrss_mib": r.get("maxrss_mib"),
                              "server_cpu_s": r.get("server_cpu_s"),
                              "per_process_s": r.get("per_process_s"), **st})
                rb.log(f"    tier: fills {st['fills']}, fill_bytes {st['fill_bytes']:,} "
                       f"({st['fill_bytes'] / total:.3f}x the set), hits {st['hits']}, "
                       f"misses {st['misses']}")
            finally:
                rb.TRASH.discard(t)
                syncfs(a._scratch)
    out = []
    if per:
        base = median(per.get("no-cache", []), "obj_per_s")
        py_base = median(per.get("py-no-cache", []), "obj_per_s")
        opn = median(per.get("open", []), "obj_per_s")
        lines = [f"### TIER (b) one epoch three ways: {sc.count:,} x {sc.size // 1024} KiB, "
                 f"{a._delay:g} ms each way, fresh tier each round, medians of {a.repeat} "
                 f"rounds (of {WARM_PASSES * a.repeat} runs for open() and the two loaders on "
                 f"the import: {WARM_PASSES} per round, in turn)\n",
                 "| way | ok | obj/s | MB/s | wall s | CPU s | CPU ms/obj | peak RSS MiB | "
                 "% of the same without cache | % of open() |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        label = {"no-cache": "wharf fetch -r, no cache (from the bucket)",
                 "cold": "cold: wharf --cache T fetch -r (fills the tier)",
                 "warm": "warm: the same again (every read a hit)",
                 "py-no-cache": "Python SampleIndex.from_prefix + SampleStream, no cache",
                 "py-cold": "cold: the same with cache=T (fills the tier)",
                 "py-warm": "warm: the same again (every read a hit)",
                 "open": "Python open().read() of the imported files",
                 "fsspec-cold": "peer: fsspec filecache::s3 fs.find + fs.cat, cold",
                 "fsspec-warm": "peer: the same again (every read from its cache)",
                 "imported": "wharf --cache T fetch -r, T holding the import (lists from it)",
                 "py-imported": "the Python loader with cache=T holding the import"}
        for way, runs in per.items():
            v = median(runs, "obj_per_s")
            ok = sum(r["status"] == "ok" for r in runs)
            lines.append("| " + " | ".join([
                label[way], f"{ok}/{len(runs)}", fmt(v, ",.0f"),
                fmt(median(runs, "mb_per_s"), ",.1f"), fmt(median(runs, "wall_s"), ".2f"),
                fmt(median(runs, "cpu_s"), ".2f"), fmt(median(runs, "cpu_ms_per_obj"), ".3f"),
                fmt(median(runs, "maxrss_mib"), ",.0f"),
                (f"{100 * v / (py_base if way.startswith(('py', 'fsspec')) else base):.0f}%"
                 if v and (py_base if way.startswith(("py", "fsspec")) else base) else "-"),
                f"{100 * v / opn:.0f}%" if v and opn else "-"]) + " |")
        lines.append("")
        lines.append("- rounds (obj/s): " + "; ".join(
            f"{w} " + "/".join(fmt(r.get("obj_per_s"), ",.0f") for r in runs)
            for w, runs in per.items()))
        out.append("\n".join(lines) + "\n")
    if fills:
        lines = [f"### TIER (c) 4 processes reading the same {total / 1e6:,.0f} MB cold through "
                 f"one fresh tier at once, {a._delay:g} ms each way\n",
                 "| round | ok | wall s (all 4) | per process s | fetched from the bucket "
                 "(fill_bytes) | x data set | fills | misses | hits | CPU s | peak RSS MiB |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for f in fills:
            lines.append("| " + " | ".join([
                str(f["round"] + 1), f["status"], fmt(f["wall_s"], ".2f"),
                "/".join(fmt(x, ".2f") for x in (f.get("per_process_s") or [])),
                f"{f['fill_bytes']:,}", f"{f['fill_bytes'] / total:.3f}x", f"{f['fills']:,}",
                f"{f['misses']:,}", f"{f['hits']:,}", fmt(f["cpu_s"], ".2f"),
                fmt(f["maxrss_mib"], ",.0f")]) + " |")
        results.append({"scenario": "TIER", "part": "c-fills", "runs": fills})
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def run(rb, a, server, proxy_bin, avail: dict, results: list) -> list[str]:
    """Runs the parts of --tier-parts; returns the report's sections."""
    quick = a.quick
    sc = rb.Scenario("TIER", "get", "tier-quick/" if quick else "s1/",
                     2000 if quick else 10_000, 100 * rb.KiB, [25], "import")
    objects = rb.ensure_data(server, sc)
    a._delay = float(a.delays.split(",")[0]) if a.delays else 25.0
    parts = set(filter(None, a.tier_parts.split(",")))
    sections = []
    with rb.Proxy(proxy_bin, server.endpoint, a._delay, a.proxy_arg) as proxy:
        def ctx_for(before_cleanup=None):
            return rb.Ctx(sc=sc, endpoint=proxy.url, direct=server.endpoint,
                          server_env=server.env, objects=objects, args=a,
                          before_cleanup=before_cleanup)
        if "a" in parts:
            sections.append(part_a(rb, a, sc, ctx_for, server, proxy, avail, results))
            print("\n" + sections[-1], flush=True)
        if parts & {"b", "c"}:
            sections.append(part_bc(rb, a, sc, ctx_for, server, proxy, avail, results,
                                    parts & {"b", "c"}))
            print("\n" + sections[-1], flush=True)
    return sections
