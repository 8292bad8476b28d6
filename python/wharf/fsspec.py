"""wharf as an fsspec filesystem (docs/design/fsspec.md).

    import fsspec
    fs = fsspec.filesystem("wharf")                  # the entry point, or `import wharf.fsspec`
    fs.ls("s3://bucket/train/")                      # paths are full URIs: s3://, gs://, file://
    with fs.open("gs://bucket/a.parquet") as f:      # wharf.open: parallel read-ahead, seekable
        ...

    import wharf.fsspec
    wharf.fsspec.install()                           # wharf serves fsspec's s3://, gs://, gcs://
    pandas.read_parquet("s3://bucket/table.parquet") # read through wharf, s3fs not needed

Every call is the engine's (wharf.Store, wharf.open): listings, HEADs, ranged GETs, multipart
uploads and server-side copies run in C++ with the GIL released. Directories are what object
stores have: common prefixes of keys ("a/b" is a directory while some key starts with "a/b/";
a key ending in "/" is a directory marker); mkdir creates nothing below a bucket, and a
directory disappears with its last object.

Exclusive creation ("xb", pipe_file/put_file with mode="create") is a condition the store
enforces at the commit (If-None-Match: * on S3, ifGenerationMatch=0 on GCS, a non-replacing
rename on file://): of writers racing for one key exactly one succeeds, the others get
FileExistsError. The file also HEADs the key when it is opened (to fail early) and just before
it commits, which is what still guards a multipart upload (an object above one part) on a
server that ignores the condition there (Ceph RGW before Squid).

The filesystem pickles as its class and options (fsspec's rule); each process opens its own
stores, one wharf.Store per (scheme, bucket), with credentials from its own environment.
"""
import datetime
import contextlib
import os
import re
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from glob import has_magic

import fsspec
from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.utils import isfilelike, stringify_path

from wharf import _wharf
from wharf._file import ObjectFile

__all__ = ["WharfFileSystem", "WharfS3FileSystem", "WharfGCSFileSystem", "install"]

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

# fsspec's own storage options (listing cache, instance cache, loops): accepted, not ours.
_FSSPEC_OPTIONS = frozenset({
    "use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache",
    "asynchronous", "loop", "default_block_size", "default_fill_cache", "default_cache_type",
    "cache_type", "block_size", "fill_cache", "cache_options"})
# Options fsspec callers pass to open() for fsspec's own buffered files (wharf's read-ahead
# replaces their caches): ignored.
# `size` (the caller's idea of the object's size, s3fs's open(size=)): the object's own is read.
_FSSPEC_FILE_OPTIONS = frozenset({"cache_type", "fill_cache", "requester_pays", "size"})

# Options of the filesystems install() stands in for (s3fs, gcsfs) that mean something here.
_CREDENTIAL_OPTIONS = frozenset({"key", "secret", "token", "username", "password",
                                 "session_token"})

# Bytes per request of put_file / get_file / cp_file across stores, and the largest
# value pipe_file sends as one PUT (a larger one streams as a multipart upload).
_CHUNK = 8 << 20
_SINGLE_PUT = 64 << 20


def _store_options(storage_options):
    """The wharf store options (wharf.Store's keywords) in fsspec storage options.

    Also takes the spellings of s3fs and gcsfs that have an equivalent (anon=,
    endpoint_url=, client_kwargs={"endpoint_url", "region_name"}, project= is ignored).
    Credentials are refused: wharf takes them from the environment or a profile, and using
    others than the caller passed would be worse than failing. Anything else is a TypeError."""
    out = {}
    names = set(_wharf.store_option_names)
    for name, value in storage_options.items():
        if value is None or name in _FSSPEC_OPTIONS:
            continue
        if name in names:
            out[name] = value
        elif name == "anon":
            out["anonymous"] = bool(value)
        elif name in ("endpoint_url", "endpoint"):
            out["endpoint"] = value
        elif name == "client_kwargs":
            for k, v in dict(value).items():
                if k == "endpoint_url":
                    out["endpoint"] = v
                elif k == "region_name":
                    out["region"] = v
                else:
                    raise TypeError(f"wharf fsspec: client_kwargs[{k!r}] is not supported")
        elif name == "project" or (name == "requester_pays" and not value):
            continue  # gcsfs's billing project: wharf's gs:// store takes it from the env
        elif name in _CREDENTIAL_OPTIONS:
            raise ValueError(f"wharf fsspec: credentials ({name}=) are not taken as options; "
                             "set them in the environment (AWS_ACCESS_KEY_ID, ...) or use "
                             "profile=")
        else:
            raise TypeError(f"wharf fsspec: unknown storage option {name!r} (store options: "
                            f"{', '.join(sorted(names))})")
    return out


def _datetime(seconds):
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)


def _reopen(fs, path, position, closed):
    f = fs.open(path, "rb")
    if closed:
        f.close()
    else:
        f.seek(position)
    return f


class _File(ObjectFile):
    """What fs.open returns: wharf.open's ObjectFile, with fsspec's file attributes (fs,
    path), and for "xb" an existence check just before the (conditional) commit."""

    def __init__(self, fs, path, uri, mode, exclusive=False, **kwargs):
        self.fs = fs
        self.path = path
        self._exclusive = exclusive
        super().__init__(uri, mode, **kwargs)

    def info(self):
        return self.fs.info(self.path)

    def __reduce__(self):
        # As fsspec's own files: one open for reading pickles as the filesystem, the path and
        # the position, and opens the object again there (a multiprocessing or dask worker).
        if self._mode != "rb":
            raise TypeError(f"cannot pickle {self.path}: a file open for writing (only one "
                            "open for reading pickles)")
        return _reopen, (self.fs, self.path, 0 if self.closed else self.tell(), self.closed)

    def close(self):
        if self.closed:
            return
        if self._mode != "rb":
            if self._interrupted():  # a wrapper's `with` exit while an exception unwinds
                self.abort()
                return
            if self._exclusive:
                try:
                    taken = self.fs.exists(self.path)
                except BaseException:
                    self.abort()  # never commit what could not be checked
                    raise
                if taken:
                    self.abort()
                    raise FileExistsError(f"{self.path}: created by another writer meanwhile")
            try:
                super().close()
            finally:
                self.fs.invalidate_cache(self.path)
        else:
            super().close()


class WharfFileSystem(fsspec.AbstractFileSystem):
    """fsspec over wharf's engine; paths are full URIs (s3://bucket/key, gs://bucket/key,
    file:///path), and names come back the same way.

    Storage options are wharf.Store's (endpoint=, region=, anonymous=, profile=,
    addressing_style=, api=, cache=), applied to every store the filesystem opens; s3fs's
    anon=, endpoint_url= and client_kwargs={"endpoint_url", "region_name"} are understood.
    """

    protocol = ("wharf",)
    root_marker = ""
    # fsspec's instance cache: the same options give the same instance (and its stores).
    cachable = True
    # The scheme of stripped paths ("bucket/key"): None here (paths are URIs); "s3" / "gs"
    # in the classes install() registers for fsspec's protocols.
    _scheme = None

    def __init__(self, **storage_options):
        super().__init__(**storage_options)
        self._options = _store_options(storage_options)
        self._stores = {}
        self._lock = threading.Lock()

    # ---- paths ----
    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, (list, tuple)):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("wharf://") and _URI.match(path[len("wharf://"):]):
            path = path[len("wharf://"):]
        elif path.startswith("wharf::"):
            path = path[len("wharf::"):]
        if cls._scheme is not None:
            for p in cls.protocol:
                if path.startswith(p + "://"):
                    path = path[len(p) + 3:]
                    break
            return path.strip("/")
        m = _URI.match(path)
        if not m:
            return path.rstrip("/")
        scheme = m.group(1).lower()
        rest = path[m.end():]
        if scheme == "file":
            return "file:///" + rest.strip("/")
        return f"{scheme}://{rest.rstrip('/')}"

    def unstrip_protocol(self, name):
        if self._scheme is None:
            return self._strip_protocol(name)
        return f"{self._scheme}://{self._strip_protocol(name)}"

    @classmethod
    def _parent(cls, path):
        path = cls._strip_protocol(path)
        scheme, bucket, key = cls._split(path)
        if not key:
            return cls._name(scheme, "", "") if cls._scheme is None else ""
        return cls._name(scheme, bucket, key.rpartition("/")[0])

    @classmethod
    def _split(cls, path):
        """(scheme, bucket, key) of a path; key without a trailing '/'."""
        path = cls._strip_protocol(path)
        if cls._scheme is not None:
            bucket, _, key = path.partition("/")
            return cls._scheme, bucket, key.rstrip("/")
        m = _URI.match(path)
        if not m:
            raise ValueError(f"wharf fsspec: {path!r} is not a URI (s3://bucket/key, "
                             "gs://bucket/key, file:///path)")
        scheme = m.group(1).lower()
        rest = path[m.end():]
        if scheme == "file":
            return scheme, "", rest.strip("/")
        bucket, _, key = rest.partition("/")
        return scheme, bucket, key.rstrip("/")

    @classmethod
    def _name(cls, scheme, bucket, key):
        """The fsspec name of a key (the form paths come in)."""
        if cls._scheme is not None:
            return f"{bucket}/{key}" if key else bucket
        if scheme == "file":
            return "file:///" + key
        return f"{scheme}://{bucket}/{key}" if key else f"{scheme}://{bucket}"

    def _store(self, scheme, bucket):
        with self._lock:
            store = self._stores.get((scheme, bucket))
            if store is None:
                root = "file:///" if scheme == "file" else f"{scheme}://{bucket}/"
                store = _wharf.Store(root, **self._options)
                self._stores[(scheme, bucket)] = store
            return store

    def _resolve(self, path):
        """(store, key, (scheme, bucket)) of a path."""
        scheme, bucket, key = self._split(path)
        if not bucket and scheme != "file":
            raise ValueError(f"wharf fsspec: {path!r} names no bucket")
        return self._store(scheme, bucket), key, (scheme, bucket)

    def _uri(self, path):
        scheme, bucket, key = self._split(path)
        if scheme == "file":
            return "file:///" + key
        return f"{scheme}://{bucket}/{key}"

    # ---- listings ----
    def _file_entry(self, scheme, bucket, meta):
        return {"name": self._name(scheme, bucket, meta["key"]), "size": meta["size"],
                "type": "file", "etag": meta["etag"], "ETag": meta["etag"],
                "mtime": meta["mtime"], "LastModified": _datetime(meta["mtime"])}

    def _dir_entry(self, scheme, bucket, key):
        return {"name": self._name(scheme, bucket, key), "size": 0, "type": "directory"}

    def _buckets(self, path):
        """The buckets, as directories, when `path` names none (s3://, gs://, "" of an
        s3/gs filesystem, as s3fs and gcsfs list them); else None."""
        scheme, bucket, _ = self._split(path)
        if bucket or scheme == "file":
            return None
        options = {k: v for k, v in self._options.items() if k != "cache"}
        return [self._dir_entry(scheme, b["name"], "")
                for b in _wharf.list_buckets(scheme, **options)]

    def ls(self, path, detail=False, **kwargs):
        # detail=False by default, as s3fs and gcsfs (which install() stands in for) have it;
        # fsspec's own methods ask for what they need.
        buckets = self._buckets(path)
        if buckets is not None:
            return buckets if detail else [e["name"] for e in buckets]
        store, key, (scheme, bucket) = self._resolve(path)
        prefix = key + "/" if key else ""
        out = []
        for e in store.list(prefix, recursive=False):
            if "prefix" in e:
                if e["prefix"] == prefix + "/":
                    # An empty path component ("a//b", "/x"): a folder without a name, which
                    # would list as the folder itself (an endless walk). find() reaches its
                    # objects.
                    continue
                out.append(self._dir_entry(scheme, bucket, e["prefix"][:-1]))
            elif e["key"] == prefix:
                continue  # the directory's own marker
            elif e["key"].endswith("/"):
                out.append(self._dir_entry(scheme, bucket, e["key"].rstrip("/")))
            else:
                out.append(self._file_entry(scheme, bucket, e))
        if not out and key:
            # ls of a file is the file; of a marker-only directory, nothing
            try:
                out = [self._file_entry(scheme, bucket, store.head(key))]
            except FileNotFoundError:
                if not store.list(prefix, limit=1):
                    raise FileNotFoundError(self._name(scheme, bucket, key)) from None
        out.sort(key=lambda e: e["name"])
        return out if detail else [e["name"] for e in out]

    def info(self, path, **kwargs):
        scheme, bucket, _ = self._split(path)
        if not bucket and scheme != "file":  # the root above the buckets
            return {"name": self._name(scheme, "", ""), "size": 0, "type": "directory"}
        store, key, (scheme, bucket) = self._resolve(path)
        if not key:
            store.list("", recursive=False, limit=1)  # NotFoundError: no such bucket
            return self._dir_entry(scheme, bucket, "")
        try:
            return self._file_entry(scheme, bucket, store.head(key))
        except FileNotFoundError:
            pass
        if store.list(key + "/", limit=1):
            return self._dir_entry(scheme, bucket, key)
        raise FileNotFoundError(self._name(scheme, bucket, key))

    def exists(self, path, **kwargs):
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path):
        store, key, _ = self._resolve(path)
        try:
            return bool(store.list(key + "/" if key else "", limit=1)) or not key
        except FileNotFoundError:
            return False

    def isfile(self, path):
        store, key, _ = self._resolve(path)
        if not key:
            return False
        try:
            store.head(key)
            return True
        except FileNotFoundError:
            return False

    def find(self, path, maxdepth=None, withdirs=False, detail=False, prefix="", **kwargs):
        """Files below path; `prefix` (as s3fs's) keeps those whose name below path starts
        with it, listed by that prefix."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        name_prefix = prefix or ""
        store, key, (scheme, bucket) = self._resolve(path)
        prefix = key + "/" if key else ""
        out = {}
        if maxdepth == 1:
            listing = store.list(prefix + name_prefix, recursive=False)
        else:
            listing = store.list(prefix + name_prefix, recursive=True)
        for e in listing:
            rel = (e.get("key") or e.get("prefix"))[len(prefix):]
            is_dir = "prefix" in e or rel.endswith("/")
            parts = rel.rstrip("/").split("/") if rel else []
            # the directories above this entry (within maxdepth)
            if withdirs:
                for i in range(1, len(parts)):
                    if maxdepth is not None and i > maxdepth:
                        break
                    d = prefix + "/".join(parts[:i])
                    name = self._name(scheme, bucket, d)
                    if name not in out:
                        out[name] = self._dir_entry(scheme, bucket, d)
            if not parts or (maxdepth is not None and len(parts) > maxdepth):
                continue
            if is_dir:
                if withdirs:
                    d = prefix + rel.rstrip("/")
                    out[self._name(scheme, bucket, d)] = self._dir_entry(scheme, bucket, d)
            else:
                out[self._name(scheme, bucket, e["key"])] = self._file_entry(scheme, bucket, e)
        if listing and withdirs:  # the directory itself, as fsspec's find (a bucket too)
            out[self._name(scheme, bucket, key)] = self._dir_entry(scheme, bucket, key)
        if not out and key and not name_prefix:
            try:
                out[self._name(scheme, bucket, key)] = self._file_entry(scheme, bucket,
                                                                        store.head(key))
            except FileNotFoundError:
                pass
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    def du(self, path, total=True, maxdepth=None, withdirs=False, **kwargs):
        """Sizes from one listing (fsspec's default HEADs every file)."""
        found = self.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=True)
        sizes = {name: info["size"] for name, info in found.items()}
        return sum(sizes.values()) if total else sizes

    def created(self, path):
        """When the object was written: objects are immutable, so the time of the last
        write (the store's Last-Modified, or the file's mtime)."""
        return self.modified(path)

    def modified(self, path):
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(path)
        return info["LastModified"]

    def ukey(self, path):
        return self.info(path)["etag"]

    # ---- reading ----
    def cat_file(self, path, start=None, end=None, **kwargs):
        store, key, _ = self._resolve(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = store.head(key)["size"]
            if start is not None and start < 0:
                start = max(0, size + start)
            if end is not None and end < 0:
                end = max(0, size + end)
        start = start or 0
        if end is not None and end <= start:
            store.head(key)  # a missing object is still FileNotFoundError
            return b""
        try:
            if start == 0 and end is None:
                return bytes(store.get(key))
            return bytes(store.get(key, start, end))
        except ValueError:
            # a range that starts at or past the end: the bytes there are none
            if start >= store.head(key)["size"]:
                return b""
            raise

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        """The byte ranges, fetched in parallel: each a ranged GET of the engine, waited for
        without the GIL, up to 32 at a time."""
        if max_gap is not None:
            raise NotImplementedError("cat_ranges: max_gap")
        if not isinstance(paths, list):
            raise TypeError("cat_ranges: paths must be a list")
        if not isinstance(starts, list):
            starts = [starts] * len(paths)
        if not isinstance(ends, list):
            ends = [ends] * len(paths)
        if len(starts) != len(paths) or len(ends) != len(paths):
            raise ValueError("cat_ranges: paths, starts and ends differ in length")
        return self._parallel(lambda a: self.cat_file(*a), list(zip(paths, starts, ends)),
                              on_error)

    @staticmethod
    def _parallel(fn, args, on_error):
        def one(a):
            try:
                return fn(a)
            except Exception as e:  # noqa: BLE001 (returned or raised below, per on_error)
                if on_error == "raise":
                    raise
                return e
        if len(args) <= 1:
            return [one(a) for a in args]
        with ThreadPoolExecutor(max_workers=min(32, len(args))) as pool:
            return list(pool.map(one, args))

    def cat(self, path, recursive=False, on_error="raise", **kwargs):
        paths = self.expand_path(path, recursive=recursive)
        if len(paths) == 1 and not isinstance(path, list) and paths[0] == self._strip_protocol(
                path):
            return self.cat_file(paths[0], **kwargs)
        results = self._parallel(lambda p: self.cat_file(p, **kwargs), paths, "return")
        out = {}
        for p, r in zip(paths, results):
            if isinstance(r, FileNotFoundError) and recursive and self.isdir(p):
                continue  # a directory of the expansion: its files are there too
            if isinstance(r, Exception):
                if on_error == "raise":
                    raise r
                if on_error == "omit":
                    continue
            out[p] = r
        return out

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        if not autocommit:
            raise NotImplementedError("wharf fsspec: transactions (autocommit=False); a 'wb' "
                                      "file already commits atomically at close")
        kwargs = {k: v for k, v in kwargs.items() if k not in _FSSPEC_FILE_OPTIONS}
        if kwargs:
            raise TypeError(f"wharf fsspec: open() got unknown options {sorted(kwargs)}")
        uri = self._uri(path)
        name = self._strip_protocol(path)
        if mode == "rb":
            chunk = block_size if block_size and block_size > 0 else 0
            return _File(self, name, uri, "rb", chunk_size=chunk, **self._options)
        if mode in ("wb", "xb"):
            exclusive = mode == "xb"
            if exclusive and self.exists(path):
                raise FileExistsError(name)
            return _File(self, name, uri, mode, exclusive=exclusive, **self._options)
        raise ValueError(f"wharf fsspec: mode {mode!r} is not supported (rb, wb, xb; objects "
                         "cannot be appended to or updated in place)")

    # ---- writing ----
    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if mode not in ("overwrite", "create"):
            raise ValueError(f"pipe_file: mode {mode!r} (overwrite or create)")
        if mode == "create" and self.exists(path):
            raise FileExistsError(self._strip_protocol(path))
        if len(value) > _SINGLE_PUT:
            with self._open(path, "xb" if mode == "create" else "wb") as f:
                f.write(value)
            return
        store, key, _ = self._resolve(path)
        try:
            store.put(key, value, if_absent=mode == "create")
        finally:
            self.invalidate_cache(path)

    def touch(self, path, truncate=True, **kwargs):
        if not truncate and self.exists(path):
            raise NotImplementedError("touch: an object's time cannot be changed in place")
        store, key, _ = self._resolve(path)
        store.put(key, b"")
        self.invalidate_cache(path)

    def put_file(self, lpath, rpath, callback=DEFAULT_CALLBACK, mode="overwrite", **kwargs):
        if os.path.isdir(lpath):
            return  # directories are implied by the keys below them
        if mode == "create" and self.exists(rpath):
            raise FileExistsError(self._strip_protocol(rpath))
        size = os.path.getsize(lpath)
        callback.set_size(size)
        with open(lpath, "rb") as src:
            if size <= _CHUNK:
                store, key, _ = self._resolve(rpath)
                store.put(key, src.read(), if_absent=mode == "create")
                callback.relative_update(size)
            else:
                with self._open(rpath, "xb" if mode == "create" else "wb") as dst:
                    _pump(src, dst, _CHUNK, callback)
        self.invalidate_cache(rpath)

    def get_file(self, rpath, lpath, callback=DEFAULT_CALLBACK, outfile=None, **kwargs):
        if outfile is None and isfilelike(lpath):
            outfile = lpath
        try:
            src = self._open(rpath, "rb")
        except FileNotFoundError:
            if outfile is None and self.isdir(rpath):
                os.makedirs(lpath, exist_ok=True)
                return
            raise
        with src:
            callback.set_size(src.size)
            close = outfile is None
            tmp = None
            if close:
                # Written beside the target under a temporary name and renamed over it when
                # whole: a failed read never leaves a partial file at lpath.
                lpath = os.fspath(lpath)
                parent = os.path.dirname(lpath)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                tmp = os.path.join(parent, f".wharf-tmp-{os.getpid()}-{secrets.token_hex(6)}")
                outfile = open(tmp, "xb")
            try:
                _pump(src, outfile, min(_CHUNK, max(src.size, 1)), callback)
                if close:
                    outfile.close()
                    os.replace(tmp, lpath)
                    tmp = None
            finally:
                if close:
                    outfile.close()
                    if tmp is not None:
                        with contextlib.suppress(OSError):
                            os.unlink(tmp)

    def get(self, rpath, lpath, recursive=False, callback=DEFAULT_CALLBACK, maxdepth=None,
            **kwargs):
        """fsspec's get, after a check of the keys it would copy: one with a '.', '..' or empty
        path component would land outside lpath (fsspec releases without check_contained
        write it there) or on another key's file ('a/./b' and 'a/b'), so the copy is refused
        before anything is written, naming it."""
        if recursive or (isinstance(rpath, str) and has_magic(rpath)):
            for path in self.expand_path(rpath, recursive=recursive, maxdepth=maxdepth):
                key = self._split(path)[2]  # "" for a bucket: no component
                if key and any(part in ("", ".", "..") for part in key.split("/")):
                    raise ValueError(f"wharf fsspec: get: the key {key!r} ({path}) has a '.', '..' "
                                     f"or empty path component: as a local path it would land "
                                     f"outside {lpath} or on another key's file; nothing was "
                                     f"copied (wharf cp -r copies the others and names it)")
        return super().get(rpath, lpath, recursive=recursive, callback=callback,
                           maxdepth=maxdepth, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        """Server-side copy within one store (S3 CopyObject, GCS rewrite); across stores,
        streamed through the engine. A directory copies as nothing (its keys are copied
        one by one by copy(..., recursive=True))."""
        src, skey, sid = self._resolve(path1)
        dst, dkey, did = self._resolve(path2)
        try:
            if sid == did:
                src.copy(skey, dkey)
            else:
                with self._open(path1, "rb") as f, self._open(path2, "wb") as g:
                    while True:
                        chunk = f.read(_CHUNK)
                        if not chunk:
                            break
                        g.write(chunk)
        except FileNotFoundError:
            if self.isdir(path1):
                return
            raise
        self.invalidate_cache(path2)

    # ---- directories ----
    def mkdir(self, path, create_parents=True, **kwargs):
        """A bucket-level path creates the bucket (FileExistsError when it exists), where the
        store can (S3, GCS JSON API); below a bucket nothing is created (object stores have
        no directories), and a missing bucket is created first when create_parents."""
        store, key, (scheme, bucket) = self._resolve(path)
        if scheme == "file":
            return
        exists = self._bucket_exists(store)
        if not key:
            if exists:
                raise FileExistsError(self._name(scheme, bucket, ""))
            store._create_bucket()
        elif not exists:
            if not create_parents:
                raise FileNotFoundError(self._name(scheme, bucket, ""))
            store._create_bucket()

    def makedirs(self, path, exist_ok=False):
        try:
            self.mkdir(path, create_parents=True)
        except FileExistsError:
            if not exist_ok:
                raise

    def rmdir(self, path):
        """Directories hold no object of their own: nothing to remove (a marker key, if
        one exists, goes with rm(path, recursive=True))."""

    @staticmethod
    def _bucket_exists(store):
        try:
            store.list("", recursive=False, limit=1)
            return True
        except FileNotFoundError:
            return False

    # ---- removing ----
    def rm_file(self, path):
        store, key, _ = self._resolve(path)
        store.delete(key)
        self.invalidate_cache(path)

    def rm(self, path, recursive=False, maxdepth=None):
        """Deletes files, or with recursive whole prefixes (directory markers too), in
        batches (S3 DeleteObjects: 1,000 keys a request)."""
        keys = {}  # (scheme, bucket) -> (store, keys)
        if recursive and maxdepth is None:
            paths = path if isinstance(path, list) else [path]
            found = False
            for p in paths:
                for q in (self.expand_path(p) if has_magic(self._strip_protocol(p)) else [p]):
                    store, key, sid = self._resolve(q)
                    batch = keys.setdefault(sid, (store, []))[1]
                    prefix = key + "/" if key else ""
                    listed = [e["key"] for e in store.list(prefix, recursive=True)]
                    batch.extend(listed)
                    found = found or bool(listed)
                    if key:
                        try:
                            store.head(key)
                            batch.append(key)
                            found = True
                        except FileNotFoundError:
                            pass
            if not found:
                raise FileNotFoundError(path)
        else:
            for p in self.expand_path(path, recursive=recursive, maxdepth=maxdepth):
                store, key, sid = self._resolve(p)
                keys.setdefault(sid, (store, []))[1].append(key)
        for store, batch in keys.values():
            if batch:
                store.delete_many(batch)
        self.invalidate_cache()


class WharfS3FileSystem(WharfFileSystem):
    """fsspec's s3:// after install(): paths as s3fs takes them ("bucket/key", or
    "s3://bucket/key"), names as s3fs gives them ("bucket/key")."""

    protocol = ("s3", "s3a")
    _scheme = "s3"


class WharfGCSFileSystem(WharfFileSystem):
    """fsspec's gs:// and gcs:// after install(): paths as gcsfs takes them."""

    protocol = ("gs", "gcs")
    _scheme = "gs"


_INSTALLED = ("s3", "s3a", "gs", "gcs")


def install():
    """Registers wharf as fsspec's implementation of s3://, gs:// and gcs:// (replacing s3fs
    and gcsfs for this process), so pandas, pyarrow datasets through fsspec, and anything
    else that opens URLs with fsspec read and write through wharf. Instances made before
    stay as they are.

    pandas' read_parquet / to_parquet given such a URL and no storage_options or filesystem
    would first try pyarrow's own S3/GCS client, which never asks fsspec; install() also
    wraps those two (when pandas is installed) to pass storage_options={} in that one case,
    which makes pandas take fsspec's filesystem, i.e. wharf. Everything else pandas does is
    unchanged."""
    fsspec.register_implementation("s3", WharfS3FileSystem, clobber=True)
    fsspec.register_implementation("s3a", WharfS3FileSystem, clobber=True)
    fsspec.register_implementation("gs", WharfGCSFileSystem, clobber=True)
    fsspec.register_implementation("gcs", WharfGCSFileSystem, clobber=True)
    _route_pandas_parquet()


def _through_fsspec(path, kwargs) -> bool:
    return (isinstance(path, str) and path.split("://", 1)[0] in _INSTALLED and "://" in path
            and kwargs.get("storage_options") is None and kwargs.get("filesystem") is None)


def _route_pandas_parquet():
    import importlib.util
    if importlib.util.find_spec("pandas") is None:
        return
    import functools

    import pandas
    if getattr(pandas.read_parquet, "_wharf", False):
        return  # installed already
    read, write = pandas.read_parquet, pandas.DataFrame.to_parquet

    @functools.wraps(read)
    def read_parquet(path, *args, **kwargs):
        if _through_fsspec(path, kwargs):
            kwargs["storage_options"] = {}
        return read(path, *args, **kwargs)

    @functools.wraps(write)
    def to_parquet(self, path=None, *args, **kwargs):
        if _through_fsspec(path, kwargs):
            kwargs["storage_options"] = {}
        return write(self, path, *args, **kwargs)

    read_parquet._wharf = to_parquet._wharf = True
    pandas.read_parquet = read_parquet
    pandas.DataFrame.to_parquet = to_parquet


# The development tree has no entry point (an installed wheel registers "wharf" through
# fsspec.specs); importing this module registers it too.
fsspec.register_implementation("wharf", WharfFileSystem, clobber=True)


def _pump(src, dst, chunk, callback):
    """Copies src to dst through one reused buffer of `chunk` bytes, reporting progress."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    while n := src.readinto(buf):
        dst.write(view[:n])
        callback.relative_update(n)
