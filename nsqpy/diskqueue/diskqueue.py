"""A filesystem-backed FIFO queue, byte-compatible with nsqio/go-diskqueue v1.1.0 (spec §7.7).

On-disk format (identical to Go's, so a data directory can move between nsqd and nsqpy):

* data files ``<data_path>/<name>.diskqueue.%06d.dat``: records ``[int32 BE length][payload]``
  back to back, nothing else (no file header);
* metadata ``<name>.diskqueue.meta.dat``: ``"<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n"``,
  replaced atomically (``<meta>.<rand>.tmp`` + fsync + rename);
* a write that would take a non-empty file past ``max_bytes_per_file`` first moves to the next
  file (one oversized record may still exceed the limit in a fresh file);
* a reader deletes each file it has fully read; a file it cannot read is renamed ``<file>.bad``.

Go runs all of this in an ``ioLoop`` goroutine fed by channels. Here the same state machine is a
plain synchronous object that the event loop calls (``put``/``put_many``/``read``/``read_many``),
with three changes that make it fast in Python and keep the loop unblocked:

* **Buffered writes.** Records are appended to an in-memory ``bytearray`` and handed to the OS
  with one ``os.pwrite`` per ``write_buffer_size`` bytes (or on ``flush()``/sync/roll/close).
  Readers of the current write file take not-yet-flushed records straight from that buffer.
* **Chunked reads.** The reader ``pread``\\s large chunks and slices records out of them.
* **fsync off the loop.** ``begin_sync()`` flushes and snapshots the positions on the loop
  thread; the returned :class:`SyncJob` does the fsyncs and the metadata write and may run in a
  worker thread while the loop keeps calling ``put``/``read``.

Every piece of behaviour cites the go-diskqueue function it mirrors; deliberate differences are
marked "Divergence".
"""

from __future__ import annotations

import errno
import os
import random
import re
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Final, NoReturn, TypeAlias


class LogLevel(IntEnum):
    """go-diskqueue's log levels (the ``logf`` callback receives these as ints)."""

    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4
    FATAL = 5


DEBUG: Final = LogLevel.DEBUG
INFO: Final = LogLevel.INFO
WARN: Final = LogLevel.WARN
ERROR: Final = LogLevel.ERROR

LogFunc: TypeAlias = Callable[[int, str], None]
"""``logf(level, message)``; Go's ``AppLogFunc`` with the message already formatted."""


class DiskQueueError(Exception):
    """A disk queue operation failed (I/O error, invalid record size, queue closed).

    The message is readable on its own and, for OS errors, worded like Go's
    (``"open /data/t.diskqueue.000000.dat: is a directory"``).
    """


class _ReadError(Exception):
    """A record could not be read: Go's ``readOne`` error, handled by ``handleReadError``."""


class _FileDone(Exception):
    """The read position is at the end of a completed file (see ``DiskQueue._finish_read_file``)."""


_LEN: Final = struct.Struct(">i")
_pack_len: Final = _LEN.pack
_unpack_len: Final = _LEN.unpack_from

# Errors that say nothing about the file being read, only about the process/system right now.
# Divergence: Go treats *any* readOne error as corruption and renames the file .bad; for these
# we raise instead and leave the file alone, so fd exhaustion cannot destroy good data.
_TRANSIENT_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})

# More retired (rolled-away-from) write files than this waiting for a sync means nobody is
# syncing: fsync the oldest synchronously rather than leak descriptors.
_MAX_RETIRED_FDS: Final = 64

# go's fmt.Fscanf("%d\n%d,%d\n%d,%d\n"): verbs skip leading blanks, literals must match.
_META_RE: Final = re.compile(
    rb"[ \t]*([+-]?[0-9]+)\r?\n"
    rb"[ \t]*([+-]?[0-9]+),[ \t]*([+-]?[0-9]+)\r?\n"
    rb"[ \t]*([+-]?[0-9]+),[ \t]*([+-]?[0-9]+)(?:\r?\n|$)"
)
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1

_Snapshot: TypeAlias = tuple[int, int, int, int, int]
"""``(depth, readFileNum, readPos, writeFileNum, writePos)``: the metadata file's content."""


def go_errno(exc: OSError) -> str:
    """An OSError's cause worded like Go's ``syscall.Errno`` (``"no space left on device"``)."""
    text = exc.strerror or str(exc)
    return f"{text[:1].lower()}{text[1:]}"


def go_error(op: str, path: str, exc: OSError) -> str:
    """Word an OSError like Go's ``*PathError`` (``"open /x: no such file or directory"``)."""
    return f"{op} {path}: {go_errno(exc)}"


def _parse_meta(raw: bytes) -> _Snapshot | None:
    m = _META_RE.match(raw)
    if m is None:
        return None
    vals = [int(g) for g in m.groups()]
    if any(v < _INT64_MIN or v > _INT64_MAX for v in vals):
        return None
    return (vals[0], vals[1], vals[2], vals[3], vals[4])


def _format_meta(snap: _Snapshot) -> bytes:
    """persistMetaData's ``fmt.Fprintf(f, "%d\\n%d,%d\\n%d,%d\\n", ...)``."""
    return b"%d\n%d,%d\n%d,%d\n" % snap


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class SyncJob:
    """The blocking half of a sync: fsync the data file(s), then write the metadata snapshot.

    Made by :meth:`DiskQueue.begin_sync` on the loop thread; :meth:`run` is thread-safe and is
    meant for ``loop.run_in_executor``. It owns private descriptors (``dup`` of the current write
    file, plus files the writer has since rolled away from), so the loop may keep writing, roll
    to a new file or close its own descriptors meanwhile. The metadata it writes is the snapshot
    taken in ``begin_sync``: data up to those positions was handed to the OS before the snapshot,
    so the metadata never points past what the fsync covered. A job that finishes after a newer
    sync, an :meth:`DiskQueue.empty` or a :meth:`DiskQueue.delete` does not write its (stale)
    metadata.
    """

    __slots__ = ("_dq", "_fds", "_gen", "_ran", "_seq", "snapshot")

    def __init__(
        self, dq: DiskQueue, fds: list[tuple[int, str]], snapshot: _Snapshot, gen: int, seq: int
    ) -> None:
        self._dq = dq
        self._fds = fds
        self.snapshot: _Snapshot = snapshot
        """``(depth, readFileNum, readPos, writeFileNum, writePos)`` this job persists."""
        self._gen = gen
        self._seq = seq
        self._ran = False

    def run(self) -> None:
        """fsync, then atomically replace the metadata file. Raises :class:`DiskQueueError`.

        Mirrors go-diskqueue ``sync()``: when the data fsync fails the metadata is not written.
        Running a job twice does nothing the second time.
        """
        if self._ran:
            return
        self._ran = True
        fds, self._fds = self._fds, []
        err: str | None = None
        try:
            for fd, path in fds:
                try:
                    os.fsync(fd)
                except OSError as e:
                    if err is None:
                        err = go_error("sync", path, e)
        finally:
            for fd, _ in fds:
                _close_quietly(fd)
        if err is not None:
            self._dq._need_sync = True  # a bool store: safe from any thread
            raise DiskQueueError(err)
        self._dq._persist_metadata(self.snapshot, self._gen, self._seq)

    def discard(self) -> None:
        """Drop the job without running it (closes its descriptors; the queue will re-sync)."""
        if not self._ran:
            self._ran = True
            for fd, _ in self._fds:
                _close_quietly(fd)
            self._fds = []
            self._dq._need_sync = True


class DiskQueue:
    """go-diskqueue's ``diskQueue`` as a synchronous object (see the module docstring).

    Not thread-safe: every method except :meth:`SyncJob.run` must be called from one thread
    (the event loop's).
    """

    def __init__(
        self,
        name: str,
        data_path: str,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float,
        logf: LogFunc,
        *,
        write_buffer_size: int = 256 * 1024,
        read_chunk_size: int = 128 * 1024,
    ) -> None:
        """Open the queue ``name`` in ``data_path``, loading its metadata file if there is one.

        Never raises for a missing or corrupt metadata file: like Go's ``New`` it logs and starts
        from what it could load. ``sync_timeout`` (seconds) is only stored for the engine's timer.
        ``write_buffer_size`` bounds the records held in memory before an ``os.pwrite``;
        ``read_chunk_size`` is the read-ahead ``pread`` size.
        """
        self.name: Final = name
        self.data_path: Final = data_path
        self.sync_timeout: Final = sync_timeout
        self._max_bytes_per_file = max_bytes_per_file
        self._min_msg_size = min_msg_size
        self._max_msg_size = max_msg_size
        self._sync_every = sync_every
        self._logf = logf

        # run-time state, also persisted (diskQueue's first five fields)
        self._read_pos = 0
        self._write_pos = 0
        self._read_file_num = 0
        self._write_file_num = 0
        self._depth = 0

        # readOne: bytes readable in a *completed* read file (its size), else max_bytes_per_file
        self._max_bytes_per_file_read = 0
        self._need_sync = False
        self._count = 0  # ioLoop's ``count``: reads + writes since the last sync
        self._exiting = False

        # write side: file bytes [0, _flushed_pos) are in the OS, [_flushed_pos, _write_pos)
        # are in _wbuf. _wbuf only ever holds bytes of the current write file.
        self._wfd: int | None = None
        self._wbuf = bytearray()
        self._flushed_pos = 0
        self._wbuf_limit = max(1, write_buffer_size)
        self._retired: list[tuple[int, str]] = []  # rolled-away-from files awaiting fsync
        self._last_error: str | None = None

        # read side: _rbuf holds file bytes from offset _rbase; the next record is at _roff.
        # Invariant while _r_open: _rbase + _roff == _read_pos.
        self._r_open = False  # Go's ``readFile != nil``
        self._rfd: int | None = None  # opened lazily for the current write file
        self._rbuf: bytes = b""
        self._rbase = 0
        self._roff = 0
        self._chunk = max(1, read_chunk_size)

        # Reads held until their messages are finished (hold_reads): each read_many that
        # returned records as (its first record's sequence number, file, position), oldest
        # first; the metadata names the oldest still held as the read position, so that a
        # kill -9 gives back what was read but not finished. None: a read is final, as Go's.
        self.read_seq = 0  # records read so far (the sequence number of the next one)
        self._held: deque[tuple[int, int, int]] | None = None
        self._floor: Callable[[], int] | None = None
        self._kept_files: list[int] = []  # read to their end, kept for the held reads
        self._reading_from = -1  # the file the running read_many started in (held reads)
        self._persisted_hold: tuple[int, int, int] | None = None  # the last sync's oldest

        # sync coordination with worker threads
        self._meta_lock = threading.Lock()
        self._gen = 0  # bumped by empty()/delete(): older SyncJobs must not write metadata
        self._sync_seq = 0
        self._persisted_seq = 0

        self._retrieve_metadata()
        self._flushed_pos = self._write_pos

    # ------------------------------------------------------------------ public API

    def depth(self) -> int:
        """Messages written minus messages read (Go's ``Depth``), but at least 1 while records
        remain to be read.

        After an unclean exit the metadata's depth can be short of what the files hold (it
        was synced before the last writes; the reader then salvages the rest). Go's reader
        reads on regardless of the count and resets it at the tail ("negative depth at
        tail"); nsqd's channels and topics ask the depth whether to read at all, so it must
        not say 0 while there is something to read.
        """
        depth = self._depth
        if depth <= 0 and (
            self._read_file_num < self._write_file_num or self._read_pos < self._write_pos
        ):
            return 1
        return depth

    def hold_reads(self, floor: Callable[[], int]) -> None:
        """Keep reads until their messages are finished: ``floor()`` says the sequence number
        (``read_seq`` at the time of reading, plus its place in the batch) of the oldest
        record still held, or ``read_seq`` when none is. Syncs persist that record's
        position as the read position (its depth counted back in), and files are deleted
        only once no held record is in them. Divergence: Go's reads are final, and a kill -9
        loses what was read but not yet finished."""
        self._held = deque()
        self._floor = floor

    def release_all(self) -> None:
        """Every read is final now (what was held was written back or dropped)."""
        if self._held is not None:
            self._held.clear()
            self._remove_kept_files()

    def _release(self) -> None:
        """Forget the reads before the oldest one held, and delete the files they were in."""
        held = self._held
        if not held:
            return
        assert self._floor is not None
        floor = self._floor()
        if floor >= self.read_seq:
            held.clear()
        else:
            while len(held) > 1 and held[1][0] <= floor:
                held.popleft()
        self._remove_kept_files()

    def _remove_kept_files(self) -> None:
        if not self._kept_files:
            return
        oldest = self._held[0][1] if self._held else self._read_file_num
        kept = []
        for num in self._kept_files:
            if num < oldest:
                self._remove_read_file(num)
            else:
                kept.append(num)
        self._kept_files = kept

    def _done_with_file(self, num: int) -> None:
        """A file read to its end: deleted, unless a held read is in it (or before it)."""
        held = self._held
        if (held and held[0][1] <= num) or 0 <= self._reading_from <= num:
            # (a read_many that started in this file has not recorded where yet)
            self._kept_files.append(num)
        else:
            self._remove_read_file(num)

    def _remove_read_file(self, num: int) -> None:
        fn = self._file_name(num)
        try:
            os.remove(fn)
        except OSError as e:
            self._logf(
                ERROR,
                f"DISKQUEUE({self.name}) failed to Remove({fn}) - {go_error('remove', fn, e)}",
            )

    @property
    def last_error(self) -> str | None:
        """Text of the last write error, ``None`` once a later write to the OS succeeded."""
        return self._last_error

    @property
    def health(self) -> str | None:
        """Alias of :attr:`last_error`, for nsqd's ``/ping`` health."""
        return self._last_error

    def put(self, data: bytes) -> None:
        """Append one record (Go's ``Put``/``writeOne``).

        Raises :class:`DiskQueueError` for a size outside ``[min_msg_size, max_msg_size]``
        (``"invalid message write size ..."``), for an I/O error (the record is then not in the
        queue, which stays usable and retries the file on the next write), or when closed.
        """
        if self._exiting:
            raise DiskQueueError("exiting")
        n = len(data)
        self._count += 1
        if n < self._min_msg_size or n > self._max_msg_size:
            raise DiskQueueError(
                f"invalid message write size ({n}) minMsgSize={self._min_msg_size} "
                f"maxMsgSize={self._max_msg_size}"
            )
        total = n + 4
        pos = self._write_pos
        # writeOne: roll *before* a write that would take a non-empty file past the limit
        if pos > 0 and pos + total > self._max_bytes_per_file:
            self._roll()
            pos = 0
        wbuf = self._wbuf
        wbuf += _pack_len(n)
        wbuf += data
        self._write_pos = pos + total
        self._depth += 1
        if len(wbuf) >= self._wbuf_limit or self._last_error is not None:
            try:
                self._flush()
            except DiskQueueError:
                # writeOne advances writePos/depth only after a successful write: undo this one
                # record; the earlier buffered ones stay pending and are retried.
                del wbuf[-total:]
                self._write_pos -= total
                self._depth -= 1
                self._truncate_unflushed()
                raise

    def put_many(self, datas: Sequence[bytes]) -> None:
        """Append several records, all or none (for MPUB).

        Sizes are validated before anything is written. On an I/O error every record of the
        batch is taken back: positions and depth are restored, files the batch rolled into are
        removed and the previous write file is truncated back. Divergence: Go's nsqd writes an
        MPUB message by message and keeps the ones written before an error.
        """
        if self._exiting:
            raise DiskQueueError("exiting")
        self._count += len(datas)
        lo, hi = self._min_msg_size, self._max_msg_size
        for data in datas:
            n = len(data)
            if n < lo or n > hi:
                raise DiskQueueError(
                    f"invalid message write size ({n}) minMsgSize={lo} maxMsgSize={hi}"
                )
        if not datas:
            return
        mark = (
            self._write_file_num,
            self._write_pos,
            len(self._wbuf),
            self._depth,
            len(self._retired),
            self._max_bytes_per_file_read,
        )
        limit = self._max_bytes_per_file
        try:
            wbuf = self._wbuf
            pos = self._write_pos
            for data in datas:
                n = len(data)
                total = n + 4
                if pos > 0 and pos + total > limit:
                    self._write_pos = pos
                    self._roll()
                    wbuf = self._wbuf
                    pos = 0
                wbuf += _pack_len(n)
                wbuf += data
                pos += total
                self._depth += 1
            self._write_pos = pos
            if len(wbuf) >= self._wbuf_limit or self._last_error is not None:
                self._flush()
        except DiskQueueError:
            self._rollback(*mark)
            raise

    def flush(self) -> None:
        """Hand the buffered records to the OS (one ``pwrite``; no fsync).

        Go writes every record to the OS as it is put; call this after a batch of puts to get
        the same crash behaviour for process (not machine) crashes. Raises
        :class:`DiskQueueError` on an I/O error (the records stay buffered for a retry).
        """
        if self._exiting:
            raise DiskQueueError("exiting")
        self._flush()

    def read(self) -> bytes | None:
        """The next record's payload, or ``None`` when the queue is empty.

        Advances the read position and decrements the depth (Go: ``readOne`` + ``moveForward``
        when the message is taken from ``ReadChan``), deletes files as they are fully read, and
        handles unreadable data like Go (log, rename the file ``.bad``, go on with the next
        file). Raises :class:`DiskQueueError` only when closed or for a resource error
        (EMFILE, ENOMEM...) that says nothing about the file.
        """
        if self._held is not None:
            one = self.read_many(1)
            return one[0] if one else None
        if self._r_open:
            # Fast path (see read_many): a whole record in the read-ahead buffer that neither
            # ends a completed file nor reaches the write position. (close() clears _r_open.)
            buf = self._rbuf
            off = self._roff
            if off + 4 <= len(buf):
                size = _unpack_len(buf, off)[0]
                stop = off + 4 + size
                if self._min_msg_size <= size <= self._max_msg_size and stop <= len(buf):
                    next_pos = self._rbase + stop
                    if self._read_file_num < self._write_file_num:
                        inside = next_pos < self._max_bytes_per_file_read
                    else:
                        inside = next_pos < self._write_pos
                    if inside:
                        self._roff = stop
                        self._read_pos = next_pos
                        self._depth -= 1
                        self._count += 1
                        return buf[off + 4 : stop]
        return self._read_slow()

    def _read_slow(self) -> bytes | None:
        if self._exiting:
            raise DiskQueueError("exiting")
        # ioLoop: ``if (d.readFileNum < d.writeFileNum) || (d.readPos < d.writePos)``
        while self._read_file_num < self._write_file_num or self._read_pos < self._write_pos:
            try:
                data, next_file, next_pos = self._read_one()
            except _FileDone:
                self._finish_read_file()
                continue
            except _ReadError as e:
                self._logf(
                    ERROR,
                    f"DISKQUEUE({self.name}) reading at {self._read_pos} of "
                    f"{self._file_name(self._read_file_num)} - {e}",
                )
                self._handle_read_error()
                continue
            self._count += 1
            self._move_forward(next_file, next_pos)
            return data
        return None

    def read_many(self, max_count: int) -> list[bytes]:
        """Up to ``max_count`` records, exactly as that many :meth:`read` calls would return."""
        if self._exiting:
            raise DiskQueueError("exiting")
        out: list[bytes] = []
        append = out.append
        lo, hi = self._min_msg_size, self._max_msg_size
        unpack = _unpack_len
        mark: tuple[int, int, int] | None = None
        if self._held is not None:
            mark = (self.read_seq, self._read_file_num, self._read_pos)
            self._reading_from = self._read_file_num
        while len(out) < max_count:
            if self._r_open:
                # Fast path: records wholly inside the read-ahead buffer that neither end the
                # file (rotation) nor reach the write position (tail check) need none of
                # readOne/moveForward's special cases: slice them out in a tight loop.
                buf = self._rbuf
                off = self._roff
                end = len(buf)
                base = self._rbase
                if self._read_file_num < self._write_file_num:
                    boundary = self._max_bytes_per_file_read - base
                else:
                    boundary = self._write_pos - base
                remaining = max_count - len(out)
                taken = 0
                while taken < remaining and off + 4 <= end:
                    size = unpack(buf, off)[0]
                    if size < lo or size > hi:
                        break
                    stop = off + 4 + size
                    if stop > end or stop >= boundary:
                        break
                    append(buf[off + 4 : stop])
                    off = stop
                    taken += 1
                if taken:
                    self._roff = off
                    self._read_pos = base + off
                    self._depth -= taken
                    self._count += taken
                    if taken == remaining:
                        break
            # slow path: one record through readOne/moveForward (refill, rotation, errors, tail)
            data = self._read_slow()
            if data is None:
                break
            append(data)
        if mark is not None:
            self._reading_from = -1
            if out:
                assert self._held is not None
                self._held.append(mark)
                self.read_seq += len(out)
            elif self._kept_files and not self._held:
                self._remove_kept_files()
        return out

    def needs_sync(self) -> bool:
        """True once ``sync_every`` reads+writes accumulated, or after a file change/error.

        Go's ioLoop: ``if count == d.syncEvery { d.needSync = true }``.
        """
        return self._need_sync or self._count >= self._sync_every

    def dirty(self) -> bool:
        """True if anything happened since the last sync: the ``sync_timeout`` ticker's test.

        Go's ioLoop on ``syncTicker.C``: ``if count == 0 { continue }``. With held reads,
        also once the oldest read held has changed since the last sync (messages FINed).
        """
        if self._need_sync or self._count > 0:
            return True
        if self._held is None:
            return False
        # held reads: dirty once the oldest one held is not what the last sync saved
        self._release()
        return (self._held[0] if self._held else None) != self._persisted_hold

    def sync(self) -> None:
        """Flush, fsync the write file and persist the metadata, all on this thread."""
        if self._exiting:
            raise DiskQueueError("exiting")
        job = self._begin_sync()
        try:
            job.run()
        except DiskQueueError as e:
            self._logf(ERROR, f"DISKQUEUE({self.name}) failed to sync - {e}")
            raise

    def begin_sync(self) -> SyncJob:
        """Start a sync: flush buffered records to the OS and snapshot the state. Cheap.

        Run the returned job's :meth:`SyncJob.run` (e.g. in ``loop.run_in_executor``) to
        finish it. Raises :class:`DiskQueueError` if the flush fails (then nothing is synced,
        as in Go's ``sync()`` when the write fails).
        """
        if self._exiting:
            raise DiskQueueError("exiting")
        return self._begin_sync()

    def empty(self) -> None:
        """Go's ``Empty``/``deleteAllFiles``: delete all data files and the metadata file.

        Positions move to a fresh (next) file number with depth 0. Raises
        :class:`DiskQueueError` if a file could not be removed (state is reset anyway).
        """
        if self._exiting:
            raise DiskQueueError("exiting")
        self._logf(INFO, f"DISKQUEUE({self.name}): emptying")
        with self._meta_lock:
            self._gen += 1  # in-flight SyncJobs must not bring the metadata back
            err = self._skip_to_next_rw_file()
            meta = self._meta_file_name()
            try:
                os.remove(meta)
            except FileNotFoundError:
                pass
            except OSError as e:
                err = go_error("remove", meta, e)
                self._logf(ERROR, f"DISKQUEUE({self.name}) failed to remove metadata file - {err}")
        self._count = 0
        if err is not None:
            raise DiskQueueError(err)

    def close(self) -> None:
        """Go's ``Close``: sync (flush, fsync, metadata) and close the files.

        Divergence: Go's ``Close`` closes the write file *before* its final sync, so it never
        fsyncs data on close; this fsyncs it. Later calls do nothing. Raises
        :class:`DiskQueueError` if the final sync failed (the files are closed anyway).
        """
        if self._exiting:
            return
        self._exiting = True
        self._logf(INFO, f"DISKQUEUE({self.name}): closing")
        err: DiskQueueError | None = None
        try:
            self._begin_sync().run()
        except DiskQueueError as e:
            self._logf(ERROR, f"DISKQUEUE({self.name}) failed to sync - {e}")
            err = e
        finally:
            self._close_all_files()
        if err is not None:
            raise err

    def delete(self) -> None:
        """Go's ``Delete``: close without syncing (nsqd calls :meth:`empty` first)."""
        if self._exiting:
            return
        self._exiting = True
        self._logf(INFO, f"DISKQUEUE({self.name}): deleting")
        with self._meta_lock:
            self._gen += 1
        # Go's records are already in the OS at this point; hand over ours too.
        try:
            self._flush()
        except DiskQueueError as e:
            self._logf(ERROR, f"DISKQUEUE({self.name}) failed to write on delete - {e}")
        self._close_all_files()

    # ------------------------------------------------------------------ names

    def _meta_file_name(self) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.meta.dat")

    def _file_name(self, file_num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{file_num:06d}.dat")

    # ------------------------------------------------------------------ metadata

    def _retrieve_metadata(self) -> None:
        """retrieveMetaData, including v1.1.0's check for a write file longer than writePos."""
        meta = self._meta_file_name()
        try:
            with open(meta, "rb") as f:
                raw = f.read(4096)
        except FileNotFoundError:
            self._recover_from_files()  # New(): os.IsNotExist is not an error
            return
        except OSError as e:
            self._logf(
                ERROR,
                f"DISKQUEUE({self.name}) failed to retrieveMetaData - {go_error('open', meta, e)}",
            )
            self._recover_from_files()
            return
        parsed = _parse_meta(raw)
        if parsed is None:
            # Divergence: Go keeps whatever fields Fscanf managed to fill before the error; a
            # half-read state is worse than a clean one, so start from the files.
            self._logf(
                ERROR,
                f"DISKQUEUE({self.name}) failed to retrieveMetaData - "
                f"cannot parse {meta}: {raw[:64]!r}",
            )
            self._recover_from_files()
            return
        (
            self._depth,
            self._read_file_num,
            self._read_pos,
            self._write_file_num,
            self._write_pos,
        ) = parsed

        # "if the metadata was not sync'd at the last shutdown of nsqd then the actual file size
        # might actually be larger than the writePos, in which case the safest thing to do is
        # skip to the next file for writes, and let the reader salvage what it can"
        while True:
            fn = self._file_name(self._write_file_num)
            try:
                size: int | None = os.stat(fn).st_size
            except FileNotFoundError:
                size = None
            except OSError as e:
                self._logf(
                    ERROR,
                    f"DISKQUEUE({self.name}) failed to retrieveMetaData - {go_error('stat', fn, e)}",
                )
                return
            if size is not None and self._write_pos < size:
                self._logf(
                    WARN,
                    f"DISKQUEUE({self.name}) {fn} metadata writePos {self._write_pos} < "
                    f"file size of {size}, skipping to new file",
                )
                self._write_file_num += 1
                self._write_pos = 0
                continue
            # Divergence (only matters after a crash): Go syncs the metadata synchronously at
            # every file roll, so its metadata never names a file older than one holding data.
            # Ours defers that sync to the next SyncJob; if we crashed in between, the next file
            # exists although the metadata does not know it. Writing there again would overwrite
            # records, so skip past it too (the reader still reads it: it is a "completed" file).
            nxt = self._file_name(self._write_file_num + 1)
            if os.path.exists(nxt):
                self._logf(
                    WARN,
                    f"DISKQUEUE({self.name}) {nxt} exists beyond metadata writeFileNum "
                    f"{self._write_file_num}, skipping to new file",
                )
                self._write_file_num += 1
                self._write_pos = 0
                continue
            return

    def _recover_from_files(self) -> None:
        """No usable metadata, but data files: read them all, write after the last.

        Divergence: go-diskqueue starts empty, so the files' records are never read and the
        first write overwrites file 0. That happens to a queue whose metadata was lost or
        damaged, and to one killed before its first metadata sync (with the default
        --sync-every, the first 2 s of a new topic). Here the reader starts at the oldest
        data file and the writer in a new file after the newest; the depth is unknown and
        counted as the records are read (depth() stays at least 1 while any remain).
        """
        pattern = re.compile(re.escape(self.name) + r"\.diskqueue\.(\d{6,})\.dat")
        try:
            names = os.listdir(self.data_path)
        except OSError:
            return
        nums = sorted(int(m.group(1)) for n in names if (m := pattern.fullmatch(n)))
        if not nums:
            return
        self._read_file_num, self._read_pos = nums[0], 0
        self._write_file_num, self._write_pos = nums[-1] + 1, 0
        self._depth = 0
        self._logf(
            WARN,
            f"DISKQUEUE({self.name}) no metadata for data files {nums[0]}..{nums[-1]}: "
            f"reading them from the start, writing to file {nums[-1] + 1}",
        )

    def _persist_metadata(self, snap: _Snapshot, gen: int, seq: int) -> None:
        """persistMetaData: ``<meta>.<rand>.tmp``, write, fsync, close, rename. Thread-safe."""
        with self._meta_lock:
            if gen != self._gen or seq <= self._persisted_seq:
                return  # emptied/deleted since the snapshot, or a newer sync already landed
            meta = self._meta_file_name()
            tmp = f"{meta}.{random.getrandbits(63)}.tmp"  # Go: rand.Int()
            op, path = "open", tmp
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    op = "write"
                    content = _format_meta(snap)
                    if os.write(fd, content) != len(content):
                        raise OSError(errno.EIO, "short write")
                    op = "sync"
                    os.fsync(fd)
                finally:
                    os.close(fd)
                op, path = "rename", f"{tmp} {meta}"
                os.rename(tmp, meta)
            except OSError as e:
                if op != "open":
                    try:
                        os.remove(tmp)
                    except OSError:
                        pass
                self._need_sync = True
                raise DiskQueueError(go_error(op, path, e)) from e
            self._persisted_seq = seq

    def _begin_sync(self) -> SyncJob:
        # ioLoop resets count whenever it syncs, whether or not the sync worked
        self._count = 0
        try:
            self._flush()
        except DiskQueueError:
            self._need_sync = True
            raise
        fds, self._retired = self._retired, []
        if self._wfd is not None:
            path = self._file_name(self._write_file_num)
            try:
                fds.append((os.dup(self._wfd), path))
            except OSError as e:
                self._retired = fds
                self._need_sync = True
                raise DiskQueueError(go_error("dup", path, e)) from e
        self._sync_seq += 1
        self._release()
        if self._held is not None:
            self._persisted_hold = self._held[0] if self._held else None
        if self._held:
            # the oldest read not yet finished is where a restart reads from again
            first_seq, file_num, pos = self._held[0]
            snap = (
                self._depth + self.read_seq - first_seq,
                file_num,
                pos,
                self._write_file_num,
                self._write_pos,
            )
        else:
            snap = (
                self._depth,
                self._read_file_num,
                self._read_pos,
                self._write_file_num,
                self._write_pos,
            )
        self._need_sync = False
        return SyncJob(self, fds, snap, self._gen, self._sync_seq)

    # ------------------------------------------------------------------ writing

    def _flush(self) -> None:
        """Write ``_wbuf`` at ``_flushed_pos`` of the write file, opening it if needed.

        Mirrors writeOne's file handling: open ``O_RDWR|O_CREATE`` 0600 when there is no open
        write file, and on a write error close it so the next attempt reopens the path.
        ``pwrite`` at the tracked offset replaces Go's ``Seek(writePos)`` + ``Write``, so a retry
        overwrites whatever a failed attempt left behind.
        """
        wbuf = self._wbuf
        total = len(wbuf)
        if not total:
            return
        fd = self._wfd
        path = self._file_name(self._write_file_num)
        try:
            if fd is None:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                self._wfd = fd
                self._logf(INFO, f"DISKQUEUE({self.name}): writeOne() opened {path}")
            pos = self._flushed_pos
            done = os.pwrite(fd, wbuf, pos)
            if done < total:
                with memoryview(wbuf) as mv:
                    while done < total:
                        n = os.pwrite(fd, mv[done:], pos + done)
                        if n <= 0:
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                        done += n
        except OSError as e:
            msg = go_error("open" if self._wfd is None else "write", path, e)
            if self._wfd is not None:
                _close_quietly(self._wfd)
                self._wfd = None
            self._last_error = msg
            raise DiskQueueError(msg) from e
        self._flushed_pos += total
        wbuf.clear()
        self._last_error = None

    def _roll(self) -> None:
        """writeOne's roll branch: finish the current file and move to the next one.

        Go calls ``sync()`` here (fsync + metadata) on the ioLoop goroutine. Divergence: we
        flush, keep the file's descriptor for the next :class:`SyncJob` to fsync, and only set
        ``needs_sync()``, so a roll never blocks the event loop on an fsync.
        """
        self._flush()  # the old file's buffered tail belongs to the old file
        if self._read_file_num == self._write_file_num:
            self._max_bytes_per_file_read = self._write_pos
        if self._wfd is not None:
            self._retired.append((self._wfd, self._file_name(self._write_file_num)))
            self._wfd = None
            if len(self._retired) > _MAX_RETIRED_FDS:
                fd, path = self._retired.pop(0)
                try:
                    os.fsync(fd)
                except OSError as e:
                    self._logf(
                        ERROR,
                        f"DISKQUEUE({self.name}) failed to sync - {go_error('sync', path, e)}",
                    )
                _close_quietly(fd)
        self._write_file_num += 1
        self._write_pos = 0
        self._flushed_pos = 0
        self._need_sync = True

    def _truncate_unflushed(self) -> None:
        """Cut bytes a failed write may have left past ``_flushed_pos`` (best effort)."""
        path = self._file_name(self._write_file_num)
        try:
            if os.stat(path).st_size > self._flushed_pos:
                os.truncate(path, self._flushed_pos)
        except OSError:
            pass

    def _rollback(
        self,
        file_num: int,
        pos: int,
        wbuf_len: int,
        depth: int,
        retired_len: int,
        max_read: int,
    ) -> None:
        """Undo a failed :meth:`put_many` back to the state captured before it."""
        if self._write_file_num == file_num:
            # No roll happened: the batch is the tail of _wbuf (a failed flush keeps it all).
            del self._wbuf[wbuf_len:]
            self._truncate_unflushed()
        else:
            # The batch rolled: the old file got flushed (pre-batch + batch records) and its
            # descriptor retired; later files were created. Remove those, reopen the old one.
            if self._wfd is not None:
                _close_quietly(self._wfd)
                self._wfd = None
            self._wbuf.clear()
            path = self._file_name(file_num)
            restored: int | None = None
            for fd, fd_path in self._retired[retired_len:]:
                if restored is None and fd_path == path:
                    restored = fd  # the file we go back to (absent if it was never opened)
                else:
                    _close_quietly(fd)
            del self._retired[retired_len:]
            self._wfd = restored
            for num in range(file_num + 1, self._write_file_num + 1):
                fn = self._file_name(num)
                try:
                    os.remove(fn)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    self._logf(
                        ERROR,
                        f"DISKQUEUE({self.name}) failed to remove data file - "
                        f"{go_error('remove', fn, e)}",
                    )
            try:
                if self._wfd is not None:
                    os.ftruncate(self._wfd, pos)
                else:
                    os.truncate(path, pos)
            except OSError:
                pass  # garbage past writePos is overwritten by the next write, never read
            self._flushed_pos = pos
        self._write_file_num = file_num
        self._write_pos = pos
        self._depth = depth
        self._max_bytes_per_file_read = max_read

    # ------------------------------------------------------------------ reading

    def _close_read_file(self) -> None:
        if self._rfd is not None:
            _close_quietly(self._rfd)
            self._rfd = None
        self._r_open = False
        self._rbuf = b""
        self._roff = 0

    def _open_read_fd(self) -> int:
        fn = self._file_name(self._read_file_num)
        try:
            fd = os.open(fn, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self._raise_read_error(go_error("open", fn, e), e)
        self._rfd = fd
        self._logf(INFO, f"DISKQUEUE({self.name}): readOne() opened {fn}")
        return fd

    def _raise_read_error(self, msg: str, exc: OSError) -> NoReturn:
        if exc.errno in _TRANSIENT_ERRNOS:
            self._close_read_file()
            raise DiskQueueError(msg) from exc
        raise _ReadError(msg) from exc

    def _pread(self, n: int, pos: int) -> bytes:
        fd = self._rfd if self._rfd is not None else self._open_read_fd()
        try:
            chunk = os.pread(fd, n, pos)
            if 0 < len(chunk) < n:
                parts = [chunk]
                got = len(chunk)
                while got < n:
                    more = os.pread(fd, n - got, pos + got)
                    if not more:
                        break
                    parts.append(more)
                    got += len(more)
                chunk = b"".join(parts)
        except OSError as e:
            self._raise_read_error(go_error("read", self._file_name(self._read_file_num), e), e)
        return chunk

    def _fill(self, k: int) -> bool:
        """Make ``k`` bytes available at ``_roff``; False if the data ends first."""
        buf = self._rbuf
        off = self._roff
        have = len(buf) - off
        if have >= k:
            return True
        parts: list[bytes | bytearray] = [buf[off:]] if have else []
        start = self._rbase + off
        pos = self._rbase + len(buf)
        want = k - have
        if self._read_file_num == self._write_file_num:
            # The write file: bytes below _flushed_pos from the file, the rest from _wbuf.
            flushed = self._flushed_pos
            if pos < flushed:
                n = min(max(self._chunk, want), flushed - pos)
                chunk = self._pread(n, pos)
                parts.append(chunk)
                pos += len(chunk)
            if pos >= flushed:
                i = pos - flushed
                if i < len(self._wbuf):
                    parts.append(self._wbuf[i:])
        else:
            parts.append(self._pread(max(self._chunk, want), pos))
        self._rbuf = parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)
        self._rbase = start
        self._roff = 0
        return len(self._rbuf) >= k

    def _read_one(self) -> tuple[bytes, int, int]:
        """readOne: the next record and the position after it (``nextReadFileNum/Pos``)."""
        if not self._r_open:
            # Go opens the file here; we open completed files now (their size is needed) and
            # the current write file only once bytes that already left _wbuf are needed.
            self._r_open = True
            self._rbuf = b""
            self._rbase = self._read_pos
            self._roff = 0
            # "for complete files (i.e. not the current file), maxBytesPerFileRead should be
            # initialized to the file's size, or default to maxBytesPerFile"
            self._max_bytes_per_file_read = self._max_bytes_per_file
            if self._read_file_num < self._write_file_num:
                fd = self._open_read_fd()
                try:
                    self._max_bytes_per_file_read = os.fstat(fd).st_size
                except OSError:
                    pass
        if (
            self._read_file_num < self._write_file_num
            and self._read_pos >= self._max_bytes_per_file_read
        ):
            raise _FileDone
        if not self._fill(4):
            got = len(self._rbuf) - self._roff
            self._close_read_file()
            raise _ReadError("EOF" if got == 0 else "unexpected EOF")
        size: int = _unpack_len(self._rbuf, self._roff)[0]
        if size < self._min_msg_size or size > self._max_msg_size:
            # "this file is corrupt and we have no reasonable guarantee on where a new
            # message should begin"
            self._close_read_file()
            raise _ReadError(f"invalid message read size ({size})")
        total = 4 + size
        if not self._fill(total):
            self._close_read_file()
            raise _ReadError("unexpected EOF")
        off = self._roff
        data = self._rbuf[off + 4 : off + total]
        self._roff = off + total
        next_pos = self._read_pos + total
        next_file = self._read_file_num
        # "we only consider rotating if we're reading a complete file and since we cannot know
        # the size at which it was rotated, we rely on maxBytesPerFileRead"
        if self._read_file_num < self._write_file_num and next_pos >= self._max_bytes_per_file_read:
            self._close_read_file()
            next_file += 1
            next_pos = 0
        return data, next_file, next_pos

    def _finish_read_file(self) -> None:
        """Move on from a completed file that has been read to its end.

        Divergence, a bug fix: go-diskqueue v1.1.0 only rotates the reader right after reading
        a record. When the reader has caught up with the writer (readPos == writePos) and the
        writer then rolls, the next readOne reads at the end of the old file, gets EOF, and
        handleReadError renames the (fully consumed) file ``.bad``: nothing is lost but every
        roll leaves a ``.bad`` copy behind with ``--mem-queue-size=0`` (go-diskqueue issues
        #38/#42, nsq #1491). Here that file is deleted as a normal rotation would (moveForward).
        """
        self._close_read_file()
        old = self._read_file_num
        self._read_file_num += 1
        self._read_pos = 0
        self._need_sync = True
        self._done_with_file(old)
        self._check_tail_corruption(self._depth)

    def _move_forward(self, next_file: int, next_pos: int) -> None:
        """moveForward: commit a read, delete a file read to its end, check the tail."""
        old = self._read_file_num
        self._read_file_num = next_file
        self._read_pos = next_pos
        self._depth -= 1
        if old != next_file:
            # "sync every time we start reading from a new file"
            self._need_sync = True
            self._done_with_file(old)
        self._check_tail_corruption(self._depth)

    def _check_tail_corruption(self, depth: int) -> None:
        """checkTailCorruption: at the write position the depth must be 0."""
        if self._read_file_num < self._write_file_num or self._read_pos < self._write_pos:
            return
        # we've reached the end of the diskqueue; if depth isn't 0 something went wrong
        if depth != 0:
            if depth < 0:
                self._logf(
                    ERROR,
                    f"DISKQUEUE({self.name}) negative depth at tail ({depth}), "
                    "metadata corruption, resetting 0...",
                )
            else:
                self._logf(
                    ERROR,
                    f"DISKQUEUE({self.name}) positive depth at tail ({depth}), "
                    "data loss, resetting 0...",
                )
            self._depth = 0
            self._need_sync = True
        if self._read_file_num != self._write_file_num or self._read_pos != self._write_pos:
            if self._read_file_num > self._write_file_num:
                self._logf(
                    ERROR,
                    f"DISKQUEUE({self.name}) readFileNum > writeFileNum "
                    f"({self._read_file_num} > {self._write_file_num}), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                )
            if self._read_pos > self._write_pos:
                self._logf(
                    ERROR,
                    f"DISKQUEUE({self.name}) readPos > writePos "
                    f"({self._read_pos} > {self._write_pos}), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                )
            self._skip_to_next_rw_file()
            self._need_sync = True

    def _handle_read_error(self) -> None:
        """handleReadError: rename the unreadable file ``.bad`` and go on with the next one."""
        if self._read_file_num == self._write_file_num:
            # "if you can't properly read from the current write file it's safe to assume that
            # something is fucked and we should skip the current file too"
            if self._wbuf:
                # Go's file already holds every record put; make the .bad file hold them too.
                try:
                    self._flush()
                except DiskQueueError:
                    pass
            self._drop_write_file()
            self._write_file_num += 1
            self._write_pos = 0
            self._flushed_pos = 0
        self.release_all()  # (a held read may be in the file renamed)
        bad = self._file_name(self._read_file_num)
        bad_rename = bad + ".bad"
        self._logf(
            WARN, f"DISKQUEUE({self.name}) jump to next file and saving bad file as {bad_rename}"
        )
        try:
            os.rename(bad, bad_rename)
        except OSError:
            self._logf(
                ERROR,
                f"DISKQUEUE({self.name}) failed to rename bad diskqueue file {bad} to {bad_rename}",
            )
        self._close_read_file()
        self._read_file_num += 1
        self._read_pos = 0
        # significant state change, schedule a sync on the next iteration
        self._need_sync = True
        self._check_tail_corruption(self._depth)

    # ------------------------------------------------------------------ files

    def _drop_write_file(self) -> None:
        """Close the write file and forget its buffered records (they are being discarded)."""
        if self._wfd is not None:
            _close_quietly(self._wfd)
            self._wfd = None
        self._wbuf.clear()

    def _skip_to_next_rw_file(self) -> str | None:
        """skipToNextRWFile: delete files readFileNum..writeFileNum, restart on the next one."""
        err: str | None = None
        if self._held is not None:
            self._held.clear()
        kept, self._kept_files = self._kept_files, []
        for num in kept:
            self._remove_read_file(num)
        self._close_read_file()
        self._drop_write_file()
        for fd, _ in self._retired:
            _close_quietly(fd)
        self._retired = []
        for num in range(self._read_file_num, self._write_file_num + 1):
            fn = self._file_name(num)
            try:
                os.remove(fn)
            except FileNotFoundError:
                pass
            except OSError as e:
                err = go_error("remove", fn, e)
                self._logf(ERROR, f"DISKQUEUE({self.name}) failed to remove data file - {err}")
        self._write_file_num += 1
        self._write_pos = 0
        self._flushed_pos = 0
        self._read_file_num = self._write_file_num
        self._read_pos = 0
        self._depth = 0
        return err

    def _close_all_files(self) -> None:
        self._close_read_file()
        if self._wfd is not None:
            _close_quietly(self._wfd)
            self._wfd = None
        for fd, _ in self._retired:
            _close_quietly(fd)
        self._retired = []
