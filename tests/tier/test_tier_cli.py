"""`wharf tier` against the real Ceph RGW: import is resumable by the source's ETag (multipart
objects included), verified, sharded across importers, and survives kill -9 at random points
without ever presenting a partial file; verify finds and repairs damage."""
import json
import os
import random
import signal
import stat
import subprocess
import time

from conftest import damage, run_wharf, wharf_bin

MiB = 1 << 20


def put_objects(s3_client, bucket, prefix, count, size=2048, seed=0):
    rng = random.Random(seed)
    objects = {}
    for i in range(count):
        key = f"{prefix}{i % 7}/obj-{i:04d}.bin"
        data = rng.randbytes(size + i)
        s3_client.put_object(Bucket=bucket, Key=key, Body=data)
        objects[key[len(prefix):]] = data
    return objects


def put_multipart(s3_client, bucket, key, size):
    data = os.urandom(size)
    upload = s3_client.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    part = 5 * MiB
    for n, off in enumerate(range(0, size, part), start=1):
        r = s3_client.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                  PartNumber=n, Body=data[off:off + part])
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    s3_client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                        MultipartUpload={"Parts": parts})
    return data


def tree_files(root):
    """{relative path: bytes} of every file below root, the tier's own folder excluded."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if ".wharf" in dirnames:
            dirnames.remove(".wharf")
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def import_json(*args, env):
    proc = run_wharf("tier", "import", "--json", *args, env=env, check=True)
    return json.loads(proc.stdout)


def test_import_resumes_by_etag_and_verify_repairs(tmp_path, bucket, s3_env, s3_client):
    objects = put_objects(s3_client, bucket, "data/", 40)
    # A multipart object: its ETag is not an MD5, so only the recorded provenance can tell
    # a rerun that the copy is current.
    objects["big.bin"] = put_multipart(s3_client, bucket, "data/big.bin", 12 * MiB)
    tier = tmp_path / "tier"
    dest = tier / "data"
    run_wharf("tier", "init", tier, env=s3_env, check=True)

    first = import_json(f"s3://{bucket}/data/", dest, env=s3_env)
    assert (first["objects"], first["fetched"], first["skipped"]) == (41, 41, 0)
    assert first["tier"] == str(tier)
    assert tree_files(dest) == objects
    # Imported files are ordinary files anyone can open.
    mode = stat.S_IMODE(os.stat(dest / "big.bin").st_mode)
    assert mode & stat.S_IRUSR and not mode & stat.S_IWOTH

    again = import_json(f"s3://{bucket}/data/", dest, env=s3_env)
    assert (again["fetched"], again["skipped"], again["bytes"]) == (0, 41, 0)

    s3_client.put_object(Bucket=bucket, Key="data/3/obj-0003.bin", Body=b"changed at the source")
    objects["3/obj-0003.bin"] = b"changed at the source"
    third = import_json(f"s3://{bucket}/data/", dest, env=s3_env)
    assert (third["fetched"], third["skipped"]) == (1, 40)
    assert tree_files(dest) == objects

    status = json.loads(run_wharf("tier", "status", "--json", dest, env=s3_env,
                                  check=True).stdout)
    assert status["entries"] == 41
    assert status["bytes"] == sum(len(v) for v in objects.values())
    assert status["imports"] == [{"source": f"s3://{bucket}/data/", "dir": "data",
                                  "complete": True, "objects": 41}]

    assert run_wharf("tier", "verify", dest, env=s3_env).returncode == 0
    # Damage behind the tier's back (the mtimes as sealed): a flipped byte (same size) and a
    # truncation.
    damage(dest / "big.bin", offset=MiB)
    damage(dest / "0/obj-0000.bin", truncate=100)
    damaged = run_wharf("tier", "verify", dest, env=s3_env)
    assert damaged.returncode == 1
    out = damaged.stdout.decode()
    assert "big.bin: content MD5" in out and "obj-0000.bin: size 100" in out
    assert "2 damaged entries remain" in damaged.stderr
    repaired = run_wharf("tier", "verify", "--repair", dest, env=s3_env)
    assert repaired.returncode == 0, repaired.stderr
    assert tree_files(dest) == objects
    assert run_wharf("tier", "verify", dest, env=s3_env).returncode == 0


def test_ranks_together_import_everything_once(tmp_path, bucket, s3_env, s3_client):
    objects = put_objects(s3_client, bucket, "ds/", 90, size=512)
    dest = tmp_path / "shared"
    fetched = 0
    for rank in range(3):
        r = import_json("--rank", rank, "--world-size", 3, f"s3://{bucket}/ds/", dest,
                        env=s3_env)
        assert r["skipped"] == 0 and 0 < r["fetched"] < 90
        assert (r["rank"], r["world_size"]) == (rank, 3)
        fetched += r["fetched"]
    assert fetched == 90
    assert tree_files(dest) == objects

    lone = run_wharf("tier", "import", "--rank", 1, f"s3://{bucket}/ds/", dest, env=s3_env)
    assert lone.returncode == 2 and "--rank and --world-size together" in lone.stderr


def test_kill_9_during_import_never_leaves_a_partial_entry(tmp_path, bucket, s3_env):
    # 2,000 objects, uploaded with wharf itself (fast), so an import takes long enough for
    # kills to land in listing, fetching, writing and publishing.
    src = tmp_path / "src"
    rng = random.Random(1234)
    objects = {}
    for i in range(2000):
        rel = f"{i % 13}/obj-{i:05d}.bin"
        objects[rel] = rng.randbytes(2048 + i % 997)
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(objects[rel])
    run_wharf("cp", "-r", "-q", src, f"s3://{bucket}/k/", env=s3_env, check=True)
    versions = {rel: {data} for rel, data in objects.items()}  # every version ever uploaded
    dest = tmp_path / "tier"

    started = time.monotonic()
    run_wharf("tier", "import", "-q", f"s3://{bucket}/k/", dest, env=s3_env, check=True)
    full = time.monotonic() - started
    kills = 0
    leftovers = 0
    for i in range(50):
        # Work for the next run: half the files gone (as after an eviction), and from time to
        # time new versions at the source.
        present = sorted(tree_files(dest))
        for rel in rng.sample(present, len(present) // 2):
            os.unlink(dest / rel)
        if i % 10 == 5:
            for rel in rng.sample(sorted(objects), 40):
                objects[rel] = rng.randbytes(3000)
                versions[rel].add(objects[rel])
                (src / rel).write_bytes(objects[rel])
            run_wharf("cp", "-r", "-q", src, f"s3://{bucket}/k/", env=s3_env, check=True)
        proc = subprocess.Popen([wharf_bin(), "tier", "import", "-q", f"s3://{bucket}/k/", dest],
                                env=s3_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.0, 0.5 * full))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        for dirpath, dirnames, filenames in os.walk(dest / ".wharf" / "tmp"):
            # Each process's temporary files sit in a directory only its user can enter.
            for name in dirnames:
                mode = stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode)
                assert mode & 0o077 == 0, f"{name}: {oct(mode)}"
            leftovers += sum(1 for name in filenames if not name.endswith(".lock"))
        # Whatever is at a key path is complete: one version of the source's bytes (an older
        # one until a run replaces it), never a prefix or a mix.
        for rel, data in tree_files(dest).items():
            assert data in versions[rel], f"after run {i}: {rel} is no version of the source"
    assert kills >= 25, f"only {kills} of 50 runs were killed: the import finished too soon"
    assert leftovers > 0, "no kill landed mid-import"

    final = import_json(f"s3://{bucket}/k/", dest, env=s3_env)
    assert final["failed"] == 0
    assert tree_files(dest) == objects
    # What the killed runs left (seen above) is gone after the clean rerun.
    left = list((dest / ".wharf" / "tmp").rglob("*"))
    assert left == [], f"temporary files left after a clean run: {left[:5]}"
    assert run_wharf("tier", "verify", dest, env=s3_env).returncode == 0


def test_clear_errors(tmp_path, bucket, s3_env):
    missing = run_wharf("tier", "import", "s3://wharf-no-such-bucket-x/data/", tmp_path / "t",
                        env=s3_env)
    assert missing.returncode == 1
    assert "wharf-no-such-bucket-x" in missing.stderr and len(missing.stderr.splitlines()) == 1
    outside = run_wharf("tier", "status", tmp_path / "nowhere")
    assert outside.returncode == 1 and "is in no tier" in outside.stderr
    run_wharf("tier", "init", tmp_path / "t2", check=True)
    # A path inside a tier names that tier (as for every tier verb): init sets its settings
    # and says so; no tier is made inside it.
    nested = run_wharf("tier", "init", "--max-size", "3G", tmp_path / "t2" / "inner")
    assert nested.returncode == 0, nested.stderr
    assert "inside the tier at" in nested.stderr and str(tmp_path / "t2") in nested.stderr
    assert json.loads(run_wharf("tier", "status", "--json", tmp_path / "t2",
                                check=True).stdout)["max_size"] == 3 << 30
    assert not (tmp_path / "t2" / "inner").exists()
    bad_mode = run_wharf("tier", "init", "--mode", "sometimes", tmp_path / "t3")
    assert bad_mode.returncode == 2
    settings = run_wharf("tier", "init", "--mode", "ttl", "--ttl", "30", "--max-size", "2G",
                         "--min-free", "10", tmp_path / "t2", check=True)
    assert b"mode ttl (ttl 30 s)" in settings.stdout
    status = json.loads(run_wharf("tier", "status", "--json", tmp_path / "t2",
                                  check=True).stdout)
    assert (status["mode"], status["ttl_seconds"], status["max_size"], status["min_free"]) == \
        ("ttl", 30.0, 2 << 30, 10.0)


def test_an_import_that_stops_moving_says_so_and_a_moving_one_does_not(tmp_path, bucket, s3_env,
                                                                        s3_client, slow_link):
    put_objects(s3_client, bucket, "s/", 3)
    env = dict(s3_env, WHARF_STALL_WARN_SECONDS="1")
    env["WHARF_S3_ENDPOINT"] = env["AWS_ENDPOINT_URL"] = slow_link(delay_ms=1500)  # 3 s a request
    slow = run_wharf("tier", "import", "--quiet", f"s3://{bucket}/s/", tmp_path / "a", env=env,
                     check=True)
    warnings = [line for line in slow.stderr.splitlines() if "no progress for" in line]
    assert warnings, slow.stderr
    assert all(line.startswith("wharf: no progress for ") and "0 objects" in line
               and "full file system" in line for line in warnings), warnings
    assert len(tree_files(tmp_path / "a")) == 3  # a warning, not a failure
    fast = run_wharf("tier", "import", "--quiet", f"s3://{bucket}/s/", tmp_path / "b", env=s3_env,
                     check=True)
    assert "no progress" not in fast.stderr


def test_an_import_larger_than_the_tiers_bound_warns_once_and_keeps_every_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(os.urandom(512 * 1024))
    run_wharf("tier", "init", "--max-size", "1M", tmp_path / "t", check=True)
    big = run_wharf("tier", "import", "--json", src, tmp_path / "t" / "all", check=True)
    assert json.loads(big.stdout)["tree_bytes"] == 3 * 512 * 1024
    warnings = big.stderr.splitlines()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("wharf: tier import: the imported tree") and \
        "larger than the tier's max size" in warnings[0] and "tier pin" in warnings[0]
    assert len(tree_files(tmp_path / "t" / "all")) == 3  # a warning: nothing was refused
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.bin").write_bytes(os.urandom(512 * 1024))
    fits = run_wharf("tier", "import", tmp_path / "one", tmp_path / "t" / "one", check=True)
    assert fits.stderr == ""
    unbounded = run_wharf("tier", "import", src, tmp_path / "u", check=True)
    assert unbounded.stderr == ""
    # The bound is disk space: 500 files of 1,000 bytes are 0.5 MB, but whole blocks each
    # (2 MB at 4 KiB): more than a 1M bound, so the warning comes, before eviction thins them.
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for i in range(500):
        (tiny / f"{i}.bin").write_bytes(os.urandom(1000))
    small = run_wharf("tier", "import", "--json", tiny, tmp_path / "t" / "tiny", check=True)
    summary = json.loads(small.stdout)
    assert summary["tree_bytes"] == 500 * 1000 < 1 << 20 < summary["tree_disk_bytes"], summary
    assert "larger than the tier's max size" in small.stderr, small.stderr
    # The estimate is what the files take, each entry's attributes included (an attribute
    # block per file on ext4: it once counted 4 KiB a file where `tier status` counted 8).
    kept = run_wharf("tier", "import", "--json", tiny, tmp_path / "u" / "tiny", check=True)
    disk = sum(f.stat().st_blocks * 512 for f in (tmp_path / "u" / "tiny").iterdir())
    assert json.loads(kept.stdout)["tree_disk_bytes"] == disk


def test_a_complete_import_answers_listings_through_the_tier(tmp_path, bucket, s3_env, s3_client):
    # A tree that holds every object its import listed is the source's listing (immutable
    # mode): `--cache` readers list from it and never ask the bucket; an import that has not
    # completed (here: one rank of two) leaves listings to the bucket.
    put_objects(s3_client, bucket, "ls/", 30)
    tier = tmp_path / "tier"
    src = f"s3://{bucket}/ls/"
    run_wharf("tier", "init", tier, check=True)

    def listed(*cache):
        out = run_wharf(*cache, "ls", "-r", src, env=s3_env, check=True).stdout.decode()
        return sorted(line.split()[-1] for line in out.splitlines() if line.strip())

    import_json("--rank", "0", "--world-size", "2", src, tier / "ls", env=s3_env)
    st = json.loads(run_wharf("tier", "status", "--json", tier, check=True).stdout)
    assert st["imports"][0]["complete"] is False
    import_json("--rank", "1", "--world-size", "2", src, tier / "ls", env=s3_env)
    st = json.loads(run_wharf("tier", "status", "--json", tier, check=True).stdout)
    assert (st["imports"][0]["complete"], st["imports"][0]["objects"]) == (True, 30)

    gone = "ls/0/obj-0000.bin"
    s3_client.delete_object(Bucket=bucket, Key=gone)
    everything = listed("--cache", tier)
    assert len(everything) == 30 and any(k.endswith(gone) for k in everything)
    assert len(listed()) == 29  # the bucket itself
    # A reader lists and reads the whole set from the tier, the deleted object included.
    fetched = run_wharf("--cache", tier, "fetch", "-r", src, env=s3_env, check=True)
    assert fetched.returncode == 0
    st = json.loads(run_wharf("tier", "status", "--json", tier, check=True).stdout)
    assert st["hits"] == 30 and st["misses"] == 0
    # The first reader's walk of the tree kept its listing beside the import's records; later
    # readers read that instead of walking. A file removed from the tree since is still listed
    # (the source listed it at the import) and is read through from the bucket.
    kept = list((tier / ".wharf" / "imports").glob("*.listing"))
    assert len(kept) == 1
    os.unlink(tier / "ls" / "1" / "obj-0001.bin")
    assert listed("--cache", tier) == everything
    before = st
    run_wharf("--cache", tier, "fetch", "-r", src, env=s3_env, check=True)
    st = json.loads(run_wharf("tier", "status", "--json", tier, check=True).stdout)
    assert (st["hits"] - before["hits"], st["misses"] - before["misses"]) == (29, 1)
    # Without a kept listing, a tree short of a file is not the whole listing: the walk finds
    # the tree short (the read-through copy does not count) and the bucket answers.
    kept[0].unlink()
    assert len(listed("--cache", tier)) == 29


def test_a_link_to_a_folder_inside_a_tier_is_inside_that_tier(tmp_path, bucket, s3_env, s3_client):
    # Every verb takes any path inside a tier, also through a symbolic link to a folder in it;
    # --cache through such a link uses the tier, not a new tier made within it.
    put_objects(s3_client, bucket, "lnk/e/", 6)
    put_objects(s3_client, bucket, "lnk/d/", 4)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    import_json(f"s3://{bucket}/lnk/e/", tier / "e", env=s3_env)
    import_json(f"s3://{bucket}/lnk/d/", tier / "d", env=s3_env)
    link = tmp_path / "link-e"
    link.symlink_to(tier / "e")
    status = json.loads(run_wharf("tier", "status", "--json", link, env=s3_env,
                                  check=True).stdout)
    assert status["tier"] == str(tier) and status["path"] == str(tier / "e")
    assert status["entries"] == 6
    one = sorted(p for p in os.listdir(tier / "e") if p != ".wharf")[0]
    run_wharf("tier", "pin", link / one, env=s3_env, check=True)
    assert json.loads(run_wharf("tier", "status", "--json", link / one, env=s3_env,
                                check=True).stdout)["pinned"] == 1
    verify = run_wharf("tier", "verify", link, env=s3_env, check=True)
    assert b"verified 6 entries" in verify.stdout, verify.stdout
    got = run_wharf("--cache", link, "cat", f"s3://{bucket}/lnk/d/0/obj-0000.bin", env=s3_env,
                    check=True)
    assert got.stdout == s3_client.get_object(Bucket=bucket, Key="lnk/d/0/obj-0000.bin")[
        "Body"].read()
    assert not (tier / "e" / ".wharf").exists()  # no tier within the tier
    assert "no tier was there" not in got.stderr
    # init through the link sets the enclosing tier's settings, as init of its folder does.
    init = run_wharf("tier", "init", link, env=s3_env, check=True)
    assert f"inside the tier at {tier}" in init.stderr, init.stderr
    assert not (tier / "e" / ".wharf").exists()
