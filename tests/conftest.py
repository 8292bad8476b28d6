"""Shared fixtures: the wharf binary, and the real servers that ./run test starts (S3, the
shared file system, Redis, the GCS emulator)."""
import contextlib
import fcntl
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "tools"))
# The package of this checkout (its extension is built into python/wharf), whatever .venv's
# wharf.pth points at.
sys.path.insert(0, str(ROOT / "python"))
# Index files of listings and manifests (dataset/index_file.h) go to a folder of this test
# run, not the user's ~/.cache/wharf/index; subprocesses inherit it.
if "WHARF_INDEX_CACHE" not in os.environ:
    import atexit
    os.environ["WHARF_INDEX_CACHE"] = tempfile.mkdtemp(prefix="wharf-test-index-")
    # Removed when the run ends (only the folder made here, not one the caller named).
    atexit.register(shutil.rmtree, os.environ["WHARF_INDEX_CACHE"], ignore_errors=True)


def wharf_bin() -> str:
    return os.environ.get("WHARF_BIN", str(ROOT / "build" / "wharf"))


def run_wharf(*args, env=None, input=None, check=False, timeout=300):
    """Runs the CLI; returns the CompletedProcess (bytes stdout, text stderr)."""
    proc = subprocess.run([wharf_bin(), *map(str, args)], capture_output=True, input=input,
                          env=env, timeout=timeout)
    proc.stderr = proc.stderr.decode(errors="replace")
    if check and proc.returncode != 0:
        raise AssertionError(f"wharf {' '.join(map(str, args))} exited {proc.returncode}: "
                             f"{proc.stderr}")
    return proc


def random_bytes(n, seed):
    """n bytes that look random, the same for the same seed (SHA-256 chained from it)."""
    import hashlib
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


def run_processes(argvs, env, timeout=120):
    """Starts one process per argv at once (the ranks of a multi-process test) and waits for
    all; returns [(returncode, output)], killing any still running on a timeout or error."""
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for argv in argvs]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, log) for p, log in zip(procs, logs)]


@pytest.fixture(scope="session")
def s3_env():
    """The environment pointing at the local Ceph RGW. Fails (never skips) without it."""
    endpoint = os.environ.get("WHARF_S3_ENDPOINT")
    if not endpoint:
        pytest.fail("WHARF_S3_ENDPOINT is not set: run `./run test`, or "
                    "`scripts/s3-server start && eval \"$(scripts/s3-server env)\"`")
    env = dict(os.environ)
    env["AWS_ENDPOINT_URL"] = endpoint
    env.pop("AWS_PROFILE", None)
    return env


@pytest.fixture(scope="session")
def redis_url():
    """The local Redis that ./run test starts (scripts/redis-server), as redis://HOST:PORT/DB.
    Fails (never skips) when it is not set or does not answer."""
    url = os.environ.get("WHARF_REDIS_URL")
    if not url:
        pytest.fail("WHARF_REDIS_URL is not set: run `./run test`, or "
                    "`scripts/redis-server start && eval \"$(scripts/redis-server env)\"`")
    import redis
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        client.ping()
        client.close()
    except redis.RedisError as e:
        pytest.fail(f"Redis at {url} does not answer ({e}): scripts/redis-server status")
    return url


@pytest.fixture(scope="session")
def gcs_emulator():
    """STORAGE_EMULATOR_HOST of the local GCS emulator that ./run test starts
    (scripts/gcs-server). Fails (never skips) when it is not set or does not answer."""
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host:
        pytest.fail("STORAGE_EMULATOR_HOST is not set: run `./run test`, or "
                    "`scripts/gcs-server start && eval \"$(scripts/gcs-server env)\"`")
    import urllib.request
    try:
        urllib.request.urlopen(f"{host}/storage/v1/b?project=wharf", timeout=5).read()
    except OSError as e:
        pytest.fail(f"the GCS emulator at {host} does not answer ({e}): scripts/gcs-server status")
    return host


@pytest.fixture(scope="session")
def gcs_client(gcs_emulator):
    """google-cloud-storage's client on the emulator (it reads STORAGE_EMULATOR_HOST)."""
    from google.cloud import storage
    return storage.Client(project="wharf-test")


@pytest.fixture
def gcs_bucket(gcs_client):
    """A fresh bucket on the GCS emulator, emptied and removed afterwards."""
    name = f"wharf-py-{uuid.uuid4().hex[:16]}"
    bucket = gcs_client.create_bucket(name)
    yield name
    for blob in gcs_client.list_blobs(name):
        blob.delete()
    bucket.delete()


@pytest.fixture(scope="session")
def s3_client(s3_env):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=s3_env["WHARF_S3_ENDPOINT"],
                        aws_access_key_id=s3_env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=s3_env["AWS_SECRET_ACCESS_KEY"],
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def aws(s3_env, monkeypatch):
    """The real S3 server's endpoint, credentials and region in this process's environment,
    for one test (code that opens s3:// URIs in-process, and processes it starts)."""
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    monkeypatch.setenv("AWS_REGION", s3_env.get("AWS_REGION", "us-east-1"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_env


def damage(path, offset=0, data=None, truncate=None, keep_etag_cache=True):
    """Damage behind the tier's back, as a failing disk or a bug below the file system leaves
    it: `data` written at `offset` (default: the byte there flipped), or the file truncated to
    `truncate` bytes, and its mtime put back as it was. (A write that changes the mtime is a
    user's edit, and makes the file theirs: docs/design/tier.md.) The file store's cached MD5
    is kept with the size and mtime, so it still vouches for the old bytes unless
    `keep_etag_cache` is False, which drops it (then reads check the content)."""
    path = pathlib.Path(path)
    st = path.stat()
    with open(path, "r+b") as f:
        if truncate is not None:
            f.truncate(truncate)
        else:
            if data is None:
                f.seek(offset)
                data = bytes([f.read(1)[0] ^ 0xFF])
            f.seek(offset)
            f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    if not keep_etag_cache:
        with contextlib.suppress(OSError):
            os.removexattr(path, "user.wharf.etag")


def make_tier(path, env=None):
    """`wharf tier init PATH`; returns PATH."""
    run_wharf("tier", "init", path, "-q", env=env, check=True)
    return path


@pytest.fixture
def bucket(s3_client):
    """A fresh bucket, emptied and removed afterwards."""
    name = f"wharf-py-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    paginator = s3_client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=name):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3_client.delete_objects(Bucket=name, Delete={"Objects": keys})
    for upload in s3_client.list_multipart_uploads(Bucket=name).get("Uploads", []):
        s3_client.abort_multipart_upload(Bucket=name, Key=upload["Key"],
                                         UploadId=upload["UploadId"])
    s3_client.delete_bucket(Bucket=name)


def fuse_mounts():
    """The mount points of every FUSE file system (ceph-fuse mounts among them)."""
    with open("/proc/mounts") as f:
        fields = [line.split() for line in f]
    return {m[1].replace("\\040", " ") for m in fields if len(m) > 2 and m[2].startswith("fuse")}


@pytest.fixture(scope="session")
def fs_mounts():
    """The shared file system that ./run test starts (scripts/fs-server): one CephFS mounted
    twice, (mount A, mount B), two clients standing for two nodes. Fails (never skips) without
    them, and when a path is not a mount (tests would write to the local folder beneath)."""
    a, b = os.environ.get("WHARF_FS_MOUNT_A"), os.environ.get("WHARF_FS_MOUNT_B")
    if not a or not b:
        pytest.fail("WHARF_FS_MOUNT_A/B are not set: run `./run test`, or "
                    "`scripts/fs-server start && eval \"$(scripts/fs-server env)\"`")
    mounted = fuse_mounts()
    for m in (a, b):
        if m not in mounted:
            pytest.fail(f"{m} is not mounted (scripts/fs-server status)")
    return pathlib.Path(a), pathlib.Path(b)


@contextlib.contextmanager
def _mounts_lock(exclusive):
    """Held by a test for as long as it uses the shared file system: shared by tests that only
    use it, exclusive for one that crashes a mount (./run test runs two test processes at
    once, and the other one's test would lose its mount)."""
    base = os.environ.get("WHARF_FS_BASE") or tempfile.gettempdir()
    with open(os.path.join(base, "wharf-tests-mounts.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield  # closing the file releases the lock


def _shared_dir(fs_mounts, exclusive):
    with _mounts_lock(exclusive):
        name = f"wharf-py-{uuid.uuid4().hex[:16]}"
        a = fs_mounts[0] / name
        a.mkdir()
        yield a, fs_mounts[1] / name
        shutil.rmtree(a, ignore_errors=True)


@pytest.fixture
def shared_dir(fs_mounts):
    """A fresh directory on the shared file system as (its path through mount A, through
    mount B); removed afterwards (the file system keeps its data in RAM)."""
    yield from _shared_dir(fs_mounts, exclusive=False)


@pytest.fixture
def shared_dir_alone(fs_mounts):
    """shared_dir for a test that crashes a mount: no other test uses the shared file system
    meanwhile."""
    yield from _shared_dir(fs_mounts, exclusive=True)


@pytest.fixture(params=["local", "cephfs"])
def node_dirs(request, tmp_path):
    """One directory as two nodes see it: a local folder (both paths the same), or a folder on
    the shared file system through mount A and through mount B."""
    if request.param == "local":
        d = tmp_path / "shared"
        d.mkdir()
        return d, d
    return request.getfixturevalue("shared_dir")


class LatencyProxy:
    """tools/latency_proxy in front of a server (http://HOST:PORT): every request pays
    2 x delay_ms, and the bytes move at most at bandwidth_mbps."""

    def __init__(self, upstream_url, delay_ms, bandwidth_mbps=None):
        name = pathlib.Path("tools") / "latency_proxy" / "wharf-latency-proxy"
        binary = pathlib.Path(wharf_bin()).parent / name
        if not binary.exists():
            binary = ROOT / "build" / name
        assert binary.exists(), f"{binary} is missing: ./run build builds it"
        upstream = upstream_url.split("://", 1)[1]
        args = [str(binary), "--listen", "127.0.0.1:0", "--upstream", upstream,
                "--delay-ms", str(delay_ms)]
        if bandwidth_mbps:
            args += ["--bandwidth-mbps", str(bandwidth_mbps)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on 127.0.0.1:"), line
        self.url = f"http://127.0.0.1:{int(line.rsplit(':', 1)[1])}"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=10)


@pytest.fixture
def slow_link(s3_env):
    proxies = []

    def start(delay_ms, bandwidth_mbps=None):
        proxies.append(LatencyProxy(s3_env["WHARF_S3_ENDPOINT"], delay_ms, bandwidth_mbps))
        return proxies[-1].url

    yield start
    for p in proxies:
        p.stop()


@pytest.fixture(params=["file", "s3"])
def root(request, tmp_path):
    """A URI prefix on file:// or on a fresh RGW bucket (wharf.open, the converters, rows)."""
    if request.param == "file":
        return f"file://{tmp_path}/"
    request.getfixturevalue("s3_env")
    return f"s3://{request.getfixturevalue('bucket')}/"
