"""gs:// over GCS's JSON API against the local emulator (scripts/gcs-server), with Google's own
client (google-cloud-storage) on the other side: objects written by one are read by the other,
both ways; the tier imports from gs:// and resumes by generation; composed reads leave no
temporary behind, even after a kill; errors are one clear line."""
import hashlib
import json
import os
import signal
import subprocess
import sys

from conftest import ROOT, LatencyProxy, run_wharf


def gcs_env(gcs_emulator, **extra):
    """The environment of a wharf process on the emulator: no HMAC key (so the JSON API)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WHARF_GS_") and k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env["STORAGE_EMULATOR_HOST"] = gcs_emulator
    env["GOOGLE_CLOUD_PROJECT"] = "wharf-test"
    env.update(extra)
    return env


def test_objects_written_by_google_client_are_read_by_wharf(gcs_emulator, gcs_client, gcs_bucket):
    bucket = gcs_client.bucket(gcs_bucket)
    blobs = {f"data/{i:03d}.bin": os.urandom(1000 + i) for i in range(20)}
    blobs["data/sub dir/ünï.txt"] = b"unicode key"
    for name, data in blobs.items():
        bucket.blob(name).upload_from_string(data)
    env = gcs_env(gcs_emulator)
    listed = run_wharf("ls", "-r", f"gs://{gcs_bucket}/data/", env=env, check=True)
    lines = listed.stdout.decode().splitlines()
    assert len(lines) == len(blobs)
    for name in blobs:
        assert any(line.endswith(name) for line in lines), name
    got = run_wharf("cat", f"gs://{gcs_bucket}/data/sub dir/ünï.txt", env=env, check=True)
    assert got.stdout == b"unicode key"


def test_cp_recursive_from_gs_matches_google_client(gcs_emulator, gcs_client, gcs_bucket,
                                                    tmp_path):
    bucket = gcs_client.bucket(gcs_bucket)
    blobs = {f"set/{i:03d}.bin": os.urandom(5000 + 97 * i) for i in range(30)}
    for name, data in blobs.items():
        bucket.blob(name).upload_from_string(data)
    env = gcs_env(gcs_emulator)
    run_wharf("cp", "-r", f"gs://{gcs_bucket}/set/", str(tmp_path / "out"), env=env, check=True)
    for name, data in blobs.items():
        assert (tmp_path / "out" / name.removeprefix("set/")).read_bytes() == data


def test_objects_written_by_wharf_are_read_by_google_client(gcs_emulator, gcs_client,
                                                            gcs_bucket, tmp_path):
    # Larger than one resumable chunk (8 MiB): a session of several chunks.
    big = os.urandom((20 << 20) + 4321)
    small = b"small object"
    (tmp_path / "big.bin").write_bytes(big)
    (tmp_path / "small.txt").write_bytes(small)
    env = gcs_env(gcs_emulator)
    run_wharf("cp", tmp_path / "big.bin", f"gs://{gcs_bucket}/up/big.bin", env=env, check=True)
    run_wharf("cp", tmp_path / "small.txt", f"gs://{gcs_bucket}/up/small.txt", env=env,
              check=True)
    bucket = gcs_client.bucket(gcs_bucket)
    got = bucket.blob("up/big.bin").download_as_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(big).hexdigest()
    assert bucket.blob("up/small.txt").download_as_bytes() == small
    # The generation wharf reports is the one Google's client sees.
    stat = run_wharf("stat", "--json", f"gs://{gcs_bucket}/up/small.txt", env=env, check=True)
    blob = bucket.get_blob("up/small.txt")
    assert json.loads(stat.stdout)["etag"] == str(blob.generation)


def test_python_store_on_gs(gcs_emulator, gcs_client, gcs_bucket, monkeypatch):
    import wharf
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    for k in ("WHARF_GS_ACCESS_KEY_ID", "WHARF_GS_SECRET_ACCESS_KEY", "WHARF_GS_API"):
        monkeypatch.delenv(k, raising=False)
    bucket = gcs_client.bucket(gcs_bucket)
    for i in range(10):
        bucket.blob(f"p/{i}").upload_from_string(bytes([i]) * (i + 1))
    store = wharf.Store(f"gs://{gcs_bucket}/p/")
    listed = list(store.list())
    assert [o["key"] for o in listed] == [str(i) for i in range(10)]
    bufs = store.get_many([o["key"] for o in listed])
    assert [bytes(b) for b in bufs] == [bytes([i]) * (i + 1) for i in range(10)]


def test_tier_import_from_gs_resumes_by_generation(gcs_emulator, gcs_client, gcs_bucket,
                                                   tmp_path):
    bucket = gcs_client.bucket(gcs_bucket)
    for i in range(12):
        bucket.blob(f"ds/{i:02d}").upload_from_string(os.urandom(2048))
    env = gcs_env(gcs_emulator)
    dest = tmp_path / "tier" / "ds"
    first = run_wharf("tier", "import", f"gs://{gcs_bucket}/ds/", dest, "--json", env=env,
                      check=True)
    summary = json.loads(first.stdout)
    assert (summary["objects"], summary["fetched"], summary["skipped"]) == (12, 12, 0)
    # One object rewritten at the source (a new generation): only it is fetched again.
    new = os.urandom(3000)
    bucket.blob("ds/05").upload_from_string(new)
    again = json.loads(run_wharf("tier", "import", f"gs://{gcs_bucket}/ds/", dest, "--json",
                                 env=env, check=True).stdout)
    assert (again["fetched"], again["skipped"]) == (1, 11)
    assert (dest / "05").read_bytes() == new
    # Exported to gs:// and to s3-like destinations alike, a rerun skips every imported
    # entry: the entries' ETags are generations, but their recorded MD5 is compared.
    out = f"gs://{gcs_bucket}/exported/"
    first = json.loads(run_wharf("tier", "export", "--json", dest, out, env=env,
                                 check=True).stdout)
    again = json.loads(run_wharf("tier", "export", "--json", dest, out, env=env,
                                 check=True).stdout)
    assert (first["uploaded"], again["uploaded"], again["skipped"]) == (12, 0, 12)


def test_uploads_complete_under_a_budget_of_one_chunk(gcs_emulator, gcs_bucket, tmp_path):
    # The resumable writer held a whole 8 MiB chunk back until one more byte came, while the
    # source waited for budget to read it: under an 8 MiB budget the upload never ended.
    env = gcs_env(gcs_emulator)
    for size in (8 << 20, (8 << 20) + 1, 9 << 20):  # exactly one chunk: finalized empty
        data = os.urandom(size)
        (tmp_path / "f").write_bytes(data)
        for budget in ("4M", "8M"):
            uri = f"gs://{gcs_bucket}/budget/{size}-{budget}"
            run_wharf("cp", "-q", "--memory-budget", budget, tmp_path / "f", uri, env=env,
                      check=True, timeout=120)
            assert run_wharf("cat", uri, env=env, check=True).stdout == data
    run_wharf("cp", "-q", "--memory-budget", "8M", "-", f"gs://{gcs_bucket}/budget/stdin",
              input=data, env=env, check=True, timeout=120)
    assert run_wharf("cat", f"gs://{gcs_bucket}/budget/stdin", env=env,
                     check=True).stdout == data


def test_reads_through_a_tier_record_the_generation_and_time(gcs_emulator, gcs_client,
                                                             gcs_bucket, tmp_path):
    # The emulator names no generation (nor a time) on reads: the tier's fills recorded an
    # empty version, and every read that carries its listed generation (cp -r, sync, fetch)
    # then failed as "object changed". The store asks the object's resource and keeps its
    # generation when its CRC32C is that of the bytes read.
    bucket = gcs_client.bucket(gcs_bucket)
    blobs = {f"rt/{i:02d}.bin": os.urandom(3000 + i) for i in range(8)}
    for name, data in blobs.items():
        bucket.blob(name).upload_from_string(data)
    env = gcs_env(gcs_emulator)
    tier = tmp_path / "tier"
    for out in ("cold", "warm"):
        run_wharf("cp", "-r", "-q", "--cache", tier, f"gs://{gcs_bucket}/rt/", tmp_path / out,
                  env=env, check=True)
        for name, data in blobs.items():
            assert (tmp_path / out / name.removeprefix("rt/")).read_bytes() == data
    status = json.loads(run_wharf("tier", "status", "--json", tier, env=env, check=True).stdout)
    assert (status["misses"], status["hits"]) == (8, 8)
    uri = f"gs://{gcs_bucket}/rt/03.bin"
    cached = run_wharf("stat", "--cache", tier, uri, env=env, check=True).stdout.decode()
    plain = run_wharf("stat", uri, env=env, check=True).stdout.decode()
    assert cached == plain and str(bucket.get_blob("rt/03.bin").generation) in plain


def test_reruns_to_and_from_gs_skip_what_is_there(gcs_emulator, gcs_bucket, tmp_path):
    # A GCS ETag is a generation, never a file's MD5: every rerun of cp -r and tier export
    # to or from gs:// moved everything again. The listing's md5Hash is compared instead.
    env = gcs_env(gcs_emulator)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}").write_bytes(os.urandom(1000 + i))

    def counts(*args):
        out = run_wharf(*args, env=env, check=True).stdout.decode()
        copied = int(out.split("copied ")[1].split(" object")[0])
        return copied, int(out.split("skipped ")[1].split(" ")[0]) if "skipped" in out else 0

    dst = f"gs://{gcs_bucket}/up/"
    assert counts("cp", "-r", src, dst) == (5, 0)
    assert counts("cp", "-r", src, dst) == (0, 5)
    assert counts("cp", "-r", dst, tmp_path / "down") == (5, 0)
    assert counts("cp", "-r", dst, tmp_path / "down") == (0, 5)
    (src / "f2").write_bytes(os.urandom(1002))  # same size, other bytes
    assert counts("cp", "-r", src, dst) == (1, 4)
    tier = tmp_path / "tier"
    run_wharf("tier", "init", "-q", tier, env=env, check=True)
    run_wharf("tier", "import", "-q", f"file://{src}/", tier / "data", env=env, check=True)
    first = json.loads(run_wharf("tier", "export", "--json", tier, f"gs://{gcs_bucket}/exp/",
                                 env=env, check=True).stdout)
    again = json.loads(run_wharf("tier", "export", "--json", tier, f"gs://{gcs_bucket}/exp/",
                                 env=env, check=True).stdout)
    assert (first["uploaded"], again["uploaded"], again["skipped"]) == (5, 0, 5)


def test_bucket_listing_and_missing_bucket(gcs_emulator, gcs_bucket):
    env = gcs_env(gcs_emulator)
    buckets = run_wharf("ls", "gs://", env=env, check=True).stdout.decode()
    assert gcs_bucket in buckets
    missing = run_wharf("ls", "gs://wharf-no-such-bucket-here/", env=env)
    assert missing.returncode == 1
    assert "gs://wharf-no-such-bucket-here/" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    # An upload to it, and a copy into it (whose parallel listing names no key range): the
    # bucket is what is missing, one line.
    src = ROOT / "README.md"
    for args in (("cp", src, "gs://wharf-no-such-bucket-here/x"),
                 ("cp", "-r", ROOT / "docs", "gs://wharf-no-such-bucket-here/d/")):
        up = run_wharf(*args, env=env)
        assert up.returncode == 1 and "no such bucket" in up.stderr, up.stderr
        assert "listing keys in" not in up.stderr and len(up.stderr.splitlines()) == 1


def test_the_bucket_itself_is_not_an_object(gcs_emulator, gcs_bucket):
    env = gcs_env(gcs_emulator)
    proc = run_wharf("cat", f"gs://{gcs_bucket}/", env=env)
    assert proc.returncode == 1 and proc.stdout == b""
    assert "no object key" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_api_choice(gcs_emulator, gcs_bucket):
    env = gcs_env(gcs_emulator)
    bad = run_wharf("ls", f"gs://{gcs_bucket}/?api=soap", env=env)
    assert bad.returncode == 1 and "'soap' is not one of xml, json" in bad.stderr
    bad = run_wharf("ls", f"gs://{gcs_bucket}/", env=dict(env, WHARF_GS_API="grpc"))
    assert bad.returncode == 1 and "WHARF_GS_API" in bad.stderr
    # addressing_style is the XML API's.
    bad = run_wharf("ls", f"gs://{gcs_bucket}/?addressing_style=virtual", env=env)
    assert bad.returncode == 1 and "addressing_style is for api=xml" in bad.stderr


def test_credentials_errors_are_one_clear_line(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WHARF_GS_") and k != "STORAGE_EMULATOR_HOST"}
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "no-such-key.json")
    proc = run_wharf("ls", "gs://some-bucket/", env=env)
    assert proc.returncode == 1
    assert "GOOGLE_APPLICATION_CREDENTIALS" in proc.stderr
    assert str(tmp_path / "no-such-key.json") in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


EPOCH = """
import sys, wharf.torch
ds = wharf.torch.IterableDataset.from_prefix(sys.argv[1])
n = 0
for i, sample in enumerate(ds):
    n += 1
    if i == 40:
        print("reading", flush=True)
print(n, flush=True)
"""


def temporaries(gcs_client, bucket):
    return [b.name for b in gcs_client.list_blobs(bucket, prefix=".wharf-compose/")]


def test_composed_reads_leave_no_temporary_even_after_a_kill(gcs_emulator, gcs_client,
                                                             gcs_bucket, tmp_path):
    bucket = gcs_client.bucket(gcs_bucket)
    for i in range(600):
        bucket.blob(f"small/{i:04d}").upload_from_string(bytes([i % 251]) * 700)
    uri = f"gs://{gcs_bucket}/small/"
    proxy = LatencyProxy(gcs_emulator, delay_ms=40)
    try:
        # A run through a slow link, killed mid-batch: its composed temporaries stay behind.
        env = gcs_env(proxy.url, WHARF_GS_COMPOSE="on", PYTHONPATH=str(ROOT / "python"))
        killed = subprocess.Popen([sys.executable, "-c", EPOCH, uri], env=env,
                                  stdout=subprocess.PIPE, text=True)
        assert killed.stdout.readline().strip() == "reading"
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
    finally:
        proxy.stop()
    # The next run sweeps what the dead process left, reads everything, and leaves nothing.
    env = gcs_env(gcs_emulator, WHARF_GS_COMPOSE="on", PYTHONPATH=str(ROOT / "python"))
    done = subprocess.run([sys.executable, "-c", EPOCH, uri], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "600"
    assert temporaries(gcs_client, gcs_bucket) == []


def test_temporaries_a_killed_reader_left_are_not_the_buckets_objects(gcs_emulator, gcs_client,
                                                                       gcs_bucket, tmp_path):
    # Listings showed .wharf-compose/: a dataset over the bucket took a killed reader's
    # temporaries for samples (then its own first composed read swept them away under it:
    # NotFound mid-epoch), and cp -r copied them.
    bucket = gcs_client.bucket(gcs_bucket)
    bucket.blob("data/a").upload_from_string(b"a")
    bucket.blob("b").upload_from_string(b"b")
    bucket.blob(".wharf-compose/elsewhere/1-1/0").upload_from_string(b"x" * 100)
    env = gcs_env(gcs_emulator)
    listed = run_wharf("ls", "-r", f"gs://{gcs_bucket}/", env=env, check=True).stdout.decode()
    assert "wharf-compose" not in listed and "data/a" in listed, listed
    top = run_wharf("ls", f"gs://{gcs_bucket}/", env=env, check=True).stdout.decode()
    assert "wharf-compose" not in top and "data/" in top, top
    run_wharf("cp", "-r", "-q", f"gs://{gcs_bucket}/", tmp_path / "out", env=env, check=True)
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")
                  if p.is_file()) == ["b", "data/a"]
    # Listed on their own, they are there (the sweep finds them so).
    inside = run_wharf("ls", "-r", f"gs://{gcs_bucket}/.wharf-compose/", env=env,
                       check=True).stdout.decode()
    assert "elsewhere/1-1/0" in inside, inside


def test_sync_between_s3_parts_and_gs_copies_nothing_twice(gcs_emulator, gcs_bucket, bucket,
                                                          s3_env, tmp_path):
    # An object uploaded in parts (no MD5 in its ETag) against a gs:// object (a generation):
    # nothing compares their bytes, so sync goes by size and time as aws s3 sync does; a
    # rerun copies nothing. A changed source (newer, another size) is copied again.
    env = gcs_env(gcs_emulator, **{k: s3_env[k] for k in
                                   ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                    "AWS_SECRET_ACCESS_KEY")})
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 << 20))  # above one 8 MiB part
    run_wharf("cp", big, f"s3://{bucket}/d/big.bin", env=env, check=True)
    routes = [(f"s3://{bucket}/d/", f"gs://{gcs_bucket}/d/"),
              (f"gs://{gcs_bucket}/d/", f"s3://{bucket}/back/")]
    for src, dst in routes:
        first = run_wharf("sync", src, dst, env=env, check=True)
        assert b"copied 1 object" in first.stdout, first.stdout
        again = run_wharf("sync", src, dst, env=env, check=True)
        assert b"copied 0 objects" in again.stdout and b"skipped 1" in again.stdout, again.stdout
    got = run_wharf("cat", f"s3://{bucket}/back/big.bin", env=env, check=True)
    assert hashlib.md5(got.stdout).hexdigest() == hashlib.md5(big.read_bytes()).hexdigest()
    big.write_bytes(os.urandom((20 << 20) + 1))
    run_wharf("cp", big, f"s3://{bucket}/d/big.bin", env=env, check=True)
    changed = run_wharf("sync", *routes[0], env=env, check=True)
    assert b"copied 1 object" in changed.stdout, changed.stdout


def test_endpoint_url_is_the_s3_sides_in_a_command_naming_both(gcs_emulator, gcs_bucket, bucket,
                                                                s3_env, s3_client, tmp_path):
    # `--endpoint-url` for MinIO/RGW with a gs:// destination: it once sent the gs:// side to
    # the S3 server too ("no such bucket"). The gs:// side keeps STORAGE_EMULATOR_HOST.
    env = gcs_env(gcs_emulator, **{k: s3_env[k] for k in
                                   ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    env.pop("AWS_ENDPOINT_URL", None)
    env.pop("WHARF_S3_ENDPOINT", None)
    s3_client.put_object(Bucket=bucket, Key="t.json", Body=b"{}")
    flag = ("--endpoint-url", s3_env["AWS_ENDPOINT_URL"])
    run_wharf(*flag, "cp", f"s3://{bucket}/t.json", f"gs://{gcs_bucket}/e/t.json", env=env,
              check=True)
    run_wharf(*flag, "sync", f"s3://{bucket}/", f"gs://{gcs_bucket}/x/", env=env, check=True)
    for key in ("e/t.json", "x/t.json"):
        assert run_wharf("cat", f"gs://{gcs_bucket}/{key}", env=env, check=True).stdout == b"{}"


def test_a_copy_between_two_buckets_is_a_rewrite_that_keeps_type_and_metadata(
        gcs_emulator, gcs_client, gcs_bucket, tmp_path):
    # Two buckets of one endpoint, the same credentials: copied on the server (rewriteTo),
    # as within one bucket, so the object keeps its Content-Type and metadata (streamed
    # through this machine it lost both).
    other = f"wharf-py-{os.urandom(8).hex()}"
    gcs_client.create_bucket(other)
    try:
        blob = gcs_client.bucket(gcs_bucket).blob("meta/y.dat")
        blob.metadata = {"owner": "bob"}
        blob.upload_from_string(b"png bytes", content_type="image/png")
        env = gcs_env(gcs_emulator)
        metrics = tmp_path / "m.json"
        run_wharf("--metrics", metrics, "cp", f"gs://{gcs_bucket}/meta/y.dat",
                  f"gs://{other}/meta/y2.dat", env=env, check=True)
        copied = gcs_client.bucket(other).get_blob("meta/y2.dat")
        assert copied.download_as_bytes() == b"png bytes"
        assert copied.content_type == "image/png" and copied.metadata == {"owner": "bob"}
        ops = {s["labels"]["op"] for s in json.loads(metrics.read_text())["metrics"]
               if s["name"] == "wharf_store_requests_total" and s["value"] > 0}
        assert "copy" in ops and "get" not in ops, ops  # no byte came through here
        # A whole prefix too, and a missing source is one clear line.
        run_wharf("cp", "-r", f"gs://{gcs_bucket}/meta/", f"gs://{other}/tree/", env=env,
                  check=True)
        assert gcs_client.bucket(other).get_blob("tree/y.dat").content_type == "image/png"
        missing = run_wharf("cp", f"gs://{gcs_bucket}/meta/nope", f"gs://{other}/x", env=env)
        assert missing.returncode == 1 and "nope" in missing.stderr, missing.stderr
    finally:
        for b in gcs_client.list_blobs(other):
            b.delete()
        gcs_client.bucket(other).delete()


def test_a_download_damaged_on_the_way_is_refused(gcs_emulator, gcs_client, gcs_bucket,
                                                   tmp_path):
    # A GCS object's ETag is its generation: the reply's x-goog-hash (CRC32C) checks the
    # bytes in the store, the md5Hash in the file store behind it.
    from fault_proxy import FaultProxy
    data = os.urandom(50_000)
    gcs_client.bucket(gcs_bucket).blob("d/x").upload_from_string(data)
    with FaultProxy(gcs_emulator.split("://", 1)[-1]) as proxy:
        proxy.set_faults([{"match": {"method": "GET", "query_regex": "alt=media"},
                           "action": "corrupt", "after_bytes": 100, "count": None}])
        env = gcs_env(proxy.url)
        proc = run_wharf("cp", "-r", f"gs://{gcs_bucket}/d/", tmp_path / "t", env=env)
        assert proc.returncode == 1, proc.stderr
        assert "is not the object's" in proc.stderr or "damaged on the way" in proc.stderr
        assert f"gs://{gcs_bucket}/d/x" in proc.stderr
        assert not (tmp_path / "t" / "x").exists()
        assert any(e["fault"] == "corrupt" for e in proxy.log())
        proxy.set_faults([])
        run_wharf("cp", "-r", f"gs://{gcs_bucket}/d/", tmp_path / "t", env=env, check=True)
        assert (tmp_path / "t" / "x").read_bytes() == data
