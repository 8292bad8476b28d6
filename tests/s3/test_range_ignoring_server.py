"""Reads from an S3-compatible server that ignores Range (HTTP lets a server answer a ranged
GET with 200 and the whole object; some gateways and proxies do). The server is a small real
HTTP server (http.server in a thread) that answers HEAD and GET of its objects and never a
206: wharf cuts each range from the whole object, so `cat --range` and the parallel ranged
parts of `cp` give the right bytes."""
import hashlib
import http.server
import threading

import pytest

from conftest import random_bytes, run_wharf


OBJECTS = {"/bkt/small.bin": random_bytes(1000, 1), "/bkt/big.bin": random_bytes(40 << 20, 2)}


class IgnoresRange(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, head):
        path = self.path.split("?")[0]
        self.server.ranges.append(self.headers.get("Range"))
        body = OBJECTS.get(path)
        if body is None:
            error = (b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code>"
                     b"<Message>no such key</Message></Error>")
            self.send_response(404)
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            if not head:
                self.wfile.write(error)
            return
        self.send_response(200)  # never 206, whatever the Range header says
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"%s"' % hashlib.md5(body).hexdigest())
        self.send_header("Last-Modified", "Mon, 30 Nov 2026 12:00:00 GMT")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_GET(self):
        self._answer(head=False)

    def do_HEAD(self):
        self._answer(head=True)


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), IgnoresRange)
    srv.daemon_threads = True
    srv.ranges = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    env = {"PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
           "AWS_SECRET_ACCESS_KEY": "not-checked-by-this-server", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{srv.server_address[1]}"}
    yield srv, env
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("spec,begin,end", [("100-349", 100, 350), ("990-", 990, 1000),
                                            ("-33", 967, 1000), ("0-4999", 0, 1000)])
def test_cat_of_a_range_cuts_it_from_the_whole_object(server, spec, begin, end):
    srv, env = server
    proc = run_wharf("cat", "--range", spec, "s3://bkt/small.bin", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == OBJECTS["/bkt/small.bin"][begin:end]
    assert any(r is not None for r in srv.ranges), srv.ranges  # a Range was sent, and ignored


def test_a_range_past_the_end_is_refused_with_the_objects_name(server):
    _, env = server
    proc = run_wharf("cat", "--range", "1000-1009", "s3://bkt/small.bin", env=env)
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "s3://bkt/small.bin: range starts at byte 1000 of a 1000-byte object" in proc.stderr


def test_parallel_ranged_parts_of_a_copy_are_right(server, tmp_path):
    srv, env = server
    dest = tmp_path / "big.bin"
    proc = run_wharf("cp", "s3://bkt/big.bin", dest, env=env)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == OBJECTS["/bkt/big.bin"]
    ranged = [r for r in srv.ranges if r is not None]
    assert len(ranged) >= 2, srv.ranges  # the copy was split into ranged parts
