"""PyTorch datasets over wharf: samples straight from object storage, zero-copy.

    from wharf.torch import DistributedSampler, MapDataset, IterableDataset

    # Map-style: one object per sample; a DataLoader batch is ONE engine batch (__getitems__).
    # wharf's DistributedSampler (torch's works too) adds the global order and resume.
    ds = MapDataset.from_prefix("s3://bucket/train/", transform=decode)
    loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds), num_workers=8)

    # Iterable: wharf's global order (the same for any world size), resumable mid-epoch.
    ds = IterableDataset.from_prefix("s3://bucket/train/", seed=0, batch_size_hint=64)
    loader = DataLoader(ds, batch_size=64, num_workers=8)
    for epoch in range(start_epoch, epochs):
        ds.set_epoch(epoch)
        for step, batch in enumerate(loader): ...
            ckpt["data"] = ds.state_dict(steps=step + 1)   # the same on every rank

    # Record shards: tar (WebDataset), tfrecord, csv, jsonl. Exact resume per worker through
    # torchdata's StatefulDataLoader (or ds.state_dict() with num_workers=0).
    ds = IterableDataset.from_shards("s3://bucket/shards/", format="tar", shuffle_buffer=1000)
    loader = StatefulDataLoader(ds, batch_size=64, num_workers=8)
    ...  ckpt["loader"] = loader.state_dict()

    # torch.save / torch.load to and from any wharf URI, streamed (wharf.open): the same bytes
    # as torch.save into a file; the object appears whole at the end, never half-written.
    wharf.torch.save({"model": model.state_dict()}, "s3://bucket/ckpt/model.pt")
    state = wharf.torch.load("s3://bucket/ckpt/model.pt", map_location="cpu")

Every sample is a `Sample` with `.key` and `.data`: a `wharf.Buffer` sharing the engine's
memory (numpy.frombuffer / torch.frombuffer / memoryview read it without a copy; it is
read-only, so torch warns that the tensor is not writable; copy before writing). For tar
shards `.data` is a dict extension -> Buffer (and `sample["jpg"]` works). `transform=` is
called on each Sample in the process that reads it (a DataLoader worker) and its result is
what the dataset yields.

Processes. `import wharf` never imports torch; this module does. The datasets hold only
configuration and the index (keys, sizes, ETags): they pickle without engine state, and every
process (DataLoader workers started by fork or spawn) creates its own engine objects on first
use. Rank and world size come from torch.distributed when it is initialized, else from the
RANK / WORLD_SIZE environment variables, else 0 / 1 (or pass rank= and world_size=). Worker
id and count come from torch.utils.data.get_worker_info().

Resume (IterableDataset over samples). The order is a property of (seed, epoch) only; ranks
take interleaved shares (global position p goes to rank p % world_size), so what all ranks
consumed is always a prefix of the epoch's sequence and a checkpoint is one integer, the global
cursor `consumed`. When every rank checkpoints after the same number of steps (synchronous
data parallelism), each computes the same value locally:

    consumed = start + steps * batch_size * world_size     (wharf._wharf.consumed_after)

where `start` is the cursor the epoch started or resumed from. `state_dict(steps=...)` does
exactly this; `state_dict()` without steps uses the samples this process yielded (exact with
num_workers=0; with DataLoader workers, pass steps, since workers yield in other processes).
`load_state_dict()` with any world size then yields exactly the positions not yet consumed,
re-dealt over the new ranks. Values past the end of the epoch (the padded tail) mean the epoch
is complete. DistributedSampler (map-style) keeps the same cursor. Inside a DataLoader worker,
state_dict() without steps is that worker's own position, which is what torchdata's
StatefulDataLoader collects; it resumes the same world size and worker count.

Resume (RecordDataset): exact, per (rank, worker) share; see RecordDataset.
"""
from __future__ import annotations

import json
import operator
import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import torch
import torch.utils.data

from wharf import _profile, _wharf
from wharf.torch import _ahead
from wharf.torch._args import _callable_or_none, _check_int, _check_state
from wharf.torch._ahead import ReadAheadSampler
from wharf._file import ObjectFile
from wharf._runtime import split_budget_for_worker

if TYPE_CHECKING:
    from wharf.torch._rows import RowDataset
    from wharf.torch._shards import ShardMapDataset

__all__ = ["Sample", "MapDataset", "IterableDataset", "RecordDataset", "DistributedSampler",
           "ReadAheadSampler", "distributed_info", "consumed_after", "save", "load"]

consumed_after = _wharf.consumed_after
_SHARE_SLICE = 4096  # DistributedSampler: indices computed per call


class Sample:
    """One sample: `.key` (relative to the dataset URI), `.data` (a zero-copy wharf.Buffer,
    or for tar shards a dict extension -> Buffer), `.index` (position in the index, for
    object datasets), `.url` and `.offset` (the shard and byte offset, for record shards)."""

    __slots__ = ("key", "data", "index", "url", "offset")

    def __init__(self, key: str, data: Any, index: Optional[int] = None,
                 url: Optional[str] = None, offset: Optional[int] = None):
        self.key = key
        self.data = data
        self.index = index
        self.url = url
        self.offset = offset

    def __getitem__(self, extension: str):
        """For tar samples: the bytes of one extension, e.g. sample["jpg"]."""
        return self.data[extension]

    def __repr__(self) -> str:
        return f"Sample(key={self.key!r}, data={self.data!r})"


def distributed_info(rank: Optional[int] = None,
                     world_size: Optional[int] = None) -> tuple[int, int]:
    """(rank, world_size): the arguments when given, else torch.distributed when initialized,
    else the RANK / WORLD_SIZE environment variables, else (0, 1)."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    r, w = 0, 1
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
    elif "WORLD_SIZE" in os.environ:
        r, w = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    return (r if rank is None else int(rank)), (w if world_size is None else int(world_size))


def _worker_info() -> tuple[int, int]:
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    # The workers of a loader share the node's budget (wharf.split_budget_for_worker).
    split_budget_for_worker(info.num_workers)
    return info.id, info.num_workers


class _Distributed:
    """Rank resolution that survives spawn: DataLoader workers started by spawn have no
    process group, so the main process's view is recorded when the dataset is pickled."""

    def _init_dist(self, rank, world_size):
        _check_int("rank", rank, 0, optional=True)
        _check_int("world_size", world_size, 1, optional=True)
        if rank is not None and world_size is not None and rank >= world_size:
            raise ValueError(f"rank {rank} is not below world_size {world_size}")
        self._rank_arg, self._world_arg = rank, world_size
        self._dist_snapshot = None

    def _dist(self) -> tuple[int, int]:
        if self._rank_arg is not None and self._world_arg is not None:
            return int(self._rank_arg), int(self._world_arg)
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        if not initialized and self._dist_snapshot is not None:
            r, w = self._dist_snapshot
            return (r if self._rank_arg is None else int(self._rank_arg),
                    w if self._world_arg is None else int(self._world_arg))
        return distributed_info(self._rank_arg, self._world_arg)

    def _snapshot_state(self) -> dict:
        state = self.__dict__.copy()
        state["_dist_snapshot"] = self._dist()  # pickled in the main process
        return state


# Store options (wharf.Store's keyword arguments) that the dataset factories pass through to
# the index's store; the index pickles them as its store spec, so workers reopen the same store.
_STORE_OPTIONS = ("endpoint", "region", "anonymous", "profile", "addressing_style", "api",
                  "cache")


def _pop_store_options(kwargs: dict) -> dict:
    return {k: kwargs.pop(k) for k in _STORE_OPTIONS if k in kwargs}


# What SampleIndex.from_prefix takes beside store options.
_LISTING_OPTIONS = ("index_cache", "page_size", "keep_directory_markers")


def _pop_index_options(kwargs: dict) -> dict:
    # index_cache=: where the index file of a listing or manifest goes (None: the default
    # cache, $WHARF_INDEX_CACHE or ~/.cache/wharf/index; False: keep the index in memory).
    return {"index_cache": kwargs.pop("index_cache")} if "index_cache" in kwargs else {}


def _index_for(uri: str, suffixes: Sequence[str] = (), list_workers: int = 16,
               index_cache=None, **store):
    """The index of from_prefix: an index file (as from a manifest), mapped and shared by every process that opens it (it pickles as the file's path), so no
    per-sample list lives in the dataset or travels to DataLoader workers."""
    if isinstance(suffixes, (str, bytes)):  # list(".jpg") would be [".", "j", "p", "g"]
        suffixes = [suffixes]
    index = _wharf.SampleIndex.from_prefix(uri, suffixes=list(suffixes), workers=list_workers,
                                           index_cache=index_cache, **store)
    if len(index) == 0:
        # A typo in a path or prefix would otherwise train on nothing, "finishing" at once.
        what = f"objects ending in {', '.join(suffixes)}" if suffixes else "objects"
        raise ValueError(f"no {what} found at {uri} (a dataset needs at least one; is the "
                         f"path or prefix right?)")
    return index


def _key_list(uri: str, keys: Iterable[str]) -> list:
    """from_keys' keys as a list: one string is refused (list("a.jpg") would be five keys of
    one letter), and so is an empty list (an epoch of nothing "finishes" at once)."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"from_keys: keys must be a list of keys relative to {uri}, not one "
                        f"string ({keys!r}): pass [{keys!r}]")
    keys = list(keys)
    if not keys:
        raise ValueError(f"from_keys: no keys given for {uri} (a dataset needs at least one)")
    return keys


def _manifest_index(uri: str, format: str, index_cache=None, **store):
    return _wharf.SampleIndex.from_manifest(uri, format, index_cache=index_cache, **store)


class _EpochSync:
    """DataLoader(persistent_workers=True) keeps its workers, and their copies of the
    dataset, from one epoch to the next, so set_epoch() in the training loop would change only
    the main process's copy and every epoch would repeat the first one's order. The main
    process also keeps the epoch in a 2-integer tensor in shared memory (it reaches fork and
    spawn workers alike), which a worker reads at each iter(): a persistent worker follows
    set_epoch(), and a load_state_dict() made after the workers started fails there instead
    of being ignored. A state loaded in the worker itself (torchdata's StatefulDataLoader
    loads each worker's own state there, before its iter()) holds its epoch at that iter():
    the main process never saw it, so following the main process's epoch would drop the
    state and read another epoch from its start, where num_workers=0 continues the state."""

    def _init_epoch_sync(self) -> None:
        self._restores = 0  # load_state_dict() calls in the main process
        self._worker_restored = False  # a state loaded in this worker, not yet iterated
        try:
            self._synced = torch.zeros(2, dtype=torch.int64).share_memory_()
        except (RuntimeError, OSError):  # no shared memory: workers get their copy's epoch
            self._synced = None

    def __setstate__(self, state):
        # A copy (copy.deepcopy, a pickle round trip in this process) gets a private tensor:
        # moved back into shared memory, or fork workers would never see set_epoch(). A spawn
        # worker's copy arrives shared already.
        self.__dict__.update(state)
        synced = state.get("_synced")
        if synced is not None and not synced.is_shared():
            try:
                synced.share_memory_()
            except (RuntimeError, OSError):
                self._synced = None

    def _publish_epoch(self, restored: bool = False) -> None:
        synced = getattr(self, "_synced", None)
        if synced is None:
            return
        if torch.utils.data.get_worker_info() is not None:
            if restored:
                self._worker_restored = True
            return
        if restored:
            self._restores += 1
        synced[0], synced[1] = self._epoch, self._restores

    def _follow_epoch(self) -> Optional[Iterator[Any]]:
        """At a worker's iter(): None, or an iterator that raises the error (raised from
        iter() itself, it would kill a persistent worker without a message)."""
        synced = getattr(self, "_synced", None)
        if synced is None or torch.utils.data.get_worker_info() is None:
            return None
        epoch, restores = (int(v) for v in synced.tolist())
        if restores != self._restores:
            return _raising(RuntimeError(
                "wharf: load_state_dict() was called on the dataset after the DataLoader's "
                "persistent workers started, and they keep the copy they started with: load the "
                "state before the loader's first iteration, or make a new DataLoader after it"))
        if getattr(self, "_worker_restored", False):
            self._worker_restored = False  # this iter() continues the state's epoch
            return None
        if epoch != self._epoch:
            self.set_epoch(epoch)
        return None


def _raising(error: BaseException) -> Iterator[Any]:
    raise error
    yield  # a generator: the error comes at the first next()


class _GlobalOrder(_EpochSync, _Distributed):
    """wharf's global order of a dataset's epochs and a cursor in it, shared by
    IterableDataset and DistributedSampler: the permutation of epoch e depends only on
    (seed, e); global position p goes to rank p % world_size; the cursor `consumed` counts
    the positions all ranks consumed, so a checkpoint is one integer valid for any world
    size."""

    def _init_order(self, index: "_wharf.SampleIndex", shuffle: bool, seed: int,
                    drop_last: bool, rank: Optional[int], world_size: Optional[int]) -> None:
        _check_int("seed", seed, 0)
        self._index = index
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self._init_dist(rank, world_size)
        self._epoch = 0
        self._start = 0      # the global cursor this epoch starts (or resumed) from
        # The order version: the current one for a new run; a resumed run keeps its state's
        # for every epoch (a state continues only in the order it was taken under).
        self._order = _wharf.current_order
        self._sampler = None

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's order. A resumed epoch keeps its cursor; another starts at 0."""
        _check_int("epoch", epoch, 0)
        if int(epoch) != self._epoch:
            self._epoch, self._start = int(epoch), 0
            self._epoch_changed()
        self._publish_epoch()

    def _epoch_changed(self) -> None:
        pass

    def sampler(self) -> "_wharf.Sampler":
        if self._sampler is None:
            self._sampler = _wharf.Sampler(len(self._index), seed=self.seed, shuffle=self.shuffle,
                                           drop_last=self.drop_last,
                                           fingerprint=self._index.fingerprint,
                                           order=self._order)
        return self._sampler

    def __len__(self) -> int:
        """Samples this rank takes in the current epoch from its cursor (all workers)."""
        _, world = self._dist()
        end = self.sampler().end_of_epoch(self._start, world)
        return max(0, end - self._start) // world

    def _state_at(self, consumed: int) -> dict:
        return json.loads(self.sampler().state(self._epoch, consumed))

    def _restore(self, state: dict) -> None:
        text = json.dumps(state)
        order = _wharf.parse_sampler_state(text)["order"]  # 1 for states without "order"
        if order != self._order:
            self._order, self._sampler = order, None
        epoch, consumed = self.sampler().restore(text)
        self._epoch, self._start = epoch, consumed

    def __getstate__(self):
        state = self._snapshot_state()
        state["_sampler"] = None
        return state


def _share_indices(sampler, epoch, start, rank, world):
    """A rank's share of an epoch from the cursor `start`, computed in slices: no list of the
    whole share, whatever the dataset's size."""
    offset = 0
    while True:
        indices = sampler.shard(epoch, start, rank=rank, world_size=world, start=offset,
                                count=_SHARE_SLICE)
        yield from indices
        if len(indices) < _SHARE_SLICE:
            return
        offset += len(indices)


class DistributedSampler(_GlobalOrder, torch.utils.data.Sampler):
    """A drop-in for torch's DistributedSampler that follows wharf's global order and resumes
    mid-epoch, also with another world size:

        sampler = DistributedSampler(ds, seed=0)          # ds: a MapDataset (or a SampleIndex)
                                                           # or MapDataset.from_shards' records
        loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=8)
        sampler.set_epoch(epoch)
        ...  ckpt["data"] = sampler.state_dict(steps=step + 1, batch_size=64)
        ...  sampler.load_state_dict(ckpt["data"])        # then iterate: the unseen samples

    rank and world_size default to torch.distributed's (num_replicas= is accepted as torch's
    name for world_size). It yields this rank's share of the epoch's permutation from the
    cursor: the same indices as IterableDataset over the same index, seed and epoch. Every rank yields the same
    count (padded by repeating samples, or the tail dropped with drop_last). The DataLoader
    draws indices ahead of the batches it returns, so the position comes from the steps the
    training loop completed: state_dict(steps, batch_size) gives the global cursor
    start + steps * batch_size * world_size, which every rank computes alike."""

    def __init__(self, dataset: Union["MapDataset", "_wharf.SampleIndex"], *,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 num_replicas: Optional[int] = None):
        from wharf.torch._shards import ShardMapDataset
        if num_replicas is not None:  # torch's name for world_size
            if world_size is not None and world_size != num_replicas:
                raise ValueError(f"num_replicas={num_replicas} and world_size={world_size} "
                                 "disagree (num_replicas is torch's name for world_size)")
            world_size = num_replicas
        index = dataset.index if isinstance(dataset, (MapDataset, ShardMapDataset)) else dataset
        if not (hasattr(index, "fingerprint") and hasattr(index, "__len__")):
            raise TypeError(f"DistributedSampler orders a wharf MapDataset (from_prefix, "
                            f"from_keys, from_manifest, from_shards) or a SampleIndex, not "
                            f"{type(dataset).__name__} (use torch's DistributedSampler)")
        self._init_order(index, shuffle, seed, drop_last, rank, world_size)
        self._yielded = 0  # indices handed out since the last __iter__
        # A MapDataset read by this sampler is told the indices to come (its read-ahead).
        self._dataset = dataset if isinstance(dataset, MapDataset) else None

    def __iter__(self) -> Iterator[int]:
        rank, world = self._dist()
        sampler, epoch, start = self.sampler(), self._epoch, self._start
        self._yielded = 0  # now, not at the first next(): a state taken in between is exact
        if self._dataset is not None:
            self._dataset.read_ahead(_share_indices(sampler, epoch, start, rank, world))

        def share():
            for i in _share_indices(sampler, epoch, start, rank, world):
                self._yielded += 1
                yield i
        return share()

    def state_dict(self, steps: Optional[int] = None, batch_size: Optional[int] = None) -> dict:
        """{"version", "order", "num_samples", "seed", "shuffle", "fingerprint", "epoch",
        "consumed"}: the state after `steps` batches of `batch_size` on every rank since the
        epoch started (or resumed). Without them, after the indices this sampler has handed
        out, which is what torchdata's StatefulDataLoader records for each batch it returns (a
        plain DataLoader draws indices ahead of its batches: pass steps and batch_size there)."""
        _, world = self._dist()
        if steps is None:
            per_rank = self._yielded
        else:
            if batch_size is None:
                raise ValueError("state_dict(steps=...) needs batch_size too")
            per_rank = int(steps) * int(batch_size)
        return self._state_at(consumed_after(self._start, per_rank, world))

    def load_state_dict(self, state: dict) -> None:
        """Continues the state's epoch at its cursor with this process's world size. Raises
        WharfError when it is for another dataset, seed or shuffle setting."""
        _check_state(state)
        self._restore(state)
        self._yielded = 0

    def _epoch_changed(self) -> None:
        self._yielded = 0


class MapDataset(torch.utils.data.Dataset):
    """Map-style dataset: sample i is object i of the index (listing order, manifest order or
    the keys given). `ds[i]` is one Sample; `ds.__getitems__(indices)`, which the DataLoader
    calls with a whole batch, fetches the batch as ONE engine batch (all requests in flight
    together). Works with any sampler (DistributedSampler included) and with DataLoader
    workers started by fork or spawn.

    Engine options: max_in_flight (0: derived), memory_budget (this dataset's cap inside the
    process's budget, an int or a SIZE such as "256M"; 0: none of its own, see
    wharf.configure).

    Read-ahead: when the order is known, samples are fetched before the DataLoader asks, so
    num_workers=0 overlaps fetching with the training step. wharf's DistributedSampler tells
    the dataset its order itself; wrap any other sampler in ReadAheadSampler(sampler, ds), or
    call ds.read_ahead(indices) with the indices to come. Bounded by `read_ahead_window`
    samples and `read_ahead_bytes` bytes (default 512 and "256M"); 0 turns it off."""

    def __init__(self, index: "_wharf.SampleIndex", transform: Optional[Callable] = None,
                 max_in_flight: int = 0, memory_budget: Union[int, str] = 0,
                 read_ahead_window: int = 512, read_ahead_bytes: Union[int, str] = "256M"):
        _check_int("max_in_flight", max_in_flight, 0, maximum=(1 << 31) - 1)
        self._index = index
        self.transform = _callable_or_none("transform", transform)
        self._engine = dict(max_in_flight=max_in_flight, memory_budget=memory_budget)
        self._reader = None
        self._pid = None
        self._ahead_options = dict(window=int(read_ahead_window),
                                   window_bytes=_wharf.parse_size(read_ahead_bytes))
        self._plan = None   # (indices to come, pid): not fetched until asked for its first
        self._ahead = None  # the ReadAhead fetching the plan in this process
        self._ahead_hits = self._ahead_misses = 0

    @classmethod
    def from_prefix(cls, uri: str, transform: Optional[Callable] = None,
                    suffixes: Sequence[str] = (), list_workers: int = 16, **engine) -> "MapDataset":
        """Every object below `uri` (end it with '/' for a folder), sorted by key; only keys
        ending in one of `suffixes` when given (none at all is a ValueError: a mistyped path
        would otherwise give an empty epoch). Listed once, by `list_workers` parallel list
        calls, in the process that calls this. Store options (endpoint=, region=,
        anonymous=, profile=) go to the store, as for wharf.Store. index_cache= (also for
        from_manifest): the directory of the index file, which every process of the node
        maps (None: $WHARF_INDEX_CACHE or ~/.cache/wharf/index; False: in memory)."""
        store = _pop_store_options(engine)
        return cls(_index_for(uri, suffixes, list_workers, **_pop_index_options(engine),
                              **store), transform, **engine)

    @classmethod
    def from_manifest(cls, uri: str, transform: Optional[Callable] = None,
                      format: str = "auto", **engine) -> "MapDataset":
        """The objects a manifest lists: one key per line, or JSON lines {"key", "size",
        "etag"}; relative keys resolve against the manifest's folder."""
        store = _pop_store_options(engine)
        return cls(_manifest_index(uri, format, **_pop_index_options(engine), **store), transform,
                   **engine)

    @classmethod
    def from_keys(cls, uri: str, keys: Iterable[str], transform: Optional[Callable] = None,
                  **engine) -> "MapDataset":
        """The objects `keys` (relative to `uri`), in that order."""
        store = _pop_store_options(engine)
        return cls(_wharf.SampleIndex.from_keys(uri, _key_list(uri, keys), **store), transform,
                   **engine)

    @staticmethod
    def from_shards(uri: str, shards: Union[None, str, Sequence[str]] = None,
                    format: str = "tar", transform: Optional[Callable] = None,
                    **store) -> "ShardMapDataset":
        """Random access to the records inside tar or TFRecord shards: `ds[i]` is record i
        (tar: a Sample whose .data is {ext: bytes}, grouped as webdataset groups members;
        tfrecord: the record's bytes). The shards are read once to build a record-offset index
        (shard, byte range, 20 bytes a record); each access is then one ranged GET, a batch's
        ranges fetched together. The record index is kept as a file in the index cache
        (`index_cache=`, as for from_prefix: the tier's .wharf/index when reading through one;
        False: not kept), named after the shards' keys, sizes and ETags, so later processes
        and runs load it instead of reading the shards again. `shards`: keys relative to
        `uri`, a sub-prefix, or None (every shard below `uri`). Compressed shards are refused
        (no random access)."""
        from wharf.torch._shards import ShardMapDataset
        return ShardMapDataset(uri, shards, format=format, transform=transform, **store)

    @property
    def index(self) -> "_wharf.SampleIndex":
        return self._index

    def keys(self) -> list[str]:
        return self._index.keys()

    def __len__(self) -> int:
        return len(self._index)

    def _engine_reader(self) -> "_wharf.SampleReader":
        # One engine per process: a forked DataLoader worker builds its own.
        if self._reader is None or self._pid != os.getpid():
            _worker_info()  # in a DataLoader worker: its share of the node's budget
            self._reader = _wharf.SampleReader(self._index, **self._engine)
            self._pid = os.getpid()
        return self._reader

    def _sample(self, i: int, key: str, data) -> Any:
        s = Sample(key, data, index=i)
        if self.transform is None:
            return s
        if _profile.state.on:
            return _profile.transform(self.transform, s)
        return self.transform(s)

    def read_ahead(self, indices: Optional[Iterable[int]], **options) -> None:
        """The indices this dataset will be asked for next, in order (None: none known).
        Nothing is fetched until the first of them is asked for in this process; a request
        off the plan drops it. options: window, window_bytes (see the class)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        self._plan = None
        if indices is not None and self._ahead_options["window"] > 0:
            self._plan = (indices, dict(self._ahead_options, **options), os.getpid())

    def _reading_ahead(self) -> bool:
        return self._ahead is not None

    def _planned(self, indices: list) -> Optional[list]:
        if self._ahead is None and self._plan is not None:
            plan, options, pid = self._plan
            self._plan = None
            if pid == os.getpid() and indices:
                ahead = _ahead.ReadAhead(self._engine_reader(), plan, sizes=self._index.size,
                                         **options)
                if ahead.peek() == indices[0]:
                    self._ahead = ahead
                else:
                    ahead.close()
        if self._ahead is None:
            return None
        got = self._ahead.take(indices)
        if got is None:
            self._ahead = None
            self._ahead_misses += 1
        else:
            self._ahead_hits += len(got)
        return got

    def __getitem__(self, i: int) -> Any:
        i = operator.index(i)  # an int (numpy's too); a float is a TypeError, as for a list
        n = len(self)
        got = self._planned([i if i >= 0 else i + n])
        key, data = got[0] if got is not None else self._engine_reader().get(i)
        return self._sample(i if i >= 0 else i + n, key, data)

    def __getitems__(self, indices: Sequence[int]) -> list:
        n = len(self)
        normalized = []
        for i in indices:
            i = operator.index(i)
            j = i + n if i < 0 else i
            if not 0 <= j < n:  # the IndexError ds[i] raises (below -n is not sample n - 1)
                raise IndexError(f"sample {i} of a dataset of {n} samples")
            normalized.append(j)
        indices = normalized
        got = self._planned(indices)
        if got is None:
            got = self._engine_reader().get_batch(indices)
        return [self._sample(i, key, data) for i, (key, data) in zip(indices, got)]

    def stats(self) -> dict:
        """This process's engine: batches, samples, requests, bytes, retries; and
        read_ahead_hits (samples served by read-ahead) and read_ahead_misses (plans dropped)."""
        out = dict(self._engine_reader().stats)
        out["read_ahead_hits"] = self._ahead_hits
        out["read_ahead_misses"] = self._ahead_misses
        return out

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_reader"] = None  # engine objects never travel; the index pickles as data
        state["_pid"] = None
        state["_plan"] = state["_ahead"] = None
        return state


class IterableDataset(_GlobalOrder, torch.utils.data.IterableDataset):
    """Iterable dataset over one object per sample, in wharf's global order: the permutation
    of epoch e depends only on (seed, e), ranks take interleaved shares (equal counts: padded
    by repeating samples, or the tail dropped with drop_last), and a rank's share is cut into
    blocks of `batch_size_hint` samples dealt round-robin to its DataLoader workers. With
    batch_size_hint equal to the DataLoader's batch_size, the loader yields the rank's share
    exactly in order, whatever num_workers.

    Each worker reads its share through one engine batch, `prefetch` samples ahead (and at
    most `prefetch_bytes` bytes ahead when non-zero); samples of one DataLoader batch are
    requested together. The default (None) follows the store: 64 samples while every sample
    comes from local files (a tier's hits), and once one comes from across a network, twice
    the requests the engine keeps in flight, a depth it tunes from the throughput it measures
    (io/inflight_controller.h), so a farther store gets a deeper read-ahead (measured at 25 ms
    each way: 64 ahead gave 394 samples/s, 512 gave 1,114). Memory stays bounded by the
    engine's budget (1 GiB) whatever the sample size."""

    def __init__(self, index: "_wharf.SampleIndex", *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, transform: Optional[Callable] = None,
                 batch_size_hint: int = 1, prefetch: Optional[int] = None,
                 prefetch_bytes: int = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 max_in_flight: int = 0, memory_budget: Union[int, str] = 0):
        _check_int("batch_size_hint", batch_size_hint, 1)
        _check_int("prefetch", prefetch, 0, optional=True)
        _check_int("prefetch_bytes", prefetch_bytes, 0)
        _check_int("max_in_flight", max_in_flight, 0, maximum=(1 << 31) - 1)
        self._init_order(index, shuffle, seed, drop_last, rank, world_size)
        self._init_epoch_sync()
        self.transform = _callable_or_none("transform", transform)
        self.batch_size_hint = int(batch_size_hint)
        self._stream_options = dict(prefetch=prefetch, prefetch_bytes=prefetch_bytes,
                                    max_in_flight=max_in_flight, memory_budget=memory_budget)
        self._yielded = 0    # samples this process yielded since the last __iter__
        self._skipped = 0    # samples of its share the last __iter__ passed over (resume)
        self._worker_resume = None  # a worker_share to continue at the next __iter__

    @classmethod
    def from_prefix(cls, uri: str, suffixes: Sequence[str] = (), list_workers: int = 16,
                    **kwargs) -> "IterableDataset":
        """Every object below `uri` (listed once, in parallel, sorted by key); none is a
        ValueError."""
        store = _pop_store_options(kwargs)
        return cls(_index_for(uri, suffixes, list_workers, **_pop_index_options(kwargs),
                              **store), **kwargs)

    @classmethod
    def from_manifest(cls, uri: str, format: str = "auto", **kwargs) -> "IterableDataset":
        """The objects a manifest lists (see MapDataset.from_manifest)."""
        store = _pop_store_options(kwargs)
        return cls(_manifest_index(uri, format, **_pop_index_options(kwargs), **store), **kwargs)

    @classmethod
    def from_keys(cls, uri: str, keys: Iterable[str], **kwargs) -> "IterableDataset":
        store = _pop_store_options(kwargs)
        return cls(_wharf.SampleIndex.from_keys(uri, _key_list(uri, keys), **store), **kwargs)

    @staticmethod
    def from_shards(uri: str, shards: Union[None, str, Sequence[str]] = None,
                    format: str = "tar", **kwargs) -> "RecordDataset":
        """Records of shard objects: format "tar" (WebDataset samples), "tfrecord", "csv",
        "jsonl" (any name of wharf._wharf.record_formats()). `shards`: a list of keys relative
        to `uri`; a string: the shards below that sub-prefix; None: every object below `uri`
        with one of the format's suffixes. See RecordDataset for the options."""
        return RecordDataset(uri, shards, format=format, **kwargs)

    @staticmethod
    def from_files(uri: str, files: Union[None, str, Sequence[str]] = None, *,
                   format: Optional[str] = None, batch_rows: int = 65536,
                   columns: Optional[Sequence[str]] = None, **kwargs) -> "RowDataset":
        """pyarrow.RecordBatch row batches of up to batch_rows rows from row files: format
        "parquet" (by row group; only `columns`' byte ranges are fetched, coalesced), "avro"
        (by blocks, in byte splits), "csv" or "jsonl" (by file, in quote-aware blocks parsed by
        pyarrow).
        `uri`: one file, or a prefix whose files with the format's suffixes are read (`files`:
        a sub-prefix or a list of keys relative to `uri`); format defaults from the suffix.
        Sharded across ranks and DataLoader workers by row group / split / file, shuffled per
        epoch from `seed`, with exact mid-epoch resume (state_dict / load_state_dict). Options:
        shuffle, seed, transform (applied to each batch), split_bytes (Avro, "64M"),
        coalesce_gap (Parquet, "256K"), csv_options ({"read_options": {...},
        "parse_options": {...}, "convert_options": {...}}), rank, world_size, store options.
        See wharf.torch._rows.RowDataset."""
        from wharf.torch._rows import RowDataset
        return RowDataset(uri, files, format=format, batch_rows=batch_rows, columns=columns,
                          **kwargs)

    # -- order and resume --

    @property
    def index(self) -> "_wharf.SampleIndex":
        return self._index

    def _epoch_changed(self) -> None:
        self._yielded, self._skipped, self._worker_resume = 0, 0, None

    def _share(self) -> dict:
        """Which share this process reads: what a worker's state must match to resume."""
        rank, world = self._dist()
        worker, num_workers = _worker_info()
        return {"rank": rank, "world_size": world, "worker": worker,
                "num_workers": num_workers, "batch_size_hint": self.batch_size_hint}

    def global_consumed(self, steps: Optional[int] = None,
                        batch_size: Optional[int] = None) -> int:
        """The global cursor: start + samples_per_rank * world_size, where samples_per_rank is
        steps * batch_size (batch_size defaults to batch_size_hint) when steps is given, else
        the samples this process yielded since the last __iter__ (exact with num_workers=0)."""
        _, world = self._dist()
        if steps is not None:
            per_rank = int(steps) * int(batch_size or self.batch_size_hint)
        else:
            per_rank = self._yielded
        return consumed_after(self._start, per_rank, world)

    def state_dict(self, steps: Optional[int] = None,
                   batch_size: Optional[int] = None) -> dict:
        """{"version", "order", "num_samples", "seed", "shuffle", "fingerprint", "epoch",
        "consumed"} at the global cursor global_consumed(steps, batch_size).

        Called inside a DataLoader worker without steps (torchdata's StatefulDataLoader does
        this in every worker), the state is that worker's: the cursor its epoch started from
        plus "worker_share" {"rank", "world_size", "worker", "num_workers",
        "batch_size_hint", "yielded"}. Loaded back into the same worker of the same setup,
        it continues that worker's share exactly."""
        if steps is None and torch.utils.data.get_worker_info() is not None:
            state = self._state_at(self._start)
            state["worker_share"] = dict(self._share(), yielded=self._skipped + self._yielded)
            return state
        return self._state_at(self.global_consumed(steps, batch_size))

    def load_state_dict(self, state: dict) -> None:
        """Continues the state's epoch at its cursor, with this process's world size (or, for
        a worker's state, that worker's share). Raises WharfError when the state is for
        another dataset, seed or shuffle setting."""
        _check_state(state)
        state = dict(state)
        share = state.pop("worker_share", None)
        self._restore(state)
        self._yielded, self._skipped = 0, 0
        self._worker_resume = dict(share) if share is not None else None
        self._publish_epoch(restored=True)

    # -- reading --

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the stream, the counters and the resume state change here, at
        # iter(), so a state taken before the first next() describes this pass.
        if (failed := self._follow_epoch()) is not None:
            return failed
        here = self._share()
        skip = 0
        share = self._worker_resume
        if share is not None:
            saved = {k: share.get(k) for k in here}
            if saved != here:
                raise ValueError(
                    f"this state continues the share {saved}, but this process reads {here}: "
                    "a worker's state resumes only with the same world size, num_workers and "
                    "batch_size_hint (checkpoint with state_dict(steps=...) to resume with "
                    "any world size)")
            skip = int(share["yielded"])
        stream = _wharf.SampleStream(
            self._index, seed=self.seed, epoch=self._epoch, shuffle=self.shuffle,
            drop_last=self.drop_last, rank=here["rank"], world_size=here["world_size"],
            worker=here["worker"], num_workers=here["num_workers"],
            worker_block=self.batch_size_hint, consumed=self._start, skip=skip,
            order=self._order, **self._stream_options)
        self._worker_resume = None  # used only once the stream exists
        self._yielded, self._skipped = 0, skip
        if _profile.state.on:
            return _profile.consumer(self._samples(stream))
        return self._samples(stream)

    def _samples(self, stream) -> Iterator[Any]:
        transform = self.transform
        profiling = _profile.state
        block = self.batch_size_hint
        while True:
            batch = stream.next_batch(block)  # one DataLoader batch requested together
            if not batch:
                return
            for index, key, data in batch:
                s = Sample(key, data, index=index)
                self._yielded += 1
                if transform is None:
                    yield s
                elif profiling.on:
                    yield _profile.transform(transform, s)
                else:
                    yield transform(s)


class _ShardEpochs(_EpochSync):
    """The epoch of a dataset whose readers keep their own positions (record shards, row
    files): changing it drops a saved position and the live one."""

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        _check_int("epoch", epoch, 0)
        if int(epoch) != self._epoch:
            self._epoch, self._resume, self._live = int(epoch), None, None
        self._publish_epoch()


class RecordDataset(_ShardEpochs, _Distributed, torch.utils.data.IterableDataset):
    """Records of shards: format "tar" (a Sample per WebDataset sample: `.key` the sample key,
    `.data` a dict extension -> Buffer), "tfrecord" (a Sample per record), "csv" or "jsonl" (a
    Sample per row; `.data` the row without its line end; parse with wharf.split_csv or json.loads);
    any format of wharf._wharf.record_formats() (formats whose records have named fields come as
    tar's do, the others as tfrecord's). Record samples have `.url` (the shard) and `.offset` (the
    record's byte offset in it) and `.key` = "<shard key>@<offset>" (tar: the sample key).
    Compressed shards are read by their name: .tar.gz / .tgz (gzip), .tfrecord.gz (GZIP),
    .tfrecord.zlib (ZLIB), inflated as they stream; listed with the others, and their offsets
    count decompressed bytes. Tar samples are grouped as webdataset groups them (extensions
    lower-cased, keys kept as they are, "__...__" metadata members skipped).

    Order: the shard order of each epoch is a permutation from (seed, epoch) (identity without
    shuffle); shards are dealt round-robin to ranks, then to the rank's DataLoader workers;
    each worker reads its shards in turn and, with shuffle_buffer=N, mixes records in a buffer
    of N (seeded from seed, epoch, rank and worker). Counts per rank follow the shards' sizes:
    use equal shards, as many as a multiple of world_size * num_workers, for equal counts.
    The buffer's records are held outside the memory budget (they are copied out of the
    readers' chunks, which go back to it), so it costs about N x the mean record size per
    worker: 1000 records of 200 KiB are 200 MiB each, whatever the budget.

    rows_per_item=N (csv/jsonl): yield lists of up to N row Samples (one buffer per list).
    header=True (csv/jsonl): the first row of each shard is its header, not a record.
    Reading: chunk_size (bytes per ranged GET) and read_ahead (chunks requested ahead) are
    derived from the store's measured link when left at 0 / -1; memory_budget (an int or a
    SIZE such as "64M") caps what this dataset's shard readers hold at once inside the
    process's budget (0: no cap of its own, see wharf.configure).
    Resume. state_dict() is exact: it holds where this process's share stands (shards read,
    the offset of the last record taken, the records held in the shuffle buffer), and
    load_state_dict() followed by iteration yields exactly the records not yet yielded, in
    the same order. Record positions live where the records are read, so:
     - num_workers=0: call ds.state_dict() / ds.load_state_dict() on the dataset;
     - DataLoader workers: use torchdata's StatefulDataLoader, which calls them in every
       worker and carries the workers' states in loader.state_dict(). A plain DataLoader's
       workers keep their positions to themselves: the main process's state_dict() then
       says only "start of the epoch" (or repeats the state it was loaded with), and a state
       loaded into the main process reaches every worker, where all but its own share
       refuse it.
    A state resumes the same share: the same shards, seed, epoch, world size and workers. The
    shards' ETags are part of it: a shard rewritten since is an error, not a silent mix.
    """

    def __init__(self, uri: str, shards: Union[None, str, Sequence[str]] = None, *,
                 format: str = "tar", shuffle: bool = True, seed: int = 0,
                 shuffle_buffer: int = 0, transform: Optional[Callable] = None,
                 header: bool = False, delimiter: str = ",", quote: str = '"',
                 skip_empty_rows: bool = False, rows_per_item: Optional[int] = None,
                 chunk_size: int = 0, read_ahead: int = -1,
                 memory_budget: Union[int, str] = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 list_workers: int = 16, **store):
        # **store: store options (endpoint=, region=, anonymous=, profile=), as for
        # wharf.Store; an unknown name is a ValueError listing the valid ones.
        # The formats, their suffixes and what their records hold come from the registry
        # (formats/registry.h): a format added there works here unchanged.
        formats = _wharf.record_formats()
        if format not in formats:
            raise ValueError(f"format {format!r}: expected one of {sorted(formats)}")
        # Store options, and the listing's options when the shards are listed (index_cache=,
        # page_size=, keep_directory_markers=, as SampleIndex.from_prefix takes them).
        unknown = sorted(set(store) - set(_STORE_OPTIONS) - set(_LISTING_OPTIONS))
        if unknown:  # a misspelled argument reads better as that than as a store option
            raise TypeError(f"unexpected keyword argument {unknown[0]!r} (neither an argument "
                            f"of the record dataset nor a store option: "
                            f"{', '.join(_STORE_OPTIONS)})")
        _check_int("seed", seed, 0)
        _check_int("shuffle_buffer", shuffle_buffer, 0)
        _check_int("rows_per_item", rows_per_item, 1, optional=True)
        _check_int("list_workers", list_workers, 1)
        info = _wharf.record_format(format)
        if rows_per_item is not None and not info["rows"]:
            rows = [name for name in formats if _wharf.record_format(name)["rows"]]
            raise ValueError(f"rows_per_item is for {' and '.join(rows)}")
        # The listing's options go to the listing alone: SampleIndex.from_keys takes store
        # options only (with a list of shards nothing is listed, and they have no effect).
        listing = {k: store.pop(k) for k in _LISTING_OPTIONS if k in store}
        if shards is None or isinstance(shards, str):
            sub = "" if shards is None else shards
            # Compressed shards (.tar.gz, .tgz, .tfrecord.gz, ...) are shards too: they are
            # inflated as they stream, by their name.
            listed = _wharf.record_formats(compressed=True)[format]
            index = _wharf.SampleIndex.from_prefix(uri + sub, suffixes=list(listed),
                                                   workers=list_workers, **listing, **store)
            if sub:  # keys relative to `uri`, not to the sub-prefix
                index = _wharf.SampleIndex.from_keys(uri, [sub + k for k in index.keys()],
                                                     **store)
        else:
            index = _wharf.SampleIndex.from_keys(uri, list(shards), **store)
        if len(index) == 0:
            raise ValueError(f"no {format} shards found at {uri}"
                             + (f" under {shards!r}" if isinstance(shards, str) else ""))
        self._index = index
        self.format = format
        self._keyed = info["shape"] == "fields"  # records are dicts of named fields (tar)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.transform = _callable_or_none("transform", transform)
        self.rows_per_item = rows_per_item
        self._options = dict(shuffle_buffer=shuffle_buffer, header=header, delimiter=delimiter,
                             quote=quote, skip_empty_rows=skip_empty_rows,
                             chunk_size=chunk_size, read_ahead=read_ahead,
                             memory_budget=memory_budget)
        self._init_dist(rank, world_size)
        self._epoch = 0
        self._init_epoch_sync()
        # The order version of the shard order: the current one for a new run; a run resumed
        # from a state keeps the state's.
        self._order = _wharf.current_order
        self._resume = None  # a stream state to continue at the next __iter__
        self._live = None    # (pid, the stream the current __iter__ reads)

    @property
    def shards(self) -> list[str]:
        return self._index.keys()

    def _identity(self) -> dict:
        return {"format": self.format, "shards": len(self._index), "seed": self.seed,
                "shuffle": self.shuffle, "fingerprint": self._index.fingerprint}

    def state_dict(self) -> dict:
        """{"format", "shards", "seed", "shuffle", "fingerprint", "epoch", "order", "stream"}:
        "order" is the order version, "stream" where the share read in this process stands
        (a RecordStream state), or None at the start of the epoch."""
        stream = None
        if self._live is not None and self._live[0] == os.getpid():
            stream = json.loads(self._live[1].state())
        elif self._resume is not None:
            stream = self._resume
        return dict(self._identity(), epoch=self._epoch, order=self._order, stream=stream)

    def load_state_dict(self, state: dict) -> None:
        """Continues from `state` at the next iteration. ValueError when it is for other
        shards, seed or shuffle setting; a state of another share (rank, worker) is refused
        when the iteration starts."""
        _check_state(state)
        mine = self._identity()
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(f"record dataset state {theirs} does not match this dataset {mine}")
        # States from before order versions have no "order" (nor in "stream"): order 1.
        stream = state.get("stream")
        order = state.get("order", (stream or {}).get("order", 1))
        if order not in _wharf.order_versions:
            raise ValueError(f"record dataset state: order version {order} is not supported "
                             f"(this build computes order versions "
                             f"{' and '.join(map(str, _wharf.order_versions))})")
        self._epoch = int(state["epoch"])
        self._order = int(order)
        self._resume = stream
        self._live = None
        self._publish_epoch(restored=True)

    def stream(self, rank: Optional[int] = None, world_size: Optional[int] = None,
               worker: int = 0, num_workers: int = 1,
               state: Optional[dict] = None) -> "_wharf.RecordStream":
        """The extension's stream for one (rank, worker) share of the current epoch, from its
        start or from a stream state."""
        r, w = self._dist()
        return _wharf.RecordStream(
            self._index, self.format, seed=self.seed, epoch=self._epoch, shuffle=self.shuffle,
            rank=r if rank is None else rank, world_size=w if world_size is None else world_size,
            worker=worker, num_workers=num_workers, order=self._order,
            state=None if state is None else json.dumps(state), **self._options)

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the stream is created (and a saved position restored) at iter(), so
        # a state taken before the first next() describes this pass, and a failed restore
        # keeps the saved position for the next attempt.
        if (failed := self._follow_epoch()) is not None:
            return failed
        worker, num_workers = _worker_info()
        stream = self.stream(worker=worker, num_workers=num_workers, state=self._resume)
        self._resume = None
        self._live = (os.getpid(), stream)
        if _profile.state.on:
            return _profile.consumer(self._records(stream))
        return self._records(stream)

    def _records(self, stream) -> Iterator[Any]:
        transform = self.transform
        url_keys = {}
        if not self._keyed:
            url_keys = {self._index.url(i): k for i, k in enumerate(self._index.keys())}

        def key_of(url: str, offset: int) -> str:
            return f"{url_keys.get(url, url)}@{offset}"

        profiling = _profile.state

        def out(s):
            if transform is None:
                return s
            if profiling.on:
                return _profile.transform(transform, s)
            return transform(s)

        if self._keyed:
            for d in stream:
                key = d.pop("__key__")
                url = d.pop("__url__")
                offset = d.pop("__offset__")
                yield out(Sample(key, d, url=url, offset=offset))
        elif self.rows_per_item:
            while True:
                rows = stream.next_batch(self.rows_per_item)
                if not rows:
                    return
                yield out([Sample(key_of(url, off), data, url=url, offset=off)
                           for url, off, data in rows])
        else:
            for url, off, data in stream:
                yield out(Sample(key_of(url, off), data, url=url, offset=off))

    def __getstate__(self):
        state = self._snapshot_state()
        state["_live"] = None  # engine objects never travel
        return state


def _no_store_options(verb: str, store_options: dict) -> None:
    if store_options:
        raise TypeError(f"wharf.torch.{verb}: store options ({', '.join(sorted(store_options))}) "
                        f"need a URI, not a file object")


# torch.load's keyword arguments for its unpickler (**pickle_load_args), passed through.
_PICKLE_LOAD_ARGS = ("encoding", "errors", "fix_imports", "buffers")


def save(obj: Any, uri: str, pickle_module: Any = None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True, **store_options) -> None:
    """torch.save(obj) to `uri` (s3://, gs://, file://, with wharf.Store's store options).

    The bytes are torch.save's into a file object, byte for byte (plain torch.load reads the
    object), streamed through wharf.open(uri, "wb"): tensors go up as parts while later ones
    are serialized, with no copy of the whole state in memory. The object appears atomically
    when the save completes; a save that raises leaves nothing (the upload is aborted).
    A file object (anything with write()) is handed to torch.save as it is. pickle_module,
    pickle_protocol and _use_new_zipfile_serialization are torch.save's.
    """
    torch_args = {"pickle_protocol": pickle_protocol,
                  "_use_new_zipfile_serialization": _use_new_zipfile_serialization}
    if pickle_module is not None:
        torch_args["pickle_module"] = pickle_module
    if hasattr(uri, "write"):
        _no_store_options("save", store_options)
        torch.save(obj, uri, **torch_args)
        return
    with ObjectFile(uri, "wb", **store_options) as f:
        try:
            torch.save(obj, f, **torch_args)
        except Exception as e:
            # A store error in a write reaches the caller as torch's zip writer's RuntimeError
            # ("unexpected pos"): raise the store's (NotFoundError, PermissionDeniedError, ...).
            if f._write_error is not None and f._write_error is not e:
                raise f._write_error from None
            raise


def load(uri: str, map_location=None, pickle_module: Any = None, *,
         weights_only: Optional[bool] = None, chunk_size: int = 0, read_ahead: int = -1,
         **store_options) -> Any:
    """torch.load of the object at `uri`, read through wharf.open(uri, "rb").

    Reads are ranged GETs with parallel read-ahead pinned to the ETag seen at open (an
    overwrite meanwhile is an error, never a mix). `map_location` and `weights_only` are
    torch.load's (None: torch's default), and so are pickle_module and the unpickler's
    arguments (encoding=, errors=, fix_imports=). Reads anything torch.save wrote. A file
    object (anything with read()) is handed to torch.load as it is.
    """
    if "mmap" in store_options:
        raise TypeError("wharf.torch.load: torch.load's mmap= is not supported here "
                        "(it maps local files); use torch.load for that")
    torch_args = {name: store_options.pop(name) for name in _PICKLE_LOAD_ARGS
                  if name in store_options}
    if pickle_module is not None:
        torch_args["pickle_module"] = pickle_module
    if hasattr(uri, "read"):
        _no_store_options("load", store_options)
        return torch.load(uri, map_location=map_location, weights_only=weights_only, **torch_args)
    with ObjectFile(uri, "rb", chunk_size=chunk_size, read_ahead=read_ahead,
                    **store_options) as f:
        return torch.load(f, map_location=map_location, weights_only=weights_only, **torch_args)


def __getattr__(name):
    # wharf.torch.CheckpointManager and wharf.torch.checkpoint without importing
    # torch.distributed.checkpoint with the datasets.
    if name in ("CheckpointManager", "checkpoint"):
        import importlib
        module = importlib.import_module("wharf.torch.checkpoint")
        return module if name == "checkpoint" else module.CheckpointManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"CheckpointManager", "checkpoint"})
