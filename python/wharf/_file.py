"""wharf.open: binary file objects over any wharf URI (docs/design/python.md, "File objects").

The engine does the work (python/file.cc): "rb" reads through an ObjectReader (ranged GETs
with parallel read-ahead, pinned to the ETag seen at open), "wb" streams the store's writer
(S3: a multipart upload with parts in flight). This class gives them io's shape, so anything
that takes a binary file (torch.save / torch.load, io.TextIOWrapper, zipfile, tarfile, pickle)
takes them.

A "wb" or "xb" file commits on close() only: leaving its `with` block by an exception, abort(), or
being garbage-collected unclosed drops the upload, and nothing appears. So does a close() that
a wrapper's `with` makes while an exception unwinds (io.TextIOWrapper, fsspec's OpenFile,
pandas' handles, contextlib.closing and ExitStack close what they wrap on the way out of their
block, as on success), and a close() by a wrapper that is garbage-collected unclosed
(io.TextIOWrapper, io.BufferedWriter: their finalizers close what they wrap); a close() of
one's own always commits.
"""
import dis
import inspect
import io
import os
import sys
import warnings

from wharf import _wharf

_CLOSED = "I/O operation on closed file."
_WITH_EXCEPT_START = dis.opmap.get("WITH_EXCEPT_START")


# Modules whose Python __exit__ closes what it wraps, exception or not: fsspec's OpenFile,
# pandas' IOHandles, the standard library's file wrappers and context managers.
_WRAPPER_MODULES = ("fsspec", "pandas", "gzip", "bz2", "lzma", "zipfile", "tarfile", "codecs",
                    "_compression", "_pyio", "io", "contextlib")


def _exit_exception(frame):
    """The exception an __exit__ frame received: __exit__(self, type, value, tb) or
    __exit__(self, *exc_info) (contextlib's); None for a normal exit."""
    code = frame.f_code
    args = frame.f_locals
    if code.co_argcount >= 3:
        return args.get(code.co_varnames[2])
    if code.co_flags & inspect.CO_VARARGS:
        rest = args.get(code.co_varnames[code.co_argcount + code.co_kwonlyargcount], ())
        if isinstance(rest, tuple) and len(rest) >= 2:
            return rest[1]
    return None


def _unwinding(exc_at_open):
    """Whether close() is a wrapper's `with` exit while an exception raised since the file was
    opened unwinds: past the `close` methods that called it (the wrappers' chain), the caller
    is a `with` statement's own exit of a C wrapper (io.TextIOWrapper; the frame is at
    WITH_EXCEPT_START) or the __exit__ of a known wrapper module that received an exception. A
    close() of one's own (in an `except` clause, a `finally`, one's own __exit__) commits, as it
    says, and so does a wrapper's __exit__ on a normal exit (inside an `except` clause too)."""
    exc = sys.exc_info()[1]
    if exc is None or exc is exc_at_open:
        return False
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_name == "close"
                                 or frame.f_globals.get("__name__") in ("wharf._file",
                                                                       "wharf.fsspec")):
        frame = frame.f_back
    if frame is None:
        return False
    if frame.f_code.co_name == "__exit__":
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in _WRAPPER_MODULES:
            return False
        received = _exit_exception(frame)
        return received is not None and received is not exc_at_open
    lasti = frame.f_lasti
    return (_WITH_EXCEPT_START is not None and 0 <= lasti < len(frame.f_code.co_code)
            and frame.f_code.co_code[lasti] == _WITH_EXCEPT_START)


class ObjectFile(io.BufferedIOBase):
    """A binary file of one object; made by wharf.open(uri, "rb" | "wb" | "xb").

    "xb" creates the object only if the key holds none when the file is closed, decided by
    the store atomically (S3 If-None-Match: *, GCS ifGenerationMatch=0, a non-replacing
    rename on file://); close() raises wharf.AlreadyExistsError (a FileExistsError) otherwise
    and nothing is written."""

    _raw = None  # until opened: __del__ and closed work on a file whose open raised
    _write_error = None  # the first failed write's exception
    _exc_at_open = None  # the exception being handled as it opened
    _dropped = False  # a wrapper of it was garbage-collected unclosed (_dealloc_warn)

    def __init__(self, uri, mode="rb", *, chunk_size=0, read_ahead=-1, access="auto",
                 **store_options):
        if mode not in ("rb", "wb", "xb"):
            raise ValueError(f"invalid mode {mode!r} for wharf.open (use 'rb', 'wb' or 'xb')")
        if access not in ("auto", "sequential"):
            raise ValueError(f"invalid access {access!r} for wharf.open "
                             "(use 'auto' or 'sequential')")
        # A URI or a path; str() of anything else (a file object) would name a local file.
        if isinstance(uri, os.PathLike):
            uri = os.fspath(uri)
        if not isinstance(uri, str):
            raise TypeError(f"wharf.open: expected a URI or a path, not {type(uri).__name__}")
        if mode != "rb":
            reading = [name for name, value, default in (("chunk_size", chunk_size, 0),
                                                          ("read_ahead", read_ahead, -1),
                                                          ("access", access, "auto"))
                       if value != default]
            if reading:
                raise ValueError(f"wharf.open({uri!r}, {mode!r}): {', '.join(reading)} "
                                 f"{'is' if len(reading) == 1 else 'are'} for reading ('rb'); "
                                 "a write streams parts of the store's part size")
        self._uri = uri
        self._mode = mode
        if mode == "rb":
            self._raw = _wharf._ObjectReadFile(self._uri, chunk_size, read_ahead,
                                               access == "auto", **store_options)
        else:
            # An exception being handled as the file opens (one writes an error report in an
            # `except` clause) is not one that interrupted its writing.
            # Held (not its id(), which a later exception may reuse) until the file closes.
            self._exc_at_open = sys.exc_info()[1]
            self._raw = _wharf._ObjectWriteFile(self._uri, exclusive=mode == "xb",
                                                **store_options)

    # ---- what it is ----
    @property
    def name(self):
        return self._uri

    @property
    def mode(self):
        return self._mode

    @property
    def closed(self):
        return self._raw is None or self._raw.closed

    @property
    def size(self):
        """The object's size ("rb": as the GET at open saw it)."""
        self._check_open()
        return self._raw.size if self._mode == "rb" else self._raw.tell()

    def readable(self):
        self._check_open()
        return self._mode == "rb"

    def writable(self):
        self._check_open()
        return self._mode != "rb"

    def seekable(self):
        self._check_open()
        return self._mode == "rb"

    def __repr__(self):
        return f"<wharf.ObjectFile name={self._uri!r} mode={self._mode!r}>"

    # ---- reading ----
    def read(self, size=-1):
        return self._reader().read(-1 if size is None else size, False)

    def read1(self, size=-1):
        return self._reader().read(-1 if size is None else size, True)

    def readinto(self, b):
        return self._reader().readinto(b, False)

    def readinto1(self, b):
        return self._reader().readinto(b, True)

    def peek(self, size=0):
        """Bytes from the position on (at least one unless at the end), without moving it."""
        return self._reader().peek()

    def stats(self):
        """"rb": the reader's GETs so far: requests, bytes_fetched, bytes_direct (fetched
        straight into readinto's buffer), peak_buffered_bytes, chunk_size, read_ahead (the
        most: access="auto" ramps up to them), jumps (seeks away from what was requested)."""
        return self._reader().stats()

    def seek(self, offset, whence=io.SEEK_SET):
        if self._mode != "rb":
            self._check_open()
            raise io.UnsupportedOperation(f"seek: a {self._mode!r} file is written sequentially")
        return self._reader().seek(offset, whence)

    def tell(self):
        self._check_open()
        return self._raw.tell()

    # ---- writing ----
    def write(self, b):
        if self._mode == "rb":
            self._check_open()
            raise io.UnsupportedOperation("write: file opened for reading")
        self._check_open()
        try:
            return self._raw.write(b)
        except BaseException as e:
            # Kept for writers that turn it into an error of their own (torch's zip writer
            # raises "unexpected pos"): wharf.torch.save raises this one instead.
            self._write_error = e
            raise

    def flush(self):
        self._check_open()  # bytes go up as parts fill; the object appears at close()

    # ---- ending ----
    def close(self):
        """"rb": releases the read-ahead. "wb", "xb": commit the object (it appears now, whole;
        "xb" raises AlreadyExistsError, writing nothing, when the key holds an object).
        Called by a wrapper's `with` exit while an exception unwinds (a TextIOWrapper's, a
        GzipFile's, pandas'), it aborts instead: a failed write never leaves part of an
        object."""
        if self.closed:
            return
        if self._interrupted():
            self.abort()
            return
        self._exc_at_open = None
        self._raw.close()  # a writer's failure aborts the upload and raises

    def abort(self):
        """"wb", "xb": drops the upload; nothing appears. "rb": the same as close()."""
        self._exc_at_open = None
        if self._raw is None or self._raw.closed:
            return
        if self._mode != "rb":
            self._raw.abort()
        else:
            self._raw.close()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()  # never commit what an exception interrupted
        else:
            self.close()

    def __del__(self):
        if self._raw is None or self._raw.closed:
            return
        if self._mode != "rb":
            warnings.warn(f"wharf.open({self._uri!r}, {self._mode!r}) was garbage-collected without "
                          "close(): the upload is aborted, nothing was written",
                          ResourceWarning, stacklevel=2)
        self.abort()

    def _dealloc_warn(self, source):
        # io's C wrappers (TextIOWrapper, BufferedWriter) call this on what they wrap when they
        # are garbage-collected unclosed, right before closing it: that close must not commit.
        if self._mode != "rb" and not self.closed:
            self._dropped = True
            warnings.warn(f"{type(source).__name__} over wharf.open({self._uri!r}, "
                          f"{self._mode!r}) was garbage-collected without close(): the upload "
                          "is aborted, nothing was written", ResourceWarning, stacklevel=2)

    # ---- copies ----
    def __reduce__(self):
        # copy.copy, copy.deepcopy and pickle all come here. A copy would share the upload or
        # the read-ahead (the copy's finalizer ended the original's). wharf.fsspec's files
        # override this: they reopen at their position, as fsspec's files pickle.
        raise TypeError(f"a wharf.open({self._uri!r}) file cannot be copied or pickled: open "
                        f"the object again (by its URI) where it is read")

    # ---- helpers ----
    def _interrupted(self):
        """A writer whose close() is a wrapper's `with` exit while an exception unwinds, or the
        finalizer of a wrapper dropped unclosed."""
        return self._mode != "rb" and (self._dropped or _unwinding(self._exc_at_open))

    def _check_open(self):
        if self.closed:
            raise ValueError(_CLOSED)

    def _reader(self):
        self._check_open()
        if self._mode != "rb":
            raise io.UnsupportedOperation("read: file opened for writing")
        return self._raw


def open(uri, mode="rb", **store_options):
    """Opens one object as a binary file: mode "rb", "wb" or "xb".

    "rb" reads with parallel read-ahead and seeks anywhere; every read is pinned to the
    object's ETag at open, so an overwrite meanwhile is an error (WharfError), never a mix of
    versions. A missing object raises NotFoundError (a FileNotFoundError).
    "wb" streams the bytes as a multipart upload; the object appears atomically at close(),
    and never if the `with` block raises or the file is dropped unclosed.
    "xb" is "wb" that creates only: close() raises AlreadyExistsError (a FileExistsError) and
    writes nothing when the key holds an object by then, decided by the store atomically
    (S3 If-None-Match: *, GCS ifGenerationMatch=0, a non-replacing rename on file://). Above
    one part, the S3 writer also checks the key before its upload starts and before it
    completes (Ceph RGW before Squid ignores the condition on a multipart completion).
    Store options are wharf.Store's (endpoint=, region=, cache=, ...); chunk_size= and
    read_ahead= tune "rb" (default: from the store's link estimate). access="auto" (the
    default) sizes the read-ahead from how the file is read: it starts small after opening and
    after every seek away, doubles while reading goes on sequentially up to chunk_size and
    read_ahead chunks, and a read of known size right after a seek fetches exactly those bytes
    (Parquet, zip and torch.load seek; pandas.read_csv streams). access="sequential" keeps
    read_ahead chunks of chunk_size in flight from the first byte.
    """
    return ObjectFile(uri, mode, **store_options)
