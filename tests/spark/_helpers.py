"""Helpers for the Spark connector tests: publish, read nsqd's stats, wait for conditions."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nsqpy.spark._conn import Publisher
from nsqpy.wire.v2 import encode_mpub

if TYPE_CHECKING:
    from tests.spark.conftest import Cluster

T = TypeVar("T")


def publish(tcp_address: str, topic: str, bodies: Iterable[bytes], chunk: int = 2000) -> int:
    """MPUB ``bodies`` to one nsqd (pipelined); returns how many were published."""
    items = list(bodies)
    publisher = Publisher(tcp_address, 5.0, 30.0)
    try:
        commands = (encode_mpub(topic, items[i : i + chunk]) for i in range(0, len(items), chunk))
        publisher.publish(commands, 4)
    finally:
        publisher.close()
    return len(items)


def numbered(n: int, prefix: str = "m", size: int = 0) -> list[bytes]:
    """``n`` distinct bodies ``<prefix>-<i>``, padded to ``size`` bytes if given."""
    out = []
    for i in range(n):
        body = f"{prefix}-{i:08d}".encode()
        out.append(body.ljust(size, b".") if size else body)
    return out


def stats(http_address: str, topic: str) -> dict[str, Any]:
    """nsqd's /stats JSON for one topic ({} if the topic does not exist)."""
    url = f"http://{http_address}/stats?format=json&topic={topic}&include_mem=false"
    with urllib.request.urlopen(url, timeout=5) as resp:
        data = json.loads(resp.read())
    for t in data.get("topics") or []:
        if t["topic_name"] == topic:
            return dict(t)
    return {}


def channel_stats(http_address: str, topic: str, channel: str) -> dict[str, Any]:
    for c in stats(http_address, topic).get("channels") or []:
        if c["channel_name"] == channel:
            return dict(c)
    return {}


def create_channel(http_address: str, topic: str, channel: str) -> None:
    for url in (
        f"http://{http_address}/topic/create?topic={topic}",
        f"http://{http_address}/channel/create?topic={topic}&channel={channel}",
    ):
        req = urllib.request.Request(url, method="POST")
        with urllib.request.urlopen(req, timeout=5):
            pass


def wait_until(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def drained(http_address: str, topic: str, channel: str) -> bool:
    c = channel_stats(http_address, topic, channel)
    return bool(c) and c["depth"] == 0 and c["in_flight_count"] == 0 and c["deferred_count"] == 0


def lookup_count(lookupd_http: str, topic: str) -> int:
    """How many nsqd nsqlookupd lists as producers of ``topic`` (0 if it does not answer)."""
    url = f"http://{lookupd_http}/lookup?topic={topic}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return len(json.loads(resp.read()).get("producers") or [])
    except OSError:
        return 0


def nsq_stream(spark: Any, cluster: Cluster, topic: str, wal: Path, **options: object) -> Any:
    """``spark.readStream.format("nsq")`` on the first nsqd of ``cluster``, channel "spark"
    (``topic`` is the option ``topics`` when it has a comma)."""
    reader = (
        spark.readStream.format("nsq")
        .option("nsqdTCPAddresses", cluster.tcp())
        .option("nsqdHTTPAddresses", cluster.http())
        .option("topics" if "," in topic else "topic", topic)
        .option("channel", "spark")
        .option("walLocation", str(wal))
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def to_parquet(df: Any, tmp_path: Path, **trigger: Any) -> Any:
    """Start ``df`` → parquet under ``tmp_path`` (``out``, ``ckpt``) with ``trigger``."""
    return (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(**trigger)
        .start()
    )
