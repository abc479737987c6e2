"""The connector on a real Spark standalone cluster (tests/spark/_standalone.py): executors in
their own JVMs, on two workers, with their own Python workers; the driver only plans.

One cluster serves every test here (the ``standalone`` fixture); the in-process session on it
(``cluster_spark``) holds both executors. The executor-kill test comes after the others that
use that session (they would wait for the replacement executor to register), and the
driver-kill test, whose driver is another process, runs last and without it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark._helpers import (
    channel_stats,
    create_channel,
    drained,
    nsq_stream,
    numbered,
    publish,
    to_parquet,
    wait_until,
)
from tests.spark._helpers import stats as topic_stats
from tests.spark._standalone import StandaloneCluster, wait_gone
from tests.spark.conftest import Cluster, use_session
from tests.spark.stream_driver import driver_config, kill_and_drain
from tests.spark.test_source import check_lookupd_two_nsqd

pytestmark = pytest.mark.timeout(300)


def _assert_exactly_once(spark: Any, out: Path, n: int, context: object) -> None:
    df = spark.read.parquet(str(out))
    rows = df.count()
    distinct = df.select("topic", "id", "nsqd").distinct().count()
    bodies = df.select("topic", "body").distinct().count()
    assert (rows, distinct, bodies) == (n, n, n), context


def test_available_now_takes_the_topic_backlog(
    cluster_spark: Any, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """Issue 12 §2 on the cluster: published before any channel existed, all of it is read."""
    n = 100_000
    publish(cluster.tcp(), topic, numbered(n, size=100), chunk=5000)
    assert topic_stats(cluster.http(), topic)["depth"] == n
    df = nsq_stream(cluster_spark, cluster, topic, tmp_path / "wal", maxMessagesPerTrigger=50_000)
    query = to_parquet(df, tmp_path, availableNow=True)
    assert query.awaitTermination(240), "the AvailableNow query did not stop"
    _assert_exactly_once(cluster_spark, tmp_path / "out", n, query.recentProgress)
    assert drained(cluster.http(), topic, "spark")


def test_sink_then_batch_read(
    cluster_spark: Any, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """df.write to both nsqd (tasks spread over them), then spark.read of everything, on a
    channel the read creates (the topic's backlog is counted as on its way)."""
    n = 20_000
    rows = cluster_spark.range(n).selectExpr("concat('row-', cast(id as string)) AS body")
    (
        rows.repartition(4)
        .write.format("nsq")
        .mode("append")
        .option("nsqdTCPAddresses", f"{cluster.tcp(0)},{cluster.tcp(1)}")
        .option("topic", topic)
        .save()
    )
    depths = [topic_stats(cluster.http(i), topic)["depth"] for i in range(2)]
    assert sum(depths) == n and all(depths), depths
    read = (
        cluster_spark.read.format("nsq")
        .option("nsqdTCPAddresses", f"{cluster.tcp(0)},{cluster.tcp(1)}")
        .option("nsqdHTTPAddresses", f"{cluster.http(0)},{cluster.http(1)}")
        .option("topic", topic)
        .option("channel", "batch")
        .option("walLocation", str(tmp_path / "wal"))
        .option("idleTimeout", "2s")
        .load()
    )
    read.write.parquet(str(tmp_path / "out"))
    out = cluster_spark.read.parquet(str(tmp_path / "out"))
    assert out.count() == n
    assert out.select("body").distinct().count() == n
    assert all(drained(cluster.http(i), topic, "batch") for i in range(2))


def test_lookupd_discovery_two_nsqd(
    cluster_spark: Any, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    check_lookupd_two_nsqd(cluster_spark, cluster, topic, tmp_path)


def test_executor_killed_mid_batch(
    cluster_spark: Any, standalone: StandaloneCluster, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """SIGKILL of one executor JVM while a read task holds messages, in a query that reads two
    topics: Spark retries its tasks on the other executor, the worker starts a replacement, the
    dead task's messages come back from nsqd after msgTimeout; the parquet output has every
    message of both topics exactly once, each row with its topic."""
    n = 40_000
    topics = [topic, f"{topic}_2"]
    for name, prefix in zip(topics, ("a", "b"), strict=True):
        create_channel(cluster.http(), name, "spark")
        publish(cluster.tcp(), name, numbered(n // 2, prefix, size=100))
    df = nsq_stream(
        cluster_spark,
        cluster,
        ",".join(topics),
        tmp_path / "wal",
        maxMessagesPerTrigger=5000,
        msgTimeout="3s",
    )
    query = to_parquet(df, tmp_path, processingTime="200 milliseconds")
    try:
        wait_until("two executor JVMs", lambda: len(standalone.executor_pids()) == 2, 120)
        executors = standalone.executor_pids()
        # Mid-batch: a read task holds messages in flight.
        wait_until(
            "a read task with messages in flight",
            lambda: (
                channel_stats(cluster.http(), topic, "spark")["in_flight_count"] > 0
                and channel_stats(cluster.http(), topic, "spark")["depth"] < n // 2
            ),
            120,
            0.02,
        )
        victim = executors[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = channel_stats(cluster.http(), topic, "spark")
        wait_gone(victim, 30)
        wait_until(
            "a replacement executor",
            lambda: len(pids := standalone.executor_pids()) == 2 and victim not in pids,
            120,
        )
        deadline = time.monotonic() + 180
        stable = 0
        while stable < 2:  # nothing ready, in flight or deferred, twice msgTimeout apart
            assert time.monotonic() < deadline, f"not drained: {killed_at}"
            assert query.exception() is None, query.exception()
            done = all(drained(cluster.http(), t, "spark") for t in topics)
            stable = stable + 1 if done else 0
            time.sleep(3.2)
        query.processAllAvailable()
    finally:
        query.stop()
    print(f"channel when the executor was killed: {killed_at}")
    _assert_exactly_once(cluster_spark, tmp_path / "out", n, killed_at)
    out = cluster_spark.read.parquet(str(tmp_path / "out"))
    per_topic = {r["topic"]: r["count"] for r in out.groupBy("topic").count().collect()}
    assert per_topic == {t: n // 2 for t in topics}
    assert out.filter(f"topic = '{topic}' AND CAST(body AS STRING) NOT LIKE 'a-%'").count() == 0


def test_driver_killed_and_restarted(
    standalone: StandaloneCluster, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """kill -9 of the driver (its own process group; the master then removes its executors)
    and a restart from the checkpoint, on the cluster: exactly once. (Killed twice, in local
    mode: tests/faults/test_spark_driver_kill.py.)"""
    use_session(None)  # the driver below needs the cluster's cores
    n = 12_000
    create_channel(cluster.http(), topic, "spark")
    publish(cluster.tcp(), topic, numbered(n))
    config = driver_config(cluster, topic, tmp_path, standalone.url, per_trigger=3000)
    kills, counts = kill_and_drain(cluster.http(), topic, "spark", tmp_path, config, kills=1)
    assert counts == {"rows": n, "distinct": n, "bodies": n}, kills
