"""wharf.serve.PredictionCache on each backend: in process ("memory"), a directory shared by
processes, and the real Redis that ./run test starts (scripts/redis-server; a private one where
a test kills it). Hits, misses, TTL, model versions, canonical requests, LRU bounds, one compute
for concurrent identical misses (threads, and processes sharing a backend), exceptions, a
backend that fails mid-run, and the runtime's metrics."""
import array
import json
import os
import pathlib
import pydoc
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings

import pytest
import redis

import wharf
from wharf.serve import PredictionCache
from wharf.serve.cache import MAX_SECONDS, PredictionCacheWarning, canonical_request

WORKER = pathlib.Path(__file__).resolve().parent / "cache_worker.py"


@pytest.fixture
def redis_prefix(redis_url):
    """A key prefix of this test's own in the shared Redis; its keys are deleted afterwards."""
    prefix = f"wharf-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=["memory", "dir", "redis"])
def make_cache(request, tmp_path):
    """make_cache(**options) -> a PredictionCache on the parametrized backend (closed after
    the test); make_cache.kind is the backend's name."""
    caches = []

    def make(**options):
        if request.param == "memory":
            c = PredictionCache("memory", **options)
        elif request.param == "dir":
            c = PredictionCache(str(tmp_path / "predictions"), **options)
        else:
            options.setdefault("key_prefix", request.getfixturevalue("redis_prefix"))
            c = PredictionCache(request.getfixturevalue("redis_url"), **options)
        caches.append(c)
        return c

    make.kind = request.param
    yield make
    for c in caches:
        c.close()


class Model:
    """compute(): counts its calls, returns b"<n>:<request>"."""

    def __init__(self, delay=0.0):
        self.calls = 0
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, request):
        with self.lock:
            self.calls += 1
            n = self.calls
        if self.delay:
            time.sleep(self.delay)
        return f"{n}:{json.dumps(request, sort_keys=True)}".encode()


def run_worker(backend, tag, requests, **kw):
    args = [sys.executable, str(WORKER), backend, "--tag", tag, "--requests", json.dumps(requests)]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def counter_values():
    return wharf.metrics()["counters"]


# ---------------------------------------------------------------------------- every backend
def test_miss_then_hit(make_cache):
    cache = make_cache()
    model = Model()
    assert cache.get("v1", {"x": 1}) is None
    assert cache.get_or_compute("v1", {"x": 1}, model) == b'1:{"x": 1}'
    assert cache.get_or_compute("v1", {"x": 1}, model) == b'1:{"x": 1}'
    assert cache.get("v1", {"x": 1}) == b'1:{"x": 1}'
    assert cache.get_or_compute("v1", {"x": 2}, model) == b'2:{"x": 2}'
    assert model.calls == 2
    s = cache.stats()
    assert (s["hits"], s["misses"], s["computes"], s["errors"]) == (2, 3, 2, 0)
    assert s["hit_bytes"] == 2 * len(b'1:{"x": 1}')
    # put/get of bytes requests; bytes-like values
    cache.put("v1", b"raw", bytearray(b"value"))
    assert cache.get("v1", b"raw") == b"value"
    assert cache.get_or_compute("v1", memoryview(b"raw"), model) == b"value"


def test_ttl_expires(make_cache):
    cache = make_cache(ttl=0.3)
    model = Model()
    assert cache.get_or_compute("v1", "q", model) == b'1:"q"'
    assert cache.get_or_compute("v1", "q", model) == b'1:"q"'
    time.sleep(0.45)
    assert cache.get("v1", "q") is None
    assert cache.get_or_compute("v1", "q", model) == b'2:"q"'
    assert model.calls == 2


def test_model_version_is_part_of_the_key(make_cache):
    cache = make_cache()
    model = Model()
    assert cache.get_or_compute("model-v1", [1, 2], model) == b"1:[1, 2]"
    assert cache.get("model-v2", [1, 2]) is None
    assert cache.get_or_compute("model-v2", [1, 2], model) == b"2:[1, 2]"
    assert cache.get_or_compute("model-v1", [1, 2], model) == b"1:[1, 2]"
    # length-prefixed: ("ab", request "c") is not ("a", request "bc")
    cache.put("a", b"bc", b"first")
    assert cache.get("ab", b"c") is None


def test_json_requests_are_canonical(make_cache):
    cache = make_cache()
    model = Model()
    first = cache.get_or_compute("v1", {"b": 1, "a": 2, "c": {"z": 0, "y": "é"}}, model)
    assert cache.get_or_compute("v1", {"a": 2, "c": {"y": "é", "z": 0}, "b": 1}, model) == first
    # the canonical bytes themselves are the same request
    canonical = '{"a":2,"b":1,"c":{"y":"é","z":0}}'.encode()
    assert canonical_request({"c": {"z": 0, "y": "é"}, "b": 1, "a": 2}) == canonical
    assert cache.get("v1", canonical) == first
    assert model.calls == 1
    # a list's order matters
    assert cache.get("v1", {"a": 2, "b": 1, "c": [1, 2]}) is None
    # keys are sorted as the strings JSON makes of them, however deep: {2: .., 10: ..} is
    # {"2": .., "10": ..}; two keys that make one string are refused
    for request in ({2: "a", 10: "b"}, {"2": "a", "10": "b"}, {10: "b", "2": "a"}):
        assert canonical_request(request) == b'{"10":"b","2":"a"}'
    assert canonical_request([{"x": {1: True, None: 0}}]) == b'[{"x":{"1":true,"null":0}}]'
    with pytest.raises(TypeError, match="collide"):
        canonical_request({1: "a", "1": "b"})
    with pytest.raises(TypeError, match="JSON-serializable"):
        cache.get_or_compute("v1", {"x": object()}, model)


def test_compute_exception_propagates_and_is_not_cached(make_cache):
    cache = make_cache()
    calls = []

    def failing(request):
        calls.append(request)
        raise KeyError("model exploded")

    with pytest.raises(KeyError, match="model exploded"):
        cache.get_or_compute("v1", "r", failing)
    assert cache.get("v1", "r") is None
    assert cache.get_or_compute("v1", "r", lambda r: b"ok") == b"ok"
    # not bytes: a TypeError, nothing cached
    with pytest.raises(TypeError, match="bytes-like, got str"):
        cache.get_or_compute("v1", "s", lambda r: "text")
    with pytest.raises(TypeError, match="bytes-like, got dict"):
        cache.get_or_compute("v1", "s", lambda r: {})
    assert cache.get("v1", "s") is None
    assert cache.stats()["errors"] == 0


def test_concurrent_identical_misses_compute_once(make_cache):
    cache = make_cache()
    model = Model(delay=0.3)
    n = 12
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        barrier.wait()
        results[i] = cache.get_or_compute("v1", {"same": True}, model)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert model.calls == 1
    assert results == [b'1:{"same": true}'] * n
    s = cache.stats()
    assert s["computes"] == 1
    assert s["coalesced"] + s["hits"] == n - 1


def test_with_outcome_says_hit_miss_or_coalesced(make_cache):
    cache = make_cache()
    model = Model(delay=0.3)
    assert cache.get_or_compute("v1", "a", model, with_outcome=True) == (b'1:"a"', "miss")
    assert cache.get_or_compute("v1", "a", model, with_outcome=True) == (b'1:"a"', "hit")
    assert cache.get_or_compute("v1", "a", model) == b'1:"a"'  # the plain form is unchanged
    n = 8
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        barrier.wait()
        results[i] = cache.get_or_compute("v1", "b", model, with_outcome=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {value for value, _ in results} == {b'2:"b"'}
    outcomes = sorted(outcome for _, outcome in results)
    # one computes; the others waited for it (or, rarely, looked after it stored the value)
    assert outcomes.count("miss") == 1 and outcomes.count("coalesced") >= 1, outcomes
    assert outcomes.count("coalesced") + outcomes.count("hit") == n - 1
    assert outcomes.count("coalesced") == cache.stats()["coalesced"]


def test_oversized_put_removes_the_old_value(make_cache):
    cache = make_cache(max_bytes=100)
    cache.put("v1", "k", b"old")
    assert cache.get("v1", "k") == b"old"
    cache.put("v1", "k", b"n" * 200)      # not stored, and "old" is no longer the value
    assert cache.get("v1", "k") is None
    cache.put("v1", "k", b"new")
    assert cache.get("v1", "k") == b"new"
    assert cache.get_or_compute("v1", "k", lambda r: b"unused") == b"new"


def test_waiting_threads_get_the_exception(make_cache):
    cache = make_cache()
    calls = []
    started = threading.Event()

    def failing(request):
        calls.append(1)
        started.set()
        time.sleep(0.3)
        raise RuntimeError("bad input")

    errors = []

    def run():
        try:
            cache.get_or_compute("v1", "x", failing)
        except RuntimeError as e:
            errors.append(str(e))

    leader = threading.Thread(target=run)
    leader.start()
    started.wait(5)
    waiters = [threading.Thread(target=run) for _ in range(5)]
    for t in waiters:
        t.start()
    for t in [leader, *waiters]:
        t.join()
    assert errors == ["bad input"] * 6
    assert len(calls) == 1
    assert cache.get("v1", "x") is None


def test_metrics_counters_move(make_cache):
    cache = make_cache()
    kind = make_cache.kind
    series = {name: f'wharf_serve_cache_{name}_total{{backend="{kind}"}}'
              for name in ("hits", "misses", "bytes")}
    before = counter_values()
    cache.get_or_compute("v1", "m", lambda r: b"12345")
    cache.get_or_compute("v1", "m", lambda r: b"other")
    cache.get_or_compute("v1", "m", lambda r: b"other")
    after = wharf.metrics()
    c = after["counters"]
    assert c[series["hits"]] - before.get(series["hits"], 0) == 2
    assert c[series["misses"]] - before.get(series["misses"], 0) == 1
    assert c[series["bytes"]] - before.get(series["bytes"], 0) == 10
    h = after["histograms"][f'wharf_serve_cache_get_seconds{{backend="{kind}"}}']
    assert h["count"] >= 3 and h["buckets"][0][0] == 1e-6
    compute = after["histograms"][f'wharf_serve_cache_compute_seconds{{backend="{kind}"}}']
    assert compute["count"] >= 1
    # A compute that raises is timed too.

    def failing(r):
        raise RuntimeError("model failed")
    with pytest.raises(RuntimeError):
        cache.get_or_compute("v1", "fails", failing)
    again = wharf.metrics()["histograms"][
        f'wharf_serve_cache_compute_seconds{{backend="{kind}"}}']
    assert again["count"] == compute["count"] + 1


# ------------------------------------------------------------------------------ memory only
_FORK_SCRIPT = r"""
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from wharf.serve import PredictionCache
kw = {"key_prefix": sys.argv[3]} if sys.argv[2].startswith("redis://") else {}
cache = PredictionCache(sys.argv[2], **kw)
started = threading.Event()
def parent_compute(request):
    started.set()
    time.sleep(1.0)
    return b"parent"
threading.Thread(target=cache.get_or_compute, args=("v", "k", parent_compute)).start()
started.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    got = cache.get_or_compute("v", "k", lambda r: b"child")
    os._exit(0 if got in (b"child", b"parent") else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_while_a_compute_runs_does_not_wait_for_it_forever(make_cache, tmp_path,
                                                                         request):
    # The child inherited the parent's compute in flight (its event never set there: the
    # thread computing is not in the child) and waited for it forever, on every backend.
    backend = {"memory": "memory", "dir": str(tmp_path / "predictions")}.get(make_cache.kind)
    prefix = ""
    if backend is None:
        backend, prefix = request.getfixturevalue("redis_url"), \
            request.getfixturevalue("redis_prefix")
    out = subprocess.run([sys.executable, "-c", _FORK_SCRIPT,
                          str(pathlib.Path(wharf.__file__).parents[1]), backend, prefix],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", (out.stdout, out.stderr)


_FORK_METRICS_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import wharf
from wharf.serve import PredictionCache
cache = PredictionCache("memory")   # made before the fork, as a pre-forking server does
cache.get_or_compute("v", "k", lambda r: b"p")
pid = os.fork()
if pid == 0:
    for _ in range(5):
        cache.get_or_compute("v", "k", lambda r: b"p")
    cache.get_or_compute("v", "other", lambda r: b"q")
    c = wharf.metrics()["counters"]
    ok = (c.get('wharf_serve_cache_hits_total{backend="memory"}') == 5 and
          c.get('wharf_serve_cache_misses_total{backend="memory"}') == 1)
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_counts_its_lookups_in_its_own_metrics():
    # The handles were looked up in the parent's runtime; the child's lookups went there and
    # its own metrics showed none.
    out = subprocess.run([sys.executable, "-c", _FORK_METRICS_SCRIPT,
                          str(pathlib.Path(wharf.__file__).parents[1])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", (out.stdout, out.stderr)


def test_memory_lru_is_bounded_by_bytes():
    # an entry counts its value and its 40-byte key: 3 entries of 290 + 40 fit in 1000 bytes
    cache = PredictionCache("memory", max_bytes=1000)
    for name in "abc":
        cache.put("v1", name, name.encode() * 290)
    assert cache.stats()["entries"] == 3 and cache.stats()["bytes"] == 990
    assert cache.get("v1", "a") is not None          # "a" is now the most recent
    cache.put("v1", "d", b"d" * 290)                 # evicts "b", the least recently used
    assert cache.get("v1", "b") is None
    assert [cache.get("v1", k) is not None for k in "acd"] == [True, True, True]
    assert cache.stats()["bytes"] <= 1000
    cache.put("v1", "huge", b"h" * 2000)             # larger than the bound: not stored
    assert cache.get("v1", "huge") is None and cache.stats()["entries"] == 3
    assert PredictionCache("memory", max_bytes="64M")._b.max_bytes == 64 << 20


def test_memory_hit_is_cheap():
    """Not a timing assertion (benchmarks time it): a hit never calls compute and stays in
    process; see docs/design/serve.md for the measured latency."""
    cache = PredictionCache("memory")
    cache.put("v1", {"inputs": [1.0]}, b"y")
    for _ in range(1000):
        assert cache.get_or_compute("v1", {"inputs": [1.0]}, None) == b"y"


# -------------------------------------------------------------------------- directory only
def test_dir_entries_files_and_eviction(tmp_path):
    d = tmp_path / "pc"
    cache = PredictionCache(str(d), max_bytes=1000)
    header = 20
    for i in range(3):
        cache.put("v1", i, bytes([i]) * 280)
    files = sorted((d / "entries").glob("*/*/*"))   # entries/<version tag>/<shard>/<hash>
    assert len(files) == 3 and all(f.stat().st_size == 280 + header for f in files)
    assert len({f.parent.parent for f in files}) == 1
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert list((d / "tmp").iterdir()) == []
    # make request 0 the oldest, then read it: the hit refreshes its time, so 1 goes first
    old = time.time() - 100
    for i in range(3):
        os.utime(cache._b._path(cache._key("v1", i)), (old + i, old + i))
    assert cache.get("v1", 0) == bytes([0]) * 280
    cache.put("v1", 3, b"\3" * 280)                 # 4 x 300 > 1000: evict down to 900
    present = [cache.get("v1", i) is not None for i in range(4)]
    assert present == [True, False, True, True]
    assert cache.stats()["bytes"] == 900
    # another cache object on the folder counts what is there
    other = PredictionCache(str(d), max_bytes=1000)
    other.put("v1", 9, b"x")
    assert other.stats()["bytes"] == 900 + header + 1
    assert PredictionCache(str(d))._b.max_bytes is None


def test_dir_truncated_or_foreign_entry_is_a_miss(tmp_path):
    d = tmp_path / "pc"
    cache = PredictionCache(str(d))
    cache.put("v1", "a", b"abcdef")
    (f,) = (d / "entries").glob("*/*/*")
    f.write_bytes(f.read_bytes()[:-2])            # truncated
    assert cache.get("v1", "a") is None and not f.exists()
    assert cache.get_or_compute("v1", "a", lambda r: b"new") == b"new"


def test_dir_shared_by_two_processes(tmp_path):
    d = str(tmp_path / "pc")
    requests = [{"i": i} for i in range(5)]
    first = run_worker(d, "p1", requests)
    assert first["stats"]["computes"] == 5
    second = run_worker(d, "p2", requests)
    assert second["stats"]["computes"] == 0 and second["stats"]["hits"] == 5
    assert second["values"] == first["values"]
    assert all(v[0].startswith("p1:") for v in second["values"])
    # and this process reads them too
    assert PredictionCache(d).get("v1", {"i": 3}) == b'p1:{"i": 3}'


def test_dir_unwritable_degrades_with_one_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = PredictionCache(str(blocker / "pc"), retry_after=0.2)
    model = Model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [cache.get_or_compute("v1", i, model) for i in range(5)]
        time.sleep(0.25)
        values += [cache.get_or_compute("v1", i, model) for i in range(5)]
    assert values == [f"{n + 1}:{n % 5}".encode() for n in range(10)]
    ours = [w for w in caught if issubclass(w.category, PredictionCacheWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert str(blocker / "pc") in str(ours[0].message)
    # Reported at the caller's line, not at wharf's own file.
    assert ours[0].filename == __file__ and ours[0].lineno > 0, (ours[0].filename, ours[0].lineno)
    assert cache.stats()["degraded"] and cache.stats()["errors"] >= 2


def test_dir_removed_while_in_use_is_made_again(tmp_path):
    import shutil
    path = tmp_path / "pc"
    cache = PredictionCache(str(path))
    model = Model()
    assert cache.get_or_compute("v1", 1, model) == b"1:1"
    shutil.rmtree(path)  # a cleanup of the node's scratch space
    with warnings.catch_warnings():
        warnings.simplefilter("error", PredictionCacheWarning)  # no degradation
        assert cache.get_or_compute("v1", 2, model) == b"2:2"
        assert cache.get_or_compute("v1", 2, model) == b"2:2"  # stored again: a hit
    assert model.calls == 2 and not cache.stats()["degraded"]
    cache.close()


def test_dir_expired_entries_are_swept_by_puts(tmp_path):
    """With a ttl and no max_bytes, entries that are never read again do not stay forever:
    puts sweep one shard folder of every version at a time, all 256 in turn."""
    d = tmp_path / "pc"
    cache = PredictionCache(str(d), ttl=0.2)
    cache._b.SWEEP_SECONDS = 0.0                  # a sweep on every put (1 s by default)
    for i in range(40):
        cache.put("old", i, b"o")
    # an entry that another cache object wrote with a longer ttl is kept
    PredictionCache(str(d), ttl=60).put("old", "long", b"l")
    old = (d / "entries" / cache._key("old", 0)[:8].hex())
    assert len(list(old.glob("*/*"))) == 41
    time.sleep(0.3)
    started = []
    for i in range(256):
        started.append(time.time())
        cache.put("new", i, b"n")
    ended = time.time()
    assert [f.name for f in old.glob("*/*")] == [cache._key("old", "long")[8:].hex()]
    assert cache.get("old", "long") == b"l"
    # The new entries that cannot have expired before the last put (each expires at least
    # ttl after its put began) are all still there, however slow the machine was.
    new = d / "entries" / cache._key("new", 0)[:8].hex()
    kept = {f.name for f in new.glob("*/*")}
    live = {cache._key("new", i)[8:].hex() for i, t in enumerate(started) if t + 0.2 > ended}
    assert live <= kept and (live or ended - started[-1] >= 0.2)


_FULL_DISK = """
import json, resource, signal, sys, time, warnings
sys.path.insert(0, sys.argv[2])
from wharf.serve import PredictionCache
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes beyond the limit fail with EFBIG
c = PredictionCache(sys.argv[1], retry_after=0.5)
c.get_or_compute("v", "warm", lambda r: b"x")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    resource.setrlimit(resource.RLIMIT_FSIZE, (10, resource.RLIM_INFINITY))
    values = [c.get_or_compute("v", i, lambda r: b"value") for i in range(5)]
    down = c.stats()
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    time.sleep(0.6)
    c.get_or_compute("v", "after", lambda r: b"stored")
print(json.dumps({"warnings": len(w), "down": down, "up": c.stats(),
                  "stored": (c.get("v", "after") or b"").decode()}))
"""


def test_dir_failed_write_degrades_once_for_retry_after(tmp_path):
    """A write that fails (a full disk: RLIMIT_FSIZE, in a process of its own) warns once and
    leaves the folder alone for retry_after, although releasing the key's lock still works."""
    out = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path / "pc"),
                          str(pathlib.Path(wharf.__file__).parents[1])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["warnings"] == 1
    assert r["down"]["degraded"] and r["down"]["errors"] == 1 and r["down"]["computes"] == 6
    assert not r["up"]["degraded"] and r["stored"] == "stored"


# ------------------------------------------------------------------------------- Redis only
def test_two_server_processes_share_redis(redis_url, redis_prefix):
    """The second replica hits what the first computed."""
    requests = [{"inputs": [i, i + 0.5]} for i in range(8)]
    first = run_worker(redis_url, "p1", requests, prefix=redis_prefix)
    assert first["stats"]["computes"] == 8 and first["stats"]["hits"] == 0
    second = run_worker(redis_url, "p2", requests, prefix=redis_prefix)
    assert second["stats"]["computes"] == 0 and second["stats"]["hits"] == 8
    assert second["values"] == first["values"]
    assert all(v[0].startswith("p1:") for v in second["values"])
    client = redis.Redis.from_url(redis_url)
    assert int(client.get(redis_prefix + "computes")) == 8
    # a value is stored as the bytes compute returned, under <prefix><version tag>:<hash>,
    # with no TTL
    keys = [k for k in client.scan_iter(match=redis_prefix + "*") if not k.endswith(b"computes")]
    assert len(keys) == 8 and all(len(k) == len(redis_prefix) + 16 + 1 + 64 for k in keys)
    assert len({k[:len(redis_prefix) + 17] for k in keys}) == 1  # one version: one pattern
    assert all(client.get(k).startswith(b"p1:") and client.ttl(k) == -1 for k in keys)


@pytest.mark.parametrize("kind", ["redis", "dir"])
def test_identical_misses_compute_once_across_processes(kind, tmp_path, request):
    """Four replicas of two threads each, started together on one cold request: one compute."""
    if kind == "redis":
        backend = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        extra = {"prefix": prefix}
    else:
        backend = str(tmp_path / "pc")
        extra = {"count_file": str(tmp_path / "computes")}
    procs = []
    for i in range(4):
        args = [sys.executable, str(WORKER), backend, "--tag", f"p{i}", "--requests",
                json.dumps([{"cold": 1}, {"cold": 2}]), "--threads", "2", "--compute-sleep", "0.4",
                "--barrier"]
        for k, v in extra.items():
            args += [f"--{k.replace('_', '-')}", v]
        procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if kind == "redis":
        computes = int(redis.Redis.from_url(backend).get(prefix + "computes"))
    else:
        computes = len((tmp_path / "computes").read_text().splitlines())
    assert computes == 2  # one per distinct request, across 4 processes x 2 threads
    for i in range(2):
        values = {v for o in outs for v in o["values"][i]}
        assert len(values) == 1, values
    assert sum(o["stats"]["computes"] for o in outs) == 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server of this test's own on 127.0.0.1:port, killed by its PID."""

    def __init__(self, port, workdir, *args):
        self.port, self.workdir, self.args, self.proc = port, workdir, args, None

    def start(self):
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (apt-get install redis-server)"
        self.proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert self.proc.poll() is None, "the private redis-server exited"
                assert time.monotonic() < deadline, "the private redis-server did not answer"
                time.sleep(0.02)
        client.close()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_redis_killed_mid_run_degrades_then_recovers(tmp_path):
    server = PrivateRedis(free_port(), tmp_path)
    server.start()
    try:
        cache = PredictionCache(f"redis://127.0.0.1:{server.port}/0", retry_after=0.3,
                                timeout=0.5)
        model = Model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cache.get_or_compute("v1", "a", model) == b'1:"a"'
            assert cache.get_or_compute("v1", "a", model) == b'1:"a"'   # a hit
            server.kill()
            t0 = time.monotonic()
            down = [cache.get_or_compute("v1", "a", model) for _ in range(5)]
            time.sleep(0.35)                                             # retried, fails again
            down += [cache.get_or_compute("v1", "b", model) for _ in range(3)]
            elapsed = time.monotonic() - t0
            assert down == [f'{n}:"a"'.encode() for n in range(2, 7)] + \
                [f'{n}:"b"'.encode() for n in range(7, 10)]
            assert elapsed < 3, "requests waited for the dead backend"
            ours = [w for w in caught if issubclass(w.category, PredictionCacheWarning)]
            assert len(ours) == 1, [str(w.message) for w in ours]
            assert f"127.0.0.1:{server.port}" in str(ours[0].message)
            assert cache.stats()["degraded"]

            server.start()                       # the same port, empty
            time.sleep(0.35)
            assert cache.get_or_compute("v1", "c", model) == b'10:"c"'
            assert cache.get_or_compute("v1", "c", model) == b'10:"c"'  # cached again
            s = cache.stats()
            assert not s["degraded"] and s["hits"] >= 2 and s["errors"] >= 2
            assert len([w for w in caught if issubclass(w.category, PredictionCacheWarning)]) == 1

            server.kill()                        # down again after recovering: warned again
            assert cache.get_or_compute("v1", "c", model) == b'11:"c"'
            assert len([w for w in caught if issubclass(w.category, PredictionCacheWarning)]) == 2
        cache.close()
    finally:
        server.kill()


def test_redis_failed_write_degrades_once_for_retry_after(tmp_path):
    """A SET that Redis refuses (a value over its proto-max-bulk-len) warns once and leaves
    Redis alone for retry_after, although the lock's SET and release still work."""
    server = PrivateRedis(free_port(), tmp_path, "--proto-max-bulk-len", "1mb")
    server.start()
    try:
        cache = PredictionCache(f"redis://127.0.0.1:{server.port}/0", retry_after=0.5)
        cache.get_or_compute("v1", "warm", lambda r: b"x")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(5):
                assert cache.get_or_compute("v1", i, lambda r: b"v" * (2 << 20)) == b"v" * (2 << 20)
            s = cache.stats()
            assert s["degraded"] and s["errors"] == 1 and s["computes"] == 6
            time.sleep(0.6)
            assert cache.get_or_compute("v1", "small", lambda r: b"s") == b"s"
        assert len([w for w in caught if issubclass(w.category, PredictionCacheWarning)]) == 1
        assert not cache.stats()["degraded"] and cache.get("v1", "small") == b"s"
        cache.close()
    finally:
        server.kill()


def test_redis_longest_ttl_is_stored(redis_url, redis_prefix):
    cache = PredictionCache(redis_url, ttl=MAX_SECONDS, key_prefix=redis_prefix)
    cache.put("v1", "k", b"v")
    assert cache.get("v1", "k") == b"v" and cache.stats()["errors"] == 0
    client = redis.Redis.from_url(redis_url)
    (key,) = client.scan_iter(match=redis_prefix + "*")
    assert client.pttl(key) > (MAX_SECONDS - 60) * 1000
    client.close()


def test_redis_down_from_the_start_never_fails_a_request():
    port = free_port()  # nothing listens there
    cache = PredictionCache(f"redis://127.0.0.1:{port}/0")
    with pytest.warns(PredictionCacheWarning, match="ConnectionError"):
        assert cache.get_or_compute("v1", 1, lambda r: b"v") == b"v"
    assert cache.get("v1", 1) is None
    cache.put("v1", 1, b"x")  # skipped while the backend is left alone, no error


def test_redis_max_bytes_caps_one_value(redis_url, redis_prefix):
    cache = PredictionCache(redis_url, max_bytes="1K", key_prefix=redis_prefix, ttl=60)
    cache.put("v1", "small", b"s" * 1024)
    cache.put("v1", "big", b"b" * 1025)
    assert cache.get("v1", "small") == b"s" * 1024
    assert cache.get("v1", "big") is None
    client = redis.Redis.from_url(redis_url)
    (key,) = [k for k in client.scan_iter(match=redis_prefix + "*")]
    assert 0 < client.pttl(key) <= 60000


def test_redis_lock_is_released_and_expires(redis_url, redis_prefix):
    """The lock key is deleted after the compute, and only by its holder."""
    cache = PredictionCache(redis_url, key_prefix=redis_prefix, lock_ttl=5)
    client = redis.Redis.from_url(redis_url)
    seen = []

    def compute(request):
        seen.extend(client.scan_iter(match=redis_prefix + "*:lock"))
        return b"v"

    cache.get_or_compute("v1", "k", compute)
    assert len(seen) == 1  # held while computing
    assert list(client.scan_iter(match=redis_prefix + "*:lock")) == []
    # a lock held by someone else (a crashed replica) is waited for until it expires
    key = cache._key("v1", "held")
    client.set(cache._b._key(key) + b":lock", b"other", px=400)
    cache2 = PredictionCache(redis_url, key_prefix=redis_prefix, lock_ttl=5)
    t0 = time.monotonic()
    assert cache2.get_or_compute("v1", "held", lambda r: b"mine") == b"mine"
    assert 0.3 < time.monotonic() - t0 < 3


def test_redis_lock_is_renewed_while_a_long_compute_runs(redis_url, redis_prefix, monkeypatch):
    """A compute longer than the lock's lease keeps the lock (its holder renews it): another
    replica waits and gets that compute's value; nothing computes twice."""
    from wharf.serve import cache as cache_module
    monkeypatch.setattr(cache_module._RedisBackend, "LEASE", 0.3)
    a = PredictionCache(redis_url, key_prefix=redis_prefix, lock_ttl=30)
    b = PredictionCache(redis_url, key_prefix=redis_prefix, lock_ttl=30)
    started = threading.Event()
    computes = []

    def slow(request):
        computes.append("a")
        started.set()
        time.sleep(1.5)  # five leases
        return b"from a"

    out = {}
    t = threading.Thread(target=lambda: out.update(a=a.get_or_compute("v1", "k", slow)))
    t.start()
    assert started.wait(10)
    got = b.get_or_compute("v1", "k", lambda r: computes.append("b") or b"from b",
                           with_outcome=True)
    t.join()
    assert got == (b"from a", "coalesced") and out["a"] == b"from a"
    assert computes == ["a"]
    client = redis.Redis.from_url(redis_url)
    assert list(client.scan_iter(match=redis_prefix + "*:lock")) == []
    client.close()
    a.close()
    b.close()


HOLDER = """
import sys, time
from wharf.serve import PredictionCache
cache = PredictionCache(sys.argv[1], key_prefix=sys.argv[2], lock_ttl=60)
def forever(request):
    print("computing", flush=True)
    time.sleep(600)
cache.get_or_compute("v1", "k", forever)
"""


def test_redis_lock_of_a_holder_killed_with_9_is_taken_over_within_the_lease(redis_url,
                                                                             redis_prefix):
    """A replica killed mid-compute stops renewing its lease: the others compute the key
    within the lease (3 s), not after lock_ttl (60 s here)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url, redis_prefix],
                              stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        assert holder.stdout.readline() == b"computing\n"
        time.sleep(4)  # longer than a lease: the holder alive keeps renewing
        client = redis.Redis.from_url(redis_url)
        assert len(list(client.scan_iter(match=redis_prefix + "*:lock"))) == 1
        client.close()
        holder.kill()
        holder.wait()
        cache = PredictionCache(redis_url, key_prefix=redis_prefix, lock_ttl=60)
        t0 = time.monotonic()
        assert cache.get_or_compute("v1", "k", lambda r: b"taken over") == b"taken over"
        assert time.monotonic() - t0 < 3.5
    finally:
        holder.kill()
        holder.wait()


# -------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("backend, message", [
    ("memroy", "unknown backend 'memroy'"),
    ("s3://bucket/x", "unknown backend"),
    ("redis://", "no host"),
    ("redis://127.0.0.1:6379/db", "the database must be a number"),
    ("redis://127.0.0.1:notaport/0", "bad Redis URL"),
    ("redis://127.0.0.1:6379/0?x=1", "no query"),
    ("", "backend must be"),
    (None, "backend must be"),
])
def test_bad_backend(backend, message):
    with pytest.raises(ValueError, match=message):
        PredictionCache(backend)


@pytest.mark.parametrize("options, message", [
    ({"ttl": -1}, "ttl must be a positive"),
    ({"ttl": 0}, "ttl must be a positive"),
    ({"ttl": float("nan")}, "ttl must be a positive"),
    ({"ttl": "10"}, "ttl must be a number"),
    ({"max_bytes": -5}, "max_bytes must be a positive"),
    ({"max_bytes": "12Q"}, "max_bytes '12Q'"),
    ({"lock_ttl": 0}, "lock_ttl"),
    ({"retry_after": -1}, "retry_after"),
    # beyond what Redis's PX takes (ttl=1e16 failed every SET); refused on every backend
    ({"ttl": 1e16}, "ttl must be a positive number of seconds up to 3153600000"),
    ({"ttl": 10 ** 400}, "ttl must be a positive"),
    ({"ttl": float("inf")}, "ttl must be a positive"),
    ({"lock_ttl": 1e16}, "lock_ttl"),
    ({"timeout": 1e16}, "timeout"),
])
@pytest.mark.parametrize("backend", ["memory", "dir", "redis"])
def test_bad_options(options, message, backend, tmp_path):
    name = {"memory": "memory", "dir": str(tmp_path / "pc"),
            "redis": "redis://127.0.0.1:6379/0"}[backend]   # never connected
    with pytest.raises(ValueError, match=message):
        PredictionCache(name, **options)


def test_bad_model_version_and_closed_cache(tmp_path, monkeypatch):
    with PredictionCache("memory", ttl=1.5) as cache:
        with pytest.raises(TypeError, match="model_version must be a str"):
            cache.get("v1".encode(), "x")
        with pytest.raises(ValueError, match="must not be empty"):
            cache.get("", "x")
        assert repr(cache) == "PredictionCache('memory', ttl=1.5)"
        with pytest.raises(ValueError, match="model_version must be valid Unicode"):
            cache.get("v\ud800", "x")                     # a lone surrogate
    with pytest.raises(ValueError, match="closed"):
        cache.get("v1", "x")
    # directories: a path, a PathLike, file://, or an existing folder by its bare name
    assert PredictionCache(tmp_path / "a")._b.root == str(tmp_path / "a")
    assert PredictionCache(f"file://{tmp_path}/b")._b.root == str(tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    assert PredictionCache("existing")._b.root == str(tmp_path / "existing")
    assert PredictionCache("./new")._b.root == str(tmp_path / "new")


def test_bytes_like_requests():
    cache = PredictionCache("memory")

    class Payload(bytes):
        pass

    cache.put("v1", b"\x00\x01", b"y")
    for request in (Payload(b"\x00\x01"), bytearray(b"\x00\x01"), memoryview(b"\x00\x01"),
                    memoryview(b"\x00\xff\x01")[::2]):
        assert cache.get("v1", request) == b"y", request
    # other buffers: their bytes alone lose the dtype and the shape
    with pytest.raises(TypeError, match="got array: pass its bytes"):
        cache.get("v1", array.array("d", [1.0]))
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="got ndarray: pass its bytes"):
        cache.get("v1", np.zeros(2))


def test_redis_ipv6_url_is_shown_with_brackets():
    cache = PredictionCache("redis://[::1]:6379/0")      # no connection until used
    assert cache.backend == "redis://[::1]:6379/0"
    assert cache.stats()["url"] == "redis://[::1]:6379/0"
    cache.close()


def test_module_lists_its_api():
    import wharf.serve
    assert {"load_safetensors", "iter_safetensors", "PredictionCache"} <= set(dir(wharf.serve))
    text = pydoc.render_doc(wharf.serve, renderer=pydoc.plaintext)
    assert "class PredictionCache" in text
    assert "    load_safetensors(uri_or_uris" in text and "    iter_safetensors(uri_or_uris" in text
    # dir() alone stays lazy
    code = ("import sys; sys.path.insert(0, %r); import wharf.serve; dir(wharf.serve); "
            "assert 'torch' not in sys.modules, 'torch imported'" % str(
                pathlib.Path(__file__).resolve().parents[2] / "python"))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_cache_does_not_import_torch():
    code = ("import sys; sys.path.insert(0, %r); from wharf.serve import PredictionCache; "
            "PredictionCache('memory').get_or_compute('v', 1, lambda r: b'x'); "
            "assert 'torch' not in sys.modules, 'torch imported'" % str(
                pathlib.Path(__file__).resolve().parents[2] / "python"))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_request_nested_deeper_than_python_recurses_is_a_value_error():
    # Lists nest as deep as dicts (one frame per level); past the recursion limit the
    # request is refused with a ValueError that says so, not a RecursionError.
    deep_list, deep_dict = [], {}
    for _ in range(400):
        deep_list, deep_dict = [deep_list], {"k": deep_dict}
    assert canonical_request(deep_list) == b"[" * 401 + b"]" * 401
    assert canonical_request(deep_dict).count(b'{"k":') == 400
    deeper = []
    for _ in range(sys.getrecursionlimit() + 100):
        deeper = [deeper, {1: "x"}]
    with pytest.raises(ValueError, match="nested too deeply"):
        canonical_request(deeper)
    with pytest.raises(ValueError, match="nested too deeply"):
        PredictionCache("memory").get_or_compute("v1", deeper, lambda r: b"x")


@pytest.mark.parametrize("url", ["redis://:s3cr3tpass@127.0.0.1:notaport/0",
                                 "redis://user:s3cr3tpass@127.0.0.1:6379/x",
                                 "rediss://user:s3cr3tpass@127.0.0.1:6379/0"])
def test_a_bad_redis_url_is_named_without_its_password(url):
    with pytest.raises(ValueError) as e:
        PredictionCache(url)
    assert "s3cr3tpass" not in str(e.value)
    assert "127.0.0.1" in str(e.value) and ":***@" in str(e.value)
