#!/usr/bin/env python3
"""Publish load generator: a Python port of NSQ's ``bench/bench_writer``.

Standalone on purpose: it speaks the NSQ TCP protocol V2 itself and imports
nothing from nsqpy (only helpers from ``_benchlib.py`` next to it), so the same
tool measures a Go nsqd and ours.

Each worker is its own process with one TCP connection (Go runs GOMAXPROCS
goroutines). A worker sends the magic, IDENTIFY, then loops: one pre-encoded
MPUB of ``--batch-size`` messages of ``--size`` bytes, wait for its ``OK``.

Output, like Go's (``log`` prefix, stderr)::

    [bench_writer] 2024/01/02 15:04:05 duration: 10.000213s - 38.147mb/s - 200000.000ops/s - 5.000us/op

plus one JSON line on stdout for scripts (``run_bench.py``).
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from typing import TYPE_CHECKING, Any

from _benchlib import (
    FRAME_RESPONSE,
    ProtocolError,
    connect,
    log,
    parse_args,
    report,
    run_workers,
)

if TYPE_CHECKING:
    import multiprocessing as mp

PROG = "bench_writer"
OK_FRAME = struct.pack(">ii", 6, FRAME_RESPONSE) + b"OK"


def mpub_command(topic: str, size: int, batch_size: int) -> bytes:
    """``MPUB <topic>\\n[body size][count]([size][body])*count``, built once."""
    body = bytes(size)  # Go: make([]byte, size) -> zero bytes
    item = struct.pack(">i", size) + body
    payload = struct.pack(">i", batch_size) + item * batch_size
    return b"MPUB " + topic.encode() + b"\n" + struct.pack(">i", len(payload)) + payload


@dataclass(frozen=True)
class WorkerConfig:
    host: str
    port: int
    topic: str
    size: int
    batch_size: int
    runfor_ns: int


def pub_worker(
    idx: int,
    cfg: WorkerConfig,
    ready_q: mp.Queue[tuple[Any, ...]],
    go: EventType,
    start_ns: Any,
    result_q: mp.Queue[tuple[Any, ...]],
) -> None:
    try:
        sock, reader = connect(cfg.host, cfg.port, "writer")
        sock.settimeout(None)
    except (OSError, ProtocolError) as exc:
        ready_q.put(("error", idx, f"worker {idx}: {exc}"))
        return
    mpub = mpub_command(cfg.topic, cfg.size, cfg.batch_size)
    batch = cfg.batch_size
    ready_q.put(("ready", idx))
    go.wait()

    end_ns = start_ns.value + cfg.runfor_ns
    cpu0 = time.process_time()
    count = 0
    sendall = sock.sendall
    recv = sock.recv
    clock = time.monotonic_ns
    try:
        while True:
            sendall(mpub)
            reply = recv(65536)
            if reply != OK_FRAME:
                # rare path: a split reply, a heartbeat before the OK, or an error
                if not reply:
                    raise ProtocolError("connection closed by server")
                reader.buf += reply
                reader.expect_ok("MPUB")
                if reader.buf:
                    raise ProtocolError(f"unexpected extra data after OK: {bytes(reader.buf)!r}")
            count += batch
            if clock() >= end_ns:
                break
        finished = clock()
    except (OSError, ProtocolError) as exc:
        result_q.put(("error", idx, f"worker {idx}: {exc}"))
        return
    cpu = time.process_time() - cpu0
    sock.close()
    result_q.put(("done", idx, count, finished, cpu))


def _own_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", default="sub_bench", help="topic to publish to")
    p.add_argument("--batch-size", type=int, default=200, help="batch size of messages")


def main(argv: list[str] | None = None) -> int:
    p, args, run = parse_args(PROG, __doc__, argv, _own_args)
    if args.size < 1 or args.batch_size < 1 or args.workers < 1:
        p.error("--size, --batch-size and --workers must be >= 1")
    cfg = WorkerConfig(run.host, run.port, args.topic, args.size, args.batch_size, run.runfor_ns)
    try:
        start, results = run_workers(PROG, pub_worker, cfg, run)
    except RuntimeError as exc:
        log(str(exc), PROG)
        return 1
    report(PROG, run, start, results, {"batch_size": args.batch_size})
    return 0


if __name__ == "__main__":
    sys.exit(main())
