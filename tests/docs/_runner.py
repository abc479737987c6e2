"""Running one doc's blocks in order, as a user would in a few terminals.

A :class:`DocRun` owns everything its blocks start: a local NSQ on free ports (``run.sh``'s
cluster, started by the doc's own ``./scripts/run.sh`` block or, for a doc without one,
by the test), the background blocks, and any process a block left running (``cmd &``).
Every block runs in its own session (process group); :meth:`DocRun.close` interrupts them
as Ctrl-C would (SIGINT), then SIGTERM and SIGKILL past a deadline, by process group id.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs._blocks import SHELL, Block, Substitutions, console_steps, output_matches

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # not resolved: the venv's python is a symlink
GO_NSQD = REPO.parent / "shared" / "ref" / "nsq-go" / "nsqd"
BLOCK_TIMEOUT = 150.0
READY_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0
DOC_PORTS = (4150, 4151, 4160, 4161, 4171, 4250, 4251, 4260, 4261, 4271)

# Flags that make each benchmark of bench/README.md a tiny run (tests/e2e/test_bench_scripts.py
# has the same sizes); appended to the doc's command line, so they win over its own.
TINY_ARGS = {
    "run_bench.py": ["--runfor", "0.2s", "--workers", "1"],
    "run_shapes.py": [
        "--runfor", "0.2s", "--rounds", "1", "--startup-runs", "1", "--queue-msgs", "1000",
        "--shapes", "200B-pub",
    ],
    "bench_writer.py": ["--runfor", "0.2s", "--workers", "1"],
    "bench_reader.py": ["--runfor", "0.2s", "--workers", "1"],
    "bench_client.py": ["--count", "2000"],
    "bench_spark.py": ["--messages", "2000", "--per-trigger", "1000", "--sink-rounds", "1"],
}  # fmt: skip


class BlockFailed(AssertionError):
    """A doc block did not do what the doc says."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the kernel had free (held together, released together)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


NO_UV = """#!/bin/sh
echo "uv: not on a new user's PATH after the set-up (scripts find or install their own);" \
  "the docs run .venv/bin/python" >&2
exit 127
"""


def block_env(tmp: Path, extra_path: Path | None = None) -> dict[str, str]:
    """The environment of a user's terminal after the README's set-up: no venv on PATH
    (the docs say ``.venv/bin/``) and no ``uv`` (this machine may have one; a fresh one
    does not), Spark's workers on this venv's Python, offline and on loopback."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != VENV_BIN]
    shims = tmp / "shims"
    if not shims.exists():
        shims.mkdir()
        (shims / "uv").write_text(NO_UV)
        (shims / "uv").chmod(0o755)
    path.insert(0, str(shims))
    if extra_path is not None:
        path.insert(0, str(extra_path))
    env["PATH"] = os.pathsep.join(path)
    env.update(
        {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONUNBUFFERED": "1",
            # the README's ./scripts/build.sh: a pure-Python wheel, as compiling nsqd's hot
            # modules (hatch_build.py) takes a minute; tests/e2e/test_wheel.py builds that one
            "NSQPY_PURE_PYTHON": "1",
        }
    )
    return env


@dataclass
class Background:
    block: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class DocRun:
    """One doc's run: its substitutions, its tmp dir and what its blocks started."""

    tmp: Path
    spark_master: str | None = None
    subs: Substitutions = field(init=False)
    groups: list[int] = field(default_factory=list)  # process groups left to stop, in order
    backgrounds: list[Background] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)  # block, seconds (-s shows)
    _count: int = 0

    def __post_init__(self) -> None:
        ports = dict(zip(DOC_PORTS, free_ports(len(DOC_PORTS)), strict=True))
        lookupd_tcp, lookupd_http, admin_http, nsqd_tcp, nsqd_http = (
            f"127.0.0.1:{ports[p]}" for p in (4160, 4161, 4171, 4150, 4151)
        )
        run_sh_args = [
            "--nsqlookupd", f"--tcp-address={lookupd_tcp}", f"--http-address={lookupd_http}",
            "--nsqadmin", f"--http-address={admin_http}",
            "--nsqd", f"--tcp-address={nsqd_tcp}", f"--http-address={nsqd_http}",
            "--https-address=", f"--data-path={self.tmp / 'data'}{{n}}",
        ]  # fmt: skip
        replace = {
            "~/go/bin/nsqd": str(GO_NSQD),
            "/path/to/go/nsqd": str(GO_NSQD),
            "/shared/": f"{self.tmp}/shared/",
            "/path/to/venv/bin/python": sys.executable,
        }
        if self.spark_master:
            replace["spark://host:7077"] = self.spark_master
        self.subs = Substitutions(ports, replace, run_sh_args, TINY_ARGS)

    # -- the blocks ------------------------------------------------------------------------

    def start_cluster(self) -> None:
        """The test's own local NSQ, for a doc that does not start one itself."""
        args = self.subs.run_sh()  # what ./scripts/run.sh would be given
        command = f"{VENV_BIN / 'python'} scripts/local_cluster.py {args}"
        self._background("cluster", self.subs.apply(command), "NSQ is ready", REPO)

    def run(self, block: Block) -> None:
        started = time.monotonic()
        try:
            self._run(block)
        finally:
            self.timings.append((block.where, time.monotonic() - started))

    def _run(self, block: Block) -> None:
        text = self.subs.apply(block.text)
        venv = self._venv() if "venv" in block.directives else None
        if "background" in block.directives:
            command = text if block.lang in SHELL else self._python_command(block, text)
            self._background(block.where, command, block.directives.get("expect", ""), REPO, venv)
        elif block.lang in SHELL:
            self.shell(block.where, text, REPO, venv)
        elif block.lang == "console":
            for step in console_steps(text):
                out = self.shell(block.where, step.command, REPO, venv)
                if not output_matches(step.expected, out):
                    raise BlockFailed(
                        f"{block.where}: `{step.command}` printed\n{out}\nthe doc shows\n"
                        f"{step.expected}"
                    )
        elif block.is_pytest:  # they start their own servers: all in one pytest run, at the end
            self.pytest_dir.mkdir(exist_ok=True)
            (self.pytest_dir / f"test_block_{block.line}.py").write_text(text)
        elif block.lang == "python":
            self.shell(block.where, self._python_command(block, text), self.tmp, venv)

    def run_tests(self) -> None:
        """The doc's test blocks, one pytest run (its output names the failing block's line)."""
        if self.pytest_dir.exists():
            started = time.monotonic()
            python = VENV_BIN / "python"
            command = f"cd {self.pytest_dir} && {python} -m pytest -q -p no:cacheprovider ."
            self.shell("the test blocks (test_block_<line>.py)", command, self.pytest_dir)
            self.timings.append(("test blocks", time.monotonic() - started))

    @property
    def pytest_dir(self) -> Path:
        return self.tmp / "test-blocks"

    def _python_command(self, block: Block, text: str) -> str:
        self._count += 1
        directory = self.tmp / f"block{self._count}"
        directory.mkdir()
        (directory / f"block_{block.line}.py").write_text(text)
        return f"cd {directory} && {VENV_BIN / 'python'} block_{block.line}.py"

    def _venv(self) -> Path:
        venv = self.tmp / "venv"
        if not venv.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        return venv / "bin"

    # -- processes -------------------------------------------------------------------------

    def shell(self, where: str, script: str, cwd: Path, venv: Path | None = None) -> str:
        """Run ``script`` in bash -e in its own session; its stdout, or BlockFailed."""
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=cwd,
            env=block_env(self.tmp, venv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.groups.append(proc.pid)  # what it leaves running (`cmd &`) is stopped at the end
        try:
            out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._stop_group(proc.pid)
            out, err = proc.communicate()
            raise BlockFailed(
                f"{where}: still running after {BLOCK_TIMEOUT}s (a block that runs until "
                f"Ctrl-C needs <!-- doc-test: background -->):\n{script}\n{_tail(out, err)}"
            ) from None
        if proc.returncode != 0:
            raise BlockFailed(
                f"{where}: exit status {proc.returncode}:\n{script}\n{_tail(out, err)}"
            )
        return out.decode("utf-8", "replace")

    def _background(
        self, where: str, script: str, expect: str, cwd: Path, venv: Path | None = None
    ) -> None:
        """Start ``script`` beside the next blocks; wait until its output shows ``expect``."""
        log = self.tmp / f"background{len(self.backgrounds)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-e", "-o", "pipefail", "-c", script],
                cwd=cwd,
                env=block_env(self.tmp, venv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.backgrounds.append(Background(where, proc, log))
        self.groups.append(proc.pid)
        deadline = time.monotonic() + READY_TIMEOUT
        while expect not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise BlockFailed(
                    f"{where}: exited ({proc.returncode}) before printing {expect!r}:\n{script}\n"
                    f"{log.read_text(errors='replace')[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise BlockFailed(f"{where}: no {expect!r} within {READY_TIMEOUT}s:\n{script}")
            time.sleep(0.05)

    def close(self) -> list[str]:
        """Ctrl-C to what is still running, newest first; what did not stop at SIGINT."""
        problems = []
        for pgid in reversed(self.groups):
            if not _group_alive(pgid):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGINT)
            if not _wait_group(pgid, STOP_TIMEOUT):
                problems.append(f"process group {pgid} ignored Ctrl-C for {STOP_TIMEOUT}s")
                self._stop_group(pgid)
        for background in self.backgrounds:
            with contextlib.suppress(subprocess.TimeoutExpired):
                background.proc.wait(5)
        return problems

    def _stop_group(self, pgid: int) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            if _wait_group(pgid, 5):
                return

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group(pgid: int, timeout: float) -> bool:
    """Whether every process of the group is gone within ``timeout`` (zombies reaped by
    their parents, or by us when we are the parent)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-pgid, os.WNOHANG)
        if not _group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


def _tail(out: bytes, err: bytes) -> str:
    text = (out + b"\n" + err).decode("utf-8", "replace")
    return text[-4000:]
