"""MapDataset read-ahead (issue 17, item 5): with num_workers=0 and a known order (wharf's
DistributedSampler, or any sampler wrapped in ReadAheadSampler) samples are fetched before the
DataLoader asks for them; the samples are the same as without it, in the same order."""
import time

import torch
from torch.utils.data import DataLoader, RandomSampler

import wharf
from wharf.torch import DistributedSampler, MapDataset, ReadAheadSampler


def _objects(root, n=300):
    store = wharf.Store(root)
    data = {f"{i:04d}.bin": bytes([i % 251]) * (100 + i) for i in range(n)}
    for k, v in data.items():
        store.put("s/" + k, v)
    return data  # keys relative to root + "s/", as the datasets name them


def _collate(samples):
    return [(s.key, bytes(s.data)) for s in samples]


def test_distributed_sampler_reads_ahead_with_no_workers(root):
    data = _objects(root)
    ds = MapDataset.from_prefix(root + "s/", read_ahead_window=64)
    sampler = DistributedSampler(ds, seed=3)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, collate_fn=_collate)
    got = [kv for batch in loader for kv in batch]
    assert [k for k, _ in got] == [ds.keys()[i] for i in sampler]
    assert all(data[k] == v for k, v in got)
    stats = ds.stats()
    assert stats["read_ahead_hits"] == len(data), stats
    assert stats["read_ahead_misses"] == 0, stats
    sampler.set_epoch(1)  # a new epoch: a new plan
    again = [k for batch in loader for k, _ in batch]
    assert sorted(again) == sorted(data) and again != [k for k, _ in got]
    assert ds.stats()["read_ahead_hits"] == 2 * len(data)


def test_read_ahead_sampler_wraps_any_sampler(root):
    data = _objects(root, 200)
    ds = MapDataset.from_prefix(root + "s/")
    inner = RandomSampler(ds, generator=torch.Generator().manual_seed(7))
    loader = DataLoader(ds, batch_size=10, sampler=ReadAheadSampler(inner, ds),
                        collate_fn=_collate)
    got = [kv for batch in loader for kv in batch]
    order = list(RandomSampler(ds, generator=torch.Generator().manual_seed(7)))
    assert [k for k, _ in got] == [ds.keys()[i] for i in order]
    assert all(data[k] == v for k, v in got)
    assert ds.stats()["read_ahead_hits"] == 200


def test_requests_off_the_plan_are_served_directly(root):
    data = _objects(root, 50)
    ds = MapDataset.from_prefix(root + "s/")
    ds.read_ahead(iter(range(50)))
    assert [s.key for s in ds.__getitems__([0, 1, 2])] == ds.keys()[:3]
    # not the plan's next (3): the plan is dropped, the answer is still right
    assert [bytes(s.data) for s in ds.__getitems__([40, 7])] == [
        data[ds.keys()[40]], data[ds.keys()[7]]]
    assert ds[-1].key == ds.keys()[-1]
    stats = ds.stats()
    assert stats["read_ahead_hits"] == 3 and stats["read_ahead_misses"] == 1, stats
    # a plan that does not start where the first request does is never fetched
    ds.read_ahead(iter(range(10, 50)))
    assert ds[5].key == ds.keys()[5]
    assert ds.stats()["read_ahead_hits"] == 3


def test_with_workers_the_main_process_fetches_nothing(root):
    data = _objects(root, 64)
    ds = MapDataset.from_prefix(root + "s/")
    sampler = DistributedSampler(ds, seed=1)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, collate_fn=_collate)
    got = [kv for batch in loader for kv in batch]
    assert sorted(k for k, _ in got) == sorted(data)
    assert ds._ahead is None and ds.stats()["samples"] == 0


def test_read_ahead_fetches_while_the_step_runs_on_a_slow_link(bucket, s3_client, aws,
                                                                slow_link):
    # Behaviour, not speed: after the first batch, while the consumer "computes", the samples
    # of the next batches are fetched (counted by the engine), before they are asked for.
    for i in range(96):
        s3_client.put_object(Bucket=bucket, Key=f"s/{i:03d}", Body=b"x" * 1000)
    endpoint = slow_link(delay_ms=50)
    ds = MapDataset.from_prefix(f"s3://{bucket}/s/", endpoint=endpoint, read_ahead_window=64)
    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, seed=0),
                        collate_fn=_collate)
    it = iter(loader)
    assert len(next(it)) == 8
    deadline = time.monotonic() + 30
    while ds.stats()["samples"] < 64 and time.monotonic() < deadline:
        time.sleep(0.05)  # the training step
    assert ds.stats()["samples"] >= 64  # a window ahead of the 8 taken
    assert ds.stats()["read_ahead_hits"] == 8
    assert len([kv for batch in it for kv in batch]) == 88
    assert ds.stats()["read_ahead_hits"] == 96
