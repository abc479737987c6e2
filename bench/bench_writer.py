#!/usr/bin/env python3
"""Publish load generator: a Python port of NSQ's ``bench/bench_writer``.

Standalone on purpose: it speaks the NSQ TCP protocol V2 itself and imports
nothing from nsqpy (only helpers from ``_benchlib.py`` next to it), so the same
tool measures a Go nsqd and ours.

Each worker is its own process with one TCP connection (Go runs GOMAXPROCS
goroutines). A worker sends the magic, IDENTIFY, then loops: one pre-encoded
MPUB of ``--batch-size`` messages of ``--size`` bytes, wait for its ``OK``.

``--mode`` (not in Go's tool) picks other publishers: ``pub`` sends one ``PUB``
per round trip (pynsq's and go-nsq's ``Publish``), ``http`` one ``POST /pub``
per request on a keep-alive connection to ``--nsqd-http-address``.

``--rate`` (not in Go's tool) paces the requests: that many per second, shared by
the workers, instead of as many as nsqd answers; the figure of interest is then
nsqd's CPU per message at a load most nsqds see, not the throughput.

Output, like Go's (``log`` prefix, stderr)::

    [bench_writer] 2024/01/02 15:04:05 duration: 10.000213s - 38.147mb/s - 200000.000ops/s - 5.000us/op

plus one JSON line on stdout for scripts (``run_bench.py``).
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from collections.abc import Callable
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
    split_hostport,
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


def pub_command(topic: str, size: int) -> bytes:
    """``PUB <topic>\n[size][body]``, built once."""
    return b"PUB " + topic.encode() + b"\n" + struct.pack(">i", size) + bytes(size)


def http_pub_request(host: str, port: int, topic: str, size: int) -> bytes:
    """``POST /pub?topic=<topic>`` with a ``size``-byte body, keep-alive."""
    head = (
        f"POST /pub?topic={topic} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Length: {size}\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    return head.encode() + bytes(size)


@dataclass(frozen=True)
class WorkerConfig:
    host: str
    port: int
    topic: str
    size: int
    batch_size: int
    runfor_ns: int
    mode: str = "mpub"
    http_host: str = ""
    http_port: int = 0
    interval_ns: int = 0  # --rate: this worker's time between requests (0: no pacing)
    workers: int = 1


def open_publisher(cfg: WorkerConfig) -> tuple[socket.socket, bytes, int, Callable[[bytes], None]]:
    """The connection of ``cfg.mode``, the request sent again and again, the messages
    per request, and the check of a reply that is not just the ``OK`` frame."""
    if cfg.mode == "http":
        sock = socket.create_connection((cfg.http_host, cfg.http_port), timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = http_pub_request(cfg.http_host, cfg.http_port, cfg.topic, cfg.size)

        def check_http(reply: bytes) -> None:
            while not reply.endswith(b"\r\n\r\nOK") and len(reply) < 8192:
                more = sock.recv(65536)  # headers and body may come apart
                if not more:
                    raise ProtocolError("connection closed by server")
                reply += more
            if not reply.startswith(b"HTTP/1.1 200 ") or not reply.endswith(b"\r\n\r\nOK"):
                raise ProtocolError(f"unexpected reply to POST /pub: {reply[:200]!r}")

        return sock, request, 1, check_http
    sock, reader = connect(cfg.host, cfg.port, "writer")
    if cfg.mode == "pub":
        request, batch = pub_command(cfg.topic, cfg.size), 1
    else:
        request, batch = mpub_command(cfg.topic, cfg.size, cfg.batch_size), cfg.batch_size

    def check_v2(reply: bytes) -> None:
        # rare path: a split reply, a heartbeat before the OK, or an error
        if not reply:
            raise ProtocolError("connection closed by server")
        reader.buf += reply
        reader.expect_ok(cfg.mode.upper())
        if reader.buf:
            raise ProtocolError(f"unexpected extra data after OK: {bytes(reader.buf)!r}")

    return sock, request, batch, check_v2


def pub_worker(
    idx: int,
    cfg: WorkerConfig,
    ready_q: mp.Queue[tuple[Any, ...]],
    go: EventType,
    start_ns: Any,
    result_q: mp.Queue[tuple[Any, ...]],
) -> None:
    try:
        sock, request, batch, check = open_publisher(cfg)
        sock.settimeout(None)
    except (OSError, ProtocolError) as exc:
        ready_q.put(("error", idx, f"worker {idx}: {exc}"))
        return
    ready_q.put(("ready", idx))
    go.wait()

    end_ns = start_ns.value + cfg.runfor_ns
    cpu0 = time.process_time()
    count = 0
    sendall = sock.sendall
    recv = sock.recv
    clock = time.monotonic_ns
    interval = cfg.interval_ns
    try:
        if interval:
            due = start_ns.value + idx * interval // cfg.workers  # workers spread out
            while True:
                wait = due - clock()
                if wait > 0:
                    time.sleep(wait / 1e9)
                sendall(request)
                reply = recv(65536)
                if reply != OK_FRAME:
                    check(reply)
                count += batch
                due += interval
                if due >= end_ns:
                    break
        else:
            while True:
                sendall(request)
                reply = recv(65536)
                if reply != OK_FRAME:
                    check(reply)
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
    p.add_argument(
        "--mode",
        choices=("mpub", "pub", "http"),
        default="mpub",
        help="mpub (Go's tool), pub (one PUB per round trip) or http (one POST /pub per request)",
    )
    p.add_argument(
        "--nsqd-http-address", default="127.0.0.1:4151", help="<addr>:<port> for --mode http"
    )
    p.add_argument(
        "--rate",
        type=int,
        default=0,
        help="requests per second, all workers together (default 0: as fast as answered)",
    )


def main(argv: list[str] | None = None) -> int:
    p, args, run = parse_args(PROG, __doc__, argv, _own_args)
    if args.size < 1 or args.batch_size < 1 or args.workers < 1:
        p.error("--size, --batch-size and --workers must be >= 1")
    if args.rate < 0:
        p.error("--rate must be >= 0")
    try:
        http_host, http_port = split_hostport(args.nsqd_http_address)
    except ValueError as exc:
        p.error(str(exc))
    batch = 1 if args.mode != "mpub" else args.batch_size
    cfg = WorkerConfig(
        run.host,
        run.port,
        args.topic,
        args.size,
        batch,
        run.runfor_ns,
        args.mode,
        http_host,
        http_port,
        args.workers * 1_000_000_000 // args.rate if args.rate else 0,
        args.workers,
    )
    try:
        start, results = run_workers(PROG, pub_worker, cfg, run)
    except RuntimeError as exc:
        log(str(exc), PROG)
        return 1
    report(PROG, run, start, results, {"batch_size": batch, "mode": args.mode, "rate": args.rate})
    return 0


if __name__ == "__main__":
    sys.exit(main())
