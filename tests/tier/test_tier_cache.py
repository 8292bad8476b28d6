"""The tier as a read-through cache (`cache=` / `--cache` / WHARF_CACHE) in front of the real
Ceph RGW: a miss fills the tier once, later reads are hits, N processes reading the same data
cold fetch it once, and the Python store and datasets read through it by name."""
import json
import os
import pickle
import subprocess
import sys
import time

from conftest import ROOT, run_wharf, wharf_bin


def put_objects(s3_client, bucket, prefix, count, size=4096):
    objects = {}
    for i in range(count):
        key = f"{prefix}{i:04d}.bin"
        objects[key] = os.urandom(size)
        s3_client.put_object(Bucket=bucket, Key=key, Body=objects[key])
    return objects


def status(path):
    return json.loads(run_wharf("tier", "status", "--json", path, check=True).stdout)


def test_cli_reads_fill_once_then_hit(tmp_path, bucket, s3_env, s3_client):
    objects = put_objects(s3_client, bucket, "p/", 20)
    tier = tmp_path / "tier"
    run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/p/", env=s3_env, check=True)
    first = status(tier)
    assert (first["fills"], first["misses"], first["entries"]) == (20, 20, 20)
    assert first["fill_bytes"] == sum(len(v) for v in objects.values())
    copy = tier / ".wharf" / "objects" / "s3" / bucket / "p" / "0003.bin"
    assert copy.read_bytes() == objects["p/0003.bin"]

    run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/p/", env=s3_env, check=True)
    second = status(tier)
    assert (second["fills"], second["hits"]) == (20, 20)

    # An immutable tier answers from its copy even after the source changed; a cat through
    # WHARF_CACHE reads the same tier.
    s3_client.put_object(Bucket=bucket, Key="p/0003.bin", Body=b"new")
    env = dict(s3_env, WHARF_CACHE=str(tier))
    cat = run_wharf("cat", f"s3://{bucket}/p/0003.bin", env=env, check=True)
    assert cat.stdout == objects["p/0003.bin"]
    assert status(tier)["hits"] == 21
    # Without the tier the source's new bytes come back.
    assert run_wharf("cat", f"s3://{bucket}/p/0003.bin", env=s3_env, check=True).stdout == b"new"


def test_an_imported_file_edited_in_place_is_not_served_as_the_object(tmp_path, bucket, s3_env,
                                                                       s3_client):
    # An imported file rewritten in place at the same size kept its entry (attribute, size):
    # reads through --cache served the edit as the bucket's object. Its content now decides
    # once its mtime is not the one sealed: a touched file is still served, an edited one is
    # read from the source.
    s3_client.put_object(Bucket=bucket, Key="ed/a.txt", Body=b"HELLO\n")
    s3_client.put_object(Bucket=bucket, Key="ed/b.txt", Body=b"same\n")
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "-q", tier, env=s3_env, check=True)
    run_wharf("tier", "import", "-q", f"s3://{bucket}/ed/", tier / "ed", env=s3_env, check=True)
    (tier / "ed" / "a.txt").write_bytes(b"WORLD\n")
    os.utime(tier / "ed" / "b.txt")
    for _ in range(2):
        for key, data in (("a.txt", b"HELLO\n"), ("b.txt", b"same\n")):
            got = run_wharf("--cache", tier, "cat", f"s3://{bucket}/ed/{key}", env=s3_env,
                            check=True)
            assert got.stdout == data, key
    counts = status(tier)
    assert counts["fills"] == 1, counts  # a.txt, once; b.txt from the import
    assert (tier / "ed" / "a.txt").read_bytes() == b"WORLD\n"  # the user's file is theirs


def test_reads_through_the_tier_keep_the_objects_modification_time(tmp_path, bucket, s3_env,
                                                                    s3_client):
    # An entry's file carries the object's time (as a download does), so stat and HEAD
    # through the tier, and cp --cache, report the object's, not the fill's.
    put_objects(s3_client, bucket, "mt/", 1, size=1000)
    s3_client.put_object(Bucket=bucket, Key="mt/big.bin", Body=os.urandom(3 << 20))
    time.sleep(2)  # so a fill's own time would differ
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "--block-size", "1M", "--block-threshold", "1M",
              env=s3_env, check=True)
    for key in ("mt/0000.bin", "mt/big.bin"):
        uri = f"s3://{bucket}/{key}"
        source = s3_client.head_object(Bucket=bucket, Key=key)["LastModified"].timestamp()
        run_wharf("cat", "--cache", tier, uri, env=s3_env, check=True)  # fills
        out = tmp_path / key.replace("/", "_")
        run_wharf("cp", "--cache", tier, uri, out, env=s3_env, check=True)  # a hit
        assert abs(out.stat().st_mtime - source) < 1.0, key
    copy = tier / ".wharf" / "objects" / "s3" / bucket / "mt" / "0000.bin"
    assert abs(copy.stat().st_mtime - s3_client.head_object(
        Bucket=bucket, Key="mt/0000.bin")["LastModified"].timestamp()) < 1.0


def test_verify_finds_and_repairs_a_damaged_filled_copy(tmp_path, bucket, s3_env, s3_client):
    # Filled copies carry a CRC32C of their bytes: a flipped byte (same size, so the size check
    # alone would pass) is found; --repair drops the copy and the next read fills it again.
    objects = put_objects(s3_client, bucket, "v/", 3)
    tier = tmp_path / "tier"
    run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/v/", env=s3_env, check=True)
    copy = tier / ".wharf" / "objects" / "s3" / bucket / "v" / "0001.bin"
    entry = json.loads(os.getxattr(copy, "user.wharf.entry"))
    assert "md5" not in entry and len(entry["crc32c"]) == 8
    assert run_wharf("tier", "verify", tier, env=s3_env).returncode == 0
    data = bytearray(copy.read_bytes())
    data[100] ^= 0xFF
    os.chmod(copy, 0o644)
    with open(copy, "r+b") as f:  # in place: the attribute stays, the content is damaged
        f.write(data)
    damaged = run_wharf("tier", "verify", tier, env=s3_env)
    assert damaged.returncode == 1
    assert "CRC32C" in damaged.stdout.decode() and "0001.bin" in damaged.stdout.decode()
    fixed = run_wharf("tier", "verify", "--repair", tier, env=s3_env)
    assert fixed.returncode == 0 and "removed (the next read fills it again)" in \
        fixed.stdout.decode(), fixed
    assert not copy.exists()
    cat = run_wharf("cat", "--cache", tier, f"s3://{bucket}/v/0001.bin", env=s3_env, check=True)
    assert cat.stdout == objects["v/0001.bin"]
    assert copy.read_bytes() == objects["v/0001.bin"]
    assert run_wharf("tier", "verify", tier, env=s3_env).returncode == 0


def test_four_cold_processes_fetch_each_object_once(node_dirs, bucket, s3_env, s3_client):
    """On a local disk, and on the shared file system with two processes on each node."""
    objects = put_objects(s3_client, bucket, "shared/", 120, size=20000)
    tier_a, tier_b = (d / "tier" for d in node_dirs)
    run_wharf("tier", "init", tier_a, check=True)
    procs = [subprocess.Popen([wharf_bin(), "fetch", "-r", "--cache", str(tier),
                               f"s3://{bucket}/shared/"], env=s3_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for tier in (tier_a, tier_b) * 2]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    s = status(tier_b)
    assert s["fills"] == 120, s
    assert s["fill_bytes"] == 120 * 20000
    assert s["hits"] + s["misses"] == 4 * 120
    assert s["entries"] == 120
    for key, data in objects.items():
        assert (tier_a / ".wharf" / "objects" / "s3" / bucket / key).read_bytes() == data


def test_python_store_and_dataset_read_through_the_tier(tmp_path, bucket, s3_env, s3_client,
                                                         monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    objects = put_objects(s3_client, bucket, "ds/", 12, size=1000)
    tier = tmp_path / "tier"
    import wharf
    store = wharf.Store(f"s3://{bucket}/ds/", cache=tier)
    assert bytes(store.get("0001.bin")) == objects["ds/0001.bin"]
    assert (tier / ".wharf" / "objects" / "s3" / bucket / "ds" / "0001.bin").exists()
    # The spec travels with the store: a copy in another process reads through the tier.
    clone = pickle.loads(pickle.dumps(store))
    assert bytes(clone.get("0001.bin")) == objects["ds/0001.bin"]

    code = f"""
import sys
import time
sys.path.insert(0, {str(ROOT / 'python')!r})
from wharf.torch import MapDataset
ds = MapDataset.from_prefix("s3://{bucket}/ds/", cache={str(tier)!r})
print(sum(len(memoryview(ds[i].data)) for i in range(len(ds))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, env=os.environ,
                         timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    assert int(out.stdout) == 12 * 1000
    filled = sorted(p.name for p in (tier / ".wharf" / "objects" / "s3" / bucket / "ds").iterdir())
    assert filled == sorted(k.split("/")[1] for k in objects)


def test_status_counts_the_reads_of_a_process_that_is_still_reading(tmp_path, bucket, s3_env,
                                                                   s3_client, monkeypatch):
    # A reader's counters reach `tier status` while it lives (a moment after each read), not
    # only when its store closes or it exits.
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    put_objects(s3_client, bucket, "live/", 3, size=1000)
    tier = tmp_path / "tier"
    import wharf
    store = wharf.Store(f"s3://{bucket}/live/", cache=tier)
    for key in ("0000.bin", "0001.bin", "0000.bin"):
        store.get(key)
    deadline = time.monotonic() + 10
    while True:
        got = status(str(tier))
        if (got["hits"], got["misses"], got.get("fills")) == (1, 2, 2) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (got["hits"], got["misses"], got.get("fills")) == (1, 2, 2), got
    assert got["entries"] == 2
    del store  # closing writes nothing twice
    assert (status(str(tier))["hits"], status(str(tier))["misses"]) == (1, 2)


def test_forked_readers_count_their_reads_and_leave_no_temporary_directory(tmp_path, bucket,
                                                                           s3_env, s3_client):
    # Forked multiprocessing children (DataLoader workers) end with os._exit, which skips exit
    # handlers: their counters and temporary directories are seen to by a finalizer. The
    # parent's own reads before the fork are counted once, by the parent.
    put_objects(s3_client, bucket, "fk/", 10, size=1000)
    tier = tmp_path / "tier"
    code = f"""
import multiprocessing, sys
sys.path.insert(0, {str(ROOT / 'python')!r})
import wharf
store = wharf.Store("s3://{bucket}/fk/", cache={str(tier)!r})
store.get("0000.bin")

def work(i):
    for _ in range(2):
        for k in range(i * 5, i * 5 + 5):
            store.get(f"{{k:04d}}.bin")

if __name__ == "__main__":
    ps = [multiprocessing.get_context("fork").Process(target=work, args=(i,)) for i in (0, 1)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    assert [p.exitcode for p in ps] == [0, 0]
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, env=s3_env,
                         timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    got = status(tier)
    # Parent: 1 miss. Children: 10 first reads (0000.bin a hit, filled by the parent), 10 hits.
    assert (got["entries"], got["misses"], got["hits"]) == (10, 10, 11), got
    leftovers = [p.name for p in (tier / ".wharf" / "tmp").iterdir()]
    assert leftovers == [], leftovers


def test_cache_needs_no_init_and_bad_paths_fail_clearly(tmp_path, bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="x", Body=b"x")
    tier = tmp_path / "fresh" / "tier"  # not a tier yet: it becomes one with defaults
    first = run_wharf("cat", "--cache", tier, f"s3://{bucket}/x", env=s3_env, check=True)
    assert (tier / ".wharf" / "tier.json").exists()
    # Creating a tier says so once (a mistyped path does not silently become a second cache).
    assert f"created one at {tier}" in first.stderr, first.stderr
    again = run_wharf("cat", "--cache", tier, f"s3://{bucket}/x", env=s3_env, check=True)
    assert again.stdout == b"x" and "created" not in again.stderr, again.stderr
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    bad = run_wharf("cat", "--cache", blocker / "tier", f"s3://{bucket}/x", env=s3_env)
    assert bad.returncode == 1 and "cache=" in bad.stderr


def test_bounded_tier_evicts_by_itself_and_on_request(tmp_path, bucket, s3_env, s3_client):
    put_objects(s3_client, bucket, "b/", 30, size=10000)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "--max-size", "100000", "--min-free", "0", tier, check=True)
    run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/b/", env=s3_env, check=True)
    # Reads keep the tier near its bound: a pass runs inside the read that found it over, but
    # reads in flight at the same time may publish while it runs, so allow some slack. The
    # bound is disk space: each 10,000-byte object takes whole blocks (and an attribute block
    # on ext4), so fewer than 10 fit.
    s = status(tier)
    assert s["bytes"] < s["disk_bytes"] <= 2 * 100000, s
    assert s["entries"] * 10000 < s["disk_bytes"], s

    pinned = tier / ".wharf" / "objects" / "s3" / bucket / "b"
    kept = sorted(pinned.iterdir())[0]
    run_wharf("tier", "pin", kept, check=True)
    out = json.loads(run_wharf("tier", "evict", "--json", tier, check=True).stdout)
    assert out["kept_pinned"] == 1 and out["evicted"] == out["entries"] - 1
    assert [p.name for p in pinned.iterdir()] == [kept.name]
    assert status(tier)["entries"] == 1
    # Evicted objects are fetched again on the next read.
    run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/b/", env=s3_env, check=True)
    assert status(tier)["entries"] >= 1
    to = json.loads(run_wharf("tier", "evict", "--json", "--to", "20000", tier,
                              check=True).stdout)
    # The pinned entry counts, and stays.
    assert to["disk_bytes"] - to["evicted_disk_bytes"] <= 20000, to
    assert status(tier)["disk_bytes"] == to["disk_bytes"] - to["evicted_disk_bytes"]
    assert to["remaining_disk_bytes"] == status(tier)["disk_bytes"] and to["target_met"], to
    # A target the pinned entry alone exceeds is not met: said in the JSON and on stderr.
    short = run_wharf("tier", "evict", "--json", "--to", "1", tier, check=True)
    out = json.loads(short.stdout)
    assert out["target_met"] is False and out["kept_pinned"] == 1, out
    assert out["remaining_disk_bytes"] > 1, out
    assert "still take" in short.stderr and "1 pinned" in short.stderr, short.stderr


def test_a_bound_holds_when_each_read_is_a_process_of_its_own(tmp_path, bucket, s3_env,
                                                              s3_client):
    # Before, each process started from the usage the last pass recorded, added only its own
    # fill, stayed under the bound and exited without a pass: 30 `wharf cat`s grew a 60 KB
    # tier to 30 entries. Each now adds what it filled to the record as it exits.
    put_objects(s3_client, bucket, "one/", 30, size=5000)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "--max-size", "60000", "--min-free", "0", tier, check=True)
    for i in range(30):
        run_wharf("cat", "--cache", tier, f"s3://{bucket}/one/{i:04d}.bin", env=s3_env,
                  check=True)
    s = status(tier)
    assert s["misses"] == 30 and s["disk_bytes"] <= 2 * 60000, s


def test_gc_folds_the_counters_of_finished_readers(tmp_path, bucket, s3_env, s3_client):
    """Each reading process leaves one counters file; `tier gc` folds those of finished
    processes into one, and `tier status` reports the same totals before, during and after
    (gc's and statuses running at the same time count each process once)."""
    put_objects(s3_client, bucket, "c/", 10, size=100)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "-q", tier, check=True)
    for _ in range(6):
        run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/c/", env=s3_env, check=True)
    stats_dir = tier / ".wharf" / "stats"
    assert len(os.listdir(stats_dir)) == 6
    before = status(tier)
    assert (before["misses"], before["hits"], before["fills"]) == (10, 50, 10)

    def totals(s):
        return (s["hits"], s["misses"], s["fills"], s["fill_bytes"])

    gcs = [subprocess.Popen([wharf_bin(), "tier", "gc", "--json", str(tier)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    statuses = [subprocess.Popen([wharf_bin(), "tier", "status", "--json", str(tier)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for _ in range(3)]
    folded = 0
    for p in gcs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
        folded += json.loads(out)["stats_folded"]
    for p in statuses:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
        assert totals(json.loads(out)) == totals(before)
    assert folded == 6
    assert os.listdir(stats_dir) == ["folded.json"]
    assert totals(status(tier)) == totals(before)

    run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/c/", env=s3_env, check=True)
    assert status(tier)["hits"] == 60
    # A stray file in the read-through area (not an entry) is an orphan: gc removes it, and
    # nothing else there (the copies still hit).
    stray = tier / ".wharf" / "objects" / "s3" / bucket / "c" / "stray"
    stray.write_bytes(b"junk")
    out = json.loads(run_wharf("tier", "gc", "--json", tier, check=True).stdout)
    assert out["stats_folded"] == 1
    assert out["orphans"] == 1 and not stray.exists()
    assert os.listdir(stats_dir) == ["folded.json"]
    assert status(tier)["hits"] == 60
    run_wharf("fetch", "-r", "--cache", tier, f"s3://{bucket}/c/", env=s3_env, check=True)
    assert status(tier)["hits"] == 70  # its 10 objects, all from the tier


BLOCK = 256 << 10


def blocks_tier(tmp_path, *options):
    """A tier that caches objects above 1 MiB in 256 KiB blocks."""
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "--block-size", "256K", "--block-threshold", "1M", *options, tier,
              check=True)
    return tier


def blocks_dir(tier, bucket, key):
    return tier / ".wharf" / "objects" / "s3" / bucket / (key + ".blocks")


def block_files(tier, bucket, key):
    root = blocks_dir(tier, bucket, key)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_block_settings_are_checked(tmp_path):
    tier = blocks_tier(tmp_path)
    config = json.loads((tier / ".wharf" / "tier.json").read_text())
    assert (config["block_size"], config["block_threshold"]) == (BLOCK, 1 << 20)
    small = run_wharf("tier", "init", "--block-size", "1K", tmp_path / "t2")
    assert small.returncode == 2 and "block_size" in small.stderr  # a usage error
    below = run_wharf("tier", "init", "--block-size", "1M", "--block-threshold", "512K",
                      tmp_path / "t3")
    assert below.returncode == 2 and "block_threshold" in below.stderr


def test_ranged_reads_of_a_big_object_fetch_and_keep_only_their_blocks(tmp_path, bucket, s3_env,
                                                                      s3_client):
    data = os.urandom(12 * BLOCK)
    s3_client.put_object(Bucket=bucket, Key="big/model.bin", Body=data)
    tier = blocks_tier(tmp_path)
    uri = f"s3://{bucket}/big/model.bin"
    # Bytes [300000, 900000): blocks 1, 2 and 3, and only they come from the bucket.
    part = run_wharf("cat", "--cache", tier, "--range", "300000-899999", uri, env=s3_env,
                     check=True)
    assert part.stdout == data[300000:900000]
    s = status(tier)
    assert (s["fill_bytes"], s["blocks"], s["entries"]) == (3 * BLOCK, 3, 3)
    assert [name.split("/")[1] for name in block_files(tier, bucket, "big/model.bin")] == \
        ["1", "2", "3"]
    # Again: served by the tier, nothing fetched.
    again = run_wharf("cat", "--cache", tier, "--range", "262144-300000", uri, env=s3_env,
                      check=True)
    assert again.stdout == data[262144:300001]
    assert status(tier)["fill_bytes"] == 3 * BLOCK
    # A whole read fetches the other nine blocks and assembles the object.
    whole = run_wharf("cat", "--cache", tier, uri, env=s3_env, check=True)
    assert whole.stdout == data
    s = status(tier)
    assert (s["fill_bytes"], s["blocks"]) == (12 * BLOCK, 12)

    # The object's path covers its blocks: status, verify, pin, evict.
    obj = tier / ".wharf" / "objects" / "s3" / bucket / "big" / "model.bin"
    assert status(obj)["entries"] == 12
    verified = json.loads(run_wharf("tier", "verify", "--json", obj, check=True).stdout)
    assert (verified["checked"], verified["damaged"]) == (12, 0)
    damaged = blocks_dir(tier, bucket, "big/model.bin") / block_files(tier, bucket,
                                                                     "big/model.bin")[4]
    with open(damaged, "r+b") as f:  # same size, other bytes
        f.write(b"\0" * 100)
    bad = run_wharf("tier", "verify", obj)
    assert bad.returncode == 1 and str(damaged).encode() in bad.stdout
    run_wharf("tier", "verify", "--repair", obj, check=True)
    assert run_wharf("cat", "--cache", tier, uri, env=s3_env, check=True).stdout == data
    assert status(tier)["fill_bytes"] == 13 * BLOCK  # the damaged block, fetched again

    run_wharf("tier", "pin", obj, check=True)
    kept = json.loads(run_wharf("tier", "evict", "--json", tier, check=True).stdout)
    assert (kept["kept_pinned"], kept["evicted"]) == (12, 0)
    run_wharf("tier", "unpin", obj, check=True)
    gone = json.loads(run_wharf("tier", "evict", "--json", obj, check=True).stdout)
    assert gone["evicted"] == 12
    assert block_files(tier, bucket, "big/model.bin") == []


def test_processes_reading_the_same_blocks_fetch_them_once(tmp_path, bucket, s3_env, s3_client):
    data = os.urandom(16 * BLOCK)
    s3_client.put_object(Bucket=bucket, Key="big/shared.bin", Body=data)
    tier = blocks_tier(tmp_path)
    uri = f"s3://{bucket}/big/shared.bin"
    procs = [subprocess.Popen([wharf_bin(), "cat", "--cache", str(tier), "--range",
                               f"{BLOCK // 2}-{6 * BLOCK - 1}", uri], env=s3_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
        assert out == data[BLOCK // 2:6 * BLOCK]
    s = status(tier)
    assert (s["fill_bytes"], s["blocks"]) == (6 * BLOCK, 6), s


def test_a_changed_source_never_mixes_blocks_of_two_versions(tmp_path, bucket, s3_env,
                                                             s3_client):
    v1, v2 = os.urandom(8 * BLOCK), os.urandom(8 * BLOCK)
    s3_client.put_object(Bucket=bucket, Key="big/changing.bin", Body=v1)
    tier = blocks_tier(tmp_path, "--mode", "ttl", "--ttl", "1")
    uri = f"s3://{bucket}/big/changing.bin"

    def cat(rng=None):
        args = ["--range", rng] if rng else []
        return run_wharf("cat", "--cache", tier, *args, uri, env=s3_env, check=True).stdout

    assert cat(f"0-{2 * BLOCK - 1}") == v1[:2 * BLOCK]
    s3_client.put_object(Bucket=bucket, Key="big/changing.bin", Body=v2)
    # Block 1 is here (v1), block 2 is not: the read gets both from v2, never v1's block 1
    # with v2's block 2.
    assert cat(f"{BLOCK}-{3 * BLOCK - 1}") == v2[BLOCK:3 * BLOCK]
    versions = [p.name for p in blocks_dir(tier, bucket, "big/changing.bin").iterdir()]
    assert len(versions) == 1  # the old version's blocks went when the new one was filled
    time.sleep(1.2)  # past the ttl: the version is checked again, and still v2
    assert cat() == v2
    s3_client.put_object(Bucket=bucket, Key="big/changing.bin", Body=v1)
    time.sleep(1.2)
    assert cat() == v1
    gc = json.loads(run_wharf("tier", "gc", "--json", tier, check=True).stdout)
    assert "old_blocks" in gc
    assert len(list(blocks_dir(tier, bucket, "big/changing.bin").iterdir())) == 1


def test_a_pinned_copy_stays_pinned_when_a_new_version_replaces_it(tmp_path, bucket, s3_env,
                                                                   s3_client):
    # Read-through in ttl mode: the source changed, the refill replaces the pinned copy.
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "--mode", "ttl", "--ttl", "1", env=s3_env, check=True)
    s3_client.put_object(Bucket=bucket, Key="m/model.bin", Body=b"v1")
    uri = f"s3://{bucket}/m/model.bin"
    assert run_wharf("cat", "--cache", tier, uri, env=s3_env, check=True).stdout == b"v1"
    copy = tier / ".wharf" / "objects" / "s3" / bucket / "m" / "model.bin"
    run_wharf("tier", "pin", copy, env=s3_env, check=True)
    s3_client.put_object(Bucket=bucket, Key="m/model.bin", Body=b"v2")
    time.sleep(1.2)  # past the ttl
    assert run_wharf("cat", "--cache", tier, uri, env=s3_env, check=True).stdout == b"v2"
    assert status(tier)["pinned"] == 1
    evicted = json.loads(run_wharf("tier", "evict", tier, "--to", "0", "--json", env=s3_env,
                                   check=True).stdout)
    assert (evicted["evicted"], evicted["kept_pinned"]) == (0, 1)
    assert copy.read_bytes() == b"v2"

    # An import over a pinned tree: the file a changed object replaces stays pinned.
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"t/{i}.bin", Body=b"old")
    tree = tier / "tree"
    run_wharf("tier", "import", "-q", f"s3://{bucket}/t/", tree, env=s3_env, check=True)
    run_wharf("tier", "pin", tree, env=s3_env, check=True)
    s3_client.put_object(Bucket=bucket, Key="t/1.bin", Body=b"new")
    run_wharf("tier", "import", "-q", f"s3://{bucket}/t/", tree, env=s3_env, check=True)
    assert (tree / "1.bin").read_bytes() == b"new"
    assert status(tier)["pinned"] == 4
    run_wharf("tier", "evict", tier, "--to", "0", env=s3_env, check=True)
    assert sorted(p.name for p in tree.iterdir()) == ["0.bin", "1.bin", "2.bin"]


def test_cli_cache_reads_file_uris_through_the_tier_but_not_plain_paths(tmp_path):
    # --cache covers every scheme the way Python's cache= does: a file:// URI (a slow mount in
    # front of local disk) fills the tier once and then hits; a plain path (a copy's local
    # side) and a file:// URI inside the cache's own tier are read where they are.
    src = tmp_path / "mount"
    src.mkdir()
    data = {f"f{i}.bin": os.urandom(1000 + i) for i in range(3)}
    for name, body in data.items():
        (src / name).write_bytes(body)
    tier = tmp_path / "tier"
    run_wharf("fetch", "-r", "--cache", tier, f"file://{src}/", check=True)
    first = status(tier)
    assert (first["fills"], first["misses"]) == (3, 3)
    copy = tier / ".wharf" / "objects" / "file" / str(src).lstrip("/") / "f1.bin"
    assert copy.read_bytes() == data["f1.bin"]
    cat = run_wharf("cat", "--cache", tier, f"file://{src}/f1.bin", check=True)
    assert cat.stdout == data["f1.bin"]
    hit = status(tier)
    assert (hit["fills"], hit["hits"]) == (3, 1)

    run_wharf("cat", "--cache", tier, str(src / "f2.bin"), check=True)  # a plain path
    out = tmp_path / "out"
    run_wharf("cp", "-r", "--cache", tier, f"file://{src}/", str(out), check=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == data
    inside = tier / "data"
    inside.mkdir()
    (inside / "x").write_bytes(b"in the tier")
    assert run_wharf("cat", "--cache", tier, f"file://{inside}/x", check=True).stdout == \
        b"in the tier"
    after = status(tier)
    assert (after["fills"], after["hits"]) == (3, 4)


def _damage_in_place_keeping_size_and_time(path):
    """Bit rot as the file system would hand it back: one byte flipped, the size, mtime and
    inode as they were (so the cached ETag, keyed on them, still vouches for the file)."""
    st = os.stat(path)
    mode = st.st_mode & 0o777
    os.chmod(path, mode | 0o200)
    with open(path, "r+b") as f:
        f.seek(7)
        b = f.read(1)
        f.seek(7)
        f.write(bytes([b[0] ^ 0xFF]))
    os.chmod(path, mode)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_reads_stop_serving_what_verify_found_damaged(tmp_path, bucket, s3_env, s3_client):
    # An imported file (MD5 entry) and a filled copy (CRC32C entry), each damaged below the
    # file system (same size and time): hits are not checksummed, so reads served the damage
    # even after `tier verify` had reported it. Verify now marks the entries; reads through
    # the tier fetch the objects from the bucket, and --repair clears the mark.
    objects = put_objects(s3_client, bucket, "rot/", 2)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "-q", tier, env=s3_env, check=True)
    run_wharf("tier", "import", "-q", f"s3://{bucket}/rot/", tier / "rot", env=s3_env,
              check=True)
    imported = tier / "rot" / "0000.bin"
    uri = f"s3://{bucket}/rot/0001.bin"
    run_wharf("cat", "--cache", tier, uri, env=s3_env, check=True)  # 0001 was imported too
    # A read-through copy of another prefix: filled by a read.
    s3_client.put_object(Bucket=bucket, Key="rot2/x.bin", Body=objects["rot/0001.bin"])
    run_wharf("cat", "--cache", tier, f"s3://{bucket}/rot2/x.bin", env=s3_env, check=True)
    filled = tier / ".wharf" / "objects" / "s3" / bucket / "rot2" / "x.bin"
    assert filled.exists()
    for path in (imported, filled):
        _damage_in_place_keeping_size_and_time(path)
    verify = run_wharf("tier", "verify", tier, env=s3_env)
    assert verify.returncode == 1, verify
    out = verify.stdout.decode()
    assert out.count("until it is repaired") == 2, out
    for path in (imported, filled):
        assert json.loads(os.getxattr(path, "user.wharf.entry"))["damaged"] is True
    for key, want in (("rot/0000.bin", objects["rot/0000.bin"]),
                      ("rot2/x.bin", objects["rot/0001.bin"])):
        got = run_wharf("cat", "--cache", tier, f"s3://{bucket}/{key}", env=s3_env, check=True)
        assert got.stdout == want, key
    fixed = run_wharf("tier", "verify", "--repair", tier, env=s3_env)
    assert fixed.returncode == 0, fixed
    assert imported.read_bytes() == objects["rot/0000.bin"]
    assert "damaged" not in json.loads(os.getxattr(imported, "user.wharf.entry"))
    assert run_wharf("tier", "verify", tier, env=s3_env).returncode == 0


def test_a_link_planted_in_the_tier_is_neither_read_nor_written_through(tmp_path, bucket, s3_env,
                                                                        s3_client):
    # A link to another folder in the tier's own area (or a destination) led fills and imports
    # to write there, and reads to serve whatever it held: such paths bypass the tier now.
    objects = put_objects(s3_client, bucket, "ln/a/", 2)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, env=s3_env, check=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "0000.bin").write_bytes(b"forged")
    area = tier / ".wharf" / "objects" / "s3" / bucket / "ln"
    area.mkdir(parents=True)
    os.symlink(outside, area / "a")
    for key in ("ln/a/0000.bin", "ln/a/0001.bin"):
        got = run_wharf("--cache", tier, "cat", f"s3://{bucket}/{key}", env=s3_env, check=True)
        assert got.stdout == objects[key]
    assert sorted(os.listdir(outside)) == ["0000.bin"]
    assert (outside / "0000.bin").read_bytes() == b"forged"
    # An import into a tree with a link in it refuses the files below the link.
    dest = tier / "data"
    dest.mkdir()
    os.symlink(outside, dest / "a")
    bad = run_wharf("tier", "import", f"s3://{bucket}/ln/", dest, env=s3_env)
    assert bad.returncode == 1 and "is a symbolic link" in bad.stderr, bad.stderr
    assert sorted(os.listdir(outside)) == ["0000.bin"]
