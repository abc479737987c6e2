"""nsqadmin's HTTP API in-process, against fake nsqlookupd and nsqd (see test_nsqadmin_fakes).

The same routes are driven against real processes in tests/e2e/test_nsqadmin_api.py; these
tests cover the error paths that are awkward to provoke with real servers.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from nsqpy.common.log import Logger, LogLevel
from nsqpy.nsqadmin.nsqadmin import NSQAdmin
from nsqpy.nsqadmin.options import Options, validate
from tests.unit.test_nsqadmin_fakes import FakeLookupd, FakeNSQD, demo_cluster

V1 = "nsq; version=1.0"


def run(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 30))

    return wrapper


@dataclass
class Env:
    admin: NSQAdmin
    lookupd: FakeLookupd
    nsqds: list[FakeNSQD]
    http: aiohttp.ClientSession
    log: io.StringIO

    @property
    def base(self) -> str:
        return f"http://{self.admin.http_address}"

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.http.get(self.base + path, **kw) as r:
            return r.status, await _body(r)

    async def post(self, path: str, doc: Any = None, **kw: Any) -> tuple[int, Any]:
        data = json.dumps(doc) if doc is not None else None
        async with self.http.post(self.base + path, data=data, **kw) as r:
            return r.status, await _body(r)

    async def delete(self, path: str, doc: Any = None, **kw: Any) -> tuple[int, Any]:
        data = json.dumps(doc) if doc is not None else None
        async with self.http.delete(self.base + path, data=data, **kw) as r:
            return r.status, await _body(r)


async def _body(r: aiohttp.ClientResponse) -> Any:
    raw = await r.read()
    if r.content_type == "application/json":
        assert r.headers.get("X-NSQ-Content-Type") == V1
        return json.loads(raw)
    return raw.decode()


async def _serve(app: web.Application) -> TestServer:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@asynccontextmanager
async def cluster(
    *, mode: str = "lookupd", extra_lookupds: tuple[str, ...] = (), **options: Any
) -> AsyncIterator[Env]:
    lookupd, nsqds = demo_cluster()
    servers = []
    for fake in (lookupd, *nsqds):
        server = await _serve(fake.app())
        fake.port = server.port or 0
        servers.append(server)
    options.setdefault("sample_interval", 0)
    opts = Options(http_address="127.0.0.1:0", **options)
    if mode == "lookupd":
        opts.nsqlookupd_http_addresses = [f"127.0.0.1:{lookupd.port}", *extra_lookupds]
    else:
        opts.nsqd_http_addresses = [f"127.0.0.1:{n.port}" for n in nsqds]
    validate(opts)
    log = io.StringIO()
    admin = NSQAdmin(opts, Logger("[nsqadmin] ", LogLevel.DEBUG, log))
    await admin.start()
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    try:
        yield Env(admin, lookupd, nsqds, http, log)
    finally:
        await http.close()
        await admin.stop()
        for server in servers:
            await server.close()


DEAD = "127.0.0.1:1"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -------------------------------------------------------------------------- pages


@run
async def test_ping_index_and_static() -> None:
    async with cluster() as env:
        assert await env.get("/ping") == (200, "OK")
        status, page = await env.get("/topics/orders")
        assert status == 200
        assert '<base href="/">' in page
        config = json.loads(page.split('type="application/json">')[1].split("</script>")[0])
        assert config["isAdmin"] is True
        assert config["nsqlookupd"] == [f"127.0.0.1:{env.lookupd.port}"]
        async with env.http.get(env.base + "/static/js/main.js") as r:
            assert r.status == 200
            assert r.content_type == "text/javascript"
            etag = r.headers["ETag"]
        async with env.http.get(
            env.base + "/static/js/main.js", headers={"If-None-Match": etag}
        ) as r:
            assert r.status == 304
        assert await env.get("/static/nope.js") == (404, {"message": "NOT_FOUND"})
        assert (await env.get("/static/%2e%2e/options.py"))[0] == 404
        assert await env.get("/nope") == (404, {"message": "NOT_FOUND"})
        async with env.http.put(env.base + "/api/topics") as r:
            assert r.status == 405
            assert await r.json() == {"message": "METHOD_NOT_ALLOWED"}
            assert "GET" in r.headers["Allow"]


@run
async def test_compression_when_asked() -> None:
    async with cluster() as env:
        async with env.http.get(
            env.base + "/api/topics/orders", headers={"Accept-Encoding": "gzip"}
        ) as r:
            assert r.headers.get("Content-Encoding") == "gzip"
            assert (await r.json())["topic_name"] == "orders"


# -------------------------------------------------------------------------- queries


@run
async def test_topics_and_inactive_topics() -> None:
    async with cluster() as env:
        assert await env.get("/api/topics") == (
            200,
            {"topics": ["clicks", "orders"], "message": ""},
        )
        env.lookupd.extra_topics["ghost"] = {"c1", "c0"}
        status, doc = await env.get("/api/topics?inactive=true")
        assert status == 200
        assert doc == {"topics": {"ghost": ["c0", "c1"]}, "message": ""}


@run
async def test_topic_aggregates_every_node() -> None:
    async with cluster() as env:
        status, doc = await env.get("/api/topics/orders")
        assert status == 200
        assert doc["node"] == "*"
        assert doc["topic_name"] == "orders"
        assert (doc["depth"], doc["backend_depth"], doc["memory_depth"]) == (15, 2, 13)
        assert doc["message_count"] == 150
        assert [n["hostname"] for n in doc["nodes"]] == ["nsqd-a", "nsqd-b"]
        assert [n["node"] for n in doc["nodes"]] == [f"127.0.0.1:{n.port}" for n in env.nsqds]
        billing, audit = (
            next(c for c in doc["channels"] if c["channel_name"] == name)
            for name in ("billing", "audit")
        )
        assert [c["channel_name"] for c in doc["channels"]] == ["audit", "billing"]
        assert (billing["depth"], billing["message_count"], len(billing["nodes"])) == (8, 110, 2)
        assert billing["client_count"] == 1
        assert billing["clients"] == []  # the topic page asks without clients
        assert audit["paused"] is True and doc["paused"] is False
        p99 = billing["e2e_processing_latency"]["percentiles"][0]
        assert p99["quantile"] == 0.99 and p99["max"] == 2_000_000
        assert list(doc)[-1] == "message"


@run
async def test_channel_with_clients_and_missing_channel() -> None:
    async with cluster() as env:
        status, doc = await env.get("/api/topics/orders/billing")
        assert status == 200
        assert (doc["node"], doc["topic_name"], doc["channel_name"]) == ("*", "orders", "billing")
        assert doc["in_flight_count"] == 2
        (client,) = doc["clients"]
        assert client["node"] == f"127.0.0.1:{env.nsqds[0].port}"
        assert client["user_agent"] == "pynsq/0.9.1"
        assert client["snappy"] is True
        assert 313e9 <= client["connected"] <= 330e9
        assert await env.get("/api/topics/orders/nope") == (200, {"message": ""})


@run
async def test_nodes_and_node() -> None:
    async with cluster() as env:
        env.lookupd.tombstones.add(("clicks", f"127.0.0.1:{env.nsqds[1].port}"))
        status, doc = await env.get("/api/nodes")
        assert status == 200
        a, b = doc["nodes"]
        assert a["hostname"] == "nsqd-a" and a["http_port"] == env.nsqds[0].port
        assert a["remote_addresses"] == [f"127.0.0.1:{env.lookupd.port}/{a['remote_address']}"]
        assert b["topics"] == [
            {"topic": "clicks", "tombstoned": True},
            {"topic": "orders", "tombstoned": False},
        ]
        node = f"127.0.0.1:{env.nsqds[0].port}"
        status, doc = await env.get(f"/api/nodes/{node}")
        assert status == 200
        assert doc["node"] == node
        assert [t["topic_name"] for t in doc["topics"]] == ["orders"]
        assert (doc["total_messages"], doc["total_clients"]) == (100, 1)
        assert doc["memory"]["gc_total_runs"] == 3
        assert doc["producer"]["hostname"] == "nsqd-a"
        assert await env.get("/api/nodes/127.0.0.1:9") == (404, {"message": "NODE_NOT_FOUND"})


@run
async def test_counter() -> None:
    async with cluster() as env:
        status, doc = await env.get("/api/counter")
        assert status == 200
        a = f"127.0.0.1:{env.nsqds[0].port}"
        assert doc["stats"][f"orders:billing:{a}"] == {
            "node": a,
            "topic_name": "orders",
            "channel_name": "billing",
            "message_count": 60,
        }
        assert len(doc["stats"]) == 3


@run
async def test_nsqd_mode_queries() -> None:
    async with cluster(mode="nsqd") as env:
        assert (await env.get("/api/topics"))[1] == {"topics": ["clicks", "orders"], "message": ""}
        doc = (await env.get("/api/topics/clicks"))[1]
        assert [n["hostname"] for n in doc["nodes"]] == ["nsqd-b"]
        nodes = (await env.get("/api/nodes"))[1]["nodes"]
        assert [n["hostname"] for n in nodes] == ["nsqd-a", "nsqd-b"]
        assert nodes[0]["remote_addresses"] == []
        assert (await env.get("/api/topics?inactive=true"))[1] == {"topics": {}, "message": ""}


# -------------------------------------------------------------------------- failures


@run
async def test_partial_failure_is_a_warning() -> None:
    async with cluster(extra_lookupds=(DEAD,)) as env:
        status, doc = await env.get("/api/topics")
        assert status == 200
        assert doc["topics"] == ["clicks", "orders"]
        assert doc["message"].startswith("WARNING: ")
        assert f'"http://{DEAD}/topics"' in doc["message"]
        assert "connection refused" in doc["message"]
        assert "WARNING" in env.log.getvalue()


@run
async def test_broken_nsqd_is_a_warning_and_all_broken_is_502() -> None:
    async with cluster() as env:
        env.nsqds[1].broken = True
        status, doc = await env.get("/api/topics/orders")
        assert status == 200
        assert doc["depth"] == 12
        assert doc["message"].startswith("WARNING: got response 500 Internal Server Error ")
        env.nsqds[0].broken = True
        status, doc = await env.get("/api/topics/orders")
        assert status == 502
        assert doc["message"].startswith(
            "UPSTREAM_ERROR: Failed to query any nsqd: got response 500"
        )


@run
async def test_no_upstream_answers_is_502() -> None:
    async with cluster() as env:
        env.admin.opts.nsqlookupd_http_addresses = [DEAD]
        for path in ("/api/topics", "/api/topics/orders", "/api/nodes", "/api/counter"):
            status, doc = await env.get(path)
            assert status == 502, path
            assert doc["message"].startswith("UPSTREAM_ERROR: Failed to query any nsqlookupd: ")


@run
async def test_missing_topic_is_502_like_go() -> None:
    async with cluster() as env:
        status, doc = await env.get("/api/topics/nope")
        assert status == 502
        assert "TOPIC_NOT_FOUND" in doc["message"]


# -------------------------------------------------------------------------- actions


@run
async def test_create_topic_and_channel() -> None:
    async with cluster() as env:
        assert await env.post("/api/topics", {"topic": "orders", "channel": "new"}) == (
            200,
            {"message": ""},
        )
        assert env.lookupd.posts == [
            "/topic/create?topic=orders",
            "/channel/create?topic=orders&channel=new",
        ]
        for nsqd in env.nsqds:
            assert nsqd.posts == ["/channel/create?topic=orders&channel=new"]
            assert "new" in nsqd.topics["orders"].channels
        assert await env.post("/api/topics", {"topic": "only"}) == (200, {"message": ""})
        assert "only" in env.lookupd.extra_topics
        assert await env.post("/api/topics", {"topic": "bad name"}) == (
            400,
            {"message": "INVALID_TOPIC"},
        )
        assert await env.post("/api/topics", {"topic": "ok", "channel": "b@d"}) == (
            400,
            {"message": "INVALID_CHANNEL"},
        )
        async with env.http.post(env.base + "/api/topics", data=b"{") as r:
            assert (r.status, await r.json()) == (400, {"message": "INVALID_BODY"})


@run
async def test_create_in_nsqd_mode_creates_on_every_nsqd() -> None:
    async with cluster(mode="nsqd") as env:
        assert await env.post("/api/topics", {"topic": "fresh", "channel": "c"}) == (
            200,
            {"message": ""},
        )
        for nsqd in env.nsqds:
            assert nsqd.posts == [
                "/topic/create?topic=fresh",
                "/channel/create?topic=fresh&channel=c",
            ]


@run
async def test_pause_unpause_empty() -> None:
    async with cluster() as env:
        a, b = env.nsqds
        assert await env.post("/api/topics/orders", {"action": "pause"}) == (200, {"message": ""})
        assert a.topics["orders"].paused and b.topics["orders"].paused
        assert await env.post("/api/topics/orders", {"action": "unpause"}) == (200, {"message": ""})
        assert not a.topics["orders"].paused
        await env.post("/api/topics/orders/billing", {"action": "pause"})
        assert b.topics["orders"].channels["billing"].paused
        await env.post("/api/topics/orders/billing", {"action": "unpause"})
        assert not b.topics["orders"].channels["billing"].paused
        await env.post("/api/topics/orders/billing", {"action": "empty"})
        assert a.topics["orders"].channels["billing"].depth == 0
        await env.post("/api/topics/clicks", {"action": "empty"})
        assert b.topics["clicks"].depth == 0 and a.posts[-1].startswith("/channel/empty")
        assert await env.post("/api/topics/orders", {"action": "explode"}) == (
            400,
            {"message": "INVALID_ACTION"},
        )


@run
async def test_delete_channel_and_topic_remove_the_lookupd_keys() -> None:
    async with cluster() as env:
        a, b = env.nsqds
        assert await env.delete("/api/topics/orders/billing") == (200, {"message": ""})
        assert env.lookupd.posts == ["/channel/delete?topic=orders&channel=billing"]
        assert "billing" not in a.topics["orders"].channels
        assert "billing" not in b.topics["orders"].channels
        assert await env.delete("/api/topics/orders") == (200, {"message": ""})
        assert env.lookupd.posts[-1] == "/topic/delete?topic=orders"
        assert "orders" not in a.topics and "orders" not in b.topics


@run
async def test_tombstone_one_producer() -> None:
    async with cluster() as env:
        a, b = env.nsqds
        node = f"127.0.0.1:{b.port}"
        assert await env.delete(f"/api/nodes/{node}", {"topic": "orders"}) == (
            200,
            {"message": ""},
        )
        assert env.lookupd.posts == [f"/topic/tombstone?topic=orders&node=127.0.0.1:{b.port}"]
        assert "orders" not in b.topics and "orders" in a.topics
        assert a.posts == []
        assert await env.delete(f"/api/nodes/{node}", {"topic": "b d"}) == (
            400,
            {"message": "INVALID_TOPIC"},
        )
        assert await env.delete(f"/api/nodes/{node}") == (400, {"message": "INVALID_BODY"})


@run
async def test_action_partial_failure_warns() -> None:
    async with cluster(extra_lookupds=(DEAD,)) as env:
        status, doc = await env.delete("/api/topics/clicks")
        assert status == 200
        assert doc["message"].startswith("WARNING: ")
        assert "/topic/delete?topic=clicks" in doc["message"]
        assert "clicks" not in env.nsqds[1].topics


# -------------------------------------------------------------------------- ACL, config


@run
async def test_admin_users_only_may_act() -> None:
    async with cluster(admin_users=["alice"], acl_http_header="X-Auth-User") as env:
        body = {"topic": "t"}
        assert await env.post("/api/topics", body) == (403, {"message": "FORBIDDEN"})
        bob = {"X-Auth-User": "bob"}
        alice = {"X-Auth-User": "alice"}
        for call in (
            env.post("/api/topics", body, headers=bob),
            env.post("/api/topics/orders", {"action": "pause"}, headers=bob),
            env.post("/api/topics/orders/billing", {"action": "empty"}, headers=bob),
            env.delete("/api/topics/orders", headers=bob),
            env.delete("/api/topics/orders/billing", headers=bob),
            env.delete("/api/nodes/127.0.0.1:1", {"topic": "orders"}, headers=bob),
        ):
            assert await call == (403, {"message": "FORBIDDEN"})
        assert env.lookupd.posts == [] and all(n.posts == [] for n in env.nsqds)
        assert await env.post("/api/topics", body, headers=alice) == (200, {"message": ""})
        assert (await env.get("/api/topics", headers=bob))[0] == 200
        for headers, admin in ((bob, False), (alice, True)):
            page = (await env.get("/", headers=headers))[1]
            assert f'"isAdmin": {"true" if admin else "false"}' in page


@run
async def test_config_get_put_and_cidr() -> None:
    async with cluster() as env:
        lookupd = f"127.0.0.1:{env.lookupd.port}"
        assert await env.get("/config/nsqlookupd_http_addresses") == (200, [lookupd])
        assert await env.get("/config/http_client_connect_timeout") == (200, 2_000_000_000)
        assert await env.get("/config/base_path") == (200, "/")
        assert await env.get("/config/nope") == (400, {"message": "INVALID_OPTION"})
        async with env.http.put(env.base + "/config/log_level", data=b"warn") as r:
            assert (r.status, await r.json()) == (200, 3)
        assert env.admin.log.level == LogLevel.WARN
        async with env.http.put(env.base + "/config/log_level", data=b"loud") as r:
            assert (r.status, await r.json()) == (400, {"message": "INVALID_VALUE"})
        async with env.http.put(env.base + "/config/log_level", data=b"") as r:
            assert (r.status, await r.json()) == (413, {"message": "INVALID_VALUE"})
        async with env.http.put(env.base + "/config/http_address", data=b"x") as r:
            assert (r.status, await r.json()) == (400, {"message": "INVALID_OPTION"})
        body = json.dumps([lookupd, DEAD]).encode()
        async with env.http.put(env.base + "/config/nsqlookupd_http_addresses", data=body) as r:
            assert (r.status, await r.json()) == (200, [lookupd, DEAD])
        assert (await env.get("/api/topics"))[1]["message"].startswith("WARNING")
    async with cluster(allow_config_from_cidr="10.0.0.0/8") as env:
        assert await env.get("/config/log_level") == (403, {"message": "FORBIDDEN"})
    async with cluster(allow_config_from_cidr="") as env:
        assert await env.get("/config/log_level") == (200, 2)


@run
async def test_base_path() -> None:
    async with cluster(base_path="/admin/") as env:
        assert env.admin.opts.base_path == "/admin"
        assert await env.get("/admin/ping") == (200, "OK")
        assert (await env.get("/admin/api/topics"))[1]["topics"] == ["clicks", "orders"]
        assert (await env.get("/api/topics"))[0] == 404
        for path in ("/admin", "/admin/", "/admin/topics/orders/billing", "/admin/lookup"):
            status, page = await env.get(path)
            assert status == 200, path
            assert '<base href="/admin/">' in page
        assert (await env.get("/admin/static/css/app.css"))[0] == 200


# -------------------------------------------------------------------------- UI protection


@run
async def test_token_protection() -> None:
    async with cluster(http_auth_token="s3cret") as env:
        assert await env.get("/ping") == (200, "OK")
        assert await env.get("/api/topics") == (401, {"message": "UNAUTHORIZED"})
        status, page = await env.get("/", headers={"Accept": "text/html"})
        assert status == 401 and "name=auth_token" in page
        bearer = {"Authorization": "Bearer s3cret"}
        assert (await env.get("/api/topics", headers=bearer))[0] == 200
        assert (await env.get("/api/topics", headers={"Authorization": "Bearer nope"}))[0] == 401
        async with env.http.get(
            env.base + "/topics/orders?auth_token=s3cret&x=1", allow_redirects=False
        ) as r:
            assert r.status == 302
            assert r.headers["Location"] == "/topics/orders?x=1"
            assert "HttpOnly" in r.headers["Set-Cookie"]
        # the session now carries the cookie
        assert (await env.get("/api/topics"))[0] == 200


@run
async def test_basic_auth_protection_and_notification_user() -> None:
    received: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def hook(request: web.Request) -> web.Response:
        await received.put(await request.json())
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    hook_server = await _serve(app)
    endpoint = f"http://127.0.0.1:{hook_server.port}/hook"
    try:
        async with cluster(
            basic_auth_user="ops", basic_auth_password="pw", notification_http_endpoint=endpoint
        ) as env:
            status, doc = await env.get("/api/topics")
            assert (status, doc) == (401, {"message": "UNAUTHORIZED"})
            async with env.http.get(env.base + "/api/topics") as r:
                assert r.headers["WWW-Authenticate"] == 'Basic realm="nsqadmin"'
            bad = {"Authorization": _basic("ops", "nope")}
            assert (await env.get("/api/topics", headers=bad))[0] == 401
            good = {"Authorization": _basic("ops", "pw")}
            assert (await env.get("/api/topics", headers=good))[0] == 200
            status, _ = await env.post("/api/topics/orders", {"action": "pause"}, headers=good)
            assert status == 200
            note = await asyncio.wait_for(received.get(), 5)
            assert note["action"] == "pause_topic" and note["user"] == "ops"
    finally:
        await hook_server.close()


# -------------------------------------------------------------------------- notifications


@run
async def test_notifications_for_every_action() -> None:
    received: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    async def hook(request: web.Request) -> web.Response:
        await received.put((request.content_type, await request.json()))
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    hook_server = await _serve(app)
    try:
        async with cluster(
            notification_http_endpoint=f"http://127.0.0.1:{hook_server.port}/hook"
        ) as env:
            node = f"127.0.0.1:{env.nsqds[1].port}"
            ua = {"User-Agent": "pytest-agent"}
            calls = [
                env.post("/api/topics", {"topic": "orders", "channel": "x"}, headers=ua),
                env.post("/api/topics/orders", {"action": "pause"}, headers=ua),
                env.post("/api/topics/orders", {"action": "unpause"}, headers=ua),
                env.post("/api/topics/orders", {"action": "empty"}, headers=ua),
                env.post("/api/topics/orders/x", {"action": "pause"}, headers=ua),
                env.post("/api/topics/orders/x", {"action": "unpause"}, headers=ua),
                env.post("/api/topics/orders/x", {"action": "empty"}, headers=ua),
                env.delete("/api/topics/orders/x", headers=ua),
                env.delete(f"/api/nodes/{node}", {"topic": "clicks"}, headers=ua),
                env.delete("/api/topics/orders", headers=ua),
            ]
            for call in calls:
                assert (await call)[0] == 200
            notes = [await asyncio.wait_for(received.get(), 5) for _ in range(11)]
        assert all(ct == "application/json" for ct, _ in notes)
        bodies = [b for _, b in notes]
        assert [b["action"] for b in bodies] == [
            "create_topic",
            "create_channel",
            "pause_topic",
            "unpause_topic",
            "empty_topic",
            "pause_channel",
            "unpause_channel",
            "empty_channel",
            "delete_channel",
            "tombstone_topic_producer",
            "delete_topic",
        ]
        first = bodies[0]
        assert list(first) == [
            "action",
            "topic",
            "timestamp",
            "remote_ip",
            "user_agent",
            "url",
            "via",
        ]
        assert first["topic"] == "orders" and first["user_agent"] == "pytest-agent"
        assert first["remote_ip"].startswith("127.0.0.1:")
        assert first["url"] == f"http://{env.admin.http_address}/api/topics"
        assert bodies[1]["channel"] == "x"
        assert bodies[9]["node"] == node and bodies[9]["topic"] == "clicks"
        assert received.empty()
    finally:
        await hook_server.close()


@run
async def test_unreachable_notification_endpoint_is_only_logged() -> None:
    async with cluster(notification_http_endpoint=f"http://{DEAD}/hook") as env:
        assert (await env.post("/api/topics/orders", {"action": "pause"}))[0] == 200
    assert "failed to POST notification" in env.log.getvalue()


# -------------------------------------------------------------------------- history


@run
async def test_history_endpoint() -> None:
    async with cluster(sample_interval=3600, history_duration=7200) as env:
        assert await env.admin.sampler.sample_once() is not None
        a, b = env.nsqds
        a.topics["orders"].message_count += 30
        a.topics["orders"].channels["billing"].message_count += 30
        a.topics["orders"].depth += 5
        assert await env.admin.sampler.sample_once() is not None
        status, doc = await env.get("/api/history")
        assert status == 200
        assert doc["interval"] == 3600 and len(doc["timestamps"]) >= 2
        orders = doc["topics"]["orders"]
        assert orders["depth"] == 20 and orders["message_count"] == 180
        assert orders["series"]["depth"][-1] == 20
        assert orders["series"]["rate"][0] is None and orders["series"]["rate"][-1] > 0
        doc = (await env.get("/api/history?topic=orders"))[1]
        assert set(doc["channels"]) == {"audit", "billing"}
        assert doc["channels"]["billing"]["series"]["rate"][-1] > 0
        assert doc["channels"]["audit"]["series"]["rate"][-1] == 0
        doc = (await env.get("/api/history?topic=orders&channel=billing"))[1]
        assert doc["series"]["depth"][-1] == 8 and doc["series"]["in_flight"][-1] == 2
        doc = (await env.get(f"/api/history?node=127.0.0.1:{b.port}"))[1]
        assert doc["series"]["depth"][-1] == 10
        assert await env.get("/api/history?channel=x") == (400, {"message": "MISSING_ARG_TOPIC"})


# -------------------------------------------------------------------------- graphite


@run
async def test_graphite_rate_and_proxy() -> None:
    seen: list[tuple[str, str]] = []

    async def render(request: web.Request) -> web.Response:
        seen.append((request.query_string, request.headers.get("Authorization", "")))
        value = -1.0 if "negative" in request.query.get("target", "") else 120.0
        return web.json_response([{"target": "x", "datapoints": [[value, 1], [None, 2]]}])

    app = web.Application()
    app.router.add_get("/render", render)
    graphite = await _serve(app)
    try:
        url = f"http://user:pw@127.0.0.1:{graphite.port}"
        async with cluster(graphite_url=url, proxy_graphite=True, statsd_interval=60) as env:
            assert await env.get("/api/graphite?metric=rate&target=nsq.*.topic") == (
                200,
                {"rate": "2.00"},
            )
            assert "from=-120sec" in seen[-1][0] and "until=-60sec" in seen[-1][0]
            assert await env.get("/api/graphite?metric=rate&target=negative") == (
                200,
                {"rate": "N/A"},
            )
            assert await env.get("/api/graphite?metric=size&target=x") == (
                400,
                {"message": "INVALID_ARG_METRIC"},
            )
            assert await env.get("/api/graphite?metric=rate") == (
                400,
                {"message": "INVALID_ARG_TARGET"},
            )
            async with env.http.get(env.base + "/render?target=abc&format=json") as r:
                assert r.status == 200 and (await r.json())[0]["target"] == "x"
            assert seen[-1] == ("target=abc&format=json", _basic("user", "pw"))
            page = (await env.get("/"))[1]
            assert '"graphEnabled": true' in page
    finally:
        await graphite.close()
    async with cluster(graphite_url=f"http://{DEAD}") as env:
        assert await env.get("/api/graphite?metric=rate&target=x") == (
            500,
            {"message": "INTERNAL_ERROR"},
        )
        assert (await env.get("/render"))[0] == 404  # only with --proxy-graphite


# -------------------------------------------------------------------------- client details


@run
async def test_client_follows_tls_required_and_unwraps_legacy_replies() -> None:
    from nsqpy.nsqadmin.clusterinfo import HTTPClient, RequestError

    async def tls_required(request: web.Request) -> web.Response:
        return web.json_response({"message": "TLS_REQUIRED", "https_port": 1}, status=403)

    async def legacy(request: web.Request) -> web.Response:
        return web.json_response(
            {"status_code": 200, "status_txt": "OK", "data": {"topics": ["a"]}}
        )

    app = web.Application()
    app.router.add_get("/stats", tls_required)
    app.router.add_get("/topics", legacy)
    server = await _serve(app)
    client = HTTPClient(1.0, 2.0)
    try:
        assert await client.get_v1(f"http://127.0.0.1:{server.port}/topics") == {"topics": ["a"]}
        try:
            await client.get_v1(f"http://127.0.0.1:{server.port}/stats?format=json")
        except RequestError as err:
            # retried once over HTTPS on the advertised port
            assert str(err).startswith('Get "https://127.0.0.1:1/stats?format=json": ')
        else:
            raise AssertionError("expected a RequestError")
    finally:
        await client.close()
        await server.close()


def test_basic_auth_user() -> None:
    from nsqpy.nsqadmin.notify import basic_auth_user

    assert basic_auth_user(_basic("ops", "pw:with:colons")) == "ops"
    assert basic_auth_user(_basic("", "pw")) == ""
    assert basic_auth_user("Bearer abc") == ""
    assert basic_auth_user("Basic !!!") == ""
    assert basic_auth_user("Basic " + base64.b64encode(b"nocolon").decode()) == ""
