#!/usr/bin/env python3
"""Consume load generator: a Python port of NSQ's ``bench/bench_reader``.

Standalone on purpose: it speaks the NSQ TCP protocol V2 itself and imports
nothing from nsqpy (only helpers from ``_benchlib.py`` next to it), so the
same tool measures a Go nsqd and ours.

Each worker is its own process with one TCP connection: magic, IDENTIFY,
``SUB <topic> <channel>``, ``RDY <n>``, then it FINs every message it receives
until ``--runfor`` has elapsed.

The reader must never be the bottleneck, so the hot loop does almost no Python
work per message. With a fixed ``--size`` every message frame is exactly
``4 + 4 + 26 + size`` bytes, so a received chunk is viewed as a numpy
``(k, frame_len)`` matrix: one vectorised compare checks all frame headers,
one column copy moves the 16-byte message IDs into a preformatted
``b"FIN <id>\\n"`` matrix, and one ``sendall`` answers the whole chunk. Chunks
with other frames (heartbeats, errors, other sizes) or a partial frame at the
end fall back to a per-frame loop for just those frames. FINs are sent at the
end of every received chunk, never held back waiting for more data (that
would deadlock against the server's in-flight limit = RDY).

Output is Go's line on stderr plus one JSON line on stdout (see bench_writer).
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from typing import TYPE_CHECKING, Any

from _benchlib import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    ProtocolError,
    connect,
    log,
    parse_args,
    report,
    run_workers,
)

if TYPE_CHECKING:
    import multiprocessing as mp

PROG = "bench_reader"
RECV_SIZE = 4 * 1024 * 1024
MSG_HEADER = 26  # timestamp(8) + attempts(2) + id(16)
ID_START = 8 + 10  # frame header(8) + timestamp + attempts
ID_END = ID_START + 16


@dataclass(frozen=True)
class WorkerConfig:
    host: str
    port: int
    topic: str
    channel: str
    size: int
    rdy: int
    runfor_ns: int


def fin_matrix(np: Any, rows: int) -> Any:
    """A ``(rows, 21)`` uint8 matrix whose rows read ``b"FIN " + 16 * b"?" + b"\\n"``."""
    fins = np.empty((rows, 21), dtype=np.uint8)
    fins[:, :4] = np.frombuffer(b"FIN ", dtype=np.uint8)
    fins[:, 20] = ord("\n")
    return fins


def handshake(cfg: WorkerConfig) -> tuple[socket.socket, bytes]:
    """Connect, IDENTIFY, SUB; return the socket and any bytes read past the OK."""
    sock, reader = connect(cfg.host, cfg.port, "reader")
    sock.sendall(f"SUB {cfg.topic} {cfg.channel}\n".encode())
    reader.expect_ok("SUB")
    sock.settimeout(None)
    return sock, bytes(reader.buf)


def sub_worker(
    idx: int,
    cfg: WorkerConfig,
    ready_q: mp.Queue[tuple[Any, ...]],
    go: EventType,
    start_ns: Any,
    result_q: mp.Queue[tuple[Any, ...]],
) -> None:
    # Imported after fork so the parent stays light; one BLAS thread is plenty.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np

    try:
        sock, leftover = handshake(cfg)
    except (OSError, ProtocolError) as exc:
        ready_q.put(("error", idx, f"worker {idx}: {exc}"))
        return

    flen = 8 + MSG_HEADER + cfg.size  # full length of one message frame
    header_bytes = struct.pack(">ii", flen - 4, FRAME_MESSAGE)
    header64 = np.frombuffer(header_bytes, dtype=np.uint64)[0]
    cap = max(RECV_SIZE, 4 * flen)
    buf = np.empty(cap, dtype=np.uint8)
    mv = buf.data  # a writable memoryview of the buffer
    fins = fin_matrix(np, cap // flen + 1)
    filled = len(leftover)
    buf[:filled] = np.frombuffer(leftover, dtype=np.uint8)

    ready_q.put(("ready", idx))
    go.wait()
    end_ns = start_ns.value + cfg.runfor_ns
    clock = time.monotonic_ns
    sendall = sock.sendall
    recv_into = sock.recv_into

    # Go's reader closes the connection from another goroutine when runfor
    # elapses; shutting the socket down likewise wakes a recv blocked on an idle
    # topic. The hot loop itself checks the clock after every chunk.
    def stop() -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    timer = threading.Timer(max(0.0, (end_ns - clock()) / 1e9), stop)
    timer.daemon = True
    cpu0 = time.process_time()
    window = len(fins)  # max rows the fast path examines at once
    count = last_count = 0
    last_msg_ns = 0  # when the last message arrived (0: none did)
    chunks = 0
    slow_frames = 0
    error: str | None = None
    try:
        sendall(f"RDY {cfg.rdy}\n".encode())
        timer.start()
        parse_leftover = filled > 0  # bytes that arrived right behind SUB's OK
        while True:
            if parse_leftover:
                parse_leftover = False
            else:
                n = recv_into(mv[filled:], cap - filled)
                if n == 0:
                    break
                filled += n
            chunks += 1
            pos = 0
            extra = bytearray()  # replies to slow-path frames, sent once per chunk
            while True:
                avail = filled - pos
                if avail >= flen and mv[pos : pos + 8] == header_bytes:
                    # fast path: a run of whole, equally sized message frames
                    k = min(avail // flen, window)
                    rows = buf[pos : pos + k * flen].reshape(k, flen)
                    # each row's 8 header bytes as one integer: one compare per frame
                    bad = rows[:, :8].view(np.uint64) != header64
                    if not np.count_nonzero(bad):
                        m = k
                        window = len(fins)
                    else:  # first m rows are messages (m >= 1: row 0 was checked)
                        m = int(bad.argmax())
                        # mixed traffic: look at fewer rows next time so a chunk
                        # of alternating frame kinds stays linear, not quadratic
                        window = max(64, 2 * m)
                    fins[:m, 4:20] = rows[:m, ID_START:ID_END]
                    sendall(fins[:m])
                    count += m
                    pos += m * flen
                    continue
                if avail < 8:
                    break
                # slow path: one frame of another kind or size
                size = int.from_bytes(mv[pos : pos + 4], "big")
                if size < 4:
                    raise ProtocolError(f"invalid frame size {size}")
                if avail < 4 + size:
                    if 4 + size > cap:  # a frame bigger than the buffer: grow
                        cap = 4 + size + RECV_SIZE
                        bigger = np.empty(cap, dtype=np.uint8)
                        bigger[:avail] = buf[pos:filled]
                        buf, mv = bigger, bigger.data
                        fins = fin_matrix(np, cap // flen + 1)
                        window = len(fins)
                        filled -= pos
                        pos = 0
                    break
                slow_frames += 1
                ftype = int.from_bytes(mv[pos + 4 : pos + 8], "big")
                if ftype == FRAME_MESSAGE:
                    if size < 4 + MSG_HEADER:
                        raise ProtocolError(f"message frame too short ({size})")
                    extra += b"FIN "
                    extra += mv[pos + ID_START : pos + ID_END]
                    extra += b"\n"
                    count += 1
                elif ftype == FRAME_RESPONSE:
                    if mv[pos + 8 : pos + 4 + size] == HEARTBEAT:
                        extra += b"NOP\n"
                elif ftype == FRAME_ERROR:
                    raise ProtocolError(
                        bytes(mv[pos + 8 : pos + 4 + size]).decode(errors="replace")
                    )
                else:
                    raise ProtocolError(f"unknown frame type {ftype}")
                pos += 4 + size
            if extra:
                sendall(extra)
            rem = filled - pos
            if rem and pos:
                buf[:rem] = buf[pos:filled]
            filled = rem
            now = clock()
            if count != last_count:
                last_count, last_msg_ns = count, now
            if now >= end_ns:
                break
    except ProtocolError as exc:
        error = str(exc)
    except OSError as exc:
        if clock() < end_ns:  # errors after the stop timer fired are the normal end
            error = str(exc)
    finished = clock()
    cpu = time.process_time() - cpu0
    timer.cancel()
    sock.close()
    if error is not None:
        result_q.put(("error", idx, f"worker {idx}: {error}"))
        return
    result_q.put(("done", idx, count, finished, cpu, chunks, slow_frames, last_msg_ns))


def _own_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", default="sub_bench", help="topic to receive messages on")
    p.add_argument("--channel", default="ch", help="channel to receive messages on")
    p.add_argument("--rdy", type=int, default=2500, help="RDY count to use")


def main(argv: list[str] | None = None) -> int:
    p, args, run = parse_args(PROG, __doc__, argv, _own_args)
    if args.size < 1 or args.rdy < 1 or args.workers < 1:
        p.error("--size, --rdy and --workers must be >= 1")
    cfg = WorkerConfig(
        run.host, run.port, args.topic, args.channel, args.size, args.rdy, run.runfor_ns
    )
    try:
        start, results = run_workers(PROG, sub_worker, cfg, run)
    except RuntimeError as exc:
        log(str(exc), PROG)
        return 1
    ops = sum(int(r[2]) for r in results)
    chunks = sum(int(r[5]) for r in results)
    last_msg_ns = max(int(r[7]) for r in results)
    extra = {
        "recv_chunks": chunks,
        "msgs_per_chunk": ops / chunks if chunks else None,
        "slow_path_frames": sum(int(r[6]) for r in results),
        # seconds from the start to the last message: well below duration_s
        # means the channel ran dry, so ops_per_s understates the reader
        "last_msg_s": (last_msg_ns - start) / 1e9 if last_msg_ns else None,
    }
    report(PROG, run, start, results, {"rdy": args.rdy}, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
