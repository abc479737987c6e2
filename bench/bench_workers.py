#!/usr/bin/env python3
"""``nsqd --workers``: what N worker processes give, beside the Go nsqd (docs/SCALING.md).

For each nsqd (ours with each ``--workers`` count, and any ``--nsqd-bin``) and each topic
count K, a fresh nsqd gets K topics (``bench_0`` ... ``bench_{K-1}``, channel ``ch``), and
NSQ's Go ``bench_writer`` and ``bench_reader`` run at once against each topic from a shared
start time, each with GOMAXPROCS=1 (so that the tools leave the server as much of the
machine as they can). It prints, per round and as medians: messages published and read per
second (summed over the topics), the server's CPU per message published (its whole process
tree: the supervisor and every worker) and how many cores the server used.

    .venv/bin/python bench/bench_workers.py --ours /tmp/ours.sh \\
        --nsqd-bin ../shared/ref/nsq-go/nsqd --go-tools ../shared/ref/nsq-go \\
        --workers 1,2 --topics 1,8 --rounds 3 --runfor 5s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_bench import (
    BenchError,
    ToolResult,
    cpu_seconds,
    create_channel,
    parse_go_duration_s,
)
from run_shapes import go_deadline, run_go_tool, running_nsqd


@dataclass
class Result:
    pub_per_s: float
    sub_per_s: float
    us_per_msg: float
    cores: float


def run_once(
    cmd: list[str], topics: int, go_tools: Path, runfor: str, size: int, batch: int, readers: bool
) -> Result:
    runfor_s = parse_go_duration_s(runfor)
    # publishing only: everything stays in memory (the disk queue is another benchmark)
    extra = [] if readers else ["--mem-queue-size=100000000"]
    with running_nsqd(cmd, extra) as nsqd:
        names = [f"bench_{i}" for i in range(topics)]
        for name in names:
            create_channel(nsqd.tcp_host, nsqd.tcp_port, name, "ch")
        deadline, start = go_deadline(1.0 + 0.1 * topics)
        results: dict[str, ToolResult | BaseException] = {}

        def run(key: str, tool: str, args: list[str]) -> None:
            try:
                results[key] = run_go_tool(go_tools / tool, args, 1, runfor_s + 120.0)
            except BaseException as exc:  # reported by the main thread
                results[key] = exc

        threads = []
        for name in names:
            common = [
                f"--nsqd-tcp-address={nsqd.tcp_address}",
                f"--runfor={runfor}",
                f"--size={size}",
                f"--topic={name}",
                f"--deadline={deadline}",
            ]
            writer = [*common, f"--batch-size={batch}"]
            reader = [*common, "--channel=ch", "--rdy=2500"]
            threads.append(
                threading.Thread(target=run, args=(f"pub {name}", "bench_writer", writer))
            )
            if readers:
                threads.append(
                    threading.Thread(target=run, args=(f"sub {name}", "bench_reader", reader))
                )
        for t in threads:
            t.start()
        time.sleep(max(0.0, start - time.monotonic()))
        cpu0, t0 = cpu_seconds(nsqd.pid), time.monotonic()
        for t in threads:
            t.join()
        cpu1, t1 = cpu_seconds(nsqd.pid), time.monotonic()
        nsqd.check_alive()
    pub_ops = sub_ops = 0
    pub_rate = sub_rate = 0.0
    for key, res in results.items():
        if isinstance(res, BaseException):
            raise res
        if key.startswith("pub"):
            pub_ops += res.stats["ops"]
            pub_rate += res.stats["ops_per_s"]
        else:
            sub_ops += res.stats["ops"]
            sub_rate += res.stats["ops_per_s"]
    cpu = cpu1 - cpu0
    return Result(pub_rate, sub_rate, cpu / max(pub_ops, 1) * 1e6, cpu / max(t1 - t0, 1e-9))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", default="nsqd", help="our nsqd command")
    parser.add_argument("--nsqd-bin", action="append", default=[], help="another nsqd beside")
    parser.add_argument("--go-tools", required=True, help="NSQ's Go bench_writer/bench_reader")
    parser.add_argument("--workers", default="1,2", help="our --workers counts")
    parser.add_argument("--topics", default="1,8", help="topic counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runfor", default="5s")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument(
        "--no-readers",
        action="store_true",
        help="publish only (the readers' CPU left to the server): capacity to take messages in",
    )
    args = parser.parse_args(argv)
    configs: list[tuple[str, list[str]]] = [
        (f"nsqpy --workers={w}", [*args.ours.split(), f"--workers={w}"])
        for w in (int(x) for x in args.workers.split(","))
    ]
    configs += [(Path(b).name + " (Go)" if "go" in b else b, [b]) for b in args.nsqd_bin]
    topic_counts = [int(x) for x in args.topics.split(",")]
    print(
        f"{args.size} B messages, MPUB batches of {args.batch_size}, {args.runfor} per round, "
        f"{args.rounds} rounds; per topic one bench_writer"
        + ("" if args.no_readers else " and one bench_reader")
        + " (GOMAXPROCS=1)"
    )
    print(
        f"{'nsqd':24} {'topics':>6} {'pub msgs/s':>12} {'sub msgs/s':>12} {'µs/msg':>8} {'cores':>6}"
    )
    try:
        for topics in topic_counts:
            for label, cmd in configs:
                runs = []
                for _ in range(args.rounds):
                    runs.append(
                        run_once(
                            cmd,
                            topics,
                            Path(args.go_tools),
                            args.runfor,
                            args.size,
                            args.batch_size,
                            not args.no_readers,
                        )
                    )
                    r = runs[-1]
                    print(
                        f"  {label:22} {topics:>6} {r.pub_per_s:>12,.0f} {r.sub_per_s:>12,.0f} "
                        f"{r.us_per_msg:>8.2f} {r.cores:>6.2f}",
                        flush=True,
                    )
                med = Result(
                    statistics.median(r.pub_per_s for r in runs),
                    statistics.median(r.sub_per_s for r in runs),
                    statistics.median(r.us_per_msg for r in runs),
                    statistics.median(r.cores for r in runs),
                )
                print(
                    f"{label:24} {topics:>6} {med.pub_per_s:>12,.0f} {med.sub_per_s:>12,.0f} "
                    f"{med.us_per_msg:>8.2f} {med.cores:>6.2f}  (median)",
                    flush=True,
                )
    except BenchError as err:
        print(f"bench_workers: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
