"""Read-ahead for map-style datasets whose order is known (docs/design/dataset.md,
"Map-style read-ahead").

A DataLoader with num_workers=0 calls MapDataset.__getitems__ for one batch at a time, so
without help every batch pays the store's first-byte latency while nothing overlaps it with the
training step. When the sequence of indices the loader will ask for is known in advance (wharf's
DistributedSampler computes it from (seed, epoch, cursor); ReadAheadSampler learns it by drawing
from any sampler ahead of the loader) the dataset is given a *plan*: an iterator of the indices
to come. The plan is not fetched until the dataset is first asked, in this process, for the
plan's first index (so a plan made in a DataLoader's main process while workers do the reading
costs nothing). From then on, chunks of the plan are fetched as engine batches
(SampleReader.get_batch, which releases the GIL) on a few threads, bounded by
`window` samples and `window_bytes` bytes ahead of the consumer; each request takes its samples
from the chunks in order. A request that does not match the plan (another sampler, a skipped
batch) drops it and is served directly, as without a plan.
"""
import collections
import concurrent.futures
from typing import Iterable, Iterator, Optional


class ReadAhead:
    """Fetches the samples a plan of indices will ask for, ahead of the asking."""

    def __init__(self, reader, plan: Iterator[int], *, sizes=None, window: int = 512,
                 window_bytes: int = 256 << 20, chunk: int = 64, threads: int = 4):
        self._reader = reader
        self._plan = iter(plan)
        self._size_of = sizes  # i -> size or None
        self._window, self._window_bytes = max(1, window), max(1, window_bytes)
        self._chunk = max(1, min(chunk, window))
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, threads), thread_name_prefix="wharf-read-ahead")
        self._pending = collections.deque()  # (indices, bytes, future), in plan order
        self._ready = collections.deque()    # (index, (key, data)) fetched, not yet taken
        self._ahead = self._ahead_bytes = 0  # samples / bytes requested and not yet taken
        self._ended = False                  # the plan has no more indices

    # The first index of the plan, or None when it is empty (peeked, not consumed).
    def peek(self) -> Optional[int]:
        if self._ready:
            return self._ready[0][0]
        if self._pending:
            return self._pending[0][0][0]
        first = next(self._plan, None)
        if first is None:
            self._ended = True
            return None
        self._plan = _prepend(first, self._plan)
        return first

    def _top_up(self) -> None:
        while not self._ended and self._ahead < self._window and (
                self._ahead_bytes < self._window_bytes or self._ahead == 0):
            indices, nbytes = [], 0
            room = min(self._chunk, self._window - self._ahead)
            while len(indices) < room:
                i = next(self._plan, None)
                if i is None:
                    self._ended = True
                    break
                indices.append(int(i))
                size = self._size_of(i) if self._size_of else None
                nbytes += size or 0
                if self._ahead_bytes + nbytes >= self._window_bytes:
                    break
            if not indices:
                return
            self._ahead += len(indices)
            self._ahead_bytes += nbytes
            self._pending.append((indices, nbytes,
                                  self._pool.submit(self._reader.get_batch, indices)))

    def take(self, indices) -> Optional[list]:
        """(key, data) of `indices` when they are the plan's next ones, else None (the
        plan is then dropped: the caller reads them directly)."""
        out = []
        for i in indices:
            if not self._ready:
                self._top_up()
                if not self._pending:
                    return self._miss()
                chunk, nbytes, fut = self._pending.popleft()
                got = fut.result()  # a fetch error raises here, for the batch that needs it
                self._ahead -= len(chunk)
                self._ahead_bytes -= nbytes
                self._ready.extend(zip(chunk, got))
            j, sample = self._ready[0]
            if j != i:
                return self._miss()
            self._ready.popleft()
            out.append(sample)
        self._top_up()
        return out

    def _miss(self):
        # What was already taken for this request is dropped too: the caller re-reads all.
        self.close()
        return None

    def close(self) -> None:
        self._ended = True
        for _, _, fut in self._pending:
            fut.cancel()
        self._pending.clear()
        self._ready.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _prepend(first, rest):
    yield first
    yield from rest


class ReadAheadSampler:
    """Wraps any sampler (or iterable of indices) for a MapDataset read with num_workers=0:
    it draws indices from the sampler ahead of the DataLoader and hands them to the dataset
    as its plan, so the samples are fetched before the loader asks for them:

        loader = DataLoader(ds, batch_size=64, sampler=ReadAheadSampler(RandomSampler(ds), ds))

    The indices the loader gets are the sampler's, unchanged. With DataLoader workers the
    dataset in the main process is never asked, and the plan is dropped once it is `window`
    indices behind (no memory grows with the epoch). wharf's DistributedSampler needs no
    wrapper: it gives the dataset its plan itself."""

    def __init__(self, sampler: Iterable[int], dataset, window: int = 512):
        self.sampler, self.dataset, self.window = sampler, dataset, window

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        import itertools
        mine, plan = itertools.tee(iter(self.sampler))
        plan_ref = [plan]
        del plan  # held only through plan_ref, so dropping it frees tee's buffer

        def planned():
            while plan_ref[0] is not None:
                i = next(plan_ref[0], None)
                if i is None:
                    return
                yield i

        self.dataset.read_ahead(planned(), window=self.window)
        for n, i in enumerate(mine):
            if n == self.window and not self.dataset._reading_ahead():
                plan_ref[0] = None  # never started here: let tee's buffer go
                self.dataset.read_ahead(None)
            yield i
