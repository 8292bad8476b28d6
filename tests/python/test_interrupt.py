"""Ctrl-C during a blocking wharf call (base/cancel.h, python/binding.h): the call's work is
cancelled and the exception the signal handler raised comes out of the call soon, instead of
after the request's own timeouts and retries (30 s without a byte, then retries for up to
120 s). The server is real (Ceph RGW) behind tests/tools/fault_proxy.py, whose "delay" rule
holds the chosen requests for minutes: a server that stopped answering.

The in-process tests interrupt with SIGUSR1 and a handler that raises `Interrupted`, so the
mechanism is exercised without raising KeyboardInterrupt inside pytest; one test sends a real
SIGINT to a child process."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import wharf
from fault_proxy import FaultProxy

HANG_MS = 600_000  # far longer than any test: a request that gets this never completes
# How soon an interrupted call must be back. The mechanism polls every 50 ms; the rest is slack
# for a loaded machine. Without it the calls below would take 30 s or more.
PROMPT_S = 10.0


class Interrupted(Exception):
    pass


@contextlib.contextmanager
def signal_after(seconds, raises=True, exc=Interrupted):
    """SIGUSR1 to this process after `seconds`; its handler raises `exc` (KeyboardInterrupt:
    as Ctrl-C does), or with raises=False only counts. Yields the list of times it ran."""
    ran = []

    def handler(signum, frame):
        ran.append(time.monotonic())
        if raises:
            raise exc()

    old = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        yield ran
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, old)


@pytest.fixture
def proxy(s3_env, monkeypatch):
    upstream = s3_env["WHARF_S3_ENDPOINT"].split("://", 1)[1]
    with FaultProxy(upstream) as p:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(k, s3_env[k])
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
        yield p


def hang(proxy, **match):
    proxy.set_faults([{"match": match, "action": "delay", "phase": "request",
                       "delay_ms": HANG_MS, "count": None}])


def interrupted_within(fn, after=0.5):
    start = time.monotonic()
    with signal_after(after):
        with pytest.raises(Interrupted):
            fn()
    elapsed = time.monotonic() - start
    assert elapsed < PROMPT_S, f"the interrupted call took {elapsed:.1f} s"
    return elapsed


def all_uploads(s3_client, bucket):
    return s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def test_get_head_list_put_are_interrupted_at_a_server_that_stopped_answering(proxy, bucket):
    store = wharf.Store(f"s3://{bucket}/")
    store.put("k", b"x" * 1000)
    hang(proxy, method="GET")
    interrupted_within(lambda: store.get("k"))
    interrupted_within(lambda: store.list(""))
    hang(proxy, method="HEAD")
    interrupted_within(lambda: store.head("k"))
    hang(proxy, method="PUT")
    interrupted_within(lambda: store.put("k2", b"y" * 100))
    # The store is usable again once the server answers: nothing of the interrupted calls is
    # left in the way (the calls had their own tokens).
    proxy.clear_faults()
    assert bytes(store.get("k")) == b"x" * 1000
    with pytest.raises(wharf.NotFoundError):
        store.head("k2")


def test_retries_and_their_backoff_are_interrupted(proxy, bucket):
    store = wharf.Store(f"s3://{bucket}/")
    store.put("k", b"x")
    # Every GET answered 503 with Retry-After 20: without the interrupt the call would wait out
    # up to 30 s per retry.
    proxy.set_faults([{"match": {"method": "GET"}, "action": "status", "status": 503,
                       "headers": {"Retry-After": "20"}, "count": None}])
    interrupted_within(lambda: store.get("k"), after=1.0)


def test_an_interrupted_multipart_write_leaves_no_upload(proxy, bucket, s3_client):
    hang(proxy, method="PUT", query_regex="partNumber=")
    before = {u["UploadId"] for u in all_uploads(s3_client, bucket)}
    chunk = os.urandom(1 << 20)

    def write():
        with wharf.open(f"s3://{bucket}/big", "wb") as f:
            for _ in range(64):
                f.write(chunk)

    interrupted_within(write, after=1.0)
    proxy.clear_faults()
    left = [u for u in all_uploads(s3_client, bucket) if u["UploadId"] not in before]
    assert left == [], f"multipart uploads left behind: {left}"
    with pytest.raises(wharf.NotFoundError):
        wharf.Store(f"s3://{bucket}/").head("big")


def test_a_file_being_written_fails_at_once_after_an_interrupt(proxy, bucket, s3_client):
    # The interrupted call (here the close, waiting for its parts) cancelled the upload: later
    # writes and closes fail at once, naming it, instead of taking bytes into a buffer that
    # can never be committed.
    hang(proxy, method="PUT", query_regex="partNumber=")
    before = {u["UploadId"] for u in all_uploads(s3_client, bucket)}
    f = wharf.open(f"s3://{bucket}/spent", "wb")
    chunk = os.urandom(1 << 20)
    for _ in range(24):
        f.write(chunk)
    interrupted_within(f.close, after=1.0)
    proxy.clear_faults()
    with pytest.raises(wharf.WharfError, match=r"write s3://.*/spent: cancelled"):
        f.write(b"x")
    with pytest.raises(wharf.WharfError, match=r"close s3://.*/spent: cancelled"):
        f.close()
    f.abort()
    assert f.closed
    left = [u for u in all_uploads(s3_client, bucket) if u["UploadId"] not in before]
    assert left == [], f"multipart uploads left behind: {left}"
    with pytest.raises(wharf.NotFoundError):
        wharf.Store(f"s3://{bucket}/").head("spent")


def test_a_file_read_and_its_read_ahead_are_interrupted(proxy, bucket):
    store = wharf.Store(f"s3://{bucket}/")
    data = os.urandom(1 << 20) * 64  # more than the read-ahead holds
    store.put("f", data)
    with wharf.open(f"s3://{bucket}/f", "rb") as f:
        assert f.read(1000) == data[:1000]  # the reader works; its read-ahead is in flight
        hang(proxy, method="GET")
        interrupted_within(lambda: f.read())
        # Its work was cancelled with it: a later read fails with a clear error, never with
        # wrong or missing bytes.
        proxy.clear_faults()
        with pytest.raises(wharf.WharfError, match="cancelled"):
            f.read()


def test_get_many_is_interrupted(proxy, bucket):
    store = wharf.Store(f"s3://{bucket}/")
    for i in range(20):
        store.put(f"m/{i}", b"m" * 3000)
    hang(proxy, method="GET")
    interrupted_within(lambda: store.get_many([f"m/{i}" for i in range(20)]))


def test_a_tier_read_waiting_for_another_threads_fill_is_interrupted(proxy, bucket, tmp_path):
    # A thread fills the object into the tier through a GET the server holds for 15 s; the main
    # thread's read of the same object waits for that fill (one filler per object) and is
    # interrupted there, not when the fill ends. The fill then completes and is kept.
    store = wharf.Store(f"s3://{bucket}/")
    store.put("t/k", b"t" * 5000)
    proxy.set_faults([{"match": {"method": "GET"}, "action": "delay", "phase": "request",
                       "delay_ms": 15_000, "count": 1}])
    cached = wharf.Store(f"s3://{bucket}/", cache=str(tmp_path / "tier"))
    filled = []
    filler = threading.Thread(target=lambda: filled.append(bytes(cached.get("t/k"))))
    filler.start()
    deadline = time.monotonic() + 10
    while not any(e["method"] == "GET" for e in proxy.log()) and time.monotonic() < deadline:
        time.sleep(0.02)
    elapsed = interrupted_within(lambda: cached.get("t/k"))
    assert elapsed < 6, f"the read waited {elapsed:.1f} s for the other thread's fill"
    filler.join()
    assert filled == [b"t" * 5000]
    assert bytes(cached.get("t/k")) == b"t" * 5000
    assert sum(e["method"] == "GET" for e in proxy.log()) == 1  # the second read hit the tier


def test_a_dataset_stream_is_interrupted(proxy, bucket):
    store = wharf.Store(f"s3://{bucket}/")
    for i in range(40):
        store.put(f"ds/{i:03d}", bytes([i]) * 5000)
    index = wharf.SampleIndex.from_prefix(f"s3://{bucket}/ds/")
    hang(proxy, method="GET")
    stream = wharf.SampleStream(index, seed=0, epoch=0)
    interrupted_within(lambda: list(stream))


def test_a_handler_that_does_not_raise_lets_the_call_finish(proxy, bucket):
    store = wharf.Store(f"s3://{bucket}/")
    store.put("k", b"z" * 5000)
    proxy.set_faults([{"match": {"method": "GET"}, "action": "delay", "delay_ms": 1500}])
    with signal_after(0.3, raises=False) as ran:
        assert bytes(store.get("k")) == b"z" * 5000
        returned = time.monotonic()
    assert len(ran) == 1
    # The handler ran during the call (the wait polled), not after it returned.
    assert ran[0] < returned - 0.5


def test_ctrl_c_raises_keyboard_interrupt_in_a_script(proxy, bucket):
    wharf.Store(f"s3://{bucket}/").put("k", b"x")
    hang(proxy, method="GET")
    script = textwrap.dedent(f"""
        import sys, time, wharf
        store = wharf.Store("s3://{bucket}/")
        print("ready", flush=True)
        start = time.monotonic()
        try:
            store.get("k")
        except KeyboardInterrupt:
            print(f"KeyboardInterrupt after {{time.monotonic() - start:.2f}} s", flush=True)
            sys.exit(3)
        print("returned", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ))
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=PROMPT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 3, out
    assert out.startswith("KeyboardInterrupt after"), out


def test_a_model_load_is_interrupted(proxy, bucket, tmp_path):
    import torch
    from safetensors.torch import save_file

    from wharf.serve import load_safetensors
    tensors = {f"w{i}": torch.full((256, 1024), float(i)) for i in range(8)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    wharf.Store(f"s3://{bucket}/").put("m.safetensors", (tmp_path / "m.safetensors").read_bytes())
    # The header is read (a range from byte 0); the tensors' ranges hang.
    hang(proxy, method="GET", headers={"range": "^bytes=[1-9]"})
    interrupted_within(lambda: load_safetensors(f"s3://{bucket}/m.safetensors"))
    proxy.clear_faults()
    got = load_safetensors(f"s3://{bucket}/m.safetensors")
    assert all(torch.equal(got[k], v) for k, v in tensors.items())


def test_gs_calls_are_interrupted(gcs_emulator, gcs_bucket, monkeypatch):
    with FaultProxy(gcs_emulator.split("://", 1)[1]) as p:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", p.url)
        store = wharf.Store(f"gs://{gcs_bucket}/")
        store.put("k", b"g" * 2000)
        hang(p, method="GET")
        interrupted_within(lambda: store.get("k"))
        interrupted_within(lambda: store.list(""))
        p.clear_faults()
        assert bytes(store.get("k")) == b"g" * 2000


def test_checkpoint_file_writes_are_interrupted_and_leave_no_file(proxy, bucket):
    root = wharf._wharf.CheckpointRoot(f"s3://{bucket}/ck/")
    store = wharf.Store(f"s3://{bucket}/ck/")
    hang(proxy, method="PUT", path_regex="/ck/slow$")
    data = b"c" * 4000
    # The held file on the calling thread, then on one of the call's worker threads.
    for files in (["slow", "fast1", "fast2"], ["fast1", "slow"]):
        interrupted_within(
            lambda: root.write_files([(k, [data]) for k in files], max_files_in_flight=2),
            after=1.0)
        # What completed was removed: nothing of an interrupted call stays.
        assert [m["key"] for m in store.list("")] == []


def test_a_checkpoint_copy_is_interrupted(proxy, bucket):
    from wharf.torch import CheckpointManager
    import torch
    CheckpointManager(f"s3://{bucket}/src/").save(1, {"w": torch.zeros(1000)}).result()
    src = wharf._wharf.CheckpointRoot(f"s3://{bucket}/src/")
    dst = wharf._wharf.CheckpointRoot(f"s3://{bucket}/dst/")
    hang(proxy, method="GET", path_regex="/src/step-")
    interrupted_within(lambda: wharf._wharf.copy_checkpoint(src, dst, 1, 0, False), after=1.0)


@pytest.mark.parametrize("loop", ["store.list()",
                                  "store.get('obj')",
                                  "f = wharf.open(root + 'w.bin', 'wb'); "
                                  "[f.write(block) for _ in range(32)]; f.close()"])
def test_a_script_exits_cleanly_while_a_daemon_thread_is_in_a_wharf_call(bucket, loop):
    # At interpreter exit CPython ends a daemon thread that takes the GIL back by unwinding
    # it (pthread_exit); through the GIL release's noexcept destructor that was std::terminate
    # ("terminate called without an active exception", rc 134) in 3 runs of 3.
    root = f"s3://{bucket}/daemon/"
    wharf.Store(root).put("obj", os.urandom(1 << 20))
    script = textwrap.dedent(f"""
        import os, threading, time, wharf
        root = {root!r}
        store = wharf.Store(root)
        block = os.urandom(1 << 20)
        def run():
            {loop}
        threading.Thread(target=lambda: [run() for _ in iter(int, 1)], daemon=True).start()
        time.sleep(0.3)
    """)
    for _ in range(4):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=dict(os.environ), timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "terminate" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_ctrl_c_in_a_checkpoint_load_comes_out_as_keyboard_interrupt(proxy, bucket):
    # A torch Future takes Exceptions only: handing it KeyboardInterrupt failed an assertion
    # ("is of type KeyboardInterrupt, not an Exception") instead of interrupting.
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from wharf.torch.checkpoint import StorageReader, StorageWriter
    sd = {"w": torch.arange(1 << 18, dtype=torch.float32)}
    dcp.save(sd, storage_writer=StorageWriter(f"s3://{bucket}/ck"))
    proxy.set_faults([{"match": {"method": "GET", "path_regex": r"\.distcp$"}, "action": "delay",
                       "phase": "request", "delay_ms": HANG_MS, "count": None}])
    start = time.monotonic()
    with signal_after(0.5, exc=KeyboardInterrupt):
        with pytest.raises((KeyboardInterrupt, CheckpointException)) as info:
            dcp.load({"w": torch.zeros(1 << 18)}, storage_reader=StorageReader(f"s3://{bucket}/ck"))
    assert time.monotonic() - start < PROMPT_S
    causes = [info.value]
    if isinstance(info.value, CheckpointException):  # torch wraps what a rank raised
        causes = [f[0] if isinstance(f, tuple) else f for f in info.value.failures.values()]
    assert all(isinstance(c, KeyboardInterrupt) for c in causes), causes


def test_ctrl_c_in_a_checkpoint_save_aborts_its_writes_promptly(proxy, bucket, s3_client):
    # The files are written on a pool thread, which Ctrl-C does not reach: it waited for the
    # writes (here: a server that never answers) before the interrupt came out.
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from wharf.torch.checkpoint import StorageWriter
    before = {u["UploadId"] for u in all_uploads(s3_client, bucket)}
    hang(proxy, method="PUT")
    start = time.monotonic()
    with signal_after(1.0, exc=KeyboardInterrupt):
        with pytest.raises((KeyboardInterrupt, CheckpointException)):
            dcp.save({"w": torch.ones(1 << 22)}, storage_writer=StorageWriter(f"s3://{bucket}/sv"))
    elapsed = time.monotonic() - start
    assert elapsed < PROMPT_S, f"the interrupted save took {elapsed:.1f} s"
    proxy.clear_faults()
    left = [u for u in all_uploads(s3_client, bucket) if u["UploadId"] not in before]
    assert left == [], f"multipart uploads left behind: {left}"
