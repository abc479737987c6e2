"""What ``bench_writer.py`` and ``bench_reader.py`` share.

It sits next to them, so running either script directly finds it; like them it
imports nothing from nsqpy, so the tools measure a Go nsqd and ours the same way.
Go's formats (durations, the result line) are copied here rather than shared with
nsqpy for the same reason.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.process import BaseProcess
from typing import Any

MAGIC_V2 = b"  V2"
FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
HEARTBEAT = b"_heartbeat_"
READY_TIMEOUT_S = 30.0

# -- Go's formats ------------------------------------------------------------------

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


def log(msg: str, prog: str) -> None:
    """Print like Go's ``log`` package after ``log.SetPrefix("[<prog>] ")``."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S")
    sys.stderr.write(f"[{prog}] {stamp} {msg}\n")
    sys.stderr.flush()


def parse_deadline(text: str) -> datetime:
    # Go: time.Parse("2006-01-02 15:04:05", s) -> a UTC time.
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def sleep_until_deadline(when: datetime | None, prog: str) -> None:
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


# -- the protocol ------------------------------------------------------------------


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

    def read_reply(self) -> tuple[int, bytes]:
        """The next frame that is not a heartbeat (answered with NOP); an error frame raises."""
        while True:
            ftype, data = self.read_frame()
            if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                self.sock.sendall(b"NOP\n")
                continue
            if ftype == FRAME_ERROR:
                raise ProtocolError(data.decode(errors="replace"))
            return ftype, data

    def expect_ok(self, command: str) -> None:
        """Read ``command``'s reply, which must be ``OK``."""
        ftype, data = self.read_reply()
        if ftype != FRAME_RESPONSE or data != b"OK":
            raise ProtocolError(f"unexpected reply to {command}: {ftype} {data[:200]!r}")


def identify_command(body: dict[str, Any]) -> bytes:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(raw)) + raw


def read_identify_response(reader: FrameReader) -> None:
    """IDENTIFY with feature_negotiation answers JSON (or ``OK`` from old servers)."""
    ftype, data = reader.read_reply()
    if ftype != FRAME_RESPONSE:
        raise ProtocolError(f"unexpected frame type {ftype} in reply to IDENTIFY")
    if data == b"OK":
        return
    try:
        json.loads(data)
    except ValueError:
        raise ProtocolError(f"bad IDENTIFY response {data[:200]!r}")


def connect(host: str, port: int, name: str) -> tuple[socket.socket, FrameReader]:
    """Connect (5 s timeout, TCP_NODELAY), send the magic and IDENTIFY as ``name``
    (``reader``/``writer``), read the reply."""
    sock = socket.create_connection((host, port), timeout=5.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = FrameReader(sock)
    identify = {
        "client_id": name,
        "hostname": name,
        "user_agent": f"bench_{name}.py",
        "feature_negotiation": True,
    }
    sock.sendall(MAGIC_V2 + identify_command(identify))
    read_identify_response(reader)
    return sock, reader


# -- the run -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunArgs:
    """The flags both tools have, checked."""

    host: str
    port: int
    runfor_ns: int
    deadline: datetime | None
    size: int
    workers: int


def parse_args(
    prog: str,
    doc: str | None,
    argv: list[str] | None,
    add_own: Callable[[argparse.ArgumentParser], None],
) -> tuple[argparse.ArgumentParser, argparse.Namespace, RunArgs]:
    """Go's flags of both tools (Go durations, ``host:port``), with ``add_own``'s between."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0] if doc else "")
    p.add_argument("--runfor", default="10s", help="duration of time to run (Go duration)")
    p.add_argument(
        "--nsqd-tcp-address", default="127.0.0.1:4150", help="<addr>:<port> to connect to nsqd"
    )
    p.add_argument("--size", type=int, default=200, help="size of messages")
    add_own(p)
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
    return p, args, RunArgs(host, port, runfor_ns, deadline, args.size, args.workers)


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


def run_workers(
    prog: str, target: Callable[..., None], cfg: Any, run: RunArgs
) -> tuple[int, list[tuple[Any, ...]]]:
    """Fork ``run.workers`` processes of ``target(idx, cfg, ready_q, go, start_ns,
    result_q)``; once all are ready (and the deadline passed) start them together.

    Returns the start (``time.monotonic_ns()``) and one ``("done", idx, ops,
    finished_ns, cpu_s, ...)`` result per worker; raises RuntimeError.
    """
    ctx = mp.get_context("fork")
    ready_q: mp.Queue[tuple[Any, ...]] = ctx.Queue()
    result_q: mp.Queue[tuple[Any, ...]] = ctx.Queue()
    go = ctx.Event()
    start_ns = ctx.Value("q", 0, lock=False)
    procs = [
        ctx.Process(
            target=target,
            args=(i, cfg, ready_q, go, start_ns, result_q),
            name=f"{prog}-{i}",
            daemon=True,
        )
        for i in range(run.workers)
    ]
    for proc in procs:
        proc.start()
    try:
        collect(ready_q, procs, "ready")
        sleep_until_deadline(run.deadline, prog)
        start = time.monotonic_ns()
        start_ns.value = start
        go.set()
        return start, collect(result_q, procs, "done")
    finally:
        for proc in procs:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def report(
    prog: str,
    run: RunArgs,
    start: int,
    results: Sequence[tuple[Any, ...]],
    params: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> None:
    """Go's result line on stderr, the JSON summary on stdout (``params``: the
    tool's own flags, ``extra``: its own figures)."""
    ops = sum(int(r[2]) for r in results)
    duration_ns = max(int(r[3]) for r in results) - start
    cpu_s = sum(float(r[4]) for r in results)
    log(go_result_line(ops, run.size, duration_ns), prog)
    secs = duration_ns / 1e9
    summary = {
        "tool": prog,
        "ops": ops,
        "ops_per_s": ops / secs,
        "mb_per_s": ops * run.size / secs / 1024 / 1024,
        "duration_s": secs,
        "us_per_op": (duration_ns // 1000) / ops if ops else None,
        "workers": run.workers,
        "size": run.size,
        **params,
        "client_cpu_s": cpu_s,
        "client_cpu_us_per_op": cpu_s * 1e6 / ops if ops else None,
        **(extra or {}),
    }
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()
