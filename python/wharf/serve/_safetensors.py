"""Safetensors models read straight into tensors (serve/model_loader.h, docs/design/serve.md).

load_safetensors() gives what safetensors.torch.load_file gives (same names, dtypes, shapes,
bytes; each tensor with storage of its own); iter_safetensors() yields each tensor as soon as
its bytes are in, so moving it to an accelerator overlaps the reads still in flight.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List, Sequence, Tuple, Union

import torch

from wharf import _wharf

UriArg = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

# The safetensors dtype names torch can hold (as safetensors.torch maps them).
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
                     ("F8_E5M2", "float8_e5m2"), ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
                     ("F8_E8M0", "float8_e8m0fnu"), ("U64", "uint64"), ("U32", "uint32"),
                     ("U16", "uint16"), ("F4", "float4_e2m1fn_x2")):
    if hasattr(torch, _attr):
        _DTYPES[_name] = getattr(torch, _attr)


def _uris(uris: UriArg) -> List[str]:
    # A bytes path is one path (iterating it would give ints).
    if isinstance(uris, (str, bytes, os.PathLike)):
        return [os.fsdecode(uris)]
    try:
        out = [os.fsdecode(u) for u in uris]
    except TypeError:
        raise TypeError(f"load safetensors: uri_or_uris is a URI or path, a list of them, or an "
                        f"index.json URI, not {uris!r}") from None
    if not out:
        raise ValueError("load safetensors: no file named")
    return out


def _open(uris: UriArg, max_in_flight: int, store_options: dict):
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 0:
        raise ValueError(f"load safetensors: max_in_flight must be an int >= 0 (0: the "
                         f"runtime's setting), got {max_in_flight!r}")
    return _wharf._SafetensorsLoad(_uris(uris), max_in_flight=max_in_flight, **store_options)


def _allocate(uri, name, dtype, shape, device=None) -> torch.Tensor:
    """An empty tensor for a safetensors entry; a dtype or shape torch cannot hold is a
    ValueError naming the file and the tensor."""
    tdtype = _DTYPES.get(dtype)
    if tdtype is None:
        raise ValueError(f"{uri}: tensor '{name}': dtype {dtype} has no torch "
                         f"dtype in torch {torch.__version__}")
    if dtype == "F4":
        # Two 4-bit values per element of torch's float4_e2m1fn_x2: the last dimension
        # halves (as safetensors.torch gives it).
        shape = list(shape)
        if not shape or shape[-1] % 2:
            raise ValueError(f"{uri}: tensor '{name}': an F4 tensor needs an "
                             f"even last dimension for torch's float4_e2m1fn_x2, not {shape}")
        shape[-1] //= 2
    try:
        return torch.empty(shape, dtype=tdtype, device=device)
    except (RuntimeError, TypeError, OverflowError) as e:  # a shape torch cannot hold
        raise ValueError(f"{uri}: tensor '{name}': torch cannot make a "
                         f"tensor of shape {list(shape)}: {str(e).splitlines()[0]}") from None


def _stream(load, device) -> Iterator[Tuple[str, torch.Tensor]]:
    """Allocates the tensors, starts the reads, yields each tensor as it completes."""
    device = torch.device(device)
    if device.type == "cuda":
        yield from _stream_staged(load, device)
        return
    files = load.files
    tensors: List[torch.Tensor] = []
    names: List[str] = []
    for name, dtype, shape, _nbytes, file, _offset in load.tensors:
        tensors.append(_allocate(files[file]["uri"], name, dtype, shape))
        names.append(name)
    # The tensors stay referenced here until the reads have ended (close() waits for them).
    load.start([t.data_ptr() if t.numel() else 0 for t in tensors])
    try:
        while True:
            i = load.next()
            if i is None:
                return
            t = tensors[i]
            if device.type != "cpu":
                t = t.to(device)
            yield names[i], t
    finally:
        load.close()


# Staging for loads onto an accelerator: this many pinned buffers of this many bytes.
_STAGING_BUFFERS = 4
_STAGING_BYTES = 64 << 20


def _windows(tensors, window: int) -> list:
    """Cuts the tensors' bytes (in load order) into windows of at most `window` bytes: per
    window, pieces (tensor index, offset in the tensor, file, offset in the file, size, offset
    in the window). A tensor larger than a window spans several; an empty one is a piece of
    size 0 (handed out in its place)."""
    windows, cur, used = [], [], 0
    for i, (_name, _dtype, _shape, nbytes, file, offset) in enumerate(tensors):
        done = 0
        while True:
            n = min(nbytes - done, window - used)
            cur.append((i, done, file, offset + done, n, used))
            used += n
            done += n
            if used == window:
                windows.append(cur)
                cur, used = [], 0
            if done == nbytes:
                break
    if cur:
        windows.append(cur)
    return windows


def _stream_staged(load, device, window: int = 0, buffers: int = 0
                   ) -> Iterator[Tuple[str, torch.Tensor]]:
    """The tensors made on `device` and filled through a few pinned staging buffers: each
    window of the files' bytes is read into a buffer (several windows in flight) and copied to
    the device asynchronously while later windows are read; a buffer is refilled once the
    device has copied out of it. Host memory stays at buffers x window whatever the model's
    size. A tensor is handed out once its last piece's copy is enqueued (on the current
    stream, so work the caller queues after it sees the bytes)."""
    window = window or _STAGING_BYTES
    buffers = buffers or _STAGING_BUFFERS
    cuda = device.type == "cuda"
    files = load.files
    meta = load.tensors
    out = [_allocate(files[file]["uri"], name, dtype, shape, device=device)
           for name, dtype, shape, _nbytes, file, _offset in meta]
    flat = [t.reshape(-1).view(torch.uint8) if t.numel() else None for t in out]
    plan = _windows(meta, window)
    total = sum(m[3] for m in meta)
    size = min(window, max(total, 1))
    slabs = [torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
             for _ in range(min(buffers, len(plan)))]
    base = [s.data_ptr() for s in slabs]
    pool = ThreadPoolExecutor(max_workers=max(1, len(slabs)), thread_name_prefix="wharf-stage")
    pending = {}

    def read(k, after):
        if after is not None:
            after.synchronize()  # the device has copied the buffer's previous window out
        slab = base[k % len(slabs)]
        load.read_spans([(f, off, n, slab + at) for _i, _t, f, off, n, at in plan[k] if n])

    try:
        for k in range(len(slabs)):
            pending[k] = pool.submit(read, k, None)
        for k, pieces in enumerate(plan):
            pending.pop(k).result()
            slab = slabs[k % len(slabs)]
            done = []
            for i, at_t, _f, _off, n, at in pieces:
                if n:
                    flat[i][at_t:at_t + n].copy_(slab[at:at + n], non_blocking=cuda)
                if at_t + n == meta[i][3]:
                    done.append(i)
            after = None
            if cuda:
                after = torch.cuda.Event()
                after.record()
            if k + len(slabs) < len(plan):
                pending[k + len(slabs)] = pool.submit(read, k + len(slabs), after)
            for i in done:
                yield meta[i][0], out[i]
    finally:
        if pending:
            load.close()  # cancels the reads still in flight
        pool.shutdown(wait=True)  # and waits for them
        if cuda:
            # The buffers are freed after the copies out of them (torch's pinned memory
            # allocator also waits for them; this keeps it independent of that).
            torch.cuda.current_stream(device).synchronize()


def _uri_arg(uri_or_uris, uris, fn: str) -> UriArg:
    """The files argument, given positionally or as uri_or_uris= or (the older name) uris=."""
    if uri_or_uris is None and uris is None:
        raise TypeError(f"wharf.serve.{fn}() missing its first argument: uri_or_uris")
    if uri_or_uris is not None and uris is not None:
        raise TypeError(f"wharf.serve.{fn}() got both uri_or_uris and uris")
    return uri_or_uris if uri_or_uris is not None else uris


def iter_safetensors(uri_or_uris: UriArg = None,
                     device: Union[str, int, torch.device] = "cpu", *,
                     max_in_flight: int = 0, uris: UriArg = None, **store_options
                     ) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yields (name, tensor) for every tensor of `uri_or_uris` as soon as its bytes are
    complete.

    `uri_or_uris` (also accepted as `uris=`): one safetensors file, a list of them, or a
    Hugging Face index (`model.safetensors.index.json`, whose shards are read) on any wharf
    URI (s3://, gs://,
    file://, a local path, a path inside a tier); `store_options` are wharf.Store's (endpoint=,
    profile=, cache="TIER_DIR" to read through a tier, ...). `device`: onto a CUDA device
    the tensors are made there and filled through a few pinned buffers (4 x 64 MiB), each
    tensor handed out once its copy is queued on the current stream: host memory stays
    bounded whatever the model's size; elsewhere they are read into CPU memory (and moved to
    another device as each completes).
    `max_in_flight`: ranged GETs at once (0: the runtime's setting, else 64).
    Errors: wharf.NotFoundError for a missing file; wharf.DataLossError (a WharfError and a
    ValueError) naming the file and the tensor for a malformed file; wharf.WharfError for a
    file replaced during the load; ValueError for a dtype this torch cannot hold. Leaving the loop early cancels the reads still in flight."""
    # The device and the files (their headers) are checked now, not at the first next().
    uris = _uri_arg(uri_or_uris, uris, "iter_safetensors")
    _check_device(device)
    load = _open(uris, max_in_flight, store_options)
    return _stream(load, device)


def _check_device(device) -> None:
    """A device this process cannot place tensors on is refused before anything is read."""
    try:
        dev = torch.device(device)
        if dev.type == "meta":  # as safetensors refuses it
            raise ValueError("meta tensors hold no bytes, and a load reads them all")
        if dev.type != "cpu":
            torch.empty(0, device=dev)
    except (RuntimeError, AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"wharf.serve: cannot place tensors on device {device!r}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def load_safetensors(uri_or_uris: UriArg = None,
                     device: Union[str, int, torch.device] = "cpu", *,
                     max_in_flight: int = 0, uris: UriArg = None,
                     **store_options) -> Dict[str, torch.Tensor]:
    """The tensors of `uri_or_uris` as a dict, like safetensors.torch.load_file (one file, a
    list of files, or an index JSON; see iter_safetensors for the arguments and errors).
    Ordered as the files were named (an index's shards sorted by name), by offset within a
    file (as load_file orders them)."""
    uris = _uri_arg(uri_or_uris, uris, "load_safetensors")
    _check_device(device)
    load = _open(uris, max_in_flight, store_options)
    order = [name for name, *_ in load.tensors]
    got = dict(_stream(load, device))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {name: got[name] for name in order}
