"""The sink: ``df.write`` and ``df.writeStream`` publish exactly the rows when nothing fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark._helpers import channel_stats, create_channel, numbered, publish, stats, wait_until
from tests.spark.conftest import Cluster

pytestmark = pytest.mark.timeout(300)


def _read_all(spark: Any, cluster: Cluster, topic: str, channel: str, wal: Path) -> list[bytes]:
    df = (
        spark.read.format("nsq")
        .option("nsqdTCPAddresses", cluster.tcp())
        .option("nsqdHTTPAddresses", cluster.http())
        .option("topic", topic)
        .option("channel", channel)
        .option("walLocation", str(wal))
        .load()
    )
    return [r["body"] for r in df.select("body").collect()]


def test_batch_write(spark: Any, cluster: Cluster, topic: str, tmp_path: Path) -> None:
    n = 20_000
    create_channel(cluster.http(), topic, "check")
    df = spark.range(n).selectExpr("format_string('row-%08d', id) AS body").repartition(3)
    df.write.format("nsq").mode("append").option("nsqdTCPAddresses", cluster.tcp()).option(
        "topic", topic
    ).option("publishBatchSize", 700).save()
    assert stats(cluster.http(), topic)["message_count"] == n
    assert channel_stats(cluster.http(), topic, "check")["depth"] == n
    bodies = _read_all(spark, cluster, topic, "check", tmp_path / "wal")
    assert sorted(bodies) == [f"row-{i:08d}".encode() for i in range(n)]


def test_batch_write_binary_through_lookupd(
    spark: Any, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    n = 2000
    for i in range(2):
        create_channel(cluster.http(i), topic, "check")
    df = spark.range(n).selectExpr("CAST(format_string('b-%05d', id) AS BINARY) AS body")
    (
        df.repartition(4)
        .write.format("nsq")
        .mode("append")
        .option("lookupdHTTPAddresses", cluster.lookupd_http)
        .option("topic", topic)
        .save()
    )
    counts = [stats(cluster.http(i), topic).get("message_count", 0) for i in range(2)]
    assert sum(counts) == n and all(counts), counts  # partitions spread over both nsqd


def test_stream_write_nsq_to_nsq(spark: Any, cluster: Cluster, topic: str, tmp_path: Path) -> None:
    """A streaming pipeline from one topic to another (the source and the sink together)."""
    n = 20_000
    out_topic = f"{topic}_out"
    create_channel(cluster.http(), topic, "spark")
    create_channel(cluster.http(), out_topic, "check")
    publish(cluster.tcp(), topic, numbered(n))
    source = (
        spark.readStream.format("nsq")
        .option("nsqdTCPAddresses", cluster.tcp())
        .option("nsqdHTTPAddresses", cluster.http())
        .option("topic", topic)
        .option("channel", "spark")
        .option("walLocation", str(tmp_path / "wal"))
        .option("maxMessagesPerTrigger", 5000)
        .load()
    )
    query = (
        source.selectExpr("concat(body, CAST('!' AS BINARY)) AS body")
        .writeStream.format("nsq")
        .option("nsqdTCPAddresses", cluster.tcp())
        .option("topic", out_topic)
        .option("markerLocation", str(tmp_path / "markers"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240)
    wait_until("the output", lambda: stats(cluster.http(), out_topic)["message_count"] >= n, 10)
    assert stats(cluster.http(), out_topic)["message_count"] == n
    bodies = _read_all(spark, cluster, out_topic, "check", tmp_path / "wal2")
    assert sorted(bodies) == [b + b"!" for b in numbered(n)]
    # Markers of finished batches are garbage collected; only the last batch's remain, beside
    # COMMITTED (the last batch committed: how a restart knows the markers are its own).
    batches = [p.name for p in (tmp_path / "markers").iterdir() if p.name != "COMMITTED"]
    assert len(batches) == 1 and batches[0].isdigit(), batches
    assert (tmp_path / "markers" / "COMMITTED").read_text() == f"{batches[0]}\n"


def test_sink_rejects_bad_input(spark: Any, cluster: Cluster, topic: str) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="body"):
        df.write.format("nsq").mode("append").option("nsqdTCPAddresses", cluster.tcp()).option(
            "topic", topic
        ).save()
    empty = spark.range(1).selectExpr("'' AS body")
    with pytest.raises(Exception, match="cannot be published"):
        empty.write.format("nsq").mode("append").option("nsqdTCPAddresses", cluster.tcp()).option(
            "topic", topic
        ).save()
