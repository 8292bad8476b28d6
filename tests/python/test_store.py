"""wharf.Store from Python: the C++ store through pybind11, on file:// and on the real S3."""
import multiprocessing as mp
import os

import numpy as np
import pytest

import wharf


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path, monkeypatch):
    if request.param == "file":
        yield wharf.Store(f"file://{tmp_path}/data/")
    elif request.param == "gs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", request.getfixturevalue("gcs_emulator"))
        yield wharf.Store(f"gs://{request.getfixturevalue('gcs_bucket')}/data/")
    else:
        s3_env = request.getfixturevalue("s3_env")
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(k, s3_env[k])  # for this test only
        bucket = request.getfixturevalue("bucket")
        yield wharf.Store(f"s3://{bucket}/data/")


def test_put_get_list_delete(store):
    store.put("b/two.bin", b"22")
    store.put("a/one.bin", bytearray(b"1"))
    store.put("c.bin", np.arange(10, dtype=np.uint8))
    assert [o["key"] for o in store.list()] == ["a/one.bin", "b/two.bin", "c.bin"]
    assert [o.get("prefix", o.get("key")) for o in store.list(recursive=False)] == \
        ["c.bin", "a/", "b/"]
    assert bytes(store.get("b/two.bin")) == b"22"
    assert bytes(store.get("c.bin", start=2, end=5)) == bytes([2, 3, 4])
    assert store.head("c.bin")["size"] == 10
    assert store.url("c.bin").endswith("/data/c.bin")
    store.delete("a/one.bin")
    store.delete("a/one.bin")  # idempotent
    assert [o["key"] for o in store.list()] == ["b/two.bin", "c.bin"]


@pytest.mark.parametrize("store", ["file", "s3", "gs"], indirect=True)
def test_ranges_read_like_slices(store):
    data = b"0123456789"
    store.put("r", data)
    for start, end in [(None, None), (0, 0), (5, 5), (7, 3), (3, None), (None, 4), (8, 20),
                       (10, None), (12, None), (12, 20), (0, 10), (9, 10)]:
        assert bytes(store.get("r", start, end)) == data[start:end], (start, end)
    store.put("empty", b"")
    assert bytes(store.get("empty")) == b""
    assert bytes(store.get("empty", 0, 0)) == b""
    assert bytes(store.get("empty", 3)) == b""
    assert bytes(store.get("empty", 0, 1)) == b"" and bytes(store.get("empty", None, 5)) == b""
    # An empty range of a missing object still says that it is missing.
    for start, end in [(0, 0), (5, None), (None, None), (-3, None)]:
        with pytest.raises(FileNotFoundError, match="missing"):
            store.get("missing", start, end)
    # A negative start is the last N bytes, as data[-N:]; what a slice would read from the end
    # otherwise (a negative end, or both) is refused naming the key.
    for n in (1, 3, 10, 30):
        assert bytes(store.get("r", -n)) == data[-n:], n
    assert bytes(store.get("empty", -3)) == b""
    with pytest.raises(ValueError, match="get r: a negative start=-3 .* takes no end"):
        store.get("r", -3, 5)
    with pytest.raises(ValueError, match="get r: end=-1 is negative"):
        store.get("r", 0, -1)
    with pytest.raises(ValueError, match="parallel must be >= 0"):
        store.list(parallel=-1)


@pytest.mark.parametrize("store", ["file", "s3", "gs"], indirect=True)
def test_list_limit_is_at_most_that_many_entries(store):
    for key in ("a", "b/1", "b/2", "c", "d/1", "e"):
        store.put(key, b"x")
    for limit in (1, 2, 3, 5):
        flat = store.list(limit=limit)
        assert [o["key"] for o in flat] == ["a", "b/1", "b/2", "c", "d/1", "e"][:limit]
        rolled = store.list(recursive=False, limit=limit)
        names = sorted(o.get("key", o.get("prefix")) for o in rolled)
        assert names == ["a", "b/", "c", "d/", "e"][:limit], (limit, rolled)
    with pytest.raises(ValueError, match="limit"):
        store.list(limit=-1)


def test_buffers_are_zero_copy_views(store):
    payload = bytes(range(256)) * 100
    store.put("x", payload)
    buf = store.get("x")
    view = memoryview(buf)
    assert view.readonly and len(view) == len(payload)
    arr = np.frombuffer(buf, dtype=np.uint8)
    assert arr.ctypes.data == np.frombuffer(view, dtype=np.uint8).ctypes.data  # same memory
    assert arr.tobytes() == payload


def test_get_many_through_the_engine(store):
    keys = [f"k/{i:03d}" for i in range(50)]
    for i, k in enumerate(keys):
        store.put(k, bytes([i]) * (i + 1))
    bufs = store.get_many(list(reversed(keys)))
    assert [bytes(b) for b in bufs] == [bytes([i]) * (i + 1) for i in reversed(range(50))]


def _requests(op):
    return sum(v for k, v in wharf.metrics()["counters"].items()
               if k.startswith("wharf_store_requests_total{") and f'op="{op}"' in k)


def test_get_many_asks_no_sizes_and_pins_listed_versions(store):
    keys = [f"m/{i:03d}" for i in range(30)]
    for i, k in enumerate(keys):
        store.put(k, bytes([i]) * (1000 + i))
    heads, gets = _requests("head"), _requests("get")
    # keys alone: one GET each, whose answer tells the size (the objects end inside it)
    by_key = store.get_many(keys)
    assert _requests("head") == heads
    assert _requests("get") - gets == len(keys)
    listed = store.list("m/")
    heads, gets = _requests("head"), _requests("get")
    bufs = store.get_many(listed)  # entries of list(): their size and ETag
    assert _requests("head") == heads
    assert _requests("get") - gets == len(keys)
    assert [bytes(b) for b in bufs] == [bytes(b) for b in by_key]
    assert [bytes(b) for b in bufs] == [bytes([i]) * (1000 + i) for i in range(30)]
    # keys and entries mixed; an entry without size or ETag is a key
    mixed = store.get_many([keys[0], {"key": keys[1]}, listed[2]])
    assert [bytes(b) for b in mixed] == [bytes(b) for b in by_key[:3]]
    # an object rewritten since it was listed fails, naming it, instead of other bytes
    store.put(keys[5], b"rewritten")
    with pytest.raises(wharf.WharfError) as e:
        store.get_many(listed)
    assert keys[5] in str(e.value)
    with pytest.raises(TypeError, match="get_many"):
        store.get_many([3])
    with pytest.raises(TypeError, match="key"):
        store.get_many([{"size": 3}])


def test_errors_are_python_exceptions(store):
    with pytest.raises(wharf.NotFoundError) as e:
        store.get("missing")
    assert isinstance(e.value, FileNotFoundError) and "missing" in str(e.value)
    with pytest.raises(ValueError):
        wharf.Store("s3://X/")  # invalid bucket name


def test_put_takes_contiguous_bytes_only(store):
    # A strided view once uploaded the memory under it (a[::2] as a[:5]; a reversed array
    # the bytes before it): now refused, as a file's write refuses it, and nothing stored.
    a = np.arange(10, dtype=np.uint8)
    for bad in (a[::2], a[::-1], np.arange(6, dtype=np.uint8).reshape(2, 3).T,
                memoryview(bytes(range(9)))[::3]):
        with pytest.raises((BufferError, ValueError)):  # numpy says ValueError
            store.put("strided", bad)
    assert store.list() == []
    store.put("ok", np.ascontiguousarray(a[::2]))
    assert bytes(store.get("ok")) == bytes([0, 2, 4, 6, 8])
    with pytest.raises(BufferError):
        wharf._wharf.split_csv(memoryview(b"a,,b,,c")[::2])


def test_names_that_are_not_utf8_are_left_out_of_listings(tmp_path, capfd):
    # Keys are UTF-8. A local file whose name is not was listed (with a surrogate) but no
    # call took that key back (TypeError; the non-recursive listing UnicodeDecodeError, which
    # broke fsspec's ls of the whole folder): it is left out with a warning now, as a FIFO is.
    root = os.fsencode(str(tmp_path / "nu"))
    os.makedirs(root + b"/d\xe9")
    os.makedirs(root + b"/ok")
    for name, data in ((b"/d\xe9/f", b"1"), (b"/f\xe9", b"22"), (b"/ok/g", b"3")):
        with open(root + name, "wb") as f:
            f.write(data)
    store = wharf.Store(f"file://{tmp_path}/nu/")
    assert [o["key"] for o in store.list()] == ["ok/g"]
    assert [o.get("prefix", o.get("key")) for o in store.list(recursive=False)] == ["ok/"]
    assert "is not UTF-8" in capfd.readouterr().err
    with pytest.raises(ValueError, match=r"f\\xe9'?: not valid UTF-8"):
        store.get("f\udce9")  # the escaped form: a clear error, not a TypeError
    with pytest.raises(TypeError):
        store.get("\ud800")  # a surrogate no byte escapes to: not a key


def _child_reads(uri, key, queue):
    try:
        queue.put(bytes(wharf.Store(uri).get(key)))
    except Exception as e:  # noqa: BLE001 - report anything to the parent
        queue.put(repr(e))


def _child_uses_inherited(store, key, queue):
    try:
        queue.put(bytes(store.get(key)))
    except Exception as e:  # noqa: BLE001
        queue.put(repr(e))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_usable_in_child_processes(store, method):
    store.put("shared", b"across processes")
    store.get("shared")  # the parent's engine threads exist before the fork
    ctx = mp.get_context(method)
    q = ctx.Queue()
    procs = [ctx.Process(target=_child_uses_inherited, args=(store, "shared", q)),
             ctx.Process(target=_child_reads, args=(store.uri, "shared", q))]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert results == [b"across processes"] * 2
