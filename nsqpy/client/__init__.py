"""The nsqpy client: asyncio and blocking producers and consumers for NSQ.

::

    from nsqpy.client import Consumer, Message, Producer

    async with Producer("127.0.0.1:4150") as producer:
        await producer.pub("events", b"hello")

    async def handle(msg: Message) -> None:
        print(msg.body)

    async with Consumer("events", "archive", handle, nsqd_tcp_addresses=["127.0.0.1:4150"]):
        ...

See docs/CLIENT.md for the options and a comparison with go-nsq and pynsq.
"""

from nsqpy.client._blocking import BlockingConsumer, BlockingProducer
from nsqpy.client._consumer import Consumer
from nsqpy.client._errors import (
    NSQClientError,
    NSQClosedError,
    NSQConnectionError,
    NSQError,
    NSQLookupdError,
    NSQProtocolError,
    NSQTimeoutError,
)
from nsqpy.client._message import Message
from nsqpy.client._producer import Producer

__all__ = [
    "BlockingConsumer",
    "BlockingProducer",
    "Consumer",
    "Message",
    "NSQClientError",
    "NSQClosedError",
    "NSQConnectionError",
    "NSQError",
    "NSQLookupdError",
    "NSQProtocolError",
    "NSQTimeoutError",
    "Producer",
]
