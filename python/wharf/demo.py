"""One simulated training epoch over the demo data set, as DLIO measures storage: each batch
"computes" for a fixed time, and accelerator utilization (AU) = compute time / wall time.
Then the checkpoint part of the workflow: the run's state is saved to the tier (async), exported
to the store, the tier's copy deleted, and the checkpoint restored from the store.

    python -m wharf.demo [--dir .wharf/demo] [--cache .wharf/demo-tier] [--batch-size 64]
                         [--compute-ms 20] [--workers 2] [--no-checkpoint]

`./run demo` runs it after `wharf demo` has generated the data set.
"""
import argparse
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
    for batch in loader:
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
    if samples != len(dataset):
        print(f"wharf.demo: read {samples} samples, expected {len(dataset)}", file=sys.stderr)
        return 1
    if args.no_checkpoint or not args.cache:
        return 0
    return checkpoint(args, uri, dataset, batches)


def checkpoint(args, data_uri, dataset, steps) -> int:
    """Saves the run's state to the tier, exports it to the store, loses the tier's copy and
    restores it from the store; prints what each took."""
    import shutil

    import torch
    from wharf.torch import CheckpointManager

    import wharf
    torch.manual_seed(0)
    # A stand-in model and optimizer (~50 MB of state with Adam's moments).
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 1024)).square().mean().backward()
    opt.step()
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


if __name__ == "__main__":
    sys.exit(main())
