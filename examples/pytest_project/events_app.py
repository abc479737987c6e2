"""The code under test: publishes and consumes events with pynsq (tornado)."""

from __future__ import annotations

import asyncio
from typing import Any

import nsq


async def publish(nsqd_tcp_address: str, topic: str, events: list[bytes], **options: Any) -> None:
    """PUB each event; returns once nsqd has acknowledged every one."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    class Writer(nsq.Writer):  # type: ignore[misc]
        def _on_connection_ready(self, conn: Any, **kwargs: Any) -> None:
            super()._on_connection_ready(conn, **kwargs)
            if not ready.done():
                ready.set_result(None)

    writer = Writer([nsqd_tcp_address], **options)
    await ready
    for event in events:
        done: asyncio.Future[Any] = loop.create_future()
        writer.pub(topic, event, callback=lambda conn, data, f=done: f.done() or f.set_result(data))
        reply = await done
        if isinstance(reply, Exception):
            raise reply
    for conn in list(writer.conns.values()):
        conn.close()


async def consume(topic: str, channel: str, count: int, **reader: Any) -> list[bytes]:
    """Read ``count`` events (``nsqd_tcp_addresses=`` or ``lookupd_http_addresses=``)."""
    received: list[bytes] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def handler(message: nsq.Message) -> bool:
        received.append(message.body)
        if len(received) >= count and not done.done():
            done.set_result(None)
        return True

    r = nsq.Reader(
        topic=topic,
        channel=channel,
        message_handler=handler,
        max_in_flight=10,
        lookupd_poll_interval=1,
        **reader,
    )
    try:
        await done
    finally:
        r.close()
    return received
