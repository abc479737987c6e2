"""Fixtures for the Spark connector tests: one local Spark session for the whole run (start-up
takes about 10 s), configured to work offline, real nsqd/nsqlookupd processes, and one Spark
standalone cluster shared by the cluster tests (tests/spark/_standalone.py).

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

from tests.spark._helpers import wait_until
from tests.spark._standalone import ConnectServer, StandaloneCluster
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


# Executors of the standalone cluster: one core each, within the workers' 1g.
CLUSTER_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "900m",
    "spark.executorEnv.NSQPY_SPARK_TEST_HOOKS": "1",
    "spark.executorEnv.PYARROW_IGNORE_TIMEZONE": "1",
}


def spark_builder(master: str = "local[2,4]", conf: dict[str, str] | None = None) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("nsqpy-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.pollingDelay", "50ms")
    )
    if master.startswith("spark://"):
        conf = {**CLUSTER_CONF, **(conf or {})}
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder


def _need_java() -> None:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs Java 17 (java on PATH or JAVA_HOME)")


# One SparkContext per JVM: the tests' session is on one master at a time (local[2,4], or the
# standalone cluster for tests/spark/test_cluster.py); switching stops the other one.
_current: list[tuple[str, Any]] = []


def use_session(master: str | None) -> Any:
    """The session on ``master`` (created if needed); None: no session (stops the current)."""
    if _current and _current[0][0] == master:
        return _current[0][1]
    if _current:
        _current.pop()[1].stop()
    if master is None:
        return None
    _need_java()
    os.environ.update(SPARK_ENV)
    from nsqpy.spark import NSQDataSource

    session = spark_builder(master).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NSQDataSource)
    _current.append((master, session))
    return session


@pytest.fixture(scope="session")
def _spark_sessions() -> Iterator[None]:
    yield
    use_session(None)


@pytest.fixture
def spark(_spark_sessions: None) -> Any:
    """A local[2,4] session (shared by the whole run)."""
    return use_session("local[2,4]")


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One Spark standalone cluster (a master, two 1-core workers) for every cluster test."""
    _need_java()
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        cluster.start()
        yield cluster
    finally:
        use_session(None)  # the executors of a session on it go first
        cluster.stop()


@pytest.fixture
def cluster_spark(_spark_sessions: None, standalone: StandaloneCluster) -> Any:
    """A session on the standalone cluster: two executors (separate JVMs, own Python workers),
    both registered (on a busy machine an executor JVM takes a while to start)."""
    session = use_session(standalone.url)
    status = session.sparkContext._jsc.sc().getExecutorMemoryStatus
    wait_until("two executors to register", lambda: status().size() >= 3, 180, 0.5)  # + driver
    return session


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server (local[2]) whose Python is this venv's (it has nsqpy)."""
    _need_java()
    server = ConnectServer(tmp_path_factory.mktemp("spark-connect"))
    try:
        server.start("local[2]")
        yield server
    finally:
        server.stop()


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
