"""wharf: fast object-store I/O for machine learning.

    import wharf
    store = wharf.Store("s3://bucket/train/")      # or gs://..., file:///path
    for obj in store.list():                        # key, size, etag, mtime
        buf = store.get(obj["key"])                 # zero-copy: memoryview(buf), numpy.frombuffer
    bufs = store.get_many([o["key"] for o in store.list()])   # through the I/O engine

The dataset core, for any framework (see docs/design/python.md):

    index = wharf.SampleIndex.from_prefix("s3://bucket/train/")    # or from_manifest, from_keys
    reader = wharf.SampleReader(index)            # get(i), get_batch([i, ...]): one engine batch
    stream = wharf.SampleStream(index, seed=0, epoch=0, rank=0, world_size=8)  # (i, key, Buffer)
    records = wharf.RecordStream(wharf.SampleIndex.from_keys(uri, shards), "tar")

PyTorch datasets live in wharf.torch (`import wharf` does not import torch). Errors raise
wharf.WharfError (an OSError); NotFoundError is also a FileNotFoundError and
PermissionDeniedError a PermissionError; invalid arguments raise ValueError.
"""
from wharf._wharf import (Buffer, NotFoundError, PermissionDeniedError, RecordStream,
                          SampleIndex, SampleReader, Sampler, SampleStream, Store, WharfError,
                          consumed_after, parse_sampler_state, split_csv)

__all__ = ["Buffer", "NotFoundError", "PermissionDeniedError", "RecordStream", "SampleIndex",
           "SampleReader", "Sampler", "SampleStream", "Store", "WharfError", "consumed_after",
           "parse_sampler_state", "split_csv"]
