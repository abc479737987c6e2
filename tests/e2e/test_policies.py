"""Message policies over the wire (issue 14, docs/POLICIES.md): max attempts, dead-letter
topics, message TTL and bounded queues on a real nsqd, every message counted.

The invariant checked throughout: every message published is finished by a consumer or
lands in the dead-letter topic, exactly once (``sent == finished + dead-letter message_count``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_datadir_compat import http_base
from tests.support.procs import NSQD, ServerProcess, run_once
from tests.support.rawclient import RawClient, consumer

pytestmark = pytest.mark.timeout(60)


def call(server: ServerProcess, method: str, path: str, body: object = None) -> tuple[int, Any]:
    """An HTTP call to nsqd; the JSON reply (or the text) with the status."""
    base = http_base(server)
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    elif method == "POST":
        data = b""
    req = urllib.request.Request(f"{base}{path}", method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def set_policy(server: ServerProcess, topic: str, channel: str | None, policy: object) -> Any:
    path = (
        f"/channel/policy?topic={topic}&channel={channel}"
        if channel
        else f"/topic/policy?topic={topic}"
    )
    status, reply = call(server, "POST", path, policy)
    assert status == 200, reply
    return reply


def stats(server: ServerProcess) -> dict[str, dict[str, Any]]:
    """topic name → topic stats, with ``channels`` as a name → stats dict."""
    status, reply = call(server, "GET", "/stats?format=json&include_clients=false")
    assert status == 200, reply
    out = {}
    for t in reply["topics"] or []:
        t["channels"] = {c["channel_name"]: c for c in t["channels"]}
        out[t["topic_name"]] = t
    return out


def wait_until(check: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def topic_count(server: ServerProcess, topic: str) -> int:
    t = stats(server).get(topic)
    return int(t["message_count"]) if t else 0


# -- the mixed run: REQ loops, timeouts, TTL, overflow ------------------------------------------


@pytest.mark.parametrize("mem_queue_size", [0, 10000])
def test_every_message_is_finished_or_dead_lettered(
    nsqd_factory: Callable[..., ServerProcess], topic: str, mem_queue_size: int
) -> None:
    server = nsqd_factory(mem_queue_size=mem_queue_size)
    dl = f"{topic}_dl"
    reply = set_policy(
        server,
        topic,
        "c",
        {"max_attempts": 3, "dead_letter_topic": dl, "message_ttl": "2s", "max_depth": 40},
    )
    assert reply["effective"]["max_attempts"] == {"value": 3, "source": "channel"}
    sent = 60
    with RawClient(server.tcp_address) as pub:
        pub.mpub(topic, [b"%03d" % i for i in range(sent)])
    # no consumer yet: the 20 oldest overflowed
    wait_until(lambda: topic_count(server, dl) == 20, what="overflow to the dead-letter topic")
    ch = stats(server)[topic]["channels"]["c"]
    assert ch["depth"] == 40 and ch["overflow_count"] == 20

    finished: set[bytes] = set()
    c = consumer(server.tcp_address, topic, "c", rdy=20, msg_timeout=1000)
    try:
        deadline = time.monotonic() + 30
        while len(finished) + topic_count(server, dl) < sent:
            assert time.monotonic() < deadline, (len(finished), stats(server))
            msg = c.poll_message(0.3)
            if msg is None:
                continue
            n = int(msg.body)
            if n % 4 == 0:
                c.fin(msg.id)
                finished.add(msg.body)
            elif n % 4 == 1:
                c.req(msg.id)  # a REQ loop: dead-lettered after 3 deliveries
            elif n % 4 == 2 and msg.attempts >= 2:
                c.fin(msg.id)
                finished.add(msg.body)
            # n % 4 == 3 (and the first delivery of n % 4 == 2): let it time out
        c.nop()
    finally:
        c.close()
    final = stats(server)
    ch = final[topic]["channels"]["c"]
    assert len(finished) + final[dl]["message_count"] == sent
    assert (
        ch["dead_letter_count"] + ch["expired_count"] + ch["overflow_count"]
        == final[dl]["message_count"]
    )
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0, ch
    assert ch["dead_letter_count"] > 0 and ch["expired_count"] > 0, ch

    # the dead letters: same bodies, attempts from zero, none of the finished ones
    with consumer(server.tcp_address, dl, "replay", rdy=100) as replay:
        parked = replay.read_messages(final[dl]["message_count"], timeout=10)
        replay.expect_no_frame(0.3)
    bodies = {m.body for m in parked}
    assert len(bodies) == len(parked)
    assert not bodies & finished
    assert bodies | finished == {b"%03d" % i for i in range(sent)}
    assert all(m.attempts == 1 for m in parked)


def test_dead_letter_keeps_body_and_timestamp(nsqd: ServerProcess, topic: str) -> None:
    dl = f"{topic}_dl"
    set_policy(nsqd, topic, "c", {"max_attempts": 1, "dead_letter_topic": dl})
    with consumer(nsqd.tcp_address, topic, "c", rdy=1) as c:
        with RawClient(nsqd.tcp_address) as pub:
            pub.pub(topic, b"\x00binary\xff")
        first = c.read_message()
        c.req(first.id, 5000)  # even a deferred REQ: attempts are used up
        c.expect_no_frame(0.3)
    with consumer(nsqd.tcp_address, dl, "c", rdy=1) as c:
        parked = c.read_message()
    assert parked.body == first.body and parked.timestamp == first.timestamp
    assert parked.attempts == 1 and parked.id != first.id


def test_without_dead_letter_topic_messages_are_dropped_and_counted(
    nsqd: ServerProcess, topic: str
) -> None:
    set_policy(nsqd, topic, "c", {"max_depth": 2})
    with RawClient(nsqd.tcp_address) as pub:
        pub.mpub(topic, [b"a", b"b", b"c", b"d", b"e"])
    ch = stats(nsqd)[topic]["channels"]["c"]
    assert ch["depth"] == 2 and ch["overflow_count"] == 3
    with consumer(nsqd.tcp_address, topic, "c", rdy=5) as c:
        assert [m.body for m in c.read_messages(2)] == [b"d", b"e"]  # drop-head: newest kept
    nsqd.wait_for_log(r"WARNING: CHANNEL\(.*:c\): dropped 3 dead-lettered message\(s\)")


# -- TTL without consumers: memory, disk, deferred, topic backlog --------------------------------


@pytest.mark.parametrize("mem_queue_size", [0, 5])
def test_ttl_expires_what_nobody_reads(
    nsqd_factory: Callable[..., ServerProcess], topic: str, mem_queue_size: int
) -> None:
    server = nsqd_factory(mem_queue_size=mem_queue_size)
    dl = f"{topic}_dl"
    set_policy(server, topic, "c", {"message_ttl": "1s", "dead_letter_topic": dl})
    set_policy(server, topic, None, {"message_ttl": "1s"})
    with RawClient(server.tcp_address) as pub:
        pub.mpub(topic, [b"m%d" % i for i in range(50)])
        pub.dpub(topic, 10_000, b"deferred")
    before = stats(server)[topic]["channels"]["c"]
    assert before["depth"] == 50 and before["deferred_count"] == 1

    def drained() -> bool:
        ch = stats(server)[topic]["channels"]["c"]
        return ch["depth"] == 0 and ch["deferred_count"] == 0 and ch["backend_depth"] == 0

    wait_until(drained, timeout=8, what="the expired messages to leave the channel")
    ch = stats(server)[topic]["channels"]["c"]
    assert ch["expired_count"] == 51
    assert topic_count(server, dl) == 51


def test_ttl_empties_a_topic_without_channels(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    server = nsqd_factory(mem_queue_size=3, message_ttl="1s", dead_letter_topic_suffix="_dead")
    with RawClient(server.tcp_address) as pub:
        pub.mpub(topic, [b"x"] * 20)
    assert stats(server)[topic]["backend_depth"] == 17
    wait_until(lambda: stats(server)[topic]["depth"] == 0, timeout=8, what="the topic to drain")
    t = stats(server)[topic]
    assert t["expired_count"] == 20 and t["backend_depth"] == 0
    assert t["policy"]["message_ttl"] == "1s"
    # the dead-letter topic has no channel either: its own TTL (the flag) applies too
    assert stats(server)[f"{topic}_dead"]["message_count"] == 20


def test_ttl_checked_at_delivery(nsqd: ServerProcess, topic: str) -> None:
    set_policy(nsqd, topic, "c", {"message_ttl": "1s"})
    with RawClient(nsqd.tcp_address) as pub:
        pub.pub(topic, b"old")
        time.sleep(1.2)  # the message must age: nothing to await
        pub.pub(topic, b"new")
    with consumer(nsqd.tcp_address, topic, "c", rdy=2) as c:
        assert c.read_message().body == b"new"
        c.expect_no_frame(0.2)


# -- the HTTP API -----------------------------------------------------------------------------


def test_policy_http_api(nsqd_factory: Callable[..., ServerProcess], topic: str) -> None:
    server = nsqd_factory(max_attempts=7, dead_letter_topic_suffix="_dead")
    ch_path = f"/channel/policy?topic={topic}&channel=c"
    t_path = f"/topic/policy?topic={topic}"
    assert call(server, "GET", t_path) == (404, {"message": "TOPIC_NOT_FOUND"})
    # a POST creates what is missing, like /channel/create
    reply = set_policy(server, topic, "c", {"message_ttl": "90s"})
    assert reply["policy"] == {"message_ttl": "1m30s"}
    assert reply["effective"] == {
        "max_attempts": {"value": 7, "source": "flag"},
        "dead_letter_topic": {"value": f"{topic}_dead", "source": "flag"},
        "message_ttl": {"value": "1m30s", "source": "channel"},
        "max_depth": {"value": 0, "source": "default"},
    }
    assert "c" in stats(server)[topic]["channels"]
    set_policy(server, topic, None, {"max_depth": 100, "dead_letter_topic": "parking"})
    status, reply = call(server, "GET", ch_path)
    assert status == 200
    assert reply["effective"]["max_depth"] == {"value": 100, "source": "topic"}
    assert reply["effective"]["dead_letter_topic"] == {"value": "parking", "source": "topic"}
    # null clears one field, absent fields stay
    reply = set_policy(server, topic, "c", {"message_ttl": None, "max_attempts": 2})
    assert reply["policy"] == {"max_attempts": 2}

    bad: list[tuple[str, object, str]] = [
        (ch_path, b"{not json", "INVALID_BODY"),
        (ch_path, [1], "INVALID_BODY"),
        (ch_path, {"max_attempt": 1}, "UNKNOWN_FIELD"),
        (ch_path, {"max_attempts": -1}, "INVALID_MAX_ATTEMPTS"),
        (ch_path, {"max_attempts": "3"}, "INVALID_MAX_ATTEMPTS"),
        (ch_path, {"max_attempts": 70000}, "INVALID_MAX_ATTEMPTS"),
        (ch_path, {"max_depth": 1.5}, "INVALID_MAX_DEPTH"),
        (ch_path, {"message_ttl": "soon"}, "INVALID_MESSAGE_TTL"),
        (ch_path, {"message_ttl": "-1s"}, "INVALID_MESSAGE_TTL"),
        (ch_path, {"message_ttl": 5}, "INVALID_MESSAGE_TTL"),
        (ch_path, {"dead_letter_topic": topic}, "INVALID_DEAD_LETTER_TOPIC"),
        (ch_path, {"dead_letter_topic": "x#ephemeral"}, "INVALID_DEAD_LETTER_TOPIC"),
        (ch_path, {"dead_letter_topic": "bad name"}, "INVALID_DEAD_LETTER_TOPIC"),
        (ch_path, {"max_depth": 1, "dead_letter_topic": ""}, "INVALID_DEAD_LETTER_TOPIC"),
        (t_path, {"max_attempts": 3}, "UNKNOWN_FIELD"),
        (t_path, {"dead_letter_topic": topic}, "INVALID_DEAD_LETTER_TOPIC"),
        ("/topic/policy?topic=bad!", {}, "INVALID_TOPIC"),
        (f"/channel/policy?topic={topic}&channel=bad!", {}, "INVALID_ARG_CHANNEL"),
    ]
    for path, body, message in bad:
        assert call(server, "POST", path, body) == (400, {"message": message}), (path, body)
    # nothing changed, nothing created
    assert call(server, "GET", ch_path)[1]["policy"] == {"max_attempts": 2}
    assert "bad!" not in stats(server)
    # DELETE clears a level
    status, reply = call(server, "DELETE", ch_path)
    assert status == 200 and reply["policy"] == {}
    assert reply["effective"]["max_attempts"]["source"] == "flag"
    # ephemeral channels may have policies
    reply = set_policy(server, topic, "e#ephemeral", {"max_attempts": 1})
    assert reply["effective"]["max_attempts"]["source"] == "channel"


def test_stats_without_policies_unchanged(nsqd: ServerProcess, topic: str) -> None:
    with RawClient(nsqd.tcp_address) as pub:
        pub.pub(topic, b"x")
    call(nsqd, "POST", f"/channel/create?topic={topic}&channel=c")
    t = stats(nsqd)[topic]
    for entry in (t, t["channels"]["c"]):
        assert not {"policy", "expired_count", "overflow_count", "dead_letter_count"} & set(entry)
    _, text = call(nsqd, "GET", "/metrics")
    assert "dead_lettered" not in text and "expired_total" not in text


def test_stats_text_and_metrics_show_policies(nsqd: ServerProcess, topic: str) -> None:
    set_policy(nsqd, topic, "c", {"max_depth": 1})
    with RawClient(nsqd.tcp_address) as pub:
        pub.mpub(topic, [b"a", b"b", b"c"])
    _, text = call(nsqd, "GET", "/stats")
    assert "policy: max_attempts=0 dead_letter_topic= message_ttl=0s max_depth=1" in text
    assert "dead-lettered: 0 expired: 0 overflow: 2" in text
    _, text = call(nsqd, "GET", "/metrics")
    assert f'nsq_channel_overflowed_total{{topic="{topic}",channel="c"}} 2' in text


# -- persistence ----------------------------------------------------------------------------------


def test_policies_survive_restarts(
    nsqd_factory: Callable[..., ServerProcess], topic: str, tmp_path: Path
) -> None:
    data_path = tmp_path / "data"
    server = nsqd_factory(data_path=data_path)
    set_policy(server, topic, "c", {"max_attempts": 4, "dead_letter_topic": "parked"})
    set_policy(server, topic, None, {"message_ttl": "1h"})
    set_policy(server, topic, "e#ephemeral", {"max_depth": 5})
    # kept when the channel is paused, emptied, deleted and re-created by a consumer
    for op in ("pause", "empty", "delete"):
        assert call(server, "POST", f"/channel/{op}?topic={topic}&channel=c")[0] == 200
    consumer(server.tcp_address, topic, "c").close()
    assert server.stop() == 0
    with open(os.path.join(data_path, "nsqd.dat")) as f:
        meta = json.load(f)
    # nsqd.dat stays the Go nsqd's: the policies live in a side file it ignores
    assert set(meta["topics"][0]) == {"name", "paused", "channels"}
    assert os.path.exists(os.path.join(data_path, "nsqd.policies.dat"))

    again = nsqd_factory(data_path=data_path)
    status, reply = call(again, "GET", f"/channel/policy?topic={topic}&channel=c")
    assert status == 200
    assert reply["policy"] == {"max_attempts": 4, "dead_letter_topic": "parked"}
    assert reply["effective"]["message_ttl"] == {"value": "1h0m0s", "source": "topic"}
    # an ephemeral channel's policy is not persisted
    consumer(again.tcp_address, topic, "e#ephemeral").close()


def test_dead_letters_survive_a_graceful_restart(
    nsqd_factory: Callable[..., ServerProcess], topic: str, tmp_path: Path
) -> None:
    data_path = tmp_path / "data"
    server = nsqd_factory(data_path=data_path, mem_queue_size=0, sync_every=1)
    dl = f"{topic}_dl"
    set_policy(server, topic, "c", {"max_attempts": 1, "dead_letter_topic": dl})
    with RawClient(server.tcp_address) as pub:
        pub.mpub(topic, [b"%d" % i for i in range(10)])
    with consumer(server.tcp_address, topic, "c", rdy=10) as c:
        for m in c.read_messages(10):
            c.req(m.id)
        c.nop()
        wait_until(lambda: topic_count(server, dl) == 10, what="10 dead letters")
        # --sync-every=1: counted once the dead-letter topic's disk queue is synced
        wait_until(
            lambda: stats(server)[topic]["channels"]["c"]["dead_letter_count"] == 10,
            what="the dead letters to be counted",
        )
    assert server.stop() == 0
    again = nsqd_factory(data_path=data_path, mem_queue_size=0)
    with consumer(again.tcp_address, dl, "c", rdy=20) as c:
        got = sorted(int(m.body) for m in c.read_messages(10))
        c.expect_no_frame(0.3)
    assert got == list(range(10))
    assert stats(again)[topic]["channels"]["c"]["depth"] == 0


# -- flags -----------------------------------------------------------------------------------


def test_policy_flags() -> None:
    help_text = run_once(NSQD, ["--help"])
    for name in ("max-attempts", "message-ttl", "max-queue-depth", "dead-letter-topic-suffix"):
        assert f"-{name}" in help_text.stdout + help_text.stderr
    for args, message in (
        (["--max-attempts=-1"], "--max-attempts must be [0,65535]"),
        (["--max-queue-depth=-5"], "--max-queue-depth must be >= 0"),
        (["--message-ttl=-1s"], "--message-ttl must be >= 0"),
        (["--dead-letter-topic-suffix=/x"], "makes invalid topic names"),
        (["--dead-letter-topic-suffix=#ephemeral"], "makes invalid topic names"),
    ):
        result = run_once(NSQD, args)
        assert result.returncode != 0
        assert message in result.stderr + result.stdout, result
