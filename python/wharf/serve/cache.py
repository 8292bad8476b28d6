"""wharf.serve.cache: a cache of predictions shared by serving replicas (docs/design/serve.md,
"Prediction cache").

    cache = PredictionCache("redis://127.0.0.1:6379/0", ttl=3600)
    out = cache.get_or_compute("model-v3", {"text": "hello"}, lambda req: run_model(req))

A prediction is stored under a hash of the model version and the canonical request bytes, so a
new model version never serves an old prediction. Values are bytes: nothing is pickled, and a
replica in another language could read them. Three backends, named by a string:

- ``"memory"``: this process only; an LRU bounded by bytes.
- a directory path (``/nvme/tier/predictions``, ``./cache``, ``file:///...``): one file per
  prediction, shared by the processes of a node, or by nodes on a shared file system; an LRU
  bounded by bytes (file modification times, refreshed on hits).
- ``"redis://HOST:PORT/DB"``: shared by any number of replicas.

Concurrent identical misses compute once per process and, on the shared backends, once across
processes. A backend that fails degrades to computing, with one warning; it is tried again
after ``retry_after`` seconds and used again once it answers.

Thread-safe. Does not import torch.
"""
import collections
import fcntl
import hashlib
import json
import os
import random
import struct
import sys
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from urllib.parse import unquote, urlsplit

__all__ = ["PredictionCache", "PredictionCacheWarning", "canonical_request"]

# Latency buckets of wharf_serve_cache_get_seconds and _compute_seconds: a memory hit takes a
# few microseconds, a Redis round trip ~100 us on loopback, a model seconds.
_SECONDS_BOUNDS = [1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3,
                   1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
# The in-process LRU's bound when max_bytes is not given.
DEFAULT_MEMORY_BYTES = 256 << 20
# The longest ttl (and other duration) accepted, 100 years: Redis refuses an expiry whose
# milliseconds overflow 64 bits once added to its clock (ttl=1e16 would fail every SET), and
# the limit is the same on every backend so that a cache moves between them unchanged.
MAX_SECONDS = 100 * 365 * 86400


class PredictionCacheWarning(RuntimeWarning):
    """The cache's backend failed; requests are computed without it until it answers again."""


_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


_CONTAINERS = (dict, list, tuple)
# The wharf package's folder: frames below it are wharf's own (see _failed).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _string_keys(obj):
    """`obj` with every dict key as the string JSON makes of it, so that sort_keys sorts the
    strings (it sorts the keys as they are: 10 after 2, "10" before "2"); `obj` itself when
    every key is a string already (only containers are visited: a list of numbers costs an
    isinstance per item). Two keys that become one string are refused."""
    if isinstance(obj, dict):
        out, changed = {}, type(obj) is not dict
        for k, v in obj.items():
            if isinstance(v, _CONTAINERS):
                v2 = _string_keys(v)
                changed = changed or v2 is not v
                v = v2
            if type(k) is not str and (k is None or isinstance(k, (bool, int, float))):
                k = json.dumps(k)  # else (a tuple key) left for the encoder to refuse
                changed = True
                if k in obj or k in out:
                    raise ValueError(f"the request's keys {k!r} collide once made strings")
            out[k] = v
        return out if changed else obj
    items, changed = [], False
    for v in obj:  # a loop, not a comprehension: one frame per level, as for dicts
        if isinstance(v, _CONTAINERS):
            v2 = _string_keys(v)
            changed = changed or v2 is not v
            v = v2
        items.append(v)
    return items if changed else obj


def canonical_request(request) -> bytes:
    """The bytes a request is keyed by: bytes, bytearray and memoryview (and their subclasses)
    as they are; anything else as compact JSON with sorted keys (so {"b": 1, "a": 2} and
    {"a": 2, "b": 1} are one request). Requests are equal when their JSON is: a dict's keys
    become strings ({1: "x"} is {"1": "x"}) and tuples lists ((1, 2) is [1, 2]). Other buffers
    (array.array, numpy arrays) are refused: their bytes alone drop the dtype and shape that
    tell two requests apart."""
    if type(request) is bytes:
        return request
    if isinstance(request, (bytes, bytearray, memoryview)):
        return bytes(request)
    try:
        return _dumps(_string_keys(request) if isinstance(request, _CONTAINERS)
                      else request).encode()
    except RecursionError:
        raise ValueError("PredictionCache: the request is nested too deeply to be made JSON "
                         "(Python's recursion limit); pass its bytes instead") from None
    except (TypeError, ValueError) as e:
        why = str(e)
        if "not supported between instances" in why:
            why = f"a dict's keys are of types JSON cannot sort together: {why}"
    try:
        memoryview(request)
        why = (f"got {type(request).__name__}: pass its bytes, with its shape and dtype when "
               f"those vary")
    except TypeError:
        pass
    raise TypeError(f"PredictionCache: a request is bytes, bytearray, memoryview or a "
                    f"JSON-serializable value ({why})")


def _as_bytes(value, what):
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        raise TypeError(f"PredictionCache: {what} must be bytes-like, got str (encode it)")
    try:
        return memoryview(value).tobytes()
    except TypeError:
        raise TypeError(f"PredictionCache: {what} must be bytes-like, got "
                        f"{type(value).__name__}") from None


# ---------------------------------------------------------------------------------- backends
# A backend stores bytes under a 40-byte key: the model version's 8-byte tag, then the 32-byte
# hash of (version, request); the tag leads the backend's names, so one version's entries sit
# together (a folder, a SCAN pattern) and can be dropped together.
# get/put/try_lock/unlock raise one of `errors`
# when the backend itself fails (the cache then degrades); a missing or expired entry is None.


class _MemoryBackend:
    """An LRU in this process, bounded by the bytes of its keys and values."""
    name = "memory"
    shared = False
    errors = ()

    def __init__(self, max_bytes):
        self.max_bytes = DEFAULT_MEMORY_BYTES if max_bytes is None else max_bytes
        self._entries = collections.OrderedDict()  # key -> (value, expires monotonic or None)
        self._bytes = 0
        self._lock = threading.Lock()

    def describe(self):
        return "memory"

    def get(self, key):
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return None
            if e[1] is not None and e[1] <= time.monotonic():
                del self._entries[key]
                self._bytes -= len(key) + len(e[0])
                return None
            self._entries.move_to_end(key)
            return e[0]

    def put(self, key, value, ttl):
        size = len(key) + len(value)
        expires = None if ttl is None else time.monotonic() + ttl
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(key) + len(old[0])
            if size > self.max_bytes:
                return  # not stored, and the key's previous value is no longer its value
            self._entries[key] = (value, expires)
            self._bytes += size
            while self._bytes > self.max_bytes:
                k, (v, _) = self._entries.popitem(last=False)
                self._bytes -= len(k) + len(v)

    def stats(self):
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes}

    def close(self):
        with self._lock:
            self._entries.clear()
            self._bytes = 0


class _DirBackend:
    """One file per prediction in a directory shared by processes (and nodes, on a shared file
    system):

        <dir>/entries/<version tag>/<2 hex>/<64 hex>   header (magic, expiry, length) + value
        <dir>/locks/<80 hex>             flocked by the process computing that key
        <dir>/tmp/                       files being written (mode 0600), renamed into entries/
        <dir>/evict.lock                 flocked by the process evicting

    A rename commits a whole entry, so readers never see a partial one; entries are not
    fsync-ed (a crash may lose or truncate the newest: a truncated one reads as a miss). The
    LRU order is the files' modification time, refreshed by a hit at most every TOUCH_SECONDS.
    An expired entry is removed by the reader that finds it, and by a sweep of one shard of
    every version (entries/*/<2 hex>/, rotating) at most every SWEEP_SECONDS during puts with
    a ttl, so entries never read again go even without max_bytes (a full pass every ~4 min).
    """
    name = "dir"
    shared = True
    errors = (OSError,)
    HEADER = struct.Struct("<4sdQ")  # magic, expires (Unix seconds, 0 = never), value length
    MAGIC = b"wpc1"
    TOUCH_SECONDS = 1.0
    EVICT_TO = 0.9          # eviction goes down to this fraction of max_bytes
    STALE_TMP_SECONDS = 3600.0
    SWEEP_SECONDS = 1.0

    def __init__(self, path, max_bytes):
        self.root = os.path.abspath(os.path.expanduser(path))
        self.max_bytes = max_bytes
        self._entries = os.path.join(self.root, "entries")
        self._locks = os.path.join(self.root, "locks")
        self._tmp = os.path.join(self.root, "tmp")
        self._total = None          # bytes of entries/, scanned once, then a running total
        self._lock = threading.Lock()
        self._next_sweep = 0.0      # monotonic
        self._sweep_shard = random.randrange(256)  # processes sharing the folder spread out

    def describe(self):
        return f"directory {self.root}"

    def _path(self, key):
        tag, h = key[:8].hex(), key[8:].hex()
        return os.path.join(self._entries, tag, h[:2], h)

    def _open(self):
        # First use: the folders, the size of what is there, and temporary files that a
        # killed writer left behind.
        for d in (self._entries, self._locks, self._tmp):
            os.makedirs(d, exist_ok=True)
        now = time.time()
        with os.scandir(self._tmp) as it:
            for e in it:
                try:
                    if now - e.stat().st_mtime > self.STALE_TMP_SECONDS:
                        os.unlink(e.path)
                except FileNotFoundError:
                    pass
        total = sum(size for _, size, _ in self._scan())
        with self._lock:
            if self._total is None:
                self._total = total

    def _reopen(self):
        """The folder (or a part of it) was removed while in use: made again, and counted
        again."""
        with self._lock:
            self._total = None
        self._open()

    def _scan(self):
        """[(mtime, size, path)] of every entry file: entries/<version>/<shard>/<file>."""
        out = []

        def subdirs(path):
            try:
                with os.scandir(path) as it:
                    return [e.path for e in it if e.is_dir(follow_symlinks=False)]
            except (FileNotFoundError, NotADirectoryError):
                return []

        for version in subdirs(self._entries):
            for shard in subdirs(version):
                try:
                    with os.scandir(shard) as it:
                        for e in it:
                            try:
                                st = e.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue
                            out.append((st.st_mtime, st.st_size, e.path))
                except (FileNotFoundError, NotADirectoryError):
                    continue
        return out

    def get(self, key):
        path = self._path(key)
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            return None
        with f:
            st = os.fstat(f.fileno())
            header = f.read(self.HEADER.size)
            value = None
            if len(header) == self.HEADER.size:
                magic, expires, length = self.HEADER.unpack(header)
                if (magic == self.MAGIC and st.st_size == self.HEADER.size + length
                        and not (expires and expires <= time.time())):
                    value = f.read(length) if length else b""
                    if len(value) != length:
                        value = None
        if value is None:
            # Expired, truncated or foreign: remove it, unless another process has just
            # replaced it with a new entry.
            self._remove_if_same(path, st)
            return None
        if time.time() - st.st_mtime > self.TOUCH_SECONDS:
            try:
                os.utime(path)
            except FileNotFoundError:
                pass
        return value

    def _remove_if_same(self, path, st):
        try:
            now = os.stat(path)
            if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.unlink(path)
                with self._lock:
                    if self._total is not None:
                        self._total -= st.st_size
        except FileNotFoundError:
            pass

    def put(self, key, value, ttl):
        size = self.HEADER.size + len(value)
        path = self._path(key)
        if self.max_bytes is not None and size > self.max_bytes:
            # Not stored, and the key's previous value is no longer its value.
            try:
                self._remove_if_same(path, os.stat(path))
            except FileNotFoundError:
                pass
            return
        if self._total is None:
            self._open()
        expires = 0.0 if ttl is None else time.time() + ttl
        try:
            fd, tmp = tempfile.mkstemp(dir=self._tmp, prefix=key[8:16].hex() + ".")
        except FileNotFoundError:  # the folder was removed meanwhile
            self._reopen()
            fd, tmp = tempfile.mkstemp(dir=self._tmp, prefix=key[8:16].hex() + ".")
        try:
            with open(fd, "wb") as f:  # mkstemp: mode 0600
                f.write(self.HEADER.pack(self.MAGIC, expires, len(value)))
                f.write(value)
            try:
                os.rename(tmp, path)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        # A replaced entry is counted twice until the next eviction scan recounts.
        with self._lock:
            self._total += size
            over = self.max_bytes is not None and self._total > self.max_bytes
        if over:
            self._evict()
        if ttl is not None:
            self._sweep(ttl)

    def _sweep(self, ttl):
        """Removes the expired entries of the next shard folder of every version, at most
        every SWEEP_SECONDS. Only files last modified more than `ttl` ago are opened (an
        entry written with this ttl cannot have expired sooner); the header decides, so an
        entry another process wrote with a longer ttl stays. Best effort: an error leaves the
        rest to a later sweep, and never fails the put."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_sweep:
                return
            self._next_sweep = now + self.SWEEP_SECONDS
            shard = f"{self._sweep_shard:02x}"
            self._sweep_shard = (self._sweep_shard + 1) % 256
        cutoff = time.time() - ttl
        try:
            with os.scandir(self._entries) as it:
                versions = [e.path for e in it if e.is_dir(follow_symlinks=False)]
            for version in versions:
                for path in self._old_files(os.path.join(version, shard), cutoff):
                    self._remove_if_expired(path)
        except OSError:
            pass

    @staticmethod
    def _old_files(folder, cutoff):
        out = []
        try:
            with os.scandir(folder) as it:
                for e in it:
                    try:
                        if e.stat(follow_symlinks=False).st_mtime <= cutoff:
                            out.append(e.path)
                    except FileNotFoundError:
                        pass
        except FileNotFoundError:
            pass
        return out

    def _remove_if_expired(self, path):
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                header = f.read(self.HEADER.size)
        except FileNotFoundError:
            return
        if len(header) == self.HEADER.size:
            magic, expires, _ = self.HEADER.unpack(header)
            if magic == self.MAGIC and expires and expires <= time.time():
                self._remove_if_same(path, st)

    def _evict(self):
        """Removes the least recently used entries down to EVICT_TO * max_bytes. One process
        at a time (a flock); the others skip it (the one evicting recounts everything)."""
        fd = os.open(os.path.join(self.root, "evict.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            items = self._scan()
            total = sum(size for _, size, _ in items)
            if total > self.max_bytes:
                items.sort()
                target = self.max_bytes * self.EVICT_TO
                for _, size, path in items:
                    if total <= target:
                        break
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                    total -= size
            with self._lock:
                self._total = total
        finally:
            os.close(fd)

    def try_lock(self, key, lock_ttl):
        """The key's lock file, flocked (its fd), or None when another process holds it. The
        kernel drops the lock of a process that dies, so lock_ttl is not needed."""
        if self._total is None:
            self._open()
        path = os.path.join(self._locks, key.hex())
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:  # the folder was removed meanwhile
                self._reopen()
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            # The holder before us removes the file as it unlocks: a lock on a removed file
            # locks nothing, so take the lock of the file at the path now.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def unlock(self, key, fd):
        try:
            os.unlink(os.path.join(self._locks, key.hex()))
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def stats(self):
        return {"bytes": self._total, "dir": self.root}

    def close(self):
        pass


class _RedisBackend:
    """Redis: GET, SET with PX, and a lock key per computing key (SET NX PX, released by a
    compare-and-delete script). The total size is the server's business: its `maxmemory` and
    an eviction policy such as allkeys-lru (scripts/redis-server sets both); max_bytes only
    caps one value.

    A lock is a lease of LEASE seconds (at most lock_ttl) that a thread of the holder renews
    every third of a lease while the compute runs (a compare-and-pexpire script): a holder killed
    with -9 stops renewing, so the others take the key over within LEASE seconds, not after
    lock_ttl; a live holder keeps its lock however long its compute takes."""
    name = "redis"
    shared = True
    LEASE = 3.0

    _UNLOCK = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
               "return redis.call('del', KEYS[1]) else return 0 end")
    _RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
              "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end")

    def __init__(self, url, max_bytes, timeout, key_prefix):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as e:  # pragma: no cover - a requirement
            raise ImportError("PredictionCache('redis://...') needs the `redis` package "
                              "(pip install redis)") from e
        host, port, db, username, password = _parse_redis_url(url)
        # urlsplit drops an IPv6 address's brackets; the URL shown needs them back.
        self.url = f"redis://{f'[{host}]' if ':' in host else host}:{port}/{db}"
        self.max_bytes = max_bytes
        self.errors = (redis.exceptions.RedisError, OSError)
        self._prefix = key_prefix.encode()
        # Short timeouts and no retries inside the client: a backend that does not answer
        # promptly is worth less than computing, and the cache retries it later by itself.
        self._r = redis.Redis(host=host, port=port, db=db, username=username, password=password,
                              socket_timeout=timeout, socket_connect_timeout=timeout,
                              retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self._unlock = self._r.register_script(self._UNLOCK)
        self._renew = self._r.register_script(self._RENEW)
        self.after_fork()

    def after_fork(self):
        """Fresh lease state (in a child made by fork(): the parent's locks and its renewing
        thread are not this process's)."""
        self._held = {}  # lock key -> (token, lease in ms)
        self._held_lock = threading.Lock()
        self._renewer = None
        self._stop = threading.Event()

    def _renew_leases(self):
        """The renewing thread: every third of the shortest lease held, each held lock's
        lease again (a lock lost meanwhile, to expiry or a failover, is left alone: the script
        renews only its own)."""
        tick = self.LEASE / 3
        while not self._stop.wait(tick):
            with self._held_lock:
                held = list(self._held.items())
            # A third of the shortest lease held (a lock_ttl below LEASE shortens it).
            tick = min([lease_ms / 3000 for _, (_, lease_ms) in held] + [self.LEASE / 3])
            for lock_key, (token, lease_ms) in held:
                try:
                    self._renew(keys=[lock_key], args=[token, lease_ms])
                except Exception:  # noqa: BLE001 - the thread must outlive any one failure
                    pass  # the backend's failures are the cache's to handle on its own calls

    def describe(self):
        return self.url

    def _key(self, key):
        # <prefix><version tag>:<hash>: one version's keys are one SCAN pattern.
        return b"%s%s:%s" % (self._prefix, key[:8].hex().encode(), key[8:].hex().encode())

    def get(self, key):
        return self._r.get(self._key(key))

    def put(self, key, value, ttl):
        if self.max_bytes is not None and len(value) > self.max_bytes:
            # Not stored, and the key's previous value is no longer its value.
            self._r.delete(self._key(key))
            return
        px = None if ttl is None else max(1, int(ttl * 1000))
        self._r.set(self._key(key), value, px=px)

    def try_lock(self, key, lock_ttl):
        token = uuid.uuid4().hex.encode()
        lock_key = self._key(key) + b":lock"
        lease_ms = max(1, int(min(lock_ttl, self.LEASE) * 1000))
        if not self._r.set(lock_key, token, nx=True, px=lease_ms):
            return None
        with self._held_lock:
            self._held[lock_key] = (token, lease_ms)
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_leases, daemon=True,
                                                 name="wharf-cache-lease")
                self._renewer.start()
        return token

    def unlock(self, key, token):
        lock_key = self._key(key) + b":lock"
        with self._held_lock:
            if self._held.get(lock_key, (None,))[0] == token:
                del self._held[lock_key]
        self._unlock(keys=[lock_key], args=[token])

    def stats(self):
        return {"url": self.url}

    def close(self):
        self._stop.set()
        with self._held_lock:
            self._held.clear()
        self._r.close()


def _redacted(url):
    """`url` without the password of its user part, for messages: scheme://user:***@host..."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc_end = min((i for i in map(rest.find, "/?#") if i != -1), default=len(rest))
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    user, at, host = netloc.rpartition("@")
    if not at:
        return url
    name = user.partition(":")[0]
    return f"{scheme}://{name}:***@{host}{tail}"


def _parse_redis_url(url):
    """redis://[[user]:password@]HOST[:PORT][/DB] -> (host, port, db, user, password)."""
    def bad(why):
        return ValueError(f"PredictionCache: bad Redis URL {_redacted(url)!r}: {why} "
                          f"(expected redis://HOST:PORT/DB)")
    try:
        u = urlsplit(url)
        port = u.port or 6379
    except ValueError as e:
        raise bad(str(e)) from None
    if u.scheme != "redis":
        raise bad("the scheme must be redis://")
    if not u.hostname:
        raise bad("no host")
    if u.query or u.fragment:
        raise bad("no query or fragment is understood")
    path = u.path.strip("/")
    if path and not path.isdigit():
        raise bad(f"the database must be a number, got {path!r}")
    db = int(path) if path else 0
    username = unquote(u.username) if u.username else None
    password = unquote(u.password) if u.password else None
    return u.hostname, port, db, username, password


def _parse_backend(backend, max_bytes, timeout, key_prefix):
    if isinstance(backend, os.PathLike):
        return _DirBackend(os.fspath(backend), max_bytes)
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"PredictionCache: backend must be 'memory', 'redis://HOST:PORT/DB' or "
                         f"a directory path, got {backend!r}")
    if backend == "memory":
        return _MemoryBackend(max_bytes)
    if backend.startswith("redis://"):
        return _RedisBackend(backend, max_bytes, timeout, key_prefix)
    if backend.startswith("file://"):
        u = urlsplit(backend)
        if u.netloc not in ("", "localhost") or not u.path:
            raise ValueError(f"PredictionCache: bad file URI {backend!r} "
                             f"(expected file:///absolute/path)")
        return _DirBackend(unquote(u.path), max_bytes)
    if "://" in backend:
        raise ValueError(f"PredictionCache: unknown backend {_redacted(backend)!r}: expected "
                         f"'memory', "
                         f"'redis://HOST:PORT/DB', or a directory path or file:// URI")
    # A bare word that is not a directory is more likely a misspelt backend than a folder to
    # create: a new directory must be written as a path (./name, /abs/name).
    if os.sep not in backend and not backend.startswith("~") and not os.path.isdir(backend):
        raise ValueError(f"PredictionCache: unknown backend {backend!r}: expected 'memory', "
                         f"'redis://HOST:PORT/DB', or a directory path (write a new folder in "
                         f"the current directory as ./{backend})")
    return _DirBackend(backend, max_bytes)


def _positive_seconds(name, value, allow_none):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"PredictionCache: {name} must be a number of seconds"
                         f"{' or None' if allow_none else ''}, got {value!r}")
    if not 0 < value <= MAX_SECONDS:  # NaN and infinities too (an int is never converted)
        raise ValueError(f"PredictionCache: {name} must be a positive number of seconds up to "
                         f"{MAX_SECONDS} (100 years){'; None: no expiry' if allow_none else ''}"
                         f", got {value!r}")
    return float(value)


def _parse_max_bytes(value):
    if value is None:
        return None
    if isinstance(value, str):
        from wharf import parse_size
        try:
            value = parse_size(value)
        except Exception as e:
            raise ValueError(f"PredictionCache: max_bytes {value!r}: {e}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"PredictionCache: max_bytes must be a positive byte count or a size "
                         f"such as '64M', got {value!r}")
    return value


# ------------------------------------------------------------------------------------ cache


# Every cache of this process: a child made by fork() starts each with no computes in
# flight and fresh locks (the threads that were computing, and that held them, are not in
# the child, so waiting for them would never end).
_CACHES = weakref.WeakSet()


_METRIC_HANDLES = ("_m_hits", "_m_misses", "_m_errors", "_m_bytes", "_m_get", "_m_compute")


class _Relookup:
    """A metric handle of a cache in a forked child: the first add/observe looks the
    cache's handles up in the child's runtime, then records there."""
    __slots__ = ("_cache", "_name")

    def __init__(self, cache, name):
        self._cache, self._name = cache, name

    def _handle(self):
        self._cache._metric_handles()
        return getattr(self._cache, self._name)

    def add(self, n):
        self._handle().add(n)

    def observe(self, v):
        self._handle().observe(v)


def _after_fork_in_child():
    for cache in list(_CACHES):
        cache._forget_threads()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Flight:
    """One computation in progress in this process; identical requests wait for it."""
    __slots__ = ("event", "value", "error")

    def __init__(self):
        self.event = threading.Event()
        self.value = None
        self.error = None


class PredictionCache:
    """A cache of predictions: bytes keyed by (model version, request).

    backend: ``"memory"``, a directory path (or ``file://`` URI), or ``"redis://HOST:PORT/DB"``.
    ttl: seconds a prediction is served (None: until evicted). It and the other durations are
        at most MAX_SECONDS (100 years), which every backend can store.
    max_bytes: an int or a size (``"64M"``). "memory": the LRU's bound (default 256 MiB);
        directory: the bound of its files (default none); all backends: no value larger than
        it is stored. Redis's total is bounded by the server (maxmemory + allkeys-lru).
    lock_ttl: seconds another process waits for the one computing a key before computing
        itself. A holder that dies frees the key at once (directory: the kernel drops its
        flock) or within 3 s (Redis: the lock is a lease its holder renews while computing).
    retry_after: seconds a failed backend is left alone before it is tried again.
    timeout: Redis socket timeout, seconds.
    key_prefix: Redis key prefix (separates caches sharing one database).
    """

    def __init__(self, backend="memory", ttl=None, max_bytes=None, *, lock_ttl=30.0,
                 retry_after=5.0, timeout=0.5, key_prefix="wharf:pc:"):
        self.ttl = _positive_seconds("ttl", ttl, allow_none=True)
        self.lock_ttl = _positive_seconds("lock_ttl", lock_ttl, allow_none=False)
        self.retry_after = _positive_seconds("retry_after", retry_after, allow_none=False)
        timeout = _positive_seconds("timeout", timeout, allow_none=False)
        if not isinstance(key_prefix, str):
            raise ValueError(f"PredictionCache: key_prefix must be a str, got {key_prefix!r}")
        self._b = _parse_backend(backend, _parse_max_bytes(max_bytes), timeout, key_prefix)
        self.backend = self._b.describe()
        self._hasher = hashlib.blake2b(digest_size=32, person=b"wharf.serve.pc1")
        self._versions = {}         # model version -> (tag, hasher after the version)
        self._flights = {}
        self._flights_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._n = {"hits": 0, "misses": 0, "coalesced": 0, "computes": 0, "errors": 0,
                   "hit_bytes": 0}
        self._degraded = False      # read without a lock on the hit path
        self._failed_write = False  # the failure that degraded it was a write
        self._retry_at = 0.0        # monotonic: a degraded backend is skipped until then
        self._closed = False
        _CACHES.add(self)
        self._metric_handles()

    def _metric_handles(self):
        """The runtime's metrics, looked up once per process (recording is an atomic add):
        a child made by fork() has a runtime of its own, whose registry it looks them up in
        again."""
        from wharf import _wharf
        labels = [("backend", self._b.name)]
        self._m_hits = _wharf._counter("wharf_serve_cache_hits_total",
                                       "Prediction cache lookups answered from the cache", labels)
        self._m_misses = _wharf._counter("wharf_serve_cache_misses_total",
                                         "Prediction cache lookups that found nothing", labels)
        self._m_errors = _wharf._counter("wharf_serve_cache_errors_total",
                                         "Prediction cache backend operations that failed",
                                         labels)
        self._m_bytes = _wharf._counter("wharf_serve_cache_bytes_total",
                                        "Bytes of predictions served from the cache", labels)
        self._m_get = _wharf._histogram("wharf_serve_cache_get_seconds",
                                        "Prediction cache lookup latency", _SECONDS_BOUNDS,
                                        labels)
        self._m_compute = _wharf._histogram("wharf_serve_cache_compute_seconds",
                                            "Time of the compute function on a miss",
                                            _SECONDS_BOUNDS, labels)

    # ------------------------------------------------------------------------------ public
    def get_or_compute(self, model_version, request, compute, *, with_outcome=False):
        """The prediction for `request` by `model_version`: from the cache, or
        `compute(request)` (bytes-like), which is then stored. Identical requests that miss
        together compute once in this process, and once across processes on the shared
        backends. An exception from compute propagates (to the waiting requests too) and
        nothing is stored; a failing backend never fails a request.

        with_outcome=True returns (prediction, outcome) instead, outcome saying where the
        prediction came from: "hit" (the cache had it), "miss" (this call computed it) or
        "coalesced" (this call waited for an identical request's compute: another thread's,
        or on the shared backends another process's, which held the key's lock).

        A JSON request is canonicalised on every call, ~0.3 us per number (float formatting):
        for large numeric inputs pass bytes (e.g. array("d", xs).tobytes()), which are keyed
        as they are."""
        key = self._key(model_version, request)
        value = self._lookup(key)
        if value is not None:
            return (value, "hit") if with_outcome else value
        with self._flights_lock:
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
        if not leader:
            flight.event.wait()
            self._count("coalesced")
            if flight.error is not None:
                raise flight.error
            return (flight.value, "coalesced") if with_outcome else flight.value
        try:
            flight.value, outcome = self._fill(key, request, compute)
            return (flight.value, outcome) if with_outcome else flight.value
        except BaseException as e:
            flight.error = e
            raise
        finally:
            with self._flights_lock:
                del self._flights[key]
            flight.event.set()

    def _forget_threads(self):
        """In a child made by fork(): the parent's computes in flight and held locks are
        not this process's."""
        self._flights = {}
        self._flights_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        if hasattr(self._b, "_lock"):
            self._b._lock = threading.Lock()
        if hasattr(self._b, "after_fork"):
            self._b.after_fork()
        # The parent's handles point into the parent's registry; the child's runtime is made
        # at its first wharf call, so each handle is looked up again at its first use.
        for name in _METRIC_HANDLES:
            setattr(self, name, _Relookup(self, name))

    def get(self, model_version, request):
        """The cached prediction, or None."""
        return self._lookup(self._key(model_version, request))

    def put(self, model_version, request, value):
        """Stores a prediction (bytes-like) with the cache's ttl. A value larger than
        max_bytes is not stored, and the key's previous value is removed."""
        key = self._key(model_version, request)
        self._store(key, _as_bytes(value, "a value"))

    def stats(self):
        """This object's counts: hits, misses (lookups that found nothing), computes,
        coalesced (requests that waited for another thread's compute), errors (failed backend
        operations), hit_bytes, degraded; and the backend's own (entries/bytes)."""
        with self._stats_lock:
            out = dict(self._n)
        out["backend"] = self.backend
        out["degraded"] = self._degraded
        if not self._closed:
            out.update(self._b.stats())
        return out

    def close(self):
        """Releases the backend (Redis connections; the memory backend's entries)."""
        if not self._closed:
            self._closed = True
            self._b.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"PredictionCache({self.backend!r}, ttl={self.ttl})"

    # ---------------------------------------------------------------------------- internals
    def _key(self, model_version, request):
        if type(model_version) is not str:
            raise TypeError(f"PredictionCache: model_version must be a str, got "
                            f"{type(model_version).__name__}")
        if not model_version:
            raise ValueError("PredictionCache: model_version must not be empty")
        prefix = self._versions.get(model_version)
        if prefix is None:
            prefix = self._version_prefix(model_version)
        h = prefix[1].copy()
        h.update(canonical_request(request))
        return prefix[0] + h.digest()

    def _version_prefix(self, model_version):
        """(the version's 8-byte tag, a hasher that has consumed the version), kept for the
        versions seen recently (a server has one or two at a time)."""
        try:
            mv = model_version.encode()
        except UnicodeEncodeError as e:  # a lone surrogate ("\ud800")
            raise ValueError(f"PredictionCache: model_version must be valid Unicode text "
                             f"({e.reason} at index {e.start})") from None
        tag = hashlib.blake2b(mv, digest_size=8, person=b"wharf.serve.pcv").digest()
        h = self._hasher.copy()
        # Length-prefixed: ("a", "bc") and ("ab", "c") are different keys.
        h.update(len(mv).to_bytes(4, "little"))
        h.update(mv)
        if len(self._versions) >= 64:
            self._versions.clear()
        self._versions[model_version] = prefix = (tag, h)
        return prefix

    def _count(self, name, n=1):
        with self._stats_lock:
            self._n[name] += n

    def _backend(self):
        """The backend, or None while a failed one is left alone."""
        if self._closed:
            raise ValueError("PredictionCache: the cache is closed")
        if self._degraded and time.monotonic() < self._retry_at:
            return None
        return self._b

    def _lookup(self, key):
        b = self._backend()
        value = None
        if b is not None:
            t0 = time.perf_counter()
            try:
                value = b.get(key)
            except b.errors as e:
                self._failed(e, write=False)
            else:
                self._m_get.observe(time.perf_counter() - t0)
                if self._degraded:
                    self._recovered(write=False)
        if value is None:
            self._m_misses.add(1)
            self._count("misses")
            return None
        n = len(value)
        self._m_hits.add(1)
        self._m_bytes.add(n)
        with self._stats_lock:
            self._n["hits"] += 1
            self._n["hit_bytes"] += n
        return value

    def _failed(self, exc, write):
        self._m_errors.add(1)
        with self._stats_lock:
            self._n["errors"] += 1
            self._retry_at = time.monotonic() + self.retry_after
            first = not self._degraded
            self._degraded = True
            # A backend that reads but does not write (a read-only folder) has not recovered
            # when a read succeeds: only an operation of the kind that failed says so.
            self._failed_write = write or (self._failed_write and not first)
        if first:
            # warn_explicit without a registry: shown again after a recovery and a new failure
            # even when the text repeats (warnings.warn shows a text once per call site).
            # Reported at the caller's line (the first frame outside wharf), as warnings.warn
            # with a stacklevel would be.
            frame = sys._getframe(1)
            while frame.f_back is not None and \
                    frame.f_code.co_filename.startswith(_PACKAGE_DIR):
                frame = frame.f_back
            warnings.warn_explicit(
                f"wharf.serve.PredictionCache: the backend {self.backend} failed "
                f"({type(exc).__name__}: {exc}); computing predictions without the cache, "
                f"trying it again every {self.retry_after:g} s",
                PredictionCacheWarning, frame.f_code.co_filename, frame.f_lineno,
                module=frame.f_globals.get("__name__", "__main__"))

    def _recovered(self, write):
        with self._stats_lock:
            if write or not self._failed_write:
                self._degraded = False

    def _call(self, b, fn, *args, write=True, proves=True):
        """fn(*args) on the backend; (True, result), or (False, None) after a failure.
        proves: whether its success ends a degraded state (releasing a lock does not: it
        succeeds on a full disk, or a Redis refusing a value, right after the put failed)."""
        try:
            result = fn(*args)
        except b.errors as e:
            self._failed(e, write)
            return False, None
        if self._degraded and proves:
            self._recovered(write)
        return True, result

    def _compute(self, request, compute):
        self._count("computes")
        t0 = time.perf_counter()
        try:
            result = compute(request)
        finally:  # a compute that raised took its time too (a slow failure is worth seeing)
            self._m_compute.observe(time.perf_counter() - t0)
        return _as_bytes(result, "compute(request)'s result")

    def _store(self, key, value):
        b = self._backend()
        if b is not None:
            self._call(b, b.put, key, value, self.ttl)

    def _fill(self, key, request, compute):
        """A miss that this thread leads: once more from the backend (another thread or
        process may have just stored it), else compute and store, under the key's
        cross-process lock on the shared backends. (value, outcome for with_outcome)."""
        b = self._backend()
        if b is None:
            return self._compute(request, compute), "miss"
        if not b.shared:
            _, value = self._call(b, b.get, key, write=False)
            if value is not None:
                return value, "hit"
            value = self._compute(request, compute)
            self._store(key, value)
            return value, "miss"
        token = None
        try:
            try:
                token, value, waited = self._lock_or_wait(b, key)
            except b.errors as e:
                self._failed(e, write=True)
                return self._compute(request, compute), "miss"
            if value is not None:
                return value, "coalesced" if waited else "hit"
            value = self._compute(request, compute)
            self._call(b, b.put, key, value, self.ttl)
            return value, "miss"
        finally:
            if token is not None:
                self._call(b, b.unlock, key, token, proves=False)

    def _lock_or_wait(self, b, key):
        """(lock token, None, waited) to compute, (None, value, waited) when another process
        stored it meanwhile, or (None, None, True) when it held the lock past lock_ttl
        (compute without the lock); waited: another process held the lock. Polls with a
        short, growing sleep."""
        deadline = time.monotonic() + self.lock_ttl
        delay = 0.001
        waited = False
        while True:
            token = b.try_lock(key, self.lock_ttl)
            if token is not None:
                try:
                    value = b.get(key)
                except BaseException:
                    try:
                        b.unlock(key, token)
                    except b.errors:
                        pass
                    raise
                if value is not None:
                    b.unlock(key, token)
                    return None, value, waited
                return token, None, waited
            waited = True
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
            value = b.get(key)
            if value is not None:
                return None, value, True
            if time.monotonic() > deadline:
                return None, None, True
