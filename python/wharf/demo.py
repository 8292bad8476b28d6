"""One simulated training epoch over the demo data set, as DLIO measures storage: each batch
"computes" for a fixed time, and accelerator utilization (AU) = compute time / wall time.
Then the checkpoint part of the workflow: the run's state is saved to the tier (async), exported
to the store, the tier's copy deleted, and the checkpoint restored from the store.

    python -m wharf.demo [--dir .wharf/demo] [--cache .wharf/demo-tier] [--batch-size 64]
                         [--compute-ms 20] [--workers 2] [--no-checkpoint]

`./run demo` runs it after `wharf demo` has generated the data set.
"""
import argparse
import json
import os
import sys
import time


def _identity(batch):
    return batch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".wharf/demo",
                        help="where `wharf demo` wrote the data set: a folder or a URI")
    parser.add_argument("--cache", default=None,
                        help="read through this tier (where `wharf demo` imported the data set)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compute-ms", type=float, default=20.0,
                        help="simulated accelerator time per batch")
    # 0: the engine already reads in parallel in this process; worker processes add a copy of
    # every sample through pickling (measured here: 89% utilization with 0 workers, 61% with 2).
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--no-checkpoint", action="store_true",
                        help="skip the checkpoint save / export / restore")
    parser.add_argument("--no-serve", action="store_true",
                        help="skip serving the model (safetensors in the tier, prediction cache)")
    args = parser.parse_args(argv)

    import torch
    from wharf.torch import IterableDataset

    import wharf
    if "://" in args.dir:
        uri = args.dir.rstrip("/") + "/train/"
    else:
        uri = f"file://{os.path.abspath(args.dir)}/train/"
    try:
        store_options = {"cache": args.cache} if args.cache else {}
        dataset = IterableDataset.from_prefix(uri, shuffle=True, seed=0, **store_options)
    except wharf.WharfError as e:
        print(f"wharf.demo: {e}", file=sys.stderr)
        return 1
    if len(dataset) == 0:
        print(f"wharf.demo: no data set at {uri}: run `wharf demo --dir {args.dir}` first",
              file=sys.stderr)
        return 1
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size,
                                         num_workers=args.workers, collate_fn=_identity)
    compute = args.compute_ms / 1000.0
    samples = batches = 0
    nbytes = 0
    start = time.perf_counter()
    # The profiler answers "what holds the accelerator back?" for this epoch (no trace file).
    with wharf.profile(trace=False) as prof:
        for batch in prof.iterate(loader):
            for sample in batch:
                nbytes += len(memoryview(sample.data))
            samples += len(batch)
            batches += 1
            time.sleep(compute)  # the accelerator's step
    wall = time.perf_counter() - start
    busy = batches * compute
    print()
    where = f"from the tier {args.cache}" if args.cache else "from the store"
    print(f"| training epoch (PyTorch DataLoader over wharf, {where}) | value |")
    print("|---|---|")
    print(f"| samples | {samples} |")
    print(f"| batches of {args.batch_size}, {args.workers} workers | {batches} |")
    print(f"| MB read | {nbytes / 1e6:.1f} |")
    print(f"| compute per batch | {args.compute_ms:.0f} ms |")
    print(f"| wall seconds | {wall:.2f} |")
    print(f"| samples/s | {samples / wall:.0f} |")
    print(f"| accelerator utilization | {100 * busy / wall:.1f}% |")
    waited = prof.stages["consumer_wait"]["seconds"]
    print(f"| waiting for data (wharf.profile) | {waited:.2f} s ({100 * waited / wall:.0f}%) |")
    print(f"| what bounds it (wharf.profile) | {prof.verdict} |")
    if samples != len(dataset):
        print(f"wharf.demo: read {samples} samples, expected {len(dataset)}", file=sys.stderr)
        return 1
    if not args.cache:
        return 0
    torch.manual_seed(0)
    # A stand-in model and optimizer (~50 MB of state with Adam's moments), one step trained.
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 1024)).square().mean().backward()
    opt.step()
    if not args.no_checkpoint:
        rc = checkpoint(args, uri, dataset, batches, model, opt)
        if rc != 0:
            return rc
    if args.no_serve:
        return 0
    return serve(args, model)


def checkpoint(args, data_uri, dataset, steps, model, opt) -> int:
    """Saves the run's state to the tier, exports it to the store, loses the tier's copy and
    restores it from the store; prints what each took."""
    import shutil

    import torch
    from wharf.torch import CheckpointManager

    import wharf
    root = os.path.join(os.path.abspath(args.cache), "ckpt")
    store = data_uri[:-len("train/")] + "ckpt/"
    state = {"model": model, "optim": opt,
             "data": dataset.state_dict(steps=steps, batch_size=args.batch_size)}
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
    try:
        mgr = CheckpointManager(root, export_to=store, keep_last=2)
        t0 = time.perf_counter()
        handle = mgr.save(steps, state, metrics={"loss": 1.0})
        stall = time.perf_counter() - t0
        handle.result()
        saved = time.perf_counter() - t0
        mgr.wait()  # the export to the store
        exported = time.perf_counter() - t0
        listed = {m["step"]: m["where"] for m in mgr.list()}
        shutil.rmtree(root)  # the tier's copy is lost
        t1 = time.perf_counter()
        restored = CheckpointManager(root, export_to=store).restore("latest")
        restore_s = time.perf_counter() - t1
    except wharf.WharfError as e:
        print(f"wharf.demo: checkpoint: {e}", file=sys.stderr)
        return 1
    same = all(torch.equal(restored["model"][k], v) for k, v in model.state_dict().items())
    print()
    print("| checkpoint (CheckpointManager: tier, export, restore) | value |")
    print("|---|---|")
    print(f"| state | {nbytes / 1e6:.0f} MB (model + Adam) + the loader's position |")
    print(f"| save() blocked the loop (async: the staging copy) | {stall * 1e3:.0f} ms |")
    print(f"| committed to the tier {root} | {saved:.2f} s |")
    print(f"| exported to {store} | {exported:.2f} s |")
    print(f"| step {steps} was in | {listed.get(steps)} |")
    print(f"| tier copy deleted, restored from the store | {restore_s:.2f} s |")
    print(f"| restored state equals the saved one | {'yes' if same else 'NO'} |")
    if not same or restored["data"] != state["data"]:
        print("wharf.demo: the restored checkpoint differs from the saved one", file=sys.stderr)
        return 1
    return 0


def serve(args, model) -> int:
    """Saves the model as safetensors in the tier, loads it back with wharf.serve, and answers
    requests (a skewed mix, as real traffic is) through a PredictionCache in the tier; prints
    the load time, hit rate and latencies."""
    import array
    import random

    import torch
    from safetensors.torch import save_file

    import wharf
    from wharf.serve import PredictionCache, load_safetensors
    model_dir = os.path.join(os.path.abspath(args.cache), "models", "demo")
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, "model.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    try:
        t0 = time.perf_counter()
        state = load_safetensors(path)
        load_s = time.perf_counter() - t0
        served = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                     torch.nn.Linear(2048, 2048))
        served.load_state_dict(state)
        served.eval()
        # The model's version: its file's size and mtime, so a new model never serves an old
        # prediction.
        st = os.stat(path)
        version = f"demo-{st.st_size}-{st.st_mtime_ns}"
        cache_dir = os.path.join(os.path.abspath(args.cache), "predictions")

        # Requests are the input's float32 bytes: keyed as they are (a JSON request works too,
        # but is canonicalised on every call, which costs more than a hit for 1,024 numbers).
        def compute(request):
            x = torch.frombuffer(bytearray(request), dtype=torch.float32).unsqueeze(0)
            with torch.no_grad():
                y = served(x)[0, :4]
            return json.dumps([round(v, 6) for v in y.tolist()]).encode()

        rng = random.Random(0)
        requests = 200
        hit_s, miss_s = [], []
        with PredictionCache(cache_dir, ttl=3600, max_bytes="64M") as cache:
            before = cache.stats()
            for _ in range(requests):
                # Zipf-like: a few inputs are asked often, most rarely.
                which = min(int(rng.paretovariate(1.2)), 50)
                request = array.array(
                    "f", [float((which * 7 + i) % 13) / 13 for i in range(1024)]).tobytes()
                hits = cache.stats()["hits"]
                t = time.perf_counter()
                out = cache.get_or_compute(version, request, compute)
                dt = time.perf_counter() - t
                (hit_s if cache.stats()["hits"] > hits else miss_s).append(dt)
                if out != compute(request):
                    print("wharf.demo: the cache answered a different prediction",
                          file=sys.stderr)
                    return 1
            after = cache.stats()
    except wharf.WharfError as e:
        print(f"wharf.demo: serve: {e}", file=sys.stderr)
        return 1
    same = all(torch.equal(state[k], v) for k, v in model.state_dict().items())

    def pct(xs, q):
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")

    hits = after["hits"] - before["hits"]
    print()
    print("| serving (wharf.serve: safetensors from the tier, PredictionCache) | value |")
    print("|---|---|")
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(f"| model {path} | {nbytes / 1e6:.0f} MB, {len(state)} tensors |")
    print(f"| load_safetensors | {load_s:.2f} s |")
    print(f"| loaded tensors equal the trained ones | {'yes' if same else 'NO'} |")
    print(f"| requests (skewed mix of 51 inputs) | {requests} |")
    print(f"| cache hit rate ({cache_dir}) | {100 * hits / requests:.0f}% |")
    print(f"| hit latency p50 / p99 | {pct(hit_s, 0.5):.2f} / {pct(hit_s, 0.99):.2f} ms |")
    print(f"| miss latency p50 / p99 (the model runs) | {pct(miss_s, 0.5):.2f} / "
          f"{pct(miss_s, 0.99):.2f} ms |")
    if not same:
        print("wharf.demo: the loaded model differs from the saved one", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
