"""Fixtures for the Spark connector tests: one local Spark session for the whole run (start-up
takes about 10 s), configured to work offline, and real nsqd/nsqlookupd processes.

The session is ``local[2,4]``: two cores, and a failed task is retried up to 4 times, which the
fault-injection tests need (a plain ``local[2]`` never retries).
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.support.procs import NSQD, ServerPool, ServerProcess, ServerSpec


def _lookupd_args(_: Path) -> list[str]:
    return [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ]


LOOKUPD = ServerSpec(
    name="nsqlookupd", module="nsqpy.nsqlookupd", default_args=_lookupd_args, ready=("tcp", "http")
)

# What the Python workers need to run offline and find the connector (pyspark-notes §1).
SPARK_ENV = {
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "SPARK_LOCAL_IP": "127.0.0.1",
    "NSQPY_SPARK_TEST_HOOKS": "1",
    "PYARROW_IGNORE_TIMEZONE": "1",
}

_names = itertools.count(1)


def spark_builder(master: str = "local[2,4]") -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName("nsqpy-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.pollingDelay", "50ms")
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs Java 17 (java on PATH or JAVA_HOME)")
    os.environ.update(SPARK_ENV)
    from nsqpy.spark import NSQDataSource

    session = spark_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NSQDataSource)
    yield session
    session.stop()


@dataclass
class Cluster:
    """nsqlookupd and two nsqd registered with it (on 127.0.0.1, free ports)."""

    lookupd: ServerProcess
    nsqds: list[ServerProcess]

    @property
    def lookupd_http(self) -> str:
        return self.lookupd.address("http")

    def tcp(self, i: int = 0) -> str:
        return self.nsqds[i].tcp_address

    def http(self, i: int = 0) -> str:
        address = self.nsqds[i].http_address
        assert address is not None
        return address


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("nsq")
    lookupds = ServerPool(LOOKUPD, base / "lookupd")
    nsqds = ServerPool(NSQD, base / "nsqd")
    try:
        lookupd = lookupds.start()
        servers = []
        for _ in range(2):
            server = nsqds.start(
                lookupd_tcp_address=lookupd.tcp_address, broadcast_address="127.0.0.1"
            )
            server.wait_for_log(r"HTTP: listening on", timeout=15)
            servers.append(server)
        yield Cluster(lookupd, servers)
    finally:
        nsqds.stop_all()
        lookupds.stop_all()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name)[:40]
    return f"{base}_{next(_names)}"
