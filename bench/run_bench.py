#!/usr/bin/env python3
"""Benchmark runner: NSQ's ``bench/bench.sh``, made comparable (see README.md).

Starts a fresh nsqd on ``127.0.0.1:0`` (ours by default, or any binary given
with ``--nsqd-bin``, e.g. a Go nsqd), reads its real TCP port from the
``TCP: listening on <ip>:<port>`` log line, creates the channel *before*
publishing (bench.sh's ``/create_channel`` calls 404 on current nsqd, so its
PUB figure is measured without a channel), then runs ``bench_writer.py``
("PUB:") and ``bench_reader.py`` ("SUB:"), sampling the nsqd process tree's
CPU time around each phase to report server CPU per message. ``--profile``
attaches py-spy to nsqd during each phase (Python nsqd only).

Standalone: imports nothing from nsqpy, so it also measures a Go nsqd.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
LISTEN_RE = re.compile(r"\bTCP: listening on (\S+):(\d+)")
STARTUP_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A step of the benchmark failed; the message says which and why."""


# ---------------------------------------------------------------------------
# nsqd process
# ---------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after ``comm`` (which may contain spaces)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode(errors="replace")
    return raw[raw.rindex(")") + 2 :].split()


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry))[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants, all threads, in seconds."""
    ticks = 0
    for p in process_tree(pid):
        try:
            fields = _stat_fields(p)
        except OSError:
            continue
        # after comm: state(0) ppid(1) ... utime(11) stime(12)
        ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


# Servers run from here, not from the caller's directory: `python -m nsqpy.nsqd` puts its
# working directory first on sys.path, so run from a checkout it would load that checkout's
# nsqpy whatever PYTHONPATH says, and a wrapper meant to run another tree (the tree before
# a change) would measure this one.
NEUTRAL_CWD = tempfile.gettempdir()


def server_argv(argv: list[str]) -> list[str]:
    """``argv`` with a relative program path made absolute, for a start from NEUTRAL_CWD."""
    program = argv[0]
    if os.sep in program and not os.path.isabs(program):
        program = os.path.abspath(program)
    return [program, *argv[1:]]


@dataclass
class Nsqd:
    """A fresh nsqd child process whose log is drained by a thread."""

    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log: deque[str] = field(default_factory=lambda: deque(maxlen=400))
    tcp_host: str = ""
    tcp_port: int = 0
    _found: threading.Event = field(default_factory=threading.Event)
    _reader: threading.Thread | None = None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                server_argv(self.argv),
                cwd=NEUTRAL_CWD,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our SIGTERM, not the terminal's ^C, stops it
            )
        except OSError as exc:
            raise BenchError(f"cannot start nsqd {self.argv[0]!r}: {exc}")
        self._reader = threading.Thread(target=self._drain, name="nsqd-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._found.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(1.0)
                raise BenchError(
                    f"nsqd exited with code {self.proc.returncode} before listening\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"no 'TCP: listening on' line from nsqd within {STARTUP_TIMEOUT_S:.0f}s\n"
                    + self.log_tail()
                )

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.log.append(line)
            if not self._found.is_set():
                m = LISTEN_RE.search(line)
                if m:
                    host = m.group(1).strip("[]")
                    self.tcp_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
                    self.tcp_port = int(m.group(2))
                    self._found.set()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def tcp_address(self) -> str:
        host = f"[{self.tcp_host}]" if ":" in self.tcp_host else self.tcp_host
        return f"{host}:{self.tcp_port}"

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"nsqd died (exit code {self.proc.returncode})\n" + self.log_tail())

    def log_tail(self, n: int = 40) -> str:
        lines = list(self.log)[-n:]
        return "---- nsqd log (last lines) ----\n" + "\n".join(lines)

    def stop(self) -> int | None:
        """SIGTERM, wait up to 10 s, then SIGKILL.

        Returns the exit code in answer to SIGTERM, or None if nsqd was not running.
        """
        if self.proc is None or self.proc.poll() is not None:
            if self._reader is not None:
                self._reader.join(2.0)
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"nsqd did not exit {STOP_TIMEOUT_S:.0f}s after SIGTERM: killing it")
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(2.0)
        return self.proc.returncode


def nsqd_version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(
            [*cmd, "--version"], capture_output=True, timeout=5, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (out.stdout or out.stderr).decode(errors="replace").strip()
    return text.splitlines()[0] if text and out.returncode == 0 else "?"


# ---------------------------------------------------------------------------
# protocol bits (just enough to create the channel)
# ---------------------------------------------------------------------------


def create_channel(host: str, port: int, topic: str, channel: str) -> None:
    """``SUB`` once, then disconnect: the (non-ephemeral) channel stays."""
    with socket.create_connection((host, port), timeout=10.0) as sock:
        sock.sendall(b"  V2" + f"SUB {topic} {channel}\n".encode())
        buf = b""
        while True:
            while len(buf) < 8 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise BenchError("nsqd closed the connection while creating the channel")
                buf += chunk
            size, ftype = struct.unpack(">ii", buf[:8])
            data, buf = buf[8 : 4 + size], buf[4 + size :]
            if ftype == 0 and data == b"_heartbeat_":
                sock.sendall(b"NOP\n")
                continue
            if ftype != 0 or data != b"OK":
                raise BenchError(f"SUB {topic} {channel} failed: {ftype} {data[:200]!r}")
            return


# ---------------------------------------------------------------------------
# load tools
# ---------------------------------------------------------------------------


@dataclass
class ToolResult:
    line: str  # the Go-style "duration: ..." part
    stats: dict[str, Any]


def run_tool(script: str, args: list[str], timeout_s: float) -> ToolResult:
    cmd = [sys.executable, str(BENCH_DIR / script), *args]
    # own process group, so an abort also takes down the tool's worker processes
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group()
        proc.communicate()
        raise BenchError(f"{script} did not finish within {timeout_s:.0f}s")
    except BaseException:
        kill_group()
        proc.wait()
        raise
    stderr = err.decode(errors="replace")
    if proc.returncode != 0:
        raise BenchError(f"{script} failed (exit code {proc.returncode}):\n{stderr}")
    line = next((ln for ln in stderr.splitlines() if "duration:" in ln), "")
    try:
        stats = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError(f"{script}: no JSON result on stdout\n{stderr}")
    return ToolResult(line=line, stats=stats)


# ---------------------------------------------------------------------------
# profiling (py-spy on the nsqd process)
# ---------------------------------------------------------------------------


def find_py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise BenchError("py-spy not found (it is a dev dependency: run via `uv run`)")
    return found


@contextlib.contextmanager
def py_spy(pid: int, raw_path: Path) -> Iterator[None]:
    """Sample ``pid`` (non-blocking, per function) into collapsed stacks."""
    proc = subprocess.Popen(
        [
            find_py_spy(),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--function",
            "--nonblocking",
            "--rate",
            "100",
            "--output",
            str(raw_path),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    time.sleep(0.5)  # let it attach before the load starts
    if proc.poll() is not None:
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        raise BenchError(f"py-spy exited at once (code {proc.returncode}):\n{out}")
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on ^C
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_collapsed(path: Path) -> Counter[str]:
    stacks: Counter[str] = Counter()
    if not path.exists():
        return stacks
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


def top_self(stacks: Counter[str], n: int = 25) -> list[tuple[str, int]]:
    leaves: Counter[str] = Counter()
    for stack, count in stacks.items():
        leaves[stack.rsplit(";", 1)[-1]] += count
    return leaves.most_common(n)


def flamegraph_svg(stacks: Counter[str], title: str) -> str:
    """A minimal static flame graph (root at the bottom; hover for counts)."""
    total = sum(stacks.values()) or 1
    tree: dict[str, Any] = {"n": 0, "kids": {}}
    for stack, count in sorted(stacks.items()):
        node = tree
        node["n"] += count
        for frame in stack.split(";"):
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += count

    def depth(node: dict[str, Any]) -> int:
        return 1 + max((depth(k) for k in node["kids"].values()), default=0)

    width, row_h, pad_top = 1600.0, 16, 40
    rows = depth(tree)
    height = pad_top + rows * row_h + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<rect width="100%" height="100%" fill="#f8f8f8"/><text x="10" y="20" font-size="14">'
        f"{html.escape(title)} ({total} samples)</text>",
    ]

    def draw(name: str, node: dict[str, Any], x: float, level: int) -> None:
        w = node["n"] / total * width
        if w < 0.3:
            return
        y = height - 10 - (level + 1) * row_h
        hue = zlib.crc32(name.split(" (")[0].encode()) % 60
        pct = 100.0 * node["n"] / total
        label = html.escape(name)
        out.append(
            f"<g><title>{label} — {node['n']} samples ({pct:.2f}%)</title>"
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 1}" '
            f'fill="hsl({hue},85%,60%)"/>'
        )
        chars = int(w / 7)
        if chars >= 4:
            text = name if len(name) <= chars else name[: chars - 2] + ".."
            out.append(f'<text x="{x + 2:.2f}" y="{y + row_h - 4}">{html.escape(text)}</text>')
        out.append("</g>")
        cx = x
        for kid_name, kid in sorted(node["kids"].items()):
            draw(kid_name, kid, cx, level + 1)
            cx += kid["n"] / total * width

    draw("all", tree, 0.0, 0)
    out.append("</svg>")
    return "\n".join(out)


def report_profile(raw_path: Path, phase: str) -> None:
    stacks = read_collapsed(raw_path)
    if not stacks:
        print(f"{phase} profile: no samples in {raw_path}")
        return
    svg_path = raw_path.with_suffix(".svg")
    svg_path.write_text(flamegraph_svg(stacks, f"nsqd during {phase}"))
    total = sum(stacks.values())
    print(f"{phase} profile: {total} samples -> {svg_path} , {raw_path}")
    print(f"  top self time ({phase}):")
    for frame, count in top_self(stacks):
        print(f"  {100.0 * count / total:6.2f}% {count:7d}  {frame}")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_go_duration_s(text: str) -> float:
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(a + b for a, b in parts) != text.strip():
        raise argparse.ArgumentTypeError(f"invalid Go duration {text!r}")
    return sum(float(a) * units[b] for a, b in parts)


def default_nsqd() -> str:
    found = shutil.which("nsqd")
    if found:
        return found
    local = Path(sys.executable).parent / "nsqd"
    return str(local) if local.exists() else "nsqd"


@dataclass
class Phase:
    name: str
    result: ToolResult
    wall_s: float
    server_cpu_s: float

    @property
    def server_us_per_msg(self) -> float | None:
        ops = int(self.result.stats["ops"])
        return self.server_cpu_s * 1e6 / ops if ops else None


def run_phase(
    name: str,
    nsqd: Nsqd,
    script: str,
    args: list[str],
    timeout_s: float,
    profile_path: Path | None,
) -> Phase:
    nsqd.check_alive()
    with py_spy(nsqd.pid, profile_path) if profile_path else contextlib.nullcontext():
        cpu0, t0 = cpu_seconds(nsqd.pid), time.monotonic()
        result = run_tool(script, args, timeout_s)
        cpu1, t1 = cpu_seconds(nsqd.pid), time.monotonic()
    nsqd.check_alive()
    phase = Phase(name, result, t1 - t0, cpu1 - cpu0)
    print(f"{name}: {result.line}", flush=True)
    us = phase.server_us_per_msg
    us_text = f"{us:.2f}us/msg" if us is not None else "n/a (no messages)"
    print(
        f"{name} server cpu: {us_text} (cpu {phase.server_cpu_s:.1f}s over {phase.wall_s:.1f}s)",
        flush=True,
    )
    if profile_path is not None:
        report_profile(profile_path, name)
    return phase


def fmt_opt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="run_bench", description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=200, help="message size in bytes")
    p.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    p.add_argument("--mem-queue-size", type=int, default=1_000_000, help="nsqd --mem-queue-size")
    p.add_argument("--runfor", default="10s", help="duration of each phase (Go duration)")
    p.add_argument("--workers", type=int, default=None, help="processes per tool (default: CPUs)")
    p.add_argument("--rdy", type=int, default=2500, help="bench_reader RDY count")
    p.add_argument("--topic", default="sub_bench")
    p.add_argument("--channel", default="ch")
    p.add_argument(
        "--nsqd-bin",
        default=None,
        help="nsqd command (split like a shell line); default: `nsqd` on PATH (ours under uv run)",
    )
    p.add_argument(
        "--data-path", default=None, help="nsqd --data-path (default: a temp dir, removed after)"
    )
    p.add_argument(
        "--nsqd-arg", action="append", default=[], help="extra nsqd argument (repeatable)"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the nsqd during each phase; SVG + collapsed stacks in bench/results/",
    )
    args = p.parse_args(argv)
    try:
        runfor_s = parse_go_duration_s(args.runfor)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))

    # turn SIGTERM into an exception so the finally below always stops nsqd
    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)

    nsqd_cmd = shlex.split(args.nsqd_bin) if args.nsqd_bin else [default_nsqd()]
    own_data = args.data_path is None
    data_path = tempfile.mkdtemp(prefix="nsq-bench-") if own_data else args.data_path
    if not own_data:
        os.makedirs(data_path, exist_ok=True)
    nsqd = Nsqd(
        [
            *nsqd_cmd,
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=",
            f"--mem-queue-size={args.mem_queue_size}",
            f"--data-path={data_path}",
            *args.nsqd_arg,
        ]
    )
    common = [f"--runfor={args.runfor}", f"--size={args.size}", f"--topic={args.topic}"]
    if args.workers is not None:
        common.append(f"--workers={args.workers}")
    tool_timeout = runfor_s + 120.0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    phases: list[Phase] = []
    version = nsqd_version(nsqd_cmd)
    exit_code = 1
    try:
        print(f"nsqd: {shlex.join(nsqd.argv)}")
        print(f"nsqd version: {version}", flush=True)
        nsqd.start()
        print(f"nsqd pid {nsqd.pid} listening on {nsqd.tcp_address}", flush=True)
        create_channel(nsqd.tcp_host, nsqd.tcp_port, args.topic, args.channel)
        if args.profile:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        addr = f"--nsqd-tcp-address={nsqd.tcp_address}"
        phases.append(
            run_phase(
                "PUB",
                nsqd,
                "bench_writer.py",
                [addr, *common, f"--batch-size={args.batch_size}"],
                tool_timeout,
                RESULTS_DIR / f"{stamp}-pub.txt" if args.profile else None,
            )
        )
        phases.append(
            run_phase(
                "SUB",
                nsqd,
                "bench_reader.py",
                [addr, *common, f"--channel={args.channel}", f"--rdy={args.rdy}"],
                tool_timeout,
                RESULTS_DIR / f"{stamp}-sub.txt" if args.profile else None,
            )
        )
        exit_code = 0
    except BenchError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'SIGINT'})", file=sys.stderr)
        exit_code = 130
    finally:
        rc = nsqd.stop()
        if own_data:
            shutil.rmtree(data_path, ignore_errors=True)
    if rc not in (None, 0):  # Go's nsqd exits 0 after a graceful SIGTERM shutdown
        print(f"warning: nsqd exited with code {rc} after SIGTERM", file=sys.stderr)
        print(nsqd.log_tail(20), file=sys.stderr)

    print()
    print("==== benchmark summary ====")
    print(f"nsqd:      {shlex.join(nsqd_cmd)} ({version})")
    print(
        f"settings:  size={args.size} batch-size={args.batch_size} "
        f"mem-queue-size={args.mem_queue_size} runfor={args.runfor} "
        f"workers={args.workers or 'cpus'} rdy={args.rdy} cpus={os.cpu_count()}"
    )
    for ph in phases:
        st = ph.result.stats
        print(
            f"{ph.name}:       {st['ops_per_s']:>12,.0f} msgs/s {st['mb_per_s']:9.3f} MB/s  "
            f"{st['ops']:>10,} msgs in {st['duration_s']:.3f}s  "
            f"server {fmt_opt(ph.server_us_per_msg, '.2f')} us/msg "
            f"({100.0 * ph.server_cpu_s / ph.wall_s:.0f}% cpu)  "
            f"client {fmt_opt(st.get('client_cpu_us_per_op'), '.3f')} us/msg"
            + (f" ({st['msgs_per_chunk']:.0f} msgs/recv)" if st.get("msgs_per_chunk") else "")
        )
    if len(phases) == 2:
        pub, sub = (ph.result.stats for ph in phases)
        last = sub.get("last_msg_s")
        if last and sub["ops"] and last < 0.95 * sub["duration_s"]:
            print(
                f"note:      SUB drained the backlog ({sub['ops']:,} of {pub['ops']:,} published)"
                f" after {last:.2f}s of {sub['duration_s']:.2f}s: its msgs/s is understated;"
                f" drain rate {sub['ops'] / last:,.0f} msgs/s"
            )
    if exit_code:
        print("status:    FAILED")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
