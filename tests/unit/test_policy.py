"""Message policies in the socket-free engine (nsqpy/nsqd/policy.py): parsing and
validation, channel > topic > flag resolution, and the decisions at each hook."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import nsqpy.nsqd.topic as topic_mod
from nsqpy.nsqd.message import to_payload
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options, parse_nsqd_args, validate
from nsqpy.nsqd.policy import Policy, PolicyBook, PolicyError, stats_fields, stats_text
from nsqpy.nsqd.stats import get_stats
from nsqpy.nsqd.statsd import statsd_lines
from tests.unit.test_engine import ListBackend, make_nsqd, packed, req, subscribe

# -- parsing ---------------------------------------------------------------------------------


def test_update_keeps_absent_fields_and_null_clears() -> None:
    p = Policy().updated(b'{"max_attempts": 5, "message_ttl": "90s"}', "t", channel=True)
    assert p == Policy(max_attempts=5, message_ttl=90 * 10**9)
    p = p.updated(b'{"message_ttl": null, "max_depth": 10}', "t", channel=True)
    assert p == Policy(max_attempts=5, max_depth=10)
    assert p.to_json() == {"max_attempts": 5, "max_depth": 10}
    assert Policy(message_ttl=3600 * 10**9).to_json() == {"message_ttl": "1h0m0s"}
    assert Policy().updated(b'{"message_ttl": 0}', "t", channel=False) == Policy(message_ttl=0)


@pytest.mark.parametrize(
    ("body", "channel", "code"),
    [
        (b"", True, "INVALID_BODY"),
        (b"\xff", True, "INVALID_BODY"),
        (b"null", True, "INVALID_BODY"),
        (b'"x"', True, "INVALID_BODY"),
        (b'{"other": 1}', True, "UNKNOWN_FIELD"),
        (b'{"max_attempts": 1}', False, "UNKNOWN_FIELD"),
        (b'{"max_attempts": true}', True, "INVALID_MAX_ATTEMPTS"),
        (b'{"max_attempts": 65536}', True, "INVALID_MAX_ATTEMPTS"),
        (b'{"max_depth": -1}', False, "INVALID_MAX_DEPTH"),
        (b'{"max_depth": 9223372036854775808}', False, "INVALID_MAX_DEPTH"),
        (b'{"message_ttl": "1"}', True, "INVALID_MESSAGE_TTL"),
        (b'{"message_ttl": []}', True, "INVALID_MESSAGE_TTL"),
        (b'{"dead_letter_topic": "t"}', True, "INVALID_DEAD_LETTER_TOPIC"),
        (b'{"dead_letter_topic": 3}', True, "INVALID_DEAD_LETTER_TOPIC"),
        (b'{"dead_letter_topic": "' + b"a" * 65 + b'"}', True, "INVALID_DEAD_LETTER_TOPIC"),
    ],
)
def test_bad_updates_are_refused(body: bytes, channel: bool, code: str) -> None:
    with pytest.raises(PolicyError) as err:
        Policy(max_attempts=1).updated(body, "t", channel=channel)
    assert str(err.value) == code


# -- resolution ------------------------------------------------------------------------------


def test_channel_over_topic_over_flag() -> None:
    nsqd, _ = make_nsqd(max_attempts=9, max_queue_depth=50, dead_letter_topic_suffix="_dead")
    book = nsqd.policies
    eff = book.effective("t", "c")
    assert (eff.max_attempts, eff.dead_letter_topic, eff.ttl_ns, eff.max_depth) == (
        9,
        "t_dead",
        0,
        50,
    )
    assert eff.sources == {
        "max_attempts": "flag",
        "dead_letter_topic": "flag",
        "message_ttl": "default",
        "max_depth": "flag",
    }
    book.topics["t"] = Policy(max_depth=5, message_ttl=10**9, dead_letter_topic="park")
    book.channels[("t", "c")] = Policy(max_depth=0, max_attempts=2)
    eff = book.effective("t", "c")
    assert (eff.max_attempts, eff.dead_letter_topic, eff.ttl_ns, eff.max_depth) == (
        2,
        "park",
        10**9,
        0,
    )
    assert eff.sources["max_depth"] == "channel" and eff.sources["message_ttl"] == "topic"
    # a topic has no max_attempts; the suffix is not applied when it makes a bad name
    assert book.effective("t", None).max_attempts == 0
    assert book.effective("a" * 60, None).dead_letter_topic == ""


def test_nothing_configured_costs_nothing() -> None:
    nsqd, _ = make_nsqd()
    ch, _ = subscribe(nsqd, "t", "c")
    assert ch.policy is None and nsqd.topics["t"].policy is None
    assert stats_fields(ch, channel=True) == {}
    topics = get_stats(nsqd, include_clients=False)["topics"] or []
    assert "policy" not in topics[0] and "expired_count" not in topics[0]["channels"][0]


# -- decisions -------------------------------------------------------------------------------


def _set(nsqd: NSQD, topic: str, channel: str | None, **fields: object) -> None:
    nsqd.policies.set(topic, channel, Policy(**fields))  # type: ignore[arg-type]


def test_max_attempts_dead_letters_on_req_and_timeout() -> None:
    nsqd, _ = make_nsqd()
    _set(nsqd, "t", "c", max_attempts=2, dead_letter_topic="dl")
    ch, consumer = subscribe(nsqd, "t", "c", ready=2, msg_timeout=10.0)
    nsqd.get_topic("t").put_messages([b"a", b"b"])
    assert consumer.bodies == [b"a", b"b"]
    req(ch, consumer, consumer.received[0][0], 0)  # a: attempt 1 comes back, goes again
    assert consumer.bodies == [b"a", b"b", b"a"]
    nsqd.queue_scan(time.monotonic() + 100)  # a (attempt 2) is dead-lettered, b goes again
    assert consumer.bodies == [b"a", b"b", b"a", b"b"]
    nsqd.queue_scan(time.monotonic() + 200)  # b (attempt 2) is dead-lettered
    dl = nsqd.topics["dl"]
    assert dl.message_count == 2 and ch.depth == 0 and ch.in_flight_count == 0
    assert ch.policy_counts is not None and ch.policy_counts.dead_letter_count == 2
    assert ch.requeue_count == 1 and ch.timeout_count == 3


def test_overflow_drops_head_memory_then_backend() -> None:
    nsqd, _ = make_nsqd(backend_factory=lambda name: ListBackend(), mem_queue_size=2)
    _set(nsqd, "t", "c", max_depth=3, dead_letter_topic="dl")
    nsqd.get_topic("t").get_channel("c")
    nsqd.get_topic("t").put_messages([b"%d" % i for i in range(6)])
    ch = nsqd.topics["t"].channels["c"]
    assert ch.depth == 3 and ch.policy_counts is not None and ch.policy_counts.overflow_count == 3
    assert nsqd.topics["dl"].message_count == 3
    backend = ch._backend
    assert isinstance(backend, ListBackend)
    assert [m[3] for m in ch._memory] + [r[26:] for r in backend.records] == [b"3", b"4", b"5"]


def test_ttl_sweep_reads_expired_heads_off_the_backend() -> None:
    nsqd, _ = make_nsqd(backend_factory=lambda name: ListBackend(), mem_queue_size=0)
    _set(nsqd, "t", "c", message_ttl=10**9)
    ch = nsqd.get_topic("t").get_channel("c")
    old = time.time_ns() - 5 * 10**9
    backend = ch._backend
    assert isinstance(backend, ListBackend)
    backend.put_many([to_payload((b"%016d" % i, old, 0, b"old")) for i in range(100)])
    backend.put(to_payload((b"%016d" % 100, time.time_ns(), 0, b"new")))
    nsqd.queue_scan(time.monotonic())
    assert ch.depth == 1 and ch._memory[0][3] == b"new"
    assert ch.policy_counts is not None and ch.policy_counts.expired_count == 100
    assert stats_text(stats_fields(ch, channel=True)).endswith("expired: 100 overflow: 0")


@pytest.mark.parametrize("where", ["channel", "topic"])
def test_ttl_sweep_keeps_a_restored_deferral(where: str) -> None:
    """A message deferred at the last exit and read back by the TTL sweep is deferred again
    (as a delivery's read does), not handed out at once; its restore entry is freed."""
    nsqd, _ = make_nsqd(backend_factory=lambda name: ListBackend(), message_ttl=3600.0)
    topic = nsqd.get_topic("t")
    owner = topic if where == "topic" else topic.get_channel("c")
    backend = owner._backend
    assert isinstance(backend, ListBackend)
    msg_id = b"%016d" % 7
    backend.put(to_payload((msg_id, time.time_ns(), 0, b"later")))
    owner.redefer = {msg_id: time.time_ns() + 60 * 10**9}
    nsqd.queue_scan(time.monotonic())
    assert owner.redefer is None  # the restore entry was used, and freed
    if where == "channel":
        assert isinstance(owner, topic_mod.Channel)
        assert owner.deferred_count == 1 and owner.depth == 0
        return
    # the topic keeps it as a deferred backlog entry; its first channel defers it
    ch = topic.get_channel("c")
    nsqd.run_pending()
    assert ch.deferred_count == 1 and ch.depth == 0


def test_dead_letter_ping_pong_is_bounded() -> None:
    # two full queues dead-lettering to each other must not recurse for ever
    nsqd, _ = make_nsqd(mem_queue_size=10)
    _set(nsqd, "a", "c", max_depth=1, dead_letter_topic="b")
    _set(nsqd, "b", "c", max_depth=1, dead_letter_topic="a")
    nsqd.get_topic("a").get_channel("c")
    nsqd.get_topic("b").get_channel("c")
    for _ in range(5):
        nsqd.get_topic("a").put_messages([b"x", b"y"])
    assert nsqd.topics["a"].channels["c"].depth == 1
    assert nsqd.topics["b"].channels["c"].depth == 1


# -- persistence -------------------------------------------------------------------------------


def test_side_file_round_trip_skips_what_is_invalid(tmp_path: Path) -> None:
    opts = Options(data_path=str(tmp_path))
    nsqd = NSQD(opts, use_disk=True)
    nsqd.policies.set("t", "c", Policy(max_attempts=3, message_ttl=10**9))
    nsqd.policies.set("t", None, Policy(max_depth=7))
    nsqd.policies.set("t", "e#ephemeral", Policy(max_depth=1))
    raw = json.loads((tmp_path / "nsqd.policies.dat").read_bytes())
    assert raw["channels"] == {"t:c": {"max_attempts": 3, "message_ttl": "1s"}}
    raw["channels"]["t:bad"] = {"max_attempts": "x"}
    (tmp_path / "nsqd.policies.dat").write_text(json.dumps(raw))
    book = PolicyBook(NSQD(opts, use_disk=True))
    book.load()
    assert book.channels == {("t", "c"): Policy(max_attempts=3, message_ttl=10**9)}
    assert book.topics == {"t": Policy(max_depth=7)}
    nsqd.close()


def test_topic_backlog_overflow_and_used_up_attempts_at_delivery() -> None:
    nsqd, _ = make_nsqd(mem_queue_size=100)
    _set(nsqd, "t", None, max_depth=2, dead_letter_topic="dl")
    topic = nsqd.get_topic("t")  # no channel: messages wait in the topic
    topic.put_messages([b"a", b"b", b"c"])
    assert topic.depth == 2 and topic.policy_counts is not None
    assert topic.policy_counts.overflow_count == 1 and nsqd.topics["dl"].message_count == 1
    topic.put_messages([b"d"], 10.0)  # a DPUB waiting in the topic counts too
    assert topic.depth == 2 and topic.policy_counts.overflow_count == 2
    # a message read back from disk after an exit with its attempts used up
    _set(nsqd, "u", "c", max_attempts=3, dead_letter_topic="dl")
    ch, consumer = subscribe(nsqd, "u", "c")
    ch.enqueue(
        [
            (b"%016d" % 1, time.time_ns(), 3, b"used"),
            (b"%016d" % 2, time.time_ns(), 2, b"one left"),
            (b"%016d" % 3, time.time_ns(), -1, b"wrapped"),
        ],
        3,
    )
    consumer.ready_count = 5
    ch.dispatch()
    assert consumer.bodies == [b"one left"]
    assert ch.policy_counts is not None and ch.policy_counts.dead_letter_count == 2


def test_statsd_counts_policy_deltas() -> None:
    nsqd, _ = make_nsqd()
    _set(nsqd, "t", "c", max_depth=1)
    nsqd.get_topic("t").get_channel("c")
    before = get_stats(nsqd, include_clients=False)["topics"] or []
    nsqd.get_topic("t").put_messages([b"a", b"b", b"c"])
    after = get_stats(nsqd, include_clients=False)["topics"] or []
    lines = [line.decode() for line in statsd_lines("p.", after, before, None, None)]
    assert "p.topic.t.channel.c.overflow_count:2|c\n" in lines
    assert "p.topic.t.channel.c.dead_letter_count:0|c\n" in lines


def test_flags_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "nsqd.cfg"
    config.write_text(
        'max_attempts = 4\nmessage_ttl = "1h"\nmax_queue_depth = 10\n'
        'dead_letter_topic_suffix = "_dead"\n'
    )
    opts = parse_nsqd_args([f"--config={config}"]).options
    validate(opts)
    assert (opts.max_attempts, opts.message_ttl, opts.max_queue_depth) == (4, 3600.0, 10)
    nsqd = NSQD(opts)
    ch = nsqd.get_topic("t").get_channel("c")
    assert ch.policy is not None and ch.policy.dead_letter_topic == "t_dead"
    # the dead-letter topic knows where its messages come from before any arrives
    dead = nsqd.get_topic("t_dead")
    assert stats_fields(dead, channel=False)["dead_letter_sources"] == ["t", "t:c"]


# -- MPUB runs (message.py): policies count and cut messages inside a run ------------------------


def test_max_depth_drops_the_head_of_a_run() -> None:
    nsqd, _ = make_nsqd()
    _set(nsqd, "t", "c", max_depth=3, dead_letter_topic="dl")
    ch = nsqd.get_topic("t").get_channel("c")
    nsqd.get_topic("t").put_messages(packed([b"%d" % i for i in range(5)]))
    assert ch.depth == 3 and ch.policy_counts is not None and ch.policy_counts.overflow_count == 2
    assert [m[3] for m in ch.peek(10)] == [b"2", b"3", b"4"]
    assert nsqd.topics["dl"].message_count == 2
    _, consumer = subscribe(nsqd, "t", "c", ready=10)
    assert consumer.bodies == [b"2", b"3", b"4"]


def test_ttl_sweep_expires_whole_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    class Past:
        @staticmethod
        def time_ns() -> int:
            return time.time_ns() - 5 * 10**9

    nsqd, _ = make_nsqd()
    _set(nsqd, "t", None, message_ttl=10**9)
    _set(nsqd, "t", "c", message_ttl=10**9)
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    monkeypatch.setattr(topic_mod, "time", Past)
    topic.put_messages(packed([b"old1", b"old2", b"old3"]))
    topic.put_messages([b"old4"])
    monkeypatch.undo()
    topic.put_messages(packed([b"new1", b"new2"]))
    backlog = nsqd.get_topic("u")  # no channel: the runs wait in the topic
    _set(nsqd, "u", None, message_ttl=10**9)
    monkeypatch.setattr(topic_mod, "time", Past)
    backlog.put_messages(packed([b"old1", b"old2"]))
    monkeypatch.undo()
    backlog.put_messages(packed([b"new1"]))
    nsqd.queue_scan(time.monotonic())
    assert ch.depth == 2 and [m[3] for m in ch.peek(5)] == [b"new1", b"new2"]
    assert ch.policy_counts is not None and ch.policy_counts.expired_count == 4
    assert backlog.depth == 1 and backlog.policy_counts is not None
    assert backlog.policy_counts.expired_count == 2
