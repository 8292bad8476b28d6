"""wharf: fast object-store I/O for machine learning.

    import wharf
    store = wharf.Store("s3://bucket/train/")      # or gs://..., file:///path
    for obj in store.list():                        # key, size, etag, mtime
        buf = store.get(obj["key"])                 # zero-copy: memoryview(buf), numpy.frombuffer
    bufs = store.get_many(store.list())   # through the I/O engine (keys work too)
    with wharf.open("s3://bucket/out.bin", "wb") as f:   # a file object; "rb" seeks anywhere
        f.write(data)                                   # appears whole at close, never on error

The dataset core, for any framework (see docs/design/python.md):

    index = wharf.SampleIndex.from_prefix("s3://bucket/train/")    # or from_manifest, from_keys
    reader = wharf.SampleReader(index)            # get(i), get_batch([i, ...]): one engine batch
    stream = wharf.SampleStream(index, seed=0, epoch=0, rank=0, world_size=8)  # (i, key, Buffer)
    records = wharf.RecordStream(wharf.SampleIndex.from_keys(uri, shards), "tar")

One runtime per process holds the memory budget every call above takes its buffers from
(docs/design/runtime.md); a `memory_budget=` argument is that call's cap inside it:

    wharf.configure(memory_budget="256M", inflight=128)   # or WHARF_MEMORY_BUDGET / _INFLIGHT
    wharf.metrics()["gauges"]["wharf_memory_budget_peak_bytes"]
    wharf.metrics_text()          # the same in Prometheus's text format (as /metrics serves it)

Where the time goes (docs/design/profiler.md); WHARF_PROFILE=1 does it for a whole process:

    with wharf.profile() as p:
        for batch in p.iterate(loader):
            step(batch)
    print(p.table()); p.verdict; p.trace     # a Chrome/Perfetto trace file

PyTorch datasets live in wharf.torch (`import wharf` does not import torch). Errors raise
wharf.WharfError (an OSError); NotFoundError is also a FileNotFoundError,
PermissionDeniedError a PermissionError, AlreadyExistsError a FileExistsError and
DataLossError (corrupt or malformed data: a record, a safetensors header) a ValueError; invalid
arguments raise ValueError.
"""
from wharf._wharf import (AlreadyExistsError, Buffer, DataLossError, NotFoundError, PermissionDeniedError, RecordStream,
                          SampleIndex, SampleReader, Sampler, SampleStream, Store, WharfError,
                          consumed_after, list_buckets, metrics, metrics_text,
                          parse_sampler_state, parse_size, split_csv)
from wharf._runtime import configure, split_budget_for_worker
from wharf._file import ObjectFile, open
from wharf._profile import Profile, profile

__all__ = ["AlreadyExistsError", "Buffer", "DataLossError", "NotFoundError", "PermissionDeniedError", "RecordStream", "SampleIndex",
           "SampleReader", "Sampler", "SampleStream", "Store", "WharfError", "consumed_after",
           "parse_sampler_state", "split_csv", "configure", "metrics", "metrics_text", "parse_size",
           "split_budget_for_worker", "open", "ObjectFile", "profile", "Profile", "list_buckets"]

# The subpackages load on first use, so `import wharf` then `wharf.torch.save(...)` works as
# `import wharf.torch` would, without importing torch (or redis, fsspec) for every user.
_SUBMODULES = ("torch", "serve", "fsspec", "lightning", "demo")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"wharf.{name}")
    raise AttributeError(f"module 'wharf' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))
