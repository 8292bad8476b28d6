"""One rank of a CheckpointManager saved on some ranks and restored in place on more
(tests/checkpoint/test_manager.py runs these as subprocesses, so that pytest never forks).

    python manager_worker.py save|restore|onefails ROOT RDZV_FILE RANK WORLD_SIZE OUT_JSON

save: seeds python / numpy / torch per rank (seed 100 + rank), saves step 1 of a small model
  (synchronously), then writes the numbers its RNGs draw next (what a rank restoring this
  rank's state must draw).
restore: seeds per rank (seed 200 + rank), restores "latest" in place into a fresh model,
  writes the numbers its RNGs draw right after, the numbers its own pre-restore states draw
  (what a rank without a saved state must draw) and whether the model equals the saved one.
"""
import json
import os
import random
import sys
import warnings

import numpy
import torch
import torch.distributed as dist

from wharf.torch import CheckpointManager


def model_of(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(8, 4)


def seed_all(seed: int) -> None:
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)


def draws() -> list:
    return [random.random(), float(numpy.random.rand()), torch.rand(1).item()]


def main() -> None:
    mode, root, rdzv = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world_size, out = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    warnings.simplefilter("ignore")
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank,
                                world_size=world_size)
    found = {"rank": rank}
    if mode == "save":
        model = model_of(1)
        seed_all(100 + rank)
        mgr = CheckpointManager(root, async_save=False)
        mgr.save(1, {"model": model})
        found["draws"] = draws()
    elif mode == "onefails":
        # Async saves of steps 1-3; at step 1 the state of the last rank cannot be copied
        # (a meta tensor): that save must fail on every rank, and the next ones succeed.
        mgr = CheckpointManager(root)
        found["saves"] = {}
        for step in (1, 2, 3):
            state = {f"r{rank}": torch.full((4,), step * 10.0 + rank)}
            if step == 1 and rank == world_size - 1:
                state["bad"] = torch.empty(2, device="meta")
            try:
                mgr.save(step, state).result(timeout=120)
                found["saves"][step] = "ok"
            except Exception as e:  # noqa: BLE001 - the error is the result
                found["saves"][step] = f"{type(e).__name__}: {e}"
        mgr.wait()
        found["steps"] = [m["step"] for m in mgr.list()]
    else:
        model = model_of(2)
        seed_all(200 + rank)
        mine = (random.getstate(), numpy.random.get_state(), torch.get_rng_state())
        mgr = CheckpointManager(root)
        mgr.restore("latest", state={"model": model})
        found["draws"] = draws()
        random.setstate(mine[0])
        numpy.random.set_state(mine[1])
        torch.set_rng_state(mine[2])
        found["own_draws"] = draws()
        found["model_equal"] = all(torch.equal(a, b) for a, b in
                                   zip(model.state_dict().values(),
                                       model_of(1).state_dict().values()))
    mgr.close()
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main()
    # As dcp_worker.py: the results are written; leave without the interpreter's shutdown.
    sys.stdout.flush()
    os._exit(0)
