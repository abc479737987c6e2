#!/usr/bin/env python3
"""The CPU of one single-message publish inside nsqd, without sockets or the event loop.

``run_shapes.py``'s 200B-pub shape measures a PUB end to end, where the kernel's loopback
write and the VM's wake-ups are half the figure and vary by the hour. This runs the
Python part alone, in process: an in-process nsqd (``nsqpy.testing.AsyncNSQD``), one
publisher and two consumers (RDY 2500) whose transports are stand-ins that keep what is
written. Each cycle feeds the publisher's connection one ``PUB`` as a read, which is
answered ``OK`` and delivered to a consumer; every 64 cycles the consumers' FINs for what
they got come in as one read each, as a consumer's batched FINs do.

Run it with the interpreter of the build to measure (the compiled wheel's venv, or the
development venv for pure Python)::

    /path/to/venv/bin/python bench/bench_pub_path.py --cycles 200000 --rounds 5

Prints the median and best ns per cycle over the rounds.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import struct
import sys
import time
from typing import Any

from nsqpy.nsqd.protocol_v2 import ClientV2
from nsqpy.testing import AsyncNSQD

TOPIC = "path"
CHANNEL = "ch"
FIN_EVERY = 64


class Transport:
    """What ClientV2 calls on its transport; written bytes are kept in ``out``."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def writelines(self, pieces: Any) -> None:
        self.out.append(b"".join(pieces))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def _connect(server: Any) -> tuple[ClientV2, Transport]:
    client = server.new_client()
    transport = Transport()
    client.connection_made(transport)
    client.data_received(b"  V2")
    return client, transport


def _message_ids(data: bytes) -> list[bytes]:
    """The IDs of the message frames in ``data``."""
    ids = []
    pos = 0
    while pos < len(data):
        size, frame_type = struct.unpack_from(">ii", data, pos)
        if frame_type == 2:
            ids.append(data[pos + 18 : pos + 34])
        pos += 4 + size
    return ids


async def run(cycles: int, rounds: int, size: int) -> list[float]:
    async with AsyncNSQD(log_level="warn") as nsqd:
        server = nsqd.server
        assert server is not None
        publisher, pub_out = _connect(server)
        consumers = []
        for _ in range(2):
            consumer, out = _connect(server)
            consumer.data_received(f"SUB {TOPIC} {CHANNEL}\nRDY 2500\n".encode())
            consumers.append((consumer, out))
        pub = b"PUB " + TOPIC.encode() + b"\n" + struct.pack(">i", size) + b"x" * size
        feed = publisher.data_received
        results = []
        for _ in range(rounds):
            gc.collect()
            start = time.perf_counter_ns()
            for i in range(cycles):
                feed(pub)
                if i % FIN_EVERY == FIN_EVERY - 1:
                    pub_out.out.clear()
                    for consumer, out in consumers:
                        consumer._flush()  # the output buffer's timer, due
                        if out.out:
                            ids = _message_ids(b"".join(out.out))
                            out.out.clear()
                            consumer.data_received(b"".join(b"FIN %s\n" % m for m in ids))
            results.append((time.perf_counter_ns() - start) / cycles)
        delivered = sum(consumer.message_count for consumer, _ in consumers)
        if delivered != cycles * rounds:
            raise SystemExit(f"{delivered} of {cycles * rounds} messages delivered")
        return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=200)
    args = p.parse_args(argv)
    import uvloop

    results = uvloop.run(run(args.cycles, args.rounds, args.size))
    compiled = (sys.modules[ClientV2.__module__].__file__ or "").endswith(".so")
    print(
        f"{sys.version.split()[0]} {'compiled' if compiled else 'pure'}: "
        f"median {statistics.median(results):.0f} ns/cycle, best {min(results):.0f} "
        f"({', '.join(f'{r:.0f}' for r in results)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
