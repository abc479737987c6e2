"""pynsq 0.9.1 (tornado) against our nsqd, direct TCP only (no nsqlookupd yet).

Each test runs tornado's IOLoop (which is asyncio's loop) in the test thread with
``asyncio.run`` and a timeout: readiness, publish responses and the arrival of the
last expected message are futures, never sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nsq  # type: ignore[import-untyped]
import pytest

from tests.support.procs import ServerProcess

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
TIMEOUT = 15.0


@pytest.fixture
def nsqd(shared_nsqd: ServerProcess) -> ServerProcess:
    """Tests here are independent (own topic names): one nsqd serves the whole module."""
    return shared_nsqd


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro_fn(), TIMEOUT)

    return asyncio.run(main())


class Writer(nsq.Writer):  # type: ignore[misc]  # untyped base
    """nsq.Writer that tells when its connection is ready."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        super().__init__(*args, **kwargs)

    def _on_connection_ready(self, conn: Any, **kwargs: Any) -> None:
        super()._on_connection_ready(conn, **kwargs)
        if not self.ready.done():
            self.ready.set_result(conn)

    def send(self, method: str, *args: Any) -> asyncio.Future[Any]:
        """Call pub/mpub/dpub; the future gets the response (b"OK") or the nsq.Error."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def callback(conn: Any, data: Any) -> None:
            if not fut.done():
                fut.set_result(data)

        getattr(self, method)(*args, callback=callback)
        return fut

    def close(self) -> None:
        for conn in list(self.conns.values()):
            conn.close()


def test_pynsq_publish_and_consume(nsqd: ServerProcess, topic: str) -> None:
    singles = [f"pub-{i}".encode() for i in range(20)]
    batch = [f"mpub-{i}".encode() for i in range(30)]
    expected = [*singles, *batch]

    async def scenario() -> tuple[list[Any], list[tuple[bytes, int]], Any]:
        loop = asyncio.get_running_loop()
        writer = Writer([nsqd.tcp_address])
        await writer.ready
        responses = [await writer.send("pub", topic, body) for body in singles]
        responses.append(await writer.send("mpub", topic, batch))

        received: list[tuple[bytes, int]] = []
        done = loop.create_future()

        def handler(message: nsq.Message) -> bool:
            received.append((message.body, message.attempts))
            if len(received) == len(expected) and not done.done():
                done.set_result(None)
            return True  # FIN

        reader = nsq.Reader(
            topic=topic,
            channel="pynsq",
            nsqd_tcp_addresses=[nsqd.tcp_address],
            message_handler=handler,
            max_in_flight=10,
        )
        await done
        await asyncio.sleep(0.5)  # an absence window: nothing more may arrive
        reader.close()
        writer.close()
        return responses, received, None

    responses, received, _ = run(scenario)
    assert responses == [b"OK"] * (len(singles) + 1)
    assert [body for body, _ in received] == expected
    assert all(attempts == 1 for _, attempts in received)


def test_pynsq_requeue(nsqd: ServerProcess, topic: str) -> None:
    async def scenario() -> list[tuple[bytes, int]]:
        loop = asyncio.get_running_loop()
        writer = Writer([nsqd.tcp_address])
        await writer.ready
        assert await writer.send("mpub", topic, [b"ok-1", b"retry", b"ok-2"]) == b"OK"
        seen: list[tuple[bytes, int]] = []
        done = loop.create_future()

        def handler(message: nsq.Message) -> bool | None:
            seen.append((message.body, message.attempts))
            if message.body == b"retry" and message.attempts == 1:
                message.requeue(backoff=False, delay=0)  # REQ <id> 0
                return None
            if len(seen) == 4 and not done.done():
                done.set_result(None)
            return True

        reader = nsq.Reader(
            topic=topic,
            channel="pynsq",
            nsqd_tcp_addresses=[nsqd.tcp_address],
            message_handler=handler,
            max_in_flight=1,
        )
        await done
        reader.close()
        writer.close()
        return seen

    seen = run(scenario)
    assert sorted(seen) == sorted([(b"ok-1", 1), (b"retry", 1), (b"ok-2", 1), (b"retry", 2)])
    assert seen.index((b"retry", 1)) < seen.index((b"retry", 2))


def test_pynsq_dpub(nsqd: ServerProcess, topic: str) -> None:
    async def scenario() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        writer = Writer([nsqd.tcp_address])
        await writer.ready
        arrived = loop.create_future()

        def handler(message: nsq.Message) -> bool:
            if not arrived.done():
                arrived.set_result((message.body, loop.time()))
            return True

        reader = nsq.Reader(
            topic=topic,
            channel="pynsq",
            nsqd_tcp_addresses=[nsqd.tcp_address],
            message_handler=handler,
        )
        start = loop.time()
        response = await writer.send("dpub", topic, 800, b"deferred")
        body, at = await arrived
        reader.close()
        writer.close()
        assert body == b"deferred"
        return response, at - start

    response, delay = run(scenario)
    assert response == b"OK"
    assert delay >= 0.75


def test_pynsq_sees_nsqd_error(nsqd: ServerProcess) -> None:
    async def scenario() -> Any:
        writer = Writer([nsqd.tcp_address])
        await writer.ready
        result = await writer.send("pub", "bad!topic", b"x")
        writer.close()
        return result

    result = run(scenario)
    assert isinstance(result, nsq.Error)
    assert result.args == (b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid',)
