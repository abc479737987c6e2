"""nsqd as a process: version, flags, start-up failures, log lines, signals (spec §1, §7.6, §11)."""

from __future__ import annotations

import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.procs import NSQD, ServerProcess, run_once, start_server
from tests.support.rawclient import RawClient, consumer

pytestmark = pytest.mark.timeout(60)

LOG_LINE = re.compile(r"^\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} [A-Z]+: ")


def test_version() -> None:
    result = run_once(NSQD, ["--version"])
    assert result.returncode == 0
    assert result.stdout == "nsqd v1.3.0 (built w/nsqpy-0.1.0)\n"


def test_version_token_is_harness_friendly() -> None:
    """Harnesses parse ``<name> vX.Y.Z (built w/<token>)``; the token has no spaces or commas."""
    result = run_once(NSQD, ["-version"])  # Go's flag package takes one dash too
    m = re.fullmatch(r"nsqd v(\d+\.\d+\.\d+) \(built w/([a-z0-9.\-]+)\)\n", result.stdout)
    assert m, result.stdout
    assert m.group(1) == "1.3.0"


def test_unknown_flag_exits_1_with_a_message() -> None:
    result = run_once(NSQD, ["--no-such-flag"])
    assert result.returncode == 1
    assert "flag provided but not defined: -no-such-flag" in result.stderr


def test_bad_flag_value_exits_1() -> None:
    result = run_once(NSQD, ["--mem-queue-size=lots"])
    assert result.returncode == 1
    assert "mem-queue-size" in result.stderr


def test_node_id_out_of_range_is_fatal(tmp_path: Path) -> None:
    result = run_once(
        NSQD, ["--node-id=2000", f"--data-path={tmp_path}", "--tcp-address=127.0.0.1:0"]
    )
    assert result.returncode == 1
    fatal = [line for line in result.stderr.splitlines() if "FATAL:" in line]
    assert fatal and "--node-id must be [0,1024)" in fatal[0], result.stderr
    assert LOG_LINE.match(fatal[0]), fatal[0]


def test_tcp_port_in_use_is_fatal(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_once(
            NSQD,
            [
                f"--tcp-address=127.0.0.1:{port}",
                "--http-address=127.0.0.1:0",
                f"--data-path={tmp_path}",
            ],
        )
    assert result.returncode == 1
    assert re.search(rf"FATAL: .*listen \(127\.0\.0\.1:{port}\) failed", result.stderr), (
        result.stderr
    )


def test_listening_line_format(nsqd: ServerProcess) -> None:
    line = next(line for line in nsqd.log_lines if "TCP: listening on" in line)
    assert re.fullmatch(
        r"\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} INFO: TCP: listening on 127\.0\.0\.1:\d+",
        line,
    ), line
    host, port = nsqd.tcp_host_port
    assert host == "127.0.0.1" and port > 0
    with RawClient(nsqd.tcp_address) as client:
        client.assert_open()


def test_log_prefix(nsqd_factory: Callable[..., ServerProcess]) -> None:
    nsqd = nsqd_factory(log_prefix="[custom] ")
    assert any(
        line.startswith("[custom] ") and "TCP: listening on" in line for line in nsqd.log_lines
    )


def test_verbose_and_worker_id_are_accepted(nsqd_factory: Callable[..., ServerProcess]) -> None:
    """Deprecated flags that wrappers (pynsq's tests) still pass."""
    nsqd = nsqd_factory("--verbose", "--worker-id")
    with RawClient(nsqd.tcp_address) as client:
        client.assert_open()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_exit_on_signal(nsqd: ServerProcess, sig: int) -> None:
    nsqd.wait_for_log(r"HTTP: listening on")  # fully started (see the next test for why)
    producer = RawClient(nsqd.tcp_address)
    producer.pub("graceful", b"x")
    sub = consumer(nsqd.tcp_address, "graceful", "ch")
    rc = nsqd.stop(sig, timeout=10)
    assert rc == 0, nsqd.log_text()
    assert any(
        re.search(r"INFO: TCP: closing 127\.0\.0\.1:\d+", line) for line in nsqd.log_lines
    ), nsqd.log_text()
    assert not any("Traceback" in line for line in nsqd.log_lines), nsqd.log_text()
    sub.assert_closed()  # clients are disconnected, not left hanging
    producer.close()


def test_sigterm_right_after_the_listening_line(tmp_path: Path) -> None:
    """The listening line is what harnesses wait for: a SIGTERM sent as soon as it appears
    must still get the graceful exit (exit code 0), not the default signal death."""
    codes = []
    for i in range(5):
        server = start_server(NSQD, tmp_path / f"n{i}")
        codes.append(server.stop(signal.SIGTERM, timeout=10))
    assert codes == [0] * 5, f"exit codes {codes} (-15 = killed by SIGTERM before its handler)"


def test_harness_kills_a_server_that_does_not_exit(nsqd: ServerProcess) -> None:
    """The harness itself: a server that ignores the stop signal is killed after the timeout."""
    nsqd.send_signal(signal.SIGSTOP)
    rc = nsqd.stop(signal.SIGSTOP, timeout=0.5)  # a stopped process ignores a second SIGSTOP
    assert rc == -signal.SIGKILL
