"""The write-ahead log: segments, seals (first wins), unconfirmed ids, garbage collection."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from nsqpy.spark._conn import Columns
from nsqpy.spark._schema import ARROW_SCHEMA, SCHEMA, columns_of, to_record_batch
from nsqpy.spark._sink import _complete_marker, _reserve_marker
from nsqpy.spark._wal import WAL, LogWriteError


def _batch(ids: list[bytes]) -> Any:
    cols = Columns()
    for i, msg_id in enumerate(ids):
        cols.append(msg_id, 1_700_000_000_123_456_789 + i, 1, b"body-%d" % i)
    return to_record_batch(cols, "t", "c", "n:1")


def _ids(n: int, prefix: str = "a") -> list[bytes]:
    return [f"{prefix}{i:015x}".encode() for i in range(n)]


def test_record_batch_schema_and_values() -> None:
    batch = _batch(_ids(2))
    assert batch.schema.equals(ARROW_SCHEMA)
    row = batch.to_pylist()[1]
    assert row["id"] == _ids(2)[1].decode()
    assert row["timestamp"].timestamp() == 1_700_000_000.123456
    assert (row["attempts"], row["body"], row["topic"], row["nsqd"]) == (1, b"body-1", "t", "n:1")


def test_segment_seal_replay(tmp_path: Path) -> None:
    wal = WAL(str(tmp_path))
    pdir = wal.partition_dir("r", 1, 0)
    batch = _batch(_ids(5))
    segment = wal.write_segment(pdir, batch)
    other = wal.write_segment(pdir, _batch(_ids(2, "b")))
    assert wal.seal(pdir, [segment, other], 7, "n:1")
    seal = wal.read_seal(pdir)
    assert seal is not None and (seal.segments, seal.rows, seal.nsqd) == (
        (segment, other),
        7,
        "n:1",
    )
    replayed = list(wal.replay(pdir, seal, "t", "c"))
    assert len(replayed) == 2 and replayed[0].equals(batch)
    assert wal.sealed_counts("r", 1, "t") == {("t", "n:1"): 7}
    assert not [n for n in os.listdir(pdir) if n.endswith(".tmp")]


def test_first_seal_wins(tmp_path: Path) -> None:
    wal = WAL(str(tmp_path))
    pdir = wal.partition_dir("r", 1, 0)
    first = wal.write_segment(pdir, _batch(_ids(3, "a")))
    second = wal.write_segment(pdir, _batch(_ids(3, "b")))
    assert wal.seal(pdir, [first], 3, "n:1")
    assert not wal.seal(pdir, [second], 3, "n:1")
    seal = wal.read_seal(pdir)
    assert seal is not None and seal.segments == (first,)


def test_unconfirmed_ids_and_garbage_collection(tmp_path: Path) -> None:
    wal = WAL(str(tmp_path))
    # batch 1: sealed, FINs confirmed except one; batch 2: sealed, never finned;
    # batch 3: a segment without a seal (an attempt that died before sealing).
    p1 = wal.partition_dir("r", 1, 0)
    wal.seal(p1, [wal.write_segment(p1, _batch(_ids(3, "a")))], 3, "n:1")
    wal.mark_finned(p1, [_ids(3, "a")[1]])
    p2 = wal.partition_dir("r", 2, 0)
    wal.seal(p2, [wal.write_segment(p2, _batch(_ids(2, "b")))], 2, "n:1")
    p3 = wal.partition_dir("r", 3, 0)
    wal.write_segment(p3, _batch(_ids(2, "c")))
    expected = {("n:1", "", _ids(3, "a")[1])} | {("n:1", "", i) for i in _ids(2, "b")}
    assert wal.unconfirmed() == expected

    wal.collect_garbage("r", 2, retention=3600)
    assert sorted(os.listdir(tmp_path / "r")) == ["3"]
    assert sorted(os.listdir(tmp_path / "unconfirmed")) == ["r-1-0.json", "r-2-0.json"]
    assert wal.unconfirmed() == expected
    wal.collect_garbage("r", 2, retention=3600)  # idempotent
    assert wal.unconfirmed() == expected

    old = time.time() - 7200
    for name in os.listdir(tmp_path / "unconfirmed"):
        os.utime(tmp_path / "unconfirmed" / name, (old, old))
    wal.collect_garbage("r", 2, retention=3600)
    assert wal.unconfirmed() == set()


def test_empty_seal(tmp_path: Path) -> None:
    wal = WAL(str(tmp_path))
    pdir = wal.partition_dir("r", 1, 0)
    assert wal.seal(pdir, [], 0, "n:1")
    seal = wal.read_seal(pdir)
    assert seal is not None and list(wal.replay(pdir, seal, "t", "c")) == []
    assert wal.unconfirmed() == set()


def _struct(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields])


def test_columns_of_a_user_schema() -> None:
    assert columns_of(SCHEMA) is None  # the source's own: every column
    assert columns_of(_struct(("body", BinaryType()), ("id", StringType()))) == ("body", "id")
    for schema, error in (
        (_struct(("id", StringType()), ("key", StringType())), "has no column 'key'"),
        (
            _struct(
                ("body", StringType()),
            ),
            "column 'body' of the nsq source is binary, not string",
        ),
        (_struct(("id", StringType()), ("id", StringType())), "repeats a column"),
        (StructType([]), "at least one column"),
    ):
        with pytest.raises(ValueError, match=error):
            columns_of(schema)


def test_segment_replay_with_columns(tmp_path: Path) -> None:
    wal = WAL(str(tmp_path))
    pdir = wal.partition_dir("r", 1, 0)
    ids = _ids(3)
    assert wal.seal(pdir, [wal.write_segment(pdir, _batch(ids))], 3, "n:1")
    seal = wal.read_seal(pdir)
    assert seal is not None
    (batch,) = wal.replay(pdir, seal, "t", "c", ("nsqd", "body", "id"))
    assert batch.schema.names == ["nsqd", "body", "id"]
    assert batch.column("id").to_pylist() == [i.decode() for i in ids]
    assert batch.column("nsqd").to_pylist() == ["n:1"] * 3
    assert batch.column("body").to_pylist() == [b"body-0", b"body-1", b"body-2"]


def _no_space(*_: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_failed_write_names_the_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (fsync refused): LogWriteError ``write <file>: no space left on device``,
    no temporary file left, no segment, no seal; once there is room the partition seals."""
    wal = WAL(str(tmp_path))
    pdir = wal.partition_dir("r", 1, 0)
    monkeypatch.setattr(os, "fsync", _no_space)
    with pytest.raises(LogWriteError, match=rf"^nsq write-ahead log: write {pdir}/\.seg-\w+"
                       r"\.arrow\.tmp: no space left on device$") as err:  # fmt: skip
        wal.write_segment(pdir, _batch(_ids(3)))
    assert err.value.errno == errno.ENOSPC
    with pytest.raises(LogWriteError, match=r"/\.seal-\w+\.tmp: no space left on device$"):
        wal.seal(pdir, [], 0, "n:1")
    assert os.listdir(pdir) == []
    assert wal.read_seal(pdir) is None  # not sealed, not damaged: read from nsqd again
    monkeypatch.undo()
    assert wal.seal(pdir, [wal.write_segment(pdir, _batch(_ids(3)))], 3, "n:1")


def test_sink_marker_room_is_taken_before_publishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker's file is reserved before the first publish and completed in place."""
    path = str(tmp_path / "7" / "0")
    pending = _reserve_marker(path)
    size = os.path.getsize(pending)
    _complete_marker(pending, path, 12345)
    assert os.path.getsize(path) == size and int(Path(path).read_bytes()) == 12345
    assert os.listdir(tmp_path / "7") == ["0"]
    monkeypatch.setattr(os, "fsync", _no_space)
    with pytest.raises(LogWriteError, match=r"^nsq sink markers: write .*/8/0\.\w+\.tmp: no space"):
        _reserve_marker(str(tmp_path / "8" / "0"))
    assert os.listdir(tmp_path / "8") == []
