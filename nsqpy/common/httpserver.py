"""The HTTP/1.1 server under nsqd's and nsqlookupd's APIs: asyncio, no dependencies.

nsqd and nsqlookupd serve a few small JSON and text routes; aiohttp was most of nsqd's
start-up time and more machinery per request than that needs (issue 16). This module
serves HTTP/1.0 and 1.1 with keep-alive, pipelined requests answered in order, HEAD,
``Connection: close``, bodies by ``Content-Length`` or chunked, ``Expect:
100-continue`` (as Go's: see :meth:`HTTPConnection._reading`; any other expectation gets
Go's 417), over TCP or a unix socket, with or without TLS.

It follows Go's ``net/http`` where a request is refused: the head (request line and
headers) may take ``httplimits.MAX_HEADER_BYTES``, with no other limit on a line or on
the number of headers; past it Go's 431 reply, and a malformed head gets Go's ``400 Bad
Request`` (``501`` for a transfer coding other than chunked, ``505`` for an HTTP
version other than 1.x), then the connection closes. Replies are written as aiohttp
wrote them for these APIs: the handler's headers in order, ``Content-Length``, ``Date``,
``Connection`` when it differs from the version's default.

Layered as h11: :func:`parse_head`, :class:`ChunkedDecoder` and :func:`encode_response`
are pure (bytes in, values out, :class:`BadRequest` for the peer's mistakes);
:class:`HTTPConnection` only moves bytes and runs the handler; :class:`HTTPServer` owns
the listeners and the graceful close.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import traceback
from collections.abc import Callable, Coroutine, Generator, Iterator
from typing import TYPE_CHECKING, Any, Final, cast

from nsqpy.common.httplimits import CLOSE_DELAY, MAX_HEADER_BYTES, TOO_LARGE

if TYPE_CHECKING:
    import ssl

    from nsqpy.common.log import Logger

__all__ = [
    "BadRequest",
    "BodyError",
    "BodyTooLarge",
    "ChunkedDecoder",
    "HTTPConnection",
    "HTTPServer",
    "Handler",
    "Headers",
    "Request",
    "Response",
    "encode_response",
    "parse_head",
    "parse_request_line",
]

KEEP_ALIVE_TIMEOUT: Final = 75.0  # an idle connection is closed after 75 to 150 s (aiohttp: 75)
LINGER_TIMEOUT: Final = 10.0  # how long an unread body is drained before a close (aiohttp: 10)
_MAX_CHUNK_LINE: Final = 4096  # Go's chunked reader: "header line too long"


def _go_reply(status: bytes, text: bytes | None = None) -> bytes:
    # net/http's fixed replies to requests it does not serve (server.go, errorHeaders)
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\n\r\n" + (status if text is None else text)
    )


_BAD_REQUEST: Final = _go_reply(b"400 Bad Request")
_NO_HOST: Final = _go_reply(b"400 Bad Request: missing required Host header")
_UNSUPPORTED_TE: Final = _go_reply(b"501 Not Implemented", b"Unsupported transfer encoding")
_BAD_VERSION: Final = _go_reply(b"505 HTTP Version Not Supported")
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


def _expectation_failed(request: Request) -> bytes:
    # net/http's sendExpectationFailed, byte for byte (no Content-Length to a HEAD)
    return b"HTTP/1.%d 417 Expectation Failed\r\nConnection: close\r\nDate: %s\r\n%s\r\n" % (
        request.version[1],
        _date(),
        b"" if request.method == "HEAD" else b"Content-Length: 0\r\n",
    )


# Go's StatusText for what these servers answer (Python's phrases differ between versions)
_REASONS: Final = {
    200: "OK",
    301: "Moved Permanently",
    308: "Permanent Redirect",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_TOKEN: Final = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
_HEX: Final = b"0123456789abcdefABCDEF"


# -- errors -----------------------------------------------------------------------------------
#
#   BadRequest        the head broke the protocol: reply with .reply and close
#   BodyError         the body was cut short or its chunked coding broken
#   BodyTooLarge      Request.read(limit): the body is longer than the limit


class BadRequest(Exception):
    """The peer sent what Go's server refuses; ``reply`` is Go's answer, byte for byte."""

    def __init__(self, reply: bytes = _BAD_REQUEST) -> None:
        super().__init__(reply.split(b"\r\n", 1)[0].decode("latin-1"))
        self.reply = reply


class BodyError(Exception):
    """The request body ended early (the connection closed) or its chunked coding is broken.

    An Exception, not a ConnectionError: mypyc compiles no subclass of OSError (see
    hatch_build.py), and the handlers catch it by name (a handler that does not: a 500)."""


class BodyTooLarge(Exception):
    """The request body is longer than the limit given to :meth:`Request.read`."""


# -- requests ---------------------------------------------------------------------------------


class Headers:
    """A request's headers by name, ignoring case; a repeated header's values joined by ", "."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self._values = values if values is not None else {}  # lower-case name -> value

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def items(self) -> Iterator[tuple[str, str]]:
        """(lower-case name, value) pairs in the order they came."""
        return iter(self._values.items())


class Request:
    """One request: its head, parsed, and its body, read with :meth:`read`.

    ``raw_path`` is the request target as sent (path and query), ``path`` its path
    percent-decoded (Go's ``URL.Path``), ``query_string`` the raw text after ``?``.
    ``content_length`` is None for a chunked body. ``expect_continue``: the client holds
    its body back for a ``100 Continue`` (Go's test: an HTTP/1.1 request with a body whose
    first ``Expect`` header has the token ``100-continue``, any case);
    ``expectation_failed``: its first ``Expect`` is something else, which Go answers with
    a 417 before any handler.
    """

    __slots__ = (
        "_complete",
        "_connection",
        "_continue",
        "_error",
        "_parts",
        "_read_whole",
        "_size",
        "_waiter",
        "chunked",
        "content_length",
        "expect_continue",
        "expectation_failed",
        "headers",
        "keep_alive",
        "method",
        "path",
        "peername",
        "query_string",
        "raw_path",
        "secure",
        "version",
    )

    def __init__(
        self,
        method: str,
        raw_path: str,
        path: str,
        query_string: str,
        version: tuple[int, int],
        headers: Headers,
        content_length: int | None,
        keep_alive: bool,
        expect_continue: bool = False,
        expectation_failed: bool = False,
    ) -> None:
        self.method = method
        self.raw_path = raw_path
        self.path = path
        self.query_string = query_string
        self.version = version
        self.headers = headers
        self.content_length = content_length
        self.chunked = content_length is None
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.expectation_failed = expectation_failed
        self.secure = False
        self.peername: Any = None  # the socket's getpeername(): (host, port, ...) or ""
        self._parts: list[bytes] = []
        self._size = 0
        self._complete = content_length == 0
        self._error: BodyError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._connection: HTTPConnection | None = None
        self._continue = expect_continue  # a 100 Continue is owed at the first read
        self._read_whole = False  # the handler read the body to its end

    async def read(self, limit: int = -1) -> bytes:
        """The whole body. With ``limit`` >= 0, raises :class:`BodyTooLarge` as soon as
        the body is known to be longer, without reading the rest. Raises
        :class:`BodyError` when the body ends early or its chunked coding is broken."""
        if self._continue and self._connection is not None:
            self._connection._reading(self)
        if 0 <= limit < (self.content_length or 0):
            raise self._too_large(limit)
        while not self._complete:
            if self._error is not None:
                raise self._error
            if 0 <= limit < self._size:
                raise self._too_large(limit)
            if self._connection is None:
                raise BodyError("the body is not being received")
            self._waiter = self._connection.want_body()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if 0 <= limit < self._size:
            raise self._too_large(limit)
        self._read_whole = True
        parts = self._parts
        if len(parts) == 1:
            return parts[0]
        body = b"".join(parts)
        self._parts = [body]
        return body

    def _too_large(self, limit: int) -> BodyTooLarge:
        # Go's handlers read through LimitReader(body, limit + 1): a body of just one byte
        # more, all in, is read to its end all the same (see HTTPConnection._reading).
        if self._complete and self._size == limit + 1:
            self._read_whole = True
        return BodyTooLarge()

    # the connection's side

    def _add(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)
        self._wake()

    def _end(self, error: BodyError | None = None) -> None:
        if error is None:
            self._complete = True
        else:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Response:
    """A reply: status, body and headers (in the order they are to be written).

    ``Content-Length``, ``Date`` and ``Connection`` are added when written; a non-empty
    body without ``Content-Type`` is sent as ``application/octet-stream``.
    """

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else {}
        self.reason = reason


Handler = Callable[[Request], Coroutine[Any, Any, Response]]
# The reply to an expectation other than 100-continue (written by _expectation_failed)
_EXPECTATION_FAILED: Final = Response(417)
# A route answered at once from a request whose whole body came with its head (see
# HTTPServer.quick_routes): a Response, or None to leave the request to the handler.
# The route keeps neither the request (a connection hands the same Request to each
# request with the same head) nor changes a Response it returns again and again (whose
# head a connection encodes once).
QuickHandler = Callable[[Request, bytes], Response | None]
# The longest head a connection remembers for its quick lane (HTTPConnection._lane_head)
_LANE_HEAD_BYTES: Final = 1024


# -- the head -------------------------------------------------------------------------------


def find_head_end(data: bytes | bytearray, start: int = 0) -> int:
    """The index just past the blank line ending a head that begins at or before
    ``start``, or -1. Lines may end in CRLF or, as Go allows, a bare LF."""
    crlf = data.find(b"\n\r\n", start)
    lf = data.find(b"\n\n", start, crlf + 1 if crlf >= 0 else len(data))
    if lf >= 0:
        return lf + 2
    return crlf + 3 if crlf >= 0 else -1


def _unquote_path(path: str) -> str:
    # Go's url.PathUnescape: %XX must be two hex digits; '+' stays a '+'
    pieces = path.split("%")
    out = bytearray(pieces[0].encode("utf-8", "surrogateescape"))
    for piece in pieces[1:]:
        pair = piece[:2]
        if len(pair) < 2 or pair.strip("0123456789abcdefABCDEF"):
            raise BadRequest
        out.append(int(pair, 16))
        out += piece[2:].encode("utf-8", "surrogateescape")
    return out.decode("utf-8", "surrogateescape")


def parse_request_line(line: str) -> tuple[str, str, int]:
    """Method, target and minor version of a request line (Go's ``parseRequestLine`` and
    ``ParseHTTPVersion``); raises :class:`BadRequest`."""
    parts = line.split(" ")
    if len(parts) != 3:
        raise BadRequest
    method, target, proto = parts
    if proto == "HTTP/1.1":
        minor = 1
    elif proto == "HTTP/1.0":
        minor = 0
    elif len(proto) == 8 and proto[:5] == "HTTP/" and proto[5].isdigit() and proto[6] == ".":
        if not proto[7].isdigit():
            raise BadRequest
        raise BadRequest(_BAD_VERSION if proto[5] != "1" else _BAD_REQUEST)
    else:
        raise BadRequest
    if not method or not _TOKEN.issuperset(method):
        raise BadRequest
    return method, target, minor


# Heads already parsed, by their bytes: a keep-alive client usually sends the same head
# again and again (a producer's POST /pub?topic=...), and a dict lookup is much cheaper
# than the parse. Bounded: emptied when full, heads longer than _CACHED_HEAD_BYTES skipped.
_HEADS: Final[dict[bytes, tuple[Any, ...]]] = {}
_CACHED_HEADS: Final = 256
_CACHED_HEAD_BYTES: Final = 1024


def parse_head(head: bytes) -> Request:
    """A request from its head (the request line through the blank line), as Go's
    ``readRequest`` reads it; raises :class:`BadRequest` with Go's reply.

    Requests with the same head share its :class:`Headers`, which nothing changes."""
    fields = _HEADS.get(head)
    if fields is None:
        fields = _parse_head(head)
        if len(head) <= _CACHED_HEAD_BYTES:
            if len(_HEADS) >= _CACHED_HEADS:
                _HEADS.clear()
            _HEADS[head] = fields
    return Request(*fields)


def _parse_head(head: bytes) -> tuple[Any, ...]:
    """:func:`parse_head`'s work: the arguments of the :class:`Request`."""
    text = head.decode("utf-8", "surrogateescape")
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    method, target, minor = parse_request_line(lines[0])
    raw_path = target
    if target[:1] != "/":
        # absolute-form (http://host/path) or OPTIONS's "*", as url.ParseRequestURI takes them
        scheme, sep, rest = target.partition("://")
        if sep and scheme.isalpha():
            slash = rest.find("/")
            raw_path = rest[slash:] if slash >= 0 else "/"
        elif target != "*":
            raise BadRequest
    path, _, query_string = raw_path.partition("?")
    if "%" in path:
        path = _unquote_path(path)

    values: dict[str, str] = {}
    expect = ""  # the first Expect header's value: Go's Header.get reads no further
    for line in lines[1:]:
        if not line:
            break
        name, sep, value = line.partition(":")
        if not sep or not name or name[-1] in " \t" or name[0] in " \t":
            raise BadRequest  # no colon, a space before it, or an obsolete line folding
        key = name.lower()
        value = value.strip(" \t")
        seen = values.get(key)
        if seen is None:
            values[key] = value
            if key == "expect":
                expect = value
        elif key == "content-length":
            if seen != value:
                raise BadRequest  # Go: "cannot contain multiple Content-Length headers"
        elif key == "host":
            raise BadRequest  # Go: "too many Host headers"
        else:
            values[key] = seen + ", " + value
    if minor == 1 and "host" not in values:
        raise BadRequest(_NO_HOST)

    content_length: int | None = 0
    encoding = values.get("transfer-encoding")
    if encoding is not None and minor == 1:
        if encoding.lower() != "chunked":
            raise BadRequest(_UNSUPPORTED_TE)
        content_length = None  # chunked wins over a Content-Length, which Go drops
    else:
        length = values.get("content-length")
        if length is not None:
            if not length.isdigit() or not length.isascii() or len(length) > 18:
                raise BadRequest  # Go: "bad Content-Length"
            content_length = int(length)

    connection = values.get("connection")
    if connection is None:
        keep_alive = minor == 1
    else:
        tokens = connection.lower()
        if minor == 1:
            keep_alive = "close" not in [t.strip() for t in tokens.split(",")]
        else:
            keep_alive = "keep-alive" in [t.strip() for t in tokens.split(",")]
    # Go's server: "100-continue" among the first Expect's tokens waits for the body's
    # first read, with HTTP/1.1 and a body (a chunked one, or a Content-Length but 0);
    # any other expectation is a 417.
    expects_continue = bool(expect) and _has_token(expect, "100-continue")
    return (
        method,
        target,
        path,
        query_string,
        (1, minor),
        Headers(values),
        content_length,
        keep_alive,
        expects_continue and minor == 1 and content_length != 0,
        bool(expect) and not expects_continue,
    )


def _has_token(value: str, token: str) -> bool:
    """Go's ``hasToken``: ``token`` (lower case) in ``value``, any ASCII case, bounded by
    the value's ends, spaces, tabs or commas."""
    folded = value.lower()
    size = len(token)
    start = folded.find(token)
    while start >= 0:
        end = start + size
        if (start == 0 or folded[start - 1] in " ,\t") and (
            end == len(folded) or folded[end] in " ,\t"
        ):
            return True
        start = folded.find(token, start + 1)
    return False


# -- bodies ---------------------------------------------------------------------------------


# ChunkedDecoder's states: reading a size line, a chunk's data, the CRLF after it, trailers
_AT_SIZE: Final = 0
_AT_DATA: Final = 1
_AT_DATA_END: Final = 2
_AT_TRAILER: Final = 3


class ChunkedDecoder:
    """The chunked transfer coding: bytes in, the body's pieces out; trailers are dropped.

    Extensions after ``;`` are ignored; a size line (or trailer line) longer than 4096
    bytes, a size that is not hex, or a chunk not followed by CRLF is a :class:`BodyError`.
    """

    __slots__ = ("_line", "_remaining", "_state", "done")

    def __init__(self) -> None:
        self.done = False
        self._state = _AT_SIZE
        self._remaining = 0
        self._line = bytearray()

    def feed(self, data: bytes | bytearray, pos: int = 0) -> tuple[list[bytes], int]:
        """The body pieces in ``data[pos:]`` and the index where the body's end left off
        (``len(data)`` while the body goes on)."""
        pieces: list[bytes] = []
        end = len(data)
        while pos < end and not self.done:
            if self._state == _AT_DATA:
                take = min(self._remaining, end - pos)
                pieces.append(bytes(data[pos : pos + take]))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _AT_DATA_END
                continue
            newline = data.find(b"\n", pos)
            if newline < 0:
                self._line += data[pos:]
                if len(self._line) > _MAX_CHUNK_LINE:
                    raise BodyError("chunked: header line too long")
                return pieces, end
            line = bytes(data[pos:newline])
            pos = newline + 1
            if self._line:
                line = bytes(self._line) + line
                self._line.clear()
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > _MAX_CHUNK_LINE:
                raise BodyError("chunked: header line too long")
            self._line_done(line)
        return pieces, pos

    def _line_done(self, line: bytes) -> None:
        if self._state == _AT_SIZE:
            size = line.split(b";", 1)[0].rstrip(b" \t")
            if not size or len(size) > 16 or size.strip(_HEX):
                raise BodyError("chunked: invalid chunk length")
            self._remaining = int(size, 16)
            self._state = _AT_DATA if self._remaining else _AT_TRAILER
        elif self._state == _AT_DATA_END:
            if line:
                raise BodyError("chunked: malformed chunked encoding")
            self._state = _AT_SIZE
        elif not line:  # _AT_TRAILER: the blank line ends the body
            self.done = True


# -- replies --------------------------------------------------------------------------------

_date_second = -1
_date_bytes = b""
_DAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS: Final = (
    "",
    "Jan",
    "Feb",
    "Mar",
    "Apr",
    "May",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Oct",
    "Nov",
    "Dec",
)


def http_date(now: float | None = None) -> str:
    """RFC 9110's IMF-fixdate of ``now`` (default: the current second, cached)."""
    if now is None:
        return _date().decode()
    t = time.gmtime(int(now))
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def _date() -> bytes:
    """:func:`http_date` of the current second, encoded (made once a second)."""
    global _date_second, _date_bytes
    second = int(time.time())
    if second != _date_second:
        _date_second, _date_bytes = second, http_date(second).encode()
    return _date_bytes


def _reason(status: int) -> str:
    reason = _REASONS.get(status)
    if reason is None:
        from http import HTTPStatus

        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
    return reason


# Encoded heads by what they depend on but the date: the bytes before the Date line's value
# and after it (through the blank line), and whether the body follows. Bounded as _HEADS.
_REPLY_HEADS: Final[dict[tuple[Any, ...], tuple[bytes, bytes, bool]]] = {}
_CACHED_REPLY_HEADS: Final = 256


def encode_response(response: Response, request: Request, keep_alive: bool) -> bytes:
    """The bytes of ``response`` to ``request``, ``keep_alive`` or not."""
    before, after, with_body = encoded_head(response, request, keep_alive)
    head = before + _date() + after
    return head + response.body if with_body else head


def encoded_head(
    response: Response, request: Request, keep_alive: bool
) -> tuple[bytes, bytes, bool]:
    """:func:`encode_response`'s head, cut around the Date line's value, and whether the
    body follows it."""
    body = response.body
    key = (
        response.status,
        response.reason,
        *response.headers.items(),
        len(body),
        request.version[1],
        request.method == "HEAD",
        keep_alive,
    )
    parts = _REPLY_HEADS.get(key)
    if parts is None:
        parts = _encode_head(response, request, keep_alive)
        if len(_REPLY_HEADS) >= _CACHED_REPLY_HEADS:
            _REPLY_HEADS.clear()
        _REPLY_HEADS[key] = parts
    return parts


def _encode_head(
    response: Response, request: Request, keep_alive: bool
) -> tuple[bytes, bytes, bool]:
    """:func:`encode_response`'s head, cut around the Date line's value."""
    status = response.status
    headers = response.headers
    body = response.body
    minor = request.version[1]
    lines = [f"HTTP/1.{minor} {status} {response.reason or _reason(status)}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
    bodiless = status < 200 or status == 204 or status == 304
    head_only = request.method == "HEAD"
    if not bodiless:
        if "Content-Length" not in headers and (body or not head_only):
            lines.append(f"Content-Length: {len(body)}\r\n")
        if body and not head_only and "Content-Type" not in headers:
            lines.append("Content-Type: application/octet-stream\r\n")
    lines.append("Date: ")
    before = "".join(lines).encode("utf-8", "surrogateescape")
    lines = ["\r\n"]
    if keep_alive:
        if minor == 0:
            lines.append("Connection: keep-alive\r\n")
    elif minor == 1:
        lines.append("Connection: close\r\n")
    lines.append("\r\n")
    after = "".join(lines).encode("ascii")
    return before, after, not (bodiless or head_only or not body)


# -- the connection -------------------------------------------------------------------------


class _Resumed:
    """Awaitable that carries on a coroutine started by hand, from the future it waits for.

    A handler first runs inside ``data_received``: most finish there without waiting
    for anything, and cost no task. One that waits is handed to a task from that point
    (as Python 3.12's eager tasks do); before its first wait it runs outside any task,
    so it must not use ``asyncio.timeout()`` or ``current_task()`` then.
    """

    __slots__ = ("_around", "_coro", "_waiting")

    def __init__(
        self,
        coro: Coroutine[Any, Any, Response],
        waiting: Any,
        around: tuple[Callable[[], None], Callable[[], None]] | None,
    ) -> None:
        self._coro = coro
        self._waiting = waiting
        self._around = around

    def __await__(self) -> Generator[Any, Any, Response]:
        """Each step of the handler runs inside ``around`` (HTTPServer.around_input), as
        its first one did inside data_received; the last step's ``around[1]`` (or that of
        a step that raised) is left to the caller, to be called once the reply is written."""
        coro = self._coro
        waiting = self._waiting
        hold, release = self._around or (_nothing, _nothing)
        step: Callable[[Any], Any]
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as err:  # a cancellation: passed on to the handler
                step, arg = coro.throw, err
            else:
                step, arg = coro.send, sent
            hold()
            try:
                waiting = step(arg)
            except StopIteration as stop:
                return cast(Response, stop.value)
            # (a step that raises leaves the release to the caller too)
            release()


def _nothing() -> None:
    pass


class HTTPConnection(asyncio.Protocol):
    """One client connection: heads parsed from the bytes received, bodies fed to their
    request, one request handled at a time (later ones wait in the buffer), replies
    written in order."""

    def __init__(self, server: HTTPServer, secure: bool) -> None:
        self._server = server
        self._secure = secure
        self._input_seen = server.input_seen
        self._quick = server.quick_routes
        self._around_input = server.around_input
        self._transport: asyncio.Transport | None = None
        self._peername: Any = None
        self._inbox = bytearray()  # received bytes not yet parsed (the next heads)
        self._scanned = 0  # how much of the inbox is known to hold no head's end
        self._line_checked = False  # the request line of the head being received is valid
        self._current: Request | None = None  # being handled
        self._body: Request | None = None  # whose body is being received
        self._body_left = 0  # of a Content-Length body
        self._chunks: ChunkedDecoder | None = None  # of a chunked body
        self._store_body = False  # False: the handler is done, the body is drained
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self._closing = False  # close once the current reply is written
        self._refused = False  # input is dropped until the close
        self._active = True  # something was received since the idle timer last looked
        self._timer: asyncio.TimerHandle | None = None
        # The lane: the head of the last request a quick route answered on this kept-alive
        # connection, with its Request (reused: a quick route keeps none), its route, the
        # length of its body and the encoded head of its reply. A request with the very
        # same head (a publisher's POSTs, one after another) skips the parse and the
        # encoding.
        self._lane_head = b""
        self._lane_request: Request | None = None
        self._lane_quick: QuickHandler | None = None
        self._lane_length = 0
        self._lane_response: Response | None = None
        self._lane_parts: tuple[bytes, bytes, bool] = (b"", b"", False)

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._peername = transport.get_extra_info("peername")
        self._server._connections.add(self)
        self._timer = asyncio.get_running_loop().call_later(KEEP_ALIVE_TIMEOUT, self._idle_check)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._lost(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        body = self._body
        if body is not None:
            self._body = None
            body._end(BodyError("the connection closed before the body's end"))
        self._inbox = bytearray()

    def eof_received(self) -> bool:
        # The client will send no more: answer what it sent, then close.
        self._closing = True
        body = self._body
        if body is not None:
            self._body = self._chunks = None
            body._end(BodyError("the body ended early"))
        return self._current is not None  # False: nothing to answer, the transport closes

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._input_seen()
        self._active = True
        around = self._around_input
        if around is None:
            self._received(data)
            return
        around[0]()
        try:
            self._received(data)
        finally:
            around[1]()

    def _received(self, data: bytes) -> None:
        start = 0
        if self._body is not None:
            start = self._feed_body(data, 0)
            if start == len(data) or self._refused:
                return
        if self._current is not None or self._inbox:
            self._inbox += memoryview(data)[start:] if start else data
            if self._current is None:
                self._process(self._inbox)
            elif len(self._inbox) > MAX_HEADER_BYTES and not self._paused:
                self._paused = True  # pipelined requests pile up behind a slow one
                self._transport.pause_reading()  # type: ignore[union-attr]
        else:
            self._process(data if not start else memoryview(data)[start:].tobytes())

    # -- parsing ----------------------------------------------------------------------------

    def _process(self, buf: bytes | bytearray) -> None:
        """Handle the requests in ``buf`` one after the other while each finishes at once;
        keep what is left in the inbox."""
        pos = 0
        end = len(buf)
        while self._current is None and not self._closing and not self._refused:
            while pos < end and buf[pos] in b"\r\n":
                pos += 1  # empty lines before a request line are ignored (RFC 9112 2.2)
            if pos == end:
                break
            replayed = False
            lane = self._lane_head
            if lane and buf.startswith(lane, pos):
                body_end = pos + len(lane) + self._lane_length
                if body_end <= end:
                    self._scanned = 0
                    self._line_checked = False
                    request = cast(Request, self._lane_request)
                    body = bytes(buf[body_end - self._lane_length : body_end])
                    response = self._ask(cast(QuickHandler, self._lane_quick), request, body)
                    if response is not None:
                        pos = body_end
                        self._reply(request, response)
                        continue
                    replayed = True  # the route said no: the handler's, as in full below
            head_end = find_head_end(buf, max(pos, pos + self._scanned - 3))
            if head_end < 0:
                if end - pos > MAX_HEADER_BYTES:
                    self._refuse(TOO_LARGE)
                    return
                if not self._line_checked:
                    # Go reads the request line first: a wrong one is refused at once
                    # (a TCP client sending "  V2" to the HTTP port gets its 400 now).
                    newline = buf.find(b"\n", pos)
                    if newline >= 0:
                        line = bytes(buf[pos:newline]).rstrip(b"\r")
                        try:
                            parse_request_line(line.decode("utf-8", "surrogateescape"))
                        except BadRequest as err:
                            self._refuse(err.reply)
                            return
                        self._line_checked = True
                self._scanned = end - pos
                break
            self._scanned = 0
            self._line_checked = False
            if head_end - pos > MAX_HEADER_BYTES:
                self._refuse(TOO_LARGE)
                return
            head = bytes(buf[pos:head_end])
            try:
                request = parse_head(head)
            except BadRequest as err:
                self._refuse(err.reply)
                return
            pos = head_end
            request.secure = self._secure
            request.peername = self._peername
            if self._quick and not replayed and not request.expectation_failed:
                quick = self._quick.get(request.path)
                length = request.content_length
                if quick is not None and length is not None and pos + length <= end:
                    response = self._ask(quick, request, bytes(buf[pos : pos + length]))
                    if response is not None:
                        pos += length
                        # (a request expecting 100-continue owes its own interim reply:
                        # not one for the lane, which reuses its Request)
                        if (
                            request.keep_alive
                            and not request.expect_continue
                            and len(head) <= _LANE_HEAD_BYTES
                        ):
                            self._lane_head = head
                            self._lane_request = request
                            self._lane_quick = quick
                            self._lane_length = length
                            self._lane_response = response
                            self._lane_parts = encoded_head(response, request, True)
                        self._reply(request, response)
                        continue
            self._current = request  # a broken body is the handler's to see (Go: a 500)
            if not request._complete:
                request._connection = self
                self._body = request
                self._store_body = True
                if request.chunked:
                    self._chunks = ChunkedDecoder()
                else:
                    self._body_left = cast(int, request.content_length)
                pos = self._feed_body(buf, pos)
            self._start(request)
        if self._refused:
            return
        if buf is self._inbox:
            del buf[:pos]
        elif pos < end:
            self._inbox += memoryview(buf)[pos:]

    def _feed_body(self, data: bytes | bytearray, pos: int) -> int:
        """Give ``data[pos:]`` to the body being received; where that body ended."""
        request = self._body
        assert request is not None
        chunks = self._chunks
        if chunks is None:
            take = min(self._body_left, len(data) - pos)
            if self._store_body:
                request._add(bytes(data[pos : pos + take] if pos or take < len(data) else data))
            self._body_left -= take
            pos += take
            if self._body_left:
                return pos
        else:
            try:
                pieces, pos = chunks.feed(data, pos)
            except BodyError as err:
                self._body = self._chunks = None
                request._end(err)
                self._closing = True  # the rest of the stream cannot be read
                if self._current is None:
                    self._close()
                self._refused = True  # input is dropped from here on
                return len(data)
            if self._store_body:
                for piece in pieces:
                    request._add(piece)
            if not chunks.done:
                return pos
            self._chunks = None
        self._body = None
        request._end()
        if self._closing and self._current is None:
            self._close()  # a drained body: now the connection can close cleanly
        return pos

    def want_body(self) -> asyncio.Future[None]:
        """For :meth:`Request.read`: a future set when more of the body arrives."""
        transport = self._transport
        if self._current is not None and transport is not None and self._paused:
            self._paused = False
            transport.resume_reading()
        return asyncio.get_running_loop().create_future()

    def _reading(self, request: Request, whole: bool = False) -> None:
        """``Expect: 100-continue`` as Go's server keeps it (its expectContinueReader), one
        rule for a handler's :meth:`Request.read` and a quick route's answer alike:

        * the first read of the body of a request that expects it writes ``HTTP/1.1 100
          Continue`` before anything else, whether or not the body has already come
          (a quick route that answers has read the body: ``whole``);
        * a request answered without its body read to the end (never read, or past a
          limit) closes the connection after the reply (:meth:`_reply`).
        """
        if request._continue:
            request._continue = False
            transport = self._transport
            if transport is not None and not transport.is_closing():
                transport.write(_CONTINUE)
        if whole:
            request._read_whole = True

    # -- handling -------------------------------------------------------------------------

    def _start(self, request: Request) -> None:
        if request.expectation_failed:  # Go's 417, before any handler
            self._finish(request, _EXPECTATION_FAILED)
            return
        coro = self._server.handler(request)
        try:
            waiting = coro.send(None)
        except StopIteration as done:
            self._finish(request, done.value)
            return
        except Exception as err:
            self._finish(request, self._server.crashed(err))
            return
        self._task = asyncio.get_running_loop().create_task(self._carry_on(request, coro, waiting))

    async def _carry_on(
        self, request: Request, coro: Coroutine[Any, Any, Response], waiting: Any
    ) -> None:
        around = self._around_input
        try:
            try:
                response = await _Resumed(coro, waiting, around)
            except Exception as err:
                response = self._server.crashed(err)
            self._task = None
            self._finish(request, response)
            if self._inbox and self._current is None:
                self._process(self._inbox)
        finally:
            if around is not None:  # what the last step published goes out after the replies
                around[1]()
        if self._paused and self._current is None:
            self._paused = False
            if self._transport is not None:
                self._transport.resume_reading()

    def _finish(self, request: Request, response: Response) -> None:
        self._current = None
        request._connection = None
        self._reply(request, response)

    def _reply(self, request: Request, response: Response) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        keep_alive = (
            request.keep_alive
            and not self._closing
            and not self._server.closing
            and (request._read_whole or not request.expect_continue)  # see _reading
        )
        if response is self._lane_response and request is self._lane_request and keep_alive:
            before, after, with_body = self._lane_parts
            head = before + _date() + after
            transport.write(head + response.body if with_body else head)
        elif response is _EXPECTATION_FAILED:
            keep_alive = False
            transport.write(_expectation_failed(request))
        else:
            transport.write(encode_response(response, request, keep_alive))
        if self._body is request:
            self._store_body = False  # unread: drained so the next request can be read
            request._parts = []
        if not keep_alive:
            self._closing = True
            if self._body is None:
                self._close()
            else:
                # Drain the rest of the body first, so that the client reads the reply
                # rather than a reset; LINGER_TIMEOUT at most.
                asyncio.get_running_loop().call_later(LINGER_TIMEOUT, transport.abort)

    def _ask(self, quick: QuickHandler, request: Request, body: bytes) -> Response | None:
        """``quick``'s answer to ``request``; one that raises is answered as a handler
        that raises, with a logged 500. An answer is a read of the whole body."""
        try:
            response = quick(request, body)
        except Exception as err:
            response = self._server.crashed(err)
        if response is not None and request.expect_continue:  # (the rule is _reading's)
            self._reading(request, whole=True)
        return response

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _refuse(self, reply: bytes) -> None:
        # Go's closeWriteAndWait: reply, half-close, and keep reading a while before the
        # close, so that the client reads the reply rather than a reset.
        self._refused = True
        self._inbox = bytearray()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(reply)
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(CLOSE_DELAY, transport.close)

    def _idle_check(self) -> None:
        if self._active or self._current is not None or self._body is not None:
            self._active = False
            self._timer = asyncio.get_running_loop().call_later(
                KEEP_ALIVE_TIMEOUT, self._idle_check
            )
        else:
            self._timer = None
            self._close()

    def shutdown(self) -> None:
        """The server closes: close now when idle, else after the reply in progress."""
        self._closing = True
        if self._current is None and self._body is None:
            self._close()

    def abort(self) -> None:
        """Close now, and cancel the handler still running."""
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()


# -- the server -----------------------------------------------------------------------------


class HTTPServer:
    """Listeners that serve ``handler``; :meth:`close` stops them gracefully.

    A handler that raises gets a 500 reply and the error logged; the routers above
    answer their own errors.
    """

    def __init__(
        self, handler: Handler, logger: Logger | None = None, shutdown_timeout: float = 1.0
    ) -> None:
        self.handler = handler
        self.logger = logger
        self.shutdown_timeout = shutdown_timeout
        self.closing = False
        self._listeners: list[asyncio.AbstractServer] = []
        self._connections: set[HTTPConnection] = set()
        self._idle: asyncio.Future[None] | None = None
        # told of every read (common/idlepoll.py; returns its time); set before listening
        self.input_seen: Callable[[], float] = time.monotonic
        # By path: answered without the handler when the body came whole with the head
        # (a publisher's POST), unless the quick handler returns None. Set before listening.
        self.quick_routes: dict[str, QuickHandler] = {}
        # Called before and after a read's requests are handled (set before listening):
        # nsqd holds deliveries until then, so that the replies go out first.
        self.around_input: tuple[Callable[[], None], Callable[[], None]] | None = None

    async def listen_tcp(
        self, host: str | None, port: int, ssl: ssl.SSLContext | None = None
    ) -> Any:
        """Listen on ``host:port`` (None: every interface; 0: any free port); the
        socket's name (``(host, port, ...)``)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: HTTPConnection(self, ssl is not None),
            host,
            port,
            ssl=ssl,
            reuse_address=True,
            backlog=1024,
        )
        return self._listening(server)

    async def listen_unix(self, path: str, ssl: ssl.SSLContext | None = None) -> Any:
        """Listen on the unix socket ``path``; the socket's name."""
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(
            lambda: HTTPConnection(self, ssl is not None), path, ssl=ssl, backlog=1024
        )
        return self._listening(server)

    async def listen_socket(self, sock: Any, ssl: ssl.SSLContext | None = None) -> Any:
        """Serve on ``sock``, a listening socket opened elsewhere (nsqd --workers shares
        the supervisor's); its name."""
        loop = asyncio.get_running_loop()
        factory = lambda: HTTPConnection(self, ssl is not None)  # noqa: E731
        if sock.family == socket.AF_UNIX:
            server = await loop.create_unix_server(factory, sock=sock, ssl=ssl)
        else:
            server = await loop.create_server(factory, sock=sock, ssl=ssl)
        return self._listening(server)

    def _listening(self, listener: Any) -> Any:
        """Keep ``listener``; its socket's name. (Any: uvloop's ``sockets`` is a list where
        typeshed says tuple, which the compiled module would refuse with a TypeError.)"""
        self._listeners.append(listener)
        return listener.sockets[0].getsockname()

    async def close(self) -> None:
        """Stop listening, close idle connections, let the requests in progress finish
        (``shutdown_timeout`` at most), then close what is left."""
        self.closing = True
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        for connection in list(self._connections):
            connection.shutdown()
        if self._connections:
            self._idle = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._idle), self.shutdown_timeout)
            for connection in list(self._connections):
                connection.abort()
            await asyncio.sleep(0)

    def crashed(self, err: Exception) -> Response:
        """The reply for a handler that raised ``err``."""
        if self.logger is not None:
            self.logger.error(f"HTTP: handler failed - {err!r}\n{traceback.format_exc()}")
        return Response(500, b"500 Internal Server Error", {"Content-Type": "text/plain"})

    def _lost(self, connection: HTTPConnection) -> None:
        self._connections.discard(connection)
        if not self._connections and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
