"""wharf.open: binary file objects over file:// and the real S3 server (RGW)."""
import gc
import hashlib
import io
import random
import warnings

import pytest

import wharf

PART = 8 << 20  # the S3 writer's part size, and wharf.open's staging block


def _bytes(n, seed=0):
    return random.Random(seed).randbytes(n)


def _uploads(s3_client, bucket):
    return s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


@pytest.mark.parametrize("size", [0, 1, 1000, PART - 1, PART, 3 * PART + 1])
def test_round_trip_of_many_sizes(root, size):
    data = _bytes(size, size)
    uri = root + f"obj-{size}"
    with wharf.open(uri, "wb") as f:
        assert f.writable() and not f.readable() and not f.seekable()
        # in uneven pieces, as bytes, bytearray and memoryview
        pos, step, kinds = 0, 0, [bytes, bytearray, memoryview]
        while pos < size:
            n = min(size - pos, [1, 777, 3 << 20][step % 3])
            piece = data[pos:pos + n]
            assert f.write(kinds[step % 3](piece)) == n
            pos += n
            step += 1
            assert f.tell() == pos
    assert f.closed
    with wharf.open(uri) as f:
        assert isinstance(f, io.BufferedIOBase)
        assert f.readable() and f.seekable() and not f.writable()
        assert f.name == uri
        assert f.size == size
        assert f.read() == data
        assert f.read() == b""
        assert f.tell() == size
    assert wharf.Store(root).get(f"obj-{size}").__bytes__() == data


def test_random_seeks_and_reads_match_the_bytes(root):
    data = _bytes(300_000, 1)
    wharf.Store(root).put("obj", data)
    rng = random.Random(5)
    # small chunks so that seeks cross chunks, read-ahead restarts and reuses
    with wharf.open(root + "obj", chunk_size=4096, read_ahead=3) as f:
        pos = 0
        for _ in range(400):
            op = rng.randrange(6)
            if op == 0:
                pos = f.seek(rng.randrange(len(data) + 10))
            elif op == 1:
                pos = f.seek(rng.randrange(-pos, 5000), io.SEEK_CUR)
            elif op == 2:
                pos = f.seek(-rng.randrange(len(data)), io.SEEK_END)
            elif op == 3:
                n = rng.randrange(20_000)
                assert f.read(n) == data[pos:pos + n]
                pos = min(pos + n, max(pos, len(data)))
            elif op == 4:
                buf = bytearray(rng.randrange(9000))
                n = f.readinto(buf)
                assert n == len(data[pos:pos + len(buf)])
                assert bytes(buf[:n]) == data[pos:pos + n]
                pos += n
            else:
                chunk = f.read1(rng.randrange(1, 9000))
                assert chunk == data[pos:pos + len(chunk)]
                assert chunk or pos >= len(data)
                pos += len(chunk)
            assert f.tell() == pos


def test_readinto_memoryview_and_numpy(root):
    np = pytest.importorskip("numpy")
    data = _bytes(100_000, 2)
    wharf.Store(root).put("obj", data)
    with wharf.open(root + "obj") as f:
        buf = bytearray(1000)
        assert f.readinto(memoryview(buf)[100:600]) == 500
        assert bytes(buf[100:600]) == data[:500]
        arr = np.zeros(1000, dtype=np.float32)  # 4000 bytes, itemsize 4
        assert f.readinto(arr) == 4000
        assert arr.tobytes() == data[500:4500]
        assert f.readinto1(bytearray(10)) == 10
        with pytest.raises((TypeError, BufferError)):
            f.readinto(b"read-only bytes")


def test_small_sequential_reads_do_not_issue_a_request_each(s3_env, bucket):
    data = _bytes(200_000, 3)
    wharf.Store(f"s3://{bucket}/").put("obj", data)
    out = bytearray()
    with wharf.open(f"s3://{bucket}/obj", chunk_size=64 << 10) as f:
        while b := f.read(7):
            out += b
        stats = f.stats()
    assert out == data
    # 28,572 reads, 4 chunks of 64 KiB: one GET each
    assert stats["requests"] == 4, stats
    assert stats["bytes_fetched"] == len(data)


def test_a_large_readinto_fetches_into_the_callers_buffer(root):
    data = _bytes(1 << 20, 7)
    wharf.Store(root).put("obj", data)
    with wharf.open(root + "obj", chunk_size=64 << 10, read_ahead=2,
                    access="sequential") as f:
        buf = bytearray(len(data) - 100)
        f.seek(100)
        assert f.readinto(buf) == len(buf)
        assert buf == data[100:]
        stats = f.stats()
    # past the read-ahead requested at open (3 chunks, copied from), the bytes came by GETs
    # straight into buf, never through the reader's buffers
    assert stats["bytes_direct"] == len(data) - 3 * (64 << 10), stats
    assert stats["peak_buffered_bytes"] <= 3 * (64 << 10), stats
    # access="auto" requests only its first 64 KiB at open (the GET that tells the size);
    # the seek stays inside them, and the rest of the read comes straight into buf
    with wharf.open(root + "obj", chunk_size=64 << 10, read_ahead=2) as f:
        f.seek(100)
        assert f.readinto(buf) == len(buf)
        assert buf == data[100:]
        stats = f.stats()
    assert stats["bytes_fetched"] == len(data), stats
    assert stats["bytes_direct"] == len(data) - (64 << 10), stats
    assert stats["peak_buffered_bytes"] == 64 << 10, stats
    # a jump away from them right after open: the read after it is fetched exactly
    with wharf.open(root + "obj", chunk_size=64 << 10, read_ahead=2) as f:
        f.seek(200 << 10)
        small = bytearray(len(data) - (200 << 10))
        assert f.readinto(small) == len(small)
        assert small == data[200 << 10:]
        stats = f.stats()
    assert stats["bytes_direct"] == len(small), stats
    assert stats["bytes_fetched"] == (64 << 10) + len(small), stats


def test_random_access_fetches_what_is_read_and_sequential_reading_ramps_up(root):
    data = _bytes(4 << 20, 11)
    wharf.Store(root).put("obj", data)
    rng = random.Random(3)
    with wharf.open(root + "obj", chunk_size=1 << 20, read_ahead=3) as f:
        wanted = 0
        for _ in range(40):  # record reads at random offsets, as a Parquet reader makes
            at, n = rng.randrange(len(data) - 300_000), rng.randrange(64 << 10, 300_000)
            f.seek(at)
            assert f.read(n) == data[at:at + n]
            wanted += n
        stats = f.stats()
    assert stats["jumps"] >= 39, stats
    # each read fetched exactly, no read-ahead: only the first 64 KiB, fetched at open (the
    # GET that told the size), come on top, less what reads found in them
    assert wanted - (64 << 10) <= stats["bytes_fetched"] <= wanted + (64 << 10), stats
    with wharf.open(root + "obj", chunk_size=1 << 20, read_ahead=3) as f:
        out = bytearray()
        while b := f.read(8192):  # small reads, as a CSV parser makes
            out += b
        stats = f.stats()
    assert out == data
    assert stats["bytes_fetched"] == len(data) and stats["jumps"] == 0, stats
    # 64 KiB, 128, 256, 512 KiB, then 1 MiB chunks
    assert stats["requests"] <= 4 + 4, stats
    with pytest.raises(ValueError, match="access"):
        wharf.open(root + "obj", access="random")


def test_text_and_buffered_wrappers(root):
    lines = [f"line {i} {'x' * (i % 50)}\n" for i in range(5000)]
    wharf.Store(root).put("text", "".join(lines).encode())
    with io.TextIOWrapper(wharf.open(root + "text"), encoding="utf-8") as t:
        assert list(t) == lines
    with io.BufferedReader(wharf.open(root + "text")) as b:
        assert b.readline() == lines[0].encode()
        rest = "".join(lines[1:]).encode()
        assert b.read(20) == rest[:20]
    with wharf.open(root + "text") as f:  # io's own readline over peek()
        assert f.readline() == lines[0].encode()
        assert f.readlines()[-1] == lines[-1].encode()
    with io.TextIOWrapper(wharf.open(root + "out", "wb"), encoding="utf-8") as t:
        t.write("".join(lines))
    assert bytes(wharf.Store(root).get("out")) == "".join(lines).encode()


def test_errors_are_clear(root):
    with pytest.raises(ValueError, match="invalid mode"):
        wharf.open(root + "x", "r")
    with pytest.raises(ValueError, match="invalid mode"):
        wharf.open(root + "x", "ab")
    # Reading's options on a write are refused, not ignored; nothing is written.
    with pytest.raises(ValueError, match=r"chunk_size, access are for reading \('rb'\)"):
        wharf.open(root + "w", "wb", chunk_size=1 << 20, access="sequential")
    with pytest.raises(ValueError, match=r"read_ahead is for reading"):
        wharf.open(root + "w", "xb", read_ahead=4)
    with pytest.raises(FileNotFoundError):
        wharf.Store(root).head("w")
    with pytest.raises(FileNotFoundError):
        wharf.open(root + "missing")
    with pytest.raises(wharf.NotFoundError):
        wharf.open(root + "missing")
    wharf.Store(root).put("obj", b"abc")
    f = wharf.open(root + "obj")
    with pytest.raises(io.UnsupportedOperation):
        f.write(b"x")
    with pytest.raises(ValueError, match="negative seek"):
        f.seek(-1)
    f.close()
    f.close()  # idempotent
    assert f.closed
    for call in (f.read, f.tell, f.readable, lambda: f.readinto(bytearray(1)),
                 lambda: f.seek(0)):
        with pytest.raises(ValueError, match="I/O operation on closed file"):
            call()
    w = wharf.open(root + "new", "wb")
    with pytest.raises(io.UnsupportedOperation):
        w.seek(0)
    with pytest.raises(io.UnsupportedOperation):
        w.read()
    w.write(b"abc")
    w.close()
    with pytest.raises(ValueError, match="I/O operation on closed file"):
        w.write(b"x")


def test_an_exception_in_with_leaves_no_object_and_no_upload(s3_env, bucket, s3_client):
    uri = f"s3://{bucket}/ckpt.bin"
    with pytest.raises(RuntimeError, match="boom"):
        with wharf.open(uri, "wb") as f:
            f.write(_bytes(2 * PART + 5))  # parts are on their way: an upload exists
            assert len(_uploads(s3_client, bucket)) == 1
            raise RuntimeError("boom")
    assert f.closed
    assert "Contents" not in s3_client.list_objects_v2(Bucket=bucket)
    assert _uploads(s3_client, bucket) == []


def test_an_exception_in_with_over_an_existing_object_keeps_it(root):
    wharf.Store(root).put("obj", b"old")
    with pytest.raises(KeyError):
        with wharf.open(root + "obj", "wb") as f:
            f.write(b"new bytes")
            raise KeyError("x")
    assert bytes(wharf.Store(root).get("obj")) == b"old"
    assert [o["key"] for o in wharf.Store(root).list()] == ["obj"]


def test_a_wrapper_closing_while_an_exception_unwinds_writes_nothing(root):
    # io.TextIOWrapper (and gzip, fsspec's OpenFile, pandas) close what they wrap on the way
    # out of their `with` block whatever the reason: that close must not commit half a file.
    store = wharf.Store(root)
    with pytest.raises(RuntimeError, match="boom"):
        with io.TextIOWrapper(wharf.open(root + "text", "wb"), encoding="utf-8") as t:
            t.write("x" * (2 * PART + 3))  # parts already uploaded on S3
            raise RuntimeError("boom")
    assert store.list() == []
    # A close() of one's own commits whatever is unwinding: in a contextmanager's `finally`
    # or in one's own __exit__ (a run log kept for a crashed run).
    import contextlib

    @contextlib.contextmanager
    def writing(uri):
        f = wharf.open(uri, "wb")
        try:
            yield f
        finally:
            f.close()

    class RunLog:
        def __enter__(self):
            self.f = wharf.open(root + "log", "wb")
            return self.f

        def __exit__(self, *exc):
            self.f.close()

    with pytest.raises(KeyError):
        with writing(root + "mine") as f:
            f.write(b"half")
            raise KeyError("x")
    with pytest.raises(KeyError):
        with RunLog() as log:
            log.write(b"crashed at step 7")
            raise KeyError("x")
    # A close() of one's own in an `except` clause commits (the exception was handled), and
    # so does a file written while an exception is being handled (an error report).
    f = wharf.open(root + "explicit", "wb")
    f.write(b"kept")
    try:
        raise ValueError("stop early")
    except ValueError:
        f.close()
    try:
        raise ValueError("failed")
    except ValueError as e:
        with io.TextIOWrapper(wharf.open(root + "report", "wb"), encoding="utf-8") as t:
            t.write(f"error: {e}")
    with io.TextIOWrapper(wharf.open(root + "plain", "wb"), encoding="utf-8") as t:
        t.write("ok")
    assert {o["key"]: bytes(store.get(o["key"])) for o in store.list()} == {
        "mine": b"half", "log": b"crashed at step 7", "explicit": b"kept",
        "report": b"error: failed", "plain": b"ok"}


def test_context_managers_and_dropped_wrappers_never_commit_half_a_file(root):
    import codecs
    import contextlib
    store = wharf.Store(root)
    # contextlib.closing and ExitStack close what they hold while the exception unwinds.
    with pytest.raises(RuntimeError):
        with contextlib.closing(wharf.open(root + "closing", "wb")) as f:
            f.write(b"half")
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        with contextlib.ExitStack() as stack:
            t = stack.enter_context(
                io.TextIOWrapper(wharf.open(root + "stack", "wb"), encoding="utf-8"))
            t.write("x" * (PART + 1))
            raise RuntimeError("boom")

    # A wrapper abandoned by an exception and collected later: its finalizer closes what it
    # wraps, with no exception in sight.
    def abandoned(wrap, key):
        t = wrap(wharf.open(root + key, "wb"))
        t.write("partial" if isinstance(t, io.TextIOBase) else b"partial")
        raise RuntimeError("export failed midway")

    for key, wrap in (("text", lambda f: io.TextIOWrapper(f, encoding="utf-8")),
                      ("buffered", io.BufferedWriter)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError):
                abandoned(wrap, key)
            gc.collect()
        assert any(issubclass(w.category, ResourceWarning) for w in caught), key
    assert store.list() == []

    # A wrapper's normal exit inside an `except` clause commits (nothing interrupted it).
    report = wharf.open(root + "report", "wb")
    try:
        1 / 0
    except ZeroDivisionError as e:
        with codecs.getwriter("utf-8")(report) as w:
            w.write(f"failed: {e!r}")
    # A file opened while one exception was handled, then written in a `with` a new exception
    # interrupts (the first one is gone by then: its id() may be reused).
    for i in range(10):
        try:
            raise ValueError(i)
        except ValueError:
            f = wharf.open(root + f"late-{i}", "wb")
        with pytest.raises(RuntimeError):
            with io.TextIOWrapper(f, encoding="utf-8") as t:
                t.write("half")
                raise RuntimeError("boom")
    assert {o["key"]: bytes(store.get(o["key"])) for o in store.list()} == {
        "report": b"failed: ZeroDivisionError('division by zero')"}


def test_seek_out_of_range_is_an_overflow_error(root):
    wharf.Store(root).put("o", b"0123456789")
    with wharf.open(root + "o") as f:
        with pytest.raises(OverflowError):
            f.seek(2**63 - 1, 2)
        f.seek(2**62, 1)
        with pytest.raises(OverflowError):
            f.seek(2**62, 1)
        with pytest.raises(ValueError, match="negative seek position"):
            f.seek(-11, 2)
        assert f.seek(-4, 2) == 6 and f.read() == b"6789"


def test_exclusive_create_of_a_large_object_keeps_what_is_there(root):
    # "xb" above one part: RGW ignores If-None-Match on a multipart completion, so the writer
    # checks the key before starting the upload and before completing it.
    store = wharf.Store(root)
    store.put("taken", b"ORIGINAL")
    with pytest.raises(wharf.AlreadyExistsError, match="already exists"):
        with wharf.open(root + "taken", "xb") as f:
            f.write(b"N" * (2 * PART + 1))  # S3: refused as the upload would start
    assert bytes(store.get("taken")) == b"ORIGINAL"
    # Taken after the upload started: refused at the completion.
    f = wharf.open(root + "late", "xb")
    f.write(b"N" * (PART + 1))
    store.put("late", b"FIRST")
    f.write(b"N" * PART)
    with pytest.raises(FileExistsError):
        f.close()
    assert bytes(store.get("late")) == b"FIRST"
    with wharf.open(root + "fresh", "xb") as f:
        f.write(b"F" * (2 * PART + 1))
    assert store.head("fresh")["size"] == 2 * PART + 1


def test_a_file_dropped_without_close_aborts(s3_env, bucket, s3_client):
    f = wharf.open(f"s3://{bucket}/dropped", "wb")
    f.write(_bytes(PART + 1))
    assert len(_uploads(s3_client, bucket)) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del f
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    assert "Contents" not in s3_client.list_objects_v2(Bucket=bucket)
    assert _uploads(s3_client, bucket) == []


def test_a_dropped_small_file_on_file_uri_leaves_nothing(tmp_path):
    f = wharf.open(f"file://{tmp_path}/small", "wb")
    f.write(b"abc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del f
        gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_an_overwrite_during_a_read_is_an_error_not_a_mix(s3_env, bucket):
    store = wharf.Store(f"s3://{bucket}/")
    store.put("obj", _bytes(64 << 10, 4))
    with wharf.open(f"s3://{bucket}/obj", chunk_size=4096, read_ahead=0) as f:
        first = f.read(4096)
        assert first == _bytes(64 << 10, 4)[:4096]
        store.put("obj", _bytes(64 << 10, 5))
        with pytest.raises(wharf.WharfError) as err:
            f.seek(32 << 10)  # past anything fetched
            f.read(4096)
        assert f"s3://{bucket}/obj" in str(err.value)
        assert "overwritten after it was opened" in str(err.value)
        with pytest.raises(wharf.WharfError, match="overwritten"):  # sticky
            f.read(1)


def test_cache_option_reads_through_the_tier(s3_env, bucket, tmp_path):
    data = _bytes(50_000, 6)
    wharf.Store(f"s3://{bucket}/").put("obj", data)
    with wharf.open(f"s3://{bucket}/obj", cache=tmp_path / "tier") as f:
        f.seek(10_000)
        assert f.read(100) == data[10_000:10_100]
    with wharf.open(f"s3://{bucket}/new", "wb", cache=str(tmp_path / "tier")) as f:
        f.write(data)
    assert bytes(wharf.Store(f"s3://{bucket}/").get("new")) == data


def test_writes_are_staged_in_the_runtime_budget(s3_env, bucket, tmp_path, s3_client):
    """A "wb" file's bytes in flight are blocks of the process's budget: with a 24 MiB budget
    a 64 MiB upload holds at most the budget, and everything is released at close."""
    from test_runtime import run_python
    env = {k: s3_env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                  "AWS_SECRET_ACCESS_KEY")}
    result = run_python("""
        import hashlib, json, sys
        import numpy as np
        import wharf

        wharf.configure(memory_budget="24M")
        wharf._wharf._reset_peak()
        # 1 MiB, written 64 times as a numpy buffer and changed after each write (write copies)
        piece = np.arange(1 << 18, dtype=np.uint32)
        md5 = hashlib.md5()
        with wharf.open(sys.argv[1], "wb") as f:
            for i in range(64):
                piece += 1
                f.write(piece)
                md5.update(piece.tobytes())
        g = wharf.metrics()["gauges"]
        print(json.dumps({"md5": md5.hexdigest(),
                          "gauges": {k: v for k, v in g.items() if "memory_budget" in k}}))
    """, tmp_path, env_extra=env, args=(f"s3://{bucket}/big.bin",))
    g = result["gauges"]
    assert g["wharf_memory_budget_limit_bytes"] == 24 << 20
    assert 2 * PART <= g["wharf_memory_budget_peak_bytes"] <= 24 << 20
    assert g["wharf_memory_budget_held_bytes"] == 0
    body = s3_client.get_object(Bucket=bucket, Key="big.bin")["Body"].read()
    assert len(body) == 64 << 20
    assert hashlib.md5(body).hexdigest() == result["md5"]
    assert _uploads(s3_client, bucket) == []
