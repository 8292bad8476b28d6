"""`wharf tier` on the awkward inputs a bucket can hold and the failures a run can meet, against
the real Ceph RGW: keys that would plant a tier inside the tier, a key that is both an object
and a prefix, directory markers, partly failed runs under --json, repairs that fail, and the
resumability of one-object imports and of exports of a user's own files."""
import json
import os

from conftest import damage, run_wharf


def wharf_json(*args, env, ok=True):
    proc = run_wharf(*args, "--json", env=env)
    assert (proc.returncode == 0) == ok, proc.stderr
    return json.loads(proc.stdout), proc


def test_a_key_below_a_folder_named_wharf_plants_no_tier(tmp_path, bucket, s3_env, s3_client):
    settings = b'{"version":1,"mode":"ttl","ttl_seconds":1,"max_size":1}'
    s3_client.put_object(Bucket=bucket, Key="q/sub/.wharf/tier.json", Body=settings)
    s3_client.put_object(Bucket=bucket, Key="q/sub/file.txt", Body=b"file")
    s3_client.put_object(Bucket=bucket, Key="q/top.txt", Body=b"top")
    dest = tmp_path / "t"
    summary, proc = wharf_json("tier", "import", f"s3://{bucket}/q/", dest, env=s3_env, ok=False)
    assert (summary["fetched"], summary["failed"]) == (2, 1), summary
    assert "sub/.wharf/tier.json" in proc.stderr and "tier of its own" in proc.stderr
    assert not (dest / "sub" / ".wharf").exists()
    status, _ = wharf_json("tier", "status", dest / "sub" / "file.txt", env=s3_env)
    assert status["tier"] == str(dest)
    status, _ = wharf_json("tier", "status", dest, env=s3_env)
    assert status["entries"] == 2

    # Read through the cache, the same key is served, and never kept.
    cache = tmp_path / "cache"
    got = run_wharf("cat", "--cache", cache, f"s3://{bucket}/q/sub/.wharf/tier.json",
                    env=s3_env, check=True)
    assert got.stdout == settings
    assert not any(".wharf" in d for d, _, _ in os.walk(cache / ".wharf" / "objects"))


def test_a_key_that_is_also_a_prefix_is_read_around_the_tier(tmp_path, bucket, s3_env, s3_client):
    # Small objects are answered from the bytes in memory, a big one (over 1 MiB) by one more
    # GET around the tier.
    big = os.urandom(3 << 20)
    bodies = {"d/a": b"file a", "d/a/b": b"file a/b", "e/a": b"file e/a", "e/a/b": big}
    for key, body in bodies.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    for n, order in enumerate((["d/a", "d/a/b"], ["d/a/b", "d/a"], ["e/a", "e/a/b"])):
        cache = tmp_path / f"cache-{n}"
        for i, key in enumerate(order):
            got = run_wharf("cat", "--cache", cache, f"s3://{bucket}/{key}", env=s3_env)
            assert got.returncode == 0, got.stderr
            assert got.stdout == bodies[key]
            if i == 1:  # the second cannot be kept: one warning, the read is answered
                assert "reading around the tier" in got.stderr, got.stderr


def test_directory_markers_are_not_objects_of_the_tree(tmp_path, bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="dm/folder/", Body=b"")
    s3_client.put_object(Bucket=bucket, Key="dm/empty/", Body=b"")
    s3_client.put_object(Bucket=bucket, Key="dm/folder/file", Body=b"x")
    dest = tmp_path / "dm"
    summary, _ = wharf_json("tier", "import", f"s3://{bucket}/dm/", dest, env=s3_env)
    assert (summary["objects"], summary["fetched"], summary["skipped"]) == (1, 1, 0), summary
    status, _ = wharf_json("tier", "status", dest, env=s3_env)
    assert status["imports"][0]["complete"] and status["imports"][0]["objects"] == 1
    # The complete import answers the listing (no "holds 1 of its 3 objects" warning).
    listed = run_wharf("ls", "-r", "--cache", dest, f"s3://{bucket}/dm/", env=s3_env, check=True)
    assert "holds" not in listed.stderr, listed.stderr
    assert b"folder/file" in listed.stdout


def test_a_partly_failed_import_and_export_still_print_their_summary(tmp_path, bucket, s3_env,
                                                                      s3_client):
    s3_client.put_object(Bucket=bucket, Key="p/ok.txt", Body=b"ok")
    s3_client.put_object(Bucket=bucket, Key="p/a/../../escape.txt", Body=b"no")
    dest = tmp_path / "t" / "p"
    summary, proc = wharf_json("tier", "import", f"s3://{bucket}/p/", dest, env=s3_env, ok=False)
    assert (summary["objects"], summary["fetched"], summary["failed"]) == (2, 1, 1), summary
    assert "1 of 2 objects failed" in summary["error"]
    assert "escape the destination" in proc.stderr
    assert not (tmp_path / "escape.txt").exists()

    # An export with one damaged entry: the others go, the summary says what failed.
    s3_client.put_object(Bucket=bucket, Key="e/one.txt", Body=b"one")
    s3_client.put_object(Bucket=bucket, Key="e/two.txt", Body=b"two")
    tree = tmp_path / "t" / "e"
    run_wharf("tier", "import", f"s3://{bucket}/e/", tree, env=s3_env, check=True)
    damage(tree / "two.txt", data=b"TWO", keep_etag_cache=False)  # same size and mtime
    summary, _ = wharf_json("tier", "export", tree, f"s3://{bucket}/out/", env=s3_env, ok=False)
    assert (summary["uploaded"], summary["failed"]) == (1, 1), summary


def test_verify_json_is_one_object_and_a_failed_repair_keeps_the_file(tmp_path, bucket, s3_env,
                                                                       s3_client):
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"v/f{i}", Body=bytes([65 + i]) * 1000)
    dest = tmp_path / "t"
    run_wharf("tier", "import", f"s3://{bucket}/v/", dest, env=s3_env, check=True)
    run_wharf("tier", "pin", dest / "f1", env=s3_env, check=True)
    for name in ("f1", "f2"):
        damage(dest / name, truncate=10)  # the mtime as sealed: damage, not an edit

    # Wrong credentials: the repair fails, the damaged file stays where it was.
    bad = dict(s3_env, AWS_SECRET_ACCESS_KEY="wrong-secret")
    failed, proc = wharf_json("tier", "verify", dest / "f2", "--repair", env=bad, ok=False)
    assert (failed["damaged"], failed["repaired"], failed["remaining"]) == (1, 0, 1)
    assert "repair failed" in proc.stderr and "damaged" in proc.stderr
    assert os.path.getsize(dest / "f2") == 10

    report, proc = wharf_json("tier", "verify", dest, "--repair", env=s3_env)
    assert (report["checked"], report["damaged"], report["repaired"]) == (3, 2, 2), report
    assert proc.stderr.count("repaired ") == 2
    assert proc.stderr.count(f"fetched again from s3://{bucket}/v/") == 2, proc.stderr
    assert (dest / "f2").read_bytes() == b"C" * 1000
    # The repaired pinned entry is still pinned: eviction keeps it.
    evicted, _ = wharf_json("tier", "evict", dest / "f1", env=s3_env)
    assert (evicted["evicted"], evicted["kept_pinned"]) == (0, 1), evicted
    assert (dest / "f1").read_bytes() == b"B" * 1000


def test_one_object_imports_and_exports_of_own_files_resume(tmp_path, bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="one/f.bin", Body=b"0123456789" * 100)
    run_wharf("tier", "init", tmp_path / "t", check=True)
    dest = tmp_path / "t" / "one"
    first, _ = wharf_json("tier", "import", f"s3://{bucket}/one/f.bin", dest, env=s3_env)
    again, _ = wharf_json("tier", "import", f"s3://{bucket}/one/f.bin", dest, env=s3_env)
    assert (first["fetched"], again["fetched"], again["skipped"]) == (1, 0, 1)
    s3_client.put_object(Bucket=bucket, Key="one/f.bin", Body=b"changed")
    changed, _ = wharf_json("tier", "import", f"s3://{bucket}/one/f.bin", dest, env=s3_env)
    assert changed["fetched"] == 1 and (dest / "f.bin").read_bytes() == b"changed"
    # A one-object import that fails (a folder where the file goes) says so under --json.
    (tmp_path / "t" / "two" / "f.bin").mkdir(parents=True)
    failed, _ = wharf_json("tier", "import", f"s3://{bucket}/one/f.bin", tmp_path / "t" / "two",
                           env=s3_env, ok=False)
    assert (failed["objects"], failed["fetched"], failed["failed"]) == (1, 0, 1), failed

    mine = tmp_path / "t" / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_bytes(b"written by the user")
    (mine / "empty").mkdir()
    out, _ = wharf_json("tier", "export", mine, f"s3://{bucket}/mine/", env=s3_env)
    rerun, _ = wharf_json("tier", "export", mine, f"s3://{bucket}/mine/", env=s3_env)
    assert (out["uploaded"], rerun["uploaded"], rerun["skipped"]) == (1, 0, 1)
    nothing, _ = wharf_json("tier", "export", mine / "empty", f"s3://{bucket}/none/", env=s3_env)
    assert (nothing["objects"], nothing["uploaded"]) == (0, 0)


def test_sizes_take_fractions_and_a_file_is_no_tier(tmp_path):
    tier = tmp_path / "t"
    run_wharf("tier", "init", tier, "--max-size", "1.5G", check=True)
    status = json.loads(run_wharf("tier", "status", tier, "--json", check=True).stdout)
    assert status["max_size"] == 1536 << 20
    bad = run_wharf("tier", "init", tier, "--max-size", "1e3")
    assert bad.returncode != 0 and "invalid size '1e3'" in bad.stderr
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    proc = run_wharf("tier", "init", afile)
    assert proc.returncode != 0 and "not a directory" in proc.stderr, proc.stderr
    # An import names itself, not `tier init`.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"f")
    proc = run_wharf("tier", "import", f"file://{tmp_path}/src/", afile)
    assert proc.returncode == 1 and f"tier import {afile}: not a directory" in proc.stderr, \
        proc.stderr
    assert afile.read_bytes() == b"x"


def test_a_tier_this_user_cannot_write_is_read_around(tmp_path, bucket, s3_env, s3_client):
    # A shared tier another user made: hits are served from it; misses (whole objects and big
    # ones) are read around it with one warning, never failed. As root the reads run as
    # nobody; otherwise the tier's own folder is made read-only.
    import shutil
    import stat
    import subprocess
    import tempfile
    from conftest import wharf_bin
    big = os.urandom(3 << 20)
    for key, body in (("ro/a", b"object a"), ("ro/b", b"object b"), ("ro/big", big)):
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    shared = tempfile.mkdtemp(prefix="wharf-ro-")  # outside the 0700 pytest folder
    try:
        os.chmod(shared, 0o755)
        tier = os.path.join(shared, "t")
        run_wharf("tier", "init", tier, "--block-size", "1M", "--block-threshold", "1M",
                  env=s3_env, check=True)
        run_wharf("cat", "--cache", tier, f"s3://{bucket}/ro/a", env=s3_env, check=True)
        binary = os.path.join(shared, "wharf")
        shutil.copy(wharf_bin(), binary)
        for d, dirs, files in os.walk(shared):
            for name in dirs + files:
                p = os.path.join(d, name)
                mode = os.stat(p).st_mode
                os.chmod(p, (mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
                             | (stat.S_IXGRP | stat.S_IXOTH if mode & stat.S_IXUSR else 0))
                         & ~(stat.S_IWGRP | stat.S_IWOTH) & (~stat.S_IWUSR if os.geteuid() else ~0))
        as_user = (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
                   if os.geteuid() == 0 else [])
        env = dict(s3_env, HOME=shared)
        for key, body in (("ro/a", b"object a"), ("ro/b", b"object b"), ("ro/big", big)):
            got = subprocess.run(as_user + [binary, "cat", "--cache", tier, f"s3://{bucket}/{key}"],
                                 capture_output=True, env=env, timeout=120)
            assert got.returncode == 0, got.stderr.decode()
            assert got.stdout == body
            if key == "ro/a":
                assert b"around the tier" not in got.stderr  # a hit
            else:
                assert b"reading around the tier" in got.stderr, got.stderr.decode()
    finally:
        for d, dirs, _ in os.walk(shared):
            for name in dirs:
                os.chmod(os.path.join(d, name), 0o755)
        shutil.rmtree(shared, ignore_errors=True)


def test_an_empty_path_is_one_error_not_a_spin(tmp_path):
    # "" (a script's unset variable) resolved to no directory, and the walk up to the
    # enclosing tier never ended, at 100% CPU.
    for args in (["status", ""], ["verify", ""], ["evict", ""], ["pin", ""], ["unpin", ""],
                 ["gc", ""], ["init", ""], ["import", f"file://{tmp_path}/", ""],
                 ["export", "", f"file://{tmp_path}/out/"]):
        proc = run_wharf("tier", *args, timeout=30)
        assert proc.returncode == 1, args
        assert "the tier path is empty" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_a_local_source_never_gives_its_tier_files_nor_imports_into_itself(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(b"a")
    (src / "sub" / "b").write_bytes(b"b")
    # A tier imported from a folder that is itself a tier: its .wharf (settings, import
    # records, locks) is not data. Before, they were listed as objects and failed every run.
    one = tmp_path / "one" / "kk"
    run_wharf("tier", "import", "-q", f"file://{src}/", one, check=True)
    for source in (f"file://{one}/", f"file://{tmp_path / 'one'}/"):
        out = tmp_path / "two" / str(len(source))
        got = json.loads(run_wharf("tier", "import", "--json", source, out, check=True).stdout)
        assert (got["objects"], got["failed"]) == (2, 0), source
        files = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                       if p.is_file() and ".wharf" not in p.parts)
        assert files in (["a", "sub/b"], ["kk/a", "kk/sub/b"]), files
    # A destination inside the source would import its own copies, more on each rerun.
    proc = run_wharf("tier", "import", f"file://{src}/", src / "imp")
    assert proc.returncode == 1
    assert f"the destination {src / 'imp'} is inside the source {src}" in proc.stderr
    assert not (src / "imp").exists()
    # An export into its own source likewise (a level deeper each run).
    for dest in (f"file://{one}/copy/", str(one / "copy")):
        proc = run_wharf("tier", "export", one, dest)
        assert proc.returncode == 1
        assert f"the destination {one / 'copy'} is inside the source {one}" in proc.stderr
        assert not (one / "copy").exists()


def test_a_rerun_removes_what_the_source_deleted(tmp_path, bucket, s3_env, s3_client):
    # Before, the files of deleted objects stayed: the tier served objects the bucket no
    # longer had, and its listing answers stopped ("holds 3 of its 2 objects").
    for i in range(4):
        s3_client.put_object(Bucket=bucket, Key=f"del/o{i}", Body=b"x" * (i + 1))
    tree = tmp_path / "tier" / "del"
    run_wharf("tier", "import", "-q", f"s3://{bucket}/del/", tree, env=s3_env, check=True)
    (tree / "mine.txt").write_bytes(b"the user's own file")
    run_wharf("tier", "pin", tree / "o3", env=s3_env, check=True)
    for i in (1, 3):
        s3_client.delete_object(Bucket=bucket, Key=f"del/o{i}")
    got = json.loads(run_wharf("tier", "import", "--json", f"s3://{bucket}/del/", tree,
                               env=s3_env, check=True).stdout)
    assert (got["objects"], got["skipped"], got["deleted"]) == (2, 2, 1)
    # o1 went; the user's file and the pinned o3 stay.
    assert sorted(p.name for p in tree.iterdir() if p.name != ".wharf") == \
        ["mine.txt", "o0", "o2", "o3"]
    cat = run_wharf("cat", "--cache", tree, f"s3://{bucket}/del/o1", env=s3_env)
    assert cat.returncode == 1 and "NoSuchKey" in cat.stderr


def test_importing_a_parent_prefix_keeps_another_imports_tree(tmp_path, bucket, s3_env,
                                                               s3_client):
    # Before, the parent's delete pass removed t/other/*: their entries' sources lay below
    # the parent's prefix, though not at the keys the parent would write there.
    for key in ("np/sub/a", "np/sub/b", "np/top"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    tier = tmp_path / "t"
    run_wharf("tier", "init", "-q", tier, check=True)
    run_wharf("tier", "import", "-q", f"s3://{bucket}/np/sub/", tier / "other", env=s3_env,
              check=True)
    got = json.loads(run_wharf("tier", "import", "--json", f"s3://{bucket}/np/", tier,
                               env=s3_env, check=True).stdout)
    assert (got["objects"], got["deleted"]) == (3, 0), got
    assert (tier / "other" / "a").read_bytes() == b"np/sub/a"
    assert (tier / "sub" / "a").read_bytes() == b"np/sub/a"
    # What the parent's own source deleted still goes.
    s3_client.delete_object(Bucket=bucket, Key="np/top")
    got = json.loads(run_wharf("tier", "import", "--json", f"s3://{bucket}/np/", tier,
                               env=s3_env, check=True).stdout)
    assert got["deleted"] == 1 and not (tier / "top").exists()
    assert sorted(p.name for p in (tier / "other").iterdir()) == ["a", "b"]


def test_empty_sizes_and_a_ttl_beyond_json_are_usage_errors(tmp_path):
    tier = tmp_path / "t"
    run_wharf("tier", "init", "-q", tier, check=True)
    for args, says in ((["evict", tier, "--to", ""], "--to: is empty"),
                       (["init", tier, "--max-size", ""], "--max-size: is empty"),
                       (["init", tier, "--block-size", ""], "--block-size: is empty"),
                       (["init", tier, "--max-size", "lots"], "invalid size 'lots'"),
                       (["init", tier, "--ttl", "inf"], "--ttl: must be a positive number"),
                       (["init", tier, "--ttl", "1e300"], "at most 100 years")):
        proc = run_wharf("tier", *args)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.stderr)


def test_every_failed_object_of_an_import_is_named_and_counted(tmp_path, bucket, s3_env,
                                                              s3_client):
    # Refused keys fail while copying; a key below an object's path fails when its batch is
    # published. Each is named on its own line, and the counts agree.
    for key in ("p/d/a", "p/d/a/b", "p/../escape", "p/ok"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    summary, proc = wharf_json("tier", "import", f"s3://{bucket}/p/", tmp_path / "t" / "p",
                               env=s3_env, ok=False)
    assert (summary["objects"], summary["fetched"], summary["failed"]) == (4, 2, 2), summary
    assert "2 of 4 objects failed" in summary["error"], summary
    lines = proc.stderr.splitlines()
    assert any("escape" in line and "refusing the key" in line for line in lines), lines
    # d/a and d/a/b are fetched at once: whichever is published second is the one refused.
    assert any(line.endswith("d/a' is an object, so it cannot also be a prefix of other keys")
               or line.endswith("other keys have this key as their prefix, so it cannot also "
                                "be an object") for line in lines), lines
    assert (tmp_path / "t" / "p" / "ok").read_bytes() == b"p/ok"


def test_an_import_from_a_missing_bucket_or_prefix_creates_nothing(tmp_path, bucket, s3_env):
    for src in ("s3://wharf-no-such-bucket-y/x/", f"s3://{bucket}/nothing-here/"):
        proc = run_wharf("tier", "import", src, tmp_path / "new" / "data", env=s3_env)
        assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert not (tmp_path / "new").exists()
    run_wharf("tier", "init", tmp_path / "t", check=True)
    proc = run_wharf("tier", "import", f"s3://{bucket}/nothing-here/", tmp_path / "t" / "n",
                     env=s3_env)
    assert proc.returncode == 1 and "no such object or prefix" in proc.stderr, proc.stderr
    assert not (tmp_path / "t" / "n").exists()
    status = json.loads(run_wharf("tier", "status", "--json", tmp_path / "t", check=True).stdout)
    assert status.get("imports", []) == [], status


def test_settings_a_tier_cannot_take_are_usage_errors(tmp_path):
    for args in (["--ttl", "60"], ["--block-size", "1K"],
                 ["--block-size", "128K", "--block-threshold", "64K"]):
        proc = run_wharf("tier", "init", tmp_path / "t", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "wharf tier init --help" in proc.stderr
    assert not (tmp_path / "t").exists()
    for args in (["--rank", "1"], ["--rank", "2", "--world-size", "2"]):
        proc = run_wharf("tier", "import", *args, tmp_path / "src", tmp_path / "t")
        assert proc.returncode == 2, (args, proc.stderr)


def test_an_imported_file_the_user_writes_is_exported_and_never_evicted(tmp_path, bucket,
                                                                         s3_env, s3_client):
    # As Lustre HSM's "dirty" files: an entry's file written since it was filled (its mtime is
    # not the one sealed) to other bytes, at the same size or not, is the user's. It is
    # exported as their file and never evicted (eviction runs unasked). `tier verify` reports
    # it as written since its fill, and --repair (asked for) puts the source's bytes back.
    sources = {"a.txt": b"HELLO2", "b.txt": b"other", "c.txt": b"third"}
    for name, body in sources.items():
        s3_client.put_object(Bucket=bucket, Key=f"ed/{name}", Body=body)
    tree = tmp_path / "t" / "ed"
    run_wharf("tier", "import", f"s3://{bucket}/ed/", tree, env=s3_env, check=True)
    summary, _ = wharf_json("tier", "export", tree, f"s3://{bucket}/out/", env=s3_env)
    assert summary["uploaded"] == 3, summary
    with open(tree / "a.txt", "r+b") as f:
        f.write(b"HELLO3")  # in place, the same size
    with open(tree / "c.txt", "ab") as f:
        f.write(b" and more")  # in place, another size
    edits = {"a.txt": b"HELLO3", "c.txt": b"third and more"}
    summary, _ = wharf_json("tier", "export", tree, f"s3://{bucket}/out/", env=s3_env)
    assert (summary["uploaded"], summary["skipped"]) == (2, 1), summary
    for name, body in edits.items():
        assert s3_client.get_object(Bucket=bucket, Key=f"out/{name}")["Body"].read() == body
    summary, _ = wharf_json("tier", "export", tree, f"s3://{bucket}/out/", env=s3_env)
    assert (summary["uploaded"], summary["skipped"]) == (0, 3), summary

    status, _ = wharf_json("tier", "status", tree, env=s3_env)
    assert (status["entries"], status["modified"]) == (1, 2), status
    evicted, _ = wharf_json("tier", "evict", tree, env=s3_env)
    assert (evicted["evicted"], evicted["kept_modified"]) == (1, 2), evicted
    assert not (tree / "b.txt").exists()
    for name, body in edits.items():
        assert (tree / name).read_bytes() == body

    verify = run_wharf("tier", "verify", tree, env=s3_env)
    assert verify.returncode == 1
    out = verify.stdout.decode()
    assert "a.txt: written since it was filled (content MD5" in out, out
    assert "c.txt: written since it was filled (size 14" in out, out
    assert "2 damaged (2 of them written since their fill)" in out, out
    repaired, _ = wharf_json("tier", "verify", "--repair", tree, env=s3_env)
    assert (repaired["damaged"], repaired["modified"], repaired["repaired"]) == (2, 2, 2)
    for name, body in edits.items():
        assert (tree / name).read_bytes() == sources[name]
    assert wharf_json("tier", "verify", tree, env=s3_env)[0]["damaged"] == 0


def test_pin_and_unpin_count_the_entries_they_change(tmp_path, bucket, s3_env, s3_client):
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"p/f{i}", Body=b"x" * 10)
    dest = tmp_path / "t"
    run_wharf("tier", "import", f"s3://{bucket}/p/", dest, env=s3_env, check=True)
    said = lambda *args: run_wharf("tier", *args, env=s3_env, check=True).stdout.decode()
    assert said("pin", dest / "f1") == "pinned 1 entries\n"
    assert said("pin", dest) == "pinned 2 entries (1 already pinned)\n"
    assert said("unpin", dest) == "unpinned 3 entries\n"
    assert said("unpin", dest) == "unpinned 0 entries (3 already unpinned)\n"
    status, _ = wharf_json("tier", "status", dest, env=s3_env)
    assert status["pinned"] == 0
    # A TTL is printed as given.
    assert "ttl 1.5 s" in said("init", tmp_path / "t2", "--mode", "ttl", "--ttl", "1.5")
