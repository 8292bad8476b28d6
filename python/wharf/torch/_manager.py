"""wharf.torch.CheckpointManager: checkpoints of a training run, saved to the tier (async by
default), exported to the bucket in the background, kept by retention rules, restored by
latest / step / best / time (docs/design/checkpoint.md).

    mgr = CheckpointManager("/nvme/tier/run1", export_to="s3://bucket/run1",
                            keep_last=3, keep_best=1, metric="loss", mode="min")
    for step in ...:
        ...
        if step % 100 == 0:
            mgr.save(step, {"model": model, "optim": opt, "data": ds.state_dict(steps=step)},
                     metrics={"loss": loss})        # returns once the state is copied
    mgr.wait()
    state = mgr.restore("latest")                   # the dict given to save (tensors on CPU)
    mgr.restore("best", state={"model": model, "optim": opt})   # in place, any world size
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import fcntl
import json
import math
import operator
import os
import pickle
import random
import shutil
import socket
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from wharf import _wharf
from wharf.torch.checkpoint import StorageReader, StorageWriter, _StagingCache

__all__ = ["CheckpointManager", "SaveHandle"]

_OWN = "_wharf"  # the manager's entry in a saved state: step and RNG states
# Steps are directory names zero-padded to 12 digits (step-<N:012d>), which sort by name only
# while they have 12 digits.
_STEP_LIMIT = 10 ** 12


# The phases of saves, exports and restores in the runtime's metrics
# (wharf_checkpoint_phase_seconds{phase=...}, docs/design/metrics.md). Handles are looked up
# once per process (a forked child has a runtime of its own).
_PHASE_BOUNDS = [0.001 * 2 ** i for i in range(21)]  # 1 ms .. ~17 min
_phase_handles: dict = {}


@contextlib.contextmanager
def _phase(name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        key = (os.getpid(), name)
        h = _phase_handles.get(key)
        if h is None:
            h = _phase_handles[key] = _wharf._histogram(
                "wharf_checkpoint_phase_seconds",
                "Time of each phase of checkpoint saves, exports and restores",
                _PHASE_BOUNDS, [("phase", name)])
        h.observe(time.perf_counter() - start)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    if "python" in state:
        random.setstate(_as_tuple(state["python"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"].to(torch.uint8))
    if "numpy" in state:
        import numpy
        numpy.random.set_state(_as_tuple(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _cause(e: CheckpointException) -> BaseException:
    """The exception DCP wrapped (the lowest failing rank's), so that a save or load fails
    with wharf's own error (PermissionDeniedError, NotFoundError, ...) rather than DCP's
    CheckpointException, which is not even an Exception."""
    failures = getattr(e, "failures", None) or {}
    for rank in sorted(failures):
        failure = failures[rank]
        exc = failure[0] if isinstance(failure, tuple) and failure else failure
        if isinstance(exc, BaseException):
            return exc
    return e


def _dcp(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except CheckpointException as e:
        cause = _cause(e)
        if cause is e:
            raise
        raise cause from e


class _LoadPlanner(DefaultLoadPlanner):
    """DCP's planner, strict about the caller's keys (a key the checkpoint lacks raises), while
    the manager's own entry may be partly absent (the RNG states a checkpoint records depend
    on what the saving process had: numpy imported, CUDA initialized; a rank beyond the
    saving world size has none). `dropped` names the entries left out: DCP does not hand them
    back intact (an ndarray slot comes back None), so restore() must not apply them."""

    def create_local_plan(self):
        saved = self.metadata.state_dict_metadata
        self.dropped = [k for k in self.state_dict if k.startswith(_OWN + ".") and k not in saved]
        for fqn in self.dropped:
            del self.state_dict[fqn]
        return super().create_local_plan()

    def loaded(self, fqn: str) -> bool:
        """Whether the entry at `fqn` (or below it) came from the checkpoint."""
        return not any(d == fqn or d.startswith(fqn + ".") for d in getattr(self, "dropped", ()))


# A local root's checkpoint of a step saved again is written here first (as a root of its
# own), then swapped in once committed: until then the step's old checkpoint stays whole.
_REPLACING = ".replacing"
# In a local root: flocked by the saving run's rank 0 from its first save to close() (the
# kernel drops it when the process dies), naming the holder.
_WRITER_LOCK = ".writer.lock"


def _step_of(name: str) -> Optional[int]:
    digits = name[len("step-"):]
    return int(digits) if name.startswith("step-") and digits.isdigit() else None


def _exchange(a: str, b: str) -> bool:
    """Swaps two paths in one step (renameat2 RENAME_EXCHANGE); False where the system or the
    file system cannot (then the caller renames in two steps)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _give_optimizers_state(state: dict, reader) -> None:
    """DCP loads into the tensors the caller's state holds. An optimizer that has not stepped
    holds none, so the checkpoint's (Adam's moments, its step counts) would be left out without
    a word: such an optimizer first gets its state as DCP's own set_state_dict gives it (one
    step with zero gradients at learning rate 0, which the load then overwrites). One that
    still has none (its parameters hold gradients) is refused by name."""
    fresh = {k: v for k, v in state.items()
             if isinstance(v, torch.optim.Optimizer) and not v.state}
    if not fresh:
        return
    saved = reader.read_metadata().state_dict_metadata
    for k, opt in fresh.items():
        if not any(key.startswith(f"{k}.state.") for key in saved):
            continue  # the checkpoint holds no state for it either (a stateless optimizer)
        try:
            from torch.distributed.checkpoint.state_dict import _init_optim_state
            _init_optim_state(opt)
        except ImportError:  # pragma: no cover - torch without it
            pass
        if not opt.state:
            raise ValueError(
                f"state[{k!r}]: the checkpoint holds optimizer state, and this optimizer has "
                f"none to load it into (it has not stepped, and its parameters hold "
                f"gradients): call opt.zero_grad(set_to_none=True) first, or restore() "
                f"without state= and load it with opt.load_state_dict")


def _int_keyed(obj, path=(), out=None) -> list:
    """[[path, [int keys]], ...]: the dicts in `obj` with int keys (an optimizer's state:
    {param index: ...}), which DCP stores as strings; path as DCP walks it (str(key) in a
    dict, the index in a list)."""
    out = [] if out is None else out
    if isinstance(obj, Mapping):
        ints = [k for k in obj if type(k) is int]
        if ints:
            out.append([list(path), ints])
        for k, v in obj.items():
            _int_keyed(v, path + (str(k),), out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _int_keyed(v, path + (i,), out)
    return out


def _restore_int_keys(state: dict, int_keyed: list) -> None:
    """Puts back the int keys _int_keyed() recorded, deepest dicts first."""
    for path, ints in sorted(int_keyed, key=lambda e: -len(e[0])):
        parent, d = None, state
        try:
            for p in path:
                parent, d = d, d[p]
        except (KeyError, IndexError, TypeError):
            continue  # not loaded (a partial state)
        if not isinstance(d, dict):
            continue
        back = {str(k): k for k in ints}
        fixed = {back.get(k, k) if isinstance(k, str) else k: v for k, v in d.items()}
        if parent is None:
            state.clear()
            state.update(fixed)
        else:
            parent[path[-1]] = fixed


def _checked_step(step) -> int:
    """`step` as an int, refused (TypeError, ValueError) unless it is an integer (Python's,
    numpy's, a one-element integer tensor) in the layout's range. int() would turn 50.7 into
    step 50, and True into step 1."""
    if isinstance(step, bool) or getattr(step, "dtype", None) is torch.bool:
        raise TypeError(f"step must be an int, not {step!r}")
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an int, not {type(step).__name__} {step!r}") from None
    if not 0 <= step < _STEP_LIMIT:
        raise ValueError(f"step {step} is out of range: 0 <= step < 10**12 (step-<N:012d>)")
    return step


def _portable(e: Optional[BaseException]) -> Optional[BaseException]:
    """`e` if it survives pickling (to send it to the other ranks), else a WharfError of its
    text."""
    if e is None:
        return None
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return _wharf.WharfError(f"{type(e).__name__}: {e}")


def _metric_value(step: int, name, value) -> float:
    """A metric as a float; TypeError naming the metric and the step otherwise."""
    # float() would take "0.5" and True; a metric is a number (a tensor of one, numpy's).
    if isinstance(value, (str, bytes, bool)) or getattr(value, "dtype", None) is torch.bool:
        raise TypeError(f"checkpoint {step}: metric {name!r} must be a number, not {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"checkpoint {step}: metric {name!r} must be a number, not "
                        f"{value!r}") from None


def _as_tuple(v):
    # random.setstate wants tuples all the way down (DCP may hand lists back).
    if isinstance(v, list):
        return tuple(_as_tuple(x) for x in v)
    return v


def _by_metric(manifests: list, metric: str, mode: str) -> list:
    """The manifests that record `metric` as a finite number, best first (ties: the later
    step first). A NaN or infinite value ranks nowhere (a diverged run is never "best")."""
    sign = -1 if mode == "max" else 1
    return sorted((m for m in manifests
                   if metric in m["metrics"] and math.isfinite(m["metrics"][metric])),
                  key=lambda m: (sign * m["metrics"][metric], -m["step"]))


def _own_user_data(manifest: dict) -> dict:
    """The manager's entry in the manifest's user data ({} when it has none)."""
    try:
        own = json.loads(manifest.get("user_json") or "{}").get("wharf")
    except (ValueError, AttributeError):
        return {}  # someone else's user data
    return own if isinstance(own, dict) else {}


def _with_nonfinite(manifest: dict) -> dict:
    """The manifest with the NaN / infinite metrics its save recorded (as text, in the
    manager's user data: JSON has no NaN) back among its metrics, as floats."""
    try:
        user = json.loads(manifest.get("user_json") or "{}")
        extra = user.get("wharf", {}).get("nonfinite_metrics") or {}
        if not extra:
            return manifest
        metrics = dict(manifest.get("metrics") or {})
        metrics.update({str(k): float(v) for k, v in extra.items() if k not in metrics})
    except (ValueError, TypeError, AttributeError):
        return manifest  # someone else's user data: the finite metrics as they are
    return dict(manifest, metrics=metrics)


class SaveHandle:
    """One save: result() waits for it (its manifest written) and returns the manifest. A
    failure that result() raised (or exception() returned) is the caller's: the manager's
    wait() and close() do not raise it again."""

    def __init__(self, step: int, future: Future, observed=None):
        self.step = step
        self._future = future
        self._observed = observed  # called with the future once its failure was handed over

    def result(self, timeout: Optional[float] = None) -> dict:
        try:
            return self._future.result(timeout)
        except BaseException:
            self._handed_over()  # not a wait that timed out: the save is not done
            raise

    def done(self) -> bool:
        return self._future.done()

    def exception(self, timeout: Optional[float] = None):
        e = self._future.exception(timeout)
        if e is not None:
            self._handed_over()
        return e

    def _handed_over(self) -> None:
        if self._observed is not None and self._future.done():
            self._observed(self._future)

    def __repr__(self):
        return f"<wharf SaveHandle step={self.step} done={self.done()}>"


class _Stager:
    """The CPU copy an async save writes from, kept across saves (no allocation after the
    first; a state of another shape gets a fresh copy). One save at a time writes from it:
    stage() waits until the previous save's writes are done (release()) before copying into
    it, or the earlier checkpoint would get the later state's values."""

    def __init__(self):
        self._cache = _StagingCache()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()

    def stage(self, state_dict: dict) -> dict:
        with self._lock:
            self._idle.wait()  # the previous save may still be writing from the cache
            self._idle.clear()
            try:
                return self._cache.stage(state_dict)
            except BaseException:
                self._idle.set()
                raise

    def release(self) -> None:
        """The save that staged last has written its files: the cache may be reused."""
        self._idle.set()


class _Writer(StorageWriter):
    """The manager's StorageWriter: the coordinator clears the step's directory once every
    rank planned and before any writes (leftovers of a killed save of the same step, or an
    older checkpoint of it being replaced: its manifest goes first)."""

    def __init__(self, uri, clear, **kwargs):
        super().__init__(uri, **kwargs)
        self._clear = clear

    def prepare_global_plan(self, plans):
        self._clear()
        return super().prepare_global_plan(plans)


class CheckpointManager:
    """Checkpoints of one training run under `dir_or_uri` (a tier directory, a local directory
    or a bucket URI): `<root>/step-<N:012d>/`, each a DCP checkpoint (any world size restores
    it) committed by a manifest written last.

    export_to: a URI the selected checkpoints are exported to in the background (every
      `export_every`-th save; the tier copies then become evictable). A manager that starts
      resumes the exports of its root's checkpoints that a crash interrupted. Recorded in the
      root: a manager opened without it takes the recorded one (lists and restores from it
      too, as `wharf ckpt` does).
    keep_last / keep_best: retention, in both places, counting only complete checkpoints
      (and, in the bucket, completed exports): the `keep_last` latest and the `keep_best` best
      by `metric` (mode "min" or "max") are kept; None keeps all. keep_last is at least 1.
    metric / mode: what "best" ranks by. Recorded in the root (checkpoints.json, and in the
      export destination); a manager opened without them takes the recorded ones (else no
      metric, "min"), and never erases what the root records.
    async_save: save() returns once the state is copied to CPU memory (a staging copy kept
      across saves, so a save waits for the previous one's writes before copying); the write,
      the commit and retention run in the background. False: save() returns when the
      checkpoint is committed.
    record_rng: each rank's RNG states (python, numpy, torch, cuda) go into the checkpoint and
      restore() puts them back (restore_rng=False keeps the current ones).
    files_per_rank: files each rank writes (in parallel). Store options (endpoint=, ...) apply
      to both places. With torch.distributed initialized, every rank makes the same calls;
      rank 0 commits, applies retention and exports (it must see every rank's files: one node,
      or a tier on a shared file system). One run saves into a root at a time: in a local
      root (a directory, a tier, a shared file system) the first save takes the root's
      writer lock until close(), and a second manager's first save raises RuntimeError
      naming the holder (its checkpoints would be removed as abandoned by the other's
      retention); a bucket root has no such lock. Managers that only list and restore are
      fine.
    """

    def __init__(self, dir_or_uri, export_to: Optional[str] = None, *,
                 keep_last: Optional[int] = None, keep_best: Optional[int] = None,
                 metric: Optional[str] = None, mode: Optional[str] = None,
                 export_every: int = 1,
                 async_save: bool = True, record_rng: bool = True, files_per_rank: int = 4,
                 process_group=None, **store_options):
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        if keep_last is not None and (isinstance(keep_last, bool) or keep_last < 1):
            # 0 would delete each checkpoint as it commits, the last good one included.
            raise ValueError(f"keep_last must be at least 1 (None keeps all), not {keep_last!r}")
        if keep_best is not None and (isinstance(keep_best, bool) or keep_best < 0):
            raise ValueError(f"keep_best must be >= 0, not {keep_best!r}")
        if export_every < 1:
            raise ValueError("export_every must be at least 1")
        if not isinstance(dir_or_uri, (str, os.PathLike)) or not os.fspath(dir_or_uri):
            raise TypeError(f"CheckpointManager: dir_or_uri must be a directory path or a URI "
                            f"(str or os.PathLike), got {dir_or_uri!r}")
        self.root = _wharf.CheckpointRoot(os.fspath(dir_or_uri), **store_options)
        # What the root records (checkpoints.json): a manager opened without export_to=,
        # metric= or mode= (to restore, say) exports, lists and ranks as the run that saved
        # did (and as `wharf ckpt` does), and never erases the settings.
        try:
            recorded = self.root.read_config()
        except _wharf.WharfError:
            recorded = {"export_to": "", "metric": "", "mode": "min"}
        if export_to is None and recorded["export_to"]:
            export_to = recorded["export_to"]
        self.export_root = (_wharf.CheckpointRoot(str(export_to), **store_options)
                            if export_to else None)
        if metric is None and recorded["metric"]:
            metric = recorded["metric"]
            if mode is None:
                mode = recorded["mode"]
        elif mode is None:
            mode = recorded["mode"] if metric == recorded["metric"] else "min"
        if keep_best is not None and not metric:
            raise ValueError("keep_best needs metric= (the metric that ranks checkpoints)")
        self.keep_last, self.keep_best = keep_last, keep_best
        self.metric, self.mode = metric, mode
        self.export_every = export_every
        self.async_save = async_save
        self.record_rng = record_rng
        self.files_per_rank = files_per_rank
        self._store_options = store_options
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        if not self.distributed:
            # DCP warns on every single-process save and load; here that is the intent.
            warnings.filterwarnings("ignore", category=UserWarning,
                                    message=r"torch\.distributed is .*unavailable")
        # Checkpoint collectives run on a thread of their own: a group of their own keeps
        # them from interleaving with the training loop's.
        self._pg = process_group
        if self.distributed and self._pg is None and self.world_size > 1:
            self._pg = dist.new_group(backend="gloo")
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wharf-ckpt-save")
        self._exporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wharf-ckpt-export")
        self._stager = _Stager()
        self._warned_damaged = set()
        self._lock = threading.Lock()
        # Deletions (retention, abandoned saves and exports) run after each commit (the save
        # thread) and each export (the export thread): one at a time, or both would delete
        # the same step (a step retention deletes looks abandoned once its manifest is gone)
        # and one would fail.
        self._deleting = threading.Lock()
        self._pending: list[Future] = []
        self._handed: set[Future] = set()  # failed saves whose failure their caller got
        self._saving: list[tuple[int, Future]] = []  # (step, its save) for _check_order
        self._to_export: set[int] = set()  # selected, export not completed: kept on the tier
        self._queued: set[int] = set()  # exports submitted and not finished
        self._export_futures: dict[int, Future] = {}  # by step, while submitted
        self._saves = 0
        # Rank 0's flock on a local root (_WRITER_LOCK): a file object, so that a manager
        # dropped without close() releases it when it is collected.
        self._writer_file = None
        self._writer_checked = False
        self._highest: Optional[int] = None  # the highest step saved or found (rank 0)
        self._warned_lower = False
        self._closed = False
        self._recovered = False  # _recover() ran
        self.last_restored: Optional[dict] = None  # the manifest restore() loaded
        if self.rank == 0:
            config = {"export_to": (self.export_root.uri if self.export_root
                                    else recorded["export_to"]),
                      "metric": metric or "", "mode": mode}
            # The bucket records the metric too: restore --best there ranks the same way.
            for root, want in ((self.root, config),
                               (self.export_root, dict(config, export_to=""))):
                if root is None or (root is self.export_root and not metric):
                    continue
                try:
                    if root.read_config() != want:
                        root.write_config(**want)
                except _wharf.WharfError as e:
                    warnings.warn(f"wharf: could not record the checkpoint settings in "
                                  f"{root.uri}: {e}", stacklevel=2)
            # What a killed run left half-done, put right before anything is listed, and the
            # exports it did not finish; not while another run saves into the root (its own
            # work in progress is in there): then at this manager's first save, if it saves.
            probe = self._writer_lock_file() if self.root.local_dir else None
            if probe is not None or not self.root.local_dir:
                try:
                    self._recover()
                finally:
                    if probe is not None:
                        probe.close()

    # ---- saving ----
    def save(self, step: int, state: dict, metrics: Optional[dict] = None) -> SaveHandle:
        """Saves `state` (a dict: tensors, nn.Modules / optimizers or other objects with
        state_dict(), and picklable values) as checkpoint `step`. Async (the default): returns
        once the state is copied; the handle's result() waits for the commit."""
        if not isinstance(state, dict):
            raise TypeError("state must be a dict (as torch.distributed.checkpoint wants)")
        if _OWN in state:
            raise ValueError(f"the key {_OWN!r} is the manager's own")
        step = _checked_step(step)
        if self._closed:
            raise RuntimeError(f"CheckpointManager({self.root.uri!r}) is closed: no more saves")
        if not self._writer_checked:
            self._take_writer_lock()
        # What each rank does on its own before the save's collectives (checks, the state's
        # conversion, the async copy) either succeeds on every rank or fails the save on
        # every rank: one rank raising alone would leave the others in a collective it never
        # joins, pairing their save N with its save N+1 from then on.
        staged, error = None, None
        try:
            if self.rank == 0:
                self._check_order(step)
            if metrics is not None and not isinstance(metrics, dict):
                raise TypeError(f"checkpoint {step}: metrics must be a dict of numbers by name, "
                                f"not {type(metrics).__name__}")
            metrics = {str(k): _metric_value(step, k, v) for k, v in (metrics or {}).items()}
            nonfinite = sorted(k for k, v in metrics.items() if not math.isfinite(v))
            if nonfinite:
                warnings.warn(
                    f"wharf: checkpoint {step}: metric(s) "
                    f"{', '.join(f'{k}={metrics[k]}' for k in nonfinite)} not finite: recorded, "
                    f"but never ranked by keep_best or restore('best')", RuntimeWarning,
                    stacklevel=2)
            from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict
            to_save = dict(_stateful_to_state_dict(state))
            own = {"step": step}
            int_keyed = _int_keyed(to_save)
            if int_keyed:  # restore() without a state gives them back as they were
                own["int_keys"] = int_keyed
            if self.record_rng:
                own["rng"] = {f"rank{self.rank}": _rng_state()}
            to_save[_OWN] = own
            if self.async_save:
                with _phase("stage"):
                    staged = self._stager.stage(to_save)  # the only part the loop waits for
        except BaseException as e:
            error = e
        try:
            self._all_prepared(step, error)
        except BaseException:
            if staged is not None:
                self._stager.release()
            raise
        if self.async_save:
            try:
                future = self._saver.submit(self._save_now, step, staged, metrics,
                                            self._stager.release)
            except BaseException:
                self._stager.release()
                raise
        else:
            future = Future()
            try:
                future.set_result(self._save_now(step, to_save, metrics))
            except BaseException as e:
                # Raised here, to the caller: not again by wait() or close().
                future.set_exception(e)
                raise
        with self._lock:
            self._pending.append(future)
            if self.rank == 0:
                self._saving.append((step, future))
        return SaveHandle(step, future, self._handed_over)

    def _handed_over(self, future: Future) -> None:
        """A save's failure went to its caller (SaveHandle.result/exception)."""
        with self._lock:
            self._handed.add(future)

    def _all_prepared(self, step: int, error: Optional[BaseException]) -> None:
        """Raises `error` on this rank, and on every other rank an error naming the first
        rank that failed, when any rank failed to prepare save `step` (a collective)."""
        if not (self.distributed and self.world_size > 1 and self._pg is not None):
            if error is not None:
                raise error
            return
        mine = None if error is None else f"{type(error).__name__}: {error}"
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self._pg)
        if error is not None:
            raise error
        for rank, failed in enumerate(everyone):
            if failed is not None:
                raise _wharf.WharfError(
                    f"checkpoint {step}: rank {rank} failed to prepare its state ({failed}); "
                    f"no rank saved it")

    def _take_writer_lock(self) -> None:
        """At the first save: rank 0 takes the root's writer lock (a local root: an flock,
        which works across the nodes of a shared file system and which the kernel drops when
        the process dies), so that a second run saving into the same root fails at once
        instead of having its checkpoints removed as abandoned by the first's retention.
        Every rank raises the same error (a collective: save() is called by all ranks)."""
        error = None
        if self.rank == 0 and self.root.local_dir:
            f = self._writer_lock_file()
            if f is None:
                path = os.path.join(self.root.local_dir, _WRITER_LOCK)
                with open(path, "rb") as held:
                    holder = held.read(512).decode(errors="replace").strip()
                error = (f"checkpoint root {self.root.uri}: another CheckpointManager is saving "
                         f"into it ({holder or 'holder unknown'}); one run saves into a root "
                         f"at a time (each would remove the other's newer checkpoints as "
                         f"abandoned): close() the other, or save into a root of this run's own")
            else:
                self._writer_file = f
                holder = (f"pid {os.getpid()} on {socket.gethostname()} since "
                          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}")
                f.truncate(0)
                f.write(holder.encode())
                f.flush()
        if self.distributed and self.world_size > 1:
            box = [error]
            dist.broadcast_object_list(box, src=0, group=self._pg)
            error = box[0]
        if error is not None:
            raise RuntimeError(error)
        self._writer_checked = True
        if self.rank == 0 and not self._recovered:
            self._recover()  # another run was saving when this one started

    def _recover(self) -> None:
        """Rank 0, with no other run saving into the root: finishes what a killed manager left
        under .replacing and resumes the exports it did not finish."""
        self._recovered = True
        self._finish_replacements()
        if self.export_root is not None:
            self._resume_exports()

    def _writer_lock_file(self):
        """The root's writer lock file, flocked (exclusively, without waiting); None when
        another manager holds it."""
        path = os.path.join(self.root.local_dir, _WRITER_LOCK)
        os.makedirs(self.root.local_dir, exist_ok=True)
        f = open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), "r+b")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        return f

    def _release_writer_lock(self) -> None:
        f, self._writer_file = self._writer_file, None
        if f is not None:
            f.close()  # drops the flock
        self._writer_checked = False

    def _check_order(self, step: int) -> None:
        """Warns (once) when `step` is below the latest checkpoint: training resumed from an
        older one. Retention keeps the highest steps and restore("latest") picks the highest,
        so the abandoned run's checkpoints would win; they are the user's to remove."""
        if self._highest is None:
            found = -1
            for root in (self.root, self.export_root):
                try:
                    steps = ([m["step"] for m in root.list()["complete"]]
                             if root is not None else [])
                except _wharf.WharfError:
                    steps = []  # unreadable: the save reports it, restore() warns
                found = max([found] + steps)
            with self._lock:  # commits raise it meanwhile (_after_commit)
                self._highest = max(found, self._highest if self._highest is not None else -1)
        with self._lock:
            # Saves still running count too (a lower step while a higher one saves is the same
            # mistake); failed ones do not.
            self._saving = [(s, f) for s, f in self._saving if not f.done()]
            highest = max([self._highest] + [s for s, _ in self._saving])
        if step < highest and not self._warned_lower:
            self._warned_lower = True
            where = self.root.uri + (f" and {self.export_root.uri}" if self.export_root else "")
            warnings.warn(
                f"wharf: checkpoint {step} is below the latest one ({highest}): retention "
                f"counts steps and restore('latest') picks the highest, so the checkpoints of "
                f"the abandoned run above {step} win over this run's; remove them (wharf ckpt rm "
                f"URI --step N, in {where})", RuntimeWarning, stacklevel=3)

    # ---- a step saved again ----
    def _replacing_dir(self) -> str:
        return os.path.join(self.root.local_dir, _REPLACING)

    def _replacing_root(self, root=None):
        """<root>/.replacing/: where a save of a committed step is written first, and where
        an export that replaces the destination's other checkpoint of its step keeps that
        one until the export is committed."""
        root = root or self.root
        if root.is_local:
            return _wharf.CheckpointRoot(os.path.join(root.local_dir, _REPLACING),
                                         **self._store_options)
        return _wharf.CheckpointRoot(root.uri.rstrip("/") + f"/{_REPLACING}/",
                                     **self._store_options)

    @staticmethod
    def _same(a: Optional[dict], b: Optional[dict]) -> bool:
        """Whether two manifests (as list() and read() give them) are the same checkpoint."""
        return a is not None and b is not None and (
            json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True))

    @staticmethod
    def _manifest(root, step: int) -> Optional[dict]:
        """The manifest of `step` in `root`, or None where it has no complete checkpoint."""
        try:
            return root.read(step)
        except _wharf.NotFoundError:
            return None

    @staticmethod
    def _committed(root, step: int) -> bool:
        """Whether `root` holds a checkpoint of `step` (complete and readable: a damaged one
        has nothing worth keeping)."""
        try:
            root.read(step)
            return True
        except _wharf.WharfError:
            return False

    def _replaces(self, step: int) -> bool:
        """Whether this save of `step` replaces a committed checkpoint (rank 0 decides for
        every rank): then it is written under <root>/.replacing first and put in the step's
        place once committed there, so a save that fails or is killed leaves the old one."""
        replace = self.rank == 0 and self._committed(self.root, step)
        if self.distributed and self.world_size > 1:
            box = [replace]
            dist.broadcast_object_list(box, src=0, group=self._pg)
            replace = box[0]
        return replace

    def _swap_in(self, step: int, staging) -> None:
        """Puts the checkpoint of `step` committed in `staging` (<root>/.replacing) in the
        root's place, and removes the one it replaces. A local root: one atomic exchange
        where the file system has it, else two renames. A bucket: copied in (server-side; the
        old manifest goes first, the new one last), then removed from .replacing. A manager
        restarted after a kill in between finishes it (_finish_replacements)."""
        if not self.root.is_local:
            _wharf.copy_checkpoint(staging, self.root, step)
            staging.delete(step)
            return
        name = _wharf.CheckpointRoot.step_dir(step)
        staged = os.path.join(self._replacing_dir(), name)
        current = os.path.join(self.root.local_dir, name)
        if not os.path.isdir(staged):
            # Never move the checkpoint in place away for a replacement that is not there.
            raise RuntimeError(f"checkpoint {step}: its committed replacement {staged} is gone")
        if _exchange(staged, current):
            old = staged
        else:
            old = os.path.join(self._replacing_dir(), f"{name}.old")
            shutil.rmtree(old, ignore_errors=True)
            try:
                os.rename(current, old)
            except FileNotFoundError:
                pass  # retention (after an export) removed the old one meanwhile
            os.rename(staged, current)
        _fsync_dir(self.root.local_dir)
        shutil.rmtree(old, ignore_errors=True)

    def _finish_replacements(self) -> None:
        """What a killed manager left under .replacing (rank 0, at start): a committed
        replacement whose step has no checkpoint any more (killed in the middle of putting
        it in place) is put in place; everything else there (a save killed before its
        commit, the old half of a swap) is removed."""
        if self.export_root is not None:
            self._finish_copied_replacements(self.export_root)
        if not self.root.is_local:
            self._finish_copied_replacements(self.root)
            return
        if not os.path.isdir(self._replacing_dir()):
            return
        for name in sorted(os.listdir(self._replacing_dir())):
            path = os.path.join(self._replacing_dir(), name)
            current = os.path.join(self.root.local_dir, name)
            if (_step_of(name) is not None and os.path.exists(os.path.join(path, "manifest.json"))
                    and not os.path.exists(os.path.join(current, "manifest.json"))):
                shutil.rmtree(current, ignore_errors=True)
                os.rename(path, current)
                _fsync_dir(self.root.local_dir)
            else:
                shutil.rmtree(path, ignore_errors=True)

    def _finish_copied_replacements(self, root) -> None:
        """_finish_replacements where a checkpoint is put in place by a copy (a bucket, and
        any export destination): a committed checkpoint in <root>/.replacing whose step has
        none in `root` (a replacement, or the older checkpoint an export was replacing, killed
        before it was committed) is copied in; then .replacing is emptied."""
        try:
            staging = self._replacing_root(root)
            listing = staging.list()
            for m in listing["complete"]:
                if not self._committed(root, m["step"]):
                    _wharf.copy_checkpoint(staging, root, m["step"])
                staging.delete(m["step"])
            if listing["incomplete"]:
                staging.remove_abandoned(10 ** 12)
        except _wharf.NotFoundError:
            pass  # no bucket: nothing was left there (saves say what is wrong)
        except _wharf.WharfError as e:
            warnings.warn(f"wharf: finishing the replaced checkpoints in {root.uri}: {e}",
                          stacklevel=4)

    def _save_now(self, step: int, state: dict, metrics: dict, written=None) -> dict:
        # Whatever fails before the write ends frees the staged copy too: else the next
        # async save would wait for it forever.
        try:
            with self._lock:
                exporting = self._export_futures.get(step)
            if exporting is not None:
                # The same step saved again: its export reads the files this save replaces,
                # and the retention after it may remove them (decided below, after it).
                concurrent.futures.wait([exporting])
            replace = self._replaces(step)
            target = self._replacing_root() if replace else self.root

            def clear():  # on the coordinator, between planning and writing
                try:
                    target.delete(step)
                except _wharf.WharfError as e:  # the first request of the save: say so
                    raise type(e)(f"saving checkpoint {step}: {e}") from e

            uri = target.step_uri(step)
            writer = _Writer(uri, clear, files_per_rank=self.files_per_rank,
                             **self._store_options)
            with _phase("write"):
                _dcp(dcp.save, state, storage_writer=writer, process_group=self._pg)
        finally:
            if written is not None:
                written()  # the staged copy is free for the next save
        manifest, error, failure = None, None, None
        # Whether the export policy selects this save; the manifest records it, so that a
        # manager started after a crash resumes the export (_resume_exports).
        export = self.export_root is not None and (self._saves + 1) % self.export_every == 0
        if self.rank == 0:
            try:
                user = {"wharf": {"manager": 1, "rng": self.record_rng}}
                if export:
                    user["wharf"]["export"] = True
                # JSON has no NaN or infinity: those metrics go into the manager's user data
                # as text ("nan", "inf", "-inf"); list() gives them back as floats.
                finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
                if len(finite) < len(metrics):
                    user["wharf"]["nonfinite_metrics"] = {
                        k: repr(v) for k, v in metrics.items() if k not in finite}
                with _phase("commit"):
                    manifest = _with_nonfinite(target.commit(
                        step, finite, self.world_size, "dcp", json.dumps(user), writer.files))
                    if replace:
                        self._swap_in(step, target)
            except BaseException as e:  # every rank learns that the commit failed
                error, failure = f"{type(e).__name__}: {e}", e
        if self.distributed and self.world_size > 1:
            box = [(manifest, error)]
            dist.broadcast_object_list(box, src=0, group=self._pg)
            manifest, error = box[0]
        if failure is not None:
            raise failure  # rank 0: the error itself (PermissionDeniedError, ...)
        if error:
            raise _wharf.WharfError(f"saving checkpoint {uri}: {error}")
        if self.rank == 0:
            self._saves += 1
            self._after_commit(step, export)
        return manifest

    def _after_commit(self, step: int, export: bool) -> None:
        with self._lock:  # the latest committed step (a failed save never counts)
            self._highest = max(step, self._highest if self._highest is not None else -1)
        # What earlier killed saves left, then retention on the tier.
        try:
            with self._deleting:
                self.root.remove_abandoned(step)
        except _wharf.WharfError as e:
            warnings.warn(f"wharf: cleaning up abandoned saves in {self.root.uri}: {e}")
        if export:
            with self._lock:
                self._to_export.add(step)
        self._retain(self.root, protect=self._exporting())
        self._submit_exports()

    def _submit_exports(self) -> None:
        with self._lock:
            # Each selected step once; one whose export failed is submitted again now.
            for s in sorted(self._to_export - self._queued):
                self._queued.add(s)
                future = self._exporter.submit(self._export, s)
                self._export_futures[s] = future
                self._pending.append(future)

    def _resume_exports(self) -> None:
        """Queues the exports a crash interrupted (or that never ran): the checkpoints here
        whose save the export policy selected (their manifest says so) and that are not
        complete at the destination. They run in the background like any export, and until
        each completes retention keeps its checkpoint here."""
        try:
            here = self.root.list()["complete"]
        except _wharf.WharfError as e:
            warnings.warn(f"wharf: could not look for exports to {self.export_root.uri} to "
                          f"resume: {e}", RuntimeWarning, stacklevel=3)
            return
        try:
            there = self.export_root.list()["complete"]
        except _wharf.WharfError as e:
            # The bucket is out of reach: every checkpoint here selected for export is taken
            # as not exported, so retention keeps it until an export completes (tried after
            # the next save, as a failed export is); resuming without them would let
            # retention delete the checkpoints that were to become the durable copies.
            warnings.warn(f"wharf: could not list {self.export_root.uri} ({e}); the "
                          "checkpoints selected for export are kept here until their exports "
                          "complete", RuntimeWarning, stacklevel=3)
            there = None
        if self._highest is None and there is not None:  # the listings _check_order makes
            self._highest = max([-1] + [m["step"] for m in here + there])
        exported = {m["step"]: m for m in there or []}
        # A step there that is another checkpoint (this step saved again, its export not
        # completed) is exported again.
        selected = {m["step"] for m in here if _own_user_data(m).get("export")
                    and not self._same(m, exported.get(m["step"]))}
        with self._lock:
            self._to_export |= selected
        if there is not None:
            self._submit_exports()

    def _exporting(self) -> set:
        with self._lock:
            return set(self._to_export)

    def _export(self, step: int) -> dict:
        try:
            with _phase("export"):
                summary = self._copy_out(step)
        finally:
            with self._lock:
                self._queued.discard(step)
                self._export_futures.pop(step, None)
        with self._lock:
            self._to_export.discard(step)
            # Exports of this manager still to run (a failed one is retried after the next
            # save) keep what they left: nothing at or above the lowest of them is touched.
            below = min([step] + [s for s in self._to_export | self._queued])
        try:
            # What exports killed earlier left at the destination: incomplete step directories
            # and multipart uploads below the step just exported (exports run one at a time,
            # in step order, so none of this manager's is in progress below it).
            with self._deleting:
                self.export_root.remove_abandoned(below)
        except _wharf.WharfError as e:
            warnings.warn(f"wharf: cleaning up abandoned exports in {self.export_root.uri}: {e}")
        self._retain(self.export_root, protect=set())
        self._retain(self.root, protect=self._exporting())
        return summary

    def _copy_out(self, step: int) -> dict:
        """Copies checkpoint `step` to the export destination. One of this step there that is
        another checkpoint (the step saved again) stops existing while the copy runs (its
        manifest goes first), so it is first copied to <export>/.replacing and copied back
        if the export fails; a manager started after a kill in between puts it back
        (_finish_replacements) and exports again (_resume_exports)."""
        there = self._manifest(self.export_root, step)
        if there is None or self._same(there, self.root.read(step)):
            return _wharf.copy_checkpoint(self.root, self.export_root, step, exported=True)
        kept = self._replacing_root(self.export_root)
        _wharf.copy_checkpoint(self.export_root, kept, step)
        try:
            summary = _wharf.copy_checkpoint(self.root, self.export_root, step, exported=True)
        except BaseException:
            try:
                if not self._committed(self.export_root, step):
                    _wharf.copy_checkpoint(kept, self.export_root, step)
                kept.delete(step)
            except _wharf.WharfError as e:
                warnings.warn(f"wharf: putting back the older checkpoint {step} in "
                              f"{self.export_root.uri} after its export failed: {e} (the next "
                              f"manager started there puts it back)", RuntimeWarning)
            raise
        kept.delete(step)
        return summary

    def _retain(self, root, protect: set) -> None:
        if self.keep_last is None and self.keep_best is None:
            return
        with self._deleting:
            complete = root.list()["complete"]
            keep = set(protect)
            by_step = sorted(complete, key=lambda m: m["step"])
            if self.keep_last is not None:
                keep.update(m["step"] for m in by_step[max(0, len(by_step) - self.keep_last):])
            else:
                keep.update(m["step"] for m in by_step)
            if self.keep_best:
                ranked = _by_metric(by_step, self.metric, self.mode)
                keep.update(m["step"] for m in ranked[:self.keep_best])
            for m in by_step:
                if m["step"] not in keep:
                    root.delete(m["step"])

    def wait(self) -> None:
        """Waits for every pending save and export; raises the first failure that no save's
        handle handed over already (SaveHandle.result, or save() itself when synchronous)."""
        first = None
        while True:
            with self._lock:
                pending, self._pending = self._pending, []
            if not pending:
                break
            for f in pending:
                try:
                    f.result()
                except BaseException as e:
                    with self._lock:
                        handed = f in self._handed
                        self._handed.discard(f)
                    if not handed:
                        first = first or e
        if first is not None:
            raise first

    def _settle(self) -> None:
        """Waits for every pending save and export, as wait() does, without raising their
        failures: they stay pending for wait() and close()."""
        while True:
            with self._lock:
                running = [f for f in self._pending if not f.done()]
            if not running:
                return
            # A save that commits queues its export before it is done: the loop sees it.
            concurrent.futures.wait(running)

    def close(self) -> None:
        """wait(), then stops the background threads."""
        self._closed = True
        try:
            self.wait()
        finally:
            self._saver.shutdown(wait=True)
            self._exporter.shutdown(wait=True)
            self._release_writer_lock()
            self._stager = _Stager()  # the staging copy of the state goes too

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        # The block's own exception is the one to see: a save's failure found while closing
        # becomes a warning, not a replacement for it.
        try:
            self.close()
        except Exception as e:
            warnings.warn(f"CheckpointManager({self.root.uri!r}) closed after an exception: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)

    # ---- listing and restoring ----
    def list(self) -> list[dict]:
        """Complete checkpoints by step: manifest fields plus `where` ("tier", "bucket" or
        "both"; "tier" also names a local directory)."""
        return self._listing()[0]

    def _listing(self) -> tuple[list, set]:
        """(list(), the steps complete in the root itself). `where` alone does not say the
        latter when the root is a bucket too ("bucket" for both roots)."""
        listing = self.root.list()
        self._warn_damaged(self.root, listing)
        in_root = {m["step"]: m for m in listing["complete"]}
        partial = {}  # step: why, for local copies that lack files of their manifest
        if self.export_root is not None and self.root.is_local:
            # An exported tier copy is evictable: eviction may have taken some of its files
            # and left its manifest; a plain folder's copy may have been damaged (a file
            # removed or cut short). Such a copy is not complete here; the bucket's is, and
            # restore() copies it back over the local one.
            for step in list(in_root):
                try:
                    self.root.files(step)
                except _wharf.WharfError as e:
                    partial[step] = str(e)
                    del in_root[step]
        here = {s: dict(_with_nonfinite(m), where="tier" if self.root.is_local else "bucket")
                for s, m in in_root.items()}
        if self.export_root is not None:
            try:
                exported = self.export_root.list()
            except _wharf.WharfError as e:
                # A manifest newer than this wharf stops the listing, as in the root itself.
                if not self.root.is_local or "newer than this wharf" in str(e):
                    raise
                # The tier's own checkpoints stay usable when the bucket cannot be read.
                warnings.warn(f"wharf: the checkpoints exported to {self.export_root.uri} are left "
                              f"out: {e}", RuntimeWarning, stacklevel=3)
                exported = {"complete": [], "damaged": []}
            self._warn_damaged(self.export_root, exported)
            for m in exported["complete"]:
                if m["step"] in here:
                    here[m["step"]]["where"] = "both"
                else:
                    here[m["step"]] = dict(_with_nonfinite(m), where="bucket")
        # Partly evicted and not in the bucket either: damaged, left out as such. In a plain
        # folder (nothing evicts there) a damaged copy is news even when the bucket has one.
        self._warn_damaged(self.root, {"damaged": [
            (step, why if step not in here else f"{why} (the copy at {self.export_root.uri} is "
                                                "used instead)")
            for step, why in partial.items() if step not in here or not self.root.in_tier]})
        return [here[s] for s in sorted(here)], set(in_root)

    def _warn_damaged(self, root, listing: dict) -> None:
        """One warning per step directory whose manifest is not one (once per manager)."""
        for step, why in listing.get("damaged", ()):
            if (root.uri, step) in self._warned_damaged:
                continue
            self._warned_damaged.add((root.uri, step))
            warnings.warn(f"wharf: step {step} is left out: {why}", RuntimeWarning,
                          stacklevel=4)

    def restore(self, which: Union[str, int, datetime.datetime] = "latest",
                state: Optional[dict] = None, *, restore_rng: bool = True) -> Any:
        """Loads a checkpoint: "latest", a step (int), "best" (by the manager's metric), or a
        datetime (the latest committed at or before it). Without `state`, returns the state
        that was saved (tensors on CPU; modules and optimizers as their state_dicts). With
        `state`, loads into it and returns it: modules and optimizers in place through DCP
        (any world size; an optimizer that has not stepped gets its state first, as DCP's
        set_state_dict gives it), other stateful objects (datasets, schedulers) through their
        load_state_dict with the state they saved, plain values replaced (a nested dict
        must have the saved one's keys, as DCP loads by them). Reads from the tier
        when the checkpoint is there, else copies it from the bucket into the tier first.
        Pending saves and exports are waited for first; their failures are left to their
        handles and to wait() (what they did not write is not listed)."""
        self._settle()
        chosen, in_root = self._choose(which)
        step = chosen["step"]
        if not in_root and self.export_root is not None:
            if self.rank == 0:
                with _phase("restore_copy"):
                    _wharf.copy_checkpoint(self.export_root, self.root, step)
            if self._pg is not None:
                dist.barrier(group=self._pg)
        manifest = {k: v for k, v in chosen.items() if k != "where"}
        # Pinned to the files as they are here (checked against the manifest): a file replaced
        # during the load fails it instead of mixing versions.
        etags = {f["path"]: f["etag"] for f in self.root.files(step) if f["etag"]}
        reader = StorageReader(self.root.step_uri(step), etags=etags, **self._store_options)
        user = json.loads(manifest.get("user_json") or "{}")
        own_saved = bool(user.get("wharf", {}).get("manager"))
        if state is None:
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
            with _phase("load"):
                loaded = _dcp(_load_state_dict_from_keys, storage_reader=reader,
                              process_group=self._pg)
            own = loaded.pop(_OWN, {}) if own_saved else {}
            _restore_int_keys(loaded, (own or {}).get("int_keys") or [])
            self._restore_rng(own, restore_rng)
            self.last_restored = manifest
            return loaded
        if not isinstance(state, dict):
            raise TypeError("state must be a dict")
        from torch.distributed.checkpoint.stateful import Stateful
        _give_optimizers_state(state, reader)
        # Modules and optimizers load in place, into the tensors they hold; other stateful
        # objects (datasets, schedulers) get the state they saved through load_state_dict,
        # whatever the shape of their state now (a fresh dataset's has None where the saved
        # one has its position).
        as_saved = [k for k, v in state.items() if isinstance(v, Stateful)
                    and not isinstance(v, (torch.nn.Module, torch.optim.Optimizer))]
        to_load = {k: v for k, v in state.items() if k not in as_saved}
        if own_saved and restore_rng and self.record_rng:
            to_load[_OWN] = {"step": 0, "rng": {f"rank{self.rank}": _rng_state()}}
        planner = _LoadPlanner()
        with _phase("load"):
            _dcp(dcp.load, to_load, storage_reader=reader, planner=planner,
                 process_group=self._pg)
        if as_saved:
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
            reader = StorageReader(self.root.step_uri(step), etags=etags, **self._store_options)
            with _phase("load"):
                saved = _dcp(_load_state_dict_from_keys,
                             keys=set(as_saved) | ({_OWN} if own_saved else set()),
                             storage_reader=reader, process_group=self._pg)
            # Their int keys back, as restore() without a state gives them.
            own = saved.pop(_OWN, None) or {}
            _restore_int_keys(saved, own.get("int_keys") or [])
            for k in as_saved:
                if k not in saved:
                    raise RuntimeError(f"Missing key in checkpoint state_dict: {k} (step {step} "
                                       f"has no state saved for it)")
                state[k].load_state_dict(saved[k])
        for k in state:
            if not isinstance(state[k], Stateful):
                state[k] = to_load[k]
        if _OWN in to_load:
            # Only the RNG states the checkpoint holds for this rank: what it lacks (a rank
            # beyond the saving world size, numpy not imported by the saver) keeps its own.
            mine = f"rank{self.rank}"
            rng = (to_load[_OWN].get("rng") or {}).get(mine) or {}
            rng = {kind: v for kind, v in rng.items()
                   if planner.loaded(f"{_OWN}.rng.{mine}.{kind}")}
            self._restore_rng({"rng": {mine: rng}}, restore_rng)
        self.last_restored = manifest
        return state

    def _restore_rng(self, own: dict, restore_rng: bool) -> None:
        if not restore_rng:
            return
        rng = (own or {}).get("rng", {}).get(f"rank{self.rank}")
        if rng:
            _set_rng_state(rng)

    def _choose(self, which) -> tuple[dict, bool]:
        """(the entry of list() `which` selects, whether the root itself holds it). With
        several ranks, rank 0's choice for all: ranks listing at different moments could see
        different checkpoints (a save, an eviction, or rank 0's own import from the bucket in
        between) and then disagree on the step or on waiting for the import."""
        error = None
        try:
            complete, in_root = self._listing()
            chosen = self._select(complete, which)
            choice = (chosen, chosen["step"] in in_root)
        except Exception as e:
            choice, error = None, e
        if self._pg is None or self.world_size <= 1:
            if error is not None:
                raise error
            return choice
        box = [(choice, _portable(error))]
        dist.broadcast_object_list(box, src=0, group=self._pg)
        if self.rank == 0 and error is not None:
            raise error
        choice, error0 = box[0]
        if error0 is not None:
            raise error0
        return choice

    def _select(self, complete: list, which) -> dict:
        if not isinstance(which, (str, datetime.datetime)):
            try:  # a step as save() takes it: an int, numpy's, a one-element integer tensor
                which = _checked_step(which)
            except TypeError:
                raise TypeError("which must be 'latest', 'best', a step or a datetime, not "
                                f"{type(which).__name__} {which!r}") from None
        if isinstance(which, str) and which not in ("latest", "best"):
            raise ValueError(f"which must be 'latest', 'best', a step or a datetime, "
                             f"not {which!r}")
        if which == "best" and not self.metric:
            raise ValueError("restore('best') needs the manager's metric=")
        if not complete:
            raise _wharf.NotFoundError(f"no complete checkpoint in {self.root.uri}" + (
                f" or {self.export_root.uri}" if self.export_root else ""))
        if isinstance(which, int):
            for m in complete:
                if m["step"] == which:
                    return m
            raise _wharf.NotFoundError(f"no complete checkpoint of step {which} in "
                                       f"{self.root.uri}" + (f" or {self.export_root.uri}"
                                                             if self.export_root else ""))
        if isinstance(which, datetime.datetime):
            # A datetime holds microseconds: a checkpoint's own time (a float of seconds)
            # given back as one may round below it.
            t = which.timestamp() + 1e-6
            before = [m for m in complete if m["time"] <= t]
            if not before:
                raise _wharf.NotFoundError(f"no checkpoint committed at or before {which}")
            return max(before, key=lambda m: m["step"])
        if which == "latest":
            return complete[-1]
        if which == "best":
            ranked = _by_metric(complete, self.metric, self.mode)
            if not ranked:
                if any(self.metric in m["metrics"] for m in complete):
                    raise _wharf.NotFoundError(
                        f"checkpoints record the metric {self.metric!r}, but no value of it is "
                        f"finite (NaN and infinity rank nowhere)")
                raise _wharf.NotFoundError(f"no checkpoint records the metric {self.metric!r}")
            return ranked[0]
