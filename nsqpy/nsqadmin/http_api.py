"""nsqadmin's HTTP server: the UI's pages and assets and its JSON API (spec §5.3).

Mirrors Go's ``nsqadmin/http.go``.  Every route lives under ``--base-path``.  The JSON API
follows NSQ's V1 conventions (``X-NSQ-Content-Type: nsq; version=1.0``, errors as
``{"message": ...}``); upstream trouble is ``502 UPSTREAM_ERROR: ...`` when nothing
answered and a ``"message": "WARNING: ..."`` beside the data when only some did.

Access control, outermost first:

1. optional UI protection (nsqpy, beyond NSQ): ``--http-auth-token`` and/or
   ``--basic-auth-user``/``--basic-auth-password`` guard every route but ``/ping``;
2. ``--admin-user`` + ``--acl-http-header``: only those users may change anything
   (``403 FORBIDDEN``), as in Go;
3. ``--allow-config-from-cidr`` for ``/config/:opt``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import html
import ipaddress
import json
import mimetypes
import posixpath
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from aiohttp import web

from nsqpy import NSQ_VERSION
from nsqpy.common.goflags import option_by_cfg_name
from nsqpy.common.log import LogLevel
from nsqpy.nsqadmin.clusterinfo import RequestError, UpstreamError, aggregate_channels
from nsqpy.nsqadmin.notify import AdminAction
from nsqpy.nsqadmin.stats import TopicStats
from nsqpy.nsqd.policy import Policy, PolicyError
from nsqpy.wire.names import is_valid_channel_name, is_valid_topic_name

if TYPE_CHECKING:
    from nsqpy.nsqadmin.nsqadmin import NSQAdmin

__all__ = ["APIError", "HTTPServer"]

V1_HEADER = "X-NSQ-Content-Type"
V1_VALUE = "nsq; version=1.0"
AUTH_COOKIE = "nsqadmin_auth"
SPA_PAGES = (
    "/",
    "/topics",
    "/topics/{topic}",
    "/topics/{topic}/{channel}",
    "/nodes",
    "/nodes/{node}",
    "/counter",
    "/lookup",
)
# Responses at least this big are compressed when the client accepts gzip/deflate.
_COMPRESS_MIN = 512

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class APIError(Exception):
    """An error answer: ``status`` with body ``{"message": text}``."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _json_bytes(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def v1_json(data: Any, status: int = 200) -> web.Response:
    """A V1 JSON answer."""
    return web.Response(
        body=_json_bytes(data),
        status=status,
        headers={"Content-Type": "application/json; charset=utf-8", V1_HEADER: V1_VALUE},
    )


def v1_text(text: str) -> web.Response:
    """A V1 answer whose data is a string: written raw, like Go's ``RespondV1``."""
    return web.Response(
        body=text.encode(),
        headers={V1_HEADER: V1_VALUE, "Content-Type": "text/plain; charset=utf-8"},
    )


def v1_error(status: int, text: str) -> web.Response:
    return v1_json({"message": text}, status)


def _warning(messages: list[str]) -> str:
    return "WARNING: " + "; ".join(messages) if messages else ""


@dataclass
class _Asset:
    body: bytes
    content_type: str
    etag: str


def _static_root() -> Path:
    return Path(str(resources.files("nsqpy.nsqadmin") / "static"))


class HTTPServer:
    """Builds the aiohttp application serving nsqadmin."""

    def __init__(self, admin: NSQAdmin) -> None:
        self.admin = admin
        self.opts = admin.opts
        self.log = admin.log
        self.ci = admin.ci
        self.base = self.opts.base_path
        dev = self.opts.dev_static_dir
        self.static_root = Path(dev) if dev else _static_root()
        self._assets: dict[str, _Asset] = {}

    # -- helpers ---------------------------------------------------------------------------

    def bp(self, path: str) -> str:
        """``path`` under ``--base-path`` (Go's ``path.Join(basePath, p)``)."""
        joined = posixpath.join(self.base, path.lstrip("/"))
        return joined.rstrip("/") or "/"

    @property
    def lookupds(self) -> list[str]:
        return self.opts.nsqlookupd_http_addresses

    @property
    def nsqds(self) -> list[str]:
        return self.opts.nsqd_http_addresses

    def is_admin(self, request: web.Request) -> bool:
        """Go's ``isAuthorizedAdminRequest``: anyone, unless ``--admin-user`` names users."""
        users = self.opts.admin_users
        if not users:
            return True
        return request.headers.get(self.opts.acl_http_header, "") in users

    def _require_admin(self, request: web.Request) -> None:
        if not self.is_admin(request):
            raise APIError(403, "FORBIDDEN")

    def _upstream(self, what: str, err: UpstreamError) -> APIError:
        self.log.error(f"failed to {what} - {err}")
        return APIError(502, f"UPSTREAM_ERROR: {err}")

    def _partial(self, messages: list[str], errors: list[str]) -> None:
        if errors:
            text = "\n".join(errors)
            self.log.warn(text)
            messages.append(text)

    def _notify(
        self, action: str, request: web.Request, topic: str, channel: str = "", node: str = ""
    ) -> None:
        self.admin.notifier.notify(AdminAction.from_request(action, topic, channel, node, request))

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            raise APIError(400, "INVALID_BODY") from None
        if not isinstance(doc, dict):
            raise APIError(400, "INVALID_BODY")
        return doc

    # -- application -----------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(
            middlewares=[
                self._response_middleware,
                self._protect_middleware,
                self._error_middleware,
            ],
            client_max_size=1024 * 1024 + 1,
        )
        bp = self.bp
        add = app.router.add_route
        add("GET", bp("/ping"), self.ping)
        for page in SPA_PAGES:
            add("GET", bp(page), self.index)
        if self.base != "/":
            add("GET", self.base + "/", self.index)
        add("GET", bp("/static/{asset:.+}"), self.static_asset)
        add("GET", bp("/fonts/{asset:.+}"), self.static_asset)
        if self.opts.proxy_graphite:
            add("GET", bp("/render"), self.graphite_proxy)
        add("GET", bp("/api/topics"), self.topics)
        add("GET", bp("/api/topics/{topic}"), self.topic)
        add("GET", bp("/api/topics/{topic}/{channel}"), self.channel)
        add("GET", bp("/api/nodes"), self.nodes)
        add("GET", bp("/api/nodes/{node}"), self.node)
        add("POST", bp("/api/topics"), self.create_topic_channel)
        add("POST", bp("/api/topics/{topic}"), self.topic_action)
        add("POST", bp("/api/topics/{topic}/{channel}"), self.channel_action)
        add("DELETE", bp("/api/nodes/{node}"), self.tombstone_node_for_topic)
        add("DELETE", bp("/api/topics/{topic}"), self.delete_topic)
        add("DELETE", bp("/api/topics/{topic}/{channel}"), self.delete_channel)
        add("GET", bp("/api/counter"), self.counter)
        add("GET", bp("/api/graphite"), self.graphite)
        add("GET", bp("/api/history"), self.history)
        add("GET", bp("/config/{opt}"), self.config)
        add("PUT", bp("/config/{opt}"), self.config)
        return app

    # -- middlewares -----------------------------------------------------------------------

    @web.middleware
    async def _response_middleware(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        start = time.monotonic()
        response = await handler(request)
        if (
            isinstance(response, web.Response)
            and response.body is not None
            and isinstance(response.body, bytes)
            and len(response.body) >= _COMPRESS_MIN
            and "Content-Encoding" not in response.headers
        ):
            accept = request.headers.get("Accept-Encoding", "")
            if "gzip" in accept or "deflate" in accept:
                response.enable_compression()
        elapsed = (time.monotonic() - start) * 1000
        self.log.debug(
            f"{response.status} {request.method} {request.path_qs} ({request.remote}) {elapsed:.3f}ms"
        )
        return response

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as err:
            return v1_error(err.status, err.text)
        except web.HTTPNotFound:
            return v1_error(404, "NOT_FOUND")
        except web.HTTPMethodNotAllowed as err:
            response = v1_error(405, "METHOD_NOT_ALLOWED")
            response.headers["Allow"] = ", ".join(sorted(err.allowed_methods))
            return response
        except web.HTTPException:
            raise
        except Exception as err:
            self.log.error(f"ERROR: panic in HTTP handler - {err!r}")
            return v1_error(500, "INTERNAL_ERROR")

    @web.middleware
    async def _protect_middleware(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Optional protection of the whole UI and API (nsqpy; NSQ issue #1103)."""
        token = self.opts.http_auth_token
        user = self.opts.basic_auth_user
        if (not token and not user) or request.path == self.bp("/ping"):
            return await handler(request)
        if token:
            given = request.query.get("auth_token")
            if given is not None and hmac.compare_digest(given.encode(), token.encode()):
                # A browser arrives once with ?auth_token=...: keep it in a cookie, drop it from the URL.
                query = {k: v for k, v in request.query.items() if k != "auth_token"}
                target = request.path + (f"?{urlencode(query)}" if query else "")
                if request.method == "GET" and not request.path.startswith(self.bp("/api")):
                    redirect = web.HTTPFound(target)
                    self._set_auth_cookie(redirect, token)
                    raise redirect
                response = await handler(request)
                self._set_auth_cookie(response, token)
                return response
            auth = request.headers.get("Authorization", "")
            if auth.startswith("Bearer ") and hmac.compare_digest(
                auth[7:].encode(), token.encode()
            ):
                return await handler(request)
            cookie = request.cookies.get(AUTH_COOKIE, "")
            if cookie and hmac.compare_digest(cookie.encode(), token.encode()):
                return await handler(request)
        if user:
            auth = request.headers.get("Authorization", "")
            if auth.startswith("Basic ") and self._basic_ok(auth):
                return await handler(request)
        return self._unauthorized(request, bool(user))

    def _set_auth_cookie(self, response: web.StreamResponse, token: str) -> None:
        response.set_cookie(AUTH_COOKIE, token, httponly=True, samesite="Strict", path=self.bp("/"))

    def _basic_ok(self, authorization: str) -> bool:
        try:
            decoded = base64.b64decode(authorization[6:], validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(":")
        expected_user = self.opts.basic_auth_user.encode()
        expected_password = self.opts.basic_auth_password.encode()
        user_ok = hmac.compare_digest(user.encode(), expected_user)
        password_ok = hmac.compare_digest(password.encode(), expected_password)
        return bool(sep) and user_ok and password_ok

    def _unauthorized(self, request: web.Request, basic: bool) -> web.Response:
        headers = {"WWW-Authenticate": 'Basic realm="nsqadmin"'} if basic else {}
        wants_html = "text/html" in request.headers.get("Accept", "")
        if wants_html and not basic:
            page = (
                "<!doctype html><meta charset=utf-8><title>nsqadmin - sign in</title>"
                "<style>body{font:16px system-ui,sans-serif;display:grid;place-items:center;"
                "height:90vh;background:#f4f6f9}form{background:#fff;padding:2rem;border-radius:12px;"
                "box-shadow:0 2px 12px #0002;display:grid;gap:.75rem}input,button{font:inherit;"
                "padding:.5rem .75rem}</style><form method=get>"
                "<strong>nsqadmin</strong><label>Access token <input name=auth_token "
                "type=password autofocus required></label><button>Sign in</button></form>"
            )
            return web.Response(status=401, text=page, content_type="text/html")
        response = v1_error(401, "UNAUTHORIZED")
        response.headers.update(headers)
        return response

    # -- pages and assets ------------------------------------------------------------------

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def index(self, request: web.Request) -> web.Response:
        asset = self._asset("index.html")
        if asset is None:
            raise APIError(500, "INTERNAL_ERROR")
        opts = self.opts
        config = {
            "version": NSQ_VERSION,
            "basePath": self.base,
            "isAdmin": self.is_admin(request),
            "user": request.headers.get(opts.acl_http_header, "") if opts.admin_users else "",
            "aclEnabled": bool(opts.admin_users),
            "graphEnabled": bool(opts.graphite_url),
            "proxyGraphite": opts.proxy_graphite,
            "graphiteUrl": opts.graphite_url,
            "statsdInterval": int(opts.statsd_interval),
            "statsdCounterFormat": opts.statsd_counter_format,
            "statsdGaugeFormat": opts.statsd_gauge_format,
            "statsdPrefix": opts.statsd_prefix,
            "nsqlookupd": list(opts.nsqlookupd_http_addresses),
            "nsqd": list(opts.nsqd_http_addresses),
            "sampleInterval": opts.sample_interval,
            "historyDuration": opts.history_duration,
        }
        # Inside <script type="application/json">: keep "</script>" and friends out.
        blob = (
            json.dumps(config)
            .replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
        )
        base_href = self.base if self.base.endswith("/") else self.base + "/"
        page = (
            asset.body.decode()
            .replace("{{BASE}}", html.escape(base_href, quote=True))
            .replace("{{CONFIG}}", blob)
            .replace("{{ASSET_VERSION}}", self._asset_version())
        )
        return web.Response(
            text=page,
            content_type="text/html",
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )

    def _asset_version(self) -> str:
        main = self._asset("js/main.js")
        return main.etag.strip('"')[:10] if main else "0"

    def _asset(self, name: str) -> _Asset | None:
        """A static file by its path under ``static/``; None if absent or outside it."""
        if not self.opts.dev_static_dir and name in self._assets:
            return self._assets[name]
        root = self.static_root.resolve()
        path = (root / name).resolve()
        if root not in path.parents or not path.is_file():
            return None
        body = path.read_bytes()
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix in (".js", ".mjs"):
            content_type = "text/javascript"
        etag = '"' + hashlib.sha1(body).hexdigest()[:20] + '"'
        asset = _Asset(body, content_type, etag)
        if not self.opts.dev_static_dir:
            self._assets[name] = asset
        return asset

    async def static_asset(self, request: web.Request) -> web.Response:
        asset = self._asset(request.match_info["asset"])
        if asset is None:
            raise APIError(404, "NOT_FOUND")
        headers = {"ETag": asset.etag, "Cache-Control": "no-cache"}
        if request.headers.get("If-None-Match") == asset.etag:
            return web.Response(status=304, headers=headers)
        charset = "utf-8" if asset.content_type.startswith(("text/", "image/svg")) else None
        return web.Response(
            body=asset.body, content_type=asset.content_type, charset=charset, headers=headers
        )

    # -- queries ---------------------------------------------------------------------------

    async def topics(self, request: web.Request) -> web.Response:
        messages: list[str] = []
        try:
            if self.lookupds:
                topics, errors = await self.ci.get_lookupd_topics(self.lookupds)
            else:
                topics, errors = await self.ci.get_nsqd_topics(self.nsqds)
        except UpstreamError as err:
            raise self._upstream("get topics", err) from None
        self._partial(messages, errors)
        if request.query.get("inactive") == "true":
            inactive: dict[str, list[str]] = {}
            if self.lookupds:
                found = await asyncio.gather(*(self._inactive_channels(t) for t in topics))
                inactive = {t: c for t, c in zip(topics, found, strict=True) if c is not None}
            return v1_json({"topics": inactive, "message": _warning(messages)})
        return v1_json({"topics": topics, "message": _warning(messages)})

    async def _inactive_channels(self, topic: str) -> list[str] | None:
        """The channels of ``topic`` if no nsqd produces it, else None."""
        try:
            producers, _ = await self.ci.get_lookupd_topic_producers(topic, self.lookupds)
            if producers:
                return None
            channels, _ = await self.ci.get_lookupd_topic_channels(topic, self.lookupds)
        except UpstreamError:
            return None
        return channels

    async def topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        messages: list[str] = []
        try:
            producers, errors = await self.ci.get_topic_producers(name, self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("get topic producers", err) from None
        self._partial(messages, errors)
        try:
            nodes, errors = await self.ci.get_nsqd_stats(producers, name, include_clients=False)
        except UpstreamError as err:
            raise self._upstream("get topic metadata", err) from None
        self._partial(messages, errors)
        total = TopicStats.aggregate(name)
        for node in nodes:
            for topic in node.topics:
                total.add(topic)
        doc = total.to_json()
        doc["message"] = _warning(messages)
        return v1_json(doc)

    async def channel(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        channel = request.match_info["channel"]
        messages: list[str] = []
        try:
            producers, errors = await self.ci.get_topic_producers(topic, self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("get topic producers", err) from None
        self._partial(messages, errors)
        try:
            nodes, errors = await self.ci.get_nsqd_stats(producers, topic, channel)
        except UpstreamError as err:
            raise self._upstream("get channel metadata", err) from None
        self._partial(messages, errors)
        stats = aggregate_channels(nodes).get((topic, channel))
        doc: dict[str, Any] = stats.to_json() if stats is not None else {}
        doc["message"] = _warning(messages)
        return v1_json(doc)

    async def nodes(self, request: web.Request) -> web.Response:
        messages: list[str] = []
        try:
            producers, errors = await self.ci.get_producers(self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("get nodes", err) from None
        self._partial(messages, errors)
        return v1_json({"nodes": [p.to_json() for p in producers], "message": _warning(messages)})

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["node"]
        messages: list[str] = []
        try:
            producers, errors = await self.ci.get_producers(self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("get producers", err) from None
        self._partial(messages, errors)
        producer = next((p for p in producers if p.http_address == name), None)
        if producer is None:
            raise APIError(404, "NODE_NOT_FOUND")
        try:
            nodes, _ = await self.ci.get_nsqd_stats([producer], include_mem=True)
        except UpstreamError as err:
            raise self._upstream("get nsqd stats", err) from None
        topics = nodes[0].topics if nodes else []
        total_clients = sum(len(c.clients) for t in topics for c in t.channels)
        total_messages = sum(t.message_count for t in topics)
        return v1_json(
            {
                "node": name,
                "topics": [t.to_json() for t in topics],
                "total_messages": total_messages,
                "total_clients": total_clients,
                "message": _warning(messages),
                # nsqpy extras for the node page:
                "producer": producer.to_json(),
                "memory": nodes[0].memory if nodes else None,
            }
        )

    async def counter(self, request: web.Request) -> web.Response:
        messages: list[str] = []
        try:
            producers, errors = await self.ci.get_producers(self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("get counter producer list", err) from None
        self._partial(messages, errors)
        try:
            nodes, errors = await self.ci.get_nsqd_stats(producers, include_clients=False)
        except UpstreamError as err:
            raise self._upstream("get nsqd stats", err) from None
        self._partial(messages, errors)
        stats: dict[str, dict[str, Any]] = {}
        for (topic, channel), total in sorted(aggregate_channels(nodes).items()):
            for node_stats in total.nodes:
                key = f"{topic}:{channel}:{node_stats.node}"
                entry = stats.setdefault(
                    key,
                    {
                        "node": node_stats.node,
                        "topic_name": topic,
                        "channel_name": channel,
                        "message_count": 0,
                    },
                )
                entry["message_count"] += node_stats.message_count
        return v1_json({"stats": stats, "message": _warning(messages)})

    async def history(self, request: web.Request) -> web.Response:
        """nsqpy: sampled history for the UI's charts (see :mod:`nsqpy.nsqadmin.history`)."""
        history = self.admin.history
        topic = request.query.get("topic", "")
        channel = request.query.get("channel", "")
        node = request.query.get("node", "")
        if channel and not topic:
            raise APIError(400, "MISSING_ARG_TOPIC")
        if node:
            return v1_json(history.node(node))
        if topic and channel:
            return v1_json(history.channel(topic, channel))
        if topic:
            return v1_json(history.topic(topic))
        return v1_json(history.overview())

    # -- actions ---------------------------------------------------------------------------

    async def tombstone_node_for_topic(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        node = request.match_info["node"]
        body = await self._json_body(request)
        topic = body.get("topic")
        if not isinstance(topic, str) or not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_TOPIC")
        messages: list[str] = []
        try:
            errors = await self.ci.tombstone_node_for_topic(topic, node, self.lookupds)
        except UpstreamError as err:
            raise self._upstream("tombstone node for topic", err) from None
        self._partial(messages, errors)
        self._notify("tombstone_topic_producer", request, topic, node=node)
        return v1_json({"message": _warning(messages)})

    async def create_topic_channel(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        body = await self._json_body(request)
        topic = body.get("topic", "")
        channel = body.get("channel", "") or ""
        if not isinstance(topic, str) or not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_TOPIC")
        if not isinstance(channel, str) or (channel and not is_valid_channel_name(channel)):
            raise APIError(400, "INVALID_CHANNEL")
        messages: list[str] = []
        try:
            errors = await self.ci.create_topic_channel(topic, channel, self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("create topic/channel", err) from None
        self._partial(messages, errors)
        self._notify("create_topic", request, topic)
        if channel:
            self._notify("create_channel", request, topic, channel)
        return v1_json({"message": _warning(messages)})

    async def delete_topic(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        topic = request.match_info["topic"]
        messages: list[str] = []
        try:
            errors = await self.ci.delete_topic(topic, self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("delete topic", err) from None
        self._partial(messages, errors)
        self._notify("delete_topic", request, topic)
        return v1_json({"message": _warning(messages)})

    async def delete_channel(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        topic = request.match_info["topic"]
        channel = request.match_info["channel"]
        messages: list[str] = []
        try:
            errors = await self.ci.delete_channel(topic, channel, self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream("delete channel", err) from None
        self._partial(messages, errors)
        self._notify("delete_channel", request, topic, channel)
        return v1_json({"message": _warning(messages)})

    async def topic_action(self, request: web.Request) -> web.Response:
        return await self._topic_channel_action(request, request.match_info["topic"], "")

    async def channel_action(self, request: web.Request) -> web.Response:
        return await self._topic_channel_action(
            request, request.match_info["topic"], request.match_info["channel"]
        )

    async def _topic_channel_action(
        self, request: web.Request, topic: str, channel: str
    ) -> web.Response:
        self._require_admin(request)
        body = await self._json_body(request)
        action = body.get("action")
        if action in ("set_policy", "clear_policy"):
            return await self._policy_action(request, topic, channel, body)
        if action not in ("pause", "unpause", "empty"):
            raise APIError(400, "INVALID_ACTION")
        messages: list[str] = []
        try:
            errors = await self.ci.topic_channel_action(
                action, topic, channel, self.lookupds, self.nsqds
            )
        except UpstreamError as err:
            raise self._upstream(f"{action} topic/channel", err) from None
        self._partial(messages, errors)
        self._notify(f"{action}_{'channel' if channel else 'topic'}", request, topic, channel)
        return v1_json({"message": _warning(messages)})

    async def _policy_action(
        self, request: web.Request, topic: str, channel: str, body: dict[str, Any]
    ) -> web.Response:
        """Set (``{"action": "set_policy", "policy": {...}}``) or clear a message policy on
        every nsqd of the topic; the policy is checked here first, with nsqd's rules."""
        payload: bytes | None = None
        if body["action"] == "set_policy":
            payload = json.dumps(body.get("policy")).encode()
            try:
                Policy().updated(payload, topic, channel=bool(channel))
            except PolicyError as err:
                raise APIError(400, str(err)) from None
        messages: list[str] = []
        try:
            errors = await self.ci.set_policy(topic, channel, payload, self.lookupds, self.nsqds)
        except UpstreamError as err:
            raise self._upstream(f"{body['action']} topic/channel", err) from None
        self._partial(messages, errors)
        self._notify(
            f"{body['action']}_{'channel' if channel else 'topic'}", request, topic, channel
        )
        return v1_json({"message": _warning(messages)})

    # -- graphite --------------------------------------------------------------------------

    async def graphite(self, request: web.Request) -> web.Response:
        if request.query.get("metric") != "rate":
            raise APIError(400, "INVALID_ARG_METRIC")
        target = request.query.get("target")
        if target is None:
            raise APIError(400, "INVALID_ARG_TARGET")
        interval = int(self.opts.statsd_interval)
        query = urlencode(
            {
                "from": f"-{interval * 2}sec",
                "until": f"-{interval}sec",
                "format": "json",
                "target": target,
            }
        )
        url = f"{self.opts.graphite_url}/render?{query}"
        self.log.info(f"GRAPHITE: {url}")
        try:
            response = await self.admin.client.get_v1(url)
            rate = float(response[0]["datapoints"][0][0])
        except (RequestError, LookupError, TypeError, ValueError) as err:
            self.log.error(f"graphite request failed - {err}")
            raise APIError(500, "INTERNAL_ERROR") from None
        text = "N/A" if rate < 0 else f"{rate / max(interval, 1):.2f}"
        return v1_json({"rate": text})

    async def graphite_proxy(self, request: web.Request) -> web.Response:
        """``--proxy-graphite``: forward ``/render`` to Graphite, with its URL's basic auth."""
        parts = urlsplit(self.opts.graphite_url)
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        url = f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}/render"
        if request.query_string:
            url += f"?{request.query_string}"
        headers = {}
        if parts.username:
            pair = f"{parts.username}:{parts.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        client = self.admin.client
        try:
            async with client.session.get(
                url, headers=headers, timeout=client.timeout()
            ) as upstream:
                body = await upstream.read()
                content_type = upstream.headers.get("Content-Type", "application/json")
                return web.Response(
                    body=body, status=upstream.status, headers={"Content-Type": content_type}
                )
        except (aiohttp.ClientError, TimeoutError) as err:
            self.log.error(f"graphite proxy failed - {err}")
            return v1_error(502, "BAD_GATEWAY")

    # -- /config ---------------------------------------------------------------------------

    async def config(self, request: web.Request) -> web.Response:
        opt = request.match_info["opt"]
        cidr = self.opts.allow_config_from_cidr
        if cidr:
            network = ipaddress.ip_network(cidr, strict=False)
            try:
                ip = ipaddress.ip_address((request.remote or "").split("%")[0])
            except ValueError:
                self.log.error(f"failed to parse RemoteAddr {request.remote}")
                raise APIError(400, "INVALID_REMOTE_ADDR") from None
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            if ip.version != network.version or ip not in network:
                raise APIError(403, "FORBIDDEN")
        if request.method == "PUT":
            body = await request.read()
            if not body or len(body) > 1024 * 1024:
                raise APIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    value = json.loads(body)
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise APIError(400, "INVALID_VALUE")
                self.opts.nsqlookupd_http_addresses = value
            elif opt == "log_level":
                try:
                    level = LogLevel.parse(body.decode("utf-8", "replace"))
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                self.opts.log_level = level
                self.log.level = level
            else:
                raise APIError(400, "INVALID_OPTION")
        ref = option_by_cfg_name(self.opts, opt)
        if ref is None:
            raise APIError(400, "INVALID_OPTION")
        value = ref.go_value
        if isinstance(value, str):
            return v1_text(value)
        return v1_json(value)
