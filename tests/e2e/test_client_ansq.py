"""ansq 0.3.0 (asyncio) against our nsqd, direct TCP only (its lookupd/HTTP parts need
nsqlookupd and nsqd's HTTP API, which these tests do not use).

ansq's Reader keeps RDY 1 per connection, so messages come one at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ansq
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


async def next_message(reader: Any, timeout: float = 5.0) -> Any:
    message = await asyncio.wait_for(reader.wait_for_message(), timeout)
    assert message is not None, "a connection closed"
    return message


async def assert_no_message(reader: Any, timeout: float = 0.5) -> None:
    try:
        message = await asyncio.wait_for(reader.wait_for_message(), timeout)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected message {message!r}")


def ok(response: Any) -> bool:
    """ansq returns a response schema (falsy for errors), or None."""
    return response is not None and bool(response.is_ok)


def test_ansq_publish_and_consume(nsqd: ServerProcess, topic: str) -> None:
    singles = [f"pub-{i}".encode() for i in range(20)]
    batch = [f"mpub-{i}".encode() for i in range(30)]

    async def scenario() -> tuple[list[Any], list[tuple[bytes, int]]]:
        writer = await ansq.create_writer(nsqd_tcp_addresses=[nsqd.tcp_address])
        responses = [await writer.pub(topic, body) for body in singles]
        responses.append(await writer.mpub(topic, *batch))
        await writer.close()

        reader = await ansq.create_reader(
            topic=topic, channel="ansq", nsqd_tcp_addresses=[nsqd.tcp_address]
        )
        seen: list[tuple[bytes, int]] = []
        for _ in range(len(singles) + len(batch)):
            message = await next_message(reader)
            seen.append((message.body, message.attempts))
            await message.fin()
        await assert_no_message(reader)
        await reader.close()
        return responses, seen

    responses, seen = run(scenario)
    assert all(ok(r) for r in responses), responses
    assert [body for body, _ in seen] == [*singles, *batch]
    assert all(attempts == 1 for _, attempts in seen)


def test_ansq_requeue_and_touch(nsqd: ServerProcess, topic: str) -> None:
    async def scenario() -> list[tuple[bytes, int]]:
        writer = await ansq.create_writer(nsqd_tcp_addresses=[nsqd.tcp_address])
        assert ok(await writer.mpub(topic, b"ok-1", b"retry", b"ok-2"))
        await writer.close()
        reader = await ansq.create_reader(
            topic=topic, channel="ansq", nsqd_tcp_addresses=[nsqd.tcp_address]
        )
        seen: list[tuple[bytes, int]] = []
        while len(seen) < 4:
            message = await next_message(reader)
            seen.append((message.body, message.attempts))
            await message.touch()
            if message.body == b"retry" and message.attempts == 1:
                await message.req(0)  # REQ <id> 0
            else:
                await message.fin()
        await assert_no_message(reader)
        await reader.close()
        return seen

    seen = run(scenario)
    assert sorted(seen) == sorted([(b"ok-1", 1), (b"retry", 1), (b"ok-2", 1), (b"retry", 2)])
    assert seen.index((b"retry", 1)) < seen.index((b"retry", 2))


def test_ansq_deferred_publish(nsqd: ServerProcess, topic: str) -> None:
    async def scenario() -> list[bytes]:
        writer = await ansq.create_writer(nsqd_tcp_addresses=[nsqd.tcp_address])
        assert ok(await writer.dpub(topic, b"deferred", 500))
        assert ok(await writer.pub(topic, b"now"))
        await writer.close()
        reader = await ansq.create_reader(
            topic=topic, channel="ansq", nsqd_tcp_addresses=[nsqd.tcp_address]
        )
        bodies = []
        for _ in range(2):
            message = await next_message(reader)
            bodies.append(message.body)
            await message.fin()
        await reader.close()
        return bodies

    assert run(scenario) == [b"now", b"deferred"]


def test_ansq_sees_nsqd_error(nsqd: ServerProcess) -> None:
    host, port = nsqd.tcp_host_port

    async def scenario() -> Any:
        options = ansq.ConnectionOptions(auto_reconnect=False)
        conn = await ansq.open_connection(host, port, connection_options=options)
        # ansq validates names itself; execute() sends the command as it is
        response = await conn.execute("PUB", "bad!topic", data=b"x")
        await conn.close()
        return response

    response = run(scenario)
    assert not response and response.code == "E_BAD_TOPIC"
    assert response.body == b'PUB topic name "bad!topic" is not valid'
