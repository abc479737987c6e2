"""Prometheus ``/metrics`` of a real nsqd, read with prometheus_client's own parser."""

from __future__ import annotations

import time
from collections.abc import Callable

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import ServerProcess
from tests.support.rawclient import consumer


def scrape(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """family name → {sorted labels: value}; asserts the exposition format."""
    r = requests.get(f"{base}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "X-NSQ-Content-Type" not in r.headers
    metrics: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        assert family.documentation, family.name
        assert family.type in ("counter", "gauge"), family.name
        for sample in family.samples:
            metrics.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return metrics


def test_topic_channel_and_process_metrics(
    nsqd_factory: Callable[..., ServerProcess],
) -> None:
    server = nsqd_factory(e2e_processing_latency_percentile=["0.99", "0.5"], msg_timeout="1s")
    base = "http://" + server.wait_for_log(r"HTTP: listening on (\S+)").group(1)
    topic, channel = (("topic", "mt"),), (("channel", "c"), ("topic", "mt"))
    assert requests.post(f"{base}/topic/create?topic=mt", timeout=5).ok
    assert requests.post(f"{base}/channel/create?topic=mt&channel=c", timeout=5).ok
    assert requests.post(f"{base}/channel/create?topic=mt&channel=idle", timeout=5).ok
    assert requests.post(f"{base}/mpub?topic=mt", b"a\nbb\nccc\ndddd", timeout=5).ok
    with consumer(server.tcp_address, "mt", "c", rdy=2) as c:
        first, second = c.read_messages(2)
        c.fin(first.id)
        c.req(second.id, 0)
        c.read_message()  # the next one, now in flight
        c.nop()
        deadline = time.monotonic() + 5
        while (m := scrape(base))["nsq_channel_requeued_total"][channel] < 1:
            assert time.monotonic() < deadline
        assert m["nsq_topic_messages_total"][topic] == 4
        assert m["nsq_topic_message_bytes_total"][topic] == 10
        assert m["nsq_topic_depth"][topic] == 0
        assert m["nsq_topic_channels"][topic] == 2
        assert m["nsq_topic_paused"][topic] == 0
        assert m["nsq_channel_messages_total"][channel] == 4
        assert m["nsq_channel_in_flight"][channel] == 2
        assert m["nsq_channel_depth"][channel] == 1
        assert m["nsq_channel_deferred"][channel] == 0
        assert m["nsq_channel_clients"][channel] == 1
        assert m["nsq_channel_timed_out_total"][channel] == 0
        assert m["nsq_channel_depth"][(("channel", "idle"), ("topic", "mt"))] == 4
        assert m["nsq_connections"][()] == 1
        assert m["nsq_healthy"][()] == 1
        assert m["nsq_info"][(("version", "1.3.0"),)] == 1
        latency = m["nsq_channel_e2e_processing_latency_seconds"]
        for q in ("0.99", "0.5"):
            assert 0 < latency[(*channel[:1], ("quantile", q), *channel[1:])] < 10
        assert set(m["nsq_topic_e2e_processing_latency_seconds"]) == {
            (("quantile", "0.5"), ("topic", "mt")),
            (("quantile", "0.99"), ("topic", "mt")),
        }
    # the consumer left with two messages in flight: they time out after --msg-timeout=1s
    while scrape(base)["nsq_channel_timed_out_total"][channel] < 2:
        assert time.monotonic() < deadline + 5
        time.sleep(0.05)
    assert requests.post(f"{base}/topic/pause?topic=mt", timeout=5).ok
    m = scrape(base)
    assert m["nsq_topic_paused"][topic] == 1
    assert m["process_resident_memory_bytes"][()] > 0
    assert m["process_virtual_memory_bytes"][()] >= m["process_resident_memory_bytes"][()]
    assert 0 < m["process_cpu_seconds_total"][()] < 1000
    assert abs(m["process_start_time_seconds"][()] - time.time()) < 120
    assert m["process_open_fds"][()] > 0
    assert m["process_max_fds"][()] > 0
    assert abs(m["nsq_start_time_seconds"][()] - time.time()) < 120
    assert m["python_gc_collections_total"][(("generation", "0"),)] >= 0


def test_metrics_without_topics(nsqd: ServerProcess) -> None:
    base = "http://" + nsqd.wait_for_log(r"HTTP: listening on (\S+)").group(1)
    m = scrape(base)
    assert "nsq_topic_messages_total" not in m
    assert m["nsq_connections"][()] == 0
    assert m["nsq_producers"][()] == 0
