"""Spark Connect: a client session (``SparkSession.builder.remote("sc://...")``, in its own
process: tests/spark/connect_client.py) registers NSQDataSource with a Connect server started
from the pyspark package, and runs a source query and a sink query. The data source runs in the
server's Python (this venv's, which has nsqpy)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark._helpers import create_channel, drained, numbered, publish, stats
from tests.spark._standalone import ConnectServer
from tests.spark.conftest import Cluster

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def test_source_and_sink_through_connect(
    connect_server: ConnectServer, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    n, sink_rows = 5000, 3000
    create_channel(cluster.http(), topic, "spark")
    publish(cluster.tcp(), topic, numbered(n))
    sink_topic = f"{topic}_out"
    create_channel(cluster.http(), sink_topic, "check")
    config = tmp_path / "client.json"
    config.write_text(
        json.dumps(
            {
                "remote": connect_server.url,
                "tcp": cluster.tcp(),
                "http": cluster.http(),
                "topic": topic,
                "wal": str(tmp_path / "wal"),
                "output": str(tmp_path / "out"),
                "checkpoint": str(tmp_path / "ckpt"),
                "sink_topic": sink_topic,
                "sink_rows": sink_rows,
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_client", str(config)],
        cwd=ROOT,
        capture_output=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    counted = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert counted == {"rows": n, "distinct": n}
    assert drained(cluster.http(), topic, "spark")
    channel = stats(cluster.http(), sink_topic)["channels"][0]
    assert channel["depth"] == sink_rows
