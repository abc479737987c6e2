"""The source's write-ahead log: what each read task took from nsqd, durable before any FIN.

Layout under ``walLocation`` (a local or shared POSIX path every executor and the driver see)::

    <run>/<batch>/<partition>/seg-<uuid>.arrow       rows, Arrow IPC file (tmp, fsync, rename):
                                                     id, timestamp, attempts, body (topic,
                                                     channel and nsqd are the partition's)
    <run>/<batch>/<partition>/SEALED                 {"segments", "rows", "nsqd"}: created once
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
the nsqd address, because two nsqd can hand out the same id.
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

from nsqpy.spark._schema import SEGMENT_SCHEMA, with_constants

__all__ = ["WAL", "Seal", "UnconfirmedKey"]

log = logging.getLogger("nsqpy.spark")

SEALED: Final = "SEALED"
FINNED: Final = "FINNED"
UNCONFIRMED: Final = "unconfirmed"
_TRASH_PREFIX: Final = ".trash-"

UnconfirmedKey = tuple[str, bytes]  # (nsqd TCP address, 16-byte message id)


@dataclass(frozen=True)
class Seal:
    """The contents of a partition's ``SEALED`` marker."""

    segments: tuple[str, ...]
    rows: int
    nsqd: str


class WAL:
    """Access to one ``walLocation``. Cheap to create; holds no open files."""

    def __init__(self, root: str, *, fsync: bool = True) -> None:
        self.root = root
        self.fsync = fsync

    # -- paths ------------------------------------------------------------------------------

    def partition_dir(self, run: str, batch: int, index: int) -> str:
        return os.path.join(self.root, run, str(batch), str(index))

    # -- writing ----------------------------------------------------------------------------

    def _write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in full (and fsync it when configured)."""
        with open(path, "wb") as f:
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
        os.makedirs(pdir, exist_ok=True)
        if name is None:
            name = self.new_segment_name()
        tmp = os.path.join(pdir, f".{name}.tmp")
        segment = pa.RecordBatch.from_arrays(batch.columns[:4], schema=SEGMENT_SCHEMA)
        with open(tmp, "wb") as f:
            with pa.ipc.new_file(f, SEGMENT_SCHEMA) as writer:
                writer.write_batch(segment)
            self._sync_file(f)
        os.rename(tmp, os.path.join(pdir, name))
        return name

    def seal(self, pdir: str, segments: list[str], rows: int, nsqd: str) -> bool:
        """Create ``SEALED`` (the partition is exactly ``segments``) unless it exists; True if
        this call created it."""
        os.makedirs(pdir, exist_ok=True)
        tmp = os.path.join(pdir, f".seal-{uuid.uuid4().hex}.tmp")
        body = {"v": 1, "segments": segments, "rows": rows, "nsqd": nsqd}
        self._write_file(tmp, json.dumps(body).encode())
        try:
            os.link(tmp, os.path.join(pdir, SEALED))
            won = True
        except FileExistsError:
            won = False
        finally:
            os.unlink(tmp)
        self._sync_dir(pdir)
        return won

    def mark_finned(self, pdir: str, failed: list[bytes]) -> None:
        """Record that nsqd confirmed the FINs of the partition, except ``failed``."""
        tmp = os.path.join(pdir, f".finned-{uuid.uuid4().hex}.tmp")
        self._write_file(tmp, json.dumps({"failed": [i.decode("ascii") for i in failed]}).encode())
        os.rename(tmp, os.path.join(pdir, FINNED))

    # -- reading ----------------------------------------------------------------------------

    def read_seal(self, pdir: str) -> Seal | None:
        try:
            with open(os.path.join(pdir, SEALED), "rb") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        segments = tuple(str(s) for s in data.get("segments") or ())
        return Seal(segments, int(data.get("rows", 0)), str(data.get("nsqd", "")))

    def replay(
        self,
        pdir: str,
        seal: Seal,
        topic: str,
        channel: str,
        columns: tuple[str, ...] | None = None,
    ) -> Iterator[Any]:
        """The sealed rows of a partition, exactly as first read (``columns`` of them)."""
        for batch in self._segments(pdir, seal):
            yield with_constants(batch, topic, channel, seal.nsqd, columns)

    def _segments(self, pdir: str, seal: Seal) -> Iterator[Any]:
        for segment in seal.segments:
            with pa.memory_map(os.path.join(pdir, segment), "r") as source:
                reader = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)

    def sealed_counts(self, run: str, batch: int) -> dict[str, int]:
        """Rows read per nsqd by the sealed partitions of one batch."""
        counts: dict[str, int] = {}
        bdir = os.path.join(self.root, run, str(batch))
        for name in _listdir(bdir):
            seal = self.read_seal(os.path.join(bdir, name))
            if seal is not None:
                counts[seal.nsqd] = counts.get(seal.nsqd, 0) + seal.rows
        return counts

    def _segment_ids(self, pdir: str, seal: Seal) -> list[bytes]:
        ids: list[bytes] = []
        try:
            for batch in self._segments(pdir, seal):
                ids.extend(s.encode("ascii") for s in batch.column(0).to_pylist())
        except FileNotFoundError:
            pass  # a partition being garbage collected; its ids were moved first
        return ids

    def _partition_unconfirmed(self, pdir: str) -> tuple[str, list[bytes]] | None:
        """The nsqd and the unconfirmed ids of one partition, if any."""
        seal = self.read_seal(pdir)
        if seal is None:
            return None
        try:
            with open(os.path.join(pdir, FINNED), "rb") as f:
                failed = [str(i).encode("ascii") for i in json.load(f).get("failed") or []]
            return (seal.nsqd, failed) if failed else None
        except FileNotFoundError:
            ids = self._segment_ids(pdir, seal)
            return (seal.nsqd, ids) if ids else None

    def unconfirmed(self) -> set[UnconfirmedKey]:
        """Every ``(nsqd, id)`` that is in the log but whose FIN was not confirmed."""
        keys: set[UnconfirmedKey] = set()
        udir = os.path.join(self.root, UNCONFIRMED)
        for name in _listdir(udir):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(udir, name), "rb") as f:
                    data = json.load(f)
            except (FileNotFoundError, ValueError):
                continue
            nsqd = str(data.get("nsqd", ""))
            keys.update((nsqd, str(i).encode("ascii")) for i in data.get("ids") or [])
        for run in _listdir(self.root):
            if run == UNCONFIRMED:
                continue
            rdir = os.path.join(self.root, run)
            for batch in _listdir(rdir):
                bdir = os.path.join(rdir, batch)
                for index in _listdir(bdir):
                    found = self._partition_unconfirmed(os.path.join(bdir, index))
                    if found is not None:
                        keys.update((found[0], i) for i in found[1])
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
        body = {"nsqd": found[0], "ids": [i.decode("ascii") for i in found[1]]}
        self._write_file(tmp, json.dumps(body).encode())
        os.rename(tmp, target)
        log.info("nsq wal: %d unconfirmed ids of %s/%s/%s kept", len(found[1]), run, batch, index)

    def _expire_unconfirmed(self, retention: float) -> None:
        udir = os.path.join(self.root, UNCONFIRMED)
        cutoff = time.time() - retention
        for name in _listdir(udir, include_hidden=True):
            path = os.path.join(udir, name)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_mtime < cutoff:
                    os.unlink(path)


def _listdir(path: str, *, include_hidden: bool = False) -> list[str]:
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if include_hidden or not n.startswith("."))
