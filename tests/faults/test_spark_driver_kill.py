"""kill -9 of the whole Spark driver (JVM, Python workers and all) at random moments
mid-stream, twice, then restarts from the same checkpoint and walLocation until the topic is
drained: the parquet output, read through Spark, has every message exactly once.

Here, not in tests/spark, so that it runs beside the Spark tests (scripts/test.sh runs
tests/spark and the faults tests as two pytest runs at once); its driver is another process, in
local mode. The same on the standalone cluster, killed once: tests/spark/test_cluster.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spark import conftest as spark_conftest
from tests.spark._helpers import create_channel, numbered, publish
from tests.spark.conftest import Cluster
from tests.spark.stream_driver import driver_config, kill_and_drain

pytestmark = pytest.mark.timeout(420)

cluster = spark_conftest.cluster  # the Spark tests' nsqd and nsqlookupd
topic = spark_conftest.topic


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
