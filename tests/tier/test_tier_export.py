"""`wharf tier export` against the real Ceph RGW: the files below a tier path go to a bucket
(include/exclude in order, multipart for big files, byte-identical), a rerun uploads only what
is missing or changed, exported entries lose `local`, errors are one clear line, and an export
killed with -9 leaves no multipart upload behind once a rerun has run."""
import hashlib
import json
import os
import signal
import subprocess
import time

from conftest import damage, run_wharf, wharf_bin

MiB = 1 << 20


def write_local_entry(path, data):
    """Writes `data` as a tier entry that exists nowhere else (`local`), as a program writing
    into the tier through its tree store would: the file and its entry attribute."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    entry = {"v": 1, "source": "", "etag": "", "size": len(data),
             "md5": hashlib.md5(data).hexdigest(), "filled": time.time(), "local": True}
    os.setxattr(tmp, "user.wharf.entry", json.dumps(entry).encode())
    os.rename(tmp, path)


def entry_of(path):
    return json.loads(os.getxattr(path, "user.wharf.entry"))


def export_json(*args, env):
    proc = run_wharf("tier", "export", "--json", *args, env=env, check=True)
    return json.loads(proc.stdout)


def bucket_objects(s3_client, bucket, prefix):
    out = {}
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            body = s3_client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            out[o["Key"][len(prefix):]] = body
    return out


def uploads_below(s3_client, bucket, prefix):
    return s3_client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])


def test_export_filters_multipart_resume_and_local(tmp_path, bucket, s3_env, s3_client):
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    local = {
        "ckpt/step-1/model.bin": os.urandom(20 * MiB + 123),  # > 16 MiB: multipart
        "ckpt/step-1/optim.bin": os.urandom(3 * MiB),
        "ckpt/step-1/scratch.tmp": b"not exported",
        "ckpt/notes/keep.tmp": b"exported: the later --include wins",
        "ckpt/README": b"hello",
    }
    for rel, data in local.items():
        write_local_entry(str(tier / rel), data)
    # Sourced entries too: imported from a local tree (their ETag is the source's).
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.txt").write_bytes(b"imported a")
    (src / "b.txt").write_bytes(b"imported b")
    run_wharf("tier", "import", "-q", f"file://{src}/", tier / "data", env=s3_env, check=True)

    dst = f"s3://{bucket}/exp/"
    flags = ["--exclude", "*.tmp", "--include", "ckpt/notes/*", "--content-type", "application/x-ckpt"]
    first = export_json(*flags, tier, dst, env=s3_env)
    expected = {rel: data for rel, data in local.items() if rel != "ckpt/step-1/scratch.tmp"}
    expected["data/d/a.txt"] = b"imported a"
    expected["data/b.txt"] = b"imported b"
    assert (first["objects"], first["uploaded"], first["skipped"], first["failed"]) == \
        (len(expected), len(expected), 0, 0)
    assert first["bytes"] == sum(len(d) for d in expected.values())
    assert first["tier"] == str(tier)
    # Byte-identical, and nothing of the tier's own folder.
    assert bucket_objects(s3_client, bucket, "exp/") == expected
    big = s3_client.head_object(Bucket=bucket, Key="exp/ckpt/step-1/model.bin")
    assert big["ETag"].strip('"').endswith("-3")  # 8 + 8 + 4 MiB parts
    assert big["ContentType"] == "application/x-ckpt"
    assert uploads_below(s3_client, bucket, "exp/") == []

    # Exported local entries are local no more, with the exported object as provenance; the
    # excluded one still is.
    for rel in ("ckpt/step-1/model.bin", "ckpt/README", "ckpt/notes/keep.tmp"):
        e = entry_of(tier / rel)
        head = s3_client.head_object(Bucket=bucket, Key=f"exp/{rel}")
        assert e["local"] is False, rel
        assert e["source"] == f"{dst}{rel}"
        assert e["etag"] == head["ETag"].strip('"')
        assert e["md5"] == hashlib.md5(local[rel]).hexdigest()
    assert entry_of(tier / "ckpt/step-1/scratch.tmp")["local"] is True
    # An imported entry keeps its source.
    assert entry_of(tier / "data/b.txt")["source"] == f"file://{src}/b.txt"
    status = json.loads(run_wharf("tier", "status", "--json", tier, env=s3_env,
                                  check=True).stdout)
    assert status["local"] == 1

    # A rerun uploads nothing: the multipart object too (its entry now lists its ETag).
    again = export_json(*flags, tier, dst, env=s3_env)
    assert (again["uploaded"], again["skipped"], again["bytes"]) == (0, len(expected), 0)

    # A changed file (a new local entry, same size) is uploaded again, and only it.
    changed = os.urandom(20 * MiB + 123)
    write_local_entry(str(tier / "ckpt/step-1/model.bin"), changed)
    third = export_json(*flags, tier, dst, env=s3_env)
    assert (third["uploaded"], third["skipped"]) == (1, len(expected) - 1)
    body = s3_client.get_object(Bucket=bucket, Key="exp/ckpt/step-1/model.bin")["Body"].read()
    assert body == changed
    assert entry_of(tier / "ckpt/step-1/model.bin")["local"] is False

    # A sub-path of the tier exports relative to itself; -q prints nothing.
    proc = run_wharf("tier", "export", "-q", tier / "ckpt" / "step-1", f"s3://{bucket}/only/",
                     "--exclude", "*.tmp", env=s3_env, check=True)
    assert proc.stdout == b""
    assert sorted(bucket_objects(s3_client, bucket, "only/")) == ["model.bin", "optim.bin"]

    # One file: to a key, and again (skipped).
    one = export_json(tier / "ckpt" / "README", f"s3://{bucket}/one/readme.txt", env=s3_env)
    assert (one["objects"], one["uploaded"]) == (1, 1)
    assert bucket_objects(s3_client, bucket, "one/") == {"readme.txt": b"hello"}
    one = export_json(tier / "ckpt" / "README", f"s3://{bucket}/one/readme.txt", env=s3_env)
    assert (one["uploaded"], one["skipped"]) == (0, 1)


def test_an_entry_already_at_the_destination_is_skipped_and_loses_local(tmp_path, bucket, s3_env,
                                                                        s3_client):
    # As after an export killed between an upload and the mark on its entry.
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    write_local_entry(str(tier / "w.bin"), b"weights")
    s3_client.put_object(Bucket=bucket, Key="m/w.bin", Body=b"weights")
    out = export_json(tier, f"s3://{bucket}/m/", env=s3_env)
    assert (out["uploaded"], out["skipped"]) == (0, 1)
    e = entry_of(tier / "w.bin")
    assert e["local"] is False and e["source"] == f"s3://{bucket}/m/w.bin"


def test_export_errors_name_what_is_wrong(tmp_path, bucket, s3_env):
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    write_local_entry(str(tier / "x.bin"), b"x")
    missing = f"{bucket}-missing"
    proc = run_wharf("tier", "export", tier, f"s3://{missing}/p/", env=s3_env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and missing in lines[0], proc.stderr
    assert entry_of(tier / "x.bin")["local"] is True

    nowhere = tmp_path / "plain"
    nowhere.mkdir()
    proc = run_wharf("tier", "export", nowhere, f"s3://{bucket}/p/", env=s3_env)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "is in no tier" in proc.stderr, proc.stderr
    assert str(nowhere) in proc.stderr


def test_export_killed_leaves_no_upload_after_rerun(tmp_path, bucket, s3_env, s3_client):
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    data = {f"big-{i}.bin": os.urandom(40 * MiB) for i in range(3)}
    for rel, d in data.items():
        write_local_entry(str(tier / rel), d)
    dst = f"s3://{bucket}/k/"
    killed_with_uploads = False
    # Kills at growing delays until one lands while uploads are open (how long the export
    # takes depends on the machine's load: short delays first, for an idle machine).
    for delay in (0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.9, 1.2, 0.15, 0.25, 0.5):
        proc = subprocess.Popen([wharf_bin(), "tier", "export", "-q", "--inflight", "2",
                                 str(tier), dst], env=s3_env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if uploads_below(s3_client, bucket, "k/"):
            killed_with_uploads = True
            break
    # A kill -9 leaves its uploads: nothing in the process can abort them.
    assert killed_with_uploads
    # Another client's upload below the destination, of a key this export does not write.
    foreign = s3_client.create_multipart_upload(Bucket=bucket, Key="k/foreign.bin")["UploadId"]
    # The rerun aborts what the killed run left (uploads of keys it exports) and completes.
    out = export_json(tier, dst, env=s3_env)
    assert out["failed"] == 0 and out["aborted_uploads"] >= 1
    assert bucket_objects(s3_client, bucket, "k/") == data
    assert [u["UploadId"] for u in uploads_below(s3_client, bucket, "k/")] == [foreign]
    s3_client.abort_multipart_upload(Bucket=bucket, Key="k/foreign.bin", UploadId=foreign)
    assert uploads_below(s3_client, bucket, "k/") == []
    # Every exported entry is local no more.
    assert all(entry_of(tier / rel)["local"] is False for rel in data)


def test_a_failed_part_aborts_the_upload_and_keeps_the_entry_local(tmp_path, bucket, s3_env,
                                                                     s3_client):
    """Through the fault proxy, every part upload of the big file is refused (403, not
    retried): the export fails naming it, its upload is aborted, its entry stays local, the
    others are exported; a rerun without faults uploads only the big file."""
    from fault_proxy import FaultProxy
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    big = os.urandom(20 * MiB)
    write_local_entry(str(tier / "big.bin"), big)
    write_local_entry(str(tier / "small.bin"), b"small")
    dst = f"s3://{bucket}/f/"
    upstream = s3_env["WHARF_S3_ENDPOINT"].split("://", 1)[1]
    with FaultProxy(upstream) as proxy:
        proxy.set_faults([{"match": {"method": "PUT", "query_regex": "uploadId="},
                           "action": "status", "status": 403, "code": "AccessDenied",
                           "count": None}])
        proc = run_wharf("tier", "export", "-q", tier, dst,
                         env=dict(s3_env, AWS_ENDPOINT_URL=proxy.url), timeout=120)
    assert proc.returncode == 1
    assert "big.bin" in proc.stderr and "AccessDenied" in proc.stderr, proc.stderr
    assert uploads_below(s3_client, bucket, "f/") == []
    assert entry_of(tier / "big.bin")["local"] is True
    assert entry_of(tier / "small.bin")["local"] is False
    assert bucket_objects(s3_client, bucket, "f/") == {"small.bin": b"small"}

    out = export_json(tier, dst, env=s3_env)
    assert (out["uploaded"], out["skipped"], out["aborted_uploads"]) == (1, 1, 0)
    assert bucket_objects(s3_client, bucket, "f/") == {"small.bin": b"small", "big.bin": big}
    assert entry_of(tier / "big.bin")["local"] is False


def test_a_users_own_big_file_is_uploaded_once(tmp_path, bucket, s3_env, s3_client):
    # A file put into the tier by other means (not an entry) lists with its MD5; uploaded in
    # parts, its object's ETag is a multipart one, which the rerun recognises by hashing the
    # file in the same parts instead of uploading it again.
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    (tier / "user").mkdir()
    data = os.urandom(17 * MiB + 1)
    (tier / "user" / "weights.bin").write_bytes(data)
    dst = f"s3://{bucket}/own/"
    first = export_json(tier, dst, env=s3_env)
    assert (first["uploaded"], first["skipped"]) == (1, 0)
    assert s3_client.head_object(Bucket=bucket, Key="own/user/weights.bin")["ETag"].endswith('-3"')
    again = export_json(tier, dst, env=s3_env)
    assert (again["uploaded"], again["skipped"], again["bytes"]) == (0, 1, 0)
    # The one file on its own, to a key: the same.
    one = f"s3://{bucket}/one/w.bin"
    assert export_json(tier / "user" / "weights.bin", one, env=s3_env)["uploaded"] == 1
    assert export_json(tier / "user" / "weights.bin", one, env=s3_env)["skipped"] == 1
    # Changed at the same size: uploaded again.
    (tier / "user" / "weights.bin").write_bytes(os.urandom(17 * MiB + 1))
    third = export_json(tier, dst, env=s3_env)
    assert (third["uploaded"], third["skipped"]) == (1, 0)


def test_a_checkpoint_file_changed_in_the_tier_is_not_exported(tmp_path, bucket, s3_env,
                                                                s3_client):
    # Checkpoint files carry a CRC32C and an ETag of their own, kept with the file's size and
    # mtime. Before, a file written since it was sealed was uploaded as the checkpoint and lost
    # `local` (so eviction could remove the only good copy's name); now its content decides:
    # the same bytes (only touched) are exported, other bytes are refused by name.
    import torch
    from wharf.torch import CheckpointManager
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    CheckpointManager(str(tier / "run")).save(1, {"w": torch.arange(50000.0)}).result()
    step = tier / "run" / "step-000000000001"
    files = sorted(p for p in step.iterdir() if p.suffix == ".distcp")
    damaged, touched = files[0], step / "manifest.json"
    assert entry_of(damaged)["local"] and entry_of(damaged)["crc32c"]
    # A flipped byte, its mtime as sealed (a write that changed it would be a user's edit,
    # exported as their file), and the ETag cached for the old bytes lost.
    damage(damaged, offset=100, keep_etag_cache=False)
    os.utime(touched, (time.time() + 5, time.time() + 5))
    proc = run_wharf("tier", "export", tier / "run", f"s3://{bucket}/ck/", env=s3_env)
    assert proc.returncode == 1
    assert damaged.name in proc.stderr and "no longer holds its tier entry's data" in proc.stderr
    assert entry_of(damaged)["local"], "a refused file must stay local"
    got = bucket_objects(s3_client, bucket, "ck/")
    assert f"step-000000000001/{damaged.name}" not in got
    assert got["step-000000000001/manifest.json"] == touched.read_bytes()
    assert not entry_of(touched)["local"]


def test_an_upload_whose_mark_was_lost_is_marked_with_the_destinations_etag(tmp_path, bucket,
                                                                            s3_env, s3_client):
    # An export killed after an upload completed and before its entry was marked: the rerun
    # finds the same bytes there in parts (a multipart ETag, not the file's MD5) and skips
    # them. It marked the entry with the file's MD5 as the destination's ETag; it now asks
    # the destination.
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    data = os.urandom(17 * MiB + 5)
    write_local_entry(str(tier / "big.bin"), data)
    before = os.getxattr(tier / "big.bin", "user.wharf.entry")
    export_json(tier, f"s3://{bucket}/m/", env=s3_env)
    etag = s3_client.head_object(Bucket=bucket, Key="m/big.bin")["ETag"].strip('"')
    assert etag.endswith("-3") and entry_of(tier / "big.bin")["etag"] == etag
    os.setxattr(tier / "big.bin", "user.wharf.entry", before)  # the mark lost
    got = export_json(tier, f"s3://{bucket}/m/", env=s3_env)
    assert (got["uploaded"], got["skipped"]) == (0, 1), got
    entry = entry_of(tier / "big.bin")
    assert not entry["local"] and entry["etag"] == etag, entry


def test_exported_objects_get_the_content_type_of_their_extension(tmp_path, bucket, s3_env,
                                                                   s3_client):
    tier = tmp_path / "tier"
    run_wharf("tier", "init", tier, "-q", env=s3_env, check=True)
    write_local_entry(str(tier / "run" / "metrics.json"), b"{}")
    write_local_entry(str(tier / "run" / "model.safetensors"), b"x" * 100)
    run_wharf("tier", "export", "-q", tier / "run", f"s3://{bucket}/guess/", env=s3_env,
              check=True)
    head = s3_client.head_object
    assert head(Bucket=bucket, Key="guess/metrics.json")["ContentType"] == "application/json"
    assert head(Bucket=bucket, Key="guess/model.safetensors")["ContentType"] in (
        "binary/octet-stream", "application/octet-stream")
    run_wharf("tier", "export", "-q", "--no-guess-content-type", tier / "run",
              f"s3://{bucket}/plain/", env=s3_env, check=True)
    assert head(Bucket=bucket, Key="plain/metrics.json")["ContentType"] in (
        "binary/octet-stream", "application/octet-stream")
