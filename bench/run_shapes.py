#!/usr/bin/env python3
"""Every load shape of issue 16 in one command, for our nsqd and any other beside it.

For each shape (size, batch, publisher kind, connections, --mem-queue-size) a fresh
nsqd is started, the channel created, and ``bench_writer.py`` and
``bench_reader.py`` run *at once* from a shared start time; the table shows
publish and consume msgs/s, the nsqd's CPU per published message and its peak
RSS. Then two figures of their own: start-up (exec to a ``/ping`` answer and an
accepted TCP connection) and RSS per queued 200-byte message (1,000,000 queued).

``--nsqd-bin CMD`` (repeatable) puts another nsqd, e.g. Go's, beside ours; the
runs of the nsqds alternate shape by shape and round by round, so that a busy
moment of the machine does not favour one of them.

``--go-tools DIR`` runs NSQ's own ``bench_writer`` and ``bench_reader`` (Go binaries
in DIR, one connection per GOMAXPROCS, set to the shape's connections) instead of the
Python ports, as the issue's table was measured; they only send MPUB, so the ``pub``
and ``http`` shapes keep the Python writer (and reader) and say so.

Standalone like ``run_bench.py``, whose process handling it reuses: nothing here
imports nsqpy, so a Go nsqd is measured the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _benchlib import connect
from bench_writer import mpub_command
from run_bench import (
    NEUTRAL_CWD,
    STARTUP_TIMEOUT_S,
    BenchError,
    Nsqd,
    ToolResult,
    cpu_seconds,
    create_channel,
    default_nsqd,
    nsqd_version,
    parse_go_duration_s,
    run_tool,
    server_argv,
)

TOPIC = "shapes"
CHANNEL = "ch"
KB = 1024
MB = 1024 * 1024


@dataclass(frozen=True)
class Shape:
    """One load: ``mode`` is bench_writer's (mpub, pub, http); ``rate`` paces the writer
    (requests per second; 0: as fast as answered), where server CPU is the figure."""

    name: str
    size: int
    batch: int
    mode: str = "mpub"
    workers: int = 2
    mem_queue_size: int = 1_000_000
    rdy: int = 2500
    rate: int = 0


SHAPES = [
    Shape("200B-b200", 200, 200),
    Shape("200B-b200-mq0", 200, 200, mem_queue_size=0),
    Shape("200B-b200-8conn", 200, 200, workers=8),
    Shape("200B-mpub1", 200, 1),
    Shape("200B-pub", 200, 1, mode="pub"),
    Shape("200B-http-pub", 200, 1, mode="http"),
    # paced: what a moderately loaded nsqd spends per message
    Shape("200B-pub-at-1k", 200, 1, mode="pub", rate=1_000),
    Shape("200B-pub-at-10k", 200, 1, mode="pub", rate=10_000),
    Shape("10KB-b20", 10 * KB, 20),
    # big bodies: a bounded memory queue (≤ ~1 GB), the rest goes to disk as in NSQ
    Shape("100KB-b20", 100 * KB, 20, mem_queue_size=10_000, rdy=200),
    Shape("1MB-b4", MB, 4, mem_queue_size=1_000, rdy=20),
]


@dataclass
class ShapeResult:
    pub: ToolResult
    sub: ToolResult
    wall_s: float
    server_cpu_s: float
    peak_rss: int

    @property
    def server_us_per_msg(self) -> float:
        ops = int(self.pub.stats["ops"])
        return self.server_cpu_s * 1e6 / ops if ops else float("nan")


def proc_status(pid: int, key: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise BenchError(f"no {key} in /proc/{pid}/status")


@contextlib.contextmanager
def running_nsqd(cmd: list[str], extra: list[str]) -> Iterator[Nsqd]:
    """A fresh nsqd on loopback port 0 with its own temp data dir, stopped afterwards."""
    data_path = tempfile.mkdtemp(prefix="nsq-shapes-")
    nsqd = Nsqd(
        [
            *cmd,
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=",
            f"--data-path={data_path}",
            *extra,
        ]
    )
    try:
        nsqd.start()
        yield nsqd
    finally:
        nsqd.stop()
        shutil.rmtree(data_path, ignore_errors=True)


def http_address(nsqd: Nsqd) -> str:
    """The ``HTTP: listening on`` address of the log (printed before or after TCP's)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in list(nsqd.log):
            if "HTTP: listening on " in line:
                return line.rsplit("HTTP: listening on ", 1)[1].split()[0]
        nsqd.check_alive()
        time.sleep(0.01)
    raise BenchError("no 'HTTP: listening on' line from nsqd\n" + nsqd.log_tail())


def go_deadline(lead_s: float) -> tuple[str, float]:
    """bench tools' ``--deadline`` (whole UTC seconds) at least ``lead_s`` from now, and
    the ``time.monotonic()`` it falls at."""
    now = datetime.now(UTC)
    when = (now + timedelta(seconds=lead_s + 1)).replace(microsecond=0)
    return when.strftime("%Y-%m-%d %H:%M:%S"), time.monotonic() + (when - now).total_seconds()


_GO_RESULT = re.compile(r"duration: (\S+) - [0-9.]+mb/s - ([0-9.]+)ops/s")


def run_go_tool(binary: Path, args: list[str], workers: int, timeout_s: float) -> ToolResult:
    """One of NSQ's Go bench tools, its figures read from its ``duration:`` log line."""
    env = {**os.environ, "GOMAXPROCS": str(workers)}
    try:
        done = subprocess.run(
            [str(binary), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{binary.name} did not finish within {timeout_s:.0f}s") from None
    stderr = done.stderr.decode(errors="replace")
    found = _GO_RESULT.search(stderr)
    if done.returncode != 0 or found is None:
        raise BenchError(f"{binary.name} failed (exit code {done.returncode}):\n{stderr}")
    seconds = parse_go_duration_s(found.group(1))
    ops_per_s = float(found.group(2))
    line = stderr[found.start() :].splitlines()[0]
    return ToolResult(line=line, stats={"ops": round(ops_per_s * seconds), "ops_per_s": ops_per_s})


def tool_args(shape: Shape, nsqd: Nsqd, runfor: str, deadline: str) -> tuple[list[str], list[str]]:
    """The arguments of ``bench_writer.py`` and ``bench_reader.py`` for ``shape``."""
    common = [
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--runfor={runfor}",
        f"--size={shape.size}",
        f"--topic={TOPIC}",
        f"--workers={shape.workers}",
        f"--deadline={deadline}",
    ]
    writer = [*common, f"--batch-size={shape.batch}", f"--mode={shape.mode}"]
    if shape.rate:
        writer.append(f"--rate={shape.rate}")
    if shape.mode == "http":
        writer.append(f"--nsqd-http-address={http_address(nsqd)}")
    return writer, [*common, f"--channel={CHANNEL}", f"--rdy={shape.rdy}"]


def run_shape(
    cmd: list[str], shape: Shape, runfor: str, runfor_s: float, go_tools: Path | None = None
) -> ShapeResult:
    with running_nsqd(cmd, [f"--mem-queue-size={shape.mem_queue_size}"]) as nsqd:
        create_channel(nsqd.tcp_host, nsqd.tcp_port, TOPIC, CHANNEL)
        deadline, start = go_deadline(1.0)
        writer, reader = tool_args(shape, nsqd, runfor, deadline)
        results: dict[str, ToolResult | BaseException] = {}
        use_go = go_tools is not None and shape.mode == "mpub"

        def run(name: str, script: str, args: list[str]) -> None:
            try:
                if use_go:
                    assert go_tools is not None
                    # Go's tools: the same flags but --workers and --mode (GOMAXPROCS instead)
                    go_args = [a for a in args if not a.startswith(("--workers=", "--mode="))]
                    binary = go_tools / script.removesuffix(".py")
                    results[name] = run_go_tool(binary, go_args, shape.workers, runfor_s + 120.0)
                else:
                    results[name] = run_tool(script, args, runfor_s + 120.0)
            except BaseException as exc:  # reported by the main thread
                results[name] = exc

        threads = [
            threading.Thread(target=run, args=("pub", "bench_writer.py", writer)),
            threading.Thread(target=run, args=("sub", "bench_reader.py", reader)),
        ]
        for t in threads:
            t.start()
        time.sleep(max(0.0, start - time.monotonic()))  # the tools' shared start
        cpu0, t0 = cpu_seconds(nsqd.pid), time.monotonic()
        for t in threads:
            t.join()
        cpu1, t1 = cpu_seconds(nsqd.pid), time.monotonic()
        nsqd.check_alive()
        peak = proc_status(nsqd.pid, "VmHWM")
    pub, sub = results["pub"], results["sub"]
    for res in (pub, sub):
        if isinstance(res, BaseException):
            raise res
    assert isinstance(pub, ToolResult) and isinstance(sub, ToolResult)
    return ShapeResult(pub, sub, t1 - t0, cpu1 - cpu0, peak)


# -- start-up and memory -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            return reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"OK")
    except OSError:
        return False


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def startup_once(cmd: list[str]) -> tuple[float, float]:
    """Seconds from exec to an nsqd that answers ``/ping`` and accepts on its TCP port,
    and the CPU seconds nsqd used until then (steadier than the wall time on a busy box)."""
    data_path = tempfile.mkdtemp(prefix="nsq-startup-")
    tcp, http = free_port(), free_port()
    argv = [
        *cmd,
        f"--tcp-address=127.0.0.1:{tcp}",
        f"--http-address=127.0.0.1:{http}",
        "--https-address=",
        f"--data-path={data_path}",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        server_argv(argv),
        cwd=NEUTRAL_CWD,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        tcp_ok = http_ok = False
        while not (tcp_ok and http_ok):
            if proc.poll() is not None:
                raise BenchError(f"nsqd exited with code {proc.returncode} during start-up")
            if time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                raise BenchError(f"nsqd not ready within {STARTUP_TIMEOUT_S:.0f}s")
            http_ok = http_ok or ping(http)
            tcp_ok = tcp_ok or accepts(tcp)
            if not (tcp_ok and http_ok):
                time.sleep(0.001)
        return time.monotonic() - t0, cpu_seconds(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data_path, ignore_errors=True)


def startup_seconds(cmds: list[list[str]], runs: int) -> list[tuple[list[float], list[float]]]:
    """Per nsqd, the sorted wall and CPU seconds of ``runs`` start-ups, the nsqds taking
    turns so that a busy moment of the machine does not favour one."""
    walls: list[list[float]] = [[] for _ in cmds]
    cpus: list[list[float]] = [[] for _ in cmds]
    for _ in range(runs):
        for i, cmd in enumerate(cmds):
            wall, cpu = startup_once(cmd)
            walls[i].append(wall)
            cpus[i].append(cpu)
    return [(sorted(w), sorted(c)) for w, c in zip(walls, cpus, strict=True)]


def rss_per_queued(cmd: list[str], count: int, size: int = 200, batch: int = 200) -> float:
    """RSS growth per message of ``count`` ``size``-byte messages queued in one channel."""
    with running_nsqd(cmd, [f"--mem-queue-size={count}"]) as nsqd:
        create_channel(nsqd.tcp_host, nsqd.tcp_port, TOPIC, CHANNEL)
        sock, reader = connect(nsqd.tcp_host, nsqd.tcp_port, "writer")
        with sock:
            sock.settimeout(60.0)
            time.sleep(0.5)
            before = proc_status(nsqd.pid, "VmRSS")
            command = mpub_command(TOPIC, size, batch)
            sent = 0
            while sent < count:
                sock.sendall(command)
                reader.expect_ok("MPUB")
                sent += batch
            time.sleep(0.5)
            after = proc_status(nsqd.pid, "VmRSS")
        return (after - before) / sent


# -- the table ---------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def label_of(cmd: list[str], index: int) -> str:
    return "nsqpy" if index == 0 else f"#{index} {Path(cmd[0]).name}"


def print_table(
    labels: list[str], shapes: list[Shape], runs: dict[tuple[int, str], list[ShapeResult]]
) -> None:
    print()
    print(
        f"{'shape':<16} {'nsqd':<14} {'pub msgs/s':>11} {'sub msgs/s':>11} "
        f"{'srv us/msg':>10} {'srv cpu':>7} {'peak RSS':>9}"
        + ("  pub/sub vs nsqpy" if len(labels) > 1 else "")
    )
    for shape in shapes:
        base: tuple[float, float] | None = None
        for i, label in enumerate(labels):
            rs = runs.get((i, shape.name), [])
            if not rs:
                continue
            pub = median([r.pub.stats["ops_per_s"] for r in rs])
            sub = median([r.sub.stats["ops_per_s"] for r in rs])
            us = median([r.server_us_per_msg for r in rs])
            cpu = median([100.0 * r.server_cpu_s / r.wall_s for r in rs])
            rss = median([r.peak_rss / MB for r in rs])
            ratio = ""
            if i == 0:
                base = (pub, sub)
            elif base is not None and pub and sub:
                ratio = f"  {base[0] / pub:.2f} / {base[1] / sub:.2f}"
            print(
                f"{shape.name:<16} {label:<14} {pub:>11,.0f} {sub:>11,.0f} "
                f"{us:>10.2f} {cpu:>6.0f}% {rss:>7.0f}MB{ratio}"
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="run_shapes", description=__doc__.splitlines()[0])
    p.add_argument("--ours", default=None, help="our nsqd command (default: `nsqd` on PATH)")
    p.add_argument(
        "--nsqd-bin", action="append", default=[], help="another nsqd to run beside (repeatable)"
    )
    p.add_argument(
        "--go-tools",
        type=Path,
        default=None,
        help="a directory with NSQ's Go bench_writer and bench_reader, used for the MPUB shapes",
    )
    p.add_argument("--runfor", default="5s", help="duration of each shape (Go duration)")
    p.add_argument("--rounds", type=int, default=1, help="runs per shape and nsqd (medians)")
    p.add_argument(
        "--shapes",
        default="all",
        help="comma-separated shape names, `all`, or `none`; " + ", ".join(s.name for s in SHAPES),
    )
    p.add_argument("--startup-runs", type=int, default=21, help="0 skips the start-up figure")
    p.add_argument(
        "--queue-msgs", type=int, default=1_000_000, help="0 skips the RSS-per-message figure"
    )
    args = p.parse_args(argv)
    try:
        runfor_s = parse_go_duration_s(args.runfor)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    known = {s.name: s for s in SHAPES}
    if args.shapes == "all":
        shapes = SHAPES
    elif args.shapes == "none":
        shapes = []
    else:
        unknown = [n for n in args.shapes.split(",") if n not in known]
        if unknown:
            p.error(f"unknown shape(s) {', '.join(unknown)}")
        shapes = [known[n] for n in args.shapes.split(",")]

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)

    cmds = [shlex.split(args.ours) if args.ours else [default_nsqd()]]
    cmds += [shlex.split(b) for b in args.nsqd_bin]
    labels = [label_of(cmd, i) for i, cmd in enumerate(cmds)]
    for label, cmd in zip(labels, cmds, strict=True):
        print(f"{label}: {shlex.join(cmd)} ({nsqd_version(cmd)})")
    if args.go_tools is not None:
        for tool in ("bench_writer", "bench_reader"):
            if not os.access(args.go_tools / tool, os.X_OK):
                p.error(f"--go-tools: no executable {args.go_tools / tool}")
        print(
            f"tools: NSQ's Go bench_writer/bench_reader in {args.go_tools} for the MPUB shapes; "
            "the Python ports for pub and http"
        )
    print(f"runfor={args.runfor} rounds={args.rounds} cpus={os.cpu_count()}", flush=True)
    runs: dict[tuple[int, str], list[ShapeResult]] = {}
    try:
        for rnd in range(args.rounds):
            for shape in shapes:
                for i, cmd in enumerate(cmds):
                    r = run_shape(cmd, shape, args.runfor, runfor_s, args.go_tools)
                    runs.setdefault((i, shape.name), []).append(r)
                    print(
                        f"round {rnd + 1} {shape.name} {labels[i]}: "
                        f"pub {r.pub.stats['ops_per_s']:,.0f} sub {r.sub.stats['ops_per_s']:,.0f}"
                        f" msgs/s, server {r.server_us_per_msg:.2f} us/msg, "
                        f"peak RSS {r.peak_rss / MB:.0f} MB",
                        flush=True,
                    )
        print_table(labels, shapes, runs)
        if args.startup_runs > 0:
            print()
            figures = startup_seconds(cmds, args.startup_runs)
            for label, (times, cpus) in zip(labels, figures, strict=True):
                print(
                    f"start-up {label:<14} median {median(times):.3f}s "
                    f"(min {times[0]:.3f}s, max {times[-1]:.3f}s, {len(times)} runs), "
                    f"cpu {median(cpus):.3f}s: exec to /ping answered and TCP accepting"
                )
        if args.queue_msgs > 0:
            print()
            for label, cmd in zip(labels, cmds, strict=True):
                per = rss_per_queued(cmd, args.queue_msgs)
                print(
                    f"memory   {label:<14} {per:.0f} B of RSS per queued 200-byte message "
                    f"({args.queue_msgs:,} queued in one channel)"
                )
    except BenchError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'SIGINT'})", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
