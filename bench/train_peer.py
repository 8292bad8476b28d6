"""One simulated training run for bench/train_bench.py, run as its own subprocess.

    python bench/train_peer.py --loader KIND --workers N --endpoint URL --bucket B --prefix P
                               --batch-size 64 --batches N --compute-ms C [--seed 0] ...

A DLIO-style loop: a torch DataLoader yields batches and every batch "computes" for
--compute-ms (time.sleep, the accelerator's step). The loop stops after --batches batches.

Loaders (KIND), all yielding the same thing: a batch is (keys, uint8 tensor [batch, size]),
stacked by the same collate function wherever the DataLoader runs it (the main process with
num_workers=0, else the worker, which hands the tensor over in shared memory):
  wharf-iter   wharf.torch.IterableDataset.from_prefix(shuffle=True, seed, batch_size_hint=batch)
  wharf-map    wharf.torch.MapDataset.from_prefix + wharf's DistributedSampler (whose known
               order lets the dataset read ahead with num_workers=0): the DataLoader calls
               __getitems__ with the whole batch (one engine batch)
  wharf-tar    wharf.torch.IterableDataset.from_shards(format="tar", shuffle=True, seed,
               shuffle_buffer); each tar member <key>.bin is one sample
  boto3-map    the common recipe: map-style Dataset, keys listed once in the main process
               (ListObjectsV2 paginator), __getitem__ = get_object()['Body'].read() with one
               boto3 client per process created lazily (so per DataLoader worker)
  s3torch-map  s3torchconnector S3MapDataset.from_prefix(endpoint, S3ClientConfig(
               force_path_style=True)), transform = reader.read(); RandomSampler

Timing (perf_counter): setup_s = dataset construction (listing included) and DataLoader; t0 =
before iter(loader); t_i = arrival of batch i; compute_i = measured sleep after batch i;
W = --warmup batches (the harness passes num_workers x prefetch_factor: the batches DataLoader
workers can bank while the first one is awaited, which would otherwise count as free).
  ttfb_s        t_1 - t0 (worker start-up and the first batch)
  au            sum(compute_W+1..n-1) / (t_n - t_W+1): steady state; the window from arrival
                W+1 to the last arrival holds the compute of batches W+1..n-1 and the waits
                for W+2..n
  rate          (n-1-W) * batch / (t_n - t_W+1), samples/s delivered in that window
  au_all, rate_all  the same from the first arrival (W = 0), for reference
  au_epoch      sum(compute_1..n) / (t_end - t0), start-up included (DLIO's epoch AU)
  rate_epoch    n * batch / (t_end - t0)
Verification: exactly --batches batches of --batch-size samples, every sample --expect-size
bytes, every key distinct (one epoch, no repeats). Anything else is an error (exit 1).

Output: one JSON line on stdout (cpu_before_s: the CPU of the imports, to subtract).
Credentials and endpoint come from the environment (AWS_*, WHARF_S3_ENDPOINT).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback

import numpy as np

EXPECT_SIZE = 0  # set in main; read by collate in forked DataLoader workers


def cpu_now() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


# ------------------------------------------------------------------ sample -> (key, bytes)
# Module-level functions: DataLoader workers (fork or spawn) must be able to pickle them.
def _wharf_kv(sample):
    return sample.key, sample.data


def _tar_kv(sample):
    return sample.key, sample.data["bin"]


def _s3torch_kv(reader):
    return reader.key, reader.read()


def collate(items):
    """[(key, bytes-like)] -> (keys, uint8 tensor [n, size]): one copy of every sample."""
    import torch
    import torch.utils.data

    size = EXPECT_SIZE
    if torch.utils.data.get_worker_info() is not None:
        # In a worker, allocate the batch in shared memory as default_collate does, so it
        # reaches the main process without another copy.
        elem = torch.empty(0, dtype=torch.uint8)
        storage = elem._typed_storage()._new_shared(len(items) * size, device=elem.device)
        batch = elem.new(storage).resize_(len(items), size)
    else:
        batch = torch.empty((len(items), size), dtype=torch.uint8)
    out = batch.numpy()
    keys = []
    for i, (key, data) in enumerate(items):
        view = np.frombuffer(data, dtype=np.uint8)
        if view.size != size:
            raise ValueError(f"sample {key}: {view.size} bytes, expected {size}")
        out[i] = view
        keys.append(key)
    return keys, batch


class Boto3MapDataset:
    """The usual boto3 recipe: keys listed up front, one lazily created client per process."""

    def __init__(self, endpoint: str, bucket: str, keys: list[str]):
        self.endpoint, self.bucket, self.keys = endpoint, bucket, keys
        self._client = None
        self._pid = None

    def _c(self):
        if self._client is None or self._pid != os.getpid():
            self._client = boto3_client(self.endpoint)
            self._pid = os.getpid()
        return self._client

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        key = self.keys[i]
        return key, self._c().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_client"] = None
        state["_pid"] = None
        return state


def boto3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint,
                        region_name=os.environ.get("AWS_REGION", "us-east-1"),
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 5, "mode": "standard"}))


def build_loader(a):
    """(DataLoader, config string); the dataset's listing happens here."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    uri = f"s3://{a.bucket}/{a.prefix}"
    common = dict(batch_size=a.batch_size, num_workers=a.workers, collate_fn=collate)
    if a.workers > 0:
        common["prefetch_factor"] = a.prefetch_factor
    gen = torch.Generator()
    gen.manual_seed(a.seed)
    if a.loader == "wharf-iter":
        from wharf.torch import IterableDataset

        kw = {} if a.prefetch is None else {"prefetch": a.prefetch}
        ds = IterableDataset.from_prefix(uri, shuffle=True, seed=a.seed,
                                         batch_size_hint=a.batch_size, transform=_wharf_kv, **kw)
        prefetch = ds._stream_options.get("prefetch")  # the effective value, default included
        cfg = (f"IterableDataset.from_prefix(shuffle, seed={a.seed}, batch_size_hint="
               f"{a.batch_size}, prefetch={prefetch}{'' if a.prefetch else ' (default)'})")
        return DataLoader(ds, **common), cfg, len(ds.index)
    if a.loader == "wharf-map":
        from wharf.torch import DistributedSampler, MapDataset

        ds = MapDataset.from_prefix(uri, transform=_wharf_kv)
        # wharf's sampler: the order is known, so with num_workers=0 the dataset reads ahead
        # of the loop (with workers, each worker fetches its batches as before).
        return (DataLoader(ds, sampler=DistributedSampler(ds, seed=a.seed), **common),
                "MapDataset.from_prefix + wharf DistributedSampler (read-ahead with 0 workers; "
                "__getitems__: one engine batch)", len(ds))
    if a.loader == "wharf-tar":
        from wharf.torch import IterableDataset

        ds = IterableDataset.from_shards(uri, format="tar", shuffle=True, seed=a.seed,
                                         shuffle_buffer=a.shuffle_buffer, transform=_tar_kv)
        return (DataLoader(ds, **common),
                f"IterableDataset.from_shards(format=tar, shuffle, seed={a.seed}, "
                f"shuffle_buffer={a.shuffle_buffer}), {len(ds.shards)} shards", None)
    if a.loader == "boto3-map":
        client = boto3_client(a.endpoint)
        keys = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=a.bucket,
                                                                      Prefix=a.prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        ds = Boto3MapDataset(a.endpoint, a.bucket, keys)
        return (DataLoader(ds, sampler=RandomSampler(ds, generator=gen), **common),
                "boto3 map-style Dataset (get_object().read(), a client per worker) + "
                "RandomSampler", len(ds))
    if a.loader == "s3torch-map":
        from s3torchconnector import S3ClientConfig, S3MapDataset

        ds = S3MapDataset.from_prefix(uri, region=os.environ.get("AWS_REGION", "us-east-1"),
                                      endpoint=a.endpoint,
                                      s3client_config=S3ClientConfig(force_path_style=True),
                                      transform=_s3torch_kv)
        n = len(ds)  # lists in the main process (the workers get the listed keys)
        return (DataLoader(ds, sampler=RandomSampler(ds, generator=gen), **common),
                "s3torchconnector S3MapDataset.from_prefix(S3ClientConfig(force_path_style)) "
                "+ RandomSampler, transform=reader.read()", n)
    raise ValueError(f"unknown loader {a.loader}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def run(a) -> dict:
    global EXPECT_SIZE
    EXPECT_SIZE = a.expect_size
    compute = a.compute_ms / 1000.0
    t_setup = time.perf_counter()
    loader, config, dataset_len = build_loader(a)
    setup_s = time.perf_counter() - t_setup

    arrivals: list[float] = []
    computes: list[float] = []
    keys_seen: set = set()
    samples = nbytes = 0
    problems: list[str] = []
    t0 = time.perf_counter()
    it = iter(loader)
    for i in range(a.batches):
        try:
            keys, batch = next(it)
        except StopIteration:
            problems.append(f"the loader ended after {i} of {a.batches} batches")
            break
        arrivals.append(time.perf_counter())
        if tuple(batch.shape) != (a.batch_size, a.expect_size) or len(keys) != a.batch_size:
            problems.append(f"batch {i}: shape {tuple(batch.shape)}, {len(keys)} keys")
        samples += len(keys)
        nbytes += batch.numel()
        keys_seen.update(keys)
        c0 = time.perf_counter()
        if compute > 0:
            time.sleep(compute)  # the accelerator's step
        computes.append(time.perf_counter() - c0)
    t_end = time.perf_counter()
    del it  # shuts the workers down and reaps them: their CPU lands in RUSAGE_CHILDREN
    expect = a.batches * a.batch_size
    if samples != expect:
        problems.append(f"read {samples}/{expect} samples")
    if len(keys_seen) != samples:
        problems.append(f"{samples - len(keys_seen)} repeated keys")
    if nbytes != expect * a.expect_size:
        problems.append(f"read {nbytes:,}/{expect * a.expect_size:,} bytes")

    n = len(arrivals)
    w = a.warmup
    out = {"loader": a.loader, "workers": a.workers, "config": config,
           "dataset_len": dataset_len, "compute_ms": a.compute_ms, "batch_size": a.batch_size,
           "batches": n, "samples": samples, "bytes": nbytes, "unique_keys": len(keys_seen),
           "warmup": w, "setup_s": setup_s, "run_s": t_end - t0, "problems": problems}
    if n >= w + 2:
        window = arrivals[-1] - arrivals[w]
        full = arrivals[-1] - arrivals[0]
        waits = [arrivals[j] - (arrivals[j - 1] + computes[j - 1]) for j in range(w + 1, n)]
        out.update(
            ttfb_s=arrivals[0] - t0, steady_s=window,
            au=sum(computes[w:-1]) / window if window > 0 else 0.0,
            rate=(n - 1 - w) * a.batch_size / window if window > 0 else 0.0,
            au_all=sum(computes[:-1]) / full if full > 0 else 0.0,
            rate_all=(n - 1) * a.batch_size / full if full > 0 else 0.0,
            au_epoch=sum(computes) / (t_end - t0),
            rate_epoch=samples / (t_end - t0),
            wait_p50_ms=1000 * pct(waits, 0.5), wait_p95_ms=1000 * pct(waits, 0.95),
            wait_max_ms=1000 * max(waits), compute_s=sum(computes))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loader", required=True,
                   choices=["wharf-iter", "wharf-map", "wharf-tar", "boto3-map", "s3torch-map"])
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--prefetch-factor", type=int, default=2, help="DataLoader prefetch_factor")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--compute-ms", type=float, required=True)
    p.add_argument("--warmup", type=int, default=0,
                   help="batches before the steady-state window (counted in --batches)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--expect-size", type=int, required=True, help="bytes per sample")
    p.add_argument("--prefetch", type=int, help="wharf-iter: samples read ahead (default: "
                   "the library's)")
    p.add_argument("--shuffle-buffer", type=int, default=1000, help="wharf-tar")
    a = p.parse_args()
    if a.batches < a.warmup + 2:
        p.error("--batches must be >= --warmup + 2")

    import warnings

    warnings.filterwarnings("ignore", message=".*not writable.*")
    # The heavy imports before the clock (they are not I/O).
    import torch  # noqa: F401
    import torch.utils.data  # noqa: F401
    if a.loader.startswith("wharf"):
        import wharf.torch  # noqa: F401
    elif a.loader == "boto3-map":
        import boto3  # noqa: F401
    else:
        import s3torchconnector  # noqa: F401
    cpu_before = cpu_now()
    try:
        result = run(a)
    except Exception as e:  # noqa: BLE001 - reported as a FAILED run
        result = {"loader": a.loader, "problems": [f"{type(e).__name__}: {e}"],
                  "traceback": traceback.format_exc()[-2000:]}
    result["cpu_before_s"] = cpu_before
    result["cpu_after_s"] = cpu_now()
    print(json.dumps(result), flush=True)
    return 1 if result.get("problems") else 0


if __name__ == "__main__":
    sys.exit(main())
