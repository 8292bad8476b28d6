"""DataLoader(persistent_workers=True) keeps its workers and their copies of the dataset from
one epoch to the next: set_epoch() in the main process still selects each epoch's order in
them (the same order a fresh loader gives), for object, record and row datasets, with fork
and spawn workers; a load_state_dict() after the workers started is an error, not ignored."""
import json

import pytest
from torch.utils.data import DataLoader

import torch_helpers as h
import wharf
from test_torch_records import tar_bytes
from wharf.torch import IterableDataset

EPOCHS = 3


def _objects(root):
    h.write_objects(wharf.Store(root), "s/", 40)
    return IterableDataset.from_prefix(root + "s/", seed=3, batch_size_hint=4)


def _records(root):
    store = wharf.Store(root)
    for s in range(4):
        store.put(f"t/{s}.tar", tar_bytes([(f"k{s}-{i}.txt", b"x") for i in range(6)]))
    return IterableDataset.from_shards(root + "t/", format="tar", shuffle_buffer=4, seed=3)


def _rows(root):
    store = wharf.Store(root)
    for f in range(4):
        store.put(f"j/{f}.jsonl", b"".join(json.dumps({"id": f * 10 + i}).encode() + b"\n"
                                           for i in range(10)))
    return IterableDataset.from_files(root + "j/", batch_rows=3, seed=3)


def _keys(batch):
    out = []
    for item in batch:
        if hasattr(item, "key"):
            out.append(item.key)
        else:  # a pyarrow RecordBatch of rows
            out.extend(item.column("id").to_pylist())
    return out


def _epochs(ds, context, persistent):
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_keys,
                        persistent_workers=persistent, multiprocessing_context=context)
    orders = []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        orders.append([k for batch in loader for k in batch])
    return orders, loader


@pytest.mark.parametrize("make", [_objects, _records, _rows], ids=["objects", "records", "rows"])
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(make, context, tmp_path):
    ds = make(f"file://{tmp_path}/")
    fresh, _ = _epochs(ds, context, persistent=False)
    ds.set_epoch(0)
    kept, _ = _epochs(ds, context, persistent=True)
    assert kept == fresh
    assert len(set(map(tuple, kept))) == EPOCHS  # each epoch its own order
    assert all(sorted(o) == sorted(kept[0]) for o in kept)


@pytest.mark.parametrize("make", [_objects, _records], ids=["objects", "records"])
@pytest.mark.parametrize("copy_of", ["deepcopy", "pickle"])
def test_a_copied_dataset_follows_set_epoch_in_persistent_fork_workers(make, copy_of, tmp_path):
    import copy
    import pickle
    ds = make(f"file://{tmp_path}/")
    fresh, _ = _epochs(ds, "fork", persistent=False)
    dup = copy.deepcopy(ds) if copy_of == "deepcopy" else pickle.loads(pickle.dumps(ds))
    dup.set_epoch(0)
    kept, _ = _epochs(dup, "fork", persistent=True)
    assert kept == fresh  # not the first epoch's order three times


def test_a_state_loaded_after_persistent_workers_started_is_an_error(tmp_path):
    ds = _objects(f"file://{tmp_path}/")
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_keys,
                        persistent_workers=True, multiprocessing_context="fork")
    first = [k for batch in loader for k in batch]
    state = ds.state_dict(steps=2)
    ds.load_state_dict(state)
    with pytest.raises(RuntimeError, match="persistent workers started"):
        list(loader)
    # A loader made after the load continues the state: the rest of epoch 0.
    rest = [k for batch in DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_keys,
                                      multiprocessing_context="fork", persistent_workers=True)
            for k in batch]
    assert sorted(first[:8] + rest) == sorted(first)
