"""nsqd's stats: the engine snapshot, /stats text format, Go-style JSON (nsqpy/nsqd/stats.py)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nsqpy.nsqd.channel import InFlight
from nsqpy.nsqd.e2e import E2EResult
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.stats import (
    ClientStats,
    MemStats,
    Stats,
    client_line,
    encode_json,
    format_stats_text,
    get_stats,
    go_json_float,
    mem_stats,
    track_gc_pauses,
)

CLIENT_KEYS = [
    "client_id",
    "hostname",
    "version",
    "remote_address",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "finish_count",
    "requeue_count",
    "connect_ts",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "topology_zone",
    "topology_region",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
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


class FakeClient:
    """A TCP connection as stats see it (and a channel Consumer)."""

    _ids = iter(range(1, 1_000_000))

    def __init__(self, hostname: str = "host1", remote: str = "127.0.0.1:5555") -> None:
        self.id = next(self._ids)
        self.client_id = hostname
        self.hostname = hostname
        self.user_agent = "test/1.0"
        self.remote_address = remote
        self.state = 3
        self.ready_count = 0
        self.in_flight: dict[bytes, InFlight] = {}
        self.irregular_in_flight = False
        self.msg_timeout = 60.0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.connect_ts = int(time.time())
        self.sample_rate = 0
        self.pub_counts: dict[str, int] = {}

    def send_messages(self, frames: list[bytes], count: int, nbytes: int) -> None:
        assert nbytes == sum(map(len, frames))
        pass

    def close_for_exit(self) -> None:
        pass


@pytest.fixture
def engine() -> NSQD:
    return NSQD(Options(node_id=1))


# -- get_stats --------------------------------------------------------------------------------


def test_topics_and_channels_sorted_with_gos_keys_in_order(engine: NSQD) -> None:
    for name in ("zeta", "alpha"):
        topic = engine.get_topic(name)
        topic.get_channel("c2")
        topic.get_channel("c1")
    engine.get_topic("alpha").put_messages([b"abc", b"de"])
    stats = get_stats(engine)
    topics = stats["topics"]
    assert topics is not None
    assert [t["topic_name"] for t in topics] == ["alpha", "zeta"]
    alpha = topics[0]
    assert list(alpha) == TOPIC_KEYS
    assert [c["channel_name"] for c in alpha["channels"]] == ["c1", "c2"]
    assert list(alpha["channels"][0]) == CHANNEL_KEYS
    assert alpha["message_count"] == 2
    assert alpha["message_bytes"] == 5
    assert alpha["channels"][0]["depth"] == 2
    assert alpha["channels"][0]["message_count"] == 2
    assert alpha["channels"][0]["clients"] == []
    assert alpha["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    assert stats["producers"] is None


def test_consumer_and_producer_stats(engine: NSQD) -> None:
    channel = engine.get_topic("t").get_channel("c")
    consumer = FakeClient()
    channel.add_client(consumer)
    consumer.ready_count = 5
    engine.get_topic("t").put_messages([b"one", b"two"])
    producer = FakeClient("prod", "10.0.0.1:4000")
    producer.state = 0
    producer.pub_counts = {"t": 2, "other": 7}
    idle = FakeClient("idle")
    stats = get_stats(engine, [producer, idle, consumer])
    topics = stats["topics"]
    assert topics is not None
    clients = topics[0]["channels"][0]["clients"]
    assert clients is not None and len(clients) == 1
    c = clients[0]
    # no zone/region/global counts (omitempty): Go's nsqd never fills a client's
    assert list(c) == CLIENT_KEYS
    assert c["in_flight_count"] == 2
    assert c["message_count"] == 2
    assert c["ready_count"] == 5
    assert c["version"] == "V2"
    assert topics[0]["channels"][0]["global_msg_count"] == 2
    assert topics[0]["channels"][0]["in_flight_count"] == 2
    producers = stats["producers"]
    assert producers is not None and len(producers) == 1
    p = producers[0]
    assert p["hostname"] == "prod"
    assert p["pub_counts"] == [{"topic": "t", "count": 2}]  # one topic only, as Go
    assert list(p).index("pub_counts") == list(p).index("topology_region") + 1


def test_topic_filter_and_channel_filter(engine: NSQD) -> None:
    engine.get_topic("a").get_channel("x")
    engine.get_topic("b").get_channel("y")
    producer = FakeClient()
    producer.pub_counts = {"a": 1, "b": 3}
    only_b = get_stats(engine, [producer], topic="b")
    assert [t["topic_name"] for t in only_b["topics"] or []] == ["b"]
    assert only_b["producers"] is not None
    assert only_b["producers"][0]["pub_counts"] == [{"topic": "b", "count": 3}]
    # a missing topic: null topics, and Go returns before gathering producers
    assert get_stats(engine, [producer], topic="nope") == {"topics": None, "producers": None}
    # a channel filter keeps only the topics that have the channel
    by_channel = get_stats(engine, channel="y")
    assert [t["topic_name"] for t in by_channel["topics"] or []] == ["b"]
    assert get_stats(engine, topic="a", channel="y")["topics"] == []


def test_without_clients(engine: NSQD) -> None:
    channel = engine.get_topic("t").get_channel("c")
    channel.add_client(FakeClient())
    producer = FakeClient()
    producer.pub_counts = {"t": 1}
    stats = get_stats(engine, [producer], include_clients=False)
    topics = stats["topics"]
    assert topics is not None
    assert topics[0]["channels"][0]["clients"] is None
    assert topics[0]["channels"][0]["client_count"] == 1
    assert stats["producers"] is None


def test_e2e_with_percentiles_configured() -> None:
    engine = NSQD(Options(node_id=1, e2e_processing_latency_percentiles=[0.5, 0.99]))
    bare = engine.get_topic("bare")
    topic = engine.get_topic("t")
    channel = topic.get_channel("c")
    client = FakeClient()
    channel.add_client(client)
    client.ready_count = 10
    topic.put_messages([b"a", b"b", b"c"])
    for msg_id in list(client.in_flight):
        channel.finish(client, msg_id)
    stats = get_stats(engine)
    topics = {t["topic_name"]: t for t in stats["topics"] or []}
    assert bare.name in topics
    assert topics["bare"]["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    for result in (
        topics["t"]["e2e_processing_latency"],
        topics["t"]["channels"][0]["e2e_processing_latency"],
    ):
        assert result["count"] == 3
        percentiles = result["percentiles"]
        assert percentiles is not None
        assert [p["quantile"] for p in percentiles] == [0.99, 0.5]  # sorted high to low
        assert all(p["value"] > 0 for p in percentiles)


# -- the text format --------------------------------------------------------------------------


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def e2e(*values: tuple[float, int]) -> E2EResult:
    return {"count": 3, "percentiles": [{"quantile": q, "value": v} for q, v in values]}


def make_client(**fields: Any) -> ClientStats:
    client: dict[str, Any] = {
        "client_id": "host1",
        "hostname": "host1",
        "version": "V2",
        "remote_address": "127.0.0.1:5555",
        "state": 3,
        "ready_count": 10,
        "in_flight_count": 1,
        "message_count": 11,
        "finish_count": 7,
        "requeue_count": 3,
        "connect_ts": 0,
        "sample_rate": 0,
        "deflate": False,
        "snappy": False,
        "user_agent": "pynsq/0.9.1",
        "topology_zone": "",
        "topology_region": "",
        "tls": False,
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
    }
    client.update(fields)
    return client  # type: ignore[return-value]


MEM: MemStats = {
    "heap_objects": 1,
    "heap_idle_bytes": 2,
    "heap_in_use_bytes": 3,
    "heap_released_bytes": 4,
    "gc_pause_usec_100": 5,
    "gc_pause_usec_99": 6,
    "gc_pause_usec_95": 7,
    "next_gc_bytes": 8,
    "gc_total_runs": 9,
}


def test_text_format_matches_gos_print_stats(utc: None) -> None:
    start = 1_795_290_158.0  # 2026-11-21T19:42:38Z
    now = start + 313.5
    stats: Stats = {
        "topics": [
            {
                "topic_name": "orders",
                "channels": [
                    {
                        "channel_name": "email",
                        "depth": 5,
                        "backend_depth": 0,
                        "in_flight_count": 1,
                        "deferred_count": 2,
                        "message_count": 100,
                        "requeue_count": 3,
                        "timeout_count": 4,
                        "client_count": 1,
                        "clients": [make_client(connect_ts=int(now) - 313)],
                        "paused": True,
                        "e2e_processing_latency": e2e((0.99, 1_500_000), (0.5, 2500)),
                    }
                ],
                "depth": 12,
                "backend_depth": 2,
                "message_count": 100,
                "message_bytes": 1000,
                "paused": False,
                "e2e_processing_latency": e2e((0.99, 1_500_000), (0.5, 2500)),
            },
            {
                "topic_name": "zz",
                "channels": [],
                "depth": 0,
                "backend_depth": 0,
                "message_count": 0,
                "message_bytes": 0,
                "paused": True,
                "e2e_processing_latency": {"count": 0, "percentiles": None},
            },
        ],
        "producers": [
            make_client(
                hostname="p",
                remote_address="[::1]:6000",
                user_agent="",
                state=0,
                connect_ts=int(now) - 10682,
                pub_counts=[{"topic": "orders", "count": 5}],
            )
        ],
    }
    text = format_stats_text(stats, MEM, "OK", start, now)
    assert text == (
        "nsqd v1.3.0 (built w/nsqpy-0.1.0)\n"
        "start_time 2026-11-21T19:42:38Z\n"
        "uptime 5m13.5s\n"
        "\n"
        "Health: OK\n"
        "\n"
        "Memory:\n"
        "   heap_objects             \t1\n"
        "   heap_idle_bytes          \t2\n"
        "   heap_in_use_bytes        \t3\n"
        "   heap_released_bytes      \t4\n"
        "   gc_pause_usec_100        \t5\n"
        "   gc_pause_usec_99         \t6\n"
        "   gc_pause_usec_95         \t7\n"
        "   next_gc_bytes            \t8\n"
        "   gc_total_runs            \t9\n"
        "\n"
        "Topics:\n"
        "   [orders         ] depth: 12    be-depth: 2     msgs: 100      e2e%: 1.5ms, 2.5us\n"
        "   *P [email                    ] depth: 5     be-depth: 0     inflt: 1    def: 2"
        "    re-q: 3     timeout: 4     msgs: 100      e2e%: 1.5ms, 2.5us\n"
        "        [V2 host1:5555 pynsq/0.9.1] state: 3 inflt: 1    rdy: 10   fin: 7"
        "        re-q: 3        msgs: 11       connected: 5m13s\n"
        "\n"
        "*P [zz             ] depth: 0     be-depth: 0     msgs: 0        e2e%: \n"
        "\n"
        "Producers:\n"
        "   [V2 p:6000               ] msgs: 5        topics: orders=5 connected: 2h58m2s\n"
    )


def test_text_format_without_topics_memory_or_producers(utc: None) -> None:
    stats: Stats = {"topics": None, "producers": None}
    text = format_stats_text(stats, None, "NOK - disk full", 0.0, 2.0)
    assert text == (
        "nsqd v1.3.0 (built w/nsqpy-0.1.0)\n"
        "start_time 1970-01-01T00:00:00Z\n"
        "uptime 2s\n"
        "\n"
        "Health: NOK - disk full\n"
        "\n"
        "Topics: None\n"
        "\n"
        "Producers: None\n"
    )


def test_start_time_carries_the_local_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        text = format_stats_text({"topics": [], "producers": []}, None, "OK", 0.0, 0.0)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert "start_time 1970-01-01T05:30:00+05:30\n" in text
    assert "uptime 0s\n" in text


def test_client_line_nanosecond_units() -> None:
    client = make_client(connect_ts=100, remote_address="/tmp/nsqd.sock")
    # a unix socket peer has no port: Go's SplitHostPort fails and leaves it empty
    assert client_line(client, 100.9).startswith("[V2 host1: pynsq/0.9.1")
    assert client_line(client, 100.9).endswith("connected: 0s")


# -- JSON -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.99, "0.99"),
        (0.5, "0.5"),
        (1e-05, "0.00001"),
        (1e-07, "1e-7"),
        (1.5e-10, "1.5e-10"),
        (1e21, "1e+21"),
        (123456789.0, "123456789"),
        (-2.5, "-2.5"),
    ],
)
def test_go_json_float(value: float, text: str) -> None:
    assert go_json_float(value) == text
    assert encode_json([value]) == f"[{text}]".encode()


def test_encode_json_is_compact_and_escapes_like_go() -> None:
    assert encode_json({"a": [1, True, None], "b": "x"}) == b'{"a":[1,true,null],"b":"x"}'
    assert encode_json("<a&b>") == b'"\\u003ca\\u0026b\\u003e"'
    assert encode_json("\u2028") == b'"\\u2028"'
    assert encode_json("é\n") == '"é\\n"'.encode()
    assert encode_json("\udcff") == '"\ufffd"'.encode()  # invalid UTF-8 → U+FFFD


# -- memory -----------------------------------------------------------------------------------


def test_mem_stats_has_gos_keys_and_counts_gc_pauses() -> None:
    track_gc_pauses()
    runs = mem_stats()["gc_total_runs"]
    gc.collect()
    mem = mem_stats()
    assert list(mem) == list(MEM)
    assert all(isinstance(v, int) and v >= 0 for v in mem.values())
    assert mem["gc_total_runs"] > runs
    assert mem["heap_in_use_bytes"] > 0
    assert mem["gc_pause_usec_100"] >= mem["gc_pause_usec_99"] >= mem["gc_pause_usec_95"]
