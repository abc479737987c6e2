"""One read task: replay a sealed partition, or read it from nsqd through the log.

A fresh read, in order::

    IDENTIFY, SUB, RDY             ceil(quota / max RDY) connections, RDYs summing to the quota
    repeat:                        until the quota, idleTimeout or readBudget
        collect a chunk            (walSegmentRows messages)
        write it as a segment      Arrow IPC, fsync, rename, on a writer thread: the task
                                   meanwhile reads on and Spark turns the rows into its output
        hand its rows to Spark     nothing is FIN'd yet
    CLS -> CLOSE_WAIT              nsqd stops delivering; late arrivals form a last segment
    wait for the writer            every segment durable (a failed write fails the task,
                                   after giving back what it read: see below)
    SEALED (link)                  the partition is decided: exactly these segments
    FIN every id, half-close, EOF  on the receiving connection; EOF proves nsqd applied them
    FINNED                         else the ids stay "unconfirmed" and are deduped later

Why this is safe:

* RDY caps in-flight messages and nothing is FIN'd before the seal, so a task never holds more
  than its quota, and a crash before the seal loses nothing: the messages time out in nsqd and
  come back (and Spark discards a failed task's output).
* Rows reach Spark before their segment is durable, but Spark uses a task's output only if
  the task succeeds, and it cannot succeed before the seal, which waits for every segment.
* A crash after the seal loses nothing either: the retry, or the restart, replays the sealed
  segments (byte for byte), and the redeliveries of the unconfirmed FINs are dropped.
* A segment or seal that cannot be written (a full file system) fails the task with a
  :class:`~nsqpy.spark._wal.LogWriteError` naming the file, and nothing of it is left: the
  partition is not sealed, so nothing was FIN'd; the task REQs what it read and nsqd delivers
  it again, to a retry or, after a restart from the checkpoint, to the same batch read anew.
  That is not data loss (``failOnDataLoss`` is about logs lost or damaged between runs).
* An attempt that finds the partition sealed by another attempt (speculation, a zombie)
  requeues what it read and **fails**: the rows it already handed to Spark are not the sealed
  ones, so Spark must not use its output.
* Rows go to Spark before the FIN, so a slow stage downstream in the same task keeps messages
  in flight longer: a thread TOUCHes them every ``msg_timeout / 3`` until the FIN (nsqd caps
  this at ``--max-msg-timeout``, 15 minutes by default).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import selectors
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

from nsqpy.spark._conn import (
    Columns,
    ConsumerConnection,
    NSQConnectionError,
    NSQErrorFrame,
    split_ids,
)
from nsqpy.spark._offsets import PartitionPlan
from nsqpy.spark._options import SourceOptions
from nsqpy.spark._schema import to_segment, with_constants
from nsqpy.spark._wal import WAL, LogWriteError, UnconfirmedKey

__all__ = ["SealLostError", "read_partition"]

log = logging.getLogger("nsqpy.spark")

OUTPUT_ROWS: Final = 10_000  # rows per RecordBatch handed to Spark (its default Arrow batch)
_RELOAD_INTERVAL: Final = 1.0
_KEEPALIVE: Final = 15.0  # half of nsqd's default heartbeat interval
_WRITE_AHEAD: Final = 2  # segments waiting for the writer thread before the task waits


class SealLostError(RuntimeError):
    """Another attempt sealed the partition first; this attempt's output must not be used."""


def read_partition(plan: PartitionPlan, options: SourceOptions) -> Iterator[Any]:
    """The rows of one partition as ``pyarrow.RecordBatch`` es (see the module docstring)."""
    if plan.quota <= 0:
        return
    wal = WAL(
        options.wal_location, fsync=options.fsync, fail_on_data_loss=options.fail_on_data_loss
    )
    pdir = wal.partition_dir(plan.run, plan.batch, plan.index)
    seal = wal.read_seal(pdir)
    if seal is not None:
        yield from wal.replay(pdir, seal, plan.topic, plan.channel, options.columns)
        return
    task = _PartitionRead(plan, options, wal, pdir)
    try:
        yield from task.run()
    finally:
        task.close()


class _Dedupe:
    """Is this redelivery already in the log? Loaded from the WAL on the first ``attempts > 1``
    message, and reloaded (at most once a second) when an id is not found."""

    def __init__(self, wal: WAL, nsqd: str, topic: str) -> None:
        self._wal = wal
        self._nsqd = nsqd
        self._topic = topic
        self._keys: set[UnconfirmedKey] | None = None
        self._loaded_at = 0.0

    def __call__(self, msg_id: bytes) -> bool:
        if self._keys is not None and self._known(msg_id):
            return True
        if self._keys is None or time.monotonic() - self._loaded_at >= _RELOAD_INTERVAL:
            self._keys = self._wal.unconfirmed()
            self._loaded_at = time.monotonic()
        return self._known(msg_id)

    def _known(self, msg_id: bytes) -> bool:
        """In the log for this nsqd and topic (or logged before seals named a topic)."""
        assert self._keys is not None
        keys = self._keys
        return (self._nsqd, self._topic, msg_id) in keys or (self._nsqd, "", msg_id) in keys


class _Keepalive(threading.Thread):
    """Until stopped: TOUCH the kept messages every ``msg_timeout / 3`` (and send a NOP at
    least every 15 s), so that nothing times out and nsqd keeps the connections while the task
    is busy elsewhere (writing the log, or blocked on Spark taking its rows)."""

    def __init__(self, conns: list[ConsumerConnection], msg_timeout: float) -> None:
        super().__init__(name="nsq-keepalive", daemon=True)
        self._conns = conns
        self._touch_every = max(0.3, msg_timeout / 3)
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_touch = time.monotonic()
        while not self._stop_event.wait(min(self._touch_every, _KEEPALIVE)):
            touch = time.monotonic() - last_touch >= self._touch_every * 0.99
            if touch:
                last_touch = time.monotonic()
            for conn in self._conns:
                try:
                    conn.keepalive(touch)
                except NSQConnectionError as err:
                    log.warning("nsq read: keepalive failed: %s", err)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()


class _SegmentWriter(threading.Thread):
    """Writes a read task's segments, in order, off the task's thread: Arrow's file write and
    fsync release the GIL, so the task reads nsqd and feeds Spark while the disk works."""

    def __init__(self, wal: WAL, pdir: str) -> None:
        super().__init__(name="nsq-wal-writer", daemon=True)
        self._wal = wal
        self._pdir = pdir
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=_WRITE_AHEAD)
        self._error: Exception | None = None
        self._done = False

    def submit(self, segment: Any) -> str:
        """Queue ``segment`` (waits while the writer is ``_WRITE_AHEAD`` behind); returns the
        file name it will have. Raises if an earlier write failed."""
        self._raise_failure()
        name = self._wal.new_segment_name()
        self._queue.put((name, segment))
        return name

    def run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._wal.write_segment(self._pdir, item[1], item[0])
                except Exception as err:  # re-raised on the task's thread
                    self._error = err

    def drain(self) -> None:
        """Wait until every submitted segment is durable; raises the first failed write."""
        self.stop()
        self._raise_failure()

    def stop(self) -> None:
        if not self._done:
            self._done = True
            self._queue.put(None)
            self.join()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error


def _confirm_finish(
    conns: list[ConsumerConnection], wal: WAL, pdir: str, dedupe: _Dedupe, timeout: float
) -> None:
    try:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for conn in conns:
                sel.register(conn.sock, selectors.EVENT_READ, conn)
            pending = len(conns)
            while pending:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                for key, _ in sel.select(wait):
                    conn = key.data
                    conn.read_closing(dedupe)
                    if conn.eof:
                        sel.unregister(key.fileobj)
                        pending -= 1
        failed: list[bytes] = []
        for conn in conns:
            if not conn.eof:
                log.warning("nsq read: %s did not confirm %d FINs", conn.address, conn.kept)
                failed.extend(split_ids(conn.ids))
            elif conn.fin_failed:
                mine = set(split_ids(conn.ids))
                failed.extend(i for i in conn.fin_failed if i in mine)
        wal.mark_finned(pdir, failed)
    except Exception as err:  # the partition stays "unconfirmed": safe, only noisier
        log.warning("nsq read: confirming FINs in %s failed: %s", pdir, err)
    finally:
        for conn in conns:
            conn.close()


class _PartitionRead:
    def __init__(self, plan: PartitionPlan, options: SourceOptions, wal: WAL, pdir: str) -> None:
        self.plan = plan
        self.options = options
        self.wal = wal
        self.pdir = pdir
        self.dedupe = _Dedupe(wal, plan.nsqd, plan.topic)
        self.conns: list[ConsumerConnection] = []
        self.opened: list[ConsumerConnection] = []  # every connection, for the log line
        self.segments: list[str] = []
        self.writer = _SegmentWriter(wal, pdir)
        self.rows = 0
        self.msg_timeout = 60.0
        self.started = time.monotonic()

    def run(self) -> Iterator[Any]:
        plan = self.plan
        try:
            self._subscribe()
        except NSQConnectionError as err:
            # nsqd is gone (or not reachable): its messages stay there for a later batch.
            log.warning(
                "nsq read: %s; partition %d of batch %d is empty", err, plan.index, plan.batch
            )
            self.close_connections()
            self.wal.seal(self.pdir, [], 0, plan.nsqd, plan.topic)
            return
        keepalive = _Keepalive(self.conns, self.msg_timeout)
        keepalive.start()
        self.writer.start()
        try:
            try:
                yield from self._collect()
                yield from self._stop_delivery()
                self.writer.drain()
            except LogWriteError as err:
                self._give_back()
                raise self._not_sealed(err) from err
            except Exception:
                self._give_back()  # nothing is sealed, so nothing of this attempt counts
                raise
            try:
                won = self.wal.seal(self.pdir, self.segments, self.rows, plan.nsqd, plan.topic)
            except LogWriteError as err:  # raised only while the seal is not created
                self._give_back()
                raise self._not_sealed(err) from err
        finally:
            keepalive.stop()
        if not won:
            self._give_back()
            raise SealLostError(
                f"batch {plan.batch} partition {plan.index} was sealed by another attempt"
            )
        self._test_crash_hook()
        self._finish()

    def _not_sealed(self, err: LogWriteError) -> LogWriteError:
        """A failed log write, saying also why nothing is lost."""
        plan = self.plan
        return err.explained(
            f"batch {plan.batch} partition {plan.index} of the nsq source is not sealed: none "
            f"of its messages was FIN'd, nsqd delivers them again; once walLocation takes "
            f"writes again, a retry or a restart from the checkpoint reads them"
        )

    def close_connections(self) -> None:
        for conn in self.conns:
            conn.close()

    def close(self) -> None:
        plan = self.plan
        if self.writer.is_alive():  # the task failed: its unsealed segments are garbage
            self.writer.stop()
        self.close_connections()
        log.info(
            "nsq read: run=%s batch=%d partition=%d nsqd=%s quota=%d rows=%d dropped=%d %.0fms",
            plan.run,
            plan.batch,
            plan.index,
            plan.nsqd,
            plan.quota,
            self.rows,
            sum(c.dropped for c in self.opened),
            (time.monotonic() - self.started) * 1000,
        )

    def _subscribe(self) -> None:
        """Open ceil(quota / max RDY) subscribed connections and set their RDY.

        The first connection learns nsqd's ``max_rdy_count``; each other one sends IDENTIFY,
        SUB and RDY in one write and is not waited for: its messages flow at once, and
        :meth:`ConsumerConnection.feed` skips its replies (or raises on an error).
        """
        o = self.options
        plan = self.plan

        def connect(ready: int) -> ConsumerConnection:
            conn = ConsumerConnection(plan.nsqd, o.connect_timeout)
            self.conns.append(conn)
            self.opened.append(conn)
            conn.send_subscribe(
                plan.topic,
                plan.channel,
                msg_timeout_ms=o.msg_timeout_ms,
                output_buffer_timeout_ms=o.output_buffer_timeout_ms,
                output_buffer_size=o.output_buffer_size,
                ready=ready,
            )
            return conn

        first = connect(0)
        identity = first.await_subscribed()
        max_rdy = min(o.max_in_flight_per_connection, int(identity.get("max_rdy_count", 2500)))
        self.msg_timeout = int(identity.get("msg_timeout", 60_000)) / 1000.0
        count = math.ceil(plan.quota / max_rdy)
        base, extra = divmod(plan.quota, count)
        first.ready(base + (1 if extra else 0))
        for j in range(1, count):
            connect(base + (1 if j < extra else 0))

    def _segment(self, cols: Columns) -> Iterator[Any]:
        """Queue ``cols`` as a segment for the writer, and hand its rows to Spark."""
        plan = self.plan
        segment = to_segment(cols)
        self.segments.append(self.writer.submit(segment))
        batch = with_constants(segment, plan.topic, plan.channel, plan.nsqd, self.options.columns)
        self.rows += batch.num_rows
        for start in range(0, batch.num_rows, OUTPUT_ROWS):
            yield batch.slice(start, OUTPUT_ROWS)

    def _collect(self) -> Iterator[Any]:
        """Receive until the quota, idleTimeout without a message, or the read budget."""
        o = self.options
        quota = self.plan.quota
        chunk = max(1, o.wal_segment_rows)
        # In-flight messages must not time out while collecting: stay well inside msg_timeout.
        budget_end = time.monotonic() + min(o.read_budget, self.msg_timeout / 2)
        cols = Columns()
        kept = 0
        last_progress = time.monotonic()
        with selectors.DefaultSelector() as sel:
            for conn in self.conns:
                sel.register(conn.sock, selectors.EVENT_READ, conn)
            while kept < quota:
                now = time.monotonic()
                wait = min(last_progress + o.idle_timeout, budget_end) - now
                if wait <= 0:
                    break
                for key, _ in sel.select(wait):
                    conn = key.data
                    before = conn.dropped
                    got = conn.pump(cols, self.dedupe)
                    if got or conn.dropped != before:
                        kept += got
                        last_progress = time.monotonic()
                    if conn.eof:
                        raise NSQConnectionError(f"{conn.address}: closed by nsqd while reading")
                if len(cols) >= chunk:
                    yield from self._segment(cols)
                    cols = Columns()
                    # Time spent in Spark's hands is not idleness of the channel.
                    last_progress = time.monotonic()
        if len(cols):
            yield from self._segment(cols)

    def _stop_delivery(self) -> Iterator[Any]:
        """CLS every connection and read until each has answered CLOSE_WAIT.

        Messages that arrive meanwhile were sent within RDY: they form a last segment.
        """
        for conn in self.conns:
            conn.start_close()
        cols = Columns()
        deadline = time.monotonic() + self.options.connect_timeout
        with selectors.DefaultSelector() as sel:
            for conn in self.conns:
                if not conn.close_wait:
                    sel.register(conn.sock, selectors.EVENT_READ, conn)
            while any(not c.close_wait for c in self.conns):
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise NSQConnectionError(f"{self.plan.nsqd}: no CLOSE_WAIT in time")
                for key, _ in sel.select(wait):
                    conn = key.data
                    conn.pump(cols, self.dedupe)
                    if conn.eof:
                        raise NSQConnectionError(
                            f"{conn.address}: closed by nsqd before CLOSE_WAIT"
                        )
        if len(cols):
            yield from self._segment(cols)

    def _finish(self) -> None:
        """FIN on every connection and half-close; a thread then waits until nsqd confirms
        (EOF) and records the ids whose FIN failed or was not confirmed in ``FINNED``.

        The task does not wait for the confirmation: the rows are sealed, so it only decides
        which ids need dedupe. If the worker dies first, ``FINNED`` is missing and all the
        partition's ids count as unconfirmed, which is safe.
        """
        try:
            for conn in self.conns:
                conn.send_finish()
        except NSQConnectionError as err:  # the partition stays "unconfirmed": safe
            log.warning("nsq read: FIN failed: %s", err)
            return
        conns, self.conns = self.conns, []  # the confirming thread owns them now
        threading.Thread(
            target=_confirm_finish,
            args=(conns, self.wal, self.pdir, self.dedupe, 2 * self.options.connect_timeout),
            name="nsq-fin-confirm",
            daemon=True,
        ).start()

    def _give_back(self) -> None:
        """This attempt's rows must not be used: stop delivery on every connection (CLS; what
        arrives until CLOSE_WAIT is "late"), then REQ everything it received, so that nsqd
        has the messages back at once, not at msg_timeout. A REQ sent while RDY was still open
        would only hand the message back to one of the task's connections. Best effort: a
        connection that fails here leaves its messages to the timeout."""
        scratch = Columns()
        with selectors.DefaultSelector() as sel:
            for conn in self.conns:
                conn.accepting = False
                try:
                    if not conn.closing:
                        conn.start_close()
                except NSQConnectionError:
                    continue
                if not conn.close_wait and not conn.eof:
                    sel.register(conn.sock, selectors.EVENT_READ, conn)
            deadline = time.monotonic() + self.options.connect_timeout
            while sel.get_map():
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                for key, _ in sel.select(wait):
                    conn = key.data
                    try:
                        conn.pump(scratch, self.dedupe)
                    except (NSQConnectionError, NSQErrorFrame):
                        conn.eof = True
                    if conn.close_wait or conn.eof:
                        sel.unregister(key.fileobj)
        self._requeue_all()

    def _requeue_all(self) -> None:
        for conn in self.conns:
            try:
                conn.requeue_all()
            except NSQConnectionError as err:
                log.warning("nsq read: requeue failed (the messages will time out): %s", err)

    def _test_crash_hook(self) -> None:
        crash = self.options.test_crash_after_wal
        if crash is None or crash != (self.plan.batch, self.plan.index):
            return
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0:
            log.warning("nsq read: test hook: crashing after the WAL write, before FIN")
            os._exit(37)
