"""wharf.torch.IterableDataset in one process: resume arithmetic, padding and drop_last, the
order's independence from the world size, rank detection. On file:// and on the real S3
server. (Real ranks and DataLoader workers: test_torch_distributed.py.)"""
import collections
import itertools

import pytest
from torch.utils.data import DataLoader

import torch_helpers as h
from torch_helpers import target  # noqa: F401 - the fixture
import wharf
from wharf.torch import IterableDataset, MapDataset, distributed_info

N = 101  # not a multiple of the world sizes: padding and drop_last matter
BATCH = 4


@pytest.fixture
def uri(target):
    base, store = target
    h.write_objects(store, "s/", N)
    return base + "s/"


def share(uri, rank, world, epoch=0, state=None, steps=None, **kw):
    """The keys one rank yields (num_workers=0), optionally stopping after `steps` batches."""
    ds = IterableDataset.from_prefix(uri, seed=11, batch_size_hint=BATCH, rank=rank,
                                     world_size=world, **kw)
    ds.set_epoch(epoch)
    if state is not None:
        ds.load_state_dict(state)
    loader = DataLoader(ds, batch_size=BATCH, collate_fn=h.sample_keys)
    return [k for batch in itertools.islice(loader, steps) for k in batch], ds


def test_order_is_the_same_for_any_world_size(uri):
    one, ds = share(uri, 0, 1)
    assert sorted(one) == sorted(f"{i:03d}.bin" for i in range(N)) and len(ds) == N
    for world in (2, 3):
        shares = [share(uri, r, world)[0] for r in range(world)]
        assert len({len(s) for s in shares}) == 1  # equal counts: padded
        padded = [shares[p % world][p // world] for p in range(sum(map(len, shares)))]
        assert padded[:N] == one and padded[N:] == one[:len(padded) - N]
    assert share(uri, 0, 1, epoch=1)[0] != one
    unshuffled = share(uri, 0, 1, shuffle=False)[0]
    assert unshuffled == sorted(unshuffled)


def test_drop_last_drops_the_tail(uri):
    one = share(uri, 0, 1)[0]
    shares = [share(uri, r, 2, drop_last=True)[0] for r in range(2)]
    assert [len(s) for s in shares] == [N // 2] * 2
    assert [shares[p % 2][p // 2] for p in range(N - 1)] == one[:N - 1]


def test_resume_in_one_process(uri):
    full = share(uri, 0, 1, epoch=3)[0]
    steps = 5
    head, ds = share(uri, 0, 1, epoch=3, steps=steps)
    # Counted from what this process yielded, or computed from the step count: the same.
    state = ds.state_dict()
    assert state == ds.state_dict(steps=steps) and state["consumed"] == steps * BATCH
    assert state["epoch"] == 3 and state["seed"] == 11 and state["num_samples"] == N
    rest, resumed = share(uri, 0, 1, epoch=3, state=state)
    assert head + rest == full
    assert len(resumed) == N - steps * BATCH
    # The resumed epoch keeps its cursor through set_epoch of the same epoch, not the next.
    resumed.set_epoch(3)
    assert len(resumed) == N - steps * BATCH
    resumed.set_epoch(4)
    assert len(resumed) == N


def test_one_rank_resumes_a_two_rank_checkpoint(uri):
    steps = 4
    heads, states = [], []
    for rank in range(2):
        head, ds = share(uri, rank, 2, epoch=1, steps=steps)
        heads.append(head)
        states.append(ds.state_dict(steps=steps))
    assert states[0] == states[1]  # every rank computes the same checkpoint locally
    assert states[0]["consumed"] == wharf.consumed_after(0, steps * BATCH, 2)
    rest = share(uri, 0, 1, epoch=1, state=states[0])[0]
    assert collections.Counter(heads[0] + heads[1] + rest) == \
        collections.Counter(f"{i:03d}.bin" for i in range(N))
    # And three ranks resuming it: the same samples, re-dealt.
    rest3 = [share(uri, r, 3, epoch=1, state=states[0])[0] for r in range(3)]
    assert sorted(set(rest3[0] + rest3[1] + rest3[2])) == sorted(rest)


def test_checkpoints_of_another_dataset_are_refused(uri):
    _, ds = share(uri, 0, 1, steps=1)
    state = ds.state_dict()
    other = IterableDataset.from_prefix(uri, seed=12)
    with pytest.raises(wharf.WharfError, match="seed"):
        other.load_state_dict(state)
    smaller = IterableDataset.from_keys(uri, [f"{i:03d}.bin" for i in range(N - 1)], seed=11)
    with pytest.raises(wharf.WharfError, match="samples"):
        smaller.load_state_dict(state)


def test_transform_and_stream_positions(uri):
    ds = IterableDataset.from_prefix(uri, seed=11, shuffle=False, rank=1, world_size=2,
                                     transform=lambda s: (s.index, bytes(s.data)))
    got = list(ds)
    assert got[0] == (1, h.PAYLOAD + b"s/001.bin") and len(got) == 51
    stream = wharf.SampleStream(ds.index, shuffle=False, rank=1, world_size=2)
    assert [stream.global_position(i) for i in range(3)] == [1, 3, 5]
    assert stream.samples[:3] == [1, 3, 5] and stream.rank_count == 51


def test_rank_from_the_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed_info() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed_info() == (2, 4)
    assert distributed_info(rank=1, world_size=2) == (1, 2)


def _next_in_child(stream, reader, queue):
    try:
        next(stream)
        queue.put("stream worked")
    except Exception as e:  # noqa: BLE001 - report to the parent
        queue.put(f"{type(e).__name__}: {e}")
    queue.put(bytes(reader.get(0)[1]))  # a reader rebuilds its engine in the child


def test_streams_are_not_carried_across_fork(uri):
    import multiprocessing as mp
    index = wharf.SampleIndex.from_prefix(uri)
    stream = wharf.SampleStream(index, seed=1)
    next(stream)  # read-ahead in flight in the parent
    reader = wharf.SampleReader(index)
    reader.get(1)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_next_in_child, args=(stream, reader, q))
    p.start()
    error, data = q.get(timeout=60), q.get(timeout=60)
    p.join(30)
    assert error.startswith("WharfError") and "another process" in error, error
    assert data == h.PAYLOAD + b"s/000.bin"
    assert len(list(stream)) == N - 1  # the parent's stream is intact


@pytest.mark.parametrize("make", [IterableDataset.from_prefix, MapDataset.from_prefix])
def test_a_prefix_with_no_objects_is_an_error_not_an_empty_epoch(make, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes(b"x")
    for uri in (f"file://{tmp_path}/no-such-dir/", f"{tmp_path}/d/typo/"):
        with pytest.raises(ValueError, match="no objects found at .*(no-such-dir|typo)/"):
            make(uri)
    with pytest.raises(ValueError, match=r"no objects ending in \.jpg, \.png found"):
        make(f"file://{tmp_path}/d/", suffixes=[".jpg", ".png"])
    assert len(make(f"file://{tmp_path}/d/")) == 1


@pytest.mark.parametrize("make", [IterableDataset.from_keys, MapDataset.from_keys])
def test_from_keys_refuses_no_keys_and_one_string(make, tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x")
    uri = f"file://{tmp_path}/"
    with pytest.raises(ValueError, match="no keys given"):
        make(uri, [])
    with pytest.raises(TypeError, match=r"not one string \('a.txt'\): pass \['a.txt'\]"):
        make(uri, "a.txt")
    assert len(make(uri, iter(["a.txt"]))) == 1
