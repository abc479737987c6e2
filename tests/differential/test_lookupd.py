"""Go's nsqd and nsqpy's registered with one Go nsqlookupd: the same traffic at both, and
what nsqlookupd learns from each compared (its /debug registrations, its /nodes entry),
with what each nsqd does with the channels nsqlookupd holds for a topic it creates.

A third nsqd (Go's) holds those channels: it creates the topic and its channels first,
so that nsqlookupd knows them before the nsqd under test create the topic.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.differential.harness import (
    MAGIC,
    NSQD_FLAGS,
    GoNSQD,
    GoNSQLookupd,
    Pair,
    TCPConn,
    close_all,
    command,
    diff_text,
    examples,
    get_json,
    http_once,
    mpub_payload,
    report,
    require_go,
    run_script,
    same_eventually,
    seed,
    start_pair,
    stats_of,
)

# What a producer entry says that does not depend on the process: not its address,
# ports, or times.
PRODUCER_KEYS = ("hostname", "broadcast_address", "version", "topology_zone", "topology_region")


@pytest.fixture(scope="module")
def cluster(go_lookupd: GoNSQLookupd) -> Iterator[tuple[Pair, GoNSQD]]:
    """The pair and the channel holder, all registered with Go's nsqlookupd."""
    require_go("nsqd")
    holder = GoNSQD(**NSQD_FLAGS, lookupd_tcp_address=go_lookupd.tcp_address)
    pair = None
    try:
        holder.start()
        pair = start_pair(lookupd_tcp_address=go_lookupd.tcp_address)
        go_lookupd.wait_for_nodes(3)
        yield pair, holder
    finally:
        close_all(holder, *((pair.go, pair.py) if pair else ()))


def port(server: Any) -> int:
    return int(server.tcp_address.rpartition(":")[2])


def registrations(lookupd: GoNSQLookupd, server: Any) -> dict[str, Any]:
    """What nsqlookupd holds for ``server``: its registrations (``topic:T:``,
    ``channel:T:C``, ``client::``), each with the producer's process-independent fields."""
    out = {}
    for key, producers in get_json(lookupd.http_address, "/debug").items():
        for producer in producers:
            if producer.get("tcp_port") == port(server):
                out[key] = {k: producer.get(k) for k in (*PRODUCER_KEYS, "tombstoned")}
    return out


def node(lookupd: GoNSQLookupd, server: Any) -> dict[str, Any] | None:
    """``server``'s /nodes entry, less its address and ports."""
    for producer in get_json(lookupd.http_address, "/nodes")["producers"]:
        if producer.get("tcp_port") == port(server):
            keys = (*PRODUCER_KEYS, "tombstones", "topics")
            return {k: producer.get(k) for k in keys}
    return None


def lookup_ports(lookupd: GoNSQLookupd, topic: str) -> set[int] | int:
    reply = http_once(lookupd.http_address, "GET", f"/lookup?topic={quote(topic)}")
    if reply.status != 200:
        return reply.status
    return {p["tcp_port"] for p in json.loads(reply.body)["producers"]}


def assert_same_registrations(lookupd: GoNSQLookupd, pair: Pair, context: str = "") -> None:
    go, py = same_eventually(
        lambda: registrations(lookupd, pair.go), lambda: registrations(lookupd, pair.py)
    )
    assert py == go, f"nsqlookupd's registrations differ{context}:\n{diff_text(go, py)}"


def topic_stats(server: Any, topic: str) -> Any:
    return stats_of(server, f"&topic={quote(topic)}")


def test_both_registered_alike(go_lookupd: GoNSQLookupd, cluster: tuple[Pair, GoNSQD]) -> None:
    pair, _ = cluster
    go, py = same_eventually(lambda: node(go_lookupd, pair.go), lambda: node(go_lookupd, pair.py))
    assert go is not None
    assert py == go, diff_text(go, py)
    assert_same_registrations(go_lookupd, pair)


# How a topic comes to exist on the nsqd under test: pieces for TCP, a request for HTTP.
CREATIONS: dict[str, tuple[str, Any]] = {
    "http-pub": ("http", ("POST", "/pub?topic={t}", b"hello")),
    "http-mpub": ("http", ("POST", "/mpub?topic={t}", b"a\nb")),
    "http-topic-create": ("http", ("POST", "/topic/create?topic={t}", None)),
    "http-pub-deferred": ("http", ("POST", "/pub?topic={t}&defer=300000", b"later")),
    "tcp-pub": ("tcp", lambda t: [MAGIC + command(b"PUB " + t, b"hello")]),
    "tcp-mpub": ("tcp", lambda t: [MAGIC + command(b"MPUB " + t, mpub_payload([b"a", b"b"]))]),
    "tcp-dpub": ("tcp", lambda t: [MAGIC + command(b"DPUB " + t + b" 300000", b"later")]),
    "tcp-sub": ("tcp", lambda t: [MAGIC + command(b"SUB " + t + b" own")]),
}


@pytest.mark.parametrize("how", list(CREATIONS))
def test_new_topic_takes_channels_from_lookupd(
    go_lookupd: GoNSQLookupd, cluster: tuple[Pair, GoNSQD], how: str
) -> None:
    """A topic the holder has channels for (c1, c2 and an ephemeral one, with its client
    still connected) is created on both nsqd: each asks nsqlookupd for the channels and
    makes the durable ones before the first message goes in."""
    pair, holder = cluster
    topic = f"held_{how}"
    http_once(holder.http_address, "POST", f"/topic/create?topic={topic}")
    for channel in ("c1", "c2"):
        http_once(holder.http_address, "POST", f"/channel/create?topic={topic}&channel={channel}")
    ephemeral = TCPConn(holder.tcp_address)
    try:
        ephemeral.send(MAGIC + command(f"SUB {topic} e#ephemeral".encode()))
        ephemeral.read_until(lambda frames: len(frames) >= 1)
        deadline = time.monotonic() + 5
        while True:  # nsqlookupd learns of the holder's channels asynchronously
            channels = get_json(go_lookupd.http_address, f"/channels?topic={topic}")["channels"]
            if sorted(channels) == ["c1", "c2", "e#ephemeral"] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert sorted(channels) == ["c1", "c2", "e#ephemeral"]

        kind, action = CREATIONS[how]
        replies = []
        for server in (pair.go, pair.py):
            if kind == "http":
                method, target, body = action
                reply = http_once(server.http_address, method, target.format(t=topic), body)
                replies.append((reply.status_line, reply.body))
            else:
                replies.append(run_script(server.tcp_address, action(topic.encode())).norm())
        assert replies[1] == replies[0], diff_text(replies[0], replies[1])

        go, py = same_eventually(
            lambda: topic_stats(pair.go, topic), lambda: topic_stats(pair.py, topic)
        )
        assert py == go, f"/stats of {topic} differ:\n{diff_text(go, py)}"
        assert_same_registrations(go_lookupd, pair)
    finally:
        ephemeral.close()


@pytest.fixture
def fresh_cluster() -> Iterator[tuple[GoNSQLookupd, Pair]]:
    """A Go nsqlookupd and a pair registered with it, for one test."""
    require_go("nsqd", "nsqlookupd")
    lookupd = GoNSQLookupd()
    pair = None
    try:
        lookupd.start()
        pair = start_pair(lookupd_tcp_address=lookupd.tcp_address)
        lookupd.wait_for_nodes(2)
        yield lookupd, pair
    finally:
        close_all(*((pair.go, pair.py) if pair else ()), lookupd)


def test_empty_topic_name_keeps_registration(fresh_cluster: tuple[GoNSQLookupd, Pair]) -> None:
    """Known: ``PUB \\n`` (topic "") was taken by nsqpy; Go refuses it and both stay
    registered with nsqlookupd: /nodes lists both, and a topic made afterwards is in
    /lookup for both."""
    go_lookupd, pair = fresh_cluster
    problems: list[str] = []
    expected = {
        "frames": [("error", b'E_BAD_TOPIC PUB topic name "" is not valid')],
        "closed": True,
        "partial": b"",
    }
    for name, server in pair.both():
        got = run_script(server.tcp_address, [MAGIC + command(b"PUB ", b"x")]).norm()
        if got != expected:
            problems.append(f'{name}: PUB of topic "": {got}')
    for name, server in pair.both():
        reply = http_once(server.http_address, "POST", "/pub?topic=", b"x")
        if (reply.status, reply.body) != (400, b'{"message":"INVALID_TOPIC"}'):
            problems.append(f"{name}: POST /pub?topic= then: {reply.status_line!r} {reply.body!r}")
    for _, server in pair.both():
        http_once(server.http_address, "POST", "/topic/create?topic=after_empty")
    want = {port(pair.go), port(pair.py)}
    deadline = time.monotonic() + 5
    while (found := lookup_ports(go_lookupd, "after_empty")) != want:
        if time.monotonic() > deadline:
            problems.append(f"/lookup?topic=after_empty lists {found}, want both nsqd {want}")
            break
        time.sleep(0.02)
    nodes = {p["tcp_port"] for p in get_json(go_lookupd.http_address, "/nodes")["producers"]}
    if not want <= nodes:
        problems.append(f"/nodes lists {nodes}, want both nsqd {want} (py: {port(pair.py)})")
    go, py = same_eventually(
        lambda: registrations(go_lookupd, pair.go), lambda: registrations(go_lookupd, pair.py)
    )
    if go != py:
        problems.append(f"nsqlookupd's registrations differ:\n{diff_text(go, py)}")
    assert not problems, "\n".join(problems)


# -- generated registration traffic ----------------------------------------------------------


def test_generated_registrations(go_lookupd: GoNSQLookupd, cluster: tuple[Pair, GoNSQD]) -> None:
    """Topics and channels made and removed on both nsqd in the same order (HTTP and
    TCP, ephemeral channels whose client comes and goes): nsqlookupd must learn the same
    from each."""
    pair, _ = cluster
    case_seed = seed(7401)
    rng = random.Random(case_seed)
    topics = [f"reg{case_seed}_{i}" for i in range(3)] + [f"reg{case_seed}_e#ephemeral"]
    channels = ["c", "d", "x#ephemeral"]
    open_subs: list[tuple[TCPConn, TCPConn]] = []
    divergences: list[str] = []
    try:
        for step in range(examples(30)):
            topic, channel = rng.choice(topics), rng.choice(channels)
            action = rng.choice(
                ("pub", "pub", "topic/create", "topic/delete", "channel/create",
                 "channel/delete", "sub", "sub", "unsub")
            )  # fmt: skip
            where = f"seed {case_seed} step {step}: {action} {topic} {channel}"
            if action == "sub":
                conns = []
                for server in (pair.go, pair.py):
                    conn = TCPConn(server.tcp_address)
                    conn.send(MAGIC + command(f"SUB {topic} {channel}".encode()))
                    conn.read_until(lambda frames: len(frames) >= 1)
                    conns.append(conn)
                open_subs.append((conns[0], conns[1]))
                replies = [c.transcript.norm() for c in conns]
            elif action == "unsub":
                if not open_subs:
                    continue
                for conn in open_subs.pop(rng.randrange(len(open_subs))):
                    conn.close()
                replies = [None, None]
            elif action == "pub":
                pieces = [MAGIC + command(f"PUB {topic}".encode(), b"m")]
                replies = [run_script(s.tcp_address, pieces).norm() for s in (pair.go, pair.py)]
            else:
                target = f"/{action}?topic={quote(topic)}&channel={quote(channel)}"
                replies = [
                    (r.status_line, r.body)
                    for r in (http_once(s.http_address, "POST", target) for s in (pair.go, pair.py))
                ]
            if replies[0] != replies[1]:
                divergences.append(f"{where}\n  reply:\n{diff_text(replies[0], replies[1])}")
            go, py = same_eventually(
                lambda: registrations(go_lookupd, pair.go),
                lambda: registrations(go_lookupd, pair.py),
            )
            if go != py:
                divergences.append(f"{where}\n  nsqlookupd's registrations:\n{diff_text(go, py)}")
                break  # from here on the registrations have parted
    finally:
        for conns in open_subs:
            for conn in conns:
                conn.close()
    assert not divergences, report(divergences)
