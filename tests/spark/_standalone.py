"""A Spark standalone cluster (one master, two one-core workers) and a Spark Connect server,
started from the pyspark package itself: ``SPARK_HOME`` is the ``pyspark`` directory, which
ships ``bin/spark-class``, the jars and ``sbin/start-connect-server.sh``. Nothing is downloaded.

Every JVM runs in its own process group (``start_new_session``), on 127.0.0.1 and free ports,
with its logs and work directories under the given base directory. A worker starts its
executors (``CoarseGrainedExecutorBackend``) as its children, in its process group, and
executors fork their Python workers: killing a worker's group stops all of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.spark._helpers import wait_until


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env(base: Path) -> dict[str, str]:
    """The environment of every Spark process here: offline, loopback only, this venv's Python
    (executors run the driver's ``PYSPARK_PYTHON``, which imports the editable nsqpy)."""
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": spark_home(),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(base / "logs"),
            "SPARK_PID_DIR": str(base / "pids"),
            "SPARK_CONF_DIR": str(base / "conf"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYARROW_IGNORE_TIMEZONE": "1",
        }
    )
    (base / "conf").mkdir(parents=True, exist_ok=True)
    return env


@dataclass
class JVM:
    """One ``spark-class`` process, leader of its own process group."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL whatever is left of it (executors included)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        # Executors and their Python workers may outlive the worker JVM: same group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def start_class(name: str, args: list[str], env: Mapping[str, str], base: Path) -> JVM:
    log = base / "logs" / f"{name}.out"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [os.path.join(spark_home(), "bin", "spark-class"), *args],
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=base,
        start_new_session=True,
    )
    return JVM(name, proc, log)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class StandaloneCluster:
    base: Path
    master_port: int = 0
    webui_port: int = 0
    master: JVM | None = None
    workers: list[JVM] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def state(self) -> dict[str, Any]:
        data = get_json(f"http://127.0.0.1:{self.webui_port}/json/")
        assert isinstance(data, dict)
        return data

    def start(self, workers: int = 2, timeout: float = 120.0) -> None:
        env = spark_env(self.base)
        self.master_port, self.webui_port = free_port(), free_port()
        self.master = start_class(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(self.master_port),
                "--webui-port", str(self.webui_port),
            ],
            env,
            self.base,
        )  # fmt: skip
        for i in range(workers):
            work = self.base / f"worker{i}"
            work.mkdir(parents=True, exist_ok=True)
            self.workers.append(
                start_class(
                    f"worker{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--cores", "1",
                        "--memory", "1g",
                        "--host", "127.0.0.1",
                        "--port", str(free_port()),
                        "--webui-port", str(free_port()),
                        "--work-dir", str(work),
                        self.url,
                    ],
                    {**env, "SPARK_WORKER_DIR": str(work)},
                    self.base,
                )
            )  # fmt: skip
        wait_until(f"{workers} ALIVE workers", lambda: self.alive_workers() >= workers, timeout)

    def alive_workers(self) -> int:
        for jvm in [self.master, *self.workers]:
            if jvm is not None and jvm.proc.poll() is not None:
                raise AssertionError(f"{jvm.name} exited:\n{jvm.log.read_text()[-3000:]}")
        try:
            state = self.state()
        except (OSError, ValueError):  # not listening yet, or answering before it is ready
            return 0
        if state.get("url") != self.url:  # not our master (a port taken meanwhile)
            return 0
        return sum(1 for w in state.get("workers") or [] if w.get("state") == "ALIVE")

    def executor_pids(self) -> list[int]:
        """The executor JVMs: children of the worker processes (found by parent), those that
        run ``CoarseGrainedExecutorBackend`` (a worker can have other, short-lived children,
        and zombies until it reaps them)."""
        pids: list[int] = []
        for worker in self.workers:
            pids.extend(p for p in _children(worker.proc.pid) if _is_executor(p))
        return pids

    def stop(self) -> None:
        for jvm in [*self.workers, self.master]:
            if jvm is not None:
                jvm.stop()


def _is_executor(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"CoarseGrainedExecutorBackend" in cmdline


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out.extend(int(p) for p in (task / "children").read_text().split())
    return out


@dataclass
class ConnectServer:
    """``sbin/start-connect-server.sh``'s class, run in the foreground through spark-submit."""

    base: Path
    port: int = 0
    jvm: JVM | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, master: str, timeout: float = 120.0) -> None:
        env = spark_env(self.base)
        self.port = free_port()
        log = self.base / "logs" / "connect.out"
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [
                os.path.join(spark_home(), "bin", "spark-submit"),
                "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--name", "nsqpy-connect",
                "--master", master,
                "--conf", f"spark.connect.grpc.binding.port={self.port}",
                "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf", "spark.ui.enabled=false",
                "--conf", "spark.driver.host=127.0.0.1",
                "--conf", "spark.driver.bindAddress=127.0.0.1",
                "--conf", "spark.sql.shuffle.partitions=2",
                "--conf", "spark.sql.session.timeZone=UTC",
                "--conf", "spark.executorEnv.NSQPY_SPARK_TEST_HOOKS=1",
                "spark-internal",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.base,
            start_new_session=True,
        )  # fmt: skip
        self.jvm = JVM("connect", proc, log)

        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"connect server exited:\n{log.read_text()[-3000:]}")
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_until("the Spark Connect server to listen", listening, timeout, 0.5)

    def stop(self) -> None:
        if self.jvm is not None:
            self.jvm.stop()


def wait_gone(pid: int, timeout: float) -> None:
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie child of a live worker counts as gone too.
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        return True

    wait_until(f"process {pid} to exit", gone, timeout, 0.1)
