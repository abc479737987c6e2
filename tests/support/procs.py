"""Start nsqpy servers (nsqd today; nsqlookupd and nsqadmin later) as real processes.

A :class:`ServerProcess` runs ``python -m <module> <args>``, reads its stderr (and
stdout) in background threads and records every line. Readiness is signalled by the
log lines the servers print (spec §11 "Process interface")::

    [nsqd] 2026/11/21 17:00:00.000000 INFO: TCP: listening on 127.0.0.1:46595

Waiting is event-driven: the reader threads notify a condition variable for each
line, so :meth:`ServerProcess.wait_for_log` returns as soon as the line arrives.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# Listener lines, by listener name. The address is group 1.
DEFAULT_LISTEN_PATTERNS: Mapping[str, str] = {
    "tcp": r"\bTCP: listening on (\S+)",
    "http": r"\bHTTP: listening on (\S+)",
    "https": r"\bHTTPS: listening on (\S+)",
}


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


class ServerError(AssertionError):
    """The server did not start, or did not log what was expected in time."""


def flag_args(options: Mapping[str, object]) -> list[str]:
    """``{"msg_timeout": "1s", "snappy": False}`` → ``["--msg-timeout=1s", "--snappy=false"]``."""
    args: list[str] = []
    for key, value in options.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            args.append(f"--{name}={'true' if value else 'false'}")
        elif isinstance(value, list | tuple):
            args.extend(f"--{name}={item}" for item in value)
        else:
            args.append(f"--{name}={value}")
    return args


class ServerProcess:
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
        self.argv = [sys.executable, "-u", "-m", spec.module, *args]
        self.log_lines: list[str] = []
        self.stdout_lines: list[str] = []
        self.addresses: dict[str, str] = {}
        self._patterns = {k: re.compile(v) for k, v in spec.listen_patterns.items()}
        self._cond = threading.Condition()
        self._eof = {"stdout": False, "stderr": False}
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=cwd,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(
                target=self._reader,
                args=(self.proc.stderr, "stderr"),
                name=f"{spec.name}-stderr",
                daemon=True,
            ),
            threading.Thread(
                target=self._reader,
                args=(self.proc.stdout, "stdout"),
                name=f"{spec.name}-stdout",
                daemon=True,
            ),
        ]
        for t in self._threads:
            t.start()

    # -- output -------------------------------------------------------------------------------

    def _reader(self, stream: IO[bytes], which: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            with self._cond:
                if which == "stderr":
                    self.log_lines.append(line)
                    for name, pattern in self._patterns.items():
                        if name not in self.addresses:
                            m = pattern.search(line)
                            if m:
                                self.addresses[name] = m.group(1)
                else:
                    self.stdout_lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof[which] = True
            self._cond.notify_all()
        stream.close()

    @property
    def output_closed(self) -> bool:
        with self._cond:
            return all(self._eof.values())

    def mark(self) -> int:
        """The number of log lines so far: pass it as ``since`` to wait for later lines."""
        with self._cond:
            return len(self.log_lines)

    def wait_for_log(self, regex: str, timeout: float = 10.0, *, since: int = 0) -> re.Match[str]:
        """The first log line (from index ``since``) matching ``regex``; waits for it."""
        pattern = re.compile(regex)
        deadline = time.monotonic() + timeout
        pos = since
        with self._cond:
            while True:
                while pos < len(self.log_lines):
                    m = pattern.search(self.log_lines[pos])
                    if m:
                        return m
                    pos += 1
                if self._eof["stderr"]:
                    raise ServerError(
                        f"{self.spec.name} closed stderr before logging /{regex}/:\n{self.log_text()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServerError(
                        f"{self.spec.name} did not log /{regex}/ within {timeout}s:\n{self.log_text()}"
                    )
                self._cond.wait(remaining)

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Wait until every listener of ``spec.ready`` has logged its address."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(name in self.addresses for name in self.spec.ready):
                if self._eof["stderr"]:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if all(name in self.addresses for name in self.spec.ready):
                return
        self.kill()
        raise ServerError(
            f"{self.spec.name} not ready (rc={self.proc.poll()}) within {timeout}s: "
            f"{' '.join(self.argv)}\n{self.log_text()}"
        )

    def log_text(self) -> str:
        with self._cond:
            return "\n".join(self.log_lines)

    # -- addresses ----------------------------------------------------------------------------

    def address(self, listener: str) -> str:
        try:
            return self.addresses[listener]
        except KeyError:
            raise ServerError(f"{self.spec.name} has not logged a {listener} address") from None

    @property
    def tcp_address(self) -> str:
        return self.address("tcp")

    @property
    def tcp_host_port(self) -> tuple[str, int]:
        host, _, port = self.tcp_address.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def http_address(self) -> str | None:
        return self.addresses.get("http")

    @property
    def https_address(self) -> str | None:
        return self.addresses.get("https")

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig``, wait up to ``timeout`` s for the exit, then kill. Returns the exit code."""
        self.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._join_readers()
        return rc

    def kill(self) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        rc = self.proc.wait()
        self._join_readers()
        return rc

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._join_readers()
        return rc

    def _join_readers(self) -> None:
        for t in self._threads:
            t.join(5.0)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{self.spec.name} pid={self.proc.pid} {self.addresses}>"


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
        [sys.executable, "-m", spec.module, *args],
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
