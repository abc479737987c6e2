#!/usr/bin/env python3
"""Publish load generator: a Python port of NSQ's ``bench/bench_writer``.

Standalone on purpose: it speaks the NSQ TCP protocol V2 itself and imports
nothing from nsqpy, so the same tool measures a Go nsqd and ours.

Each worker is its own process with one TCP connection (Go runs GOMAXPROCS
goroutines). A worker sends the magic, IDENTIFY, then loops: one pre-encoded
MPUB of ``--batch-size`` messages of ``--size`` bytes, wait for its ``OK``.

Output, like Go's (``log`` prefix, stderr)::

    [bench_writer] 2024/01/02 15:04:05 duration: 10.000213s - 38.147mb/s - 200000.000ops/s - 5.000us/op

plus one JSON line on stdout for scripts (``run_bench.py``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import re
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from typing import Any

PROG = "bench_writer"
MAGIC_V2 = b"  V2"
FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
HEARTBEAT = b"_heartbeat_"
OK_FRAME = struct.pack(">ii", 6, FRAME_RESPONSE) + b"OK"
READY_TIMEOUT_S = 30.0

# ---------------------------------------------------------------------------
# Helpers bench_reader.py imports from here (it sits in the same directory, so
# running either script directly works; neither imports nsqpy).
# ---------------------------------------------------------------------------

_GO_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    """Parse a Go ``time.Duration`` string (``10s``, ``1m30s``, ``250ms``) into ns."""
    s = text.strip()
    sign = 1
    if s[:1] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    for m in _GO_DURATION_PART.finditer(s):
        if m.start() != pos:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _GO_UNITS_NS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"invalid duration {text!r}")
    return sign * round(total)


def _frac(value: int, digits: int) -> str:
    """``value / 10**digits`` printed like Go: no trailing zeros, no lone dot."""
    whole, rest = divmod(value, 10**digits)
    tail = f"{rest:0{digits}d}".rstrip("0")
    return f"{whole}.{tail}" if tail else str(whole)


def format_go_duration(ns: int) -> str:
    """Format nanoseconds exactly like Go's ``time.Duration.String()``."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_frac(u, 3)}µs"
    if u < 1_000_000_000:
        return f"{sign}{_frac(u, 6)}ms"
    secs, sub = divmod(u, 1_000_000_000)
    out = f"{_frac((secs % 60) * 1_000_000_000 + sub, 9)}s"
    if secs >= 60:
        out = f"{(secs // 60) % 60}m{out}"
    if secs >= 3600:
        out = f"{secs // 3600}h{out}"
    return sign + out


def log(msg: str, prog: str = PROG) -> None:
    """Print like Go's ``log`` package after ``log.SetPrefix("[<prog>] ")``."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S")
    sys.stderr.write(f"[{prog}] {stamp} {msg}\n")
    sys.stderr.flush()


def parse_deadline(text: str) -> datetime:
    # Go: time.Parse("2006-01-02 15:04:05", s) -> a UTC time.
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def sleep_until_deadline(when: datetime | None, prog: str = PROG) -> None:
    if when is None:
        return
    delta_ns = round((when - datetime.now(UTC)).total_seconds() * 1e9)
    log(
        f"sleeping until {when:%Y-%m-%d %H:%M:%S} +0000 UTC ({format_go_duration(delta_ns)})",
        prog,
    )
    if delta_ns > 0:
        time.sleep(delta_ns / 1e9)


def split_hostport(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid address {addr!r} (want host:port)")
    return host.strip("[]") or "127.0.0.1", int(port)


def default_workers() -> int:
    # Go's GOMAXPROCS default: the CPUs this process may run on.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _go_f3(num: float, den: float) -> str:
    """``fmt.Sprintf("%.03f", num/den)`` with Go's float division semantics."""
    if den == 0:
        return "NaN" if num == 0 else "+Inf"
    return f"{num / den:.3f}"


def go_result_line(ops: int, size: int, duration_ns: int) -> str:
    """The exact ``log.Printf`` line of Go's bench_writer/bench_reader."""
    secs = duration_ns / 1e9
    us_int = duration_ns // 1_000  # float64(duration/time.Microsecond): truncated
    return (
        f"duration: {format_go_duration(duration_ns)}"
        f" - {_go_f3(ops * size / 1024 / 1024, secs)}mb/s"
        f" - {_go_f3(ops, secs)}ops/s - {_go_f3(us_int, ops)}us/op"
    )


class ProtocolError(Exception):
    """The server sent an error frame or broke the framing."""


class FrameReader:
    """Minimal buffered reader of ``[size][type][data]`` frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ProtocolError("connection closed by server")
            self.buf += chunk

    def read_frame(self) -> tuple[int, bytes]:
        self._fill(8)
        size = int.from_bytes(self.buf[0:4], "big")
        if size < 4:
            raise ProtocolError(f"invalid frame size {size}")
        self._fill(4 + size)
        ftype = int.from_bytes(self.buf[4:8], "big")
        data = bytes(self.buf[8 : 4 + size])
        del self.buf[: 4 + size]
        return ftype, data


def identify_command(body: dict[str, Any]) -> bytes:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(raw)) + raw


def read_identify_response(reader: FrameReader) -> None:
    """IDENTIFY with feature_negotiation answers JSON (or ``OK`` from old servers)."""
    sock = reader.sock
    while True:
        ftype, data = reader.read_frame()
        if ftype == FRAME_RESPONSE and data == HEARTBEAT:
            sock.sendall(b"NOP\n")
            continue
        if ftype == FRAME_ERROR:
            raise ProtocolError(data.decode(errors="replace"))
        if ftype != FRAME_RESPONSE:
            raise ProtocolError(f"unexpected frame type {ftype} in reply to IDENTIFY")
        if data == b"OK":
            return
        try:
            json.loads(data)
        except ValueError:
            raise ProtocolError(f"bad IDENTIFY response {data[:200]!r}")
        return


# ---------------------------------------------------------------------------
# The writer proper.
# ---------------------------------------------------------------------------


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
        sock = socket.create_connection((cfg.host, cfg.port), timeout=5.0)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = FrameReader(sock)
        sock.sendall(
            MAGIC_V2
            + identify_command(
                {
                    "client_id": "writer",
                    "hostname": "writer",
                    "user_agent": "bench_writer.py",
                    "feature_negotiation": True,
                }
            )
        )
        read_identify_response(reader)
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
                while True:
                    ftype, data = reader.read_frame()
                    if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                        sendall(b"NOP\n")
                        continue
                    if ftype == FRAME_ERROR:
                        raise ProtocolError(data.decode(errors="replace"))
                    if ftype != FRAME_RESPONSE or data != b"OK":
                        raise ProtocolError(f"unexpected reply to MPUB: {ftype} {data[:200]!r}")
                    break
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


def collect(
    q: mp.Queue[tuple[Any, ...]], procs: Sequence[BaseProcess], want: str
) -> list[tuple[Any, ...]]:
    """Gather one message per worker, failing fast on errors or dead workers."""
    got: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + READY_TIMEOUT_S if want == "ready" else None
    while len(got) < len(procs):
        try:
            msg = q.get(timeout=0.2)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"worker exited with code {dead[0].exitcode}")
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {READY_TIMEOUT_S:.0f}s")
            continue
        if msg[0] == "error":
            raise RuntimeError(str(msg[2]))
        got.append(msg)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--runfor", default="10s", help="duration of time to run (Go duration)")
    p.add_argument(
        "--nsqd-tcp-address", default="127.0.0.1:4150", help="<addr>:<port> to connect to nsqd"
    )
    p.add_argument("--topic", default="sub_bench", help="topic to publish to")
    p.add_argument("--size", type=int, default=200, help="size of messages")
    p.add_argument("--batch-size", type=int, default=200, help="batch size of messages")
    p.add_argument("--deadline", default="", help='start time "YYYY-mm-dd HH:MM:SS" (UTC, like Go)')
    p.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="worker processes, one connection each (default: CPUs, like GOMAXPROCS)",
    )
    args = p.parse_args(argv)
    try:
        runfor_ns = parse_go_duration(args.runfor)
        host, port = split_hostport(args.nsqd_tcp_address)
        deadline = parse_deadline(args.deadline) if args.deadline else None
    except ValueError as exc:
        p.error(str(exc))
    if args.size < 1 or args.batch_size < 1 or args.workers < 1:
        p.error("--size, --batch-size and --workers must be >= 1")

    cfg = WorkerConfig(host, port, args.topic, args.size, args.batch_size, runfor_ns)
    ctx = mp.get_context("fork")
    ready_q: mp.Queue[tuple[Any, ...]] = ctx.Queue()
    result_q: mp.Queue[tuple[Any, ...]] = ctx.Queue()
    go = ctx.Event()
    start_ns = ctx.Value("q", 0, lock=False)
    procs = [
        ctx.Process(
            target=pub_worker,
            args=(i, cfg, ready_q, go, start_ns, result_q),
            name=f"{PROG}-{i}",
            daemon=True,
        )
        for i in range(args.workers)
    ]
    for proc in procs:
        proc.start()
    try:
        collect(ready_q, procs, "ready")
        sleep_until_deadline(deadline)
        start = time.monotonic_ns()
        start_ns.value = start
        go.set()
        results = collect(result_q, procs, "done")
    except RuntimeError as exc:
        log(str(exc))
        return 1
    finally:
        for proc in procs:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()

    ops = sum(int(r[2]) for r in results)
    duration_ns = max(int(r[3]) for r in results) - start
    cpu_s = sum(float(r[4]) for r in results)
    log(go_result_line(ops, args.size, duration_ns))
    secs = duration_ns / 1e9
    summary = {
        "tool": PROG,
        "ops": ops,
        "ops_per_s": ops / secs,
        "mb_per_s": ops * args.size / secs / 1024 / 1024,
        "duration_s": secs,
        "us_per_op": (duration_ns // 1000) / ops if ops else None,
        "workers": args.workers,
        "size": args.size,
        "batch_size": args.batch_size,
        "client_cpu_s": cpu_s,
        "client_cpu_us_per_op": cpu_s * 1e6 / ops if ops else None,
    }
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
