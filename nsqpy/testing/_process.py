"""A server as a child process, ready when it has logged where it listens.

:class:`ServerProcess` runs an argv, reads its stderr (and stdout) in two daemon
threads and records every line. Readiness is the listener lines every nsqpy server
prints with its real address (spec §11 "Process interface")::

    [nsqd] 2026/11/21 17:00:00.000000 INFO: TCP: listening on 127.0.0.1:46595

The reader threads notify a condition variable for each line, so waiting returns as
soon as the line arrives: no polling, no sleeps. Every live process is recorded and
killed at interpreter exit (:mod:`atexit`), whatever the test that started it did.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

__all__ = ["LISTEN_PATTERNS", "ServerError", "ServerProcess", "flag_args", "parse_flag_args"]

# Listener lines, by listener name. The address is group 1.
LISTEN_PATTERNS: Mapping[str, str] = {
    "tcp": r"\bTCP: listening on (\S+)",
    "http": r"\bHTTP: listening on (\S+)",
    "https": r"\bHTTPS: listening on (\S+)",
}


class ServerError(AssertionError):
    """A server did not start, or did not log what was expected in time."""


def flag_args(flags: Mapping[str, object]) -> list[str]:
    """Go-style arguments for ``flags``, in order; names take ``_`` or ``-``.

    ``{"msg_timeout": "1s", "snappy": False, "lookupd_tcp_address": ["a", "b"]}`` →
    ``["--msg-timeout=1s", "--snappy=false", "--lookupd-tcp-address=a",
    "--lookupd-tcp-address=b"]``. ``None`` values are left out.
    """
    args: list[str] = []
    for key, value in flags.items():
        name = key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            args.append(f"--{name}={'true' if value else 'false'}")
        elif isinstance(value, list | tuple):
            args.extend(f"--{name}={item}" for item in value)
        else:
            args.append(f"--{name}={value}")
    return args


def parse_flag_args(args: Sequence[str]) -> dict[str, object]:
    """The inverse of :func:`flag_args`: ``["--mem-queue-size=0", "--snappy"]`` →
    ``{"mem_queue_size": "0", "snappy": True}``; a repeated flag gives a list.

    Raises :class:`ValueError` for anything but ``--name=value`` or ``--name``.
    """
    flags: dict[str, object] = {}
    for arg in args:
        if not arg.startswith("-") or arg.strip("-") == "":
            raise ValueError(f"not a flag: {arg!r} (expected --name=value or --name)")
        name, eq, value = arg.lstrip("-").partition("=")
        key = name.replace("-", "_")
        parsed: object = value if eq else True
        if key in flags:
            previous = flags[key]
            flags[key] = [*previous, parsed] if isinstance(previous, list) else [previous, parsed]
        else:
            flags[key] = parsed
    return flags


_live: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    """Whatever a test left running (it failed, or was interrupted) dies with us."""
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.kill()


class ServerProcess:
    """One server process and everything it logged.

    ``ready`` names the listeners (keys of ``patterns``) that must have logged their
    address before :meth:`wait_ready` returns. Lines on stderr are the log
    (:attr:`log_lines`), stdout lines are kept apart (:attr:`stdout_lines`).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: Sequence[str] = ("tcp",),
        patterns: Mapping[str, str] = LISTEN_PATTERNS,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        watchdog: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.ready = tuple(ready)
        self.log_lines: list[str] = []
        self.stdout_lines: list[str] = []
        self.addresses: dict[str, str] = {}
        self._patterns = {k: re.compile(v) for k, v in patterns.items()}
        self._cond = threading.Condition()
        self._eof = {"stdout": False, "stderr": False}
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        # With ``watchdog`` the child's stdin is a pipe we never write to: when this
        # process dies, however it dies, the child reads EOF and stops (nsqpy.testing._child).
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE if watchdog else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=cwd,
        )
        _live.add(self)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(
                target=self._reader, args=(stream, which), name=f"{name}-{which}", daemon=True
            )
            for stream, which in ((self.proc.stderr, "stderr"), (self.proc.stdout, "stdout"))
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
        """Both of the child's output streams have reached EOF."""
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
                        f"{self.name} closed stderr before logging /{regex}/:\n{self.log_text()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServerError(
                        f"{self.name} did not log /{regex}/ within {timeout}s:\n{self.log_text()}"
                    )
                self._cond.wait(remaining)

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Wait until every listener of :attr:`ready` has logged its address.

        A server that exits or stays silent is killed and reported with its log.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(name in self.addresses for name in self.ready):
                remaining = deadline - time.monotonic()
                if self._eof["stderr"] or remaining <= 0:
                    break
                self._cond.wait(remaining)
            if all(name in self.addresses for name in self.ready):
                return
        self.kill()
        raise ServerError(
            f"{self.name} not ready (rc={self.proc.poll()}) within {timeout}s: "
            f"{' '.join(self.argv)}\n{self.log_text()}"
        )

    def log_text(self) -> str:
        """Everything logged so far, one line per line."""
        with self._cond:
            return "\n".join(self.log_lines)

    # -- addresses ----------------------------------------------------------------------------

    def address(self, listener: str) -> str:
        """The ``host:port`` that ``listener`` (``tcp``, ``http``, ``https``) logged."""
        try:
            return self.addresses[listener]
        except KeyError:
            raise ServerError(f"{self.name} has not logged a {listener} address") from None

    @property
    def tcp_address(self) -> str:
        """The TCP listener's ``host:port``."""
        return self.address("tcp")

    @property
    def tcp_host_port(self) -> tuple[str, int]:
        """The TCP listener as ``(host, port)``."""
        host, _, port = self.tcp_address.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def http_address(self) -> str | None:
        """The HTTP listener's ``host:port``, if it has one."""
        return self.addresses.get("http")

    @property
    def https_address(self) -> str | None:
        """The HTTPS listener's ``host:port``, if it has one."""
        return self.addresses.get("https")

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status, or ``None`` while it runs."""
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child if it still runs."""
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
        self._finish()
        return rc

    def kill(self) -> int:
        """SIGKILL (a crash: nothing is flushed); returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        rc = self.proc.wait()
        self._finish()
        return rc

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for the child to exit by itself."""
        rc = self.proc.wait(timeout)
        self._finish()
        return rc

    def _finish(self) -> None:
        _live.discard(self)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for t in self._threads:
            t.join(5.0)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{self.name} pid={self.proc.pid} {self.addresses}>"
