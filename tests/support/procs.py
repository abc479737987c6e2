"""Start nsqpy servers as real processes, described by a :class:`ServerSpec`.

The suite's own layer over :mod:`nsqpy.testing`: a :class:`ServerProcess` is
nsqpy.testing's process (``python -m <module> <args>``, every log line recorded,
readiness from the "listening on" lines, event-driven waits) made from a spec, and
:class:`ServerPool` stops every server a test started. Tests that need no more than an
nsqd with flags can use nsqpy.testing's fixtures directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nsqpy.testing import ServerError
from nsqpy.testing._process import LISTEN_PATTERNS as DEFAULT_LISTEN_PATTERNS
from nsqpy.testing._process import ServerProcess as _ServerProcess
from nsqpy.testing._process import flag_args

__all__ = [
    "DEFAULT_LISTEN_PATTERNS",
    "NSQD",
    "RunResult",
    "ServerError",
    "ServerPool",
    "ServerProcess",
    "ServerSpec",
    "flag_args",
    "run_once",
    "start_server",
]


@dataclass(frozen=True)
class ServerSpec:
    """How to run one kind of server and how to tell it is ready."""

    name: str
    module: str
    default_args: Callable[[Path], list[str]]
    listen_patterns: Mapping[str, str] = field(default_factory=lambda: DEFAULT_LISTEN_PATTERNS)
    # Listeners that must have logged their address before the server counts as started.
    ready: tuple[str, ...] = ("tcp",)


def _nsqd_default_args(data_path: Path) -> list[str]:
    return [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--https-address=",
        f"--data-path={data_path}",
    ]


NSQD = ServerSpec(name="nsqd", module="nsqpy.nsqd", default_args=_nsqd_default_args)


def server_python() -> str:
    """The interpreter that runs the servers: this one, or NSQPY_SERVER_PYTHON's, a venv with
    the built (mypyc-compiled) wheel installed, which scripts/test.sh runs the protocol and
    differential tests against too. ``-P``: the working directory's nsqpy (a checkout) is
    never imported in place of that interpreter's."""
    return os.environ.get("NSQPY_SERVER_PYTHON") or sys.executable


def nsqd_workers(name: str) -> list[str]:
    """``--workers=N`` for an nsqd when NSQPY_NSQD_WORKERS says so (scripts/test.sh runs
    the protocol and differential tests against --workers=2 too); first, so that a test's
    own --workers wins."""
    workers = os.environ.get("NSQPY_NSQD_WORKERS")
    return [f"--workers={workers}"] if workers and name == "nsqd" else []


class ServerProcess(_ServerProcess):
    """One server process; use :func:`start_server` (or the pytest fixtures) to make one."""

    def __init__(
        self,
        spec: ServerSpec,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.spec = spec
        super().__init__(
            spec.name,
            [server_python(), "-P", "-u", "-m", spec.module, *nsqd_workers(spec.name), *args],
            ready=spec.ready,
            patterns=spec.listen_patterns,
            env=env,
            cwd=cwd,
        )


def start_server(
    spec: ServerSpec,
    data_path: Path,
    *args: str,
    options: Mapping[str, object] | None = None,
    defaults: bool = True,
    wait: bool = True,
    timeout: float = 15.0,
    env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """Start ``spec``'s server on ``127.0.0.1`` port 0 with ``data_path``; waits for readiness.

    ``options`` become ``--flag=value`` arguments after the defaults (Go's flag
    package lets the last occurrence win), then the raw ``args``.
    """
    data_path.mkdir(parents=True, exist_ok=True)
    argv = [*(spec.default_args(data_path) if defaults else []), *flag_args(options or {}), *args]
    server = ServerProcess(spec, argv, env=env, cwd=data_path)
    if wait:
        server.wait_ready(timeout)
    return server


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str


def run_once(spec: ServerSpec, args: Iterable[str], timeout: float = 15.0) -> RunResult:
    """Run the server's command to completion (``--version``, bad flags, ...)."""
    proc = subprocess.run(
        [server_python(), "-P", "-m", spec.module, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return RunResult(
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


class ServerPool:
    """Every server a test started, stopped at teardown (see the pytest fixtures)."""

    def __init__(self, spec: ServerSpec, base_path: Path) -> None:
        self.spec = spec
        self.base_path = base_path
        self.servers: list[ServerProcess] = []

    def start(
        self, *args: str, data_path: Path | None = None, wait: bool = True, **options: object
    ) -> ServerProcess:
        path = data_path or self.base_path / f"{self.spec.name}{len(self.servers)}"
        server = start_server(self.spec, path, *args, options=options, wait=wait)
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop(timeout=10.0)

    def __iter__(self) -> Iterator[ServerProcess]:
        return iter(self.servers)
