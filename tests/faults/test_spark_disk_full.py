"""The Spark connector on a full file system (issue 28, docs/RELIABILITY.md "A full disk under
Spark"): the source's write-ahead log and Spark's checkpoint, then the sink's markers, on a
small tmpfs that the test fills while a streaming query runs.

Required, and asserted: the query fails with an error that names the file it could not write
and says "no space left on device"; nothing of the batch that failed was FIN'd (the source)
or published (the sink); nothing half written is left behind; and, once space is freed, the
query restarted from the same checkpoint delivers every message exactly once (the Parquet
output, read through Spark; the output topic), without a person's help and without a
``DataLossError`` (a write that failed is not a log lost between runs).

Runs in the Spark session the Spark tests share (tests/spark/conftest.py, ``local[2,4]``).
Root only (tmpfs); skipped otherwise, a failure in CI.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import NSQD
from tests.faults.conftest import Mount, fill_up
from tests.spark import conftest as spark_conftest
from tests.spark._helpers import channel_stats, create_channel, numbered, publish, wait_until
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.timeout(240)

BODY = 1024
NO_SPACE = "no space left on device"


# The Spark tests' fixtures: their shared local[2,4] session (a failed task is retried, as on
# a cluster), stopped at the end of the run.
_spark_sessions = spark_conftest._spark_sessions
spark = spark_conftest.spark


def read_stream(spark: Any, nsqd: NSQD, topic: str, wal: Path) -> Any:
    return (
        spark.readStream.format("nsq")
        .option("nsqdTCPAddresses", nsqd.tcp_address)
        .option("nsqdHTTPAddresses", nsqd.http_address)
        .option("topic", topic)
        .option("channel", "spark")
        .option("walLocation", str(wal))
        .option("maxMessagesPerTrigger", 2000)
        .option("msgTimeout", "10s")
        .load()
    )


def error_line(error: str) -> str:
    """The line of a query's error that says what failed (Spark wraps it in its traces)."""
    return next((line for line in error.splitlines() if "LogWriteError:" in line), "")


def write_stream(df: Any, fmt: str, checkpoint: Path, **options: object) -> Any:
    """Start ``df.writeStream`` in ``fmt`` with a 200 ms trigger."""
    writer = df.writeStream.format(fmt).option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, str(value))
    return writer.trigger(processingTime="200 milliseconds").start()


def run_until_full(
    start: Callable[[], Any],
    nsqd: NSQD,
    topic: str,
    first: list[bytes],
    second: list[bytes],
    fill: Callable[[], Path],
) -> tuple[str, Path]:
    """Publish ``first``, start the query and let it read them, fill the disk (``fill``
    returns the file to delete to free it), publish ``second``: the error the query fails
    with, and that file."""
    publish(nsqd.tcp_address, topic, first)
    query = start()
    try:
        wait_until("the first messages", lambda: input_rows(query) >= len(first), 90)
        filler = fill()
        publish(nsqd.tcp_address, topic, second)
        return failure(query), filler
    finally:
        query.stop()


def input_rows(query: Any) -> int:
    return sum(int(p["numInputRows"]) for p in query.recentProgress)


def failure(query: Any, timeout: float = 90) -> str:
    """The error the query stopped with (waits for it)."""
    wait_until("the query to fail", lambda: query.exception() is not None, timeout)
    query.stop()
    return str(query.exception())


def back_in_nsqd(nsqd: NSQD, topic: str, channel: str, count: int) -> bool:
    """``count`` messages ready in the channel again, none in flight."""
    c = channel_stats(nsqd.http_address, topic, channel)
    return bool(c) and c["depth"] == count and c["in_flight_count"] == 0


def leftovers(root: Path) -> list[Path]:
    """Temporary files a failed write would have left (hidden ``*.tmp``)."""
    return sorted(p for p in root.rglob("*.tmp"))


def leave_room(filler: Path, room: int) -> None:
    """Free ``room`` bytes of a full file system (the end of ``filler``)."""
    os.truncate(filler, max(0, filler.stat().st_size - room))


def test_source_log_on_a_full_disk(
    spark: Any, mounts: Mount, nsqd: NSQD, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint and the log on a 4 MB tmpfs; 64 KB left free, so that Spark's own small
    files (offsets, commits) still fit and the log's segment is what the disk refuses."""
    state = mounts.tmpfs("spark-state", "4m")
    wal, ckpt, out = state / "wal", state / "ckpt", tmp_path / "out"
    topic = "disk_full_source"
    create_channel(nsqd.http_address, topic, "spark")
    first, second = numbered(1000, "a", BODY), numbered(1000, "b", BODY)

    def start() -> Any:
        df = read_stream(spark, nsqd, topic, wal)
        return write_stream(df, "parquet", ckpt, path=out)

    def fill() -> Path:
        filler = fill_up(state)
        leave_room(filler, 64 * 1024)
        return filler

    error, filler = run_until_full(start, nsqd, topic, first, second, fill)
    line = error_line(error)
    assert NO_SPACE in line and f"write {wal}/" in line, error[-3000:]
    assert "not sealed: none of its messages was FIN'd" in error, error[-3000:]
    # nothing of the failed batch was FIN'd: the failed attempts gave it back (REQ)
    wait_until("the messages back in nsqd", lambda: back_in_nsqd(nsqd, topic, "spark", 1000), 30)
    assert leftovers(wal) == [], "a half-written file was left in the log"

    filler.unlink()
    query = start()
    try:
        wait_until("every message", lambda: input_rows(query) >= len(second), 90)
        assert query.exception() is None
    finally:
        query.stop()
    rows = spark.read.parquet(str(out))  # through _spark_metadata
    bodies = [r["body"] for r in rows.select("body").collect()]
    distinct = rows.select("id", "nsqd").distinct().count()
    assert (len(bodies), distinct) == (2000, 2000)
    assert sorted(bodies) == sorted(first + second)
    with capsys.disabled():
        print(f"\n  spark source, log on a full disk: 2000 published, {len(bodies)} rows, "
              f"{distinct} distinct; the error: {error_line(error)}")  # fmt: skip


def published(nsqd: NSQD, topic: str) -> int:
    c = channel_stats(nsqd.http_address, topic, "check")
    return int(c.get("depth", 0)) + int(c.get("in_flight_count", 0)) if c else 0


def drain(nsqd: NSQD, topic: str, channel: str) -> list[bytes]:
    """Every message the channel holds (FINed), until none comes for a second."""
    out: list[bytes] = []
    with RawClient(nsqd.tcp_address) as client:
        client.sub(topic, channel)
        client.rdy(200)
        while (msg := client.poll_message(1.0)) is not None:
            out.append(msg.body)
            client.fin(msg.id)
    return out


def test_sink_markers_on_a_full_disk(
    spark: Any, mounts: Mount, nsqd: NSQD, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nsq → nsq with ``markerLocation`` on a 1 MB tmpfs, filled between two batches: the
    marker's room is taken before publishing, so the batch fails before any of it is
    published, and the restart publishes it once."""
    markers = mounts.tmpfs("spark-markers", "1m")
    source, sink = "disk_full_in", "disk_full_out"
    create_channel(nsqd.http_address, source, "spark")
    create_channel(nsqd.http_address, sink, "check")
    first, second = numbered(500, "a"), numbered(500, "b")

    def start() -> Any:
        df = read_stream(spark, nsqd, source, tmp_path / "wal").selectExpr("body")
        options = {"nsqdTCPAddresses": nsqd.tcp_address, "topic": sink, "markerLocation": markers}
        return write_stream(df, "nsq", tmp_path / "ckpt", **options)

    error, filler = run_until_full(start, nsqd, source, first, second, lambda: fill_up(markers))
    line = error_line(error)
    assert NO_SPACE in line and f"write {markers}/" in line, error[-3000:]
    assert published(nsqd, sink) == len(first), "a batch that failed was published"
    # (the batch's input is in the source's log, or back in nsqd: the restart reads it again)
    assert leftovers(markers) == [], "a half-written marker was left"

    filler.unlink()
    query = start()
    try:
        wait_until("every message", lambda: published(nsqd, sink) >= 1000, 90)
        wait_until("the batch committed", lambda: input_rows(query) >= len(second), 30)
        assert query.exception() is None
    finally:
        query.stop()
    got = drain(nsqd, sink, "check")
    assert len(got) == 1000 and sorted(got) == sorted(first + second)
    with capsys.disabled():
        print(f"\n  spark sink, markers on a full disk: 1000 published, {len(got)} in the "
              f"output topic, {len(set(got))} distinct; the error: "
              f"{error_line(error)}")  # fmt: skip
