"""nsqpy.testing as its users see it: the servers, the in-process nsqd, and the pytest
plugin driving a sample project (examples/pytest_project, with pynsq) in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

import nsqpy.testing
from nsqpy.testing import NSQD, AsyncNSQD, HTTPError, NSQAdmin, NSQCluster, ServerError
from tests.support.rawclient import RawClient

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "pytest_project"

pytestmark = pytest.mark.timeout(90)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its dead parent's reaper) counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.02)


def test_nsqd_publishes_restarts_and_cleans_up() -> None:
    started = time.monotonic()
    with NSQD(msg_timeout="5s") as nsqd:
        ready = time.monotonic() - started
        assert nsqd.tcp_address.startswith("127.0.0.1:") and nsqd.url.startswith(
            "http://127.0.0.1:"
        )
        assert nsqd.flags["msg_timeout"] == "5s"
        nsqd.pub("t", b"one")
        nsqd.mpub("t", [b"two\nlines", "three"])
        with pytest.raises(HTTPError) as err:
            nsqd.pub("bad topic!", b"x")
        assert err.value.status == 400 and "INVALID_TOPIC" in err.value.body
        assert nsqd.depth("t") == 3
        address, pid, directory = nsqd.tcp_address, nsqd.pid, nsqd.directory
        nsqd.restart()  # graceful: memory goes to disk, same address after
        assert nsqd.tcp_address == address and nsqd.pid != pid
        assert nsqd.depth("t") == 3
        with RawClient(nsqd.tcp_address, magic=b"  V2") as client:
            client.send(b"SUB t c\nRDY 3\n")
            client.expect_response()
            assert sorted(client.read_frame().data[26:] for _ in range(3)) == [
                b"one",
                b"three",
                b"two\nlines",
            ]
        pid = nsqd.pid
    _wait_gone(pid)
    assert not directory.exists()
    # subprocess start-up target: < 1 s (generous here: the CI machine is shared)
    assert ready < 5.0, ready


def test_bad_flag_is_reported_with_the_servers_own_words() -> None:
    with pytest.raises(ServerError, match="mem-queue-size"), NSQD(mem_queue_size="lots"):
        pass


def test_cluster_registers_every_nsqd_nsqadmin_sees_it_and_kill_crashes_one() -> None:
    with NSQCluster(2, nsqd_flags={"mem_queue_size": 0}) as cluster:
        nodes = cluster.lookupd.nodes()
        assert sorted(n["tcp_port"] for n in nodes) == sorted(
            int(n.tcp_address.rsplit(":", 1)[1]) for n in cluster.nsqds
        )
        cluster.nsqds[1].pub("spread", b"x")
        producers = cluster.lookupd.lookup("spread")
        assert [p["broadcast_address"] for p in producers] == ["127.0.0.1"]
        with NSQAdmin(lookupd_http_address=cluster.lookupd.http_address) as admin:
            with urllib.request.urlopen(f"{admin.url}/api/topics", timeout=10) as resp:
                assert json.loads(resp.read())["topics"] == ["spread"]
            admin_pid = admin.pid
        assert cluster.nsqds[1].kill() == -signal.SIGKILL
        assert cluster.lookupd.lookup("nothing-here") == []
        pids = [n.pid for n in cluster.nsqds] + [cluster.lookupd.pid, admin_pid]
    for pid in pids:
        _wait_gone(pid)


def test_tls_nsqd_serves_https_with_its_generated_certificate() -> None:
    with NSQD(tls=True, tls_required="true") as nsqd:
        assert nsqd.tls is not None and nsqd.flags["tls_cert"] == str(nsqd.tls.cert)
        url = f"https://{nsqd.https_address}/ping"
        with urllib.request.urlopen(url, context=nsqd.tls.client_context()) as resp:
            assert resp.read() == b"OK"  # verified against the generated CA
        with RawClient(nsqd.tcp_address, magic=b"  V2") as client:
            client.send(b"PUB t\n" + (1).to_bytes(4, "big") + b"x")
            assert b"E_INVALID" in client.read_frame().data  # TLS required first


def test_async_nsqd_runs_on_the_callers_loop() -> None:
    async def scenario() -> float:
        import nsqpy.nsqd.server  # noqa: F401  - import time is not start-up time

        started = time.monotonic()
        async with AsyncNSQD(mem_queue_size=1) as nsqd:
            ready = time.monotonic() - started
            assert nsqd.server is not None
            assert nsqd.server.opts.idle_poll == 0  # the test's own loop does not spin
            await nsqd.pub("t", b"a")
            await nsqd.mpub("t", [b"b", b"c"])
            stats = await nsqd.stats("t")
            assert stats["topics"][0]["depth"] == 3
            reader, writer = await asyncio.open_connection(*nsqd.tcp_address.split(":"))
            writer.write(b"  V2PUB t\n" + (1).to_bytes(4, "big") + b"d")
            assert await reader.readexactly(10) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
            writer.close()
            await nsqd.restart()
            assert (await nsqd.stats("t"))["topics"][0]["depth"] == 4  # went to disk and back
            directory = nsqd.directory
        assert not directory.exists()
        return ready

    ready = asyncio.run(scenario())
    assert ready < 1.0, ready  # target < 0.3 s


def test_async_nsqd_polls_when_asked() -> None:
    async def scenario() -> None:
        async with AsyncNSQD(idle_poll="100us") as nsqd:
            assert nsqd.server is not None
            assert nsqd.server.opts.idle_poll == pytest.approx(0.0001)
            assert nsqd.server.nsqd.input_seen.__qualname__ == "IdlePoll.input"
            await nsqd.pub("t", b"a")
            assert (await nsqd.stats("t"))["topics"][0]["depth"] == 1

    asyncio.run(scenario())


def test_public_api_is_small() -> None:
    assert sorted(nsqpy.testing.__all__) == sorted(
        [
            "AsyncNSQD",
            "HTTPError",
            "NSQAdmin",
            "NSQCluster",
            "NSQD",
            "NSQLookupd",
            "ServerError",
            "ServerProcess",
            "TLSFiles",
            "make_tls_files",
        ]
    )
    # importable without pytest (not a runtime dependency)
    code = "import sys; sys.modules['pytest'] = None; import nsqpy.testing; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


# -- the pytest plugin, as a user runs it -----------------------------------------------------


def _pytest(
    cwd: Path, tmp: Path, *args: str, timeout: float = 80
) -> subprocess.CompletedProcess[str]:
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _leftovers(tmp: Path) -> list[str]:
    """Temp dirs, and processes whose command line points into ``tmp``."""
    found = [p.name for p in tmp.iterdir() if p.name.startswith("nsqpy-")]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if str(tmp).encode() in cmdline and _alive(int(proc.name)):
                found.append(f"pid {proc.name}")
    return found


def test_sample_project_with_pynsq_passes_and_leaves_nothing(tmp_path: Path) -> None:
    result = _pytest(SAMPLE, tmp_path / "tmp")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout.splitlines()[-1], result.stdout
    assert _leftovers(tmp_path / "tmp") == []


def test_ini_options_scope_and_parametrisation(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text(
        textwrap.dedent("""\
            [pytest]
            nsqpy_fixture_scope = session
            nsqpy_nsqd_flags = --max-msg-size=2048 --e2e-processing-latency-percentile=0.5
                --e2e-processing-latency-percentile=0.99
            nsqpy_cluster_size = 1
        """)
    )
    (project / "test_it.py").write_text(
        textwrap.dedent("""\
            import pytest
            pids = set()

            def test_one(nsqd):
                pids.add(nsqd.pid)
                assert nsqd.flags["max_msg_size"] == "2048"
                assert nsqd.flags["e2e_processing_latency_percentile"] == ["0.5", "0.99"]

            def test_two(nsqd, nsq_cluster):
                pids.add(nsqd.pid)
                assert len(pids) == 1  # session scope: one nsqd for both tests
                assert len(nsq_cluster.nsqds) == 1

            @pytest.mark.parametrize("nsqd", [{"max_msg_size": 10}], indirect=True)
            def test_param(nsqd):
                assert nsqd.pid not in pids
                with pytest.raises(AssertionError, match="MSG_TOO_BIG"):
                    nsqd.pub("t", b"x" * 11)

            @pytest.mark.parametrize("nsq_cluster", [2], indirect=True)
            def test_cluster_param(nsq_cluster, nsqd_factory):
                extra = nsqd_factory(lookupd_tcp_address=nsq_cluster.lookupd.tcp_address)
                assert len(nsq_cluster.lookupd.wait_for_nodes(3)) == 3
                assert extra.flags["max_msg_size"] == "2048"

            def test_fails(nsqd):
                assert nsqd.depth("nothing") == 1  # the report shows nsqd's log

            def test_interrupted(nsqd):
                raise KeyboardInterrupt  # an interrupted run cleans up too
        """)
    )
    result = _pytest(project, tmp_path / "tmp")
    assert result.returncode == 2, result.stdout + result.stderr  # interrupted
    assert "1 failed, 4 passed" in result.stdout, result.stdout
    log_section = r"- nsqd log \(pid \d+\) -+\n.*TCP: listening on"
    assert re.search(log_section, result.stdout, re.S), result.stdout
    assert _leftovers(tmp_path / "tmp") == []
    (project / "pytest.ini").write_text("[pytest]\nnsqpy_fixture_scope = forever\n")
    result = _pytest(project, tmp_path / "tmp")
    assert result.returncode == 4 and "nsqpy_fixture_scope = 'forever'" in result.stderr


def test_killed_test_run_leaves_nothing(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_killed.py").write_text(
        textwrap.dedent("""\
            import os, signal

            def test_killed(nsq_cluster):
                print("PIDS", *[n.pid for n in nsq_cluster.nsqds], nsq_cluster.lookupd.pid,
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # no finalizer, no atexit
        """)
    )
    result = _pytest(project, tmp_path / "tmp", "-s")
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    pids = [int(p) for p in result.stdout.split("PIDS", 1)[1].split()[:3]]
    for pid in pids:
        _wait_gone(pid)
    assert _leftovers(tmp_path / "tmp") == []


def test_testing_md_client_examples_run(tmp_path: Path) -> None:
    """docs/TESTING.md's examples (parametrisation, pynsq, gnsq, nsqpy's client) as a
    user's tests."""
    text = (ROOT / "docs" / "TESTING.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    tests = [b for b in blocks if re.search(r"^def test_\w+\(\w+\):", b, re.M)]
    assert len(tests) == 4, tests
    project = tmp_path / "project"
    project.mkdir()
    for i, block in enumerate(tests):
        (project / f"test_doc_{i}.py").write_text(block)
    result = _pytest(project, tmp_path / "tmp", "-o", "nsqpy_fixture_scope=session")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout.splitlines()[-1], result.stdout


def test_tls_without_cryptography_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)
    with pytest.raises(RuntimeError, match=r"pip install cryptography"):
        NSQD(tls=True, directory=tmp_path)
