"""nsqpy.diskqueue against go-diskqueue v1.1.0's on-disk format and behaviour (spec §7.7).

Real files in tmp_path, no sleeps. Several tests port go-diskqueue's own diskqueue_test.go
(TestDiskQueueRoll, TestDiskQueueEmpty, TestDiskQueueCorruption, TestDiskQueueSyncAfterRead,
TestDiskQueueResize) to the synchronous API: Go's ``<-dq.ReadChan()`` is ``dq.read()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqpy.diskqueue import DiskQueue, DiskQueueError, LogLevel

FIXTURES = Path(__file__).parent / "fixtures" / "diskqueue"


class Log:
    """A logf that records (level, message) pairs."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def __call__(self, level: int, msg: str) -> None:
        with self._lock:
            self.lines.append((level, msg))

    def at(self, level: LogLevel) -> list[str]:
        return [m for lv, m in self.lines if lv == level]

    def problems(self) -> list[str]:
        return [m for lv, m in self.lines if lv >= LogLevel.WARN]


def open_dq(
    path: Path,
    name: str = "test",
    max_bytes_per_file: int = 1024,
    min_msg_size: int = 4,
    max_msg_size: int = 1 << 10,
    sync_every: int = 2500,
    log: Log | None = None,
    **kw: int,
) -> tuple[DiskQueue, Log]:
    log = log if log is not None else Log()
    dq = DiskQueue(
        name, str(path), max_bytes_per_file, min_msg_size, max_msg_size, sync_every, 2.0, log, **kw
    )
    return dq, log


def rec(data: bytes) -> bytes:
    """One on-disk record: [int32 BE length][payload]."""
    return struct.pack(">i", len(data)) + data


def nsq_message(ts: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """Spec §2.1: int64 BE timestamp ns, uint16 BE attempts, 16 hex ASCII id, body."""
    assert len(msg_id) == 16
    return struct.pack(">qH", ts, attempts) + msg_id + body


def numbered(i: int, size: int = 30) -> bytes:
    return i.to_bytes(4, "big") + bytes([i % 251]) * (size - 4)


def meta_text(path: Path, name: str = "test") -> str:
    return (path / f"{name}.diskqueue.meta.dat").read_text()


def data_files(path: Path, name: str = "test") -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith(f"{name}.diskqueue.0"))


def fname(path: Path, num: int, name: str = "test") -> Path:
    return path / f"{name}.diskqueue.{num:06d}.dat"


def go_layout(payloads: list[bytes], max_bytes_per_file: int) -> list[bytes]:
    """Independent model of writeOne's roll rule: the data files Go would write."""
    files = [bytearray()]
    for p in payloads:
        r = rec(p)
        if len(files[-1]) > 0 and len(files[-1]) + len(r) > max_bytes_per_file:
            files.append(bytearray())
        files[-1] += r
    return [bytes(f) for f in files]


# ---------------------------------------------------------------- basics, rolling, layout


def test_put_read_one(tmp_path: Path) -> None:
    dq, log = open_dq(tmp_path)
    assert dq.depth() == 0
    assert dq.read() is None
    dq.put(b"test")
    assert dq.depth() == 1
    assert dq.read() == b"test"
    assert dq.depth() == 0
    assert dq.read() is None
    dq.close()
    assert log.problems() == []


def test_roll_matches_go(tmp_path: Path) -> None:
    """TestDiskQueueRoll: the 11th 14-byte record does not fit a 140-byte file."""
    msg = bytes([1, 2, 3, 4, 5, 6, 7, 8, 9, 0])
    ml = len(msg)
    dq, log = open_dq(tmp_path, max_bytes_per_file=10 * (ml + 4), min_msg_size=ml)
    for i in range(11):
        dq.put(msg)
        assert dq.depth() == i + 1
    assert dq._write_file_num == 1
    assert dq._write_pos == ml + 4
    for i in range(11, 0, -1):
        assert dq.read() == msg
        assert dq.depth() == i - 1
    dq.close()
    assert log.problems() == []


def test_round_trip_many_records_across_rolls(tmp_path: Path) -> None:
    dq, log = open_dq(tmp_path, max_bytes_per_file=500, write_buffer_size=300, read_chunk_size=200)
    payloads = [numbered(i, 4 + (i * 7) % 90) for i in range(2000)]
    for p in payloads[:1000]:
        dq.put(p)
    dq.put_many(payloads[1000:])
    assert dq.depth() == 2000
    got: list[bytes] = []
    while len(got) < 1500:
        got += dq.read_many(37)
    while (r := dq.read()) is not None:
        got.append(r)
    assert got == payloads
    assert dq.depth() == 0
    # fully read files are deleted: only the current write file is left
    assert data_files(tmp_path) == [fname(tmp_path, dq._write_file_num).name]
    dq.close()
    assert log.problems() == []


def test_reader_caught_up_when_writer_rolls_leaves_no_bad_file(tmp_path: Path) -> None:
    """go-diskqueue #38/#42, nsq #1491: v1.1.0 renames the fully read file .bad here; we don't.

    The alternating put/read of go-diskqueue PR #37's reproduction test.
    """
    msg = bytes(range(10))
    ml = len(msg)
    dq, log = open_dq(tmp_path, max_bytes_per_file=10 * (ml + 4), min_msg_size=ml)
    for _ in range(11):
        dq.put(msg)
        assert dq.depth() == 1
        assert dq.read() == msg
        assert dq.depth() == 0
    assert (dq._write_file_num, dq._write_pos) == (1, ml + 4)
    assert list(tmp_path.glob("*.bad")) == []
    assert not fname(tmp_path, 0).exists()  # deleted like any file read to its end
    assert log.problems() == []
    dq.close()
    # same boundary found on startup: metadata says "read to the end of file 0"
    fname(tmp_path, 5).write_bytes(rec(msg))
    fname(tmp_path, 6).write_bytes(rec(msg))
    (tmp_path / "test.diskqueue.meta.dat").write_text(f"1\n5,{ml + 4}\n6,{ml + 4}\n")
    dq, log = open_dq(tmp_path, max_bytes_per_file=10 * (ml + 4), min_msg_size=ml)
    assert dq.read_many(5) == [msg]
    assert list(tmp_path.glob("*.bad")) == []
    assert not fname(tmp_path, 5).exists()
    assert log.problems() == []


def test_written_bytes_are_exactly_gos(tmp_path: Path) -> None:
    """Data files and metadata byte for byte as go-diskqueue would leave them."""
    payloads = [
        nsq_message(1700000000000000000 + i, 1, b"%016x" % i, b"x" * (i % 40)) for i in range(60)
    ]
    dq, _ = open_dq(tmp_path, name="orders", max_bytes_per_file=256, min_msg_size=26)
    for p in payloads[:20]:
        dq.put(p)
    dq.put_many(payloads[20:45])
    for p in payloads[45:]:
        dq.put(p)
    dq.close()
    expected = go_layout(payloads, 256)
    assert data_files(tmp_path, "orders") == [
        f"orders.diskqueue.{i:06d}.dat" for i in range(len(expected))
    ]
    for i, content in enumerate(expected):
        assert fname(tmp_path, i, "orders").read_bytes() == content
    assert meta_text(tmp_path, "orders") == f"60\n0,0\n{len(expected) - 1},{len(expected[-1])}\n"
    # no temp files left behind by the atomic metadata write
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_oversized_record_gets_a_fresh_file_to_itself(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=100)
    small, big = b"s" * 10, b"B" * 300
    dq.put(small)
    dq.put(big)  # does not fit after `small`: new file, where it exceeds the limit alone
    dq.put(small)  # file 1 is past the limit: roll again
    dq.close()
    assert fname(tmp_path, 0).read_bytes() == rec(small)
    assert fname(tmp_path, 1).read_bytes() == rec(big)
    assert fname(tmp_path, 2).read_bytes() == rec(small)
    dq, _ = open_dq(tmp_path, max_bytes_per_file=100)
    assert [dq.read(), dq.read(), dq.read(), dq.read()] == [small, big, small, None]


def test_meta_content_exact_after_sync(tmp_path: Path) -> None:
    """TestDiskQueueSyncAfterRead, with explicit syncs instead of the 50ms ticker."""
    dq, _ = open_dq(tmp_path, max_bytes_per_file=1 << 11, min_msg_size=0)
    msg = bytes(1000)
    dq.put(msg)
    dq.sync()
    assert meta_text(tmp_path) == "1\n0,0\n0,1004\n"
    dq.put(msg)
    assert dq.read() == msg
    dq.sync()
    assert meta_text(tmp_path) == "1\n0,1004\n0,2008\n"
    dq.put(msg)  # 2008 + 1004 > 2048: roll
    dq.sync()
    assert meta_text(tmp_path) == "2\n0,1004\n1,1004\n"
    assert dq.read() == msg  # last record of file 0: reader moves to file 1, deletes file 0
    assert not fname(tmp_path, 0).exists()
    assert dq.needs_sync()
    dq.sync()
    assert meta_text(tmp_path) == "1\n1,0\n1,1004\n"
    dq.close()
    assert meta_text(tmp_path) == "1\n1,0\n1,1004\n"


def test_reopen_after_close_continues(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=300)
    payloads = [numbered(i) for i in range(50)]
    for p in payloads:
        dq.put(p)
    assert dq.read_many(12) == payloads[:12]
    dq.close()
    dq, log = open_dq(tmp_path, max_bytes_per_file=300)
    assert dq.depth() == 38
    more = [numbered(i) for i in range(50, 60)]
    dq.put_many(more)
    assert dq.read_many(100) == payloads[12:] + more
    assert dq.depth() == 0
    dq.close()
    dq, _ = open_dq(tmp_path, max_bytes_per_file=300)
    assert dq.depth() == 0
    assert dq.read() is None
    assert log.problems() == []


def test_resize_between_runs(tmp_path: Path) -> None:
    """TestDiskQueueResize: max_bytes_per_file changes between runs, no .bad files."""
    msg = bytearray(range(10))
    ml = len(msg)
    dq, log = open_dq(tmp_path, max_bytes_per_file=8 * (ml + 4), min_msg_size=ml)
    for i in range(9):
        msg[0] = i
        dq.put(bytes(msg))
    assert (dq._write_file_num, dq._write_pos, dq.depth()) == (1, ml + 4, 9)
    dq.close()
    dq, _ = open_dq(tmp_path, max_bytes_per_file=10 * (ml + 4), min_msg_size=ml, log=log)
    for i in range(10):
        msg[0] = 20 + i
        dq.put(bytes(msg))
    assert (dq._write_file_num, dq._write_pos, dq.depth()) == (2, ml + 4, 19)
    for i in [*range(9), *range(20, 30)]:
        msg[0] = i
        assert dq.read() == bytes(msg)
    assert dq.depth() == 0
    dq.close()
    assert list(tmp_path.glob("*.bad")) == []
    assert log.problems() == []


def test_put_sizes_are_validated(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, min_msg_size=26, max_msg_size=100)
    with pytest.raises(DiskQueueError, match=r"invalid message write size \(25\)"):
        dq.put(bytes(25))
    with pytest.raises(DiskQueueError, match=r"invalid message write size \(101\)"):
        dq.put(bytes(101))
    dq.put(bytes(26))
    dq.put(bytes(100))
    assert dq.depth() == 2


def test_put_many_size_error_writes_nothing(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=100, write_buffer_size=1)
    dq.put(numbered(0))
    before = (dq._write_file_num, dq._write_pos, dq.depth())
    with pytest.raises(DiskQueueError, match="invalid message write size"):
        dq.put_many([numbered(1), numbered(2), numbered(3), bytes(2000)])
    assert (dq._write_file_num, dq._write_pos, dq.depth()) == before
    assert fname(tmp_path, 0).read_bytes() == rec(numbered(0))
    assert not fname(tmp_path, 1).exists()
    dq.put_many([])
    assert dq.read_many(10) == [numbered(0)]


def test_needs_sync_and_dirty(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=100, sync_every=5)
    assert not dq.needs_sync()
    assert not dq.dirty()
    for _ in range(2):
        dq.put(numbered(0, 10))
    assert dq.dirty()
    assert not dq.needs_sync()
    dq.read()
    dq.put_many([numbered(1, 10)])
    assert not dq.needs_sync()
    dq.put(numbered(2, 10))  # 5 operations, reads and writes together
    assert dq.needs_sync()
    dq.sync()
    assert not dq.needs_sync()
    assert not dq.dirty()
    dq.put_many([numbered(3, 40)] * 3)  # 3rd record rolls: needSync like Go's sync-on-roll
    assert dq.needs_sync()


# ---------------------------------------------------------------- Go-written files


def test_fixture_files_written_by_spec_are_read_back(tmp_path: Path) -> None:
    ts0 = 1700000000123456789
    expected = [
        nsq_message(ts0, 1, b"0a1b2c3d4e5f6071", b'{"order":1,"email":"a@example.com"}'),
        nsq_message(
            ts0 + 100000000,
            1,
            b"0a1b2c3d4e5f6072",
            b'{"order":2,"email":"b@example.com","note":"x"}',
        ),
        nsq_message(ts0 + 200000000, 3, b"0a1b2c3d4e5f6073", b"plain text body " * 8),
        nsq_message(ts0 + 300000000, 1, b"0a1b2c3d4e5f6074", b"\x00\x01\x02\xff binary"),
        nsq_message(ts0 + 400000000, 65535, b"0a1b2c3d4e5f6075", b""),
    ]
    name = "orders:email"
    # the fixture files are exactly the spec's format
    assert (FIXTURES / f"{name}.diskqueue.000000.dat").read_bytes() == b"".join(
        map(rec, expected[:3])
    )
    assert (FIXTURES / f"{name}.diskqueue.000001.dat").read_bytes() == b"".join(
        map(rec, expected[3:])
    )
    size1 = sum(len(e) + 4 for e in expected[3:])
    assert (FIXTURES / f"{name}.diskqueue.meta.dat").read_text() == f"5\n0,0\n1,{size1}\n"

    for fn in FIXTURES.glob(f"{name}.diskqueue.*"):
        shutil.copy(fn, tmp_path / fn.name)
    dq, log = open_dq(tmp_path, name=name, max_bytes_per_file=320, min_msg_size=26)
    assert dq.depth() == 5
    assert dq.read_many(3) == expected[:3]
    assert not (tmp_path / f"{name}.diskqueue.000000.dat").exists()  # read to its end: deleted
    assert dq.read() == expected[3]
    # writing continues in file 1 at the recorded writePos, where Go would
    new = nsq_message(ts0 + 500000000, 1, b"0a1b2c3d4e5f6076", b"new")
    dq.put(new)
    assert dq.read_many(10) == [expected[4], new]
    dq.close()
    assert (tmp_path / f"{name}.diskqueue.000001.dat").read_bytes() == b"".join(
        map(rec, [*expected[3:], new])
    )
    assert meta_text(tmp_path, name) == f"0\n1,{size1 + 4 + len(new)}\n1,{size1 + 4 + len(new)}\n"
    assert log.problems() == []


def test_go_files_with_read_position_mid_file(tmp_path: Path) -> None:
    """Hand-built files: three files, reader half-way through the first, as Go left them."""
    name = "orders:email"
    msgs = [nsq_message(1 << 60, 1, b"%016x" % i, b"body-%d" % i) for i in range(8)]
    f0 = b"".join(map(rec, msgs[0:3]))
    f1 = b"".join(map(rec, msgs[3:6]))
    f2 = b"".join(map(rec, msgs[6:8]))
    (tmp_path / f"{name}.diskqueue.000004.dat").write_bytes(f0)
    (tmp_path / f"{name}.diskqueue.000005.dat").write_bytes(f1)
    (tmp_path / f"{name}.diskqueue.000006.dat").write_bytes(f2)
    first = len(rec(msgs[0]))
    (tmp_path / f"{name}.diskqueue.meta.dat").write_bytes(b"7\n4,%d\n6,%d\n" % (first, len(f2)))
    dq, log = open_dq(tmp_path, name=name, max_bytes_per_file=120, min_msg_size=26)
    assert dq.depth() == 7
    assert dq.read_many(100) == msgs[1:]
    assert dq.depth() == 0
    assert log.problems() == []
    dq.close()
    assert meta_text(tmp_path, name) == f"0\n6,{len(f2)}\n6,{len(f2)}\n"


def test_spec_example_metadata_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "t.diskqueue.000000.dat").write_bytes(b"\x00" * 46347)
    (tmp_path / "t.diskqueue.meta.dat").write_bytes(b"0\n0,46347\n0,46347\n")
    dq, log = open_dq(tmp_path, name="t", max_bytes_per_file=100 * 1024 * 1024)
    assert (dq.depth(), dq._read_file_num, dq._read_pos, dq._write_file_num, dq._write_pos) == (
        0,
        0,
        46347,
        0,
        46347,
    )
    assert dq.read() is None
    dq.put(b"next")
    assert dq.read() == b"next"
    dq.close()
    assert (tmp_path / "t.diskqueue.000000.dat").read_bytes()[46347:] == rec(b"next")
    assert log.problems() == []


def test_corrupt_or_odd_metadata_never_raises(tmp_path: Path) -> None:
    (tmp_path / "test.diskqueue.meta.dat").write_bytes(b"not a number\n")
    dq, log = open_dq(tmp_path)
    assert "failed to retrieveMetaData" in log.at(LogLevel.ERROR)[0]
    assert dq.depth() == 0
    dq.put(b"abcd")
    assert dq.read() == b"abcd"
    dq.close()
    # Fscanf-style: no final newline is fine, extra trailing content is ignored
    (tmp_path / "u.diskqueue.meta.dat").write_bytes(b"3\n2,10\n2,10")
    dq, log = open_dq(tmp_path, name="u")
    assert (dq.depth(), dq._read_file_num, dq._read_pos) == (3, 2, 10)
    assert log.problems() == []
    dq.delete()


# ---------------------------------------------------------------- corruption handling


def test_corruption_like_go(tmp_path: Path) -> None:
    """TestDiskQueueCorruption's first part: a truncated completed file becomes .bad."""
    dq, log = open_dq(
        tmp_path, max_bytes_per_file=1000, min_msg_size=10, sync_every=5, write_buffer_size=1
    )
    raw = bytearray(120)  # 124 bytes per record, 8 records (992 bytes) per file
    raw[0], raw[62], raw[119] = 91, 4, 211
    msg = bytes(raw)
    for _ in range(25):
        dq.put(msg)
    assert dq.depth() == 25
    os.truncate(fname(tmp_path, 1), 400)  # 3 valid records, 5 lost
    for _ in range(19):  # 8 + 3 + 8
        assert dq.read() == msg
    assert fname(tmp_path, 1).with_name(fname(tmp_path, 1).name + ".bad").exists()
    assert any("unexpected EOF" in m for m in log.at(LogLevel.ERROR))
    assert any("saving bad file as" in m for m in log.at(LogLevel.WARN))
    assert dq.read() == msg  # the one record of file 3
    # depth was never told about the 5 lost records; the tail check fixes it (Go logs it)
    assert dq.depth() == 0
    assert any("positive depth at tail (5), data loss" in m for m in log.at(LogLevel.ERROR))


def test_corrupt_length_renames_bad_and_continues_with_next_file(tmp_path: Path) -> None:
    dq, log = open_dq(tmp_path, max_bytes_per_file=200, write_buffer_size=1)
    payloads = [numbered(i, 40) for i in range(12)]  # 44 bytes each: 4 per file
    dq.put_many(payloads)
    assert data_files(tmp_path) == [fname(tmp_path, i).name for i in range(3)]
    dq.close()
    with open(fname(tmp_path, 1), "r+b") as f:  # second record of file 1: length 0x7fffffff
        f.seek(44)
        f.write(b"\x7f\xff\xff\xff")
    dq, log = open_dq(tmp_path, max_bytes_per_file=200)
    got = dq.read_many(100)
    assert got == payloads[:5] + payloads[8:]
    assert (tmp_path / "test.diskqueue.000001.dat.bad").exists()
    assert any("invalid message read size (2147483647)" in m for m in log.at(LogLevel.ERROR))
    assert dq.depth() == 0  # "positive depth at tail (3)"
    dq.put(b"more")
    assert dq.read() == b"more"


def test_corrupt_current_write_file_moves_writer_to_new_file(tmp_path: Path) -> None:
    """handleReadError on the write file: skip it for writing too."""
    dq, log = open_dq(tmp_path, write_buffer_size=1)
    dq.put(b"first-record")
    dq.put(b"second-record")
    with open(fname(tmp_path, 0), "r+b") as f:
        f.seek(len(rec(b"first-record")))
        f.write(b"\x00\x00\x00\x00")  # length 0 < min_msg_size
    assert dq.read() == b"first-record"
    assert dq.read() is None
    assert (tmp_path / "test.diskqueue.000000.dat.bad").exists()
    assert (dq._write_file_num, dq._write_pos, dq._read_file_num, dq._read_pos) == (1, 0, 1, 0)
    assert dq.depth() == 0
    assert any("invalid message read size (0)" in m for m in log.at(LogLevel.ERROR))
    dq.put(b"third-record")
    assert fname(tmp_path, 1).read_bytes() == rec(b"third-record")
    assert dq.read() == b"third-record"


def test_truncated_record_at_end_of_write_file(tmp_path: Path) -> None:
    """TestDiskQueueCorruption's last part: the last file is cut mid-record."""
    dq, log = open_dq(tmp_path, write_buffer_size=1)
    for i in range(3):
        dq.put(numbered(i, 50))
    os.truncate(fname(tmp_path, 0), 2 * 54 + 20)
    assert dq.depth() == 3
    assert dq.read_many(5) == [numbered(0, 50), numbered(1, 50)]
    assert dq.depth() == 0  # the third record is lost and the depth says so
    assert any("positive depth at tail (1)" in m for m in log.at(LogLevel.ERROR))
    assert (tmp_path / "test.diskqueue.000000.dat.bad").exists()
    dq.put(numbered(3, 50))
    assert dq.read() == numbered(3, 50)


def test_missing_read_file_is_skipped(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=100, write_buffer_size=1)
    dq.put_many([numbered(i, 40) for i in range(6)])  # files 0, 1, 2
    dq.close()
    os.remove(fname(tmp_path, 1))
    dq, log = open_dq(tmp_path, max_bytes_per_file=100)
    assert dq.read_many(10) == [numbered(i, 40) for i in (0, 1, 4, 5)]
    assert any("failed to rename bad diskqueue file" in m for m in log.at(LogLevel.ERROR))


def test_tail_check_fixes_wrong_depth(tmp_path: Path) -> None:
    fname(tmp_path, 0).write_bytes(rec(b"aaaa") + rec(b"bbbb"))
    (tmp_path / "test.diskqueue.meta.dat").write_text("0\n0,0\n0,16\n")
    dq, log = open_dq(tmp_path)
    assert dq.depth() == 1  # the metadata says 0, but records remain: never 0 before they are read
    assert dq.read_many(1) == [b"aaaa"]
    assert dq.depth() == 1  # the count is at -1 now
    assert dq.read_many(5) == [b"bbbb"]
    assert dq.depth() == 0
    assert any(
        "negative depth at tail (-2), metadata corruption" in m for m in log.at(LogLevel.ERROR)
    )


# ---------------------------------------------------------------- stale metadata on startup


def test_stale_meta_starts_new_write_file_and_salvages(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=10_000)
    payloads = [numbered(i) for i in range(8)]
    for p in payloads[:5]:
        dq.put(p)
    dq.sync()  # metadata: depth 5, writePos 170
    for p in payloads[5:]:
        dq.put(p)
    dq.flush()  # the OS has 8 records, the metadata knows 5: then the process dies
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path, crashed, ignore=shutil.ignore_patterns("crashed"))
    dq.delete()

    dq, log = open_dq(crashed, max_bytes_per_file=10_000)
    assert any(
        "metadata writePos 170 < file size of 272, skipping to new file" in m
        for m in log.at(LogLevel.WARN)
    )
    assert (dq._write_file_num, dq._write_pos, dq.depth()) == (1, 0, 5)
    dq.put(numbered(100))
    assert dq.read_many(100) == [*payloads, numbered(100)]
    assert dq.depth() == 0
    assert any("negative depth at tail (-3)" in m for m in log.at(LogLevel.ERROR))
    assert fname(crashed, 0).exists() is False


def test_stale_meta_built_by_hand(tmp_path: Path) -> None:
    recs = [b"r1-payload", b"r2-payload", b"r3-payload"]
    fname(tmp_path, 3).write_bytes(b"".join(map(rec, recs)))
    (tmp_path / "test.diskqueue.meta.dat").write_text("1\n3,0\n3,14\n")
    dq, _ = open_dq(tmp_path)
    assert dq._write_file_num == 4
    assert dq.read_many(10) == recs


def test_meta_older_than_a_file_roll_does_not_overwrite_the_next_file(tmp_path: Path) -> None:
    """Our extension of the stale check (rolls sync lazily, see DiskQueue._roll)."""
    fname(tmp_path, 0).write_bytes(rec(b"file0-a") + rec(b"file0-b"))
    fname(tmp_path, 1).write_bytes(rec(b"file1-a"))
    (tmp_path / "test.diskqueue.meta.dat").write_text("2\n0,0\n0,22\n")
    dq, _ = open_dq(tmp_path, max_bytes_per_file=30)
    assert dq._write_file_num == 2
    dq.put(b"new-record")
    assert dq.read_many(10) == [b"file0-a", b"file0-b", b"file1-a", b"new-record"]


# ---------------------------------------------------------------- empty, close, delete


def test_empty_removes_files(tmp_path: Path) -> None:
    """TestDiskQueueEmpty."""
    dq, log = open_dq(tmp_path, max_bytes_per_file=100, min_msg_size=0)
    msg = bytes(10)
    for i in range(100):
        dq.put(msg)
        assert dq.depth() == i + 1
    for _ in range(3):
        assert dq.read() == msg
    assert dq.depth() == 97
    dq.sync()
    num_files = dq._write_file_num
    dq.empty()
    assert not (tmp_path / "test.diskqueue.meta.dat").exists()
    for i in range(num_files + 1):
        assert not fname(tmp_path, i).exists()
    assert dq.depth() == 0
    assert (dq._read_file_num, dq._read_pos) == (dq._write_file_num, dq._write_pos)
    assert dq._write_file_num == num_files + 1
    for i in range(100):
        dq.put(msg)
        assert dq.depth() == i + 1
    for _ in range(100):
        assert dq.read() == msg
    assert dq.depth() == 0
    assert (dq._read_file_num, dq._read_pos) == (dq._write_file_num, dq._write_pos)
    assert log.problems() == []


def test_read_after_delete_and_close(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path)
    dq.put(b"data")
    dq.empty()
    dq.delete()
    assert list(tmp_path.iterdir()) == []  # Delete does not sync: no metadata comes back
    for op in (dq.read, lambda: dq.read_many(1), lambda: dq.put(b"data"), dq.sync, dq.empty):
        with pytest.raises(DiskQueueError, match="exiting"):
            op()
    dq.delete()
    dq.close()  # both idempotent
    dq, log = open_dq(tmp_path)  # the name can be used again: a fresh queue
    assert (dq.depth(), dq._read_file_num, dq._write_file_num) == (0, 0, 0)
    dq.put(b"again")
    assert dq.read() == b"again"
    dq.empty()
    dq.delete()
    assert list(tmp_path.iterdir()) == []
    assert log.problems() == []

    dq, _ = open_dq(tmp_path)
    dq.put(b"data")
    dq.close()
    dq.close()
    with pytest.raises(DiskQueueError, match="exiting"):
        dq.read()
    assert meta_text(tmp_path) == "1\n0,0\n0,8\n"


# ---------------------------------------------------------------- I/O errors


def test_open_failure_directory_in_place_of_data_file_then_recovery(tmp_path: Path) -> None:
    """A directory where the data file should be: open(O_RDWR) fails even for root."""
    dq, _ = open_dq(tmp_path, write_buffer_size=1)
    fname(tmp_path, 0).mkdir()
    with pytest.raises(
        DiskQueueError, match=r"open .*test\.diskqueue\.000000\.dat: is a directory"
    ):
        dq.put(b"lost")
    assert dq.last_error is not None and "is a directory" in dq.last_error
    assert dq.health == dq.last_error
    assert dq.depth() == 0
    with pytest.raises(DiskQueueError):
        dq.put_many([b"lost", b"lost"])
    assert dq.depth() == 0
    fname(tmp_path, 0).rmdir()
    dq.put(b"kept")
    assert dq.last_error is None
    dq.put_many([b"kep2", b"kep3"])
    assert dq.read_many(10) == [b"kept", b"kep2", b"kep3"]


def test_buffered_records_survive_a_failed_flush(tmp_path: Path) -> None:
    """Records accepted into the buffer stay queued while the disk fails; the failing puts don't."""
    dq, _ = open_dq(tmp_path)  # big buffer: puts do no I/O
    dq.put(b"buffered-1")
    dq.put(b"buffered-2")
    fname(tmp_path, 0).mkdir()
    with pytest.raises(DiskQueueError, match="is a directory"):
        dq.flush()
    with pytest.raises(DiskQueueError):  # unhealthy: each put tries the disk, like Go
        dq.put(b"refused")
    with pytest.raises(DiskQueueError):
        dq.begin_sync()
    assert dq.depth() == 2
    assert dq.needs_sync()
    fname(tmp_path, 0).rmdir()
    dq.put(b"accepted")
    assert dq.last_error is None
    assert fname(tmp_path, 0).read_bytes() == b"".join(
        map(rec, [b"buffered-1", b"buffered-2", b"accepted"])
    )
    assert dq.read_many(10) == [b"buffered-1", b"buffered-2", b"accepted"]


def test_write_failure_enospc_via_dev_full_then_recovery(tmp_path: Path) -> None:
    """/dev/full in place of the data file: open works, every write fails with ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    dq, _ = open_dq(tmp_path, write_buffer_size=1)
    os.symlink("/dev/full", fname(tmp_path, 0))
    with pytest.raises(DiskQueueError, match=r"write .*000000\.dat: no space left on device"):
        dq.put(b"lost")
    assert dq._wfd is None  # writeOne closes the file on a write error
    os.remove(fname(tmp_path, 0))
    dq.put(b"kept")
    assert dq.last_error is None
    assert fname(tmp_path, 0).read_bytes() == rec(b"kept")
    assert dq.read() == b"kept"


def test_write_failure_on_descriptor_closed_underneath(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, write_buffer_size=1)
    dq.put(b"one!")
    assert dq._wfd is not None
    os.close(dq._wfd)  # EBADF on the next write
    with pytest.raises(DiskQueueError, match="bad file descriptor"):
        dq.put(b"lost")
    dq.put(b"two!")  # reopens the path and writes at writePos
    assert fname(tmp_path, 0).read_bytes() == rec(b"one!") + rec(b"two!")
    assert dq.read_many(5) == [b"one!", b"two!"]


def test_put_many_io_failure_rolls_back_across_file_rolls(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=100, write_buffer_size=1)
    first = [numbered(0), numbered(1)]  # 34 bytes each: 2 per file (68; a third needs 102)
    dq.put_many(first)
    fname(tmp_path, 2).mkdir()  # the batch will need files 1 and 2
    batch = [numbered(i) for i in range(2, 8)]
    with pytest.raises(DiskQueueError, match="is a directory"):
        dq.put_many(batch)
    assert (dq._write_file_num, dq._write_pos, dq.depth()) == (0, 68, 2)
    assert fname(tmp_path, 0).read_bytes() == b"".join(map(rec, first))
    assert not fname(tmp_path, 1).exists()  # created by the batch, removed again
    fname(tmp_path, 2).rmdir()
    dq.put_many(batch)
    assert dq.read_many(100) == first + batch
    dq.close()
    assert meta_text(tmp_path) == "0\n3,68\n3,68\n"


def test_put_many_io_failure_without_roll(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, write_buffer_size=1)
    dq.put(b"before")
    os.symlink("/dev/full", fname(tmp_path, 1))  # unused; just proves nothing looks there
    assert dq._wfd is not None
    os.close(dq._wfd)
    with pytest.raises(DiskQueueError):
        dq.put_many([b"batch-1", b"batch-2"])
    assert (dq._write_pos, dq.depth()) == (10, 1)
    dq.put_many([b"batch-3", b"batch-4"])
    assert dq.read_many(10) == [b"before", b"batch-3", b"batch-4"]


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_real_enospc_on_a_full_tmpfs(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "mnt", "64k") as mnt:
        dq, _ = open_dq(mnt, max_bytes_per_file=1 << 20, max_msg_size=1 << 16, write_buffer_size=1)
        filler = mnt / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            f.write(b"\xff" * (60 * 1024))
        payloads: list[bytes] = []
        with pytest.raises(DiskQueueError, match="no space left on device"):
            for i in range(1000):
                p = numbered(i, 1000)
                dq.put(p)
                payloads.append(p)
        assert dq.depth() == len(payloads)
        assert dq.last_error is not None
        filler.unlink()
        dq.put(b"after")
        assert dq.last_error is None
        assert dq.read_many(10_000) == [*payloads, b"after"]
        dq.close()
        assert meta_text(mnt) == f"0\n0,{dq._write_pos}\n0,{dq._write_pos}\n"


# ---------------------------------------------------------------- SyncJob in a thread


def test_sync_job_in_thread_concurrent_with_puts_leaves_consistent_meta(tmp_path: Path) -> None:
    dq, log = open_dq(tmp_path, max_bytes_per_file=2048, write_buffer_size=700)
    pool = ThreadPoolExecutor(max_workers=2)
    futures: list[Future[None]] = []
    issued: list[str] = []
    seq = read = 0
    try:
        for rnd in range(300):
            for _ in range(25):
                dq.put(numbered(seq))
                seq += 1
            if rnd % 3 == 0:
                got = dq.read_many(30)
                assert got == [numbered(i) for i in range(read, read + len(got))]
                read += len(got)
            job = dq.begin_sync()
            depth, rfn, rpos, wfn, wpos = job.snapshot
            issued.append(f"{depth}\n{rfn},{rpos}\n{wfn},{wpos}\n")
            futures.append(pool.submit(job.run))
            # the metadata on disk is always one whole snapshot, never torn or mixed
            meta = tmp_path / "test.diskqueue.meta.dat"
            if meta.exists():
                assert meta.read_text() in issued
        for fut in futures:
            fut.result()
    finally:
        pool.shutdown()
    assert meta_text(tmp_path) == issued[-1]  # the newest snapshot wins, whatever the order
    # "crash" now: a fresh queue from the files on disk finds exactly the unread records
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path, crashed, ignore=shutil.ignore_patterns("crashed"))
    dq2, log2 = open_dq(crashed, max_bytes_per_file=2048)
    assert dq2.depth() == seq - read
    assert dq2.read_many(100_000) == [numbered(i) for i in range(read, seq)]
    assert log2.problems() == []
    assert log.problems() == []


def test_sync_job_after_empty_or_newer_sync_does_not_write(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path)
    dq.put(b"aaaa")
    old = dq.begin_sync()
    dq.put(b"bbbb")
    new = dq.begin_sync()
    new.run()
    old.run()
    assert meta_text(tmp_path) == "2\n0,0\n0,16\n"
    stale = dq.begin_sync()
    dq.empty()
    stale.run()  # would resurrect metadata pointing at deleted files
    assert not (tmp_path / "test.diskqueue.meta.dat").exists()
    stale.run()  # a job runs once
    dq.begin_sync().discard()
    assert dq.needs_sync()


def test_sync_job_survives_roll_and_close_on_the_loop(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=64)
    dq.put(numbered(0))
    job = dq.begin_sync()
    for i in range(1, 6):  # each put rolls: the loop retires the descriptor the job duplicated
        dq.put(numbered(i))
    dq.close()
    job.run()  # older than close()'s sync: must not overwrite it
    assert meta_text(tmp_path) == "6\n0,0\n5,34\n"  # 34-byte records: one per 64-byte file


# ---------------------------------------------------------------- model-based


class _Ops:
    put = st.tuples(st.just("put"), st.integers(4, 120))
    put_many = st.tuples(st.just("put_many"), st.lists(st.integers(4, 120), max_size=8))
    read = st.tuples(st.just("read"), st.just(0))
    read_many = st.tuples(st.just("read_many"), st.integers(0, 20))
    sync = st.tuples(st.just("sync"), st.just(0))
    flush = st.tuples(st.just("flush"), st.just(0))
    reopen = st.tuples(st.just("reopen"), st.just(0))
    any = st.one_of(put, put_many, read, read_many, sync, flush, reopen)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(_Ops.any, max_size=80),
    max_bytes=st.integers(30, 400),
    wbuf=st.integers(1, 300),
    chunk=st.integers(1, 300),
)
def test_behaves_like_a_fifo(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, object]],
    max_bytes: int,
    wbuf: int,
    chunk: int,
) -> None:
    path = tmp_path_factory.mktemp("fifo")
    log = Log()

    def mk() -> DiskQueue:
        return open_dq(
            path,
            max_bytes_per_file=max_bytes,
            write_buffer_size=wbuf,
            read_chunk_size=chunk,
            log=log,
        )[0]

    dq = mk()
    model: deque[bytes] = deque()
    n = 0
    for op, arg in ops:
        if op == "put":
            assert isinstance(arg, int)
            dq.put(numbered(n, arg))
            model.append(numbered(n, arg))
            n += 1
        elif op == "put_many":
            assert isinstance(arg, list)
            batch = [numbered(n + i, s) for i, s in enumerate(arg)]
            n += len(arg)
            dq.put_many(batch)
            model.extend(batch)
        elif op == "read":
            assert dq.read() == (model.popleft() if model else None)
        elif op == "read_many":
            assert isinstance(arg, int)
            k = min(arg, len(model))
            assert dq.read_many(arg) == [model.popleft() for _ in range(k)]
        elif op == "sync":
            dq.sync()
        elif op == "flush":
            dq.flush()
        else:
            dq.close()
            dq = mk()
        assert dq.depth() == len(model)
    assert dq.read_many(10_000) == list(model)
    dq.close()
    assert log.problems() == []
    assert len(data_files(path)) <= 1
    shutil.rmtree(path)
