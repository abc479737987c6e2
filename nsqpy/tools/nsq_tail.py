"""``nsq_tail``: consume topics and print the message bodies to stdout (spec §6)."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from nsqpy.client import Message
from nsqpy.common.goflags import Kind, flag
from nsqpy.tools._common import (
    ConsumerFlags,
    consume_until_stopped,
    consumer_options,
    fatal,
    go_log,
    parse_tool_args,
    require_one_source,
    run,
    setup_client_logging,
)

__all__ = ["Options", "main"]


@dataclass
class Options(ConsumerFlags):
    """nsq_tail's flags (apps/nsq_tail)."""

    topics: list[str] = flag(
        "topic",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="NSQ topic (may be given multiple times)",
    )
    channel: str = flag("channel", "", kind=Kind.STRING, help="NSQ channel")
    total_messages: int = flag(
        "n", 0, kind=Kind.INT, help="total messages to show (will wait if starved)"
    )
    print_topic: bool = flag(
        "print-topic", False, kind=Kind.BOOL, help="print topic name where message was received"
    )


class TailHandler:
    """Writes the bodies of one topic's messages, one per line; ``-n`` counts per topic."""

    def __init__(
        self, topic: str, total: int, print_topic: bool, out: BinaryIO, done: Callable[[], None]
    ) -> None:
        self.prefix = topic.encode() + b" | " if print_topic else b""
        self.total = total
        self.shown = 0
        self.out = out
        self.done = done
        self.finished = False

    def __call__(self, messages: list[Message]) -> None:
        if self.finished:
            for msg in messages:
                msg.requeue(0, backoff=False)
            return
        parts: list[bytes] = []
        prefix = self.prefix
        for i, msg in enumerate(messages):
            if prefix:
                parts.append(prefix)
            parts.append(msg.body)
            parts.append(b"\n")
            self.shown += 1
            if self.total and self.shown >= self.total:
                # Go exits the process here; the rest of this read goes back to nsqd.
                for rest in messages[i + 1 :]:
                    rest.requeue(0, backoff=False)
                self.finished = True
                self.done()
                break
        try:
            self.out.write(b"".join(parts))
            self.out.flush()
        except (OSError, ValueError) as err:
            go_log(f"ERROR: failed to write to os.Stdout - {err}")
            os._exit(1)


async def tail(opts: Options) -> int:
    channel = opts.channel or f"tail{random.randrange(1 << 62) % 999999:06d}#ephemeral"
    if not opts.topics:
        fatal("--topic is required")
    require_one_source(opts.nsqd_tcp_addresses, opts.lookupd_http_addresses)
    max_in_flight = opts.max_in_flight
    # Don't ask for more messages than we want
    if 0 < opts.total_messages < max_in_flight:
        max_in_flight = opts.total_messages
    setup_client_logging()
    options = consumer_options(opts.consumer_opts, "nsq_tail", max_in_flight)
    stop = asyncio.Event()
    consumers = []
    for topic in opts.topics:
        go_log(f"Adding consumer for topic: {topic}")  # stderr: stdout holds only messages
        handler = TailHandler(
            topic, opts.total_messages, opts.print_topic, sys.stdout.buffer, stop.set
        )
        consumers.append(opts.new_consumer(topic, channel, options, batch_handler=handler))
    await consume_until_stopped(consumers, stop)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """The ``nsq_tail`` command."""
    opts = parse_tool_args(Options, argv, "nsq_tail").options
    run(lambda: tail(opts))


if __name__ == "__main__":
    main()
