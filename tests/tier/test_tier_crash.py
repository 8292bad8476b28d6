"""kill -9 at random points of read-through fills, exports and eviction passes (issue 12,
crash safety; import has its own loop in test_tier_cli.py), against the real Ceph RGW. After
every kill: no partial file is presented as an entry (each file carrying the entry attribute
has the recorded size and the source's bytes), a killed process blocks nobody, and at the end a
rerun completes, `tier verify` is clean and what the killed runs left (temporary files of dead
owners, multipart uploads) is gone.

Kill delays are drawn from the duration of an uninterrupted run measured first; the RNG is
seeded (WHARF_CRASH_SEED to replay a run) and the seed is printed, so a failure reproduces."""
import fcntl
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_wharf, wharf_bin
from test_tier_export import entry_of, uploads_below, write_local_entry

MiB = 1 << 20
KILLS_PER_LOOP = 20


@pytest.fixture
def rng():
    seed = int(os.environ.get("WHARF_CRASH_SEED", random.randrange(1 << 31)))
    print(f"WHARF_CRASH_SEED={seed}")
    return random.Random(seed)


def entry_files(tier):
    """{path: entry attribute} of every file below the tier that claims to be an entry (its
    temporary area excluded: files there are presented as nothing)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tier):
        if os.path.relpath(dirpath, tier) == ".wharf":
            dirnames[:] = [d for d in dirnames if d == "objects"]
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                attr = os.getxattr(path, "user.wharf.entry")
            except OSError:
                continue
            out[path] = json.loads(attr)
    return out


def check_entries(tier, expected_of, when):
    """Every entry is complete and holds what `expected_of(path, entry)` says it should (a set
    of acceptable byte strings). Returns the number of entries."""
    entries = entry_files(tier)
    for path, entry in entries.items():
        with open(path, "rb") as f:
            data = f.read()
        assert len(data) == entry["size"], f"{when}: {path} is partial"
        if "md5" in entry:  # fills record a CRC32C instead: the bytes are compared below
            assert hashlib.md5(data).hexdigest() == entry["md5"], f"{when}: {path} is corrupt"
        assert data in expected_of(path, entry), f"{when}: {path} holds no version of its source"
    return len(entries)


def temp_leftovers(tier):
    """Files in the tier's temporary area other than owners' lock files."""
    left = []
    for dirpath, _, filenames in os.walk(tier / ".wharf" / "tmp"):
        left += [os.path.join(dirpath, n) for n in filenames if not n.endswith(".lock")]
    return left


def evict_lock_is_free(tier):
    path = tier / ".wharf" / "locks" / "evict"
    if not path.exists():
        return True
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


class Killer:
    """Runs commands and kills them with -9 at a random point of their run. The points are
    drawn from the duration of the last run of the same kind that was not killed (the first
    run of each kind is left to finish, to measure it)."""

    def __init__(self, rng, env):
        self.rng, self.env = rng, env
        self.window = {}
        self.kills = 0

    def run(self, kind, cmd):
        delay = None
        if kind in self.window:
            delay = self.rng.uniform(0.05, 1.0) * self.window[kind]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=delay if delay is not None else 300)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            self.kills += 1
            return True
        assert proc.returncode == 0, f"{cmd} failed: {err.decode()}"
        self.window[kind] = time.monotonic() - started
        return False


def python_reader(bucket, prefix, tier, keys, seed):
    """A Python process reading `keys` through `cache=tier` on 8 threads, in a seeded order."""
    code = f"""
import random, sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, {str(ROOT / 'python')!r})
import wharf
store = wharf.Store("s3://{bucket}/{prefix}", cache={str(tier)!r})
keys = {sorted(keys)!r}
random.Random({seed}).shuffle(keys)
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda k: len(bytes(store.get(k))), keys))
"""
    return [sys.executable, "-c", code]


def put_dataset(s3_client, bucket, prefix, rng, count, big=0):
    objects = {}
    for i in range(count):
        objects[f"{i % 5}/o-{i:04d}.bin"] = rng.randbytes(rng.randrange(500, 12000))
    for i in range(big):
        objects[f"big/b-{i}.bin"] = rng.randbytes(2 * MiB + i)
    for rel, data in objects.items():
        s3_client.put_object(Bucket=bucket, Key=prefix + rel, Body=data)
    return objects


def test_kill_9_during_read_through_fills(tmp_path, bucket, s3_env, s3_client, rng):
    objects = put_dataset(s3_client, bucket, "f/", rng, 300, big=4)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "-q", tier, check=True)
    area = tier / ".wharf" / "objects" / "s3" / bucket / "f"
    uri = f"s3://{bucket}/f/"
    cli = [wharf_bin(), "fetch", "-r", "--cache", str(tier), uri]

    def expected(path, entry):
        rel = os.path.relpath(path, area)
        assert entry["source"] == uri + rel
        return {objects[rel]}

    killer = Killer(rng, s3_env)
    leftovers = 0
    for i in range(3 * KILLS_PER_LOOP):
        if killer.kills == KILLS_PER_LOOP:
            break
        present = sorted(entry_files(area))
        for path in rng.sample(present, len(present) * 2 // 3):
            os.unlink(path)  # work for this run, as after an eviction
        kind = "cli" if i % 2 == 0 else "py"
        victim = cli if kind == "cli" else python_reader(bucket, "f/", tier, objects, i)
        # Every third run, another reader of the same data at the same time: the victim's
        # stripe locks die with it, so this one finishes.
        other = None
        if i % 3 == 0:
            other = subprocess.Popen(cli, env=s3_env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        killer.run(kind, victim)
        if other is not None:
            _, err = other.communicate(timeout=120)
            assert other.returncode == 0, f"run {i}: the other reader failed: {err.decode()}"
        leftovers += len(temp_leftovers(tier))
        check_entries(tier, expected, f"after run {i}")
    assert killer.kills == KILLS_PER_LOOP, "the runs ended too soon to be killed"
    assert leftovers > 0, "no kill landed mid-fill"

    # A rerun that fills removes what the killed ones left, and leaves every entry complete.
    os.unlink(sorted(entry_files(area))[0])
    subprocess.run(cli, env=s3_env, check=True, capture_output=True, timeout=120)
    assert temp_leftovers(tier) == []
    assert os.listdir(tier / ".wharf" / "tmp") == []
    assert check_entries(tier, expected, "after the rerun") == len(objects)
    assert run_wharf("tier", "verify", "-q", tier).returncode == 0


def test_kill_9_during_export(tmp_path, bucket, s3_env, s3_client, rng):
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "-q", tier, check=True)
    versions = {}  # rel -> every content ever written there
    current = {}

    def write(rel, data):
        write_local_entry(str(tier / rel), data)
        current[rel] = data
        versions.setdefault(rel, set()).add(data)

    for i in range(150):
        write(f"ckpt/{i % 4}/s-{i:03d}.bin", rng.randbytes(rng.randrange(100, 8000)))
    for i in range(2):
        write(f"ckpt/big-{i}.bin", rng.randbytes(17 * MiB + i))  # multipart: 8 + 8 + 1 MiB
    dst = f"s3://{bucket}/x/"
    cmd = [wharf_bin(), "tier", "export", "-q", "--inflight", "4", str(tier), dst]

    def expected(path, entry):
        return {current[os.path.relpath(path, tier)]}

    def check_destination(when):
        """An entry that says it is exported (local no more) is at the destination with the
        ETag it recorded; every object there is one whole version of its file."""
        listed = {}
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                         Prefix="x/"):
            for o in page.get("Contents", []):
                listed[o["Key"][2:]] = (o["Size"], o["ETag"].strip('"'))
        for rel, (size, etag) in listed.items():
            sizes = {len(v) for v in versions[rel]}
            assert size in sizes, f"{when}: x/{rel} has a size no version had"
            if "-" not in etag:
                assert etag in {hashlib.md5(v).hexdigest() for v in versions[rel]}, \
                    f"{when}: x/{rel} is no version of its file"
        for path, entry in entry_files(tier).items():
            rel = os.path.relpath(path, tier)
            if entry["local"]:
                continue
            assert entry["source"] == dst + rel
            assert listed.get(rel) == (entry["size"], entry["etag"]), \
                f"{when}: {rel} lost `local` but the destination does not hold it"

    killer = Killer(rng, s3_env)
    uploads_left = 0
    for i in range(3 * KILLS_PER_LOOP):
        if killer.kills == KILLS_PER_LOOP:
            break
        # Work for this run: new content in some files (new local entries) and a big one.
        for rel in rng.sample(sorted(r for r in current if "/s-" in r), 15):
            write(rel, rng.randbytes(rng.randrange(100, 8000)))
        write(f"ckpt/big-{rng.randrange(2)}.bin", rng.randbytes(17 * MiB + rng.randrange(100)))
        killer.run("export", cmd)
        uploads_left += len(uploads_below(s3_client, bucket, "x/"))
        check_entries(tier, expected, f"after run {i}")
        check_destination(f"after run {i}")
    assert killer.kills == KILLS_PER_LOOP, "the runs ended too soon to be killed"
    assert uploads_left > 0, "no kill landed mid-upload"

    out = json.loads(run_wharf("tier", "export", "--json", tier, dst, env=s3_env,
                               check=True).stdout)
    assert out["failed"] == 0
    assert uploads_below(s3_client, bucket, "x/") == []
    for rel, data in current.items():
        assert entry_of(tier / rel)["local"] is False, rel
        if len(data) < MiB:
            body = s3_client.get_object(Bucket=bucket, Key=f"x/{rel}")["Body"].read()
            assert body == data, rel
    check_destination("after the rerun")
    again = json.loads(run_wharf("tier", "export", "--json", tier, dst, env=s3_env,
                                 check=True).stdout)
    assert (again["uploaded"], again["skipped"]) == (0, len(current))
    assert run_wharf("tier", "verify", "-q", tier).returncode == 0
    run_wharf("tier", "gc", "-q", tier, check=True)
    assert os.listdir(tier / ".wharf" / "tmp") == []


def test_kill_9_during_eviction(tmp_path, bucket, s3_env, s3_client, rng):
    """Passes of `tier evict --to` and passes that bounded reads start, killed at random. The
    tier holds 800 read-through entries (written here, as fills would), a few pinned, a few
    `local` and one held open by a reader: those are never evicted."""
    tier = tmp_path / "tier"
    objects = put_dataset(s3_client, bucket, "r/", rng, 80)
    area = tier / ".wharf" / "objects" / "s3" / bucket
    content = {f"e/{i % 10}/{i:05d}": rng.randbytes(rng.randrange(200, 1200))
               for i in range(800)}
    total = sum(len(d) for d in content.values())
    # Reads fill the tier up to about two thirds of what it holds: their passes evict.
    run_wharf("tier", "init", "-q", "--max-size", str(total * 2 // 3), "--min-free", "0", tier,
              check=True)
    now = time.time()

    def restore():
        for rel, data in content.items():
            path = area / rel
            if path.exists():
                continue
            os.makedirs(path.parent, exist_ok=True)
            tmp = tier / ".wharf" / "staging"
            tmp.write_bytes(data)
            entry = {"v": 1, "source": f"s3://{bucket}/{rel}", "etag": "e", "size": len(data),
                     "md5": hashlib.md5(data).hexdigest(),
                     "filled": now - rng.uniform(0, 3600), "local": False}
            os.setxattr(tmp, "user.wharf.entry", json.dumps(entry).encode())
            os.rename(tmp, path)

    restore()
    keep = sorted(content)
    pinned, local, held = keep[:5], keep[5:10], keep[10]
    for rel in pinned:
        run_wharf("tier", "pin", "-q", area / rel, check=True)
    for rel in local:
        e = entry_of(area / rel)
        e["local"] = True
        os.setxattr(area / rel, "user.wharf.entry", json.dumps(e).encode())
    reader = open(area / held, "rb")
    fcntl.flock(reader, fcntl.LOCK_SH)  # as a reader holds it while it reads

    def expected(path, entry):
        rel = os.path.relpath(path, area)
        return {content[rel]} if rel.startswith("e/") else {objects[rel[len("r/"):]]}

    read = [wharf_bin(), "fetch", "-r", "--cache", str(tier), f"s3://{bucket}/r/"]
    killer = Killer(rng, s3_env)
    for i in range(3 * KILLS_PER_LOOP):
        if killer.kills == KILLS_PER_LOOP:
            break
        restore()
        if i % 2 == 0:
            kind = "evict"
            cmd = [wharf_bin(), "tier", "evict", "--to", str(rng.randrange(total // 2)), str(tier)]
        else:
            kind = "read"
            for path in entry_files(area / "r"):
                os.unlink(path)  # the reads fill again, and start passes
            cmd = read
        killer.run(kind, cmd)
        check_entries(tier, expected, f"after run {i}")
        for rel in pinned + local + [held]:
            assert (area / rel).exists(), f"after run {i}: {rel} was evicted"
        assert evict_lock_is_free(tier), f"after run {i}: a killed pass still holds the tier"
    assert killer.kills == KILLS_PER_LOOP, "the runs ended too soon to be killed"

    # Passes after the kills run to the end and reach their targets.
    subprocess.run(read, env=s3_env, check=True, capture_output=True, timeout=120)
    out = json.loads(run_wharf("tier", "evict", "--json", "--to", "0", tier, check=True).stdout)
    kept = sum(len(content[rel]) for rel in pinned + local + [held])
    assert out["bytes"] - out["evicted_bytes"] == kept
    assert (out["kept_pinned"], out["kept_local"], out["kept_busy"]) == (5, 5, 1)
    reader.close()
    assert run_wharf("tier", "verify", "-q", tier).returncode == 0
    run_wharf("tier", "gc", "-q", tier, check=True)
    assert os.listdir(tier / ".wharf" / "tmp") == []


def test_kill_9_during_gc_never_counts_twice(tmp_path, rng):
    """`tier gc` folds the counters of dead processes into one file: killed at random points
    (between writing the folded totals and removing the files it folded, too), `tier status`
    still reports each process once."""
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "-q", tier, check=True)
    stats = tier / ".wharf" / "stats"
    stats.mkdir()
    killer = Killer(rng, os.environ)
    rounds = 0
    for i in range(3 * KILLS_PER_LOOP // 2):
        if killer.kills == KILLS_PER_LOOP // 2:
            break
        rounds += 1
        # Finished processes' files (no owner lock: their owners are gone).
        for n in range(400):
            (stats / f"host-{i}-{n:04x}.json").write_text(
                json.dumps({"hits": 1, "misses": 2, "fills": 0, "fill_bytes": 0}))
        killer.run("gc", [wharf_bin(), "tier", "gc", "-q", str(tier)])
        s = json.loads(run_wharf("tier", "status", "--json", tier, check=True).stdout)
        assert (s["hits"], s["misses"]) == (400 * rounds, 800 * rounds), f"after run {i}"
    assert killer.kills == KILLS_PER_LOOP // 2, "the runs ended too soon to be killed"
    run_wharf("tier", "gc", "-q", tier, check=True)
    assert os.listdir(stats) == ["folded.json"]
    s = json.loads(run_wharf("tier", "status", "--json", tier, check=True).stdout)
    assert s["hits"] == 400 * rounds
