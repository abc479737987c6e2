"""Topology-aware consumption (NSQ master's experiment), measured as against the Go nsqd:
three consumers on one channel (zone-local A, region-local B, remote C), 300 messages
published one at a time."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from tests.e2e.test_metrics import scrape
from tests.support.procs import NSQD, ServerPool, ServerProcess
from tests.support.rawclient import RawClient, consumer

TOTAL = 300
PLACES = {"A": ("z1", "r1"), "B": ("z2", "r1"), "C": ("z3", "r2")}


@pytest.fixture(scope="module")
def aware(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One nsqd with the experiment on, zone z1, region r1 (each test its own topic)."""
    pool = ServerPool(NSQD, tmp_path_factory.mktemp("topology"))
    try:
        yield pool.start(
            enable_experiment="topology-aware-consumption",
            topology_zone="z1",
            topology_region="r1",
        )
    finally:
        pool.stop_all()


def _channel(server: ServerProcess, topic: str) -> dict[str, Any]:
    r = requests.get(f"http://{server.http_address}/stats?format=json&topic={topic}", timeout=5)
    [channel] = r.json()["topics"][0]["channels"]
    return channel  # type: ignore[no-any-return]


def _run(
    server: ServerProcess, topic: str, rdy: dict[str, int]
) -> tuple[dict[str, int], dict[str, Any]]:
    """Subscribe A, B, C with these RDY counts, publish one at a time: the deliveries
    each got, and the channel's stats while they are still connected."""
    clients: dict[str, RawClient] = {}
    try:
        for name, (zone, region) in PLACES.items():
            clients[name] = consumer(
                server.tcp_address,
                topic,
                "ch",
                rdy=rdy[name],
                topology_zone=zone,
                topology_region=region,
                user_agent=name,
            )
        # RDY is asynchronous: wait until nsqd has seen every RDY.
        _wait(
            lambda: all(c["ready_count"] == rdy[c["user_agent"]] for c in _clients(server, topic))
        )
        with RawClient(server.tcp_address) as producer:
            for i in range(TOTAL):
                producer.pub(topic, b"%d" % i)
        got = dict.fromkeys(PLACES, 0)
        deadline = time.monotonic() + 10
        while sum(got.values()) < TOTAL and time.monotonic() < deadline:
            for name, client in clients.items():
                while client.poll_message(0.01) is not None:
                    got[name] += 1
        return got, _channel(server, topic)
    finally:
        for client in clients.values():
            client.close()


def _clients(server: ServerProcess, topic: str) -> list[dict[str, Any]]:
    return _channel(server, topic)["clients"] or []


def _wait(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_identify_reply_and_stats_carry_the_topology(aware: ServerProcess) -> None:
    with RawClient(aware.tcp_address) as c:
        reply = json.loads(
            c.identify_ok(feature_negotiation=True, topology_zone="z9", topology_region="r9").data
        )
        assert list(reply)[-2:] == ["topology_region", "topology_zone"]
        assert (reply["topology_region"], reply["topology_zone"]) == ("r1", "z1")
        c.sub("topo_ident", "ch")
        [client] = _clients(aware, "topo_ident")
        assert (client["topology_zone"], client["topology_region"]) == ("z9", "r9")


def test_zone_local_consumer_gets_everything(aware: ServerProcess) -> None:
    got, channel = _run(aware, "topo_zone", {"A": 1000, "B": 1000, "C": 1000})
    assert got == {"A": TOTAL, "B": 0, "C": 0}
    assert channel["zone_local_msg_count"] == TOTAL
    # Go writes a counter only when it is non-zero
    assert "region_local_msg_count" not in channel and "global_msg_count" not in channel
    by_agent = {c["user_agent"]: c for c in channel["clients"]}
    assert by_agent["A"]["zone_local_msg_count"] == TOTAL
    assert (by_agent["A"]["topology_zone"], by_agent["A"]["topology_region"]) == ("z1", "r1")
    assert not any(k.endswith("_msg_count") for k in by_agent["B"])
    metrics = scrape(f"http://{aware.http_address}")
    labels = (("channel", "ch"), ("topic", "topo_zone"))
    assert metrics["nsq_channel_zone_local_messages_total"][labels] == TOTAL
    assert labels not in metrics.get("nsq_channel_global_messages_total", {})


def test_region_local_consumer_when_zone_local_is_not_ready(aware: ServerProcess) -> None:
    got, channel = _run(aware, "topo_region", {"A": 0, "B": 1000, "C": 1000})
    assert got == {"A": 0, "B": TOTAL, "C": 0}
    assert channel["region_local_msg_count"] == TOTAL
    assert "zone_local_msg_count" not in channel and "global_msg_count" not in channel


def test_a_preference_not_a_partition(aware: ServerProcess) -> None:
    # Only the remote consumer has room at first, then the zone-local one is full:
    # nothing waits for a local consumer, and the three counters add up.
    got, channel = _run(aware, "topo_spill", {"A": 100, "B": 0, "C": 1000})
    assert got == {"A": 100, "B": 0, "C": TOTAL - 100}
    assert (channel["zone_local_msg_count"], channel.get("region_local_msg_count", 0)) == (100, 0)
    assert channel["global_msg_count"] == TOTAL - 100
    by_agent = {c["user_agent"]: c for c in channel["clients"]}
    assert by_agent["C"]["global_msg_count"] == TOTAL - 100


def test_without_the_experiment_an_even_spread(
    nsqd_factory: Callable[..., ServerProcess],
) -> None:
    server = nsqd_factory(topology_zone="z1", topology_region="r1")
    got, channel = _run(server, "topo_off", {"A": 1000, "B": 1000, "C": 1000})
    assert sum(got.values()) == TOTAL
    assert all(80 <= n <= 120 for n in got.values()), got
    assert channel["global_msg_count"] == TOTAL
    assert "zone_local_msg_count" not in channel and "region_local_msg_count" not in channel


def test_identify_reply_escapes_the_topology_as_go(
    nsqd_factory: Callable[..., ServerProcess],
) -> None:
    server = nsqd_factory(topology_zone="z<é>&", topology_region="r")
    with RawClient(server.tcp_address) as c:
        data = c.identify_ok(feature_negotiation=True).data
    assert data.endswith(
        b',"topology_region":"r","topology_zone":"z\\u003c\xc3\xa9\\u003e\\u0026"}'
    )
