"""wharf.profile(): where the time of a data-loading run goes (docs/design/profiler.md).

    with wharf.profile() as p:
        for batch in p.iterate(loader):      # or just `loader`; see below
            step(batch)
    print(p.table())                         # stage, seconds, % of wall, count, mean, MB
    p.verdict                                # store-latency | bandwidth | client-cpu | parse | consumer
    p.trace                                  # the Chrome/Perfetto trace written at the end

The C++ layers record listing, budget waits, time to first byte, transfer, waiting for I/O
and record parsing (base/profiler.h); wharf.torch datasets add the transform; `iterate()`
adds the consumer's wait in next() and its own step between batches, and the collate_fn.
Without iterate(), a wharf.torch iterable dataset read in this process (num_workers=0)
measures the consumer itself. DataLoader workers (forked or spawned) profile themselves and
hand their numbers to this process when they end, so the table covers them.

WHARF_PROFILE=1 profiles the whole process and prints the table to stderr at exit.
"""
import atexit
import json
import multiprocessing.util
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Iterable, Iterator, Optional, Union

from wharf import _wharf

_STAGE = {name: i for i, name in enumerate(_wharf._profile_stages)}
TRANSFORM = _STAGE["transform"]
COLLATE = _STAGE["collate"]
CONSUMER_WAIT = _STAGE["consumer_wait"]
STEP = _STAGE["step"]

now = time.perf_counter_ns  # CLOCK_MONOTONIC, as the C++ side's events
record = _wharf._profile_record

# Set in the environment while a profile runs: "<pid>:<folder>". Processes started meanwhile
# (DataLoader workers) profile themselves and write their numbers into the folder at exit.
_SPOOL_ENV = "WHARF_PROFILE_SPOOL"


class _State:
    on = False        # a profile runs in this process: the Python stages record
    owner = False     # ... and this process started it (not a worker spooling to a parent)
    iterating = 0     # Profile.iterate() loops running: they measure the consumer


state = _State()


class Profile:
    """A profile of this process (and the workers it starts) from start() to stop()."""

    def __init__(self, trace: Union[None, bool, str] = None):
        # trace: a path, None for WHARF_PROFILE_TRACE or wharf-trace-<pid>.json, False for none.
        if trace is True:
            trace = None
        if not (trace is None or trace is False or isinstance(trace, (str, os.PathLike))):
            raise TypeError(f"wharf.profile(trace=...): a path, None (the default path) or "
                            f"False (no trace), not {trace!r}")
        self._trace_arg = os.fspath(trace) if isinstance(trace, os.PathLike) else trace
        self.trace: Optional[str] = None
        self.report: Optional[dict] = None
        self._table = ""
        self._spool: Optional[str] = None
        self._saved_env: Optional[str] = None

    def start(self) -> "Profile":
        if self._trace_arg is not False:
            # Said now, not after the work it profiles: a trace that cannot be written.
            path = self._trace_arg or _wharf._profile_trace_path()
            folder = os.path.dirname(os.path.abspath(path))
            if os.path.isdir(path) or not os.access(folder, os.W_OK | os.X_OK):
                why = "is a directory" if os.path.isdir(path) else f"cannot write in {folder}"
                raise ValueError(f"wharf.profile: the trace {path}: {why} (trace=False for none)")
        _wharf._profile_start()  # raises if one runs already
        self._spool = tempfile.mkdtemp(prefix=f"wharf-profile-{os.getpid()}-")
        self._saved_env = os.environ.get(_SPOOL_ENV)
        os.environ[_SPOOL_ENV] = f"{os.getpid()}:{self._spool}"
        state.on, state.owner = True, True
        return self

    def stop(self) -> "Profile":
        if self._spool is None:
            return self
        state.on, state.owner = False, False
        if self._saved_env is None:
            os.environ.pop(_SPOOL_ENV, None)
        else:
            os.environ[_SPOOL_ENV] = self._saved_env
        try:
            report, self._table = _wharf._profile_stop(self._spool)
        finally:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None
        self.report = json.loads(report)
        if self._trace_arg is not False:
            path = self._trace_arg or _wharf._profile_trace_path()
            _wharf._profile_trace(path)
            self.trace = os.path.abspath(path)
        return self

    def __enter__(self) -> "Profile":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- results (after stop) --

    def table(self) -> str:
        """Where the time went: a row per stage seen, and the verdict with its reason."""
        self._require()
        return self._table

    @property
    def verdict(self) -> str:
        """What bounds throughput: store-latency, bandwidth, client-cpu, parse or consumer."""
        return self._require()["verdict"]

    @property
    def reason(self) -> str:
        return self._require()["reason"]

    @property
    def stages(self) -> dict:
        """{stage id: {"label", "seconds", "count", "bytes"}} for every stage."""
        return self._require()["stages"]

    def _require(self) -> dict:
        if self.report is None:
            raise RuntimeError("the profile is still running: read it after the with block")
        return self.report

    # -- the consumer --

    def iterate(self, iterable: Iterable) -> Iterator[Any]:
        """Yields what `iterable` (a DataLoader) yields, recording the consumer's wait inside
        next() (the accelerator stall) and its step between two batches; a DataLoader's
        collate_fn is timed too (in its workers as well)."""
        collate = getattr(iterable, "collate_fn", None)
        wrapped = collate is not None and not isinstance(collate, ProfiledCollate)
        if wrapped:
            iterable.collate_fn = ProfiledCollate(collate)
        state.iterating += 1
        try:
            it = iter(iterable)
            while True:
                t0 = now()
                try:
                    item = next(it)
                except StopIteration:
                    return
                t1 = now()
                if state.on:
                    record(CONSUMER_WAIT, t0, t1)
                yield item
                if state.on:
                    record(STEP, t1, now())
        finally:
            state.iterating -= 1
            if wrapped:
                iterable.collate_fn = collate


class ProfiledCollate:
    """A collate_fn timed as the "collate" stage while a profile runs (picklable, for
    spawned DataLoader workers)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, batch):
        if not state.on:
            return self.fn(batch)
        t0 = now()
        out = self.fn(batch)
        record(COLLATE, t0, now())
        return out


def profile(trace: Union[None, bool, str] = None) -> Profile:
    """A profile of this process and the DataLoader workers it starts, as a context manager:
    `with wharf.profile() as p: ...`, then `p.table()`, `p.verdict`, `p.trace`. `trace`: where
    the Chrome/Perfetto trace goes (default WHARF_PROFILE_TRACE, else wharf-trace-<pid>.json
    in the working directory); False writes none."""
    return Profile(trace)


# ---- hooks for wharf.torch ----

def transform(fn, sample):
    """fn(sample), timed as the "transform" stage (call only while state.on)."""
    t0 = now()
    out = fn(sample)
    record(TRANSFORM, t0, now())
    return out


def consumer(gen: Iterator[Any]) -> Iterator[Any]:
    """Wraps a dataset's sample generator read in the profiling process: the time inside
    next() is the consumer's wait, the time between is its step. Left to Profile.iterate()
    when one runs."""
    if not (state.on and state.owner):
        yield from gen
        return
    t1 = None
    try:
        while True:
            t0 = now()
            if t1 is not None and state.on and not state.iterating:
                record(STEP, t1, t0)
            try:
                item = next(gen)
            except StopIteration:
                return
            t1 = now()
            if state.on and not state.iterating:
                record(CONSUMER_WAIT, t0, t1)
            yield item
    finally:
        gen.close()  # a consumer that stops early closes the dataset's generator now


# ---- processes started while a profile runs, and WHARF_PROFILE=1 ----

def _spool_at_exit(folder: str) -> None:
    try:
        _wharf._profile_spool(folder)
    except OSError:
        pass  # the parent stopped and removed the folder: nothing to hand over


def _start_in_child() -> None:
    value = os.environ.get(_SPOOL_ENV, "")
    owner, _, folder = value.partition(":")
    if not folder or owner == str(os.getpid()):
        if state.on and not state.owner:
            state.on = False  # a parent's profile, not ours (its env is gone)
        return
    _wharf._profile_start_in_child()
    state.on, state.owner = True, False
    multiprocessing.util.Finalize(None, _spool_at_exit, args=(folder,), exitpriority=0)


class _ForkHook:
    pass


_fork_hook = _ForkHook()


def _install() -> None:
    # A forked multiprocessing child runs the after-fork hooks after clearing the parent's
    # finalizers; a spawned one (or any process started while a profile runs) imports wharf
    # anew, and starts here.
    multiprocessing.util.register_after_fork(_fork_hook, lambda _h: _start_in_child())
    _start_in_child()
    if not _wharf._profile_requested():  # WHARF_PROFILE, read as the CLI reads it
        return
    owner = os.environ.get(_SPOOL_ENV, "").partition(":")[0]
    if owner and owner != str(os.getpid()):
        return  # a child of a profiled process: the after-fork hook spools it
    whole = Profile()
    try:
        whole.start()
    except ValueError as e:  # an import must not fail for its report: no trace then
        sys.stderr.write(f"wharf: {e}; profiling without it\n")
        whole = Profile(trace=False)
        whole.start()
    pid = os.getpid()

    def report() -> None:
        if os.getpid() != pid:
            return
        whole.stop()
        sys.stderr.write(whole.table())
        if whole.trace:
            sys.stderr.write(f"trace: {whole.trace}\n")

    atexit.register(report)


_install()
