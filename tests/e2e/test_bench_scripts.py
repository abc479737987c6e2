"""Every script in bench/ runs at a tiny size, so that none rots.

Each script runs as a subprocess from the repository root, the way its docstring says to run
it, with flags that make it small (``--runfor 0.2s``, ``--count``, ``--rounds 1``...). A run
must exit 0 and print the figure lines the script is for: the tests parse them, they do not
just look for output. Scripts that measure another nsqd (``--nsqd-bin``), and the Python
ports of NSQ's bench tools, also run against the Go nsqd and with NSQ's Go
``bench_writer``/``bench_reader``, from ``<repo>/../shared/ref/nsq-go``: without them such a
test is skipped, and in CI (``CI=true``) it fails.

Every process a script starts must be gone when it returns: each run's environment carries a
marker, and a process still carrying it afterwards is killed and fails the test.
:func:`test_every_bench_script_has_a_tiny_run` enumerates bench/, so that a new script cannot
be added without a tiny run here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nsqpy.testing._process import ServerProcess as _ServerProcess

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
GO_DIR = REPO.parent / "shared" / "ref" / "nsq-go"
GO_BINARIES = ("nsqd", "bench_writer", "bench_reader")
# The venv's bin directory first on PATH: the scripts' default nsqd is `nsqd` on PATH (ours,
# as under `uv run`) and bench_http.sh runs `python3`. Not resolved: the venv's python is a
# symlink to the base interpreter.
VENV_BIN = os.path.dirname(sys.executable)
MARKER = "NSQPY_BENCH_SCRIPT_RUN"
_runs = itertools.count(1)

# script name -> the nsqds it runs against here ("ours", "go"), filled by @covers
COVERED: dict[str, set[str]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def covers(script: str, *targets: str) -> Callable[[F], F]:
    """Register the decorated test as ``script``'s tiny run against ``targets``."""

    def register(fn: F) -> F:
        COVERED.setdefault(script, set()).update(targets)
        return fn

    return register


# -- running a script ---------------------------------------------------------------------------


@dataclass
class Run:
    argv: list[str]
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def matches(self, pattern: str, text: str | None = None) -> list[re.Match[str]]:
        """Every line of ``text`` (default: stdout and stderr) that ``pattern`` matches
        (``re.search``)."""
        regex = re.compile(pattern)
        lines = (self.output if text is None else text).splitlines()
        return [m for m in (regex.search(line) for line in lines) if m]

    def one(self, pattern: str, text: str | None = None) -> re.Match[str]:
        found = self.matches(pattern, text)
        assert len(found) == 1, f"want one line /{pattern}/, got {len(found)}\n{self.tail()}"
        return found[0]

    def tail(self, n: int = 60) -> str:
        lines = self.output.splitlines()[-n:]
        return f"$ {' '.join(self.argv)}\n" + "\n".join(lines)


def marked_processes(marker: str) -> list[int]:
    """The live processes whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            pids.append(int(entry))
    return pids


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def reap_leftovers(marker: str, grace: float) -> list[str]:
    """Wait up to ``grace`` s for the processes of run ``marker`` to end; kill the rest and
    return their command lines."""
    deadline = time.monotonic() + grace
    while (pids := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [f"{pid}: {cmdline(pid)}" for pid in pids]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def run(argv: list[str], *, timeout: float = 90.0, leftover_grace: float = 10.0) -> Run:
    """Run ``argv`` from the repository root in its own session; it must exit 0 within
    ``timeout`` s and leave no process behind.

    Its output goes to files, not pipes: a process it leaves behind holding them must not
    make this wait."""
    marker = f"{os.getpid()}-{next(_runs)}"
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        MARKER: marker,
    }
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM first: run_bench.py and run_shapes.py stop their nsqd (its own session)
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            if proc.returncode is None:  # interrupted
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                reap_leftovers(marker, 0)
        left = reap_leftovers(marker, 0 if timed_out else leftover_grace)
        out.seek(0)
        err.seek(0)
        result = Run(argv, out.read().decode(errors="replace"), err.read().decode(errors="replace"))
    if timed_out:
        pytest.fail(f"did not finish within {timeout:.0f}s\n{result.tail()}")
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{result.tail()}"
    assert not left, "processes left running (killed now):\n" + "\n".join(left)
    return result


def python_script(script: str, *args: str, **kw: Any) -> Run:
    return run([sys.executable, str(BENCH / script), *args], **kw)


def number(text: str) -> float:
    """``1,234.5`` -> 1234.5"""
    return float(text.replace(",", ""))


# -- what the runs need -------------------------------------------------------------------------


def need(reason: str) -> None:
    """Skip for ``reason``; in CI, where every test must run, fail."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (in CI every bench script must run in every mode)")
    pytest.skip(reason)


@pytest.fixture
def go_dir() -> Path:
    """The directory of NSQ's Go nsqd, bench_writer and bench_reader."""
    missing = [name for name in GO_BINARIES if not os.access(GO_DIR / name, os.X_OK)]
    if missing:
        need(f"no Go {', '.join(missing)} in {GO_DIR}")
    return GO_DIR


@pytest.fixture
def go_nsqd(go_dir: Path, tmp_path: Path) -> Iterator[_ServerProcess]:
    """A Go nsqd on 127.0.0.1, ports 0, stopped afterwards."""
    data = tmp_path / "go-nsqd"
    data.mkdir()
    server = _ServerProcess(
        "go-nsqd",
        [
            str(go_dir / "nsqd"),
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=",
            f"--data-path={data}",
        ],
        ready=("tcp", "http"),
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def http_post(address: str, path: str) -> None:
    req = urllib.request.Request(f"http://{address}{path}", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def topic_message_count(address: str, topic: str) -> int:
    with urllib.request.urlopen(
        f"http://{address}/stats?format=json&topic={topic}", timeout=10
    ) as resp:
        stats = json.loads(resp.read())
    stats = stats.get("data", stats)  # Go's nsqd before 1.1 wrapped it
    return sum(int(t["message_count"]) for t in stats["topics"] if t["topic_name"] == topic)


# -- the inventory ------------------------------------------------------------------------------


def bench_scripts() -> list[str]:
    """The scripts of bench/: every file but the docs and the ``_``-prefixed helpers."""
    return sorted(
        p.name
        for p in BENCH.iterdir()
        if p.is_file() and p.suffix != ".md" and not p.name.startswith("_")
    )


def test_every_bench_script_has_a_tiny_run() -> None:
    scripts = bench_scripts()
    assert "run_bench.py" in scripts and "bench_writer.py" in scripts, scripts
    missing = [s for s in scripts if "ours" not in COVERED.get(s, set())]
    assert not missing, f"bench scripts without a tiny run in {Path(__file__).name}: {missing}"
    stale = sorted(set(COVERED) - set(scripts))
    assert not stale, f"tiny runs of scripts that are not in bench/: {stale}"
    # a script that can measure another nsqd also runs against the Go one
    can_compare = [s for s in scripts if "--nsqd-bin" in (BENCH / s).read_text()]
    missing_go = [s for s in can_compare if "go" not in COVERED[s]]
    assert not missing_go, f"bench scripts with --nsqd-bin but no run against Go: {missing_go}"
    # the helpers are used by a script, which runs them
    sources = "".join((BENCH / s).read_text() for s in scripts)
    for helper in sorted(p for p in BENCH.glob("_*") if p.is_file()):
        assert helper.stem in sources, f"bench/{helper.name} is used by no script"


# -- the engine and the disk queue alone --------------------------------------------------------


@covers("bench_policy_engine.py", "ours")
@pytest.mark.parametrize(
    "policies", [[], ["--max-attempts=5", "--message-ttl=3600", "--max-queue-depth=100000000"]]
)
def test_policy_engine(policies: list[str]) -> None:
    result = python_script("bench_policy_engine.py", "--rounds", "1", "--batches", "10", *policies)
    m = result.one(r"^(\d+) ns/msg engine cpu \(best of 1\)$", result.stdout)
    assert int(m.group(1)) > 0


@covers("bench_diskqueue.py", "ours")
@pytest.mark.parametrize(
    "sync", [[], ["--sync", "inline", "--sync-every", "100", "--max-bytes-per-file", "65536"]]
)
def test_diskqueue(sync: list[str], tmp_path: Path) -> None:
    result = python_script(
        "bench_diskqueue.py", "--count", "2000", "--batch", "100", "--dir", str(tmp_path), *sync
    )
    found = {
        m.group(1): m
        for m in result.matches(
            r"^(put|put_many|read|read_many|pass)\s+([\d,]+) x 200 B\s+([\d.]+) s\s+([\d,]+) ops/s"
            r"\s+([\d.]+) MB/s",
            result.stdout,
        )
    }
    assert sorted(found) == sorted(["put", "put_many", "read", "read_many", "pass"]), result.tail()
    for m in found.values():
        assert number(m.group(2)) == 2000, result.tail()  # every record put is read back
        assert number(m.group(4)) > 0
    assert not list(tmp_path.iterdir()), "the queue's temp dir was not removed"


# -- the client ---------------------------------------------------------------------------------


def check_client(result: Run) -> None:
    result.one(r"^nsqd 127\.0\.0\.1:\d+, 200-byte messages", result.stdout)
    modes = {
        m.group(1): int(m.group(2))
        for m in result.matches(
            r"^(pub|mpub|sub-batch|sub-sync|sub-async|sub-blocking)\s+(\d+) msgs\s+[\d.]+s"
            r"\s+\d+ msgs/s\s+[\d.]+ MB/s\s+client CPU\s+[\d.]+ us/msg$",
            result.stdout,
        )
    }
    # each SUB mode reads its own channel holding everything both PUB modes published
    assert modes == {
        "pub": 2000,
        "mpub": 2000,
        "sub-batch": 4000,
        "sub-sync": 4000,
        "sub-async": 4000,
        "sub-blocking": 4000,
    }, result.tail()


CLIENT_ARGS = ["--count", "2000", "--concurrency", "20", "--batch-size", "100"]


@covers("bench_client.py", "ours")
def test_client() -> None:
    check_client(python_script("bench_client.py", *CLIENT_ARGS))


@covers("bench_client.py", "go")
def test_client_go_nsqd(go_dir: Path) -> None:
    check_client(python_script("bench_client.py", *CLIENT_ARGS, "--nsqd-bin", str(go_dir / "nsqd")))


# -- TLS, snappy, deflate -----------------------------------------------------------------------


def check_features(result: Run, modes: list[str]) -> None:
    result.one(r"^nsqd pid \d+ listening on 127\.0\.0\.1:\d+$", result.stdout)
    summary = result.stdout.partition("==== features summary ====")[2]
    assert summary, result.tail()
    rows = {
        m.group(1): m
        for m in result.matches(
            r"^(\S+)\s+([\d,]+)\s+([\d.]+|nan)\s+([\d,]+)\s+([\d.]+|nan)$", summary
        )
    }
    assert sorted(rows) == sorted(modes), result.tail()
    for mode, m in rows.items():  # msgs/s; the server's us/msg may round to 0 CPU ticks
        assert number(m.group(2)) > 0 and number(m.group(4)) > 0, f"{mode}\n{result.tail()}"
    for mode in modes:  # the per-phase lines
        for phase in ("PUB", "SUB"):
            result.one(
                rf"^{re.escape(mode)}\s+{phase}:\s+[\d,]+ msgs/s\s+server\s+[\d.]+ us/msg",
                result.stdout,
            )


FEATURES_ARGS = ["--runfor", "0.2s", "--lead", "0.3s", "--workers", "1", "--batch-size", "20"]


FEATURES_MODES = ["plain", "tls", "snappy", "deflate", "tls+snappy", "tls+deflate"]


@covers("bench_features.py", "ours")
def test_features() -> None:
    check_features(python_script("bench_features.py", *FEATURES_ARGS), FEATURES_MODES)


@covers("bench_features.py", "go")
def test_features_go_nsqd(go_dir: Path) -> None:
    result = python_script("bench_features.py", *FEATURES_ARGS, f"--nsqd-bin={go_dir / 'nsqd'}")
    check_features(result, FEATURES_MODES)


# -- HTTP publishing ----------------------------------------------------------------------------


def check_http(result: Run, tool: str) -> None:
    sections = re.split(r"^== ", result.stdout, flags=re.M)[1:]
    assert [s.partition(":")[0] for s in sections] == ["PUB", "MPUB text", "MPUB binary"], (
        result.tail()
    )
    for section, per_request in zip(sections, (1, 10, 10), strict=True):
        assert section.split(":", 1)[1].split()[0] == tool, result.tail()
        m = result.one(
            r"^   ([\d,]+) req/s, ([\d,]+) msgs/s \((\w+)\); nsqd counted ([\d,]+) msgs = "
            r"([\d,]+) msgs/s; nsqd CPU ([\d.]+)s = ([\d.]+) us/msg; non-2xx: (\d+)$",
            section,
        )
        assert number(m.group(1)) > 0 and m.group(3) == tool, result.tail()
        counted = number(m.group(4))
        assert counted > 0 and counted % per_request == 0, result.tail()
        assert m.group(8) == "0", result.tail()
        requests = number(result.one(r"^\s+(\d+) requests in [\d.]+m?s", section).group(1))
        assert requests * per_request <= counted, result.tail()


def bench_http(*args: str) -> Run:
    bash = shutil.which("bash")
    assert bash is not None
    return run(
        [
            bash,
            str(BENCH / "bench_http.sh"),
            "--duration",
            "1s",
            "--connections",
            "4",
            "--batch",
            "10",
            *args,
        ]
    )


@covers("bench_http.sh", "ours")
def test_http() -> None:
    # the Python load generator, so that it is always run (wrk is the default when installed)
    result = bench_http("--nsqd-bin", f"{sys.executable} -m nsqpy.nsqd", "--load-tool", "python")
    check_http(result, "python")


@covers("bench_http.sh", "go")
def test_http_go_nsqd(go_dir: Path) -> None:
    result = bench_http("--nsqd-bin", str(go_dir / "nsqd"))
    check_http(result, "wrk" if shutil.which("wrk") else "python")


# -- the Python ports of NSQ's bench_writer and bench_reader, against an nsqd -------------------


GO_LINE = (
    r"^\[{tool}\] \d{{4}}/\d\d/\d\d \d\d:\d\d:\d\d duration: \S+ - ([\d.]+)mb/s"
    r" - ([\d.]+)ops/s - ([\d.]+)us/op$"
)


def check_tool(result: Run, tool: str) -> dict[str, Any]:
    """The tool's Go-format line on stderr and its JSON line on stdout; the JSON."""
    m = result.one(GO_LINE.format(tool=tool), result.stderr)
    stats: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["tool"] == tool and stats["ops"] > 0, result.tail()
    assert float(m.group(2)) > 0
    return stats


@pytest.fixture(params=["ours", "go"])
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(TCP address, HTTP address) of a fresh nsqd: ours, or Go's."""
    server = request.getfixturevalue("go_nsqd" if request.param == "go" else "nsqd")
    http = server.wait_for_log(r"\bHTTP: listening on (\S+)").group(1)
    return server.tcp_address, http


@covers("bench_writer.py", "ours", "go")
@covers("bench_reader.py", "ours", "go")
def test_writer_and_reader(target: tuple[str, str]) -> None:
    tcp, http = target
    topic = "bench_tiny"
    http_post(http, f"/topic/create?topic={topic}")
    http_post(http, f"/channel/create?topic={topic}&channel=ch")
    common = ["--nsqd-tcp-address", tcp, "--topic", topic, "--workers", "1"]
    published = 0
    for mode in (
        ["--batch-size", "20"],  # Go's tool: MPUB
        ["--mode", "pub", "--rate", "500"],
        ["--mode", "http", "--nsqd-http-address", http],
    ):
        writer = python_script("bench_writer.py", *common, "--runfor", "0.2s", *mode)
        stats = check_tool(writer, "bench_writer")
        published += stats["ops"]
    assert topic_message_count(http, topic) == published
    reader = python_script("bench_reader.py", *common, "--runfor", "0.5s", "--channel", "ch")
    stats = check_tool(reader, "bench_reader")
    assert 0 < stats["ops"] <= published, reader.tail()
    assert stats["recv_chunks"] > 0


# -- the runners --------------------------------------------------------------------------------


def check_run_bench(result: Run, built_with: str) -> None:
    result.one(rf"^nsqd version: nsqd v\S+ \(built w/{built_with}", result.stdout)
    result.one(GO_LINE.format(tool="bench_writer").replace("^", "^PUB: "), result.stdout)
    result.one(GO_LINE.format(tool="bench_reader").replace("^", "^SUB: "), result.stdout)
    for phase in ("PUB", "SUB"):
        result.one(rf"^{phase} server cpu: [\d.]+us/msg \(cpu", result.stdout)
        m = result.one(
            rf"^{phase}:\s+([\d,]+) msgs/s\s+([\d.]+) MB/s\s+([\d,]+) msgs in ([\d.]+)s"
            r"\s+server ([\d.]+) us/msg \(\d+% cpu\)\s+client ([\d.]+) us/msg",
            result.stdout,
        )
        assert number(m.group(1)) > 0 and number(m.group(3)) > 0, result.tail()
    assert "status:    FAILED" not in result.stdout


@covers("run_bench.py", "ours")
def test_run_bench() -> None:
    result = python_script("run_bench.py", "--runfor", "0.2s", "--workers", "1")
    check_run_bench(result, "nsqpy")


@covers("run_bench.py", "go")
def test_run_bench_go_nsqd(go_dir: Path) -> None:
    result = python_script(
        "run_bench.py", "--runfor", "0.2s", "--workers", "1", "--nsqd-bin", str(go_dir / "nsqd")
    )
    check_run_bench(result, "go")


SHAPE_ROW = (
    r"^(\S+)\s+(nsqpy|#\d+ \S+)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)\s+(\d+)%\s+(\d+)MB"
    r"(?:\s+([\d.]+) / ([\d.]+))?$"
)


def check_shapes(result: Run, shapes: list[str], labels: list[str]) -> None:
    table = result.stdout.partition("\nshape ")[2]
    rows = {(m.group(1), m.group(2)): m for m in result.matches(SHAPE_ROW, table)}
    assert sorted(rows) == sorted((s, label) for s in shapes for label in labels), result.tail()
    for (shape, label), m in rows.items():  # pub and sub msgs/s
        assert number(m.group(3)) > 0 and number(m.group(4)) > 0, f"{shape} {label}"
        assert (m.group(8) is not None) == (label != "nsqpy"), f"{shape} {label}: ratio column"
    for label in labels:
        result.one(
            rf"^start-up {re.escape(label)}\s+median [\d.]+s \(min [\d.]+s, max [\d.]+s, 1 runs\),"
            r" cpu [\d.]+s",
            result.stdout,
        )
        result.one(
            rf"^memory   {re.escape(label)}\s+-?\d+ B of RSS per queued 200-byte message"
            r" \(1,000 queued in one channel\)$",
            result.stdout,
        )


SHAPES_ARGS = ["--runfor", "0.2s", "--startup-runs", "1", "--queue-msgs", "1000"]


@covers("run_shapes.py", "ours")
def test_run_shapes() -> None:
    # the disk queue, a paced PUB, HTTP and big bodies; 200B-b200 runs beside Go below
    shapes = ["200B-b200-mq0", "200B-pub-at-1k", "200B-http-pub", "1MB-b4"]
    result = python_script("run_shapes.py", *SHAPES_ARGS, f"--shapes={','.join(shapes)}")
    check_shapes(result, shapes, ["nsqpy"])


@covers("run_shapes.py", "go")
def test_run_shapes_beside_go(go_dir: Path) -> None:
    # NSQ's Go bench_writer/bench_reader for the MPUB shape, the Python ports for HTTP
    shapes = ["200B-b200", "200B-http-pub"]
    result = python_script(
        "run_shapes.py",
        *SHAPES_ARGS,
        f"--shapes={','.join(shapes)}",
        f"--nsqd-bin={go_dir / 'nsqd'}",
        f"--go-tools={go_dir}",
    )
    result.one(r"^#1 nsqd: \S+ \(nsqd v\S+ \(built w/go", result.stdout)
    result.one(r"^tools: NSQ's Go bench_writer/bench_reader in ", result.stdout)
    check_shapes(result, shapes, ["nsqpy", "#1 nsqd"])


@covers("profile_shape.py", "ours")
def test_profile_shape() -> None:
    result = python_script("profile_shape.py", "--runfor", "0.2s", "--shape", "200B-pub")
    m = result.one(
        r"^200B-pub: pub ([\d,]+) / sub ([\d,]+) msgs/s; server ([\d.]+) us/msg"
        r" \(user [\d.]+, system [\d.]+\); context switches per msg [\d.]+ voluntary,"
        r" [\d.]+ involuntary$",
        result.stdout,
    )
    assert number(m.group(1)) > 0 and number(m.group(3)) > 0, result.tail()


# -- the Spark connector ------------------------------------------------------------------------


def need_spark() -> None:
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            need(f"{module} is not installed")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        need("Spark needs Java 17 (java on PATH or JAVA_HOME)")


@covers("bench_pub_path.py", "ours")
def test_pub_path() -> None:
    """The Python part of a PUB in process: every message delivered (the script checks),
    a figure per round."""
    result = python_script("bench_pub_path.py", "--cycles", "640", "--rounds", "2")
    m = result.one(
        r"^3\.\d+\.\d+ (compiled|pure): median (\d+) ns/cycle, best (\d+) \((\d+), (\d+)\)$",
        result.stdout,
    )
    assert 0 < int(m.group(3)) <= int(m.group(2))


@covers("bench_read_task.py", "ours")
def test_read_task() -> None:
    need_spark()  # pyarrow
    result = python_script("bench_read_task.py", "--messages", "2000", "--quota", "1000")
    m = result.one(
        r"^read ([\d,]+) x 100 B in tasks of 1,000: ([\d,]+) msgs/s; "
        r"cpu us/msg: task ([\d.]+), nsqd ([\d.]+) \[OK\]$",
        result.stdout,
    )
    assert number(m.group(1)) == 2000 and number(m.group(2)) > 0


@covers("bench_spark.py", "ours")
@pytest.mark.timeout(300)
def test_spark() -> None:
    need_spark()
    # two micro-batches per run: the steady rate is the second's
    result = python_script(
        "bench_spark.py",
        "--messages",
        "2000",
        "--per-trigger",
        "1000",
        "--sink-rounds",
        "1",
        timeout=240,
        leftover_grace=20,
    )
    out = result.stdout
    assert "MISMATCH" not in out, result.tail()
    result.one(r"^spark \S+ local\[2\] started in [\d.]+s$", out)
    runs = {
        m.group(1): number(m.group(2))
        for m in result.matches(
            r"^(\S+)(?: \(not counted\))? -> parquet: steady ([\d,]+) rows/s \([\d,]+ rows in \d+ "
            r"batches after the first\); 2,000 in [\d.]+s wall incl\. start-up \[OK\]$",
            out,
        )
    }
    warm_ups = ["warm-up", "warm-up-nsq-schema"]
    counted = ["noop", "nsq", "nsq-multi", "noop-nsq-schema", "nsq-id-body", "noop-again"]
    assert sorted(runs) == sorted(warm_ups + counted), result.tail()
    assert all(rate > 0 for rate in runs.values()), runs
    m = result.one(
        r"^RESULT source: nsq ([\d,]+) rows/s, no-op ([\d,]+) rows/s \(mean of [\d,]+, [\d,]+\), "
        r"ratio ([\d.]+)$",
        out,
    )
    assert float(m.group(3)) > 0
    result.one(r"^RESULT source, same schema: no-op with the nsq columns [\d,]+ rows/s, ratio", out)
    result.one(r"^RESULT source, schema id and body: nsq [\d,]+ rows/s, ratio [\d.]+$", out)
    result.one(r"^warm-up \(not counted\) -> sink \(batch, streaming\) \[OK\]$", out)
    result.one(r"^dataframe -> nsq \(batch\): [\d,]+ msgs/s \[OK\]$", out)
    result.one(r"^no-op source -> nsq \(streaming\): steady [\d,]+ msgs/s \[OK\]$", out)
    for kind in ("batch", "streaming"):
        m = result.one(
            rf"^RESULT sink \({kind}\): nsq ([\d,]+) msgs/s; no-op sink ([\d,]+) msgs/s$", out
        )
        assert number(m.group(1)) > 0 and number(m.group(2)) > 0


# bench/soak.py's run (one minute: it is about growth) is tests/faults/test_soak.py.
COVERED["soak.py"] = {"ours"}


@covers("bench_workers.py", "ours", "go")
def test_bench_workers(go_dir: Path) -> None:
    result = python_script(
        "bench_workers.py",
        f"--go-tools={go_dir}",
        f"--nsqd-bin={go_dir / 'nsqd'}",
        "--workers=1,2",
        "--topics=2",
        "--rounds=1",
        "--runfor=0.3s",
    )
    medians = re.findall(
        r"^(nsqpy --workers=\d|nsqd \(Go\))\s+2\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)"
        r"  \(median\)$",
        result.stdout,
        re.MULTILINE,
    )
    assert [m[0] for m in medians] == ["nsqpy --workers=1", "nsqpy --workers=2", "nsqd (Go)"]
    for _, pub, sub, _, _ in medians:
        assert number(pub) > 0 and number(sub) > 0, result.tail()
