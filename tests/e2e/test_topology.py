"""Topology-aware consumption (NSQ master's experiment).

First nsqpy alone: three consumers on one channel (zone-local A, region-local B, remote C),
300 messages published one at a time. Then nsqpy against Go's nsqd, side by side with the
same flags, for every combination of nsqd's zone and region (set or not) and what the
consumers send (see "Against Go's nsqd" below)."""

from __future__ import annotations

import itertools
import json
import os
import select
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from nsqpy.testing import ServerProcess as Process
from tests.e2e.test_metrics import scrape
from tests.support.procs import NSQD, ServerPool, ServerProcess, flag_args, start_server
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


def _channel(server: Process, topic: str) -> dict[str, Any]:
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
    assert (by_agent["A"]["topology_zone"], by_agent["A"]["topology_region"]) == ("z1", "r1")
    # as Go's: the counters are the channel's, no client's stats carry them
    assert not any(k.endswith("_msg_count") for c in channel["clients"] for k in c)
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


# == Against Go's nsqd =====================================================================
#
# The same consumers at Go's nsqd and at nsqpy's, both started with the same flags, and the
# deliveries and counters compared, for every combination of nsqd's --topology-zone and
# --topology-region (set or not) and what a consumer sends (topology_zone absent, equal or
# different; topology_region the same). Go offers each message to a consumer whose pump
# waits for one at that moment; so that "waits" is true, messages go one at a time: PUB,
# its OK, then the message read at whichever consumer got it, then the next PUB; and the
# consumers ask for no output buffering (output_buffer_size -1), so a message leaves nsqd
# as soon as it is handed over. Nothing Go sends says when the pump that sent a message is
# waiting again, and on two CPUs Go's scheduler is now and then late with it (measured: 5
# runs in 100 with a message to another consumer, 1 in 200 all of them), so SETTLE
# seconds pass before each PUB (then 1 run in 200 strays by a message). It is no
# synchronisation of the test's own state, only a margin for Go's; nsqpy, which hands
# messages out at once, gets the same traffic. And Go is measured until two clean runs
# (one consumer got all, or those that got any took turns) agree on who got the messages,
# at most four times: its usual outcome, chosen by Go's runs alone, never by nsqpy's.

GO_DIR = Path(
    os.environ.get("NSQPY_GO_NSQ_DIR", Path(__file__).resolve().parents[3] / "shared/ref/nsq-go")
)
EXPERIMENT = "topology-aware-consumption"
COUNTERS = ("zone_local_msg_count", "region_local_msg_count", "global_msg_count")
SYNC_TOPIC = "topology_sync#ephemeral"  # a PUB's OK after RDY: nsqd has read the RDY
SETTLE = 0.001

# nsqd's --topology-zone / --topology-region: unset or set.
SERVERS = {
    "zone-unset,region-unset": {},
    "zone-z1,region-unset": {"topology_zone": "z1"},
    "zone-unset,region-r1": {"topology_region": "r1"},
    "zone-z1,region-r1": {"topology_zone": "z1", "topology_region": "r1"},
}
# A consumer's IDENTIFY: topology_zone absent, "z1" or "z2"; topology_region absent, "r1" or
# "r2". With nsqd's zone z1, "z1" is equal and "z2" different; with it unset, absent is
# equal ("" == "") and both others different. Likewise for the region.
ZONES = (None, "z1", "z2")
REGIONS = (None, "r1", "r2")
Place = tuple[str | None, str | None]
PLACES_ALL: list[Place] = [(z, r) for z in ZONES for r in REGIONS]


def _place_id(place: Place | None) -> str:
    if place is None:
        return "no-identify"
    zone, region = place
    return f"{zone or '-'}/{region or '-'}"


def _fields(place: Place | None) -> dict[str, str] | None:
    if place is None:
        return None
    zone, region = place
    fields = {}
    if zone is not None:
        fields["topology_zone"] = zone
    if region is not None:
        fields["topology_region"] = region
    return fields


def go_nsqd_binary() -> Path:
    """Go's nsqd binary; without it skip, except in CI (CI=true) where that is a failure."""
    path = GO_DIR / "nsqd"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    message = f"Go's nsqd not found at {path} (<repo root>/../shared/ref/nsq-go/nsqd)"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@dataclass
class Both:
    """Go's nsqd and nsqpy's, started with the same flags."""

    go: Process
    py: Process

    def stop(self) -> None:
        for process in (self.go, self.py):
            process.stop(timeout=10.0)  # by its PID


def start_both(binary: Path, base: Path, flags: dict[str, object]) -> Both:
    """Go's nsqd (``binary``) and nsqpy's (``python -m nsqpy.nsqd``) with the same
    ``flags``, each its own data directory under ``base``, on 127.0.0.1 port 0; both
    stopped (by PID) if either fails to start."""
    (base / "go").mkdir()
    go_argv = [
        str(binary),
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--https-address=",
        f"--data-path={base / 'go'}",
        *flag_args(flags),
    ]
    go = Process("go-nsqd", go_argv, ready=("tcp", "http"), cwd=base / "go")
    try:
        py = start_server(NSQD, base / "py", options=flags, wait=False)
    except BaseException:
        go.stop()
        raise
    try:
        go.wait_ready(15.0)
        py.wait_ready(15.0)
    except BaseException:
        go.stop()
        py.stop()
        raise
    return Both(go, py)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Both]]:
    """``both(**flags)``: a Go nsqd and an nsqpy nsqd with these flags (and the experiment
    unless ``enable_experiment=None``), started once per set of flags for the module."""
    binary = go_nsqd_binary()
    started: dict[tuple[tuple[str, object], ...], Both] = {}

    def get(**flags: object) -> Both:
        flags = {"enable_experiment": EXPERIMENT, **flags}
        key = tuple(sorted(flags.items()))
        if key not in started:
            base = tmp_path_factory.mktemp("topology-vs-go")
            started[key] = start_both(binary, base, flags)
        return started[key]

    try:
        yield get
    finally:
        for pair in started.values():
            pair.stop()


@dataclass(frozen=True)
class Outcome:
    got: tuple[int, ...]  # deliveries per consumer, in the order they were given
    counters: tuple[int, int, int]  # the channel's zone/region/global counts (0: omitted)
    client_counters: frozenset[str]  # any of COUNTERS in a client's stats

    def receivers(self) -> frozenset[int]:
        return frozenset(i for i, n in enumerate(self.got) if n)

    def clean(self) -> bool:
        """One consumer got them all, or those that got any took turns (±2)."""
        share = sum(self.got) / len(self.receivers())
        return all(abs(self.got[i] - share) <= 2 for i in self.receivers())


_topics = itertools.count()


def _next_delivery(clients: Sequence[RawClient], deadline: float) -> int:
    """The index of the client the next message arrives at (each reads at most one)."""
    while True:
        for i, client in enumerate(clients):
            if client.poll_message(0) is not None:  # one already read off the socket
                return i
        remaining = deadline - time.monotonic()
        assert remaining > 0, "a published message reached no consumer in time"
        readable, _, _ = select.select([c.sock for c in clients], [], [], remaining)
        for i, client in enumerate(clients):
            if client.sock in readable and client.poll_message(1.0) is not None:
                return i


def _measure(server: Process, places: Sequence[Place | None], n: int, rdy: int = 100) -> Outcome:
    """Subscribe one consumer per place (RDY ``rdy`` each), publish ``n`` messages one at a
    time, each read where it went before the next PUB; then the channel's stats."""
    topic = f"topo_vs_go_{next(_topics)}"
    clients: list[RawClient] = []
    try:
        for place in places:
            client = RawClient(server.tcp_address)
            clients.append(client)
            fields = _fields(place)
            if fields is not None:
                client.identify_ok(output_buffer_size=-1, **fields)
            client.sub(topic, "ch")
            client.rdy(rdy)
            client.pub(SYNC_TOPIC, b"x")  # answered in order: the RDY is in
        got = [0] * len(clients)
        with RawClient(server.tcp_address) as producer:
            for i in range(n):
                time.sleep(SETTLE)  # a margin for Go's pumps, see above
                producer.pub(topic, b"%d" % i)
                got[_next_delivery(clients, time.monotonic() + 5.0)] += 1
        channel = _channel(server, topic)
        # exactly n went out (one per PUB, each read once): nothing else is on its way
        assert (channel["message_count"], channel["in_flight_count"]) == (n, n), channel
        assert sum(c["message_count"] for c in channel["clients"]) == n, channel
        counters = tuple(channel.get(key, 0) for key in COUNTERS)
        client_counters = {k for c in channel["clients"] for k in COUNTERS if k in c}
        return Outcome(tuple(got), counters, frozenset(client_counters))  # type: ignore[arg-type]
    finally:
        for client in clients:
            client.close()


def _go_outcome(server: Process, places: Sequence[Place | None], n: int) -> Outcome:
    """Go's usual outcome: measured until two clean runs agree on which consumers got
    messages (one run for one consumer), at most four times."""
    runs: list[Outcome] = []
    while len(runs) < 4:
        runs.append(_measure(server, places, n))
        clean = [run for run in runs if run.clean()]
        for run in clean:
            if len(places) == 1 or [c.receivers() for c in clean].count(run.receivers()) > 1:
                return run
    raise AssertionError(f"Go's nsqd gave no outcome twice in {len(runs)} runs: {runs}")


def _compare(pair: Both, places: Sequence[Place | None], n: int) -> tuple[Outcome, Outcome]:
    """Go's outcome (see above) and nsqpy's, for the same consumers."""
    return _go_outcome(pair.go, places, n), _measure(pair.py, places, n)


def _assert_same(go: Outcome, py: Outcome, n: int) -> None:
    assert py.clean(), py
    assert py.receivers() == go.receivers(), (go, py)
    if len(go.receivers()) == 1:
        assert py.got == go.got, (go, py)
    # counters: the same ones written (omitempty), adding up to n; exact where they must
    assert sum(go.counters) == sum(py.counters) == n, (go, py)
    assert [bool(c) for c in py.counters] == [bool(c) for c in go.counters], (go, py)
    if len(go.receivers()) == 1 or sum(map(bool, go.counters)) == 1:
        assert py.counters == go.counters, (go, py)
    # Go's per-client stats carry no counters at all
    assert go.client_counters == py.client_counters == frozenset(), (go, py)


@pytest.mark.parametrize(
    "place", [*PLACES_ALL, ("", ""), None], ids=[*map(_place_id, PLACES_ALL), "''/''", "none"]
)
@pytest.mark.parametrize("server", list(SERVERS))
def test_counters_by_consumer_class_as_go(
    both: Callable[..., Both], server: str, place: Place | None
) -> None:
    """One consumer: which of the channel's counters its deliveries go to."""
    pair = both(**SERVERS[server])
    go, py = _compare(pair, [place], 3)
    assert go.got == py.got == (3,)
    _assert_same(go, py, 3)


@pytest.mark.parametrize(
    "places",
    list(itertools.combinations(PLACES_ALL, 2)),
    ids=[f"{_place_id(a)}-vs-{_place_id(b)}" for a, b in itertools.combinations(PLACES_ALL, 2)],
)
@pytest.mark.parametrize("server", list(SERVERS))
def test_two_consumers_as_go(
    both: Callable[..., Both], server: str, places: tuple[Place, Place]
) -> None:
    """Who gets the messages of two consumers of different localities, and the counters."""
    go, py = _compare(both(**SERVERS[server]), places, 12)
    _assert_same(go, py, 12)


TRIPLES: list[tuple[Place, Place, Place]] = [
    (("z1", "r1"), ("z2", "r1"), ("z2", "r2")),
    ((None, "r1"), (None, "r2"), (None, None)),
    (("z1", "r2"), ("z2", "r1"), (None, None)),
]


@pytest.mark.parametrize("places", TRIPLES, ids=["-".join(map(_place_id, t)) for t in TRIPLES])
@pytest.mark.parametrize("server", list(SERVERS))
def test_three_consumers_as_go(
    both: Callable[..., Both], server: str, places: tuple[Place, Place, Place]
) -> None:
    go, py = _compare(both(**SERVERS[server]), places, 12)
    _assert_same(go, py, 12)


def test_an_empty_zone_on_both_sides_is_not_a_zone_match_as_go(
    both: Callable[..., Both],
) -> None:
    """The issue: --topology-region=r1, no --topology-zone; A in r1 and B in r2, neither
    sending a zone, RDY 100 each, 60 PUBs. Go: all 60 to A (nsqpy used to split 31/29),
    counted zone-local ("" == "" is a zone match for the counters)."""
    go, py = _compare(both(topology_region="r1"), [(None, "r1"), (None, "r2")], 60)
    assert go.got == py.got == (60, 0)
    assert go.counters == py.counters == (60, 0, 0)
    assert go.client_counters == py.client_counters == frozenset()


def test_without_the_experiment_no_preference_as_go(both: Callable[..., Both]) -> None:
    places = [("z1", "r1"), ("z2", "r2")]
    go, py = _compare(
        both(enable_experiment=None, topology_zone="z1", topology_region="r1"), places, 12
    )
    assert len(go.receivers()) == len(py.receivers()) == 2
    assert go.counters == py.counters == (0, 0, 12)
    _assert_same(go, py, 12)
