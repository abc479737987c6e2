"""DiskQueue.hold_reads: reads held until their messages are finished.

A channel's disk queue saves, as its read position, the start of the oldest read whose
message is not finished yet (in flight, requeued, deferred), and keeps its files until
then; a kill -9 followed by a restart reads from there again: every unfinished record comes
back, and nothing finished before that read does. The metadata keeps go-diskqueue's format
(a Go nsqd on the same data path reads the same records again).

A "kill -9" here is a reopen from what the last sync persisted, without close().
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.diskqueue import DiskQueue
from tests.unit.test_diskqueue import data_files, meta_text, numbered, open_dq


class Holder:
    """What a channel does: remembers each read record's sequence number until finished."""

    def __init__(self, dq: DiskQueue) -> None:
        self.dq = dq
        self.unfinished: dict[int, int] = {}  # record number -> sequence number
        self.batches: list[int] = []  # each read's first sequence number
        dq.hold_reads(self.floor)

    def floor(self) -> int:
        return min(self.unfinished.values(), default=self.dq.read_seq)

    def read(self, n: int) -> list[int]:
        seq = self.dq.read_seq
        got = [int.from_bytes(r[:4], "big") for r in self.dq.read_many(n)]
        if got:
            self.batches.append(seq)
        for i, number in enumerate(got):
            self.unfinished[number] = seq + i
        return got

    def finish(self, number: int) -> None:
        del self.unfinished[number]

    def restart_point(self) -> int:
        """Where a restart reads from: the start of the read (batch) that holds the oldest
        unfinished record, else the first record not read."""
        if not self.unfinished:
            return self.dq.read_seq
        floor = min(self.unfinished.values())
        return max(b for b in self.batches if b <= floor)


def crash_and_reopen(path: Path, dq: DiskQueue, **kw: int) -> DiskQueue:
    """kill -9: the files and the last persisted metadata stay as they are."""
    dq._close_all_files()
    reopened, _ = open_dq(path, **kw)
    return reopened


def read_all(dq: DiskQueue) -> list[int]:
    out = []
    while (r := dq.read()) is not None:
        out.append(int.from_bytes(r[:4], "big"))
    return out


def test_sync_saves_the_oldest_unfinished_read(tmp_path: Path) -> None:
    dq, log = open_dq(tmp_path, max_bytes_per_file=200)
    dq.put_many([numbered(i) for i in range(40)])  # 34-byte records, 5 to a file
    holder = Holder(dq)
    assert holder.read(3) == [0, 1, 2]
    assert holder.read(10) == list(range(3, 13))  # a batch over three files
    for i in (0, 1, 2, 3, 4, 6):
        holder.finish(i)
    dq.sync()
    # the batch with record 5, the oldest unfinished, starts at record 3 (file 0, at 102)
    assert meta_text(tmp_path) == "37\n0,102\n7,170\n"
    assert len(data_files(tmp_path)) == 8  # files 0 and 1 kept, read to their end or not
    dq = crash_and_reopen(tmp_path, dq, max_bytes_per_file=200)
    assert read_all(dq) == list(range(3, 40))
    assert not log.problems()


def test_files_go_once_nothing_held_is_in_them(tmp_path: Path) -> None:
    dq, log = open_dq(tmp_path, max_bytes_per_file=200)
    dq.put_many([numbered(i) for i in range(20)])  # files 0-3, 5 records each
    dq.flush()
    holder = Holder(dq)
    for _ in range(12):
        holder.read(1)
    # files 0 and 1 were read to their end: kept, record 0 is held
    assert len(data_files(tmp_path)) == 4
    for i in range(1, 12):
        holder.finish(i)
    dq.sync()
    assert len(data_files(tmp_path)) == 4
    holder.finish(0)
    dq.sync()
    assert data_files(tmp_path) == ["test.diskqueue.000002.dat", "test.diskqueue.000003.dat"]
    assert meta_text(tmp_path) == "8\n2,68\n3,170\n"
    assert not log.problems()


def test_release_all_and_dirty(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=200)
    dq.put_many([numbered(i) for i in range(10)])
    holder = Holder(dq)
    holder.read(3)
    holder.read(4)
    dq.sync()
    assert not dq.dirty()
    holder.finish(1)
    assert not dq.dirty()  # the oldest read held is the same
    holder.finish(0)
    holder.finish(2)
    assert dq.dirty()  # it moved on: the --sync-timeout ticker saves that
    dq.sync()
    assert meta_text(tmp_path) == "7\n0,102\n1,170\n"
    assert not dq.dirty()
    dq.release_all()  # (a graceful exit wrote them back)
    assert dq.dirty()
    dq.sync()
    assert not dq.dirty()
    assert meta_text(tmp_path) == "3\n1,68\n1,170\n"
    assert data_files(tmp_path) == ["test.diskqueue.000001.dat"]


def test_without_hold_reads_a_read_is_final(tmp_path: Path) -> None:
    dq, _ = open_dq(tmp_path, max_bytes_per_file=200)
    dq.put_many([numbered(i) for i in range(10)])
    assert len(dq.read_many(7)) == 7
    dq.sync()
    assert meta_text(tmp_path) == "3\n1,68\n1,170\n"
    assert data_files(tmp_path) == ["test.diskqueue.000001.dat"]


def test_empty_forgets_held_reads(tmp_path: Path) -> None:
    dq, log = open_dq(tmp_path, max_bytes_per_file=200)
    dq.put_many([numbered(i) for i in range(10)])
    holder = Holder(dq)
    holder.read(7)
    dq.empty()
    holder.unfinished.clear()
    dq.put(numbered(99))
    dq.sync()
    assert len(data_files(tmp_path)) == 1
    dq = crash_and_reopen(tmp_path, dq, max_bytes_per_file=200)
    assert read_all(dq) == [99]
    assert not log.problems()


@settings(max_examples=150, deadline=None)
@given(data=st.data(), max_bytes=st.sampled_from([64, 200, 1024]))
def test_a_crash_after_any_steps_gives_back_every_unfinished_record(
    data: st.DataObject, max_bytes: int
) -> None:
    """Random writes, batched reads, finishes in any order and syncs, then a crash: the
    reopened queue reads, in order and once each, every record from the oldest unfinished
    (or the first unread) on: every unfinished and unread one, and no record finished
    before the oldest unfinished one; its depth counts them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        dq, log = open_dq(path, max_bytes_per_file=max_bytes)
        holder = Holder(dq)
        written = 0  # records are numbered in write order, so a record's number is its seq
        for _ in range(data.draw(st.integers(1, 40), label="steps")):
            step = data.draw(st.sampled_from(["put", "read", "finish", "sync"]), label="step")
            if step == "put":
                n = data.draw(st.integers(1, 8), label="put")
                dq.put_many([numbered(written + i) for i in range(n)])
                written += n
            elif step == "read":
                holder.read(data.draw(st.integers(1, 10), label="read"))
            elif step == "finish" and holder.unfinished:
                holder.finish(data.draw(st.sampled_from(sorted(holder.unfinished)), label="fin"))
            elif step == "sync":
                dq.sync()
        dq.sync()
        first = holder.restart_point()
        dq = crash_and_reopen(path, dq, max_bytes_per_file=max_bytes)
        assert dq.depth() == written - first
        assert read_all(dq) == list(range(first, written))
        assert not log.problems(), log.problems()
