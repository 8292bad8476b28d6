"""A small inference service: a model loaded with wharf (from the bucket, a file, or through a
tier) answering through wharf's prediction cache. Standard library HTTP (ThreadingHTTPServer).

    python examples/serving/server.py --model s3://models/mlp/model.safetensors \\
        --tier /nvme/tier --cache redis://127.0.0.1:17379/0 --ttl 3600 --port 8080
    curl -s -D- localhost:8080/predict -d '{"inputs": [0.1, 0.2, 0.3, 0.4]}'

Endpoints:
  POST /predict   {"inputs": [floats]} (one example) or {"inputs": [[floats], ...]} (a batch)
                  -> {"outputs": [...], "model_version": "..."}; the header X-Wharf-Cache says
                  hit, miss (computed for this request) or coalesced (it waited for an
                  identical request's compute). 400 for a body that is not such a request,
                  422 when the model's outputs for it are not finite (inputs overflowing its
                  float32 arithmetic), 500 if the model fails; none of these is cached.
  GET /healthz    {"status": "ok", "model_version": ..., "cache": ...}
  GET /metrics    the runtime's metrics (wharf.metrics()) in the Prometheus text format

The model: any state dict of a torch.nn.Sequential of Linear layers with activations between
them, saved with safetensors (`safetensors.torch.save_file(seq.state_dict(), path)`): tensors
named "<i>.weight" ([out, in]) and optionally "<i>.bias" ([out]), where i is the layer's index
in the Sequential, all of one dtype (float32, float64, float16 or bfloat16). The gaps between
the indices of consecutive Linear layers are ReLUs, as in Sequential(Linear, ReLU, Linear, ...)
(indices 0, 2, ...).

Library use (python/wharf/demo.py): `serve_in_thread(model_uri, cache=...)` starts the
service on a free loopback port in a thread and returns a handle with .url and .close().
"""
import argparse
import array
import hashlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import torch

import wharf
from wharf.serve import PredictionCache, load_safetensors

MAX_BODY = 1 << 20
# ASCII digits without leading zeros: "00.weight" or "\u0663.weight" would name layer 0 or 3
# to int() but not to the Sequential's load_state_dict.
_NAME = re.compile(r"(0|[1-9][0-9]*)\.(weight|bias)")
# The dtypes a Linear layer computes in on the CPU (no integer or float8 kernels).
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Loads retried when the model's files change during one (see load_predictor).
LOAD_ATTEMPTS = 3


class Unprocessable(ValueError):
    """A valid request the model cannot answer (its outputs are not finite): 422."""


# ------------------------------------------------------------------------------------ model
def build_model(state_dict):
    """A torch.nn.Sequential of Linear layers (ReLU in the index gaps) holding `state_dict`'s
    tensors: see the module's docstring for the names it expects. Raises ValueError naming
    what does not fit."""
    layers, first = {}, None
    for name, tensor in state_dict.items():
        m = _NAME.fullmatch(name)
        if not m:
            raise ValueError(f"model: tensor {name!r}: expected names '<index>.weight' and "
                             f"'<index>.bias' (the state dict of a torch.nn.Sequential of "
                             f"Linear layers)")
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"model: tensor {name!r} is {_dtype_name(tensor.dtype)}: expected "
                             f"float32, float64, float16 or bfloat16")
        if first is None:
            first = name, tensor.dtype
        elif tensor.dtype != first[1]:
            raise ValueError(f"model: tensor {name!r} is {_dtype_name(tensor.dtype)} and "
                             f"{first[0]!r} {_dtype_name(first[1])}: expected one dtype")
        layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
    if not layers:
        raise ValueError("model: no tensors")
    modules, prev_out, last = [], None, -1
    for index in sorted(layers):
        params = layers[index]
        w, b = params.get("weight"), params.get("bias")
        if w is None or w.dim() != 2:
            raise ValueError(f"model: layer {index}: expected a 2-d '{index}.weight' [out, in]")
        out_features, in_features = w.shape
        if b is not None and tuple(b.shape) != (out_features,):
            raise ValueError(f"model: layer {index}: bias shape {tuple(b.shape)}, expected "
                             f"({out_features},)")
        if prev_out is not None and in_features != prev_out:
            raise ValueError(f"model: layer {index} takes {in_features} inputs, the layer "
                             f"before gives {prev_out}")
        if not modules and index > 0:
            raise ValueError(f"model: the first layer's index is {index}, expected 0")
        modules += [torch.nn.ReLU() for _ in range(index - last - 1)]  # the activations
        linear = torch.nn.Linear(in_features, out_features, bias=b is not None, dtype=w.dtype)
        modules.append(linear)
        prev_out, last = out_features, index
    model = torch.nn.Sequential(*modules)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def derive_model_version(uri, **store_options):
    """A version string that changes when the model's bytes do: the file's name and a hash of
    the URI, ETag and size of each file (read with HEADs, through the tier when store_options
    has cache=): the file itself, or for a sharded model's index JSON the index and every
    shard it names, so replacing a shard under an unchanged index is a new version."""
    uri = _as_uri(uri)
    parent, _, name = uri.rpartition("/")
    store = wharf.Store(parent + "/", **store_options)
    files = [name]
    if name.endswith(".json"):
        index = json.loads(bytes(store.get(name)))
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{uri}: not a safetensors index (its 'weight_map' is not an "
                             f"object of tensor names to shard file names)")
        files += sorted(set(weight_map.values()))
    h = hashlib.sha256()
    for f in files:
        info = store.head(f)
        h.update(f"{parent}/{f}\0{info['etag']}\0{info['size']}\0".encode())
    return f"{name}@{h.hexdigest()[:16]}"


def _dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def _finite(x):
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float range
        return False


def _as_uri(path_or_uri):
    s = os.fspath(path_or_uri)
    return s if "://" in s else "file://" + os.path.abspath(s)


class Predictor:
    """Answers requests through the prediction cache. Thread-safe (torch inference under
    no_grad is; the cache is)."""

    def __init__(self, model, model_version, cache):
        self.model = model
        self.model_version = model_version
        self.cache = cache
        first = next(m for m in model if isinstance(m, torch.nn.Linear))
        self.in_features = first.in_features
        self.dtype = first.weight.dtype

    def validate(self, request):
        """The request's inputs as a list of rows, or ValueError saying what is wrong."""
        if not isinstance(request, dict) or set(request) != {"inputs"}:
            raise ValueError('expected a JSON object {"inputs": [numbers]} or '
                             '{"inputs": [[numbers], ...]}')
        inputs = request["inputs"]
        rows = inputs if inputs and isinstance(inputs, list) and isinstance(inputs[0], list) \
            else [inputs]
        for row in rows:
            if (not isinstance(row, list) or len(row) != self.in_features
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                               for x in row)):
                raise ValueError(f"inputs: expected {self.in_features} numbers per example")
            # NaN, Infinity and numbers beyond float range (1e400) parse in Python's JSON, but
            # their outputs would not be JSON.
            if not all(_finite(x) for x in row):
                raise ValueError("inputs: every number must be finite")
        return rows

    def _compute(self, rows, batched):
        with torch.no_grad():
            out = self.model(torch.tensor(rows, dtype=self.dtype))
        if not bool(torch.isfinite(out).all()):
            # Finite float64 inputs can overflow a float32 (or float16) model: its NaN and
            # infinities are not JSON, and an exception here is not cached.
            raise Unprocessable(f"outputs: not finite for these inputs (they overflow the "
                                f"model's {_dtype_name(self.dtype)} arithmetic)")
        outputs = out.tolist() if batched else out[0].tolist()
        return json.dumps({"outputs": outputs, "model_version": self.model_version}).encode()

    def predict(self, request):
        """(response bytes, "hit" | "miss" | "coalesced"): see PredictionCache.get_or_compute's
        with_outcome. ValueError for an invalid request (checked before the cache, so nothing
        invalid is cached or looked up); Unprocessable, a ValueError, for a request whose
        outputs are not finite (not cached)."""
        rows = self.validate(request)
        batched = bool(request["inputs"]) and isinstance(request["inputs"][0], list)
        # The cache key: the numbers as float64 bytes (and the shape), not the request's JSON:
        # 1 and 1.0 are one input, and packing 1,024 floats takes ~12 us where canonical JSON
        # of them takes ~340 us (float formatting).
        try:
            key = b"%d:%d:" % (len(rows) if batched else 0, self.in_features) + \
                b"".join([array.array("d", row).tobytes() for row in rows])
        except OverflowError:
            raise ValueError("inputs: a number beyond the float range") from None
        return self.cache.get_or_compute(self.model_version, key,
                                         lambda _key: self._compute(rows, batched),
                                         with_outcome=True)


def load_predictor(model_uri, cache="memory", *, ttl=None, max_bytes=None, model_version=None,
                   tier=None, **store_options):
    """Loads the model with wharf.serve.load_safetensors (through the tier `tier` when given;
    store_options: endpoint=, ...) and opens the prediction cache `cache` (a backend name:
    "memory", a directory, redis://...).

    The derived version is read before and after the load and the load retried until the two
    agree (LOAD_ATTEMPTS), so that weights are never filed under the version of a file that
    replaced them during the load: a shared cache would serve their predictions as the new
    model's. An explicit model_version is the caller's word and is not checked."""
    if tier is not None:
        store_options = dict(store_options, cache=os.fspath(tier))  # wharf's name for it
    uri = _as_uri(model_uri)
    for _ in range(LOAD_ATTEMPTS):
        version = model_version or derive_model_version(uri, **store_options)
        t0 = time.perf_counter()
        state = load_safetensors(uri, **store_options)
        load_s = time.perf_counter() - t0
        if model_version or derive_model_version(uri, **store_options) == version:
            break
    else:
        raise OSError(f"{uri}: the model changed during each of {LOAD_ATTEMPTS} loads; load it "
                      f"when it is not being replaced, or pass its model_version")
    model = build_model(state)
    predictor = Predictor(model, version, PredictionCache(cache, ttl=ttl, max_bytes=max_bytes))
    predictor.load_seconds = load_s
    return predictor


# ------------------------------------------------------------------------------------- HTTP
_ROUTES = {"/predict": "POST", "/healthz": "GET", "/metrics": "GET"}  # path -> its method


_DIGITS = re.compile(r"[0-9]{1,19}")


def make_handler(predictor, verbose=False, in_flight=None):
    in_flight = in_flight if in_flight is not None else _InFlight()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "wharf-serving-example/1"
        # A client that stops sending (a partial head or body) frees its thread after this
        # many seconds; so does an idle keep-alive connection.
        timeout = 30

        def _send(self, status, body, content_type="application/json", headers=()):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status, message):
            self._send(status, json.dumps({"error": message}).encode())

        def _route(self, method):
            """True when this request is for `method`; else answers 404, or 405 for a path
            served with another method. The query string is ignored."""
            path = urlsplit(self.path).path
            allowed = _ROUTES.get(path)
            if allowed is not None and (allowed == method or
                                        (allowed == "GET" and self.command == "HEAD")):
                return True
            self.close_connection = True  # a body it may have is not read
            if allowed is None:
                self._error(404, f"no such path {path}")
            else:
                self._send(405, json.dumps({"error": f"{path}: use {allowed}"}).encode(),
                           headers=[("Allow", allowed)])
            return False

        def _other(self):
            """A method no path takes (PUT, DELETE, ...): 404, or 405 naming the method the
            path takes."""
            self._route(None)

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _other

        def do_HEAD(self):  # GET's headers (load balancers' health checks)
            self.do_GET()

        def do_GET(self):
            if not self._route("GET"):
                return
            if urlsplit(self.path).path == "/healthz":
                self._send(200, json.dumps({"status": "ok",
                                            "model_version": predictor.model_version,
                                            "cache": predictor.cache.backend}).encode())
            else:
                self._send(200, wharf.metrics_text().encode(), "text/plain; version=0.0.4")

        def do_POST(self):
            with in_flight:  # from its head on: a stop waits for its answer
                self._post()

        def _post(self):
            if not self._route("POST"):
                return
            # The body's framing must be unambiguous, else bytes of the body would be read as
            # the next request on this connection (and a proxy in front could disagree).
            # Any refusal here closes the connection: the body is never read.
            lengths = self.headers.get_all("Content-Length") or []
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = True
                self._error(400, "Transfer-Encoding is not supported: send Content-Length")
                return
            if not lengths:
                self.close_connection = True
                self._error(411, "Content-Length required")
                return
            if len(set(v.strip() for v in lengths)) > 1 or not _DIGITS.fullmatch(lengths[0].strip()):
                self.close_connection = True
                self._error(400, "Content-Length must be one whole number of bytes")
                return
            length = int(lengths[0].strip())
            if length > MAX_BODY:
                self.close_connection = True
                self._error(413, f"body over {MAX_BODY} bytes")
                return
            try:
                request = json.loads(self.rfile.read(length))
            except ValueError as e:  # json.JSONDecodeError is one
                self._error(400, str(e))
                return
            except RecursionError:  # the parser recurses once per [ or {
                self._error(400, "the body's JSON is nested too deeply")
                return
            try:
                body, outcome = predictor.predict(request)
            except Unprocessable as e:
                self._error(422, str(e))
                return
            except ValueError as e:
                self._error(400, str(e))
                return
            except Exception as e:  # the model failed: the request fails, the server does not
                self._error(500, f"{type(e).__name__}: {e}")
                return
            self._send(200, body, headers=[("X-Wharf-Cache", outcome),
                                           ("X-Wharf-Model-Version", predictor.model_version)])

        def log_message(self, fmt, *args):
            if verbose:
                super().log_message(fmt, *args)

    return Handler


class _InFlight:
    """Requests being answered (a context manager around each), and a wait for none."""

    def __init__(self):
        self._n = 0
        self._idle = threading.Condition()

    def __enter__(self):
        with self._idle:
            self._n += 1

    def __exit__(self, *exc):
        with self._idle:
            self._n -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout):
        with self._idle:
            return self._idle.wait_for(lambda: self._n == 0, timeout)


class _Server(ThreadingHTTPServer):
    # The stdlib's backlog of 5 reset connections of a burst of clients.
    request_queue_size = 128
    daemon_threads = True  # idle keep-alive connections do not hold the exit


def make_server(predictor, host="127.0.0.1", port=0, verbose=False):
    """The HTTP server; .in_flight counts the requests being answered. OSError when the
    address cannot be bound."""
    in_flight = _InFlight()
    try:
        server = _Server((host, port), make_handler(predictor, verbose, in_flight))
    except OverflowError as e:  # a port beyond 65535
        raise OSError(f"cannot listen on {host}:{port}: {e}") from None
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.in_flight = in_flight
    return server


class Service:
    """A server running in a thread (serve_in_thread); .url, .predictor, .close()."""

    def __init__(self, server, predictor):
        self.server, self.predictor = server, predictor
        host, port = server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=server.serve_forever, name="wharf-serving",
                                       daemon=True)
        self.thread.start()

    def close(self, drain_seconds=30.0):
        """Stops accepting, lets the requests being answered finish (up to drain_seconds),
        then closes."""
        self.server.shutdown()
        self.server.in_flight.wait_idle(drain_seconds)
        self.server.server_close()
        self.thread.join()
        self.predictor.cache.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve_in_thread(model_uri, cache="memory", *, ttl=None, max_bytes=None, model_version=None,
                    tier=None, host="127.0.0.1", port=0, **store_options):
    """Loads the model (through `tier` when given), starts the service in a thread on
    host:port (0: a free port)."""
    predictor = load_predictor(model_uri, cache, ttl=ttl, max_bytes=max_bytes,
                               model_version=model_version, tier=tier, **store_options)
    return Service(make_server(predictor, host, port), predictor)


def main(argv=None):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--model", required=True,
                   help="the model's safetensors file: s3://..., gs://..., file://... or a path")
    p.add_argument("--tier", help="read the model through this tier (wharf's cache= option)")
    p.add_argument("--cache", default="memory",
                   help="prediction cache: memory, a directory, or redis://HOST:PORT/DB")
    p.add_argument("--ttl", type=float, help="seconds a prediction is served (default: no expiry)")
    p.add_argument("--max-bytes", help="cache bound, e.g. 256M (memory, directory)")
    p.add_argument("--model-version",
                   help="the cache's model version (default: from the file's name, ETag, size)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0: a free port")
    p.add_argument("--verbose", action="store_true", help="log each request")
    args = p.parse_args(argv)
    try:
        predictor = load_predictor(args.model, args.cache, ttl=args.ttl, max_bytes=args.max_bytes,
                                   model_version=args.model_version, tier=args.tier)
    except (OSError, ValueError) as e:  # wharf.WharfError is an OSError
        print(f"server: {e}", file=sys.stderr)
        return 1
    try:
        server = make_server(predictor, args.host, args.port, args.verbose)
    except OSError as e:
        print(f"server: {e}", file=sys.stderr)
        predictor.cache.close()
        return 1
    host, port = server.server_address[:2]
    print(f"serving {args.model} (version {predictor.model_version}, loaded in "
          f"{predictor.load_seconds * 1e3:.0f} ms) with cache {predictor.cache.backend} "
          f"on http://{host}:{port}", flush=True)

    # SIGTERM (a container's stop, a supervisor) and SIGINT stop accepting, let the requests
    # being answered finish, then exit 0.
    def stop(signum, _frame):
        print(f"server: {signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        if not server.in_flight.wait_idle(30.0):
            print("server: requests still running after 30 s: exiting anyway", file=sys.stderr)
        server.server_close()
        predictor.cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
