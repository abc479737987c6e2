#!/usr/bin/env python3
"""One load shape against one nsqd, with the server's syscalls counted or its CPU sampled.

Where ``run_shapes.py`` says how much server CPU a message costs, this says where it
goes: a fresh nsqd and the same writer and reader as ``run_shapes.py``'s shape, run once,
while a tool watches the server process from the shared start to the end:

* ``--syscalls``: ``perf stat`` of the syscalls either kind of nsqd makes on this path,
  and its context switches, per published message (tracepoints count without slowing
  the server much);
* ``--strace``: ``strace -c -f`` on the server, every syscall per published message
  (strace slows the server a lot: the counts hold, the figures do not);
* ``--perf FILE``: ``perf record -g`` on the server (``--dwarf``: DWARF unwinding, which
  follows CPython's and uvloop's frames), read with ``perf report -i FILE``;
  ``--perf-report N`` prints the N hottest symbols (self);
* ``--py-spy FILE``: ``py-spy record --nonblocking --idle`` on the server, collapsed stacks
  (``--native``: with C frames, stopping the server at each sample); ``--py-spy-top N``
  prints the N frames with the most samples, self and total;
* none of these: only the figures.

Prints msgs/s, the server's CPU per message (user: Python and the event loop; system:
syscalls, the network stack, scheduling), and its voluntary (it slept) and involuntary
(it was preempted) context switches per message. Like the other runners it imports
nothing from nsqpy.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from run_bench import (
    CLK_TCK,
    BenchError,
    ToolResult,
    _stat_fields,
    cpu_seconds,
    create_channel,
    default_nsqd,
    find_py_spy,
    process_tree,
    read_collapsed,
    run_tool,
)
from run_shapes import CHANNEL, SHAPES, TOPIC, go_deadline, running_nsqd, tool_args

_COUNTED = (
    "read",
    "write",
    "readv",
    "writev",
    "recvfrom",
    "sendto",
    "recvmsg",
    "sendmsg",
    "epoll_pwait",
    "epoll_wait",
    "epoll_ctl",
    "futex",
    "nanosleep",
    "sched_yield",
    "getpid",
    "clock_gettime",
)
_PERF_STAT_LINE = re.compile(r"^\s*([0-9,]+)\s+(?:syscalls:sys_enter_)?([\w-]+)")
_SYSCALL_LINE = re.compile(r"^\s*[0-9.]+\s+[0-9.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches of ``pid``'s process tree (all threads)."""
    vol = invol = 0
    for proc in process_tree(pid):
        for task in Path(f"/proc/{proc}/task").iterdir():
            with contextlib.suppress(OSError), open(task / "status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
    return vol, invol


def user_system(pid: int) -> tuple[float, float]:
    """utime and stime of ``pid``'s process tree, in seconds (user: Python, the event loop;
    system: syscalls, the network stack, scheduling)."""
    user = system = 0
    for proc in process_tree(pid):
        with contextlib.suppress(OSError):
            fields = _stat_fields(proc)
            user += int(fields[11])
            system += int(fields[12])
    return user / CLK_TCK, system / CLK_TCK


def parse_strace_summary(text: str) -> dict[str, int]:
    """``strace -c``'s table as {syscall: calls}."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        found = _SYSCALL_LINE.match(line)
        if found is not None and found.group(2) != "total":
            calls[found.group(2)] = int(found.group(1))
    return calls


def parse_perf_stat(text: str) -> dict[str, int]:
    """``perf stat``'s counts as {event: count} (syscalls by their bare names)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        found = _PERF_STAT_LINE.match(line)
        if found is not None:
            counts[found.group(2)] = int(found.group(1).replace(",", ""))
    return counts


@contextlib.contextmanager
def watching(pid: int, tool: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """``tool`` attached to ``pid`` for the block; stopped with SIGINT (strace and perf
    then write their summary) and waited for."""
    proc = subprocess.Popen(
        tool, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        time.sleep(0.5)  # let it attach
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def print_py_spy_top(path: Path, n: int) -> None:
    """The ``n`` frames with the most samples: on top of the stack (self), and anywhere
    in it (total), as shares of all samples."""
    stacks = read_collapsed(path)
    total = sum(stacks.values()) or 1
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            anywhere[frame] += count
    for title, counter in (("self", own), ("total", anywhere)):
        print(f"py-spy, {title} ({total:,} samples):")
        for frame, count in counter.most_common(n):
            print(f"  {100 * count / total:5.1f}%  {frame}")


def run(args: argparse.Namespace) -> int:
    shape = next((s for s in SHAPES if s.name == args.shape), None)
    if shape is None:
        raise BenchError(f"unknown shape {args.shape}")
    cmd = shlex.split(args.nsqd)
    extra = [f"--mem-queue-size={shape.mem_queue_size}", *args.nsqd_arg]
    with running_nsqd(cmd, extra) as nsqd:
        create_channel(nsqd.tcp_host, nsqd.tcp_port, TOPIC, CHANNEL)
        deadline, start = go_deadline(args.lead)
        writer, reader = tool_args(shape, nsqd, args.runfor, deadline)
        results: dict[str, ToolResult | BaseException] = {}

        def tool(name: str, script: str, targs: list[str]) -> None:
            try:
                results[name] = run_tool(script, targs, 300.0)
            except BaseException as exc:  # reported below
                results[name] = exc

        threads = [
            threading.Thread(target=tool, args=("pub", "bench_writer.py", writer)),
            threading.Thread(target=tool, args=("sub", "bench_reader.py", reader)),
        ]
        watcher: list[str] = []
        if args.strace:
            watcher = ["strace", "-c", "-f", "-p", str(nsqd.pid)]
        elif args.syscalls:
            events = ",".join(f"syscalls:sys_enter_{name}" for name in _COUNTED)
            watcher = ["perf", "stat", "-e", f"{events},context-switches", "-p", str(nsqd.pid)]
        elif args.py_spy:
            watcher = [
                find_py_spy(),
                "record",
                "--pid",
                str(nsqd.pid),
                "--format",
                "raw",
                *(["--native"] if args.native else ["--nonblocking", "--function"]),
                "--idle",
                "--rate",
                "997",
                "--output",
                args.py_spy,
            ]
        elif args.perf:
            graph = ["--call-graph", "dwarf,16384"] if args.dwarf else ["-g"]
            watcher = ["perf", "record", *graph, "-o", args.perf, "-p", str(nsqd.pid)]
        for t in threads:
            t.start()
        ctx = watching(nsqd.pid, watcher) if watcher else contextlib.nullcontext()
        with ctx as watch:
            time.sleep(max(0.0, start - time.monotonic()))
            cpu0, sw0, us0 = cpu_seconds(nsqd.pid), switches(nsqd.pid), user_system(nsqd.pid)
            for t in threads:
                t.join()
            cpu1, sw1, us1 = cpu_seconds(nsqd.pid), switches(nsqd.pid), user_system(nsqd.pid)
        nsqd.check_alive()
    for res in results.values():
        if isinstance(res, BaseException):
            raise res
    pub, sub = results["pub"], results["sub"]
    assert isinstance(pub, ToolResult) and isinstance(sub, ToolResult)
    ops = int(pub.stats["ops"])
    per = 1.0 / ops if ops else float("nan")
    print(
        f"{shape.name}: pub {pub.stats['ops_per_s']:,.0f} / sub {sub.stats['ops_per_s']:,.0f}"
        f" msgs/s; server {(cpu1 - cpu0) * 1e6 * per:.2f} us/msg"
        f" (user {(us1[0] - us0[0]) * 1e6 * per:.2f}, system {(us1[1] - us0[1]) * 1e6 * per:.2f});"
        f" context switches per msg {(sw1[0] - sw0[0]) * per:.3f} voluntary,"
        f" {(sw1[1] - sw0[1]) * per:.3f} involuntary"
    )
    if args.strace and isinstance(watch, subprocess.Popen):
        assert watch.stderr is not None
        calls = parse_strace_summary(watch.stderr.read().decode(errors="replace"))
        print(f"syscalls per published message ({ops:,} messages; strace slows the server):")
        for name, count in sorted(calls.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<20} {count * per:8.3f}")
        print(f"  {'total':<20} {sum(calls.values()) * per:8.3f}")
    if args.syscalls and isinstance(watch, subprocess.Popen):
        assert watch.stderr is not None
        counts = parse_perf_stat(watch.stderr.read().decode(errors="replace"))
        print(f"per published message ({ops:,} messages):")
        for name, count in sorted(counts.items(), key=lambda kv: -kv[1]):
            if count:
                print(f"  {name:<20} {count * per:8.3f}")
    if args.py_spy and args.py_spy_top:
        print_py_spy_top(Path(args.py_spy), args.py_spy_top)
    if args.perf and args.perf_report:
        report = subprocess.run(
            [
                "perf",
                "report",
                "-i",
                args.perf,
                "--no-children",
                "--stdio",
                "-g",
                "none",
                "--percent-limit",
                "0.5",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [ln for ln in report.stdout.splitlines() if ln and not ln.startswith("#")]
        print("\n".join(lines[: args.perf_report]))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="profile_shape", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--nsqd",
        default=default_nsqd(),
        help="the nsqd command, split like a shell line (default: ours, as run_bench.py's)",
    )
    parser.add_argument("--shape", default="200B-pub", help="a run_shapes.py shape")
    parser.add_argument("--runfor", default="3s")
    parser.add_argument("--lead", type=float, default=1.0, help="seconds before the start")
    parser.add_argument("--nsqd-arg", action="append", default=[], help="(repeatable)")
    parser.add_argument("--strace", action="store_true", help="count the server's syscalls")
    parser.add_argument("--syscalls", action="store_true", help="perf stat the syscalls")
    parser.add_argument("--py-spy", metavar="FILE", help="py-spy record to FILE")
    parser.add_argument("--native", action="store_true", help="--py-spy with C frames (slow)")
    parser.add_argument("--py-spy-top", type=int, default=0, metavar="N")
    parser.add_argument("--perf", metavar="FILE", help="perf record -g the server to FILE")
    parser.add_argument("--dwarf", action="store_true", help="--perf with DWARF unwinding")
    parser.add_argument("--perf-report", type=int, default=0, metavar="N")
    args = parser.parse_args()
    if args.strace and shutil.which("strace") is None:
        raise BenchError("--strace: no strace on PATH")
    if (args.perf or args.syscalls) and shutil.which("perf") is None:
        raise BenchError("--perf: no perf on PATH")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
