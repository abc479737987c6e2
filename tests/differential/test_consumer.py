"""Generated consumer sessions, run in lockstep on Go's nsqd and nsqpy's.

A session: one or two consumers subscribe to a fresh topic's channel, a producer
publishes N messages (PUB, MPUB, sometimes a long DPUB), the consumers send RDY and take
what they are given, then FIN / REQ / TOUCH them by their index in the order received
(each server's own IDs), and a single consumer asks for more with a new RDY.

How many messages a step brings is NSQ's rule (RDY caps in-flight), worked out from
Go's own /stats where it depends on the state; the session waits for exactly that many
and ends each batch of acknowledgements with a PUB whose OK comes after every reply
before it, so nothing waits on a timer. Which of two consumers gets which message is
Go's choice, not a rule: with two consumers only the set of messages is compared.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any
from urllib.parse import quote

import pytest

from tests.differential.harness import (
    ERROR,
    HEARTBEAT,
    MAGIC,
    MESSAGE,
    RESPONSE,
    Frame,
    Pair,
    StatsWatch,
    TCPConn,
    command,
    diff_text,
    examples,
    get_json,
    http_once,
    mpub_payload,
    norm_channel,
    read_many,
    report,
    run_script,
    same_eventually,
    seed,
    stats_of,
)

SESSIONS = 30
DEFAULT_SEED = 7201
IDENTIFIES: tuple[dict[str, object] | None, ...] = (
    None,
    {},
    {"feature_negotiation": True},
    {"output_buffer_timeout": 25},
    {"output_buffer_size": -1},
    {"msg_timeout": 120_000, "user_agent": "differential/1.0"},
)
SUBSCRIBED = 3  # a client's state in /stats


class Divergence(Exception):
    pass


def channel_stats(server: Any, topic: str, channel: str) -> dict[str, Any] | None:
    query = f"/stats?format=json&topic={quote(topic)}&channel={quote(channel)}"
    for t in get_json(server.http_address, query).get("topics") or ():
        for c in t.get("channels") or ():
            if c.get("channel_name") == channel:
                return norm_channel(c)
    return None


def messages_of(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.type == MESSAGE]


def messages(conn: TCPConn) -> list[Frame]:
    return messages_of(conn.transcript.frames)


def replies_since(conn: TCPConn, start: int) -> list[tuple[object, ...]]:
    """The frames since ``start``, a message ID in an error's text (each server makes its
    own IDs) replaced by the message's index in the order received: ``<msg 0>``."""
    ids = [f.message_id for f in messages(conn)]
    out = []
    for frame in conn.transcript.frames[start:]:
        if frame.data == HEARTBEAT:
            continue
        norm = frame.norm()
        if frame.type == ERROR:
            text = frame.data
            for index, msg_id in enumerate(ids):
                text = text.replace(msg_id, b"<msg %d>" % index)
            norm = ("error", text)
        out.append(norm)
    return out


def consumers_merged(channel: dict[str, Any] | None) -> dict[str, Any] | None:
    """A channel's stats with its clients' counts added up: which of two consumers gets
    a message is Go's choice, the totals are not."""
    if channel is None or not isinstance(channel.get("clients"), list):
        return channel
    clients = channel["clients"]
    merged = {
        key: sum(c.get(key, 0) for c in clients)
        for key in ("ready_count", "in_flight_count", "message_count", "finish_count",
                    "requeue_count")
    }  # fmt: skip
    merged["states"] = sorted(c.get("state") for c in clients)
    return {**channel, "clients": merged}


class Session:
    """One session on both servers; every step is sent to Go first, then to nsqpy, and
    what came back is compared before the next step."""

    def __init__(
        self,
        pair: Pair,
        rng: random.Random,
        where: str,
        prefix: str,
        *,
        ephemeral: bool = True,
        deferred: bool = True,
    ) -> None:
        self.pair = pair
        self.deferred = deferred
        self.rng = rng
        self.where = where
        eph_topic, eph_channel = rng.random() < 0.1, rng.random() < 0.15
        self.topic = prefix + ("#ephemeral" if eph_topic and ephemeral else "")
        self.channel = "c#ephemeral" if eph_channel and ephemeral else "c"
        self.consumers: dict[str, list[TCPConn]] = {"go": [], "py": []}
        self.log: list[str] = []

    def servers(self) -> tuple[tuple[str, Any], tuple[str, Any]]:
        return (("go", self.pair.go), ("py", self.pair.py))

    def compare(self, what: str, go: object, py: object) -> None:
        if go != py:
            raise Divergence(f"{what}:\n{diff_text(go, py)}")

    def close(self) -> None:
        for conns in self.consumers.values():
            for conn in conns:
                conn.close()

    # -- steps --------------------------------------------------------------------------

    def run(self) -> None:
        rng = self.rng
        n_consumers = 2 if rng.random() < 0.25 else 1
        identify = IDENTIFIES[rng.randrange(len(IDENTIFIES))]
        hello = MAGIC
        if identify is not None:
            hello += command(b"IDENTIFY", json.dumps(identify).encode())
        hello += command(f"SUB {self.topic} {self.channel}".encode())
        self.log.append(f"subscribe {n_consumers} consumer(s): {hello!r}")
        seen = {}
        for name, server in self.servers():
            conns = [TCPConn(server.tcp_address) for _ in range(n_consumers)]
            self.consumers[name] = conns
            for conn in conns:
                conn.send(hello)
                conn.read_until(lambda frames: len(frames) >= (2 if identify is not None else 1))
            seen[name] = [replies_since(conn, 0) for conn in conns]
        self.compare("subscribe", seen["go"], seen["py"])

        # sometimes the channel or the topic is paused first: nothing is delivered
        pause = (
            rng.choice((None, None, None, None, "channel", "topic")) if n_consumers == 1 else None
        )
        if pause is not None:
            self.http(f"/{pause}/pause?topic={quote(self.topic)}&channel={quote(self.channel)}")

        # publish: the channel exists already, so every message reaches it
        bodies = [f"m{i}".encode() for i in range(rng.randint(0, 6))]
        pieces, rest = [MAGIC], list(bodies)
        while rest:
            take = rng.randint(1, len(rest))
            batch, rest = rest[:take], rest[take:]
            if take == 1 and rng.random() < 0.5:
                pieces.append(command(f"PUB {self.topic}".encode(), batch[0]))
            else:
                pieces.append(command(f"MPUB {self.topic}".encode(), mpub_payload(batch)))
        if rng.random() < 0.3 and self.deferred:
            pieces.append(command(f"DPUB {self.topic} 300000".encode(), b"deferred"))
        self.log.append(f"publish: {pieces!r}")
        self.compare(
            "publish",
            run_script(self.pair.go.tcp_address, pieces).norm(),
            run_script(self.pair.py.tcp_address, pieces).norm(),
        )

        # first RDY: min(sum of RDY, N) messages in all
        rdys = [rng.choice((0, 1, 2, 3, 10)) for _ in range(n_consumers)]
        self.ask_messages(rdys, 0 if pause else min(sum(rdys), len(bodies)), "first RDY")
        if pause is not None:
            self.compare_topic(f"with the {pause} paused")

        if n_consumers == 1:
            self.acknowledge()
        else:
            self.finish_all()
        self.compare_channel("after the acknowledgements")

        if pause is not None:  # RDY is 0 now: what the unpause releases stays in the channel
            self.http(f"/{pause}/unpause?topic={quote(self.topic)}&channel={quote(self.channel)}")
            self.compare_topic(f"after the {pause}'s unpause")

        if n_consumers == 1:
            self.ask_more(rng.choice((0, 1, 5)))

    def ask_messages(self, rdys: list[int], want: int, what: str) -> None:
        """Send each consumer its RDY; wait until ``want`` messages came in all."""
        self.log.append(f"{what}: RDY {rdys}, {want} message(s) expected")
        got = {}
        for name, _ in self.servers():
            conns = self.consumers[name]
            before = sum(len(messages(c)) for c in conns)
            for conn, rdy in zip(conns, rdys, strict=True):
                conn.send(b"RDY %d\n" % rdy)
            target = before + want
            read_many(conns, lambda conns=conns, n=target: sum(map(len, map(messages, conns))) >= n)
            new = [f.norm() for c in conns for f in messages(c)][before:]
            # one consumer: in order; two: which one gets which is Go's choice
            got[name] = new if len(conns) == 1 else sorted(new, key=repr)
        self.compare(what, got["go"], got["py"])

    def acknowledge(self) -> None:
        """RDY 0 (nothing more is sent meanwhile), FIN/REQ/TOUCH by index, the sentinel."""
        rng = self.rng
        ops: list[tuple[str, int | None, str]] = []  # (command, message index, argument)
        for _ in range(rng.randint(0, 5)):
            index = rng.randrange(8) if rng.random() < 0.85 else None  # None: an unknown ID
            cmd = rng.choice(("FIN", "FIN", "REQ", "TOUCH"))
            arg = rng.choice(("0", "300000", "99999999", "0", "-1")) if cmd == "REQ" else ""
            ops.append((cmd, index, arg))
        if rng.random() < 0.1:
            ops.append(("CLS", None, ""))
        self.log.append(f"acknowledge: {ops!r} (index: of the messages received)")
        seen = {}
        for name, _ in self.servers():
            conn = self.consumers[name][0]
            ids = [f.message_id for f in messages(conn)]
            data = b"RDY 0\n"
            for cmd, index, arg in ops:
                if cmd == "CLS":
                    data += b"CLS\n"
                    continue
                msg_id = ids[index % len(ids)] if index is not None and ids else b"f" * 16
                data += f"{cmd} ".encode() + msg_id + (f" {arg}".encode() if arg else b"") + b"\n"
            data += command(f"PUB {self.topic.split('#')[0]}_end".encode(), b"end")  # sentinel
            start = len(conn.transcript.frames)
            conn.send(data)
            conn.read_until(
                lambda frames, start=start: any(
                    f.type == RESPONSE and f.data == b"OK" for f in frames[start:]
                )
            )
            seen[name] = {"replies": replies_since(conn, start), "closed": conn.transcript.closed}
        self.compare("acknowledgements", seen["go"], seen["py"])

    def finish_all(self) -> None:
        """Two consumers: each FINs what it got (no reply), then the sentinel."""
        for name, _ in self.servers():
            for conn in self.consumers[name]:
                data = b"".join(b"FIN " + f.message_id + b"\n" for f in messages(conn))
                start = len(conn.transcript.frames)
                conn.send(data + command(f"PUB {self.topic.split('#')[0]}_end".encode(), b"e"))
                conn.read_until(
                    lambda frames, start=start: any(f.type == RESPONSE for f in frames[start:])
                )

    def ask_more(self, rdy: int) -> None:
        """A new RDY: as many messages as it leaves room for, of those in the channel."""
        deadline = time.monotonic() + 2.0
        while True:  # what Go's topic holds reaches the channel asynchronously
            topics = stats_of(self.pair.go, f"&topic={quote(self.topic)}")["topics"] or []
            if not topics or topics[0]["depth"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        go_channel = channel_stats(self.pair.go, self.topic, self.channel)
        conn = self.consumers["go"][0]
        if go_channel is None or conn.transcript.closed:
            return
        clients = go_channel["clients"]
        if len(clients) != 1 or clients[0]["state"] != SUBSCRIBED:
            return  # closing (CLS): RDY is ignored
        want = max(0, min(rdy - clients[0]["in_flight_count"], go_channel["depth"]))
        self.ask_messages([rdy], want, "second RDY")
        self.compare_channel("after the second RDY")

    def http(self, target: str) -> None:
        """POST ``target`` to both servers; the replies compared."""
        self.log.append(f"POST {target}")
        replies = [http_once(s.http_address, "POST", target) for _, s in self.servers()]
        go, py = ((r.status_line, r.body) for r in replies)
        self.compare(f"POST {target}", go, py)

    def compare_topic(self, what: str) -> None:
        """The topic's /stats, channels and clients included, once both have settled."""
        query = f"&topic={quote(self.topic)}"
        go, py = same_eventually(
            lambda: stats_of(self.pair.go, query), lambda: stats_of(self.pair.py, query)
        )
        self.compare(f"topic /stats {what}", go, py)

    def compare_channel(self, what: str) -> None:
        def fetch(server: Any) -> dict[str, Any] | None:
            channel = channel_stats(server, self.topic, self.channel)
            return consumers_merged(channel) if len(self.consumers["go"]) > 1 else channel

        go, py = same_eventually(lambda: fetch(self.pair.go), lambda: fetch(self.pair.py))
        self.compare(f"channel /stats {what}", go, py)


@pytest.fixture(scope="module")
def stats_watch(pair: Pair) -> StatsWatch:
    return StatsWatch(pair)


def run_sessions(
    pair: Pair, stats_watch: StatsWatch, case_seed: int, count: int, **options: bool
) -> list[str]:
    """``count`` sessions on ``pair`` (``options``: Session's); the divergences found."""
    divergences: list[str] = []
    for number in range(count):
        # a generator per session: one that stops early leaves the next ones as they were
        rng = random.Random(case_seed * 1_000_003 + number)
        where = f"seed {case_seed} session {number}"
        session = Session(pair, rng, where, f"cs{case_seed}_{number}", **options)
        try:
            session.run()
        except Divergence as err:
            steps = "\n    ".join(session.log)
            divergences.append(f"{where}: {err}\n  steps:\n    {steps}")
        finally:
            session.close()
        stats_diff = stats_watch.check()
        if stats_diff is not None:
            divergences.append(f"{where}\n  /stats after it:\n{stats_diff}")
        if len(divergences) >= 10:
            break
    return divergences


def test_generated_consumer_sessions(pair: Pair, stats_watch: StatsWatch) -> None:
    divergences = run_sessions(pair, stats_watch, seed(DEFAULT_SEED), examples(SESSIONS))
    assert not divergences, report(divergences)


# -- fixed examples -----------------------------------------------------------------------


def deliver_two_finish_one(pair: Pair, topic: str) -> None:
    """SUB, MPUB of two, RDY 2, FIN the first: the frames and the channel's /stats."""
    got: dict[str, Any] = {}
    for name, server in pair.both():
        consumer = TCPConn(server.tcp_address)
        try:
            consumer.send(MAGIC + command(f"SUB {topic} c".encode()))
            consumer.read_until(lambda frames: len(frames) >= 1)
            publish = command(f"MPUB {topic}".encode(), mpub_payload([b"a", b"b"]))
            run_script(server.tcp_address, [MAGIC + publish])
            consumer.send(b"RDY 2\n")
            consumer.read_until(lambda frames: len(messages_of(frames)) >= 2)
            first = messages_of(consumer.transcript.frames)[0]
            sentinel = command(f"PUB {topic}_end".encode(), b"e")
            consumer.send(b"FIN " + first.message_id + b"\n" + sentinel)
            consumer.read_until(lambda frames: frames[-1].data == b"OK" and len(frames) >= 4)
            got[name] = {
                "frames": [f.norm() for f in consumer.transcript.frames],
                "channel": channel_stats(server, topic, "c"),
            }
        finally:
            consumer.close()
    assert got["py"] == got["go"], diff_text(got["go"], got["py"])


def test_delivery_counts_in_stats(fresh_pair: Pair) -> None:
    """Found: after deliveries nsqpy's /stats carried a non-zero ``global_msg_count``
    (a topology-aware counter; the client's at 50786ea), which Go only counts with the
    topology experiment on, so leaves at zero and omits. (With the disk queue:
    test_disk_queue.py.)"""
    deliver_two_finish_one(fresh_pair, "delivered")
