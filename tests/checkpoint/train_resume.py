"""A small training run that test_manager.py interrupts and resumes (bit-exact resume).

    train_resume.py --mode full|killed|resume --data URI --ckpt ROOT --out PATH [--no-rng]

The model (Linear, ReLU, Dropout, Linear) trains with Adam on batches of 8 samples read from
a wharf IterableDataset (shuffle=True, seed=0) over objects of 16 float32 features and a
label; dropout draws from torch's RNG and each step scales its input by 1 + random.random()/10,
so python's RNG matters too. Step 6 is checkpointed (model, optimizer, the dataset's state;
the manager records the RNG states).

  full     trains steps 1..12 and writes --out.
  killed   trains to step 8, waits for the step-6 checkpoint to commit, prints
           "STEP 8 DONE" and waits to be killed.
  resume   restores "latest" from --ckpt (model, optimizer and RNG through the manager, the
           dataset through load_state_dict; --no-rng keeps this process's RNG states), prints
           "RESUMED <step>", trains to 12 and writes --out.

--out (torch.save): {"model": state_dict, "optim": state_dict, "keys": {step: [sample keys]},
"random": random.random() after the last step}.
"""
import argparse
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from wharf.torch import CheckpointManager, IterableDataset  # noqa: E402

BATCH = 8
STEPS = 12
CKPT_STEP = 6
KILL_AFTER = 8


def decode(sample):
    values = torch.frombuffer(bytearray(bytes(sample.data)), dtype=torch.float32)
    return values[:16], int(values[16])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["full", "killed", "resume"], required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--no-rng", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(1)
    # A resumed run starts from other seeds: only what the checkpoint restores may matter.
    seed = 1234 if args.mode == "resume" else 0
    torch.manual_seed(seed)
    random.seed(seed)
    torch.manual_seed(0)  # the same initial model in every mode (resume overwrites it)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(32, 4))
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ds = IterableDataset.from_prefix(args.data, shuffle=True, seed=0)
    mgr = CheckpointManager(args.ckpt, metric="loss")

    start = 0
    if args.mode == "resume":
        state = mgr.restore("latest", restore_rng=not args.no_rng)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        ds.load_state_dict(state["data"])
        start = mgr.last_restored["step"]
        print(f"RESUMED {start}", flush=True)

    model.train()
    it = iter(ds)
    keys, handle = {}, None
    for step in range(start + 1, STEPS + 1):
        batch = [next(it) for _ in range(BATCH)]
        keys[step] = [s.key for s in batch]
        xs, ys = zip(*(decode(s) for s in batch))
        x = torch.stack(xs) * (1.0 + random.random() / 10)
        loss = F.cross_entropy(model(x), torch.tensor(ys))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == CKPT_STEP and args.mode != "resume":
            handle = mgr.save(step, {"model": model, "optim": opt,
                                     "data": ds.state_dict(steps=step, batch_size=BATCH)},
                              metrics={"loss": loss.item()})
        if step == KILL_AFTER and args.mode == "killed":
            handle.result()
            print("STEP 8 DONE", flush=True)
            time.sleep(600)
            return
    mgr.close()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "keys": keys,
                "random": random.random()}, args.out)


if __name__ == "__main__":
    main()
