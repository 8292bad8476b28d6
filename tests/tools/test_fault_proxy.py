"""Tests of fault_proxy.py against a small HTTP/1.1 upstream (http.server in a thread)."""

import hashlib
import http.client
import http.server
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fault_proxy import FaultProxy  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parent / "fault_proxy.py"


class Handler(http.server.BaseHTTPRequestHandler):
    """A tiny S3-like server: objects in a dict, Range, HEAD, PUT (also chunked), DELETE,
    multipart-initiate POST, a chunked response, 304, and a Connection: close response."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _record(self, body=b""):
        self.server.seen.append({"method": self.command, "path": self.path,
                                 "headers": list(self.headers.items()),
                                 "client": self.client_address, "body": body})

    def _send(self, status, body=b"", headers=(), head=False):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if status not in (204, 304):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and status not in (204, 304):
            self.wfile.write(body)

    def _read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_GET(self, head=False):
        self._record()
        objects = self.server.objects
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b"a" * 1000, b"b" * 2000, b"c" * 3000):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/not-modified":
            return self._send(304, headers=[("ETag", '"x"')])
        if self.path == "/close":
            self.close_connection = True
            return self._send(200, b"bye", headers=[("Connection", "close")])
        if self.path.startswith("/bucket?list-type=2"):
            keys = "".join(f"<Contents><Key>{k[len('/bucket/'):]}</Key></Contents>"
                           for k in sorted(objects))
            return self._send(200, f"<ListBucketResult>{keys}</ListBucketResult>".encode(),
                              [("Content-Type", "application/xml")], head)
        data = objects.get(self.path.partition("?")[0])
        if data is None:
            return self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", head=head)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            return self._send(206, data[start:end + 1],
                              [("Content-Range", f"bytes {start}-{end}/{len(data)}")], head)
        return self._send(200, data, [("ETag", f'"{hashlib.md5(data).hexdigest()}"')], head)

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_PUT(self):
        body = self._read_body()
        self._record(body)
        self.server.objects[self.path.partition("?")[0]] = body
        self._send(200, headers=[("ETag", f'"{hashlib.md5(body).hexdigest()}"')])

    def do_POST(self):
        body = self._read_body()
        self._record(body)
        self._send(200, b"<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
                        b"</InitiateMultipartUploadResult>")

    def do_DELETE(self):
        self._record()
        self.server.objects.pop(self.path, None)
        self._send(204)


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the proxy cutting a response short (reset/truncate) breaks the handler's pipe


@pytest.fixture
def upstream():
    server = QuietServer(("127.0.0.1", 0), Handler)
    server.seen = []
    server.objects = {"/bucket/key": os.urandom(100_000), "/bucket/other": b"other"}
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(upstream):
    with FaultProxy(f"127.0.0.1:{upstream.server_address[1]}") as p:
        yield p


def connect(proxy):
    return http.client.HTTPConnection(proxy.host, proxy.port, timeout=10)


def get(conn, path, headers=None, method="GET", body=None):
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    return r.status, r.read(), r


def raw_exchange(proxy, request: bytes, read_timeout=5):
    """Sends raw bytes; returns (bytes received, how the connection ended: eof/reset/timeout)."""
    s = socket.create_connection((proxy.host, proxy.port))
    s.settimeout(read_timeout)
    s.sendall(request)
    received = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return received, "eof"
            received += data
    except ConnectionResetError:
        return received, "reset"
    except socket.timeout:
        return received, "timeout"
    finally:
        s.close()


def split_response(raw: bytes):
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body


# ---- Pass-through ----------------------------------------------------------------------------


def test_relays_an_s3_like_session_over_one_keep_alive_connection(proxy, upstream):
    key = upstream.objects["/bucket/key"]
    conn = connect(proxy)
    host = {"Host": "s3.example.test:9000"}

    status, body, _ = get(conn, "/bucket/key", host)
    assert (status, body) == (200, key)
    sock = conn.sock
    status, body, r = get(conn, "/bucket/key", {**host, "Range": "bytes=10-19"})
    assert (status, body, r.getheader("Content-Range")) == (206, key[10:20], "bytes 10-19/100000")
    status, body, r = get(conn, "/bucket/key", host, method="HEAD")
    assert (status, body, r.getheader("Content-Length")) == (200, b"", "100000")
    status, _, _ = get(conn, "/bucket/new", host, method="PUT", body=b"p" * 70_000)
    assert status == 200
    conn.request("PUT", "/bucket/chunked", body=iter([b"x" * 5000, b"y" * 7000]),
                 headers=host, encode_chunked=True)
    r = conn.getresponse()
    assert (r.status, r.read()) == (200, b"")
    status, body, _ = get(conn, "/bucket/big?uploads", host, method="POST", body=b"")
    assert status == 200 and b"<UploadId>u1</UploadId>" in body
    status, body, _ = get(conn, "/bucket?list-type=2&prefix=", host)
    assert status == 200 and b"<Key>chunked</Key>" in body and b"<Key>new</Key>" in body
    status, body, _ = get(conn, "/chunked", host)
    assert (status, body) == (200, b"a" * 1000 + b"b" * 2000 + b"c" * 3000)
    status, body, _ = get(conn, "/not-modified", host)
    assert (status, body) == (304, b"")
    status, body, _ = get(conn, "/bucket/new", host, method="DELETE")
    assert (status, body) == (204, b"")
    status, body, _ = get(conn, "/bucket/other", host)
    assert (status, body) == (200, b"other")
    assert conn.sock is sock  # the client connection stayed open throughout
    conn.close()

    assert upstream.objects["/bucket/chunked"] == b"x" * 5000 + b"y" * 7000
    assert all(dict(s["headers"])["Host"] == "s3.example.test:9000" for s in upstream.seen)
    assert len({s["client"] for s in upstream.seen}) == 1  # one upstream connection, reused
    log = proxy.log()
    assert [e["status"] for e in log] == [200, 206, 200, 200, 200, 200, 200, 200, 304, 204, 200]
    assert all(e["fault"] is None and e["host"] == "s3.example.test:9000" for e in log)


def test_request_bytes_reach_the_upstream_unchanged():
    received = []
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = server.accept()
        data = b""
        while b"hello" not in data:
            data += conn.recv(65536)
        received.append(data)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    request = (b"PUT /bucket/a%20b?x-id=PutObject HTTP/1.1\r\n"
               b"host: S3.Example.test:9000\r\n"
               b"X-Amz-Date: 20260101T000000Z\r\n"
               b"x-amz-content-sha256:   UNSIGNED-PAYLOAD  \r\n"
               b"Authorization: AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, "
               b"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=abc\r\n"
               b"Content-Length: 5\r\n\r\nhello")
    with FaultProxy(f"127.0.0.1:{server.getsockname()[1]}") as p:
        raw, _ = raw_exchange(p, request)
    server.close()
    assert received == [request]
    assert raw.endswith(b"\r\n\r\nok")


def test_upstream_connection_close_is_honoured(proxy):
    conn = connect(proxy)
    status, body, r = get(conn, "/close")
    assert (status, body, r.getheader("Connection")) == (200, b"bye", "close")
    conn.close()
    conn = connect(proxy)  # a new connection gets a new upstream connection
    assert get(conn, "/bucket/other")[:2] == (200, b"other")
    conn.close()


def test_expect_100_continue_is_relayed(proxy, upstream):
    raw, how = raw_exchange(proxy, b"PUT /bucket/e HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                                   b"Expect: 100-continue\r\nConnection: close\r\n\r\n",
                            read_timeout=0.5)
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n"), raw
    # (the client above never sent its body; now a well-behaved client:)
    s = socket.create_connection((proxy.host, proxy.port))
    s.sendall(b"PUT /bucket/e HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
              b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
    s.settimeout(5)
    interim = s.recv(65536)
    assert interim.startswith(b"HTTP/1.1 100 Continue\r\n")
    s.sendall(b"body")
    rest = b""
    while data := s.recv(65536):
        rest += data
    s.close()
    assert rest.startswith(b"HTTP/1.1 200")
    assert upstream.objects["/bucket/e"] == b"body"


# ---- Faults ----------------------------------------------------------------------------------


def test_status_503_for_the_first_two_gets_of_a_key(proxy, upstream):
    proxy.set_faults([{"match": {"method": "GET", "path_regex": r"^/bucket/key$"},
                       "action": "status", "status": 503, "count": 2}])
    conn = connect(proxy)
    results = []
    for path in ("/bucket/key", "/bucket/other", "/bucket/key", "/bucket/key"):
        status, body, r = get(conn, path)
        results.append((path, status))
        if status == 503:
            assert b"<Code>SlowDown</Code>" in body
            assert r.getheader("Content-Type") == "application/xml"
            assert b"<Resource>/bucket/key</Resource>" in body
    sock = conn.sock
    assert get(conn, "/bucket/key")[0] == 200
    assert conn.sock is sock  # an injected status keeps the connection alive
    conn.close()
    assert results == [("/bucket/key", 503), ("/bucket/other", 200), ("/bucket/key", 503),
                       ("/bucket/key", 200)]
    assert [e["fault"] for e in proxy.log()] == ["status", None, "status", None, None]
    assert [s["path"] for s in upstream.seen] == ["/bucket/other", "/bucket/key", "/bucket/key"]
    assert proxy.faults()[0]["remaining"] == 0


@pytest.mark.parametrize("status,code", [(500, "InternalError"), (502, "BadGateway"),
                                         (504, "GatewayTimeout"), (429, "TooManyRequests")])
def test_other_statuses(proxy, status, code):
    proxy.set_faults([{"action": "status", "status": status, "count": 2,
                       "headers": {"Retry-After": "1"}}])
    conn = connect(proxy)
    got, body, r = get(conn, "/bucket/other")
    assert got == status and f"<Code>{code}</Code>".encode() in body
    assert r.getheader("Retry-After") == "1"
    got, body, r = get(conn, "/bucket/other", method="HEAD")
    assert (got, body) == (status, b"")
    assert get(conn, "/bucket/other")[:2] == (200, b"other")
    conn.close()


def test_status_on_a_put_discards_the_body_and_keeps_the_connection(proxy, upstream):
    proxy.set_faults([{"match": {"method": "PUT"}, "action": "status", "status": 503}])
    conn = connect(proxy)
    assert get(conn, "/bucket/p", method="PUT", body=b"q" * 300_000)[0] == 503
    assert get(conn, "/bucket/p", method="PUT", body=b"r" * 300_000)[0] == 200
    conn.close()
    assert upstream.objects["/bucket/p"] == b"r" * 300_000


def test_status_on_an_expect_100_request_closes_the_connection(proxy, upstream):
    proxy.set_faults([{"match": {"method": "PUT"}, "action": "status", "status": 503}])
    raw, how = raw_exchange(proxy, b"PUT /bucket/x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n"
                                   b"Expect: 100-continue\r\n\r\n")
    head, body = split_response(raw)
    assert head.startswith("HTTP/1.1 503 Slow Down") and "Connection: close" in head
    assert b"SlowDown" in body and how == "eof"
    assert upstream.seen == []


def test_reset_after_n_body_bytes(proxy, upstream):
    proxy.set_faults([{"match": {"path_regex": "^/bucket/key$"}, "action": "reset",
                       "after_bytes": 1000}])
    raw, how = raw_exchange(proxy, b"GET /bucket/key HTTP/1.1\r\nHost: h\r\n\r\n")
    head, body = split_response(raw)
    assert how == "reset"
    assert head.startswith("HTTP/1.1 200") and "Content-Length: 100000" in head
    assert body == upstream.objects["/bucket/key"][:1000]
    # count 1: the retry succeeds (and http.client sees the reset as an exception)
    conn = connect(proxy)
    assert get(conn, "/bucket/key")[:2] == (200, upstream.objects["/bucket/key"])
    conn.close()
    assert [(e["fault"], e["bytes_relayed"]) for e in proxy.log()] == [("reset", 1000),
                                                                         (None, 100000)]


def test_reset_before_any_body_byte(proxy):
    proxy.set_faults([{"action": "reset", "after_bytes": 0}])
    conn = connect(proxy)
    with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
        get(conn, "/bucket/key")
    conn.close()


def test_truncate_closes_with_fin_after_n_body_bytes(proxy, upstream):
    proxy.set_faults([{"match": {"method": "GET"}, "action": "truncate", "after_bytes": 5000}])
    raw, how = raw_exchange(proxy, b"GET /bucket/key HTTP/1.1\r\nHost: h\r\n\r\n")
    head, body = split_response(raw)
    assert how == "eof"
    assert "Content-Length: 100000" in head
    assert body == upstream.objects["/bucket/key"][:5000]
    proxy.set_faults([{"match": {"method": "GET"}, "action": "truncate", "after_bytes": 10}])
    conn = connect(proxy)
    with pytest.raises(http.client.IncompleteRead):
        get(conn, "/bucket/key")
    conn.close()


def test_truncate_a_chunked_response(proxy):
    proxy.set_faults([{"action": "truncate", "after_bytes": 1500}])
    raw, how = raw_exchange(proxy, b"GET /chunked HTTP/1.1\r\nHost: h\r\n\r\n")
    head, body = split_response(raw)
    assert how == "eof" and "Transfer-Encoding: chunked" in head
    assert len(body) == 1500 and body.startswith(b"3e8\r\n" + b"a" * 1000 + b"\r\n7d0\r\n")


def test_delay_holds_the_response(proxy):
    proxy.set_faults([{"match": {"method": "GET"}, "action": "delay", "delay_ms": 300},
                      {"match": {"method": "HEAD"}, "action": "delay", "delay_ms": 200,
                       "phase": "request"}])
    conn = connect(proxy)
    t0 = time.monotonic()
    assert get(conn, "/bucket/other")[:2] == (200, b"other")
    assert time.monotonic() - t0 >= 0.3
    t0 = time.monotonic()
    assert get(conn, "/bucket/other", method="HEAD")[0] == 200
    assert time.monotonic() - t0 >= 0.2
    t0 = time.monotonic()
    assert get(conn, "/bucket/other")[0] == 200
    assert time.monotonic() - t0 < 0.2  # count 1: not delayed again
    conn.close()


def test_drop_resets_without_forwarding(proxy, upstream):
    proxy.set_faults([{"action": "drop"}])
    raw, how = raw_exchange(proxy, b"GET /bucket/other HTTP/1.1\r\nHost: h\r\n\r\n")
    assert (raw, how) == (b"", "reset")
    assert upstream.seen == []


def test_skip_headers_and_query_matching(proxy):
    proxy.set_faults([
        {"match": {"method": "GET", "headers": {"range": r"^bytes=0-"}}, "action": "status",
         "status": 500, "skip": 1},
        {"match": {"query_regex": r"partNumber=2"}, "action": "status", "status": 503,
         "count": None},
    ])
    conn = connect(proxy)
    assert get(conn, "/bucket/key", {"Range": "bytes=0-9"})[0] == 206  # skipped
    assert get(conn, "/bucket/key", {"Range": "bytes=5-9"})[0] == 206  # header does not match
    assert get(conn, "/bucket/key", {"Range": "bytes=0-9"})[0] == 500
    assert get(conn, "/bucket/key", {"Range": "bytes=0-9"})[0] == 206  # count spent
    for _ in range(3):  # count null: every match
        assert get(conn, "/bucket/k?partNumber=2&uploadId=u1", method="PUT", body=b"x")[0] == 503
    assert get(conn, "/bucket/k?partNumber=3&uploadId=u1", method="PUT", body=b"x")[0] == 200
    conn.close()


def test_probability_faults_a_repeatable_share(proxy):
    def statuses(seed):
        proxy.reset()
        proxy.set_faults([{"match": {"method": "GET"}, "action": "status", "status": 503,
                           "count": None, "probability": 0.3, "seed": seed}])
        conn = connect(proxy)
        out = [get(conn, "/bucket/key")[0] for _ in range(60)]
        conn.close()
        return out

    first = statuses(7)
    assert 5 <= first.count(503) <= 35 and first.count(200) == 60 - first.count(503)
    assert statuses(7) == first  # the same seed draws the same requests


def test_bad_rules_are_rejected(proxy):
    for bad in ([{"action": "explode"}], [{"action": "delay"}], [{"action": "status", "count": 0}],
                [{"action": "status", "match": {"paht_regex": "x"}}],
                [{"action": "status", "probability": 1.5}]):
        with pytest.raises(ValueError):
            proxy.set_faults(bad)


# ---- Control endpoint and script mode --------------------------------------------------------


def control(base, method, path, payload=None):
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_control_endpoint(proxy):
    base = proxy.control_url
    assert control(base, "POST", "/faults", [{"match": {"method": "GET"}, "action": "status",
                                              "status": 503}]) == (200, {"faults": 1})
    assert control(base, "POST", "/faults?append=1",
                   {"action": "delay", "delay_ms": 1})[1] == {"faults": 2}
    status, faults = control(base, "GET", "/faults")
    assert status == 200 and [f["remaining"] for f in faults] == [1, 1]
    conn = connect(proxy)
    assert get(conn, "/bucket/other")[0] == 503
    assert get(conn, "/bucket/other")[0] == 200  # the delay rule
    conn.close()
    status, log = control(base, "GET", "/log")
    assert [(e["method"], e["target"], e["fault"], e["status"]) for e in log] == [
        ("GET", "/bucket/other", "status", 503), ("GET", "/bucket/other", "delay", 200)]
    assert control(base, "POST", "/faults", [{"action": "nope"}])[0] == 400
    assert control(base, "POST", "/reset") == (200, {"reset": True})
    assert control(base, "GET", "/log") == (200, [])
    assert control(base, "GET", "/faults") == (200, [])


def test_script_mode(upstream):
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--upstream", f"127.0.0.1:{upstream.server_address[1]}",
         "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listen = proc.stdout.readline().split()
        ctl = proc.stdout.readline().split()
        assert listen[:2] == ["listening", "on"] and ctl[:2] == ["control", "on"]
        port = int(listen[2].rsplit(":", 1)[1])
        base = "http://" + ctl[2]
        control(base, "POST", "/faults", [{"action": "status", "status": 504}])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert get(conn, "/bucket/other")[0] == 504
        assert get(conn, "/bucket/other")[:2] == (200, b"other")
        conn.close()
        assert [e["fault"] for e in control(base, "GET", "/log")[1]] == ["status", None]
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        proc.stdout.close()
        stderr = proc.stderr.read()
        proc.stderr.close()
    assert rc == 0, stderr


# ---- In front of the real S3 server (Ceph RGW, started by ./run test) ------------------------


def test_relays_signed_boto3_traffic_to_rgw_and_injects_faults(s3_env, s3_client, bucket):
    import boto3
    from botocore.config import Config

    upstream = s3_env["WHARF_S3_ENDPOINT"].removeprefix("http://")
    data = os.urandom(6 << 20)
    with FaultProxy(upstream) as p:
        # SigV4 covers the Host header: it names the proxy, and must arrive unchanged.
        client = boto3.client(
            "s3", endpoint_url=p.url, aws_access_key_id=s3_env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=s3_env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"},
                          retries={"mode": "standard", "max_attempts": 4}))
        client.put_object(Bucket=bucket, Key="k", Body=data)
        mp = client.create_multipart_upload(Bucket=bucket, Key="mp")
        part = client.upload_part(Bucket=bucket, Key="mp", UploadId=mp["UploadId"], PartNumber=1,
                                  Body=data)
        client.complete_multipart_upload(
            Bucket=bucket, Key="mp", UploadId=mp["UploadId"],
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
        assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["k", "mp"]

        p.reset()
        p.set_faults([{"match": {"method": "GET", "path_regex": f"^/{bucket}/k$"},
                       "action": "status", "status": 503, "count": 2}])
        got = client.get_object(Bucket=bucket, Key="k", Range="bytes=100-")["Body"].read()
        assert got == data[100:]
        assert [(e["fault"], e["status"]) for e in p.log()] == [("status", 503),
                                                               ("status", 503), (None, 206)]
        p.set_faults([{"match": {"method": "GET"}, "action": "truncate", "after_bytes": 1000}])
        with pytest.raises(Exception):
            client.get_object(Bucket=bucket, Key="mp")["Body"].read()
        assert client.head_object(Bucket=bucket, Key="mp")["ContentLength"] == len(data)
    assert s3_client.get_object(Bucket=bucket, Key="mp")["Body"].read() == data
