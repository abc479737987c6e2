"""A full disk under nsqd (issue 28, part 1), side by side with the Go nsqd.

Go's setting: a 3 MB tmpfs for --data-path, --mem-queue-size=0, 10 KB bodies. Both nsqd
answer a PUB the disk refuses with ``E_PUB_FAILED PUB failed write <file>: no space left on
device``, an HTTP ``/pub`` with 503 and ``/ping`` with 500 ``NOK - <the error>``; once space
is freed both publish again and ``/ping`` says OK. Beyond Go, ours delivers every message it
acknowledged before and after, its queue files read back whole after a restart, and a
failed ``nsqd.dat`` or ``nsqd.deferred.dat`` write is retried without a restart.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import NSQD
from nsqpy.wire.v2 import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, encode_pub
from tests.faults.conftest import GoNSQD, Mount, PyNSQD, fill_up, http, require_go, wait_until
from tests.support.rawclient import Message, RawClient

pytestmark = pytest.mark.timeout(120)

TOPIC = "full"
BODY = 10 * 1024
PUB_FAILED = re.compile(
    r"^E_PUB_FAILED PUB failed write (/\S+\.diskqueue\.\d{6}\.dat): no space left on device$"
)


@dataclass
class Run:
    """What one nsqd answered through the fault."""

    acked: list[bytes] = field(default_factory=list)
    refused: list[bytes] = field(default_factory=list)
    pub_error: str = ""
    http_pub: tuple[int, bytes] = (0, b"")
    ping_full: tuple[int, bytes] = (0, b"")
    ping_freed: tuple[int, bytes] = (0, b"")
    delivered: list[bytes] = field(default_factory=list)

    def body(self) -> bytes:
        n = len(self.acked) + len(self.refused)
        return b"%06d|" % n + b"\xab" * (BODY - 7)


def start(kind: type[NSQD], mounts: Mount, path: Path, **flags: Any) -> NSQD:
    nsqd = kind(directory=path, mem_queue_size=0, **flags)
    mounts.on_teardown(nsqd.close)
    return nsqd.start()


def create_channel(base: str) -> None:
    assert http("POST", f"{base}/topic/create?topic={TOPIC}")[0] == 200
    assert http("POST", f"{base}/channel/create?topic={TOPIC}&channel=c")[0] == 200


def publish_until_refused(nsqd: NSQD, run: Run, limit: int = 1000) -> None:
    """PUB new bodies on one connection until one is refused (the error closes it)."""
    with RawClient(nsqd.tcp_address) as client:
        for _ in range(limit):
            body = run.body()
            client.send(encode_pub(TOPIC, body))
            frame = client.next_frame(10)
            if frame.type == FRAME_TYPE_RESPONSE:
                run.acked.append(body)
                continue
            assert frame.type == FRAME_TYPE_ERROR, frame
            run.refused.append(body)
            run.pub_error = frame.data.decode()
            client.assert_closed()
            return
    raise AssertionError(f"{limit} PUBs of {BODY} bytes and no error")


def publish(nsqd: NSQD, run: Run, count: int) -> None:
    with RawClient(nsqd.tcp_address) as client:
        for _ in range(count):
            client.pub(TOPIC, body := run.body())
            run.acked.append(body)  # after its OK


def drain(nsqd: NSQD, channel: str = "c", quiet: float = 1.0) -> list[bytes]:
    """Every message the channel still has, FINed, until none comes for ``quiet`` s."""
    out: list[Message] = []
    with RawClient(nsqd.tcp_address) as client:
        client.sub(TOPIC, channel)
        client.rdy(50)
        while (msg := client.poll_message(quiet)) is not None:
            out.append(msg)
            client.fin(msg.id)
    return [m.body for m in out]


def through_the_fault(nsqd: NSQD, mounts: Mount, path: Path) -> Run:
    """The fault as the issue measured it on Go: fill by publishing, then free space."""
    run = Run()
    base = nsqd.url
    create_channel(base)
    spare = path / "spare"
    spare.write_bytes(b"\0" * (512 * 1024))  # deleted to free space
    publish_until_refused(nsqd, run)
    body = run.body()
    run.http_pub = http("POST", f"{base}/pub?topic={TOPIC}", body)
    if run.http_pub[0] == 200:
        run.acked.append(body)
    else:
        run.refused.append(body)
    run.ping_full = http("GET", f"{base}/ping")
    spare.unlink()
    publish(nsqd, run, 5)
    run.ping_freed = http("GET", f"{base}/ping")
    run.delivered = drain(nsqd)
    return run


def lost(run: Run, delivered: list[bytes]) -> list[bytes]:
    seen = set(delivered)
    return [b for b in run.acked if b not in seen]


def test_full_disk_side_by_side_with_go(
    mounts: Mount, go_nsqd_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs: dict[str, Run] = {}
    for name, kind in (("go", GoNSQD), ("ours", PyNSQD)):
        path = mounts.tmpfs(f"full-{name}", "3m")
        nsqd = start(kind, mounts, path)
        runs[name] = run = through_the_fault(nsqd, mounts, path)
        match = PUB_FAILED.match(run.pub_error)
        assert match, f"{name}: {run.pub_error!r}"
        assert match.group(1).startswith(str(path) + "/"), run.pub_error
        assert run.http_pub[0] == 503, f"{name}: {run.http_pub}"
        status, text = run.ping_full
        assert status == 500, f"{name}: {run.ping_full}"
        assert text.startswith(b"NOK - ") and b"no space left on device" in text, text
        assert run.ping_freed == (200, b"OK"), f"{name}: {run.ping_freed}"
        if name == "ours":
            # beyond Go: every acknowledged message was delivered, the refused ones at most once
            assert not lost(run, run.delivered), f"{len(lost(run, run.delivered))} lost"
            assert len(run.delivered) == len(set(run.delivered))
            assert nsqd.stop() == 0
            assert "Traceback" not in nsqd.log_text()
        else:
            nsqd.stop()
    with capsys.disabled():
        for name, run in runs.items():
            print(
                f"\n  disk full [{name}]: {len(run.acked)} acknowledged, "
                f"{len(lost(run, run.delivered))} of them not delivered; "
                f"HTTP /pub {run.http_pub[0]} {run.http_pub[1]!r}"
            )


def test_queue_files_read_back_whole_after_a_full_disk(mounts: Mount) -> None:
    """Fill the disk through several refusals and recoveries, restart, read everything."""
    path = mounts.tmpfs("full", "3m")
    nsqd = start(PyNSQD, mounts, path)
    run = Run()
    create_channel(nsqd.url)
    for _ in range(3):
        spare = path / "spare"
        spare.write_bytes(b"\0" * (256 * 1024))
        publish_until_refused(nsqd, run)
        delivered = drain(nsqd, quiet=0.5)  # room again by reading...
        run.delivered += delivered
        spare.unlink()  # ...and by freeing space
    publish(nsqd, run, 20)
    nsqd.restart()
    run.delivered += drain(nsqd)
    assert not lost(run, run.delivered)
    assert not list(path.glob("*.bad")), "a queue file was found corrupt"
    log = nsqd.log_text()
    assert "Traceback" not in log
    assert "corrupt" not in log and "invalid message read size" not in log, log


def test_failed_metadata_write_is_retried(mounts: Mount) -> None:
    """nsqd.dat: a topic created while the disk is full is written once there is room."""
    path = mounts.tmpfs("meta", "1m")
    nsqd = start(PyNSQD, mounts, path, sync_timeout="100ms")
    filler = fill_up(path)
    assert http("POST", f"{nsqd.url}/topic/create?topic=later")[0] == 200
    assert nsqd.process is not None
    nsqd.process.wait_for_log(r"failed to persist metadata - .*no space left on device")
    assert b"later" not in (path / "nsqd.dat").read_bytes()
    filler.unlink()
    wait_until(lambda: b'"later"' in (path / "nsqd.dat").read_bytes(), "nsqd.dat rewritten")
    assert list(path.glob("nsqd.dat.*.tmp")) == [], "a temporary file was left behind"
    assert nsqd.stop() == 0


def test_deferred_file_written_when_space_comes_during_exit(mounts: Mount) -> None:
    """nsqd.deferred.dat: an exit on a full disk retries it (and the queues come next)."""
    path = mounts.tmpfs("deferred", "1m")
    nsqd = start(PyNSQD, mounts, path)
    create_channel(nsqd.url)
    filler = fill_up(path)
    with RawClient(nsqd.tcp_address) as client:
        client.dpub(TOPIC, 60_000, b"later")  # held in memory: OK with a full disk
    assert nsqd.process is not None
    nsqd.process.send_signal(15)
    nsqd.process.wait_for_log(r"failed to persist metadata - .*no space left on device")
    filler.unlink()
    assert nsqd.process.wait(10) == 0
    # (with --workers, NSQPY_NSQD_WORKERS, the topic's worker writes nsqd.deferred.<i>.dat)
    (side_file,) = path.glob("nsqd.deferred*.dat")
    due = json.loads(side_file.read_bytes())["due"]
    assert list(due) == [f"{TOPIC}:c"], due
    (due_ns,) = due[f"{TOPIC}:c"].values()
    assert due_ns > time.time_ns() + 30e9
    nsqd.start()
    with RawClient(nsqd.tcp_address) as client:
        client.sub(TOPIC, "c")
        client.rdy(1)
        client.expect_no_frame(0.5)  # deferred again when read back, not delivered at once

        def deferred() -> bool:
            stats = json.loads(http("GET", f"{nsqd.url}/stats?format=json&topic={TOPIC}")[1])
            return bool(stats["topics"][0]["channels"][0]["deferred_count"] == 1)

        wait_until(deferred, "the message deferred again")


@pytest.mark.parametrize("name", ["ours", "go"])
def test_messages_returned_while_the_disk_is_full_are_kept(
    name: str, mounts: Mount, capsys: pytest.CaptureFixture[str]
) -> None:
    """Beyond Go: a message requeued (REQ), timed out or deferred while the disk refuses
    writes is kept in memory instead of dropped, and delivered. The Go nsqd, same steps,
    gives the figure beside it."""
    if name == "go":
        require_go("nsqd")
    path = mounts.tmpfs("returned", "1m")
    nsqd = start(PyNSQD if name == "ours" else GoNSQD, mounts, path, msg_timeout="1s")
    create_channel(nsqd.url)
    run = Run()
    publish(nsqd, run, 3)
    with RawClient(nsqd.tcp_address) as client:
        client.sub(TOPIC, "c")
        client.rdy(3)
        first, second, _third = client.read_messages(3, 5)
        # RDY 0 first: a requeued message handed out again (RDY 3 would allow it) would time
        # out as well, and the counts below would never match
        client.rdy(0)
        filler = fill_up(path)
        client.req(first.id)  # back at once
        client.req(second.id, 200)  # deferred, due while the disk is still full
        # the third times out (--msg-timeout=1s)

        def returned() -> bool:
            body = http("GET", f"{nsqd.url}/stats?format=json&topic={TOPIC}")[1]
            chan = json.loads(body)["topics"][0]["channels"][0]
            return bool(chan["timeout_count"] == 1 and chan["deferred_count"] == 0)

        wait_until(returned, "the message timed out and the deferred one due")
        filler.unlink()
    got = drain(nsqd)
    if name == "go":
        with capsys.disabled():
            print(f"\n  returned while the disk is full [go]: {len(got)} of 3 delivered")
        return
    assert sorted(got) == sorted(run.acked)
    assert nsqd.stop() == 0


def test_topic_backlog_moved_into_a_channel_while_the_disk_is_full(mounts: Mount) -> None:
    """Beyond Go: a topic's backlog read off its disk queue for a new channel whose queue
    the disk refuses stays in the channel's memory instead of being dropped."""
    path = mounts.tmpfs("backlog", "1m")
    nsqd = start(PyNSQD, mounts, path)
    run = Run()
    publish(nsqd, run, 40)  # no channel yet: the topic's backlog, on disk (400 KB)
    filler = fill_up(path)
    assert http("POST", f"{nsqd.url}/channel/create?topic={TOPIC}&channel=c")[0] == 200
    got = drain(nsqd, quiet=0.5)
    filler.unlink()
    got += drain(nsqd, quiet=0.5)
    assert sorted(got) == sorted(run.acked)
    assert "kept in memory" in nsqd.log_text()
    assert nsqd.stop() == 0
