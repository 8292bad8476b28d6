"""Exact mid-epoch resume where the positions live in DataLoader workers: record shards of
every format (tar, tfrecord, csv, jsonl; with and without a shuffle buffer; csv rows in lists)
and object datasets, in one process and through torchdata's StatefulDataLoader with 2
workers, which carries every worker's dataset state in loader.state_dict(). The records
consumed before the stop plus those read after the restore are the uninterrupted epoch, in
the same order. On file:// and on the real S3 server."""
import json

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import torch_helpers as h
from torch_helpers import target  # noqa: F401 - the fixture
import wharf
from wharf.torch import IterableDataset
from test_torch_records import tar_bytes

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

SHARDS = 8
PER_SHARD = 5


def write_tars(store) -> None:
    for s in range(SHARDS):
        members = []
        for i in range(PER_SHARD):
            key = f"s{s}/x{i}"
            members += [(f"{key}.bin", bytes([s, i]) * 50), (f"{key}.cls", str(i).encode())]
        store.put(f"tars/shard-{s:02d}.tar", tar_bytes(members))


def write_csv(store) -> None:
    for s in range(4):
        rows = "".join(f'{s},{i},"row {s}-{i}\nsecond line"\n' for i in range(7))
        store.put(f"csv/part-{s}.csv", b"shard,row,text\n" + rows.encode())


def write_tfrecords(store) -> None:
    for s in range(4):
        records = [f"record {s}-{i} ".encode() * (i + 1) for i in range(6)]
        store.put(f"tfrecord/part-{s}.tfrecord", h.tfrecord_file(records)[0])


def write_jsonl(store) -> None:
    for s in range(4):
        rows = "".join(json.dumps({"shard": s, "row": i}) + "\n" for i in range(6))
        store.put(f"jsonl/part-{s}.jsonl", rows.encode())


# Every record format (a kind: how its shards are written, the folder, the dataset options).
RECORD_KINDS = {
    "tar": (write_tars, "tars/", dict(format="tar")),
    "tfrecord": (write_tfrecords, "tfrecord/", dict(format="tfrecord")),
    "csv": (write_csv, "csv/", dict(format="csv", header=True)),
    "csv-rows": (write_csv, "csv/", dict(format="csv", header=True, rows_per_item=3)),
    "jsonl": (write_jsonl, "jsonl/", dict(format="jsonl")),
}


def test_the_record_kinds_cover_every_builtin_format():
    formats = {options["format"] for _, _, options in RECORD_KINDS.values()}
    assert formats == {"tar", "tfrecord", "csv", "jsonl"}
    assert formats <= set(wharf._wharf.record_formats())


def tar_keys(batch):
    for sample in batch:  # the bytes belong to the key
        s, i = int(sample.key[1]), int(sample.key[-1])
        assert bytes(sample["bin"]) == bytes([s, i]) * 50
    return [s.key for s in batch]


def row_keys(batch):
    return [[s.key for s in rows] for rows in batch]


def tar_dataset(uri):
    return IterableDataset.from_shards(uri + "tars/", format="tar", seed=3, shuffle_buffer=6,
                                       rank=0, world_size=1)


def csv_dataset(uri):
    return IterableDataset.from_shards(uri + "csv/", format="csv", seed=3, header=True,
                                       rows_per_item=3, rank=0, world_size=1)


@pytest.mark.parametrize("buffer", [0, 6])
@pytest.mark.parametrize("kind", sorted(RECORD_KINDS))
def test_record_dataset_resumes_exactly_in_one_process(target, kind, buffer):
    uri, store = target
    write, folder, options = RECORD_KINDS[kind]
    write(store)
    lists = "rows_per_item" in options

    def make(u):
        return IterableDataset.from_shards(u + folder, seed=3, shuffle_buffer=buffer, rank=0,
                                           world_size=1, **options)

    def keys(items):
        return [[r.key for r in s] if lists else s.key for s in items]

    def count(items):
        return sum(len(rows) for rows in items) if lists else len(items)

    full = keys(make(uri))
    assert len(set(map(str, full))) == len(full) > 8  # every record once
    for stop in (0, 1, len(full) // 2, len(full) - 1, len(full)):
        ds = make(uri)
        ds.set_epoch(0)
        it = iter(ds)
        before = keys([next(it) for _ in range(stop)])
        state = json.loads(json.dumps(ds.state_dict()))  # as a checkpoint carries it
        assert (state["stream"] or {"yielded": 0})["yielded"] == count(before)
        resumed = make(uri)
        resumed.load_state_dict(state)
        after = keys(resumed)
        assert before + after == full, f"stop after {stop}"


def stateful_run(make, uri, collate, stop_after=None, state=None, batch_size=3):
    """Batches of a StatefulDataLoader with 2 workers; with stop_after, also its state then."""
    loader = StatefulDataLoader(make(uri), batch_size=batch_size, num_workers=2,
                                collate_fn=collate, timeout=60)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for batch in loader:
        out.append(batch)
        if stop_after is not None and len(out) == stop_after:
            return out, loader.state_dict()
    return out, None


@pytest.mark.parametrize("kind", ["tar", "csv", "objects"])
def test_stateful_dataloader_with_two_workers_resumes_exactly(target, kind, tmp_path):
    uri, store = target
    if kind == "tar":
        write_tars(store)
        make, collate = tar_dataset, tar_keys
    elif kind == "csv":
        write_csv(store)
        make, collate = csv_dataset, row_keys
    else:
        h.write_objects(store, "objs/", 60)

        def make(u):
            return IterableDataset.from_prefix(u + "objs/", seed=3, batch_size_hint=3,
                                               rank=0, world_size=1)
        collate = h.sample_keys
    full, _ = stateful_run(make, uri, collate)
    flat = [k for b in full for k in b]
    assert len(flat) == len(set(map(str, flat)))  # every record once
    for stop in (1, len(full) // 2, len(full) - 1):
        before, state = stateful_run(make, uri, collate, stop_after=stop)
        # The state survives a round trip through torch.save, as a checkpoint would.
        import torch
        path = tmp_path / f"ckpt-{stop}.pt"
        torch.save(state, path)
        after, _ = stateful_run(make, uri, collate, state=torch.load(path))
        assert before + after == full, f"stop after {stop} batches"


def test_record_states_of_another_dataset_or_share_are_refused(target):
    uri, store = target
    write_tars(store)
    ds = tar_dataset(uri)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    other = IterableDataset.from_shards(uri + "tars/", format="tar", seed=4, shuffle_buffer=6)
    with pytest.raises(ValueError, match="does not match"):
        other.load_state_dict(state)
    # The same dataset read as rank 1 of 2: the stream state is for rank 0 of 1.
    as_rank1 = IterableDataset.from_shards(uri + "tars/", format="tar", seed=3,
                                           shuffle_buffer=6, rank=1, world_size=2)
    as_rank1.load_state_dict(state)
    with pytest.raises(wharf.WharfError, match="rank 0 in the state, 1 here"):
        next(iter(as_rank1))


def test_wharf_sampler_resumes_under_stateful_dataloader(target):
    from wharf.torch import DistributedSampler, MapDataset
    uri, store = target
    h.write_objects(store, "m/", 50)

    def run(state=None, stop=None):
        ds = MapDataset.from_prefix(uri + "m/")
        loader = StatefulDataLoader(ds, batch_size=4, num_workers=2, timeout=60,
                                    sampler=DistributedSampler(ds, seed=5, rank=0, world_size=1),
                                    collate_fn=h.sample_keys)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for batch in loader:
            out.append(batch)
            if stop is not None and len(out) == stop:
                return out, loader.state_dict()
        return out, None

    full, _ = run()
    assert sorted(k for b in full for k in b) == [f"{i:03d}.bin" for i in range(50)]
    for stop in (1, 6, len(full) - 1):
        before, state = run(stop=stop)
        after, _ = run(state=state)
        assert before + after == full, f"stop after {stop} batches"


def test_a_state_taken_before_the_first_next_is_the_start_of_that_pass(target):
    uri, store = target
    write_tars(store)
    ds = tar_dataset(uri)
    full = [s.key for s in ds]
    it = iter(ds)  # a second pass: nothing read from it yet
    state = ds.state_dict()
    assert state["stream"]["yielded"] == 0
    resumed = tar_dataset(uri)
    resumed.load_state_dict(state)
    assert [s.key for s in resumed] == full
    assert [s.key for s in it] == full


def _epoch_makers(root):
    """Objects, records and rows, each made anew over the same files (file://)."""
    store = wharf.Store(root)
    h.write_objects(store, "objs/", 30)
    write_tars(store)
    for f in range(4):
        store.put(f"rows/{f}.jsonl", b"".join(json.dumps({"id": f * 10 + i}).encode() + b"\n"
                                              for i in range(6)))
    return {
        "objects": (lambda: IterableDataset.from_prefix(root + "objs/", seed=3,
                                                        batch_size_hint=3, rank=0, world_size=1),
                    h.sample_keys),
        "records": (lambda: tar_dataset(root), tar_keys),
        "rows": (lambda: IterableDataset.from_files(root + "rows/", batch_rows=2, seed=3,
                                                    rank=0, world_size=1),
                 lambda b: [i for rows in b for i in rows.column("id").to_pylist()]),
    }


@pytest.mark.parametrize("kind", ["objects", "records", "rows"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_state_continues_its_epoch_without_set_epoch(tmp_path, kind, workers):
    # A state of epoch 1 loaded into a new dataset and loader whose dataset is still at epoch
    # 0: with num_workers=0 the state's epoch continued; with workers, each worker loaded its
    # state and then followed the main process's epoch (0), which dropped the state, and the
    # loader yielded the whole of epoch 0 instead.
    make, collate = _epoch_makers(f"file://{tmp_path}/")[kind]

    def loader(ds, persistent=False):
        return StatefulDataLoader(ds, batch_size=3, num_workers=workers, collate_fn=collate,
                                  timeout=60 if workers else 0,
                                  persistent_workers=persistent and workers > 0)

    ds = make()
    first = loader(ds)
    epoch0 = [b for b in first]
    ds.set_epoch(1)
    epoch1, before, state = [], None, None
    for batch in first:
        epoch1.append(batch)
        if len(epoch1) == 2:
            before, state = list(epoch1), first.state_dict()
    ds.set_epoch(2)
    epoch2 = [b for b in first]
    assert epoch1 != epoch0 and len(epoch1) > 3

    resumed_ds = make()  # no set_epoch(1): the state says which epoch it is
    resumed = loader(resumed_ds, persistent=True)
    resumed.load_state_dict(state)
    assert before + [b for b in resumed] == epoch1
    # The next epoch, set in the main process, reaches the (persistent) workers as ever.
    resumed_ds.set_epoch(2)
    assert [b for b in resumed] == epoch2
