"""wharf: fast object-store I/O for machine learning.

    import wharf
    store = wharf.Store("s3://bucket/train/")      # or gs://..., file:///path
    for obj in store.list():                        # key, size, etag, mtime
        buf = store.get(obj["key"])                 # zero-copy: memoryview(buf), numpy.frombuffer
    bufs = store.get_many([o["key"] for o in store.list()])   # through the I/O engine

Datasets for PyTorch live in wharf.torch. Errors raise wharf.WharfError (an OSError);
NotFoundError is also a FileNotFoundError and PermissionDeniedError a PermissionError.
"""
from wharf._wharf import Buffer, NotFoundError, PermissionDeniedError, Store, WharfError

__all__ = ["Buffer", "NotFoundError", "PermissionDeniedError", "Store", "WharfError"]
