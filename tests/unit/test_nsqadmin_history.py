"""The sampled history behind the UI's charts (nsqpy/nsqadmin/history.py)."""

from __future__ import annotations

from nsqpy.nsqadmin.history import ChannelPoint, History, Sample, TopicPoint


def _topic(depth: int, count: int, channel_count: int | None = None) -> TopicPoint:
    channels = {}
    if channel_count is not None:
        channels["c"] = ChannelPoint(depth, 1, 0, channel_count, 0, channel_count // 10, 2)
    return TopicPoint(depth=depth, message_count=count, paused=False, channels=channels)


def _sample(t: float, nodes: dict[str, dict[str, TopicPoint]]) -> Sample:
    return Sample(wall=1000 + t, mono=t, nodes=nodes)


def test_rates_gauges_and_gaps() -> None:
    h = History(interval=1, duration=10)
    h.add(_sample(0, {"a": {"t": _topic(5, 100, 100)}, "b": {"t": _topic(1, 10)}}))
    h.add(_sample(2, {"a": {"t": _topic(7, 140, 120)}, "b": {"t": _topic(1, 30)}}))
    h.add(_sample(4, {"a": {"t": _topic(3, 150, 130)}}))  # b did not answer
    h.add(_sample(6, {"a": {"t": _topic(3, 20, 20)}, "b": {"t": _topic(0, 40)}}))  # a restarted
    h.add(_sample(8, {"a": {}, "b": {}}))  # the topic is gone
    doc = h.topic("t")
    assert doc["timestamps"] == [1000, 1002, 1004, 1006, 1008]
    assert doc["series"]["depth"] == [6, 8, 3, 3, None]
    assert doc["series"]["rate"] == [None, 30.0, 5.0, 10.0, None]
    c = doc["channels"]["c"]["series"]
    assert c["rate"] == [None, 10.0, 5.0, 10.0, None]
    assert c["timeout_rate"][1] == 1.0
    assert c["in_flight"] == [1, 1, 1, 1, None] and c["clients"][0] == 2
    assert h.channel("t", "c")["series"] == c
    node = h.node("b")
    assert node["series"]["depth"] == [1, 1, None, 0, 0]
    assert node["series"]["rate"] == [None, 10.0, None, None, 0.0]


def test_overview_and_capacity() -> None:
    h = History(interval=5, duration=10)
    for i in range(6):
        h.add(_sample(i * 5, {"a": {"x": _topic(i, i * 50, 0)}}))
    assert len(h.samples) == 3  # 10s of 5s samples, plus the one the first rate needs
    doc = h.overview()
    assert doc["sampled_at"] == 1025 and doc["message"] == ""
    x = doc["topics"]["x"]
    assert (x["depth"], x["message_count"], x["channel_count"], x["node_count"]) == (5, 250, 1, 1)
    assert x["series"]["rate"] == [None, 10.0, 10.0]


def test_empty_history() -> None:
    doc = History(interval=0, duration=0).overview()
    assert doc["timestamps"] == [] and doc["topics"] == {} and doc["sampled_at"] is None
    assert History(1, 5).topic("nope")["series"] == {"depth": [], "rate": []}


def test_sample_errors_are_reported() -> None:
    h = History(1, 10)
    h.add(Sample(wall=1, mono=1, nodes={}, errors=("boom", "bang")))
    assert h.overview()["message"] == "WARNING: boom; bang"
