"""gnsq 1.0.2 (gevent) against our nsqd, direct TCP only (no nsqlookupd, no HTTP client).

gnsq talks through ``gevent.socket`` itself, so no monkey-patching is needed and
the tests run in-process: the gevent hub runs whenever the test blocks on a gevent
primitive (an Event with a timeout), never through sleeps.
"""

from __future__ import annotations

from typing import Any

import gevent  # type: ignore[import-untyped]
import gevent.event  # type: ignore[import-untyped]
import gnsq  # type: ignore[import-untyped]
import pytest

from tests.support.procs import ServerProcess

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 15.0


@pytest.fixture
def nsqd(shared_nsqd: ServerProcess) -> ServerProcess:
    """Tests here are independent (own topic names): one nsqd serves the whole module."""
    return shared_nsqd


def make_producer(nsqd: ServerProcess) -> gnsq.Producer:
    producer = gnsq.Producer(nsqd_tcp_addresses=[nsqd.tcp_address])
    producer.start()
    return producer


def consume(
    nsqd: ServerProcess,
    topic: str,
    expected: int,
    handler: Any = None,
    **kwargs: Any,
) -> list[tuple[bytes, int]]:
    """Run a gnsq.Consumer until ``expected`` messages were handled (auto-FIN)."""
    seen: list[tuple[bytes, int]] = []
    done = gevent.event.Event()
    consumer = gnsq.Consumer(topic, "gnsq", nsqd_tcp_addresses=[nsqd.tcp_address], **kwargs)

    def on_message(_consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        seen.append((message.body, message.attempts))
        if handler is not None:
            handler(message)
        if len(seen) >= expected:
            done.set()

    consumer.on_message.connect(on_message)
    consumer.start(block=False)
    try:
        assert done.wait(TIMEOUT), f"only {len(seen)} of {expected} messages"
        extra = gevent.event.Event()
        extra.wait(0.5)  # let anything unexpected arrive (runs the hub)
    finally:
        consumer.close()
        consumer.join(5)
    return seen


def test_gnsq_publish_and_consume(nsqd: ServerProcess, topic: str) -> None:
    singles = [f"pub-{i}".encode() for i in range(20)]
    batch = [f"mpub-{i}".encode() for i in range(30)]
    producer = make_producer(nsqd)
    try:
        responses = [producer.publish(topic, body, timeout=TIMEOUT) for body in singles]
        responses.append(producer.multipublish(topic, batch, timeout=TIMEOUT))
    finally:
        producer.close()
        producer.join(5)
    assert responses == [b"OK"] * 21
    seen = consume(nsqd, topic, 50, max_in_flight=10)
    assert [body for body, _ in seen] == [*singles, *batch]
    assert all(attempts == 1 for _, attempts in seen)


def test_gnsq_requeue(nsqd: ServerProcess, topic: str) -> None:
    producer = make_producer(nsqd)
    try:
        producer.multipublish(topic, [b"ok-1", b"retry", b"ok-2"], timeout=TIMEOUT)
    finally:
        producer.close()
        producer.join(5)

    def handler(message: gnsq.Message) -> None:
        if message.body == b"retry" and message.attempts == 1:
            message.requeue(time_ms=0, backoff=False)  # REQ <id> 0

    seen = consume(nsqd, topic, 4, handler=handler, max_in_flight=1)
    assert sorted(seen) == sorted([(b"ok-1", 1), (b"retry", 1), (b"ok-2", 1), (b"retry", 2)])
    assert seen.index((b"retry", 1)) < seen.index((b"retry", 2))


def test_gnsq_deferred_publish(nsqd: ServerProcess, topic: str) -> None:
    producer = make_producer(nsqd)
    try:
        assert producer.publish(topic, b"deferred", defer=500, timeout=TIMEOUT) == b"OK"
        assert producer.publish(topic, b"now", timeout=TIMEOUT) == b"OK"
    finally:
        producer.close()
        producer.join(5)
    seen = consume(nsqd, topic, 2, max_in_flight=5)
    assert [body for body, _ in seen] == [b"now", b"deferred"]


def test_gnsq_tcp_client_sees_nsqd_errors(nsqd: ServerProcess, topic: str) -> None:
    host, port = nsqd.tcp_host_port
    conn = gnsq.NsqdTCPClient(host, port)
    conn.connect()
    try:
        conn.identify()
        conn.subscribe(topic, "gnsq")
        assert conn.read_response() == (0, b"OK")
        conn.finish(b"0123456789abcdef")
        frame, error = conn.read_response()
        assert frame == 1 and isinstance(error, gnsq.errors.NSQFinishFailed)
        assert not error.fatal  # E_FIN_FAILED keeps the connection
        assert error.args == (b"FIN 0123456789abcdef failed ID not in flight",)  # code dropped
        conn.ready(1)
        conn.nop()
        conn.send(b"RDY x\n")
        frame, error = conn.read_response()
        assert frame == 1 and isinstance(error, gnsq.errors.NSQInvalid)
        assert error.args == (b"RDY could not parse count x",)
    finally:
        conn.close_stream()
