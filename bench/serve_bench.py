"""SERVE: the serving benchmarks of issue 14, run by bench/run_bench.py (its server, proxy and
report):

    .venv/bin/python bench/run_bench.py --scenario SERVE [--quick] [--repeat N] [--delays 0,25]
                                        [--serve-parts load,tier,cache] [--clients ...]
                                        [--serve-threads 8] [--serve-seconds 10]
    .venv/bin/python bench/serve_bench.py --render bench-results/bench-<time>.json

Model: a transformer-like state written with the `safetensors` library (safetensors.torch.
save_file) in the Hugging Face sharded layout: model-0000N-of-00004.safetensors and
model.safetensors.index.json ("weight_map"), 1.97 GiB in 4 shards of ~0.5 GiB (--quick: 0.24
GiB): embedding and lm_head matrices of 125 MiB (bf16 and fp16), 18 layers of attention (4 x 8
MiB, bf16, with 4 KiB biases) and MLP (3 x 22 MiB, bf16) matrices and fp32 norms of 8 KiB (220
tensors; --quick: hidden 1024, 5 layers, 64 tensors). Every tensor's elements come from one seeded pool
(randn x 0.02, per dtype) at a per-tensor offset, so a loaded model is checked in full, every
tensor's name, dtype, shape and every element, after the timed section: a broken loader cannot
win. The model is uploaded once (boto3, 64 MiB parts) to s3://wharf-bench/serve[-quick]/model/
and reused while its manifest (serve[-quick]/model-manifest.json, written last) matches.

Every measurement runs in a fresh process (python bench/serve_bench.py --worker ...), which
imports its libraries, then times the load alone (client creation included) until the tensors
are ready: the call returned and one byte of every 4 KiB page of every tensor was read (so a
lazily mapped load, safetensors' mmap, pays its reads inside the clock; for tensors already in
memory that pass takes a few ms; "call returned s" is reported beside). Peak RSS is reported
above the RSS the process had when the clock started (ru_maxrss: the loaded tensors are in it).

(load) all 4 shards into a dict of CPU tensors through wharf-latency-proxy at each delay (0 ms
  too, so every client takes the same path), clients rotated each round, medians:
    wharf              wharf.serve.load_safetensors("s3://.../model.safetensors.index.json")
    wharf-iter         dict(wharf.serve.iter_safetensors(same index URI))
    wharf-fetch        `wharf fetch -r --json` of the model prefix: the store's own rate on the
                       same bytes into memory (its JSON "seconds"; RSS: GNU time's maxrss)
    runai              runai-model-streamer SafetensorsStreamer.stream_files(4 s3:// URIs), its
                       defaults (object storage: RUNAI_STREAMER_CONCURRENCY 8, 8 MiB chunks,
                       40 GB memory limit; tensors owned by the caller, no copy needed), with
                       AWS_ENDPOINT_URL=the proxy, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0,
                       AWS_EC2_METADATA_DISABLED=true
    runai-c32          the same with RUNAI_STREAMER_CONCURRENCY=32 (its only setting changed;
                       the targets compare against its defaults)
    boto3-safetensors  4 threads, one per shard, boto3 download_fileobj into BytesIO (its
                       TransferConfig defaults: 8 MiB parts, 10 threads each), then
                       safetensors.torch.load(bytes)
    s3torch            s3torchconnector S3Client (force_path_style) get_object().read() of each
                       shard in 4 threads, then safetensors.torch.load(bytes)
(tier) the same model imported into a tier (`wharf tier import`), loaded from the tier's
  local files, page cache warm (just read) and cold (posix_fadvise DONTNEED on every file
  first; `fincore` reports what stayed resident):
    wharf-tier         wharf.serve.load_safetensors(TIER/model/model.safetensors.index.json)
    runai-tier         SafetensorsStreamer on the 4 local paths (its file-system defaults)
    safetensors-tier   safetensors.torch.load_file of each shard (the baseline)
(cache) wharf.serve.PredictionCache on each backend (memory, a directory in a tier, Redis from
  scripts/redis-server: an instance of the benchmark's own on port 27379 unless
  WHARF_REDIS_PORT / WHARF_REDIS_BASE name one; started and stopped by the run if it was not
  running), one fresh process per backend: 10,000 distinct JSON requests drawn
  with a Zipf law (s=1.1), 1 KiB values, compute = a 2 ms sleep standing in for the model.
    single thread, warm: every request computed once, then 20,000 (quick: 5,000) Zipf draws,
      each timed (all hits): p50 / p99 / p99.9 and calls per second
    under load: N threads (--serve-threads, default 8) in a closed loop for --serve-seconds
      (default 10; quick 3) from a cold cache (a new model version): throughput, hit rate,
      hit and miss latency (a call that found its request already computed is a hit; one that
      waited for another thread's compute of the same request is counted apart, "coalesced")
    Redis's own round trip from the same process (redis-py PING and GET of a 1 KiB key)
  Every value a call returns is compared with the expected one (outside the timing).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import scenario  # noqa: E402  (bench/, beside this file)
from scenario import median_ok as _med, rss_bytes  # noqa: E402,F401
N_SHARDS = 4
SPEC_VERSION = 1
INDEX = "model.safetensors.index.json"
LOAD_ORDER = ["wharf", "wharf-iter", "wharf-fetch", "runai", "runai-c32", "boto3-safetensors",
              "s3torch"]
LOAD_DEFAULT = LOAD_ORDER
TIER_ORDER = ["wharf-tier", "runai-tier", "safetensors-tier"]
CACHE_BACKENDS = ["memory", "dir", "redis"]
LABEL = {
    "wharf": "**wharf.serve.load_safetensors** (index URI)",
    "wharf-iter": "wharf.serve.iter_safetensors into a dict",
    "wharf-fetch": "store itself: wharf fetch -r of the 4 shards (into memory, discarded; "
                   "peak: the process's maxrss)",
    "runai": "runai-model-streamer SafetensorsStreamer (defaults: concurrency 8)",
    "runai-c32": "runai-model-streamer, RUNAI_STREAMER_CONCURRENCY=32",
    "boto3-safetensors": "boto3 download_fileobj x 4 threads + safetensors.torch.load",
    "s3torch": "s3torchconnector S3Client read() x 4 threads + safetensors.torch.load",
    "wharf-tier": "**wharf.serve.load_safetensors** (tier path)",
    "runai-tier": "runai-model-streamer on the local files (defaults: concurrency 16)",
    "safetensors-tier": "safetensors.torch.load_file per shard",
}
MiB = 1 << 20


# ----------------------------------------------------------------------------- the model
def model_layout(total: int) -> tuple[int, int, int, int]:
    """(hidden, intermediate, vocab, layers) of a model of about `total` bytes."""
    hidden, inter, vocab = (1024, 2816, 32000) if total <= 512 * MiB else (2048, 5632, 32000)
    fixed = 2 * vocab * hidden * 2
    per_layer = (4 * hidden * hidden + 3 * hidden * inter) * 2 + 3 * hidden * 2 + 2 * hidden * 4
    return hidden, inter, vocab, max(1, round((total - fixed) / per_layer))


def model_spec(total: int) -> list[tuple[str, str, tuple[int, ...], int]]:
    """[(name, dtype, shape, shard)] of the generated model, in file order."""
    h, i, v, layers = model_layout(total)
    ts: list[tuple[str, str, tuple[int, ...]]] = [("model.embed_tokens.weight", "bfloat16", (v, h))]
    for n in range(layers):
        p = f"model.layers.{n}."
        ts.append((p + "input_layernorm.weight", "float32", (h,)))
        for m in ("q", "k", "v"):
            ts.append((p + f"self_attn.{m}_proj.weight", "bfloat16", (h, h)))
            ts.append((p + f"self_attn.{m}_proj.bias", "bfloat16", (h,)))
        ts.append((p + "self_attn.o_proj.weight", "bfloat16", (h, h)))
        ts.append((p + "post_attention_layernorm.weight", "float32", (h,)))
        ts.append((p + "mlp.gate_proj.weight", "bfloat16", (i, h)))
        ts.append((p + "mlp.up_proj.weight", "bfloat16", (i, h)))
        ts.append((p + "mlp.down_proj.weight", "bfloat16", (h, i)))
    ts.append(("model.norm.weight", "float32", (h,)))
    ts.append(("model.rotary_emb.inv_freq", "float32", (64,)))
    ts.append(("lm_head.weight", "float16", (v, h)))
    size = {"bfloat16": 2, "float16": 2, "float32": 4}
    nbytes = [size[d] * _numel(s) for _, d, s in ts]
    total_b = sum(nbytes)
    out, cum = [], 0
    for (name, d, s), nb in zip(ts, nbytes):
        shard = min(N_SHARDS - 1, int(N_SHARDS * (cum + nb / 2) / total_b))
        out.append((name, d, s, shard))
        cum += nb
    return out


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def shard_name(k: int) -> str:
    return f"model-{k + 1:05d}-of-{N_SHARDS:05d}.safetensors"


POOL_ELEMS = 1 << 24  # 16 Mi elements: 32 MiB as bf16
_pools: dict = {}


def _pool(dtype):
    import torch
    if dtype not in _pools:
        if "f32" not in _pools:
            g = torch.Generator().manual_seed(14)
            _pools["f32"] = torch.randn(POOL_ELEMS, generator=g) * 0.02
        _pools[dtype] = _pools["f32"].to(dtype)
    return _pools[dtype]


def _segments(index: int, numel: int):
    """(destination start, pool start, count) covering a tensor's elements."""
    src = (index * 2_654_435_761) % POOL_ELEMS
    pos = 0
    while pos < numel:
        take = min(numel - pos, POOL_ELEMS - src)
        yield pos, src, take
        pos += take
        src = 0


def make_tensor(index: int, dtype: str, shape):
    import torch
    dt = getattr(torch, dtype)
    t = torch.empty(_numel(shape), dtype=dt)
    pool = _pool(dt)
    for pos, src, n in _segments(index, t.numel()):
        t[pos:pos + n] = pool[src:src + n]
    return t.view(shape)


def check_state(state, spec) -> None:
    """Raises SystemExit naming the first tensor that differs from the generator's."""
    import torch
    if not isinstance(state, dict):
        raise SystemExit(f"loaded a {type(state).__name__}, not a dict")
    want = {name for name, *_ in spec}
    if set(state) != want:
        missing, extra = sorted(want - set(state)), sorted(set(state) - want)
        raise SystemExit(f"tensor names differ: missing {missing[:3]} ({len(missing)}), "
                         f"unexpected {extra[:3]} ({len(extra)})")
    for i, (name, dtype, shape, _) in enumerate(spec):
        t = state[name]
        if not isinstance(t, torch.Tensor) or t.dtype != getattr(torch, dtype) or \
                tuple(t.shape) != tuple(shape) or t.device.type != "cpu":
            got = f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}"
            raise SystemExit(f"{name}: {got} on {getattr(t, 'device', '?')}, expected {dtype} "
                             f"{shape} on cpu")
        flat = t.reshape(-1)
        pool = _pool(t.dtype)
        for pos, src, n in _segments(i, flat.numel()):
            if not torch.equal(flat[pos:pos + n], pool[src:src + n]):
                raise SystemExit(f"{name}: elements {pos}..{pos + n} differ from the generator's")


def generate(out_dir: Path, total: int) -> dict:
    """Writes the shards and the index into out_dir; returns {file name: size}."""
    import safetensors.torch as st
    spec = model_spec(total)
    out_dir.mkdir(parents=True, exist_ok=True)
    weight_map, tensor_bytes = {}, 0
    for k in range(N_SHARDS):
        tensors = {}
        for i, (name, dtype, shape, shard) in enumerate(spec):
            if shard == k:
                tensors[name] = make_tensor(i, dtype, shape)
                weight_map[name] = shard_name(k)
                tensor_bytes += tensors[name].numel() * tensors[name].element_size()
        st.save_file(tensors, str(out_dir / shard_name(k)), metadata={"format": "pt"})
        del tensors
    (out_dir / INDEX).write_text(json.dumps(
        {"metadata": {"total_size": tensor_bytes}, "weight_map": weight_map}, indent=2))
    return {"files": {p.name: p.stat().st_size for p in sorted(out_dir.iterdir())},
            "tensor_bytes": tensor_bytes, "tensors": len(spec)}


# ----------------------------------------------------------------------------- the workers
def _split(uri: str) -> tuple[str, str]:
    bucket, key = uri[len("s3://"):].split("/", 1)
    return bucket, key


def load_worker(spec: dict) -> dict:
    import resource
    import warnings

    import torch
    warnings.filterwarnings("ignore")
    client = spec["client"]
    files: list[str] = spec["files"]  # the 4 shards: s3:// URIs or local paths
    index: str = spec["index"]
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    region = os.environ.get("AWS_REGION", "us-east-1")
    # Everything a client needs is imported before the clock starts.
    if client.startswith("wharf"):
        import wharf.serve
    if client.startswith("runai"):
        from runai_model_streamer import SafetensorsStreamer
    if client in ("boto3-safetensors", "s3torch", "safetensors-tier"):
        import concurrent.futures as cf
        import io

        import safetensors.torch as st
    if client == "boto3-safetensors":
        import boto3
        from botocore.config import Config
    if client == "s3torch":
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
    base_rss = rss_bytes()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    first_s = None
    if client in ("wharf", "wharf-tier"):
        state = wharf.serve.load_safetensors(index)
    elif client == "wharf-iter":
        state = {}
        for name, t in wharf.serve.iter_safetensors(index):
            if first_s is None:
                first_s = time.perf_counter() - t0
            state[name] = t
    elif client.startswith("runai"):
        state = {}
        with SafetensorsStreamer() as s:
            s.stream_files(files)
            for name, t in s.get_tensors():
                if first_s is None:
                    first_s = time.perf_counter() - t0
                state[name] = t
    elif client == "boto3-safetensors":
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region,
                          config=Config(s3={"addressing_style": "path"},
                                        max_pool_connections=50))

        def one(uri):
            buf = io.BytesIO()
            s3.download_fileobj(*_split(uri), buf)
            data = buf.getvalue()
            del buf
            return st.load(data)
        state = {}
        with cf.ThreadPoolExecutor(len(files)) as pool:
            for part in pool.map(one, files):
                state.update(part)
    elif client == "s3torch":
        s3 = S3Client(region, endpoint=endpoint,
                      s3client_config=S3ClientConfig(force_path_style=True))

        def one(uri):
            return st.load(s3.get_object(*_split(uri)).read())
        state = {}
        with cf.ThreadPoolExecutor(len(files)) as pool:
            for part in pool.map(one, files):
                state.update(part)
    elif client == "safetensors-tier":
        state = {}
        for f in files:
            state.update(st.load_file(f))
    else:
        raise SystemExit(f"unknown client {client}")
    returned = time.perf_counter() - t0
    # Ready = every page of every tensor readable from memory: one byte of each 4 KiB page is
    # read (a lazily mapped load, safetensors' mmap, pays its reads here; for tensors already
    # in memory this costs a few ms).
    for t in state.values():
        if t.numel():
            t.reshape(-1).view(torch.uint8)[::4096].sum()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out = {"client": client, "wall_s": wall, "returned_s": returned,
           "cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
           "peak_above_mib": max(0, ru1.ru_maxrss * 1024 - base_rss) / MiB,
           "base_rss_mib": base_rss / MiB, "tensors": len(state),
           "tensor_bytes": sum(t.numel() * t.element_size() for t in state.values())}
    if first_s is not None:
        out["first_tensor_s"] = first_s
    check_state(state, model_spec(spec["total"]))  # not timed
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cache_worker(spec: dict) -> dict:
    import bisect
    import functools
    import hashlib
    import random
    import threading
    import uuid

    from wharf.serve import PredictionCache
    n, s = spec["distinct"], spec["zipf_s"]
    vsize, compute_s = spec["value_bytes"], spec["compute_ms"] / 1e3
    requests = [{"prompt": f"request {k:05d}: summarise the document", "max_tokens": 16}
                for k in range(n)]
    cum, acc = [], 0.0
    for r in range(1, n + 1):
        acc += 1.0 / r ** s
        cum.append(acc)

    def draws(seed: int, count: int) -> list[int]:
        rng = random.Random(seed)
        return [min(n - 1, bisect.bisect_left(cum, rng.random() * acc)) for _ in range(count)]

    def value(k: int) -> bytes:
        d = hashlib.blake2b(b"%d" % k, digest_size=64).digest()
        return (d * (vsize // 64 + 1))[:vsize]
    values = [value(k) for k in range(n)]
    tl = threading.local()
    computed: set[int] = set()

    def compute_k(k: int, _req) -> bytes:
        tl.computes = getattr(tl, "computes", 0) + 1
        if compute_s:
            time.sleep(compute_s)
        computed.add(k)
        return values[k]
    computes = [functools.partial(compute_k, k) for k in range(n)]
    out: dict = {"backend": spec["backend_name"], "distinct": n, "zipf_s": s,
                 "value_bytes": vsize, "compute_ms": spec["compute_ms"]}
    cache = PredictionCache(spec["backend"], ttl=spec["ttl"], max_bytes=spec["max_bytes"])
    bad = 0

    raw = []  # Redis's own round trips, timed between the cache's hits (same conditions)
    if spec.get("redis_url"):
        import redis
        red = redis.Redis.from_url(spec["redis_url"])
        rtt_key = f"wharf-bench-rtt-{uuid.uuid4().hex}"
        red.set(rtt_key, values[0], ex=600)
        raw = [("get", functools.partial(red.get, rtt_key), []), ("ping", red.ping, [])]
        for _, f, _ in raw:
            for _ in range(500):
                f()

    # Single thread, warm: every request computed once, then Zipf draws (all hits).
    version = f"bench-hit-{uuid.uuid4().hex[:8]}"
    t = time.perf_counter()
    for k in range(n):
        cache.get_or_compute(version, requests[k], functools.partial(lambda k, _r: values[k], k))
    out["prefill_s"] = time.perf_counter() - t
    seq = draws(1, spec["hit_ops"])
    for k in seq[:500]:  # warm the code paths
        cache.get_or_compute(version, requests[k], computes[k])
    tl.computes = 0
    lat = []
    t = time.perf_counter()
    raw_s = 0.0
    for k in seq:
        a = time.perf_counter_ns()
        v = cache.get_or_compute(version, requests[k], computes[k])
        lat.append((time.perf_counter_ns() - a) / 1e3)
        bad += v != values[k]
        for _, f, rl in raw:
            a = time.perf_counter_ns()
            f()
            rl.append((time.perf_counter_ns() - a) / 1e3)
            raw_s += rl[-1] / 1e6
    el = time.perf_counter() - t - raw_s
    for op, _, rl in raw:
        out[f"redis_{op}_p50_us"], out[f"redis_{op}_p99_us"] = _pct(rl, .5), _pct(rl, .99)
    if raw:
        red.delete(rtt_key)
    out.update(hit1_calls=len(seq), hit1_misses=tl.computes, hit1_p50_us=_pct(lat, .5),
               hit1_p99_us=_pct(lat, .99), hit1_p999_us=_pct(lat, .999),
               hit1_mean_us=statistics.fmean(lat), hit1_per_s=len(seq) / el)

    # Under load: N threads, closed loop, from a cold cache (a new model version).
    version = f"bench-load-{uuid.uuid4().hex[:8]}"
    computed.clear()
    threads, seconds = spec["threads"], spec["seconds"]
    per = [dict(hit=[], miss=[], coal=[], bad=0) for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def run(tid: int):
        rec = per[tid]
        seq = draws(100 + tid, 200_000)
        tl.computes = 0
        start.wait()
        i = 0
        while True:
            k = seq[i % len(seq)]
            i += 1
            known = k in computed
            c0 = tl.computes
            a = time.perf_counter_ns()
            v = cache.get_or_compute(version, requests[k], computes[k])
            b = time.perf_counter_ns()
            us = (b - a) / 1e3
            if tl.computes != c0:
                rec["miss"].append(us)
            elif known:
                rec["hit"].append(us)
            else:
                rec["coal"].append(us)
            rec["bad"] += v != values[k]
            if b / 1e9 >= stop_at[0]:
                break
    ths = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for th in ths:
        th.start()
    stop_at[0] = time.perf_counter_ns() / 1e9 + seconds
    t = time.perf_counter()
    start.wait()
    for th in ths:
        th.join()
    el = time.perf_counter() - t
    hit = [x for p in per for x in p["hit"]]
    miss = [x for p in per for x in p["miss"]]
    coal = [x for p in per for x in p["coal"]]
    bad += sum(p["bad"] for p in per)
    calls = len(hit) + len(miss) + len(coal)
    out.update(load_threads=threads, load_seconds=el, load_calls=calls, load_per_s=calls / el,
               load_hits=len(hit), load_misses=len(miss), load_coalesced=len(coal),
               load_hit_rate=len(hit) / max(1, calls),
               load_hit_p50_us=_pct(hit, .5), load_hit_p99_us=_pct(hit, .99),
               load_miss_p50_us=_pct(miss, .5), load_miss_p99_us=_pct(miss, .99),
               load_coal_p50_us=_pct(coal, .5), load_coal_p99_us=_pct(coal, .99),
               wrong_values=bad)
    with contextlib.suppress(Exception):
        cache.close()
    if bad:
        raise SystemExit(f"{bad} calls returned a value that is not the request's: {out}")
    return out


def generate_worker(spec: dict) -> dict:
    return generate(Path(spec["dir"]), spec["total"])


def worker(spec: dict) -> dict:
    op = spec["op"]
    if op == "load":
        return load_worker(spec)
    if op == "cache":
        return cache_worker(spec)
    if op == "generate":
        return generate_worker(spec)
    raise SystemExit(f"unknown op {op}")


# ----------------------------------------------------------------------------- the driver
def _run_worker(rb, spec: dict, env: dict, timeout: float) -> dict:
    r = scenario.run_worker(rb.VENV_PY, Path(__file__).resolve(), spec, env, timeout, cwd=REPO)
    if r["status"] == "failed":
        r.update(client=spec.get("client"), op=spec.get("op"))
    return r


def _env(server, endpoint: str) -> dict:
    env = dict(os.environ)
    env.update(server.env)
    env.update(AWS_ENDPOINT_URL=endpoint, WHARF_S3_ENDPOINT=endpoint,
               RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", AWS_EC2_METADATA_DISABLED="true",
               PYTHONPATH=str(REPO / "python"))
    env.setdefault("AWS_REGION", "us-east-1")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(k, None)
    return env


def _avail_python(rb, code: str, hint: str) -> str | None:
    r = subprocess.run([str(rb.VENV_PY), "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "python")), cwd=REPO)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"N/A ({hint}: {last[-160:]})"
    return None


def availability(rb, a) -> dict[str, str | None]:
    loader = _avail_python(rb, "import wharf.serve as s; s.load_safetensors; s.iter_safetensors",
                           "wharf.serve.load_safetensors missing")
    runai = _avail_python(rb, "import runai_model_streamer, runai_model_streamer_s3",
                          "runai-model-streamer[s3] missing")
    out = {"wharf": loader, "wharf-iter": loader, "wharf-tier": loader,
           "wharf-fetch": rb.avail_wharf_fetch(a), "runai": runai, "runai-c32": runai,
           "runai-tier": runai,
           "boto3-safetensors": _avail_python(rb, "import boto3, safetensors.torch", "missing"),
           "s3torch": _avail_python(rb, "import s3torchconnector, safetensors.torch", "missing"),
           "safetensors-tier": _avail_python(rb, "import safetensors.torch", "missing"),
           "cache": _avail_python(rb, "from wharf.serve import PredictionCache",
                                  "wharf.serve.PredictionCache missing")}
    return out


def _versions() -> dict:
    import importlib.metadata as md
    out = {}
    for p in ("torch", "safetensors", "runai-model-streamer", "runai-model-streamer-s3",
              "boto3", "s3torchconnector", "redis"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = "missing"
    return out


def ensure_model(rb, a, server, total: int) -> dict:
    """The model under s3://BUCKET/serve[-quick]/model/, generated and uploaded if missing;
    returns its manifest ({files: {name: size}, tensor_bytes, tensors, prefix, ...})."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError
    q = "-quick" if a.quick else ""
    prefix, mkey = f"serve{q}/model/", f"serve{q}/model-manifest.json"
    s3 = rb.boto3_client(server)
    try:
        s3.head_bucket(Bucket=rb.BUCKET)
    except ClientError:
        s3.create_bucket(Bucket=rb.BUCKET)
    have = rb.list_prefix(s3, prefix)
    try:
        man = json.loads(s3.get_object(Bucket=rb.BUCKET, Key=mkey)["Body"].read())
        if (man.get("spec_version") == SPEC_VERSION and man.get("total") == total and
                {prefix + k: v for k, v in man["files"].items()} == have):
            rb.log(f"SERVE: model present ({len(have)} objects, "
                   f"{sum(have.values()) / 2**30:.2f} GiB under s3://{rb.BUCKET}/{prefix})")
            man["prefix"] = prefix
            return man
    except ClientError:
        pass
    with contextlib.suppress(ClientError):
        s3.delete_object(Bucket=rb.BUCKET, Key=mkey)
    for k in have:
        s3.delete_object(Bucket=rb.BUCKET, Key=k)
    need = total * 1.8
    if server.objectstore() == "memstore" and rb.mem_available() < need + 2 * rb.GiB:
        raise rb.SetupError(f"SERVE: uploading {total / 2**30:.1f} GiB to a memstore OSD needs "
                            f"~{need / 2**30:.1f} GiB of RAM, only "
                            f"{rb.mem_available() / 2**30:.1f} available")
    d = Path(tempfile.mkdtemp(prefix="wharf-serve-model-", dir=a._scratch))
    try:
        rb.log(f"SERVE: generating a {total / 2**30:.2f} GiB model in {d}")
        t0 = time.time()
        man = _run_worker(rb, {"op": "generate", "dir": str(d), "total": total},
                          _env(server, server.endpoint), 1800)
        if man.get("status") != "ok":
            raise rb.SetupError(f"SERVE: generating the model failed: {man.get('error')}")
        rb.log(f"SERVE: generated in {time.time() - t0:.1f} s; uploading to "
               f"s3://{rb.BUCKET}/{prefix}")
        t0 = time.time()
        tc = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB,
                            max_concurrency=4)
        for name in man["files"]:
            s3.upload_file(str(d / name), rb.BUCKET, prefix + name, Config=tc)
        rb.log(f"SERVE: uploaded in {time.time() - t0:.1f} s")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    man = {"spec_version": SPEC_VERSION, "total": total, "files": man["files"],
           "tensor_bytes": man["tensor_bytes"], "tensors": man["tensors"]}
    s3.put_object(Bucket=rb.BUCKET, Key=mkey, Body=json.dumps(man).encode())
    man["prefix"] = prefix
    return man


@contextlib.contextmanager
def _proxied(rb, a, server, proxy_bin, delay: float):
    """wharf-latency-proxy in front of RGW at `delay` ms each way (0 ms too: one path)."""
    with rb.Proxy(proxy_bin, server.endpoint, delay, a.proxy_arg) as proxy:
        yield proxy


def _shard_bytes(man: dict) -> int:
    return sum(v for k, v in man["files"].items() if k.endswith(".safetensors"))


def _fetch(rb, a, env: dict, uri: str, nbytes: int) -> dict:
    m = rb.run_measured([a.wharf, "fetch", "-r", "--json", uri], env, a.timeout)
    if m.rc != 0 or m.timed_out:
        return {"status": "failed", "error": [(m.stderr.strip() or f"exit {m.rc}")[-300:]]}
    try:
        j = rb.parse_json_line(m.stdout)
    except ValueError as e:
        return {"status": "failed", "error": [str(e)]}
    if int(j["bytes"]) < nbytes or int(j.get("errors", 0)):
        return {"status": "failed", "error": [f"read {j['bytes']} of {nbytes} B"]}
    return {"status": "ok", "wall_s": float(j["seconds"]), "process_wall_s": m.wall,
            "cpu_s": m.cpu_user + m.cpu_sys, "peak_above_mib": m.maxrss_kib / 1024,
            "maxrss_mib": m.maxrss_kib / 1024, "fetched_bytes": int(j["bytes"])}


def _log_load(rb, where: str, r: dict) -> None:
    rb.log(f"  SERVE {where} {r['client']}: " + (
        f"{r['wall_s']:.2f} s, {r['gb_per_s']:.3f} GB/s, CPU {r.get('cpu_s', 0):.1f} s, "
        f"+{r.get('peak_above_mib', 0):.0f} MiB" if r["status"] == "ok"
        else f"{r['status']} {r.get('error', '')}"))


def run(rb, a, server, proxy_bin, avail_rb: dict, results: list) -> list[str]:
    total = (256 if a.quick else 2048) * MiB
    delays = [float(x) for x in a.delays.split(",")] if a.delays else [0.0, 25.0]
    parts = set(filter(None, a.serve_parts.split(",")))
    wanted = set(a.clients.split(",")) if a.clients else None
    skip = set(filter(None, a.skip_clients.split(",")))
    sections: list[str] = []
    avail = availability(rb, a)
    for k, v in avail.items():
        if v:
            rb.log(f"SERVE {k}: {v}")

    def want(c, default=True):
        return c not in skip and (c in wanted if wanted is not None else default)

    man = None
    if parts & {"load", "tier"}:
        man = ensure_model(rb, a, server, total)
        nbytes = _shard_bytes(man)
        uri = f"s3://{rb.BUCKET}/{man['prefix']}"
        s3_files = [uri + shard_name(k) for k in range(N_SHARDS)]
        info = {"scenario": "SERVE", "part": "model", "bytes": nbytes,
                "tensor_bytes": man["tensor_bytes"], "tensors": man["tensors"],
                "files": man["files"], "uri": uri, "layout": model_layout(total),
                "memory_budget": os.environ.get("WHARF_MEMORY_BUDGET", "1G"),
                "versions": _versions()}
        results.append(info)

    if "load" in parts:
        clients = [c for c in LOAD_ORDER if want(c, c in LOAD_DEFAULT)]
        for c in clients:
            if avail.get(c):
                results.append({"scenario": "SERVE", "part": "load", "client": c,
                                "status": avail[c], "delay_ms": None})
        clients = [c for c in clients if not avail.get(c)]
        for delay in delays:
            with _proxied(rb, a, server, proxy_bin, delay) as proxy:
                env = _env(server, proxy.url)
                rb.log(f"SERVE load at {delay:g} ms through {proxy.url}: {', '.join(clients)}")
                for rnd in range(a.repeat):
                    k = rnd % max(1, len(clients))
                    for c in clients[k:] + clients[:k]:
                        s_cpu0, p_cpu0 = server.cpu(), proxy.cpu()
                        if c == "wharf-fetch":
                            r = _fetch(rb, a, env, uri, nbytes)
                        else:
                            wenv = dict(env)
                            if c == "runai-c32":
                                wenv["RUNAI_STREAMER_CONCURRENCY"] = "32"
                            r = _run_worker(rb, {"op": "load", "client": c, "files": s3_files,
                                                 "index": uri + INDEX,
                                                 "total": total}, wenv, a.timeout)
                        r.update(client=c, scenario="SERVE", part="load", delay_ms=delay,
                                 round=rnd, bytes=nbytes, server_cpu_s=server.cpu() - s_cpu0,
                                 proxy_cpu_s=proxy.cpu() - p_cpu0)
                        if r["status"] == "ok":
                            r["gb_per_s"] = nbytes / r["wall_s"] / 1e9
                        results.append(r)
                        _log_load(rb, f"{delay:g} ms", r)
        sections.append(load_table(results, delays))
        print("\n" + sections[-1], flush=True)

    if "tier" in parts:
        clients = [c for c in TIER_ORDER if want(c)]
        for c in clients:
            if avail.get(c):
                results.append({"scenario": "SERVE", "part": "tier", "client": c,
                                "status": avail[c], "cache": None})
        clients = [c for c in clients if not avail.get(c)]
        base = Path(tempfile.mkdtemp(prefix="wharf-serve-tier-", dir=a._scratch))
        try:
            env = _env(server, server.endpoint)
            tier = base / "tier"
            rb.check_output([a.wharf, "tier", "init", str(tier)], env=env)
            t0 = time.perf_counter()
            imp = json.loads(rb.check_output(
                [a.wharf, "tier", "import", "--json", uri, str(tier / "model")], env=env,
                timeout=a.timeout).strip().splitlines()[-1])
            imp_s = time.perf_counter() - t0
            rb.log(f"SERVE tier: imported {imp.get('bytes', 0) / 2**30:.2f} GiB in {imp_s:.1f} s")
            results.append({"scenario": "SERVE", "part": "tier-import", "import": imp,
                            "wall_s": imp_s, "dir": str(tier)})
            local = [str(tier / "model" / shard_name(k)) for k in range(N_SHARDS)]
            for rnd in range(a.repeat):
                k = rnd % max(1, len(clients))
                for cache_state in ("warm", "cold"):
                    for c in clients[k:] + clients[:k]:
                        resident = _page_cache(local, cold=cache_state == "cold")
                        r = _run_worker(rb, {"op": "load", "client": c, "files": local,
                                             "index": str(tier / "model" / INDEX),
                                             "total": total}, env, a.timeout)
                        r.update(client=c, scenario="SERVE", part="tier", cache=cache_state,
                                 round=rnd, bytes=nbytes, resident_before_mib=resident)
                        if r["status"] == "ok":
                            r["gb_per_s"] = nbytes / r["wall_s"] / 1e9
                        results.append(r)
                        _log_load(rb, f"tier {cache_state} (resident before "
                                      f"{resident:.0f} MiB)", r)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        sections.append(tier_table(results))
        print("\n" + sections[-1], flush=True)

    if "cache" in parts:
        if avail.get("cache"):
            results.append({"scenario": "SERVE", "part": "cache", "status": avail["cache"]})
            sections.append(f"### SERVE (cache)\n\n{avail['cache']}\n")
        else:
            sections.append(run_cache(rb, a, server, results, want))
        print("\n" + sections[-1], flush=True)
    if man is not None or any(r.get("part") == "cache" for r in results):
        sections.append(targets(results))
        print("\n" + sections[-1], flush=True)
    return sections


def _page_cache(files: list[str], cold: bool) -> float:
    """Warm: reads every file (into the page cache); cold: posix_fadvise(DONTNEED) on each.
    Returns the MiB of the files resident afterwards (fincore; -1 if unknown)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            if cold:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 8 * MiB):
                    pass
        finally:
            os.close(fd)
    try:
        out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", *files], capture_output=True,
                             text=True, timeout=30).stdout.split()
        return sum(int(x) for x in out) / MiB
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return -1.0


class Redis:
    """scripts/redis-server, started if not running (and then stopped at the end). An instance
    of the benchmark's own unless WHARF_REDIS_PORT / WHARF_REDIS_BASE say otherwise (port
    27379, .wharf/bench-redis), as ./run bench gives the benchmark its own S3 server: the test
    suite's Redis is never shared, nor stopped under it."""

    def __init__(self, keep: bool):
        self.keep, self.started, self.url = keep, False, ""
        self.script = REPO / "scripts" / "redis-server"
        self.env = dict(os.environ)
        self.env.setdefault("WHARF_REDIS_PORT", "27379")
        self.env.setdefault("WHARF_REDIS_BASE", str(REPO / ".wharf" / "bench-redis"))

    def __enter__(self):
        if not self.script.exists():
            raise RuntimeError("scripts/redis-server missing")
        st = subprocess.run([str(self.script), "status"], cwd=REPO, capture_output=True,
                            text=True, env=self.env)
        if st.returncode != 0:
            r = subprocess.run([str(self.script), "start"], cwd=REPO, capture_output=True,
                               text=True, timeout=120, env=self.env)
            if r.returncode != 0:
                raise RuntimeError(f"scripts/redis-server start failed: {r.stderr[-500:]}")
            self.started = True
        out = subprocess.run([str(self.script), "env"], cwd=REPO, capture_output=True,
                             text=True, check=True, env=self.env).stdout
        for line in out.splitlines():
            line = line.strip().removeprefix("export ")
            if line.startswith("WHARF_REDIS_URL="):
                self.url = line.split("=", 1)[1].strip("'\"")
        if not self.url:
            raise RuntimeError("scripts/redis-server env printed no WHARF_REDIS_URL")
        return self

    def __exit__(self, *exc):
        if self.started and not self.keep:
            subprocess.run([str(self.script), "stop"], cwd=REPO, capture_output=True,
                           timeout=60, env=self.env)


def run_cache(rb, a, server, results: list, want) -> str:
    backends = [b for b in a.serve_cache_backends.split(",") if b]
    spec0 = {"op": "cache", "distinct": 10_000, "zipf_s": 1.1, "value_bytes": 1024,
             "compute_ms": 2.0, "ttl": 3600, "max_bytes": 256 * MiB,
             "hit_ops": 5_000 if a.quick else 20_000, "threads": a.serve_threads,
             "seconds": a.serve_seconds or (3 if a.quick else 10)}
    env = _env(server, server.endpoint)
    for rnd in range(a.repeat):
        for b in backends:
            spec = dict(spec0, backend_name=b)
            base = None
            try:
                if b == "memory":
                    spec["backend"] = "memory"
                    r = _run_worker(rb, spec, env, a.timeout)
                elif b == "dir":
                    base = Path(tempfile.mkdtemp(prefix="wharf-serve-cache-", dir=a._scratch))
                    rb.check_output([a.wharf, "tier", "init", str(base / "tier")], env=env)
                    spec["backend"] = str(base / "tier" / "predictions")
                    r = _run_worker(rb, spec, env, a.timeout)
                elif b == "redis":
                    with Redis(a.keep_server) as red:
                        spec.update(backend=red.url, redis_url=red.url)
                        r = _run_worker(rb, spec, env, a.timeout)
                else:
                    r = {"status": "failed", "error": [f"unknown backend {b}"]}
            except Exception as e:  # noqa: BLE001 - a backend that cannot start: reported
                r = {"status": "failed", "error": [repr(e)[-300:]]}
            finally:
                if base:
                    shutil.rmtree(base, ignore_errors=True)
            r.update(scenario="SERVE", part="cache", backend=b, round=rnd,
                     backend_uri=spec.get("backend"))
            results.append(r)
            rb.log(f"  SERVE cache {b}: " + (
                f"hit p50/p99 {r['hit1_p50_us']:.1f}/{r['hit1_p99_us']:.1f} us single thread; "
                f"{r['load_per_s']:,.0f} calls/s with {r['load_threads']} threads, hit rate "
                f"{100 * r['load_hit_rate']:.1f}%" if r["status"] == "ok"
                else f"FAILED {r.get('error')}"))
    return cache_table(results)


# ----------------------------------------------------------------------------- tables
def _f(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def _model(results) -> dict:
    return next((r for r in results if r.get("scenario") == "SERVE" and r.get("part") == "model"),
                {})


def _model_line(results) -> str:
    m = _model(results)
    if not m:
        return ""
    h, i, v, layers = m.get("layout", (0, 0, 0, 0))
    return (f"{m['bytes'] / 2**30:.2f} GiB in 4 safetensors shards ({m['tensors']} tensors: "
            f"hidden {h}, {layers} layers, vocab {v}; bf16/fp16 matrices, fp32 norms)")


def _versions_line(results) -> str:
    v = _model(results).get("versions") or {}
    return ("Versions: " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".") if v else ""


def load_table(results, delays=None) -> str:
    rs = [r for r in results if r.get("scenario") == "SERVE" and r.get("part") == "load"]
    if delays is None:
        delays = sorted({r["delay_ms"] for r in rs if r.get("delay_ms") is not None})
    rounds = max((r.get("round", 0) for r in rs), default=0) + 1
    out = [f"### SERVE (load): {_model_line(results)} into CPU tensors, median of {rounds}", "",
           "s (ready): the timed section of a fresh process until every tensor is in memory "
           "(imports before the clock, client creation inside it); GB/s: the 4 shard files' "
           "bytes / s (10^9 B); peak RSS: ru_maxrss above the RSS at the start of the clock "
           "(the loaded tensors are in it). " + _versions_line(results), ""]
    na = [r for r in rs if r.get("status", "").startswith("N/A")]
    for delay in delays:
        per: dict = {}
        for r in rs:
            if r.get("delay_ms") == delay:
                per.setdefault(r["client"], []).append(r)
        w = _med(per.get("wharf", []), "wall_s")
        fetch = _med(per.get("wharf-fetch", []), "wall_s")
        out += [f"**{delay:g} ms each way** (wharf-latency-proxy)", "",
                "| client | s (ready) | GB/s | wharf / X (>1: wharf faster) | % of wharf fetch | "
                "call returned s | first tensor s | CPU s | peak RSS above start MiB | "
                "server CPU s | proxy CPU s | runs |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for c in LOAD_ORDER:
            runs = per.get(c)
            if not runs:
                continue
            s = _med(runs, "wall_s")
            ok = sum(r["status"] == "ok" for r in runs)
            secs = "/".join(_f(r.get("wall_s"), ".2f") if r["status"] == "ok" else "failed"
                            for r in sorted(runs, key=lambda r: r["round"]))
            out.append("| " + " | ".join([
                LABEL.get(c, c), _f(s, ".2f"), _f(_med(runs, "gb_per_s")),
                f"{s / w:.2f}x" if s and w else "-",
                f"{100 * fetch / s:.0f}%" if s and fetch else "-",
                _f(_med(runs, "returned_s"), ".2f"), _f(_med(runs, "first_tensor_s"), ".2f"),
                _f(_med(runs, "cpu_s"), ".1f"),
                _f(_med(runs, "peak_above_mib"), ",.0f"), _f(_med(runs, "server_cpu_s"), ".1f"),
                _f(_med(runs, "proxy_cpu_s"), ".1f"),
                f"{ok}/{len(runs)}: {secs} s"]) + " |")
        for c, runs in per.items():
            for r in runs:
                if r["status"] != "ok":
                    out.append(f"\n- {c} round {r.get('round', 0) + 1}: {r.get('error')}")
        out.append("")
    for r in na:
        out.append(f"- {r['client']}: {r['status']}")
    return "\n".join(out) + "\n"


def tier_table(results) -> str:
    rs = [r for r in results if r.get("scenario") == "SERVE" and r.get("part") == "tier"]
    rounds = max((r.get("round", 0) for r in rs), default=0) + 1
    imp = next((r for r in results if r.get("part") == "tier-import"), None)
    out = [f"### SERVE (tier): the same model from a tier's local files, median of {rounds}", ""]
    if imp:
        b = imp["import"].get("bytes", 0)
        out += [f"Imported with `wharf tier import` (straight to RGW): {b / 2**30:.2f} GiB in "
                f"{imp['wall_s']:.1f} s ({b / imp['wall_s'] / 1e9:.2f} GB/s, durable).", ""]
    out += ["| client | page cache | s (ready) | GB/s | wharf / X | call returned s | CPU s | "
            "peak RSS above start MiB | resident before MiB | runs |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for state in ("warm", "cold"):
        per: dict = {}
        for r in rs:
            if r.get("cache") == state:
                per.setdefault(r["client"], []).append(r)
        w = _med(per.get("wharf-tier", []), "wall_s")
        for c in TIER_ORDER:
            runs = per.get(c)
            if not runs:
                continue
            s = _med(runs, "wall_s")
            secs = "/".join(_f(r.get("wall_s"), ".2f") if r["status"] == "ok" else "failed"
                            for r in sorted(runs, key=lambda r: r["round"]))
            out.append("| " + " | ".join([
                LABEL.get(c, c), state, _f(s, ".2f"), _f(_med(runs, "gb_per_s")),
                f"{s / w:.2f}x" if s and w else "-", _f(_med(runs, "returned_s"), ".2f"),
                _f(_med(runs, "cpu_s"), ".1f"), _f(_med(runs, "peak_above_mib"), ",.0f"),
                _f(_med(runs, "resident_before_mib"), ",.0f"),
                f"{sum(r['status'] == 'ok' for r in runs)}/{len(runs)}: {secs} s"]) + " |")
    for r in rs:
        if r["status"] != "ok":
            out.append(f"\n- {r['client']} {r.get('cache') or ''} round {r.get('round', 0) + 1}: "
                       f"{r.get('error') or r['status']}")
    return "\n".join(out) + "\n"


def cache_table(results) -> str:
    rs = [r for r in results if r.get("scenario") == "SERVE" and r.get("part") == "cache"
          and r.get("backend")]
    if not rs:
        return ""
    ok = [r for r in rs if r["status"] == "ok"]
    r0 = ok[0] if ok else rs[0]
    rounds = max((r.get("round", 0) for r in rs), default=0) + 1
    out = [f"### SERVE (cache): wharf.serve.PredictionCache, Zipf s={r0.get('zipf_s', 1.1)} "
           f"over {r0.get('distinct', 10000):,} JSON requests, {r0.get('value_bytes', 1024):,} B "
           f"values, compute = {r0.get('compute_ms', 2):g} ms sleep (median of {rounds})", "",
           f"Single thread, warm cache ({r0.get('hit1_calls', 0):,} Zipf draws, every one a hit):",
           "", "| backend | hit p50 us | hit p99 us | hit p99.9 us | mean us | calls/s | "
           "misses | prefill of 10k s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    by: dict = {}
    for r in rs:
        by.setdefault(r["backend"], []).append(r)
    for b, runs in by.items():
        out.append("| " + " | ".join([
            b, _f(_med(runs, "hit1_p50_us"), ".1f"), _f(_med(runs, "hit1_p99_us"), ".1f"),
            _f(_med(runs, "hit1_p999_us"), ".1f"), _f(_med(runs, "hit1_mean_us"), ".1f"),
            _f(_med(runs, "hit1_per_s"), ",.0f"), _f(_med(runs, "hit1_misses"), ".0f"),
            _f(_med(runs, "prefill_s"), ".2f")]) + " |")
    out += ["", f"Under load: {r0.get('load_threads', '?')} threads in a closed loop for "
            f"{r0.get('load_seconds', 0):.0f} s from a cold cache (one process; hits include "
            f"the GIL's wait behind the other threads):", "",
            "| backend | calls/s | hit rate | hit p50 us | hit p99 us | miss p50 ms | "
            "miss p99 ms | computes | coalesced (waited for a compute) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b, runs in by.items():
        hr = _med(runs, "load_hit_rate")
        mp50, mp99 = _med(runs, "load_miss_p50_us"), _med(runs, "load_miss_p99_us")
        out.append(f"| {b} | {_f(_med(runs, 'load_per_s'), ',.0f')} | "
                   f"{_f(hr * 100 if hr is not None else None, '.1f')}% | "
                   f"{_f(_med(runs, 'load_hit_p50_us'), '.1f')} | "
                   f"{_f(_med(runs, 'load_hit_p99_us'), '.1f')} | "
                   f"{_f(mp50 / 1e3 if mp50 else None, '.2f')} | "
                   f"{_f(mp99 / 1e3 if mp99 else None, '.2f')} | "
                   f"{_f(_med(runs, 'load_misses'), ',.0f')} | "
                   f"{_f(_med(runs, 'load_coalesced'), ',.0f')} |")
    red = by.get("redis", [])
    if _med(red, "redis_get_p50_us") is not None:
        out += ["", f"Redis's own round trip (redis-py in the same process and thread, each "
                f"timed right after one of the single-thread hits above): PING "
                f"p50/p99 {_med(red, 'redis_ping_p50_us'):.1f}/{_med(red, 'redis_ping_p99_us'):.1f}"
                f" us, GET of a 1 KiB key {_med(red, 'redis_get_p50_us'):.1f}/"
                f"{_med(red, 'redis_get_p99_us'):.1f} us."]
    for r in rs:
        if r["status"] != "ok":
            out.append(f"\n- {r['backend']} round {r.get('round', 0) + 1}: {r.get('error')}")
    return "\n".join(out) + "\n"


def targets(results) -> str:
    rs = [r for r in results if r.get("scenario") == "SERVE"]
    m = _model(results)
    out = ["### SERVE against the targets (issue 14)", ""]

    def load(c, delay):
        return _med([r for r in rs if r.get("part") == "load" and r.get("client") == c
                     and r.get("delay_ms") == delay], "wall_s")

    def line(ok, text):
        out.append(f"- [{'x' if ok else ' '}] {text}"
                   + ("" if ok is not None else " (not measured)"))
    delays = sorted({r["delay_ms"] for r in rs if r.get("part") == "load"
                     and r.get("delay_ms") is not None})
    for d in delays if delays else ([0.0, 25.0] if m else []):
        w, ru = load("wharf", d), load("runai", d)
        line(w and ru and w < ru if w and ru else None,
             f"load ahead of runai-model-streamer at {d:g} ms: " +
             (f"wharf {w:.2f} s vs runai {ru:.2f} s ({ru / w:.2f}x)" if w and ru else "-"))
    w, b = load("wharf", 25.0), load("boto3-safetensors", 25.0)
    if m:
        line(w and b and b / w >= 3 if w and b else None,
             ">= 3x boto3 + safetensors at 25 ms: " +
             (f"{b / w:.2f}x ({w:.2f} s vs {b:.2f} s)" if w and b else "-"))
    for d in delays if delays else ([0.0, 25.0] if m else []):
        w, f = load("wharf", d), load("wharf-fetch", d)
        line(w and f and f / w >= 0.9 if w and f else None,
             f">= 90% of `wharf fetch` on the same bytes at {d:g} ms: " +
             (f"{100 * f / w:.0f}% ({w:.2f} s vs {f:.2f} s)" if w and f else "-"))
    if m:
        budget = _parse_size(m.get("memory_budget", "1G"))
        limit = (m["bytes"] + budget) / MiB + 64
        peaks = [r["peak_above_mib"] for r in rs if r.get("part") in ("load", "tier")
                 and r.get("client") in ("wharf", "wharf-tier") and r.get("status") == "ok"]
        p = max(peaks) if peaks else None
        line(p is not None and p <= limit if p is not None else None,
             f"peak memory <= model size + runtime budget + 64 MiB ({m['bytes'] / MiB:,.0f} + "
             f"{budget / MiB:,.0f} + 64 = {limit:,.0f} MiB): " +
             (f"highest wharf peak above start {p:,.0f} MiB (model {m['bytes'] / MiB:,.0f} MiB)"
              if p is not None else "-"))
    cache = [r for r in rs if r.get("part") == "cache" and r.get("backend")]
    mem = [r for r in cache if r["backend"] == "memory"]
    p99 = _med(mem, "hit1_p99_us")
    if not cache:
        return "\n".join(out) + "\n"
    line(p99 < 50 if p99 is not None else None,
         "in-process cache hit under 50 us p99: "
         + (f"{p99:.1f} us (p50 {_med(mem, 'hit1_p50_us'):.1f})" if p99 is not None else "-"))
    red = [r for r in cache if r["backend"] == "redis"]
    h50, h99 = _med(red, "hit1_p50_us"), _med(red, "hit1_p99_us")
    g50, g99 = _med(red, "redis_get_p50_us"), _med(red, "redis_get_p99_us")
    line(h50 <= 2 * g50 and h99 <= 2 * g99 if h50 and g50 and h99 and g99 else None,
         "Redis hit within 2x Redis's own round trip: " + (
             f"hit p50/p99 {h50:.0f}/{h99:.0f} us vs GET {g50:.0f}/{g99:.0f} us "
             f"({h50 / g50:.2f}x / {h99 / g99:.2f}x)" if h50 and g50 and h99 and g99 else "-"))
    return "\n".join(out) + "\n"


def _parse_size(s: str) -> int:
    s = str(s).strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s) if s.isdigit() else 1 << 30


def render(results: list) -> str:
    """The report's tables again from a run's JSON results (bench-results/bench-*.json)."""
    out = []
    if any(r.get("part") == "load" for r in results if r.get("scenario") == "SERVE"):
        out.append(load_table(results))
    if any(r.get("part") == "tier" for r in results if r.get("scenario") == "SERVE"):
        out.append(tier_table(results))
    c = cache_table(results)
    if c:
        out.append(c)
    out.append(targets(results))
    return "\n".join(out)


if __name__ == "__main__":
    scenario.main(worker, render, "SERVE", "serve_bench.py")
