"""Read tasks and connections against a real nsqd, without Spark: quotas, FIN confirmation,
replay, and the dedupe of redeliveries after a crash between the log and the FIN."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from nsqpy.spark._conn import Columns, ConsumerConnection
from nsqpy.spark._offsets import PartitionPlan
from nsqpy.spark._options import SinkOptions, SourceOptions
from nsqpy.spark._schema import to_record_batch
from nsqpy.spark._sink import encode_mpubs
from nsqpy.spark._task import SealLostError, read_partition
from nsqpy.spark._wal import WAL, LogWriteError
from tests.spark._helpers import channel_stats, create_channel, numbered, publish, wait_until
from tests.spark.conftest import Cluster

pytestmark = pytest.mark.timeout(60)


def _options(cluster: Cluster, topic: str, wal: Path, **extra: str) -> SourceOptions:
    raw = {
        "nsqdTCPAddresses": cluster.tcp(),
        "topic": topic,
        "channel": "c",
        "walLocation": str(wal),
        "idleTimeout": "1s",
        **extra,
    }
    return SourceOptions.parse({k.lower(): v for k, v in raw.items()}, streaming=True)


def _rows(batches: Any) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def test_quota_fin_confirmed_and_replay(cluster: Cluster, topic: str, tmp_path: Path) -> None:
    create_channel(cluster.http(), topic, "c")
    publish(cluster.tcp(), topic, numbered(100))
    options = _options(cluster, topic, tmp_path, maxInFlightPerConnection="7", walSegmentRows="8")
    plan = PartitionPlan("r", 1, 0, cluster.tcp(), 30, topic, "c")
    rows = _rows(read_partition(plan, options))
    assert len(rows) == 30 == len({r["id"] for r in rows})
    # The FINs went out before the task ended; nsqd confirms them (EOF) just after.
    wait_until(
        "the FINs", lambda: channel_stats(cluster.http(), topic, "c")["in_flight_count"] == 0, 10
    )
    assert channel_stats(cluster.http(), topic, "c")["depth"] == 70
    wait_until(
        "FINNED",
        lambda: os.path.exists(os.path.join(WAL(str(tmp_path)).partition_dir("r", 1, 0), "FINNED")),
        10,
    )
    # A replay (task retry, restart) returns the same rows and does not touch nsqd.
    assert _rows(read_partition(plan, options)) == rows
    assert channel_stats(cluster.http(), topic, "c")["depth"] == 70
    # An idle channel ends the task early with what there is.
    more = _rows(read_partition(PartitionPlan("r", 2, 0, cluster.tcp(), 500, topic, "c"), options))
    assert len(more) == 70


def test_redeliveries_of_logged_messages_are_dropped(
    cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """Simulate a task killed after sealing and before FIN, then read the redeliveries."""
    create_channel(cluster.http(), topic, "c")
    publish(cluster.tcp(), topic, numbered(10))
    wal = WAL(str(tmp_path))
    conn = ConsumerConnection(cluster.tcp(), 5.0)
    conn.subscribe(topic, "c", msg_timeout_ms=1000, output_buffer_timeout_ms=25)
    conn.ready(6)
    cols = Columns()
    while len(cols) < 6:
        conn.pump(cols, lambda _: False)
    pdir = wal.partition_dir("r", 1, 0)
    batch = to_record_batch(cols, topic, "c", cluster.tcp())
    assert wal.seal(pdir, [wal.write_segment(pdir, batch)], 6, cluster.tcp())
    conn.close()  # "crash": no FIN; nsqd requeues the six after msg_timeout

    wait_until(
        "the timeout",
        lambda: channel_stats(cluster.http(), topic, "c")["timeout_count"] == 6,
        20,
    )
    options = _options(cluster, topic, tmp_path)
    rows = _rows(read_partition(PartitionPlan("r", 2, 0, cluster.tcp(), 10, topic, "c"), options))
    logged = set(batch.column("body").to_pylist())
    assert sorted(r["body"] for r in rows) == sorted(set(numbered(10)) - logged)
    assert all(r["attempts"] == 1 for r in rows)
    wait_until(
        "the FINs", lambda: channel_stats(cluster.http(), topic, "c")["in_flight_count"] == 0, 10
    )
    assert channel_stats(cluster.http(), topic, "c")["depth"] == 0  # the six were FIN'd, dropped


def test_fin_failures_are_reported(cluster: Cluster, topic: str) -> None:
    create_channel(cluster.http(), topic, "c")
    publish(cluster.tcp(), topic, numbered(3))
    conn = ConsumerConnection(cluster.tcp(), 5.0)
    conn.subscribe(topic, "c", msg_timeout_ms=0, output_buffer_timeout_ms=25)
    conn.ready(3)
    cols = Columns()
    while len(cols) < 3:
        conn.pump(cols, lambda _: False)
    conn.ids.append(b"0123456789abcdef")  # not in flight: E_FIN_FAILED
    assert conn.finish_and_confirm(5.0, lambda _: False)
    assert conn.fin_failed == [b"0123456789abcdef"]
    assert channel_stats(cluster.http(), topic, "c")["in_flight_count"] == 0


def test_mpub_chunks_respect_nsqd_limits(cluster: Cluster) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]

    options = SinkOptions.parse(
        {
            "nsqdtcpaddresses": cluster.tcp(),
            "topic": "t",
            "maxbodysize": "1000",
            "maxmsgsize": "100",
        }
    )
    bodies = [b"x" * (i % 100 + 1) for i in range(500)]
    batch = pa.record_batch([pa.array(bodies, pa.binary())], names=["body"])
    counter = [0]
    commands = list(encode_mpubs("t", iter([batch]), options, counter))
    assert counter == [500]
    for command in commands:
        body = command[len(b"MPUB t\n") :]
        size = int.from_bytes(body[:4], "big")
        assert size == len(body) - 4 <= 1000
    with pytest.raises(ValueError, match="cannot be published"):
        list(
            encode_mpubs(
                "t", iter([pa.record_batch([pa.array([b"y" * 101])], names=["body"])]), options, [0]
            )
        )


def _mpub_bodies(commands: list[bytes], topic: bytes = b"t") -> list[list[bytes]]:
    """The bodies of each MPUB command, checked frame by frame."""
    out = []
    for command in commands:
        head = b"MPUB " + topic + b"\n"
        assert command.startswith(head)
        body = command[len(head) :]
        assert int.from_bytes(body[:4], "big") == len(body) - 4
        count, pos, bodies = int.from_bytes(body[4:8], "big"), 8, []
        for _ in range(count):
            size = int.from_bytes(body[pos : pos + 4], "big")
            bodies.append(body[pos + 4 : pos + 4 + size])
            pos += 4 + size
        assert pos == len(body)
        out.append(bodies)
    return out


def test_mpubs_carry_every_body_in_order_across_batches_and_types() -> None:
    """Commands span Spark's batches (a short tail waits for the next batch), every column
    type and sliced arrays keep their bytes, and no command passes the count or size cap."""
    import pyarrow as pa  # type: ignore[import-untyped]

    options = SinkOptions.parse(
        {"nsqdtcpaddresses": "127.0.0.1:1", "topic": "t", "publishbatchsize": "7"}
    )
    expected: list[bytes] = []
    batches = []
    for n, kind in enumerate([pa.binary(), pa.string(), pa.large_binary(), pa.large_string()]):
        bodies = [f"{n}-{i}-".encode() * (i % 5 + 1) for i in range(12)]
        column = pa.array(
            bodies if kind in (pa.binary(), pa.large_binary()) else [b.decode() for b in bodies],
            kind,
        ).slice(2)
        expected += bodies[2:]
        batches.append(pa.record_batch([column], names=["body"]))
    batches.insert(2, pa.record_batch([pa.array([], pa.binary())], names=["body"]))
    counter = [0]
    commands = _mpub_bodies(list(encode_mpubs("t", iter(batches), options, counter)))
    assert [b for c in commands for b in c] == expected
    assert counter == [len(expected)] == [40]
    assert [len(c) for c in commands] == [7, 7, 7, 7, 7, 5]  # across batch boundaries

    tight = SinkOptions.parse(
        {"nsqdtcpaddresses": "127.0.0.1:1", "topic": "t", "maxbodysize": "30", "maxmsgsize": "10"}
    )
    bodies = [b"a" * 10, b"b", b"c" * 9, b"d" * 10, b"e" * 3]
    commands = _mpub_bodies(
        list(
            encode_mpubs(
                "t", iter([pa.record_batch([pa.array(bodies)], names=["body"])]), tight, [0]
            )
        )
    )
    # 4 + (4 + 10) + (4 + 1) = 23 <= 30; adding (4 + 9) would be 36.
    assert commands == [[b"a" * 10, b"b"], [b"c" * 9], [b"d" * 10, b"e" * 3]]
    with pytest.raises(ValueError, match="a body of 0 bytes cannot be published"):
        list(
            encode_mpubs(
                "t", iter([pa.record_batch([pa.array([b"x", b""])], names=["body"])]), tight, [0]
            )
        )


def test_slow_consumer_keeps_messages_alive(cluster: Cluster, topic: str, tmp_path: Path) -> None:
    """Rows go to Spark before the FIN: while Spark is slow to take them (the generator is
    suspended for longer than msg_timeout), the keepalive thread TOUCHes them."""
    create_channel(cluster.http(), topic, "c")
    publish(cluster.tcp(), topic, numbered(300))
    options = _options(cluster, topic, tmp_path, msgTimeout="1s", walSegmentRows="100")
    rows: list[dict[str, Any]] = []
    for batch in read_partition(PartitionPlan("r", 1, 0, cluster.tcp(), 300, topic, "c"), options):
        rows.extend(batch.to_pylist())
        time.sleep(2.5)
    assert len(rows) == 300 == len({r["id"] for r in rows})
    wait_until(
        "the FINs", lambda: channel_stats(cluster.http(), topic, "c")["in_flight_count"] == 0, 10
    )
    stats = channel_stats(cluster.http(), topic, "c")
    assert (stats["depth"], stats["timeout_count"], stats["requeue_count"]) == (0, 0, 0)


def test_attempt_that_loses_the_seal_fails_and_requeues(
    cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """Another attempt (speculation, a zombie) sealed the partition meanwhile: this attempt
    already handed rows to Spark, so it must fail, and give its messages back."""
    create_channel(cluster.http(), topic, "c")
    publish(cluster.tcp(), topic, numbered(50))
    options = _options(cluster, topic, tmp_path)
    plan = PartitionPlan("r", 1, 0, cluster.tcp(), 50, topic, "c")
    reader = read_partition(plan, options)
    first = next(reader)
    assert first.num_rows == 50
    wal = WAL(str(tmp_path))
    assert wal.seal(wal.partition_dir("r", 1, 0), [], 0, "other")
    with pytest.raises(SealLostError):
        next(reader)
    wait_until(
        "the requeue",
        lambda: channel_stats(cluster.http(), topic, "c")["depth"] == 50,
        10,
    )
    assert channel_stats(cluster.http(), topic, "c")["in_flight_count"] == 0


def test_failed_log_write_fails_the_task_and_seals_nothing(
    cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    """Segments are written on a writer thread while the task reads on: a write that fails (a
    real one: the file size limit, RLIMIT_FSIZE, makes write() fail with EFBIG) fails the task
    before the seal, and nsqd gets every message back."""
    import resource
    import signal

    create_channel(cluster.http(), topic, "c")
    publish(cluster.tcp(), topic, numbered(200, size=2000))
    options = _options(cluster, topic, tmp_path, walSegmentRows="50")  # ~100 KB segments
    plan = PartitionPlan("r", 1, 0, cluster.tcp(), 200, topic, "c")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(
            LogWriteError,
            match=r"^nsq write-ahead log: write .*/r/1/0/\.seg-\w+\.arrow\.tmp: file too large "
            r"\(batch 1 partition 0 of the nsq source is not sealed",
        ):
            for _ in read_partition(plan, options):
                pass
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    pdir = WAL(str(tmp_path)).partition_dir("r", 1, 0)
    assert not os.path.exists(os.path.join(pdir, "SEALED"))
    assert not [name for name in os.listdir(pdir) if name.endswith((".arrow", ".tmp"))]
    wait_until(
        "the messages back", lambda: channel_stats(cluster.http(), topic, "c")["depth"] == 200, 10
    )
    # The next attempt reads them all, once.
    rows = _rows(read_partition(plan, options))
    assert len(rows) == 200 == len({r["body"] for r in rows})
