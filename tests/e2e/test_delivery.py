"""Delivery semantics of a running nsqd (spec §2.5, §7.1-§7.4, §10, §11 "TCP")."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from nsqpy.wire.v2 import encode_mpub, encode_pub
from tests.e2e.conftest import Connect
from tests.support.procs import ServerProcess
from tests.support.rawclient import Frame, RawClient, consumer

pytestmark = pytest.mark.timeout(30)

HEX_ID = re.compile(rb"^[0-9a-f]{16}$")


@pytest.fixture
def nsqd(shared_nsqd: ServerProcess) -> ServerProcess:
    """Tests here are independent (own topic names): one nsqd serves the whole module."""
    return shared_nsqd


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


# -- RDY ---------------------------------------------------------------------------------------------


def test_new_subscription_starts_at_rdy_zero(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    connect().pub(topic, b"waiting")
    client.expect_no_frame(0.4)
    client.rdy(1)
    assert client.read_message().body == b"waiting"


def test_rdy_is_a_cap_on_in_flight(connect: Connect, topic: str) -> None:
    connect().mpub(topic, bodies(5))
    client = connect()
    client.sub(topic, "ch")
    client.rdy(2)
    first = client.read_messages(2)
    assert [m.body for m in first] == [b"m0", b"m1"]
    client.expect_no_frame(0.5)  # RDY 2 with 2 in flight: nothing more
    client.fin(first[0].id)
    third = client.read_message()
    assert third.body == b"m2"
    client.expect_no_frame(0.3)
    client.fin(first[1].id)
    client.fin(third.id)
    rest = client.read_messages(2)
    assert [m.body for m in rest] == [b"m3", b"m4"]


def test_rdy_without_count_means_one(connect: Connect, topic: str) -> None:
    connect().mpub(topic, bodies(3))
    client = connect()
    client.sub(topic, "ch")
    client.rdy(None)
    msg = client.read_message()
    client.expect_no_frame(0.4)
    client.fin(msg.id)
    assert client.read_message().body == b"m1"


def test_rdy_zero_pauses_delivery(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(5)
    producer = connect()
    producer.pub(topic, b"a")
    client.fin(client.read_message().id)
    client.rdy(0)
    producer.pub(topic, b"b")
    client.expect_no_frame(0.4)
    client.rdy(1)
    assert client.read_message().body == b"b"


# -- topics and channels ---------------------------------------------------------------------------


def test_fan_out_to_every_channel(connect: Connect, topic: str) -> None:
    one = connect()
    one.sub(topic, "one")
    one.rdy(10)
    two = connect()
    two.sub(topic, "two")
    two.rdy(10)
    connect().mpub(topic, bodies(5))
    assert [m.body for m in one.read_messages(5)] == bodies(5)
    assert [m.body for m in two.read_messages(5)] == bodies(5)


def test_topic_without_channel_keeps_messages(connect: Connect, topic: str) -> None:
    producer = connect()
    for body in bodies(3):
        producer.pub(topic, body)
    client = connect()
    client.sub(topic, "late")
    client.rdy(10)
    assert [m.body for m in client.read_messages(3)] == bodies(3)
    client.expect_no_frame(0.2)


def test_new_channel_only_gets_later_messages(connect: Connect, topic: str) -> None:
    early = connect()
    early.sub(topic, "early")
    early.rdy(10)
    producer = connect()
    producer.pub(topic, b"before")
    late = connect()
    late.sub(topic, "late")
    late.rdy(10)
    producer.pub(topic, b"after")
    assert [m.body for m in early.read_messages(2)] == [b"before", b"after"]
    assert late.read_message().body == b"after"
    late.expect_no_frame(0.3)


def _consume_both(a: RawClient, b: RawClient, total: int) -> tuple[list[bytes], list[bytes]]:
    got_a: list[bytes] = []
    got_b: list[bytes] = []
    deadline = time.monotonic() + 5.0
    while len(got_a) + len(got_b) < total and time.monotonic() < deadline:
        for client, got in ((a, got_a), (b, got_b)):
            msg = client.poll_message(0.05)
            if msg is not None:
                got.append(msg.body)
                client.fin(msg.id)
    a.expect_no_frame(0.2)
    b.expect_no_frame(0.2)
    return got_a, got_b


def test_channel_consumers_each_message_to_exactly_one(connect: Connect, topic: str) -> None:
    a = consumer_of(connect, topic, "shared", 20)
    b = consumer_of(connect, topic, "shared", 20)
    producer = connect()
    for body in bodies(20):
        producer.pub(topic, body)
    got_a, got_b = _consume_both(a, b, 20)
    assert not set(got_a) & set(got_b), "a message went to both consumers"
    assert sorted(got_a + got_b) == sorted(bodies(20))
    assert got_a and got_b, "one consumer got everything"


def test_channel_consumers_share_a_burst(connect: Connect, topic: str) -> None:
    """An MPUB burst is spread over the channel's ready consumers, as Go's competing
    message pumps do, not handed entirely to whichever consumer comes first."""
    a = consumer_of(connect, topic, "shared", 20)
    b = consumer_of(connect, topic, "shared", 20)
    connect().mpub(topic, bodies(20))
    got_a, got_b = _consume_both(a, b, 20)
    assert not set(got_a) & set(got_b), "a message went to both consumers"
    assert sorted(got_a + got_b) == sorted(bodies(20))
    assert got_a and got_b, f"one consumer got all 20: a={len(got_a)} b={len(got_b)}"


def consumer_of(connect: Connect, topic: str, channel: str, rdy: int) -> RawClient:
    client = connect()
    client.sub(topic, channel)
    client.rdy(rdy)
    return client


# -- requeue, touch, timeouts ------------------------------------------------------------------------


def test_req_zero_redelivers_with_attempts_two(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(1)
    connect().pub(topic, b"again")
    first = client.read_message()
    assert first.attempts == 1
    client.req(first.id, 0)
    again = client.read_message()
    assert (again.id, again.body, again.timestamp, again.attempts) == (
        first.id,
        b"again",
        first.timestamp,
        2,
    )
    client.fin(again.id)


def test_req_with_delay_waits(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(1)
    connect().pub(topic, b"later")
    first = client.read_message()
    sent = time.monotonic()
    client.req(first.id, 700)
    again = client.read_message(timeout=4.0)
    assert again.id == first.id and again.attempts == 2
    assert 0.7 <= again.received_at - sent < 2.0


def test_req_over_max_req_timeout_is_clamped(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(max_req_timeout="1s")
    client = consumer(nsqd.tcp_address, topic, "ch", rdy=1)
    RawClient(nsqd.tcp_address).pub(topic, b"clamped")
    first = client.read_message()
    sent = time.monotonic()
    client.req(first.id, 3_600_000)  # an hour: not an error, clamped to 1 s
    again = client.read_message(timeout=5.0)
    assert again.id == first.id and again.attempts == 2
    assert 0.9 <= again.received_at - sent < 3.0


def test_in_flight_timeout_redelivers(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(msg_timeout=1000)
    client.sub(topic, "ch")
    client.rdy(1)
    connect().pub(topic, b"slow")
    first = client.read_message()
    again = client.read_message(timeout=4.0)
    assert (again.id, again.attempts) == (first.id, 2)
    assert 0.95 <= again.received_at - first.received_at < 2.5
    third = client.read_message(timeout=4.0)
    assert third.attempts == 3
    client.fin(third.id)


def test_touch_extends_the_deadline(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(msg_timeout=1000)
    client.sub(topic, "ch")
    client.rdy(1)
    connect().pub(topic, b"touchy")
    msg = client.read_message()
    t0 = msg.received_at
    client.expect_no_frame(t0 + 0.6 - time.monotonic())
    client.touch(msg.id)  # new deadline: ~1.6 s after delivery
    client.expect_no_frame(t0 + 1.3 - time.monotonic())  # past the original deadline
    again = client.read_message(timeout=4.0)
    assert (again.id, again.attempts) == (msg.id, 2)
    assert 1.5 <= again.received_at - t0 < 2.8


def test_touch_then_fin(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(msg_timeout=1000)
    client.sub(topic, "ch")
    client.rdy(1)
    connect().pub(topic, b"done")
    msg = client.read_message()
    client.touch(msg.id)
    client.fin(msg.id)
    client.expect_no_frame(1.6)  # never redelivered


def test_disconnected_consumers_messages_wait_for_their_timeout(
    connect: Connect, topic: str
) -> None:
    gone = connect()
    gone.identify_ok(msg_timeout=1000)
    gone.sub(topic, "ch")
    gone.rdy(1)
    connect().pub(topic, b"orphan")
    msg = gone.read_message()
    gone.close()
    heir = connect()
    heir.sub(topic, "ch")
    heir.rdy(1)
    again = heir.read_message(timeout=4.0)
    assert (again.id, again.attempts) == (msg.id, 2)
    assert again.received_at - msg.received_at >= 0.9, "requeued before its timeout"


# -- DPUB, MPUB, message format ----------------------------------------------------------------------


def test_dpub_delivered_after_its_delay(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(10)
    producer = connect()
    producer.dpub(topic, 1000, b"deferred")
    sent = time.monotonic()
    producer.pub(topic, b"immediate")
    assert client.read_message().body == b"immediate"
    late = client.read_message(timeout=4.0)
    assert late.body == b"deferred" and late.attempts == 1
    assert 0.95 <= late.received_at - sent < 2.5


def test_dpub_zero_is_immediate(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(1)
    connect().dpub(topic, 0, b"now")
    assert client.read_message(timeout=1.0).body == b"now"


def test_mpub_100_complete_and_in_order(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(100)
    connect().mpub(topic, bodies(100))
    msgs = client.read_messages(100)
    assert [m.body for m in msgs] == bodies(100)
    assert all(m.attempts == 1 for m in msgs)
    client.expect_no_frame(0.2)


def test_a_publisher_is_answered_before_its_message_fans_out(connect: Connect, topic: str) -> None:
    """The OK of a PUB (one alone in a read, and two in one read) is written before the
    message is handed to consumers: a publisher subscribed to the topic itself reads its
    OK first, as from Go's nsqd, whose topic pump runs beside the publisher's connection."""

    def frames(client: RawClient, n: int) -> list[Frame]:
        got = []
        while len(got) < n:
            frame = client.read_frame(timeout=5.0)
            if not frame.is_heartbeat:
                got.append(frame)
        return got

    def seen(got: list[Frame]) -> list[bytes]:  # responses, and the bodies of messages
        return [f.data[26:] if f.type == 2 else f.data for f in got]

    client = connect()
    client.sub(topic, "ch")
    client.rdy(1)
    client.send(encode_pub(topic, b"alone"))
    got = frames(client, 2)
    assert [f.type for f in got] == [0, 2] and seen(got) == [b"OK", b"alone"]
    client.fin(got[1].data[10:26])
    client.rdy(2)
    client.send(encode_pub(topic, b"one") + encode_mpub(topic, [b"two"]))
    got = frames(client, 4)
    assert [f.type for f in got] == [0, 0, 2, 2]
    assert seen(got) == [b"OK", b"OK", b"one", b"two"]


def test_message_ids_and_timestamps(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(200)
    producer = connect()
    before = time.time_ns()
    producer.mpub(topic, bodies(150))
    for body in bodies(50, "p"):
        producer.pub(topic, body)
    after = time.time_ns()
    msgs = client.read_messages(200)
    ids = [m.id for m in msgs]
    assert all(HEX_ID.match(i) for i in ids), ids[:5]
    assert len(set(ids)) == 200
    for m in msgs:
        assert before - 1_000_000_000 <= m.timestamp <= after + 1_000_000_000
    stamps = [m.timestamp for m in msgs]
    assert stamps == sorted(stamps)


def test_large_message_round_trip(connect: Connect, topic: str) -> None:
    client = connect()
    client.sub(topic, "ch")
    client.rdy(1)
    body = bytes(range(256)) * 4096  # 1 MiB exactly: the default --max-msg-size
    connect().pub(topic, body)
    assert client.read_message(timeout=10.0).body == body


def test_kilobyte_bodies_mixed_with_small_ones_arrive_whole_and_in_order(
    connect: Connect, topic: str
) -> None:
    """Output of big bodies goes out as separate pieces (writev): frames stay whole."""
    client = connect()
    client.sub(topic, "ch")
    sent = [bytes([i]) * (10_240 if i % 3 else 7) for i in range(30)]
    connect().mpub(topic, sent)
    client.rdy(30)  # the whole batch in one flush
    msgs = client.read_messages(30, timeout=10.0)
    assert [m.body for m in msgs] == sent


# -- ephemeral and overflow ---------------------------------------------------------------------------


def test_ephemeral_channel_disappears_with_its_last_client(
    nsqd: ServerProcess, connect: Connect, topic: str
) -> None:
    first = connect()
    first.sub(topic, "eph#ephemeral")
    connect().mpub(topic, bodies(3, "old"))
    mark = nsqd.mark()
    first.close()
    nsqd.wait_for_log(rf"TOPIC\({topic}\): deleting channel eph#ephemeral", since=mark)
    second = connect()
    second.sub(topic, "eph#ephemeral")
    second.rdy(10)
    connect().pub(topic, b"new")
    assert second.read_message().body == b"new"
    second.expect_no_frame(0.3)  # the old messages went with the channel


def test_ephemeral_channel_overflow_is_dropped(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(mem_queue_size=10)
    client = consumer(nsqd.tcp_address, topic, "eph#ephemeral")
    producer = RawClient(nsqd.tcp_address)
    for body in bodies(25):
        producer.pub(topic, body)  # always OK
    client.rdy(100)
    assert [m.body for m in client.read_messages(10)] == bodies(10)
    client.expect_no_frame(0.5)


def test_ephemeral_topic_overflow_is_dropped(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(mem_queue_size=10)
    name = f"{topic}#ephemeral"
    producer = RawClient(nsqd.tcp_address)
    for body in bodies(25):
        producer.pub(name, body)
    client = consumer(nsqd.tcp_address, name, "ch", rdy=100)
    assert [m.body for m in client.read_messages(10)] == bodies(10)
    client.expect_no_frame(0.5)


def test_overflow_never_loses_a_message_silently(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    """Past --mem-queue-size a durable topic either accepts (and later delivers) or refuses.

    Today (no disk queue yet) nsqd refuses with
    ``E_PUB_FAILED PUB failed memory queue full and no disk queue``; with the disk
    queue the PUBs are accepted. Either way nothing acknowledged may be lost.
    """
    nsqd = nsqd_factory(mem_queue_size=10)
    accepted: list[bytes] = []
    producer = RawClient(nsqd.tcp_address)
    for body in bodies(25):
        producer.send(encode_pub(topic, body))
        frame = producer.next_frame()
        if frame == Frame(0, b"OK"):
            accepted.append(body)
            continue
        assert frame.type == 1 and frame.data.startswith(b"E_PUB_FAILED PUB failed "), frame
        producer.assert_closed()
        producer = RawClient(nsqd.tcp_address)
    assert len(accepted) >= 10
    client = consumer(nsqd.tcp_address, topic, "ch", rdy=100)
    assert [m.body for m in client.read_messages(len(accepted))] == accepted
    client.expect_no_frame(0.5)


def test_mpub_overflow_is_all_or_nothing(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(mem_queue_size=10)
    producer = RawClient(nsqd.tcp_address)
    producer.send(encode_mpub(topic, bodies(25)))
    frame = producer.next_frame()
    expected = bodies(25)
    if frame != Frame(0, b"OK"):
        assert frame.type == 1 and frame.data.startswith(b"E_MPUB_FAILED MPUB failed "), frame
        expected = []
    client = consumer(nsqd.tcp_address, topic, "ch", rdy=100)
    assert [m.body for m in client.read_messages(len(expected))] == expected
    client.expect_no_frame(0.5)


# -- limits and output buffering ------------------------------------------------------------------------


def test_max_channel_consumers(nsqd_factory: Callable[..., ServerProcess], topic: str) -> None:
    nsqd = nsqd_factory(max_channel_consumers=1)
    first = consumer(nsqd.tcp_address, topic, "ch")
    refused = RawClient(nsqd.tcp_address)
    refused.send(f"SUB {topic} ch\n".encode())
    refused.expect_error(f"E_SUB_FAILED SUB failed consumers for {topic}:ch exceeds limit of 1")
    other = consumer(nsqd.tcp_address, topic, "other")  # the limit is per channel
    first.assert_open()
    other.assert_open()


def test_output_buffer_timeout_delays_a_lone_message(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(output_buffer_timeout=1000)
    client.sub(topic, "ch")
    client.rdy(10)
    connect().pub(topic, b"buffered")
    sent = time.monotonic()
    msg = client.read_message(timeout=4.0)
    assert 0.7 <= msg.received_at - sent < 2.0


def test_not_ready_client_is_flushed_at_once(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(output_buffer_timeout=1000)
    client.sub(topic, "ch")
    client.rdy(1)  # one in flight makes the client not ready: flush now
    connect().pub(topic, b"flushed")
    sent = time.monotonic()
    msg = client.read_message(timeout=4.0)
    assert msg.received_at - sent < 0.6  # well before the 1 s buffer timeout


def test_unbuffered_client_gets_messages_at_once(connect: Connect, topic: str) -> None:
    client = connect()
    # size -1 means unbuffered and overrides the timeout given with it
    client.identify_ok(output_buffer_size=-1, output_buffer_timeout=1000)
    client.sub(topic, "ch")
    client.rdy(10)
    connect().pub(topic, b"direct")
    sent = time.monotonic()
    assert client.read_message().received_at - sent < 0.6


def test_sample_rate_delivers_about_half(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(sample_rate=50)
    client.sub(topic, "ch")
    client.rdy(2500)
    connect().mpub(topic, bodies(1000))
    got: set[bytes] = set()
    while (msg := client.poll_message(1.0)) is not None:  # until the stream goes quiet
        assert msg.body not in got and msg.attempts == 1
        got.add(msg.body)
        client.fin(msg.id)
    # Go sends when rand[0,100) <= 50: p = 0.51; the others are dropped, not requeued
    assert 400 <= len(got) <= 620, len(got)
