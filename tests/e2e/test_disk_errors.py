"""Disk errors under nsqd: a full disk and a read-only disk (spec §7.7 "valid sizes"/writes).

--data-path is a 1 MiB tmpfs mounted for the test (root only; skipped when mounting is not
possible) and --mem-queue-size=0, so every message must go to disk. When the disk is full,
publishing must fail with a clear ``E_PUB_FAILED``/``E_MPUB_FAILED``, never be dropped after
its OK and never crash nsqd; consumers are still served; once there is room again publishing
works and every acknowledged message is delivered. ``/ping`` says ``NOK - <error>`` meanwhile
when nsqd serves HTTP.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqpy.wire.v2 import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, encode_mpub, encode_pub
from tests.e2e.test_datadir_compat import http_base, http_call
from tests.support.procs import ServerPool, ServerProcess
from tests.support.rawclient import Message, RawClient, consumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "diskfull"
FILLER_BYTES = 600 * 1024  # of the 1 MiB: about 400 KiB are left for the queue
BODY_PAD = 990


def mount(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


@pytest.fixture
def tmpfs(nsqd_pool: ServerPool, tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs; nsqd processes are stopped before it is unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    result = mount(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)])
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {result.stderr.strip() or result.returncode}")
    try:
        yield mnt
    finally:
        nsqd_pool.stop_all()
        if mount(["umount", str(mnt)]).returncode != 0:
            mount(["umount", "-l", str(mnt)])


class PublishLog:
    """Bodies whose publish was acknowledged, and those of failed publishes."""

    def __init__(self) -> None:
        self.acked: list[bytes] = []
        self.failed: set[bytes] = set()
        self.errors: list[str] = []
        self._batches = 0

    def batch(self, size: int = 20) -> list[bytes]:
        """New distinct bodies of about 1 KB."""
        self._batches += 1
        return [b"%05d-%02d|" % (self._batches, j) + b"\xaa" * BODY_PAD for j in range(size)]


def publish_until_error(
    nsqd: ServerProcess, log: PublishLog, *, single: bool = False, limit: int = 200
) -> str:
    """(M)PUB new batches until one gets an error frame; returns its text. The error closes
    the connection (every PUB error is fatal in NSQ)."""
    client = RawClient(nsqd.tcp_address)
    try:
        for _ in range(limit):
            bodies = log.batch(1 if single else 20)
            client.send(encode_pub(TOPIC, bodies[0]) if single else encode_mpub(TOPIC, bodies))
            frame = client.next_frame()
            if frame.type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                log.acked.extend(bodies)
                continue
            assert frame.type == FRAME_TYPE_ERROR, frame
            log.failed.update(bodies)
            text = frame.data.decode()
            log.errors.append(text)
            client.assert_closed()
            return text
        raise AssertionError(f"{limit} publishes and no error: {len(log.acked)} messages acked")
    finally:
        client.close()


def publish_ok(nsqd: ServerProcess, log: PublishLog, batches: int) -> None:
    with RawClient(nsqd.tcp_address) as client:
        for _ in range(batches):
            bodies = log.batch()
            client.mpub(TOPIC, bodies)
            log.acked.extend(bodies)


def take(client: RawClient, count: int, *, timeout: float = 15.0) -> list[Message]:
    deadline = time.monotonic() + timeout
    out: list[Message] = []
    while len(out) < count:
        try:
            msg = client.read_message(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise AssertionError(f"got {len(out)} of {count} messages in {timeout}s") from None
        out.append(msg)
        client.fin(msg.id)
    return out


def assert_all_acked_delivered(got: list[Message], log: PublishLog) -> None:
    """Every acknowledged body, in publish order; failed ones may or may not appear."""
    bodies = [m.body for m in got]
    unknown = set(bodies) - set(log.acked) - log.failed
    assert not unknown, f"{len(unknown)} bodies nobody published"
    acked_seen = [b for b in bodies if b not in log.failed]
    missing = set(log.acked) - set(acked_seen)
    assert not missing, (
        f"{len(missing)} of {len(log.acked)} acknowledged messages lost, "
        f"e.g. {sorted(missing)[0][:12]!r}"
    )
    assert acked_seen == log.acked, "acknowledged messages out of order or duplicated"


def drain_quiet(reader: RawClient, quiet: float) -> list[Message]:
    """Every message that still arrives (FINed) until none has for ``quiet`` seconds."""
    extra: list[Message] = []
    while True:
        try:
            msg = reader.read_message(quiet)
        except TimeoutError:
            return extra
        extra.append(msg)
        reader.fin(msg.id)


def ping(base: str | None) -> tuple[int, str] | None:
    if base is None:
        return None
    status, body = http_call("GET", f"{base}/ping")
    return status, body.decode()


def fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    filler.write_bytes(b"\0" * FILLER_BYTES)
    return filler


def test_full_disk_refuses_publishes_and_recovers(nsqd_pool: ServerPool, tmpfs: Path) -> None:
    nsqd = nsqd_pool.start(data_path=tmpfs, mem_queue_size=0)
    base = http_base(nsqd)
    reader = consumer(nsqd.tcp_address, TOPIC, "ch")  # RDY 0 for now
    filler = fill(tmpfs)
    log = PublishLog()

    text = publish_until_error(nsqd, log)
    assert text.startswith("E_MPUB_FAILED MPUB failed "), text
    assert "no space left on device" in text, text
    # bounded: nsqd did not acknowledge much more than the disk could take
    assert len(log.acked) * (BODY_PAD + 50) < 1024 * 1024 - FILLER_BYTES + 300 * 1024
    assert publish_until_error(nsqd, log, single=True).startswith("E_PUB_FAILED PUB failed ")
    assert nsqd.returncode is None
    if (health := ping(base)) is not None:
        assert health[0] == 500 and health[1].startswith("NOK - "), health
        assert "no space left on device" in health[1], health

    # consumers are still served while the disk is full
    reader.rdy(10)
    got = take(reader, 10)
    assert [m.body for m in got] == log.acked[:10]

    # room again: publishing works, /ping recovers, every acknowledged message is delivered
    filler.unlink()
    publish_ok(nsqd, log, 3)
    if base is not None:
        assert ping(base) == (200, "OK")
    reader.rdy(100)
    got += take(reader, len(log.acked) - 10)
    # refused publishes may still arrive (at least once): read until the channel is quiet
    got += drain_quiet(reader, 0.5)
    assert_all_acked_delivered(got, log)
    reader.close()
    assert nsqd.stop() == 0
    assert "Traceback" not in nsqd.log_text()


def test_acknowledged_messages_survive_exit_on_a_full_disk(
    nsqd_pool: ServerPool, tmpfs: Path
) -> None:
    """An OK means the message is in nsqd's files (the Go nsqd writes each message to its
    file before answering OK): a graceful exit while the disk is still full loses none of
    the acknowledged messages, and is still a clean exit (code 0, errors logged).

    The queue's metadata is synced once before the disk fills up (--sync-timeout=100ms), as
    it would be in any nsqd that has run for a while: at the exit it cannot be rewritten, so
    the restart finds it stale and salvages the data file to its end (spec §7.7)."""
    nsqd = nsqd_pool.start(data_path=tmpfs, mem_queue_size=0, sync_timeout="100ms")
    with consumer(nsqd.tcp_address, TOPIC, "ch"):
        pass
    log = PublishLog()
    publish_ok(nsqd, log, 1)
    meta = tmpfs / f"{TOPIC}:ch.diskqueue.meta.dat"
    deadline = time.monotonic() + 10
    while not (meta.exists() and meta.read_bytes().startswith(b"20\n")):
        assert time.monotonic() < deadline, "the queue's metadata was never synced"
        time.sleep(0.02)
    filler = fill(tmpfs)
    assert "no space left on device" in publish_until_error(nsqd, log)
    rc = nsqd.stop()
    exit_log = nsqd.log_text()
    filler.unlink()

    nsqd = nsqd_pool.start(data_path=tmpfs, mem_queue_size=0)
    with consumer(nsqd.tcp_address, TOPIC, "ch", rdy=100) as client:
        got: list[Message] = []
        while (msg := client.poll_message(1.0)) is not None:
            got.append(msg)
            client.fin(msg.id)
    lost = set(log.acked) - {m.body for m in got}
    problems = []
    if lost:
        problems.append(f"{len(lost)} of {len(log.acked)} acknowledged messages lost")
    if rc != 0:
        problems.append(f"exit code {rc} on SIGTERM with a full disk")
    if "Traceback" in exit_log:
        last = exit_log[exit_log.index("Traceback") :].splitlines()[-4:]
        problems.append("a traceback at exit, ending:\n" + "\n".join(last))
    assert not problems, "\n".join(problems)
    assert_all_acked_delivered(got, log)
    assert nsqd.stop() == 0


def test_read_only_disk_refuses_publishes_and_recovers(nsqd_pool: ServerPool, tmpfs: Path) -> None:
    nsqd = nsqd_pool.start(data_path=tmpfs, mem_queue_size=0)
    base = http_base(nsqd)
    reader = consumer(nsqd.tcp_address, TOPIC, "ch")
    # nsqd.dat names the new channel once its (background) write is done
    dat = tmpfs / "nsqd.dat"
    deadline = time.monotonic() + 5
    while b'"ch"' not in dat.read_bytes():
        assert time.monotonic() < deadline, "nsqd.dat never listed the channel"
        time.sleep(0.02)
    result = mount(["mount", "-o", "remount,ro", str(tmpfs)])
    if result.returncode != 0:
        reader.close()
        pytest.skip(f"cannot remount the tmpfs read-only: {result.stderr.strip()}")
    log = PublishLog()
    try:
        text = publish_until_error(nsqd, log, single=True, limit=20)
        assert text.startswith("E_PUB_FAILED PUB failed "), text
        assert "read-only file system" in text, text
        assert nsqd.returncode is None
        if (health := ping(base)) is not None:
            assert health[0] == 500 and "read-only file system" in health[1], health
    finally:
        assert mount(["mount", "-o", "remount,rw", str(tmpfs)]).returncode == 0
    publish_ok(nsqd, log, 2)
    if base is not None:
        assert ping(base) == (200, "OK")
    reader.rdy(100)
    got = take(reader, len(log.acked))
    # refused publishes may still arrive (at least once): read until the channel is quiet
    got += drain_quiet(reader, 0.5)
    assert_all_acked_delivered(got, log)
    reader.close()
    assert nsqd.stop() == 0
    assert "Traceback" not in nsqd.log_text()
