"""What Spark's Kafka connector users expect, on a real local Spark and real nsqd/nsqlookupd
(issue 31): a topicPattern that finds a topic created after the query started, the sink's
routing (a topic column, the option winning, deferMs by DPUB), minMessagesPerTrigger with
maxTriggerDelay, the lag in the query's progress, and failOnDataLoss both ways."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark._helpers import (
    channel_stats,
    create_channel,
    drained,
    lookup_count,
    nsq_stream,
    numbered,
    publish,
    stats,
    to_parquet,
    wait_until,
)
from tests.spark.conftest import Cluster

pytestmark = pytest.mark.timeout(240)


def _per_topic(spark: Any, out: Path) -> dict[str, tuple[int, int]]:
    """Rows and distinct (nsqd, id) per topic of the parquet output."""
    df = spark.read.parquet(str(out))
    rows = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    distinct = df.select("topic", "nsqd", "id").distinct().groupBy("topic").count().collect()
    return {r["topic"]: (rows[r["topic"]], r["count"]) for r in distinct}


def test_topic_pattern_finds_a_topic_created_later(
    spark: Any, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    first, later, other = f"{topic}_a", f"{topic}_b", f"x{topic}_c"
    publish(cluster.tcp(0), first, numbered(500, "a"))
    publish(cluster.tcp(0), other, numbered(50, "c"))  # does not match the pattern
    wait_until(
        "nsqlookupd to know the topic", lambda: lookup_count(cluster.lookupd_http, first), 10
    )
    df = (
        spark.readStream.format("nsq")
        .option("lookupdHTTPAddresses", cluster.lookupd_http)
        .option("topicPattern", f"{topic}_.*")
        .option("channel", "spark")
        .option("walLocation", str(tmp_path / "wal"))
        .option("lookupdPollInterval", "500ms")
        .load()
    )
    query = to_parquet(df, tmp_path, processingTime="100 milliseconds")
    try:
        wait_until("the first topic read", lambda: drained(cluster.http(0), first, "spark"), 60)
        publish(cluster.tcp(1), later, numbered(300, "b"))  # a new topic, on the other nsqd
        wait_until("the new topic read", lambda: drained(cluster.http(1), later, "spark"), 60)
        query.processAllAvailable()
    finally:
        query.stop()
    assert _per_topic(spark, tmp_path / "out") == {first: (500, 500), later: (300, 300)}
    assert channel_stats(cluster.http(0), other, "spark") == {}  # never subscribed


def test_sink_routes_by_topic_column_option_wins_and_defers(
    spark: Any, cluster: Cluster, topic: str
) -> None:
    t1, t2, t3 = f"{topic}_1", f"{topic}_2", f"{topic}_3"
    for t in (t1, t2, t3):
        create_channel(cluster.http(), t, "check")
    n = 3000
    df = spark.range(n).selectExpr(
        f"IF(id % 3 = 0, '{t1}', '{t2}') AS topic",
        "format_string('r-%06d', id) AS body",
        "IF(id % 10 = 0, 600000, NULL) AS deferMs",
    )
    sink = df.repartition(3).write.format("nsq").mode("append")
    sink.option("nsqdTCPAddresses", cluster.tcp()).option("publishBatchSize", 400).save()
    to_t1 = len([i for i in range(n) if i % 3 == 0])
    deferred_t1 = len([i for i in range(n) if i % 3 == 0 and i % 10 == 0])
    deferred_t2 = len([i for i in range(n) if i % 3 and i % 10 == 0])
    assert stats(cluster.http(), t1)["message_count"] == to_t1
    assert stats(cluster.http(), t2)["message_count"] == n - to_t1
    for t, deferred, total in ((t1, deferred_t1, to_t1), (t2, deferred_t2, n - to_t1)):
        check = channel_stats(cluster.http(), t, "check")
        # deferMs rows went by DPUB: deferred in nsqd, the others ready at once.
        assert (check["deferred_count"], check["depth"]) == (deferred, total - deferred), check

    # The option topic, when set, wins over the column (Kafka's rule).
    df.write.format("nsq").mode("append").option("nsqdTCPAddresses", cluster.tcp()).option(
        "topic", t3
    ).save()
    assert stats(cluster.http(), t3)["message_count"] == n
    assert channel_stats(cluster.http(), t3, "check")["deferred_count"] == n // 10
    assert stats(cluster.http(), t1)["message_count"] == to_t1


def test_min_messages_per_trigger_and_lag_in_progress(
    spark: Any, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """Fewer than minMessagesPerTrigger wait for maxTriggerDelay; enough go at once. The
    progress of each batch carries the lag the planner saw (reportLatestOffset)."""
    create_channel(cluster.http(), topic, "spark")
    delay = 6.0
    df = nsq_stream(
        spark,
        cluster,
        topic,
        tmp_path / "wal",
        minMessagesPerTrigger=1000,
        maxTriggerDelay=f"{delay}s",
    )
    started = time.monotonic()
    query = to_parquet(df, tmp_path, processingTime="100 milliseconds")
    try:
        publish(cluster.tcp(), topic, numbered(300, "few"))

        def batches() -> list[Any]:
            return [p for p in query.recentProgress if p["numInputRows"]]

        first = wait_until("the delayed batch", lambda: batches(), 60, 0.05)[0]
        waited = time.monotonic() - started
        assert waited >= delay, f"a batch of {first['numInputRows']} after {waited:.1f}s"
        assert first["numInputRows"] == 300
        lag = json.loads(first["sources"][0]["latestOffset"])
        assert lag["messagesBehind"] == 300, lag
        assert lag["topics"][topic][cluster.tcp()]["channelDepth"] == 300, lag
        assert {"inFlight", "deferred", "topicDepth"} <= set(lag["topics"][topic][cluster.tcp()])

        published = time.monotonic()
        publish(cluster.tcp(), topic, numbered(1500, "many"))
        second = wait_until("a batch of enough messages", lambda: batches()[1:], 60, 0.05)[0]
        assert time.monotonic() - published < delay, "enough messages waited for the delay"
        assert second["numInputRows"] == 1500
        query.processAllAvailable()
    finally:
        query.stop()
    assert _per_topic(spark, tmp_path / "out") == {topic: (1800, 1800)}


def test_fail_on_data_loss(spark: Any, cluster: Cluster, topic: str, tmp_path: Path) -> None:
    """The log is deleted between two runs of a query (two topics): by default the restart
    fails with a clear error and reads nothing; with failOnDataLoss=false it goes on."""
    topics = [topic, f"{topic}_2"]
    for t in topics:
        create_channel(cluster.http(), t, "spark")
        publish(cluster.tcp(), t, numbered(400, t))

    def run(**options: object) -> Any:
        df = nsq_stream(spark, cluster, ",".join(topics), tmp_path / "wal", **options)
        return to_parquet(df, tmp_path, availableNow=True)

    assert run().awaitTermination(120)
    shutil.rmtree(tmp_path / "wal")
    publish(cluster.tcp(), topic, numbered(100, "after"))
    failing = run()
    with pytest.raises(Exception, match=r"write-ahead log .* is gone"):
        failing.awaitTermination(120)
    assert channel_stats(cluster.http(), topic, "spark")["depth"] == 100  # nothing read
    assert run(failOnDataLoss="false").awaitTermination(120)
    assert _per_topic(spark, tmp_path / "out") == {topic: (500, 500), topics[1]: (400, 400)}
