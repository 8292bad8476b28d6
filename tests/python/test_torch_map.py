"""wharf.torch.MapDataset: one engine batch per DataLoader batch, zero-copy samples,
DistributedSampler, DataLoader workers started by fork and by spawn, pickling without engine
state. On file:// and on the real S3 server."""
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import torch_helpers as h
from torch_helpers import target  # noqa: F401 - the fixture
import wharf
from wharf.torch import MapDataset, Sample

N = 48


@pytest.fixture
def dataset(target):
    uri, store = target
    h.write_objects(store, "m/", N)
    store.put("other/x.txt", b"not in the dataset")
    return uri


def test_import_wharf_does_not_import_torch():
    code = "import sys, wharf; assert 'torch' not in sys.modules; import wharf.torch"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_index_and_samples(dataset):
    ds = MapDataset.from_prefix(dataset + "m/")
    assert len(ds) == N
    assert ds.keys() == [f"{i:03d}.bin" for i in range(N)]
    s = ds[5]
    assert isinstance(s, Sample) and s.key == "005.bin" and s.index == 5
    assert bytes(s.data) == h.PAYLOAD + b"m/005.bin"
    assert ds[-1].key == f"{N - 1:03d}.bin"
    with pytest.raises(IndexError):
        ds[N]
    assert MapDataset.from_keys(dataset, ["m/007.bin", "m/001.bin"])[0].key == "m/007.bin"


def test_getitems_refuses_what_getitem_refuses(dataset):
    # A DataLoader batch calls __getitems__: an index below -len was made "negative" once
    # and then read as the last sample (-N - 1 gave sample N - 1), where ds[i] raises.
    ds = MapDataset.from_prefix(dataset + "m/")
    assert [s.index for s in ds.__getitems__([-1, -N, 2])] == [N - 1, 0, 2]
    for bad in (-N - 1, N, -2 * N):
        with pytest.raises(IndexError):
            ds[bad]
        with pytest.raises(IndexError, match=f"sample {bad} of a dataset of {N}"):
            ds.__getitems__([0, bad])


def test_manifest_and_missing_objects(dataset):
    store = wharf.Store(dataset)
    # Relative keys resolve against the manifest's folder; URIs of the same store are keys.
    lines = ['{"key": "002.bin"}', '{"key": "%s"}' % store.url("m/001.bin"),
             '{"key": "missing.bin"}']
    store.put("m/list.jsonl", "\n".join(lines).encode())
    ds = MapDataset.from_manifest(dataset + "m/list.jsonl")
    assert len(ds) == 3 and ds.keys()[:2] == ["002.bin", "001.bin"]
    assert bytes(ds[1].data).endswith(b"m/001.bin")
    with pytest.raises(wharf.NotFoundError, match="missing.bin"):
        ds.__getitems__([0, 2])


def test_zero_copy_and_transform(dataset):
    ds = MapDataset.from_prefix(dataset + "m/", transform=lambda s: (s.key, s.data))
    key, data = ds[3]
    assert key == "003.bin"
    view = np.frombuffer(data, dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the buffer is read-only
        tensor = torch.frombuffer(data, dtype=torch.uint8)
    assert tensor.data_ptr() == view.ctypes.data  # the same memory: no copy
    assert memoryview(data).readonly
    assert tensor.numpy().tobytes() == h.PAYLOAD + b"m/003.bin"


def test_getitems_is_one_engine_batch_per_loader_batch(dataset):
    ds = MapDataset.from_prefix(dataset + "m/")
    before = ds.stats()["batches"]
    loader = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=h.keys_and_engine_batches)
    keys = []
    for n, (batch_keys, _, _) in enumerate(loader, 1):
        keys += batch_keys
        assert ds.stats()["batches"] == before + n
    assert n == N // 8 and sorted(keys) == ds.keys()
    assert ds.stats()["samples"] >= N


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_workers_and_distributed_sampler(dataset, method):
    ds = MapDataset.from_prefix(dataset + "m/")
    ds[0]  # the parent's engine exists before the workers start
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        loader = DataLoader(ds, batch_size=6, sampler=sampler, num_workers=2,
                            multiprocessing_context=method, collate_fn=h.keys_and_engine_batches,
                            timeout=60)
        per_worker = {}
        for keys, batches, pid in loader:
            seen += keys
            per_worker.setdefault(pid, []).append(batches)
        # Each worker's engine ran exactly one batch per DataLoader batch it made.
        assert len(per_worker) == 2
        for counts in per_worker.values():
            assert counts == list(range(1, len(counts) + 1))
    assert sorted(seen) == ds.keys()


def test_samples_travel_from_workers(dataset):
    ds = MapDataset.from_prefix(dataset + "m/")
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=h.as_list, timeout=60)
    samples = [s for batch in loader for s in batch]
    assert [s.key for s in samples] == ds.keys()
    assert all(isinstance(s.data, wharf.Buffer) and bytes(s.data).endswith(s.key.encode())
               for s in samples)


def test_pickles_as_configuration(dataset):
    ds = MapDataset.from_prefix(dataset + "m/")
    ds[1]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._reader is None and copy.keys() == ds.keys()
    assert copy.index.fingerprint == ds.index.fingerprint
    assert bytes(copy[1].data) == bytes(ds[1].data)


def test_wharf_sampler_follows_the_global_order_and_resumes_with_another_world_size(dataset):
    from wharf.torch import DistributedSampler as WharfSampler, IterableDataset
    ds = MapDataset.from_prefix(dataset + "m/")
    batch, steps = 4, 2

    def run(rank, world, epoch, state=None, stop=None):
        sampler = WharfSampler(ds, seed=9, rank=rank, world_size=world)
        sampler.set_epoch(epoch)
        if state is not None:
            sampler.load_state_dict(state)
        loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=2,
                            collate_fn=h.sample_keys, timeout=60)
        out = []
        for i, keys in enumerate(loader):
            if stop is not None and i == stop:
                return out, sampler.state_dict(steps=stop, batch_size=batch)
            out += keys
        return out, None

    # Two ranks: equal shares, every sample once, the same global order as one rank and as
    # the iterable dataset (position p is rank p % 2's item p // 2).
    shares = [run(r, 2, 1)[0] for r in range(2)]
    assert [len(s) for s in shares] == [N // 2] * 2
    assert sorted(shares[0] + shares[1]) == ds.keys()
    one_rank = run(0, 1, 1)[0]
    assert [shares[p % 2][p // 2] for p in range(N)] == one_rank
    it = IterableDataset(ds.index, seed=9, rank=0, world_size=1)
    it.set_epoch(1)
    assert [s.key for s in it] == one_rank
    assert run(0, 1, 2)[0] != one_rank  # another epoch, another order

    # Stop both ranks after `steps` batches; resume the epoch on ONE rank: exactly the rest.
    consumed, states = [], []
    for r in range(2):
        got, state = run(r, 2, 1, stop=steps)
        consumed += got
        states.append(state)
    assert states[0] == states[1] and states[0]["consumed"] == steps * batch * 2
    rest, _ = run(0, 1, 1, state=states[0])
    assert len(consumed) + len(rest) == N
    assert sorted(consumed + rest) == ds.keys()
    assert rest == one_rank[steps * batch * 2:]
    with pytest.raises(wharf.WharfError):
        WharfSampler(ds, seed=10).load_state_dict(states[0])  # another seed
