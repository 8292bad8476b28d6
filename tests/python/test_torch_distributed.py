"""wharf.torch.IterableDataset across 2 ranks (spawned processes, gloo on 127.0.0.1), each with
a DataLoader of 2 workers: every sample once per epoch, the same order for the same seed and
epoch, another order next epoch, the same global order as one rank, and mid-epoch resume on
2 ranks and on 1 rank; tar shards through torchdata's StatefulDataLoader, stopped and resumed
per worker; CSV row files read by a spawned worker. On file:// and on the real S3 server."""
import collections
import json

from torch.utils.data import DataLoader

import torch_helpers as h
from torch_helpers import target  # noqa: F401 - the fixture
from wharf.torch import IterableDataset
from test_torch_records import tar_bytes

N = 100
SHARDS = 8
PER_SHARD = 5
BATCH = 4
RESUME_STEPS = 3


def interleave(shares):
    """The global sequence from rank shares: position p is share p % W, item p // W."""
    w = len(shares)
    return [shares[p % w][p // w] for p in range(sum(len(s) for s in shares))]


def one_rank_order(uri, epoch, state=None):
    ds = IterableDataset.from_prefix(uri, seed=7, batch_size_hint=BATCH, rank=0, world_size=1)
    ds.set_epoch(epoch)
    if state is not None:
        ds.load_state_dict(state)
    return [k for b in DataLoader(ds, batch_size=BATCH, collate_fn=h.sample_keys) for k in b]


def test_two_ranks_with_two_workers_each(target, tmp_path):
    uri, store = target
    keys = h.write_objects(store, "s/", N)
    uri += "s/"
    for s in range(SHARDS):
        store.put(f"shards/{s:02d}.tar", tar_bytes(
            [(f"t{s}/x{i}.bin", b"%d-%d" % (s, i)) for i in range(PER_SHARD)]))
    for f in range(4):
        rows = "".join(f"{f * 10 + i},x\n" for i in range(3))
        store.put(f"rows/f{f}.csv", ("id,v\n" + rows).encode())
    root = uri[:-len("s/")]
    h.run_ranks(h.rank_main, (2, h.free_port(), uri, str(tmp_path), RESUME_STEPS,
                              root + "shards/", root + "rows/"), nprocs=2,
                stacks_dir=str(tmp_path / "stacks"))
    r = json.loads((tmp_path / "results.json").read_text())
    all_keys = sorted(k[2:] for k in keys)

    # Every sample exactly once per epoch across ranks, equal counts per rank.
    for run in ("epoch0", "epoch0_again", "epoch1"):
        shares = r[run]
        assert [len(s) for s in shares] == [N // 2] * 2 == r["len"]
        assert sorted(shares[0] + shares[1]) == all_keys
    # Same seed and epoch: same order; next epoch: another one.
    assert r["epoch0_again"] == r["epoch0"]
    assert r["epoch1"] != r["epoch0"]
    # The interleaved shares are the one-rank order (the order does not depend on W).
    assert interleave(r["epoch0"]) == one_rank_order(uri, 0)
    assert interleave(r["epoch1"]) == one_rank_order(uri, 1)

    # Resume on 2 ranks: consumed + rest is the epoch, exactly once.
    states = r["state"]
    assert states[0] == states[1]
    assert states[0]["consumed"] == RESUME_STEPS * BATCH * 2 and states[0]["epoch"] == 2
    consumed = r["consumed"][0] + r["consumed"][1]
    assert len(consumed) == RESUME_STEPS * BATCH * 2
    rest = r["rest"][0] + r["rest"][1]
    assert sorted(consumed + rest) == all_keys
    order2 = one_rank_order(uri, 2)
    assert interleave(r["consumed"]) == order2[:len(consumed)]
    assert interleave(r["rest"]) == order2[len(consumed):]

    # Resume the 2-rank checkpoint on 1 rank: exactly the samples not yet seen, in order.
    rest1 = one_rank_order(uri, 2, state=states[0])
    assert rest1 == order2[len(consumed):]
    assert collections.Counter(consumed + rest1) == collections.Counter(all_keys)

    # Record shards, 2 ranks x 2 workers (StatefulDataLoader): every record exactly once
    # across ranks, and each rank's stopped-and-resumed run equals its uninterrupted one.
    full = r["records_full"]
    assert sorted(full[0] + full[1]) == sorted(f"t{s}/x{i}" for s in range(SHARDS)
                                               for i in range(PER_SHARD))
    assert r["records_resumed"] == full

    # Row files, one spawned worker per rank: each rank its own files' rows (2 files of 3).
    shares = r["rows_spawn"]
    assert [len(s) for s in shares] == [6, 6]
    assert sorted(shares[0] + shares[1]) == [f * 10 + i for f in range(4) for i in range(3)]
