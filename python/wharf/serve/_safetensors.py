"""Safetensors models read straight into tensors (serve/model_loader.h, docs/design/serve.md).

load_safetensors() gives what safetensors.torch.load_file gives (same names, dtypes, shapes,
bytes; each tensor with storage of its own); iter_safetensors() yields each tensor as soon as
its bytes are in, so moving it to an accelerator overlaps the reads still in flight.
"""
from __future__ import annotations

import os
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
    out = [os.fsdecode(u) for u in uris]
    if not out:
        raise ValueError("load safetensors: no file named")
    return out


def _open(uris: UriArg, max_in_flight: int, store_options: dict):
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 0:
        raise ValueError(f"load safetensors: max_in_flight must be an int >= 0 (0: the "
                         f"runtime's setting), got {max_in_flight!r}")
    return _wharf._SafetensorsLoad(_uris(uris), max_in_flight=max_in_flight, **store_options)


def _stream(load, device) -> Iterator[Tuple[str, torch.Tensor]]:
    """Allocates the tensors, starts the reads, yields each tensor as it completes."""
    device = torch.device(device)
    pin = device.type == "cuda" and torch.cuda.is_available()
    files = load.files
    tensors: List[torch.Tensor] = []
    names: List[str] = []
    for name, dtype, shape, _nbytes, file in load.tensors:
        tdtype = _DTYPES.get(dtype)
        if tdtype is None:
            raise ValueError(f"{files[file]['uri']}: tensor '{name}': dtype {dtype} has no torch "
                             f"dtype in torch {torch.__version__}")
        if dtype == "F4":
            # Two 4-bit values per element of torch's float4_e2m1fn_x2: the last dimension
            # halves (as safetensors.torch gives it).
            shape = list(shape)
            if not shape or shape[-1] % 2:
                raise ValueError(f"{files[file]['uri']}: tensor '{name}': an F4 tensor needs an "
                                 f"even last dimension for torch's float4_e2m1fn_x2, not {shape}")
            shape[-1] //= 2
        try:
            tensors.append(torch.empty(shape, dtype=tdtype, pin_memory=pin))
        except (RuntimeError, TypeError, OverflowError) as e:  # a shape torch cannot hold
            raise ValueError(f"{files[file]['uri']}: tensor '{name}': torch cannot make a "
                             f"tensor of shape {list(shape)}: {str(e).splitlines()[0]}") from None
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
                t = t.to(device, non_blocking=pin)
            yield names[i], t
    finally:
        load.close()


def iter_safetensors(uris: UriArg, device: Union[str, int, torch.device] = "cpu", *,
                     max_in_flight: int = 0, **store_options
                     ) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yields (name, tensor) for every tensor of `uris` as soon as its bytes are complete.

    `uris`: one safetensors file, a list of them, or a Hugging Face index
    (`model.safetensors.index.json`, whose shards are read) on any wharf URI (s3://, gs://,
    file://, a local path, a path inside a tier); `store_options` are wharf.Store's (endpoint=,
    profile=, cache="TIER_DIR" to read through a tier, ...). `device`: tensors are read into
    CPU memory (pinned when the device is CUDA) and moved there as each completes.
    `max_in_flight`: ranged GETs at once (0: the runtime's setting, else 64).
    Errors: wharf.NotFoundError for a missing file; wharf.WharfError naming the file and the
    tensor for a malformed file or a file replaced during the load; ValueError for a dtype
    this torch cannot hold. Leaving the loop early cancels the reads still in flight."""
    # The device and the files (their headers) are checked now, not at the first next().
    _check_device(device)
    load = _open(uris, max_in_flight, store_options)
    return _stream(load, device)


def _check_device(device) -> None:
    """A device this process cannot place tensors on is refused before anything is read."""
    try:
        dev = torch.device(device)
        if dev.type != "cpu":
            torch.empty(0, device=dev)
    except (RuntimeError, AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"wharf.serve: cannot place tensors on device {device!r}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def load_safetensors(uris: UriArg, device: Union[str, int, torch.device] = "cpu", *,
                     max_in_flight: int = 0, **store_options) -> Dict[str, torch.Tensor]:
    """The tensors of `uris` as a dict, like safetensors.torch.load_file (one file, a list of
    files, or an index JSON; see iter_safetensors for the arguments and errors). Ordered as
    the files were named (an index's shards sorted by name), by offset within a file (as
    load_file orders them)."""
    _check_device(device)
    load = _open(uris, max_in_flight, store_options)
    order = [name for name, *_ in load.tensors]
    got = dict(_stream(load, device))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {name: got[name] for name in order}
