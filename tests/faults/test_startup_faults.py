"""A data path nsqd cannot use (issue 28, part 2): read-only, no permission, a file in its
place, files in it nsqd cannot read. Each start-up fault is exactly one ``FATAL:`` line
naming the path and the cause, exit code 1, no traceback, and the data untouched; where
the Go nsqd has the case, our line is Go's (timestamps and random temporary names aside).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.differential.harness import go_binary, require_go
from tests.faults.conftest import Mount, checksums, require_prerequisite, run_nsqd_once

pytestmark = pytest.mark.timeout(120)

PY_NSQD = [sys.executable, "-m", "nsqpy.nsqd"]
NSQD_DAT = (
    b'{"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":false}]}],'
    b'"version":"1.3.0"}'
)
DEFERRED_DAT = b'{"version":1,"due":{"t:c":{"0a1b2c3d4e5f6789":1}}}'


@dataclass
class Case:
    """How to make the data path; ``go`` when the Go nsqd has the same case."""

    name: str
    make: Callable[[Mount, Path], Path]
    user: str | None = None
    go: bool = True
    cause: str = ""


def _with_files(path: Path, deferred: bool) -> None:
    (path / "nsqd.dat").write_bytes(NSQD_DAT)
    if deferred:
        (path / "nsqd.deferred.dat").write_bytes(DEFERRED_DAT)
    (path / "t:c.diskqueue.meta.dat").write_bytes(b"1\n0,0\n0,30\n")
    (path / "t:c.diskqueue.000000.dat").write_bytes(b"\0\0\0\x1a" + b"x" * 26)


def read_only(deferred: bool) -> Callable[[Mount, Path], Path]:
    def make(mounts: Mount, base: Path) -> Path:
        point = mounts.tmpfs("ro", "1m")
        _with_files(point, deferred)
        mounts.remount(point, "ro")
        return point

    return make


def empty_read_only(mounts: Mount, base: Path) -> Path:
    point = mounts.tmpfs("ro", "1m")
    mounts.remount(point, "ro")
    return point


def no_permission(mounts: Mount, base: Path) -> Path:
    path = base / "private"
    path.mkdir(mode=0o700)
    _with_files(path, deferred=False)
    return path


def not_writable(mounts: Mount, base: Path) -> Path:
    path = base / "readable"
    path.mkdir()
    _with_files(path, deferred=True)
    path.chmod(0o755)  # root's: nobody reads it but cannot write in it
    return path


def unreadable(name: str) -> Callable[[Mount, Path], Path]:
    def make(mounts: Mount, base: Path) -> Path:
        path = base / "open"
        path.mkdir()
        _with_files(path, deferred=True)
        (path / name).chmod(0o600)
        path.chmod(0o777)
        return path

    return make


def a_file(mounts: Mount, base: Path) -> Path:
    path = base / "afile"
    path.write_bytes(b"not a directory")
    return path


def missing(mounts: Mount, base: Path) -> Path:
    return base / "missing"


CASES = [
    Case("read-only", read_only(False), cause="read-only file system"),
    Case("read-only-empty", empty_read_only, cause="read-only file system"),
    Case("read-only-deferred", read_only(True), cause="read-only file system"),
    Case("no-permission", no_permission, user="nobody", cause="permission denied"),
    Case("not-writable", not_writable, user="nobody", cause="permission denied"),
    Case("nsqd.dat-unreadable", unreadable("nsqd.dat"), user="nobody", cause="permission denied"),
    Case(
        "deferred-unreadable",
        unreadable("nsqd.deferred.dat"),
        user="nobody",
        go=False,
        cause="permission denied",
    ),
    Case("a-file", a_file, cause="not a directory"),
    Case("missing", missing, cause="no such file or directory"),
]


def fatal_line(output: str) -> str:
    """The one FATAL line, without its timestamp, random temporary names made ``<n>``."""
    lines = [line for line in output.splitlines() if "FATAL:" in line]
    assert len(lines) == 1, f"expected one FATAL line:\n{output}"
    text = lines[0][lines[0].index("FATAL:") :]
    return re.sub(r"\.\d+\.tmp\b", ".<n>.tmp", text)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_unusable_data_path_is_one_fatal_line(
    case: Case, mounts: Mount, open_dir: Path, go_nsqd_path: Path
) -> None:
    if case.user is not None:
        require_prerequisite(os.geteuid() == 0, "dropping privileges with setpriv needs root")
        require_prerequisite(shutil.which("setpriv") is not None, "setpriv (util-linux) missing")
    path = case.make(mounts, open_dir)
    before = checksums(path) if path.is_dir() else {}
    ours = run_nsqd_once(PY_NSQD, path, user=case.user)
    output = ours.stdout + ours.stderr
    assert ours.returncode == 1, output
    assert "Traceback" not in output, output
    line = fatal_line(output)
    assert "FATAL:" in output.rstrip().splitlines()[-1], "lines after the FATAL one"
    assert case.cause in line, line
    assert str(path) in line, line
    if path.is_dir():
        assert checksums(path) == before, "a failed start changed the data path"
    if case.go:
        go = run_nsqd_once([str(go_nsqd_path)], path, user=case.user)
        assert go.returncode == 1, go.stderr
        assert line == fatal_line(go.stdout + go.stderr)
        if path.is_dir():
            assert checksums(path) == before, "the Go nsqd changed the data path"


@pytest.mark.parametrize("listener", ["tcp", "http"])
def test_port_taken_names_the_address_as_go_does(
    listener: str, tmp_path: Path, go_nsqd_path: Path
) -> None:
    """``FATAL: failed to instantiate nsqd - listen (<address>) failed - listen tcp
    <address>: bind: address already in use``, the address asked for (not ``:0``)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        lines = []
        for argv in (PY_NSQD, [str(go_nsqd_path)]):
            result = run_nsqd_once(argv, tmp_path, f"--{listener}-address={address}")
            output = result.stdout + result.stderr
            assert result.returncode == 1, output
            assert "Traceback" not in output, output
            lines.append(fatal_line(output))
    assert lines[0] == lines[1]
    assert lines[0] == (
        f"FATAL: failed to instantiate nsqd - listen ({address}) failed - "
        f"listen tcp {address}: bind: address already in use"
    )


# nsqlookupd's and nsqadmin's listeners: (program, flag) pairs
OTHER_LISTENERS = [
    ("nsqlookupd", "tcp-address"),
    ("nsqlookupd", "http-address"),
    ("nsqadmin", "http-address"),
]


@pytest.mark.parametrize(("program", "flag"), OTHER_LISTENERS)
def test_other_servers_name_a_taken_port_as_go_does(program: str, flag: str) -> None:
    """The same one FATAL line as Go's nsqlookupd (its format has no verb for the error, so
    Go prints it as ``%!(EXTRA ...)``) and nsqadmin, never ``[Errno 98]``."""
    require_go(program)
    go = go_binary(program)
    assert go is not None
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        defaults = {"nsqlookupd": ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]}
        extra = ["--nsqd-http-address=127.0.0.1:1"] if program == "nsqadmin" else []
        lines = []
        for argv in ([sys.executable, "-m", f"nsqpy.{program}"], [str(go)]):
            result = subprocess.run(
                [*argv, *defaults.get(program, []), *extra, f"--{flag}={address}"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            output = result.stdout + result.stderr
            assert result.returncode == 1, output
            assert "Traceback" not in output and "Errno" not in output, output
            lines.append(fatal_line(output))
    assert lines[0] == lines[1]
    assert address in lines[0] and "bind: address already in use" in lines[0]
