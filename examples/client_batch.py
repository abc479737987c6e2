"""The fastest path: a plain-function batch handler, called once per network read.

    .venv/bin/python examples/client_batch.py 127.0.0.1:4150 events bulk

Prints the count every second until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import sys

from nsqpy.client import Consumer, Message

total = 0


def handle(messages: list[Message]) -> None:
    # Runs in the connection's read callback: no task, no future; all the FINs of the
    # batch go out in one write when it returns.
    global total
    total += len(messages)


async def main(address: str, topic: str, channel: str) -> None:
    async with Consumer(
        topic, channel, batch_handler=handle, nsqd_tcp_addresses=[address], max_in_flight=2500
    ) as consumer:
        while True:
            await asyncio.sleep(1)
            print(f"{total} messages, {consumer.stats()}")


if __name__ == "__main__":
    asyncio.run(main(*(sys.argv[1:4] or ["127.0.0.1:4150", "events", "bulk"])))
