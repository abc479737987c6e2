"""kill -9 of the whole driver (JVM, Python workers and all) at random moments mid-stream,
then restarts from the same checkpoint and walLocation until the topic is drained: the parquet
output, read through Spark, has every message exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark._helpers import create_channel, numbered, publish
from tests.spark.conftest import Cluster
from tests.spark.stream_driver import kill_and_drain

pytestmark = pytest.mark.timeout(420)


def driver_config(
    cluster: Cluster, topic: str, tmp_path: Path, master: str, per_trigger: int = 1500
) -> dict[str, Any]:
    return {
        "master": master,
        "source": {
            "nsqdTCPAddresses": cluster.tcp(),
            "nsqdHTTPAddresses": cluster.http(),
            "topic": topic,
            "channel": "spark",
            "walLocation": str(tmp_path / "wal"),
            "maxMessagesPerTrigger": per_trigger,
            "msgTimeout": "2s",
        },
        "output": str(tmp_path / "out"),
        "checkpoint": str(tmp_path / "ckpt"),
    }


def test_kill_driver_twice_then_drain(cluster: Cluster, topic: str, tmp_path: Path) -> None:
    n = 20_000
    create_channel(cluster.http(), topic, "spark")
    publish(cluster.tcp(), topic, numbered(n))
    config = driver_config(cluster, topic, tmp_path, "local[2]")
    kills, counts = kill_and_drain(cluster.http(), topic, "spark", tmp_path, config, kills=2)
    assert any((tmp_path / "wal").iterdir())
    print(f"kills (delay s, depth at kill): {kills}")
    # Read back through Spark by the last driver (honouring _spark_metadata).
    assert counts == {"rows": n, "distinct": n, "bodies": n}, kills
