"""The source's write-ahead log: what each read task took from nsqd, durable before any FIN.

Layout under ``walLocation`` (a local or shared POSIX path every executor and the driver see)::

    <run>/<batch>/<partition>/seg-<uuid>.arrow       rows, Arrow IPC file (tmp, fsync, rename):
                                                     id, timestamp, attempts, body (topic,
                                                     channel and nsqd are the partition's)
    <run>/RUN                                        created when the run plans its first
                                                     batch: a run without it lost its log
    <run>/<batch>/<partition>/SEALED                 {"segments", "rows", "nsqd", "topic"}:
                                                     created once
    <run>/<batch>/<partition>/FINNED                 {"failed": [ids]}: after nsqd confirmed
    unconfirmed/<run>-<batch>-<partition>.json       ids whose FIN was never confirmed, kept
                                                     after garbage collection for dedupe

``SEALED`` is created with ``link()`` (atomic create-if-absent): the first attempt to seal a
partition wins, a later or concurrent attempt (retry, speculation, zombie) replays the winner
and requeues what it read itself. A sealed partition is never read from nsqd again.

**Unconfirmed ids.** A task can die after sealing and before nsqd confirmed its FINs, or a FIN
can fail because the message had timed out. nsqd then redelivers those messages (``attempts >
1``) although they are already in the log; a read task FINs and drops them. They are: the rows
of a sealed partition without ``FINNED``, the ``failed`` ids of ``FINNED``, and the files in
``unconfirmed/`` (garbage collection moves them there before deleting a batch). Keys include
the nsqd address and the topic, because two nsqd, or two topics of one nsqd (each has its own
id sequence), can hand out the same id.

**A write that fails** (a full or read-only file system) raises :class:`LogWriteError`,
worded as Go's ``write <file>: no space left on device``, and leaves nothing half written: the
temporary file is removed, so a segment or seal that failed is simply not there. A partition
whose segment or seal could not be written was never sealed, so none of it was FIN'd: its
messages come back from nsqd, and it is not data loss.

**Data loss.** A log lost or damaged between runs (a run's directory gone, a seal that is not
JSON, a sealed segment missing or unreadable, fewer rows than sealed) is reported by
:meth:`WAL.lost`: a :class:`DataLossError` with ``failOnDataLoss`` (the default), else a
warning, and the reader goes on with what is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped]

from nsqpy.diskqueue.diskqueue import go_error
from nsqpy.spark._schema import SEGMENT_SCHEMA, with_constants

__all__ = [
    "WAL",
    "DataLossError",
    "LogWriteError",
    "Seal",
    "UnconfirmedKey",
    "report_loss",
    "writing",
]

log = logging.getLogger("nsqpy.spark")

SEALED: Final = "SEALED"
FINNED: Final = "FINNED"
UNCONFIRMED: Final = "unconfirmed"
RUN: Final = "RUN"
_TRASH_PREFIX: Final = ".trash-"

UnconfirmedKey = tuple[str, str, bytes]  # (nsqd TCP address, topic, 16-byte message id)

_WHAT: Final = "nsq write-ahead log"
_ADVICE: Final = " (the option failOnDataLoss=false logs this and goes on instead)"


class DataLossError(RuntimeError):
    """The write-ahead log (or the sink's markers) was lost or damaged between runs."""


class LogWriteError(OSError):
    """Writing the log (or the sink's markers) failed, e.g. the file system is full. The
    message names the file as Go's errors do (``nsq write-ahead log: write <file>: no space
    left on device``); ``errno`` and ``filename`` are the cause's."""

    def __init__(self, errno: int | None, message: str, filename: str) -> None:
        super().__init__(errno, message, filename)  # OSError's order: pickles as it is
        self.message = message

    def explained(self, why: str) -> LogWriteError:
        """The same error, followed by ``why`` (what it means for the data)."""
        return LogWriteError(self.errno, f"{self.message} ({why})", self.filename)

    def __str__(self) -> str:
        return self.message


@contextlib.contextmanager
def writing(what: str, path: str, *partial: str) -> Iterator[None]:
    """Turn an ``OSError`` of the block into a :class:`LogWriteError` (``<what>: write
    <path>: <cause>``), after removing the ``partial`` files it may have left half written:
    a file that failed is never read as data, nor taken for a damaged one."""
    try:
        yield
    except LogWriteError:
        raise
    except OSError as err:
        for leftover in partial:
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        op = "open" if err.filename is not None else "write"
        raise LogWriteError(err.errno, f"{what}: {go_error(op, path, err)}", path) from err


def report_loss(message: str, fail: bool) -> None:
    """The option ``failOnDataLoss``: raise :class:`DataLossError` (``fail``), or log a
    warning and let the caller go on."""
    if fail:
        raise DataLossError(message + _ADVICE)
    log.warning("%s; going on (failOnDataLoss=false)", message)


@dataclass(frozen=True)
class Seal:
    """The contents of a partition's ``SEALED`` marker (``topic`` "" in seals written before a
    query could read several topics: the query's one topic)."""

    segments: tuple[str, ...]
    rows: int
    nsqd: str
    topic: str = ""


class WAL:
    """Access to one ``walLocation``. Cheap to create; holds no open files."""

    def __init__(self, root: str, *, fsync: bool = True, fail_on_data_loss: bool = True) -> None:
        self.root = root
        self.fsync = fsync
        self.fail_on_data_loss = fail_on_data_loss

    def lost(self, what: str) -> None:
        """Report lost or damaged log data: raise, or log and go on (``failOnDataLoss``)."""
        report_loss(f"nsq write-ahead log {self.root}: {what}", self.fail_on_data_loss)

    # -- runs -------------------------------------------------------------------------------

    def start_run(self, run: str) -> None:
        """Mark ``run`` as started (before its first batch is planned), durably."""
        rdir = os.path.join(self.root, run)
        if os.path.exists(os.path.join(rdir, RUN)):
            return
        with writing(_WHAT, rdir):
            os.makedirs(rdir, exist_ok=True)
            self._write_file(os.path.join(rdir, RUN), b"")
            self._sync_dir(rdir)
            self._sync_dir(self.root)

    def check_run(self, run: str) -> None:
        """A run that planned batches must still have its log; else report the loss and mark
        the run started again."""
        if os.path.exists(os.path.join(self.root, run, RUN)):
            return
        self.lost(f"the log of run {run} is gone (deleted, or another walLocation)")
        self.start_run(run)

    # -- paths ------------------------------------------------------------------------------

    def partition_dir(self, run: str, batch: int, index: int) -> str:
        return os.path.join(self.root, run, str(batch), str(index))

    # -- writing ----------------------------------------------------------------------------

    def _write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in full (and fsync it when configured); if that fails,
        ``path`` is removed and :class:`LogWriteError` names it."""
        with writing(_WHAT, path, path), open(path, "wb") as f:
            f.write(data)
            self._sync_file(f)

    def _sync_file(self, f: Any) -> None:
        f.flush()
        if self.fsync:
            os.fsync(f.fileno())

    def _sync_dir(self, path: str) -> None:
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def new_segment_name() -> str:
        return f"seg-{uuid.uuid4().hex}.arrow"

    def write_segment(self, pdir: str, batch: Any, name: str | None = None) -> str:
        """Write ``batch`` (:data:`~nsqpy.spark._schema.SEGMENT_SCHEMA`, or ``ARROW_SCHEMA``'s
        first columns) as a new segment of the partition (named ``name``, or a new name),
        straight from its Arrow buffers to the file; returns its file name."""
        if name is None:
            name = self.new_segment_name()
        tmp = os.path.join(pdir, f".{name}.tmp")
        segment = pa.RecordBatch.from_arrays(batch.columns[:4], schema=SEGMENT_SCHEMA)
        with writing(_WHAT, tmp, tmp):
            os.makedirs(pdir, exist_ok=True)
            with open(tmp, "wb") as f:
                with pa.ipc.new_file(f, SEGMENT_SCHEMA) as writer:
                    writer.write_batch(segment)
                self._sync_file(f)
            os.rename(tmp, os.path.join(pdir, name))
        return name

    def seal(self, pdir: str, segments: list[str], rows: int, nsqd: str, topic: str = "") -> bool:
        """Create ``SEALED`` (the partition is exactly ``segments``) unless it exists; True if
        this call created it. :class:`LogWriteError`: the seal could not be written, and the
        partition is not sealed."""
        tmp = os.path.join(pdir, f".seal-{uuid.uuid4().hex}.tmp")
        body = {"v": 1, "segments": segments, "rows": rows, "nsqd": nsqd, "topic": topic}
        with writing(_WHAT, pdir):
            os.makedirs(pdir, exist_ok=True)
        self._write_file(tmp, json.dumps(body).encode())
        try:
            won = _link(tmp, os.path.join(pdir, SEALED))
        finally:
            os.unlink(tmp)
        self._sync_dir(pdir)
        return won

    def mark_finned(self, pdir: str, failed: list[bytes]) -> None:
        """Record that nsqd confirmed the FINs of the partition, except ``failed``."""
        tmp = os.path.join(pdir, f".finned-{uuid.uuid4().hex}.tmp")
        self._write_file(tmp, json.dumps({"failed": [i.decode("ascii") for i in failed]}).encode())
        with writing(_WHAT, os.path.join(pdir, FINNED), tmp):
            os.rename(tmp, os.path.join(pdir, FINNED))

    # -- reading ----------------------------------------------------------------------------

    def read_seal(self, pdir: str) -> Seal | None:
        """The partition's seal; None if it has none. A damaged seal is :meth:`lost` (going
        on, the partition replays as empty: its seal exists, so it is never read again), as is
        a partition whose FINs were confirmed but whose seal is gone (going on, it is read)."""
        try:
            with open(os.path.join(pdir, SEALED), "rb") as f:
                data = json.load(f)
            segments = tuple(str(s) for s in data.get("segments") or ())
            return Seal(
                segments,
                int(data.get("rows", 0)),
                str(data.get("nsqd", "")),
                str(data.get("topic", "")),
            )
        except FileNotFoundError:
            if os.path.exists(os.path.join(pdir, FINNED)):
                self.lost(f"{pdir}: FIN'd messages whose seal is gone")
            return None
        except (ValueError, TypeError, AttributeError) as err:
            self.lost(f"{pdir}: a damaged seal ({err})")
            return Seal((), 0, "")

    def replay(
        self,
        pdir: str,
        seal: Seal,
        topic: str,
        channel: str,
        columns: tuple[str, ...] | None = None,
    ) -> Iterator[Any]:
        """The sealed rows of a partition, exactly as first read (``columns`` of them).

        A missing or unreadable segment, or fewer rows than sealed, is :meth:`lost`: the
        rows that are left are replayed."""
        rows = 0
        for name in seal.segments:
            try:
                batches = list(self._read_segment(pdir, name))
            except (OSError, pa.ArrowInvalid) as err:
                self.lost(f"{pdir}: sealed segment {name} cannot be read ({err})")
                continue
            for batch in batches:
                rows += batch.num_rows
                yield with_constants(batch, topic, channel, seal.nsqd, columns)
        if rows != seal.rows:
            self.lost(f"{pdir}: {rows} rows where {seal.rows} were sealed")

    def _read_segment(self, pdir: str, name: str) -> Iterator[Any]:
        with pa.memory_map(os.path.join(pdir, name), "r") as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def _segments(self, pdir: str, seal: Seal) -> Iterator[Any]:
        for segment in seal.segments:
            yield from self._read_segment(pdir, segment)

    def sealed_counts(self, run: str, batch: int, topic: str = "") -> dict[tuple[str, str], int]:
        """Rows read per (topic, nsqd) by the sealed partitions of one batch (``topic``: for
        seals that name none)."""
        counts: dict[tuple[str, str], int] = {}
        bdir = os.path.join(self.root, run, str(batch))
        for name in _listdir(bdir):
            seal = self.read_seal(os.path.join(bdir, name))
            if seal is not None:
                key = (seal.topic or topic, seal.nsqd)
                counts[key] = counts.get(key, 0) + seal.rows
        return counts

    def _segment_ids(self, pdir: str, seal: Seal) -> list[bytes]:
        ids: list[bytes] = []
        try:
            for batch in self._segments(pdir, seal):
                ids.extend(s.encode("ascii") for s in batch.column(0).to_pylist())
        except FileNotFoundError:
            pass  # a partition being garbage collected; its ids were moved first
        return ids

    def _partition_unconfirmed(self, pdir: str) -> tuple[str, str, list[bytes]] | None:
        """The nsqd, topic and unconfirmed ids of one partition, if any."""
        seal = self.read_seal(pdir)
        if seal is None:
            return None
        try:
            with open(os.path.join(pdir, FINNED), "rb") as f:
                failed = [str(i).encode("ascii") for i in json.load(f).get("failed") or []]
            return (seal.nsqd, seal.topic, failed) if failed else None
        except FileNotFoundError:
            ids = self._segment_ids(pdir, seal)
            return (seal.nsqd, seal.topic, ids) if ids else None

    def unconfirmed(self) -> set[UnconfirmedKey]:
        """Every ``(nsqd, topic, id)`` that is in the log but whose FIN was not confirmed
        (topic "": logged before seals named their topic)."""
        keys: set[UnconfirmedKey] = set()
        udir = os.path.join(self.root, UNCONFIRMED)
        for name in _listdir(udir):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(udir, name), "rb") as f:
                    data = json.load(f)
            except FileNotFoundError:
                continue
            except ValueError as err:
                self.lost(f"unconfirmed/{name} is damaged ({err}): redeliveries may repeat")
                continue
            nsqd, topic = str(data.get("nsqd", "")), str(data.get("topic", ""))
            keys.update((nsqd, topic, str(i).encode("ascii")) for i in data.get("ids") or [])
        for run in _listdir(self.root):
            if run == UNCONFIRMED:
                continue
            rdir = os.path.join(self.root, run)
            for batch in _listdir(rdir):
                if not batch.isdigit():
                    continue
                bdir = os.path.join(rdir, batch)
                for index in _listdir(bdir):
                    found = self._partition_unconfirmed(os.path.join(bdir, index))
                    if found is not None:
                        keys.update((found[0], found[1], i) for i in found[2])
        return keys

    # -- garbage collection -----------------------------------------------------------------

    def collect_garbage(self, run: str, upto_batch: int, retention: float) -> None:
        """Delete batches ``<= upto_batch`` of ``run`` (moving their unconfirmed ids to
        ``unconfirmed/`` first) and unconfirmed files older than ``retention`` seconds.

        Idempotent; never acknowledges anything.
        """
        rdir = os.path.join(self.root, run)
        for name in _listdir(rdir, include_hidden=True):
            path = os.path.join(rdir, name)
            if name.startswith(_TRASH_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
            elif name.isdigit() and int(name) <= upto_batch:
                self._delete_batch(run, name)
        self._expire_unconfirmed(retention)

    def collect_stale_runs(self, prefix: str, age: float, retention: float) -> None:
        """Delete whole runs named ``prefix*`` not modified for ``age`` seconds (batch reads)."""
        now = time.time()
        for run in _listdir(self.root):
            if not run.startswith(prefix):
                continue
            rdir = os.path.join(self.root, run)
            try:
                if now - os.stat(rdir).st_mtime < age:
                    continue
            except FileNotFoundError:
                continue
            for batch in _listdir(rdir):
                self._delete_batch(run, batch)
            with contextlib.suppress(OSError):
                shutil.rmtree(rdir)
        self._expire_unconfirmed(retention)

    def _delete_batch(self, run: str, batch: str) -> None:
        rdir = os.path.join(self.root, run)
        bdir = os.path.join(rdir, batch)
        for index in _listdir(bdir):
            self._move_unconfirmed(run, batch, index)
        # Rename first: a scan never sees a half-deleted partition as "sealed, not finned".
        trash = os.path.join(rdir, f"{_TRASH_PREFIX}{batch}-{uuid.uuid4().hex}")
        try:
            os.rename(bdir, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def _move_unconfirmed(self, run: str, batch: str, index: str) -> None:
        udir = os.path.join(self.root, UNCONFIRMED)
        target = os.path.join(udir, f"{run}-{batch}-{index}.json")
        if os.path.exists(target):
            return
        found = self._partition_unconfirmed(os.path.join(self.root, run, batch, index))
        if found is None:
            return
        os.makedirs(udir, exist_ok=True)
        tmp = os.path.join(udir, f".{uuid.uuid4().hex}.tmp")
        body = {"nsqd": found[0], "topic": found[1], "ids": [i.decode("ascii") for i in found[2]]}
        self._write_file(tmp, json.dumps(body).encode())
        with writing(_WHAT, target, tmp):
            os.rename(tmp, target)
        log.info("nsq wal: %d unconfirmed ids of %s/%s/%s kept", len(found[2]), run, batch, index)

    def _expire_unconfirmed(self, retention: float) -> None:
        udir = os.path.join(self.root, UNCONFIRMED)
        cutoff = time.time() - retention
        for name in _listdir(udir, include_hidden=True):
            path = os.path.join(udir, name)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_mtime < cutoff:
                    os.unlink(path)


def _link(source: str, target: str) -> bool:
    """``link(2)`` ``source`` to ``target`` unless ``target`` exists (atomic create-if-absent):
    True if this call created it."""
    with writing(_WHAT, target):
        try:
            os.link(source, target)
        except FileExistsError:
            return False
    return True


def _listdir(path: str, *, include_hidden: bool = False) -> list[str]:
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if include_hidden or not n.startswith("."))
