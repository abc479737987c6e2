"""Run a local NSQ: nsqlookupd, nsqd registered with it, and nsqadmin, on NSQ's default ports.

    nsqlookupd  TCP 4160, HTTP 4161
    nsqd        TCP 4150, HTTP 4151      data in ./data/nsqd
    nsqadmin    HTTP 4171                http://127.0.0.1:4171/

Ctrl-C (or SIGTERM) stops all three gracefully, nsqd last so it flushes to disk.
Extra arguments are passed to nsqd.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(module: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT)


def main() -> int:
    data = os.path.join(ROOT, "data", "nsqd")
    os.makedirs(data, exist_ok=True)
    procs = [
        start("nsqpy.nsqlookupd", "--broadcast-address=127.0.0.1"),
        start(
            "nsqpy.nsqd",
            f"--data-path={data}",
            "--lookupd-tcp-address=127.0.0.1:4160",
            "--broadcast-address=127.0.0.1",
            *sys.argv[1:],
        ),
        start("nsqpy.nsqadmin", "--lookupd-http-address=127.0.0.1:4161"),
    ]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        # nsqadmin, then nsqd (it unregisters and flushes), then nsqlookupd
        for proc in reversed(procs[1:]):
            _stop(proc)
        _stop(procs[0])
    failed = [p.args for p in procs if p.returncode not in (0, -signal.SIGTERM)]
    return 1 if failed and not stopping else 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
