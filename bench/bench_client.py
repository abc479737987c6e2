"""Throughput of the nsqpy client (nsqpy.client) against a real nsqd.

Publishes ``--count`` messages of ``--size`` bytes, then consumes them, once per mode:

* pub: ``--concurrency`` coroutines each awaiting PUB after PUB on one pipelined connection
* mpub: MPUB batches of ``--batch-size``
* sub-batch: a plain-function batch handler (``Consumer(batch_handler=...)``)
* sub-sync: a plain-function per-message handler
* sub-async: a coroutine per-message handler
* sub-blocking: ``BlockingConsumer.get_batch`` + ``finish`` from the main thread

It starts its own nsqd (``python -m nsqpy.nsqd`` on 127.0.0.1 port 0, a temp data dir)
unless ``--nsqd-tcp-address`` is given. Each consume mode reads a fresh channel holding
every published message, so the figures measure the client, not an empty queue::

    uv run python bench/bench_client.py                  # all modes, 200-byte messages
    uv run python bench/bench_client.py --count 500000 --modes pub,sub-batch
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from nsqpy.client import BlockingConsumer, Consumer, Message, Producer

PUB_MODES = ("pub", "mpub")
SUB_MODES = ("sub-batch", "sub-sync", "sub-async", "sub-blocking")


@contextmanager
def nsqd_process(command: str, extra: list[str]) -> Iterator[str]:
    """Start nsqd on 127.0.0.1:0 with a temp data dir; yield its TCP address."""
    with tempfile.TemporaryDirectory(prefix="bench-client-") as data:
        argv = [
            *shlex.split(command),
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=",
            "--mem-queue-size=10000000",
            f"--data-path={data}",
            *extra,
        ]
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert proc.stderr is not None
        address = None
        deadline = time.monotonic() + 15
        lines = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"TCP: listening on (\S+)", line)
            if m:
                address = m.group(1)
                break
        if address is None:
            proc.kill()
            raise SystemExit("nsqd did not start:\n" + "".join(lines))
        drain = threading.Thread(target=lambda: proc.stderr.read() if proc.stderr else None)
        drain.daemon = True
        drain.start()
        try:
            yield address
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def report(mode: str, count: int, size: int, seconds: float, cpu: float) -> None:
    rate = count / seconds
    mb = count * size / seconds / (1024 * 1024)
    print(
        f"{mode:13s} {count:9d} msgs  {seconds:7.3f}s  {rate:10.0f} msgs/s  {mb:7.2f} MB/s"
        f"  client CPU {cpu / count * 1e6:5.2f} us/msg"
    )
    sys.stdout.flush()


async def publish(
    address: str, topic: str, mode: str, count: int, size: int, args: argparse.Namespace
) -> float:
    body = b"a" * size
    async with Producer(address) as producer:
        await producer.connect()
        start = time.perf_counter()
        if mode == "pub":
            per = count // args.concurrency

            async def worker(n: int) -> None:
                for _ in range(n):
                    await producer.pub(topic, body)

            await asyncio.gather(*(worker(per) for _ in range(args.concurrency)))
        else:
            batch = [body] * args.batch_size
            for _ in range(count // args.batch_size):
                await producer.mpub(topic, batch)
        return time.perf_counter() - start


async def create_channels(address: str, topic: str, channels: list[str]) -> None:
    """SUB once per channel so every channel gets a copy of what is published next."""
    for channel in channels:

        def noop(m: Message) -> None:
            return None

        c = Consumer(topic, channel, noop, nsqd_tcp_addresses=[address], max_in_flight=0)
        await c.start()
        await c.close()


async def consume(address: str, topic: str, channel: str, mode: str, count: int, mif: int) -> float:
    done = asyncio.get_running_loop().create_future()
    seen = 0
    start = 0.0

    def count_n(n: int) -> None:
        nonlocal seen, start
        if not seen:
            start = time.perf_counter()
        seen += n
        if seen >= count and not done.done():
            done.set_result(time.perf_counter())

    def on_batch(msgs: list[Message]) -> None:
        count_n(len(msgs))

    def on_msg(msg: Message) -> None:
        count_n(1)

    async def on_msg_async(msg: Message) -> None:
        count_n(1)

    if mode == "sub-batch":
        consumer = Consumer(
            topic, channel, batch_handler=on_batch, nsqd_tcp_addresses=[address], max_in_flight=mif
        )
    elif mode == "sub-sync":
        consumer = Consumer(topic, channel, on_msg, nsqd_tcp_addresses=[address], max_in_flight=mif)
    else:
        consumer = Consumer(
            topic, channel, on_msg_async, nsqd_tcp_addresses=[address], max_in_flight=mif
        )
    t0 = time.perf_counter()
    async with consumer:
        end = await done
    return end - (start or t0)


def consume_blocking(address: str, topic: str, channel: str, count: int, mif: int) -> float:
    with BlockingConsumer(
        topic, channel, nsqd_tcp_addresses=[address], max_in_flight=mif
    ) as consumer:
        seen = 0
        start = 0.0
        while seen < count:
            batch = consumer.get_batch(timeout=10)
            if not batch:
                raise SystemExit("sub-blocking: no message for 10s")
            if not seen:
                start = time.perf_counter()
            seen += len(batch)
            consumer.finish(batch)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--nsqd-tcp-address", default="", help="use this nsqd instead of starting one"
    )
    parser.add_argument("--nsqd-bin", default=f"{sys.executable} -m nsqpy.nsqd")
    parser.add_argument("--nsqd-arg", action="append", default=[])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=200, help="outstanding PUBs (pub mode)")
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--modes", default=",".join(PUB_MODES + SUB_MODES))
    parser.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if args.uvloop:
        import uvloop

        uvloop.install()

    def run(address: str) -> None:
        topic = f"bench_client_{os.getpid()}"
        sub_modes = [m for m in modes if m in SUB_MODES]
        asyncio.run(create_channels(address, topic, sub_modes))
        print(
            f"nsqd {address}, {args.size}-byte messages, python {sys.version.split()[0]}, uvloop={args.uvloop}"
        )
        published = 0
        for mode in modes:
            if mode in PUB_MODES:
                cpu0 = time.process_time()
                seconds = asyncio.run(publish(address, topic, mode, args.count, args.size, args))
                cpu = time.process_time() - cpu0
                n = args.count // (args.concurrency if mode == "pub" else args.batch_size)
                n *= args.concurrency if mode == "pub" else args.batch_size
                published += n
                report(mode, n, args.size, seconds, cpu)
        if not published and sub_modes:
            seconds = asyncio.run(publish(address, topic, "mpub", args.count, args.size, args))
            published = args.count // args.batch_size * args.batch_size
        for mode in sub_modes:
            cpu0 = time.process_time()
            if mode == "sub-blocking":
                seconds = consume_blocking(address, topic, mode, published, args.max_in_flight)
            else:
                seconds = asyncio.run(
                    consume(address, topic, mode, mode, published, args.max_in_flight)
                )
            report(mode, published, args.size, seconds, time.process_time() - cpu0)

    if args.nsqd_tcp_address:
        run(args.nsqd_tcp_address)
    else:
        with nsqd_process(args.nsqd_bin, args.nsqd_arg) as address:
            run(address)


if __name__ == "__main__":
    main()
