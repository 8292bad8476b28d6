"""examples/serving/server.py as a process: a model saved with safetensors, loaded with wharf,
requests answered through the prediction cache (a repeat is a hit, X-Wharf-Cache), two server
processes sharing the Redis cache, the model's outputs, bad requests, /healthz and /metrics."""
import http.client
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "serving" / "server.py"
_spec = importlib.util.spec_from_file_location("wharf_serving_example", SERVER)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()


@pytest.fixture
def model_file(tmp_path):
    model = make_model()
    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(path))
    return model, path


class ServerProcess:
    def __init__(self, *args):
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        self.proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        line = self.proc.stdout.readline()
        if " on http://" not in line:
            self.proc.kill()
            raise AssertionError(f"the server did not start: {line}{self.proc.stderr.read()}")
        self.host, _, port = line.rsplit("http://", 1)[1].strip().rpartition(":")
        self.port = int(port)
        self.banner = line

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
            conn.request(method, path, body=data)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def predict(self, body):
        status, headers, data = self.request("POST", "/predict", body)
        assert status == 200, data
        return headers["X-Wharf-Cache"], json.loads(data)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def servers():
    started = []

    def start(*args):
        s = ServerProcess(*args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def test_predictions_through_the_cache(model_file, servers):
    model, path = model_file
    srv = servers("--model", path, "--cache", "memory")
    x = [0.5, -1.0, 2.0, 0.25]
    assert srv.predict({"inputs": x})[0] == "miss"
    outcome, body = srv.predict({"inputs": x})
    assert outcome == "hit"
    with torch.no_grad():
        expected = model(torch.tensor([x])).tolist()[0]
    assert body["outputs"] == pytest.approx(expected, rel=1e-6, abs=1e-6)
    # the key is the numbers: spacing and 2 vs 2.0 do not matter
    assert srv.predict(b'{ "inputs" : [0.5, -1.0, 2, 0.25] }')[0] == "hit"
    assert srv.predict({"inputs": [0.5, -1.0, 2.0, 0.5]})[0] == "miss"
    # a batch
    outcome, body = srv.predict({"inputs": [x, [0, 0, 0, 0]]})
    assert outcome == "miss" and len(body["outputs"]) == 2 and len(body["outputs"][0]) == 3
    assert body["outputs"][0] == pytest.approx(expected, rel=1e-6, abs=1e-6)
    # the version is derived from the file: the same in the header, /healthz and the body
    status, headers, data = srv.request("GET", "/healthz")
    health = json.loads(data)
    assert status == 200 and health["status"] == "ok" and health["cache"] == "memory"
    assert health["model_version"].startswith("model.safetensors@")
    assert headers["Content-Type"] == "application/json"
    assert body["model_version"] == health["model_version"]


def test_bad_requests_are_400_and_not_cached(model_file, servers):
    _, path = model_file
    srv = servers("--model", path)
    for body in (b"not json", {"inputs": [1, 2]}, {"inputs": "abcd"}, {"x": [1, 2, 3, 4]},
                 {"inputs": [1, 2, 3, True]}, [1, 2, 3, 4], b'{"inputs": [1, 2, 3, NaN]}',
                 b'{"inputs": [1, 2, 3, 1e400]}', b'{"inputs": [1, 2, 3, %d]}' % 10**400):
        status, _, data = srv.request("POST", "/predict", body)
        assert status == 400, (body, data)
        assert "error" in json.loads(data)
    # A negative Content-Length is refused at once (no read that waits for the client).
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
    conn.putrequest("POST", "/predict")
    conn.putheader("Content-Length", "-1")
    conn.endheaders()
    assert conn.getresponse().status == 400
    conn.close()
    assert srv.request("GET", "/nope")[0] == 404
    assert srv.request("POST", "/nope", b"{}")[0] == 404
    status, headers, data = srv.request("GET", "/metrics")
    text = data.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'wharf_serve_cache_misses_total{backend="memory"} 0' in text
    srv.predict({"inputs": [1, 2, 3, 4]})
    srv.predict({"inputs": [1, 2, 3, 4]})
    text = srv.request("GET", "/metrics")[2].decode()
    assert 'wharf_serve_cache_hits_total{backend="memory"} 1' in text
    assert 'wharf_serve_cache_misses_total{backend="memory"} 1' in text
    assert "# TYPE wharf_serve_cache_get_seconds histogram" in text
    assert 'wharf_serve_cache_get_seconds_bucket{backend="memory",le="+Inf"} 2' in text


def test_two_server_processes_share_the_redis_cache(model_file, servers, redis_url):
    _, path = model_file
    version = f"test-{uuid.uuid4().hex}"  # Redis outlives the test: a version of its own
    a = servers("--model", path, "--cache", redis_url, "--ttl", 60, "--model-version", version)
    b = servers("--model", path, "--cache", redis_url, "--ttl", 60, "--model-version", version)
    requests = [{"inputs": [i, i / 2, -i, 1.0]} for i in range(5)]
    first = [a.predict(r) for r in requests]
    assert [o for o, _ in first] == ["miss"] * 5
    second = [b.predict(r) for r in requests]
    assert [o for o, _ in second] == ["hit"] * 5
    assert [body for _, body in second] == [body for _, body in first]
    assert all(body["model_version"] == version for _, body in second)
    # another version of the model never gets these predictions
    c = servers("--model", path, "--cache", redis_url, "--model-version", version + "-next")
    assert c.predict(requests[0])[0] == "miss"


def test_tier_dir_cache_shared_by_two_servers(model_file, servers, tmp_path):
    _, path = model_file
    cache = tmp_path / "predictions"
    a = servers("--model", path, "--cache", cache)
    b = servers("--model", path, "--cache", cache)
    assert a.predict({"inputs": [1, 1, 1, 1]})[0] == "miss"
    assert b.predict({"inputs": [1, 1, 1, 1]})[0] == "hit"


def test_missing_model_fails_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(SERVER), "--model", tmp_path / "none.safetensors",
                          "--port", "0"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    assert out.returncode == 1
    assert out.stderr.startswith("server: ") and "none.safetensors" in out.stderr


# ------------------------------------------------------------------------- the library part
def test_build_model_from_state_dicts():
    model = make_model(1)
    built = example.build_model(model.state_dict())
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(built(x), model(x))
    # consecutive Linear layers (no activation between), no bias
    plain = torch.nn.Sequential(torch.nn.Linear(2, 3, bias=False), torch.nn.Linear(3, 1))
    assert torch.equal(example.build_model(plain.state_dict())(torch.ones(1, 2)),
                       plain(torch.ones(1, 2)))
    with pytest.raises(ValueError, match="expected names '<index>.weight'"):
        example.build_model({"encoder.weight": torch.ones(2, 2)})
    with pytest.raises(ValueError, match="takes 5 inputs"):
        example.build_model({"0.weight": torch.ones(3, 2), "2.weight": torch.ones(1, 5)})
    with pytest.raises(ValueError, match="bias shape"):
        example.build_model({"0.weight": torch.ones(3, 2), "0.bias": torch.ones(2)})


def test_serve_in_thread(model_file):
    model, path = model_file
    with example.serve_in_thread(path, cache="memory", ttl=60) as service:
        host, port = service.url.split("://")[1].split(":")
        for expected in ("miss", "hit"):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("POST", "/predict", body=b'{"inputs": [1, 2, 3, 4]}')
            r = conn.getresponse()
            assert r.status == 200 and r.getheader("X-Wharf-Cache") == expected
            r.read()
            conn.close()
        assert service.predictor.cache.stats()["hits"] == 1


def call(service, method, path, body=None):
    """(status, headers, body) of one request to a serve_in_thread service."""
    host, port = service.url.split("://")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_overflowing_inputs_are_422_and_not_cached(model_file):
    # finite float64 numbers whose float32 products are not: NaN outputs are not JSON
    _, path = model_file
    with example.serve_in_thread(path) as service:
        for _ in range(2):
            status, _, data = call(service, "POST", "/predict",
                                   b'{"inputs": [1e300, 1e300, 1e300, 1e300]}')
            assert status == 422, data
            assert "not finite" in json.loads(data)["error"]
        s = service.predictor.cache.stats()
        assert s["computes"] == 2 and s["hits"] == 0 and s["entries"] == 0


def test_coalesced_requests_say_so(model_file):
    """Identical requests that wait for one compute say X-Wharf-Cache: coalesced, not hit."""
    _, path = model_file
    n = 8
    with example.serve_in_thread(path) as service:
        compute = service.predictor._compute

        def slow(*args):
            time.sleep(0.5)
            return compute(*args)

        service.predictor._compute = slow
        barrier = threading.Barrier(n)
        outcomes = []

        def run():
            barrier.wait()
            status, headers, data = call(service, "POST", "/predict", b'{"inputs": [1, 2, 3, 4]}')
            assert status == 200, data
            outcomes.append(headers["X-Wharf-Cache"])

        threads = [threading.Thread(target=run) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = service.predictor.cache.stats()
        assert s["computes"] == 1
        assert sorted(outcomes) == sorted(["miss"] + ["coalesced"] * s["coalesced"] +
                                          ["hit"] * s["hits"])
        assert outcomes.count("coalesced") >= 1 and outcomes.count("hit") == s["hits"]
        assert call(service, "POST", "/predict", b'{"inputs": [1, 2, 3, 4]}')[1][
            "X-Wharf-Cache"] == "hit"


def test_http_edges(model_file):
    _, path = model_file
    with example.serve_in_thread(path) as service:
        # nested deeper than the JSON parser's recursion: 400, not a 500 RecursionError
        status, _, data = call(service, "POST", "/predict", b"[" * 100000)
        assert status == 400 and "nested too deeply" in json.loads(data)["error"]
        # a known path with the wrong method: 405 with Allow
        status, headers, _ = call(service, "GET", "/predict")
        assert status == 405 and headers["Allow"] == "POST"
        status, headers, _ = call(service, "POST", "/healthz", b"{}")
        assert status == 405 and headers["Allow"] == "GET"
        # the query string is not part of the path
        status, _, data = call(service, "GET", "/healthz?x=1")
        assert status == 200 and json.loads(data)["status"] == "ok"
        assert call(service, "GET", "/metrics?name=x")[0] == 200
        assert call(service, "GET", "/nope?x=1")[0] == 404


def raw_exchange(service, data: bytes) -> bytes:
    """Sends raw bytes on one connection; everything the server answers until it closes."""
    import socket
    host, port = service.url.split("://")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("framing", [
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: abc\r\n",
    b"Content-Length: 2_0\r\n",
    b"Content-Length: 41\r\nContent-Length: 0\r\n",
    b"Content-Length: 0\r\nTransfer-Encoding: chunked\r\n",
])
def test_a_body_of_ambiguous_framing_is_refused_and_never_read_as_a_request(model_file,
                                                                             framing):
    # The bytes after a refused head were parsed as the next request on the connection
    # (a 411 kept it open; int() took "2_0"; the first of two lengths won).
    _, path = model_file
    with example.serve_in_thread(path) as service:
        out = raw_exchange(service, b"POST /predict HTTP/1.1\r\nHost: x\r\n" + framing +
                           b"\r\n" + SMUGGLED)
    assert out.startswith(b"HTTP/1.1 400") or out.startswith(b"HTTP/1.1 411"), out
    assert out.count(b"HTTP/1.1 ") == 1, out  # one answer: the rest was not a request


def test_methods_head_bursts_and_a_port_in_use(model_file, capsys):
    _, path = model_file
    with example.serve_in_thread(path) as service:
        for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
            status, headers, data = call(service, method, "/predict")
            assert status == 405 and headers["Allow"] == "POST", (method, data)
            assert "use POST" in json.loads(data)["error"]
        status, headers, data = call(service, "HEAD", "/healthz")
        assert status == 200 and data == b"" and int(headers["Content-Length"]) > 0
        assert call(service, "DELETE", "/nope")[0] == 404
        # {"inputs": []}: a 400, not an IndexError 500
        assert call(service, "POST", "/predict", b'{"inputs": []}')[0] == 400
        # 64 clients at once: the stdlib's backlog of 5 reset some of them
        results = []

        def one():
            results.append(call(service, "GET", "/healthz")[0])

        threads = [threading.Thread(target=one) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [200] * 64
        # Its port, taken: one line, exit 1, no traceback.
        port = service.url.rsplit(":", 1)[1]
        assert example.main(["--model", str(path), "--port", port]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"server: cannot listen on 127.0.0.1:{port}: ") and \
            err.count("\n") == 1, err


def test_sigterm_lets_the_requests_being_answered_finish(model_file, servers):
    # SIGTERM killed the process at once: requests being answered got a reset.
    import socket
    _, path = model_file
    server = servers("--model", path)
    body = json.dumps({"inputs": [0.5, 0.25, 0.125, 1.0]}).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body[:10])
        time.sleep(0.5)  # the head is read; the body is still coming
        server.proc.send_signal(15)
        time.sleep(0.5)
        sock.sendall(body[10:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"]}") or answer.endswith(b"]"):
                break
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert server.proc.wait(60) == 0
    assert "SIGTERM: stopping" in server.proc.stderr.read()


def test_model_replaced_during_the_load_is_loaded_again(tmp_path, monkeypatch):
    """The version is read before and after the load: weights loaded from a file that was
    replaced meanwhile are never filed under the new file's version."""
    path = tmp_path / "model.safetensors"
    save_file(make_model(0).state_dict(), str(path))
    new = make_model(1)
    load = example.load_safetensors
    calls = []

    def load_then_replace(uri, **options):
        state = load(uri, **options)
        calls.append(uri)
        if len(calls) == 1:           # the old weights are loaded; then the file changes
            save_file(new.state_dict(), str(path) + ".new")
            os.replace(str(path) + ".new", path)
        return state

    monkeypatch.setattr(example, "load_safetensors", load_then_replace)
    predictor = example.load_predictor(path)
    assert len(calls) == 2
    assert predictor.model_version == example.derive_model_version(path)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(predictor.model(x), new(x))

    def always_replace(uri, **options):
        state = load(uri, **options)
        save_file(make_model(len(calls)).state_dict(), str(path))
        calls.append(uri)
        return state

    calls.clear()
    monkeypatch.setattr(example, "load_safetensors", always_replace)
    with pytest.raises(OSError, match="the model changed during each of 3 loads"):
        example.load_predictor(path)
    assert len(calls) == 3
    # an explicit version is the caller's word: one load
    calls.clear()
    assert example.load_predictor(path, model_version="mine").model_version == "mine"
    assert len(calls) == 1


@pytest.mark.parametrize("state, message", [
    ({"0.weight": torch.ones(3, 4, dtype=torch.int64)}, "'0.weight' is int64"),
    ({"0.weight": torch.ones(3, 4).to(torch.float8_e4m3fn)}, "'0.weight' is float8_e4m3fn"),
    ({"00.weight": torch.ones(3, 4)}, "'00.weight': expected names"),
    # a Unicode digit: int() reads layer 3, which the Sequential names "3"
    ({"0.weight": torch.ones(3, 4), "\u0663.weight": torch.ones(2, 3)},
     "'\u0663.weight': expected names"),
    ({"0.weight": torch.ones(3, 4), "1.weight": torch.ones(2, 3, dtype=torch.float64)},
     "expected one dtype"),
])
def test_unusable_models_fail_with_one_line(state, message, tmp_path, monkeypatch, capsys):
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))

    def no_server(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(example, "make_server", no_server)
    assert example.main(["--model", str(path), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("server: model: ") and err.count("\n") == 1, err
    assert message in err


def test_the_model_through_a_tier_and_a_sharded_models_version(tmp_path, servers):
    # --tier reads the model through a tier (wharf's cache=): its file is kept there.
    model = make_model(2)
    state = model.state_dict()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[:3],
              "model-00002-of-00002.safetensors": names[3:]}
    src = tmp_path / "src"
    src.mkdir()

    def write(seed):
        s = make_model(seed).state_dict()
        for shard, keys in shards.items():
            save_file({k: s[k] for k in keys}, str(src / shard))

    write(2)
    index = src / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: shard for shard, keys in
                                                               shards.items() for k in keys}}))
    tier = tmp_path / "tier"
    srv = servers("--model", index, "--tier", tier)
    outcome, body = srv.predict({"inputs": [1, 2, 3, 4]})
    with torch.no_grad():
        assert body["outputs"] == pytest.approx(model(torch.tensor([[1.0, 2, 3, 4]])).tolist()[0],
                                                rel=1e-6, abs=1e-6)
    kept = [f for _, _, files in os.walk(tier / ".wharf" / "objects") for f in files]
    assert sorted(kept) == sorted([*shards, index.name]), kept
    version = body["model_version"]
    # New weights in the shards, the index unchanged: a new version, never an old prediction.
    write(3)
    assert example.derive_model_version(index) != version
