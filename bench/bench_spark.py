"""Throughput of the PySpark connector: NSQ source → Parquet, and DataFrame → NSQ sink.

    uv run python bench/bench_spark.py                       # 500k messages of 100 bytes
    uv run python bench/bench_spark.py --messages 1000000 --per-trigger 200000
    uv run python bench/bench_spark.py --nsqd-tcp 127.0.0.1:4150 --nsqd-http 127.0.0.1:4151

Starts a fresh nsqd (``python -m nsqpy.nsqd`` on 127.0.0.1, port 0, temp data dir) unless
``--nsqd-tcp``/``--nsqd-http`` are given, and a local Spark (``--master local[2]``) set up to run
offline. Then:

1. publishes the messages (pipelined MPUB; not part of the figures);
2. **source → parquet**: a streaming query with ``Trigger.AvailableNow`` and
   ``maxMessagesPerTrigger``, WAL on local disk, into Spark's parquet file sink. Reported as
   wall time from ``start()`` to termination, and as rows over the summed micro-batch times
   (``steady``: without the query's start-up);
3. **DataFrame → sink**: a cached DataFrame of the same bodies, ``df.write.format("nsq")``.

Both check their counts (parquet rows read back through Spark; nsqd's topic message_count).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def start_nsqd(data_path: str) -> tuple[subprocess.Popen[bytes], str, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "nsqpy.nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=",
            "--mem-queue-size=10000000",
            f"--data-path={data_path}",
        ],
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stderr is not None
    found: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while len(found) < 2 and time.monotonic() < deadline:
        line = proc.stderr.readline().decode()
        if not line:
            raise SystemExit("nsqd exited before listening")
        m = re.search(r"\b(TCP|HTTP): listening on (\S+)", line)
        if m:
            found[m.group(1)] = m.group(2)
    if len(found) < 2:
        proc.kill()
        raise SystemExit("nsqd did not start")
    # Keep draining its log so that it never blocks on a full pipe.
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
    return proc, found["TCP"], found["HTTP"]


def http_post(url: str) -> None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10):
            pass
    except urllib.error.HTTPError as err:
        raise SystemExit(f"POST {url}: {err.code} {err.read()!r}") from None


def topic_stats(http: str, topic: str) -> dict[str, Any]:
    with urllib.request.urlopen(
        f"http://{http}/stats?format=json&topic={topic}&include_mem=false", timeout=10
    ) as resp:
        data = json.loads(resp.read())
    for t in data.get("topics") or []:
        if t["topic_name"] == topic:
            return dict(t)
    return {}


def publish(tcp: str, topic: str, n: int, size: int) -> float:
    from nsqpy.spark._conn import Publisher
    from nsqpy.wire.v2 import encode_mpub

    chunk = 2000
    started = time.monotonic()
    pub = Publisher(tcp, 5.0, 60.0)
    try:

        def commands() -> Any:
            for start in range(0, n, chunk):
                bodies = [
                    f"{i:012d}".encode().ljust(size, b".")
                    for i in range(start, min(n, start + chunk))
                ]
                yield encode_mpub(topic, bodies)

        pub.publish(commands(), 8)
    finally:
        pub.close()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--per-trigger", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2, help="the source's numPartitions")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--nsqd-tcp")
    parser.add_argument("--nsqd-http")
    parser.add_argument("--skip-source", action="store_true")
    parser.add_argument("--skip-sink", action="store_true")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench-spark-")
    nsqd = None
    try:
        if args.nsqd_tcp and args.nsqd_http:
            tcp, http = args.nsqd_tcp, args.nsqd_http
        else:
            os.makedirs(os.path.join(work, "nsqd"))
            nsqd, tcp, http = start_nsqd(os.path.join(work, "nsqd"))
        os.environ.update(
            {
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": "127.0.0.1",
            }
        )
        from pyspark.sql import SparkSession

        from nsqpy.spark import NSQDataSource

        t0 = time.monotonic()
        spark = (
            SparkSession.builder.master(args.master)
            .appName("nsqpy-bench-spark")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(NSQDataSource)
        print(f"spark {spark.version} {args.master} started in {time.monotonic() - t0:.1f}s")
        n, size = args.messages, args.size
        stamp = int(time.time())

        if not args.skip_source:
            topic = f"bench_src_{stamp}"
            http_post(f"http://{http}/topic/create?topic={topic}")
            http_post(f"http://{http}/channel/create?topic={topic}&channel=spark")
            took = publish(tcp, topic, n, size)
            print(f"published {n:,} x {size} B in {took:.1f}s ({n / took:,.0f} msgs/s)")
            df = (
                spark.readStream.format("nsq")
                .option("nsqdTCPAddresses", tcp)
                .option("nsqdHTTPAddresses", http)
                .option("topic", topic)
                .option("channel", "spark")
                .option("walLocation", os.path.join(work, "wal"))
                .option("maxMessagesPerTrigger", args.per_trigger)
                .option("numPartitions", args.partitions)
                .load()
            )
            out = os.path.join(work, "out")
            started = time.monotonic()
            query = (
                df.writeStream.format("parquet")
                .option("path", out)
                .option("checkpointLocation", os.path.join(work, "ckpt"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            wall = time.monotonic() - started
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            if os.environ.get("BENCH_VERBOSE"):
                for p in progress:
                    print(p["batchId"], p["numInputRows"], json.dumps(p["durationMs"]))
            # Steady state: the batches after the first, which pays for the Python workers'
            # start, the planner and the JIT warm-up.
            later = progress[1:]
            busy = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
            later_rows = sum(p["numInputRows"] for p in later)
            rows = spark.read.parquet(out).count()
            status = "OK" if rows == n else f"MISMATCH ({rows:,} rows)"
            steady = f"{later_rows / busy:,.0f}" if busy else "n/a"
            print(
                f"source -> parquet: {n:,} msgs in {wall:.1f}s wall = {n / wall:,.0f} msgs/s "
                f"(query start-up included); steady {steady} msgs/s "
                f"({later_rows:,} msgs in {len(later)} batches after the first) [{status}]"
            )

        if not args.skip_sink:
            topic = f"bench_sink_{stamp}"
            http_post(f"http://{http}/topic/create?topic={topic}")
            http_post(f"http://{http}/channel/create?topic={topic}&channel=check")
            bodies = (
                spark.range(n, numPartitions=2)
                .selectExpr(f"rpad(format_string('%012d', id), {size}, '.') AS body")
                .cache()
            )
            bodies.count()
            started = time.monotonic()
            bodies.write.format("nsq").mode("append").option("nsqdTCPAddresses", tcp).option(
                "topic", topic
            ).save()
            took = time.monotonic() - started
            count = topic_stats(http, topic).get("message_count", 0)
            status = "OK" if count == n else f"MISMATCH ({count:,} published)"
            print(
                f"dataframe -> sink: {n:,} msgs in {took:.1f}s = {n / took:,.0f} msgs/s [{status}]"
            )
        spark.stop()
    finally:
        if nsqd is not None:
            nsqd.terminate()
            try:
                nsqd.wait(10)
            except subprocess.TimeoutExpired:
                nsqd.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
