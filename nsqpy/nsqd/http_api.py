"""nsqd's HTTP API (spec §3) on the event loop the TCP server runs on.

Routing, replies and parameters are NSQ's ``http_api`` (:mod:`nsqpy.common.httpapi`):
strings written raw, anything else as JSON, errors as ``{"message": <TEXT>}``.

Publishing calls the same engine methods as the TCP protocol. Beyond NSQ:
``GET /metrics`` (Prometheus text format), ``GET /channel/peek`` and Python
equivalents of the ``/debug/pprof`` pages (stacks, tracemalloc, cProfile).

Health: ``/ping`` and ``/stats`` read ``nsqd.health_error`` (None or "" when healthy,
else the last disk write error), so the engine decides what unhealthy means.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import io
import json
import os
import re
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Final

from nsqpy import NSQ_VERSION
from nsqpy.common.app import ListenError
from nsqpy.common.goflags import option_by_cfg_name, seconds_to_ns
from nsqpy.common.httpapi import (
    JSON_CONTENT_TYPE,
    V1_HEADER,
    HTTPError,
    ReqParams,
    Router,
    text_response,
    v1_response,
)
from nsqpy.common.httpserver import (
    BodyError,
    BodyTooLarge,
    Headers,
    HTTPServer,
    Request,
    Response,
)
from nsqpy.common.log import LogLevel
from nsqpy.common.net import format_address, is_unix_address, split_host_port
from nsqpy.nsqd.backend import BackendError
from nsqpy.nsqd.options import TLSRequired
from nsqpy.nsqd.policy import Policy, PolicyError
from nsqpy.nsqd.protocol_v2 import until_started
from nsqpy.nsqd.stats import (
    PROMETHEUS_CONTENT_TYPE,
    Stats,
    format_prometheus,
    format_stats_text,
    get_stats,
    mem_stats,
    track_gc_pauses,
)
from nsqpy.wire.names import go_quote, is_valid_topic_name
from nsqpy.wire.v2 import CommandParser, ProtocolError, mpub_bodies

if TYPE_CHECKING:
    import ssl

    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.server import NSQDServer
    from nsqpy.nsqd.topic import Topic

__all__ = ["NSQDHTTPServer"]

# http_api's boolParams: anything else means "not given" (or, for /mpub's binary, true)
BOOL_PARAMS: Final = {"true": True, "1": True, "false": False, "0": False}

_INT64 = re.compile(r"[+-]?[0-9]+\Z")
_OK: Final = v1_response("OK")  # /pub's reply (nothing changes a Response once made)


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is longer than ``limit`` (Go's LimitReader(limit + 1)).

    A body cut short by the client is a 500 INTERNAL_ERROR, as Go's failed read.
    """
    try:
        return await request.read(limit)
    except BodyTooLarge:
        return None
    except BodyError:
        raise HTTPError(500, "INTERNAL_ERROR") from None


# -- the server -----------------------------------------------------------------------------


class NSQDHTTPServer:
    """The HTTP listener of one nsqd (``--http-address``), its HTTPS listener
    (``--https-address``, when the server has a ``tls_context``).

    Both listeners serve the same routes; under ``--tls-required=true`` the plain one
    answers every request with Go's 403 ``TLS_REQUIRED``.
    """

    def __init__(self, server: NSQDServer) -> None:
        self.server = server
        self.nsqd = server.nsqd
        self.opts = server.opts
        self.logger = server.logger
        self.address = ""
        self.port = -1
        self.https_address = ""
        self.https_port = 0  # Go's RealHTTPSAddr().Port: 0 without an HTTPS listener
        self._http: HTTPServer | None = None
        self._profiling = False
        self.router = Router(self.logger)
        self._routes = self.router.routes  # the same table, for tests that patch a handler
        self._add_routes()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on ``--http-address`` (TCP ``host:port`` or a unix socket path), and on
        ``--https-address`` when TLS is configured."""
        track_gc_pauses()
        self._http = HTTPServer(self._handle, self.logger)
        self._http.input_seen = self.nsqd.input_seen
        self._http.quick_routes["/pub"] = self._pub_now
        # What a read's requests publish reaches consumers after their replies, as a TCP
        # read's does (protocol_v2's _run_commands)
        self._http.around_input = (self.nsqd.hold_dispatch, self.nsqd.release_dispatch)
        tls_context: ssl.SSLContext | None = getattr(self.server, "tls_context", None)
        if tls_context is not None and self.opts.https_address:
            self.https_address, self.https_port = await self._listen(
                self.opts.https_address, tls_context
            )
            if self.server.worker is None:  # (else the supervisor logs it: workers.py)
                self.logger.info(f"HTTPS: listening on {self.https_address}")
        self.address, self.port = await self._listen(self.opts.http_address, None)
        if self.server.worker is None:
            self.logger.info(f"HTTP: listening on {self.address}")

    async def _listen(self, address: str, tls: ssl.SSLContext | None) -> tuple[str, int]:
        """Open one listener; its address as logged, and its port (-1 for a unix socket)."""
        assert self._http is not None
        try:
            worker = self.server.worker
            if worker is not None:  # the supervisor's listener, shared by every worker
                sock = worker.https if tls is not None else worker.http
                sock_name = await self._http.listen_socket(sock, tls)
            elif is_unix_address(address):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address)
                sock_name = await self._http.listen_unix(address, tls)
            else:
                host, port = split_host_port(address)
                sock_name = await self._http.listen_tcp(host or None, port, tls)
        except OSError as err:
            raise ListenError(address, err) from None
        return format_address(sock_name), int(sock_name[1]) if isinstance(sock_name, tuple) else -1

    async def stop(self) -> None:
        if self._http is not None:
            if self.https_address:
                self.logger.info(f"HTTPS: closing {self.https_address}")
            self.logger.info(f"HTTP: closing {self.address}")
            await self._http.close()
            self._http = None
            for address in (self.opts.http_address, self.https_address):
                if address and is_unix_address(address):
                    with contextlib.suppress(OSError):
                        os.unlink(address)

    # -- routing --------------------------------------------------------------------------

    def _add_routes(self) -> None:
        add = self.router.add
        add("GET", "/ping", self._ping, v1=False)
        add("GET", "/info", self._info)
        add("POST", "/pub", self._pub, log=False)
        add("POST", "/mpub", self._mpub, log=False)
        add("GET", "/stats", self._stats)
        add("POST", "/topic/create", self._topic_create)
        add("POST", "/topic/delete", self._topic_delete)
        add("POST", "/topic/empty", self._topic_empty)
        add("POST", "/topic/pause", self._topic_pause)
        add("POST", "/topic/unpause", self._topic_pause)
        add("POST", "/channel/create", self._channel_create)
        add("POST", "/channel/delete", self._channel_delete)
        add("POST", "/channel/empty", self._channel_empty)
        add("POST", "/channel/pause", self._channel_pause)
        add("POST", "/channel/unpause", self._channel_pause)
        add("GET", "/config/:opt", self._config)
        add("PUT", "/config/:opt", self._config)
        # beyond NSQ
        add("GET", "/channel/peek", self._channel_peek)
        for method in ("GET", "POST", "DELETE"):
            add(method, "/topic/policy", self._policy)
            add(method, "/channel/policy", self._policy)
        add("GET", "/metrics", self._metrics, v1=False, log=False)
        # Python's answers to Go's /debug/pprof pages
        add("GET", "/debug/pprof/", self._pprof_index, v1=False, log=False)
        add("GET", "/debug/pprof/goroutine", self._pprof_goroutine, v1=False, log=False)
        add("GET", "/debug/pprof/threadcreate", self._pprof_threads, v1=False, log=False)
        add("GET", "/debug/pprof/heap", self._pprof_heap, v1=False, log=False)
        add("GET", "/debug/pprof/profile", self._pprof_profile, v1=False, log=False)
        add("GET", "/debug/pprof/cmdline", self._pprof_cmdline, v1=False, log=False)
        add("PUT", "/debug/setblockrate", self._set_block_rate, v1=False)
        add("POST", "/debug/freememory", self._free_memory, v1=False)

    async def _handle(self, request: Request) -> Response:
        if self.opts.tls_required == TLSRequired.REQUIRED and not request.secure:
            return self._tls_required()
        if self.nsqd.shards is not None:  # --workers: the topic's owner answers
            from nsqpy.nsqd.workers import route_http

            response = await route_http(self.server, request)
            if response is not None:
                return response
        return await self.router.handle(request)

    async def replayed(
        self,
        method: str,
        raw_path: str,
        path: str,
        query_string: str,
        version: tuple[int, int],
        headers: dict[str, str],
        body: bytes,
        content_length: int | None,
        secure: bool,
        peername: Any,
    ) -> Response:
        """--workers: answer a request another worker received (workers.route_http), its
        body read there as far as the handler here reads it."""
        request = Request(
            method, raw_path, path, query_string, version, Headers(headers), content_length, True
        )
        request.secure = secure
        request.peername = peername
        if body:
            request._add(body)
        request._end()
        return await self.router.handle(request)

    def _tls_required(self) -> Response:
        body = f'{{"message": "TLS_REQUIRED", "https_port": {self.https_port}}}'
        headers = {V1_HEADER[0]: V1_HEADER[1], "Content-Type": JSON_CONTENT_TYPE}
        return Response(403, body.encode(), headers)

    # -- helpers ------------------------------------------------------------------------

    async def _gather_stats(
        self, topic: str, channel: str, include_clients: bool
    ) -> tuple[Stats, str, int]:
        """get_stats (and the health, and how many connections): this nsqd's, or with
        --workers every worker's, merged."""
        if self.nsqd.shards is None:
            stats = get_stats(self.nsqd, self.server.clients, topic, channel, include_clients)
            return stats, self._health(), len(self.server.clients)
        from nsqpy.nsqd.workers import gather_stats

        return await gather_stats(self.server, topic, channel, include_clients)

    def _health(self) -> str:
        error = getattr(self.nsqd, "health_error", None)
        return f"NOK - {error}" if error else "OK"

    def _topic_name(self, params: ReqParams) -> str:
        """Go's ``getTopicFromQuery`` before its GetTopic: the name, checked (a topic's name
        is valid: NSQD.open_topic makes no other)."""
        name = params.topic()
        if name not in self.nsqd.topics and not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        if self.nsqd.exiting:
            raise HTTPError(503, "EXITING")
        return name

    async def _topic_from_query(self, request: Request) -> tuple[ReqParams, Topic]:
        """Go's ``getTopicFromQuery``: validates the name, then gets or creates the topic
        (a new one answers once the channels nsqlookupd knows of exist)."""
        params = ReqParams(request)
        topic, wait = self.nsqd.open_topic(self._topic_name(params))
        if wait:
            await until_started(topic)
        return params, topic

    def _existing_topic_and_channel_name(self, request: Request) -> tuple[Topic, str]:
        """Go's ``getExistingTopicFromQuery`` (with ``GetTopicChannelArgs``)."""
        topic_name, channel_name = ReqParams(request).topic_channel()
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, channel_name

    def _existing_channel(self, request: Request) -> Channel:
        topic, channel_name = self._existing_topic_and_channel_name(request)
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    def _publish(self, topic_name: str, bodies: list[bytes], delay: float = 0.0) -> Topic | None:
        """NSQD.publish, its refusals as Go's replies; the new topic to wait for, if any."""
        try:
            return self.nsqd.publish(topic_name, bodies, delay)[1]
        except BackendError as err:
            # Go answers every refused put 503 EXITING (http.go doPUB), a full disk too; the
            # cause is in the log and in /ping (docs/RELIABILITY.md)
            topic = self.nsqd.get_existing_topic(topic_name)
            if not (self.nsqd.exiting or topic is None or topic.exiting):
                self.logger.error(f"TOPIC({topic_name}): failed to put message(s) - {err}")
            raise HTTPError(503, "EXITING") from None

    # -- NSQ's routes ---------------------------------------------------------------------

    async def _ping(self, request: Request, _: str) -> Response:
        health = self._health()
        if self.nsqd.shards is not None:
            health = (await self._gather_stats("-", "", False))[1]
        return text_response(200 if health == "OK" else 500, health)

    async def _info(self, request: Request, _: str) -> object:
        try:
            hostname = socket.gethostname()
        except OSError as err:
            raise HTTPError(500, str(err)) from None
        tcp_port = -1
        if not is_unix_address(self.opts.tcp_address):
            _, _, port = self.server.tcp_address.rpartition(":")
            tcp_port = int(port) if port.isdigit() else -1
        opts = self.opts
        return {
            "version": NSQ_VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": hostname,
            "http_port": self.port,
            "tcp_port": tcp_port,
            "start_time": int(self.nsqd.start_time),
            "max_heartbeat_interval": seconds_to_ns(opts.max_heartbeat_interval),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": seconds_to_ns(opts.max_output_buffer_timeout),
            "max_deflate_level": opts.max_deflate_level,
            "topology_zone": opts.topology_zone,
            "topology_region": opts.topology_region,
        }

    async def _pub(self, request: Request, _: str) -> object:
        max_size = self.opts.max_msg_size
        length = request.content_length
        if length is not None and length > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = await _read_body(request, max_size)
        if body is None:
            raise HTTPError(413, "MSG_TOO_BIG")
        starting = self._pub_body(ReqParams(request), body)
        if starting is not None:
            await until_started(starting)
        return "OK"

    def _pub_body(self, params: ReqParams, body: bytes) -> Topic | None:
        """``POST /pub`` once its body is read: Go's checks in Go's order, then the publish.
        Returns the new topic to wait for before answering, if any."""
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        name = self._topic_name(params)
        delay = 0.0
        starting: Topic | None = None
        defer = params.get("defer")
        if defer is not None:
            # Go creates the topic (getTopicFromQuery) before it parses defer
            topic, wait = self.nsqd.open_topic(name)
            starting = topic if wait else None
            if not _INT64.match(defer) or not -(1 << 63) <= int(defer) < 1 << 63:
                raise HTTPError(400, "INVALID_DEFER")
            delay_ms = int(defer)
            if delay_ms < 0 or delay_ms > self.opts.max_req_timeout * 1000:
                raise HTTPError(400, "INVALID_DEFER")
            delay = delay_ms / 1000
        return self._publish(name, [body], delay) or starting

    def _pub_now(self, request: Request, body: bytes) -> Response | None:
        """``POST /pub`` whose body came with its head, to an existing topic, answered
        without the router and the handler's coroutine (the server's quick route): the same
        checks and publish as _pub (_pub_body). Whatever else (a new topic, an error,
        ``--tls-required``) returns None, and _pub answers it; so does a refused put, which
        queued nothing."""
        if (
            request.method != "POST"
            or len(body) > self.opts.max_msg_size
            or (self.opts.tls_required == TLSRequired.REQUIRED and not request.secure)
        ):
            return None
        try:
            params = ReqParams(request)
            if params.get("topic") not in self.nsqd.topics:
                return None  # a new topic may have to wait for its channels: _pub
            self._pub_body(params, body)
        except HTTPError:
            return None
        return _OK

    async def _mpub(self, request: Request, _: str) -> object:
        opts = self.opts
        length = request.content_length
        if length is not None and length > opts.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        params, topic = await self._topic_from_query(request)
        binary = False
        flag = params.get("binary")
        if flag is not None:
            if flag in BOOL_PARAMS:
                binary = BOOL_PARAMS[flag]
            else:
                binary = True
                self.logger.warn(f"deprecated value '{flag}' used for /mpub binary param")
        # Go reads a binary body without limit (bounded by the message count); this
        # one stops at --max-body-size, which the Content-Length check implies anyway.
        body = await _read_body(request, opts.max_body_size)
        if body is None:
            raise HTTPError(413, "BODY_TOO_BIG")
        bodies = self._binary_bodies(topic.name, body) if binary else self._text_bodies(body)
        self._publish(topic.name, bodies)
        return "OK"

    def _text_bodies(self, body: bytes) -> list[bytes]:
        max_size = self.opts.max_msg_size
        bodies = [line for line in body.split(b"\n") if line]
        if any(len(line) > max_size for line in bodies):
            raise HTTPError(413, "MSG_TOO_BIG")
        return bodies

    def _binary_bodies(self, topic_name: str, body: bytes) -> list[bytes]:
        """``readMPUB`` through the TCP codec; errors are 413 with the code minus ``E_``."""
        opts = self.opts
        if len(body) < 8:
            # Go fails on the count read (BAD_BODY), or on the first size read after a
            # valid count (BAD_MESSAGE); the codec would just wait for more bytes.
            count = int.from_bytes(body[:4], "big", signed=True) if len(body) >= 4 else 0
            valid = 0 < count <= (opts.max_body_size - 4) // 5
            raise HTTPError(413, "BAD_MESSAGE" if valid else "BAD_BODY")
        parser = CommandParser(opts.max_msg_size, opts.max_body_size, 0)
        parser.feed(b"MPUB " + topic_name.encode() + b"\n" + len(body).to_bytes(4, "big") + body)
        try:
            command = parser.next_command()
        except ProtocolError as err:
            raise HTTPError(413, err.code[2:]) from None
        if command is None or command[1] is None or isinstance(command[1], bytes):
            raise HTTPError(413, "BAD_MESSAGE")  # a message cut short
        return command[1] if isinstance(command[1], list) else mpub_bodies(command[1])

    async def _stats(self, request: Request, _: str) -> object:
        params = ReqParams(request)
        topic = params.get("topic") or ""
        channel = params.get("channel") or ""
        include_clients = BOOL_PARAMS.get(params.get("include_clients") or "", True)
        include_mem = BOOL_PARAMS.get(params.get("include_mem") or "", True)
        stats, health, _count = await self._gather_stats(topic, channel, include_clients)
        mem = mem_stats() if include_mem else None
        start_time = self.nsqd.start_time
        if params.get("format") != "json":
            return format_stats_text(stats, mem, health, start_time, time.time())
        reply: dict[str, object] = {
            "version": NSQ_VERSION,
            "health": health,
            "start_time": int(start_time),
            "topics": stats["topics"],
        }
        if mem is not None:
            reply["memory"] = mem
        reply["producers"] = stats["producers"]
        return reply

    async def _topic_create(self, request: Request, _: str) -> object:
        await self._topic_from_query(request)
        return None

    async def _topic_delete(self, request: Request, _: str) -> object:
        try:
            self.nsqd.delete_topic(ReqParams(request).topic())
        except KeyError:
            raise HTTPError(404, "TOPIC_NOT_FOUND") from None
        return None

    async def _topic_empty(self, request: Request, _: str) -> object:
        name = ReqParams(request).topic()
        if not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        try:
            topic.empty()
        except (BackendError, OSError) as err:
            self.logger.error(f"TOPIC({name}): failed to empty - {err}")
            raise HTTPError(500, "INTERNAL_ERROR") from None
        return None

    async def _topic_pause(self, request: Request, _: str) -> object:
        topic = self.nsqd.get_existing_topic(ReqParams(request).topic())
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if "unpause" in request.path:
            topic.unpause()
        else:
            topic.pause()
        self.nsqd.persist_metadata()
        return None

    async def _channel_create(self, request: Request, _: str) -> object:
        topic, channel_name = self._existing_topic_and_channel_name(request)
        topic.get_channel(channel_name)
        return None

    async def _channel_delete(self, request: Request, _: str) -> object:
        topic, channel_name = self._existing_topic_and_channel_name(request)
        try:
            topic.delete_channel(channel_name)
        except KeyError:
            raise HTTPError(404, "CHANNEL_NOT_FOUND") from None
        return None

    async def _channel_empty(self, request: Request, _: str) -> object:
        channel = self._existing_channel(request)
        try:
            channel.empty()
        except (BackendError, OSError) as err:
            self.logger.error(
                f"CHANNEL({channel.topic_name}:{channel.name}): failed to empty - {err}"
            )
            raise HTTPError(500, "INTERNAL_ERROR") from None
        return None

    async def _channel_pause(self, request: Request, _: str) -> object:
        channel = self._existing_channel(request)
        if "unpause" in request.path:
            channel.unpause()
        else:
            channel.pause()
        self.nsqd.persist_metadata()
        return None

    async def _config(self, request: Request, opt: str) -> object:
        opts = self.opts
        if request.method == "PUT":
            body = await _read_body(request, opts.max_msg_size)
            if not body:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    addresses = json.loads(body)
                except (ValueError, UnicodeDecodeError):
                    raise HTTPError(400, "INVALID_VALUE") from None
                if addresses is None:
                    addresses = []
                if not isinstance(addresses, list) or not all(
                    isinstance(a, str) for a in addresses
                ):
                    raise HTTPError(400, "INVALID_VALUE")
                lookup = getattr(self.server, "lookup", None)
                if lookup is not None:
                    lookup.set_addresses(addresses)  # reconciles the lookupd peers live
                else:
                    opts.lookupd_tcp_addresses = addresses
            elif opt == "log_level":
                try:
                    level = LogLevel.parse(body.decode("utf-8", "surrogateescape"))
                except ValueError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                opts.log_level = level
                self.logger.level = level
                self.nsqd.logger.level = level
            else:
                raise HTTPError(400, "INVALID_OPTION")
        ref = option_by_cfg_name(opts, opt)
        if ref is None:
            raise HTTPError(400, "INVALID_OPTION")
        return ref.go_value

    # -- beyond NSQ -------------------------------------------------------------------------

    async def _channel_peek(self, request: Request, _: str) -> object:
        """The next ``n`` (default 1, at most 1000) messages of the channel's memory queue,
        oldest first, without taking them; messages spilled to disk are not shown."""
        channel = self._existing_channel(request)
        n_text = ReqParams(request).get("n") or "1"
        if not n_text.isdigit() or not 1 <= int(n_text) <= 1000:
            raise HTTPError(400, "INVALID_ARG_N")
        queued = channel.peek(int(n_text))
        return {
            "depth": channel.depth,
            "messages": [
                {
                    "id": msg_id.decode("ascii", "replace"),
                    "timestamp": timestamp,
                    "attempts": attempts & 0xFFFF,
                    "body": base64.b64encode(body).decode("ascii"),
                }
                for msg_id, timestamp, attempts, body in queued
            ],
        }

    async def _policy(self, request: Request, _: str) -> object:
        """GET (effective policy, with sources), POST (JSON update: absent fields kept,
        null clears) and DELETE (clear) of a topic's or channel's policy (policy.py)."""
        params = ReqParams(request)
        channel_name: str | None = None
        if request.path.startswith("/channel/"):
            topic_name, channel_name = params.topic_channel()
        else:
            topic_name = params.topic()
            if not is_valid_topic_name(topic_name):
                raise HTTPError(400, "INVALID_TOPIC")
        book = self.nsqd.policies
        topic = self.nsqd.get_existing_topic(topic_name)
        if request.method == "GET":
            if topic is None:
                raise HTTPError(404, "TOPIC_NOT_FOUND")
            if channel_name is not None and channel_name not in topic.channels:
                raise HTTPError(404, "CHANNEL_NOT_FOUND")
            return self._policy_reply(topic_name, channel_name)
        if request.method == "POST":
            body = await _read_body(request, 65536)
            if body is None:
                raise HTTPError(413, "BODY_TOO_BIG")
            try:
                policy = book.get(topic_name, channel_name).updated(
                    body, topic_name, channel=channel_name is not None
                )
            except PolicyError as refused:
                raise HTTPError(400, str(refused)) from None
        else:
            policy = Policy()
        if self.nsqd.exiting:
            raise HTTPError(503, "EXITING")
        try:
            book.set(topic_name, channel_name, policy)
        except OSError as err:
            self.logger.error(f"failed to persist policies - {err}")
            raise HTTPError(500, "INTERNAL_ERROR") from None
        if request.method == "POST":
            topic = self.nsqd.get_topic(topic_name)
            if channel_name is not None:
                topic.get_channel(channel_name)
        return self._policy_reply(topic_name, channel_name)

    def _policy_reply(self, topic_name: str, channel_name: str | None) -> dict[str, object]:
        book = self.nsqd.policies
        reply: dict[str, object] = {"topic_name": topic_name}
        if channel_name is not None:
            reply["channel_name"] = channel_name
        reply["policy"] = book.get(topic_name, channel_name).to_json()
        reply["effective"] = book.effective(topic_name, channel_name).to_json()
        return reply

    async def _metrics(self, request: Request, _: str) -> Response:
        stats, health, connections = await self._gather_stats("", "", True)
        text = format_prometheus(
            stats,
            health_ok=health == "OK",
            start_time=self.nsqd.start_time,
            connections=connections,
        )
        return Response(200, text.encode(), {"Content-Type": PROMETHEUS_CONTENT_TYPE})

    # -- /debug ---------------------------------------------------------------------------------

    async def _pprof_index(self, request: Request, _: str) -> Response:
        return text_response(
            200,
            "nsqd (nsqpy) debug pages, the Python counterparts of Go's /debug/pprof:\n\n"
            "/debug/pprof/goroutine      stack of every thread and every asyncio task\n"
            "/debug/pprof/threadcreate   the threads\n"
            "/debug/pprof/heap           tracemalloc snapshot, tracing starts on the first call\n"
            "                            ?top=N (30) &group=lineno|filename|traceback &stop=1\n"
            "/debug/pprof/profile        cProfile of the event loop thread for ?seconds=N (30),\n"
            "                            &sort=tottime|cumulative|calls &top=N (60)\n"
            "/debug/pprof/cmdline        the command line, NUL separated\n"
            "PUT  /debug/setblockrate    accepted for compatibility, no effect\n"
            "POST /debug/freememory      full garbage collection, then malloc_trim\n\n"
            f"Sampling flame graphs without overhead: py-spy record --pid {os.getpid()}\n",
        )

    async def _pprof_goroutine(self, request: Request, _: str) -> Response:
        out = io.StringIO()
        frames = sys._current_frames()
        threads = threading.enumerate()
        out.write(f"threads: {len(threads)}\n")
        for thread in threads:
            daemon = " daemon" if thread.daemon else ""
            out.write(f"\nthread {thread.name} (ident {thread.ident}){daemon}:\n")
            frame = frames.get(thread.ident or -1)
            if frame is not None:
                out.write("".join(traceback.format_stack(frame)))
        tasks = asyncio.all_tasks()
        out.write(f"\nasyncio tasks: {len(tasks)}\n")
        for task in sorted(tasks, key=lambda t: t.get_name()):
            coro = task.get_coro()
            name = getattr(coro, "__qualname__", repr(coro))
            out.write(f"\ntask {task.get_name()} coro={name}:\n")
            out.write("".join(traceback.format_list(_await_stack(coro))))
        return text_response(200, out.getvalue())

    async def _pprof_threads(self, request: Request, _: str) -> Response:
        threads = threading.enumerate()
        lines = [f"threads: {len(threads)}"]
        lines += [f"{t.name} ident={t.ident} daemon={t.daemon}" for t in threads]
        return text_response(200, "\n".join(lines) + "\n")

    async def _pprof_heap(self, request: Request, _: str) -> Response:
        import tracemalloc  # the /debug pages' modules load when first used

        params = ReqParams(request)
        top_text = params.get("top") or "30"
        group = params.get("group") or "lineno"
        if not top_text.isdigit() or group not in ("lineno", "filename", "traceback"):
            raise HTTPError(400, "INVALID_ARG")
        out = io.StringIO()
        if not tracemalloc.is_tracing():
            tracemalloc.start(25)
            out.write("tracemalloc started now (25 frames): allocations from here on are traced,\n")
            out.write(
                "call again for a meaningful snapshot (tracing slows nsqd down; &stop=1 ends it)\n\n"
            )
        current, peak = tracemalloc.get_traced_memory()
        out.write(
            f"traced memory: current {current} bytes, peak {peak} bytes, "
            f"tracemalloc overhead {tracemalloc.get_tracemalloc_memory()} bytes\n"
        )
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        statistics = snapshot.statistics(group)
        top = int(top_text)
        out.write(f"top {min(top, len(statistics))} of {len(statistics)} by {group}:\n")
        for index, stat in enumerate(statistics[:top], 1):
            out.write(f"#{index}: {stat.size} bytes in {stat.count} blocks")
            lines = stat.traceback.format(most_recent_first=True)
            out.write(f"  {lines[0].strip()}\n" if group != "traceback" else "\n")
            if group == "traceback":
                out.write("\n".join(lines) + "\n")
        rest = statistics[top:]
        if rest:
            out.write(
                f"other: {sum(s.size for s in rest)} bytes in {sum(s.count for s in rest)} blocks\n"
            )
        out.write(f"total: {sum(s.size for s in statistics)} bytes\n")
        if BOOL_PARAMS.get(params.get("stop") or "", False):
            tracemalloc.stop()
            out.write("tracemalloc stopped\n")
        return text_response(200, out.getvalue())

    async def _pprof_profile(self, request: Request, _: str) -> Response:
        import cProfile
        import pstats

        params = ReqParams(request)
        seconds_text = params.get("seconds") or "30"
        top_text = params.get("top") or "60"
        sort = params.get("sort") or "tottime"
        if (
            not seconds_text.isdigit()
            or not top_text.isdigit()
            or sort not in ("tottime", "cumulative", "calls", "ncalls")
        ):
            raise HTTPError(400, "INVALID_ARG")
        if self._profiling:
            raise HTTPError(500, "Could not enable CPU profiling: cpu profiling already in use")
        self._profiling = True
        profile = cProfile.Profile()
        try:
            profile.enable()
            try:
                await asyncio.sleep(int(seconds_text))
            finally:
                profile.disable()
        finally:
            self._profiling = False
        out = io.StringIO()
        out.write(f"cProfile of the event loop thread over {int(seconds_text)}s\n")
        pstats.Stats(profile, stream=out).sort_stats(sort).print_stats(int(top_text))
        return text_response(200, out.getvalue())

    async def _pprof_cmdline(self, request: Request, _: str) -> Response:
        return text_response(200, "\x00".join(sys.argv))

    async def _set_block_rate(self, request: Request, _: str) -> Response:
        rate = ReqParams(request).get("rate") or ""
        if not _INT64.match(rate):
            raise HTTPError(
                400, f"invalid block rate : strconv.Atoi: parsing {go_quote(rate)}: invalid syntax"
            )
        if not -(1 << 63) <= int(rate) < 1 << 63:
            raise HTTPError(
                400,
                f"invalid block rate : strconv.Atoi: parsing {go_quote(rate)}: value out of range",
            )
        return Response(200)

    async def _free_memory(self, request: Request, _: str) -> Response:
        gc.collect()
        _malloc_trim()
        return Response(200)


def _await_stack(coro: Any) -> traceback.StackSummary:
    """The chain of awaits of a coroutine, outermost first (a goroutine-like stack)."""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(frames)


def _malloc_trim() -> None:
    """Give free heap memory back to the OS (glibc only), like Go's FreeOSMemory."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)
