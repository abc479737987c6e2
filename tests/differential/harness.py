"""The machinery of the differential suite: servers, raw TCP scripts, raw HTTP, and the
normalisation that leaves only what Go's nsqd has and what Go answers deterministically.

Nothing here knows what the right answer is: Go's nsqd is the oracle, every comparison is
"the same bytes went to both, did the same come back".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import NSQD, NSQLookupd
from nsqpy.testing._process import flag_args
from tests.support.procs import nsqd_workers, server_python

# -- where the Go binaries are ----------------------------------------------------------------

# <repo root>/../shared/ref/nsq-go, the layout of a developer's machine and of CI;
# NSQPY_GO_NSQ_DIR overrides it.
GO_DIR = Path(
    os.environ.get(
        "NSQPY_GO_NSQ_DIR",
        Path(__file__).resolve().parents[3] / "shared" / "ref" / "nsq-go",
    )
)


def go_binary(name: str) -> Path | None:
    """The Go binary ``name`` if it is there and executable."""
    path = GO_DIR / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_go(*names: str) -> None:
    """Skip without Go's binaries; in CI, where a skip is a failure, say why plainly."""
    missing = [name for name in names if go_binary(name) is None]
    if not missing:
        return
    message = (
        f"Go NSQ binaries {missing} not found in {GO_DIR} (expected at "
        "<repo root>/../shared/ref/nsq-go/, or set NSQPY_GO_NSQ_DIR)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def seed(default: int) -> int:
    """The test's seed: ``NSQPY_DIFF_SEED`` if set, else its fixed default."""
    return int(os.environ.get("NSQPY_DIFF_SEED", default))


def examples(default: int) -> int:
    """How many generated cases: ``NSQPY_DIFF_EXAMPLES`` if set, else ``default``."""
    return int(os.environ.get("NSQPY_DIFF_EXAMPLES", default))


# -- servers ----------------------------------------------------------------------------------

# The same flags for both nsqd: limits small enough that max and max+1 cost nothing.
MAX_MSG_SIZE = 1024
MAX_BODY_SIZE = 4096
MAX_RDY_COUNT = 50
MAX_REQ_TIMEOUT_MS = 600_000
MAX_MSG_TIMEOUT_MS = 900_000
MAX_HEARTBEAT_MS = 60_000
NSQD_FLAGS: dict[str, object] = {
    "max_msg_size": MAX_MSG_SIZE,
    "max_body_size": MAX_BODY_SIZE,
    "max_rdy_count": MAX_RDY_COUNT,
    "max_req_timeout": f"{MAX_REQ_TIMEOUT_MS // 1000}s",
    "max_msg_timeout": f"{MAX_MSG_TIMEOUT_MS // 1000}s",
    # Both derive the node id from the hostname; pinned so that nothing depends on it.
    "node_id": 7,
}


class PyNSQD(NSQD):
    """nsqpy's nsqd, ready once both its TCP and HTTP listeners have logged; run by
    NSQPY_SERVER_PYTHON when set (the compiled wheel's venv, tests/support/procs.py)."""

    ready = ("tcp", "http")

    @property
    def argv(self) -> list[str]:
        argv = super().argv
        return [server_python(), "-P", *argv[1:4], *nsqd_workers("nsqd"), *argv[4:]]


class GoNSQD(NSQD):
    """Go's nsqd binary run by nsqpy.testing's machinery: same flags, same log lines."""

    name = "go-nsqd"
    ready = ("tcp", "http")  # Go logs TCP first, then HTTP

    @property
    def argv(self) -> list[str]:
        return [str(GO_DIR / "nsqd"), *flag_args(self.flags), *self.args]


class GoNSQLookupd(NSQLookupd):
    """Go's nsqlookupd binary."""

    name = "go-nsqlookupd"

    @property
    def argv(self) -> list[str]:
        return [str(GO_DIR / "nsqlookupd"), *flag_args(self.flags), *self.args]


@dataclass
class Pair:
    """One Go nsqd and one nsqpy nsqd, started with the same flags."""

    go: NSQD
    py: NSQD

    def both(self) -> tuple[tuple[str, NSQD], tuple[str, NSQD]]:
        return (("go", self.go), ("py", self.py))


def start_pair(**flags: object) -> Pair:
    """Start Go's and nsqpy's nsqd side by side; both are closed if either fails."""
    go = GoNSQD(**{**NSQD_FLAGS, **flags})
    py = PyNSQD(**{**NSQD_FLAGS, **flags})
    try:
        go.spawn()
        py.spawn()
        go.wait_ready()
        py.wait_ready()
    except BaseException:
        close_all(go, py)
        raise
    return Pair(go, py)


def close_all(*servers: Any) -> None:
    """Close every server (stopping its process by its PID), even if one fails to."""
    errors: list[BaseException] = []
    for server in servers:
        try:
            server.close()
        except BaseException as err:  # the others are closed all the same
            errors.append(err)
    if errors:
        raise errors[0]


# -- raw TCP V2 scripts ------------------------------------------------------------------------

MAGIC = b"  V2"
RESPONSE, ERROR, MESSAGE = 0, 1, 2
HEARTBEAT = b"_heartbeat_"


def int32(n: int) -> bytes:
    return struct.pack(">i", n)


def command(line: bytes, body: bytes | None = None) -> bytes:
    """``line`` + ``\\n`` and, with ``body``, its 4-byte size and the body."""
    return line + b"\n" + (b"" if body is None else int32(len(body)) + body)


def mpub_payload(bodies: Iterable[bytes]) -> bytes:
    items = list(bodies)
    return int32(len(items)) + b"".join(int32(len(b)) + b for b in items)


@dataclass(frozen=True)
class Frame:
    type: int
    data: bytes

    def norm(self) -> tuple[object, ...]:
        """What is compared: errors and responses byte for byte (JSON parsed), messages
        without their ID and timestamp (each server makes its own)."""
        if self.type == MESSAGE:
            attempts = struct.unpack(">H", self.data[8:10])[0] if len(self.data) >= 26 else None
            return ("message", attempts, self.data[26:])
        if self.type == RESPONSE and self.data.startswith(b"{"):
            with contextlib.suppress(ValueError):
                return ("response-json", json.loads(self.data))
        return ({RESPONSE: "response", ERROR: "error"}.get(self.type, self.type), self.data)

    @property
    def message_id(self) -> bytes:
        return self.data[10:26]


@dataclass
class Transcript:
    """What a server sent back on one connection, and how the connection ended."""

    frames: list[Frame] = field(default_factory=list)
    closed: bool = False  # the server closed the connection (else: still open at the end)
    partial: bytes = b""  # bytes of an unfinished frame when it closed

    def norm(self) -> dict[str, object]:
        return {
            "frames": [f.norm() for f in self.frames if f.data != HEARTBEAT],
            "closed": self.closed,
            "partial": self.partial,
        }


def parse_frames(buf: bytearray) -> list[Frame]:
    frames = []
    while len(buf) >= 4:
        (size,) = struct.unpack(">i", buf[:4])
        if size < 4 or len(buf) < 4 + size:
            break
        frame_type = struct.unpack(">i", buf[4:8])[0]
        frames.append(Frame(frame_type, bytes(buf[8 : 4 + size])))
        del buf[: 4 + size]
    return frames


class TCPConn:
    """One raw connection to nsqd: sends bytes as asked, reads frames with deadlines."""

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.transcript = Transcript()
        self.send_failed = False

    def send(self, data: bytes) -> None:
        """Send ``data``; once the server has closed, the rest is dropped (and noted)."""
        if self.send_failed:
            return
        try:
            self.sock.sendall(data)
        except OSError:
            self.send_failed = True

    def send_pieces(self, pieces: Iterable[bytes]) -> None:
        for piece in pieces:
            self.send(piece)

    def half_close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def fill(self, deadline: float) -> bool:
        """Read once; False at EOF or the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.transcript.closed = True
            self.transcript.partial = bytes(self.buf)
            return False
        self.buf += data
        self.transcript.frames.extend(parse_frames(self.buf))
        return True

    def read_until(self, done: Callable[[list[Frame]], bool], timeout: float | None = None) -> bool:
        """Read until ``done(frames so far)``, the server closes, or the deadline; True
        if ``done`` was reached."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if done(self.transcript.frames):
                return True
            if self.transcript.closed or not self.fill(deadline):
                return done(self.transcript.frames)

    def read_to_close(self, timeout: float | None = None) -> Transcript:
        """Everything until the server closes the connection (or the deadline)."""
        self.read_until(lambda _: False, timeout)
        return self.transcript

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> TCPConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_script(address: str, pieces: Sequence[bytes], timeout: float = 5.0) -> Transcript:
    """Send ``pieces`` one after the other on a fresh connection (the magic is the
    script's own first bytes), half-close, and read every frame until nsqd closes.

    After our EOF nsqd answers what it has read, reports a body cut short, and closes:
    the end of the transcript is an event, not a timer.
    """
    with TCPConn(address, timeout) as conn:
        conn.send_pieces(pieces)
        conn.half_close()
        return conn.read_to_close()


# -- raw HTTP/1.1 --------------------------------------------------------------------------------


@dataclass
class HTTPReply:
    status_line: bytes
    headers: list[tuple[str, str]]
    body: bytes
    interim: list[bytes] = field(default_factory=list)  # 1xx status lines before it

    @property
    def status(self) -> int:
        return int(self.status_line.split(b" ")[1])

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name.lower():
                return value
        return None


class HTTPConn:
    """One kept-alive HTTP connection, spoken byte for byte."""

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no complete HTTP reply from {self.address} in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise EOFError("connection closed")
        self.buf += data

    def _line(self, deadline: float) -> bytes:
        while (i := self.buf.find(b"\r\n")) < 0:
            self._more(deadline)
        line = bytes(self.buf[:i])
        del self.buf[: i + 2]
        return line

    def read_line(self, timeout: float | None = None) -> bytes:
        """One CRLF-terminated line, without its CRLF."""
        return self._line(time.monotonic() + (self.timeout if timeout is None else timeout))

    def _exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self._more(deadline)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def read_reply(self, method: str = "GET", timeout: float | None = None) -> HTTPReply:
        """The next reply (1xx interim replies collected into it)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        interim: list[bytes] = []
        while True:
            status_line = self._line(deadline)
            headers: list[tuple[str, str]] = []
            while line := self._line(deadline):
                name, _, value = line.decode("latin-1").partition(":")
                headers.append((name.strip().lower(), value.strip()))
            status = int(status_line.split(b" ")[1])
            if 100 <= status < 200:
                interim.append(status_line)
                continue
            break
        hdr = dict(headers)
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in hdr.get("transfer-encoding", ""):
            parts = []
            while True:
                size = int(self._line(deadline).split(b";")[0], 16)
                if size == 0:
                    while self._line(deadline):
                        pass
                    break
                parts.append(self._exact(size, deadline))
                self._exact(2, deadline)
            body = b"".join(parts)
        elif "content-length" in hdr:
            body = self._exact(int(hdr["content-length"]), deadline)
        else:
            while not self.eof:
                with contextlib.suppress(EOFError):
                    self._more(deadline)
            body = bytes(self.buf)
            self.buf.clear()
        return HTTPReply(status_line, headers, body, interim)

    def closed_by_server(self, timeout: float = 0.0) -> bool:
        """True if the server has closed the connection (nothing left to read)."""
        if self.eof:
            return True
        if self.buf:
            return False
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536, socket.MSG_PEEK)
        except (TimeoutError, BlockingIOError):
            return False
        except ConnectionResetError:
            return True
        return not data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def http_request(
    method: str,
    target: str,
    body: bytes | None = None,
    headers: Sequence[tuple[str, str]] = (),
    *,
    host: str = "nsqd",
) -> bytes:
    """The bytes of one HTTP/1.1 request (Content-Length given whenever there is a body,
    and for every POST/PUT)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if body is not None or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def http_once(address: str, method: str, target: str, body: bytes | None = None) -> HTTPReply:
    conn = HTTPConn(address)
    try:
        conn.send(http_request(method, target, body, [("Connection", "close")]))
        return conn.read_reply(method)
    finally:
        conn.close()


def get_json(address: str, target: str) -> Any:
    reply = http_once(address, "GET", target)
    assert reply.status == 200, f"GET {target} on {address}: {reply.status_line!r} {reply.body!r}"
    return json.loads(reply.body)


# -- normalisation: only what Go has, only what Go answers deterministically ---------------------

# /stats?format=json keys Go's nsqd has (spec 3.2). Left out: version, health (text),
# start_time, memory, e2e_processing_latency, and per client its id, hostname, address and
# connect time; nsqpy's extra fields are not in these lists, so they are never compared.
TOPIC_KEYS = (
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
)
CHANNEL_KEYS = (
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "zone_local_msg_count",
    "region_local_msg_count",
    "global_msg_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
)
CLIENT_KEYS = (
    "version",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "zone_local_msg_count",
    "region_local_msg_count",
    "global_msg_count",
    "finish_count",
    "requeue_count",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "authed",
    "auth_identity",
    "auth_identity_url",
    "pub_counts",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
)
OMITEMPTY = {
    "zone_local_msg_count",
    "region_local_msg_count",
    "global_msg_count",
    "authed",
    "auth_identity",
    "auth_identity_url",
    "pub_counts",
}
MISSING = "<missing>"


def _pick(obj: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``keys`` of ``obj``; a key absent is marked (absent where Go omits an empty value
    and the value would be empty is the same as absent)."""
    out: dict[str, Any] = {}
    for key in keys:
        if key in obj:
            value = obj[key]
            if key in OMITEMPTY and not value:
                continue
            out[key] = value
        elif key not in OMITEMPTY:
            out[key] = MISSING
    return out


def norm_client(client: Mapping[str, Any]) -> dict[str, Any]:
    return _pick(client, CLIENT_KEYS)


def _clients(clients: Any) -> Any:
    if not isinstance(clients, list):
        return clients  # null (include_clients=false) stays null
    return sorted((norm_client(c) for c in clients), key=repr)


def norm_channel(channel: Mapping[str, Any]) -> dict[str, Any]:
    out = _pick(channel, CHANNEL_KEYS)
    if "clients" in out:
        out["clients"] = _clients(out["clients"])
    return out


def norm_topic(topic: Mapping[str, Any]) -> dict[str, Any]:
    out = _pick(topic, TOPIC_KEYS)
    if isinstance(out.get("channels"), list):
        out["channels"] = [norm_channel(c) for c in out["channels"]]
    return out


def norm_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    topics = stats.get("topics", MISSING)
    return {
        "topics": [norm_topic(t) for t in topics] if isinstance(topics, list) else topics,
        "producers": _clients(stats.get("producers", MISSING)),
    }


def stats_of(server: NSQD, query: str = "") -> dict[str, Any]:
    return norm_stats(get_json(server.http_address, f"/stats?format=json{query}"))


def same_eventually(
    fetch_go: Callable[[], Any],
    fetch_py: Callable[[], Any],
    timeout: float = 2.0,
) -> tuple[Any, Any]:
    """Fetch both until they are equal or ``timeout`` passes; the last pair.

    For state that Go itself fills asynchronously (a topic's messages reaching a new
    channel, a closed client leaving): the comparison is of where both settle.
    """
    deadline = time.monotonic() + timeout
    while True:
        go, py = fetch_go(), fetch_py()
        if go == py or time.monotonic() > deadline:
            return go, py
        time.sleep(0.02)  # polling /stats with a deadline: there is no event to wait on


def assert_same_stats(pair: Pair, query: str = "", context: str = "") -> None:
    go, py = same_eventually(lambda: stats_of(pair.go, query), lambda: stats_of(pair.py, query))
    assert py == go, f"/stats{query} differ{context}:\n{diff_text(go, py)}"


def _by_name(items: Any) -> dict[str, Any] | None:
    """A list of topics or channels by name (None for any other value)."""
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return None
    if not items:
        return {}
    for key in ("topic_name", "channel_name"):
        if all(key in i for i in items):
            return {i[key]: i for i in items}
    return None


def diff_text(go: Any, py: Any) -> str:
    """A short, readable account of where ``py`` differs from ``go``."""
    lines: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(lines) > 20:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in list(a) + [k for k in b if k not in a]:
                walk(a.get(key, MISSING), b.get(key, MISSING), f"{path}.{key}")
        elif (named_a := _by_name(a)) is not None and (named_b := _by_name(b)) is not None:
            for key in list(named_a) + [k for k in named_b if k not in named_a]:
                walk(named_a.get(key, MISSING), named_b.get(key, MISSING), f"{path}[{key!r}]")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{path}[{i}]")
        elif a != b:
            lines.append(f"  {path or '.'}: go={a!r:.600} py={b!r:.600}")

    walk(go, py, "")
    return "\n".join(lines) or "  (equal)"


def norm_http(reply: HTTPReply, *, json_norm: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Status line, the headers that carry meaning (not Date, not Content-Length, whose
    value follows from the body; names in any case and order) and the body, JSON parsed."""
    content_type = reply.header("content-type") or ""
    body: Any = reply.body
    if "json" in content_type:
        try:
            body = json.loads(reply.body)
        except ValueError:
            body = ("invalid json", reply.body)
        else:
            if json_norm is not None:
                body = json_norm(body)
    return {
        "interim": reply.interim,
        "status": reply.status_line,
        "content-type": content_type,
        "x-nsq-content-type": reply.header("x-nsq-content-type"),
        "allow": reply.header("allow"),
        "location": reply.header("location"),
        "body": body,
    }


class StatsWatch:
    """Compares both servers' /stats after each case, and keeps finding new divergences
    after a first one: the topics that already differ are left out of later comparisons
    (their state has parted, so every later case would report them again)."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.parted: set[str] = set()  # topic names, and "producers"

    def _view(self, server: NSQD) -> dict[str, Any]:
        stats = stats_of(server)
        if isinstance(stats["topics"], list):
            stats["topics"] = [t for t in stats["topics"] if t.get("topic_name") not in self.parted]
        if "producers" in self.parted:
            stats.pop("producers")
        return stats

    def check(self) -> str | None:
        """None if both agree (eventually); else the difference, now left out."""
        go, py = same_eventually(lambda: self._view(self.pair.go), lambda: self._view(self.pair.py))
        if go == py:
            return None
        go_topics = {t.get("topic_name"): t for t in go["topics"] or ()}
        py_topics = {t.get("topic_name"): t for t in py["topics"] or ()}
        for name in go_topics.keys() | py_topics.keys():
            if go_topics.get(name) != py_topics.get(name):
                self.parted.add(str(name))
        if go.get("producers") != py.get("producers"):
            self.parted.add("producers")
        return diff_text(go, py)


def short_repr(value: object, limit: int = 2000) -> str:
    """``repr`` with long runs of one character shown as ``<Nxc>``, cut at ``limit``."""
    text = re.sub(r"(.)\1{15,}", lambda m: f"<{len(m.group(0))}x{m.group(1)}>", repr(value))
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def report(divergences: Sequence[str], shown: int = 6) -> str:
    """The failure message: the first divergences in full, the others one line each."""
    lines = [f"{len(divergences)} divergence(s) from Go's nsqd:"]
    lines += divergences[:shown]
    if len(divergences) > shown:
        lines.append("and, in short:")
        lines += ["  " + " | ".join(d.splitlines()[i].strip()[:200] for i in (0, -1))
                  for d in divergences[shown:]]  # fmt: skip
    return "\n\n".join(lines)


def read_many(conns: Sequence[TCPConn], done: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Read from whichever of ``conns`` has data until ``done()``, every connection is
    closed, or the deadline; True if ``done()`` was reached."""

    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for conn in conns:
            if not conn.transcript.closed:
                selector.register(conn.sock, selectors.EVENT_READ, conn)
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.get_map():
                return done()
            for key, _ in selector.select(remaining):
                conn = key.data
                conn.fill(time.monotonic() + 1.0)
                if conn.transcript.closed:
                    selector.unregister(conn.sock)
    return True
