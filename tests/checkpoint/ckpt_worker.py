"""A process that test_manager.py kills with -9 in the middle of a save.

    ckpt_worker.py ROOT [--endpoint URL] [--mib N] [--export-to URI]

Saves step 1 (small: tensors from seed 1, see step1_state) synchronously, prints "SAVED 1",
then prints "SAVING 2" and saves a big step 2 (N MiB in two tensors, so two files, each a
multipart upload on s3://); prints "SAVED 2" if it ever finishes, then waits to be killed.
With --export-to, the manager exports each step there (through --endpoint): step 1's export
completes before "SAVED 1"; step 2's runs in the background after "SAVED 2" (to be killed in).
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402

from wharf.torch import CheckpointManager  # noqa: E402


def step1_state() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"w": torch.randn(64, 256, generator=g), "b": torch.randn(256, generator=g),
            "meta": {"step": 1, "name": "small"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--endpoint", default=None)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--export-to", default=None)
    p.add_argument("--again", action="store_true", help="the second save is of step 1 again")
    args = p.parse_args()
    options = {"endpoint": args.endpoint} if args.endpoint else {}
    mgr = CheckpointManager(args.root, export_to=args.export_to, async_save=False, **options)
    mgr.save(1, step1_state())
    mgr.wait()
    print("SAVED 1", flush=True)
    half = (args.mib << 20) // 2 // 4  # float32 elements per tensor
    big = {"a": torch.full((half,), 2.0), "b": torch.full((half,), 3.0), "meta": {"step": 2}}
    print("SAVING 2", flush=True)
    mgr.save(1 if args.again else 2, big)
    print("SAVED 2", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
