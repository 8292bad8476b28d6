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
    # beside plain shards a compressed one is left out, with a warning naming it
    store.put("gz/b.tar", _wds_shard([{"__key__": "s0", "txt": b"t"}]))
    with pytest.warns(UserWarning, match=r"1 compressed shard\(s\) .*/gz/a\.tar\.gz"):
        ds = MapDataset.from_shards(uri + "gz/", format="tar")
    assert len(ds) == 1


def _gets() -> int:
    return sum(v for k, v in wharf.metrics()["counters"].items()
               if k.startswith("wharf_store_requests_total{") and 'op="get"' in k)


def test_record_index_is_kept_and_reused(target, tmp_path, capfd):  # noqa: F811
    """The record index is built once and kept in the index cache: a second dataset over the
    same shards loads it without reading a shard; a changed shard (new ETag) builds a new
    one; a damaged file is rebuilt with a warning; index_cache=False keeps nothing."""
    uri, store = target
    for s in range(2):
        store.put(f"k/{s}.tar", _wds_shard([{"__key__": f"s{s}-{i}", "txt": b"t" * (i + 1)}
                                            for i in range(5)]))
    cache = tmp_path / "idx"
    first = MapDataset.from_shards(uri + "k/", index_cache=cache)
    path = first.index_path
    assert path is not None and path.startswith(str(cache) + "/r-")
    assert oct((tmp_path / "idx" / path.rsplit("/", 1)[1]).stat().st_mode & 0o777) == "0o600"
    gets = _gets()
    again = MapDataset.from_shards(uri + "k/", index_cache=cache)
    assert _gets() == gets, "the kept index was not used: the shards were read again"
    assert again.index_path == path and len(again) == 10
    assert [again[i].key for i in range(10)] == [first[i].key for i in range(10)]
    assert again[7].data == {"txt": b"t" * 3}
    # a changed shard is another index (the old one stays until the cache's cleanup)
    store.put("k/1.tar", _wds_shard([{"__key__": f"n{i}", "txt": b"n"} for i in range(3)]))
    changed = MapDataset.from_shards(uri + "k/", index_cache=cache)
    assert changed.index_path != path and len(changed) == 8
    assert changed[7].key == "n2" and changed[7].data == {"txt": b"n"}
    # a damaged index file is rebuilt, with a warning naming it
    with open(changed.index_path, "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff\xff\xff")
    capfd.readouterr()
    rebuilt = MapDataset.from_shards(uri + "k/", index_cache=cache)
    assert changed.index_path in capfd.readouterr().err
    assert [rebuilt[i].key for i in range(8)] == [changed[i].key for i in range(8)]
    assert MapDataset.from_shards(uri + "k/", index_cache=cache)[0].key == "s0-0"
    assert MapDataset.from_shards(uri + "k/", index_cache=False).index_path is None
    assert not [p for p in cache.iterdir() if "tmp" in p.name], "a temporary was left"


def test_index_files_go_to_the_tier_read_through(s3_env, bucket, tmp_path, monkeypatch):
    """Reading through a tier (cache=), the index files (a listing's, a record index) go to
    the tier's own folder, which every node sharing the tier sees, not to the user's cache."""
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    uri = f"s3://{bucket}/t/"
    store = wharf.Store(uri)
    store.put("a.tar", _wds_shard([{"__key__": f"x{i}", "bin": b"b" * 9} for i in range(4)]))
    tier = tmp_path / "tier"
    ds = MapDataset.from_shards(uri, cache=str(tier))
    assert ds.index_path.startswith(str(tier / ".wharf" / "index") + "/r-")
    assert ds[3].data == {"bin": b"b" * 9}
    it = IterableDataset.from_prefix(uri, cache=str(tier))
    assert it.index.path.startswith(str(tier / ".wharf" / "index") + "/l-")
    explicit = IterableDataset.from_prefix(uri, cache=str(tier), index_cache=tmp_path / "mine")
    assert explicit.index.path.startswith(str(tmp_path / "mine") + "/l-")


def test_distributed_sampler_shards_the_records(tmp_path):
    # wharf's DistributedSampler took a from_shards dataset for a SampleIndex and failed at
    # the first iteration ('ShardMapDataset' object has no attribute 'fingerprint').
    from wharf.torch import DistributedSampler
    for s in range(3):
        (tmp_path / f"{s}.tar").write_bytes(_wds_shard(
            [{"__key__": f"s{s}-{i}", "txt": f"{s}-{i}".encode()} for i in range(5 + s)]))
    ds = MapDataset.from_shards(f"file://{tmp_path}/", index_cache=False)
    assert len(ds) == 18
    shares = [list(DistributedSampler(ds, seed=1, rank=r, world_size=2)) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(18))
    got = [ds[i].key for i in shares[0]]
    assert len(set(got)) == 9
    # Resumed mid-epoch: the rest of the same order.
    sampler = DistributedSampler(ds, seed=1, rank=0, world_size=2)
    state = sampler.state_dict(steps=2, batch_size=2)
    resumed = DistributedSampler(ds, seed=1, rank=0, world_size=2)
    resumed.load_state_dict(state)
    assert list(resumed) == shares[0][4:]
    with pytest.raises(TypeError, match="not list"):
        DistributedSampler([1, 2, 3], rank=0, world_size=1)


def test_plain_paths_and_doubled_slashes(tmp_path):
    # The record index matched the reader's records by dataset URI + key, but the reader
    # names them by the engine's URL (file://, one slash): a plain path or a doubled slash
    # was a KeyError ('file:///.../p0.tfrecord') while building the index.
    recs = [b"r0", b"r1", b"r2"]
    (tmp_path / "p0.tfrecord").write_bytes(h.tfrecord_file(recs)[0])
    (tmp_path / "p1.tar").write_bytes(_wds_shard([{"__key__": "a", "txt": b"A"},
                                                  {"__key__": "b", "txt": b"B"}]))
    for uri in (f"{tmp_path}/", f"file://{tmp_path}//"):
        ds = MapDataset.from_shards(uri, format="tfrecord", index_cache=False)
        assert [bytes(s.data) for s in ds.__getitems__([0, 1, 2])] == recs
        streamed = list(IterableDataset.from_shards(uri, format="tfrecord", shuffle=False))
        # The same shard URL and offsets as the streamed records.
        assert [(s.url, s.offset) for s in ds.__getitems__([0, 1, 2])] == [
            (s.url, s.offset) for s in streamed]
        tar = MapDataset.from_shards(uri, format="tar", index_cache=False)
        assert [(s.key, s.data) for s in tar.__getitems__([1, 0])] == [
            ("b", {"txt": b"B"}), ("a", {"txt": b"A"})]


def test_a_tfrecord_changed_in_place_fails_its_crc(tmp_path):
    # A shard edited in place behind the index (same size, its mtime put back: its ETag
    # unchanged) is found by the record's CRC32C, as the streamed reader finds it.
    import os
    data, offsets = h.tfrecord_file([b"A" * 64, b"B" * 64])
    path = tmp_path / "x.tfrecord"
    path.write_bytes(data)
    ds = MapDataset.from_shards(f"{tmp_path}/", format="tfrecord", index_cache=False)
    assert bytes(ds[0].data) == b"A" * 64
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offsets[1] + 12 + 5)
        f.write(b"Z")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert bytes(ds[0].data) == b"A" * 64
    with pytest.raises(ValueError, match=rf"x\.tfrecord at byte {offsets[1]}: CRC mismatch"):
        ds[1]
