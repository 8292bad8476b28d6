"""MapDataset.from_shards: random access to records inside tar and TFRecord shards through a
record-offset index (issue 17, item 4). Tar shards are written by webdataset's TarWriter and
compared with what webdataset and RecordDataset read; TFRecords by the tests' framing writer."""
import io
import random

import pytest
import torch
import webdataset as wds

import torch_helpers as h
import wharf
from torch_helpers import target  # noqa: F401 - fixture
from wharf.torch import IterableDataset, MapDataset


def _wds_shard(samples):
    buf = io.BytesIO()
    with wds.TarWriter(buf) as w:
        for s in samples:
            w.write(s)
    return buf.getvalue()


def test_tar_records_by_index_match_webdataset(target, tmp_path):  # noqa: F811
    uri, store = target
    expected = {}
    for s in range(3):
        samples = []
        for i in range(7):
            key = f"s{s}/x{i:02d}"
            samples.append({"__key__": key, "jpg": bytes([s, i]) * (50 + 300 * i),
                            "cls": str(i).encode(), "seg.json": b'{"a": 1}'})
            expected[key] = {"jpg": bytes([s, i]) * (50 + 300 * i), "cls": str(i).encode(),
                             "seg.json": b'{"a": 1}'}
        store.put(f"sh/{s}.tar", _wds_shard(samples))
    ds = MapDataset.from_shards(uri + "sh/", format="tar")
    assert len(ds) == 21
    streamed = list(IterableDataset.from_shards(uri + "sh/", format="tar", shuffle=False))
    assert [ds[i].key for i in range(len(ds))] == [s.key for s in streamed]
    order = list(range(len(ds)))
    random.Random(4).shuffle(order)
    for j, sample in zip(order, ds.__getitems__(order)):
        assert sample.index == j
        assert sample.data == expected[sample.key]
        assert sample.offset == streamed[j].offset
    # the same through a DataLoader with workers (the index pickles to them)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2,
                                         collate_fn=lambda b: [s.key for s in b])
    assert sorted(k for b in loader for k in b) == sorted(expected)
    # webdataset's own reader of the same shard agrees
    path = tmp_path / "copy.tar"
    path.write_bytes(bytes(wharf.Store(uri).get("sh/1.tar")))
    local = list(wds.WebDataset(str(path), shardshuffle=False))
    assert [s["__key__"] for s in local] == [ds[i].key for i in range(7, 14)]


def test_tfrecord_records_by_index(target):  # noqa: F811
    uri, store = target
    records = {}
    for s in range(2):
        recs = [f"rec {s}-{i} ".encode() * (i + 1) for i in range(9)]
        data, _ = h.tfrecord_file(recs)
        store.put(f"tf/p{s}.tfrecord", data)
        records[s] = recs
    ds = MapDataset.from_shards(uri + "tf/", format="tfrecord")
    flat = records[0] + records[1]
    assert len(ds) == len(flat)
    assert [bytes(s.data) for s in ds.__getitems__([17, 0, 9, 4])] == [
        flat[17], flat[0], flat[9], flat[4]]
    assert ds[-1].data == flat[-1]
    with pytest.raises(IndexError):
        ds[len(flat)]
    # a shard rewritten after indexing: an error, never other bytes
    store.put("tf/p1.tfrecord", h.tfrecord_file([b"other"] * 9)[0])
    with pytest.raises(wharf.WharfError):
        ds[12]


def test_compressed_shards_and_other_formats_are_refused(target):  # noqa: F811
    uri, store = target
    store.put("gz/a.tar.gz", b"\x1f\x8b" + b"\0" * 30)
    with pytest.raises(ValueError, match="compressed"):
        MapDataset.from_shards(uri + "gz/", format="tar")
    with pytest.raises(ValueError, match="random access"):
        MapDataset.from_shards(uri + "gz/", format="csv")
