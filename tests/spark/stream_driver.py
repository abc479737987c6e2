"""A streaming driver for the kill -9 tests, run as its own process group, and the code that
drives it (:func:`kill_and_drain`).

    python -m tests.spark.stream_driver CONFIG.json

Starts nsq → parquet with the checkpoint and WAL of the config (on its ``master``, with its
``conf``), prints ``STARTED``, and runs until the file ``stop_file`` appears; then processes
what is available, stops, prints ``COUNTS {"rows", "distinct", "bodies"}`` of the output read
back through Spark, and exits 0.
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.spark.conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    from tests.spark.conftest import SPARK_ENV, spark_builder

    os.environ.update(SPARK_ENV)
    from nsqpy.spark import NSQDataSource

    spark = spark_builder(cfg.get("master", "local[2]"), cfg.get("conf")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    reader = spark.readStream.format("nsq")
    for key, value in cfg["source"].items():
        reader = reader.option(key, str(value))
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", cfg["output"])
        .option("checkpointLocation", cfg["checkpoint"])
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    print("STARTED", flush=True)
    while not os.path.exists(cfg["stop_file"]):
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")
        time.sleep(0.1)
    query.processAllAvailable()
    query.stop()
    out = spark.read.parquet(cfg["output"])
    counts = {
        "rows": out.count(),
        "distinct": out.select("id", "nsqd").distinct().count(),
        "bodies": out.select("body").distinct().count(),
    }
    print("COUNTS " + json.dumps(counts), flush=True)
    spark.stop()


# -- the test side ----------------------------------------------------------------------------


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
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


def driver_config(
    cluster: Cluster, topic: str, tmp_path: Path, master: str, per_trigger: int = 1500
) -> dict[str, Any]:
    """The config of a driver reading ``topic`` (channel ``spark``) into parquet."""
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


def kill_and_drain(
    http: str, topic: str, channel: str, tmp_path: Path, config: dict[str, Any], kills: int
) -> tuple[list[tuple[float, int]], dict[str, int]]:
    """Run the driver ``kills`` times, killing its process group (SIGKILL) at a random moment
    once the stream is under way, then once more until the channel is drained and stop it
    cleanly. Returns (delay, depth) of each kill and the output's counts (``COUNTS``)."""
    from tests.spark._helpers import channel_stats, drained

    stop_file = tmp_path / "STOP"
    log = tmp_path / "driver.log"
    path = tmp_path / "driver.json"
    path.write_text(json.dumps({**config, "stop_file": str(stop_file)}))
    rng = random.Random()
    t0 = time.monotonic()
    done = []
    for _ in range(kills):
        proc = _start(path, log)
        try:
            _wait_started(proc, 180)
            print(f"driver started at {time.monotonic() - t0:.1f}s")
            # Wait for the stream to be under way, then kill at a random moment.
            before = channel_stats(http, topic, channel)["depth"]
            deadline = time.monotonic() + 120
            while channel_stats(http, topic, channel)["depth"] >= before:
                assert time.monotonic() < deadline, "no progress:\n" + log.read_text()[-3000:]
                time.sleep(0.1)
            delay = rng.uniform(0.5, 5.0)
            time.sleep(delay)
            done.append((delay, channel_stats(http, topic, channel)["depth"]))
            print(f"driver killed at {time.monotonic() - t0:.1f}s")
        finally:
            _kill_group(proc)

    proc = _start(path, log)
    try:
        _wait_started(proc, 180)
        print(f"driver restarted at {time.monotonic() - t0:.1f}s")
        # Drained means: nothing ready, nothing in flight (the killed tasks' messages come back
        # after msg_timeout) or deferred, seen twice, msg_timeout apart.
        deadline = time.monotonic() + 240
        stable = 0
        while stable < 2:
            assert time.monotonic() < deadline, f"not drained: {done}"
            stable = stable + 1 if drained(http, topic, channel) else 0
            time.sleep(2.5)
        print(f"drained at {time.monotonic() - t0:.1f}s")
        stop_file.touch()
        stdout, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, log.read_text()[-3000:]
        print(f"driver stopped at {time.monotonic() - t0:.1f}s")
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    counts = [line[7:] for line in stdout.decode().splitlines() if line.startswith("COUNTS ")]
    assert counts, log.read_text()[-3000:]
    return done, json.loads(counts[0])


if __name__ == "__main__":
    main()
