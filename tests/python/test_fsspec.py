"""wharf.fsspec: the fsspec filesystem over wharf's engine (docs/design/fsspec.md).

Every method on the real S3 server (RGW) and on file://; fsspec's own abstract test suite
(fsspec.tests.abstract) on RGW and file://; install() under pandas and pyarrow, also in a
process where s3fs and gcsfs cannot be imported; the entry point fsspec finds in an installed
package; pickling to spawned processes; gs:// on the GCS emulator. Each test works in a fresh
bucket or a fresh prefix and leaves nothing behind.
"""
import datetime
import io
import json
import os
import threading
import pathlib
import pickle
import subprocess
import sys
import textwrap
import tomllib
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
import multiprocessing

import fsspec
import fsspec.tests.abstract as abstract
import pytest

import wharf
import wharf.fsspec
from wharf.fsspec import WharfFileSystem, WharfGCSFileSystem, WharfS3FileSystem

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
# Where `import wharf` came from, for processes the tests start.
WHARF_PATH = str(pathlib.Path(wharf.__file__).resolve().parent.parent)


def requests(op, scheme="s3"):
    """The store requests of `op` answered so far in this process (wharf's metrics); "put"
    counts single PUTs and writers' uploads ("write") together."""
    counters = wharf.metrics()["counters"]
    ops = ("put", "write") if op == "put" else (op,)
    return sum(v for k, v in counters.items() for o in ops
               if k.startswith(f'wharf_store_requests_total{{scheme="{scheme}",op="{o}"'))


def join(*parts):
    return "/".join(p.rstrip("/") for p in parts[:-1]) + "/" + parts[-1]


@pytest.fixture
def fs(aws):
    return WharfFileSystem(skip_instance_cache=True)


@pytest.fixture(params=["s3", "file"])
def root(request, aws, tmp_path):
    """A fresh, empty directory: a prefix of a fresh bucket on RGW, or a file:// tmp dir."""
    if request.param == "s3":
        bucket = request.getfixturevalue("bucket")
        return f"s3://{bucket}/t-{uuid.uuid4().hex[:8]}"
    return f"file://{tmp_path}/t"


# ---------------------------------------------------------------- the methods, one by one


def test_the_root_above_the_buckets_lists_them(fs, bucket):
    # As s3fs: ls("s3://") (or "" on the s3 filesystem) gives the buckets, as directories.
    listed = fs.ls("s3://", detail=True)
    assert {"name": f"s3://{bucket}", "size": 0, "type": "directory"} in listed
    assert f"s3://{bucket}" in fs.ls("s3://", detail=False)
    s3 = WharfS3FileSystem(skip_instance_cache=True)
    assert bucket in s3.ls("", detail=False)
    assert s3.info("")["type"] == "directory"
    assert {b["name"] for b in wharf.list_buckets("s3")} >= {bucket}
    assert {b["name"] for b in wharf.list_buckets("s3://")} >= {bucket}  # a bucketless URI


def test_get_refuses_keys_that_would_land_outside_and_leaves_no_partial_file(
        fs, bucket, s3_client, tmp_path):
    # Keys a listing may hold that are no path below the destination: fsspec releases without
    # check_contained wrote 'p/../../x' outside it, and 'p/./a' onto 'p/a'.
    for key in ("g/ok", "g/../../fsspec-outside-" + bucket, "g/sub/./dup", "g/sub/dup"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"z")
    dst = tmp_path / "deep" / "dst"
    dst.mkdir(parents=True)
    with pytest.raises(ValueError, match=r"has a '\.', '\.\.' or empty path component"):
        fs.get(f"s3://{bucket}/g/", str(dst) + "/", recursive=True)
    assert list(dst.iterdir()) == []
    assert not list(tmp_path.rglob("fsspec-outside-*"))
    # A read that fails halfway leaves nothing at the target (it is written beside it and
    # renamed when whole).
    s3_client.put_object(Bucket=bucket, Key="h/big", Body=os.urandom(3 << 20))

    class Stop(Exception):
        pass

    class FailAfterFirst(fsspec.callbacks.Callback):
        def relative_update(self, inc=1):
            raise Stop()

    with pytest.raises(Stop):
        fs.get_file(f"s3://{bucket}/h/big", str(tmp_path / "part"), callback=FailAfterFirst())
    assert sorted(os.listdir(tmp_path)) == ["deep"]


def test_ls_info_isdir_isfile_exists(fs, root):
    fs.pipe({join(root, "a.txt"): b"hello", join(root, "d/b.bin"): b"12345678",
             join(root, "d/e/c"): b"", join(root, "d.txt"): b"x"})
    assert fs.ls(root, detail=False) == [join(root, "a.txt"), join(root, "d"),
                                         join(root, "d.txt")]
    detail = {e["name"]: e for e in fs.ls(root + "/", detail=True)}  # a trailing slash too
    assert detail[join(root, "a.txt")]["type"] == "file"
    assert detail[join(root, "a.txt")]["size"] == 5
    assert detail[join(root, "d")] == {"name": join(root, "d"), "size": 0, "type": "directory"}
    # Names by default, as s3fs and gcsfs give them.
    assert fs.ls(join(root, "d")) == [join(root, "d/b.bin"), join(root, "d/e")]
    # ls of a file is the file
    assert fs.ls(join(root, "a.txt"), detail=False) == [join(root, "a.txt")]
    with pytest.raises(FileNotFoundError):
        fs.ls(join(root, "nothing"))

    info = fs.info(join(root, "d/b.bin"))
    assert info["name"] == join(root, "d/b.bin") and info["size"] == 8
    assert info["type"] == "file" and info["etag"]
    assert fs.info(join(root, "d")) == {"name": join(root, "d"), "size": 0, "type": "directory"}
    with pytest.raises(FileNotFoundError):
        fs.info(join(root, "d/b"))  # a prefix of a name is nothing
    assert fs.isdir(root) and fs.isdir(join(root, "d")) and fs.isdir(join(root, "d/e"))
    assert not fs.isdir(join(root, "a.txt")) and not fs.isdir(join(root, "nothing"))
    assert fs.isfile(join(root, "a.txt")) and fs.isfile(join(root, "d/e/c"))
    assert not fs.isfile(join(root, "d")) and not fs.isfile(join(root, "nothing"))
    assert fs.exists(join(root, "d")) and fs.exists(join(root, "d/e/c"))
    assert not fs.exists(join(root, "nothing")) and not fs.exists(join(root, "d/b"))
    assert fs.size(join(root, "d/b.bin")) == 8
    assert fs.du(root) == 14


def test_find_maxdepth_withdirs_detail(fs, root):
    for key in ("a", "d/b", "d/e/c", "d/e/f/g"):
        fs.pipe(join(root, key), key.encode())
    assert fs.find(root) == [join(root, k) for k in ("a", "d/b", "d/e/c", "d/e/f/g")]
    assert fs.find(root, maxdepth=1) == [join(root, "a")]
    assert fs.find(root, maxdepth=2) == [join(root, "a"), join(root, "d/b")]
    assert fs.find(root, withdirs=True) == [root] + [
        join(root, k) for k in ("a", "d", "d/b", "d/e", "d/e/c", "d/e/f", "d/e/f/g")]
    assert fs.find(root, maxdepth=2, withdirs=True) == [root] + [
        join(root, k) for k in ("a", "d", "d/b", "d/e")]
    detail = fs.find(join(root, "d"), detail=True)
    assert set(detail) == {join(root, k) for k in ("d/b", "d/e/c", "d/e/f/g")}
    assert detail[join(root, "d/e/f/g")]["size"] == 7
    # prefix= (s3fs's): names below the path that start with it (it was ignored)
    assert fs.find(root, prefix="d/e") == [join(root, k) for k in ("d/e/c", "d/e/f/g")]
    assert fs.find(join(root, "d"), prefix="e/f") == [join(root, "d/e/f/g")]
    assert fs.find(root, prefix="zz") == []
    # find of a file is the file; of nothing, nothing
    assert fs.find(join(root, "d/b")) == [join(root, "d/b")]
    assert fs.find(join(root, "nothing")) == []
    assert fs.glob(join(root, "d/*")) == [join(root, "d/b"), join(root, "d/e")]
    assert fs.glob(join(root, "**/c")) == [join(root, "d/e/c")]
    assert [p for p, _, _ in fs.walk(root)] == [root, join(root, "d"), join(root, "d/e"),
                                                 join(root, "d/e/f")]


def test_cat_cat_file_ranges(fs, root):
    data = bytes(range(256)) * 40
    fs.pipe_file(join(root, "blob"), data)
    fs.pipe_file(join(root, "small"), b"abc")
    fs.pipe_file(join(root, "empty"), b"")
    assert fs.cat(join(root, "blob")) == data
    # cat passes start/end on to cat_file, as fsspec's own cat does (they were dropped: the
    # whole object came back).
    assert fs.cat(join(root, "blob"), start=2, end=5) == data[2:5]
    assert fs.cat([join(root, "blob"), join(root, "small")], start=1, end=2) == {
        join(root, "blob"): data[1:2], join(root, "small"): b"b"}
    assert fs.cat_file(join(root, "blob"), 100, 300) == data[100:300]
    assert fs.cat_file(join(root, "blob"), start=10_000) == data[10_000:]
    assert fs.cat_file(join(root, "blob"), end=5) == data[:5]
    assert fs.cat_file(join(root, "blob"), -10) == data[-10:]
    assert fs.cat_file(join(root, "blob"), 5, -5) == data[5:-5]
    assert fs.cat_file(join(root, "blob"), len(data), None) == b""  # at the end: nothing
    assert fs.cat_file(join(root, "blob"), len(data) + 9, None) == b""
    assert fs.cat_file(join(root, "blob"), 30, 20) == b""
    assert fs.cat_file(join(root, "empty")) == b""
    assert fs.cat_file(join(root, "empty"), 0, 10) == b""
    with pytest.raises(FileNotFoundError):
        fs.cat_file(join(root, "nothing"))
    with pytest.raises(FileNotFoundError):
        fs.cat_file(join(root, "nothing"), 3, 2)
    assert fs.head(join(root, "blob"), 7) == data[:7]
    assert fs.tail(join(root, "blob"), 7) == data[-7:]
    assert fs.read_block(join(root, "blob"), 50, 25) == data[50:75]

    # many paths at once
    assert fs.cat([join(root, "small"), join(root, "empty")]) == {
        join(root, "small"): b"abc", join(root, "empty"): b""}
    assert fs.cat(root, recursive=True) == {join(root, "blob"): data,
                                            join(root, "empty"): b"",
                                            join(root, "small"): b"abc"}
    out = fs.cat([join(root, "small"), join(root, "nothing")], on_error="return")
    assert out[join(root, "small")] == b"abc"
    assert isinstance(out[join(root, "nothing")], FileNotFoundError)
    assert fs.cat([join(root, "small"), join(root, "nothing")], on_error="omit") == {
        join(root, "small"): b"abc"}
    with pytest.raises(FileNotFoundError):
        fs.cat([join(root, "small"), join(root, "nothing")])

    # cat_ranges: many ranges of a few objects, in parallel, in order
    starts = list(range(0, 10_000, 97))
    paths = [join(root, "blob")] * len(starts)
    got = fs.cat_ranges(paths, starts, [s + 33 for s in starts])
    assert got == [data[s:s + 33] for s in starts]
    assert fs.cat_ranges([join(root, "small"), join(root, "blob")], 1, 3) == [b"bc",
                                                                              data[1:3]]
    got = fs.cat_ranges([join(root, "small"), join(root, "nothing")], [0, 0], [2, 2])
    assert got[0] == b"ab" and isinstance(got[1], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges([join(root, "nothing")], [0], [2], on_error="raise")
    with pytest.raises(ValueError):
        fs.cat_ranges([join(root, "small")], [0, 1], [2])


def test_cat_ranges_is_one_ranged_get_per_range(fs, aws, bucket):
    """cat_ranges fetches exactly the ranges asked for: one ranged GET each (issued from a
    thread pool, each waiting without the GIL), never the whole object."""
    root = f"s3://{bucket}/par"
    data = os.urandom(1 << 20)
    fs.pipe_file(join(root, "big"), data)
    starts = list(range(0, 1 << 20, 1 << 14))
    ends = [s + 1000 for s in starts]
    before = requests("get")
    got = fs.cat_ranges([join(root, "big")] * len(starts), starts, ends)
    assert got == [data[s:e] for s, e in zip(starts, ends)]
    assert requests("get") - before == len(starts)  # one ranged GET each, no whole reads


def test_an_empty_path_component_is_not_listed_as_the_folder_itself(fs, aws, bucket, s3_client):
    # "/lead" and "dbl//b" hold a folder without a name: ls listed it as the folder itself
    # (walk saw a file named "", recursive get failed). find still reaches the objects.
    for key in ("/lead", "top", "dbl//b", "dbl/c"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    assert fs.ls(f"s3://{bucket}", detail=False) == [f"s3://{bucket}/dbl", f"s3://{bucket}/top"]
    assert fs.ls(f"s3://{bucket}/dbl", detail=False) == [f"s3://{bucket}/dbl/c"]
    walked = list(fs.walk(f"s3://{bucket}"))
    assert all("" not in files and "" not in dirs for _, dirs, files in walked), walked
    assert len(fs.find(f"s3://{bucket}")) == 4


def test_open_read_write_exclusive(fs, root):
    data = os.urandom(3 << 20)
    with fs.open(join(root, "f.bin"), "wb") as f:
        f.write(data[:1000])
        f.write(memoryview(data)[1000:])
        assert not fs.exists(join(root, "f.bin"))  # appears at close, whole
    with fs.open(join(root, "f.bin"), "rb") as f:
        assert f.size == len(data) and f.seekable()
        assert f.read(10) == data[:10]
        f.seek(2 << 20)
        assert f.read(5) == data[2 << 20:(2 << 20) + 5]
        f.seek(-3, io.SEEK_END)
        assert f.read() == data[-3:]
        assert f.path == fs._strip_protocol(join(root, "f.bin")) and f.fs is fs
    with fs.open(join(root, "t.txt"), "w", encoding="utf-8") as f:
        f.write("zwölf\nlines\n")
    with fs.open(join(root, "t.txt"), "r", encoding="utf-8") as f:
        assert f.readlines() == ["zwölf\n", "lines\n"]
    assert fs.read_text(join(root, "t.txt"), encoding="utf-8") == "zwölf\nlines\n"

    # an exception inside the with block: nothing appears
    with pytest.raises(RuntimeError):
        with fs.open(join(root, "aborted"), "wb") as f:
            f.write(b"half")
            raise RuntimeError("stop")
    assert not fs.exists(join(root, "aborted"))

    # exclusive creation
    with fs.open(join(root, "x"), "xb") as f:
        f.write(b"first")
    with pytest.raises(FileExistsError):
        fs.open(join(root, "x"), "xb")
    assert fs.cat(join(root, "x")) == b"first"
    # created by someone else after open: the commit is refused, theirs stays
    f = fs.open(join(root, "y"), "xb")
    f.write(b"mine")
    fs.pipe_file(join(root, "y"), b"theirs")
    with pytest.raises(FileExistsError):
        f.close()
    assert f.closed and fs.cat(join(root, "y")) == b"theirs"

    with pytest.raises(FileNotFoundError):
        fs.open(join(root, "nothing"), "rb")
    with pytest.raises(ValueError, match="not supported"):
        fs.open(join(root, "x"), "ab")
    with pytest.raises(TypeError, match="unknown options"):
        fs.open(join(root, "x"), "rb", no_such_option=1)
    with fs.open(join(root, "x"), "rb", cache_type="readahead") as f:  # fsspec's: ignored
        assert f.read() == b"first"
    with fs.open(join(root, "x"), "rb", size=5) as f:  # s3fs's (blockcache passes it)
        assert f.read() == b"first"


def test_text_and_compressed_writes_that_raise_leave_nothing(fs, root):
    # fsspec's text mode and compression wrap the binary file and close it on the way out of
    # their block, exception or not: nothing may appear.
    with pytest.raises(RuntimeError):
        with fs.open(join(root, "t.txt"), "w") as t:
            t.write("first half\n")
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        with fsspec.core.OpenFile(fs, join(root, "t.gz"), "wt", compression="gzip") as t:
            t.write("half" * 10000)
            raise RuntimeError("boom")
    # pandas writing into a text file: a cell that fails to format midway leaves no truncated
    # CSV.
    import pandas as pd

    class Bad:
        def __str__(self):
            raise RuntimeError("bad cell")

    frame = pd.DataFrame({"a": range(50_000), "b": ["x"] * 49_999 + [Bad()]})
    with pytest.raises(RuntimeError, match="bad cell"):
        with fs.open(join(root, "t.csv"), "w") as out:
            frame.to_csv(out)
    assert not fs.exists(join(root, "t.txt")) and not fs.exists(join(root, "t.gz"))
    assert not fs.exists(join(root, "t.csv"))
    with fs.open(join(root, "t.txt"), "w") as t:
        t.write("whole\n")
    assert fs.cat(join(root, "t.txt")) == b"whole\n"


def test_exclusive_create_is_decided_by_the_store(fs, root):
    # wharf.open(..., "xb") checks nothing itself: the store's conditional put decides at the
    # commit. Two files opened on one new key: the first close creates it, the second is
    # refused and writes nothing.
    uri = join(root, "race/obj")
    a = wharf.open(uri, "xb")
    b = wharf.open(uri, "xb")
    a.write(b"a" * 1000)
    b.write(b"b" * 2000)
    a.close()
    with pytest.raises(wharf.AlreadyExistsError, match="already exists") as refused:
        b.close()
    assert isinstance(refused.value, FileExistsError) and "race/obj" in str(refused.value)
    assert fs.cat(uri) == b"a" * 1000
    # Store.put(if_absent=True) from racing threads: exactly one creates the key.
    store = wharf.Store(root.rstrip("/") + "/")
    results = [None] * 8

    def racer(i):
        try:
            results[i] = store.put("race/put", f"racer {i}".encode(), if_absent=True)["etag"]
        except FileExistsError:
            results[i] = "refused"

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if r != "refused"]
    assert len(winners) == 1, results
    assert fs.cat(join(root, "race/put")) == f"racer {winners[0]}".encode()
    # pipe_file(mode="create") of a small value is the same conditional put.
    with pytest.raises(FileExistsError):
        fs.pipe_file(join(root, "race/put"), b"late", mode="create")
    assert fs.cat(join(root, "race/put")) == f"racer {winners[0]}".encode()


def test_pipe_put_get_touch(fs, root, tmp_path):
    fs.pipe_file(join(root, "p"), b"one")
    with pytest.raises(FileExistsError):
        fs.pipe_file(join(root, "p"), b"two", mode="create")
    assert fs.cat(join(root, "p")) == b"one"
    fs.pipe_file(join(root, "q"), b"two", mode="create")
    assert fs.cat(join(root, "q")) == b"two"

    local = tmp_path / "local"
    local.mkdir()
    small, big = local / "small", local / "sub" / "big"
    big.parent.mkdir()
    small.write_bytes(b"s" * 100)
    big_data = os.urandom(20 << 20)  # more than one 8 MiB part: the multipart writer
    big.write_bytes(big_data)
    fs.put_file(str(small), join(root, "up/small"))
    fs.put(str(local), join(root, "tree"), recursive=True)
    assert fs.find(join(root, "tree")) == [join(root, "tree/small"),
                                           join(root, "tree/sub/big")]
    assert fs.cat(join(root, "tree/sub/big")) == big_data
    with pytest.raises(FileExistsError):
        fs.put_file(str(small), join(root, "up/small"), mode="create")

    out = tmp_path / "out"
    fs.get(join(root, "tree"), str(out), recursive=True)
    assert (out / "sub" / "big").read_bytes() == big_data
    assert (out / "small").read_bytes() == b"s" * 100
    fs.get_file(join(root, "up/small"), str(tmp_path / "one"))
    assert (tmp_path / "one").read_bytes() == b"s" * 100
    buf = io.BytesIO()
    fs.get_file(join(root, "p"), buf)
    assert buf.getvalue() == b"one"
    with pytest.raises(FileNotFoundError):
        fs.get_file(join(root, "nothing"), str(tmp_path / "nothing"))

    fs.touch(join(root, "empty"))
    assert fs.info(join(root, "empty"))["size"] == 0
    fs.touch(join(root, "p"))
    assert fs.cat(join(root, "p")) == b""


def test_cp_file_server_side_and_across_stores(fs, root, aws, bucket, tmp_path):
    scheme = root.split(":")[0]
    fs.pipe_file(join(root, "src/a"), b"A" * 1000)
    fs.pipe_file(join(root, "src/d/b"), b"B")
    before = requests("copy", scheme)
    fs.cp_file(join(root, "src/a"), join(root, "dst/a"))
    assert requests("copy", scheme) - before == 1  # one server-side copy, no GET/PUT
    assert fs.cat(join(root, "dst/a")) == b"A" * 1000
    fs.copy(join(root, "src"), join(root, "tree"), recursive=True)
    assert fs.find(join(root, "tree")) == [join(root, "tree/a"), join(root, "tree/d/b")]
    with pytest.raises(FileNotFoundError):
        fs.cp_file(join(root, "nothing"), join(root, "dst/nothing"))
    fs.cp_file(join(root, "src/d"), join(root, "dst/d"))  # a directory copies as nothing
    assert not fs.exists(join(root, "dst/d"))
    fs.mv(join(root, "tree/a"), join(root, "moved"))
    assert fs.cat(join(root, "moved")) == b"A" * 1000 and not fs.exists(join(root, "tree/a"))

    # across stores (file:// <-> s3://): streamed through the engine
    other = f"file://{tmp_path}/x" if scheme == "s3" else f"s3://{bucket}/x"
    fs.cp_file(join(root, "src/a"), join(other, "a"))
    assert fs.cat(join(other, "a")) == b"A" * 1000
    fs.rm(other, recursive=True)


def test_store_copy_binding(aws, bucket):
    store = wharf.Store(f"s3://{bucket}/pre/")
    store.put("a", b"abc")
    meta = store.copy("a", "b/c")
    assert meta["key"] == "b/c" and meta["size"] == 3
    assert bytes(store.get("b/c")) == b"abc"
    with pytest.raises(wharf.NotFoundError):
        store.copy("missing", "x")
    assert [o["key"] for o in store.list("", limit=1)] == ["a"]
    assert [(o["key"], o["etag"]) for o in store.list("b/", recursive=False, limit=5)] == [
        ("b/c", meta["etag"])]
    assert store.list("", recursive=False, limit=5)[1] == {"prefix": "b/"}


def test_rm_batches_recursive_and_markers(fs, aws, bucket, s3_client):
    root = f"s3://{bucket}/rm"
    store = wharf.Store(f"s3://{bucket}/rm/")
    keys = [f"many/{i:05d}" for i in range(1100)]  # two DeleteObjects batches
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), keys))
    s3_client.put_object(Bucket=bucket, Key="rm/marked/", Body=b"")  # a directory marker
    s3_client.put_object(Bucket=bucket, Key="rm/marked/in", Body=b"1")
    s3_client.put_object(Bucket=bucket, Key="rm/emptydir/", Body=b"")
    fs.pipe({join(root, "keep"): b"k", join(root, "f1"): b"1", join(root, "f2"): b"2"})

    # markers are directories, not files
    assert fs.isdir(join(root, "marked")) and fs.isdir(join(root, "emptydir"))
    assert fs.ls(join(root, "emptydir")) == []
    assert join(root, "emptydir") in fs.ls(root, detail=False)
    assert fs.find(join(root, "marked")) == [join(root, "marked/in")]
    assert fs.find(join(root, "marked"), withdirs=True) == [join(root, "marked"),
                                                           join(root, "marked/in")]

    before = requests("delete_many")
    fs.rm(join(root, "many"), recursive=True)
    assert requests("delete_many") - before == 1  # one call; the store batches by 1,000
    assert not fs.exists(join(root, "many"))
    fs.rm([join(root, "f1"), join(root, "f2")])
    assert not fs.exists(join(root, "f1")) and not fs.exists(join(root, "f2"))
    fs.rm(join(root, "marked"), recursive=True)
    fs.rm(join(root, "emptydir"), recursive=True)
    left = s3_client.list_objects_v2(Bucket=bucket, Prefix="rm/").get("Contents", [])
    assert [o["Key"] for o in left] == ["rm/keep"]
    with pytest.raises(FileNotFoundError):
        fs.rm(join(root, "nothing"), recursive=True)
    fs.rm_file(join(root, "keep"))
    fs.rm_file(join(root, "keep"))  # deleting what is gone succeeds, as on S3
    assert not fs.exists(join(root, "keep"))


def test_mkdir_makedirs(fs, aws, s3_client, tmp_path):
    name = f"wharf-py-{uuid.uuid4().hex[:16]}"
    try:
        with pytest.raises(FileNotFoundError):
            fs.mkdir(f"s3://{name}/a/b", create_parents=False)
        fs.mkdir(f"s3://{name}")  # a bucket-level path creates the bucket
        s3_client.head_bucket(Bucket=name)
        with pytest.raises(FileExistsError):
            fs.mkdir(f"s3://{name}")
        fs.makedirs(f"s3://{name}", exist_ok=True)
        with pytest.raises(FileExistsError):
            fs.makedirs(f"s3://{name}")
        fs.makedirs(f"s3://{name}/x/y")  # below a bucket: nothing is created
        fs.mkdir(f"s3://{name}/x/y")
        assert fs.ls(f"s3://{name}") == [] and not fs.exists(f"s3://{name}/x")
        fs.rmdir(f"s3://{name}/x")
        fs.mkdir(f"file://{tmp_path}/d")  # file:// too: nothing until a file is in it
        assert not fs.exists(f"file://{tmp_path}/d")
    finally:
        try:
            s3_client.delete_bucket(Bucket=name)
        except s3_client.exceptions.ClientError:
            pass
    with pytest.raises(FileNotFoundError):
        fs.ls(f"s3://{name}")


def test_created_modified(fs, root):
    t0 = datetime.datetime.now(datetime.timezone.utc)
    fs.pipe_file(join(root, "a"), b"a")
    fs.pipe_file(join(root, "d/b"), b"b")
    modified = fs.modified(join(root, "a"))
    assert modified.tzinfo is not None
    assert abs((modified - t0).total_seconds()) < 60
    assert fs.created(join(root, "a")) == modified
    with pytest.raises(IsADirectoryError):
        fs.modified(join(root, "d"))
    with pytest.raises(FileNotFoundError):
        fs.modified(join(root, "nothing"))
    assert fs.ukey(join(root, "a")) == fs.info(join(root, "a"))["etag"]


def test_paths_and_names():
    s = WharfFileSystem._strip_protocol
    assert s("s3://b/k/") == "s3://b/k"
    assert s("file:///tmp/x/") == "file:///tmp/x"
    assert s("file:///") == "file:///"
    assert s("wharf://gs://b/k") == "gs://b/k"
    assert s(pathlib.PurePosixPath("/x")) == "/x"
    assert WharfFileSystem._parent("s3://b/k/l") == "s3://b/k"
    assert WharfFileSystem._parent("s3://b/k") == "s3://b"
    assert WharfFileSystem._parent("file:///tmp") == "file:///"
    assert WharfS3FileSystem._strip_protocol("s3://b/k/") == "b/k"
    assert WharfS3FileSystem._strip_protocol("s3a://b/k") == "b/k"
    assert WharfS3FileSystem._strip_protocol("b/k") == "b/k"
    assert WharfGCSFileSystem._strip_protocol("gcs://b/k") == "b/k"
    assert WharfS3FileSystem._parent("b/k") == "b"
    fs = WharfFileSystem(skip_instance_cache=True)
    with pytest.raises(ValueError, match="not a URI"):
        fs.ls("bucket/key")
    with pytest.raises(ValueError, match="names no bucket"):
        fs.cat_file("s3://")
    assert fs.unstrip_protocol("s3://b/k") == "s3://b/k"
    # fsspec URLs of the wharf protocol carry the URI: wharf://s3://bucket/key
    url_fs, path = fsspec.core.url_to_fs("wharf://s3://b/k")
    assert isinstance(url_fs, WharfFileSystem) and path == "s3://b/k"
    assert WharfS3FileSystem(skip_instance_cache=True).unstrip_protocol("b/k") == "s3://b/k"


def test_storage_options(aws, bucket):
    # s3fs's spellings map to wharf's store options
    fs = WharfS3FileSystem(anon=False, client_kwargs={"endpoint_url": aws["AWS_ENDPOINT_URL"],
                                                      "region_name": "us-east-1"},
                           skip_instance_cache=True)
    assert fs._options == {"anonymous": False, "endpoint": aws["AWS_ENDPOINT_URL"],
                           "region": "us-east-1"}
    fs.pipe_file(f"{bucket}/o", b"1")
    assert fs.cat(f"s3://{bucket}/o") == b"1"
    fs = WharfFileSystem(endpoint=aws["AWS_ENDPOINT_URL"], use_listings_cache=False,
                         skip_instance_cache=True)
    assert fs.cat(f"s3://{bucket}/o") == b"1"
    with pytest.raises(ValueError, match="credentials"):
        WharfS3FileSystem(key="AKIA", secret="x", skip_instance_cache=True)
    with pytest.raises(TypeError, match="unknown storage option 'versin_aware'"):
        WharfFileSystem(versin_aware=True, skip_instance_cache=True)


def _read_in_worker(fs, path):
    return fs.cat(path), type(fs).__name__


def test_pickles_to_spawned_workers(aws, bucket):
    fs = WharfFileSystem(endpoint=aws["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    fs.pipe_file(f"s3://{bucket}/w/0", b"zero")
    fs.pipe_file(f"s3://{bucket}/w/1", b"one")
    copy = pickle.loads(pickle.dumps(fs))
    assert copy is not fs and copy._options == fs._options
    assert copy.cat(f"s3://{bucket}/w/1") == b"one"
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        got = list(pool.map(_read_in_worker, [fs, fs], [f"s3://{bucket}/w/0",
                                                        f"s3://{bucket}/w/1"]))
    assert got == [(b"zero", "WharfFileSystem"), (b"one", "WharfFileSystem")]


def _read_rest(f):
    return f.tell(), f.read()


def test_a_file_open_for_reading_pickles_at_its_position(aws, bucket):
    # As fsspec's own files (a dask or multiprocessing worker gets the file itself): it
    # raised TypeError (cannot pickle the native reader).
    fs = WharfFileSystem(endpoint=aws["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    fs.pipe_file(f"s3://{bucket}/pk/r.bin", b"0123456789")
    with fs.open(f"s3://{bucket}/pk/r.bin", "rb") as f:
        f.seek(3)
        copy = pickle.loads(pickle.dumps(f))
        assert copy is not f and copy.path == f.path and _read_rest(copy) == (3, b"3456789")
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            assert pool.submit(_read_rest, f).result(timeout=120) == (3, b"3456789")
        assert f.read() == b"3456789"  # the original is where it was
    with fs.open(f"s3://{bucket}/pk/w.bin", "wb") as w:
        with pytest.raises(TypeError, match="open for writing"):
            pickle.dumps(w)


def test_gs_on_the_emulator(gcs_emulator, gcs_bucket, monkeypatch):
    for k in [k for k in os.environ if k.startswith("WHARF_GS_")]:
        monkeypatch.delenv(k)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "wharf-test")
    fs = WharfFileSystem(skip_instance_cache=True)
    root = f"gs://{gcs_bucket}/t"
    fs.pipe({join(root, "a"): b"alpha", join(root, "d/b"): b"beta"})
    # The root above the buckets lists them, as gcsfs does.
    assert f"gs://{gcs_bucket}" in fs.ls("gs://", detail=False)
    assert fs.info("gs://")["type"] == "directory"
    assert fs.find(root) == [join(root, "a"), join(root, "d/b")]
    assert fs.ls(root, detail=False) == [join(root, "a"), join(root, "d")]
    assert fs.cat_file(join(root, "a"), 1, 3) == b"lp"
    fs.cp_file(join(root, "a"), join(root, "c"))
    assert fs.cat(join(root, "c")) == b"alpha"
    with fs.open(join(root, "w"), "xb") as f:
        f.write(b"w")
    with pytest.raises(FileExistsError):
        fs.open(join(root, "w"), "xb")
    gcs = WharfGCSFileSystem(skip_instance_cache=True)
    assert gcs.cat(f"gcs://{gcs_bucket}/t/d/b") == b"beta"
    assert gcs.ls(f"{gcs_bucket}/t", detail=False) == [f"{gcs_bucket}/t/{n}"
                                                        for n in ("a", "c", "d", "w")]
    fs.rm(root, recursive=True)
    assert fs.find(root) == []


# ---------------------------------------------------------------- registration, install()


def test_registered_as_wharf():
    assert fsspec.get_filesystem_class("wharf") is WharfFileSystem
    fs = fsspec.filesystem("wharf")
    assert isinstance(fs, WharfFileSystem)


def test_entry_point_in_pyproject_reaches_the_class(tmp_path):
    """An installed wheel carries pyproject's entry point; fsspec reads it at import. A
    dist-info with that entry point (as pip writes it) makes fsspec.filesystem("wharf")
    resolve in a process that never imported wharf.fsspec."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    value = project["entry-points"]["fsspec.specs"]["wharf"]
    assert value == "wharf.fsspec:WharfFileSystem"
    dist = tmp_path / "wharf_entry_point_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: wharf-entry-point-probe\n"
                                   "Version: 0\n")
    (dist / "entry_points.txt").write_text(f"[fsspec.specs]\nwharf = {value}\n")
    code = textwrap.dedent("""
        import sys, fsspec
        assert "wharf.fsspec" not in sys.modules
        cls = fsspec.get_filesystem_class("wharf")
        print(cls.__module__ + "." + cls.__name__)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), WHARF_PATH]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "wharf.fsspec.WharfFileSystem"


@pytest.fixture
def installed():
    """wharf.fsspec.install() for one test; fsspec's registry restored afterwards."""
    import pandas
    from fsspec.registry import _registry
    saved = {p: _registry.get(p) for p in ("s3", "s3a", "gs", "gcs")}
    read, write = pandas.read_parquet, pandas.DataFrame.to_parquet
    wharf.fsspec.install()
    yield
    pandas.read_parquet, pandas.DataFrame.to_parquet = read, write
    for p, cls in saved.items():
        if cls is None:
            _registry.pop(p, None)
        else:
            _registry[p] = cls


def test_install_pandas_and_pyarrow_read_through_wharf(aws, bucket, installed):
    """After install(), pandas reaches s3:// through wharf: read_csv and to_csv through
    fsspec's registry, read_parquet / to_parquet also without storage_options (install()
    routes them to fsspec instead of pyarrow's own S3 client: docs/design/fsspec.md).
    pyarrow datasets over the fsspec filesystem list and read
    through wharf with s3fs's path form ("bucket/key")."""
    import pandas
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    assert isinstance(fsspec.filesystem("s3"), WharfS3FileSystem)
    assert isinstance(fsspec.filesystem("gs"), WharfGCSFileSystem)
    assert isinstance(fsspec.filesystem("gcs"), WharfGCSFileSystem)
    df = pandas.DataFrame({"i": range(1000), "s": [f"row {i}" for i in range(1000)],
                           "part": [i % 3 for i in range(1000)]})
    url = f"s3://{bucket}/tables/t.parquet"
    puts, gets = requests("put"), requests("get")
    df.to_parquet(url, storage_options={})
    assert requests("put") > puts
    back = pandas.read_parquet(url, columns=["i", "s"], storage_options={})
    assert requests("get") > gets
    assert back.equals(df[["i", "s"]])
    # without storage_options too: install() routes pandas' parquet calls to fsspec
    puts, gets = requests("put"), requests("get")
    df.to_parquet(f"s3://{bucket}/tables/u.parquet")
    assert pandas.read_parquet(f"s3://{bucket}/tables/u.parquet").equals(df)
    assert requests("put") > puts and requests("get") > gets
    puts, gets = requests("put"), requests("get")
    df.to_csv(f"s3://{bucket}/tables/t.csv", index=False)
    assert pandas.read_csv(f"s3://{bucket}/tables/t.csv").equals(df)
    assert requests("put") > puts and requests("get") > gets
    # A to_csv that fails midway (a cell that cannot be formatted) leaves no truncated CSV:
    # pandas closes its handles on the way out of its block, and that close aborts.

    class Bad:
        def __str__(self):
            raise RuntimeError("bad cell")

    bad = pandas.DataFrame({"a": range(50_000), "b": ["x"] * 49_999 + [Bad()]})
    with pytest.raises(RuntimeError, match="bad cell"):
        bad.to_csv(f"s3://{bucket}/tables/bad.csv")
    assert not fsspec.filesystem("s3").exists(f"{bucket}/tables/bad.csv")
    # s3fs's storage options reach wharf's store
    opts = {"client_kwargs": {"endpoint_url": aws["AWS_ENDPOINT_URL"]}, "anon": False}
    assert pandas.read_csv(f"s3://{bucket}/tables/t.csv", storage_options=opts).equals(df)

    # a partitioned pyarrow dataset through fsspec (stripped "bucket/key" paths)
    fs = fsspec.filesystem("s3")
    pq.write_to_dataset(pa.Table.from_pandas(df), f"{bucket}/ds", partition_cols=["part"],
                        filesystem=fs)
    assert fs.ls(f"{bucket}/ds", detail=False) == [f"{bucket}/ds/part={p}" for p in range(3)]
    gets = requests("get")
    dataset = ds.dataset(f"{bucket}/ds", filesystem=fs, format="parquet",
                         partitioning="hive")
    table = dataset.to_table(filter=ds.field("part") == 1)
    assert requests("get") > gets
    assert sorted(table.column("i").to_pylist()) == [i for i in range(1000) if i % 3 == 1]
    whole = pandas.read_parquet(f"s3://{bucket}/ds", storage_options={})
    assert sorted(whole["i"]) == list(range(1000))


def test_install_without_s3fs_and_gcsfs(s3_env, bucket, s3_client, tmp_path):
    """In a process where s3fs and gcsfs cannot be imported, fsspec has no s3:// of its own
    (read_csv fails); after install() pandas reads s3:// through wharf (its GET counter
    moves)."""
    import pandas
    df = pandas.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    df.to_parquet(tmp_path / "t.parquet")
    df.to_csv(tmp_path / "t.csv", index=False)
    s3_client.upload_file(str(tmp_path / "t.parquet"), bucket, "t.parquet")
    s3_client.upload_file(str(tmp_path / "t.csv"), bucket, "t.csv")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["s3fs"] = None      # `import s3fs` raises ImportError
        sys.modules["gcsfs"] = None
        for name in ("s3fs", "gcsfs"):
            try:
                __import__(name)
                raise SystemExit(name + " imported")
            except ImportError:
                pass
        import pandas
        try:
            pandas.read_csv("s3://{bucket}/t.csv")
            raise SystemExit("read s3:// without s3fs and without install()")
        except ImportError:
            pass
        import fsspec, wharf, wharf.fsspec
        wharf.fsspec.install()
        def gets():
            return sum(v for k, v in wharf.metrics()["counters"].items()
                       if k.startswith('wharf_store_requests_total{{scheme="s3",op="get"'))
        before = gets()
        pq = pandas.read_parquet("s3://{bucket}/t.parquet")  # no options: through wharf too
        csv = pandas.read_csv("s3://{bucket}/t.csv")
        assert gets() >= before + 2, (before, gets())
        assert pq.equals(csv), (pq, csv)
        print(type(fsspec.filesystem("s3")).__name__, pq.to_json(orient="records"))
    """)
    env = dict(s3_env, PYTHONPATH=WHARF_PATH)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    name, records = out.stdout.strip().split(" ", 1)
    assert name == "WharfS3FileSystem"
    assert json.loads(records) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 3, "b": "z"}]


def test_hugging_face_datasets_through_wharf(s3_env, bucket, s3_client, tmp_path):
    """Hugging Face datasets reaches s3:// through fsspec; after install(), in a process where
    s3fs and gcsfs cannot be imported, load_dataset (parquet by glob, csv, streaming) and
    save_to_disk / load_from_disk read and write through wharf (its GET and PUT counters
    move) and give back the rows that were written."""
    import pandas
    df = pandas.DataFrame({"i": range(300), "s": [f"row {i}" for i in range(300)]})
    for n in range(3):
        df.iloc[n * 100:(n + 1) * 100].to_parquet(tmp_path / f"part-{n}.parquet", index=False)
        s3_client.upload_file(str(tmp_path / f"part-{n}.parquet"), bucket,
                              f"hf/train/part-{n}.parquet")
    df.to_csv(tmp_path / "t.csv", index=False)
    s3_client.upload_file(str(tmp_path / "t.csv"), bucket, "hf/t.csv")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["s3fs"] = None
        sys.modules["gcsfs"] = None
        import datasets, wharf, wharf.fsspec
        wharf.fsspec.install()
        def count(op):
            return sum(v for k, v in wharf.metrics()["counters"].items()
                       if k.startswith('wharf_store_requests_total{{scheme="s3",op="' + op + '"'))
        gets = count("get")
        pq = datasets.load_dataset("parquet", data_files="s3://{bucket}/hf/train/*.parquet",
                                   split="train")
        csv = datasets.load_dataset("csv", data_files="s3://{bucket}/hf/t.csv", split="train")
        assert count("get") >= gets + 4, (gets, count("get"))
        assert sorted(pq["i"]) == list(range(300)) and csv["i"] == list(range(300))
        assert sorted(zip(pq["i"], pq["s"])) == list(zip(csv["i"], csv["s"]))
        gets = count("get")
        streamed = datasets.load_dataset("parquet", split="train", streaming=True,
                                         data_files="s3://{bucket}/hf/train/*.parquet")
        rows = sorted(r["i"] for r in streamed)
        assert rows == list(range(300)) and count("get") > gets, rows[:5]
        puts = count("put") + count("write")  # whole-object and streamed uploads
        csv.save_to_disk("s3://{bucket}/hf/saved")
        assert count("put") + count("write") >= puts + 3, (puts, count("write"))
        back = datasets.load_from_disk("s3://{bucket}/hf/saved")
        assert back["s"] == csv["s"]
        print(len(pq), len(csv), len(back))
    """)
    cache = tmp_path / "hf-cache"
    env = dict(s3_env, PYTHONPATH=WHARF_PATH, HF_HOME=str(cache), HF_DATASETS_CACHE=str(cache),
               HF_DATASETS_DISABLE_PROGRESS_BARS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.split() == ["300", "300", "300"]
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket,
                                                         Prefix="hf/saved/")["Contents"]]
    assert "hf/saved/dataset_info.json" in keys and any(k.endswith(".arrow") for k in keys)


# ---------------------------------------------------------------- fsspec's abstract suite


@pytest.fixture(scope="module")
def suite_bucket(s3_client):
    """One bucket for the abstract suite's tests (each works under its own prefix); removed,
    and checked empty, at the end."""
    name = f"wharf-py-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    left = s3_client.list_objects_v2(Bucket=name).get("Contents", [])
    for o in left:
        s3_client.delete_object(Bucket=name, Key=o["Key"])
    s3_client.delete_bucket(Bucket=name)
    assert not left, f"the abstract suite left objects behind: {[o['Key'] for o in left]}"


class WharfS3Fixtures(abstract.AbstractFixtures):
    """fsspec's fixtures for wharf on RGW: paths are full URIs under a fresh prefix of one
    bucket, joined with "/". Object stores have no empty directories (a prefix exists while a
    key is below it), as for s3fs."""

    @pytest.fixture
    def fs(self, aws):
        return WharfFileSystem(skip_instance_cache=True)

    @pytest.fixture
    def fs_path(self, fs, suite_bucket):
        path = f"s3://{suite_bucket}/{uuid.uuid4().hex[:12]}"
        yield path
        if fs.exists(path):  # the suite's fixtures clean up; this catches a failed test's
            fs.rm(path, recursive=True)

    @pytest.fixture
    def fs_join(self):
        return join

    @pytest.fixture
    def supports_empty_directories(self):
        return False


class WharfFileFixtures(WharfS3Fixtures):
    """The same on file:// (wharf's local store: keys are files, directories implied)."""

    @pytest.fixture
    def fs(self):
        return WharfFileSystem(skip_instance_cache=True)

    @pytest.fixture
    def fs_path(self, tmp_path):
        return f"file://{tmp_path}/remote"


class TestWharfS3Copy(abstract.AbstractCopyTests, WharfS3Fixtures):
    pass


class TestWharfS3Get(abstract.AbstractGetTests, WharfS3Fixtures):
    pass


class TestWharfS3Put(abstract.AbstractPutTests, WharfS3Fixtures):
    pass


class TestWharfS3Open(abstract.AbstractOpenTests, WharfS3Fixtures):
    pass


class TestWharfS3Pipe(abstract.AbstractPipeTests, WharfS3Fixtures):
    pass


class TestWharfFileCopy(abstract.AbstractCopyTests, WharfFileFixtures):
    pass


class TestWharfFileGet(abstract.AbstractGetTests, WharfFileFixtures):
    pass


class TestWharfFilePut(abstract.AbstractPutTests, WharfFileFixtures):
    pass


class TestWharfFileOpen(abstract.AbstractOpenTests, WharfFileFixtures):
    pass


class TestWharfFilePipe(abstract.AbstractPipeTests, WharfFileFixtures):
    pass
