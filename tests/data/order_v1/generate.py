#!/usr/bin/env python3
"""Reference vectors for order version 1 (Fisher-Yates over splitmix64): resume states exactly
as the code before order versions emitted them, and what follows each state.

Run once, with the extension built from commit 80321ed (the last one without order versions):

    PYTHONPATH=python .venv/bin/python tests/data/order_v1/generate.py

It writes sampler.json, records.json and torch.json next to itself. The shards the record
states read are committed in shards/ (JSON lines, contents fixed here); the objects of the
torch states are made by the tests (obj-NNN, content = the key, see make_objects()).

Where the data lives is part of a state: a local store's keys are absolute paths, and a state
carries the fingerprint of its index's keys. So the states are taken over copies at fixed
paths, ROOT/shards and ROOT/objects (ROOT = /tmp/wharf-order-v1), and the tests put the same
bytes there (place_data()) before restoring them unchanged.

The vectors are checked twice when generated: by the C++ extension that emitted them, and by
the pure-Python transcription of order version 1 below (splitmix64, Lemire's bounded draws,
Fisher-Yates, the two seed derivations), so a test pinned to them does not only restate what
one implementation happened to compute. After this change the tests (dataset/order_test.cc,
tests/python/test_order_v1.py) load these states and assert the exact continuation.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = "/tmp/wharf-order-v1"
SHARDS = os.path.join(ROOT, "shards")
OBJECTS = os.path.join(ROOT, "objects")
M64 = (1 << 64) - 1

# ---- order version 1, transcribed ----


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & M64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        return mix64(self.state)

    def uniform(self, n):  # Lemire's multiply-shift with rejection
        m = self.next() * n
        low = m & M64
        if low < n:
            threshold = ((1 << 64) - n) % n
            while low < threshold:
                m = self.next() * n
                low = m & M64
        return m >> 64


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def derive_seed(seed, stream):  # formats/shuffle.cc DeriveSeed: shard order, shuffle buffer
    a = SplitMix64(seed)
    return SplitMix64(a.next() ^ ((stream * 0xD1342543DE82EF95) & M64)).next()


def epoch_seed(seed, epoch):  # dataset/sampler.cc internal::EpochSeed: sample order
    return mix64(mix64(seed) ^ ((epoch * 0xD1B54A32D192ED03 + 0x8BB84B93962EACC9) & M64))


def fisher_yates(n, seed):
    order = list(range(n))
    rng = SplitMix64(seed)
    for i in range(n - 1, 0, -1):
        j = rng.uniform(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def sample_order(n, seed, epoch, shuffle):
    return fisher_yates(n, epoch_seed(seed, epoch)) if shuffle else list(range(n))


def shard_order(n, seed, epoch, shuffle):
    return fisher_yates(n, derive_seed(seed, epoch)) if shuffle else list(range(n))


def end_of_epoch(n, consumed, world, drop_last):
    if consumed >= n:
        return consumed
    r = n - consumed
    return consumed + (r // world if drop_last else (r + world - 1) // world) * world


def share(order, consumed, world, rank, workers, worker, block, drop_last):
    n = len(order)
    rank_count = (end_of_epoch(n, consumed, world, drop_last) - consumed) // world
    out = []
    first = worker * block
    while first < rank_count:
        for j in range(first, min(first + block, rank_count)):
            out.append(order[(consumed + rank + j * world) % n])
        first += workers * block
    return out


# ---- the data the record states read ----

SHARD_COUNT = 6
ROWS = 7


def shard_bytes():
    """{name: bytes} of the committed shards (what write_shards() wrote)."""
    return {f"part-{s}.jsonl": "".join(
        json.dumps({"shard": s, "row": i, "pad": "x" * ((s * 7 + i) % 5)}) + "\n"
        for i in range(ROWS)).encode() for s in range(SHARD_COUNT)}


def write_shards():
    os.makedirs(os.path.join(HERE, "shards"), exist_ok=True)
    for name, data in shard_bytes().items():
        with open(os.path.join(HERE, "shards", name), "wb") as f:
            f.write(data)


OBJECT_COUNT = 50


def object_bytes():
    """{name: bytes} of the torch sample states' objects: obj-000 .. obj-049, each its key."""
    return {f"obj-{i:03d}": f"obj-{i:03d}".encode() for i in range(OBJECT_COUNT)}


def place_data():
    """Puts the shards and the objects at ROOT (atomically per file: concurrent test runs
    write the same bytes)."""
    for folder, files in ((SHARDS, shard_bytes()), (OBJECTS, object_bytes())):
        os.makedirs(folder, exist_ok=True)
        for name, data in files.items():
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    if f.read() == data:
                        continue
            except FileNotFoundError:
                pass
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)


# ---- generation ----

SAMPLER_CASES = [
    # (num_samples, seed, shuffle, drop_last, epoch, consumed, [(world, workers, block)])
    (10, 0, True, False, 0, 4, [(1, 1, 1), (3, 1, 1)]),
    (1000, 1234, True, False, 7, 300, [(1, 1, 1), (3, 2, 4)]),
    (37, 7, True, True, 2, 10, [(4, 3, 2), (1, 1, 1)]),
    (37, 7, True, False, 2, 10, [(4, 3, 2)]),
    (100, 5, False, False, 3, 50, [(2, 1, 1)]),
    (4096, (1 << 63) + 5, True, False, 1, 1000, [(1, 1, 1), (8, 4, 16)]),
    (2, 99, True, False, 5, 1, [(1, 1, 1), (2, 1, 1)]),
    (1, 3, True, False, 0, 0, [(1, 1, 1)]),
]

RECORD_CASES = [
    # (seed, epoch, shuffle, shuffle_buffer, rank, world, worker, workers, stop_after)
    (3, 0, True, 0, 0, 1, 0, 1, 10),
    (3, 1, True, 5, 1, 2, 0, 1, 7),
    (11, 4, True, 8, 0, 1, 1, 2, 5),
    (11, 4, True, 8, 0, 1, 0, 2, 0),
    (0, 0, False, 0, 0, 1, 0, 1, 3),
    ((1 << 64) - 1, 9, True, 3, 2, 3, 0, 1, 4),
]


def gen_sampler(w):
    cases = []
    for n, seed, shuffle, drop_last, epoch, consumed, resumes in SAMPLER_CASES:
        s = w.Sampler(n, seed=seed, shuffle=shuffle, drop_last=drop_last)
        perm = list(s.permutation(epoch))
        assert perm == sample_order(n, seed, epoch, shuffle), (n, seed, epoch)
        case = {"num_samples": n, "seed": seed, "shuffle": shuffle, "drop_last": drop_last,
                "epoch": epoch, "consumed": consumed, "state": s.state(epoch, consumed),
                "permutation": perm, "resume": []}
        for world, workers, block in resumes:
            shares = []
            for rank in range(world):
                for worker in range(workers):
                    got = list(s.shard(epoch, consumed, rank, world, worker, workers, block))
                    assert got == share(perm, consumed, world, rank, workers, worker, block,
                                        drop_last)
                    shares.append({"rank": rank, "worker": worker, "samples": got})
            case["resume"].append({"world_size": world, "num_workers": workers,
                                   "worker_block": block, "shares": shares})
        cases.append(case)
    return cases


def gen_records(w):
    keys = [f"part-{s}.jsonl" for s in range(SHARD_COUNT)]
    index = w.SampleIndex.from_keys(SHARDS + "/", keys)
    cases = []
    for seed, epoch, shuffle, buf, rank, world, worker, workers, stop in RECORD_CASES:
        opts = dict(seed=seed, epoch=epoch, shuffle=shuffle, shuffle_buffer=buf, rank=rank,
                    world_size=world, worker=worker, num_workers=workers)
        whole = [(u, o, bytes(d).decode()) for u, o, d in w.RecordStream(index, "jsonl", **opts)]
        order = shard_order(SHARD_COUNT, seed, epoch, shuffle)
        mine = [keys[order[p]] for j, p in enumerate(range(rank, SHARD_COUNT, world))
                if j % workers == worker]
        stream = w.RecordStream(index, "jsonl", **opts)
        assert stream.shards == mine, (stream.shards, mine)
        before = [next(stream) for _ in range(stop)]
        state = stream.state()
        after = [(u, o, bytes(d).decode()) for u, o, d in stream]
        rel = lambda u: os.path.relpath(u[len("file://"):] if u.startswith("file://") else u,
                                        SHARDS)
        assert [(u, o) for u, o, _ in whole] == [(u, o) for u, o, _ in before] + \
            [(u, o) for u, o, _ in after]
        cases.append({"format": "jsonl", "shards": keys, **opts, "stop_after": stop,
                      "assigned": mine, "state": state,
                      "before": [[rel(u), o] for u, o, _ in before],
                      "after": [[rel(u), o, d] for u, o, d in after]})
    return cases


def gen_torch(wharf_torch, w):
    objects = OBJECTS
    out = {"objects": OBJECT_COUNT, "iterable": [], "sampler": [], "records": []}
    for seed, epoch, take, hint in [(5, 0, 13, 4), (8, 3, 21, 1)]:
        ds = wharf_torch.IterableDataset.from_prefix(objects + "/", seed=seed,
                                                     batch_size_hint=hint, rank=0, world_size=1)
        ds.set_epoch(epoch)
        it = iter(ds)
        first = [next(it).key for _ in range(take)]
        state = ds.state_dict()
        rest = [s.key for s in it]
        perm = sample_order(50, seed, epoch, True)
        assert first + rest == [f"obj-{i:03d}" for i in perm]
        out["iterable"].append({"seed": seed, "epoch": epoch, "batch_size_hint": hint,
                                "state_dict": state, "first": first, "rest": rest})
    index = w.SampleIndex.from_prefix(objects + "/")
    ds = wharf_torch.MapDataset(index)
    for seed, steps, batch in [(9, 3, 2), (4, 10, 2)]:
        sampler = wharf_torch.DistributedSampler(ds, seed=seed, rank=0, world_size=2)
        first = list(sampler)
        state = sampler.state_dict(steps=steps, batch_size=batch)
        resumed = wharf_torch.DistributedSampler(ds, seed=seed, rank=0, world_size=1)
        resumed.load_state_dict(state)
        out["sampler"].append({"seed": seed, "world_size": 2, "steps": steps,
                               "batch_size": batch, "first_rank0": first, "state_dict": state,
                               "rest_world1": list(resumed)})
    for seed, epoch, buf, take in [(3, 2, 4, 9), (6, 0, 0, 16)]:
        ds = wharf_torch.RecordDataset(SHARDS + "/", format="jsonl", seed=seed,
                                       shuffle_buffer=buf, rank=0, world_size=1)
        ds.set_epoch(epoch)
        it = iter(ds)
        first = [next(it).key for _ in range(take)]
        state = ds.state_dict()
        rest = [s.key for s in it]
        out["records"].append({"seed": seed, "epoch": epoch, "shuffle_buffer": buf,
                               "state_dict": state, "first": first, "rest": rest})
    return out


def main():
    if not os.environ.get("PYTHONPATH"):
        sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))
    import wharf._wharf as w
    import wharf.torch as wharf_torch
    write_shards()
    place_data()

    def dump(name, obj):
        with open(os.path.join(HERE, name), "w") as f:
            f.write(json.dumps(obj, indent=1) + "\n")

    dump("sampler.json", gen_sampler(w))
    dump("records.json", gen_records(w))
    dump("torch.json", gen_torch(wharf_torch, w))


if __name__ == "__main__":
    main()
