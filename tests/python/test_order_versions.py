"""Order versions through the Python resume path (wharf.torch state_dict / load_state_dict).

States saved by wharf before order versions (tests/data/order_v1/torch.json, emitted by that
code, with what followed each) load into today's datasets and continue exactly, in the order
they were taken under (order 1: Fisher-Yates), also on later epochs of the resumed run. New
runs use the counter-based order (2), and a state of an unknown order version is refused.
"""
import importlib.util
import json
import pathlib

import pytest

import wharf
from wharf import _wharf
from wharf.torch import DistributedSampler, IterableDataset, MapDataset, RecordDataset

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "order_v1"


def _generator():
    spec = importlib.util.spec_from_file_location("order_v1_generate", DATA / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


@pytest.fixture(scope="module")
def saved():
    gen.place_data()  # the states name these paths (a local store's keys are absolute)
    return json.loads((DATA / "torch.json").read_text())


def objects_index():
    return _wharf.SampleIndex.from_prefix(gen.OBJECTS + "/")


def test_module_names_the_order_versions():
    assert _wharf.current_order == 2
    assert _wharf.order_versions == (1, 2)


def test_old_iterable_states_continue_exactly(saved):
    for case in saved["iterable"]:
        state = case["state_dict"]
        assert "order" not in state and state["version"] == 1  # as the old code saved it
        ds = IterableDataset(objects_index(), seed=case["seed"],
                             batch_size_hint=case["batch_size_hint"], rank=0, world_size=1)
        ds.load_state_dict(state)
        assert [s.key for s in ds] == case["rest"]
        # Re-saved, it says which order it is in, and the run stays in that order.
        again = ds.state_dict()
        assert again["order"] == 1 and again["version"] == 2
        ds.set_epoch(ds.epoch + 1)
        perm = gen.sample_order(50, case["seed"], ds.epoch, True)
        assert [s.key for s in ds] == [f"obj-{i:03d}" for i in perm]


def test_old_sampler_states_continue_exactly(saved):
    ds = MapDataset(objects_index())
    for case in saved["sampler"]:
        sampler = DistributedSampler(ds, seed=case["seed"], rank=0, world_size=1)
        sampler.load_state_dict(case["state_dict"])
        assert list(sampler) == case["rest_world1"]


def test_old_record_states_continue_exactly(saved):
    for case in saved["records"]:
        state = case["state_dict"]
        assert "order" not in state and state["stream"]["version"] == 1
        ds = RecordDataset(gen.SHARDS + "/", format="jsonl", seed=case["seed"],
                           shuffle_buffer=case["shuffle_buffer"], rank=0, world_size=1)
        ds.load_state_dict(state)
        assert [s.key for s in ds] == case["rest"]
        assert ds.state_dict()["order"] == 1


def test_new_runs_use_order_two_and_resume_in_it(saved):
    ds = IterableDataset(objects_index(), seed=5, batch_size_hint=4, rank=0, world_size=1)
    it = iter(ds)
    first = [next(it).key for _ in range(9)]
    state = ds.state_dict()
    assert state["order"] == 2 and state["version"] == 2
    rest = [s.key for s in it]
    # Not the Fisher-Yates order of the same seed, and still every sample once.
    v1 = [f"obj-{i:03d}" for i in gen.sample_order(50, 5, 0, True)]
    assert first + rest != v1 and sorted(first + rest) == sorted(v1)
    again = IterableDataset(objects_index(), seed=5, batch_size_hint=4, rank=0, world_size=1)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert [s.key for s in again] == rest

    records = RecordDataset(gen.SHARDS + "/", format="jsonl", seed=3, shuffle_buffer=4,
                            rank=0, world_size=1)
    it = iter(records)
    [next(it) for _ in range(11)]
    rstate = records.state_dict()
    assert rstate["order"] == 2 and rstate["stream"]["order"] == 2
    tail = [s.key for s in it]
    resumed = RecordDataset(gen.SHARDS + "/", format="jsonl", seed=3, shuffle_buffer=4,
                            rank=0, world_size=1)
    resumed.load_state_dict(json.loads(json.dumps(rstate)))
    assert [s.key for s in resumed] == tail


def test_unknown_order_versions_are_refused(saved):
    state = dict(saved["iterable"][0]["state_dict"], version=2, order=9)
    ds = IterableDataset(objects_index(), seed=5, rank=0, world_size=1)
    with pytest.raises((ValueError, wharf.WharfError), match="order version 9 is not supported"):
        ds.load_state_dict(state)
    records = RecordDataset(gen.SHARDS + "/", format="jsonl", seed=3, rank=0, world_size=1)
    bad = dict(saved["records"][0]["state_dict"], order=9)
    with pytest.raises(ValueError, match="order version 9 is not supported"):
        records.load_state_dict(bad)
    with pytest.raises((ValueError, wharf.WharfError), match="order version 9"):
        _wharf.Sampler(10, order=9)
