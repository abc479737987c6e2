"""In-process fakes of nsqlookupd and nsqd HTTP APIs serving the spec's JSON shapes
(§3.2, §4.3), for nsqadmin's unit tests.  The end-to-end tests use the real servers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

V1 = {"X-NSQ-Content-Type": "nsq; version=1.0"}


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, headers=V1)


def _err(status: int, text: str) -> web.Response:
    return _json({"message": text}, status)


@dataclass
class FakeChannel:
    depth: int = 0
    backend_depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    message_count: int = 0
    requeue: int = 0
    timeout: int = 0
    paused: bool = False
    clients: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FakeTopic:
    depth: int = 0
    backend_depth: int = 0
    message_count: int = 0
    paused: bool = False
    channels: dict[str, FakeChannel] = field(default_factory=dict)


class FakeNSQD:
    """An nsqd HTTP API with scripted topics; records every POST it receives."""

    def __init__(self, hostname: str = "fake-nsqd") -> None:
        self.hostname = hostname
        self.topics: dict[str, FakeTopic] = {}
        self.posts: list[str] = []
        self.port = 0
        self.broken = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/info", self.info)
        app.router.add_get("/stats", self.stats)
        for path in ("create", "delete", "empty", "pause", "unpause"):
            app.router.add_post(f"/topic/{path}", self.topic_action)
            app.router.add_post(f"/channel/{path}", self.channel_action)
        return app

    async def info(self, request: web.Request) -> web.Response:
        if self.broken:
            return _err(500, "INTERNAL_ERROR")
        return _json(
            {
                "version": "1.3.0",
                "broadcast_address": "127.0.0.1",
                "hostname": self.hostname,
                "http_port": self.port,
                "tcp_port": self.port + 1,
                "start_time": int(time.time()),
            }
        )

    async def stats(self, request: web.Request) -> web.Response:
        if self.broken:
            return _err(500, "INTERNAL_ERROR")
        assert request.query.get("format") == "json"
        include_clients = request.query.get("include_clients", "true") in ("true", "1")
        only_topic = request.query.get("topic", "")
        only_channel = request.query.get("channel", "")
        topics = []
        for name in sorted(self.topics):
            if only_topic and name != only_topic:
                continue
            t = self.topics[name]
            channels = []
            for cname in sorted(t.channels):
                if only_channel and cname != only_channel:
                    continue
                c = t.channels[cname]
                channels.append(
                    {
                        "channel_name": cname,
                        "depth": c.depth,
                        "backend_depth": c.backend_depth,
                        "in_flight_count": c.in_flight,
                        "deferred_count": c.deferred,
                        "message_count": c.message_count,
                        "requeue_count": c.requeue,
                        "timeout_count": c.timeout,
                        "client_count": len(c.clients),
                        "clients": list(c.clients) if include_clients else None,
                        "paused": c.paused,
                        "e2e_processing_latency": {
                            "count": 3,
                            "percentiles": [{"quantile": 0.99, "value": 2_000_000}],
                        },
                    }
                )
            topics.append(
                {
                    "topic_name": name,
                    "channels": channels,
                    "depth": t.depth,
                    "backend_depth": t.backend_depth,
                    "message_count": t.message_count,
                    "paused": t.paused,
                    "e2e_processing_latency": {"count": 0, "percentiles": None},
                }
            )
        if only_topic and not topics:
            return _json({"version": "1.3.0", "health": "OK", "topics": None, "producers": None})
        doc: dict[str, Any] = {
            "version": "1.3.0",
            "health": "OK",
            "start_time": 0,
            "topics": topics,
        }
        if request.query.get("include_mem", "true") in ("true", "1"):
            doc["memory"] = {"heap_objects": 1, "heap_in_use_bytes": 2, "gc_total_runs": 3}
        doc["producers"] = None
        return _json(doc)

    async def topic_action(self, request: web.Request) -> web.Response:
        self.posts.append(request.path_qs)
        name = request.query.get("topic", "")
        action = request.path.rsplit("/", 1)[1]
        if not name:
            return _err(400, "MISSING_ARG_TOPIC")
        if action == "create":
            self.topics.setdefault(name, FakeTopic())
            return web.Response(headers=V1)
        topic = self.topics.get(name)
        if topic is None:
            return _err(404, "TOPIC_NOT_FOUND")
        if action == "delete":
            del self.topics[name]
        elif action == "empty":
            topic.depth = topic.backend_depth = 0
        else:
            topic.paused = action == "pause"
        return web.Response(headers=V1)

    async def channel_action(self, request: web.Request) -> web.Response:
        self.posts.append(request.path_qs)
        name = request.query.get("topic", "")
        cname = request.query.get("channel", "")
        action = request.path.rsplit("/", 1)[1]
        topic = self.topics.get(name)
        if topic is None:
            return _err(404, "TOPIC_NOT_FOUND")
        if action == "create":
            topic.channels.setdefault(cname, FakeChannel())
            return web.Response(headers=V1)
        channel = topic.channels.get(cname)
        if channel is None:
            return _err(404, "CHANNEL_NOT_FOUND")
        if action == "delete":
            del topic.channels[cname]
        elif action == "empty":
            channel.depth = channel.backend_depth = 0
        else:
            channel.paused = action == "pause"
        return web.Response(headers=V1)


class FakeLookupd:
    """An nsqlookupd HTTP API whose registrations are the fake nsqds' topics."""

    def __init__(self, nsqds: list[FakeNSQD]) -> None:
        self.nsqds = nsqds
        self.extra_topics: dict[str, set[str]] = {}
        self.tombstones: set[tuple[str, str]] = set()
        self.posts: list[str] = []
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/topics", self.topics)
        app.router.add_get("/channels", self.channels)
        app.router.add_get("/lookup", self.lookup)
        app.router.add_get("/nodes", self.nodes)
        app.router.add_get("/info", self.info)
        for path in (
            "topic/create",
            "topic/delete",
            "channel/create",
            "channel/delete",
            "topic/tombstone",
        ):
            app.router.add_post(f"/{path}", self.action)
        return app

    def _all_topics(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {k: set(v) for k, v in self.extra_topics.items()}
        for nsqd in self.nsqds:
            for name, topic in nsqd.topics.items():
                out.setdefault(name, set()).update(topic.channels)
        return out

    def _peer(self, nsqd: FakeNSQD) -> dict[str, Any]:
        return {
            "remote_address": f"127.0.0.1:{40000 + nsqd.port % 1000}",
            "hostname": nsqd.hostname,
            "broadcast_address": "127.0.0.1",
            "tcp_port": nsqd.port + 1,
            "http_port": nsqd.port,
            "version": "1.3.0",
            "topology_zone": "",
            "topology_region": "",
        }

    async def info(self, request: web.Request) -> web.Response:
        return _json({"version": "1.3.0"})

    async def topics(self, request: web.Request) -> web.Response:
        return _json({"topics": sorted(self._all_topics())})

    async def channels(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic")
        if not topic:
            return _err(400, "MISSING_ARG_TOPIC")
        return _json({"channels": sorted(self._all_topics().get(topic, set()))})

    async def lookup(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic")
        if not topic:
            return _err(400, "MISSING_ARG_TOPIC")
        everything = self._all_topics()
        if topic not in everything:
            return _err(404, "TOPIC_NOT_FOUND")
        producers = [
            self._peer(n)
            for n in self.nsqds
            if topic in n.topics and (topic, f"127.0.0.1:{n.port}") not in self.tombstones
        ]
        return _json({"channels": sorted(everything[topic]), "producers": producers})

    async def nodes(self, request: web.Request) -> web.Response:
        out = []
        for n in self.nsqds:
            peer = self._peer(n)
            names = sorted(n.topics)
            peer["topics"] = names
            peer["tombstones"] = [(t, f"127.0.0.1:{n.port}") in self.tombstones for t in names]
            out.append(peer)
        return _json({"producers": out})

    async def action(self, request: web.Request) -> web.Response:
        self.posts.append(request.path_qs)
        topic = request.query.get("topic", "")
        channel = request.query.get("channel", "")
        if not topic:
            return _err(400, "MISSING_ARG_TOPIC")
        if request.path == "/topic/create":
            self.extra_topics.setdefault(topic, set())
        elif request.path == "/topic/delete":
            self.extra_topics.pop(topic, None)
        elif request.path == "/channel/create":
            self.extra_topics.setdefault(topic, set()).add(channel)
        elif request.path == "/channel/delete":
            self.extra_topics.get(topic, set()).discard(channel)
        elif request.path == "/topic/tombstone":
            node = request.query.get("node", "")
            if not node:
                return _err(400, "MISSING_ARG_NODE")
            self.tombstones.add((topic, node))
        return web.Response(headers=V1)


def demo_cluster() -> tuple[FakeLookupd, list[FakeNSQD]]:
    """Two nsqd with a few topics, channels and clients."""
    now = int(time.time())
    a, b = FakeNSQD("nsqd-a"), FakeNSQD("nsqd-b")
    client = {
        "client_id": "worker-1",
        "hostname": "worker-1.local",
        "version": "V2",
        "remote_address": "127.0.0.1:50123",
        "state": 3,
        "ready_count": 10,
        "in_flight_count": 2,
        "message_count": 40,
        "finish_count": 38,
        "requeue_count": 1,
        "connect_ts": now - 313,
        "sample_rate": 0,
        "deflate": False,
        "snappy": True,
        "user_agent": "pynsq/0.9.1",
        "tls": False,
    }
    a.topics["orders"] = FakeTopic(
        depth=12,
        backend_depth=2,
        message_count=100,
        channels={
            "billing": FakeChannel(depth=5, in_flight=2, message_count=60, clients=[client]),
            "audit": FakeChannel(depth=1, message_count=40, paused=True),
        },
    )
    b.topics["orders"] = FakeTopic(
        depth=3, message_count=50, channels={"billing": FakeChannel(depth=3, message_count=50)}
    )
    b.topics["clicks"] = FakeTopic(depth=7, message_count=7)
    return FakeLookupd([a, b]), [a, b]


def test_demo_cluster_shapes() -> None:
    lookupd, nsqds = demo_cluster()
    assert set(lookupd._all_topics()) == {"orders", "clicks"}
    assert nsqds[0].topics["orders"].channels["billing"].clients[0]["user_agent"] == "pynsq/0.9.1"
