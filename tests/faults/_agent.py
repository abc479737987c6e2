"""A consumer or a publisher of the partition tests, run as a process inside a node.

``python -m tests.faults._agent consume --topic t --channel c --lookupd 10.28.1.2:4161``
prints one JSON line per message it handles, when it gets it (``{"body", "attempts",
"at"}``, ``at`` in ns of ``time.time_ns``), then finishes it after ``--hold`` seconds.
``publish --nsqd ADDR --topic t --rate R --count N`` publishes bodies ``"<seq> <ns>"`` at that
rate (pipelined: a slow reply holds up no tick) and prints ``{"acked": seq}`` after each OK (or ``{"failed": seq, "error": ...}``), then
``{"done": true}``. Both print ``{"started": true}`` once connected. The nsqpy client is the
one under test: its options are the ones a user sets for quick failure detection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from nsqpy.client import Consumer, Message, Producer


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def consume(args: argparse.Namespace) -> None:
    async def handle(msg: Message) -> None:
        emit(body=msg.body.decode(), attempts=msg.attempts, at=time.time_ns())
        if args.hold:
            await asyncio.sleep(args.hold)

    consumer = Consumer(
        args.topic,
        args.channel,
        handle,
        nsqd_tcp_addresses=args.nsqd,
        lookupd_http_addresses=args.lookupd,
        concurrency=args.max_in_flight,
        max_in_flight=args.max_in_flight,
        heartbeat_interval=1.0,
        read_timeout=2.0,
        lookupd_poll_interval=1.0,
        lookupd_poll_jitter=0.0,
        max_reconnect_delay=1.0,
        output_buffer_timeout=0.025,
        max_attempts=0,
    )
    await consumer.start()
    emit(started=True)
    await asyncio.Event().wait()  # until SIGTERM


async def publish(args: argparse.Namespace) -> None:
    """Steady publishing at ``--rate``, whatever the round trip: each PUB is sent on its tick
    and answered in its time (the producer pipelines them on its connection)."""

    async def one(seq: int) -> None:
        try:
            await producer.pub(args.topic, f"{seq} {time.time_ns()}")
        except Exception as err:
            emit(failed=seq, error=str(err))
        else:
            emit(acked=seq)

    async with Producer(args.nsqd, reply_timeout=30.0) as producer:
        await producer.connect()
        emit(started=True)
        period = 1.0 / args.rate
        next_at = time.monotonic()
        pending = set()
        for seq in range(1, args.count + 1):
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
            task = asyncio.ensure_future(one(seq))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
    emit(done=True)


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("consume")
    c.add_argument("--topic", required=True)
    c.add_argument("--channel", required=True)
    c.add_argument("--nsqd", action="append", default=[])
    c.add_argument("--lookupd", action="append", default=[])
    c.add_argument("--hold", type=float, default=0.0)
    c.add_argument("--max-in-flight", type=int, default=10)
    pub = sub.add_parser("publish")
    pub.add_argument("--nsqd", required=True)
    pub.add_argument("--topic", required=True)
    pub.add_argument("--rate", type=float, default=100.0)
    pub.add_argument("--count", type=int, default=1000)
    args = p.parse_args()
    try:
        asyncio.run(consume(args) if args.mode == "consume" else publish(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
