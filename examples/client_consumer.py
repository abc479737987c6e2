"""Consume with the asyncio Consumer: a coroutine handler, discovery through nsqlookupd.

    .venv/bin/python examples/client_consumer.py 127.0.0.1:4161 events archive

Returning finishes a message, raising requeues it (and backs off); a message delivered
more than max_attempts times goes to on_give_up and is finished. Ctrl-C closes
gracefully: CLS, then the messages in flight are waited for.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from nsqpy.client import Consumer, Message


async def handle(msg: Message) -> None:
    print(msg.attempts, msg.body.decode(errors="replace"))
    if msg.body == b"later":
        msg.requeue(10.0, backoff=False)  # respond yourself: the consumer will not


def give_up(msg: Message) -> None:
    print("giving up on", msg.id, msg.body)


async def main(lookupd: str, topic: str, channel: str) -> None:
    consumer = Consumer(
        topic,
        channel,
        handle,
        lookupd_http_addresses=[lookupd],
        max_in_flight=100,
        concurrency=10,  # ten handler coroutines at a time
        max_attempts=5,
        on_give_up=give_up,
        lookupd_poll_interval=15,
    )
    await consumer.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(consumer.close()))
    await consumer.wait_closed()
    print(consumer.stats())


if __name__ == "__main__":
    asyncio.run(main(*(sys.argv[1:4] or ["127.0.0.1:4161", "events", "archive"])))
