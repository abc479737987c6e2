"""Fixtures of the fault harness (docs/RELIABILITY.md): small filesystems the test mounts
itself, the Go nsqd to compare with, and a raw TCP/HTTP view of an nsqd.

Mounting needs root (CI runs as root). Without it a test is skipped with the reason,
except in CI (``CI=true``), where a missing prerequisite is a failure. Every mount is
undone at teardown, after the processes that use it have been stopped.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.differential.harness import GoNSQD, PyNSQD, go_binary, require_go

__all__ = [
    "GoNSQD",
    "Mount",
    "PyNSQD",
    "checksums",
    "fill_up",
    "http",
    "require_go",
    "require_prerequisite",
    "run_nsqd_once",
    "wait_until",
]


def require_prerequisite(ok: bool, reason: str) -> None:
    """Skip without ``ok`` (the reason says what is missing); in CI fail instead."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"missing in CI, where every test must run: {reason}", pytrace=False)
    pytest.skip(reason)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


class Mount:
    """Filesystems mounted for one test, unmounted (lazily if still busy) at its end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.points: list[Path] = []
        self._stops: list[Callable[[], object]] = []

    def tmpfs(self, name: str, size: str, *, mode: str = "0755") -> Path:
        """A fresh tmpfs of ``size`` (``3m``) at ``<tmp>/<name>``."""
        require_prerequisite(os.geteuid() == 0, "mounting a tmpfs needs root")
        point = self.base / name
        point.mkdir(parents=True, exist_ok=True)
        result = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(point))
        require_prerequisite(result.returncode == 0, f"cannot mount a tmpfs: {result.stderr}")
        self.points.append(point)
        return point

    def remount(self, point: Path, option: str) -> None:
        """``mount -o remount,<option>`` (``ro``/``rw``); raises if it fails."""
        result = _run("mount", "-o", f"remount,{option}", str(point))
        assert result.returncode == 0, f"remount,{option} {point}: {result.stderr}"

    def on_teardown(self, stop: Callable[[], object]) -> None:
        """Run ``stop`` (stop a process using a mount) before anything is unmounted."""
        self._stops.append(stop)

    def close(self) -> None:
        for stop in reversed(self._stops):
            with contextlib.suppress(Exception):
                stop()
        for point in reversed(self.points):
            if _run("umount", str(point)).returncode != 0:
                _run("umount", "-l", str(point))
        self.points.clear()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory in /tmp that every user can reach (pytest's tmp_path is 0700), for the
    tests that run nsqd as ``nobody``."""
    path = Path(tempfile.mkdtemp(prefix="nsqpy-faults-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mounts(open_dir: Path) -> Iterator[Mount]:
    m = Mount(open_dir)
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def go_nsqd_path() -> Path:
    """The Go nsqd binary (``../shared/ref/nsq-go/nsqd``), required."""
    require_go("nsqd")
    path = go_binary("nsqd")
    assert path is not None
    return path


def checksums(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: mode and sha256, to show that a failed start touched nothing."""
    out: dict[str, tuple[int, str]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = (
                path.stat().st_mode,
                hashlib.sha256(path.read_bytes()).hexdigest(),
            )
    return out


def run_nsqd_once(
    argv: list[str],
    data_path: Path,
    *flags: str,
    user: str | None = None,
    timeout: float = 20.0,
) -> subprocess.CompletedProcess[str]:
    """Run an nsqd that is expected to refuse to start: its exit code and output.

    ``flags`` come after the defaults (the last occurrence wins); ``user`` drops
    privileges with ``setpriv`` (``nobody``) for the no-permission cases.
    """
    prefix: list[str] = []
    if user is not None:
        prefix = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups"]
    args = [
        *prefix,
        *argv,
        f"--data-path={data_path}",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--https-address=",
        *flags,
    ]
    return subprocess.run(
        args,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One HTTP request: status and body (an error status is an answer, not an exception)."""
    data = body if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def fill_up(directory: Path) -> Path:
    """Write a file in ``directory`` until its filesystem is full; delete it to free the space."""
    path = directory / "filler"
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
        try:  # the last few bytes
            while f.write(b"\0" * 512):
                pass
        except OSError:
            pass
    return path


def wait_until(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Poll ``check`` until it is true, or fail saying ``what`` did not happen."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.02)
