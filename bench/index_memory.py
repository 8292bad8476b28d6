#!/usr/bin/env python3
"""Memory of a sample index that does not grow with the data set (issue 17, item 4).

Usage (from the repository root, after ./run build):

    .venv/bin/python bench/index_memory.py [--samples 100000000] [--dir /tmp/wharf-index-bench]
                                           [--read 4000] [--processes 2] [--out bench-results/]

What it does
1. Generates a JSON-lines manifest of N samples on local disk (file://), keys
   "train/%09d.jpg" with sizes ({"key": ..., "size": ...}), once (reused when it has N lines).
   Only the objects the readers will take are created (the first --read positions of epoch 0
   of the shuffled order, computed with wharf's sampler), so N can be 10^8 on a small disk.
2. Builds the index file once, in a fresh process (SampleIndex.from_manifest with an
   index_cache directory): build time, the file's size, the builder's peak RSS (VmHWM).
3. Starts --processes fresh reader processes together. Each imports wharf.torch, then opens
   an IterableDataset.from_manifest over the manifest (mapping the index file), iterates
   --read samples (shuffled: random pages of the index), and waits for the others at a
   barrier before reading its memory: RssAnon, RssFile and Pss (/proc/self/status,
   /proc/self/smaps_rollup) as growth since before the dataset was opened, and the Pss and
   Rss of the index file's mapping alone (/proc/self/smaps), which the processes share.
4. For reference (N <= 10^7), the same reader with the index held in memory (index_cache=False):
   the compact columns on the heap, what spawned workers would each copy.

Output: a markdown table and --out/index_memory.json. The target is anonymous RSS growth per
process under 100 MB at N = 10^8, with the shared mapping counted by PSS.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rollup_kb(field: str) -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def mapping_kb(path: str) -> dict:
    """Rss and Pss of the mappings of `path` in this process (/proc/self/smaps)."""
    out = {"rss": 0, "pss": 0, "size": 0}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                inside = len(parts) >= 6 and parts[5] == path
                continue
            if inside and parts[0] in ("Rss:", "Pss:", "Size:"):
                out[parts[0][:-1].lower()] += int(parts[1])
    return out


def memory() -> dict:
    return {"rss_anon_kb": status_kb("RssAnon"), "rss_file_kb": status_kb("RssFile"),
            "pss_kb": rollup_kb("Pss"), "pss_anon_kb": rollup_kb("Pss_Anon")}


def generate_manifest(path: Path, n: int) -> float:
    """Writes N JSON lines; returns seconds (0 when reused)."""
    marker = path.with_suffix(".count")
    if path.exists() and marker.exists() and marker.read_text().strip() == str(n):
        return 0.0
    t = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    block = 100_000
    with open(path, "wb") as f:
        for start in range(0, n, block):
            end = min(n, start + block)
            f.write("".join(f'{{"key": "train/{i:09d}.jpg", "size": {16 + i % 100}}}\n'
                            for i in range(start, end)).encode())
    marker.write_text(str(n))
    return time.perf_counter() - t


def create_read_objects(root: Path, n: int, read: int, seed: int, world: int) -> None:
    """The objects of the first `read` samples each rank takes in epoch 0, and of the ones
    its read-ahead requests past them."""
    from wharf import _wharf
    sampler = _wharf.Sampler(n, seed=seed, shuffle=True)
    for rank in range(world):
        for i in sampler.shard(0, 0, rank=rank, world_size=world, start=0, count=read + 4096):
            p = root / "train" / f"{i:09d}.jpg"
            if not p.exists() or p.stat().st_size != 16 + i % 100:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(b"x" * (16 + i % 100))


def build(uri: str, cache: str, q) -> None:
    import wharf
    t = time.perf_counter()
    index = wharf.SampleIndex.from_manifest(uri, index_cache=cache)
    q.put({"seconds": time.perf_counter() - t, "samples": len(index), "path": index.path,
           "file_bytes": os.path.getsize(index.path) if index.path else 0,
           "peak_rss_kb": status_kb("VmHWM"), "fingerprint": index.fingerprint})


def reader(uri: str, cache, read: int, seed: int, rank: int, world: int, barrier, q) -> None:
    try:
        measure(uri, cache, read, seed, rank, world, barrier, q)
    except BaseException as e:  # reported, so the parent does not wait forever
        barrier.abort()
        q.put({"rank": rank, "error": repr(e)})
        raise


def measure(uri: str, cache, read: int, seed: int, rank: int, world: int, barrier, q) -> None:
    from wharf.torch import IterableDataset  # torch and wharf loaded before the baseline
    before = memory()
    t = time.perf_counter()
    ds = IterableDataset.from_manifest(uri, index_cache=cache, seed=seed, shuffle=True,
                                       rank=rank, world_size=world, batch_size_hint=64)
    open_s = time.perf_counter() - t
    opened = memory()
    t = time.perf_counter()
    taken = 0
    for sample in ds:
        taken += 1
        if taken == read:
            break
    read_s = time.perf_counter() - t
    path = ds.index.path
    barrier.wait()  # every reader has mapped and read: the shared pages are split among them
    after = memory()
    mapped = mapping_kb(path) if path else {"rss": 0, "pss": 0, "size": 0}
    q.put({"rank": rank, "open_s": open_s, "read_s": read_s, "samples": taken,
           "index_memory_bytes": ds.index.memory_bytes, "path": path,
           "growth_after_open_kb": {k: opened[k] - before[k] for k in before},
           "growth_kb": {k: after[k] - before[k] for k in before},
           "index_mapping_kb": mapped, "after": after})
    barrier.wait()  # keep the mapping until every reader measured


def run_readers(ctx, uri, cache, read, seed, world):
    barrier = ctx.Barrier(world)
    q = ctx.Queue()
    procs = [ctx.Process(target=reader, args=(uri, cache, read, seed, r, world, barrier, q))
             for r in range(world)]
    for p in procs:
        p.start()
    results = sorted((q.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(60)
    errors = [r for r in results if "error" in r]
    if errors:
        raise SystemExit(f"reader failed: {errors}")
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=100_000_000)
    ap.add_argument("--dir", default="/tmp/wharf-index-bench")
    ap.add_argument("--read", type=int, default=4000, help="samples each reader takes")
    ap.add_argument("--processes", type=int, default=2, help="readers at once (ranks)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(REPO / "bench-results"))
    ap.add_argument("--keep-index", action="store_true",
                    help="reuse an index file already built (build time then not measured)")
    a = ap.parse_args()

    root = Path(a.dir) / f"n{a.samples}"
    manifest = root / "manifest.jsonl"
    cache = str(Path(a.dir) / "index-cache")
    uri = "file://" + str(manifest)
    ctx = mp.get_context("spawn")

    gen_s = generate_manifest(manifest, a.samples)
    create_read_objects(root, a.samples, a.read, a.seed, a.processes)
    if not a.keep_index:  # a fresh build: nothing cached for this manifest
        for f in Path(cache).glob("m-*") if Path(cache).exists() else []:
            f.unlink()
    q = ctx.Queue()
    p = ctx.Process(target=build, args=(uri, cache, q))
    p.start()
    built = q.get(timeout=7200)
    p.join()
    readers = run_readers(ctx, uri, cache, a.read, a.seed, a.processes)
    in_memory = (run_readers(ctx, uri, False, a.read, a.seed, 1)
                 if a.samples <= 10_000_000 else [])

    result = {"samples": a.samples, "manifest_bytes": manifest.stat().st_size,
              "manifest_generate_s": gen_s, "build": built, "readers": readers,
              "in_memory_reader": in_memory, "read_per_reader": a.read,
              "processes": a.processes}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index_memory.json").write_text(json.dumps(result, indent=2))

    mb = 1024.0
    print(f"\n## Index memory: {a.samples:,} samples (manifest {result['manifest_bytes'] / 1e9:.2f}"
          f" GB, file://), {a.processes} readers x {a.read:,} shuffled samples\n")
    print(f"build (one process): {built['seconds']:.1f} s, index file "
          f"{built['file_bytes'] / 1e9:.2f} GB ({built['file_bytes'] / a.samples:.1f} B/sample), "
          f"builder peak RSS {built['peak_rss_kb'] / mb:.0f} MiB\n")
    print("| reader | index | open s | RssAnon growth MiB | RssFile growth MiB | "
          "Pss growth MiB | index map Rss MiB | index map Pss MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in readers + [dict(x, rank="mem") for x in in_memory]:
        g, m = r["growth_kb"], r["index_mapping_kb"]
        kind = "mapped file" if r["path"] else f"memory ({r['index_memory_bytes'] / 2**20:.0f} MiB)"
        print(f"| {r['rank']} | {kind} | {r['open_s']:.2f} | {g['rss_anon_kb'] / mb:.1f} | "
              f"{g['rss_file_kb'] / mb:.1f} | {g['pss_kb'] / mb:.1f} | {m['rss'] / mb:.1f} | "
              f"{m['pss'] / mb:.1f} |")
    print(f"\nwrote {out / 'index_memory.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
