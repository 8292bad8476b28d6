"""Uploads to s3:// against the real Ceph RGW: no multipart upload left behind under faults,
upload options (content type, storage class, encryption), bucket listing and unsigned access."""
import datetime
import json
import re
import signal
import subprocess
import time
import uuid

import pytest

from conftest import run_wharf, wharf_bin
from fault_proxy import FaultProxy
from test_s3_cli import random_bytes


@pytest.fixture
def proxy(s3_env):
    upstream = s3_env["WHARF_S3_ENDPOINT"].split("://", 1)[1]
    with FaultProxy(upstream) as p:
        yield p


def via(proxy, s3_env):
    return dict(s3_env, AWS_ENDPOINT_URL=proxy.url)


def all_uploads(s3_client, bucket):
    uploads, kwargs = [], {}
    while True:
        page = s3_client.list_multipart_uploads(Bucket=bucket, **kwargs)
        uploads += page.get("Uploads", [])
        if not page.get("IsTruncated"):
            return uploads
        kwargs = {"KeyMarker": page["NextKeyMarker"],
                  "UploadIdMarker": page["NextUploadIdMarker"]}


# ---- No multipart upload left behind ----

def test_faulty_upload_leaves_no_multipart_upload(proxy, tmp_path, bucket, s3_env, s3_client):
    """~200 objects, 4 of them multipart (above the 16 MiB streaming threshold, 8 MiB parts),
    with faults on a share of every kind of request. The creates of multipart uploads are
    answered with a dropped connection after the server created the upload (the ambiguous
    failure that used to leave an orphan: the retry starts a second upload), and so are some
    completes (the retry then finds its upload gone although the object is there)."""
    src = tmp_path / "src"
    files = {}
    for i in range(196):
        files[f"small/{i:03d}.bin"] = random_bytes(1 + (i * 7919) % 60000, 1000 + i)
    for i, mib in enumerate((17, 20, 24, 26)):
        files[f"big/{i}.bin"] = random_bytes((mib << 20) + 12345 * i, 2000 + i)
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)

    create = {"method": "POST", "query_regex": r"(^|&)uploads(=|&|$)"}
    complete = {"method": "POST", "query_regex": r"uploadId="}
    proxy.set_faults([
        # The first two creates, then a third of the rest: reset once the server has answered.
        {"match": create, "action": "reset", "after_bytes": 0, "count": 2},
        {"match": create, "action": "reset", "after_bytes": 0, "count": None,
         "probability": 0.35, "seed": 1},
        {"match": complete, "action": "reset", "after_bytes": 0, "count": None,
         "probability": 0.3, "seed": 2},
        # Every request: 503s, dropped connections, truncated and reset responses.
        {"action": "status", "status": 503, "count": None, "probability": 0.06, "seed": 3},
        {"action": "drop", "count": None, "probability": 0.04, "seed": 4},
        {"action": "truncate", "after_bytes": 10, "count": None, "probability": 0.04,
         "seed": 5},
        {"action": "reset", "after_bytes": 0, "count": None, "probability": 0.03, "seed": 6},
    ])
    proc = run_wharf("cp", "-r", "-q", src, f"s3://{bucket}/up/", env=via(proxy, s3_env),
                     timeout=120)
    log = proxy.log()
    proxy.reset()  # the checks below go straight to the server anyway

    # The test exercised what it is about: creates that reached the server, then failed.
    creates = [e for e in log if e["method"] == "POST" and re.search(
        r"\?(.*&)?uploads(=|&|$)", e["target"])]
    assert sum(e["fault"] == "reset" for e in creates) >= 2, creates

    assert all_uploads(s3_client, bucket) == []
    # Every object is complete, or named in a failure line; normally none fails (10 attempts).
    failed = set(re.findall(rf"s3://{bucket}/up/(\S+?):", proc.stderr))
    listed = {}
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            listed[o["Key"]] = o["Size"]
    for rel, data in files.items():
        key = f"up/{rel}"
        if key not in listed:
            assert rel in failed, f"{key} missing but not reported as failed: {proc.stderr}"
            continue
        assert listed[key] == len(data), key
        body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert body == data, key
    assert set(listed) <= {f"up/{rel}" for rel in files}
    if proc.returncode != 0:
        assert failed, proc.stderr


def test_a_create_whose_reply_is_lost_leaves_no_second_upload(proxy, bucket, s3_env,
                                                               s3_client, monkeypatch):
    """The server started the upload and its reply was lost on a pooled connection: libcurl
    sent the create again by itself, unseen, and the first upload stayed behind for good. A
    create goes on a fresh connection, so the resend is wharf's own, which sweeps."""
    import os
    import wharf
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = wharf.Store(f"s3://{bucket}/")
    store.list()  # leaves an idle connection in the pool
    proxy.set_faults([{"match": {"method": "POST", "query_regex": r"(^|&)uploads(=|&|$)"},
                       "action": "lose", "count": 1}])
    data = os.urandom(20 << 20)
    with wharf.open(f"s3://{bucket}/lost/a.bin", "wb") as f:
        f.write(data)
    assert [e["fault"] for e in proxy.log() if e["method"] == "POST"].count("lose") == 1
    assert all_uploads(s3_client, bucket) == []
    assert s3_client.get_object(Bucket=bucket, Key="lost/a.bin")["Body"].read() == data


# ---- Upload options ----

def test_content_type_and_storage_class_reach_the_object(tmp_path, bucket, s3_env, s3_client):
    small = tmp_path / "page.html"
    small.write_bytes(b"<html></html>")
    big = tmp_path / "big.bin"
    big.write_bytes(random_bytes(20 << 20, 31))  # multipart: the options go on the create
    for src, key in ((small, "page.html"), (big, "big.bin")):
        run_wharf("cp", "--content-type", "text/html; charset=utf-8", "--storage-class",
                  "STANDARD", src, f"s3://{bucket}/{key}", env=s3_env, check=True)
        head = s3_client.head_object(Bucket=bucket, Key=key)
        assert head["ContentType"] == "text/html; charset=utf-8", key
        # RGW names the class only when it is set; STANDARD is the one it has by default.
        assert head.get("StorageClass", "STANDARD") == "STANDARD", key
    # Without --content-type, the type the source's extension names (as aws s3 cp and rclone);
    # --no-guess-content-type (or aws's --no-guess-mime-type) leaves the server's default.
    run_wharf("cp", small, f"s3://{bucket}/plain", env=s3_env, check=True)
    assert s3_client.head_object(Bucket=bucket, Key="plain")["ContentType"] == "text/html"
    for flag in ("--no-guess-content-type", "--no-guess-mime-type"):
        run_wharf("cp", flag, small, f"s3://{bucket}/plain", env=s3_env, check=True)
        assert s3_client.head_object(Bucket=bucket, Key="plain")["ContentType"] in (
            "binary/octet-stream", "application/octet-stream"), flag


def test_uploads_get_the_content_type_of_their_extension(tmp_path, bucket, s3_env, s3_client):
    files = {"a.json": "application/json", "d/b.JPG": "image/jpeg", "c.csv": "text/csv",
             "shard-0001.tar": "application/x-tar", "e.parquet": "application/vnd.apache.parquet",
             "noext": None, "f.unknownext": None, ".hidden": None, "g.txt.gz": "application/gzip"}
    for name in files:
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(b"x" * 10)
    big = tmp_path / "src" / "big.json"  # multipart: the type goes on the create
    big.write_bytes(random_bytes(20 << 20, 32))
    files["big.json"] = "application/json"
    run_wharf("cp", "-r", "-q", tmp_path / "src", f"s3://{bucket}/up/", env=s3_env, check=True)
    for name, want in files.items():
        got = s3_client.head_object(Bucket=bucket, Key=f"up/{name}")["ContentType"]
        if want is None:
            assert got in ("binary/octet-stream", "application/octet-stream"), (name, got)
        else:
            assert got == want, (name, got)
    # --content-type wins over the extension.
    run_wharf("cp", "-r", "-q", "--content-type", "text/plain", tmp_path / "src",
              f"s3://{bucket}/typed/", env=s3_env, check=True)
    for name in files:
        assert s3_client.head_object(Bucket=bucket, Key=f"typed/{name}")["ContentType"] == \
            "text/plain", name


def test_upload_options_reach_a_copy_within_the_bucket(bucket, s3_env, s3_client):
    # A copy within one store is server-side, which keeps the source's settings: the options
    # were dropped without a word (exit 0). With options the bytes now go through wharf.
    s3_client.put_object(Bucket=bucket, Key="m/b.json", Body=b"{}",
                         ContentType="application/json")
    run_wharf("cp", "-q", "--content-type", "text/plain", f"s3://{bucket}/m/b.json",
              f"s3://{bucket}/one/b.json", env=s3_env, check=True)
    run_wharf("cp", "-r", "-q", "--content-type", "text/plain", f"s3://{bucket}/m/",
              f"s3://{bucket}/many/", env=s3_env, check=True)
    for key in ("one/b.json", "many/b.json"):
        assert s3_client.head_object(Bucket=bucket, Key=key)["ContentType"] == "text/plain", key
    # SSE: RGW refuses it over plain HTTP, so the copy fails instead of succeeding without it.
    proc = run_wharf("cp", "--sse", "aws:kms", f"s3://{bucket}/m/b.json", f"s3://{bucket}/e",
                     env=s3_env)
    assert proc.returncode == 1 and "InvalidRequest" in proc.stderr, proc.stderr
    # Without options it stays server-side and keeps the source's type.
    run_wharf("cp", "-q", f"s3://{bucket}/m/b.json", f"s3://{bucket}/kept.json", env=s3_env,
              check=True)
    assert s3_client.head_object(Bucket=bucket, Key="kept.json")["ContentType"] == \
        "application/json"


def test_storage_class_the_server_lacks_is_one_line(tmp_path, bucket, s3_env):
    src = tmp_path / "f"
    src.write_bytes(b"x")
    proc = run_wharf("cp", "--storage-class", "NO_SUCH_CLASS", src, f"s3://{bucket}/f",
                     env=s3_env)
    assert proc.returncode == 1
    assert f"s3://{bucket}/f" in proc.stderr and "InvalidArgument" in proc.stderr


def test_sse_headers_are_signed_and_sent(tmp_path, bucket, s3_env):
    # This RGW has no TLS, and RGW accepts SSE only over TLS (rgw_crypt_require_ssl), so
    # it refuses the upload with InvalidRequest. That it answers InvalidRequest rather than
    # SignatureDoesNotMatch shows the x-amz-server-side-encryption* headers reached it and
    # were signed correctly; their values are checked in store/s3/s3_store_test.cc
    # (UploadOptionsAreSentAndSigned).
    src = tmp_path / "f"
    src.write_bytes(b"secret")
    for args in (["--sse", "AES256"], ["--sse", "aws:kms", "--sse-kms-key-id", "testkey-1"]):
        proc = run_wharf("cp", *args, src, f"s3://{bucket}/f", env=s3_env)
        assert proc.returncode == 1
        assert "InvalidRequest" in proc.stderr, proc.stderr
        assert "SignatureDoesNotMatch" not in proc.stderr


# ---- Bucket listing ----

def test_ls_without_a_bucket_lists_the_buckets(s3_env, s3_client):
    name = f"wharf-ls-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    try:
        proc = run_wharf("ls", "s3://", env=s3_env, check=True)
        lines = proc.stdout.decode().splitlines()
        ours = [line for line in lines if line.endswith(f" {name}")]
        assert len(ours) == 1, lines
        # "2024-01-01 12:00:00 name", as `aws s3 ls`, in local time.
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d " + re.escape(name), ours[0])
        created = datetime.datetime.strptime(ours[0][:19], "%Y-%m-%d %H:%M:%S")
        assert abs((created - datetime.datetime.now()).total_seconds()) < 600

        proc = run_wharf("ls", "--json", "s3://", env=s3_env, check=True)
        entries = [json.loads(line) for line in proc.stdout.decode().splitlines()]
        ours = [e for e in entries if e["bucket"] == name]
        assert len(ours) == 1
        assert ours[0]["uri"] == f"s3://{name}/"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ours[0]["created"])
        assert [e["bucket"] for e in entries] == sorted(e["bucket"] for e in entries)
    finally:
        s3_client.delete_bucket(Bucket=name)


# ---- Unsigned (anonymous) access ----

def test_anonymous_reads_public_objects_only(bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="public.txt", Body=b"for everyone",
                         ACL="public-read")
    s3_client.put_object(Bucket=bucket, Key="private.txt", Body=b"not for you")
    # No credentials at all: nothing may be looked up, let alone sent.
    anonymous = {k: v for k, v in s3_env.items()
                 if not k.startswith("AWS_") or k == "AWS_ENDPOINT_URL"}
    anonymous["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent"
    anonymous["AWS_CONFIG_FILE"] = "/nonexistent"
    anonymous["AWS_EC2_METADATA_DISABLED"] = "true"
    for env, flags in ((dict(anonymous, WHARF_NO_SIGN_REQUEST="1"), []),
                       (anonymous, ["--no-sign-request"])):
        proc = run_wharf(*flags, "cat", f"s3://{bucket}/public.txt", env=env)
        assert (proc.returncode, proc.stdout) == (0, b"for everyone"), proc.stderr
        proc = run_wharf(*flags, "cat", f"s3://{bucket}/private.txt", env=env)
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert f"s3://{bucket}/private.txt" in lines[0] and "AccessDenied" in lines[0]
        assert "unsigned" in lines[0]
    # Without the flag and without credentials: the usual hint, nothing sent unsigned.
    proc = run_wharf("cat", f"s3://{bucket}/public.txt", env=anonymous)
    assert proc.returncode == 1 and "credentials" in proc.stderr.lower()


def test_bad_no_sign_request_value_is_refused(bucket, s3_env):
    proc = run_wharf("ls", f"s3://{bucket}/", env=dict(s3_env, WHARF_NO_SIGN_REQUEST="maybe"))
    assert proc.returncode == 1 and "WHARF_NO_SIGN_REQUEST" in proc.stderr


# ---- Store flags and URI query options (store specs) ----

def test_store_flags_and_query_options_reach_the_store(bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="f/a?b", Body=b"question")
    endpoint = s3_env["WHARF_S3_ENDPOINT"]
    # No endpoint in the environment: only the flag or the query can point at the RGW.
    env = {k: v for k, v in s3_env.items() if not k.startswith("AWS_ENDPOINT_URL")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    for args in (["--endpoint-url", endpoint, "ls", f"s3://{bucket}/f/"],
                 ["ls", f"s3://{bucket}/f/", "--endpoint-url", endpoint, "--region", "us-east-1"],
                 ["ls", f"s3://{bucket}/f/?endpoint={endpoint}&region=us-east-1"]):
        proc = run_wharf(*args, env=env)
        assert proc.returncode == 0, proc.stderr
        assert b"a?b" in proc.stdout
    # A key with '?' is a key, not options.
    proc = run_wharf("--endpoint-url", endpoint, "cat", f"s3://{bucket}/f/a?b", env=env)
    assert (proc.returncode, proc.stdout) == (0, b"question"), proc.stderr
    # The flag beats the query.
    proc = run_wharf("--endpoint-url", endpoint, "ls",
                     f"s3://{bucket}/f/?endpoint=http://127.0.0.1:1", env=env)
    assert proc.returncode == 0 and b"a?b" in proc.stdout, proc.stderr
    # Unknown query options and bad flag values are refused, naming them.
    proc = run_wharf("ls", f"s3://{bucket}/f/?endpiont={endpoint}", env=env)
    assert proc.returncode == 2 and "'endpiont'" in proc.stderr and "valid:" in proc.stderr
    proc = run_wharf("--endpoint-url", "ftp://x", "ls", f"s3://{bucket}/", env=env)
    assert proc.returncode == 2 and "--endpoint-url" in proc.stderr
    # The flags do not apply to local paths.
    proc = run_wharf("--endpoint-url", endpoint, "--region", "us-east-1", "cp",
                     f"s3://{bucket}/f/a?b", "-", env=env)
    assert (proc.returncode, proc.stdout) == (0, b"question"), proc.stderr


def test_gs_store_options(s3_env, bucket, s3_client):
    s3_client.put_object(Bucket=bucket, Key="g/obj", Body=b"through gs")
    env = dict(s3_env, WHARF_GS_ACCESS_KEY_ID=s3_env["AWS_ACCESS_KEY_ID"],
               WHARF_GS_SECRET_ACCESS_KEY=s3_env["AWS_SECRET_ACCESS_KEY"])
    env.pop("WHARF_GS_ENDPOINT", None)
    endpoint = s3_env["WHARF_S3_ENDPOINT"]
    # --endpoint-url reaches gs:// (instead of WHARF_GS_ENDPOINT); --region is S3's and skipped.
    proc = run_wharf("--endpoint-url", endpoint, "--region", "eu-west-1", "cat",
                     f"gs://{bucket}/g/obj", env=env)
    assert (proc.returncode, proc.stdout) == (0, b"through gs"), proc.stderr
    proc = run_wharf("ls", f"gs://{bucket}/g/?endpoint={endpoint}&api=xml", env=env)
    assert proc.returncode == 0 and b"obj" in proc.stdout, proc.stderr
    # api=json speaks GCS's JSON API even with an HMAC key set: RGW has no such bucket there.
    proc = run_wharf("ls", f"gs://{bucket}/g/?endpoint={endpoint}&api=json&anonymous=true",
                     env=env)
    assert proc.returncode == 1 and "no such bucket" in proc.stderr, proc.stderr
    proc = run_wharf("ls", f"gs://{bucket}/g/?endpoint={endpoint}&region=x", env=env)
    assert proc.returncode == 1 and "'region'" in proc.stderr


# ---- An interrupted run (Ctrl-C, SIGTERM, SIGHUP) leaves nothing behind ----

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupted_upload_aborts_its_multipart_upload(bucket, s3_env, s3_client, sig):
    """`wharf cp - s3://...` interrupted while its multipart upload is open (one 8 MiB part
    sent, the rest of standard input still to come): the upload is aborted before the
    process exits with 128 + the signal, and no object appears."""
    proc = subprocess.Popen([wharf_bin(), "cp", "-q", "-", f"s3://{bucket}/big"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=s3_env)
    try:
        proc.stdin.write(random_bytes(9 << 20, seed=sig))
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not all_uploads(s3_client, bucket):
            assert time.monotonic() < deadline, "the upload never started"
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"interrupted ({signal.Signals(sig).name})" in err, err
    assert "cleaning up 1 transfer in progress" in err, err
    assert all_uploads(s3_client, bucket) == []
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_an_interrupted_download_removes_its_temporary_files(tmp_path):
    """A local write interrupted mid-file removes its temporary file at once (kill -9 leaves
    it for the next listing of the folder: tests/cli)."""
    target = tmp_path / "out" / "file"
    proc = subprocess.Popen([wharf_bin(), "cp", "-q", "-", str(target)],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"x" * 100_000)
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not list(target.parent.glob(".wharf-tmp-*")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(target.parent.iterdir()) == []


def test_an_interrupt_while_the_create_is_unanswered_aborts_what_it_started(
        proxy, bucket, s3_env, s3_client):
    """The server has created the upload, its reply is held back (10 s): the interrupt finds
    the key's upload by listing and aborts it, and the exit status is still the signal's."""
    proxy.set_faults([{"match": {"method": "POST", "query_regex": "uploads"},
                       "action": "delay", "delay_ms": 10000, "count": None}])
    proc = subprocess.Popen([wharf_bin(), "cp", "-q", "-", f"s3://{bucket}/held"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=via(proxy, s3_env))
    try:
        proc.stdin.write(random_bytes(9 << 20, seed=7))
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not all_uploads(s3_client, bucket):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "cleaning up 1 transfer in progress" in err, err
    assert len(err.strip().splitlines()) == 1, err  # nothing after the signal's line
    assert all_uploads(s3_client, bucket) == []


def test_a_signal_the_parent_ignores_stays_ignored(tmp_path):
    """nohup, `trap '' INT` and a shell's background jobs start a process with the signal
    ignored: it must not end the copy."""
    target = tmp_path / "file"
    proc = subprocess.Popen([wharf_bin(), "cp", "-q", "-", str(target)],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        proc.stdin.write(b"x" * 100_000)
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".wharf-tmp-*")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert proc.poll() is None
        proc.stdin.write(b"y" * 10)
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert target.read_bytes() == b"x" * 100_000 + b"y" * 10


def test_an_interrupt_ends_a_credential_process_that_is_still_running(tmp_path, s3_env):
    """A credential_process still running when the CLI gets SIGTERM ends with it."""
    marker = f"sleep 60.{uuid.uuid4().int % 10**9:09d}"  # a command line of its own
    script = tmp_path / "cred.sh"
    script.write_text(f"#!/bin/sh\nexec {marker}\n")
    script.chmod(0o755)
    config = tmp_path / "config"
    config.write_text(f"[profile slow]\ncredential_process = {script}\n")
    env = {k: v for k, v in s3_env.items()
           if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    env.update(AWS_CONFIG_FILE=str(config), AWS_PROFILE="slow")

    def running():
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
        return found.stdout.split()

    proc = subprocess.Popen([wharf_bin(), "ls", "s3://wharf-cred-probe/"], env=env,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not running():
            assert time.monotonic() < deadline and proc.poll() is None, "no credential process"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while running():
        assert time.monotonic() < deadline, f"still running: {running()}"
        time.sleep(0.05)


def test_cleanup_aborts_the_unfinished_uploads_below_a_prefix(bucket, s3_env, s3_client):
    """What a writer killed with -9 leaves (an initiated upload with a part), made here with
    boto3: `wharf cleanup` lists and aborts those below the prefix, started before
    --older-than (default 24h, so uploads in progress are left alone)."""
    def start(key):
        u = s3_client.create_multipart_upload(Bucket=bucket, Key=key)
        s3_client.upload_part(Bucket=bucket, Key=key, UploadId=u["UploadId"], PartNumber=1,
                              Body=b"x" * 100)
        return u["UploadId"]

    ids = {key: start(key) for key in ("run/a.bin", "run/sub/b.bin", "other/c.bin",
                                       "run10/d.bin")}

    def pending():
        return sorted(u["Key"] for u in
                      s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))

    out = run_wharf("cleanup", f"s3://{bucket}/run/", env=s3_env, check=True)
    assert out.stdout.decode() == "aborted 0 uploads (2 started within --older-than 24h kept)\n"
    out = run_wharf("cleanup", "--older-than", "0", "--dryrun", f"s3://{bucket}/run/",
                    env=s3_env, check=True)
    lines = out.stdout.decode().splitlines()
    assert lines[:2] == [f"(dryrun) abort upload of s3://{bucket}/run/a.bin"
                         + lines[0][lines[0].index(" (started"):],
                         f"(dryrun) abort upload of s3://{bucket}/run/sub/b.bin"
                         + lines[1][lines[1].index(" (started"):]]
    assert lines[2] == "would abort 2 uploads"
    assert pending() == ["other/c.bin", "run/a.bin", "run/sub/b.bin", "run10/d.bin"]
    out = run_wharf("cleanup", "--older-than", "0", "--json", f"s3://{bucket}/run/",
                    env=s3_env, check=True)
    rows = [json.loads(line) for line in out.stdout.decode().splitlines()]
    assert {(r["uri"], r["upload_id"], r["action"]) for r in rows[:-1]} == {
        (f"s3://{bucket}/{k}", ids[k], "aborted") for k in ("run/a.bin", "run/sub/b.bin")}
    assert rows[-1] == {"uploads": 2, "aborted": 2, "kept": 0, "failed": 0}
    assert pending() == ["other/c.bin", "run10/d.bin"]
    # A prefix without its '/' is that folder (and that one key), as for rm -r: run10/'s
    # uploads, perhaps someone's in progress, are not run's.
    start("run")
    out = run_wharf("cleanup", "--older-than", "0", f"s3://{bucket}/run", env=s3_env, check=True)
    lines = out.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[1] == "aborted 1 upload", lines
    assert lines[0].startswith(f"aborted upload of s3://{bucket}/run (started "), lines
    assert pending() == ["other/c.bin", "run10/d.bin"]
    # Usage errors exit 2; a store without multipart uploads says so; a missing bucket is one line.
    out = run_wharf("cleanup", "--older-than", "3x", f"s3://{bucket}/", env=s3_env)
    assert out.returncode == 2 and "--older-than: '3x' is not an age" in out.stderr
    out = run_wharf("cleanup", "/tmp", env=s3_env, check=True)
    assert b"keeps no unfinished multipart uploads" in out.stdout
    out = run_wharf("cleanup", "s3://wharf-no-such-bucket-7c1d/", env=s3_env)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "NoSuchBucket" in out.stderr
    run_wharf("cleanup", "--older-than", "0", "-q", f"s3://{bucket}/", env=s3_env, check=True)
    assert pending() == []
