"""``Expect`` on nsqd's HTTP port, nsqpy's against Go's: the same raw bytes to both, and
the same replies back (``100 Continue`` included), and the connection kept or closed alike.

Go's server (net/http) writes ``HTTP/1.1 100 Continue`` when the handler first reads the
body of an HTTP/1.1 request whose first ``Expect`` has the token ``100-continue``, even
if the body came with the head; a reply to one whose body was not read to its end closes
the connection; any other expectation is a 417. Replies are compared as status line,
headers (names in any case, in any order: nsqpy writes them in its own order, as before),
but the Date, and body; after them a last request on the same connection tells whether it
was kept open.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from tests.e2e.test_topology import Both, go_nsqd_binary, start_both

MAX_MSG_SIZE = 1024
LAST = b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _head(method: str, target: str, *headers: str, version: str = "1.1") -> bytes:
    host = "Host: x\r\n" if version == "1.1" else ""
    lines = "".join(f"{h}\r\n" for h in headers)
    return f"{method} {target} HTTP/{version}\r\n{host}{lines}\r\n".encode()


def _pub(*headers: str, target: str = "/pub?topic=t", version: str = "1.1") -> bytes:
    return _head("POST", target, *headers, "Content-Length: 5", version=version) + b"hello"


def _chunked(size: int) -> bytes:
    head = _head("POST", "/pub?topic=t", "Expect: 100-continue", "Transfer-Encoding: chunked")
    return head + b"%x\r\n" % size + b"x" * size + b"\r\n0\r\n\r\n"


CONTINUE = "Expect: 100-continue"
ALIVE = "Connection: keep-alive"
CASES: dict[str, tuple[bytes, bytes | None, int]] = {
    # name: (sent at once, sent after the 100 Continue, how many requests)
    "body-with-head": (_pub(CONTINUE), None, 1),
    "body-after-100": (_head("POST", "/pub?topic=t", CONTINUE, "Content-Length: 5"), b"hello", 1),
    "new-topic": (_pub(CONTINUE, target="/pub?topic=t_new"), None, 1),
    "chunked": (
        _head("POST", "/pub?topic=t", CONTINUE, "Transfer-Encoding: chunked")
        + b"5\r\nhello\r\n0\r\n\r\n",
        None,
        1,
    ),
    "pipelined": (_pub(CONTINUE) * 2, None, 2),
    "empty-body": (_head("POST", "/pub?topic=t", CONTINUE, "Content-Length: 0"), None, 1),
    # answered after reading the body: 100 Continue, the connection kept
    "invalid-topic": (_pub(CONTINUE, target="/pub?topic=bad!"), None, 1),
    "missing-topic": (_pub(CONTINUE, target="/pub"), None, 1),
    # one byte over --max-msg-size: Go's LimitReader(max + 1) reads it to its end (kept)
    "max-msg-size-plus-1-chunked": (_chunked(MAX_MSG_SIZE + 1), None, 1),
    # two over: not to its end, so the connection closes
    "max-msg-size-plus-2-chunked": (_chunked(MAX_MSG_SIZE + 2), None, 1),
    # answered without reading it: no 100 Continue, "Connection: close"
    "not-found": (_pub(CONTINUE, target="/nope"), None, 1),
    "method-not-allowed": (
        _head("GET", "/pub?topic=t", CONTINUE, "Content-Length: 5") + b"hello",
        None,
        1,
    ),
    "mpub-invalid-topic": (_pub(CONTINUE, target="/mpub?topic=bad!"), None, 1),
    "ping-with-a-body": (_head("GET", "/ping", CONTINUE, "Content-Length: 5") + b"hello", None, 1),
    # HTTP/1.0: no interim reply
    "http10": (_pub(CONTINUE, ALIVE, version="1.0"), None, 1),
    "http10-not-found": (_pub(CONTINUE, ALIVE, target="/nope", version="1.0"), None, 1),
    # how the header is read
    "100-Continue": (_pub("Expect: 100-Continue"), None, 1),
    "100-CONTINUE": (_pub("Expect: 100-CONTINUE"), None, 1),
    "token-list": (_pub("Expect: foo, 100-continue"), None, 1),
    "first-header-continue": (_pub(CONTINUE, "Expect: foo"), None, 1),
    "empty-expect": (_pub("Expect:"), None, 1),
    # any other expectation: 417 and close
    "foo": (_pub("Expect: foo"), None, 1),
    "foo-http10": (_pub("Expect: foo", ALIVE, version="1.0"), None, 1),
    "first-header-foo": (_pub("Expect: foo", CONTINUE), None, 1),
    "100-continuex": (_pub("Expect: 100-continuex"), None, 1),
    "head-foo": (_head("HEAD", "/ping", "Expect: foo"), None, 1),
}


@dataclass(frozen=True)
class Reply:
    status: bytes
    headers: tuple[bytes, ...]  # lower-cased, sorted, without Date
    body: bytes


class _Reader:
    """Replies read off a raw socket, by their Content-Length (none for HEAD or 1xx)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        self.buf += data
        return bool(data)

    def reply(self, head_only: bool) -> Reply | None:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                assert not self.buf, f"closed after a partial reply: {self.buf!r}"
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status, *lines = head.split(b"\r\n")
        fields = dict(line.split(b": ", 1) for line in lines)
        fields = {k.lower(): v for k, v in fields.items()}
        length = 0 if head_only or b" 1" in status[8:10] else int(fields[b"content-length"])
        while len(self.buf) < length:
            assert self._fill(), "closed in a reply's body"
        body, self.buf = self.buf[:length], self.buf[length:]
        headers = tuple(sorted(b"%s: %s" % kv for kv in fields.items() if kv[0] != b"date"))
        return Reply(status, headers, body)


def _transcript(address: str, first: bytes, later: bytes | None, count: int) -> list[object]:
    """The replies to ``first`` (then ``later`` once a 100 Continue came), then whether
    a last request on the connection is answered ("kept") or not ("closed")."""
    host, _, port = address.rpartition(":")
    head_only = first.startswith(b"HEAD ")
    out: list[object] = []
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        reader = _Reader(sock)
        sock.sendall(first)
        finals = 0
        while finals < count:
            reply = reader.reply(head_only)
            if reply is None:
                out.append("closed early")
                return out
            out.append(reply)
            if reply.status.startswith(b"HTTP/1.1 100 ") and later is not None:
                sock.sendall(later)
                later = None
            elif reply.status[9:10] != b"1":
                finals += 1
        try:
            sock.sendall(LAST)
        except (BrokenPipeError, ConnectionResetError):
            out.append("closed")
            return out
        last = reader.reply(False)
        out.append("closed" if last is None else f"kept: {last.status.decode()}")
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Both]:
    pair = start_both(
        go_nsqd_binary(), tmp_path_factory.mktemp("expect-vs-go"), {"max_msg_size": MAX_MSG_SIZE}
    )
    try:
        for server in (pair.go, pair.py):  # an existing topic: nsqpy's quick lane for /pub
            r = requests.post(f"http://{server.http_address}/topic/create?topic=t", timeout=5)
            assert r.status_code == 200
        yield pair
    finally:
        pair.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_expect_as_go(both: Both, case: str) -> None:
    first, later, count = CASES[case]
    assert both.go.http_address and both.py.http_address
    go = _transcript(both.go.http_address, first, later, count)
    py = _transcript(both.py.http_address, first, later, count)
    assert py == go


def test_the_issue_100_continue_when_the_body_came_with_the_head(both: Both) -> None:
    assert both.py.http_address
    [interim, final, state] = _transcript(both.py.http_address, _pub(CONTINUE), None, 1)
    assert interim == Reply(b"HTTP/1.1 100 Continue", (), b"")
    assert isinstance(final, Reply) and final.status == b"HTTP/1.1 200 OK"
    assert state == "kept: HTTP/1.1 200 OK"
