"""One simulated training epoch over the demo data set, as DLIO measures storage: each batch
"computes" for a fixed time, and accelerator utilization (AU) = compute time / wall time.

    python -m wharf.demo [--dir .wharf/demo] [--batch-size 64] [--compute-ms 20] [--workers 2]

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
    parser.add_argument("--dir", default=".wharf/demo", help="data set directory (wharf demo)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compute-ms", type=float, default=20.0,
                        help="simulated accelerator time per batch")
    # 0: the engine already reads in parallel in this process; worker processes add a copy of
    # every sample through pickling (measured here: 89% utilization with 0 workers, 61% with 2).
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    args = parser.parse_args(argv)

    import torch
    from wharf.torch import IterableDataset

    root = os.path.abspath(args.dir)
    if not os.path.isdir(os.path.join(root, "train")):
        print(f"wharf.demo: no data set in {root}: run `wharf demo` first", file=sys.stderr)
        return 1
    dataset = IterableDataset.from_prefix(f"file://{root}/train/", shuffle=True, seed=0)
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
    print("| training epoch (PyTorch DataLoader over wharf) | value |")
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
