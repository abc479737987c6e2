"""A Spark Structured Streaming pipeline on NSQ: JSON events from two topics in, windowed
aggregates to Parquet, alerts routed to two topics by a column.

Locally (Spark's default master, ``local[*]``)::

    ./scripts/run.sh &                                             # nsqd on 127.0.0.1:4150 / 4151
    .venv/bin/python examples/spark_pipeline.py --generate 20000   # publish samples, run, exit
    .venv/bin/python examples/spark_pipeline.py --continuous       # run until Ctrl-C
    .venv/bin/nsq_tail --topic alerts --nsqd-tcp-address 127.0.0.1:4150   # watch the alerts

On a cluster, with ``spark-submit`` (the master comes from ``--master``; nsqpy must be
importable on every executor, and ``--work`` must be a path every node sees, see docs/SPARK.md
"Running on a cluster")::

    SPARK_HOME=$(uv run python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
    PYSPARK_PYTHON=$PWD/.venv/bin/python $SPARK_HOME/bin/spark-submit \
        --master spark://127.0.0.1:7077 --conf spark.executor.cores=1 \
        examples/spark_pipeline.py --generate 20000 --work /shared/spark_pipeline

Events on topics ``events`` and ``events_mobile`` (``--topics``; ``--generate`` publishes half
to each) look like ``{"ts": 1795291185.25, "user": "u7", "kind": "click", "value": 42.0}``.
Two streaming queries read both topics (option ``topics``), each on its own NSQ channel (every
channel gets every message, so each query sees all events):

* ``aggregate`` (channel ``spark_aggregate``): per 10-second event-time window, source topic
  and kind, the count and mean value, appended to Parquet under ``<work>/aggregates`` once the
  watermark (30 s) closes the window;
* ``alerts`` (channel ``spark_alerts``): events with ``value`` above ``--threshold``, published
  as JSON by the NSQ sink, routed by a ``topic`` column: ``error`` events to
  ``<alerts-topic>_errors``, the others to ``<alerts-topic>``.

Each query keeps its checkpoint and its NSQ write-ahead log under ``<work>/<query>/``; restart
the script with the same ``--work`` directory and it carries on where it stopped, without losing
or repeating events in the Parquet output.

Offline: the script sets ``PYSPARK_PYTHON`` to this interpreter (unless set), ``SPARK_LOCAL_IP``
to 127.0.0.1 and disables the Spark UI; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any


def generate(nsqd_tcp: str, topics: list[str], count: int) -> None:
    """Publish ``count`` random events spread over the last few minutes, over ``topics``."""
    from nsqpy.client import BlockingProducer

    kinds = ["click", "view", "purchase", "error"]
    now = time.time()
    rng = random.Random(42)
    events = [
        json.dumps(
            {
                "ts": round(now - 300 + 300 * i / count, 3),
                "user": f"u{rng.randrange(100)}",
                "kind": rng.choice(kinds),
                "value": round(rng.expovariate(1 / 20), 2),
            }
        ).encode()
        for i in range(count)
    ]
    with BlockingProducer(nsqd_tcp) as producer:
        for k, start in enumerate(range(0, count, 1000)):
            producer.mpub(topics[k % len(topics)], events[start : start + 1000])
    print(f"published {count} events to {', '.join(topics)}")


def create_channels(nsqd_http: str, topic: str, channels: list[str]) -> None:
    """Create the topic and the queries' channels before anything is published: nsqd only
    keeps messages for channels that exist (a topic without any channel keeps them for the
    first one created, and only for it)."""
    import urllib.request

    for path in [f"/topic/create?topic={topic}"] + [
        f"/channel/create?topic={topic}&channel={c}" for c in channels
    ]:
        request = urllib.request.Request(f"http://{nsqd_http}{path}", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nsqd-tcp", default="127.0.0.1:4150")
    parser.add_argument("--nsqd-http", default="127.0.0.1:4151")
    parser.add_argument("--lookupd-http", help="discover nsqd through nsqlookupd instead")
    parser.add_argument("--topics", default="events,events_mobile", help="comma-separated")
    parser.add_argument("--alerts-topic", default="alerts")
    parser.add_argument("--threshold", type=float, default=90.0)
    parser.add_argument("--work", default="data/spark_pipeline", help="checkpoints, logs, output")
    parser.add_argument("--generate", type=int, default=0, help="publish N sample events first")
    parser.add_argument(
        "--continuous", action="store_true", help="keep running (else: process what is there)"
    )
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = os.path.abspath(args.work)

    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    if args.generate:
        for topic in topics:
            create_channels(args.nsqd_http, topic, ["spark_aggregate", "spark_alerts"])
        generate(args.nsqd_tcp, topics, args.generate)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    from nsqpy.spark import NSQDataSource

    # No .master(): spark-submit's --master (or spark.master in spark-defaults.conf) decides,
    # and a plain `python examples/spark_pipeline.py` gets Spark's default, local[*].
    spark = (
        SparkSession.builder.appName("nsq-spark-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    print(f"Spark master: {spark.sparkContext.master}")
    spark.dataSource.register(NSQDataSource)

    def events(channel: str) -> Any:
        reader = spark.readStream.format("nsq")
        if args.lookupd_http:
            reader = reader.option("lookupdHTTPAddresses", args.lookupd_http)
        else:
            reader = reader.option("nsqdTCPAddresses", args.nsqd_tcp).option(
                "nsqdHTTPAddresses", args.nsqd_http
            )
        raw = (
            reader.option("topics", ",".join(topics))  # several topics in one query
            .option("channel", channel)
            .option("walLocation", os.path.join(work, channel, "nsq-wal"))
            .option("maxMessagesPerTrigger", 50_000)
            .load()
        )
        schema = StructType(
            [
                StructField("ts", DoubleType()),
                StructField("user", StringType()),
                StructField("kind", StringType()),
                StructField("value", DoubleType()),
            ]
        )
        parsed = raw.select(
            F.from_json(F.col("body").cast("string"), schema).alias("e"),
            F.col("timestamp").alias("published_at"),
            F.col("id").alias("nsq_id"),
            F.col("topic").alias("source_topic"),  # which topic the row came from
        )
        return parsed.select(
            "e.*",
            # Event time from the payload; NSQ's publish time when the payload has none.
            F.coalesce(F.timestamp_seconds(F.col("e.ts")), F.col("published_at")).alias(
                "event_time"
            ),
            "nsq_id",
            "source_topic",
        ).where(F.col("kind").isNotNull())

    def trigger(writer: Any) -> Any:
        if args.continuous:
            return writer.trigger(processingTime="5 seconds")
        return writer.trigger(availableNow=True)

    aggregates = (
        events("spark_aggregate")
        .withWatermark("event_time", "30 seconds")
        .groupBy(F.window("event_time", "10 seconds"), "source_topic", "kind")
        .agg(F.count("*").alias("events"), F.avg("value").alias("mean_value"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "source_topic",
            "kind",
            "events",
            "mean_value",
        )
    )
    aggregate_query = trigger(
        aggregates.writeStream.format("parquet")
        .queryName("aggregate")
        .outputMode("append")
        .option("path", os.path.join(work, "aggregates"))
        .option("checkpointLocation", os.path.join(work, "spark_aggregate", "checkpoint"))
    ).start()

    alerts = (
        events("spark_alerts")
        .where(F.col("value") > args.threshold)
        .select(
            # No option topic: the sink routes each row by this column.
            F.when(F.col("kind") == "error", F.lit(f"{args.alerts_topic}_errors"))
            .otherwise(F.lit(args.alerts_topic))
            .alias("topic"),
            F.to_json(
                F.struct(
                    "event_time",
                    "user",
                    "kind",
                    "value",
                    "source_topic",
                    F.col("nsq_id").alias("source_id"),
                )
            ).alias("body"),
        )
    )
    alert_sink = alerts.writeStream.format("nsq").queryName("alerts")
    if args.lookupd_http:
        alert_sink = alert_sink.option("lookupdHTTPAddresses", args.lookupd_http)
    else:
        alert_sink = alert_sink.option("nsqdTCPAddresses", args.nsqd_tcp)
    alert_query = trigger(
        alert_sink.option("markerLocation", os.path.join(work, "spark_alerts", "markers")).option(
            "checkpointLocation", os.path.join(work, "spark_alerts", "checkpoint")
        )
    ).start()

    try:
        if args.continuous:
            print("running; Ctrl-C to stop")
            spark.streams.awaitAnyTermination()
        else:
            aggregate_query.awaitTermination()
            alert_query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        for query in (aggregate_query, alert_query):
            query.stop()

    read = sum(p["numInputRows"] for p in alert_query.recentProgress)
    path = os.path.join(work, "aggregates")
    windows = spark.read.parquet(path) if os.path.exists(path) else None
    print(
        f"alerts query: {read} events checked this run; alerts went to topics "
        f"{args.alerts_topic} and {args.alerts_topic}_errors"
    )
    if windows is not None:
        print(f"aggregates in {path}: {windows.count()} closed windows; latest:")
        windows.orderBy(F.col("window_start").desc(), "source_topic", "kind").show(
            8, truncate=False
        )
    spark.stop()


if __name__ == "__main__":
    main()
