"""nsqpy/nsqd/topology.py: consumer locality, the delivery preference and its counters,
driven through a real engine (NSQD, Topic, Channel) with fake consumers."""

from __future__ import annotations

from typing import Any

from nsqpy.nsqd.options import Options
from nsqpy.nsqd.topology import (
    GLOBAL,
    REGION_LOCAL,
    ZONE_LOCAL,
    counter,
    locality,
)
from tests.unit.test_engine import FakeConsumer, fin, make_nsqd, pub, rdy

EXPERIMENT: dict[str, Any] = {"experiments": ["topology-aware-consumption"]}


class Placed(FakeConsumer):
    """A consumer that IDENTIFYed with a zone and a region."""

    def __init__(self, opts: Options, zone: str, region: str, ready: int = 0) -> None:
        super().__init__(ready)
        self.locality = locality(opts, zone, region)


PLACES = {"A": ("z1", "r1"), "B": ("z2", "r1"), "C": ("z3", "r2")}


def _setup(
    ready: dict[str, int], places: dict[str, tuple[str, str]] = PLACES, **opts: Any
) -> tuple[Any, Any, dict[str, Placed]]:
    nsqd, _ = make_nsqd(**opts)
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    consumers = {}
    for name, (zone, region) in places.items():
        consumers[name] = Placed(nsqd.opts, zone, region)
        ch.add_client(consumers[name])
        rdy(ch, consumers[name], ready[name])
    return topic, ch, consumers


def test_locality_is_two_facts_of_plain_string_equality_and_needs_the_experiment() -> None:
    on = Options(topology_zone="z1", topology_region="r1", **EXPERIMENT)
    assert locality(on, "z1", "rX") == ZONE_LOCAL
    assert locality(on, "zX", "r1") == REGION_LOCAL
    assert locality(on, "z1", "r1") == ZONE_LOCAL | REGION_LOCAL
    assert locality(on, "zX", "rX") == GLOBAL
    # unset on both sides: "" == "" (Go compares the strings as they are)
    assert locality(Options(**EXPERIMENT), "", "") == ZONE_LOCAL | REGION_LOCAL
    assert locality(Options(topology_region="r1", **EXPERIMENT), "", "r2") == ZONE_LOCAL
    assert locality(Options(topology_zone="z1"), "z1", "r1") == GLOBAL
    # the counter: zone-local first, then region-local, else global
    assert [counter(w) for w in (ZONE_LOCAL | REGION_LOCAL, ZONE_LOCAL, REGION_LOCAL)] == [0, 0, 1]
    assert counter(GLOBAL) == 2
    # Go's per-client stats never carry the counters


def test_an_empty_zone_on_both_sides_is_no_preference() -> None:
    # The case: --topology-region=r1, no --topology-zone, neither consumer sends a
    # zone. Both are zone-local ("" == ""), but with no zone hand-off that prefers nobody;
    # only A is region-local, so it gets every message (Go: 60/0, all counted zone-local).
    topic, ch, c = _setup(
        {"A": 100, "B": 100},
        {"A": ("", "r1"), "B": ("", "r2")},
        topology_region="r1",
        **EXPERIMENT,
    )
    for i in range(60):
        pub(topic, b"%d" % i)
    assert [len(c[n].received) for n in "AB"] == [60, 0]
    assert ch.topology is not None and ch.topology.counts == [60, 0, 0]


def test_a_zone_match_without_a_region_match_reads_no_region_hand_off() -> None:
    # --topology-zone=z1 --topology-region=r1: Z is zone-local only, R region-local only,
    # G neither. Z first; with Z full, R; with both full, G.
    topic, ch, c = _setup(
        {"Z": 1, "R": 2, "G": 100},
        {"Z": ("z1", "r2"), "R": ("z2", "r1"), "G": ("z2", "r2")},
        topology_zone="z1",
        topology_region="r1",
        **EXPERIMENT,
    )
    for i in range(5):
        pub(topic, b"%d" % i)
    assert [len(c[n].received) for n in "ZRG"] == [1, 2, 2]
    assert ch.topology is not None and ch.topology.counts == [1, 2, 2]


def test_one_at_a_time_to_the_zone_local_consumer() -> None:
    topic, ch, c = _setup(
        {"A": 1000, "B": 1000, "C": 1000}, topology_zone="z1", topology_region="r1", **EXPERIMENT
    )
    for i in range(30):
        pub(topic, b"%d" % i)
    assert [len(c[n].received) for n in "ABC"] == [30, 0, 0]
    assert ch.topology is not None and ch.topology.counts == [30, 0, 0]


def test_region_then_others_when_the_local_ones_are_full() -> None:
    topic, ch, c = _setup(
        {"A": 2, "B": 3, "C": 1000}, topology_zone="z1", topology_region="r1", **EXPERIMENT
    )
    pub(topic, *(b"%d" % i for i in range(10)))
    assert [len(c[n].received) for n in "ABC"] == [2, 3, 5]
    assert ch.topology is not None and ch.topology.counts == [2, 3, 5]
    # room again at A: the next message goes there, not to C
    fin(ch, c["A"], c["A"].last_id)
    pub(topic, b"next")
    assert c["A"].bodies[-1] == b"next"
    assert ch.topology.counts == [3, 3, 5]


def test_queued_messages_go_to_the_local_consumer_that_becomes_ready() -> None:
    topic, ch, c = _setup({"A": 0, "B": 0, "C": 0}, topology_zone="z1", **EXPERIMENT)
    pub(topic, *(b"%d" % i for i in range(4)))
    rdy(ch, c["C"], 1)
    rdy(ch, c["A"], 10)
    assert [len(c[n].received) for n in "ABC"] == [3, 0, 1]
    # no --topology-region: region-local consumers get no preference, but count as such
    assert ch.topology is not None and ch.topology.counts == [3, 0, 1]


def test_without_the_experiment_no_preference_object_and_an_even_spread() -> None:
    topic, ch, c = _setup({"A": 1000, "B": 1000, "C": 1000}, topology_zone="z1")
    assert ch.topology is None
    for i in range(30):
        pub(topic, b"%d" % i)
    assert [len(c[n].received) for n in "ABC"] == [10, 10, 10]
    assert ch.delivery_count == 30
