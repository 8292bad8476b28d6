"""PyTorch Distributed Checkpoint (DCP) on any wharf URI, and the CheckpointManager.

    import torch.distributed.checkpoint as dcp
    from wharf.torch.checkpoint import StorageWriter, StorageReader

    dcp.save(state_dict, storage_writer=StorageWriter("s3://bucket/ckpt/step-100"))
    dcp.load(state_dict, storage_reader=StorageReader("s3://bucket/ckpt/step-100"))
    fut = dcp.async_save(state_dict, storage_writer=StorageWriter("/nvme/tier/ckpt/step-100"))

URIs are s3://, gs://, file:// or local paths; a path inside a tier writes tier entries that
stay `local` (never evicted) until exported (docs/design/checkpoint.md).

Layout, as DCP's own FileSystemWriter: each rank writes its own files `__<rank>_<i>.distcp`
(`files_per_rank` of them, balanced by size), the coordinator writes `.metadata` (pickled DCP
Metadata) last. The difference is inside the files: a tensor is its raw bytes, not a
torch.save archive, so a save hands the tensors' memory to the engine (parallel multipart
uploads, no staging copy) and a load reads each tensor's bytes straight into the destination
tensor's storage. Each item's storage info is DCP's `_StorageInfo` with the transform
descriptor "wharf.raw/1" (DCP's FileSystemReader refuses it by name rather than misreading it).
StorageReader also reads checkpoints written by FileSystemWriter (or s3torchconnector's
S3StorageWriter, which writes the same files) from any wharf URI: items without the descriptor
are torch.load-ed as DCP does.

Loads sort each rank's read items by file and offset, coalesce neighbours into one ranged GET
and fetch them concurrently (checkpoint/io.h ReadRanges); resharding works as DCP defines it
(a read item is a box of a saved chunk: a box contiguous in the chunk's bytes is read as one
range, straight into the destination when it is a contiguous CPU tensor of the saved dtype;
otherwise the covering byte window is read and copied out).
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import uuid
from typing import Any, Optional, Sequence

import torch
from torch.futures import Future
from torch.distributed.checkpoint import staging as _staging
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StorageReaderTransforms
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner)
from torch.distributed.checkpoint.storage import StorageReader as _StorageReader
from torch.distributed.checkpoint.storage import StorageWriter as _StorageWriter
from torch.distributed.checkpoint.storage import WriteResult

from wharf import _wharf

__all__ = ["StorageWriter", "StorageReader", "CheckpointManager", "RAW_DESCRIPTOR"]

RAW_DESCRIPTOR = "wharf.raw/1"
_METADATA = ".metadata"
_SUFFIX = ".distcp"
DCP_VERSION = "1.0.0"
# Tensors on an accelerator are copied to host memory to be written (and read through it into
# them), through pinned buffers of this size: a rank's device state larger than that is written
# and read in waves (a tensor larger than a wave gets a buffer of its own size), so host memory
# stays bounded whatever the state's size.
_DEVICE_WAVE_BYTES = 256 << 20


@dataclasses.dataclass
class _Prefix:
    """A rank's file name prefix ("__<rank>_"), DCP's _StoragePrefix under another name."""
    prefix: str


def _uri_of(checkpoint_id) -> str:
    return os.fspath(checkpoint_id) if isinstance(checkpoint_id, os.PathLike) else str(checkpoint_id)


def _region(data) -> tuple[Any, int, Any]:
    """(memory for _wharf, nbytes, object to keep alive) of a resolved write item."""
    if isinstance(data, io.BytesIO):
        view = data.getbuffer()
        return view, view.nbytes, data
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"DCP resolved a write item to {type(data).__name__}, not a tensor")
    t = data.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    # A conjugate or negative view's memory holds the values before the lazy op: materialize
    # it (no copy when the bits are not set), as torch.save does.
    t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    return (t.data_ptr(), nbytes), nbytes, t


def _waves(sizes: list[int], limit: int, align: int = 1) -> list[tuple[list, int]]:
    """Items cut, in order, into waves of at most `limit` bytes (an item larger than that is a
    wave of its own): [([(item index, offset in the wave), ...], wave bytes), ...], each offset
    a multiple of `align`. Items of size 0 ride along with the wave they fall in."""
    waves, cur, used = [], [], 0
    for i, size in enumerate(sizes):
        n = -(-size // align) * align
        if cur and n and used + n > limit:
            waves.append((cur, used))
            cur, used = [], 0
        cur.append((i, used))
        used += n
    waves.append((cur, used))
    return waves


def _balance(items: list, sizes: list[int], bins: int) -> list[list[int]]:
    """Indices of `items` in `bins` bins of about equal bytes (largest first), in item order."""
    bins = max(1, min(bins, len(items)))
    load = [0] * bins
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(range(len(items)), key=lambda i: -sizes[i]):
        b = min(range(bins), key=load.__getitem__)
        out[b].append(i)
        load[b] += sizes[i]
    return [sorted(b) for b in out if b]


class _Located:
    """What the writer and the reader share: the checkpoint's URI (DCP's checkpoint_id),
    the store options, and the root opened on first use (reopened after pickling)."""

    def _locate(self, uri, store_options: dict) -> None:
        self.uri = _uri_of(uri)
        self._store_options = store_options
        self._root = None

    @property
    def root(self):
        if self._root is None:
            self._root = _wharf.CheckpointRoot(self.uri, **self._store_options)
        return self._root

    @property
    def checkpoint_id(self) -> str:
        return self.uri

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        try:
            _wharf.CheckpointRoot(_uri_of(checkpoint_id))
            return True
        except Exception:
            return False

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_root"] = None  # reopened where it is used
        return state


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor  # torch >= 2.5
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:  # pragma: no cover - torch without DTensor
            return None
    return DTensor


_DTENSOR = _dtensor_type()


def _layout(obj) -> Any:
    """What a staged copy of `obj` must share with it to be reused for it: the structure
    (container types, keys in order, lengths) and each tensor's type, shape, dtype and layout
    (a DTensor's mesh, placements and local shape too). None for what cannot be compared (a
    ShardedTensor): such a state is staged afresh every time."""
    if isinstance(obj, torch.Tensor):
        if _DTENSOR is not None and isinstance(obj, _DTENSOR):
            return ("dtensor", tuple(obj.shape), obj.dtype, id(obj.device_mesh),
                    tuple(obj.placements), tuple(obj.to_local().shape))
        if type(obj).__name__ == "ShardedTensor":
            return None
        return ("tensor", type(obj), tuple(obj.shape), obj.dtype, obj.layout)
    if isinstance(obj, dict):
        items = []
        for key, value in obj.items():
            inner = _layout(value)
            if inner is None:
                return None
            items.append((key, inner))
        return ("dict", tuple(items))
    if isinstance(obj, (list, tuple)):
        inner = tuple(_layout(v) for v in obj)
        if any(v is None for v in inner):
            return None
        return (type(obj).__name__, inner)
    return "value"  # not a tensor: staged as the object itself, never copied into


class _StagingCache:
    """The CPU copy an async save stages into, reused while the state keeps its layout
    (_layout); a state whose structure, shapes or dtypes changed gets a fresh copy, so a
    staged state is always exactly what was passed (copying into the old buffers would
    broadcast a new shape into the old one, or convert a new dtype to the old one)."""

    def __init__(self):
        self._cache = None
        self._layout = None

    def stage(self, state_dict: dict) -> dict:
        from torch.distributed._state_dict_utils import _copy_state_dict
        layout = _layout(state_dict)
        if self._cache is not None and layout is not None and layout == self._layout:
            try:
                return _copy_state_dict(state_dict, self._cache, type_check=False)
            except (ValueError, RuntimeError, KeyError, TypeError, AttributeError):
                pass  # something the layout does not capture: staged afresh below
        self._cache = None  # freed before the new copy is made
        self._cache = _fresh_copy(state_dict)
        self._layout = layout
        return _copy_state_dict(state_dict, self._cache, type_check=False)


def _fresh_copy(state_dict: dict) -> dict:
    from torch.distributed._state_dict_utils import _create_cpu_state_dict
    return _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())


class StorageWriter(_Located, _StorageWriter, _staging.BlockingAsyncStager):
    """DCP StorageWriter on any wharf URI (the checkpoint's directory).

    files_per_rank: files each rank writes, written in parallel (each as parallel parts);
    default 4. A rank's tensors on an accelerator (CUDA) go through pinned host buffers: more
    than 256 MiB of them are written in waves of `files_per_rank` files each, two waves at a
    time, so a save holds at most two waves in host memory. overwrite: replace a checkpoint
    already at the URI (as DCP's FileSystemWriter, default True). cache_staged_state_dict: dcp.async_save keeps the CPU copy it stages into
    across saves (faster staging, one copy of the state held). Store options (endpoint=,
    region=, ...) as wharf.Store's.
    """

    def __init__(self, uri, *, files_per_rank: int = 4, overwrite: bool = True,
                 cache_staged_state_dict: bool = False, max_files_in_flight: int = 0,
                 **store_options):
        _StorageWriter.__init__(self)
        _staging.BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if files_per_rank < 1:
            raise ValueError("files_per_rank must be at least 1")
        self.files_per_rank = files_per_rank
        self.overwrite = overwrite
        self.max_files_in_flight = max_files_in_flight
        self._locate(uri, store_options)
        self.save_id = uuid.uuid4().hex
        self.rank: Optional[int] = None
        self.is_coordinator = False
        self.use_collectives = True
        # After finish() on the coordinator: file name -> bytes the save wrote into it.
        self.files: dict[str, int] = {}

    # ---- DCP's StorageWriter ----
    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self._locate(checkpoint_id, self._store_options)
        self.save_id = uuid.uuid4().hex
        self.files = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if not self.overwrite and self.root.exists(self._metadata_name()):
            raise RuntimeError(f"a checkpoint exists at {self.uri} and overwrite=False")
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=_Prefix(f"__{self.rank}_"))
            self._drop_old_metadata()
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Overwriting: the old .metadata goes before any rank writes (DCP scatters this plan
        # only after it returns), so a save that dies midway leaves no checkpoint rather
        # than the old metadata over a mix of old and new files.
        self._drop_old_metadata()
        # What killed saves to this folder left (temporary files of dead writers, multipart
        # uploads of its files) goes before this save's writers start; a live writer's stays.
        try:
            self.root.remove_leftovers()
        except PermissionError:
            pass  # credentials that may write but not list or abort uploads
        return [dataclasses.replace(p, storage_data=_Prefix(f"__{i}_"))
                if p.storage_data is None else p for i, p in enumerate(plans)]

    # Tests set this to stage CPU tensors too (the device path without a device).
    _stage_all = False
    _wave_bytes = _DEVICE_WAVE_BYTES

    def _on_device(self, data) -> bool:
        return isinstance(data, torch.Tensor) and (data.device.type != "cpu" or self._stage_all)

    def _files(self, prefix: str, first: int, items: list, sizes: list, regions: list,
               results: list) -> list:
        """The files of `items` (balanced over files_per_rank, numbered from `first`); appends
        their WriteResults."""
        files = []
        for n, members in enumerate(_balance(items, sizes, self.files_per_rank)):
            name = f"{prefix}{first + n}{_SUFFIX}"
            offset = 0
            for i in members:
                results.append(WriteResult(
                    index=items[i].index, size_in_bytes=sizes[i],
                    storage_data=_StorageInfo(name, offset, sizes[i],
                                              transform_descriptors=[RAW_DESCRIPTOR])))
                offset += sizes[i]
            files.append((name, [regions[i] for i in members]))
        return files

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Writes the rank's items as files of raw bytes. Tensors on an accelerator are copied
        into a pinned buffer first (asynchronously, then synchronized), in waves of at most
        `_wave_bytes` (a tensor larger than that alone): each wave is written as files of its
        own while the next is copied into a second buffer. A state in CPU memory is one wave
        written straight from its tensors' memory."""
        from concurrent.futures import ThreadPoolExecutor
        prefix = plan.storage_data.prefix
        items = plan.items
        datas = [planner.resolve_data(item) for item in items]
        staged = [self._on_device(d) for d in datas]
        waves = _waves([d.numel() * d.element_size() if on else 0
                        for d, on in zip(datas, staged)], self._wave_bytes)
        size = max(used for _, used in waves)
        buffers: list = []
        results: list = []
        writes: list = []
        kept: list = []  # what _region made (contiguous copies) lives until written
        future: Future = Future()
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="wharf-ckpt-wave")
        # The writes run on the pool's threads, where Ctrl-C does not reach: a failure or an
        # interrupt here cancels them (their requests and uploads aborted), so the shutdown
        # below does not wait for the rest of the save, or a dead server, to finish them.
        cancel = _wharf.CancelScope()
        try:
            first = 0
            for k, (wave, _) in enumerate(waves):
                if k >= 2:
                    writes[k - 2].result()  # its buffer is free again
                if size and len(buffers) <= k % 2:
                    buffers.append(torch.empty(size, dtype=torch.uint8,
                                               pin_memory=torch.cuda.is_available()))
                regions, sizes, devices = [], [], set()
                for i, at in wave:
                    if not staged[i]:
                        memory, nbytes, owner = _region(datas[i])
                        kept.append(owner)
                    else:
                        buf = buffers[k % 2]
                        t = datas[i].detach().resolve_conj().resolve_neg()
                        nbytes = t.numel() * t.element_size()
                        if nbytes:
                            buf[at:at + nbytes].copy_(
                                t.contiguous().reshape(-1).view(torch.uint8),
                                non_blocking=t.device.type == "cuda")
                            devices.add(t.device)
                        memory = (buf.data_ptr() + at, nbytes)
                    regions.append(memory)
                    sizes.append(nbytes)
                for dev in devices:
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                files = self._files(prefix, first, [items[i] for i, _ in wave], sizes, regions,
                                    results)
                first += len(files)
                # GIL released inside write_files.
                writes.append(pool.submit(self.root.write_files, files, self.max_files_in_flight,
                                          cancel))
            for w in writes:
                w.result()
            future.set_result(results)
        except BaseException as e:
            cancel.cancel()
            for w in writes:
                w.cancel()
            if not isinstance(e, Exception):
                raise  # Ctrl-C: as itself (a torch Future takes Exceptions only)
            future.set_exception(e)  # the future carries it to DCP
        finally:
            pool.shutdown(wait=True)  # no write still reads a buffer when they are freed
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage = {}
        files: dict[str, int] = {}
        for per_rank in results:
            for r in per_rank:
                storage[r.index] = r.storage_data
                info = r.storage_data
                files[info.relative_path] = max(files.get(info.relative_path, 0),
                                                info.offset + info.length)
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        metadata.version = DCP_VERSION
        data = pickle.dumps(metadata)
        # One atomic put, after every rank's files (DCP calls finish once they all wrote).
        self.root.put_object(self._metadata_name(), data)
        files[self._metadata_name()] = len(data)
        self.files = files

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.uri, save_id=self.save_id)

    # ---- staging for dcp.async_save ----
    def stage(self, state_dict):
        """A CPU copy of state_dict (dcp.async_save writes it while training goes on)."""
        if not self.cache_staged_state_dict:
            from torch.distributed._state_dict_utils import _copy_state_dict
            return _copy_state_dict(state_dict, _fresh_copy(state_dict), type_check=False)
        if self.state_dict_cache is None:
            self.state_dict_cache = _StagingCache()
        return self.state_dict_cache.stage(state_dict)

    def _drop_old_metadata(self) -> None:
        """Deletes the metadata of a checkpoint this save overwrites (deleting a missing one
        succeeds). Credentials that may write but not delete (a first save needs no delete)
        skip it."""
        try:
            self.root.delete_object(self._metadata_name())
        except PermissionError:
            pass

    def _metadata_name(self) -> str:
        if not self.use_collectives and self.rank is not None:
            return f"__{self.rank}{_METADATA}"
        return _METADATA


def _contiguous_box(offsets: Sequence[int], lengths: Sequence[int], sizes: Sequence[int]) -> bool:
    """Whether a box of a C-contiguous chunk is one run of its bytes."""
    # Leading dims of length 1, then one dim cut anywhere, then full dims.
    k = 0
    while k < len(lengths) and lengths[k] == 1:
        k += 1
    return all(lengths[j] == sizes[j] for j in range(k + 1, len(sizes)))


def _unquote_etag(etag: str) -> str:
    etag = str(etag)
    if len(etag) >= 2 and etag[0] == '"' and etag[-1] == '"':
        return etag[1:-1]
    return etag


def _flat(offsets: Sequence[int], sizes: Sequence[int]) -> int:
    flat = 0
    for o, s in zip(offsets, sizes):
        flat = flat * s + o
    return flat


class StorageReader(_Located, _StorageReader):
    """DCP StorageReader on any wharf URI (the checkpoint's directory).

    Reads checkpoints written by wharf's StorageWriter (raw tensor bytes, straight into the
    destination tensors) and by DCP's FileSystemWriter / s3torchconnector (torch.save items).
    max_in_flight: GETs at once (0: the runtime's setting, else 64). etags: file -> ETag to pin
    every read to (the CheckpointManager passes those the step's files list with where it
    reads them), so a file overwritten during a load fails instead of mixing versions. Store
    options as wharf.Store's.
    """

    def __init__(self, uri, *, max_in_flight: int = 0, etags: Optional[dict] = None,
                 **store_options):
        super().__init__()
        self._locate(uri, store_options)
        self.max_in_flight = max_in_flight
        # ETags as the store reports them (unquoted); accept the quoted form S3 clients
        # (boto3, the HTTP header) show, which would otherwise never match.
        self.etags = {k: _unquote_etag(v) for k, v in (etags or {}).items()}
        self.storage_data: dict = {}
        self.metadata: Optional[Metadata] = None
        self.load_id = uuid.uuid4().hex
        self.transforms = _StorageReaderTransforms()
        self.stats: dict = {}

    def reset(self, checkpoint_id=None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self._locate(checkpoint_id, self._store_options)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        name = _METADATA if rank is None else f"__{rank}{_METADATA}"
        data = self.root.read_object(name)
        if data is None:
            if not self.root.is_local:
                # read_object() says None for a missing bucket as for a missing object: a
                # listing tells them apart (NoSuchBucket names the bucket and the endpoint).
                try:
                    self.root.list()
                except _wharf.NotFoundError as e:
                    raise _wharf.NotFoundError(f"reading {self.uri.rstrip('/')}/{name}: {e}") \
                        from None
            raise FileNotFoundError(
                f"{self.uri.rstrip('/')}/{name}: no such checkpoint (DCP writes its metadata "
                f"last: a save that did not finish has none)")
        try:
            metadata = pickle.loads(data)
        except Exception as e:
            raise _wharf.DataLossError(
                f"{self.uri.rstrip('/')}/{name}: the checkpoint's metadata is damaged "
                f"({type(e).__name__}: {e})") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args,
                              **kwargs) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"{self.uri}: the checkpoint's metadata has no storage data")
        self.metadata = metadata
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    # Tests set this to stage CPU destinations too (the device path without a device).
    _stage_all = False
    _wave_bytes = _DEVICE_WAVE_BYTES

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        ranges, after, staged = [], [], []
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            etag = self.etags.get(info.relative_path, "")
            descriptors = list(getattr(info, "transform_descriptors", None) or ())
            raw = descriptors == [RAW_DESCRIPTOR]
            if req.type == LoadItemType.BYTE_IO or not raw:
                buf = bytearray(info.length)
                ranges.append((info.relative_path, info.offset, info.length, buf, etag))
                after.append((self._finish_stream, req, buf, descriptors))
                continue
            chunk = self._chunk(req)
            dtype = self.metadata.state_dict_metadata[req.storage_index.fqn].properties.dtype
            elt = torch._utils._element_size(dtype)
            target = planner.resolve_tensor(req).detach()
            sizes, offsets, lengths = list(chunk.sizes), list(req.storage_offsets), list(req.lengths)
            first = _flat(offsets, sizes)
            count = math.prod(lengths)
            if count == 0:
                after.append((self._commit, req, target, None))
                continue
            last = _flat([o + n - 1 for o, n in zip(offsets, lengths)], sizes)
            if not target.is_cpu or self._stage_all:
                # Into an accelerator: through pinned buffers, in waves (_read_waves).
                staged.append((req, info, etag, dtype, first, last, target,
                               lengths, [math.prod(sizes[j + 1:]) for j in range(len(sizes))]))
                continue
            if (_contiguous_box(offsets, lengths, sizes)
                    and target.is_contiguous() and target.dtype == dtype
                    and not target.is_conj() and not target.is_neg()):
                ranges.append((info.relative_path, info.offset + first * elt, count * elt,
                               (target.data_ptr(), count * elt), etag))
                after.append((self._commit, req, target, None))
                continue
            # The byte window from the box's first element to its last, then the box's view.
            window = torch.empty(last - first + 1, dtype=dtype)
            ranges.append((info.relative_path, info.offset + first * elt, window.numel() * elt,
                           (window.data_ptr(), window.numel() * elt), etag))
            strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]
            view = window.as_strided(lengths, strides, 0)
            after.append((self._commit, req, target, view))
        future: Future = Future()
        try:
            self.stats = self.root.read_ranges(ranges, self.max_in_flight)  # GIL released
            for fn, *args in after:
                fn(planner, *args)
            if staged:
                self._read_waves(planner, staged)
            future.set_result(None)
        except Exception as e:  # Ctrl-C (a BaseException) is raised as itself
            future.set_exception(e)
        return future

    def _read_waves(self, planner, staged: list) -> None:
        """Items whose destinations are on an accelerator: their byte windows are read into
        pinned buffers, wave by wave (at most `_wave_bytes` each; an item larger than that
        alone), up to four waves in flight; as a wave is in, its boxes are copied to their
        destinations asynchronously and the buffer is read into again once the device has
        copied out of it. Host memory: the buffers, whatever the state's size."""
        from concurrent.futures import ThreadPoolExecutor
        # Offsets aligned for any dtype's view of the buffer.
        waves = [([(staged[i], at) for i, at in wave], used) for wave, used in _waves(
            [(last - first + 1) * torch._utils._element_size(dtype)
             for _req, _info, _etag, dtype, first, last, *_ in staged],
            self._wave_bytes, align=64)]
        size = max(used for _, used in waves)
        cuda = torch.cuda.is_available() and any(not e[6].is_cpu for e in staged)
        buffers = [torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
                   for _ in range(min(4, len(waves)))]

        def read(k, after):
            if after is not None:
                after.synchronize()  # the device has copied this buffer's last wave out
            buf = buffers[k % len(buffers)]
            ranges = []
            for (_req, info, etag, dtype, first, last, *_), at in waves[k][0]:
                elt = torch._utils._element_size(dtype)
                n = (last - first + 1) * elt
                ranges.append((info.relative_path, info.offset + first * elt, n,
                               (buf.data_ptr() + at, n), etag))
            return self.root.read_ranges(ranges, self.max_in_flight)

        pool = ThreadPoolExecutor(max_workers=len(buffers), thread_name_prefix="wharf-ckpt-wave")
        pending = {k: pool.submit(read, k, None) for k in range(len(buffers))}
        devices = set()
        try:
            for k, (wave, _) in enumerate(waves):
                stats = pending.pop(k).result()
                for key in ("ranges", "requests", "bytes", "bytes_fetched"):
                    if key in stats:
                        self.stats[key] = self.stats.get(key, 0) + stats[key]
                buf = buffers[k % len(buffers)]
                for (req, _info, _etag, dtype, first, last, target, lengths, strides), at in wave:
                    n = (last - first + 1) * torch._utils._element_size(dtype)
                    window = buf[at:at + n].view(dtype)
                    view = window.as_strided(lengths, strides, window.storage_offset())
                    target.copy_(view, non_blocking=target.device.type == "cuda")
                    if target.device.type == "cuda":
                        devices.add(target.device)
                    planner.commit_tensor(req, target)
                after = None
                if cuda:
                    after = torch.cuda.Event()
                    after.record()
                if k + len(buffers) < len(waves):
                    pending[k + len(buffers)] = pool.submit(read, k + len(buffers), after)
        finally:
            pool.shutdown(wait=True)  # after an error: the reads still in flight end
            for dev in devices:  # the copies out of the buffers are done before they go
                torch.cuda.synchronize(dev)

    # ---- helpers ----
    def _chunk(self, req):
        md = self.metadata.state_dict_metadata[req.storage_index.fqn]
        if not isinstance(md, TensorStorageMetadata):
            raise ValueError(f"{self.uri}: {req.storage_index.fqn} is not a tensor")
        hint = req.storage_index.index
        if hint is not None and hint < len(md.chunks) and \
                list(md.chunks[hint].offsets) == list(req.storage_index.offset):
            return md.chunks[hint]
        for c in md.chunks:
            if list(c.offsets) == list(req.storage_index.offset):
                return c
        raise ValueError(f"{self.uri}: no saved chunk of {req.storage_index.fqn} at "
                         f"{list(req.storage_index.offset)}")

    @staticmethod
    def _commit(planner, req, target, view):
        if view is not None:
            target.copy_(view)
        planner.commit_tensor(req, target)

    def _finish_stream(self, planner, req, buf, descriptors):
        stream = io.BytesIO(buf)
        if descriptors and descriptors != [RAW_DESCRIPTOR]:
            stream = io.BytesIO(self.transforms.transform_load_stream(req, descriptors,
                                                                      stream).read())
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, stream)
            return
        from torch.distributed._shard._utils import narrow_tensor_by_index
        tensor = torch.load(stream, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise ValueError(f"{self.uri}: {req.storage_index.fqn}: saved {tuple(tensor.size())}"
                             f", loading into {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(req, target)


def __getattr__(name):
    if name == "CheckpointManager":
        from wharf.torch._manager import CheckpointManager
        return CheckpointManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
