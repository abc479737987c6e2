"""The Spark source's read task without Spark: CPU per message of the task and of nsqd.

    uv run python bench/bench_read_task.py                      # 500,000 x 100 B, 2 tasks of 250,000
    uv run python bench/bench_read_task.py --messages 1000000 --quota 500000
    uv run python bench/bench_read_task.py --profile-nsqd /tmp/nsqd.txt   # py-spy raw output

Starts a fresh nsqd (as bench_spark.py does), publishes the messages, then runs
``nsqpy.spark._task.read_partition`` in this process, one partition after the other, exactly
as an executor's Python worker does (subscribe, Arrow columns, WAL segments with fsync, seal,
FIN after CLS). It prints messages/s and the CPU per message of this process and of nsqd, so
that the connector's own cost can be told apart from Spark's (bench_spark.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_spark import http_post, publish, start_nsqd  # noqa: E402

from nsqpy.spark._offsets import PartitionPlan  # noqa: E402
from nsqpy.spark._options import SourceOptions  # noqa: E402
from nsqpy.spark._task import read_partition  # noqa: E402


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--quota", type=int, default=250_000, help="messages per read task")
    parser.add_argument("--profile-nsqd", metavar="FILE", help="py-spy record nsqd (raw format)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-read-task-")
    nsqd, tcp, http = start_nsqd(work)
    spy = None
    try:
        http_post(f"http://{http}/topic/create?topic=t")
        http_post(f"http://{http}/channel/create?topic=t&channel=c")
        publish(tcp, "t", args.messages, args.size)
        options = SourceOptions.parse(
            {"nsqdtcpaddresses": tcp, "topic": "t", "channel": "c", "wallocation": work + "/wal"},
            streaming=True,
        )
        # What a warm Python worker already has: the first compute call imports pandas.
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        pc.binary_length(pa.array([b"x"]))
        if args.profile_nsqd:
            spy = subprocess.Popen(
                [
                    os.path.join(os.path.dirname(sys.executable), "py-spy"),
                    "record",
                    "-p",
                    str(nsqd.pid),
                    "-o",
                    args.profile_nsqd,
                    "-f",
                    "raw",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        nsqd0, task0, started = proc_cpu(nsqd.pid), self_cpu(), time.perf_counter()
        rows = 0
        for index in range(-(-args.messages // args.quota)):
            plan = PartitionPlan("r", 1, index, tcp, args.quota, "t", "c")
            for batch in read_partition(plan, options):
                rows += batch.num_rows
        took = time.perf_counter() - started
        task = self_cpu() - task0
        time.sleep(1.0)  # the FIN-confirming threads and nsqd finish the FINs
        nsqd_cpu = proc_cpu(nsqd.pid) - nsqd0
        status = "OK" if rows == args.messages else f"MISMATCH ({rows:,} rows)"
        print(
            f"read {rows:,} x {args.size} B in tasks of {args.quota:,}: {rows / took:,.0f} msgs/s; "
            f"cpu us/msg: task {1e6 * task / rows:.2f}, nsqd {1e6 * nsqd_cpu / rows:.2f} [{status}]"
        )
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait()
        nsqd.kill()
        nsqd.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
