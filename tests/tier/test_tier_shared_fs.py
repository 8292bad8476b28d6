"""The tier shared by nodes: the same tier directory seen through two CephFS mounts (two
ceph-fuse clients standing for two nodes; scripts/fs-server), and, for comparison, through one
local folder. Importers, readers, a killed filler, eviction and garbage collection on one node
work with what the other node's processes do, as on one machine."""
import collections
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from conftest import ROOT, damage, run_wharf, wharf_bin
from fault_proxy import FaultProxy
from test_tier_cli import put_multipart, put_objects, tree_files

MiB = 1 << 20


def tier_json(*args, env=None):
    return json.loads(run_wharf("tier", *args, "--json", env=env, check=True).stdout)


def owner_dirs(tier):
    tmp = tier / ".wharf" / "tmp"
    return sorted(p.name for p in tmp.iterdir() if p.is_dir()) if tmp.exists() else []


@pytest.fixture
def proxy(s3_env):
    """The fault proxy in front of the real server: it delays responses on request and logs
    every request, so a test counts what the bucket was asked."""
    with FaultProxy(s3_env["WHARF_S3_ENDPOINT"].split("://", 1)[1]) as p:
        yield p


def via(proxy, s3_env):
    return dict(s3_env, AWS_ENDPOINT_URL=proxy.url)


def object_gets(proxy, bucket):
    """{key: GET requests} of the objects of `bucket` (listings excluded)."""
    prefix = f"/{bucket}/"
    gets = collections.Counter()
    for e in proxy.log():
        path = e["target"].split("?", 1)[0]
        if e["method"] == "GET" and path.startswith(prefix) and len(path) > len(prefix):
            gets[path[len(prefix):]] += 1
    return gets


def test_ranks_on_two_nodes_import_concurrently(node_dirs, bucket, s3_env, s3_client):
    """Rank 0 imports through mount A while rank 1 imports through mount B, into a folder that
    is no tier yet: together exactly what one import makes, seen alike from both nodes."""
    objects = put_objects(s3_client, bucket, "ds/", 120, size=2048)
    objects["big.bin"] = put_multipart(s3_client, bucket, "ds/big.bin", 6 * MiB)
    dest_a, dest_b = (d / "data" for d in node_dirs)  # each importer makes it a tier
    procs = [subprocess.Popen([wharf_bin(), "tier", "import", "--json", "--rank", str(rank),
                               "--world-size", "2", f"s3://{bucket}/ds/", str(dest)],
                              env=s3_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank, dest in ((0, dest_a), (1, dest_b))]
    fetched = 0
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
        r = json.loads(out)
        assert (r["rank"], r["world_size"], r["skipped"], r["failed"]) == (rank, 2, 0, 0), r
        assert 0 < r["fetched"] < len(objects)
        fetched += r["fetched"]
    assert fetched == len(objects)
    assert tree_files(dest_a) == objects
    assert tree_files(dest_b) == objects

    # One import over everything, on node B, finds it all there.
    again = tier_json("import", f"s3://{bucket}/ds/", dest_b, env=s3_env)
    assert (again["fetched"], again["skipped"]) == (0, len(objects))
    status = tier_json("status", dest_b)
    assert status["entries"] == len(objects)
    assert status["bytes"] == sum(len(v) for v in objects.values())
    assert status["imports"] == [{"source": f"s3://{bucket}/ds/", "dir": "", "complete": True,
                                  "objects": len(objects)}]
    verify = run_wharf("tier", "verify", "--json", dest_b)
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["checked"] == len(objects)


READER = f"""
import hashlib, json, random, sys
sys.path.insert(0, {str(ROOT / 'python')!r})
import wharf
uri, tier, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
want = json.load(sys.stdin)
store = wharf.Store(uri, cache=tier)
keys = sorted(want)
random.Random(seed).shuffle(keys)
for k in keys:
    assert hashlib.sha256(bytes(store.get(k))).hexdigest() == want[k], k
del store
print(len(keys))
"""


def test_readers_on_two_nodes_ask_the_bucket_once_per_object(node_dirs, bucket, s3_env,
                                                              s3_client, proxy):
    """Six Python processes, half on each node, read the same objects through `cache=` at
    once, each in its own order: every object is fetched from the bucket once, and every
    reader gets the right bytes."""
    objects = put_objects(s3_client, bucket, "r/", 40, size=8192, seed=5)
    want = {key: hashlib.sha256(data).hexdigest() for key, data in objects.items()}
    tier_a, tier_b = (d / "tier" for d in node_dirs)
    run_wharf("tier", "init", tier_a, check=True)
    env = via(proxy, s3_env)
    procs = [subprocess.Popen([sys.executable, "-c", READER, f"s3://{bucket}/r/", str(tier), str(i)],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for i, tier in enumerate((tier_a, tier_b) * 3)]
    for p in procs:
        out, err = p.communicate(json.dumps(want).encode(), timeout=300)
        assert p.returncode == 0, err.decode()
        assert int(out) == len(objects)
    assert object_gets(proxy, bucket) == {f"r/{key}": 1 for key in objects}
    s = tier_json("status", tier_b)
    assert (s["entries"], s["fills"]) == (40, 40), s
    assert s["hits"] + s["misses"] == 6 * 40


def test_a_killed_filler_on_one_node_blocks_no_reader_on_the_other(node_dirs, bucket, s3_env,
                                                                    s3_client, proxy):
    """A filler on node A hangs in its GET (the proxy holds the answer) and holds the
    object's fill lock; gc on node B leaves its temporary directory alone while it lives. A
    reader on B waits for it; the filler is killed with -9; the reader fills the object
    itself, and gc on B then removes what the killed filler left."""
    victim = os.urandom(300_000)
    s3_client.put_object(Bucket=bucket, Key="victim", Body=victim)
    tier_a, tier_b = (d / "tier" for d in node_dirs)
    run_wharf("tier", "init", tier_a, check=True)
    env = via(proxy, s3_env)
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/victim$"}, "action": "delay",
                       "delay_ms": 600_000, "count": 1}])
    filler = subprocess.Popen([wharf_bin(), "cat", "--cache", str(tier_a), f"s3://{bucket}/victim"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while object_gets(proxy, bucket)["victim"] == 0 or not owner_dirs(tier_a):
            assert filler.poll() is None, filler.stderr.read().decode()
            assert time.monotonic() < deadline, "the filler never asked for the object"
            time.sleep(0.05)
        live = owner_dirs(tier_a)
        gc = tier_json("gc", tier_b)
        assert gc["owners"] == 0, gc
        assert owner_dirs(tier_b) == live, "gc on B removed a live process's directory"

        reader = subprocess.Popen([wharf_bin(), "cat", "--cache", str(tier_b),
                                   f"s3://{bucket}/victim"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        time.sleep(1)
        # The reader is not fetching on its own: it waits for the filler's lock.
        assert object_gets(proxy, bucket)["victim"] == 1
    finally:
        filler.kill()
        filler.wait()
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err.decode()
    assert out == victim
    assert object_gets(proxy, bucket)["victim"] == 2
    s = tier_json("status", tier_a)
    assert (s["entries"], s["fills"]) == (1, 1), s
    assert (tier_a / ".wharf" / "objects" / "s3" / bucket / "victim").read_bytes() == victim
    assert run_wharf("tier", "verify", tier_a).returncode == 0

    # The killed filler's directory goes: the reader on B collected it when it took its own
    # temporary directory (a new owner removes dead owners'), or gc on B does.
    tier_json("gc", tier_b)
    assert not set(live) & set(owner_dirs(tier_a)), "the killed filler's directory is still there"


def test_pin_and_readers_on_one_node_hold_against_eviction_on_the_other(node_dirs, bucket,
                                                                        s3_env, s3_client):
    """Entries filled through A are entries through B; `tier evict` on B keeps what A pinned
    and what a reader on A holds (its shared lock), and removes the rest."""
    objects = put_objects(s3_client, bucket, "e/", 12, size=4000, seed=9)
    tier_a, tier_b = (d / "tier" for d in node_dirs)
    run_wharf("fetch", "-r", "--cache", tier_a, f"s3://{bucket}/e/", env=s3_env, check=True)
    area_a = tier_a / ".wharf" / "objects" / "s3" / bucket / "e"
    area_b = tier_b / ".wharf" / "objects" / "s3" / bucket / "e"
    assert tier_json("status", tier_b)["entries"] == len(objects)
    assert run_wharf("tier", "verify", tier_b).returncode == 0

    pinned, read = sorted(objects)[0], sorted(objects)[1]
    run_wharf("tier", "pin", area_a / pinned, check=True)
    import fcntl
    with open(area_a / read, "rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_SH)  # what a TierStore read holds while it reads
        out = tier_json("evict", tier_b)
    assert (out["entries"], out["kept_pinned"], out["kept_busy"]) == (12, 1, 1), out
    assert out["evicted"] == 10
    assert sorted(p.name for p in area_a.rglob("*") if p.is_file()) == \
        sorted(k.split("/")[-1] for k in (pinned, read))
    assert (area_b / pinned).read_bytes() == objects[pinned]

    run_wharf("tier", "unpin", area_b / pinned, check=True)
    out = tier_json("evict", tier_a)
    assert (out["evicted"], out["kept_pinned"]) == (2, 0), out


def test_a_file_written_on_one_node_is_the_users_on_the_other(node_dirs, bucket, s3_env,
                                                              s3_client):
    """The mtime an entry records is the file's as both nodes see it: a file a user wrote
    through A is theirs through B (eviction keeps it, verify says it was written since its
    fill), damage with the mtime as sealed is damage through B, and the untouched entries are
    evicted."""
    objects = put_objects(s3_client, bucket, "u/", 6, size=3000, seed=4)
    tree_a, tree_b = (d / "tier" / "u" for d in node_dirs)
    run_wharf("tier", "import", f"s3://{bucket}/u/", tree_a, env=s3_env, check=True)
    edited, damaged = sorted(objects)[:2]
    with open(tree_a / edited, "r+b") as f:
        f.write(b"the user's bytes")
    mine = (tree_a / edited).read_bytes()
    damage(tree_a / damaged, offset=10)
    proc = run_wharf("tier", "verify", "--json", tree_b, env=s3_env)
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["checked"], out["damaged"], out["modified"]) == (6, 2, 1), out
    assert f"{edited}: written since it was filled" in proc.stderr
    assert f"{damaged}: content MD5" in proc.stderr
    out = tier_json("evict", tree_b)
    assert (out["evicted"], out["kept_modified"]) == (5, 1), out
    left = [p.relative_to(tree_a) for p in tree_a.rglob("*") if p.is_file()]
    assert [p.as_posix() for p in left if ".wharf" not in p.parts] == [edited]
    assert (tree_b / edited).read_bytes() == mine


def test_min_free_on_a_file_system_without_capacity_warns_once(shared_dir, bucket, s3_env,
                                                               s3_client, tmp_path):
    """CephFS without a manager reports 0 bytes of capacity (statfs): --min-free cannot apply
    there. `tier init` says so once; a reader whose eviction passes would apply it says so once
    (however many passes it runs), and the size bound alone decides."""
    a, b = shared_dir
    assert os.statvfs(a).f_blocks == 0, "the test needs a file system that reports no capacity"
    objects = put_objects(s3_client, bucket, "m/", 30, size=10000, seed=3)
    tier_a, tier_b = a / "tier", b / "tier"
    warning = re.compile(r"reports no capacity, so its min free space \(20%, set with "
                         r"`wharf tier init --min-free`\) is ignored")
    init = run_wharf("tier", "init", "--min-free", "20", "--max-size", "100000", tier_a)
    assert init.returncode == 0, init.stderr
    assert len(warning.findall(init.stderr)) == 1, init.stderr
    assert tier_json("status", tier_b)["min_free"] == 20
    local = run_wharf("tier", "init", "--min-free", "20", tmp_path / "local", check=True)
    assert not warning.search(local.stderr), "a local disk reports its capacity"

    fetch = run_wharf("fetch", "-r", "--cache", tier_b, f"s3://{bucket}/m/", env=s3_env)
    assert fetch.returncode == 0, fetch.stderr
    assert len(warning.findall(fetch.stderr)) == 1, fetch.stderr
    s = tier_json("status", tier_a)
    assert s["fills"] == len(objects)
    # The size bound evicted (passes ran, more than one); what remains is within reach of it.
    assert 0 < s["entries"] < len(objects) and s["disk_bytes"] <= 2 * 100000, s


def fs_base():
    base = os.environ.get("WHARF_FS_BASE")
    if not base:
        pytest.fail("WHARF_FS_BASE is not set: eval \"$(scripts/fs-server env)\"")
    return base


def crash_node_a():
    """Node A crashes: its CephFS client (ceph-fuse) is killed with -9, so every process on
    A loses the mount."""
    with open(os.path.join(fs_base(), "run", "fuse.a.pid")) as f:
        os.kill(int(f.read()), 9)


def restart_node_a():
    """scripts/fs-server start evicts the dead client (freeing its capabilities and locks now,
    not after the MDS's session timeout) and mounts A again."""
    up = subprocess.run([str(ROOT / "scripts" / "fs-server"), "start"], capture_output=True,
                        env=dict(os.environ, WHARF_FS_BASE=fs_base()), timeout=300)
    assert up.returncode == 0, up.stderr.decode()
    assert "mounting again" in up.stderr.decode(), up.stderr.decode()


def test_a_node_crash_mid_import_leaves_only_complete_entries(shared_dir_alone, bucket,
                                                              s3_env, tmp_path):
    """Node A crashes while it imports (its mount dies under the importer). Node B sees only
    complete entries, each a copy of its source; a rerun on B fetches the rest and removes
    what the dead node's importer left in its temporary directory."""
    src = tmp_path / "src"
    rng = random.Random(77)
    objects = {}
    for i in range(300):
        rel = f"{i % 3}/obj-{i:04d}.bin"
        objects[rel] = rng.randbytes(10000 + i)
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(objects[rel])
    run_wharf("cp", "-r", "-q", src, f"s3://{bucket}/n/", env=s3_env, check=True)
    a, b = shared_dir_alone
    dest_a, dest_b = a / "tier", b / "tier"
    run_wharf("tier", "init", dest_a, check=True)
    importer = subprocess.Popen([wharf_bin(), "tier", "import", "-q", f"s3://{bucket}/n/",
                                 str(dest_a)], env=s3_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(dest_b.glob("*/obj-*.bin")):  # the first batch is published
        assert importer.poll() is None, "the import finished before the crash"
        assert time.monotonic() < deadline, "the import never published an entry"
        time.sleep(0.01)
    crash_node_a()
    try:
        importer.communicate(timeout=120)
        assert importer.returncode != 0, "the importer did not notice its mount die"
    finally:
        importer.kill()
        restart_node_a()

    seen = tree_files(dest_b)
    assert 0 < len(seen) < len(objects), len(seen)
    for rel, data in seen.items():
        assert data == objects[rel], f"{rel} is not its source's copy"
    assert run_wharf("tier", "verify", dest_b).returncode == 0
    assert owner_dirs(dest_b), "the crashed importer left no temporary directory"

    rerun = tier_json("import", f"s3://{bucket}/n/", dest_b, env=s3_env)
    assert rerun["failed"] == 0 and rerun["fetched"] + rerun["skipped"] == len(objects)
    assert rerun["skipped"] >= len(seen), rerun
    # The dead importer's temporary directory is gone (the files it held may never have
    # reached the MDS: a crashed client's unsynced creates are lost, so none may be counted).
    assert owner_dirs(dest_b) == []
    assert tree_files(dest_a) == objects  # node A, mounted again, sees it all
