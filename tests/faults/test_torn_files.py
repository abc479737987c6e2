"""Damaged queue files (issue 28, part 1): a data file truncated in the middle of a message,
and garbage written over the middle of one. The same damaged bytes go to the Go nsqd and
to ours: both start, report the damaged file, rename it ``.bad`` and deliver what is
around it (go-diskqueue's handleReadError), never a crash loop.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsqpy.testing import NSQD
from tests.faults.conftest import GoNSQD, PyNSQD, http
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.timeout(120)

TOPIC = "torn"
QUEUE = f"{TOPIC}:c.diskqueue"
COUNT = 30
FLAGS: dict[str, Any] = {"mem_queue_size": 0, "max_bytes_per_file": 1024}


def body(i: int) -> bytes:
    return b"msg-%03d|" % i + b"." * 80


def make_queue(path: Path) -> None:
    """COUNT messages in channel c's disk queue, over several 1 KiB files, cleanly closed."""
    path.mkdir(parents=True, exist_ok=True)
    nsqd = PyNSQD(directory=path, **FLAGS).start()
    try:
        assert http("POST", f"{nsqd.url}/topic/create?topic={TOPIC}")[0] == 200
        assert http("POST", f"{nsqd.url}/channel/create?topic={TOPIC}&channel=c")[0] == 200
        with RawClient(nsqd.tcp_address) as client:
            for i in range(COUNT):
                client.pub(TOPIC, body(i))
    finally:
        assert nsqd.stop() == 0
    assert len(list(path.glob(f"{QUEUE}.*.dat"))) - 1 >= 3, "expected several data files"


def truncate_middle(path: Path) -> None:
    """The first file cut 10 bytes into its third record."""
    f = path / f"{QUEUE}.000000.dat"
    record = 4 + 26 + len(body(0))
    with open(f, "r+b") as fh:
        fh.truncate(2 * record + 10)


def garbage_middle(path: Path) -> None:
    """Garbage over the length of the second file's second record."""
    f = path / f"{QUEUE}.000001.dat"
    record = 4 + 26 + len(body(0))
    data = bytearray(f.read_bytes())
    data[record : record + 8] = b"\xff\xfe\xfd\xfc garb"
    f.write_bytes(bytes(data))


def tail_torn(path: Path) -> None:
    """The current write file (the last one) cut in the middle of its last record."""
    files = sorted(path.glob(f"{QUEUE}.0*.dat"))
    last = files[-1]
    size = last.stat().st_size
    with open(last, "r+b") as fh:
        fh.truncate(size - 20)


def read_all(nsqd: NSQD) -> list[bytes]:
    got: list[bytes] = []
    with RawClient(nsqd.tcp_address) as client:
        client.sub(TOPIC, "c")
        client.rdy(COUNT)
        while (msg := client.poll_message(0.5)) is not None:
            got.append(msg.body)
            client.fin(msg.id)
    return got


def survive(kind: type[NSQD], path: Path) -> tuple[list[bytes], list[str], str, list[bytes]]:
    """Start on the damaged files, read everything, publish one more, restart, read again:
    what was delivered, the .bad files, the log of the first run, what came after."""
    nsqd = kind(directory=path, **FLAGS).start()
    try:
        got = read_all(nsqd)
        log = nsqd.log_text()
        bad = sorted(p.name for p in path.glob("*.bad"))
        with RawClient(nsqd.tcp_address) as client:
            client.pub(TOPIC, b"after")
        nsqd.restart()
        after = read_all(nsqd)
    finally:
        nsqd.close()
    return got, bad, log, after


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": truncate_middle,
    "garbage": garbage_middle,
    "tail-truncated": tail_torn,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_queue_file_is_set_aside_as_go_does(
    damage: str, tmp_path: Path, go_nsqd_path: Path
) -> None:
    clean = tmp_path / "clean"
    make_queue(clean)
    DAMAGE[damage](clean)
    results = {}
    for name, kind in (("go", GoNSQD), ("ours", PyNSQD)):
        path = tmp_path / name
        shutil.copytree(clean, path)
        results[name] = survive(kind, path)
    (go_got, go_bad, go_log, _), (got, bad, log, after) = results["go"], results["ours"]
    assert after == [b"after"], "ours is not right after the damage"
    assert bad, "ours did not set the damaged file aside"
    assert bad == go_bad
    assert got == go_got, f"ours delivered {len(got)}, Go {len(go_got)}"
    assert 0 < len(got) < COUNT
    assert "Traceback" not in log
    assert "jump to next file and saving bad file as" in log
    assert "jump to next file and saving bad file as" in go_log


def garbage_meta(path: Path) -> None:
    (path / f"{QUEUE}.meta.dat").write_bytes(b"\x00garbage\xff\n")


def no_meta(path: Path) -> None:
    """As after a kill before the queue's first metadata sync (default --sync-every)."""
    (path / f"{QUEUE}.meta.dat").unlink()


@pytest.mark.parametrize("damage", [garbage_meta, no_meta], ids=["garbage", "missing"])
def test_queue_metadata_lost_reads_the_files_beyond_go(
    damage: Callable[[Path], None], tmp_path: Path, go_nsqd_path: Path
) -> None:
    """Beyond Go: with its metadata damaged or missing, a queue's data files are still read
    (Go starts the queue empty: their messages are never delivered, and its next writes
    go over file 0)."""
    clean = tmp_path / "clean"
    make_queue(clean)
    damage(clean)
    results = {}
    for name, kind in (("go", GoNSQD), ("ours", PyNSQD)):
        path = tmp_path / name
        shutil.copytree(clean, path)
        results[name] = survive(kind, path)
    got, bad, log, after = results["ours"]
    assert got == [body(i) for i in range(COUNT)], f"ours delivered {len(got)} of {COUNT}"
    assert after == [b"after"]
    assert not bad and "Traceback" not in log
    print(f"\n  queue metadata {damage.__name__}: Go delivered {len(results['go'][0])} of {COUNT}")
