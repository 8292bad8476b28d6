"""Record shards through wharf.torch.RecordDataset (IterableDataset.from_shards): tar
(WebDataset samples), TFRecord (CRC-checked, errors naming the shard and the byte offset), CSV
and JSON lines. On file:// and on the real S3 server."""
import gc
import io
import json
import tarfile

import pytest
from torch.utils.data import DataLoader

import torch_helpers as h
from torch_helpers import target  # noqa: F401 - the fixture
import wharf
from wharf.torch import DistributedSampler, IterableDataset, MapDataset

SHARDS = 6
PER_SHARD = 4


def tar_bytes(members) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def tars(target):
    uri, store = target
    for s in range(SHARDS):
        members = []
        for i in range(PER_SHARD):
            key = f"s{s}/sample{i:02d}"
            members += [(f"{key}.jpg", bytes([s, i]) * 100), (f"{key}.cls", str(i).encode()),
                        (f"{key}.seg.json", json.dumps({"shard": s}).encode())]
        store.put(f"tars/shard-{s:02d}.tar", tar_bytes(members))
    store.put("tars/README.md", b"not a shard")
    return uri + "tars/"


def keys_of(samples):
    return [s.key for s in samples]


def test_tar_samples_have_every_extension(tars):
    ds = IterableDataset.from_shards(tars, format="tar", seed=5)
    assert ds.shards == [f"shard-{s:02d}.tar" for s in range(SHARDS)]
    samples = list(ds)
    assert len(samples) == SHARDS * PER_SHARD
    assert sorted(keys_of(samples)) == sorted(f"s{s}/sample{i:02d}" for s in range(SHARDS)
                                              for i in range(PER_SHARD))
    for sample in samples:
        assert set(sample.data) == {"jpg", "cls", "seg.json"}
        s, i = int(sample.key[1]), int(sample.key[-2:])
        assert bytes(sample["jpg"]) == bytes([s, i]) * 100
        assert bytes(sample["cls"]) == str(i).encode()
        assert json.loads(bytes(sample["seg.json"])) == {"shard": s}
        assert sample.url.endswith(f"shard-{s:02d}.tar")


def test_shard_shuffle_is_deterministic(tars):
    def order(epoch, **kw):
        ds = IterableDataset.from_shards(tars, format="tar", seed=5, **kw)
        ds.set_epoch(epoch)
        return keys_of(ds)

    first = order(0)
    assert order(0) == first  # same seed and epoch: same order
    assert order(1) != first
    # Samples stay grouped by shard; shards move as a whole.
    shard_sequence = [k.split("/")[0] for k in first[::PER_SHARD]]
    assert first == [f"{s}/sample{i:02d}" for s in shard_sequence for i in range(PER_SHARD)]
    mixed = order(0, shuffle_buffer=8)
    assert mixed == order(0, shuffle_buffer=8) and mixed != first
    assert sorted(mixed) == sorted(first)
    assert order(0, shuffle=False) == sorted(first)


def test_shards_are_partitioned_across_ranks_then_workers(tars):
    ds = IterableDataset.from_shards(tars, format="tar", seed=5)
    shares = [ds.stream(rank=r, world_size=2, worker=w, num_workers=2).shards
              for r in range(2) for w in range(2)]
    flat = [s for share in shares for s in share]
    assert sorted(flat) == ds.shards and len(set(flat)) == SHARDS
    # Through a DataLoader with 2 workers, as rank 1 of 2.
    ds = IterableDataset.from_shards(tars, format="tar", seed=5, rank=1, world_size=2)
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=keys_of, timeout=60)
    got = sorted(k for batch in loader for k in batch)
    expected = sorted(k for share in shares[2:] for s in share
                      for k in (f"s{int(s[6:8])}/sample{i:02d}" for i in range(PER_SHARD)))
    assert got == expected


def write_tfrecords(store):
    shards = {}
    for s in range(3):
        records = [f"record {s}-{i} ".encode() * (i + 1) for i in range(10)]
        data, offsets = h.tfrecord_file(records)
        store.put(f"tfr/part-{s}.tfrecord", data)
        shards[s] = (records, data, offsets)
    return shards


def test_tfrecord_records_and_corruption(target):
    uri, store = target
    assert h.crc32c(b"123456789") == 0xE3069283  # the test's writer is right
    shards = write_tfrecords(store)
    ds = IterableDataset.from_shards(uri + "tfr/", format="tfrecord", shuffle=False)
    samples = list(ds)
    assert [bytes(s.data) for s in samples] == [r for s in range(3) for r in shards[s][0]]
    assert samples[11].key == f"part-1.tfrecord@{shards[1][2][1]}"
    assert samples[11].offset == shards[1][2][1]

    # Flip one byte inside record 4 of shard 1: the error names the shard and the offset.
    records, data, offsets = shards[1]
    corrupt = bytearray(data)
    corrupt[offsets[4] + 12 + 3] ^= 0xFF
    store.put("tfr/part-1.tfrecord", bytes(corrupt))
    ds = IterableDataset.from_shards(uri + "tfr/", format="tfrecord", shuffle=False)
    with pytest.raises(wharf.WharfError) as e:
        list(ds)
    message = str(e.value)
    assert store.url("tfr/part-1.tfrecord") in message, message
    assert f"at byte {offsets[4]}" in message, message
    assert "CRC" in message, message


def test_csv_and_jsonl_rows(target):
    uri, store = target
    store.put("rows/a.csv", b'id,text\n1,plain\n2,"quoted, with\nnewline"\r\n3,"say ""hi"""\n')
    store.put("rows/b.csv", b"id,text\n4,four\n")
    ds = IterableDataset.from_shards(uri + "rows/", format="csv", shuffle=False, header=True)
    rows = [wharf.split_csv(s.data) for s in ds]
    assert rows == [["1", "plain"], ["2", "quoted, with\nnewline"], ["3", 'say "hi"'],
                    ["4", "four"]]
    assert ds.stream().shards == ["a.csv", "b.csv"]

    lines = [json.dumps({"i": i}) for i in range(10)]
    store.put("jl/x.jsonl", "\n".join(lines[:7]).encode() + b"\n")
    store.put("jl/y.jsonl", "\n".join(lines[7:]).encode())
    ds = IterableDataset.from_shards(uri + "jl/", format="jsonl", shuffle=False,
                                     rows_per_item=4)
    batches = list(ds)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert [json.loads(bytes(s.data))["i"] for b in batches for s in b] == list(range(10))
    assert batches[0][1].key == "x.jsonl@" + str(len(lines[0]) + 1)
    # A list of shard keys, in any order, instead of a prefix.
    ds = IterableDataset.from_shards(uri, ["jl/y.jsonl", "jl/x.jsonl"], format="jsonl",
                                     shuffle=False)
    assert [json.loads(bytes(s.data))["i"] for s in ds] == list(range(7, 10)) + list(range(7))
    # Blank and whitespace-only lines hold no JSON value: never records (pandas skips them).
    store.put("jb/b.jsonl", b'{"a": 1}\n\n{"a": 2}\n \t\r\n{"a": 3}\n\n')
    ds = IterableDataset.from_shards(uri + "jb/", format="jsonl", shuffle=False)
    assert [json.loads(bytes(s.data)) for s in ds] == [{"a": 1}, {"a": 2}, {"a": 3}]
    # A gzip-compressed shard named by hand came back as rows of gzip bytes; it is refused,
    # naming the object and pointing at from_files, which inflates it.
    import gzip
    store.put("gz/a.jsonl.gz", gzip.compress(("\n".join(lines) + "\n").encode()))
    ds = IterableDataset.from_shards(uri, ["gz/a.jsonl.gz"], format="jsonl", shuffle=False)
    with pytest.raises(ValueError, match="gzip-compressed.*from_files") as e:
        list(ds)
    assert store.url("gz/a.jsonl.gz") in str(e.value)
    got = [row["i"] for b in IterableDataset.from_files(uri + "gz/a.jsonl.gz", shuffle=False)
           for row in b.to_pylist()]
    assert got == list(range(10))


def test_the_format_registry_names_formats_and_suffixes(target):
    formats = wharf._wharf.record_formats()
    assert formats == {"tar": (".tar",), "tfrecord": (".tfrecord", ".tfrecords"),
                       "csv": (".csv",), "jsonl": (".jsonl", ".json", ".ndjson")}
    assert list(formats) == ["tar", "tfrecord", "csv", "jsonl"]
    assert wharf._wharf.record_format("tar") == {"name": "tar", "suffixes": (".tar",),
                                                 "shape": "fields", "rows": False}
    assert wharf._wharf.record_format("jsonl")["rows"] is True
    assert wharf._wharf.record_format("tfrecord")["shape"] == "payload"
    with pytest.raises(ValueError) as e:
        wharf._wharf.record_format("zip")
    assert str(e.value) == ('record format "zip": expected "tar", "tfrecord", "csv" or '
                            '"jsonl"')
    uri, store = target
    store.put("z/a.zip", b"x")
    with pytest.raises(ValueError, match="expected one of \\['csv', 'jsonl', 'tar', 'tfrecord'\\]"):
        IterableDataset.from_shards(uri + "z/", format="zip")
    with pytest.raises(ValueError, match="rows_per_item is for csv and jsonl"):
        IterableDataset.from_shards(uri + "z/", format="tar", rows_per_item=2)


def test_memory_budget_caps_what_the_shard_readers_hold(target):
    """memory_budget= is the dataset's cap inside the process's budget: the readers of its
    shards (the current one and the next, read ahead) hold at most that much at once, where
    the same dataset without it holds more. Chunk size and read-ahead are derived by default."""
    uri, store = target
    for s in range(4):
        records = [bytes([65 + s]) * (4000 + i) for i in range(40)]
        store.put(f"big/part-{s}.tfrecord", h.tfrecord_file(records)[0])

    def peak(**kw):
        ds = IterableDataset.from_shards(uri + "big/", format="tfrecord", seed=1, **kw)
        gc.collect()  # bytes of earlier tests still held are not this dataset's
        wharf._wharf._reset_peak()
        before = wharf.metrics()["gauges"]["wharf_memory_budget_held_bytes"]
        count = sum(1 for _ in ds)  # each record dropped at once
        assert count == 160
        return wharf.metrics()["gauges"]["wharf_memory_budget_peak_bytes"] - before

    cap = 64 << 10
    assert peak() > cap
    assert 0 < peak(memory_budget="64K") <= cap
    assert peak(memory_budget=cap, shuffle_buffer=8) <= cap
    with pytest.raises(ValueError, match="memory_budget"):
        iter(IterableDataset.from_shards(uri + "big/", format="tfrecord", memory_budget="lots"))


def test_bad_arguments_fail_where_the_dataset_is_made(tmp_path):
    # Checked by the constructor, not at the first iteration (in a DataLoader worker, as a
    # pybind signature dump); a misspelled argument is named as one, not as a store option.
    root = f"file://{tmp_path}/"
    store = wharf.Store(root)
    store.put("s0.tar", tar_bytes([("a.txt", b"1")]))
    store.put("obj", b"x")
    for kwargs, error, match in [
            (dict(seed=-1), ValueError, "seed must be >= 0"),
            (dict(seed=1.5), TypeError, "seed must be an int"),
            (dict(shuffle_buffer=-1), ValueError, "shuffle_buffer must be >= 0"),
            (dict(world_size=0, rank=0), ValueError, "world_size must be >= 1"),
            (dict(world_size=2, rank=2), ValueError, "rank 2 is not below world_size 2"),
            (dict(shufle=True), TypeError, "unexpected keyword argument 'shufle'")]:
        with pytest.raises(error, match=match):
            IterableDataset.from_shards(root, format="tar", **kwargs)
    with pytest.raises(ValueError, match="rows_per_item must be >= 1"):
        IterableDataset.from_shards(root, format="csv", shards=["s0.tar"], rows_per_item=0)
    for kwargs, error in [(dict(seed=-1), ValueError), (dict(rank=0, world_size=0), ValueError)]:
        with pytest.raises(error):
            IterableDataset.from_prefix(root, **kwargs)
    # Accepted before and refused at the first iteration as a pybind TypeError (or, for a
    # float index, silently truncated).
    for kwargs, match in [(dict(prefetch=-1), "prefetch must be >= 0"),
                          (dict(prefetch_bytes=-1), "prefetch_bytes must be >= 0"),
                          (dict(max_in_flight=-2), "max_in_flight must be >= 0"),
                          (dict(seed=2**64), "seed must be <= 18446744073709551615")]:
        with pytest.raises(ValueError, match=match):
            IterableDataset.from_prefix(root, **kwargs)
    ds = IterableDataset.from_prefix(root, seed=2**64 - 1, rank=0, world_size=1)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        ds.set_epoch(-1)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        IterableDataset.from_shards(root, format="tar", shards=["s0.tar"]).set_epoch(-1)
    maps = MapDataset.from_prefix(root)
    with pytest.raises(TypeError):
        maps[1.5]
    with pytest.raises(TypeError):
        maps.__getitems__([0, 1.0])
    assert maps[1].key == "s0.tar"
    import numpy as np
    assert len(IterableDataset.from_prefix(root, seed=np.int64(7), rank=0, world_size=1)) == 2
    assert maps[np.int64(0)].key == "obj"
    # torch's DistributedSampler names world_size num_replicas.
    sampler = DistributedSampler(maps, num_replicas=2, rank=1, shuffle=False)
    assert list(sampler) == [1]
    with pytest.raises(ValueError, match="num_replicas=2 and world_size=3 disagree"):
        DistributedSampler(maps, num_replicas=2, world_size=3, rank=0)


def test_listing_options_with_a_sub_prefix_or_a_list_of_shards(target, tmp_path):
    # The listing's options (index_cache=, page_size=, keep_directory_markers=) were accepted
    # and then passed to the index of the keys too, which refused them as store options.
    uri, store = target
    store.put("lo/top.tfrecord", h.tfrecord_file([b"t0", b"t1"])[0])
    store.put("lo/sub/p0.tfrecord", h.tfrecord_file([b"a0", b"a1", b"a2"])[0])
    store.put("lo/sub/p1.tfrecord", h.tfrecord_file([b"b0"])[0])
    options = [dict(index_cache=False), dict(index_cache=str(tmp_path / "ix")),
               dict(page_size=1), dict(keep_directory_markers=True)]
    for shards, expected in ((None, 6), ("sub/", 4), (["sub/p1.tfrecord", "top.tfrecord"], 3)):
        for option in options:
            ds = IterableDataset.from_shards(uri + "lo/", shards, format="tfrecord", rank=0,
                                             world_size=1, **option)
            got = list(ds)
            assert len(got) == expected, (shards, option)
            if shards == "sub/":  # keys stay relative to the dataset's URI
                assert {s.key.split("@")[0] for s in got} == {"sub/p0.tfrecord",
                                                             "sub/p1.tfrecord"}
