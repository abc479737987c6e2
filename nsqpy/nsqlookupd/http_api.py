"""nsqlookupd's HTTP API (spec §4.3), Go's ``nsqlookupd/http.go``.

Routing is NSQ's (``julienschmidt/httprouter``): method-strict, ``404
{"message":"NOT_FOUND"}`` for an unknown path, ``405 {"message":"METHOD_NOT_ALLOWED"}``
with an ``Allow`` header for a known path and another method, automatic ``OPTIONS``
replies and a redirect for a path that only differs by a trailing slash. Replies
follow ``http_api.RespondV1``: ``X-NSQ-Content-Type: nsq; version=1.0``, JSON data,
empty bodies for the mutations, errors as ``{"message": <TEXT>}``; ``/ping`` is
plain text without the NSQ header. Parameters come from the query string only,
parsed like Go's ``url.ParseQuery``. Go's ``/debug/pprof`` pages are not served.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from nsqpy import NSQ_VERSION
from nsqpy.common.goflags import format_duration_ns, seconds_to_ns
from nsqpy.common.net import format_address
from nsqpy.nsqlookupd.registration_db import (
    Registration,
    filter_by_active,
    filter_registrations,
    keys,
    subkeys,
)
from nsqpy.wire.names import is_valid_channel_name, is_valid_topic_name
from nsqpy.wire.v1 import encode_json

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.lookupd import NSQLookupd

__all__ = ["HTTPError", "LookupdHTTPServer", "QueryError", "parse_query"]

V1_HEADER: Final = ("X-NSQ-Content-Type", "nsq; version=1.0")
JSON_CONTENT_TYPE: Final = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE: Final = "text/plain; charset=utf-8"


class HTTPError(Exception):
    """``http_api.Err``: the reply's status and its ``message`` text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class QueryError(ValueError):
    """The query string is not valid for Go's ``url.ParseQuery``."""


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _unescape(text: str) -> str:
    # url.QueryUnescape: '+' is a space, '%' must be followed by two hex digits.
    if "%" not in text and "+" not in text:
        return text
    raw = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        b = raw[i]
        if b == 0x25:  # '%'
            pair = raw[i + 1 : i + 3]
            if len(pair) < 2 or not all(c in _HEX for c in pair):
                raise QueryError(f"invalid URL escape {raw[i : i + 3]!r}")
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if b == 0x2B else b)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def parse_query(raw_query: str) -> dict[str, list[str]]:
    """Go's ``url.ParseQuery``: every value of every key, in order; raises QueryError."""
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


class _Params:
    """``http_api.ReqParams``: the query string's values (the body is never read)."""

    def __init__(self, request: web.BaseRequest) -> None:
        _, _, raw_query = request.raw_path.partition("?")
        try:
            self.values = parse_query(raw_query)
        except QueryError:
            raise HTTPError(400, "INVALID_REQUEST") from None

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


def v1_response(data: object) -> web.Response:
    """``http_api.RespondV1`` with status 200: None is an empty body, the rest JSON."""
    headers = {V1_HEADER[0]: V1_HEADER[1]}
    if data is None:
        return web.Response(status=200, body=b"", headers=headers)
    headers["Content-Type"] = JSON_CONTENT_TYPE
    sort_keys = isinstance(data, _GoMaps)
    return web.Response(status=200, body=encode_json(data, sort_keys=sort_keys), headers=headers)


def v1_error(status: int, text: str) -> web.Response:
    """``http_api.RespondV1`` for an error: ``{"message": text}``."""
    headers = {V1_HEADER[0]: V1_HEADER[1], "Content-Type": JSON_CONTENT_TYPE}
    return web.Response(status=status, body=encode_json({"message": text}), headers=headers)


class _GoMaps(dict[str, Any]):
    """Maps all the way down (``/debug``): json.Marshal sorts the keys at every level.

    Elsewhere Go marshals a one-level map of structs; those dicts are written with
    their keys in sorted order and the structs' in Go's field order.
    """


Handler = Callable[[web.BaseRequest], Awaitable[object]]


@dataclass(frozen=True)
class Route:
    """One method of one path; ``v1`` handlers return data or raise HTTPError."""

    handler: Handler
    v1: bool = True


# -- the server -----------------------------------------------------------------------------


class LookupdHTTPServer:
    """The HTTP listener of one nsqlookupd (``--http-address``)."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.opts = lookupd.opts
        self.logger = lookupd.logger
        self.address = ""
        self.port = 0
        self._runner: web.ServerRunner | None = None
        self._routes: dict[str, dict[str, Route]] = {}
        self._add_routes()

    async def start(self, host: str | None, port: int) -> None:
        """Listen on ``host:port`` (port 0: any free port) and log the real address."""
        web_server = web.Server(self._handle, access_log=None)
        self._runner = web.ServerRunner(web_server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        sock_name = self._runner.addresses[0]
        self.address = format_address(sock_name)
        self.port = int(sock_name[1])
        self.logger.info(f"HTTP: listening on {self.address}")

    async def stop(self) -> None:
        """Stop listening and close the connections."""
        if self._runner is not None:
            self.logger.info(f"HTTP: closing {self.address}")
            await self._runner.cleanup()
            self._runner = None

    # -- routing --------------------------------------------------------------------------

    def _add_routes(self) -> None:
        add = self._add
        add("GET", "/ping", self._ping, v1=False)
        add("GET", "/info", self._info)
        add("GET", "/debug", self._debug)
        add("GET", "/lookup", self._lookup)
        add("GET", "/topics", self._topics)
        add("GET", "/channels", self._channels)
        add("GET", "/nodes", self._nodes)
        add("POST", "/topic/create", self._topic_create)
        add("POST", "/topic/delete", self._topic_delete)
        add("POST", "/channel/create", self._channel_create)
        add("POST", "/channel/delete", self._channel_delete)
        add("POST", "/topic/tombstone", self._topic_tombstone)

    def _add(self, method: str, path: str, handler: Handler, *, v1: bool = True) -> None:
        self._routes.setdefault(path, {})[method] = Route(handler, v1=v1)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter_ns()
        response, logged = await self._dispatch(request)
        if logged:
            # http_api.Log
            elapsed = format_duration_ns(time.perf_counter_ns() - started)
            peer = format_address(
                request.transport.get_extra_info("peername") if request.transport else None
            )
            self.logger.info(
                f"{response.status} {request.method} {request.raw_path} ({peer}) {elapsed}"
            )
        return response

    async def _dispatch(self, request: web.BaseRequest) -> tuple[web.StreamResponse, bool]:
        path = request.path
        methods = self._routes.get(path)
        if methods is None:
            alternative = path[:-1] if path.endswith("/") else path + "/"
            if len(path) > 1 and alternative in self._routes:
                return self._redirect(request, alternative), False
            return v1_error(404, "NOT_FOUND"), True
        route = methods.get(request.method)
        if route is None:
            allow = ", ".join(sorted({*methods, "OPTIONS"}))
            if request.method == "OPTIONS":
                return web.Response(status=200, headers={"Allow": allow}), False
            response = v1_error(405, "METHOD_NOT_ALLOWED")
            response.headers["Allow"] = allow
            return response, True
        try:
            result = await route.handler(request)
        except HTTPError as err:
            if route.v1:
                return v1_error(err.status, err.text), True
            return self._text(err.status, err.text), True
        except Exception as err:  # Go's LogPanicHandler
            self.logger.error(f"panic in HTTP handler - {err!r}\n{traceback.format_exc()}")
            return v1_error(500, "INTERNAL_ERROR"), True
        if isinstance(result, web.StreamResponse):
            return result, True
        return v1_response(result), True

    @staticmethod
    def _redirect(request: web.BaseRequest, path: str) -> web.Response:
        # httprouter's RedirectTrailingSlash: 301 for GET, 308 for the other methods
        _, sep, query = request.raw_path.partition("?")
        status = 301 if request.method == "GET" else 308
        return web.Response(status=status, headers={"Location": path + sep + query})

    @staticmethod
    def _text(status: int, text: str) -> web.Response:
        # http_api.PlainText: no NSQ header
        return web.Response(
            status=status, body=text.encode(), headers={"Content-Type": TEXT_CONTENT_TYPE}
        )

    # -- handlers -------------------------------------------------------------------------

    async def _ping(self, request: web.BaseRequest) -> object:
        return self._text(200, "OK")

    async def _info(self, request: web.BaseRequest) -> object:
        return {"version": NSQ_VERSION}

    async def _topics(self, request: web.BaseRequest) -> object:
        return {"topics": keys(self.db.find_registrations("topic", "*", ""))}

    async def _channels(self, request: web.BaseRequest) -> object:
        topic = _Params(request).topic()
        channels = subkeys(self.db.find_registrations("channel", topic, "*"))
        return {"channels": channels}

    async def _lookup(self, request: web.BaseRequest) -> object:
        topic = _Params(request).topic()
        db = self.db
        if not db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels = subkeys(db.find_registrations("channel", topic, "*"))
        producers = filter_by_active(
            db.find_producers("topic", topic, ""),
            seconds_to_ns(self.opts.inactive_producer_timeout),
            seconds_to_ns(self.opts.tombstone_lifetime),
        )
        return {"channels": channels, "producers": [p.peer_info.to_json() for p in producers]}

    async def _topic_create(self, request: web.BaseRequest) -> object:
        topic = _Params(request).topic()
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        self.logger.info(f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def _topic_delete(self, request: web.BaseRequest) -> object:
        topic = _Params(request).topic()
        db = self.db
        for k in db.find_registrations("channel", topic, "*"):
            self.logger.info(f"DB: removing channel({k.subkey}) from topic({topic})")
            db.remove_registration(k)
        for k in db.find_registrations("topic", topic, ""):
            self.logger.info(f"DB: removing topic({topic})")
            db.remove_registration(k)
        return None

    async def _topic_tombstone(self, request: web.BaseRequest) -> object:
        params = _Params(request)
        topic = params.topic()
        node = params.get("node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        self.logger.info(f"DB: setting tombstone for producer@{node} of topic({topic})")
        for producer in self.db.find_producers("topic", topic, ""):
            info = producer.peer_info
            if f"{info.broadcast_address}:{info.http_port}" == node:
                producer.tombstone()
        return None

    async def _channel_create(self, request: web.BaseRequest) -> object:
        topic, channel = _Params(request).topic_channel()
        self.logger.info(f"DB: adding channel({channel}) in topic({topic})")
        self.db.add_registration(Registration("channel", topic, channel))
        self.logger.info(f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def _channel_delete(self, request: web.BaseRequest) -> object:
        topic, channel = _Params(request).topic_channel()
        registrations = self.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.logger.info(f"DB: removing channel({channel}) from topic({topic})")
        for k in registrations:
            self.db.remove_registration(k)
        return None

    async def _nodes(self, request: web.BaseRequest) -> object:
        db = self.db
        lifetime = seconds_to_ns(self.opts.tombstone_lifetime)
        # tombstoned nodes are listed: only inactivity filters here
        producers = filter_by_active(
            db.find_producers("client", "", ""),
            seconds_to_ns(self.opts.inactive_producer_timeout),
            0,
        )
        now = time.time_ns()
        nodes: list[dict[str, Any]] = []
        for p in producers:
            info = p.peer_info
            topics = keys(filter_registrations(db.lookup_registrations(info.id), "topic", "*", ""))
            # for each topic, the producer entry of this peer holds its tombstone
            tombstones = []
            for topic in topics:
                tombstoned = False
                for tp in db.find_producers("topic", topic, ""):
                    if tp.peer_info is info:
                        tombstoned = tp.is_tombstoned(lifetime, now)
                tombstones.append(tombstoned)
            nodes.append({**info.to_json(), "tombstones": tombstones, "topics": topics})
        return {"producers": nodes}

    async def _debug(self, request: web.BaseRequest) -> object:
        data = _GoMaps()
        for k, producers in self.db.items():
            entries = [
                {
                    "id": p.peer_info.id,
                    "hostname": p.peer_info.hostname,
                    "broadcast_address": p.peer_info.broadcast_address,
                    "tcp_port": p.peer_info.tcp_port,
                    "http_port": p.peer_info.http_port,
                    "version": p.peer_info.version,
                    "topology_zone": p.peer_info.topology_zone,
                    "topology_region": p.peer_info.topology_region,
                    "last_update": p.peer_info.last_update,
                    "tombstoned": p.tombstoned,
                    "tombstoned_at": p.tombstoned_at,
                }
                for p in producers.values()
            ]
            if entries:
                data[f"{k.category}:{k.key}:{k.subkey}"] = entries
        return data
