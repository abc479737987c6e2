"""Publish with the asyncio Producer: PUB, MPUB, DPUB, many publishes in flight.

.venv/bin/python examples/client_producer.py 127.0.0.1:4150 events
"""

from __future__ import annotations

import asyncio
import sys

from nsqpy.client import NSQError, Producer


async def main(address: str, topic: str) -> None:
    async with Producer(address) as producer:
        await producer.pub(topic, b"hello")
        await producer.mpub(topic, [b"one", b"two", b"three"])  # atomic: all or none
        await producer.dpub(topic, 5.0, b"in five seconds")
        # pipelined: 1000 publishes share the connection, replies matched in order
        await asyncio.gather(*(producer.pub(topic, f"msg {i}") for i in range(1000)))
        try:
            await producer.pub("not a valid topic!", b"x")
        except NSQError as err:
            print("refused:", err)  # the wire text: "E_BAD_TOPIC PUB topic name ..."


if __name__ == "__main__":
    asyncio.run(main(*(sys.argv[1:3] or ["127.0.0.1:4150", "events"])))
