"""``to_nsq``: publish stdin, split on a delimiter, to every given nsqd (spec §6)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nsqpy.client import NSQClientError, Producer
from nsqpy.common.goflags import Kind, flag
from nsqpy.tools._common import (
    fatal,
    go_log,
    on_signals,
    parse_tool_args,
    producer_options,
    run,
    setup_client_logging,
)

__all__ = ["Options", "main"]

# Lines read in one go are published as one MPUB (at most this many bytes), so that a
# fast stdin is not throttled by one round trip per line; nsqd sees the same messages.
_BATCH_BYTES = 512 * 1024
_READ_SIZE = 256 * 1024


@dataclass
class Options:
    """to_nsq's flags (apps/to_nsq)."""

    topic: str = flag("topic", "", kind=Kind.STRING, help="NSQ topic to publish to")
    delimiter: str = flag(
        "delimiter", "\n", kind=Kind.STRING, help="character to split input from stdin"
    )
    nsqd_tcp_addresses: list[str] = flag(
        "nsqd-tcp-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="destination nsqd TCP address (may be given multiple times)",
    )
    producer_opts: list[str] = flag(
        "producer-opt",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="option to passthrough to nsq.Producer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    )
    rate: int = flag("rate", 0, kind=Kind.INT, help="Throttle messages to n/second. 0 to disable")


class _Throttle:
    """to_nsq's token bucket: one token per 1/rate s, at most ``rate`` saved up."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.interval = 1.0 / rate
        self.balance = 1.0
        self.last = time.monotonic()

    async def take(self) -> None:
        now = time.monotonic()
        self.balance = min(float(self.rate), self.balance + (now - self.last) / self.interval)
        self.last = now
        if self.balance < 1:
            await asyncio.sleep((1 - self.balance) * self.interval)
            self.balance = 1.0
            self.last = time.monotonic()
        self.balance -= 1


async def publish_stdin(opts: Options) -> int:
    if not opts.topic:
        fatal("--topic required")
    delimiter = opts.delimiter.encode("utf-8", "surrogateescape")
    if len(delimiter) != 1:
        fatal("--delimiter must be a single byte")
    setup_client_logging()
    options = producer_options(opts.producer_opts, "to_nsq")
    addresses = list(dict.fromkeys(opts.nsqd_tcp_addresses))
    if not addresses:
        fatal("--nsqd-tcp-address required")
    try:
        producers = [Producer(a, **options) for a in addresses]
    except (ValueError, TypeError) as err:
        fatal(f"failed to create nsq.Producer - {err}")
    throttle = _Throttle(opts.rate) if opts.rate >= 1 else None
    if throttle is not None:
        go_log(f"Throttling messages rate to max:{opts.rate}/second")

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    on_signals(stopping.set)
    stdin_fd = sys.stdin.fileno()
    topic = opts.topic

    async def publish(bodies: list[bytes]) -> None:
        try:
            if len(bodies) == 1:
                await asyncio.gather(*(p.pub(topic, bodies[0]) for p in producers))
            else:
                await asyncio.gather(*(p.mpub(topic, bodies) for p in producers))
        except NSQClientError as err:
            fatal(str(err))

    # A daemon thread reads stdin: a blocked read must not keep the process alive. It
    # reads at most 4 chunks ahead (a slot each, given back as the loop takes it), and
    # hands them over with call_soon_threadsafe: no coroutine is made in the thread, so a
    # loop that closed first (a fatal error) leaves none un-awaited to warn about.
    chunks: asyncio.Queue[bytes] = asyncio.Queue()
    slots = threading.Semaphore(4)

    def read_stdin() -> None:
        while True:
            slots.acquire()
            try:
                chunk = os.read(stdin_fd, _READ_SIZE)
            except (OSError, ValueError):
                chunk = b""
            try:
                loop.call_soon_threadsafe(chunks.put_nowait, chunk)
            except RuntimeError:  # the loop is closed
                return
            if not chunk:
                return

    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()

    async def read_loop() -> None:
        rest = b""
        while not stopping.is_set():
            chunk = await chunks.get()
            slots.release()
            if not chunk:
                break
            data = rest + chunk if rest else chunk
            pieces = data.split(delimiter)
            rest = pieces.pop()
            await send([p for p in pieces if p])
        if rest and not stopping.is_set():
            await send([rest])

    async def send(bodies: list[bytes]) -> None:
        if throttle is not None:
            for body in bodies:
                if stopping.is_set():
                    return
                await throttle.take()
                await publish([body])
            return
        batch: list[bytes] = []
        size = 0
        for body in bodies:
            batch.append(body)
            size += len(body) + 4
            if size >= _BATCH_BYTES:
                await publish(batch)
                batch, size = [], 0
        if batch:
            await publish(batch)

    reader = asyncio.ensure_future(read_loop())
    stop_wait = asyncio.ensure_future(stopping.wait())
    await asyncio.wait([reader, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if reader.done():
        reader.result()
    else:
        reader.cancel()
    await asyncio.gather(*(p.close() for p in producers))
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """The ``to_nsq`` command."""
    opts = parse_tool_args(Options, argv, "to_nsq").options
    run(lambda: publish_stdin(opts))


if __name__ == "__main__":
    main()
