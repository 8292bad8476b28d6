"""The CLI on s3:// against the real Ceph RGW, cross-checked with an independent client
(Debian's awscli v2), plus retries proven through a fault-injecting proxy."""
import json
import os
import time
import pathlib
import socket
import subprocess
import threading

import pytest

from conftest import random_bytes, run_wharf
from fault_proxy import FaultProxy

AWS = "/usr/bin/aws"  # Debian's awscli v2; the `aws` on PATH may be another version

AWKWARD = ["a b.txt", "a+b.txt", "a%2Bb.txt", "a=b&c.txt", "tilde~x", "star*x", "é.bin",
           "日本/語.bin", "deep/1/2/3/4/5/leaf", "paren(1)", "comma,semi;at@"]


def aws(s3_env, *args, check=True):
    # awscli 2.9 ignores AWS_ENDPOINT_URL: pass the endpoint explicitly.
    # One file per test process: ./run test runs two at once.
    cfg = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"wharf-test-aws-config-{os.getpid()}"
    cfg.write_text("[default]\ns3 =\n  addressing_style = path\n"
                   "  multipart_threshold = 8MB\n  multipart_chunksize = 8MB\n")
    env = dict(s3_env, AWS_CONFIG_FILE=str(cfg), AWS_PAGER="")
    return subprocess.run([AWS, "--endpoint-url", s3_env["WHARF_S3_ENDPOINT"], *args],
                          capture_output=True, env=env, check=check, timeout=300)


def test_awscli_uploads_read_by_wharf(tmp_path, bucket, s3_env):
    files = {"small.bin": random_bytes(1000, 1), "multi.bin": random_bytes(20 << 20, 2)}
    files.update({k: random_bytes(3000 + i, 10 + i) for i, k in enumerate(AWKWARD)})
    src = tmp_path / "src"
    for key, data in files.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(data)
    aws(s3_env, "s3", "cp", "--recursive", "--quiet", str(src), f"s3://{bucket}/up/")
    # awscli really used multipart for the big one.
    head = run_wharf("stat", "--json", f"s3://{bucket}/up/multi.bin", env=s3_env, check=True)
    assert "-" in json.loads(head.stdout)["etag"]
    for key, data in files.items():
        got = run_wharf("cat", f"s3://{bucket}/up/{key}", env=s3_env, check=True)
        assert got.stdout == data, key
    # The listing is in byte order, exactly the keys awscli wrote.
    listed = run_wharf("ls", "-r", "--json", f"s3://{bucket}/up/", env=s3_env, check=True)
    keys = [json.loads(line)["key"] for line in listed.stdout.decode().splitlines()]
    expect = sorted((f"up/{k}" for k in files), key=lambda k: k.encode())
    assert keys == expect


def test_wharf_uploads_read_by_awscli(tmp_path, bucket, s3_env):
    files = {"small.bin": random_bytes(777, 3), "big.bin": random_bytes(21 << 20, 4)}
    files.update({k: random_bytes(100 + i, 30 + i) for i, k in enumerate(AWKWARD)})
    src = tmp_path / "src"
    for key, data in files.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(data)
    run_wharf("cp", "-r", "--quiet", src, f"s3://{bucket}/w/", env=s3_env, check=True)
    head = run_wharf("stat", "--json", f"s3://{bucket}/w/big.bin", env=s3_env, check=True)
    assert json.loads(head.stdout)["etag"].endswith("-3")  # 8 MiB parts: multipart
    out = tmp_path / "out"
    aws(s3_env, "s3", "cp", "--recursive", "--quiet", f"s3://{bucket}/w/", str(out))
    for key, data in files.items():
        assert (out / key).read_bytes() == data, key
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        sorted(files)


def test_cp_recursive_round_trip_and_rm(tmp_path, bucket, s3_env):
    src = tmp_path / "tree"
    expect = {}
    for i, key in enumerate(["x/1", "x/y/2", "empty", "z z/3"] + AWKWARD[:4]):
        data = random_bytes(i * 997, 50 + i)
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(data)
        expect[key] = data
    run_wharf("cp", "-r", "--quiet", src, f"s3://{bucket}/t", env=s3_env, check=True)
    back = tmp_path / "back"
    run_wharf("cp", "-r", "--quiet", f"s3://{bucket}/t/", back, env=s3_env, check=True)
    got = {p.relative_to(back).as_posix(): p.read_bytes() for p in back.rglob("*") if p.is_file()}
    assert got == expect
    cat = run_wharf("cat", "--range", "2-5", f"s3://{bucket}/t/x/y/2", env=s3_env, check=True)
    assert cat.stdout == expect["x/y/2"][2:6]
    assert run_wharf("rm", "-r", f"s3://{bucket}/t/", env=s3_env).returncode == 0
    assert run_wharf("ls", "-r", f"s3://{bucket}/t/", env=s3_env).returncode == 1


def test_keys_escaping_the_destination_are_refused(tmp_path, bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="p/ok.txt", Body=b"fine")
    s3_client.put_object(Bucket=bucket, Key="p/../escaped.txt", Body=b"evil")
    s3_client.put_object(Bucket=bucket, Key="p//abs.txt", Body=b"evil")
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert "p/../escaped.txt" in keys  # the server kept the hostile key as is
    dest = tmp_path / "inner" / "dest"
    dest.mkdir(parents=True)
    proc = run_wharf("cp", "-r", "--quiet", f"s3://{bucket}/p/", dest, env=s3_env)
    assert proc.returncode == 1
    assert "p/../escaped.txt" in proc.stderr and "escape" in proc.stderr
    assert (dest / "ok.txt").read_bytes() == b"fine"
    assert not (tmp_path / "inner" / "escaped.txt").exists()
    assert not pathlib.Path("/abs.txt").exists()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["ok.txt"]


def test_wrong_secret_is_one_line_and_exit_1(bucket, s3_env):
    env = dict(s3_env, AWS_SECRET_ACCESS_KEY="not-the-right-secret")
    proc = run_wharf("ls", f"s3://{bucket}/", env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "SignatureDoesNotMatch" in lines[0] and "AWS_SECRET_ACCESS_KEY" in lines[0]
    assert "not-the-right-secret" not in proc.stderr


def test_missing_bucket_and_object(s3_env, bucket):
    proc = run_wharf("ls", "s3://wharf-no-such-bucket-x/", env=s3_env)
    assert proc.returncode == 1 and "NoSuchBucket" in proc.stderr
    proc = run_wharf("cat", f"s3://{bucket}/nope", env=s3_env)
    assert proc.returncode == 1 and f"s3://{bucket}/nope" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_bucket_itself_is_not_an_object(tmp_path, s3_env, bucket, s3_client):
    # A GET of the empty key is S3's listing of the bucket: never served as an object's bytes.
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"x")
    for args in (("cat", f"s3://{bucket}/"), ("cp", f"s3://{bucket}/", tmp_path / "out")):
        proc = run_wharf(*args, env=s3_env)
        assert proc.returncode != 0, args
        assert b"ListBucketResult" not in proc.stdout
    assert not (tmp_path / "out").exists()
    proc = run_wharf("cat", f"s3://{bucket}/", env=s3_env)
    assert "no object key" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    import wharf
    store = wharf.Store(f"s3://{bucket}/")
    for call in (lambda: store.get(""), lambda: store.head(""), lambda: store.put("", b"y")):
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the type is wharf's; the message is checked
            assert "no object key" in str(e)
        else:
            raise AssertionError("the empty key was accepted")
    assert [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]


def test_failed_single_copy_is_one_line(tmp_path, s3_env):
    """A one-object cp that fails says so once (it used to print the same line twice)."""
    src = tmp_path / "f.txt"
    src.write_text("data")
    for args in (("cp", str(src), "s3://wharf-no-such-bucket-x/f.txt"),
                 ("cp", "--quiet", str(src), "s3://wharf-no-such-bucket-x/f.txt"),
                 ("cp", "s3://wharf-no-such-bucket-x/f.txt", str(tmp_path / "out.txt"))):
        proc = run_wharf(*args, env=s3_env)
        assert proc.returncode == 1, args
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "wharf-no-such-bucket-x" in lines[0], (args, proc.stderr)
    assert not (tmp_path / "out.txt").exists()


def test_gs_scheme_speaks_the_xml_api(s3_env, bucket, s3_client):
    """gs:// uses the same client with GCS's XML API settings; pointed at RGW here."""
    s3_client.put_object(Bucket=bucket, Key="g/obj", Body=b"through gs")
    env = dict(s3_env, WHARF_GS_ENDPOINT=s3_env["WHARF_S3_ENDPOINT"],
               WHARF_GS_ACCESS_KEY_ID=s3_env["AWS_ACCESS_KEY_ID"],
               WHARF_GS_SECRET_ACCESS_KEY=s3_env["AWS_SECRET_ACCESS_KEY"])
    proc = run_wharf("cat", f"gs://{bucket}/g/obj", env=env, check=True)
    assert proc.stdout == b"through gs"
    no_keys = {k: v for k, v in env.items() if not k.startswith("WHARF_GS_ACCESS")}
    # api=xml without an HMAC key: the error says which variables to set.
    proc = run_wharf("ls", f"gs://{bucket}/?api=xml", env=no_keys)
    assert proc.returncode == 1 and "WHARF_GS_ACCESS_KEY_ID" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_gs_without_any_credentials_fails_fast_naming_the_sources(tmp_path):
    """No HMAC key, so the JSON API; no application-default credentials, no emulator and a
    metadata server that does not answer: one line naming what to set, within seconds."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WHARF_GS_", "GOOGLE_", "CLOUDSDK_"))
           and k != "STORAGE_EMULATOR_HOST"}
    env.update(HOME=str(tmp_path), GCE_METADATA_HOST="127.0.0.1:9")
    started = time.monotonic()
    proc = run_wharf("ls", "gs://some-bucket/", env=env)
    assert time.monotonic() - started < 20
    assert proc.returncode == 1
    assert "GOOGLE_APPLICATION_CREDENTIALS" in proc.stderr, proc.stderr
    assert "gs://some-bucket/" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ---- Retries, through a fault-injecting proxy in front of the real server ----

@pytest.fixture
def proxy(s3_env):
    upstream = s3_env["WHARF_S3_ENDPOINT"].split("://", 1)[1]
    with FaultProxy(upstream) as p:
        yield p


def via(proxy, s3_env):
    return dict(s3_env, AWS_ENDPOINT_URL=proxy.url)


def test_503_slowdown_is_retried(proxy, bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"payload")
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/k$"}, "action": "status",
                       "status": 503, "count": 2}])
    proc = run_wharf("cat", f"s3://{bucket}/k", env=via(proxy, s3_env), check=True)
    assert proc.stdout == b"payload"
    faults = [e["fault"] for e in proxy.log() if e["method"] == "GET"]
    assert faults == ["status", "status", None]


def test_a_503s_retry_after_is_waited_out(proxy, bucket, s3_env, s3_client):
    # The backoff of a first retry is well under a second; the server asked for 2.
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"payload")
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/k$"}, "action": "status",
                       "status": 503, "headers": {"Retry-After": "2"}, "count": 1}])
    proc = run_wharf("cat", f"s3://{bucket}/k", env=via(proxy, s3_env), check=True)
    assert proc.stdout == b"payload"
    gets = [e for e in proxy.log() if e["method"] == "GET"]
    assert [e["fault"] for e in gets] == ["status", None]
    assert gets[1]["time"] - gets[0]["time"] >= 1.9, gets


def test_reset_mid_body_resumes_from_received_bytes(proxy, bucket, s3_env, s3_client):
    data = random_bytes(3 << 20, 7)
    s3_client.put_object(Bucket=bucket, Key="big", Body=data)
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/big$"}, "action": "reset",
                       "after_bytes": 1 << 20, "count": 1}])
    out = run_wharf("cat", f"s3://{bucket}/big", env=via(proxy, s3_env), check=True)
    assert out.stdout == data
    gets = [e for e in proxy.log() if e["method"] == "GET"]
    assert [e["fault"] for e in gets] == ["reset", None]
    # The second request asked only for the rest, not the whole object again.
    assert gets[1]["bytes_relayed"] < len(data)


def test_truncated_body_is_never_presented_as_complete(proxy, bucket, s3_env, s3_client, tmp_path):
    data = random_bytes(2 << 20, 8)
    s3_client.put_object(Bucket=bucket, Key="t", Body=data)
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/t$"}, "action": "truncate",
                       "after_bytes": 1000, "count": 1}])
    dest = tmp_path / "t.bin"
    run_wharf("cp", f"s3://{bucket}/t", dest, env=via(proxy, s3_env), check=True)
    assert dest.read_bytes() == data
    # With every attempt truncated, the copy fails and leaves no partial file behind.
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/t$"}, "action": "truncate",
                       "after_bytes": 1000, "count": None}])
    dest2 = tmp_path / "t2.bin"
    proc = run_wharf("cp", f"s3://{bucket}/t", dest2, env=via(proxy, s3_env))
    assert proc.returncode == 1
    assert not dest2.exists()
    assert list(tmp_path.glob(".wharf-tmp-*")) == []


def test_a_well_formed_short_reply_is_never_presented_as_complete(proxy, bucket, s3_env,
                                                                   s3_client, tmp_path):
    # The reply's own Content-Length agrees with its short body (a broken proxy's): the size
    # and ETag the listing or HEAD gave decide, so no verb writes or prints half an object.
    data = random_bytes(1 << 20, 9)
    s3_client.put_object(Bucket=bucket, Key="d/s", Body=data)
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/d/s$"}, "action": "shorten",
                       "after_bytes": 1000, "count": None}])
    env = via(proxy, s3_env)
    for args in (("cp", f"s3://{bucket}/d/s", tmp_path / "one"),
                 ("cp", "-r", f"s3://{bucket}/d/", tmp_path / "tree"),
                 ("sync", f"s3://{bucket}/d/", tmp_path / "synced")):
        proc = run_wharf(*args, env=env)
        assert proc.returncode == 1, (args, proc.stderr)
        assert f"s3://{bucket}/d/s" in proc.stderr, proc.stderr
    assert not (tmp_path / "one").exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    cat = run_wharf("cat", f"s3://{bucket}/d/s", env=env)
    assert cat.returncode == 1 and len(cat.stdout) < len(data), cat.stderr
    assert any(e["fault"] == "shorten" for e in proxy.log())
    proxy.set_faults([])
    assert run_wharf("cat", f"s3://{bucket}/d/s", env=env, check=True).stdout == data


class SilentServer:
    """Accepts connections and reads requests, never answers: a server that stopped."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = []
        self.conns = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self.read, args=(conn,), daemon=True).start()

    def read(self, conn):
        try:
            line = conn.makefile("rb").readline()
        except OSError:
            return
        with self.lock:
            self.requests.append(line.split(b" ")[0].decode())

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_server_that_stopped_answering_is_named_while_retried_and_cat_gives_up_once(
        s3_env):
    server = SilentServer()
    try:
        env = dict(s3_env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{server.port}",
                   WHARF_STALL_TIMEOUT="1")
        proc = run_wharf("cat", "s3://bkt/k", env=env, timeout=120)
        assert proc.returncode == 1 and proc.stdout == b""
        lines = proc.stderr.splitlines()
        # Warned while it waited (not only at the end), rate-limited, naming object and cause.
        warnings = [l for l in lines if l.startswith("wharf: warning: head s3://bkt/k: ")]
        assert warnings and "retrying, attempt 2 of 10" in warnings[0], proc.stderr
        assert len(warnings) < 10 and "Timeout was reached" in warnings[0]
        assert "gave up after 10 attempts" in lines[-1] and "s3://bkt/k" in lines[-1]
        # The HEAD's end is the answer: no GET waits as long again.
        assert set(server.requests) == {"HEAD"} and len(server.requests) == 10, server.requests
    finally:
        server.close()


def test_a_malformed_stall_timeout_is_named_and_the_default_kept(tmp_path, bucket, s3_env,
                                                                 s3_client):
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"data")
    proc = run_wharf("cat", f"s3://{bucket}/k", env=dict(s3_env, WHARF_STALL_TIMEOUT="soon"),
                     check=True)
    assert proc.stdout == b"data"
    assert "WHARF_STALL_TIMEOUT='soon' is not a whole number of seconds >= 1; using 30s" in \
        proc.stderr


def test_a_reply_damaged_on_the_way_is_never_written_as_the_object(proxy, bucket, s3_env,
                                                                  s3_client, tmp_path):
    # Same length, one byte inverted: only the MD5 the ETag of a single-part upload gives can
    # tell. The file store hashes what it writes anyway, and compares.
    data = random_bytes(100 << 10, 11)
    big = random_bytes(20 << 20, 12)  # above the streaming threshold: one PUT, MD5 ETag
    s3_client.put_object(Bucket=bucket, Key="d/s", Body=data)
    s3_client.put_object(Bucket=bucket, Key="b/big", Body=big)
    proxy.set_faults([{"match": {"method": "GET", "path_regex": "/(d/s|b/big)$"},
                       "action": "corrupt", "after_bytes": 777, "count": None}])
    env = via(proxy, s3_env)
    for args, name in ((("cp", f"s3://{bucket}/d/s", tmp_path / "one"), "d/s"),
                       (("cp", "-r", f"s3://{bucket}/d/", tmp_path / "tree"), "d/s"),
                       (("sync", f"s3://{bucket}/d/", tmp_path / "synced"), "d/s"),
                       (("cp", f"s3://{bucket}/b/big", tmp_path / "big"), "b/big")):
        proc = run_wharf(*args, env=env)
        assert proc.returncode == 1, (args, proc.stderr)
        assert f"s3://{bucket}/{name}" in proc.stderr and "damaged on the way" in proc.stderr, \
            proc.stderr
        # Fetched again twice (a damaged reply is the network's fault, as a reset is).
        assert proc.stderr.count("fetching it again") == 2, proc.stderr
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert any(e["fault"] == "corrupt" for e in proxy.log())
    # Damaged once: the second fetch is whole, and the copy succeeds (with a warning).
    for args, dest, want in ((("cp", "-r", f"s3://{bucket}/d/", tmp_path / "tree"),
                              tmp_path / "tree" / "s", data),
                             (("cp", f"s3://{bucket}/b/big", tmp_path / "big"),
                              tmp_path / "big", big),
                             (("tier", "import", f"s3://{bucket}/d/", tmp_path / "tier"),
                              tmp_path / "tier" / "s", data)):
        proxy.set_faults([{"match": {"method": "GET", "path_regex": "/(d/s|b/big)$"},
                           "action": "corrupt", "after_bytes": 5, "count": 1}])
        proc = run_wharf(*args, env=env, check=True)
        assert "damaged on the way; nothing written; fetching it again" in proc.stderr or \
            "is not the source's ETag" in proc.stderr, proc.stderr
        assert dest.read_bytes() == want
    assert run_wharf("tier", "verify", tmp_path / "tier", env=env).returncode == 0


def test_a_listing_that_is_not_one_ends_in_an_error_not_a_short_listing(proxy, bucket, s3_env,
                                                                         s3_client, tmp_path):
    # A page that is XML but no ListBucketResult (a proxy's page) once ended the listing:
    # sync --delete then deleted the local copies of everything after it.
    for i in range(6):
        s3_client.put_object(Bucket=bucket, Key=f"d/k{i}", Body=b"x")
    dst = tmp_path / "dst"
    run_wharf("sync", "-q", f"s3://{bucket}/d/", dst, env=s3_env, check=True)
    # The fault proxy's 200 answer is an <Error> document: XML without a ListBucketResult.
    proxy.set_faults([{"match": {"method": "GET", "query_regex": "list-type=2"},
                       "action": "status", "status": 200, "count": None}])
    proc = run_wharf("sync", "--delete", f"s3://{bucket}/d/", dst, env=via(proxy, s3_env))
    assert proc.returncode == 1 and "not a ListObjectsV2 listing" in proc.stderr, proc.stderr
    assert sorted(p.name for p in dst.iterdir()) == [f"k{i}" for i in range(6)]
    ls = run_wharf("ls", "-r", f"s3://{bucket}/d/", env=via(proxy, s3_env))
    assert ls.returncode == 1 and ls.stdout == b""


# ---- The I/O engine through the CLI ----

def put_many(s3_client, bucket, prefix, n, size):
    from concurrent.futures import ThreadPoolExecutor
    blobs = {f"{prefix}{i:04d}": random_bytes(size, i) for i in range(n)}
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda kv: s3_client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]),
                    blobs.items()))
    return blobs


def test_fetch_reads_every_object(bucket, s3_env, s3_client):
    blobs = put_many(s3_client, bucket, "f/", 300, 5000)
    s3_client.put_object(Bucket=bucket, Key="f/big", Body=random_bytes(20 << 20, 99))
    proc = run_wharf("fetch", "-r", "--json", f"s3://{bucket}/f/", env=s3_env, check=True)
    stats = json.loads(proc.stdout)
    assert stats["objects"] == 301 and stats["errors"] == 0
    assert stats["bytes"] == sum(map(len, blobs.values())) + (20 << 20)
    assert stats["requests"] >= 301 + 2  # the big object was split into parts
    assert stats["peak_in_flight"] > 1
    # 1 MiB parts: the 20 MiB object alone takes a HEAD (its size) and 20 ranged GETs.
    proc = run_wharf("fetch", "--json", "--part-size-mb", "1", f"s3://{bucket}/f/big",
                     env=s3_env, check=True)
    stats = json.loads(proc.stdout)
    assert stats["objects"] == 1 and stats["bytes"] == 20 << 20 and stats["requests"] == 1 + 20


def test_parallel_ls_matches_sequential(bucket, s3_env, s3_client):
    put_many(s3_client, bucket, "l/", 2500, 1)
    seq = run_wharf("ls", "-r", f"s3://{bucket}/l/", env=s3_env, check=True).stdout
    par = run_wharf("ls", "-r", "--parallel", "8", f"s3://{bucket}/l/", env=s3_env,
                    check=True).stdout
    assert par == seq and len(seq.splitlines()) == 2500


def test_cp_recursive_resumes_skipping_what_is_there(tmp_path, bucket, s3_env, s3_client):
    blobs = put_many(s3_client, bucket, "r/", 120, 3000)
    dest = tmp_path / "dest"
    first = run_wharf("cp", "-r", f"s3://{bucket}/r/", dest, env=s3_env, check=True)
    assert b"copied 120 objects" in first.stdout
    (dest / "0007").unlink()                 # one lost
    (dest / "0008").write_bytes(b"changed")  # one changed
    again = run_wharf("cp", "-r", f"s3://{bucket}/r/", dest, env=s3_env, check=True)
    assert b"copied 2 objects" in again.stdout and b"skipped 118" in again.stdout
    got = {p.name: p.read_bytes() for p in dest.iterdir()}
    assert got == {k[2:]: v for k, v in blobs.items()}


def s3_requests(metrics_file, op):
    m = json.loads(pathlib.Path(metrics_file).read_text())["metrics"]
    return sum(x["value"] for x in m if x["name"] == "wharf_store_requests_total"
               and x["labels"].get("scheme") == "s3" and x["labels"].get("op") == op)


def test_sync_delete_lists_the_destination_again_only_when_something_may_go(tmp_path, bucket,
                                                                            s3_env, s3_client):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(b"x" * i)
    run_wharf("sync", "-q", src, f"s3://{bucket}/p/", env=s3_env, check=True)
    # Nothing below the destination that the source lacks: one listing of it, not two.
    m = tmp_path / "m.json"
    run_wharf("--metrics", m, "sync", "-q", "--delete", src, f"s3://{bucket}/p/", env=s3_env,
              check=True)
    assert s3_requests(m, "list") == 1
    # An extra is still found and deleted (the second listing names it).
    s3_client.put_object(Bucket=bucket, Key="p/extra", Body=b"e")
    proc = run_wharf("--metrics", m, "sync", "--delete", src, f"s3://{bucket}/p/", env=s3_env,
                     check=True)
    assert s3_requests(m, "list") == 2 and b"deleted 1" in proc.stdout, proc.stdout
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="p/")["Contents"]]
    assert sorted(keys) == ["p/f0", "p/f1", "p/f2"]


def test_copy_between_buckets_of_the_same_server(bucket, s3_env, s3_client):
    """Another bucket of the same endpoint and credentials: copied server-side (CopyObject
    names the source bucket), so the objects keep their Content-Type and user metadata, as
    aws s3 cp keeps them. With upload options the bytes go through the engine in ordered
    chunks into a multipart writer (no event-loop thread waits on the other store)."""
    other = bucket + "-b"
    s3_client.create_bucket(Bucket=other)
    try:
        big = random_bytes(20 << 20, 123)
        s3_client.put_object(Bucket=bucket, Key="x/big.bin", Body=big)
        s3_client.put_object(Bucket=bucket, Key="x/small.bin", Body=b"small",
                             ContentType="application/x-custom", Metadata={"owner": "alice"},
                             CacheControl="max-age=60")
        run_wharf("cp", "-r", "--quiet", f"s3://{bucket}/x/", f"s3://{other}/y/", env=s3_env,
                  check=True, timeout=120)
        got = s3_client.get_object(Bucket=other, Key="y/big.bin")
        assert got["Body"].read() == big
        small = s3_client.get_object(Bucket=other, Key="y/small.bin")
        assert small["Body"].read() == b"small"
        assert (small["ContentType"], small["Metadata"], small.get("CacheControl")) == (
            "application/x-custom", {"owner": "alice"}, "max-age=60"), small
        run_wharf("cp", f"s3://{bucket}/x/small.bin", f"s3://{other}/one.bin", env=s3_env,
                  check=True)
        one = s3_client.head_object(Bucket=other, Key="one.bin")
        assert (one["ContentType"], one["Metadata"]) == ("application/x-custom",
                                                         {"owner": "alice"}), one
        # Upload options: streamed (a multipart upload for the big one), the options applied.
        run_wharf("cp", "--storage-class", "STANDARD", f"s3://{bucket}/x/big.bin",
                  f"s3://{other}/single.bin", env=s3_env, check=True, timeout=120)
        got = s3_client.get_object(Bucket=other, Key="single.bin")
        assert got["Body"].read() == big and "-" in got["ETag"]  # multipart upload
    finally:
        for o in s3_client.list_objects_v2(Bucket=other).get("Contents", []):
            s3_client.delete_object(Bucket=other, Key=o["Key"])
        s3_client.delete_bucket(Bucket=other)


def test_ls_of_an_empty_bucket_is_empty_and_a_missing_prefix_an_error(bucket, s3_env,
                                                                      s3_client):
    out = run_wharf("ls", f"s3://{bucket}/", env=s3_env)
    assert out.returncode == 0 and out.stdout == b"" and out.stderr == "", out
    missing = run_wharf("ls", f"s3://{bucket}/nothing/", env=s3_env)
    assert missing.returncode == 1 and "no objects match" in missing.stderr
    # A key ending in '/' that is an object (a folder marker, or data under such a name) is
    # one for stat and rm too, as for cat.
    s3_client.put_object(Bucket=bucket, Key="d/marker/", Body=b"data")
    s3_client.put_object(Bucket=bucket, Key="d/marker/inside", Body=b"x")
    stat = run_wharf("stat", "--json", f"s3://{bucket}/d/marker/", env=s3_env, check=True)
    assert json.loads(stat.stdout)["size"] == 4
    removed = run_wharf("rm", f"s3://{bucket}/d/marker/", env=s3_env, check=True)
    assert "the objects below it are kept" in removed.stderr, removed.stderr
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["d/marker/inside"]
    gone = run_wharf("stat", f"s3://{bucket}/d/marker/", env=s3_env)
    assert gone.returncode == 1 and "a prefix, not an object" in gone.stderr


def test_keys_that_are_no_paths_copy_between_buckets_and_sync_delete_keeps_them(
        tmp_path, bucket, s3_env, s3_client):
    # An object store's keys are opaque: 'a//b', 'a/./b' and 'a/../b' are copied between
    # buckets as they are (aws s3 cp does). They were refused as if the destination were a
    # folder, and sync --delete then took them for keys the source lacks and deleted the
    # destination's copies (data loss). Into a folder they are still refused.
    other = bucket + "-d"
    s3_client.create_bucket(Bucket=other)
    odd = ["p//abs.txt", "p/./dot.txt", "p/x/../../esc.txt", "p/ok.txt"]
    try:
        for key in odd:
            s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
            s3_client.put_object(Bucket=other, Key=key, Body=b"old " + key.encode())
        s3_client.put_object(Bucket=other, Key="p/extra.txt", Body=b"extra")
        proc = run_wharf("sync", "--delete", f"s3://{bucket}/p/", f"s3://{other}/p/",
                         env=s3_env)
        assert proc.returncode == 0, proc.stderr
        keys = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=other)["Contents"])
        assert keys == sorted(odd), keys
        for key in odd:
            assert s3_client.get_object(Bucket=other, Key=key)["Body"].read() == key.encode()
        again = run_wharf("sync", "--delete", f"s3://{bucket}/p/", f"s3://{other}/q/",
                          env=s3_env, check=True)
        assert b"copied 4 objects" in again.stdout, again.stdout
        s3_client.head_object(Bucket=other, Key="q//abs.txt")
        local = run_wharf("cp", "-r", f"s3://{bucket}/p/", tmp_path / "d", env=s3_env)
        assert local.returncode == 1 and local.stderr.count("refusing the key") == 3, \
            local.stderr
        assert [p.name for p in (tmp_path / "d").rglob("*")] == ["ok.txt"]
    finally:
        for o in s3_client.list_objects_v2(Bucket=other).get("Contents", []):
            s3_client.delete_object(Bucket=other, Key=o["Key"])
        s3_client.delete_bucket(Bucket=other)


def test_rm_r_deletes_keys_with_control_characters_too(bucket, s3_env, s3_client):
    # DeleteObjects is XML, which cannot carry most control characters (and turns "\r" into
    # "\n"): one such key failed its whole batch with a bare "HTTP 400", deleting nothing.
    keys = [f"cc/n{i:03d}" for i in range(30)] + ["cc/c\x01t", "cc/r\rt", "cc/t\tab"]
    for key in keys:
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    proc = run_wharf("rm", "-r", f"s3://{bucket}/cc/", env=s3_env)
    assert proc.returncode == 0, proc.stderr
    assert "Contents" not in s3_client.list_objects_v2(Bucket=bucket, Prefix="cc/")


def test_keys_the_filters_exclude_are_not_refused_either(tmp_path, bucket, s3_env, s3_client):
    # A listing may hold keys that cannot be files ('..', '//'): refused one by one when
    # selected, but a key the filters exclude is skipped before that, failing nothing.
    for key in ("p/esc/../evil", "p/esc//x", "p/big.bin", "p/other.txt"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    ok = run_wharf("cp", "-r", f"s3://{bucket}/p/", tmp_path / "d", "--exclude", "*",
                   "--include", "big.bin", env=s3_env)
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (tmp_path / "d").rglob("*") if p.is_file()) == ["big.bin"]
    selected = run_wharf("cp", "-r", f"s3://{bucket}/p/", tmp_path / "e", env=s3_env)
    assert selected.returncode == 1 and selected.stderr.count("refusing the key") == 2, \
        selected.stderr
    assert not (tmp_path / "evil").exists() and (tmp_path / "e" / "big.bin").exists()


def test_sync_decides_an_edit_within_the_second_of_the_copy_by_content(tmp_path, bucket, s3_env,
                                                                     s3_client):
    # S3 keeps whole seconds: a file rewritten (same size) in the second of its upload, or an
    # object in the second of its download, ties on time; the MD5s decide then.
    src = tmp_path / "up"
    src.mkdir()
    (src / "f").write_bytes(b"v1")
    run_wharf("sync", "-q", src, f"s3://{bucket}/up", env=s3_env, check=True)
    uploaded = s3_client.head_object(Bucket=bucket, Key="up/f")["LastModified"].timestamp()
    (src / "f").write_bytes(b"v2")
    os.utime(src / "f", (uploaded + 0.5, uploaded + 0.5))  # the upload's second
    run_wharf("sync", "-q", src, f"s3://{bucket}/up", env=s3_env, check=True)
    assert s3_client.get_object(Bucket=bucket, Key="up/f")["Body"].read() == b"v2"
    # Unchanged now: nothing copied, however often.
    proc = run_wharf("sync", src, f"s3://{bucket}/up", env=s3_env, check=True)
    assert "skipped 1 up to date" in proc.stdout.decode()

    down = tmp_path / "down"
    run_wharf("sync", "-q", f"s3://{bucket}/up", down, env=s3_env, check=True)
    assert (down / "f").read_bytes() == b"v2"
    s3_client.put_object(Bucket=bucket, Key="up/f", Body=b"v3")
    rewritten = s3_client.head_object(Bucket=bucket, Key="up/f")["LastModified"].timestamp()
    os.utime(down / "f", (rewritten, rewritten))  # the download's time, the same second
    run_wharf("sync", "-q", f"s3://{bucket}/up", down, env=s3_env, check=True)
    assert (down / "f").read_bytes() == b"v3"
    proc = run_wharf("sync", f"s3://{bucket}/up", down, env=s3_env, check=True)
    assert "skipped 1 up to date" in proc.stdout.decode()
    # Synced up, then down into the folder it came from: the objects are newer than the
    # files, but the same bytes: nothing is downloaded again.
    (src / "g").write_bytes(b"other")
    run_wharf("sync", "-q", src, f"s3://{bucket}/up", env=s3_env, check=True)
    proc = run_wharf("sync", f"s3://{bucket}/up", src, env=s3_env, check=True)
    assert "copied 0 objects" in proc.stdout.decode()
    assert "skipped 2 up to date" in proc.stdout.decode()


def test_sync_uploads_a_same_size_edit_in_the_second_of_a_multipart_upload(tmp_path, bucket,
                                                                           s3_env, s3_client):
    # An object uploaded in parts has no MD5 to compare: times decide. A file edited (same
    # size) at 10:11:28.3, after an upload stamped 10:11:28, is newer: copied, as aws s3 sync
    # does (its time was cut to whole seconds and tied).
    src = tmp_path / "mp"
    src.mkdir()
    data = bytearray(random_bytes(12 << 20, seed=5))
    (src / "m.bin").write_bytes(data)
    from boto3.s3.transfer import TransferConfig
    s3_client.upload_file(str(src / "m.bin"), bucket, "mp/m.bin", Config=TransferConfig(
        multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    head = s3_client.head_object(Bucket=bucket, Key="mp/m.bin")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]
    stamped = head["LastModified"].timestamp()
    data[7] ^= 0xFF
    (src / "m.bin").write_bytes(data)
    os.utime(src / "m.bin", (stamped + 0.3, stamped + 0.3))
    proc = run_wharf("sync", src, f"s3://{bucket}/mp", env=s3_env, check=True)
    assert "copied 1 object" in proc.stdout.decode(), proc.stdout
    assert s3_client.get_object(Bucket=bucket, Key="mp/m.bin")["Body"].read() == bytes(data)
    # A file at exactly the object's second is current (a download gives it that time).
    down = tmp_path / "down"
    run_wharf("sync", "-q", f"s3://{bucket}/mp", down, env=s3_env, check=True)
    proc = run_wharf("sync", f"s3://{bucket}/mp", down, env=s3_env, check=True)
    assert "skipped 1 up to date" in proc.stdout.decode(), proc.stdout


def test_a_key_naming_an_object_and_a_prefix_is_not_guessed(tmp_path, bucket, s3_env, s3_client):
    for key in ("run", "run/x", "run/y", "solo"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "stale").write_bytes(b"old")
    for args in (("sync", "--delete", f"s3://{bucket}/run", tmp_path / "dst"),
                 ("cp", "-r", f"s3://{bucket}/run", tmp_path / "dst"),
                 ("rm", "-r", f"s3://{bucket}/run")):
        proc = run_wharf(*args, env=s3_env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "names both an object and a prefix" in proc.stderr
        assert f"s3://{bucket}/run/" in proc.stderr
    listed = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(listed) == ["run", "run/x", "run/y", "solo"]
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["stale"]
    # ls shows both: the object and its folder's roll-up (with -r, the folder's contents);
    # a lone object is just itself.
    ls = run_wharf("ls", "--json", f"s3://{bucket}/run", env=s3_env, check=True)
    assert [e.get("key", e.get("prefix")) for e in map(json.loads, ls.stdout.splitlines())] == [
        "run", "run/"]
    ls = run_wharf("ls", "-r", f"s3://{bucket}/run", env=s3_env, check=True)
    assert [line.split()[-1] for line in ls.stdout.decode().splitlines()] == [
        f"s3://{bucket}/run", f"s3://{bucket}/run/x", f"s3://{bucket}/run/y"]
    ls = run_wharf("ls", f"s3://{bucket}/solo", env=s3_env, check=True)
    assert [line.split()[-1] for line in ls.stdout.decode().splitlines()] == [
        f"s3://{bucket}/solo"]
    # With '/' it is the prefix; --delete of a lone object is refused, not ignored.
    run_wharf("sync", "-q", "--delete", f"s3://{bucket}/run/", tmp_path / "dst", env=s3_env,
              check=True)
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["x", "y"]
    proc = run_wharf("sync", "--delete", f"s3://{bucket}/solo", tmp_path / "dst", env=s3_env)
    assert proc.returncode == 2 and "--delete needs a prefix" in proc.stderr
    run_wharf("rm", "-r", "-q", f"s3://{bucket}/run/", env=s3_env, check=True)
    listed = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(listed) == ["run", "solo"]


def test_filters_before_the_positionals_leave_them_alone(tmp_path, bucket, s3_env, s3_client):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"a")
    (src / "b.tmp").write_bytes(b"b")
    run_wharf("sync", "--exclude", "*.tmp", src, f"s3://{bucket}/f", "--delete", "-q",
              env=s3_env, check=True)
    run_wharf("cp", "-r", "--exclude=*.txt", src, f"s3://{bucket}/g", "-q", env=s3_env,
              check=True)
    listed = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"])
    assert listed == ["f/a.txt", "g/b.tmp"]
    proc = run_wharf("rm", "-r", "--exclude", "b*", f"s3://{bucket}/g/", "--dryrun", env=s3_env)
    assert proc.returncode == 1 and "no objects match" in proc.stderr  # the only key excluded
    proc = run_wharf("rm", "-r", "--exclude", "b*", f"s3://{bucket}/f/", "--dryrun",
                     env=s3_env, check=True)
    assert proc.stdout.decode() == f"(dryrun) delete s3://{bucket}/f/a.txt\n"


def test_a_missing_key_ending_in_a_slash_is_not_called_a_missing_bucket(bucket, s3_env):
    proc = run_wharf("stat", f"s3://{bucket}/no-such-dir/", env=s3_env)
    assert proc.returncode == 1
    assert "NoSuchKey or NoSuchBucket" in proc.stderr, proc.stderr


def test_a_failed_listing_names_the_prefix_it_listed(s3_env):
    proc = run_wharf("ls", "s3://wharf-no-such-bucket-x/some/prefix/", env=s3_env)
    assert proc.returncode == 1
    assert "list s3://wharf-no-such-bucket-x/some/prefix/: NoSuchBucket" in proc.stderr
