"""nsqpy.client._consumer without a network: RDY budget, redistribution, back-off, handlers."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from nsqpy.client import Consumer, Message

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class FakeConn:
    """What the consumer uses of a Conn."""

    def __init__(self, address: str, max_rdy: int = 2500) -> None:
        self.address = address
        self.max_rdy = max_rdy
        self.rdy = 0
        self.sent: list[int] = []
        self.in_flight = 0
        self.closing = False
        self.closed = False
        self.last_msg_time = 0.0
        self.last_rdy_time = 0.0
        self.responses: list[tuple[bytes, bool]] = []

    def send_rdy(self, count: int) -> None:
        self.rdy = count
        self.sent.append(count)
        self.last_rdy_time = asyncio.get_running_loop().time()

    def finish_all(self, msgs: list[Message]) -> None:
        for msg in msgs:
            if msg._auto and not msg._responded:
                msg.finish()

    def respond(self, msg: Message, finished: bool, delay: float, backoff: bool) -> None:
        self.in_flight -= 1
        self.responses.append((msg.id, finished))
        consumer: Consumer = self.consumer  # type: ignore[attr-defined]
        consumer.on_response(self, msg, finished, backoff)  # type: ignore[arg-type]


def noop(msg: Message) -> None:
    return None


def make(max_in_flight: int, n_conns: int, **options: Any) -> tuple[Consumer, list[FakeConn]]:
    consumer = Consumer(
        "t", "c", options.pop("handler", noop), max_in_flight=max_in_flight, **options
    )
    consumer._loop = asyncio.get_running_loop()
    conns = []
    for i in range(n_conns):
        conn = FakeConn(f"127.0.0.1:{4150 + i}")
        conn.consumer = consumer  # type: ignore[attr-defined]
        consumer._conns[conn.address] = conn  # type: ignore[assignment]
        for c in consumer._conns.values():
            consumer._maybe_update_rdy(c)  # type: ignore[arg-type]
        conns.append(conn)
    return consumer, conns


def deliver(consumer: Consumer, conn: FakeConn, n: int, attempts: int = 1) -> list[Message]:
    msgs = [Message(b"%016d" % i, 0, attempts, b"x", conn) for i in range(n)]  # type: ignore[arg-type]
    conn.in_flight += n
    conn.last_msg_time = asyncio.get_running_loop().time()
    consumer.on_messages(conn, msgs)  # type: ignore[arg-type]
    return msgs


def test_max_in_flight_spread_over_connections() -> None:
    async def main() -> None:
        consumer, conns = make(10, 3)
        assert [c.rdy for c in conns] == [3, 3, 3]
        assert consumer._total_rdy == 9
        # the first connection started with everything and was lowered as others came
        assert conns[0].sent == [10, 5, 3]

    arun(main())


def test_more_connections_than_max_in_flight() -> None:
    async def main() -> None:
        consumer, conns = make(2, 3)
        assert [c.rdy for c in conns] == [1, 1, 0]
        assert consumer._total_rdy == 2
        # the starved one retries later; redistribution moves RDY off idle connections
        assert conns[2].address in consumer._rdy_retry
        now = asyncio.get_running_loop().time()
        conns[0].last_msg_time = now  # busy
        conns[1].last_msg_time = now - 60  # idle
        random.seed(1)
        consumer._redistribute()
        assert conns[0].rdy == 1  # busy: keeps it
        assert conns[1].rdy + conns[2].rdy == 1  # idle one gave it up, a zero one got it
        assert sum(c.rdy for c in conns) == 2
        assert consumer._total_rdy == 2
        for _ in range(20):  # whoever holds RDY, the budget holds
            for c in conns:
                c.last_msg_time = now - 60
            consumer._need_redistribute = True
            consumer._redistribute()
            assert sum(c.rdy for c in conns) <= 2
        for timer in consumer._rdy_retry.values():
            timer.cancel()

    arun(main())


def test_set_max_in_flight_respreads_rdy() -> None:
    async def main() -> None:
        consumer, conns = make(10, 2)
        consumer.set_max_in_flight(4)
        assert [c.rdy for c in conns] == [2, 2]
        consumer.set_max_in_flight(0)
        assert [c.rdy for c in conns] == [0, 0]
        consumer.set_max_in_flight(30)
        assert [c.rdy for c in conns] == [15, 15]
        assert consumer._total_rdy == 30

    arun(main())


def test_rdy_never_above_max_rdy_count() -> None:
    async def main() -> None:
        consumer = Consumer("t", "c", noop, max_in_flight=5000)
        consumer._loop = asyncio.get_running_loop()
        conn = FakeConn("127.0.0.1:4150", max_rdy=2500)
        consumer._conns[conn.address] = conn  # type: ignore[assignment]
        consumer._maybe_update_rdy(conn)  # type: ignore[arg-type]
        assert conn.rdy == 2500

    arun(main())


def test_closed_connection_gives_its_rdy_to_the_others() -> None:
    async def main() -> None:
        consumer, conns = make(10, 2)
        assert [c.rdy for c in conns] == [5, 5]
        consumer.on_close(conns[1], None)  # type: ignore[arg-type]
        assert conns[0].rdy == 10 and consumer._total_rdy == 10

    arun(main())


def test_backoff_state_machine() -> None:
    async def main() -> None:
        consumer, conns = make(
            10, 2, handler=Message.disable_auto_response, backoff_multiplier=0.01
        )
        msgs = deliver(consumer, conns[0], 4)
        msgs[0].requeue(0)  # handler failure: level 1, everything to RDY 0
        assert consumer.in_backoff and consumer._backoff_counter == 1
        assert [c.rdy for c in conns] == [0, 0]
        assert consumer._backoff_timer is not None
        msgs[1].requeue(0)  # during the back-off period nothing changes
        msgs[2].finish()
        assert consumer._backoff_counter == 1
        await asyncio.sleep(0.05)  # 0.01 x 2^1 s later: one connection gets RDY 1
        assert consumer._backoff_timer is None
        assert sorted(c.rdy for c in conns) == [0, 1]
        msgs[3].finish()  # success: level 0, all back to normal
        assert not consumer.in_backoff
        assert [c.rdy for c in conns] == [5, 5]

    arun(main())


def test_backoff_disabled_by_zero_max_backoff_duration() -> None:
    async def main() -> None:
        consumer, conns = make(10, 1, handler=Message.disable_auto_response, max_backoff_duration=0)
        msgs = deliver(consumer, conns[0], 1)
        msgs[0].requeue()
        assert not consumer.in_backoff and conns[0].rdy == 10

    arun(main())


def test_sync_handler_auto_responses_and_max_attempts() -> None:
    async def main() -> None:
        given_up: list[int] = []

        def handler(msg: Message) -> None:
            if msg.body == b"bad":
                raise ValueError("bad message")
            if msg.body == b"manual":
                msg.disable_auto_response()

        consumer, conns = make(
            10, 1, handler=handler, max_attempts=3, on_give_up=lambda m: given_up.append(m.attempts)
        )
        conn = conns[0]
        bodies = [b"good", b"bad", b"manual", b"old"]
        msgs = [
            Message(b"%016d" % i, 0, 4 if body == b"old" else 1, body, conn)  # type: ignore[arg-type]
            for i, body in enumerate(bodies)
        ]
        conn.in_flight = 4
        consumer.on_messages(conn, msgs)  # type: ignore[arg-type]
        assert dict(conn.responses) == {b"%016d" % 0: True, b"%016d" % 1: False, b"%016d" % 3: True}
        assert given_up == [4]
        assert not msgs[2].has_responded and msgs[2].auto_response_disabled
        stats = consumer.stats()
        assert (stats.messages_received, stats.messages_finished, stats.messages_requeued) == (
            4,
            2,
            1,
        )

    arun(main())


def test_async_and_batch_handlers() -> None:
    async def main() -> None:
        seen: list[list[bytes]] = []

        async def batch(messages: list[Message]) -> None:
            seen.append([m.body for m in messages])
            await asyncio.sleep(0)

        consumer, conns = make(10, 1, handler=None, batch_handler=batch)
        consumer._workers = [asyncio.ensure_future(consumer._worker())]
        await asyncio.sleep(0)
        deliver(consumer, conns[0], 3)
        deliver(consumer, conns[0], 2)
        for _ in range(10):
            await asyncio.sleep(0)
        assert [len(b) for b in seen] in ([5], [3, 2])
        assert len(conns[0].responses) == 5 and all(f for _, f in conns[0].responses)
        consumer._workers[0].cancel()

    arun(main())


def test_handler_choice_is_checked() -> None:
    with pytest.raises(ValueError):
        Consumer("t", "c")
    with pytest.raises(ValueError):
        Consumer("t", "c", noop, batch_handler=lambda ms: None)
    with pytest.raises(ValueError):
        Consumer("bad topic", "c", noop)
    with pytest.raises(TypeError):
        Consumer("t", "c", noop, not_an_option=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Consumer("t", "c", noop, nsqd_tcp_addresses="127.0.0.1:4150")
    assert Consumer("t", "c", noop)._async is False

    async def coro(m: Message) -> None:
        return None

    class Callable:
        async def __call__(self, m: Message) -> None:
            return None

    assert Consumer("t", "c", coro)._async is True
    assert Consumer("t", "c", Callable())._async is True
