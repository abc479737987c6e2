"""NSQ's command-line tools (nsqpy.tools) end to end against real nsqd / nsqlookupd."""

from __future__ import annotations

import gzip
import json
import re
import signal
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nsqpy.client import BlockingConsumer, BlockingProducer
from tests.support.procs import NSQD, ServerPool, ServerProcess, ServerSpec

pytestmark = pytest.mark.timeout(60)

TOOLS = ["nsq_tail", "to_nsq", "nsq_to_file", "nsq_to_http", "nsq_to_nsq", "nsq_stat"]

LOOKUPD = ServerSpec(
    name="nsqlookupd",
    module="nsqpy.nsqlookupd",
    default_args=lambda _: [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ],
    ready=("tcp", "http"),
)


def tool_spec(name: str) -> ServerSpec:
    return ServerSpec(name=name, module=f"nsqpy.tools.{name}", default_args=lambda _: [], ready=())


def run_tool(
    name: str, *args: str, stdin: bytes = b"", timeout: float = 30
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", f"nsqpy.tools.{name}", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


class Cluster:
    def __init__(self, lookupd: ServerProcess, nsqds: list[ServerProcess]) -> None:
        self.lookupd = lookupd
        self.nsqds = nsqds

    @property
    def lookupd_http(self) -> str:
        return self.lookupd.address("http")

    def nsqd_http(self, i: int) -> str:
        self.nsqds[i].wait_for_log(r"HTTP: listening on")
        address = self.nsqds[i].http_address
        assert address is not None
        return address


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("tools-cluster")
    lookupds = ServerPool(LOOKUPD, base)
    nsqds = ServerPool(NSQD, base)
    try:
        lookupd = lookupds.start()
        servers = [
            nsqds.start(lookupd_tcp_address=lookupd.tcp_address, broadcast_address="127.0.0.1")
            for _ in range(2)
        ]
        yield Cluster(lookupd, servers)
    finally:
        nsqds.stop_all()
        lookupds.stop_all()


@pytest.fixture
def tools() -> Iterator[Callable[..., ServerProcess]]:
    """``tools("nsq_to_file", *args)`` starts a tool; every one is stopped at teardown."""
    started: list[ServerProcess] = []

    def start(name: str, *args: str) -> ServerProcess:
        proc = ServerProcess(tool_spec(name), list(args))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop(timeout=10)


def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    with BlockingProducer(address) as producer:
        producer.mpub(topic, bodies)


def consume(address: str, topic: str, n: int, channel: str = "check") -> list[bytes]:
    got: list[bytes] = []
    with BlockingConsumer(topic, channel, nsqd_tcp_addresses=[address], max_in_flight=100) as c:
        while len(got) < n:
            batch = c.get_batch(timeout=10)
            assert batch, f"only {len(got)} of {n} messages"
            got.extend(m.body for m in batch)
            c.finish(batch)
    return got


def create_channel(address: str, topic: str, channel: str) -> None:
    """Subscribe once so that the channel exists before anything is published."""
    with BlockingConsumer(topic, channel, nsqd_tcp_addresses=[address], max_in_flight=0) as c:
        c.start(timeout=10)


# -- flags ---------------------------------------------------------------------------------


def test_version_and_source_flags() -> None:
    for name in TOOLS:
        result = run_tool(name, "--version")
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode() == f"{name} v1.3.0 (built w/nsqpy-0.1.0)\n"
    both = run_tool(
        "nsq_tail", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--lookupd-http-address=x:1"
    )
    assert both.returncode == 1
    assert b"use --nsqd-tcp-address or --lookupd-http-address not both" in both.stderr
    none = run_tool("nsq_to_http", "--topic=t", "--post=http://127.0.0.1:1/")
    assert none.returncode == 1
    assert b"--nsqd-tcp-address or --lookupd-http-address required" in none.stderr
    bad = run_tool("nsq_tail", "--nope")
    assert bad.returncode == 1 and b"flag provided but not defined: -nope" in bad.stderr
    stat = run_tool("nsq_stat", "--topic=t", "--channel=c")
    assert b"--nsqd-http-address or --lookupd-http-address required" in stat.stderr


# -- nsq_tail, to_nsq ----------------------------------------------------------------------


def test_to_nsq_publishes_stdin_to_every_nsqd(cluster: Cluster) -> None:
    a, b = (s.tcp_address for s in cluster.nsqds)
    for address in (a, b):
        create_channel(address, "to_nsq_t", "check")
    result = run_tool(
        "to_nsq",
        "--topic=to_nsq_t",
        f"--nsqd-tcp-address={a}",
        f"--nsqd-tcp-address={b}",
        "--delimiter=,",
        "--producer-opt=snappy,true",
        stdin=b"one,two,,three",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b""
    for address in (a, b):
        assert sorted(consume(address, "to_nsq_t", 3)) == [b"one", b"three", b"two"]
    rated = run_tool(
        "to_nsq", "--topic=to_nsq_t", f"--nsqd-tcp-address={a}", "--rate=50", stdin=b"x\ny\nz\n"
    )
    assert rated.returncode == 0
    assert b"Throttling messages rate to max:50/second" in rated.stderr
    assert sorted(consume(a, "to_nsq_t", 3)) == [b"x", b"y", b"z"]
    bad = run_tool("to_nsq", "--topic=t", f"--nsqd-tcp-address={a}", "--delimiter=ab")
    assert bad.returncode == 1 and b"--delimiter must be a single byte" in bad.stderr


def test_nsq_tail_counts_n_per_topic(cluster: Cluster) -> None:
    address = cluster.nsqds[0].tcp_address
    publish(address, "tail_a", [b"a1", b"a2", b"a3", b"a4"])
    publish(address, "tail_b", [b"b1"])
    result = run_tool(
        "nsq_tail",
        "--topic=tail_a",
        "--topic=tail_b",
        "--channel=tail",
        f"--nsqd-tcp-address={address}",
        "-n",
        "3",
        "--print-topic",
    )
    assert result.returncode == 0, result.stderr
    # standard output holds the messages and nothing else (pipe it into jq, a file...)
    lines = result.stdout.decode().splitlines()
    a_lines = [line for line in lines if line.startswith("tail_a | ")]
    assert a_lines == ["tail_a | a1", "tail_a | a2", "tail_a | a3"]
    assert set(lines) - set(a_lines) <= {"tail_b | b1"}
    # Go logs the consumers it adds: standard error, with the log prefix
    logged = re.findall(
        rb"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d Adding consumer for topic: (\w+)$",
        result.stderr,
        re.MULTILINE,
    )
    assert logged == [b"tail_a", b"tail_b"]


def test_nsq_tail_with_lookupd(cluster: Cluster) -> None:
    publish(cluster.nsqds[0].tcp_address, "tail_lk", [b"x"])
    publish(cluster.nsqds[1].tcp_address, "tail_lk", [b"y"])
    result = run_tool(
        "nsq_tail",
        "--topic=tail_lk",
        f"--lookupd-http-address={cluster.lookupd_http}",
        "-n",
        "2",
    )
    assert result.returncode == 0, result.stderr
    # the ephemeral tail channel only exists once nsq_tail subscribed: both get there
    assert sorted(result.stdout.splitlines()) == [b"x", b"y"]
    assert b"Adding consumer for topic: tail_lk\n" in result.stderr
    assert b"connecting to nsqd" in result.stderr


# -- nsq_to_file ---------------------------------------------------------------------------


def test_nsq_to_file_gzip_rotation_work_dir_and_hup(
    cluster: Cluster, tools: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    address = cluster.nsqds[0].tcp_address
    out, work = tmp_path / "out", tmp_path / "work"
    proc = tools(
        "nsq_to_file",
        "--topic=file_t",
        f"--nsqd-tcp-address={address}",
        f"--output-dir={out}",
        f"--work-dir={work}",
        "--gzip",
        "--rotate-size=100",
        "--sync-interval=100ms",
        "--filename-format=<TOPIC><REV>.log",
    )
    proc.wait_for_log(r"connecting to nsqd")
    publish(address, "file_t", [b"%03d-%s" % (n, b"x" * 40) for n in range(10)])
    proc.wait_for_log(r"syncing \d+ records to disk")
    mark = proc.mark()
    proc.send_signal(signal.SIGHUP)  # closes (and moves) the current file
    proc.wait_for_log(r"moving finished file", since=mark)
    publish(address, "file_t", [b"after hup"])
    proc.wait_for_log(r"syncing 1 records to disk", since=mark)
    assert proc.stop() == 0
    assert proc.stdout_lines == []
    files = sorted(p.name for p in out.iterdir())
    assert files[0] == "file_t-000000.log.gz" and len(files) >= 2
    assert all(re.fullmatch(r"file_t-\d{6}\.log\.gz", f) for f in files)
    assert list(work.iterdir()) == []
    lines = b"".join(gzip.decompress((out / f).read_bytes()) for f in files).splitlines()
    assert sorted(lines) == sorted(
        [b"%03d-%s" % (n, b"x" * 40) for n in range(10)] + [b"after hup"]
    )


def test_nsq_to_file_discovers_topics_by_pattern(
    cluster: Cluster, tools: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    address = cluster.nsqds[1].tcp_address
    publish(address, "pattern_yes", [b"kept"])
    publish(address, "pattern_no", [b"skipped"])
    proc = tools(
        "nsq_to_file",
        "--topic-pattern=^pattern_y",
        f"--lookupd-http-address={cluster.lookupd_http}",
        f"--output-dir={tmp_path}",
        "--topic-refresh=100ms",
        "--sync-interval=100ms",
        "--filename-format=<TOPIC>.log",
        "--consumer-opt=lookupd_poll_interval,100ms",
    )
    proc.wait_for_log(r"\[pattern_yes/nsq_to_file\] syncing 1 records to disk")
    proc.wait_for_log(r"skipping topic pattern_no \(doesn't match pattern \^pattern_y\)")
    assert proc.stop() == 0
    assert proc.stdout_lines == []
    assert (tmp_path / "pattern_yes.log").read_bytes() == b"kept\n"
    assert not (tmp_path / "pattern_no.log").exists()


# -- nsq_to_http ---------------------------------------------------------------------------


class Recorder:
    """An HTTP endpoint recording requests; ``wait(n)`` blocks until n arrived."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = status
        self.cond = threading.Condition()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                with recorder.cond:
                    recorder.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": self.rfile.read(length),
                        }
                    )
                    recorder.cond.notify_all()
                self.send_response(recorder.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 15) -> list[dict[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.requests) >= n, timeout), self.requests
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


def test_nsq_to_http_post_with_headers(
    cluster: Cluster, tools: Callable[..., ServerProcess], recorder: Recorder
) -> None:
    address = cluster.nsqds[0].tcp_address
    publish(address, "http_post", [b"b%d" % n for n in range(5)])
    proc = tools(
        "nsq_to_http",
        "--topic=http_post",
        f"--nsqd-tcp-address={address}",
        f"--post={recorder.url}/hook",
        "--content-type=text/plain",
        "--header=X-Token: a:b",
        "--mode=round-robin",
        "-n",
        "4",
    )
    requests = recorder.wait(5)
    assert sorted(r["body"] for r in requests) == [b"b%d" % n for n in range(5)]
    first = requests[0]
    assert first["method"] == "POST" and first["path"] == "/hook"
    assert first["headers"]["Content-Type"] == "text/plain"
    assert first["headers"]["X-Token"] == "a:b"
    assert first["headers"]["User-Agent"] == "nsq_to_http v1.3.0"
    assert proc.stop() == 0
    assert proc.stdout_lines == []


def test_nsq_to_http_get_escapes_and_retries(
    cluster: Cluster, tools: Callable[..., ServerProcess]
) -> None:
    address = cluster.nsqds[1].tcp_address
    failing, working = Recorder(status=500), Recorder()
    try:
        publish(address, "http_get", [b"a b&c=d/\xc3\xa9"])
        proc = tools(
            "nsq_to_http",
            "--topic=http_get",
            f"--nsqd-tcp-address={address}",
            f"--get={failing.url}/?data=%s",
            f"--get={working.url}/?data=%s",
            "--mode=hostpool",
            "--status-every=1",
            "--consumer-opt=default_requeue_delay,0",
            "--consumer-opt=max_backoff_duration,0",
        )
        got = working.wait(1)
        assert got[0]["path"] == "/?data=a+b%26c%3Dd%2F%C3%A9"
        assert urllib.parse.parse_qs(got[0]["path"][2:])["data"] == ["a b&c=d/é"]
        proc.wait_for_log(r"finished 1 - 99th: [\d.]+ms - 95th: [\d.]+ms - avg: [\d.]+ms")
        assert proc.stop() == 0
        assert proc.stdout_lines == []  # the status lines are logged, on stderr
    finally:
        failing.close()
        working.close()


# -- nsq_to_nsq ----------------------------------------------------------------------------


def test_nsq_to_nsq_filters_and_whitelists(
    cluster: Cluster, tools: Callable[..., ServerProcess]
) -> None:
    source, dest = cluster.nsqds[0].tcp_address, cluster.nsqds[1].tcp_address
    create_channel(dest, "relay_dst", "check")
    events = [
        {"kind": "click", "id": 1, "secret": "x"},
        {"kind": "view", "id": 2},
        {"kind": "click", "id": 3.0, "secret": "y"},
    ]
    publish(source, "relay_src", [json.dumps(e).encode() for e in events] + [b"not json"])
    proc = tools(
        "nsq_to_nsq",
        "--topic=relay_src",
        f"--nsqd-tcp-address={source}",
        f"--destination-nsqd-tcp-address={dest}",
        "--destination-topic=relay_dst",
        "--require-json-field=kind",
        "--require-json-value=click",
        "--whitelist-json-field=kind",
        "--whitelist-json-field=id",
    )
    got = consume(dest, "relay_dst", 2)
    assert sorted(got) == [b'{"id":1,"kind":"click"}', b'{"id":3,"kind":"click"}']
    proc.wait_for_log(r"Unable to decode json: not json")
    assert proc.stop() == 0
    assert proc.stdout_lines == []


# -- nsq_stat ------------------------------------------------------------------------------


def test_nsq_stat_rows_from_nsqd_and_lookupd(cluster: Cluster) -> None:
    address = cluster.nsqds[0].tcp_address
    create_channel(address, "stat_t", "ch")
    publish(address, "stat_t", [b"m"] * 7)
    by_nsqd = run_tool(
        "nsq_stat",
        "--topic=stat_t",
        "--channel=ch",
        f"--nsqd-http-address={cluster.nsqd_http(0)}",
        "--count=2",
        "--interval=100ms",
    )
    assert by_nsqd.returncode == 0, by_nsqd.stderr
    lines = by_nsqd.stdout.decode().splitlines()
    assert lines[0].startswith("------rate------+")
    assert lines[1].split() == [
        "ingress", "egress", "|", "total", "mem", "disk", "inflt", "def", "|",
        "req", "t-o", "msgs", "clients",
    ]  # fmt: skip
    assert len(lines) == 4  # the first poll is the baseline: --count rows after it
    for row in lines[2:]:
        assert row.split() == ["0", "0", "|", "7", "7", "0", "0", "0", "|", "0", "0", "7", "0"]
    by_lookupd = run_tool(
        "nsq_stat",
        "--topic=stat_t",
        "--channel=ch",
        f"--lookupd-http-address={cluster.lookupd_http}",
        "--count=1",
        "--interval=100ms",
    )
    assert by_lookupd.returncode == 0, by_lookupd.stderr
    assert by_lookupd.stdout.decode().splitlines()[2].split()[3] == "7"
    missing = run_tool(
        "nsq_stat",
        "--topic=stat_t",
        "--channel=nope",
        f"--nsqd-http-address={cluster.nsqd_http(0)}",
    )
    assert missing.returncode == 1
    assert missing.stdout == b""
    assert b"failed to find channel(nope) in stats metadata for topic(stat_t)" in missing.stderr


# -- errors --------------------------------------------------------------------------------

DOWN = "127.0.0.1:1"  # nothing listens there


def tool_args(name: str, topic: str, out: Path) -> list[str]:
    """Each tool's arguments for ``topic`` with every nsqd it talks to down."""
    return {
        "nsq_tail": [f"--topic={topic}", f"--nsqd-tcp-address={DOWN}"],
        "to_nsq": [f"--topic={topic}", f"--nsqd-tcp-address={DOWN}"],
        "nsq_to_file": [f"--topic={topic}", f"--nsqd-tcp-address={DOWN}", f"--output-dir={out}"],
        "nsq_to_http": [f"--topic={topic}", f"--nsqd-tcp-address={DOWN}", f"--post=http://{DOWN}/"],
        "nsq_to_nsq": [
            f"--topic={topic}",
            f"--nsqd-tcp-address={DOWN}",
            f"--destination-nsqd-tcp-address={DOWN}",
            "--destination-topic=copy",
        ],
        "nsq_stat": [f"--topic={topic}", "--channel=c", f"--nsqd-http-address={DOWN}"],
    }[name]


@pytest.mark.parametrize("topic", ["bad!topic", "fine"])
def test_every_tool_ends_with_its_one_error_line(topic: str, tmp_path: Path) -> None:
    """A bad topic or an nsqd that is down: exit 1, the error as the last line, and no
    traceback after it (asyncio's "Task exception was never retrieved" included)."""
    problems: list[str] = []
    for name in TOOLS:
        result = run_tool(name, *tool_args(name, topic, tmp_path), stdin=b"one\ntwo\n", timeout=20)
        err = result.stderr.decode()
        lines = err.strip().splitlines()
        last = lines[-1] if lines else ""
        expected = "topic" if topic.startswith("bad") else ("refused" if name != "nsq_stat" else "")
        if result.returncode != 1:
            problems.append(f"{name}: exit code {result.returncode}")
        if "Traceback" in err or "Task exception" in err:
            problems.append(f"{name}: a traceback after the error:\n{err}")
        if expected not in last.lower() and not (name == "nsq_stat" and "failed" in last):
            problems.append(f"{name}: the last line is not the error: {last!r}")
    assert not problems, "\n".join(problems)
