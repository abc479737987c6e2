"""Reading and adding up the cluster's stats (nsqpy/nsqadmin/stats.py)."""

from __future__ import annotations

from typing import Any

from nsqpy.nsqadmin.stats import (
    ChannelStats,
    ClientStats,
    E2ELatency,
    Producer,
    TopicStats,
    version_key,
)


def _channel(
    name: str, depth: int, backend: int = 0, clients: int = 0, **kw: Any
) -> dict[str, Any]:
    return {
        "channel_name": name,
        "depth": depth,
        "backend_depth": backend,
        "in_flight_count": kw.get("in_flight", 0),
        "deferred_count": 1,
        "message_count": depth * 10,
        "requeue_count": 2,
        "timeout_count": 3,
        "client_count": clients,
        "clients": [
            {"client_id": f"c{i}", "hostname": f"h{i}", "connect_ts": 0} for i in range(clients)
        ],
        "paused": kw.get("paused", False),
        "e2e_processing_latency": kw.get("e2e", {"count": 0, "percentiles": None}),
    }


def _topic(
    name: str, channels: list[dict[str, Any]], depth: int = 5, backend: int = 1
) -> dict[str, Any]:
    return {
        "topic_name": name,
        "channels": channels,
        "depth": depth,
        "backend_depth": backend,
        "message_count": 100,
        "paused": False,
        "e2e_processing_latency": {"count": 0, "percentiles": None},
    }


def test_topic_add_merges_channels_by_name_and_lists_each_node_once() -> None:
    a = TopicStats.from_nsqd(
        _topic("t", [_channel("x", 1), _channel("y", 2, clients=1)]), "a:1", "ha"
    )
    b = TopicStats.from_nsqd(
        _topic("t", [_channel("z", 4), _channel("x", 3, 1, paused=True)]), "b:1", "hb"
    )
    total = TopicStats.aggregate("t")
    for node in (b, a):
        total.add(node)
    assert total.node == "*"
    assert (total.depth, total.memory_depth, total.backend_depth) == (10, 8, 2)
    assert [n.node for n in total.nodes] == ["a:1", "b:1"]
    assert [c.channel_name for c in total.channels] == ["x", "y", "z"]
    x = total.channels[0]
    assert (x.depth, x.backend_depth, x.memory_depth, x.paused) == (4, 1, 3, True)
    assert [n.node for n in x.nodes] == ["a:1", "b:1"]
    assert (x.deferred_count, x.requeue_count, x.timeout_count, x.message_count) == (2, 4, 6, 40)
    assert total.channels[1].client_count == 1
    doc = total.to_json()
    assert list(doc) == [
        "node",
        "hostname",
        "topic_name",
        "depth",
        "memory_depth",
        "backend_depth",
        "message_count",
        "nodes",
        "channels",
        "paused",
        "e2e_processing_latency",
    ]
    # the per-node documents keep their own channels
    assert [c["channel_name"] for c in doc["nodes"][1]["channels"]] == ["z", "x"]


def test_e2e_latency_aggregate() -> None:
    one = E2ELatency.from_nsqd(
        {
            "count": 2,
            "percentiles": [{"quantile": 0.5, "value": 10}, {"quantile": 0.99, "value": 50}],
        }
    )
    two = E2ELatency.from_nsqd({"count": 6, "percentiles": [{"quantile": 0.99, "value": 90}]})
    total = E2ELatency(topic="t", host="*")
    total.add(one)
    total.add(two)
    assert total.count == 8
    assert total.percentiles is not None
    p99, p50 = total.percentiles
    assert p99["quantile"] == 0.99 and (p99["min"], p99["max"]) == (50, 90)
    assert p99["average"] == (50 * 2 + 90 * 6) / 8 and p99["count"] == 8
    assert p50["max"] == 10
    assert E2ELatency.from_nsqd({"count": 0, "percentiles": None}).percentiles is None
    assert E2ELatency.from_nsqd("garbage").to_json()["count"] == 0


def test_client_stats_normalised() -> None:
    c = ClientStats.from_nsqd(
        {"name": "old", "remote_address": "1.2.3.4:5678", "connect_ts": 1000, "snappy": True},
        "n:1",
        now=1061.7,
    )
    doc = c.to_json()
    assert doc["client_id"] == "old:5678"  # pre-1.0 nsqd had no client_id
    assert doc["connected"] == 61_000_000_000
    assert doc["node"] == "n:1" and doc["snappy"] is True and doc["tls"] is False
    assert doc["user_agent"] == "" and doc["ready_count"] == 0


def test_garbage_from_upstream_is_tolerated() -> None:
    t = TopicStats.from_nsqd(
        {"topic_name": 5, "depth": "x", "channels": [None, {"depth": 2.0}]}, "n", "h"
    )
    assert t.topic_name == "" and t.depth == 0
    assert [c.depth for c in t.channels] == [2]
    ch = ChannelStats.from_nsqd({"clients": "nope"}, "n", "h", "t")
    assert ch.clients == [] and ch.client_count == 0


def test_producer_from_lookupd() -> None:
    p = Producer.from_lookupd(
        {
            "remote_address": "10.0.0.1:555",
            "hostname": "h",
            "broadcast_address": "10.0.0.1",
            "tcp_port": 4150,
            "http_port": 4151,
            "version": "1.3.0",
            "topics": ["b", "a"],
            "tombstones": [True, False],
        }
    )
    assert p.http_address == "10.0.0.1:4151" and p.tcp_address == "10.0.0.1:4150"
    assert [(t.topic, t.tombstoned) for t in p.topics] == [("a", False), ("b", True)]
    assert Producer.from_lookupd({}).address == "N/A"
    assert p.is_inconsistent(1)  # no lookupd has listed it yet


def test_version_key() -> None:
    assert version_key("1.3.0") > version_key("1.3.0-alpha") > version_key("1.2.1")
    assert version_key("v1.10.0") > version_key("1.9.9")
    assert version_key("junk") == version_key("0.0.0")


def test_topology_counters_add_up_and_are_omitted_when_zero() -> None:
    a = ChannelStats.from_nsqd(
        _channel("x", 1) | {"zone_local_msg_count": 5, "global_msg_count": 2}, "a:1", "ha", "t"
    )
    b = ChannelStats.from_nsqd(_channel("x", 1) | {"global_msg_count": 3}, "b:1", "hb", "t")
    total = ChannelStats.aggregate("t", "x")
    total.add(a)
    total.add(b)
    doc = total.to_json()
    keys = list(doc)
    # Go's nsqadmin ChannelStats: after message_count, omitempty
    assert keys[keys.index("message_count") + 1 : keys.index("client_count")] == [
        "zone_local_msg_count",
        "global_msg_count",
    ]
    assert (doc["zone_local_msg_count"], doc["global_msg_count"]) == (5, 5)
    assert "region_local_msg_count" not in doc
    assert (
        "global_msg_count" not in ChannelStats.from_nsqd(_channel("y", 0), "c", "h", "t").to_json()
    )


def test_client_shows_its_nodes_topology_next_to_its_own() -> None:
    c = ClientStats.from_nsqd({"topology_zone": "z2", "topology_region": "r1"}, "n:1")
    assert "node_topology_zone" not in c.to_json()
    c.doc["node_topology_region"] = "r1"
    c.doc["node_topology_zone"] = "z1"
    keys = list(c.to_json())
    at = keys.index("node_topology_region")
    assert keys[at : at + 4] == [
        "node_topology_region",
        "node_topology_zone",
        "topology_zone",
        "topology_region",
    ]
