"""The socket-free nsqd engine: topics, channels, delivery, timeouts (spec §2.5, §7.1-7.4, §7.8).

A FakeConsumer stands in for a subscribed TCP client; the tests do what the server
does around it (SUB → add_client, RDY → ready_count + dispatch, FIN → finish +
dispatch...) and drive time through a fake monotonic clock and queue_scan(now).
"""

from __future__ import annotations

import io
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import nsqpy.nsqd.channel as channel_mod
import nsqpy.nsqd.nsqd as nsqd_mod
from nsqpy.common.log import Logger
from nsqpy.nsqd.backend import BackendError, DummyBackend, RefusingBackend
from nsqpy.nsqd.channel import Channel, ChannelError, Consumer, InFlight, delivery
from nsqpy.nsqd.message import Message, requeued
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.topic import Topic
from nsqpy.wire.v2 import FRAME_TYPE_MESSAGE, FrameParser, MPubBody, decode_message

# -- fixtures and helpers ---------------------------------------------------------------------------


class FakeConsumer:
    """Implements channel.Consumer; decodes the frames it is sent with FrameParser."""

    def __init__(self, ready: int = 0, msg_timeout: float = 60.0, sample_rate: int = 0) -> None:
        self.ready_count = ready
        self.in_flight: dict[bytes, InFlight] = {}
        self.irregular_in_flight = False
        self.msg_timeout = msg_timeout
        self.sample_rate = sample_rate
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.closed = False
        self.received: list[Message] = []
        self._frames = FrameParser()

    def send_messages(self, frames: list[bytes], count: int, nbytes: int) -> None:
        assert nbytes == sum(map(len, frames))
        got = self._frames.feed(b"".join(frames))
        assert len(got) == count
        for frame_type, payload in got:
            assert frame_type == FRAME_TYPE_MESSAGE
            self.received.append(decode_message(payload))

    def close_for_exit(self) -> None:
        self.closed = True

    @property
    def bodies(self) -> list[bytes]:
        return [m[3] for m in self.received]

    @property
    def last_id(self) -> bytes:
        return self.received[-1][0]


def _is_consumer(c: Consumer) -> Consumer:
    return c


_is_consumer(FakeConsumer())  # FakeConsumer satisfies the Consumer protocol (checked by mypy)


class FakeClock:
    """Replaces the `time` module inside nsqpy.nsqd.channel: a hand-driven monotonic clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return time.time_ns()


class ListBackend:
    """An in-memory stand-in for the disk queue."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.deleted = False
        self.closed = False

    def put(self, data: bytes) -> None:
        self.records.append(data)

    def put_many(self, datas: Sequence[bytes]) -> None:
        self.records.extend(datas)

    def read_many(self, max_count: int) -> list[bytes]:
        out, self.records = self.records[:max_count], self.records[max_count:]
        return out

    def depth(self) -> int:
        return len(self.records)

    def empty(self) -> None:
        self.records.clear()

    def close(self) -> None:
        self.closed = True

    def delete(self) -> None:
        self.deleted = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock(1000.0)
    monkeypatch.setattr(channel_mod, "time", c)
    return c


def make_nsqd(
    backend_factory: Callable[[str], Any] | None = None, **opts: Any
) -> tuple[NSQD, list[str]]:
    log = io.StringIO()
    nsqd = NSQD(Options(**opts), logger=Logger("", stream=log), backend_factory=backend_factory)
    wakeups: list[str] = []
    nsqd.wakeup = lambda: wakeups.append("wakeup")
    return nsqd, wakeups


def nsqd_with_list_backends(**opts: Any) -> tuple[NSQD, dict[str, ListBackend]]:
    """An engine whose durable topics and channels spill to ListBackends, by name."""
    backends: dict[str, ListBackend] = {}

    def factory(name: str) -> ListBackend:
        return backends.setdefault(name, ListBackend())

    return make_nsqd(backend_factory=factory, **opts)[0], backends


def subscribe(
    nsqd: NSQD, topic: str, channel: str, ready: int = 0, **kw: Any
) -> tuple[Channel, FakeConsumer]:
    """SUB then RDY, as the server does."""
    ch = nsqd.get_topic(topic).get_channel(channel)
    consumer = FakeConsumer(**kw)
    ch.add_client(consumer)
    rdy(ch, consumer, ready)
    return ch, consumer


def rdy(ch: Channel, consumer: FakeConsumer, count: int) -> None:
    consumer.ready_count = count
    ch.dispatch()


def fin(ch: Channel, consumer: FakeConsumer, msg_id: bytes) -> None:
    ch.finish(consumer, msg_id)
    ch.dispatch()


def req(ch: Channel, consumer: FakeConsumer, msg_id: bytes, delay: float) -> None:
    ch.requeue(consumer, msg_id, delay)
    ch.dispatch()


def pub(topic: Topic, *bodies: bytes) -> None:
    """PUB one body, MPUB several (queued as a run, as a TCP MPUB is)."""
    if len(bodies) == 1:
        topic.put_messages(list(bodies))
    else:
        topic.put_messages(packed(bodies))


def packed(bodies: Sequence[bytes]) -> MPubBody:
    return (b"".join(len(b).to_bytes(4, "big") + b for b in bodies), len(bodies))


def scan_at(nsqd: NSQD, clock: FakeClock, when: float) -> int:
    """Time moves to `when`, then one queue scan tick runs (as the server's timer does)."""
    clock.now = when
    return nsqd.queue_scan(when)


def msg(i: int, body: bytes = b"x") -> Message:
    return (b"%016x" % i, time.time_ns(), 0, body)


# -- topic fan-out and backlog ----------------------------------------------------------------------


def test_topic_fans_out_to_every_channel(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    c1, a = subscribe(nsqd, "t", "c1", ready=10)
    c2, b = subscribe(nsqd, "t", "c2", ready=10)
    topic = nsqd.get_topic("t")
    pub(topic, b"one")
    pub(topic, b"two", b"three")
    assert a.bodies == b.bodies == [b"one", b"two", b"three"]
    assert [m[0] for m in a.received] == [m[0] for m in b.received]  # the same message IDs
    assert all(m[2] == 1 for m in a.received + b.received)  # attempts 1 on first delivery
    assert topic.message_count == 3
    assert topic.message_bytes == 11
    assert c1.message_count == c2.message_count == 3
    assert a.message_count == b.message_count == 3
    assert c1.in_flight_count == c2.in_flight_count == 3


def test_timestamp_is_publish_time_in_ns(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    _, a = subscribe(nsqd, "t", "c", ready=1)
    before = time.time_ns()
    pub(nsqd.get_topic("t"), b"x")
    after = time.time_ns()
    assert before <= a.received[0][1] <= after


def test_topic_without_channels_keeps_messages(clock: FakeClock) -> None:
    nsqd, wakeups = make_nsqd()
    topic = nsqd.get_topic("t")
    pub(topic, b"a")
    pub(topic, b"b", b"c")
    assert topic.depth == 3
    assert topic.message_count == 3
    assert wakeups == []  # nothing to pump into
    ch = topic.get_channel("c")
    assert ch.depth == 0  # not yet moved
    assert wakeups == ["wakeup"]
    assert nsqd.run_pending() is False
    assert topic.depth == 0
    assert ch.depth == 3
    assert ch.message_count == 3
    # the topic now flows: later publishes reach the channel without a pump
    pub(topic, b"d")
    assert ch.depth == 4
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 10)
    assert consumer.bodies == [b"a", b"b", b"c", b"d"]


def test_backlog_pumped_in_order_with_publishes_in_between(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    pub(topic, b"1", b"2")
    _ch, consumer = subscribe(nsqd, "t", "c", ready=100)
    pub(topic, b"3")  # backlog still pending: goes behind it
    assert consumer.bodies == []
    nsqd.run_pending()
    pub(topic, b"4")
    assert consumer.bodies == [b"1", b"2", b"3", b"4"]


def test_large_backlog_pumped_in_bounded_steps(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=30_000)
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(25_000)])
    ch = topic.get_channel("c")
    steps = 0
    while nsqd.run_pending():
        steps += 1
        assert steps < 100
    assert steps >= 2  # more than one PUMP_BUDGET's worth
    assert ch.depth == 25_000
    assert topic.depth == 0


def test_paused_topic_holds_messages(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=10)
    topic = nsqd.get_topic("t")
    topic.pause()
    assert topic.paused
    pub(topic, b"a", b"b")
    nsqd.run_pending()
    assert consumer.bodies == []
    assert topic.depth == 2
    assert ch.depth == 0
    topic.unpause()
    nsqd.run_pending()
    assert consumer.bodies == [b"a", b"b"]
    assert topic.depth == 0
    pub(topic, b"c")
    assert consumer.bodies == [b"a", b"b", b"c"]


def test_paused_channel_holds_messages(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=10)
    _other, other_consumer = subscribe(nsqd, "t", "other", ready=10)
    ch.pause()
    topic = nsqd.get_topic("t")
    pub(topic, b"a", b"b")
    rdy(ch, consumer, 10)
    assert consumer.bodies == []
    assert ch.depth == 2
    assert other_consumer.bodies == [b"a", b"b"]  # only that channel is paused
    ch.unpause()
    assert consumer.bodies == [b"a", b"b"]
    assert ch.depth == 0


# -- delivery: RDY, round robin ---------------------------------------------------------------------


def test_rdy_is_an_in_flight_cap(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=0)
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(6)])
    assert consumer.received == []  # a new subscription starts at RDY 0
    rdy(ch, consumer, 2)
    assert consumer.bodies == [b"0", b"1"]
    assert ch.in_flight_count == 2
    assert ch.depth == 4
    rdy(ch, consumer, 2)  # RDY is not a counter: re-sending it delivers nothing more
    assert len(consumer.received) == 2
    fin(ch, consumer, consumer.received[0][0])
    assert consumer.bodies == [b"0", b"1", b"2"]
    assert len(consumer.in_flight) == 2
    rdy(ch, consumer, 0)
    fin(ch, consumer, consumer.received[1][0])
    assert len(consumer.received) == 3
    rdy(ch, consumer, 100)
    assert consumer.bodies == [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert ch.depth == 0
    assert consumer.message_count == 6


def test_round_robin_between_two_consumers(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch = nsqd.get_topic("t").get_channel("c")
    a, b = FakeConsumer(), FakeConsumer()
    for c in (a, b):
        ch.add_client(c)
        rdy(ch, c, 100)
    topic = nsqd.get_topic("t")
    for i in range(10):
        pub(topic, b"%d" % i)
    assert a.bodies == [b"0", b"2", b"4", b"6", b"8"]
    assert b.bodies == [b"1", b"3", b"5", b"7", b"9"]


def test_the_rotation_survives_consumers_leaving(clock: FakeClock) -> None:
    """The next consumer to serve is remembered by its place: when consumers leave, that
    place may be past the end of the list, and the next pass starts from the first."""
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    consumers = [FakeConsumer() for _ in range(3)]
    for consumer in consumers:
        ch.add_client(consumer)
        rdy(ch, consumer, 10)
    for i in range(2):
        pub(topic, b"%d" % i)  # the rotation moves on to the third consumer
    ch.remove_client(consumers[2])
    ch.remove_client(consumers[1])
    for i in range(2, 5):
        pub(topic, b"%d" % i)
    assert consumers[0].bodies == [b"0", b"2", b"3", b"4"]
    assert ch.depth == 0


def test_a_pub_goes_to_the_next_consumer_with_room(clock: FakeClock) -> None:
    """One message queued (a PUB) goes to the next consumer with room: the rotation skips a full
    consumer and goes on after the one served; the in-flight record is a delivery's."""
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    a, b, c = FakeConsumer(msg_timeout=30.0), FakeConsumer(), FakeConsumer()
    for consumer, ready in ((a, 100), (b, 1), (c, 100)):
        ch.add_client(consumer)
        rdy(ch, consumer, ready)
    for i in range(5):
        pub(topic, b"%d" % i)
    assert (a.bodies, b.bodies, c.bodies) == ([b"0", b"3"], [b"1"], [b"2", b"4"])
    msg_id, timestamp, attempts, _ = a.received[0]
    assert attempts == 1
    assert a.in_flight[msg_id] == (msg_id, timestamp, 1, b"0", 1030.0, 1000.0)
    assert (a.message_count, b.message_count, ch.delivery_count, ch.depth) == (2, 1, 5, 0)
    for consumer in (a, b, c):
        rdy(ch, consumer, len(consumer.in_flight))  # every one full: the PUB waits
    pub(topic, b"5")
    assert ch.depth == 1
    assert sum(len(x.received) for x in (a, b, c)) == 5
    fin(ch, b, b.last_id)
    assert b.bodies == [b"1", b"5"]
    assert ch.depth == 0


def test_a_pub_to_a_sampling_consumer_takes_the_general_pass(
    clock: FakeClock, seeded: random.Random
) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=2500, sample_rate=50)
    topic = nsqd.get_topic("t")
    for i in range(400):
        pub(topic, b"%d" % i)
    assert 140 < len(consumer.received) < 260  # rand[0,100) <= 50: about 51%
    assert ch.depth == 0  # the others are dropped


def test_two_consumers_share_a_backlog_by_rdy(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    pub(topic, *[b"%d" % i for i in range(5)])
    a, b = FakeConsumer(), FakeConsumer()
    ch.add_client(a)
    ch.add_client(b)
    rdy(ch, a, 1)
    rdy(ch, b, 1)
    assert len(a.received) == len(b.received) == 1
    assert ch.depth == 3
    assert sorted(a.bodies + b.bodies) == [b"0", b"1"]


# -- FIN, REQ, TOUCH ----------------------------------------------------------------------------------


def test_fin(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    pub(nsqd.get_topic("t"), b"x")
    msg_id = consumer.last_id
    fin(ch, consumer, msg_id)
    assert consumer.in_flight == {}
    assert consumer.finish_count == 1
    assert ch.in_flight_count == 0
    with pytest.raises(ChannelError) as info:
        ch.finish(consumer, msg_id)
    assert str(info.value) == "ID not in flight"
    assert consumer.finish_count == 1


def test_req_zero_redelivers_with_attempts_2(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    pub(nsqd.get_topic("t"), b"x")
    first = consumer.received[0]
    req(ch, consumer, first[0], 0)
    assert len(consumer.received) == 2
    second = consumer.received[1]
    assert second[0] == first[0]
    assert second[1] == first[1]  # timestamp kept
    assert second[2] == 2
    assert ch.requeue_count == 1
    assert consumer.requeue_count == 1
    assert ch.message_count == 1  # a requeue does not count as a new message
    assert consumer.message_count == 2


def test_req_goes_behind_queued_messages(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    pub(nsqd.get_topic("t"), b"a", b"b")
    req(ch, consumer, consumer.last_id, 0)
    assert consumer.bodies == [b"a", b"b"]
    fin(ch, consumer, consumer.last_id)
    assert consumer.bodies == [b"a", b"b", b"a"]
    assert consumer.received[-1][2] == 2


def test_req_with_delay_is_deferred_until_due(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    pub(nsqd.get_topic("t"), b"x")
    msg_id = consumer.last_id
    req(ch, consumer, msg_id, 5.0)
    assert ch.deferred_count == 1
    assert ch.in_flight_count == 0
    assert ch.depth == 0
    assert ch.requeue_count == 1
    assert len(consumer.received) == 1
    scan_at(nsqd, clock, clock.now + 4.9)
    assert ch.deferred_count == 1
    assert len(consumer.received) == 1
    scan_at(nsqd, clock, clock.now + 5.0)
    assert ch.deferred_count == 0
    assert len(consumer.received) == 2
    assert consumer.received[1][0] == msg_id
    assert consumer.received[1][2] == 2
    assert ch.timeout_count == 0


def test_deferred_comes_back_to_the_queue_without_a_ready_consumer(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    pub(nsqd.get_topic("t"), b"x")
    ch.requeue(consumer, consumer.last_id, 2.0)
    rdy(ch, consumer, 0)
    scan_at(nsqd, clock, clock.now + 2.0)
    assert ch.deferred_count == 0
    assert ch.depth == 1
    rdy(ch, consumer, 1)
    assert consumer.received[-1][2] == 2


def test_touch_extends_the_deadline(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1, msg_timeout=10.0)
    pub(nsqd.get_topic("t"), b"x")  # delivered at 1000, deadline 1010
    clock.now = 1008.0
    ch.touch(consumer, consumer.last_id)  # deadline 1018
    scan_at(nsqd, clock, 1011.0)
    assert ch.timeout_count == 0
    assert len(consumer.in_flight) == 1
    scan_at(nsqd, clock, 1017.9)
    assert ch.timeout_count == 0
    scan_at(nsqd, clock, 1018.0)
    assert ch.timeout_count == 1
    assert consumer.received[-1][2] == 2  # redelivered right away (RDY 1, nothing in flight)


def test_touch_capped_at_delivery_plus_max_msg_timeout(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(max_msg_timeout=15.0)
    ch, consumer = subscribe(nsqd, "t", "c", ready=1, msg_timeout=10.0)
    pub(nsqd.get_topic("t"), b"x")  # delivered at 1000
    clock.now = 1008.0
    ch.touch(consumer, consumer.last_id)  # 1018 capped to 1015
    clock.now = 1014.0
    ch.touch(consumer, consumer.last_id)  # 1024 capped to 1015
    scan_at(nsqd, clock, 1014.99)
    assert ch.timeout_count == 0
    scan_at(nsqd, clock, 1015.0)
    assert ch.timeout_count == 1


def test_capped_touch_times_out_on_time_behind_later_deadlines(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(max_msg_timeout=15.0)
    ch, consumer = subscribe(nsqd, "t", "c", ready=3, msg_timeout=10.0)
    topic = nsqd.get_topic("t")
    pub(topic, b"m1")  # delivered at 1000: deadline 1010
    clock.now = 1007.0
    pub(topic, b"m2")  # delivered at 1007: deadline 1017
    m1, m2 = consumer.received[0][0], consumer.received[1][0]
    clock.now = 1008.0
    ch.touch(consumer, m1)  # deadline capped to 1015, earlier than m2's
    scan_at(nsqd, clock, 1015.5)
    assert ch.timeout_count == 1
    assert m2 in consumer.in_flight
    assert consumer.received[-1][0] == m1  # m1 timed out and came straight back
    assert consumer.received[-1][2] == 2


def test_touch_errors(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    with pytest.raises(ChannelError, match=r"^ID not in flight$"):
        ch.touch(consumer, b"0" * 16)


def test_in_flight_timeout_requeues(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(msg_timeout=30.0)
    ch, consumer = subscribe(nsqd, "t", "c", ready=1, msg_timeout=30.0)
    pub(nsqd.get_topic("t"), b"x")
    rdy(ch, consumer, 0)  # keep the timed-out message in the queue
    assert scan_at(nsqd, clock, clock.now + 29.0) == 1
    assert ch.timeout_count == 0
    scan_at(nsqd, clock, clock.now + 30.0 + 1)
    assert ch.timeout_count == 1
    assert consumer.in_flight == {}
    assert ch.in_flight_count == 0
    assert ch.depth == 1
    assert ch.requeue_count == 0
    assert ch.message_count == 1
    rdy(ch, consumer, 1)
    assert consumer.received[-1][2] == 2  # attempts preserved, then incremented


def test_in_flight_timeout_with_the_real_monotonic_clock() -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    pub(nsqd.get_topic("t"), b"x")
    rdy(ch, consumer, 0)  # or its redelivery would also be past this future deadline
    nsqd.queue_scan(time.monotonic() + consumer.msg_timeout + 1)
    assert ch.timeout_count == 1
    assert ch.depth == 1
    rdy(ch, consumer, 1)
    assert len(consumer.received) == 2
    assert consumer.received[1][2] == 2


def test_removed_consumer_in_flight_times_out_later(clock: FakeClock) -> None:
    """§2.5: a disconnected client's in-flight messages wait for their timeout."""
    nsqd, _ = make_nsqd()
    ch, a = subscribe(nsqd, "t", "c", ready=1, msg_timeout=10.0)
    pub(nsqd.get_topic("t"), b"x")
    msg_id = a.last_id
    ch.remove_client(a)
    assert ch.in_flight_count == 1  # still counted
    b = FakeConsumer(msg_timeout=10.0)
    ch.add_client(b)
    rdy(ch, b, 1)
    assert b.received == []  # not requeued at once
    with pytest.raises(ChannelError, match=r"^client does not own message$"):
        ch.finish(b, msg_id)
    scan_at(nsqd, clock, 1009.0)
    assert b.received == []
    scan_at(nsqd, clock, 1010.0)
    assert ch.timeout_count == 1
    assert ch.in_flight_count == 1
    assert b.received[0][0] == msg_id
    assert b.received[0][2] == 2
    fin(ch, b, msg_id)
    assert ch.in_flight_count == 0


def test_ownership_errors(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch = nsqd.get_topic("t").get_channel("c")
    a, b = FakeConsumer(), FakeConsumer()
    ch.add_client(a)
    ch.add_client(b)
    rdy(ch, a, 1)
    pub(nsqd.get_topic("t"), b"x")
    msg_id = a.last_id
    ops: tuple[Callable[[], None], ...] = (
        lambda: ch.finish(b, msg_id),
        lambda: ch.requeue(b, msg_id, 0),
        lambda: ch.requeue(b, msg_id, 1.0),
        lambda: ch.touch(b, msg_id),
    )
    for op in ops:
        with pytest.raises(ChannelError) as info:
            op()
        assert str(info.value) == "client does not own message"
    assert msg_id in a.in_flight  # the owner still has it
    ops = (
        lambda: ch.finish(a, b"f" * 16),
        lambda: ch.requeue(a, b"f" * 16, 0),
        lambda: ch.touch(a, b"f" * 16),
    )
    for op in ops:
        with pytest.raises(ChannelError) as info:
            op()
        assert str(info.value) == "ID not in flight"
    assert ch.requeue_count == 0
    assert b.finish_count == b.requeue_count == 0


# -- sampling -------------------------------------------------------------------------------------------


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch) -> random.Random:
    rng = random.Random(20240601)
    monkeypatch.setattr(channel_mod, "random", rng)
    return rng


def test_sample_rate_drops_the_rest_for_this_channel(
    clock: FakeClock, seeded: random.Random
) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=2500, sample_rate=50)
    _other, all_consumer = subscribe(nsqd, "t", "other", ready=2500)
    pub(nsqd.get_topic("t"), *[b"%d" % i for i in range(1000)])
    n = len(consumer.received)
    assert 400 < n < 620  # rand[0,100) <= 50: about 51%
    assert ch.depth == 0  # the others are dropped, not requeued
    assert ch.in_flight_count == n
    assert consumer.message_count == n
    assert len(all_consumer.received) == 1000  # other channels are not affected
    assert set(consumer.bodies) <= set(all_consumer.bodies)


def test_sample_rate_99_keeps_everything(clock: FakeClock, seeded: random.Random) -> None:
    nsqd, _ = make_nsqd()
    _, consumer = subscribe(nsqd, "t", "c", ready=500, sample_rate=99)
    pub(nsqd.get_topic("t"), *[b"%d" % i for i in range(300)])
    assert len(consumer.received) == 300


def test_sample_rate_still_fills_rdy(clock: FakeClock, seeded: random.Random) -> None:
    """Go's messagePump skips a sampled-out message and reads the next one while the
    client is ready, so a sampled consumer still gets RDY messages in flight."""
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    pub(topic, *[b"%d" % i for i in range(100)])
    consumer = FakeConsumer(sample_rate=50)
    ch.add_client(consumer)
    rdy(ch, consumer, 10)
    assert len(consumer.in_flight) == 10
    assert ch.depth > 0


# -- empty, ephemeral, overflow ---------------------------------------------------------------------


def test_channel_empty_clears_everything(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, a = subscribe(nsqd, "t", "c", ready=2)
    b = FakeConsumer()
    ch.add_client(b)
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(6)])  # a takes 2, 4 stay queued
    deferred_id = a.received[0][0]
    ch.requeue(a, deferred_id, 60.0)
    orphan_id = a.received[1][0]
    ch.remove_client(a)  # one orphan in flight
    rdy(ch, b, 1)  # b takes one
    assert ch.deferred_count == 1
    assert ch.in_flight_count == 2
    assert ch.depth == 3
    ch.empty()
    assert ch.depth == 0
    assert ch.in_flight_count == 0
    assert ch.deferred_count == 0
    assert b.in_flight == {}
    for msg_id in (deferred_id, orphan_id, b.last_id):
        with pytest.raises(ChannelError, match=r"^ID not in flight$"):
            ch.finish(b, msg_id)
    scan_at(nsqd, clock, clock.now + 3600)
    assert ch.depth == 0
    assert ch.timeout_count == 0
    # the channel still works afterwards
    pub(topic, b"after")
    assert b.bodies[-1] == b"after"


def test_ephemeral_channel_deleted_with_its_last_consumer(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    events: list[tuple[str, str | None, str | None]] = []
    nsqd.listeners.append(
        lambda e, t, c: events.append((e, t.name if t else None, c.name if c else None))
    )
    ch, a = subscribe(nsqd, "t", "c#ephemeral", ready=1)
    b = FakeConsumer()
    ch.add_client(b)
    topic = nsqd.get_topic("t")
    ch.remove_client(a)
    assert "c#ephemeral" in topic.channels
    ch.remove_client(b)
    assert "c#ephemeral" not in topic.channels
    assert ch.exiting
    assert "t" in nsqd.topics  # a durable topic stays
    assert events[-1] == ("channel_deleted", "t", "c#ephemeral")
    ch.remove_client(b)  # removing twice is harmless


def test_ephemeral_topic_deleted_with_its_last_channel(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    events: list[tuple[str, str | None, str | None]] = []
    nsqd.listeners.append(
        lambda e, t, c: events.append((e, t.name if t else None, c.name if c else None))
    )
    ch, a = subscribe(nsqd, "t#ephemeral", "c#ephemeral", ready=1)
    ch.remove_client(a)
    assert "t#ephemeral" not in nsqd.topics
    assert events == [
        ("topic_created", "t#ephemeral", None),
        ("channel_created", "t#ephemeral", "c#ephemeral"),
        ("channel_deleted", "t#ephemeral", "c#ephemeral"),
        ("topic_deleted", "t#ephemeral", None),
    ]


def test_ephemeral_topic_deleted_when_a_durable_channel_goes(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t#ephemeral")
    topic.get_channel("c1")
    topic.get_channel("c2")
    topic.delete_channel("c1")
    assert "t#ephemeral" in nsqd.topics
    topic.delete_channel("c2")
    assert "t#ephemeral" not in nsqd.topics


def test_ephemeral_topic_without_channels_is_not_deleted(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t#ephemeral")
    pub(topic, b"x")
    scan_at(nsqd, clock, clock.now + 3600)
    nsqd.run_pending()
    assert nsqd.get_existing_topic("t#ephemeral") is topic


def test_durable_channel_survives_its_last_consumer(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, a = subscribe(nsqd, "t", "c", ready=1)
    ch.remove_client(a)
    assert nsqd.get_topic("t").channels["c"] is ch


def test_ephemeral_overflow_silently_dropped(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=2)
    topic = nsqd.get_topic("t#ephemeral")
    pub(topic, b"1", b"2", b"3")
    pub(topic, b"4")
    assert topic.depth == 2
    assert topic.message_count == 4
    assert isinstance(topic._backend, DummyBackend)
    ch = nsqd.get_topic("t").get_channel("c#ephemeral")
    pub(nsqd.get_topic("t"), b"1", b"2", b"3", b"4", b"5")
    assert ch.depth == 2
    assert ch.message_count == 5
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 10)
    assert consumer.bodies == [b"1", b"2"]


def test_durable_topic_overflow_refused(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=2)
    topic = nsqd.get_topic("t")
    assert isinstance(topic._backend, RefusingBackend)
    pub(topic, b"1", b"2")
    with pytest.raises(BackendError):
        pub(topic, b"3")
    assert topic.depth == 2
    assert topic.message_count == 2
    assert topic.message_bytes == 2


def test_mpub_all_or_nothing_into_topic_backlog(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=3)
    topic = nsqd.get_topic("t")
    pub(topic, b"1")
    with pytest.raises(BackendError):
        pub(topic, b"a", b"b", b"c")  # only 2 would fit
    assert topic.depth == 1
    assert topic.message_count == 1
    pub(topic, b"a", b"b")
    assert topic.depth == 3
    ch = topic.get_channel("c")
    nsqd.run_pending()
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 10)
    assert consumer.bodies == [b"1", b"a", b"b"]


def test_mpub_all_or_nothing_into_a_channel(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=3)
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    pub(topic, b"1")
    with pytest.raises(BackendError):
        pub(topic, b"a", b"b", b"c")
    assert ch.depth == 1
    assert ch.message_count == 1  # a refused batch is not counted
    assert topic.message_count == 1
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 10)
    assert consumer.bodies == [b"1"]


def test_mpub_refused_by_one_channel_reaches_no_channel(clock: FakeClock) -> None:
    """A refused MPUB answers E_MPUB_FAILED: none of it may have been queued anywhere,
    or the publisher's retry duplicates it in the channels that took it."""
    nsqd, _ = make_nsqd(mem_queue_size=2)
    topic = nsqd.get_topic("t")
    c1, fast = subscribe(nsqd, "t", "c1", ready=100)
    c2 = topic.get_channel("c2")
    pub(topic, b"first")  # c1 delivers it, c2 keeps it: c2 has room for 1 more
    with pytest.raises(BackendError):
        pub(topic, b"a", b"b")
    assert fast.bodies == [b"first"]
    assert c1.message_count == 1
    assert c2.message_count == 1
    assert c2.depth == 1


def test_overflow_goes_to_the_backend_and_comes_back_in_order(clock: FakeClock) -> None:
    backends: dict[str, ListBackend] = {}

    def factory(name: str) -> ListBackend:
        backends[name] = ListBackend()
        return backends[name]

    nsqd, _ = make_nsqd(backend_factory=factory, mem_queue_size=2)
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(5)])
    assert topic.depth == 5
    assert topic.backend_depth == 3
    ch = topic.get_channel("c")
    while nsqd.run_pending():
        pass
    assert topic.depth == 0
    assert ch.depth == 5
    assert ch.backend_depth == 3
    assert set(backends) == {"t", "t:c"}
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 3)
    assert consumer.bodies == [b"0", b"1", b"2"]
    rdy(ch, consumer, 100)
    assert consumer.bodies == [b"0", b"1", b"2", b"3", b"4"]
    assert ch.depth == 0


def test_attempts_wrap_on_delivery(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    ch.put_many([requeued(b"a" * 16, time.time_ns(), 0xFFFF, b"x")])
    assert consumer.received[-1][2] == 0
    req(ch, consumer, b"a" * 16, 0)
    assert consumer.received[-1][2] == 1
    ch.put_many([requeued(b"b" * 16, time.time_ns(), 0xFFFE, b"y")])
    fin(ch, consumer, b"a" * 16)
    assert consumer.received[-1][2] == 0xFFFF


# -- stats --------------------------------------------------------------------------------------------


def test_channel_and_topic_stats(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=3, msg_timeout=10.0)
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(5)])
    assert (ch.message_count, ch.depth, ch.in_flight_count, ch.deferred_count) == (5, 2, 3, 0)
    ids = [m[0] for m in consumer.received]
    ch.finish(consumer, ids[0])
    ch.requeue(consumer, ids[1], 0)
    ch.requeue(consumer, ids[2], 30.0)
    assert (ch.depth, ch.in_flight_count, ch.deferred_count) == (3, 0, 1)
    assert (ch.requeue_count, ch.timeout_count) == (2, 0)
    assert (consumer.finish_count, consumer.requeue_count, consumer.message_count) == (1, 2, 3)
    ch.dispatch()
    assert (ch.depth, ch.in_flight_count) == (0, 3)
    scan_at(nsqd, clock, clock.now + 10.0)
    assert ch.timeout_count == 3
    assert ch.depth == 0  # redelivered at once: RDY 3, nothing in flight
    assert ch.in_flight_count == 3
    assert ch.message_count == 5
    topic.put_messages([b"d"], 1.0)
    assert ch.message_count == 6
    assert ch.deferred_count == 2
    assert topic.message_count == 6
    assert topic.message_bytes == 6
    assert topic.depth == 0


# -- the queue scan (§7.8) ------------------------------------------------------------------------------


class SampleSpy:
    """Replaces the `random` module inside nsqpy.nsqd.nsqd, recording each sample size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._rng = random.Random(5)

    def sample(self, population: Sequence[Any], k: int) -> list[Any]:
        self.sizes.append(k)
        return self._rng.sample(population, k)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> SampleSpy:
    s = SampleSpy()
    monkeypatch.setattr(nsqd_mod, "random", s)
    return s


def deferred_channels(nsqd: NSQD, delays: list[float]) -> list[Channel]:
    topic = nsqd.get_topic("t")
    channels = []
    for i, delay in enumerate(delays):
        ch = topic.get_channel(f"c{i}")
        ch.put_deferred(msg(i), delay)
        channels.append(ch)
    return channels


def test_queue_scan_without_work(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    nsqd.get_topic("t").get_channel("c")
    assert scan_at(nsqd, clock, clock.now + 100) == 0


def test_queue_scan_processes_all_when_few(clock: FakeClock, spy: SampleSpy) -> None:
    nsqd, _ = make_nsqd()
    channels = deferred_channels(nsqd, [1.0] * 10)
    assert scan_at(nsqd, clock, clock.now + 1.0) == 10
    assert spy.sizes == []  # fewer than queue_scan_selection_count: all of them
    assert all(ch.depth == 1 and ch.deferred_count == 0 for ch in channels)


def test_queue_scan_samples_at_most_selection_count_and_repeats_while_dirty(
    clock: FakeClock, spy: SampleSpy
) -> None:
    nsqd, _ = make_nsqd()
    assert nsqd.opts.queue_scan_selection_count == 20
    channels = deferred_channels(nsqd, [1.0] * 100)
    # every round is 100% dirty: 5 rounds of 20 cover the 100 channels
    assert scan_at(nsqd, clock, clock.now + 1.0) == 100
    assert spy.sizes == [20, 20, 20, 20]  # the fifth round has exactly 20 left: no sampling
    assert all(ch.depth == 1 for ch in channels)


def test_queue_scan_stops_when_at_most_25_percent_dirty(clock: FakeClock, spy: SampleSpy) -> None:
    nsqd, _ = make_nsqd()
    channels = deferred_channels(nsqd, [1.0] * 4 + [60.0] * 96)
    # at most 4 of any 20 sampled channels are dirty (≤ 25%): one round only
    assert scan_at(nsqd, clock, clock.now + 1.0) == 20
    assert spy.sizes == [20]
    assert sum(ch.depth for ch in channels) <= 4


def test_queue_scan_dirty_threshold_is_strict(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    deferred_channels(nsqd, [1.0] * 5 + [60.0] * 15)
    assert scan_at(nsqd, clock, clock.now + 1.0) == 20  # 5/20 = 25%: not more, no repeat
    nsqd2, _ = make_nsqd()
    deferred_channels(nsqd2, [1.0] * 6 + [60.0] * 14)
    assert nsqd2.queue_scan(clock.now + 1.0) == 20 + 14  # 30%: one more round over the rest


def test_queue_scan_respects_a_custom_selection_count(clock: FakeClock, spy: SampleSpy) -> None:
    nsqd, _ = make_nsqd(queue_scan_selection_count=3)
    deferred_channels(nsqd, [1.0] * 10)
    assert scan_at(nsqd, clock, clock.now + 1.0) == 10
    assert spy.sizes == [3, 3, 3]  # then the last one alone


def test_queue_scan_rounds_are_bounded(clock: FakeClock, spy: SampleSpy) -> None:
    # channels that are dirty on every round (timeouts redelivered and timing out again)
    nsqd, _ = make_nsqd(queue_scan_selection_count=2)
    for i in range(4):
        subscribe(nsqd, "t", f"c{i}", ready=1, msg_timeout=1.0)
    pub(nsqd.get_topic("t"), b"x")
    # the clock stays put, so each redelivery has already expired at the next round
    processed = nsqd.queue_scan(clock.now + 5.0)
    assert processed == 2 * nsqd_mod.MAX_SCAN_ROUNDS


def test_queue_scan_handles_in_flight_and_deferred_together(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=2, msg_timeout=5.0)
    pub(nsqd.get_topic("t"), b"a", b"b")
    ch.requeue(consumer, consumer.received[0][0], 5.0)
    rdy(ch, consumer, 0)
    scan_at(nsqd, clock, clock.now + 5.0)
    assert ch.timeout_count == 1
    assert ch.deferred_count == 0
    assert ch.depth == 2


# -- listeners -------------------------------------------------------------------------------------------


def test_listeners_receive_lifecycle_events(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    events: list[tuple[str, Topic | None, Channel | None]] = []
    nsqd.listeners.append(lambda e, t, c: events.append((e, t, c)))
    topic = nsqd.get_topic("t")
    assert events == [("topic_created", topic, None)]
    assert nsqd.get_topic("t") is topic
    assert len(events) == 1
    c1 = topic.get_channel("c1")
    c2 = topic.get_channel("c2")
    assert topic.get_channel("c1") is c1
    assert events[1:] == [("channel_created", topic, c1), ("channel_created", topic, c2)]
    topic.delete_channel("c1")
    assert events[3] == ("channel_deleted", topic, c1)
    nsqd.delete_topic("t")
    assert events[4:] == [("channel_deleted", topic, c2), ("topic_deleted", topic, None)]
    assert "t" not in nsqd.topics
    with pytest.raises(KeyError):
        nsqd.delete_topic("t")


def test_a_failing_listener_does_not_break_the_engine(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    seen: list[str] = []

    def bad(event: str, topic: Topic | None, channel: Channel | None) -> None:
        raise RuntimeError("boom")

    nsqd.listeners.append(bad)
    nsqd.listeners.append(lambda e, t, c: seen.append(e))
    nsqd.get_topic("t").get_channel("c")
    assert seen == ["topic_created", "channel_created"]


def test_deleting_a_channel_closes_its_consumers(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    pub(nsqd.get_topic("t"), b"x")
    nsqd.get_topic("t").delete_channel("c")
    assert consumer.closed
    assert ch.exiting
    with pytest.raises(ChannelError, match="exiting"):
        ch.add_client(FakeConsumer())


# -- DPUB -------------------------------------------------------------------------------------------------


def test_dpub_with_channels(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    c1, a = subscribe(nsqd, "t", "c1", ready=1)
    c2 = nsqd.get_topic("t").get_channel("c2")
    topic = nsqd.get_topic("t")
    topic.put_messages([b"later"], 3.0)
    assert topic.message_count == 1
    assert topic.depth == 0
    for ch in (c1, c2):
        assert (ch.deferred_count, ch.depth, ch.message_count) == (1, 0, 1)
    assert a.received == []
    scan_at(nsqd, clock, clock.now + 2.9)
    assert a.received == []
    scan_at(nsqd, clock, clock.now + 3.0)
    assert a.bodies == [b"later"]
    assert a.received[0][2] == 1
    assert c2.depth == 1
    assert c1.deferred_count == c2.deferred_count == 0


def test_dpub_without_channels_waits_in_the_topic(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    topic.put_messages([b"later"], 3.0)
    pub(topic, b"now")
    assert topic.depth == 2
    ch, consumer = subscribe(nsqd, "t", "c", ready=10)
    nsqd.run_pending()
    assert consumer.bodies == [b"now"]
    assert ch.deferred_count == 1
    assert ch.message_count == 2
    scan_at(nsqd, clock, clock.now + 3.0)
    assert consumer.bodies == [b"now", b"later"]


def test_dpub_into_a_paused_topic(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=10)
    topic = nsqd.get_topic("t")
    topic.pause()
    topic.put_messages([b"d"], 1.0)
    assert ch.deferred_count == 0
    topic.unpause()
    nsqd.run_pending()
    assert ch.deferred_count == 1
    scan_at(nsqd, clock, clock.now + 1.0)
    assert consumer.bodies == [b"d"]


def test_dpub_refused_when_the_topic_is_full(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=1)
    topic = nsqd.get_topic("t")
    topic.put_messages([b"1"], 1.0)
    with pytest.raises(BackendError):
        topic.put_messages([b"2"], 1.0)
    assert topic.message_count == 1


# -- mem-queue-size 0 (§7.2) ------------------------------------------------------------------------------


def test_mem_queue_size_0_ephemeral_channel_hands_off_to_ready_consumer_only(
    clock: FakeClock,
) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=0)
    ch, consumer = subscribe(nsqd, "t", "c#ephemeral", ready=1)
    topic = nsqd.get_topic("t")
    pub(topic, b"a")
    assert consumer.bodies == [b"a"]
    pub(topic, b"b")  # consumer not ready (RDY 1, one in flight): dropped
    assert ch.depth == 0
    fin(ch, consumer, consumer.last_id)
    assert consumer.bodies == [b"a"]
    pub(topic, b"c", b"d")  # only what the ready consumer takes
    assert consumer.bodies == [b"a", b"c"]
    assert ch.depth == 0
    rdy(ch, consumer, 0)
    fin(ch, consumer, consumer.last_id)
    pub(topic, b"e")
    assert consumer.bodies == [b"a", b"c"]
    assert ch.depth == 0


def test_mem_queue_size_0_paused_ephemeral_channel_drops(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=0)
    ch, consumer = subscribe(nsqd, "t", "c#ephemeral", ready=5)
    ch.pause()
    pub(nsqd.get_topic("t"), b"a")
    ch.unpause()
    assert consumer.received == []
    assert ch.depth == 0


def test_mem_queue_size_0_durable_channel_uses_the_backend(clock: FakeClock) -> None:
    backends: dict[str, ListBackend] = {}

    def factory(name: str) -> ListBackend:
        return backends.setdefault(name, ListBackend())

    nsqd, _ = make_nsqd(backend_factory=factory, mem_queue_size=0)
    ch, consumer = subscribe(nsqd, "t", "c", ready=0)
    pub(nsqd.get_topic("t"), b"a", b"b")
    assert ch.backend_depth == 2
    rdy(ch, consumer, 5)
    assert consumer.bodies == [b"a", b"b"]


# -- shutdown -------------------------------------------------------------------------------------------


def test_close_writes_queued_in_flight_and_deferred_to_the_backend(clock: FakeClock) -> None:
    nsqd, backends = nsqd_with_list_backends()
    ch, consumer = subscribe(nsqd, "t", "c", ready=2)
    topic = nsqd.get_topic("t")
    pub(topic, b"1", b"2", b"3")
    ch.requeue(consumer, consumer.received[0][0], 30.0)
    nsqd.get_topic("other").put_messages([b"o"])
    nsqd.close()
    assert consumer.closed
    records = [decode_message(r) for r in backends["t:c"].records]
    assert sorted(r[3] for r in records) == [b"1", b"2", b"3"]
    assert {r[3]: r[2] for r in records} == {b"1": 1, b"2": 1, b"3": 0}  # attempts kept
    assert [decode_message(r)[3] for r in backends["other"].records] == [b"o"]
    assert all(b.closed for b in backends.values())
    with pytest.raises(BackendError):
        pub(topic, b"late")


# -- MPUB runs (message.py): a channel's position in a shared run ----------------------------------


def _ids_consecutive(msgs: Sequence[Message]) -> bool:
    ids = [int(m[0], 16) for m in msgs]
    return ids == list(range(ids[0], ids[0] + len(ids)))


def test_run_head_taken_across_dispatches_and_shared_by_channels(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    c1, a = subscribe(nsqd, "t", "c1", ready=2)
    c2, b = subscribe(nsqd, "t", "c2", ready=3)
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(7)])
    assert (c1.depth, c2.depth) == (5, 4)
    fin(c1, a, a.received[0][0])  # one more goes: the run left behind starts at 2
    assert a.bodies == [b"0", b"1", b"2"] and c1.depth == 4
    rdy(c1, a, 100)
    rdy(c2, b, 100)
    assert a.bodies == b.bodies == [b"%d" % i for i in range(7)]
    assert [m[0] for m in a.received] == [m[0] for m in b.received]
    assert _ids_consecutive(a.received) and all(m[2] == 1 for m in a.received)
    assert c1.depth == c2.depth == 0 and not c1._memory and not c2._memory
    assert topic.message_bytes == 7 and c1.message_count == 7


@pytest.mark.parametrize("seed", range(12))
def test_run_frames_of_equal_and_mixed_body_sizes(clock: FakeClock, seed: int) -> None:
    """Runs of one body size are framed without reading each size; runs of several sizes (a
    different one anywhere, even only the last) the general way. Either way, whatever the RDY
    steps cut them into, every frame and every in-flight record is the message sent."""
    rng = random.Random(seed)
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=0)
    topic = nsqd.get_topic("t")
    sent: list[bytes] = []
    for _ in range(12):
        count = rng.randrange(2, 90)
        size = rng.randrange(1, 300)
        sizes = [size] * count
        shape = rng.choice(["equal", "last differs", "first differs", "mixed"])
        if shape == "last differs":
            sizes[-1] = size + rng.randrange(1, 5)
        elif shape == "first differs":
            sizes[0] = size + 256  # differs in another byte of the size
        elif shape == "mixed":
            sizes = [rng.randrange(1, 300) for _ in range(count)]
        bodies = [rng.randbytes(k) for k in sizes]
        sent.extend(bodies)
        pub(topic, *bodies)
    while len(consumer.received) < len(sent):
        rdy(ch, consumer, len(consumer.received) + rng.randrange(1, 50))
    assert consumer.bodies == sent
    assert all(m[2] == 1 for m in consumer.received)
    assert len({m[0] for m in consumer.received}) == len(sent)
    assert {k: delivery(k, v)[3] for k, v in consumer.in_flight.items()} == {
        m[0]: m[3] for m in consumer.received
    }
    assert ch.depth == 0 and not ch._memory


def test_shared_in_flight_records_give_each_message_back(clock: FakeClock) -> None:
    """Messages of a run delivered in one pass share one in-flight record: REQ, TOUCH, a
    timeout, a consumer that leaves and the exit flush each get the right message back from
    it (its ID, timestamp, attempts and body), whatever part of the run the pass took."""
    nsqd, backends = nsqd_with_list_backends(e2e_processing_latency_percentiles=[0.5])
    ch, a = subscribe(nsqd, "t", "c", ready=0, msg_timeout=10.0)
    topic = nsqd.get_topic("t")
    pub(topic, b"skip")  # the run's IDs do not start at sequence 0
    rdy(ch, a, 1)
    fin(ch, a, a.last_id)
    bodies = [b"m%03d" % i for i in range(80)]
    pub(topic, *bodies)
    rdy(ch, a, 5)  # a first pass: messages 0-4 (framed by the Python loop)
    rdy(ch, a, 45)  # a second: 5-44, from the middle of the run (by the C loops)
    sent = {m[0]: m for m in a.received[1:]}
    assert [m[3] for m in a.received[1:]] == bodies[:45]
    assert {k: delivery(k, v) for k, v in a.in_flight.items()} == {
        k: (k, m[1], 1, m[3], 1010.0, 1000.0) for k, m in sent.items()
    }
    ids = [m[0] for m in a.received[1:]]
    rdy(ch, a, 0)
    fin(ch, a, ids[2])  # FIN: its latency is counted from the shared timestamp
    assert ch.e2e is not None and ch.e2e.result()["count"] == 2
    req(ch, a, ids[30], 0)  # REQ: back on the queue as it was delivered
    clock.now = 1005.0
    ch.touch(a, ids[12])  # TOUCH: its own record now, deadline 1015
    assert delivery(ids[12], a.in_flight[ids[12]]) == (
        ids[12],
        sent[ids[12]][1],
        1,
        b"m012",
        1015.0,
        1000.0,
    )
    scan_at(nsqd, clock, 1010.0)  # every other message of both passes times out
    assert ch.timeout_count == 42 and list(a.in_flight) == [ids[12]]
    b = FakeConsumer(msg_timeout=10.0)
    ch.add_client(b)
    ch.remove_client(a)  # ids[12] waits for its deadline among the orphans
    rdy(ch, b, 100)
    got = {m[3]: m for m in b.received}
    assert sorted(got) == sorted(set(bodies) - {b"m002", b"m012"})
    for body, m in got.items():
        first_attempt = bodies.index(body) >= 45
        assert m[2] == (1 if first_attempt else 2)
        assert first_attempt or sent[m[0]][3] == body  # the same ID came back with its body
    scan_at(nsqd, clock, 1015.0)
    assert [m[3] for m in b.received[-1:]] == [b"m012"] and b.received[-1][2] == 2
    nsqd.close()  # b's in-flight messages, shared records among them, flushed to the backend
    records = [decode_message(r) for r in backends["t:c"].records]
    assert sorted(r[3] for r in records) == sorted(set(bodies) - {b"m002"})
    assert {r[0]: r[3] for r in records} == {m[0]: m[3] for m in b.received}
    assert all(r[2] == m[2] for r, m in zip(sorted(records), sorted(b.received), strict=True))


def test_run_with_single_messages_and_requeues_keeps_order(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    ch, consumer = subscribe(nsqd, "t", "c", ready=1)
    topic = nsqd.get_topic("t")
    pub(topic, b"a", b"b", b"c")
    pub(topic, b"d")
    pub(topic, b"e", b"f")
    req(ch, consumer, consumer.last_id, 0)  # a goes behind f
    rdy(ch, consumer, 100)
    assert consumer.bodies == [b"a", b"b", b"c", b"d", b"e", b"f", b"a"]
    assert [m[2] for m in consumer.received] == [1, 1, 1, 1, 1, 1, 2]
    assert ch.depth == 0


def test_run_peek_depth_and_unqueue_count_messages_not_entries(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    pub(topic, b"a", b"b", b"c")
    pub(topic, b"d")
    assert ch.depth == 4 and topic.depth == 0
    assert [m[3] for m in ch.peek(2)] == [b"a", b"b"]
    assert [m[3] for m in ch.peek(10)] == [b"a", b"b", b"c", b"d"]
    assert ch.peek(0) == []
    assert not ch.unqueue(5)
    assert ch.unqueue(2)  # d and c: the run is cut
    assert ch.depth == 2 and ch.message_count == 2
    assert [m[3] for m in ch.peek(10)] == [b"a", b"b"]
    ch.empty()
    assert ch.depth == 0 and ch.peek(5) == []


def test_run_spilled_to_the_backend_mid_run(clock: FakeClock) -> None:
    nsqd, backends = nsqd_with_list_backends(mem_queue_size=4)
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("c")
    pub(topic, b"0")
    pub(topic, *[b"%d" % i for i in range(1, 7)])  # 3 fit in memory, 3 go to the backend
    assert ch.depth == 7 and ch.backend_depth == 3
    assert [decode_message(r)[3] for r in backends["t:c"].records] == [b"4", b"5", b"6"]
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 100)
    assert consumer.bodies == [b"%d" % i for i in range(7)]
    assert _ids_consecutive(consumer.received[1:])
    assert all(m[2] == 1 for m in consumer.received)


def test_run_spilled_in_the_topic_backlog_then_pumped_whole(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(backend_factory=lambda name: ListBackend(), mem_queue_size=5)
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(8)])
    assert topic.depth == 8 and topic.backend_depth == 3
    ch = topic.get_channel("c")
    while nsqd.run_pending():
        pass
    assert topic.depth == 0 and ch.depth == 8
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 100)
    assert consumer.bodies == [b"%d" % i for i in range(8)]


def test_backlog_pump_cuts_a_run_at_its_budget(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nsqd_mod, "PUMP_BUDGET", 3)
    nsqd, _ = make_nsqd()
    topic = nsqd.get_topic("t")
    pub(topic, *[b"%d" % i for i in range(7)])
    ch = topic.get_channel("c")
    assert nsqd.run_pending()  # 3 moved, 4 left
    assert (topic.depth, ch.depth) == (4, 3)
    while nsqd.run_pending():
        pass
    consumer = FakeConsumer()
    ch.add_client(consumer)
    rdy(ch, consumer, 100)
    assert consumer.bodies == [b"%d" % i for i in range(7)]
    assert _ids_consecutive(consumer.received)


def test_mpub_refused_by_a_channel_is_taken_back_from_the_others_run(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(backend_factory=lambda name: RefusingBackend(), mem_queue_size=4)
    topic = nsqd.get_topic("t")
    c2 = topic.get_channel("c2")
    pub(topic, b"z")
    c1 = topic.get_channel("c1")
    pub(topic, b"x", b"y")
    with pytest.raises(BackendError):
        pub(topic, b"a", b"b")  # c1 took the run, c2 (1 place left) refused it
    assert (c1.depth, c2.depth) == (2, 3) and c1.message_count == 2
    assert [m[3] for m in c1.peek(5)] == [b"x", b"y"]


def test_exit_flush_writes_a_partly_delivered_run_in_order(clock: FakeClock) -> None:
    nsqd, backends = nsqd_with_list_backends()
    ch, consumer = subscribe(nsqd, "t", "c", ready=2)
    topic = nsqd.get_topic("t")
    pub(topic, b"0", b"1", b"2", b"3", b"4")
    ch.requeue(consumer, consumer.received[1][0], 30.0)  # 1 is deferred
    pub(topic, b"5")
    nsqd.get_topic("backlog").put_messages(packed([b"p", b"q"]))
    nsqd.close()
    records = [decode_message(r) for r in backends["t:c"].records]
    # memory first (3, 4: the rest of the run, then 5), in flight (0, 2), deferred (1)
    assert [r[3] for r in records] == [b"3", b"4", b"5", b"0", b"2", b"1"]
    assert [r[2] for r in records] == [0, 0, 0, 1, 1, 1]
    assert _ids_consecutive(records[:2])
    assert [decode_message(r)[3] for r in backends["backlog"].records] == [b"p", b"q"]


def test_mem_queue_size_0_ephemeral_hands_off_part_of_a_run(clock: FakeClock) -> None:
    nsqd, _ = make_nsqd(mem_queue_size=0)
    ch, consumer = subscribe(nsqd, "t", "c#ephemeral", ready=2)
    pub(nsqd.get_topic("t"), b"a", b"b", b"c")
    assert consumer.bodies == [b"a", b"b"] and ch.depth == 0
