"""Go net/http's request limits on nsqd, nsqlookupd and nsqadmin: a request line and
headers up to 1 MiB (DefaultMaxHeaderBytes, plus 4 KiB of bufio slop) are served, more
gets Go's ``431 Request Header Fields Too Large`` and the connection closed; a client
sending its headers slowly holds one connection and blocks nobody."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.e2e.test_nsqadmin_api import Cluster
from tests.support.procs import ServerProcess

TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n"
    b"431 Request Header Fields Too Large"
)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """name → HTTP address of one nsqlookupd, one nsqd and one nsqadmin."""
    cluster = Cluster(tmp_path_factory.mktemp("http-limits")).start(nsqd_count=1)
    try:
        [admin] = cluster.start_admins({})
        yield {
            "nsqd": cluster.nsqd_http(0),
            "nsqlookupd": cluster.lookupd_http,
            "nsqadmin": _http(admin),
        }
    finally:
        cluster.stop()


def _http(server: ServerProcess) -> str:
    address = server.http_address
    assert address
    return address


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(10)
    return sock


def _exchange(address: str, request: bytes) -> bytes:
    """Send ``request`` (Connection: close) and read the reply to the end."""
    with _connect(address) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading it all, as Go does
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _ping(target: bytes = b"/ping", headers: bytes = b"") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + headers + b"Connection: close\r\n\r\n"


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


SERVERS = ["nsqd", "nsqlookupd", "nsqadmin"]


@pytest.mark.parametrize("name", SERVERS)
def test_within_go_limits_is_served(servers: dict[str, str], name: str) -> None:
    address = servers[name]
    big_header = b"X-Big: " + b"a" * 100_000 + b"\r\n"
    assert _status(_exchange(address, _ping(headers=big_header))) == 200
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(2000))  # aiohttp's default: 128
    assert _status(_exchange(address, _ping(headers=many))) == 200
    long_target = b"/ping?pad=" + b"p" * 200_000  # aiohttp's default line: 8190 bytes
    assert _status(_exchange(address, _ping(target=long_target))) == 200
    just_under = b"X-Big: " + b"a" * (1 << 20) + b"\r\n"
    assert _status(_exchange(address, _ping(headers=just_under))) == 200


@pytest.mark.parametrize("name", SERVERS)
def test_over_go_limits_gets_431_and_close(servers: dict[str, str], name: str) -> None:
    address = servers[name]
    one_header = b"X-Big: " + b"a" * ((1 << 20) + 8192) + b"\r\n"
    assert _exchange(address, _ping(headers=one_header)) == TOO_LARGE
    many_headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(1100))
    assert _exchange(address, _ping(headers=many_headers)) == TOO_LARGE
    long_target = b"/ping?pad=" + b"p" * ((1 << 20) + 8192)
    assert _exchange(address, _ping(target=long_target)) == TOO_LARGE
    # the server is fine afterwards
    assert _status(_exchange(address, _ping())) == 200


def test_slow_headers_block_nobody_and_are_bounded(servers: dict[str, str]) -> None:
    address = servers["nsqd"]
    slow = _connect(address)
    try:
        slow.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        started = time.monotonic()
        assert _status(_exchange(address, _ping())) == 200  # served meanwhile
        assert time.monotonic() - started < 5
        # the slow client's head keeps growing: refused once past the budget
        refused = b""
        for _ in range(300):
            try:
                slow.sendall(b"s" * 4096)
            except (BrokenPipeError, ConnectionResetError):
                break
        while chunk := slow.recv(65536):
            refused += chunk
        assert refused == TOO_LARGE
    finally:
        slow.close()


def test_keep_alive_bodies_do_not_count_as_headers(servers: dict[str, str]) -> None:
    # Two 900 KB PUBs and then a 500 KB header on one connection: each head is small
    # or within the budget on its own.
    with _connect(servers["nsqd"]) as sock:
        body = b"b" * 900_000
        for _ in range(2):
            sock.sendall(
                b"POST /pub?topic=limits HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert _read_reply(sock).startswith(b"HTTP/1.1 200 OK\r\n")
        sock.sendall(_ping(headers=b"X-Big: " + b"a" * 500_000 + b"\r\n"))
        assert _read_reply(sock).startswith(b"HTTP/1.1 200 OK\r\n")


def _read_reply(sock: socket.socket) -> bytes:
    """One reply with a Content-Length body, read from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest
