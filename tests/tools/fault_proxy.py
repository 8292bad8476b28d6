"""A fault-injecting HTTP/1.1 proxy for testing an S3 client's retry logic (stdlib only).

It sits between a client and a real S3 server (Ceph RGW), relays requests and responses byte for
byte over keep-alive connections (one upstream connection per client connection), and injects
faults that a test sets at run time. The request bytes, Host header included, are never rewritten:
SigV4 signs the Host header, so the client signs for the proxy's address and the server accepts it
only because RGW does not check which host the signature names against its own address.

Faults are rules, matched in order against each request; the first matching rule with count left
applies and its count drops by one:

    {"match": {"method": "GET",                # optional, case-insensitive
               "path_regex": "^/bucket/key$",  # optional, re.search on the path (before '?')
               "query_regex": "partNumber=2",  # optional, re.search on the query string
               "target_regex": "...",          # optional, re.search on path + '?' + query
               "headers": {"range": "^bytes=0-"}},  # optional, name -> re.search on its value
     "action": "status" | "reset" | "truncate" | "shorten" | "corrupt" | "delay" | "drop" |
               "lose",
     "count": 2,          # requests that get the fault (default 1; null = every match)
     "skip": 0,           # matching requests to let through untouched first (default 0)
     "probability": 1.0,  # share of the (otherwise eligible) matching requests that get the
                          # fault, drawn from random.Random(seed) per rule (default 1: all)
     "seed": 0,           # probability: the draw's seed, so a run is repeatable (default 0)
     # action parameters:
     "status": 503,       # status: 503 (S3 SlowDown XML), 500, 502, 504, 429 or any code
     "code": "SlowDown", "message": "...",  # status: override the XML error code/message
     "headers": {"Retry-After": "1"},       # status: extra response headers
     "close": false,      # status: also close the client connection after the answer
     "after_bytes": 0,    # reset/truncate/shorten: response bytes relayed after the header block;
                          # corrupt: the offset of the body byte that is flipped
                          # (raw bytes, so chunk framing counts for chunked responses)
     "delay_ms": 500,     # delay: hold the response this long after the upstream answered
     "phase": "response"} # delay: or "request" to hold the request before forwarding it

Actions:
  status    answer with the given status without forwarding (the request body is read and
            discarded; with "Expect: 100-continue" the connection is closed instead).
  reset     forward, relay the response header block and `after_bytes` body bytes, then close the
            client connection with RST (SO_LINGER 0).
  truncate  the same, but close with FIN: the client sees a short body.
  shorten   the same as truncate, with the response's Content-Length rewritten to `after_bytes`:
            a well-formed reply that is shorter than the object (a broken proxy's or server's).
  corrupt   forward and relay the whole response, with the body byte at `after_bytes` inverted
            (damage on the way that no length check can see).
  delay     forward, hold the response for `delay_ms`, then relay it.
  drop      close the client connection with RST as soon as the request head has arrived.
  lose      forward, wait for the server's answer (it acted on the request), then close the
            client connection with RST before relaying any of it: a reply lost on the way.

Control endpoint (JSON over HTTP, separate port):
  POST /faults            replace the rules (a list, or one rule); POST /faults?append=1 appends
  GET /faults             the rules with their remaining counts
  DELETE /faults          remove every rule
  GET /log                every request seen: seq, time, client, method, target, host, fault
                          (action or null), rule (index or null), status (final status relayed
                          or injected), bytes_relayed (response body bytes sent to the client)
  POST /reset             remove the rules and clear the log

From pytest:
    with FaultProxy("127.0.0.1:17080") as proxy:
        proxy.set_faults([{"match": {"method": "GET"}, "action": "status", "status": 503,
                           "count": 2}])
        client = make_s3_client(endpoint=proxy.url)
        ...
        assert [e["fault"] for e in proxy.log()] == ["status", "status", None]

As a script:
    python3 fault_proxy.py --upstream 127.0.0.1:17080 --listen 127.0.0.1:0 --control 127.0.0.1:0
prints "listening on HOST:PORT" and "control on HOST:PORT" and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import email.utils
import fcntl
import http
import json
import random
import re
import signal
import socket
import struct
import sys
import termios
import threading
import time
import urllib.parse
from typing import Any, Optional

_IO_SIZE = 256 * 1024
_HEAD_LIMIT = 1 << 20  # longest header block accepted
_LOG_LIMIT = 100_000

ACTIONS = ("status", "reset", "truncate", "shorten", "corrupt", "delay", "drop", "lose")

# S3-style error codes for injected statuses (S3 itself sends 500 InternalError and 503 SlowDown;
# the others stand for what load balancers and other stores answer).
S3_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    502: ("BadGateway", "The gateway received an invalid response (injected by fault_proxy)."),
    503: ("SlowDown", "Please reduce your request rate."),
    504: ("GatewayTimeout", "The gateway timed out (injected by fault_proxy)."),
    429: ("TooManyRequests", "Too many requests; please slow down."),
}


class ProtocolError(Exception):
    """Malformed HTTP from either side; the connection is closed."""


# ---- Fault rules and shared state ---------------------------------------------------------


class Rule:
    def __init__(self, spec: dict[str, Any]):
        if not isinstance(spec, dict):
            raise ValueError(f"a fault must be a JSON object, got {spec!r}")
        unknown = set(spec) - {"match", "action", "count", "skip", "status", "code", "message",
                               "headers", "close", "after_bytes", "delay_ms", "phase",
                               "probability", "seed"}
        if unknown:
            raise ValueError(f"unknown fault fields {sorted(unknown)}")
        self.spec = copy.deepcopy(spec)
        match = spec.get("match") or {}
        unknown = set(match) - {"method", "path_regex", "query_regex", "target_regex", "headers"}
        if unknown:
            raise ValueError(f"unknown match fields {sorted(unknown)}")
        self.method = match.get("method", "").upper() or None
        self.path_re = re.compile(match["path_regex"]) if "path_regex" in match else None
        self.query_re = re.compile(match["query_regex"]) if "query_regex" in match else None
        self.target_re = re.compile(match["target_regex"]) if "target_regex" in match else None
        self.header_res = {k.lower(): re.compile(v)
                           for k, v in (match.get("headers") or {}).items()}
        self.action = spec.get("action")
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")
        count = spec.get("count", 1)
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ValueError("count must be a positive integer or null (unlimited)")
        self.remaining: Optional[int] = count
        self.skip = int(spec.get("skip", 0))
        self.probability = float(spec.get("probability", 1.0))
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError("probability must be between 0 and 1")
        self.rng = random.Random(spec.get("seed", 0))
        self.applied = 0
        self.status = int(spec.get("status", 503))
        self.after_bytes = int(spec.get("after_bytes", 0))
        if self.after_bytes < 0:
            raise ValueError("after_bytes must be >= 0")
        self.delay_ms = float(spec.get("delay_ms", 0))
        if self.action == "delay" and "delay_ms" not in spec:
            raise ValueError("delay needs delay_ms")
        self.phase = spec.get("phase", "response")
        if self.phase not in ("request", "response"):
            raise ValueError("phase must be 'request' or 'response'")
        self.close = bool(spec.get("close", False))
        self.extra_headers = dict(spec.get("headers") or {})
        default_code, default_message = S3_ERRORS.get(
            self.status, ("InjectedError", "Injected by fault_proxy."))
        self.code = spec.get("code", default_code)
        self.message = spec.get("message", default_message)

    def matches(self, method: str, path: str, query: str, target: str,
                headers: dict[str, str]) -> bool:
        if self.method and method.upper() != self.method:
            return False
        if self.path_re and not self.path_re.search(path):
            return False
        if self.query_re and not self.query_re.search(query):
            return False
        if self.target_re and not self.target_re.search(target):
            return False
        for name, pattern in self.header_res.items():
            if name not in headers or not pattern.search(headers[name]):
                return False
        return True

    def to_json(self) -> dict[str, Any]:
        out = copy.deepcopy(self.spec)
        out["remaining"] = self.remaining
        out["skip_left"] = self.skip
        out["applied"] = self.applied
        return out


class FaultState:
    """Rules and request log shared by the event loop and the controlling thread (a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._log: collections.deque[dict[str, Any]] = collections.deque(maxlen=_LOG_LIMIT)
        self._seq = 0

    def set_faults(self, specs, append: bool = False) -> int:
        if isinstance(specs, dict):
            specs = [specs]
        if not isinstance(specs, list):
            raise ValueError("faults must be a JSON list of objects (or one object)")
        rules = [Rule(s) for s in specs]  # validate all before changing anything
        with self._lock:
            self._rules = (self._rules if append else []) + rules
            return len(self._rules)

    def clear_faults(self) -> None:
        with self._lock:
            self._rules = []

    def reset(self) -> None:
        with self._lock:
            self._rules = []
            self._log.clear()

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_json() for r in self._rules]

    def log(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._log]

    def begin(self, method: str, target: str, headers: dict[str, str],
              client: str) -> tuple[Optional[Rule], dict[str, Any]]:
        """Picks the fault for a request (consuming a count) and opens its log entry."""
        path, _, query = target.partition("?")
        with self._lock:
            chosen = None
            index = None
            for i, rule in enumerate(self._rules):
                if rule.remaining == 0 or not rule.matches(method, path, query, target, headers):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                if rule.probability < 1.0 and rule.rng.random() >= rule.probability:
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                rule.applied += 1
                chosen, index = rule, i
                break
            self._seq += 1
            entry = {"seq": self._seq, "time": time.time(), "client": client, "method": method,
                     "target": target, "host": headers.get("host"),
                     "fault": chosen.action if chosen else None, "rule": index, "status": None,
                     "bytes_relayed": None}
            self._log.append(entry)
            return chosen, entry

    def update(self, entry: dict[str, Any], **fields: Any) -> None:
        with self._lock:
            entry.update(fields)


# ---- HTTP/1.1 framing ----------------------------------------------------------------------


class _BudgetSpent(Exception):
    pass


class _Sink:
    """Where relayed bytes go: a writer (None discards), optionally stopping after `limit`.
    `progress(sent)` runs before each write, so a log read by a client that has just received
    the last byte is already up to date."""

    def __init__(self, writer: Optional[asyncio.StreamWriter], limit: Optional[int] = None,
                 progress=None, flip_at: Optional[int] = None):
        self.writer = writer
        self.limit = limit
        self.progress = progress
        self.flip_at = flip_at  # a byte offset to invert (the corrupt action)
        self.sent = 0

    async def write(self, data: bytes) -> None:
        if self.limit is not None and self.sent + len(data) >= self.limit:
            data = data[: self.limit - self.sent]
            await self._put(data)
            raise _BudgetSpent()
        await self._put(data)

    async def _put(self, data: bytes) -> None:
        if self.flip_at is not None and self.sent <= self.flip_at < self.sent + len(data):
            i = self.flip_at - self.sent
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        self.sent += len(data)
        if self.progress is not None:
            self.progress(self.sent)
        if self.writer is not None and data:
            self.writer.write(data)
            await self.writer.drain()


async def _read_head(reader: asyncio.StreamReader) -> Optional[bytes]:
    """One header block including its final CRLFCRLF; None on a clean EOF before it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise ProtocolError("connection closed inside a header block") from e
    except asyncio.LimitOverrunError as e:
        raise ProtocolError("header block too long") from e
    return head


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """The start line and the headers (lower-case names; repeated ones joined with ', ')."""
    lines = head.decode("latin-1").split("\r\n")
    while lines and not lines[0]:  # tolerated empty lines before a request line (RFC 9112 2.2)
        lines.pop(0)
    if not lines:
        raise ProtocolError("empty header block")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line {line!r}")
        name = name.lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return lines[0], headers


def _is_chunked(headers: dict[str, str]) -> bool:
    codings = [c.strip().lower() for c in headers.get("transfer-encoding", "").split(",")]
    return codings[-1] == "chunked"


def _content_length(headers: dict[str, str]) -> Optional[int]:
    if "content-length" not in headers:
        return None
    values = {v.strip() for v in headers["content-length"].split(",")}
    if len(values) != 1 or not next(iter(values)).isdigit():
        raise ProtocolError(f"bad Content-Length {headers['content-length']!r}")
    return int(values.pop())


def _has_token(headers: dict[str, str], name: str, token: str) -> bool:
    return token in (t.strip().lower() for t in headers.get(name, "").split(","))


async def _relay_exact(reader: asyncio.StreamReader, sink: _Sink, n: int) -> None:
    while n > 0:
        data = await reader.read(min(n, _IO_SIZE))
        if not data:
            raise ProtocolError(f"connection closed with {n} body bytes outstanding")
        n -= len(data)
        await sink.write(data)


async def _relay_chunked(reader: asyncio.StreamReader, sink: _Sink) -> None:
    """Relays a chunked body as it is framed (sizes, extensions, trailers untouched)."""
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            raise ProtocolError("bad chunk size line") from e
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as e:
            raise ProtocolError(f"bad chunk size line {line!r}") from e
        await sink.write(line)
        if size == 0:
            while True:  # trailer section, ended by an empty line
                try:
                    trailer = await reader.readuntil(b"\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                    raise ProtocolError("bad chunked trailer") from e
                await sink.write(trailer)
                if trailer == b"\r\n":
                    return
        await _relay_exact(reader, sink, size + 2)  # data and its CRLF


async def _relay_until_eof(reader: asyncio.StreamReader, sink: _Sink) -> None:
    while True:
        data = await reader.read(_IO_SIZE)
        if not data:
            return
        await sink.write(data)


async def _relay_request_body(headers: dict[str, str], reader: asyncio.StreamReader,
                              sink: _Sink) -> None:
    if "transfer-encoding" in headers and _is_chunked(headers):
        await _relay_chunked(reader, sink)
    else:
        await _relay_exact(reader, sink, _content_length(headers) or 0)


def _request_has_body(headers: dict[str, str]) -> bool:
    return "transfer-encoding" in headers or (_content_length(headers) or 0) > 0


async def _abort(writer: asyncio.StreamWriter, flush: bool) -> None:
    """Closes with RST. With flush, first waits until what was written reached the peer (else the
    RST would discard bytes still queued in our kernel send buffer)."""
    transport = writer.transport
    sock = writer.get_extra_info("socket")
    if flush and not transport.is_closing():
        transport.set_write_buffer_limits(0)  # drain() now waits for an empty user-space buffer
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        if sock is not None:
            outq = struct.pack("i", 0)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    unacked = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ,
                                                             outq))[0]
                except OSError:
                    break
                if unacked == 0:
                    break
                await asyncio.sleep(0.001)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _error_response(rule: Rule, method: str, target: str, seq: int, close: bool) -> bytes:
    request_id = f"fault-proxy-{seq}"
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{rule.code}</Code>'
            f"<Message>{rule.message}</Message>"
            f"<Resource>{_xml_escape(target.partition('?')[0])}</Resource>"
            f"<RequestId>{request_id}</RequestId></Error>").encode()
    try:
        reason = "Slow Down" if rule.status == 503 else http.HTTPStatus(rule.status).phrase
    except ValueError:
        reason = "Injected"
    if method == "HEAD":
        body = b""
    lines = [f"HTTP/1.1 {rule.status} {reason}",
             f"Date: {email.utils.formatdate(usegmt=True)}",
             f"x-amz-request-id: {request_id}",
             "Content-Type: application/xml",
             f"Content-Length: {len(body)}",
             f"Connection: {'close' if close else 'keep-alive'}"]
    lines += [f"{k}: {v}" for k, v in rule.extra_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---- The proxy -----------------------------------------------------------------------------


class _ClientConnection:
    """One client connection and its upstream connection (opened on the first request)."""

    def __init__(self, server: "FaultProxyServer", reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.up_reader: Optional[asyncio.StreamReader] = None
        self.up_writer: Optional[asyncio.StreamWriter] = None
        self.aborted = False

    async def run(self) -> None:
        try:
            while True:
                head = await _read_head(self.reader)
                if head is None:
                    return
                if not await self._exchange(head):
                    return
        except (ProtocolError, ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self._close_upstream()
            if not self.aborted:
                self.writer.close()
                with contextlib.suppress(Exception):
                    await self.writer.wait_closed()

    def _close_upstream(self) -> None:
        if self.up_writer is not None:
            self.up_writer.close()
        self.up_reader = self.up_writer = None

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.up_writer is None or self.up_writer.is_closing() or self.up_reader.at_eof():
            self._close_upstream()
            host, port = self.server.upstream
            self.up_reader, self.up_writer = await asyncio.open_connection(
                host, port, limit=_HEAD_LIMIT)
        return self.up_reader, self.up_writer

    async def _exchange(self, head: bytes) -> bool:
        """Handles one request; returns whether the client connection stays open."""
        start, headers = _parse_head(head)
        parts = start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise ProtocolError(f"bad request line {start!r}")
        method, target, version = parts
        client_close = (_has_token(headers, "connection", "close") or
                        (version == "HTTP/1.0" and
                         not _has_token(headers, "connection", "keep-alive")))
        rule, entry = self.server.state.begin(method, target, headers, self.client)
        action = rule.action if rule else None

        if action == "drop":
            self.aborted = True
            await _abort(self.writer, flush=False)
            return False

        if action == "status":
            expects = _has_token(headers, "expect", "100-continue")
            has_body = _request_has_body(headers)
            # A client waiting for 100 Continue never sends the body: the framing is lost.
            close = client_close or rule.close or (expects and has_body)
            if has_body and not expects:
                await _relay_request_body(headers, self.reader, _Sink(None))
            self.server.state.update(entry, status=rule.status)
            self.writer.write(_error_response(rule, method, target, entry["seq"], close))
            await self.writer.drain()
            return not close

        if action == "delay" and rule.phase == "request":
            await asyncio.sleep(rule.delay_ms / 1000)

        up_reader, up_writer = await self._upstream()
        up_writer.write(head)
        await up_writer.drain()
        # The body goes up while the response is awaited: the server may answer 100 Continue
        # first (the client then sends the body) or a final status before reading it all.
        body_task = None
        if _request_has_body(headers):
            body_task = asyncio.ensure_future(
                _relay_request_body(headers, self.reader, _Sink(up_writer)))
        try:
            keep = await self._relay_response(method, rule, entry, up_reader)
            if body_task is not None:
                await body_task
                body_task = None
        finally:
            if body_task is not None:
                body_task.cancel()
                with contextlib.suppress(BaseException):
                    await body_task
        return keep and not client_close

    async def _relay_response(self, method: str, rule: Optional[Rule], entry: dict[str, Any],
                              up_reader: asyncio.StreamReader) -> bool:
        action = rule.action if rule else None
        while True:
            rhead = await _read_head(up_reader)
            if rhead is None:
                raise ConnectionError("upstream closed the connection before answering")
            status_line, rheaders = _parse_head(rhead)
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[1].isdigit():
                raise ProtocolError(f"bad status line {status_line!r}")
            status = int(parts[1])
            if 100 <= status < 200 and status != 101:
                self.writer.write(rhead)  # 100 Continue and other interim responses
                await self.writer.drain()
                continue
            break
        self.server.state.update(entry, status=status)
        if action == "lose":
            self._close_upstream()
            self.aborted = True
            await _abort(self.writer, flush=False)
            return False
        if action == "delay" and rule.phase == "response":
            await asyncio.sleep(rule.delay_ms / 1000)

        state = self.server.state
        state.update(entry, bytes_relayed=0)
        if action == "shorten" and _content_length(rheaders) is not None:
            rhead = re.sub(rb"(?im)^content-length:[^\r\n]*",
                           b"Content-Length: %d" % min(rule.after_bytes,
                                                       _content_length(rheaders)), rhead)
        self.writer.write(rhead)
        limit = rule.after_bytes if action in ("reset", "truncate", "shorten") else None
        sink = _Sink(self.writer, limit, lambda sent: state.update(entry, bytes_relayed=sent),
                     flip_at=rule.after_bytes if action == "corrupt" else None)
        upstream_close = (_has_token(rheaders, "connection", "close") or
                          (parts[0] == "HTTP/1.0" and
                           not _has_token(rheaders, "connection", "keep-alive")))
        try:
            if limit == 0:
                raise _BudgetSpent()
            if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                await self.writer.drain()
            elif "transfer-encoding" in rheaders and _is_chunked(rheaders):
                await _relay_chunked(up_reader, sink)
            elif _content_length(rheaders) is not None:
                await _relay_exact(up_reader, sink, _content_length(rheaders))
            else:  # delimited by the server closing the connection
                upstream_close = True
                await _relay_until_eof(up_reader, sink)
            await self.writer.drain()
        except _BudgetSpent:
            self._close_upstream()  # the rest of the response is abandoned

        if action in ("truncate", "shorten"):
            self._close_upstream()
            await self.writer.drain()
            return False  # run() closes the client connection with FIN
        if action == "reset":
            self._close_upstream()
            self.aborted = True
            await _abort(self.writer, flush=True)
            return False
        if upstream_close:
            self._close_upstream()
            return False  # the client saw "Connection: close" (or HTTP/1.0) and will close too
        return True


class FaultProxyServer:
    """The proxy and its control endpoint on one asyncio event loop."""

    def __init__(self, upstream: str, listen: str = "127.0.0.1:0",
                 control: str = "127.0.0.1:0", state: Optional[FaultState] = None):
        self.upstream = _split_address(upstream)
        self._listen = _split_address(listen)
        self._control = _split_address(control)
        self.state = state or FaultState()
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: set[asyncio.Task] = set()
        self.address: tuple[str, int] = ("", 0)
        self.control_address: tuple[str, int] = ("", 0)

    async def start(self) -> None:
        proxy = await asyncio.start_server(self._on_client, *self._listen, limit=_HEAD_LIMIT,
                                           backlog=1024)
        control = await asyncio.start_server(self._on_control, *self._control, limit=_HEAD_LIMIT)
        self._servers = [proxy, control]
        self.address = proxy.sockets[0].getsockname()[:2]
        self.control_address = control.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)

    def _track(self) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_client(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        self._track()
        # Cancelled only by stop(); finishing normally keeps asyncio's stream callback from
        # logging the cancellation as an error (Python 3.11).
        with contextlib.suppress(asyncio.CancelledError):
            await _ClientConnection(self, reader, writer).run()

    async def _on_control(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self._track()
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                start, headers = _parse_head(head)
                method, target = (start.split(" ") + ["", ""])[:2]
                body = await reader.readexactly(_content_length(headers) or 0)
                status, payload = self._control_request(method, target, body)
                data = json.dumps(payload, indent=1).encode()
                close = _has_token(headers, "connection", "close")
                writer.write((f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
                              "Content-Type: application/json\r\n"
                              f"Content-Length: {len(data)}\r\n"
                              f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
                              ).encode() + data)
                await writer.drain()
                if close:
                    return
        except (ProtocolError, ConnectionError, asyncio.IncompleteReadError,
                asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def _control_request(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qs(url.query)
        try:
            if url.path == "/faults" and method in ("POST", "PUT"):
                append = query.get("append", ["0"])[0] not in ("0", "false", "")
                n = self.state.set_faults(json.loads(body or b"[]"), append=append)
                return 200, {"faults": n}
            if url.path == "/faults" and method == "GET":
                return 200, self.state.faults()
            if url.path == "/faults" and method == "DELETE":
                self.state.clear_faults()
                return 200, {"faults": 0}
            if url.path == "/log" and method == "GET":
                return 200, self.state.log()
            if url.path == "/reset" and method == "POST":
                self.state.reset()
                return 200, {"reset": True}
            if url.path == "/health":
                return 200, {"ok": True}
        except (ValueError, re.error) as e:  # json.JSONDecodeError is a ValueError
            return 400, {"error": str(e)}
        return 404, {"error": f"no such control endpoint: {method} {url.path}"}


def _split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {text!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


class FaultProxy:
    """Runs a FaultProxyServer on its own event loop in a background thread (for pytest).

    Thread-safety: every method may be called from any thread.
    """

    def __init__(self, upstream: str, listen: str = "127.0.0.1:0",
                 control: str = "127.0.0.1:0"):
        self.state = FaultState()
        self._server = FaultProxyServer(upstream, listen, control, self.state)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped: Optional[asyncio.Event] = None

    def start(self) -> "FaultProxy":
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            self._stopped = asyncio.Event()
            try:
                await self._server.start()
            except BaseException as e:
                failure.append(e)
                ready.set()
                return
            ready.set()
            await self._stopped.wait()
            await self._server.stop()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(main())
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._loop.is_running() and self._stopped is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return self._server.address[0]

    @property
    def port(self) -> int:
        return self._server.address[1]

    @property
    def url(self) -> str:
        """The endpoint a client should use instead of the upstream's."""
        return f"http://{self.host}:{self.port}"

    @property
    def control_url(self) -> str:
        host, port = self._server.control_address
        return f"http://{host}:{port}"

    def set_faults(self, faults) -> None:
        """Replaces the rules (see the module doc for their shape)."""
        self.state.set_faults(faults)

    def add_faults(self, faults) -> None:
        self.state.set_faults(faults, append=True)

    def clear_faults(self) -> None:
        self.state.clear_faults()

    def faults(self) -> list[dict[str, Any]]:
        return self.state.faults()

    def log(self) -> list[dict[str, Any]]:
        """Every request seen, oldest first (the fault applied, if any, and the final status)."""
        return self.state.log()

    def reset(self) -> None:
        self.state.reset()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the real server")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT for clients")
    parser.add_argument("--control", default="127.0.0.1:0", help="HOST:PORT of the control API")
    parser.add_argument("--faults", help="initial rules, as JSON")
    args = parser.parse_args(argv)

    async def run() -> None:
        server = FaultProxyServer(args.upstream, args.listen, args.control)
        if args.faults:
            server.state.set_faults(json.loads(args.faults))
        await server.start()
        print(f"listening on {server.address[0]}:{server.address[1]}", flush=True)
        print(f"control on {server.control_address[0]}:{server.control_address[1]}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()

    try:
        asyncio.run(run())
    except (ValueError, OSError) as e:
        print(f"fault_proxy: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
