"""Record formats read as their own ecosystems read them, from files their own writers made:
tar shards written by webdataset's TarWriter (upper-case extensions, members whose names
start with a dot, metadata members, .tar.gz) grouped exactly as webdataset's reader groups
them; TFRecord files compressed as tf.data's GZIP and ZLIB (Python's gzip and zlib over the
TFRecord framing); CSV written by pandas (a byte-order mark, RFC 4180 quoting with commas,
quotes and newlines in fields) split into the values pandas reads, and CSV variants wharf does
not read refused by name. Keys ending in '/' that hold data are not dropped. On file:// and on
the real S3 server."""
import gzip
import io
import random
import tarfile
import zlib

import pandas as pd
import pytest
import webdataset as wds
from webdataset.tariterators import tarfile_samples

import torch_helpers as h
import wharf
from wharf.torch import IterableDataset

target = h.target  # the fixture: a local folder, or a fresh bucket on the real S3 server


def read_records(uri, shards, fmt, **kwargs):
    """Every record of `shards` (keys below uri), in shard order."""
    return list(IterableDataset.from_shards(uri, list(shards), format=fmt, shuffle=False,
                                            **kwargs))


# -- tar: webdataset's TarWriter in, webdataset's grouping out --

def webdataset_samples(path):
    """What webdataset's own reader yields for a local shard: [(key, {ext: bytes})]."""
    out = []
    for s in tarfile_samples([{"url": path}]):
        out.append((s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}))
    return out


def wharf_samples(uri, key):
    return [(s.key, {ext: bytes(b) for ext, b in s.data.items()})
            for s in read_records(uri, [key], "tar")]


def write_shard(path, samples, compress=False, extra=()):
    """A shard by webdataset.TarWriter (raw bytes, no encoder), then `extra` members
    (name, bytes) appended with tarfile where TarWriter cannot name them."""
    with open(path, "wb") as f:
        with wds.TarWriter(f, encoder=False, compress=compress) as w:
            for sample in samples:
                w.write(sample)
    if extra:
        assert not compress
        with tarfile.open(path, "a") as t:
            for name, data in extra:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


SAMPLES = [
    {"__key__": "train/s000", "JPG": b"upper-case extension", "Seg.PNG": b"mixed case",
     "cls": b"0"},
    {"__key__": "train/s001", "jpg": b"\x00\x01" * 700, "cls": b"1", "meta.json": b"{}"},
    # A key that ends in '/' makes members whose names start with a dot ("train/.hidden").
    {"__key__": "train/", "hidden": b"dot member", "DS_Store": b"finder"},
    {"__key__": "./flat", "txt": b"a key that keeps its './'"},
    {"__key__": "train/s002", "jpg": bytes(range(256)) * 40, "txt": b""},
]


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz"])
def test_tar_shards_group_as_webdataset_reads_them(target, tmp_path, compress):
    uri, store = target
    name = "shard.tar.gz" if compress else "shard.tar"
    path = str(tmp_path / name)
    extra = () if compress else (("__meta__/info.json", b"{}"), ("README", b"no extension"),
                                 (".toplevel.txt", b"no key"), ("train/s003.TXT", b"after"))
    write_shard(path, SAMPLES, compress=compress, extra=extra)
    with open(path, "rb") as f:
        store.put(f"wds/{name}", f.read())
    want = webdataset_samples(path)
    got = wharf_samples(uri, f"wds/{name}")
    assert got == want
    # What that means, spelled out.
    keys = [k for k, _ in got]
    assert keys[:5] == ["train/s000", "train/s001", "train/", "./flat", "train/s002"]
    assert got[0][1] == {"jpg": b"upper-case extension", "seg.png": b"mixed case", "cls": b"0"}
    assert got[2][1] == {"hidden": b"dot member", "ds_store": b"finder"}
    if not compress:
        assert keys[5:] == ["train/s003"]


def as_tuple(s):
    return (s.url.rsplit("/", 1)[1], s.key, bytes(s["bin"]))


@pytest.mark.parametrize("shuffle_buffer", [0, 8])
def test_compressed_shards_are_listed_and_resume(target, tmp_path, shuffle_buffer):
    uri, store = target
    rng = random.Random(4)
    samples = [{"__key__": f"s{i:03d}", "bin": rng.randbytes(rng.randrange(0, 5000)),
                "cls": str(i).encode()} for i in range(30)]
    for name, compress in (("a.tar", False), ("b.tar.gz", True), ("c.tgz", True)):
        path = str(tmp_path / name)
        write_shard(path, samples, compress=compress)
        with open(path, "rb") as f:
            store.put(f"mixed/{name}", f.read())
    assert wharf._wharf.record_formats(compressed=True)["tar"] == (".tar", ".tar.gz", ".tgz")

    def dataset():
        return IterableDataset.from_shards(uri + "mixed/", format="tar", shuffle=True, seed=3,
                                           shuffle_buffer=shuffle_buffer)

    ds = dataset()
    assert ds.shards == ["a.tar", "b.tar.gz", "c.tgz"]
    everything = [as_tuple(s) for s in ds]
    assert len(everything) == 90
    for name in ("b.tar.gz", "c.tgz"):
        assert sorted(e[1:] for e in everything if e[0] == name) == \
            [(s["__key__"], s["bin"]) for s in samples]
    # Stop inside a compressed shard, resume from the state (buffered records included): the
    # offsets are decompressed ones, and a reopened compressed shard is inflated up to them.
    compressed = [i for i, e in enumerate(everything) if e[0] != "a.tar"]
    stop = compressed[len(compressed) // 2] + 1  # just after a record of a compressed shard
    ds = dataset()
    it = iter(ds)
    taken = [as_tuple(next(it)) for _ in range(stop)]
    state = ds.state_dict()
    resumed = dataset()
    resumed.load_state_dict(state)
    assert taken + [as_tuple(s) for s in resumed] == everything


def test_a_gzip_shard_under_a_plain_name_is_refused_by_name(target, tmp_path):
    uri, store = target
    path = str(tmp_path / "x.tar.gz")
    write_shard(path, SAMPLES, compress=True)
    with open(path, "rb") as f:
        store.put("bad/x.tar", f.read())
    with pytest.raises(ValueError, match=r"x\.tar at byte 0: the shard is gzip-compressed"):
        read_records(uri, ["bad/x.tar"], "tar")


def test_members_that_would_overwrite_sample_metadata_are_refused(target, tmp_path):
    uri, store = target
    path = str(tmp_path / "m.tar")
    with tarfile.open(path, "w") as t:
        for name in ("s1.jpg", "s1.__key__"):
            info = tarfile.TarInfo(name)
            info.size = 1
            t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match="duplicate file name"):
        webdataset_samples(path)  # webdataset refuses it too
    with open(path, "rb") as f:
        store.put("meta/m.tar", f.read())
    with pytest.raises(ValueError, match="extension '__key__', which names a sample's metadata"):
        read_records(uri, ["meta/m.tar"], "tar")


# -- TFRecord: GZIP and ZLIB as tf.data reads them --

def test_tfrecord_gzip_and_zlib(target):
    uri, store = target
    rng = random.Random(7)
    records = [b"", b"a"] + [rng.randbytes(rng.randrange(0, 3000)) for _ in range(60)]
    framed, offsets = h.tfrecord_file(records)
    cut = len(framed) // 3  # mid-frame: gzip members need not end at a record
    files = {
        "plain.tfrecord": framed,
        "g.tfrecord.gz": gzip.compress(framed),
        "z.tfrecord.zlib": zlib.compress(framed),
        # Two gzip members in a row (pigz, cat a.gz b.gz): one stream, as gzip.decompress reads.
        "m.tfrecords.gz": gzip.compress(framed[:cut]) + gzip.compress(framed[cut:], 1),
    }
    assert gzip.decompress(files["m.tfrecords.gz"]) == framed
    for name, data in files.items():
        store.put(f"tf/{name}", data)
    ds = IterableDataset.from_shards(uri + "tf/", format="tfrecord", shuffle=False)
    assert sorted(ds.shards) == sorted(files)
    by_shard = {}
    for s in ds:
        by_shard.setdefault(s.url.rsplit("/", 1)[1], []).append((s.offset, bytes(s.data)))
    for name in files:
        # Offsets count decompressed bytes: the same as the plain file's.
        assert by_shard[name] == list(zip(offsets, records)), name

    # Resume inside the GZIP file.
    ds = IterableDataset.from_shards(uri + "tf/", ["g.tfrecord.gz"], format="tfrecord",
                                     shuffle=False)
    it = iter(ds)
    first = [bytes(next(it).data) for _ in range(25)]
    state = ds.state_dict()
    resumed = IterableDataset.from_shards(uri + "tf/", ["g.tfrecord.gz"], format="tfrecord",
                                          shuffle=False)
    resumed.load_state_dict(state)
    assert first + [bytes(s.data) for s in resumed] == records


def test_a_compressed_tfrecord_under_a_plain_name_says_which(target):
    uri, store = target
    framed, _ = h.tfrecord_file([b"x" * 100, b"y"])
    store.put("tfbad/g.tfrecord", gzip.compress(framed))
    store.put("tfbad/z.tfrecord", zlib.compress(framed))
    with pytest.raises(ValueError, match='compression_type="GZIP"'):
        read_records(uri, ["tfbad/g.tfrecord"], "tfrecord")
    with pytest.raises(ValueError, match='compression_type="ZLIB"'):
        read_records(uri, ["tfbad/z.tfrecord"], "tfrecord")
    store.put("tfbad/cut.tfrecord.gz", gzip.compress(framed)[:-10])
    with pytest.raises(wharf.WharfError, match="gzip stream is cut short"):
        read_records(uri, ["tfbad/cut.tfrecord.gz"], "tfrecord")


# -- CSV: what pandas writes, split into what pandas reads --

FRAME = pd.DataFrame({
    "id": ["1", "2", "3", "4", "5", "6"],
    "text": ["plain", "with, comma", 'say "hi"', "two\nlines", "crlf\r\ninside", ""],
    "more": ["é ü 日本", " spaces ", '"', "a,b\"c\nd", "x", "last"],
})


def csv_rows(uri, key, **kwargs):
    return [wharf.split_csv(bytes(s.data)) for s in read_records(uri, [key], "csv", **kwargs)]


def pandas_rows(path, **kwargs):
    df = pd.read_csv(path, dtype=str, keep_default_na=False, **kwargs)
    return [list(df.columns)] + df.values.tolist()


@pytest.mark.parametrize("variant", [
    dict(encoding="utf-8-sig"),                      # a byte-order mark
    dict(encoding="utf-8-sig", lineterminator="\r\n"),
    dict(quoting=1),                                 # csv.QUOTE_ALL
    dict(),
], ids=["bom", "bom-crlf", "quote-all", "plain"])
def test_csv_written_by_pandas_reads_as_pandas_reads_it(target, tmp_path, variant):
    uri, store = target
    path = tmp_path / "frame.csv"
    FRAME.to_csv(path, index=False, **variant)
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") == (variant.get("encoding") == "utf-8-sig")
    store.put("csv/frame.csv", raw)
    want = pandas_rows(path)
    assert want[0] == ["id", "text", "more"]  # pandas drops the mark
    got = csv_rows(uri, "csv/frame.csv")
    assert got == want
    # With header=True the header row is not a record.
    assert csv_rows(uri, "csv/frame.csv", header=True) == want[1:]


def test_backslash_escaped_quotes_are_refused_with_the_line(target, tmp_path):
    uri, store = target
    path = tmp_path / "escaped.csv"
    # Written with backslash escapes instead of doubled quotes: 'a,b"c\nd' -> "a,b\"c\nd". (An
    # unquoted field's \" is two ordinary bytes to pandas and to wharf alike: say \"hi\".)
    FRAME.to_csv(path, index=False, escapechar="\\", doublequote=False)
    raw = path.read_bytes()
    assert b'"a,b\\"c\nd"' in raw
    # pandas, not told about the escapes, silently splits that row in two.
    assert ["d\"", "", ""] in pandas_rows(path)
    store.put("esc/escaped.csv", raw)
    # The line of the escaped quote inside a quoted field.
    line = raw[:raw.index(b'\\"c')].count(b"\n") + 1
    assert line == 6
    with pytest.raises(ValueError) as err:
        csv_rows(uri, "esc/escaped.csv")
    message = str(err.value)
    assert message.startswith(f"read csv {uri}esc/escaped.csv at byte ")
    assert f": line {line} (byte " in message
    assert 'backslash-escaped quote; wharf reads RFC 4180 quoting ("")' in message


def test_utf16_csv_is_refused(target, tmp_path):
    uri, store = target
    path = tmp_path / "u16.csv"
    FRAME.to_csv(path, index=False, encoding="utf-16")
    store.put("u16/u16.csv", path.read_bytes())
    with pytest.raises(ValueError, match="UTF-16 or UTF-32 byte-order mark"):
        csv_rows(uri, "u16/u16.csv")


# -- keys ending in '/' --

def test_keys_ending_in_a_slash_that_hold_data_are_kept(s3_env, bucket, s3_client, monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    s3_client.put_object(Bucket=bucket, Key="d/marker/", Body=b"")      # a directory marker
    s3_client.put_object(Bucket=bucket, Key="d/blob/", Body=b"data")    # an object
    s3_client.put_object(Bucket=bucket, Key="d/a.bin", Body=b"a")
    ds = IterableDataset.from_prefix(f"s3://{bucket}/d/", shuffle=False)
    got = {s.key: bytes(s.data) for s in ds}
    assert got == {"a.bin": b"a", "blob/": b"data"}

