"""Throughput of the PySpark connector against Spark's own ceiling, in one run.

    uv run python bench/bench_spark.py                       # 2,000,000 x 100 B, 500,000 per trigger
    uv run python bench/bench_spark.py --messages 1000000 --per-trigger 100000
    uv run python bench/bench_spark.py --nsqd-tcp 127.0.0.1:4150 --nsqd-http 127.0.0.1:4151

Starts a fresh nsqd (``python -m nsqpy.nsqd`` on 127.0.0.1, port 0, temp data dir) unless
``--nsqd-tcp``/``--nsqd-http`` are given, and a local Spark (``--master local[2]``) set up to run
offline. Then, in the same Spark session:

1. publishes the messages (pipelined MPUB; not part of the figures);
2. **no-op → parquet** (the ceiling; after warm-up runs of the no-op with each schema, not
   counted): a Python streaming Data Source whose ``read()`` yields
   prebuilt Arrow record batches of 10,000 rows (``id`` string, ``body`` binary),
   ``--partitions`` partitions per micro-batch, the same rows and triggers as the ``nsq`` run;
3. **nsq → parquet**: the ``nsq`` source with ``Trigger.AvailableNow`` and
   ``maxMessagesPerTrigger``, WAL on local disk (fsync on), into Spark's parquet file sink;
   and **nsq-multi**: the same number of rows from two other topics (half each) in one query
   (``topics``), per row beside the single topic's rate;
4. the **ratios** of the steady rates (rows over the summed micro-batch times of the batches
   after the first, which pays for the Python workers' start-up): nsq / no-op (the issue's
   figure); nsq / a no-op with the nsq source's seven columns (what Spark's side costs for that
   schema: its conversion and the parquet writer's work per column); and the nsq source with
   ``.schema("id string, body binary")``, the no-op's own columns, on a second channel / no-op;
5. **DataFrame → sink**, beside the **no-op sink** (a Python Arrow writer that only counts, the
   ceiling of Spark's side), after a warm-up write of each, ``--sink-rounds`` times: a cached
   DataFrame of the same bodies, ``df.write.format("nsq")``, and the streaming sink: the no-op
   source ``writeStream.format("nsq")`` with ``Trigger.AvailableNow`` (steady rate).

Every figure checks its count (parquet rows read back through Spark; nsqd's topic
message_count). ``BENCH_VERBOSE=1`` prints every micro-batch's ``durationMs``.
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
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def start_nsqd(
    data_path: str, extra: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
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
            *(extra or []),
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


def noop_source(rows_per_batch: int = 10_000) -> Any:
    """The ceiling: a streaming Python Data Source named ``noop_arrow`` with the options
    ``messages``, ``perTrigger`` and ``partitions``, whose ``read()`` only yields prebuilt Arrow
    batches (``id`` string, ``body`` binary, 100-byte bodies)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    class NoopReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options: dict[str, str]) -> None:
            self.full = options.get("schema") == "nsq"
            self.total = int(options["messages"])
            self.per_trigger = int(options["pertrigger"])
            self.parts = int(options["partitions"])

        def initialOffset(self) -> dict[str, Any]:
            return {"n": 0}

        def getDefaultReadLimit(self) -> ReadLimit:
            return ReadMaxRows(self.per_trigger)

        def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
            cap = limit.max_rows if isinstance(limit, ReadMaxRows) else self.total
            return {"n": min(self.total, start["n"] + cap)}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Any:
            rows = end["n"] - start["n"]
            base, extra = divmod(rows, self.parts)
            return [InputPartition(base + (1 if j < extra else 0)) for j in range(self.parts)]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            n = int(partition.value)
            ids = pa.array([f"{i:016x}" for i in range(rows_per_batch)], pa.string())
            bodies = pa.array([b"x" * 100] * rows_per_batch, pa.binary())
            if self.full:  # the nsq source's columns, the same values as its rows carry
                from nsqpy.spark._schema import ARROW_SCHEMA, with_constants

                now = time.time_ns() // 1000
                stamps = pa.array(range(now, now + rows_per_batch), pa.int64())
                segment = pa.RecordBatch.from_arrays(
                    [
                        ids,
                        stamps.cast(ARROW_SCHEMA.field("timestamp").type),
                        pa.array([1] * rows_per_batch, pa.int32()),
                        bodies,
                    ],
                    schema=pa.schema(list(ARROW_SCHEMA)[:4]),
                )
                full = with_constants(segment, "bench_src_1764100000", "spark", "127.0.0.1:4150")
            else:
                full = pa.RecordBatch.from_arrays([ids, bodies], names=["id", "body"])
            for start in range(0, n, rows_per_batch):
                yield full.slice(0, min(rows_per_batch, n - start))

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class NoopArrowSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "noop_arrow"

        def schema(self) -> Any:
            if self.options.get("schema") == "nsq":
                from nsqpy.spark._schema import SCHEMA

                return SCHEMA
            return "id string, body binary"

        def streamReader(self, schema: Any) -> Any:
            return NoopReader(dict(self.options))

    return NoopArrowSource


def noop_sink() -> Any:
    """The sink's ceiling: a Python Data Source named ``noop_sink`` whose batch and streaming
    Arrow writers only count the rows Spark hands them."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )

    def count(iterator: Any) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    class NoopWriter(DataSourceArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            return count(iterator)

    class NoopStreamWriter(DataSourceStreamArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            return count(iterator)

        def commit(self, messages: Any, batchId: int) -> None:
            pass

        def abort(self, messages: Any, batchId: int) -> None:
            pass

    class NoopSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "noop_sink"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return NoopWriter()

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return NoopStreamWriter()

    return NoopSink


def steady_rate(query: Any, label: str) -> tuple[float, int, int]:
    """Rows/s over the micro-batches after the first, their rows and count."""
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    if os.environ.get("BENCH_VERBOSE"):
        for p in progress:
            print(f"  {label} batch {p['batchId']}: {p['numInputRows']:,} rows", p["durationMs"])
    later = progress[1:] or progress
    busy = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
    rows = sum(p["numInputRows"] for p in later)
    return (rows / busy if busy else 0.0), rows, len(later)


def run_to_parquet(spark: Any, df: Any, work: str, name: str, expect: int) -> tuple[float, str]:
    """Run ``df`` into parquet with Trigger.AvailableNow; (steady rows/s, summary line)."""
    out = os.path.join(work, f"out-{name}")
    started = time.monotonic()
    query = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", os.path.join(work, f"ckpt-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.monotonic() - started
    rate, rows, batches = steady_rate(query, name)
    count = spark.read.parquet(out).count()
    status = "OK" if count == expect else f"MISMATCH ({count:,} rows)"
    return rate, (
        f"{name} -> parquet: steady {rate:,.0f} rows/s ({rows:,} rows in {batches} batches "
        f"after the first); {expect:,} in {wall:.1f}s wall incl. start-up [{status}]"
    )


def tree_cpu(nsqd_pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) so far of nsqd, Spark's JVM, its Python workers and this
    driver process, read from /proc (Linux; empty elsewhere). Exited processes are not
    counted, so a difference is a lower bound."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    procs: dict[int, tuple[int, str, float]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                comm, _, rest = f.read().rpartition(")")
            fields = rest.split()
            procs[int(name)] = (
                int(fields[1]),
                comm.partition("(")[2],
                (int(fields[11]) + int(fields[12])) / ticks,
            )
        except (OSError, ValueError, IndexError):
            continue
    me = os.getpid()
    out = {"nsqd": 0.0, "jvm": 0.0, "python workers": 0.0, "driver": 0.0}
    for pid, (ppid, comm, cpu) in procs.items():
        if pid == nsqd_pid:
            out["nsqd"] += cpu
        elif pid == me:
            out["driver"] += cpu
        else:
            up = ppid
            while up > 1 and up != me and up in procs:
                up = procs[up][0]
            if up == me:
                out["jvm" if comm == "java" else "python workers"] += cpu
    return out


def cpu_line(before: dict[str, float], after: dict[str, float], rows: int) -> str:
    parts = [f"{k} {(after[k] - before[k]) / rows * 1e6:.2f}" for k in before]
    return "  cpu us/row: " + ", ".join(parts)


def load_line() -> str:
    try:
        with open("/proc/loadavg") as f:
            return "load " + " ".join(f.read().split()[:3])
    except OSError:
        return "load n/a"


def sink(
    spark: Any,
    noop_df: Any,
    nsqd_pid: int | None,
    addresses: tuple[str, str],
    work: str,
    n: int,
    size: int,
    rounds: int,
) -> None:
    """DataFrame → sink, batch and streaming, each beside the no-op sink (Spark's ceiling for a
    Python Arrow writer), after a warm-up write of each kind that is not counted."""
    tcp, http = addresses
    topic = f"bench_sink_{int(time.time())}"
    http_post(f"http://{http}/topic/create?topic={topic}")
    http_post(f"http://{http}/channel/create?topic={topic}&channel=check")
    bodies = (
        spark.range(n, numPartitions=2)
        .selectExpr(f"rpad(format_string('%012d', id), {size}, '.') AS body")
        .cache()
    )
    bodies.count()
    published = 0

    def check(expect: int) -> str:
        count = topic_stats(http, topic).get("message_count", 0) - published
        # The topic's message_count is what is checked; the channel, which nobody reads, is
        # emptied so that every write meets the same nsqd (a backlog growing by millions per
        # write would spill to disk and slow the later rounds, which measures nsqd, not the sink).
        http_post(f"http://{http}/channel/empty?topic={topic}&channel=check")
        return "OK" if count == expect else f"MISMATCH ({count:,} published)"

    def batch(fmt: str) -> float:
        writer = bodies.write.format(fmt).mode("append")
        if fmt == "nsq":
            writer = writer.option("nsqdTCPAddresses", tcp).option("topic", topic)
        started = time.monotonic()
        writer.save()
        return n / (time.monotonic() - started)

    def streaming(fmt: str, name: str) -> float:
        writer = noop_df().writeStream.format(fmt)
        if fmt == "nsq":
            writer = writer.option("nsqdTCPAddresses", tcp).option("topic", topic)
        query = (
            writer.option("checkpointLocation", os.path.join(work, f"ckpt-{name}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return steady_rate(query, name)[0]

    for fmt in ("noop_sink", "nsq"):  # warm-up: the JVM's first writes run cold code
        batch(fmt)
        streaming(fmt, f"sink-warm-up-{fmt}")
        if fmt == "nsq":
            print(f"warm-up (not counted) -> sink (batch, streaming) [{check(2 * n)}]")
            published += 2 * n
    results: dict[str, list[float]] = {}
    for r in range(rounds):
        for kind in ("batch", "streaming"):
            for fmt in ("noop_sink", "nsq"):
                cpu0 = tree_cpu(nsqd_pid)
                if kind == "batch":
                    rate = batch(fmt)
                    line = f"dataframe -> {fmt} (batch): {rate:,.0f} msgs/s"
                else:
                    rate = streaming(fmt, f"sink-{fmt}-{r}")
                    line = f"no-op source -> {fmt} (streaming): steady {rate:,.0f} msgs/s"
                results.setdefault(f"{kind} {fmt}", []).append(rate)
                if fmt == "nsq":
                    line += f" [{check(n)}]"
                    published += n
                print(line)
                print(cpu_line(cpu0, tree_cpu(nsqd_pid), n))
        print(f"[{load_line()}]")
    bodies.unpersist()
    for kind in ("batch", "streaming"):
        nsq, ceiling = results[f"{kind} nsq"], results[f"{kind} noop_sink"]
        print(
            f"RESULT sink ({kind}): nsq {', '.join(f'{r:,.0f}' for r in nsq)} msgs/s; "
            f"no-op sink {', '.join(f'{r:,.0f}' for r in ceiling)} msgs/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--per-trigger", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=2, help="numPartitions of both sources")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--nsqd-tcp")
    parser.add_argument("--nsqd-http")
    parser.add_argument(
        "--nsqd-arg", action="append", default=[], help="an extra flag for the nsqd started"
    )
    parser.add_argument("--skip-source", action="store_true", help="no source runs (sink only)")
    parser.add_argument("--skip-sink", action="store_true")
    parser.add_argument("--sink-rounds", type=int, default=2, help="rounds of the sink figures")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench-spark-")
    nsqd = None
    try:
        if args.nsqd_tcp and args.nsqd_http:
            tcp, http = args.nsqd_tcp, args.nsqd_http
        else:
            os.makedirs(os.path.join(work, "nsqd"))
            nsqd, tcp, http = start_nsqd(os.path.join(work, "nsqd"), args.nsqd_arg)
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
        spark.dataSource.register(noop_source())
        spark.dataSource.register(noop_sink())
        print(f"spark {spark.version} {args.master} started in {time.monotonic() - t0:.1f}s")
        n, size = args.messages, args.size
        stamp = int(time.time())

        def noop_df(schema: str = "") -> Any:
            return (
                spark.readStream.format("noop_arrow")
                .option("messages", n)
                .option("perTrigger", args.per_trigger)
                .option("partitions", args.partitions)
                .option("schema", schema)
                .load()
            )

        def nsq_df(channel: str, schema: str | None = None, topics: str | None = None) -> Any:
            reader = spark.readStream.format("nsq")
            if schema is not None:
                reader = reader.schema(schema)
            return (
                reader.option("nsqdTCPAddresses", tcp)
                .option("nsqdHTTPAddresses", http)
                .option("topics", topics or topic)
                .option("channel", channel)
                .option("walLocation", os.path.join(work, f"wal-{channel}"))
                .option("maxMessagesPerTrigger", args.per_trigger)
                .option("numPartitions", args.partitions)
                .load()
            )

        if not args.skip_source:
            topic = f"bench_src_{stamp}"
            http_post(f"http://{http}/topic/create?topic={topic}")
            for channel in ("spark", "spark_id_body"):
                http_post(f"http://{http}/channel/create?topic={topic}&channel={channel}")
            took = publish(tcp, topic, n, size)
            print(f"published {n:,} x {size} B in {took:.1f}s ({n / took:,.0f} msgs/s)")
            # The multi-topic run: the same rows over two more topics, half each.
            multi = [f"{topic}_a", f"{topic}_b"]
            for part, name in zip((n // 2, n - n // 2), multi, strict=True):
                http_post(f"http://{http}/topic/create?topic={name}")
                http_post(f"http://{http}/channel/create?topic={name}&channel=spark_multi")
                publish(tcp, name, part, size)
            print(f"{n:,} rows, {args.per_trigger:,} per trigger, {args.partitions} partitions")
            print(f"[{load_line()}]")
            nsqd_pid = nsqd.pid if nsqd is not None else None
            # First runs warm the JVM up, for each schema (its JIT makes a cold no-op run about
            # half as fast, which would flatter the ratio; and the first query with the seven
            # columns compiles their converters and Parquet writers, which would hand the cost to
            # whichever run comes first); they are not counted. Then the ceiling is measured
            # before and after the nsq runs (the machine is shared): the ratios use their mean.
            # Beside the ceiling (id and body), the no-op with the nsq source's seven
            # columns tells what Spark's side costs for that schema, and the nsq source with the
            # schema "id string, body binary" (only those columns) gives the like-for-like figure.
            for schema in ("", "nsq"):
                name = f"warm-up{'-nsq-schema' if schema else ''}"
                _, line = run_to_parquet(spark, noop_df(schema), work, name, n)
                print(line.replace(f"{name} -> parquet", f"{name} (not counted) -> parquet"))
            runs: dict[str, Callable[[], Any]] = {
                "noop": noop_df,
                "nsq": lambda: nsq_df("spark"),
                "nsq-multi": lambda: nsq_df("spark_multi", topics=",".join(multi)),
                "noop-nsq-schema": lambda: noop_df("nsq"),
                "nsq-id-body": lambda: nsq_df("spark_id_body", "id string, body binary"),
                "noop-again": noop_df,
            }
            rates: dict[str, float] = {}
            for name, make in runs.items():
                cpu0 = tree_cpu(nsqd_pid)
                rates[name], line = run_to_parquet(spark, make(), work, name, n)
                print(line)
                print(cpu_line(cpu0, tree_cpu(nsqd_pid), n))
                print(f"[{load_line()}]")
            noop_rate = (rates["noop"] + rates["noop-again"]) / 2
            print(
                f"RESULT source: nsq {rates['nsq']:,.0f} rows/s, no-op {noop_rate:,.0f} rows/s "
                f"(mean of {rates['noop']:,.0f}, {rates['noop-again']:,.0f}), "
                f"ratio {rates['nsq'] / noop_rate:.2f}"
            )
            print(
                f"RESULT source, two topics: nsq {rates['nsq-multi']:,.0f} rows/s, "
                f"{rates['nsq-multi'] / rates['nsq']:.2f} of one topic's"
            )
            print(
                f"RESULT source, same schema: no-op with the nsq columns "
                f"{rates['noop-nsq-schema']:,.0f} rows/s, "
                f"ratio {rates['nsq'] / rates['noop-nsq-schema']:.2f}"
            )
            print(
                f"RESULT source, schema id and body: nsq {rates['nsq-id-body']:,.0f} rows/s, "
                f"ratio {rates['nsq-id-body'] / noop_rate:.2f}"
            )

        if not args.skip_sink:
            nsqd_pid = nsqd.pid if nsqd is not None else None
            sink(spark, noop_df, nsqd_pid, (tcp, http), work, n, size, args.sink_rounds)
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
