"""nsqpy.common.httpserver: the head parser, the chunked decoder and the reply encoder fed
bytes directly, then the server over real sockets on 127.0.0.1 (pipelining, HTTP/1.0,
slow clients, oversized heads, graceful close)."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nsqpy.common import httpserver
from nsqpy.common.httpapi import HTTPError, ReqParams
from nsqpy.common.httplimits import MAX_HEADER_BYTES, TOO_LARGE
from nsqpy.common.httpserver import (
    BadRequest,
    BodyError,
    BodyTooLarge,
    ChunkedDecoder,
    HTTPServer,
    Request,
    Response,
    encode_response,
    find_head_end,
    http_date,
    parse_head,
)

T = TypeVar("T")

BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n400 Bad Request"
)


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- the head -------------------------------------------------------------------------------


def test_parse_head_reads_line_target_and_headers() -> None:
    request = parse_head(
        b"POST /p%69ng?topic=a%20b&x HTTP/1.1\r\nHost: h\r\nX-Two: 1\r\n"
        b"x-two: 2\r\nContent-Length:  12 \r\n\r\n"
    )
    assert (request.method, request.path, request.raw_path) == (
        "POST",
        "/ping",
        "/p%69ng?topic=a%20b&x",
    )
    assert request.query_string == "topic=a%20b&x"
    assert request.version == (1, 1)
    assert request.headers["X-TWO"] == "1, 2"
    assert request.headers.get("host") == "h"
    assert "content-length" in request.headers
    assert request.content_length == 12
    assert not request.chunked
    assert request.keep_alive


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade, close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", True),
    ],
)
def test_keep_alive_follows_version_and_connection(head: bytes, keep_alive: bool) -> None:
    assert parse_head(head).keep_alive is keep_alive


def test_bare_lf_lines_and_absolute_targets_are_read_as_go_does() -> None:
    request = parse_head(b"GET http://h:1/ping?a=1 HTTP/1.1\nHost: h\n\n")
    assert (request.path, request.query_string) == ("/ping", "a=1")
    assert parse_head(b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n").path == "*"


def test_chunked_wins_over_content_length_and_identical_lengths_pass() -> None:
    request = parse_head(
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: Chunked\r\n\r\n"
    )
    assert request.chunked and request.content_length is None
    assert (
        parse_head(
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"
        ).content_length
        == 1
    )
    # HTTP/1.0 knows no transfer codings: the Content-Length counts
    assert (
        parse_head(
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n"
        ).content_length
        == 2
    )


@pytest.mark.parametrize(
    "head",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /ping\r\nHost: h\r\n\r\n",
        b"GET  /ping HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET /ping FOO/1.1\r\nHost: h\r\n\r\n",
        b"GET /ping HTTP/1.x\r\nHost: h\r\n\r\n",
        b"G(T /ping HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET ping HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET /p%zzng HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : h\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nHost: i\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: abc\r\n\r\n",
    ],
)
def test_malformed_heads_get_go_400(head: bytes) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_head(head)
    assert caught.value.reply == BAD_REQUEST


def test_go_replies_for_host_version_and_transfer_coding() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_head(b"GET / HTTP/1.1\r\n\r\n")
    assert caught.value.reply.endswith(b"\r\n\r\n400 Bad Request: missing required Host header")
    with pytest.raises(BadRequest) as caught:
        parse_head(b"GET / HTTP/2.0\r\nHost: h\r\n\r\n")
    assert caught.value.reply.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n")
    with pytest.raises(BadRequest) as caught:
        parse_head(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
    assert caught.value.reply == (
        b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\n\r\nUnsupported transfer encoding"
    )


@pytest.mark.parametrize(
    ("lines", "expect_continue", "expectation_failed"),
    [
        (b"Expect: 100-continue\r\nContent-Length: 1", True, False),
        (b"Expect: 100-Continue\r\nContent-Length: 1", True, False),
        (b"Expect: 100-CONTINUE\r\nContent-Length: 1", True, False),
        (b"Expect: \t100-continue \r\nContent-Length: 1", True, False),
        (b"Expect: foo, 100-continue\r\nContent-Length: 1", True, False),
        (b"Expect: 100-continue,foo\r\nContent-Length: 1", True, False),
        (b"Expect: 100-continue\r\nTransfer-Encoding: chunked", True, False),
        # Go reads the first Expect header only
        (b"Expect: 100-continue\r\nExpect: foo\r\nContent-Length: 1", True, False),
        (b"Expect: foo\r\nExpect: 100-continue\r\nContent-Length: 1", False, True),
        # no body, nothing to wait for; and no Expect at all
        (b"Expect: 100-continue\r\nContent-Length: 0", False, False),
        (b"Expect: 100-continue", False, False),
        (b"Expect:\r\nContent-Length: 1", False, False),
        # anything else is a 417
        (b"Expect: foo\r\nContent-Length: 1", False, True),
        (b"Expect: 100-continuex\r\nContent-Length: 1", False, True),
        (b"Expect: 100-continue;x=1\r\nContent-Length: 1", False, True),
        (b"Expect: foo", False, True),
    ],
    ids=lambda v: v.decode().replace("\r\n", " | ") if isinstance(v, bytes) else str(v),
)
def test_expect_read_as_go_does(
    lines: bytes, expect_continue: bool, expectation_failed: bool
) -> None:
    request = parse_head(b"POST /pub HTTP/1.1\r\nHost: h\r\n" + lines + b"\r\n\r\n")
    assert (request.expect_continue, request.expectation_failed) == (
        expect_continue,
        expectation_failed,
    )
    # HTTP/1.0: no interim reply ever, but still Go's 417 for another expectation
    request = parse_head(b"POST /pub HTTP/1.0\r\n" + lines + b"\r\n\r\n")
    assert (request.expect_continue, request.expectation_failed) == (False, expectation_failed)


def test_find_head_end_takes_the_first_blank_line() -> None:
    assert find_head_end(b"GET / HTTP/1.1\r\nHost: h\r\n\r\nBODY") == 27
    assert find_head_end(b"GET / HTTP/1.1\nHost: h\n\nBODY\r\n\r\n") == 24
    assert find_head_end(b"GET / HTTP/1.1\r\nHost: h\r\n") == -1


# -- bodies ---------------------------------------------------------------------------------

CHUNKED = b"5;ext=1\r\nhello\r\n1A\r\n" + b"z" * 26 + b"\r\n0\r\nTrailer: t\r\n\r\nNEXT"


def test_chunked_body_decoded_in_one_piece_or_byte_by_byte() -> None:
    decoder = ChunkedDecoder()
    pieces, end = decoder.feed(CHUNKED)
    assert b"".join(pieces) == b"hello" + b"z" * 26
    assert decoder.done and CHUNKED[end:] == b"NEXT"

    decoder = ChunkedDecoder()
    body = b""
    for i in range(len(CHUNKED)):
        pieces, end = decoder.feed(CHUNKED[i : i + 1])
        body += b"".join(pieces)
        if decoder.done:
            assert CHUNKED[i + 1 :] == b"NEXT" and end == 1
            break
    assert body == b"hello" + b"z" * 26


@pytest.mark.parametrize(
    "data",
    [b"zz\r\nhello\r\n", b"\r\n", b"5\r\nhelloXX0\r\n\r\n", b"0x5\r\nhello\r\n", b"1" * 5000],
)
def test_broken_chunked_bodies_are_errors(data: bytes) -> None:
    with pytest.raises(BodyError):
        ChunkedDecoder().feed(data)


# -- replies --------------------------------------------------------------------------------


def _request(head: bytes) -> Request:
    return parse_head(head)


def test_reply_headers_in_aiohttp_order_with_date_and_connection() -> None:
    date = http_date()
    response = Response(405, b"{}", {"Content-Type": "application/json", "Allow": "GET"})
    get11 = _request(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert encode_response(response, get11, keep_alive=True) == (
        b"HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json\r\nAllow: GET\r\n"
        b"Content-Length: 2\r\nDate: " + date.encode() + b"\r\n\r\n{}"
    )
    assert b"\r\nConnection: close\r\n\r\n{}" in encode_response(response, get11, keep_alive=False)
    get10 = _request(b"GET / HTTP/1.0\r\n\r\n")
    assert encode_response(Response(200, b"x"), get10, keep_alive=True) == (
        b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nContent-Type: application/octet-stream\r\n"
        b"Date: " + date.encode() + b"\r\nConnection: keep-alive\r\n\r\nx"
    )
    head = _request(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert encode_response(Response(200, b"abc"), head, keep_alive=True).endswith(
        b"Content-Length: 3\r\nDate: " + date.encode() + b"\r\n\r\n"
    )
    assert b"Content-Length" not in encode_response(Response(200), head, keep_alive=True)


def test_the_same_head_twice_gives_two_requests_with_their_own_bodies() -> None:
    head = b"POST /pub?topic=t HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n"
    first, second = parse_head(head), parse_head(bytes(head))  # the second from the cache
    assert first is not second
    assert (second.method, second.path, second.query_string, second.content_length) == (
        "POST",
        "/pub",
        "topic=t",
        2,
    )
    assert dict(second.headers.items()) == {"host": "h", "content-length": "2"}
    first._add(b"ab")
    first._end()
    assert (first._parts, first._complete) == ([b"ab"], True)
    assert (second._parts, second._complete, second._size) == ([], False, 0)


def test_head_cache_is_bounded_and_keeps_no_refusal() -> None:
    for n in range(3 * httpserver._CACHED_HEADS):
        assert parse_head(f"GET /{n} HTTP/1.1\r\nHost: h\r\n\r\n".encode()).path == f"/{n}"
        assert len(httpserver._HEADS) <= httpserver._CACHED_HEADS
    long_head = b"GET / HTTP/1.1\r\nHost: h\r\nX: " + b"x" * 2000 + b"\r\n\r\n"
    assert parse_head(long_head).headers["x"] == "x" * 2000
    assert long_head not in httpserver._HEADS
    bad = b"GET / HTTP/1.1\r\n\r\n"  # no Host: refused each time it comes
    for _ in range(2):
        with pytest.raises(BadRequest):
            parse_head(bad)
    assert bad not in httpserver._HEADS


def test_a_reused_reply_head_takes_the_current_date_and_its_own_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = _request(b"POST /pub HTTP/1.1\r\nHost: h\r\n\r\n")
    headers = {"X-NSQ-Content-Type": "nsq; version=1.0", "Content-Type": "text/plain"}
    monkeypatch.setattr(httpserver.time, "time", lambda: 784111777.5)
    first = encode_response(Response(200, b"OK", dict(headers)), request, keep_alive=True)
    monkeypatch.setattr(httpserver.time, "time", lambda: 784111778.25)
    second = encode_response(Response(200, b"NO", dict(headers)), request, keep_alive=True)
    head = (
        b"HTTP/1.1 200 OK\r\nX-NSQ-Content-Type: nsq; version=1.0\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 2\r\nDate: "
    )
    assert first == head + b"Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\nOK"
    assert second == head + b"Sun, 06 Nov 1994 08:49:38 GMT\r\n\r\nNO"
    closing = encode_response(Response(200, b"OK", dict(headers)), request, keep_alive=False)
    assert closing.endswith(b"GMT\r\nConnection: close\r\n\r\nOK")
    longer = encode_response(Response(200, b"OK!", dict(headers)), request, keep_alive=True)
    assert b"Content-Length: 3\r\n" in longer and longer.endswith(b"\r\n\r\nOK!")


def test_query_values_are_reused_and_a_bad_query_refused_each_time() -> None:
    ok = _request(b"GET /stats?topic=a&topic=b&x= HTTP/1.1\r\nHost: h\r\n\r\n")
    assert ReqParams(ok).values == {"topic": ["a", "b"], "x": [""]}
    assert ReqParams(ok).get("topic") == "a"
    bad = _request(b"GET /stats?topic=a;b HTTP/1.1\r\nHost: h\r\n\r\n")
    for _ in range(2):
        with pytest.raises(HTTPError) as err:
            ReqParams(bad)
        assert (err.value.status, err.value.text) == (400, "INVALID_REQUEST")


def test_http_date_is_imf_fixdate() -> None:
    assert http_date(784111777) == "Sun, 06 Nov 1994 08:49:37 GMT"


# -- over sockets ---------------------------------------------------------------------------


async def _echo(request: Request) -> Response:
    """Replies with what it saw; ``/slow`` waits first, ``/limit`` reads at most 10 bytes."""
    if request.path == "/slow":
        await asyncio.sleep(0.2)
    try:
        body = await request.read(10 if request.path == "/limit" else -1)
    except BodyTooLarge:
        return Response(413, b"too large")
    except BodyError:
        return Response(500, b"broken body")
    return Response(200, f"{request.method} {request.raw_path} {len(body)} ".encode() + body)


async def _serving(
    scenario: Callable[[int], Awaitable[T]], handler: Callable[[Request], Any] = _echo
) -> T:
    server = HTTPServer(handler)
    _, port = (await server.listen_tcp("127.0.0.1", 0))[:2]
    try:
        return await scenario(port)
    finally:
        await server.close()


async def _exchange(port: int, *parts: bytes, pause: float = 0.0) -> bytes:
    """Send ``parts`` (``pause`` s apart) and read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def _bodies(replies: bytes) -> list[bytes]:
    return [part.split(b"\r\n\r\n", 1)[1] for part in replies.split(b"HTTP/1.")[1:]]


def test_pipelined_requests_are_answered_in_order() -> None:
    requests = (
        b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n"
        b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n"
        b"\r\nGET /d?q HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    replies = arun(_serving(lambda port: _exchange(port, requests)))
    assert _bodies(replies) == [b"POST /a 3 abc", b"GET /slow 0 ", b"POST /c 3 xyz", b"GET /d?q 0 "]
    assert replies.count(b"Connection: close") == 1


def test_quick_routes_answer_whole_requests_and_leave_the_rest_to_the_handler() -> None:
    """A quick route answers a request whose body came with its head, in order with the
    handler's replies; its None, a body still to come, or a chunked body go the usual
    way; one that raises is a 500, as a handler that does; its reply to a closing request
    closes the connection."""
    seen: list[bytes] = []

    def quick(request: Request, body: bytes) -> Response | None:
        seen.append(body)
        if body == b"boom":
            raise RuntimeError("quick route failed")
        return None if body == b"no" else Response(200, b"quick " + body)

    async def scenario(port: int) -> tuple[bytes, bytes]:
        split = await _exchange(
            port,
            b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nConnection: close\r\n\r\nde",
            b"fg",
            pause=0.05,
        )
        pipelined = await _exchange(
            port,
            b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n"
            b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nno"
            b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nboom"
            b"POST /q HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n"
            b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nConnection: close\r\n\r\nh"
            b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\ni",
        )
        return split, pipelined

    server = HTTPServer(_echo)
    server.quick_routes["/q"] = quick

    async def run() -> tuple[bytes, bytes]:
        _, port = (await server.listen_tcp("127.0.0.1", 0))[:2]
        try:
            return await scenario(port)
        finally:
            await server.close()

    split, pipelined = arun(run())
    assert _bodies(split) == [b"POST /q 4 defg"]  # the body came after its head
    assert _bodies(pipelined) == [
        b"quick abc",
        b"GET /slow 0 ",
        b"POST /q 2 no",
        b"500 Internal Server Error",  # a quick route that raises, as a handler that does
        b"POST /q 1 z",
        b"quick h",
    ]
    assert pipelined.count(b"Connection: close") == 1  # and nothing after that reply
    assert seen == [b"abc", b"no", b"boom", b"h"]  # whole bodies only: not the chunked one


def test_a_quick_routes_repeated_head_takes_the_lane_with_the_same_outcomes() -> None:
    """Requests with the head of the last one a quick route answered on the connection
    are handed to the route without a parse, whether in one packet or from the buffer
    behind a slow handler: the same replies (a fresh Date each), the route called once
    for each, its None left to the handler, and a body still to come read as usual."""
    seen: list[tuple[Request, bytes]] = []

    def quick(request: Request, body: bytes) -> Response | None:
        seen.append((request, body))
        if body == b"boo":
            raise RuntimeError("quick route failed")
        return None if body == b"nop" else Response(200, b"quick " + body)

    head = b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n"
    closing = b"POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nConnection: close\r\n\r\n"
    server = HTTPServer(_echo)
    server.quick_routes["/q"] = quick

    async def run() -> bytes:
        _, port = (await server.listen_tcp("127.0.0.1", 0))[:2]
        try:
            return await _exchange(
                port,
                head + b"abc" + head + b"xyz" + head + b"nop" + head + b"boo" + head + b"ab",
                b"c" + head + b"def" + closing + b"h",
                pause=0.05,
            )
        finally:
            await server.close()

    replies = arun(run())
    assert _bodies(replies) == [
        b"quick abc",
        b"quick xyz",
        b"POST /q 3 nop",  # the route's None: the handler's, the route not asked again
        b"500 Internal Server Error",
        b"POST /q 3 abc",  # its body came later: the handler's
        b"quick def",
        b"quick h",
    ]
    assert replies.count(b"\r\nDate: ") == 7
    assert replies.count(b"Connection: close") == 1
    assert [body for _, body in seen] == [b"abc", b"xyz", b"nop", b"boo", b"def", b"h"]
    lane = seen[0][0]
    assert all(request is lane for request, _ in seen[:5])  # parsed once
    assert seen[5][0] is not lane and not seen[5][0].keep_alive


class _Recorder:
    """A transport that keeps what is written: where the input is cut, and when the loop
    runs between two reads, is the test's to choose, as no socket lets it."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.out += part

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if key == "peername" else default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


def test_the_quick_lane_never_changes_what_is_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random runs of requests, most with one head, cut at random points, the loop run a
    random number of turns between reads: with the lane and without it (no head short
    enough), the same replies byte for byte but the Date (100 Continue included, for the
    heads with ``Expect: 100-continue``), and the route sees the same."""

    def quick(request: Request, body: bytes) -> Response | None:
        return None if body.startswith(b"n") else Response(200, b"quick " + body)

    async def answers(seed: int) -> tuple[bytes, int]:
        rnd = random.Random(seed)
        requests = []
        for _ in range(rnd.randint(1, 20)):
            size = rnd.choice([3, 3, 3, 4])
            path = rnd.choice(["/q", "/q", "/q", "/x", "/x/a/longer/path?and=a&query"])
            body = bytes(rnd.choice(b"abn") for _ in range(size))
            extra = rnd.choice(
                ["", "", "", "X-Some-Header: with a value\r\n", "Expect: 100-continue\r\n"]
            )
            head = f"POST {path} HTTP/1.1\r\nHost: h\r\n{extra}Content-Length: {size}\r\n\r\n"
            requests.append(head.encode() + body)
        data = b"".join(requests)
        cuts = sorted(rnd.sample(range(1, len(data)), min(len(data) - 1, rnd.randint(0, 10))))
        server = HTTPServer(_echo)
        server.quick_routes["/q"] = quick
        connection = httpserver.HTTPConnection(server, False)
        transport = _Recorder()
        connection.connection_made(transport)  # type: ignore[arg-type]
        start = 0
        for cut in [*cuts, len(data)]:
            connection.data_received(data[start:cut])
            start = cut
            for _ in range(rnd.randint(0, 3)):
                await asyncio.sleep(0)
        for _ in range(1000):  # the handler's replies, a turn or two each
            out = transport.out
            if out.count(b"HTTP/1.1 ") - out.count(_CONTINUE) >= len(requests):
                break
            await asyncio.sleep(0)
        connection.connection_lost(None)
        replies = re.sub(rb"\r\nDate: [^\r]*", b"", bytes(transport.out))
        return replies, replies.count(b"quick ")

    async def run() -> int:
        quick_answers = 0
        for seed in range(300):
            monkeypatch.setattr(httpserver, "_LANE_HEAD_BYTES", 1024)
            with_lane, count = await answers(seed)
            monkeypatch.setattr(httpserver, "_LANE_HEAD_BYTES", 0)
            without, _ = await answers(seed)
            assert with_lane == without, seed
            quick_answers += count
        return quick_answers

    assert arun(run()) > 1000  # most requests took the quick route, so the lane was tried


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def test_http10_closes_unless_kept_alive() -> None:
    replies = arun(_serving(lambda port: _exchange(port, b"GET /x HTTP/1.0\r\n\r\n")))
    assert replies.startswith(b"HTTP/1.0 200 OK\r\n") and b"Connection" not in replies

    async def kept(port: int) -> list[bytes]:
        return _bodies(
            await _exchange(
                port,
                b"GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n",
            )
        )

    assert arun(_serving(kept)) == [b"GET /1 0 ", b"GET /2 0 "]


def test_a_slow_client_is_served_byte_by_byte() -> None:
    request = (
        b"POST /pub HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    )
    parts = [request[i : i + 1] for i in range(len(request))]
    replies = arun(_serving(lambda port: _exchange(port, *parts, pause=0.002)))
    assert _bodies(replies) == [b"POST /pub 5 hello"]


def test_slow_headers_block_nobody() -> None:
    async def scenario(port: int) -> bytes:
        _, slow = await asyncio.open_connection("127.0.0.1", port)
        slow.write(b"GET /slowloris HTTP/1.1\r\nHost: h\r\nX-Slow: ")
        try:
            return await _exchange(
                port, b"GET /other HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
            )
        finally:
            slow.close()

    assert _bodies(arun(_serving(scenario))) == [b"GET /other 0 "]


def test_oversized_heads_get_go_431_and_close() -> None:
    big = b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n"
    assert arun(_serving(lambda port: _exchange(port, big))) == TOO_LARGE
    # sent in small pieces, with no end of head in sight
    parts = [b"GET / HTTP/1.1\r\n"] + [b"X-H: " + b"v" * 4090 + b"\r\n"] * 300
    assert arun(_serving(lambda port: _exchange(port, *parts))) == TOO_LARGE
    # within the budget, a long target and many headers are served
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(3000))
    fine = (
        b"GET /"
        + b"p" * 200_000
        + b" HTTP/1.1\r\nHost: h\r\n"
        + many
        + b"Connection: close\r\n\r\n"
    )
    assert arun(_serving(lambda port: _exchange(port, fine))).startswith(b"HTTP/1.1 200 OK\r\n")


def test_bad_request_gets_go_400_and_close() -> None:
    replies = arun(
        _serving(lambda port: _exchange(port, b"GET / HTTP/1.1\r\nHost: h\r\n\r\nGARBAGE\r\n\r\n"))
    )
    assert replies.endswith(BAD_REQUEST) and replies.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_body_over_the_limit_is_drained_and_the_connection_kept() -> None:
    requests = (
        b"POST /limit HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"6\r\nabcdef\r\n6\r\nghijkl\r\n" * 100
        + b"0\r\n\r\n"
        + b"POST /limit HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n"
        + b"x" * 100
        + b"GET /last HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    replies = arun(_serving(lambda port: _exchange(port, requests)))
    assert _bodies(replies) == [b"too large", b"too large", b"GET /last 0 "]


def test_broken_chunked_body_reaches_the_handler_then_closes() -> None:
    request = b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\nGET / HTTP/1.1\r\n"
    replies = arun(_serving(lambda port: _exchange(port, request)))
    assert replies.startswith(b"HTTP/1.1 200 OK\r\n") is False
    assert _bodies(replies) == [b"broken body"] and b"Connection: close" in replies


def test_expect_continue_is_answered_when_the_body_is_read() -> None:
    async def scenario(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n"
            b"Connection: close\r\n\r\n"
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"ok")
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return interim + rest

    replies = arun(_serving(scenario))
    assert replies.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert replies.endswith(b"POST /x 2 ok")


async def _reads_unless_nope(request: Request) -> Response:
    """_echo, except that ``/nope`` answers without reading the body (Go's 404)."""
    if request.path == "/nope":
        return Response(404, b"not found")
    return await _echo(request)


def _quick_pub(request: Request, body: bytes) -> Response | None:
    return None if body.startswith(b"n") else Response(200, b"quick " + body)


def _expect_exchange(*parts: bytes, pause: float = 0.0) -> bytes:
    """What a server (_reads_unless_nope, a quick route at /q) sends back, Date masked."""
    server = HTTPServer(_reads_unless_nope)
    server.quick_routes["/q"] = _quick_pub

    async def run() -> bytes:
        _, port = (await server.listen_tcp("127.0.0.1", 0))[:2]
        try:
            return await _exchange(port, *parts, pause=pause)
        finally:
            await server.close()

    return re.sub(rb"\r\nDate: [^\r]*", b"\r\nDate: X", arun(run()))


_EXPECT = b"Host: h\r\nExpect: 100-continue\r\n"
_LAST = b"GET /last HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
_LAST_REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Type: application/octet-stream\r\nDate: X\r\nConnection: close\r\n\r\nGET /last 0 "


def test_expect_continue_gets_100_continue_even_when_the_body_came_with_the_head() -> None:
    # Go writes its 100 Continue at the body's first read, whether or not the body is in
    # already; then the reply, and the connection stays open. The quick lane (/q) and the
    # handler (/x) alike, and each request of a repeated head (the lane's) its own.
    head = b"POST /q HTTP/1.1\r\n" + _EXPECT + b"Content-Length: 3\r\n\r\n"
    replies = _expect_exchange(
        head + b"abc" + head + b"def" + head + b"nop"
        b"POST /x HTTP/1.1\r\n" + _EXPECT + b"Content-Length: 2\r\n\r\nhi" + _LAST
    )
    quick = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Type: application/octet-stream\r\nDate: X\r\n\r\nquick "
    assert replies == (
        _CONTINUE + quick + b"abc"
        + _CONTINUE + quick + b"def"
        # the route's None: the handler reads, and there is one 100 Continue still
        + _CONTINUE + b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: application/octet-stream\r\nDate: X\r\n\r\nPOST /q 3 nop"
        + _CONTINUE + b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Type: application/octet-stream\r\nDate: X\r\n\r\nPOST /x 2 hi"
        + _LAST_REPLY
    )  # fmt: skip


def test_expect_continue_with_a_chunked_body_and_over_a_limit() -> None:
    # chunked: a body all the same. Past the handler's limit (10): Go's handler reads
    # through LimitReader(body, 11), so a body of 11 is read to its end and the connection
    # kept, one of 12 is not: the 100 Continue, the reply, and the connection closes.
    limit = b"POST /limit HTTP/1.1\r\n" + _EXPECT
    replies = _expect_exchange(
        b"POST /x HTTP/1.1\r\n" + _EXPECT + b"Transfer-Encoding: chunked\r\n\r\n"
        + b"3\r\nabc\r\n0\r\n\r\n"
        + limit + b"Content-Length: 11\r\n\r\n" + b"x" * 11
        + limit + b"Content-Length: 12\r\n\r\n" + b"x" * 12
        + _LAST
    )  # fmt: skip
    too_large = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 9\r\nContent-Type: application/octet-stream\r\nDate: X\r\n"
    assert replies == (
        _CONTINUE + b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: application/octet-stream\r\nDate: X\r\n\r\nPOST /x 3 abc"
        + _CONTINUE + too_large + b"\r\ntoo large"
        + _CONTINUE + too_large + b"Connection: close\r\n\r\ntoo large"
    )  # fmt: skip


@pytest.mark.parametrize("body_first", [True, False])
def test_a_reply_without_reading_the_body_gets_no_100_continue_and_closes(
    body_first: bool,
) -> None:
    # Go's 404 (its router reads no body): no 100 Continue, "Connection: close", and the
    # connection closes once the body (sent with the head, or after all) is drained.
    head = b"POST /nope HTTP/1.1\r\n" + _EXPECT + b"Content-Length: 3\r\n\r\n"
    parts = (head + b"abc" + _LAST,) if body_first else (head, b"abc" + _LAST)
    replies = _expect_exchange(*parts, pause=0.05)
    assert replies == (
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nContent-Type: application/octet-stream\r\nDate: X\r\nConnection: close\r\n\r\nnot found"
    )  # fmt: skip


def test_no_100_continue_without_a_body_or_with_http10() -> None:
    replies = _expect_exchange(
        b"POST /x HTTP/1.1\r\n" + _EXPECT + b"Content-Length: 0\r\n\r\n"
        + b"POST /q HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n"
        + b"Connection: keep-alive\r\n\r\nabc"
        + b"POST /nope HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n"
        + b"Connection: keep-alive\r\n\r\nabc"
        + _LAST
    )  # fmt: skip
    assert _CONTINUE not in replies
    assert _bodies(replies) == [b"POST /x 0 ", b"quick abc", b"not found", b"GET /last 0 "]
    assert replies.count(b"Connection: close") == 1  # only the last: all were kept alive


@pytest.mark.parametrize(
    ("request_", "reply"),
    [
        (
            b"POST /q HTTP/1.1\r\nHost: h\r\nExpect: foo\r\nContent-Length: 3\r\n\r\nabc",
            b"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: X\r\n"
            b"Content-Length: 0\r\n\r\n",
        ),
        (
            b"POST /x HTTP/1.0\r\nExpect: 100-continuex\r\nConnection: keep-alive\r\n\r\n",
            b"HTTP/1.0 417 Expectation Failed\r\nConnection: close\r\nDate: X\r\n"
            b"Content-Length: 0\r\n\r\n",
        ),
        (
            b"HEAD /x HTTP/1.1\r\nHost: h\r\nExpect: foo\r\nExpect: 100-continue\r\n\r\n",
            b"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: X\r\n\r\n",
        ),
    ],
    ids=["foo", "http10", "head"],
)
def test_another_expectation_gets_go_417_and_close(request_: bytes, reply: bytes) -> None:
    # net/http's answer, before any handler or quick route; what follows is not read
    assert _expect_exchange(request_ + _LAST) == reply


def test_close_finishes_requests_in_progress_and_closes_idle_connections() -> None:
    async def scenario() -> tuple[bytes, bytes]:
        server = HTTPServer(_echo)
        _, port = (await server.listen_tcp("127.0.0.1", 0))[:2]
        idle_reader, idle = await asyncio.open_connection("127.0.0.1", port)
        idle.write(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        await idle_reader.readuntil(b"GET /first 0 ")
        busy = asyncio.create_task(_exchange(port, b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n"))
        await asyncio.sleep(0.05)
        await server.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        idle_rest = await asyncio.wait_for(idle_reader.read(), 5)
        idle.close()
        return await busy, idle_rest

    busy, idle_rest = arun(scenario())
    assert _bodies(busy) == [b"GET /slow 0 "] and b"Connection: close" in busy
    assert idle_rest == b""


def test_handler_errors_are_500_and_a_unix_socket_serves(tmp_path: Path) -> None:
    async def failing(request: Request) -> Response:
        raise RuntimeError("boom")

    async def scenario() -> bytes:
        server = HTTPServer(failing)
        path = str(tmp_path / "http.sock")
        await server.listen_unix(path)
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"GET / HTTP/1.0\r\n\r\n")
            reply = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return reply
        finally:
            await server.close()

    assert arun(scenario()).startswith(b"HTTP/1.0 500 Internal Server Error\r\n")


def test_a_wrong_request_line_is_refused_before_the_head_ends() -> None:
    # what go-nsq sends first: the magic, then IDENTIFY; never a blank line
    replies = arun(
        _serving(lambda port: _exchange(port, b"  V2", b"IDENTIFY\n\x00\x00\x00\x02{}", pause=0.05))
    )
    assert replies == BAD_REQUEST
