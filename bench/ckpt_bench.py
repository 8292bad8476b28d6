"""CKPT: the checkpoint benchmarks of issue 13, run by bench/run_bench.py (its server, proxy and
report):

    .venv/bin/python bench/run_bench.py --scenario CKPT [--quick] [--repeat N] [--delays 0,25]
                                        [--ckpt-parts store,tier,async] [--clients ...]

State: a training-like state of a few hundred (335) float32 tensors, sizes spread log-uniformly
(1 KiB to 64 MiB) and summing to 2 GiB (--quick: 256 MiB), the same bytes for every client.
Every measurement runs in a fresh process (python bench/ckpt_bench.py --worker ...), which
builds the state, then times the operation alone; peak RSS is reported above the RSS the
process had once the state was built (what the operation added).

(store) save then load of the state through RGW at each delay (0 ms: straight to RGW; others
  through wharf-latency-proxy, each way), each client into its own prefix, deleted after:
    store-put / store-get  the store's own rate for the same bytes: `wharf cp` of one object
                           of that size from /dev/shm, and `wharf fetch` of it into memory
    wharf-dcp              dcp.save / dcp.load with wharf.torch.checkpoint.StorageWriter /
                           StorageReader (load into the preallocated state, in place)
    wharf-torch-save       wharf.torch.save / wharf.torch.load (one object, streamed)
    torch-boto3            torch.save into BytesIO + boto3 upload_fileobj; download_fileobj
                           into BytesIO + torch.load
    s3torch-dcp            s3torchconnector's DCP S3StorageWriter / S3StorageReader
    s3torch-ckpt           s3torchconnector's S3Checkpoint writer + torch.save / reader +
                           torch.load
                           (Ceph RGW 16.2 answers CompleteMultipartUpload with an empty <ETag>,
                           which their CRT client requires: they reach RGW through a proxy with
                           --fill-empty-complete-etag, at 0 ms one of their own with no delay)
(tier) the same state to a local disk: wharf-dcp to a path inside a tier (durable: the tier
  syncs its batches) vs DCP's own FileSystemWriter (sync_files=True, its default; thread_count
  1, its default, and 4) into a plain directory; loads from the page cache.
(async) the training loop's stall: a CheckpointManager with async_save saves the state to the
  bucket at each delay; the time save() blocks (its second save: the staging copy is reused)
  against one in-memory copy of the state (torch copy_ into preallocated tensors, measured in
  the same process) and against a synchronous save of the same manager kind.
"""
from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import scenario  # noqa: E402  (bench/, beside this file)
from scenario import median_ok as _med, rss_bytes  # noqa: E402,F401
STORE_ORDER = ["store-put", "wharf-dcp", "wharf-torch-save", "torch-boto3", "s3torch-dcp",
               "s3torch-ckpt"]
LABEL = {
    "store-put": "store itself: wharf cp / wharf fetch of one object",
    "wharf-dcp": "**wharf DCP StorageWriter/Reader**",
    "wharf-torch-save": "wharf.torch.save / load",
    "torch-boto3": "torch.save + boto3 upload_fileobj / download_fileobj + torch.load",
    "s3torch-dcp": "s3torchconnector DCP S3StorageWriter/Reader",
    "s3torch-ckpt": "s3torchconnector S3Checkpoint + torch.save / torch.load",
    "wharf-dcp-tier": "**wharf DCP to a tier** (durable)",
    "fs-dcp-1": "DCP FileSystemWriter/Reader (thread_count=1, sync_files)",
    "fs-dcp-4": "DCP FileSystemWriter/Reader (thread_count=4, sync_files)",
}


# ----------------------------------------------------------------------------- the worker
def make_state(total: int, seed: int = 0):
    """Deterministic float32 tensors summing to ~total bytes, nested like a training state."""
    import torch
    g = torch.Generator().manual_seed(seed)
    rng = __import__("random").Random(seed)
    sizes, left = [], total
    while left > 0:
        n = int(2 ** rng.uniform(10, 26))  # 1 KiB .. 64 MiB
        n = min(n, left)
        sizes.append(max(4, n - n % 4))
        left -= sizes[-1]
    model, optim = {}, {}
    for i, n in enumerate(sizes):
        t = torch.empty(n // 4, dtype=torch.float32)
        t.uniform_(generator=g)
        (model if i % 3 else optim)[f"layer{i:04d}.weight"] = t
    return {"model": model, "optim": optim, "step": 1234}


def zeros_like(state):
    import torch
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
            "optim": {k: torch.zeros_like(v) for k, v in state["optim"].items()}, "step": 0}


def nbytes_of(state) -> int:
    return sum(t.numel() * t.element_size() for part in ("model", "optim")
               for t in state[part].values())


def _boto3(endpoint: str, region: str):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, region_name=region,
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=50))


def worker(spec: dict) -> dict:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    state = make_state(spec["bytes"])
    nbytes = nbytes_of(state)
    client, op, uri = spec["client"], spec["op"], spec["uri"]
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    region = os.environ.get("AWS_REGION", "us-east-1")
    # Everything a client needs is imported and set up before the clock starts.
    if client.startswith("wharf") or client == "async":
        import wharf.torch
        from wharf.torch.checkpoint import StorageReader, StorageWriter
    if client == "torch-boto3":
        import io
        s3 = _boto3(endpoint, region)
        bucket, key = uri[5:].split("/", 1)
    if client.startswith("s3torch"):
        from s3torchconnector import S3Checkpoint, S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
        cfg = S3ClientConfig(force_path_style=True)
    dst = zeros_like(state) if op == "load" else None
    base_rss = rss_bytes()
    out: dict = {"client": client, "op": op, "bytes": nbytes, "tensors": len(state["model"]) +
                 len(state["optim"])}
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if client in ("wharf-dcp", "wharf-dcp-tier"):
        if op == "save":
            dcp.save(state, storage_writer=StorageWriter(uri))
        else:
            dcp.load(dst, storage_reader=StorageReader(uri))
    elif client.startswith("fs-dcp"):
        threads = int(client.rsplit("-", 1)[1])
        if op == "save":
            dcp.save(state, storage_writer=dcp.FileSystemWriter(uri, thread_count=threads))
        else:
            dcp.load(dst, storage_reader=dcp.FileSystemReader(uri))
    elif client == "wharf-torch-save":
        if op == "save":
            wharf.torch.save(state, uri)
        else:
            dst = wharf.torch.load(uri, map_location="cpu", weights_only=True)
    elif client == "torch-boto3":
        if op == "save":
            buf = io.BytesIO()
            torch.save(state, buf)
            buf.seek(0)
            s3.upload_fileobj(buf, bucket, key)
        else:
            buf = io.BytesIO()
            s3.download_fileobj(bucket, key, buf)
            buf.seek(0)
            dst = torch.load(buf, map_location="cpu", weights_only=True)
    elif client == "s3torch-dcp":
        # Its defaults (thread_count 1); the client given the endpoint, as for the reader.
        if op == "save":
            w = S3StorageWriter(region, uri, s3client_config=cfg)
            w.fs._client = S3Client(region, endpoint=endpoint, s3client_config=cfg)
            dcp.save(state, storage_writer=w)
        else:
            r = S3StorageReader(region, uri, s3client_config=cfg)
            r.fs._client = S3Client(region, endpoint=endpoint, s3client_config=cfg)
            dcp.load(dst, storage_reader=r)
    elif client == "s3torch-ckpt":
        ck = S3Checkpoint(region, endpoint=endpoint, s3client_config=cfg)
        if op == "save":
            with ck.writer(uri) as w:
                torch.save(state, w)
        else:
            with ck.reader(uri) as r:
                dst = torch.load(r, map_location="cpu", weights_only=True)
    elif client == "async":
        from wharf.torch import CheckpointManager
        mgr = CheckpointManager(uri, async_save=True)
        mgr.save(1, state).result()  # the first save allocates the staging copy
        a0 = time.perf_counter()
        h = mgr.save(2, state)
        out["stall_s"] = time.perf_counter() - a0
        h.result()
        out["async_total_s"] = time.perf_counter() - a0
        sync = CheckpointManager(uri, async_save=False)
        s0 = time.perf_counter()
        sync.save(3, state)
        out["sync_s"] = time.perf_counter() - s0
        mgr.close()
        sync.close()
        # What the saves added (the staged copy among it), before the copy below allocates.
        out["peak_saves_mib"] = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                                    - base_rss) / 2**20
        # One in-memory copy of the state, into preallocated tensors (what staging must do).
        copy_into = zeros_like(state)
        for part in ("model", "optim"):  # touch the pages first: the copy alone is timed
            for t in copy_into[part].values():
                t.fill_(1)
        c0 = time.perf_counter()
        for part in ("model", "optim"):
            for k, v in state[part].items():
                copy_into[part][k].copy_(v)
        out["copy_s"] = time.perf_counter() - c0
        del copy_into
    else:
        raise SystemExit(f"unknown client or operation: {client} {op}")
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    if op == "load":
        # The loaded state must be the saved one (a check, not timed).
        ref = make_state(spec["bytes"])
        for part in ("model", "optim"):
            for k, v in ref[part].items():
                if not torch.equal(dst[part][k], v):
                    raise SystemExit(f"{client}: loaded {part}.{k} differs from the saved one")
    out.update(wall_s=wall, gb_per_s=nbytes / wall / 1e9,
               cpu_s=(ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
               peak_above_mib=max(0, ru1.ru_maxrss * 1024 - base_rss) / 2**20,
               base_rss_mib=base_rss / 2**20)
    return out


# ----------------------------------------------------------------------------- the driver
def _run_worker(rb, spec: dict, env: dict, timeout: float) -> dict:
    r = scenario.run_worker(rb.VENV_PY, Path(__file__).resolve(), spec, env, timeout, cwd=REPO)
    if r["status"] == "failed":
        r.update(client=spec.get("client"), op=spec.get("op"))
    return r


def _env(rb, server, endpoint: str) -> dict:
    env = dict(os.environ)
    env.update(server.env)
    env["AWS_ENDPOINT_URL"] = endpoint
    env.pop("AWS_PROFILE", None)
    env["PYTHONPATH"] = str(REPO / "python")
    return env


def _s3(server):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=server.endpoint,
                        aws_access_key_id=server.env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=server.env["AWS_SECRET_ACCESS_KEY"],
                        region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))


def _empty(s3, bucket: str, prefix: str) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []):
        s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])


def _store_ref(rb, a, server, env, nbytes: int, delay: float) -> tuple[dict, dict]:
    """The store's own rate for the same bytes: wharf cp of one object from /dev/shm, then
    wharf fetch of it into memory."""
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    f = shm / f"wharf-ckpt-raw-{os.getpid()}.bin"
    with open(f, "wb") as out:
        left = nbytes
        block = os.urandom(8 << 20)
        while left > 0:
            out.write(block[:min(left, len(block))])
            left -= min(left, len(block))
    uri = f"s3://{rb.BUCKET}/ckpt-bench/raw-{delay:g}/obj"
    try:
        t0 = time.perf_counter()
        p = subprocess.run([a.wharf, "cp", "--quiet", str(f), uri], env=env,
                           capture_output=True, text=True, timeout=a.timeout)
        put = time.perf_counter() - t0
        if p.returncode != 0:
            return ({"status": "failed", "error": [p.stderr.strip()]},) * 2
        t0 = time.perf_counter()
        p = subprocess.run([a.wharf, "fetch", "--json", uri], env=env, capture_output=True,
                           text=True, timeout=a.timeout)
        get = time.perf_counter() - t0
        if p.returncode != 0:
            return ({"status": "failed", "error": [p.stderr.strip()]},) * 2
        return ({"status": "ok", "wall_s": put, "gb_per_s": nbytes / put / 1e9},
                {"status": "ok", "wall_s": get, "gb_per_s": nbytes / get / 1e9})
    finally:
        f.unlink(missing_ok=True)


def run(rb, a, server, proxy_bin, avail: dict, results: list) -> list[str]:
    total = (256 if a.quick else 2048) * rb.MiB
    delays = [float(x) for x in a.delays.split(",")] if a.delays else [0.0, 25.0]
    parts = set(filter(None, a.ckpt_parts.split(",")))
    wanted = set(a.clients.split(",")) if a.clients else None
    sections = []
    s3 = _s3(server)
    try:
        s3.create_bucket(Bucket=rb.BUCKET)
    except Exception:  # noqa: BLE001 - exists already
        pass
    nbytes = None

    def want(c):
        return wanted is None or c in wanted

    if "store" in parts:
        rows = {}
        for delay in delays:
            with _endpoint(rb, a, server, proxy_bin, delay) as endpoint, \
                    (_endpoint(rb, a, server, proxy_bin, delay, crt=True) if delay <= 0
                     else contextlib.nullcontext(endpoint)) as crt_endpoint:
                env = _env(rb, server, endpoint)
                crt_env = _env(rb, server, crt_endpoint)
                per: dict = {}
                for rnd in range(a.repeat):
                    clients = [c for c in STORE_ORDER[1:] if want(c)]
                    clients = clients[rnd % len(clients):] + clients[:rnd % len(clients)]
                    for c in clients:
                        if c.startswith("s3torch") and avail.get("s3torch"):
                            continue
                        prefix = f"ckpt-bench/{c}-{delay:g}-{rnd}"
                        uri = f"s3://{rb.BUCKET}/{prefix}" + (
                            ".pt" if c in ("wharf-torch-save", "torch-boto3", "s3torch-ckpt")
                            else "/")
                        for op in ("save", "load"):
                            r = _run_worker(rb, {"client": c, "op": op, "uri": uri,
                                                 "bytes": total},
                                            crt_env if c.startswith("s3torch") else env,
                                            a.timeout)
                            r.update(delay_ms=delay, round=rnd, scenario="CKPT")
                            results.append(r)
                            per.setdefault((c, op), []).append(r)
                            nbytes = r.get("bytes", nbytes)
                            rb.log(f"  CKPT {delay:g} ms {c} {op}: " + (
                                f"{r['wall_s']:.2f} s, {r['gb_per_s']:.3f} GB/s, CPU "
                                f"{r['cpu_s']:.1f} s, +{r['peak_above_mib']:.0f} MiB"
                                if r["status"] == "ok" else f"FAILED {r['error']}"))
                            if r["status"] != "ok":
                                break
                        _empty(s3, rb.BUCKET, prefix)
                    if want("store-put") and nbytes:
                        put, get = _store_ref(rb, a, server, env, nbytes, delay)
                        per.setdefault(("store-put", "save"), []).append(put)
                        per.setdefault(("store-put", "load"), []).append(get)
                        results.append(dict(put, client="store-put", op="save", delay_ms=delay,
                                            scenario="CKPT"))
                        results.append(dict(get, client="store-put", op="load", delay_ms=delay,
                                            scenario="CKPT"))
                        rb.log(f"  CKPT {delay:g} ms store put/get: {put.get('gb_per_s', 0):.3f}"
                               f" / {get.get('gb_per_s', 0):.3f} GB/s")
                        _empty(s3, rb.BUCKET, f"ckpt-bench/raw-{delay:g}")
                rows[delay] = per
        sections.append(_store_table(rows, delays, nbytes or total, a.repeat))
        print("\n" + sections[-1], flush=True)

    if "tier" in parts:
        scratch = Path(a._scratch) if getattr(a, "_scratch", None) else Path(tempfile.gettempdir())
        per: dict = {}
        env = _env(rb, server, server.endpoint)
        for rnd in range(a.repeat):
            base = Path(tempfile.mkdtemp(prefix="wharf-ckpt-tier-", dir=scratch))
            try:
                subprocess.run([a.wharf, "tier", "init", str(base / "tier")], check=True,
                               capture_output=True, env=env)
                for c, uri in (("wharf-dcp-tier", base / "tier" / "ckpt"),
                               ("fs-dcp-1", base / "fs1"), ("fs-dcp-4", base / "fs4")):
                    if not want(c):
                        continue
                    for op in ("save", "load"):
                        r = _run_worker(rb, {"client": c, "op": op, "uri": str(uri),
                                             "bytes": total}, env, a.timeout)
                        r.update(delay_ms=None, round=rnd, scenario="CKPT")
                        results.append(r)
                        per.setdefault((c, op), []).append(r)
                        rb.log(f"  CKPT tier {c} {op}: " + (
                            f"{r['wall_s']:.2f} s, {r['gb_per_s']:.3f} GB/s, CPU {r['cpu_s']:.1f}"
                            f" s, +{r['peak_above_mib']:.0f} MiB" if r["status"] == "ok"
                            else f"FAILED {r['error']}"))
                    shutil.rmtree(uri, ignore_errors=True)
            finally:
                shutil.rmtree(base, ignore_errors=True)
        sections.append(_tier_table(per, total, a.repeat))
        print("\n" + sections[-1], flush=True)

    if "async" in parts:
        rows = {}
        for delay in delays:
            with _endpoint(rb, a, server, proxy_bin, delay) as endpoint:
                env = _env(rb, server, endpoint)
                rs = []
                for rnd in range(a.repeat):
                    prefix = f"ckpt-bench/async-{delay:g}-{rnd}"
                    r = _run_worker(rb, {"client": "async", "op": "save",
                                         "uri": f"s3://{rb.BUCKET}/{prefix}/", "bytes": total},
                                    env, a.timeout)
                    r.update(delay_ms=delay, round=rnd, scenario="CKPT")
                    results.append(r)
                    rs.append(r)
                    rb.log(f"  CKPT async {delay:g} ms: " + (
                        f"stall {r['stall_s'] * 1e3:.0f} ms, copy {r['copy_s'] * 1e3:.0f} ms, "
                        f"sync save {r['sync_s']:.2f} s" if r["status"] == "ok"
                        else f"FAILED {r['error']}"))
                    _empty(s3, rb.BUCKET, prefix)
                rows[delay] = rs
        sections.append(_async_table(rows, delays, total))
        print("\n" + sections[-1], flush=True)
    return sections


@contextlib.contextmanager
def _endpoint(rb, a, server, proxy_bin, delay: float, crt: bool = False):
    """The S3 endpoint at `delay` ms each way: RGW itself at 0, else a latency proxy. The
    proxies fill the empty ETag of RGW 16.2's CompleteMultipartUpload replies, which the AWS
    CRT clients (`crt`: s3torchconnector) require; at 0 ms those get a proxy with no delay."""
    if delay <= 0 and not crt:
        yield server.endpoint
        return
    with rb.Proxy(proxy_bin, server.endpoint, delay,
                  [*a.proxy_arg, "--fill-empty-complete-etag"]) as proxy:
        yield proxy.url


def _store_table(rows: dict, delays, nbytes: int, repeat: int) -> str:
    out = [f"### CKPT (store): save and load of a {nbytes / 2**30:.2f} GiB state "
           f"(median of {repeat})", ""]
    for delay in delays:
        per = rows.get(delay, {})
        ref_put = _med(per.get(("store-put", "save"), []), "gb_per_s")
        ref_get = _med(per.get(("store-put", "load"), []), "gb_per_s")
        s3t_save = _med(per.get(("s3torch-dcp", "save"), []), "gb_per_s")
        s3t_load = _med(per.get(("s3torch-dcp", "load"), []), "gb_per_s")
        out += [f"**{delay:g} ms each way**" + (
                    " (straight to RGW; s3torchconnector through a proxy with no delay)"
                    if delay == 0 else " (wharf-latency-proxy)"), "",
                "| client | save GB/s | load GB/s | save vs store | load vs store | "
                "save vs s3torch DCP | load vs s3torch DCP | CPU s save/load | "
                "peak RSS above start MiB save/load |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in STORE_ORDER:
            s, l = per.get((c, "save"), []), per.get((c, "load"), [])
            if not s and not l:
                continue
            gs, gl = _med(s, "gb_per_s"), _med(l, "gb_per_s")

            def f(x, fmt="{:.3f}"):
                return fmt.format(x) if x is not None else "-"

            def ratio(x, ref):
                return f"{x / ref:.2f}x" if x and ref else "-"
            failed = [r for r in s + l if r.get("status") != "ok"]
            name = LABEL.get(c, c) + (" (failed: " + "; ".join(
                str(r.get("error")) for r in failed[:1]) + ")" if failed else "")
            out.append(f"| {name} | {f(gs)} | {f(gl)} | {ratio(gs, ref_put)} | "
                       f"{ratio(gl, ref_get)} | {ratio(gs, s3t_save)} | {ratio(gl, s3t_load)} | "
                       f"{f(_med(s, 'cpu_s'), '{:.1f}')}/{f(_med(l, 'cpu_s'), '{:.1f}')} | "
                       f"{f(_med(s, 'peak_above_mib'), '{:.0f}')}/"
                       f"{f(_med(l, 'peak_above_mib'), '{:.0f}')} |")
        out.append("")
    return "\n".join(out)


def _tier_table(per: dict, nbytes: int, repeat: int) -> str:
    out = [f"### CKPT (tier): save and load of a {nbytes / 2**30:.2f} GiB state on the local "
           f"disk (median of {repeat})", "",
           "| client | save GB/s | load GB/s | save vs FileSystemWriter(1) | "
           "load vs FileSystemReader | CPU s save/load | peak RSS above start MiB save/load |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    ref_s = _med(per.get(("fs-dcp-1", "save"), []), "gb_per_s")
    ref_l = _med(per.get(("fs-dcp-1", "load"), []), "gb_per_s")
    for c in ("wharf-dcp-tier", "fs-dcp-1", "fs-dcp-4"):
        s, l = per.get((c, "save"), []), per.get((c, "load"), [])
        if not s:
            continue
        gs, gl = _med(s, "gb_per_s"), _med(l, "gb_per_s")
        out.append(f"| {LABEL[c]} | {gs or 0:.3f} | {gl or 0:.3f} | "
                   f"{(gs / ref_s) if gs and ref_s else 0:.2f}x | "
                   f"{(gl / ref_l) if gl and ref_l else 0:.2f}x | "
                   f"{_med(s, 'cpu_s') or 0:.1f}/{_med(l, 'cpu_s') or 0:.1f} | "
                   f"{_med(s, 'peak_above_mib') or 0:.0f}/{_med(l, 'peak_above_mib') or 0:.0f} |")
    return "\n".join(out) + "\n"


def _async_table(rows: dict, delays, nbytes: int) -> str:
    out = [f"### CKPT (async): the training loop's stall for a {nbytes / 2**30:.2f} GiB state", "",
           "| delay | save() blocked s | one in-memory copy s | stall / copy | sync save s | "
           "stall / sync | async save total s | peak RSS above start MiB (the saves) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for delay in delays:
        rs = [r for r in rows.get(delay, []) if r.get("status") == "ok"]
        if not rs:
            out.append(f"| {delay:g} ms | failed | | | | | | |")
            continue
        st, cp, sy = _med(rs, "stall_s"), _med(rs, "copy_s"), _med(rs, "sync_s")
        out.append(f"| {delay:g} ms | {st:.3f} | {cp:.3f} | {st / cp:.2f}x | {sy:.2f} | "
                   f"{100 * st / sy:.1f}% | {_med(rs, 'async_total_s'):.2f} | "
                   f"{_med(rs, 'peak_saves_mib'):.0f} |")
    return "\n".join(out) + "\n"


def render(results: list) -> str:
    """The report's tables again from a run's JSON results (bench-results/bench-*.json)."""
    rs = [r for r in results if r.get("scenario") == "CKPT"]
    store, tier, asyncs = {}, {}, {}
    for r in rs:
        if r.get("client") == "async":
            asyncs.setdefault(r["delay_ms"], []).append(r)
        elif r.get("delay_ms") is None:
            tier.setdefault((r["client"], r["op"]), []).append(r)
        else:
            store.setdefault(r["delay_ms"], {}).setdefault((r["client"], r["op"]), []).append(r)
    nbytes = max((r.get("bytes", 0) for r in rs), default=0)
    rounds = max((r.get("round", 0) for r in rs), default=0) + 1
    delays = sorted(store) or sorted(asyncs)
    out = []
    if store:
        out.append(_store_table(store, delays, nbytes, rounds))
    if tier:
        out.append(_tier_table(tier, nbytes, rounds))
    if asyncs:
        out.append(_async_table(asyncs, sorted(asyncs), nbytes))
    return "\n".join(out)


if __name__ == "__main__":
    scenario.main(worker, render, "CKPT", "ckpt_bench.py")
