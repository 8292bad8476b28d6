"""wharf's accelerator paths timed on a CUDA device (issues 13 and 14 on a GPU machine).

    python bench/gpu_bench.py [--gib 2] [--repeat 3] [--dir /tmp/wharf-gpu-bench] [--out F.md]

Part A, model loading onto the GPU: a model of --gib GiB of bf16 in 4 safetensors shards (a
few hundred tensors) on the local disk, loaded onto cuda:0 by safetensors.torch.load_file
(device="cuda:0"), by wharf.serve.load_safetensors(device="cuda"), and, for the CPU side, both
into CPU memory. Each load runs in a fresh process (its CUDA context made before the clock
starts), clients interleaved, --repeat rounds, page cache warm (the files were just written
and read), and once more after dropping the page cache where the machine allows it; seconds
to the last tensor on the GPU (synchronized), GB/s, and the process's peak RSS above its RSS
before the load.

Part B, checkpoints of a CUDA training state (--gib GiB of fp32 in 256 tensors on the GPU) to
the local disk: the training loop's stall of wharf.torch.CheckpointManager's async save
against one device-to-host copy of the state into pinned memory (the floor of any async save)
and against a synchronous save; whole saves by the manager (sync), by DCP's FileSystemWriter,
by DCP through wharf's StorageWriter, and by torch.save into a file; loads back into the CUDA
tensors in place by the manager, DCP's FileSystemReader and wharf's StorageReader.
Medians of --repeat. Prints a markdown report (and writes it to --out).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
# WHARF_GPU_BENCH_DRY=1: the same code on the CPU, tiny, to check the script without a GPU.
DRY = os.environ.get("WHARF_GPU_BENCH_DRY") == "1"
DEV = "cpu" if DRY else "cuda"


def sync() -> None:
    if not DRY:
        import torch
        torch.cuda.synchronize()


def drop_caches() -> bool:
    if DRY:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ---- part A: one load in this process (run as a child) ----

def load_once(method: str, folder: str) -> dict:
    import torch
    torch.empty(1, device=DEV)  # the CUDA context, before the clock
    import wharf.serve  # noqa: F401  (imported before the clock too)
    import safetensors.torch
    shards = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                    if f.endswith(".safetensors"))
    index = os.path.join(folder, "model.safetensors.index.json")
    before = rss_mib()
    t0 = time.perf_counter()
    if method == "safetensors-cuda":
        out = {}
        for s in shards:
            out.update(safetensors.torch.load_file(s, device=DEV))
    elif method == "wharf-cuda":
        out = wharf.serve.load_safetensors(index, device=DEV)
    elif method == "wharf-iter-cuda":
        out = dict(wharf.serve.iter_safetensors(index, device=DEV))
    elif method == "safetensors-cpu":
        out = {}
        for s in shards:
            out.update(safetensors.torch.load_file(s))
    elif method == "wharf-cpu":
        out = wharf.serve.load_safetensors(index)
    else:
        raise SystemExit(f"unknown method {method}")
    sync()
    seconds = time.perf_counter() - t0
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "bytes": nbytes, "tensors": len(out),
            "rss_above_mib": max(0.0, peak - before)}


def make_model(folder: str, gib: float) -> None:
    import torch
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    total = int(gib * 2**30)
    # A transformer-ish mix: per layer 4 square matrices, 2 wide ones, 2 vectors.
    d = 2048
    layer = 4 * d * d + 2 * d * 4 * d + 2 * d
    layers = max(1, total // (layer * 2))
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(layers):
        for n in ("q", "k", "v", "o"):
            tensors[f"layers.{i}.attn.{n}.weight"] = (d, d)
        tensors[f"layers.{i}.mlp.up.weight"] = (4 * d, d)
        tensors[f"layers.{i}.mlp.down.weight"] = (d, 4 * d)
        tensors[f"layers.{i}.norm1.weight"] = (d,)
        tensors[f"layers.{i}.norm2.weight"] = (d,)
    names = list(tensors)
    shards = 4
    weight_map = {}
    for s in range(shards):
        part = {}
        for n in names[s * len(names) // shards:(s + 1) * len(names) // shards]:
            part[n] = torch.randn(tensors[n], generator=g).to(torch.bfloat16)
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, os.path.join(folder, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def part_a(args, report: list) -> None:
    folder = os.path.join(args.dir, "model")
    if not os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
        t0 = time.perf_counter()
        make_model(folder, args.gib)
        print(f"model written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    methods = ["safetensors-cuda", "wharf-cuda", "wharf-iter-cuda", "safetensors-cpu",
               "wharf-cpu"]
    rounds: dict = {m: [] for m in methods}

    def child(m):
        out = subprocess.run([sys.executable, __file__, "--child", m, "--dir", folder],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"{m} failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    child("wharf-cpu")  # warm the page cache
    for r in range(args.repeat):
        order = methods[r % len(methods):] + methods[:r % len(methods)]
        for m in order:
            rounds[m].append(child(m))
    cold = {}
    for m in methods[:3]:
        if drop_caches():
            cold[m] = child(m)
    size = rounds[methods[0]][0]["bytes"]
    report.append(f"### A. Model loading: {size / 2**30:.2f} GiB of bf16, "
                  f"{rounds[methods[0]][0]['tensors']} tensors in 4 safetensors shards on the "
                  f"local disk (median of {args.repeat}, page cache warm)\n")
    report.append("| client | seconds | GB/s | vs safetensors (same device) | peak RSS above start, MiB | cold (page cache dropped): s, GB/s |")
    report.append("|---|---:|---:|---:|---:|---:|")
    med = {m: statistics.median(x["seconds"] for x in rounds[m]) for m in methods}
    for m in methods:
        base = med["safetensors-cuda" if m.endswith("cuda") else "safetensors-cpu"]
        rss = max(x["rss_above_mib"] for x in rounds[m])
        c = cold.get(m)
        cold_s = f"{c['seconds']:.2f} s, {size / c['seconds'] / 1e9:.2f}" if c else "-"
        report.append(f"| {m} | {med[m]:.3f} | {size / med[m] / 1e9:.2f} | "
                      f"{base / med[m]:.2f}x | {rss:.0f} | {cold_s} |")
    report.append("")
    report.append("Rounds (s): " + "; ".join(
        f"{m} " + "/".join(f"{x['seconds']:.2f}" for x in rounds[m]) for m in methods))
    report.append("")


# ---- part B: checkpoints of a CUDA state ----

def part_b(args, report: list) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    import warnings
    warnings.filterwarnings("ignore")
    from wharf.torch import CheckpointManager
    from wharf.torch.checkpoint import StorageReader, StorageWriter
    n = 256
    per = int(args.gib * 2**30) // n // 4
    g = torch.Generator(device=DEV).manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(per, device=DEV, generator=g) for i in range(n)}
    nbytes = n * per * 4
    base = os.path.join(args.dir, "ckpt")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    res: dict = {}

    def timed(name, fn):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        res.setdefault(name, []).append(time.perf_counter() - t0)

    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=not DRY) for k, v in state.items()}

    def d2h():
        for k, v in state.items():
            pinned[k].copy_(v, non_blocking=True)

    def touch():  # the loop goes on: the state changes after every save
        for v in state.values():
            v.add_(1.0)

    dd = subprocess.run(["dd", "if=/dev/zero", f"of={base}/dd", "bs=1M", "count=1024",
                         "conv=fsync"], capture_output=True, text=True)
    os.remove(f"{base}/dd")
    report.append(f"The disk: `dd bs=1M count=1024 conv=fsync`: "
                  f"{dd.stderr.strip().splitlines()[-1] if dd.stderr.strip() else dd.returncode}\n")
    rss0 = rss_mib()
    mgr = CheckpointManager(os.path.join(base, "async"), keep_last=1)
    sync_mgr = CheckpointManager(os.path.join(base, "sync"), keep_last=1, async_save=False)
    step = 0
    for r in range(args.repeat + 1):  # the first round allocates the staging copy
        timed("d2h copy into pinned memory", d2h)
        step += 1
        t0 = time.perf_counter()
        handle = mgr.save(step, {"model": state})
        stall = time.perf_counter() - t0
        touch()
        handle.result()
        whole = time.perf_counter() - t0
        if r:
            res.setdefault("manager async: stall", []).append(stall)
            res.setdefault("manager async: whole save", []).append(whole)
        timed("manager sync save", lambda: sync_mgr.save(step, {"model": state}))
        d = os.path.join(base, f"fsw-{r}")
        timed("DCP FileSystemWriter save",
              lambda: dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(d)))
        w = "file://" + os.path.join(base, f"wsw-{r}")
        timed("DCP + wharf StorageWriter save",
              lambda: dcp.save({"model": state}, storage_writer=StorageWriter(w)))
        w1 = "file://" + os.path.join(base, f"wsw1-{r}")
        timed("DCP + wharf StorageWriter save, files_per_rank=1",
              lambda: dcp.save({"model": state},
                               storage_writer=StorageWriter(w1, files_per_rank=1)))
        shutil.rmtree(w1[len("file://"):], ignore_errors=True)
        cpu_state = {k: v.cpu() for k, v in state.items()}
        w2 = "file://" + os.path.join(base, f"wsw2-{r}")
        timed("DCP + wharf StorageWriter save of the same state in CPU memory",
              lambda: dcp.save({"model": cpu_state}, storage_writer=StorageWriter(w2)))
        d2 = os.path.join(base, f"fsw2-{r}")
        timed("DCP FileSystemWriter save of the same state in CPU memory",
              lambda: dcp.save({"model": cpu_state}, storage_writer=dcp.FileSystemWriter(d2)))
        del cpu_state
        shutil.rmtree(w2[len("file://"):], ignore_errors=True)
        shutil.rmtree(d2, ignore_errors=True)

        def tsave(path=os.path.join(base, f"torch-{r}.pt")):
            with open(path, "wb") as f:
                torch.save({"model": state}, f)
                f.flush()
                os.fsync(f.fileno())
        timed("torch.save into a file (fsync)", tsave)
        touch()
        # Loads into the CUDA tensors in place, page cache dropped first where allowed.
        dropped = drop_caches()
        timed("manager restore in place", lambda: mgr.restore(step, state={"model": state}))
        drop_caches()
        timed("DCP FileSystemReader load",
              lambda: dcp.load({"model": state}, storage_reader=dcp.FileSystemReader(d)))
        drop_caches()
        timed("DCP + wharf StorageReader load",
              lambda: dcp.load({"model": state}, storage_reader=StorageReader(w)))
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(w[len("file://"):], ignore_errors=True)
        os.remove(os.path.join(base, f"torch-{r}.pt"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report.append(f"### B. Checkpoints of a CUDA state: {nbytes / 2**30:.2f} GiB of fp32 in {n} "
                  f"tensors, to the local disk (median of {args.repeat}; loads after dropping "
                  f"the page cache: {'yes' if dropped else 'not allowed here'})\n")
    report.append("| what | seconds | GB/s |")
    report.append("|---|---:|---:|")
    for name, xs in res.items():
        xs = xs[1:] if len(xs) > args.repeat else xs
        m = statistics.median(xs)
        report.append(f"| {name} | {m:.3f} | {nbytes / m / 1e9:.2f} |")
    med = {k: statistics.median(v[1:] if len(v) > args.repeat else v) for k, v in res.items()}
    report.append("")
    report.append(f"- async stall / one D2H copy: "
                  f"**{med['manager async: stall'] / med['d2h copy into pinned memory']:.2f}x** "
                  f"(target <= 1.2x); async stall / sync save: "
                  f"**{med['manager async: stall'] / med['manager sync save']:.0%}**")
    report.append(f"- manager sync save vs FileSystemWriter: "
                  f"**{med['DCP FileSystemWriter save'] / med['manager sync save']:.2f}x**; "
                  f"wharf StorageWriter vs FileSystemWriter: "
                  f"**{med['DCP FileSystemWriter save'] / med['DCP + wharf StorageWriter save']:.2f}x**")
    report.append(f"- manager restore vs FileSystemReader: "
                  f"**{med['DCP FileSystemReader load'] / med['manager restore in place']:.2f}x**; "
                  f"wharf StorageReader vs FileSystemReader: "
                  f"**{med['DCP FileSystemReader load'] / med['DCP + wharf StorageReader load']:.2f}x**")
    report.append(f"- process peak RSS above its RSS before the first save: "
                  f"{peak - rss0:.0f} MiB (the pinned reference copy and the async staging "
                  f"copy are {nbytes / 2**20:.0f} MiB each)")
    report.append("")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repeat-b", type=int, help="rounds of part B (default: --repeat)")
    ap.add_argument("--dir", default="/tmp/wharf-gpu-bench")
    ap.add_argument("--parts", default="a,b")
    ap.add_argument("--out")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(load_once(args.child, args.dir)))
        return
    import torch
    if not DRY and not torch.cuda.is_available():
        raise SystemExit("gpu_bench: torch sees no CUDA device")
    report = [f"## GPU: {'none (dry run)' if DRY else torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
              f"{os.cpu_count()} CPUs\n"]
    if "a" in args.parts:
        part_a(args, report)
    if "b" in args.parts:
        args.repeat = args.repeat_b or args.repeat
        part_b(args, report)
    text = "\n".join(report)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
