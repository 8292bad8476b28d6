"""In-process Python peers for bench/run_bench.py, each run as its own subprocess.

run_bench.py runs this file once per measurement so that every Python client's CPU time and
peak RSS are measured exactly like the command-line clients' (os.wait4 on the child). The
timed section starts after the imports; the JSON line printed at the end carries the CPU the
process had used before it (``cpu_before_s``, mostly imports) so the harness can subtract it.

    python bench/peer.py MODE --endpoint URL --bucket B --prefix P [options]

Modes (each used the way its own documentation recommends for throughput):
  boto3        one shared boto3 client (max_pool_connections=50, path-style), list with the
               ListObjectsV2 paginator, then ThreadPoolExecutor(50) of get_object()['Body'].read()
  s3fs         s3fs.S3FileSystem (path-style, max_pool_connections=64): fs.find(prefix), then
               fs.cat(paths) -- fsspec's batched concurrent read
  s3torch      s3torchconnector S3IterableDataset.from_prefix(enable_sharding=True) in a
               torch DataLoader(num_workers=W, batch_size=None), each item read whole
               (the README's multi-worker recipe); S3ClientConfig(force_path_style=True)
  s3torch-threads  s3torchconnector's S3Client shared by a ThreadPoolExecutor(50), one
               get_object(...).read() per key (the keys listed with S3Client.list_objects)
  boto3-list   ListObjectsV2 paginator over the prefix (listing reference)

Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
Output: one JSON object on stdout: objects, bytes, seconds, cpu_before_s, and details.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def cpu_now() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _boto3_client(endpoint: str, pool: int):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(
            max_pool_connections=pool,
            s3={"addressing_style": "path"},
            retries={"max_attempts": 5, "mode": "standard"},
        ),
    )


def _boto3_list(client, bucket: str, prefix: str) -> list[tuple[str, int]]:
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out.append((o["Key"], o["Size"]))
    return out


def run_boto3(a) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    client = _boto3_client(a.endpoint, a.concurrency)
    keys = [k for k, _ in _boto3_list(client, a.bucket, a.prefix)]

    def get(key: str) -> int:
        return len(client.get_object(Bucket=a.bucket, Key=key)["Body"].read())

    with ThreadPoolExecutor(a.concurrency) as pool:
        sizes = list(pool.map(get, keys))
    return {"objects": len(sizes), "bytes": sum(sizes), "seconds": time.perf_counter() - t0,
            "config": f"ThreadPoolExecutor({a.concurrency}), max_pool_connections={a.concurrency}"}


def run_boto3_list(a) -> dict:
    t0 = time.perf_counter()
    client = _boto3_client(a.endpoint, 10)
    listed = _boto3_list(client, a.bucket, a.prefix)
    return {"objects": len(listed), "bytes": sum(s for _, s in listed),
            "seconds": time.perf_counter() - t0, "config": "list_objects_v2 paginator"}


def run_s3fs(a) -> dict:
    import s3fs

    t0 = time.perf_counter()
    fs = s3fs.S3FileSystem(
        key=os.environ["AWS_ACCESS_KEY_ID"],
        secret=os.environ["AWS_SECRET_ACCESS_KEY"],
        endpoint_url=a.endpoint,
        client_kwargs={"region_name": os.environ.get("AWS_REGION", "us-east-1")},
        config_kwargs={"s3": {"addressing_style": "path"},
                       "max_pool_connections": a.concurrency},
        use_listings_cache=False,
    )
    paths = fs.find(f"{a.bucket}/{a.prefix}")
    n = nbytes = 0
    # fs.cat returns every object's bytes in one dict; bound the memory that can pin by
    # splitting only when the listed data exceeds --max-batch-bytes (S2's big objects).
    sizes = {}
    batch, batch_bytes, batches = [], 0, []
    if a.max_batch_bytes > 0:
        info = fs.find(f"{a.bucket}/{a.prefix}", detail=True)
        sizes = {p: d.get("size", 0) for p, d in info.items()}
    for p in paths:
        s = sizes.get(p, 0)
        if batch and a.max_batch_bytes > 0 and batch_bytes + s > a.max_batch_bytes:
            batches.append(batch)
            batch, batch_bytes = [], 0
        batch.append(p)
        batch_bytes += s
    if batch:
        batches.append(batch)
    for b in batches:
        out = fs.cat(b, on_error="raise")
        if isinstance(out, bytes):  # a single path returns bytes, not a dict
            out = {b[0]: out}
        n += len(out)
        nbytes += sum(len(v) for v in out.values())
        del out
    return {"objects": n, "bytes": nbytes, "seconds": time.perf_counter() - t0,
            "config": f"fs.cat(paths) in {len(batches)} call(s), max_pool_connections={a.concurrency}"}


def _s3torch_len(obj) -> int:  # module level: DataLoader workers must pickle it
    return len(obj.read())


def _s3torch_config():
    from s3torchconnector import S3ClientConfig

    return S3ClientConfig(force_path_style=True)


def run_s3torch(a) -> dict:
    from s3torchconnector import S3IterableDataset
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    ds = S3IterableDataset.from_prefix(
        f"s3://{a.bucket}/{a.prefix}",
        region=os.environ.get("AWS_REGION", "us-east-1"),
        endpoint=a.endpoint,
        s3client_config=_s3torch_config(),
        transform=_s3torch_len,
        enable_sharding=True,
    )
    loader = DataLoader(ds, batch_size=None, num_workers=a.workers,
                        persistent_workers=False)
    n = nbytes = 0
    it = iter(loader)
    for size in it:
        n += 1
        nbytes += int(size)
    del it  # joins the workers, so their CPU lands in RUSAGE_CHILDREN
    return {"objects": n, "bytes": nbytes, "seconds": time.perf_counter() - t0,
            "config": f"S3IterableDataset(enable_sharding) + DataLoader(num_workers={a.workers})"}


def run_s3torch_threads(a) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from s3torchconnector._s3client import S3Client

    t0 = time.perf_counter()
    client = S3Client(os.environ.get("AWS_REGION", "us-east-1"), endpoint=a.endpoint,
                      s3client_config=_s3torch_config())
    keys = []
    for page in client.list_objects(a.bucket, a.prefix):
        keys.extend(o.key for o in page.object_info)

    def get(key: str) -> int:
        return len(client.get_object(a.bucket, key).read())

    with ThreadPoolExecutor(a.concurrency) as pool:
        sizes = list(pool.map(get, keys))
    return {"objects": len(sizes), "bytes": sum(sizes), "seconds": time.perf_counter() - t0,
            "config": f"S3Client + ThreadPoolExecutor({a.concurrency})"}


MODES = {
    "boto3": run_boto3,
    "boto3-list": run_boto3_list,
    "s3fs": run_s3fs,
    "s3torch": run_s3torch,
    "s3torch-threads": run_s3torch_threads,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--workers", type=int, default=8, help="DataLoader num_workers (s3torch)")
    p.add_argument("--max-batch-bytes", type=int, default=0,
                   help="s3fs: split fs.cat calls above this many bytes (0 = one call)")
    a = p.parse_args()

    fn = MODES[a.mode]
    # Import the heavy modules before the clock starts (they are not I/O).
    if a.mode.startswith("s3torch"):
        import s3torchconnector  # noqa: F401
        import torch  # noqa: F401
    elif a.mode == "s3fs":
        import s3fs  # noqa: F401
    else:
        import boto3  # noqa: F401
    cpu_before = cpu_now()
    result = fn(a)
    result["cpu_before_s"] = cpu_before
    result["cpu_after_s"] = cpu_now()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
