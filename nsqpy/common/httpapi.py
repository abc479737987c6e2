"""The HTTP plumbing nsqd and nsqlookupd share: NSQ's ``internal/http_api`` and its router.

Routing is NSQ's (``julienschmidt/httprouter``): method-strict, ``404
{"message":"NOT_FOUND"}`` for an unknown path, ``405 {"message":"METHOD_NOT_ALLOWED"}``
with an ``Allow`` header for a known path and another method, automatic ``OPTIONS``
replies, and a redirect for a path that only differs by a trailing slash. Replies
follow ``http_api.RespondV1``: ``X-NSQ-Content-Type: nsq; version=1.0`` on every V1
reply, strings written raw, anything else as JSON, errors as ``{"message": <TEXT>}``.
Parameters come from the query string only, parsed like Go's ``url.ParseQuery``.
Requests and replies are those of our own server (:mod:`nsqpy.common.httpserver`).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from nsqpy.common.goflags import format_duration_ns
from nsqpy.common.gojson import encode_json
from nsqpy.common.httpserver import Request, Response
from nsqpy.common.log import Logger
from nsqpy.common.net import format_address
from nsqpy.wire.names import go_quote, is_valid_channel_name, is_valid_topic_name

__all__ = [
    "JSON_CONTENT_TYPE",
    "TEXT_CONTENT_TYPE",
    "V1_HEADER",
    "HTTPError",
    "Handler",
    "QueryError",
    "ReqParams",
    "Route",
    "Router",
    "parse_query",
    "text_response",
    "v1_error",
    "v1_response",
]

V1_HEADER: Final = ("X-NSQ-Content-Type", "nsq; version=1.0")
JSON_CONTENT_TYPE: Final = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE: Final = "text/plain; charset=utf-8"


class HTTPError(Exception):
    """``http_api.Err``: the reply's status and its ``message`` text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


# -- the query string -----------------------------------------------------------------------


class QueryError(ValueError):
    """The query string is not valid for Go's ``url.ParseQuery``."""


def _unescape(text: str) -> str:
    # url.QueryUnescape: '+' is a space, '%' must be followed by two hex digits.
    if "%" not in text and "+" not in text:
        return text
    out = bytearray()
    raw = text.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(raw):
        b = raw[i]
        if b == 0x25:  # '%'
            pair = raw[i + 1 : i + 3]
            if len(pair) < 2 or not all(c in b"0123456789abcdefABCDEF" for c in pair):
                raise QueryError(f"invalid URL escape {go_quote(raw[i : i + 3].decode('latin-1'))}")
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if b == 0x2B else b)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def parse_query(raw_query: str) -> dict[str, list[str]]:
    """Go's ``url.ParseQuery``: keys in order, every value kept; raises QueryError."""
    values: dict[str, list[str]] = {}
    error: QueryError | None = None
    for part in raw_query.split("&"):
        if ";" in part:
            error = error or QueryError("invalid semicolon separator in query")
            continue
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            values.setdefault(_unescape(key), []).append(_unescape(value))
        except QueryError as err:
            error = error or err
    if error is not None:
        raise error
    return values


# Query strings already parsed (a producer sends the same ?topic= again and again); the
# values are shared and never changed. Bounded: emptied when full, long queries skipped.
_QUERIES: Final[dict[str, dict[str, list[str]]]] = {}
_CACHED_QUERIES: Final = 256
_CACHED_QUERY_CHARS: Final = 1024


class ReqParams:
    """``http_api.ReqParams``: the query string's values (the body is never read).

    An unparsable query string is a 400 ``INVALID_REQUEST``.
    """

    def __init__(self, request: Request) -> None:
        query = request.query_string
        values = _QUERIES.get(query)
        if values is None:
            try:
                values = parse_query(query)
            except QueryError:
                raise HTTPError(400, "INVALID_REQUEST") from None
            if len(query) <= _CACHED_QUERY_CHARS:
                if len(_QUERIES) >= _CACHED_QUERIES:
                    _QUERIES.clear()
                _QUERIES[query] = values
        self.values: Mapping[str, list[str]] = values  # shared by requests with this query

    def get(self, key: str) -> str | None:
        """The first value of ``key``, or None when the key is absent."""
        values = self.values.get(key)
        return values[0] if values else None

    def topic(self) -> str:
        """``topic``, unchecked; 400 MISSING_ARG_TOPIC when absent."""
        topic = self.get("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return topic

    def topic_channel(self) -> tuple[str, str]:
        """``http_api.GetTopicChannelArgs``: both names, checked in Go's order."""
        topic = self.topic()
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = self.get("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel


# -- replies --------------------------------------------------------------------------------


def v1_response(data: object, status: int = 200, *, sort_keys: bool = False) -> Response:
    """``http_api.RespondV1``: str/bytes raw, None empty, anything else JSON.

    ``sort_keys`` for data Go holds in maps all the way down (json.Marshal sorts
    the keys of maps at every level, structs keep their field order).
    """
    headers = {V1_HEADER[0]: V1_HEADER[1]}
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if isinstance(data, bytes):
        if data:
            headers["Content-Type"] = TEXT_CONTENT_TYPE  # what Go's content sniffing says
        return Response(status, data, headers)
    if data is None:
        return Response(status, b"", headers)
    headers["Content-Type"] = JSON_CONTENT_TYPE
    return Response(status, encode_json(data, sort_keys=sort_keys), headers)


def v1_error(status: int, text: str) -> Response:
    """``http_api.RespondV1`` for an error: ``{"message": text}``."""
    headers = {V1_HEADER[0]: V1_HEADER[1], "Content-Type": JSON_CONTENT_TYPE}
    return Response(status, encode_json({"message": text}), headers)


def text_response(status: int, text: str, content_type: str = TEXT_CONTENT_TYPE) -> Response:
    """A plain reply (Go's ``PlainText`` decorator): no NSQ header."""
    return Response(status, text.encode("utf-8", "surrogateescape"), {"Content-Type": content_type})


# -- routing --------------------------------------------------------------------------------

Handler = Callable[[Request, str], Awaitable[object]]
"""A route's handler: the request and the path's ``:name`` parameter ("" if none)."""


@dataclass(frozen=True)
class Route:
    """One method of one path. ``v1`` handlers return data or raise HTTPError; the
    others return their own response. ``log`` is Go's ``http_api.Log`` decorator."""

    handler: Handler
    v1: bool = True
    log: bool = True


class Router:
    """httprouter's routing table and NSQ's decorators around every handler.

    A path may end in one ``:name`` segment (``/config/:opt``), which matches any
    non-empty segment and is passed to the handler.
    """

    def __init__(self, logger: Logger) -> None:
        self.logger = logger
        self.routes: dict[str, dict[str, Route]] = {}  # path -> method -> route
        self._prefixes: dict[str, str] = {}  # "/config/" -> "/config/:opt"

    def add(
        self, method: str, path: str, handler: Handler, *, v1: bool = True, log: bool = True
    ) -> None:
        """Serve ``method path`` with ``handler`` (see :class:`Route`)."""
        self.routes.setdefault(path, {})[method] = Route(handler, v1=v1, log=log)
        prefix, _, last = path.rpartition("/")
        if last.startswith(":"):
            self._prefixes[prefix + "/"] = path

    def match(self, path: str) -> tuple[dict[str, Route] | None, str]:
        """The methods served at ``path`` and its ``:name`` parameter, if any."""
        methods = self.routes.get(path)
        if methods is not None:
            return methods, ""
        for prefix, pattern in self._prefixes.items():
            if path.startswith(prefix):
                param = path[len(prefix) :]
                if param and "/" not in param:
                    return self.routes[pattern], param
        return None, ""

    async def handle(self, request: Request) -> Response:
        """Route ``request``, logging it as ``http_api.Log`` does when the route says so."""
        started = time.perf_counter_ns()
        response, logged = await self.dispatch(request)
        if logged:
            elapsed = format_duration_ns(time.perf_counter_ns() - started)
            self.logger.info(
                f"{response.status} {request.method} {request.raw_path} "
                f"({format_address(request.peername or '')}) {elapsed}"
            )
        return response

    async def dispatch(self, request: Request) -> tuple[Response, bool]:
        """The response to ``request`` and whether to log it."""
        path = request.path
        methods, param = self.match(path)
        if methods is None or request.method not in methods:
            if request.method == "OPTIONS" and request.raw_path == "*":
                return Response(200, b""), False  # Go's net/http answers "OPTIONS *" itself
            target = self._redirect_target(request.method, path)
            if target is not None:
                return _redirect(request, target), False
        if methods is None:
            return v1_error(404, "NOT_FOUND"), True
        route = methods.get(request.method)
        if route is None:
            allow = ", ".join(sorted({*methods, "OPTIONS"}))
            if request.method == "OPTIONS":
                return Response(200, b"", {"Allow": allow}), False
            response = v1_error(405, "METHOD_NOT_ALLOWED")
            response.headers["Allow"] = allow
            return response, True
        try:
            result = await route.handler(request, param)
        except HTTPError as err:
            if route.v1:
                return v1_error(err.status, err.text), route.log
            return text_response(err.status, err.text), route.log
        except Exception as crash:  # Go's LogPanicHandler (a name of its own: mypyc)
            self.logger.error(f"panic in HTTP handler - {crash!r}\n{traceback.format_exc()}")
            return v1_error(500, "INTERNAL_ERROR"), True
        if isinstance(result, Response):
            return result, route.log
        return v1_response(result), route.log

    def _redirect_target(self, method: str, path: str) -> str | None:
        """httprouter's RedirectTrailingSlash, then RedirectFixedPath: where a request for
        ``path`` that no ``method`` route matches is sent instead, if anywhere. Both look
        only at routes of ``method``: the same path with its trailing slash added or
        removed, then the cleaned path (CleanPath), matched case-insensitively, with or
        without a trailing slash."""
        if method == "CONNECT" or path == "/" or not any(method in m for m in self.routes.values()):
            return None
        toggled = path[:-1] if path.endswith("/") else path + "/"
        if len(path) > 1 and self._serves(method, toggled):
            return toggled
        cleaned = clean_path(path)
        for candidate in (cleaned, cleaned[:-1] if cleaned.endswith("/") else cleaned + "/"):
            if len(candidate) > 1 or candidate == cleaned:
                fixed = self._case_insensitive(method, candidate)
                if fixed is not None:
                    return fixed
        return None

    def _serves(self, method: str, path: str) -> bool:
        methods = self.match(path)[0]
        return methods is not None and method in methods

    def _case_insensitive(self, method: str, path: str) -> str | None:
        lowered = path.lower()
        for pattern, methods in self.routes.items():
            if method not in methods:
                continue
            prefix, _, last = pattern.rpartition("/")
            if last.startswith(":"):
                prefix += "/"
                param = path[len(prefix) :]
                if lowered.startswith(prefix.lower()) and param and "/" not in param:
                    return prefix + param
            elif lowered == pattern.lower():
                return pattern
        return None


def clean_path(path: str) -> str:
    """httprouter's CleanPath: ``path.Clean`` of ``path`` rooted at ``/``, keeping a trailing
    slash (``//ping`` → ``/ping``, ``/stats/../ping`` → ``/ping``)."""
    parts: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if parts:
                parts.pop()
        elif segment and segment != ".":
            parts.append(segment)
    cleaned = "/" + "/".join(parts)
    if path.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


_HTML_ESCAPES: Final = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"}
)


def _redirect(request: Request, path: str) -> Response:
    """Go's http.Redirect as httprouter calls it: 301 for GET, 307 for the other methods
    (httprouter v1.3.0, which NSQ pins), the query kept; a GET's reply has a small HTML
    body, and GET and HEAD replies are text/html."""
    _, sep, query = request.raw_path.partition("?")
    url = path + sep + query
    status = 301 if request.method == "GET" else 307
    headers = {"Location": url}
    if request.method in ("GET", "HEAD"):
        headers["Content-Type"] = "text/html; charset=utf-8"
    body = b""
    if request.method == "GET":
        text = "Moved Permanently" if status == 301 else "Temporary Redirect"
        body = f'<a href="{url.translate(_HTML_ESCAPES)}">{text}</a>.\n\n'.encode()
    return Response(status, body, headers)
