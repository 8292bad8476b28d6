"""One simulated training epoch over the demo data set, as DLIO measures storage: each batch
"computes" for a fixed time, and accelerator utilization (AU) = compute time / wall time.

    python -m wharf.demo [--dir .wharf/demo] [--cache .wharf/demo-tier] [--batch-size 64]
                         [--compute-ms 20] [--workers 2]

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
