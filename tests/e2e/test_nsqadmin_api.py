"""nsqadmin's JSON API (spec §5.3) against a real cluster: nsqlookupd, two nsqd registered
with it, and nsqadmin processes, all on 127.0.0.1 port 0.

:class:`Cluster` is also what the browser tests (tests/browser) run the UI against.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests

from tests.support.procs import NSQD, ServerPool, ServerProcess, ServerSpec, run_once
from tests.support.rawclient import consumer

T = TypeVar("T")

LOOKUPD = ServerSpec(
    name="nsqlookupd",
    module="nsqpy.nsqlookupd",
    default_args=lambda _: [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ],
    ready=("tcp", "http"),
)
NSQD_WITH_HTTP = dataclasses.replace(NSQD, ready=("tcp", "http"))
NSQADMIN = ServerSpec(
    name="nsqadmin",
    module="nsqpy.nsqadmin",
    default_args=lambda _: ["--http-address=127.0.0.1:0"],
    ready=("http",),
)


def wait_until(check: Callable[[], T | None], timeout: float = 10.0, what: str = "") -> T:
    """Poll ``check`` (every 20 ms) until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (AssertionError, requests.RequestException, KeyError, IndexError) as err:
            last = err
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}: last={last!r}")
        time.sleep(0.02)


class Cluster:
    """nsqlookupd + N nsqd registered with it, and any number of nsqadmin."""

    def __init__(self, base: Path) -> None:
        self.lookupd_pool = ServerPool(LOOKUPD, base)
        self.nsqd_pool = ServerPool(NSQD_WITH_HTTP, base)
        self.admin_pool = ServerPool(NSQADMIN, base)
        self.lookupd: ServerProcess | None = None
        self.nsqds: list[ServerProcess] = []
        self.http = requests.Session()

    def start(self, nsqd_count: int = 2) -> Cluster:
        self.lookupd = self.lookupd_pool.start()
        self.nsqds = [
            self.nsqd_pool.start(
                wait=False,
                lookupd_tcp_address=self.lookupd.address("tcp"),
                broadcast_address="127.0.0.1",
            )
            for _ in range(nsqd_count)
        ]
        for nsqd in self.nsqds:
            nsqd.wait_ready()
        wanted = {self.nsqd_http(i) for i in range(nsqd_count)}
        wait_until(
            lambda: (
                {
                    f"{p['broadcast_address']}:{p['http_port']}"
                    for p in self.lookupd_get("/nodes")["producers"]
                }
                >= wanted
            ),
            what="every nsqd registered with nsqlookupd",
        )
        return self

    def start_admins(self, *configs: dict[str, Any]) -> list[ServerProcess]:
        """Start several nsqadmin at once (each config: flag → value; ``args`` extra)."""
        admins = []
        for config in configs:
            options = dict(config)
            args = options.pop("args", ())
            if "nsqd_http_address" not in options:
                options.setdefault("lookupd_http_address", self.lookupd_http)
            admins.append(self.admin_pool.start(*args, wait=False, **options))
        for admin in admins:
            admin.wait_ready()
        return admins

    def stop(self) -> None:
        for pool in (self.admin_pool, self.nsqd_pool, self.lookupd_pool):
            for server in pool:
                server.send_signal(signal.SIGCONT)
            pool.stop_all()
        self.http.close()

    # -- addresses and upstream calls ----------------------------------------------------

    @property
    def lookupd_http(self) -> str:
        assert self.lookupd is not None and self.lookupd.http_address
        return self.lookupd.http_address

    def nsqd_http(self, i: int) -> str:
        address = self.nsqds[i].http_address
        assert address
        return address

    def nsqd_tcp(self, i: int) -> str:
        return self.nsqds[i].tcp_address

    def lookupd_get(self, path: str) -> Any:
        r = self.http.get(f"http://{self.lookupd_http}{path}", timeout=5)
        return r.json() if r.status_code == 200 else None

    def lookupd_post(self, path: str) -> None:
        r = self.http.post(f"http://{self.lookupd_http}{path}", timeout=5)
        assert r.status_code == 200, r.text

    def nsqd_post(self, i: int, path: str, body: bytes = b"") -> None:
        r = self.http.post(f"http://{self.nsqd_http(i)}{path}", data=body, timeout=5)
        assert r.status_code == 200, (path, r.status_code, r.text)

    def publish(self, i: int, topic: str, count: int, body: bytes = b"hello") -> None:
        """``count`` messages to ``topic`` on nsqd ``i`` with one /mpub."""
        self.nsqd_post(i, f"/mpub?topic={topic}", b"\n".join([body] * count))

    def nsqd_topic(self, i: int, topic: str) -> dict[str, Any] | None:
        r = self.http.get(f"http://{self.nsqd_http(i)}/stats?format=json&topic={topic}", timeout=5)
        topics = r.json()["topics"] or []
        return next((t for t in topics if t["topic_name"] == topic), None)

    def producers(self, topic: str) -> set[str]:
        doc = self.lookupd_get(f"/lookup?topic={topic}")
        if not doc:
            return set()
        return {f"{p['broadcast_address']}:{p['http_port']}" for p in doc["producers"]}

    def wait_registered(self, topic: str, nodes: set[int], channel: str = "") -> None:
        """Wait until nsqlookupd lists exactly these nsqd (and the channel) for ``topic``."""
        wanted = {self.nsqd_http(i) for i in nodes}

        def done() -> bool:
            if self.producers(topic) != wanted:
                return False
            return not channel or channel in (
                self.lookupd_get(f"/channels?topic={topic}") or {}
            ).get("channels", [])

        wait_until(done, what=f"{topic} registered by {sorted(wanted)}")


class Hook:
    """A notification endpoint: collects every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.cond = threading.Condition()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with hook.cond:
                    hook.bodies.append(body)
                    hook.headers.append(dict(self.headers))
                    hook.cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(
        self, topic: str, actions: list[str], timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """The notifications about ``topic``, once their actions are exactly ``actions``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                mine = [b for b in self.bodies if b.get("topic") == topic]
                if [b["action"] for b in mine] == actions:
                    return mine
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"notifications for {topic}: {mine}")
                self.cond.wait(remaining)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("nsqadmin-e2e"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def admins(cluster: Cluster, hook: Hook) -> dict[str, ServerProcess]:
    main, acl, direct = cluster.start_admins(
        {
            "notification_http_endpoint": hook.url,
            "sample_interval": "200ms",
            "history_duration": "1m",
            "http_client_request_timeout": "1s",
        },
        {"admin_user": ["alice"], "base_path": "/ui", "sample_interval": "0"},
        {
            "nsqd_http_address": [cluster.nsqd_http(0), cluster.nsqd_http(1), "127.0.0.1:1"],
            "http_client_request_timeout": "1s",
            "sample_interval": "0",
        },
    )
    return {"main": main, "acl": acl, "direct": direct}


_names = itertools.count()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-zA-Z0-9_]", "_", request.node.name.removeprefix("test_"))[:40]
    return f"{base}_{next(_names)}"


class Admin:
    """HTTP calls to one nsqadmin."""

    def __init__(self, process: ServerProcess, prefix: str = "") -> None:
        self.process = process
        self.base = f"http://{process.http_address}{prefix}"
        self.http = requests.Session()

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.http.get(self.base + path, timeout=10, **kw)

    def post(self, path: str, doc: Any = None, **kw: Any) -> requests.Response:
        return self.http.post(self.base + path, json=doc, timeout=10, **kw)

    def delete(self, path: str, doc: Any = None, **kw: Any) -> requests.Response:
        return self.http.delete(self.base + path, json=doc, timeout=10, **kw)

    def json(self, path: str) -> Any:
        r = self.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        assert r.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
        return r.json()


@pytest.fixture(scope="module")
def api(admins: dict[str, ServerProcess]) -> Admin:
    return Admin(admins["main"])


def ok(response: requests.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    assert doc == {"message": ""}, doc
    return doc


# ------------------------------------------------------------------------------ process


def test_process_interface(admins: dict[str, ServerProcess], api: Admin) -> None:
    result = run_once(NSQADMIN, ["--version"])
    assert (result.returncode, result.stdout) == (0, "nsqadmin v1.3.0 (built w/nsqpy-0.1.0)\n")
    main = admins["main"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", main.address("http"))
    main.wait_for_log(r"INFO: HTTP: listening on 127\.0\.0\.1:\d+")
    r = api.get("/ping")
    assert (r.status_code, r.text) == (200, "OK")
    bad = run_once(NSQADMIN, ["--http-address=127.0.0.1:0"])
    assert bad.returncode == 1
    assert "--nsqd-http-address or --lookupd-http-address required" in bad.stderr


def test_pages_assets_and_errors(api: Admin) -> None:
    for page in (
        "/",
        "/topics",
        "/topics/a",
        "/topics/a/b",
        "/nodes",
        "/nodes/x:1",
        "/counter",
        "/lookup",
    ):
        r = api.get(page)
        assert r.status_code == 200, page
        assert r.headers["Content-Type"].startswith("text/html")
        assert 'src="static/js/main.js' in r.text
    for asset in ("/static/js/main.js", "/static/css/app.css", "/static/js/views/topic.js"):
        assert api.get(asset).status_code == 200, asset
    r = api.get("/api/nope")
    assert (r.status_code, r.json()) == (404, {"message": "NOT_FOUND"})
    r = api.http.patch(api.base + "/api/topics", timeout=5)
    assert (r.status_code, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})


# ------------------------------------------------------------------------------ queries


def test_topic_channel_and_clients(cluster: Cluster, api: Admin, topic: str) -> None:
    for i in (0, 1):
        cluster.nsqd_post(i, f"/topic/create?topic={topic}")
        cluster.nsqd_post(i, f"/channel/create?topic={topic}&channel=work")
    cluster.publish(0, topic, 3)
    cluster.publish(1, topic, 2)
    cluster.wait_registered(topic, {0, 1}, "work")
    client = consumer(
        cluster.nsqd_tcp(0),
        topic,
        "work",
        rdy=1,
        user_agent="e2e-consumer/1.0",
        hostname="worker-7",
    )
    try:
        client.read_message()
        assert topic in api.json("/api/topics")["topics"]

        def topic_doc() -> dict[str, Any] | None:
            doc: dict[str, Any] = api.json(f"/api/topics/{topic}")
            (work,) = doc["channels"]
            return doc if work["in_flight_count"] == 1 else None

        doc = wait_until(topic_doc, what="the message in flight")
        assert doc["message"] == ""
        assert doc["node"] == "*" and doc["message_count"] == 5
        assert sorted(n["node"] for n in doc["nodes"]) == sorted(
            cluster.nsqd_http(i) for i in (0, 1)
        )
        (work,) = doc["channels"]
        assert (work["channel_name"], work["depth"], work["message_count"]) == ("work", 4, 5)
        assert work["client_count"] == 1 and len(work["nodes"]) == 2

        channel = api.json(f"/api/topics/{topic}/work")
        assert (channel["topic_name"], channel["channel_name"]) == (topic, "work")
        assert (channel["depth"], channel["in_flight_count"]) == (4, 1)
        (row,) = channel["clients"]
        assert row["node"] == cluster.nsqd_http(0)
        assert (row["user_agent"], row["hostname"]) == ("e2e-consumer/1.0", "worker-7")
        assert (row["ready_count"], row["in_flight_count"], row["message_count"]) == (1, 1, 1)
        assert row["connected"] >= 0
        assert sorted(n["node"] for n in channel["nodes"]) == sorted(
            cluster.nsqd_http(i) for i in (0, 1)
        )

        node = cluster.nsqd_http(0)
        counter = api.json("/api/counter")["stats"]
        assert counter[f"{topic}:work:{node}"]["message_count"] == 3
        assert counter[f"{topic}:work:{cluster.nsqd_http(1)}"]["message_count"] == 2

        node_doc = api.json(f"/api/nodes/{node}")
        (mine,) = [t for t in node_doc["topics"] if t["topic_name"] == topic]
        assert mine["message_count"] == 3
        assert mine["channels"][0]["clients"][0]["user_agent"] == "e2e-consumer/1.0"
        assert node_doc["total_clients"] >= 1 and node_doc["memory"]["heap_objects"] > 0
    finally:
        client.close()


def test_nodes(cluster: Cluster, api: Admin) -> None:
    nodes = api.json("/api/nodes")["nodes"]
    by_addr = {f"{n['broadcast_address']}:{n['http_port']}": n for n in nodes}
    assert set(by_addr) == {cluster.nsqd_http(0), cluster.nsqd_http(1)}
    for i in (0, 1):
        n = by_addr[cluster.nsqd_http(i)]
        assert f"127.0.0.1:{n['tcp_port']}" == cluster.nsqd_tcp(i)
        assert n["version"] == "1.3.0" and n["out_of_date"] is False
        assert n["remote_addresses"] == [f"{cluster.lookupd_http}/{n['remote_address']}"]
    r = api.get("/api/nodes/127.0.0.1:1")
    assert (r.status_code, r.json()) == (404, {"message": "NODE_NOT_FOUND"})


def test_inactive_topics(cluster: Cluster, api: Admin, topic: str) -> None:
    cluster.lookupd_post(f"/topic/create?topic={topic}")
    cluster.lookupd_post(f"/channel/create?topic={topic}&channel=idle")
    inactive = api.json("/api/topics?inactive=true")["topics"]
    assert inactive[topic] == ["idle"]
    assert topic in api.json("/api/topics")["topics"]


def test_history_of_real_traffic(cluster: Cluster, api: Admin, topic: str) -> None:
    cluster.publish(0, topic, 4)
    cluster.wait_registered(topic, {0})

    def sampled() -> dict[str, Any] | None:
        doc: dict[str, Any] = api.json(f"/api/history?topic={topic}")
        return doc if [d for d in doc["series"]["depth"] if d is not None][-2:] == [4, 4] else None

    wait_until(sampled, what="two samples of the topic")
    cluster.publish(0, topic, 50)

    def moving() -> bool:
        overview = api.json("/api/history")["topics"].get(topic)
        rates = [r for r in overview["series"]["rate"] if r]
        return bool(rates) and overview["depth"] == 54

    wait_until(moving, what="a message rate")
    node = api.json(f"/api/history?node={cluster.nsqd_http(0)}")
    assert node["interval"] == 0.2 and any(v for v in node["series"]["depth"] if v)


# ------------------------------------------------------------------------------ actions


def test_create_topic_then_channel(cluster: Cluster, api: Admin, hook: Hook, topic: str) -> None:
    ok(api.post("/api/topics", {"topic": topic}))
    assert topic in cluster.lookupd_get("/topics")["topics"]
    assert cluster.producers(topic) == set()  # known to nsqlookupd, produced nowhere yet
    cluster.publish(0, topic, 1)
    cluster.wait_registered(topic, {0})
    ok(api.post("/api/topics", {"topic": topic, "channel": "made"}))
    nsqd_topic = cluster.nsqd_topic(0, topic)
    assert nsqd_topic is not None
    assert [c["channel_name"] for c in nsqd_topic["channels"]] == ["made"]
    assert "made" in cluster.lookupd_get(f"/channels?topic={topic}")["channels"]
    notes = hook.wait_for(topic, ["create_topic", "create_topic", "create_channel"])
    assert notes[2]["channel"] == "made"
    r = api.post("/api/topics", {"topic": "no good"})
    assert (r.status_code, r.json()) == (400, {"message": "INVALID_TOPIC"})


def test_pause_unpause_and_empty(cluster: Cluster, api: Admin, hook: Hook, topic: str) -> None:
    for i in (0, 1):
        cluster.nsqd_post(i, f"/topic/create?topic={topic}")
        cluster.nsqd_post(i, f"/channel/create?topic={topic}&channel=ch")
        cluster.publish(i, topic, 3)
    cluster.wait_registered(topic, {0, 1}, "ch")

    def paused(i: int) -> tuple[bool, bool]:
        t = cluster.nsqd_topic(i, topic)
        assert t is not None
        return t["paused"], t["channels"][0]["paused"]

    ok(api.post(f"/api/topics/{topic}", {"action": "pause"}))
    assert paused(0) == paused(1) == (True, False)
    assert api.json(f"/api/topics/{topic}")["paused"] is True
    ok(api.post(f"/api/topics/{topic}", {"action": "unpause"}))
    assert paused(0) == paused(1) == (False, False)
    ok(api.post(f"/api/topics/{topic}/ch", {"action": "pause"}))
    assert paused(0) == paused(1) == (False, True)
    assert api.json(f"/api/topics/{topic}/ch")["paused"] is True
    ok(api.post(f"/api/topics/{topic}/ch", {"action": "unpause"}))
    assert paused(0) == paused(1) == (False, False)

    assert api.json(f"/api/topics/{topic}/ch")["depth"] == 6
    ok(api.post(f"/api/topics/{topic}/ch", {"action": "empty"}))
    assert api.json(f"/api/topics/{topic}/ch")["depth"] == 0
    ok(api.post(f"/api/topics/{topic}/ch", {"action": "pause"}))  # messages now stay on the topic
    ok(api.post(f"/api/topics/{topic}", {"action": "pause"}))
    cluster.publish(1, topic, 2)
    assert api.json(f"/api/topics/{topic}")["depth"] == 2
    ok(api.post(f"/api/topics/{topic}", {"action": "empty"}))
    assert api.json(f"/api/topics/{topic}")["depth"] == 0
    r = api.post(f"/api/topics/{topic}", {"action": "nap"})
    assert (r.status_code, r.json()) == (400, {"message": "INVALID_ACTION"})
    hook.wait_for(
        topic,
        [
            "pause_topic",
            "unpause_topic",
            "pause_channel",
            "unpause_channel",
            "empty_channel",
            "pause_channel",
            "pause_topic",
            "empty_topic",
        ],
    )


def test_delete_channel_and_topic(cluster: Cluster, api: Admin, hook: Hook, topic: str) -> None:
    for i in (0, 1):
        cluster.nsqd_post(i, f"/topic/create?topic={topic}")
        cluster.nsqd_post(i, f"/channel/create?topic={topic}&channel=gone")
        cluster.nsqd_post(i, f"/channel/create?topic={topic}&channel=kept")
    cluster.wait_registered(topic, {0, 1}, "kept")
    ok(api.delete(f"/api/topics/{topic}/gone"))
    for i in (0, 1):
        t = cluster.nsqd_topic(i, topic)
        assert t is not None and [c["channel_name"] for c in t["channels"]] == ["kept"]
    # the lookupd key itself is removed (§11), not only the nsqd's registration
    assert cluster.lookupd_get(f"/channels?topic={topic}")["channels"] == ["kept"]
    ok(api.delete(f"/api/topics/{topic}"))
    assert cluster.nsqd_topic(0, topic) is None and cluster.nsqd_topic(1, topic) is None
    assert topic not in cluster.lookupd_get("/topics")["topics"]
    assert cluster.lookupd_get(f"/lookup?topic={topic}") is None  # 404
    notes = hook.wait_for(topic, ["delete_channel", "delete_topic"])
    assert notes[0]["channel"] == "gone"


def test_tombstone_topic_producer(cluster: Cluster, api: Admin, hook: Hook, topic: str) -> None:
    for i in (0, 1):
        cluster.publish(i, topic, 1)
    cluster.wait_registered(topic, {0, 1})
    node = cluster.nsqd_http(1)
    ok(api.delete(f"/api/nodes/{node}", {"topic": topic}))
    assert cluster.producers(topic) == {cluster.nsqd_http(0)}
    assert cluster.nsqd_topic(1, topic) is None and cluster.nsqd_topic(0, topic) is not None
    (note,) = hook.wait_for(topic, ["tombstone_topic_producer"])
    assert note["node"] == node
    assert set(note) == {
        "action",
        "topic",
        "node",
        "timestamp",
        "remote_ip",
        "user_agent",
        "url",
        "via",
    }
    assert note["url"] == f"{api.base}/api/nodes/{node}"
    assert note["user_agent"].startswith("python-requests/")
    assert abs(note["timestamp"] - time.time()) < 60
    r = api.delete(f"/api/nodes/{node}", {"topic": "#bad"})
    assert (r.status_code, r.json()) == (400, {"message": "INVALID_TOPIC"})


# ------------------------------------------------------------------------------ ACL, config, base path


def test_admin_user_and_base_path(
    cluster: Cluster, admins: dict[str, ServerProcess], topic: str
) -> None:
    acl = Admin(admins["acl"], "/ui")
    assert acl.get("/ping").text == "OK"
    assert (
        acl.http.get(f"http://{admins['acl'].http_address}/api/topics", timeout=5).status_code
        == 404
    )
    assert '<base href="/ui/">' in acl.get("/topics").text
    r = acl.post("/api/topics", {"topic": topic})
    assert (r.status_code, r.json()) == (403, {"message": "FORBIDDEN"})
    r = acl.post("/api/topics", {"topic": topic}, headers={"X-Forwarded-User": "mallory"})
    assert r.status_code == 403
    assert topic not in cluster.lookupd_get("/topics")["topics"]
    ok(acl.post("/api/topics", {"topic": topic}, headers={"X-Forwarded-User": "alice"}))
    assert topic in cluster.lookupd_get("/topics")["topics"]
    assert '"isAdmin": false' in acl.get("/").text
    assert '"isAdmin": true' in acl.get("/", headers={"X-Forwarded-User": "alice"}).text
    assert topic in acl.json("/api/topics")["topics"]  # reading needs no admin


def test_config_and_502(cluster: Cluster, admins: dict[str, ServerProcess]) -> None:
    acl = Admin(admins["acl"], "/ui")
    assert acl.json("/config/nsqlookupd_http_addresses") == [cluster.lookupd_http]
    assert acl.json("/config/admin_users") == ["alice"]
    assert acl.http.put(acl.base + "/config/log_level", data="debug", timeout=5).json() == 1
    r = acl.http.put(
        acl.base + "/config/nsqlookupd_http_addresses", data=json.dumps(["127.0.0.1:1"]), timeout=5
    )
    assert r.json() == ["127.0.0.1:1"]
    try:
        for path in ("/api/topics", "/api/nodes", "/api/counter"):
            r = acl.get(path)
            assert r.status_code == 502, path
            message = r.json()["message"]
            assert message.startswith("UPSTREAM_ERROR: Failed to query any nsqlookupd: ")
            assert "connection refused" in message
    finally:
        acl.http.put(
            acl.base + "/config/nsqlookupd_http_addresses",
            data=json.dumps([cluster.lookupd_http]),
            timeout=5,
        )
    assert acl.get("/api/topics").status_code == 200


# ------------------------------------------------------------------------------ partial failure


def test_one_nsqd_down_is_a_warning(
    cluster: Cluster, admins: dict[str, ServerProcess], api: Admin, topic: str
) -> None:
    for i in (0, 1):
        cluster.publish(i, topic, 2)
    cluster.wait_registered(topic, {0, 1})
    direct = Admin(admins["direct"])

    # nsqd-mode nsqadmin: one of its three nsqd never existed
    doc = direct.json("/api/topics")
    assert topic in doc["topics"]
    assert doc["message"].startswith("WARNING: ")
    assert '"http://127.0.0.1:1/stats?format=json' in doc["message"]
    assert doc["message"].count("connection refused") == 1
    assert direct.json(f"/api/topics/{topic}")["depth"] == 4

    # one nsqd hangs while nsqlookupd still lists it: nsqadmin times out on it (1s)
    stop_tree(cluster.nsqds[1].pid, signal.SIGSTOP)  # (with --workers, every worker)
    try:
        doc = api.json(f"/api/topics/{topic}")
        assert doc["message"].startswith("WARNING: ")
        assert cluster.nsqd_http(1) in doc["message"]
        assert "Client.Timeout exceeded" in doc["message"]
        assert doc["depth"] == 2 and [n["node"] for n in doc["nodes"]] == [cluster.nsqd_http(0)]
        nodes_doc = direct.json("/api/nodes")
        assert [f"127.0.0.1:{n['http_port']}" for n in nodes_doc["nodes"]] == [cluster.nsqd_http(0)]
        assert nodes_doc["message"].count("WARNING") == 1
    finally:
        stop_tree(cluster.nsqds[1].pid, signal.SIGCONT)
    assert api.json(f"/api/topics/{topic}")["message"] == ""


def stop_tree(pid: int, sig: int) -> None:
    """``sig`` to ``pid`` and its children (nsqd --workers: the supervisor's workers)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    for target in (*children, pid):
        os.kill(target, sig)


def test_gzip(api: Admin) -> None:
    r = api.get("/static/css/app.css", headers={"Accept-Encoding": "gzip"})
    assert r.headers.get("Content-Encoding") == "gzip"
    r = api.get("/api/nodes", headers={"Accept-Encoding": "gzip"})
    assert r.headers.get("Content-Encoding") == "gzip" and r.json()["nodes"]
