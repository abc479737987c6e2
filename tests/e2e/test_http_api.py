"""nsqd's HTTP API against a real nsqd process (spec §3, §11 "HTTP")."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQDServer
from tests.support.procs import NSQD as NSQD_SPEC
from tests.support.procs import ServerPool, ServerProcess, server_python
from tests.support.rawclient import RawClient, consumer, mpub_body

V1 = "nsq; version=1.0"
JSON = "application/json; charset=utf-8"
TEXT = "text/plain; charset=utf-8"

TOPIC_KEYS = [
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
    "e2e_processing_latency",
]
MEM_KEYS = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
]


def http_address(server: ServerProcess) -> str:
    """The HTTP listener's address (it logs after the TCP one the fixture waits for)."""
    return server.wait_for_log(r"HTTP: listening on (\S+)").group(1)


class HTTP:
    """requests against one nsqd's HTTP listener."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.base = f"http://{http_address(server)}"
        self.session = requests.Session()

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.session.get(self.base + path, timeout=10, allow_redirects=False, **kw)

    def post(self, path: str, data: Any = None, **kw: Any) -> requests.Response:
        return self.session.post(
            self.base + path, data=data, timeout=10, allow_redirects=False, **kw
        )

    def put(self, path: str, data: Any = None) -> requests.Response:
        return self.session.put(self.base + path, data=data, timeout=10)

    def request(self, method: str, path: str) -> requests.Response:
        return self.session.request(method, self.base + path, timeout=10, allow_redirects=False)

    def raw(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send ``target`` exactly as given (requests would re-quote a stray ``%``)."""
        host, port = self.base[len("http://") :].rsplit(":", 1)
        conn = HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request(method, target, body=body)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stats(self, query: str = "") -> dict[str, Any]:
        r = self.get(f"/stats?format=json{query}")
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    def topic(self, name: str) -> dict[str, Any]:
        topics = self.stats(f"&topic={name}")["topics"]
        assert topics is not None and len(topics) == 1
        topic: dict[str, Any] = topics[0]
        return topic


@pytest.fixture
def http(nsqd: ServerProcess) -> Iterator[HTTP]:
    client = HTTP(nsqd)
    yield client
    client.session.close()


@pytest.fixture(scope="module")
def shared_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTP]:
    """One nsqd for the tests that only look at replies (errors, routing): faster."""
    pool = ServerPool(NSQD_SPEC, tmp_path_factory.mktemp("shared"))
    try:
        client = HTTP(pool.start())
        yield client
        client.session.close()
    finally:
        pool.stop_all()


def assert_error(r: requests.Response, status: int, message: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["X-NSQ-Content-Type"] == V1
    assert r.headers["Content-Type"] == JSON
    assert r.content == json.dumps({"message": message}, separators=(",", ":")).encode()


def assert_ok_empty(r: requests.Response) -> None:
    assert r.status_code == 200, r.text
    assert r.headers["X-NSQ-Content-Type"] == V1
    assert r.content == b""
    assert "Content-Type" not in r.headers


def assert_ok_text(r: requests.Response, body: bytes = b"OK") -> None:
    assert r.status_code == 200, r.text
    assert r.headers["X-NSQ-Content-Type"] == V1
    assert r.headers["Content-Type"] == TEXT
    assert r.content == body


# -- /ping and /info ------------------------------------------------------------------------


def test_ping_is_plain_text_without_nsq_header(shared_http: HTTP) -> None:
    r = shared_http.get("/ping")
    assert r.status_code == 200
    assert r.content == b"OK"
    assert r.headers["Content-Type"] == TEXT
    assert "X-NSQ-Content-Type" not in r.headers


def test_info(shared_http: HTTP) -> None:
    before = int(time.time())
    r = shared_http.get("/info")
    assert r.status_code == 200
    assert r.headers["X-NSQ-Content-Type"] == V1
    assert r.headers["Content-Type"] == JSON
    info = r.json()
    assert list(info) == [
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "max_heartbeat_interval",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "max_deflate_level",
        "topology_zone",
        "topology_region",
    ]
    assert info["version"] == "1.3.0"
    assert info["hostname"] == socket.gethostname()
    assert info["broadcast_address"] == socket.gethostname()
    assert info["http_port"] == int(shared_http.base.rsplit(":", 1)[1])
    assert info["tcp_port"] == shared_http.server.tcp_host_port[1]
    assert before - 60 <= info["start_time"] <= before
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_deflate_level"] == 6


# -- publishing -----------------------------------------------------------------------------


def test_pub_then_consume_over_tcp(shared_http: HTTP, topic: str) -> None:
    with consumer(shared_http.server.tcp_address, topic, "ch", rdy=10) as c:
        assert_ok_text(shared_http.post(f"/pub?topic={topic}", b"hello http"))
        msg = c.read_message()
        assert msg.body == b"hello http"
        assert msg.attempts == 1
        assert abs(msg.timestamp - time.time_ns()) < 10 * 10**9
    assert shared_http.topic(topic)["message_count"] == 1
    assert shared_http.topic(topic)["message_bytes"] == len(b"hello http")


def test_pub_creates_the_topic(shared_http: HTTP, topic: str) -> None:
    assert_ok_text(shared_http.post(f"/pub?topic={topic}", b"x"))
    stats = shared_http.topic(topic)
    assert stats["depth"] == 1
    assert stats["channels"] == []


def test_pub_with_defer(shared_http: HTTP, topic: str) -> None:
    with consumer(shared_http.server.tcp_address, topic, "ch", rdy=10) as c:
        sent = time.monotonic()
        assert_ok_text(shared_http.post(f"/pub?topic={topic}&defer=700", b"later"))
        assert_ok_text(shared_http.post(f"/pub?topic={topic}&defer=0", b"now"))
        first = c.read_message()
        assert first.body == b"now"
        assert shared_http.topic(topic)["channels"][0]["deferred_count"] == 1
        second = c.read_message(timeout=5)
        assert second.body == b"later"
        assert second.received_at - sent >= 0.65


@pytest.mark.parametrize("value", ["abc", "-1", "3600001", "1.5", "", " 5", "99999999999999999999"])
def test_pub_invalid_defer(shared_http: HTTP, topic: str, value: str) -> None:
    assert_error(shared_http.post(f"/pub?topic={topic}&defer={value}", b"x"), 400, "INVALID_DEFER")
    # Go has already created the topic when it looks at defer
    assert shared_http.topic(topic)["message_count"] == 0


def test_pub_defer_up_to_max_req_timeout(shared_http: HTTP, topic: str) -> None:
    assert_ok_text(shared_http.post(f"/pub?topic={topic}&defer=3600000", b"x"))


def test_pub_errors(shared_http: HTTP, topic: str) -> None:
    # the empty body is checked before the topic
    assert_error(shared_http.post("/pub", b""), 400, "MSG_EMPTY")
    assert_error(shared_http.post(f"/pub?topic={topic}", b""), 400, "MSG_EMPTY")
    assert_error(shared_http.post("/pub", b"x"), 400, "MISSING_ARG_TOPIC")
    assert_error(shared_http.post("/pub?topic=bad*name", b"x"), 400, "INVALID_TOPIC")
    assert_error(shared_http.post("/pub?topic=" + "a" * 65, b"x"), 400, "INVALID_TOPIC")
    assert_error(shared_http.post("/pub?topic=", b"x"), 400, "INVALID_TOPIC")
    invalid = (400, b'{"message":"INVALID_REQUEST"}')
    assert shared_http.raw("POST", "/pub?topic=a%zz", b"x") == invalid
    assert shared_http.raw("POST", f"/pub?topic={topic}&x=%", b"x") == invalid
    assert shared_http.raw("POST", f"/pub?topic={topic};x=1", b"x") == invalid
    # the body is not parsed as a form
    assert_error(
        shared_http.post(
            "/pub",
            b"topic=x",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        ),
        400,
        "MISSING_ARG_TOPIC",
    )


def test_pub_query_is_unescaped(shared_http: HTTP) -> None:
    assert_ok_text(shared_http.post("/pub?topic=esc%2Daped", b"x"))
    assert shared_http.topic("esc-aped")["message_count"] == 1


def test_pub_too_big(nsqd_factory: Callable[..., ServerProcess]) -> None:
    http = HTTP(nsqd_factory(max_msg_size=100))
    assert_ok_text(http.post("/pub?topic=t", b"x" * 100))
    assert_error(http.post("/pub?topic=t", b"x" * 101), 413, "MSG_TOO_BIG")
    # without a Content-Length (chunked): Go reads max+1 bytes and refuses
    assert_error(http.post("/pub?topic=t", iter([b"x" * 60, b"x" * 60])), 413, "MSG_TOO_BIG")
    assert_ok_text(http.post("/pub?topic=t", iter([b"x" * 60, b"x" * 40])))
    assert http.topic("t")["message_count"] == 2


def test_mpub_text(shared_http: HTTP, topic: str) -> None:
    with consumer(shared_http.server.tcp_address, topic, "ch", rdy=10) as c:
        # empty lines are skipped, one trailing newline per line is stripped
        assert_ok_text(shared_http.post(f"/mpub?topic={topic}", b"one\ntwo\n\nthree\r\n"))
        assert [m.body for m in c.read_messages(3)] == [b"one", b"two", b"three\r"]
    assert shared_http.topic(topic)["message_count"] == 3


def test_mpub_all_empty_lines_publish_nothing(shared_http: HTTP, topic: str) -> None:
    assert_ok_text(shared_http.post(f"/mpub?topic={topic}", b"\n\n\n"))
    assert_ok_text(shared_http.post(f"/mpub?topic={topic}", b""))
    assert shared_http.topic(topic)["message_count"] == 0


def test_mpub_binary(shared_http: HTTP, topic: str) -> None:
    bodies = [b"a", b"with\nnewline", b"\x00\x01binary"]
    with consumer(shared_http.server.tcp_address, topic, "ch", rdy=10) as c:
        assert_ok_text(shared_http.post(f"/mpub?topic={topic}&binary=true", mpub_body(bodies)))
        assert [m.body for m in c.read_messages(3)] == bodies
        # an unknown value also means binary (deprecated)
        assert_ok_text(shared_http.post(f"/mpub?topic={topic}&binary=yes", mpub_body([b"z"])))
        assert c.read_message().body == b"z"
        # binary=false is text mode
        assert_ok_text(shared_http.post(f"/mpub?topic={topic}&binary=0", b"p\nq"))
        assert [m.body for m in c.read_messages(2)] == [b"p", b"q"]


def test_mpub_errors(nsqd_factory: Callable[..., ServerProcess]) -> None:
    http = HTTP(nsqd_factory(max_msg_size=10, max_body_size=1000))
    assert_error(http.post("/mpub", b"x"), 400, "MISSING_ARG_TOPIC")
    assert_error(http.post("/mpub?topic=b@d", b"x"), 400, "INVALID_TOPIC")
    # Content-Length is checked before the topic
    assert_error(http.post("/mpub?topic=b@d", b"x" * 1001), 413, "BODY_TOO_BIG")
    assert_error(
        http.post("/mpub?topic=t", iter([b"x\n" * 300, b"x\n" * 300])), 413, "BODY_TOO_BIG"
    )
    assert_error(http.post("/mpub?topic=t", b"short\n" + b"y" * 11), 413, "MSG_TOO_BIG")
    binary = "/mpub?topic=t&binary=1"
    assert_error(http.post(binary, b""), 413, "BAD_BODY")
    assert_error(http.post(binary, b"\x00\x00"), 413, "BAD_BODY")
    assert_error(http.post(binary, struct.pack(">i", 0)), 413, "BAD_BODY")
    assert_error(http.post(binary, struct.pack(">i", 200)), 413, "BAD_BODY")  # > (1000-4)/5
    assert_error(http.post(binary, struct.pack(">i", 1)), 413, "BAD_MESSAGE")
    assert_error(http.post(binary, struct.pack(">ii", 1, 0)), 413, "BAD_MESSAGE")
    assert_error(http.post(binary, struct.pack(">ii", 1, 11) + b"x" * 11), 413, "BAD_MESSAGE")
    assert_error(http.post(binary, struct.pack(">ii", 2, 1) + b"x"), 413, "BAD_MESSAGE")
    assert_error(http.post(binary, struct.pack(">ii", 1, 5) + b"xx"), 413, "BAD_MESSAGE")
    # nothing was published by any of them
    assert http.topic("t")["message_count"] == 0
    # trailing bytes after the declared messages are ignored, as Go does
    assert_ok_text(http.post(binary, mpub_body([b"ok"]) + b"junk"))
    assert http.topic("t")["message_count"] == 1


def test_tcp_producer_shows_in_stats(nsqd: ServerProcess, http: HTTP, topic: str) -> None:
    with RawClient(nsqd.tcp_address) as producer:
        producer.identify_ok(client_id="prod", hostname="prodhost", user_agent="raw/1")
        producer.pub(topic, b"1")
        producer.mpub(topic, [b"2", b"3"])
        stats = http.stats()
        producers = stats["producers"]
        assert producers is not None and len(producers) == 1
        p = producers[0]
        assert p["client_id"] == "prod"
        assert p["hostname"] == "prodhost"
        assert p["user_agent"] == "raw/1"
        assert p["version"] == "V2"
        assert p["state"] == 0
        assert p["pub_counts"] == [{"topic": topic, "count": 3}]
        assert p["tls"] is False and p["snappy"] is False and p["deflate"] is False
        assert p["remote_address"].startswith("127.0.0.1:")
        text = http.get("/stats").text
        assert f"msgs: 3        topics: {topic}=3 connected: " in text
        # with include_clients=false, no producers
        assert http.stats("&include_clients=false")["producers"] is None
    # HTTP publishers are not producers
    assert http.post(f"/pub?topic={topic}", b"x").status_code == 200


# -- /stats ---------------------------------------------------------------------------------


def test_stats_json_shape(nsqd: ServerProcess, http: HTTP, topic: str) -> None:
    empty = http.stats()
    assert list(empty) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert empty["version"] == "1.3.0"
    assert empty["health"] == "OK"
    assert empty["topics"] == []
    assert empty["producers"] is None
    assert list(empty["memory"]) == MEM_KEYS
    with consumer(
        nsqd.tcp_address, topic, "ch", rdy=1, client_id="cons", hostname="h", user_agent="ua/2"
    ) as c:
        http.post(f"/mpub?topic={topic}", b"a\nb\nc")
        c.read_message()
        stats = http.stats()
        (t,) = stats["topics"]
        assert list(t) == TOPIC_KEYS
        assert t["topic_name"] == topic
        assert t["message_count"] == 3
        assert t["e2e_processing_latency"] == {"count": 0, "percentiles": None}
        (ch,) = t["channels"]
        assert list(ch)[:6] == CHANNEL_KEYS[:6]
        assert [k for k in ch if k != "global_msg_count"] == CHANNEL_KEYS
        assert ch["depth"] == 2
        assert ch["in_flight_count"] == 1
        assert ch["message_count"] == 3
        assert ch["client_count"] == 1
        assert ch["paused"] is False
        (cl,) = ch["clients"]
        assert cl["client_id"] == "cons"
        assert cl["hostname"] == "h"
        assert cl["user_agent"] == "ua/2"
        assert cl["state"] == 3
        assert cl["ready_count"] == 1
        assert cl["in_flight_count"] == 1
        assert cl["message_count"] == 1
        assert cl["version"] == "V2"
        assert "pub_counts" not in cl
        assert abs(cl["connect_ts"] - time.time()) < 60
        no_clients = http.stats("&include_clients=0&include_mem=false")
        assert "memory" not in no_clients
        assert no_clients["topics"][0]["channels"][0]["clients"] is None
        assert no_clients["topics"][0]["channels"][0]["client_count"] == 1
        # anything but true/1/false/0 means the default (true)
        assert http.stats("&include_clients=maybe")["topics"][0]["channels"][0]["clients"]


def test_stats_filters(http: HTTP) -> None:
    for name in ("filt_a", "filt_b"):
        assert_ok_empty(http.post(f"/topic/create?topic={name}"))
    assert_ok_empty(http.post("/channel/create?topic=filt_b&channel=only_b"))
    assert [t["topic_name"] for t in http.stats()["topics"]] == ["filt_a", "filt_b"]
    assert [t["topic_name"] for t in http.stats("&topic=filt_b")["topics"]] == ["filt_b"]
    assert http.stats("&topic=missing")["topics"] is None
    assert http.stats("&topic=filt_a&channel=only_b")["topics"] == []
    by_channel = http.stats("&channel=only_b")["topics"]
    assert [t["topic_name"] for t in by_channel] == ["filt_b"]
    assert http.raw("GET", "/stats?format=json&topic=%") == (400, b'{"message":"INVALID_REQUEST"}')


def test_stats_text_format(nsqd: ServerProcess, http: HTTP, topic: str) -> None:
    r = http.get("/stats")
    assert r.status_code == 200
    assert r.headers["X-NSQ-Content-Type"] == V1
    assert r.headers["Content-Type"] == TEXT
    lines = r.text.split("\n")
    assert lines[0] == "nsqd v1.3.0 (built w/nsqpy-0.1.0)"
    assert lines[1].startswith("start_time 20")
    assert lines[2].startswith("uptime ")
    assert lines[3:6] == ["", "Health: OK", ""]
    assert lines[6] == "Memory:"
    assert [line.split("\t")[0].strip() for line in lines[7:16]] == MEM_KEYS
    assert "\nTopics: None\n\nProducers: None\n" in r.text
    with consumer(nsqd.tcp_address, topic, "chan", rdy=5, hostname="hh", user_agent="ua") as c:
        http.post(f"/pub?topic={topic}", b"x")
        c.read_message()
        http.post(f"/channel/pause?topic={topic}&channel=chan")
        text = http.get("/stats?format=text&include_mem=false").text
        port = c.sock.getsockname()[1]
    assert "Memory:" not in text
    name = f"[{topic:<15}]"
    assert f"\nTopics:\n   {name} depth: 0     be-depth: 0     msgs: 1        e2e%: \n" in text
    assert (
        f"   *P [{'chan':<25}] depth: 0     be-depth: 0     inflt: 1    def: 0"
        "    re-q: 0     timeout: 0     msgs: 1        e2e%: \n"
    ) in text
    assert f"        [V2 hh:{port} ua" in text
    assert (
        "] state: 3 inflt: 1    rdy: 5    fin: 0        re-q: 0        msgs: 1        connected: "
        in text
    )


def test_e2e_latency_after_fins(nsqd_factory: Callable[..., ServerProcess], topic: str) -> None:
    server = nsqd_factory(e2e_processing_latency_percentile=["1.0", "0.99,0.5"])
    http = HTTP(server)
    assert_ok_empty(http.post(f"/topic/create?topic={topic}"))
    assert http.topic(topic)["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    assert_ok_empty(http.post(f"/channel/create?topic={topic}&channel=ch"))
    zero = [{"quantile": q, "value": 0} for q in (1, 0.99, 0.5)]
    t = http.topic(topic)
    assert t["channels"][0]["e2e_processing_latency"] == {"count": 0, "percentiles": zero}
    assert t["e2e_processing_latency"] == {"count": 0, "percentiles": zero}
    with consumer(server.tcp_address, topic, "ch", rdy=50) as c:
        http.post(f"/mpub?topic={topic}", b"\n".join(b"m%d" % i for i in range(20)))
        for msg in c.read_messages(20):
            c.fin(msg.id)
        c.nop()
        deadline = time.monotonic() + 5
        while http.topic(topic)["channels"][0]["e2e_processing_latency"]["count"] < 20:
            assert time.monotonic() < deadline, "FINs not counted"
            c.expect_no_frame(0.02)
    t = http.topic(topic)
    for result in (t["e2e_processing_latency"], t["channels"][0]["e2e_processing_latency"]):
        assert result["count"] == 20
        assert [p["quantile"] for p in result["percentiles"]] == [1, 0.99, 0.5]
        values = [p["value"] for p in result["percentiles"]]
        assert all(0 < v < 10 * 10**9 for v in values)
        assert values[0] >= values[2]
    text = http.get("/stats").text
    assert "e2e%: " in text and ("ms, " in text or "us, " in text)


# -- topics and channels --------------------------------------------------------------------


def test_topic_create_delete_empty(shared_http: HTTP, topic: str) -> None:
    assert_ok_empty(shared_http.post(f"/topic/create?topic={topic}"))
    shared_http.post(f"/mpub?topic={topic}", b"1\n2")
    assert shared_http.topic(topic)["depth"] == 2
    assert_ok_empty(shared_http.post(f"/topic/empty?topic={topic}"))
    assert shared_http.topic(topic)["depth"] == 0
    assert_ok_empty(shared_http.post(f"/topic/delete?topic={topic}"))
    assert shared_http.stats(f"&topic={topic}")["topics"] is None
    assert_error(shared_http.post(f"/topic/delete?topic={topic}"), 404, "TOPIC_NOT_FOUND")
    assert_error(shared_http.post(f"/topic/empty?topic={topic}"), 404, "TOPIC_NOT_FOUND")


def test_topic_errors(shared_http: HTTP) -> None:
    for route in ("create", "delete", "empty", "pause", "unpause"):
        assert_error(shared_http.post(f"/topic/{route}"), 400, "MISSING_ARG_TOPIC")
    assert_error(shared_http.post("/topic/create?topic=b@d"), 400, "INVALID_TOPIC")
    assert_error(shared_http.post("/topic/empty?topic=b@d"), 400, "INVALID_TOPIC")
    # delete and pause do not validate the name
    for route in ("delete", "pause", "unpause"):
        assert_error(shared_http.post(f"/topic/{route}?topic=b@d"), 404, "TOPIC_NOT_FOUND")
        assert_error(shared_http.post(f"/topic/{route}?topic=missing"), 404, "TOPIC_NOT_FOUND")


def test_topic_pause_and_unpause(shared_http: HTTP, topic: str) -> None:
    with consumer(shared_http.server.tcp_address, topic, "ch", rdy=10) as c:
        assert_ok_empty(shared_http.post(f"/topic/pause?topic={topic}"))
        assert shared_http.topic(topic)["paused"] is True
        shared_http.post(f"/pub?topic={topic}", b"held")
        c.expect_no_frame(0.3)
        assert shared_http.topic(topic)["depth"] == 1
        assert_ok_empty(shared_http.post(f"/topic/unpause?topic={topic}"))
        assert c.read_message().body == b"held"
        assert shared_http.topic(topic)["paused"] is False


def test_pause_is_persisted(nsqd: ServerProcess, http: HTTP, topic: str) -> None:
    assert_ok_empty(http.post(f"/topic/create?topic={topic}"))
    assert_ok_empty(http.post(f"/channel/create?topic={topic}&channel=ch"))
    assert_ok_empty(http.post(f"/channel/pause?topic={topic}&channel=ch"))
    data_path = Path(nsqd.argv[[a.startswith("--data-path=") for a in nsqd.argv].index(True)][12:])
    deadline = time.monotonic() + 5
    while True:
        with_pause = (
            (data_path / "nsqd.dat").read_text() if (data_path / "nsqd.dat").exists() else ""
        )
        if '"paused":true' in with_pause:
            break
        assert time.monotonic() < deadline, with_pause
        time.sleep(0.02)
    meta = json.loads(with_pause)
    (t,) = [t for t in meta["topics"] if t["name"] == topic]
    assert t["channels"] == [{"name": "ch", "paused": True}]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_channel_routes(shared_http: HTTP, topic: str) -> None:
    assert_error(
        shared_http.post(f"/channel/create?topic={topic}&channel=ch"), 404, "TOPIC_NOT_FOUND"
    )
    assert_ok_empty(shared_http.post(f"/topic/create?topic={topic}"))
    assert_ok_empty(shared_http.post(f"/channel/create?topic={topic}&channel=ch"))
    shared_http.post(f"/mpub?topic={topic}", b"1\n2\n3")
    assert shared_http.topic(topic)["channels"][0]["depth"] == 3
    assert_ok_empty(shared_http.post(f"/channel/empty?topic={topic}&channel=ch"))
    assert shared_http.topic(topic)["channels"][0]["depth"] == 0
    with consumer(shared_http.server.tcp_address, topic, "ch", rdy=10) as c:
        assert_ok_empty(shared_http.post(f"/channel/pause?topic={topic}&channel=ch"))
        assert shared_http.topic(topic)["channels"][0]["paused"] is True
        shared_http.post(f"/pub?topic={topic}", b"held")
        c.expect_no_frame(0.3)
        assert_ok_empty(shared_http.post(f"/channel/unpause?topic={topic}&channel=ch"))
        assert c.read_message().body == b"held"
        assert_ok_empty(shared_http.post(f"/channel/delete?topic={topic}&channel=ch"))
        c.assert_closed()  # deleting a channel closes its consumers
    assert shared_http.topic(topic)["channels"] == []
    for route in ("delete", "empty", "pause", "unpause"):
        assert_error(
            shared_http.post(f"/channel/{route}?topic={topic}&channel=ch"), 404, "CHANNEL_NOT_FOUND"
        )


@pytest.mark.parametrize("route", ["create", "delete", "empty", "pause", "unpause"])
def test_channel_argument_errors(shared_http: HTTP, route: str) -> None:
    path = f"/channel/{route}"
    assert_error(shared_http.post(path), 400, "MISSING_ARG_TOPIC")
    assert_error(shared_http.post(f"{path}?topic=b@d&channel=c"), 400, "INVALID_ARG_TOPIC")
    assert_error(shared_http.post(f"{path}?topic=t"), 400, "MISSING_ARG_CHANNEL")
    assert_error(shared_http.post(f"{path}?topic=t&channel=b@d"), 400, "INVALID_ARG_CHANNEL")
    assert_error(shared_http.post(f"{path}?topic=nope&channel=c"), 404, "TOPIC_NOT_FOUND")
    assert shared_http.raw("POST", f"{path}?topic=t%&channel=c") == (
        400,
        b'{"message":"INVALID_REQUEST"}',
    )


def test_channel_peek(shared_http: HTTP, topic: str) -> None:
    assert_ok_empty(shared_http.post(f"/topic/create?topic={topic}"))
    assert_ok_empty(shared_http.post(f"/channel/create?topic={topic}&channel=ch"))
    shared_http.post(f"/mpub?topic={topic}", b"first\nsecond\nthird")
    r = shared_http.get(f"/channel/peek?topic={topic}&channel=ch&n=2")
    assert r.status_code == 200
    assert r.headers["X-NSQ-Content-Type"] == V1
    peek = r.json()
    assert peek["depth"] == 3
    assert [m["body"] for m in peek["messages"]] == ["Zmlyc3Q=", "c2Vjb25k"]  # base64
    assert all(len(m["id"]) == 16 and m["attempts"] == 0 for m in peek["messages"])
    assert all(abs(m["timestamp"] - time.time_ns()) < 60 * 10**9 for m in peek["messages"])
    assert len(shared_http.get(f"/channel/peek?topic={topic}&channel=ch").json()["messages"]) == 1
    # nothing was consumed
    with consumer(shared_http.server.tcp_address, topic, "ch", rdy=10) as c:
        msgs = c.read_messages(3)
        assert [m.body for m in msgs] == [b"first", b"second", b"third"]
        assert msgs[0].id.decode() == peek["messages"][0]["id"]
    assert_error(
        shared_http.get(f"/channel/peek?topic={topic}&channel=ch&n=0"), 400, "INVALID_ARG_N"
    )
    assert_error(
        shared_http.get(f"/channel/peek?topic={topic}&channel=nope"), 404, "CHANNEL_NOT_FOUND"
    )


# -- /config --------------------------------------------------------------------------------


def test_config_get(shared_http: HTTP) -> None:
    r = shared_http.get("/config/nsqlookupd_tcp_addresses")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == JSON
    assert r.content == b"[]"
    r = shared_http.get("/config/tcp_address")  # strings are raw text
    assert_ok_text(r, b"127.0.0.1:0")
    assert shared_http.get("/config/max_heartbeat_interval").content == b"60000000000"
    assert shared_http.get("/config/log_level").content == b"2"
    assert shared_http.get("/config/mem_queue_size").content == b"10000"
    assert shared_http.get("/config/snappy").content == b"true"
    assert_error(shared_http.get("/config/nope"), 400, "INVALID_OPTION")
    assert_error(shared_http.get("/config/tcp-address"), 400, "INVALID_OPTION")


def test_config_put(http: HTTP, nsqd: ServerProcess) -> None:
    r = http.put("/config/log_level", b"debug")
    assert r.status_code == 200 and r.content == b"1"
    assert http.get("/config/log_level").content == b"1"
    mark = nsqd.mark()
    http.get("/ping")
    nsqd.wait_for_log(r"200 GET /ping \(127\.0\.0\.1:\d+\) ", since=mark)
    assert http.put("/config/log_level", b"ERROR").content == b"4"
    assert_error(http.put("/config/log_level", b"loud"), 400, "INVALID_VALUE")
    assert_error(http.put("/config/log_level", b""), 413, "INVALID_VALUE")
    assert_error(http.put("/config/nope", b""), 413, "INVALID_VALUE")  # size first
    assert_error(http.put("/config/tcp_address", b"x"), 400, "INVALID_OPTION")
    r = http.put("/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:4160","h:4160"]')
    assert r.status_code == 200
    assert r.json() == ["127.0.0.1:4160", "h:4160"]
    assert http.get("/config/nsqlookupd_tcp_addresses").json() == ["127.0.0.1:4160", "h:4160"]
    assert_error(http.put("/config/nsqlookupd_tcp_addresses", b"[1]"), 400, "INVALID_VALUE")
    assert_error(http.put("/config/nsqlookupd_tcp_addresses", b"{"), 400, "INVALID_VALUE")
    assert http.put("/config/nsqlookupd_tcp_addresses", b"[]").json() == []


def test_config_put_too_big(nsqd_factory: Callable[..., ServerProcess]) -> None:
    http = HTTP(nsqd_factory(max_msg_size=10))
    assert_error(http.put("/config/log_level", b"x" * 11), 413, "INVALID_VALUE")


# -- routing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/put",
        "/mput",
        "/create_topic",
        "/delete_topic",
        "/empty_topic",
        "/pause_topic",
        "/unpause_topic",
        "/create_channel",
        "/delete_channel",
        "/empty_channel",
        "/pause_channel",
        "/unpause_channel",
        "/config/",
        "/config/a/b",
    ],
)
def test_unknown_and_removed_paths(shared_http: HTTP, path: str) -> None:
    assert_error(shared_http.post(path, b"x"), 404, "NOT_FOUND")
    assert_error(shared_http.get(path), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/ping", "GET, OPTIONS"),
        ("GET", "/pub", "OPTIONS, POST"),
        ("PUT", "/stats", "GET, OPTIONS"),
        ("GET", "/topic/create", "OPTIONS, POST"),
        ("DELETE", "/channel/delete", "OPTIONS, POST"),
        ("POST", "/config/log_level", "GET, OPTIONS, PUT"),
        ("HEAD", "/info", "GET, OPTIONS"),
    ],
)
def test_method_not_allowed(shared_http: HTTP, method: str, path: str, allow: str) -> None:
    r = shared_http.request(method, path)
    assert r.status_code == 405
    assert r.headers["Allow"] == allow
    assert r.headers["X-NSQ-Content-Type"] == V1
    if method != "HEAD":
        assert r.content == b'{"message":"METHOD_NOT_ALLOWED"}'


def test_options_is_answered_with_allow(shared_http: HTTP) -> None:
    r = shared_http.request("OPTIONS", "/pub")
    assert r.status_code == 200
    assert r.headers["Allow"] == "OPTIONS, POST"


def test_trailing_slash_redirects(shared_http: HTTP) -> None:
    r = shared_http.get("/ping/")
    assert r.status_code == 301
    assert r.headers["Location"] == "/ping"
    r = shared_http.post("/pub/?topic=t", b"x")
    assert r.status_code == 307  # httprouter v1.3.0, as NSQ pins it (the Go nsqd says so too)
    assert r.headers["Location"] == "/pub?topic=t"
    r = shared_http.get("/debug/pprof")
    assert r.status_code == 301
    assert r.headers["Location"] == "/debug/pprof/"
    # RedirectFixedPath: the cleaned path, matched case-insensitively, with Go's HTML body
    r = shared_http.get("//stats/../PING?x=1")
    assert (r.status_code, r.headers["Location"]) == (301, "/ping?x=1")
    assert r.content == b'<a href="/ping?x=1">Moved Permanently</a>.\n\n'


def test_v2_magic_on_the_http_port_gets_an_http_error(shared_http: HTTP) -> None:
    host, port = shared_http.base[len("http://") :].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        # what go-nsq sends first: the magic, then IDENTIFY
        sock.sendall(b"  V2IDENTIFY\n\x00\x00\x00\x02{}")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.")
    assert b" 400 " in reply.split(b"\r\n", 1)[0]


def test_requests_are_logged_like_go(shared_http: HTTP) -> None:
    mark = shared_http.server.mark()
    shared_http.get("/stats?format=json")
    shared_http.post("/nope")
    shared_http.server.wait_for_log(
        r"INFO: 200 GET /stats\?format=json \(127\.0\.0\.1:\d+\) [0-9.]+(µs|ms|s)$", since=mark
    )
    shared_http.server.wait_for_log(r"INFO: 404 POST /nope \(127\.0\.0\.1:\d+\) ", since=mark)


def test_http_disabled(nsqd_factory: Callable[..., ServerProcess]) -> None:
    server = nsqd_factory(http_address="")
    with RawClient(server.tcp_address) as client:  # fully started: it answers on TCP
        client.pub("t", b"x")
    assert server.http_address is None
    assert not any("HTTP" in line for line in server.log_lines)


def test_http_on_a_unix_socket(nsqd_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    path = tmp_path / "nsqd-http.sock"
    server = nsqd_factory(http_address=str(path))
    assert http_address(server) == str(path)

    def get(target: str) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(path))
            sock.sendall(f"GET {target} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    assert get("/ping").endswith(b"\r\n\r\nOK")
    info = json.loads(get("/info").split(b"\r\n\r\n", 1)[1])
    assert info["http_port"] == -1
    assert info["tcp_port"] == server.tcp_host_port[1]


def test_https_listener_and_tls_required(
    nsqd_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = (tmp_path / n for n in ("cert.pem", "key.pem", "ca.pem"))
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    server = nsqd_factory(
        https_address="127.0.0.1:0",
        tls_cert=str(cert_file),
        tls_key=str(key_file),
        tls_required="true",
    )
    https = server.wait_for_log(r"HTTPS: listening on (\S+)").group(1)
    plain = HTTP(server)
    # every request on the plain listener is refused with the HTTPS port (Go's body, spaces too)
    for r in (plain.get("/ping"), plain.post("/pub?topic=t", b"x"), plain.get("/nope")):
        assert r.status_code == 403
        assert r.headers["X-NSQ-Content-Type"] == V1
        assert r.headers["Content-Type"] == JSON
        port = int(https.rsplit(":", 1)[1])
        assert r.content == b'{"message": "TLS_REQUIRED", "https_port": %d}' % port
    with requests.Session() as session:
        r = session.get(f"https://{https}/ping", verify=str(ca_file), timeout=10)
        assert r.status_code == 200 and r.content == b"OK"
        r = session.post(f"https://{https}/pub?topic=t", b"x", verify=str(ca_file), timeout=10)
        assert r.status_code == 200 and r.content == b"OK"


# -- /debug ---------------------------------------------------------------------------------


def test_debug_pages(nsqd: ServerProcess, http: HTTP) -> None:
    index = http.get("/debug/pprof/")
    assert index.status_code == 200
    assert "/debug/pprof/goroutine" in index.text
    stacks = http.get("/debug/pprof/goroutine").text
    assert "thread MainThread" in stacks
    assert "asyncio tasks:" in stacks
    if server_python() == sys.executable:  # (the compiled wheel's functions have no frames)
        assert "_pprof_goroutine" in stacks  # the handler's own frame is in the dump
    assert "MainThread" in http.get("/debug/pprof/threadcreate").text
    first = http.get("/debug/pprof/heap").text
    assert "tracemalloc started now" in first
    http.post("/mpub?topic=heap_t", b"\n".join(b"m" * 50 for _ in range(100)))
    second = http.get("/debug/pprof/heap?top=5&stop=1").text
    assert "tracemalloc started" not in second
    assert "top 5 of " in second and "tracemalloc stopped" in second
    profile = http.get("/debug/pprof/profile?seconds=1")
    assert profile.status_code == 200
    assert "function calls" in profile.text
    assert http.get("/debug/pprof/cmdline").content.split(b"\x00")[:1] != [b""]
    assert http.request("PUT", "/debug/setblockrate?rate=5").status_code == 200
    bad = http.request("PUT", "/debug/setblockrate?rate=x")
    assert bad.status_code == 400
    assert bad.text == 'invalid block rate : strconv.Atoi: parsing "x": invalid syntax'
    assert "X-NSQ-Content-Type" not in bad.headers
    assert http.post("/debug/freememory").status_code == 200
    assert http.get("/debug/pprof/heap?group=nope").status_code == 400


# -- in-process: what cannot be provoked from outside ------------------------------------------


def run_in_process(tmp_path: Path, test: Callable[[NSQDServer, str], Any]) -> None:
    async def main() -> None:
        opts = Options(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            https_address="",
            data_path=str(tmp_path),
            node_id=1,
        )
        server = NSQDServer(opts)
        await server.start()
        try:
            assert server.http is not None
            await test(server, f"http://{server.http.address}")
        finally:
            await server.stop()

    asyncio.run(main())


def test_unexpected_exception_is_internal_error(tmp_path: Path) -> None:
    async def test(server: NSQDServer, base: str) -> None:
        assert server.http is not None
        route = server.http._routes["/info"]["GET"]

        async def boom(*args: object) -> object:
            raise RuntimeError("boom")

        object.__setattr__(route, "handler", boom)
        async with aiohttp.ClientSession() as session, session.get(base + "/info") as r:
            assert r.status == 500
            assert r.headers["X-NSQ-Content-Type"] == V1
            assert await r.read() == b'{"message":"INTERNAL_ERROR"}'

    run_in_process(tmp_path, test)


def test_unhealthy_ping_and_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NSQD, "health_error", property(lambda self: "disk full"), raising=False)

    async def test(server: NSQDServer, base: str) -> None:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/ping") as r:
                assert r.status == 500
                assert await r.read() == b"NOK - disk full"
                assert "X-NSQ-Content-Type" not in r.headers
            async with session.get(base + "/stats?format=json") as r:
                assert (await r.json())["health"] == "NOK - disk full"
            async with session.get(base + "/stats") as r:
                assert "\nHealth: NOK - disk full\n" in await r.text()

    run_in_process(tmp_path, test)
