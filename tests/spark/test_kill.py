"""kill -9 of the whole driver (JVM, Python workers and all) at random moments mid-stream,
then restarts from the same checkpoint and walLocation until the topic is drained: the parquet
output, read through Spark, has every message exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark._helpers import channel_stats, create_channel, drained, numbered, publish
from tests.spark.conftest import Cluster

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parents[2]


def _start_driver(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.stream_driver", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log.open("ab"),
        start_new_session=True,  # its own process group: the JVM and workers die with it
    )


def _wait_started(proc: subprocess.Popen[bytes], timeout: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"driver exited early (rc={proc.wait()})")
        if line.strip() == b"STARTED":
            return
    raise AssertionError("driver did not start")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def test_kill_driver_twice_then_drain(
    spark: Any, cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    n = 20_000
    create_channel(cluster.http(), topic, "spark")
    publish(cluster.tcp(), topic, numbered(n))
    config = tmp_path / "driver.json"
    stop_file = tmp_path / "STOP"
    log = tmp_path / "driver.log"
    config.write_text(
        json.dumps(
            {
                "master": "local[2]",
                "source": {
                    "nsqdTCPAddresses": cluster.tcp(),
                    "nsqdHTTPAddresses": cluster.http(),
                    "topic": topic,
                    "channel": "spark",
                    "walLocation": str(tmp_path / "wal"),
                    "maxMessagesPerTrigger": 1500,
                    "msgTimeout": "2s",
                },
                "output": str(tmp_path / "out"),
                "checkpoint": str(tmp_path / "ckpt"),
                "stop_file": str(stop_file),
            }
        )
    )
    rng = random.Random()
    wal = tmp_path / "wal"
    kills = []
    for _ in range(2):
        proc = _start_driver(config, log)
        try:
            _wait_started(proc, 180)
            # Wait for the stream to be under way, then kill at a random moment.
            before = channel_stats(cluster.http(), topic, "spark")["depth"]
            deadline = time.monotonic() + 120
            while channel_stats(cluster.http(), topic, "spark")["depth"] >= before:
                assert time.monotonic() < deadline, "no progress"
                time.sleep(0.1)
            delay = rng.uniform(0.5, 5.0)
            time.sleep(delay)
            kills.append((delay, channel_stats(cluster.http(), topic, "spark")["depth"]))
        finally:
            _kill_group(proc)
    assert any(wal.iterdir())

    proc = _start_driver(config, log)
    try:
        _wait_started(proc, 180)
        # Drained means: nothing ready, nothing in flight (the killed tasks' messages come back
        # after msg_timeout) or deferred, seen twice, msg_timeout apart.
        deadline = time.monotonic() + 240
        stable = 0
        while stable < 2:
            assert time.monotonic() < deadline, f"not drained: {kills}"
            stable = stable + 1 if drained(cluster.http(), topic, "spark") else 0
            time.sleep(2.5)
        stop_file.touch()
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            _kill_group(proc)

    print(f"kills (delay s, depth at kill): {kills}")
    df = spark.read.parquet(str(tmp_path / "out"))
    rows = df.count()
    distinct = df.select("id").distinct().count()
    bodies = df.select("body").distinct().count()
    assert (rows, distinct, bodies) == (n, n, n), kills
