"""The nsqd engine root: topics, the queue scan, and lifecycle hooks (no socket code).

The servers call into it; it calls back only through the small ``Consumer``
interface (channel.py) and the ``wakeup`` hook, so it runs under an event loop or
under a unit test driving it by hand.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nsqpy.common.log import Level, Logger
from nsqpy.diskqueue import DiskQueue, DiskQueueError
from nsqpy.nsqd import metadata
from nsqpy.nsqd.backend import (
    BackendError,
    BackendQueue,
    DiskBackend,
    DummyBackend,
    RefusingBackend,
)
from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.e2e import E2EStream
from nsqpy.nsqd.message import GUIDFactory
from nsqpy.nsqd.policy import PolicyBook
from nsqpy.nsqd.topic import InvalidNameError, Topic
from nsqpy.wire.names import is_ephemeral, is_valid_topic_name
from nsqpy.wire.v2 import MESSAGE_HEADER_SIZE, MPubBody

if TYPE_CHECKING:
    from nsqpy.nsqd.options import Options
    from nsqpy.nsqd.shards import Shards

# How long an exit waits for a disk that refuses nsqd.dat/nsqd.deferred.dat (seconds).
EXIT_DISK_RETRY = 3.0
# How many backlog messages one pump step moves before yielding to the event loop.
PUMP_BUDGET = 10_000
# Scan rounds in one tick before yielding, however dirty (Go loops without bound).
MAX_SCAN_ROUNDS = 16


class NSQD:
    """Topics and channels of one nsqd, and the operations on them."""

    def __init__(
        self,
        opts: Options,
        *,
        logger: Logger | None = None,
        backend_factory: Callable[[str], BackendQueue] | None = None,
        use_disk: bool = False,
    ) -> None:
        """``use_disk``: durable topics and channels spill to disk queues in --data-path
        (the server's mode); without it they refuse overflow (unit tests)."""
        self.opts = opts
        self.logger = logger or Logger(opts.log_prefix)
        self.topics: dict[str, Topic] = {}
        # One ID factory for every topic (Go has one per topic): IDs are unique in the whole
        # nsqd, so a dead letter or a copy in another topic never shares its source's ID.
        self.ids = GUIDFactory(opts.node_id)
        self.start_time = time.time()
        self.exiting = False
        self._backend_factory = backend_factory
        # Channels that have in-flight or deferred messages: the queue scan's sample space.
        self._scan_set: set[Channel] = set()
        self._pump_set: set[Topic] = set()
        # Between hold_dispatch() and release_dispatch(): the channels whose consumers get
        # what was published meanwhile (a dict, so that each is dispatched once).
        self._dispatch_held = False
        self._dispatch_later: dict[Channel, None] = {}
        # Set by the server: asks for run_pending() to be called soon.
        self.wakeup: Callable[[], None] = lambda: None
        # Set by the server: told of every read before it is handled (common/idlepoll.py);
        # returns the time.monotonic() of it.
        self.input_seen: Callable[[], float] = time.monotonic
        # Lifecycle listeners (metadata persistence, lookupd registration): (event, topic, channel).
        self.listeners: list[Callable[[str, Topic | None, Channel | None], None]] = []
        # Durability
        self.use_disk = use_disk
        self.data_path = opts.data_path or os.getcwd()
        self.disk_backends: set[DiskBackend] = set()
        self._touched: set[DiskBackend] = set()
        # Set by the server: run a blocking function in a worker thread, then call back on the loop.
        self.run_in_thread: (
            Callable[[Callable[[], None], Callable[[BaseException | None], None]], None] | None
        ) = None
        self._loading = False
        self._metadata_dirty = False
        self._metadata_writing = False
        self._metadata_error: str | None = None  # the last failed write's, until one works
        self._deferred_read = False
        # Message policies (policy.py): by topic and channel name, with their side file.
        self.policies = PolicyBook(self)
        # --workers (shards.py): the other workers, and what this one hands them: publishes
        # to topics it does not own, and (but for worker 0) its part of nsqd.dat
        self.shards: Shards | None = None
        self.forward_publish: (
            Callable[[str, list[bytes] | MPubBody, float, list[int] | None], None] | None
        ) = None
        self.metadata_sink: Callable[[list[metadata.TopicMeta]], None] | None = None
        self.remote_metadata: Callable[[], list[metadata.TopicMeta]] | None = None
        self.policy_sink: Callable[[dict[str, Any]], None] | None = None
        self.deferred_name = metadata.DEFERRED_FILE
        if use_disk:
            self.listeners.append(self._persist_on_change)

    # -- logging ------------------------------------------------------------------------------

    def logf_info(self, msg: str) -> None:
        self.logger.log(Level.INFO, msg)

    def logf_error(self, msg: str) -> None:
        self.logger.log(Level.ERROR, msg)

    # -- factories ----------------------------------------------------------------------------

    def new_backend(self, name: str, ephemeral: bool) -> BackendQueue:
        if ephemeral:
            return DummyBackend()
        if self._backend_factory is not None:
            return self._backend_factory(name)
        if not self.use_disk:
            return RefusingBackend()
        opts = self.opts
        dq = DiskQueue(
            name,
            self.data_path,
            opts.max_bytes_per_file,
            MESSAGE_HEADER_SIZE,
            opts.max_msg_size + MESSAGE_HEADER_SIZE,
            opts.sync_every,
            opts.sync_timeout,
            self._disk_log,
        )
        backend = DiskBackend(dq, self._backend_touched, self.disk_backends.discard)
        self.disk_backends.add(backend)
        return backend

    def _disk_log(self, level: int, msg: str) -> None:
        self.logger.log(Level(level), msg)

    def new_e2e_stream(self) -> E2EStream | None:
        """A latency stream for a channel, when --e2e-processing-latency-percentile is set."""
        percentiles = self.opts.e2e_processing_latency_percentiles
        if not percentiles:
            return None
        return E2EStream(percentiles, self.opts.e2e_processing_latency_window_time)

    @property
    def loading(self) -> bool:
        """True while topics and channels are being recreated from nsqd.dat."""
        return self._loading

    # -- durability (spec §7.5-§7.7) ---------------------------------------------------------

    @property
    def health_error(self) -> str | None:
        """The last disk write error still standing (``/ping`` answers ``NOK - <it>``)."""
        for backend in self.disk_backends:
            if backend.dq.last_error:
                return backend.dq.last_error
        return None

    def load_metadata(
        self,
        topics: list[metadata.TopicMeta] | None = None,
        due: dict[str, dict[str, int]] | None = None,
    ) -> None:
        """Recreate topics and channels (and pause state) from nsqd.dat; raises MetadataError.

        ``topics`` and ``due``: nsqd.dat's and the deferred side file's contents, read
        already (a --workers worker gets them from the supervisor, which removed the side
        file); else both files are read here."""
        worker = due is not None
        if not worker:
            topics = metadata.read_metadata(self.data_path)
        self.policies.load()
        self._loading = True
        try:
            for t in topics or []:
                if self.shards is not None and not self.shards.owns(t.name):
                    continue  # another worker's
                try:
                    topic = self.get_topic(t.name)
                except InvalidNameError:
                    self.logger.warn(f"skipping creation of invalid topic {t.name}")
                    continue
                if t.paused:
                    topic.pause()
                for c in t.channels:
                    try:
                        channel = topic.get_channel(c.name)
                    except InvalidNameError:
                        self.logger.warn(f"skipping creation of invalid channel {c.name}")
                        continue
                    if c.paused:
                        channel.pause()
            found = self.use_disk and self._open_queues_missing_from(topics or [])
        finally:
            self._loading = False
        if found and worker:
            self.persist_metadata()  # (without workers, serve() writes nsqd.dat next)
        if due is None:
            due = metadata.read_deferred(self.data_path)
        for name, ids in due.items():
            topic_name, _, channel_name = name.partition(":")
            parent = self.topics.get(topic_name)
            owner: Topic | Channel | None = parent
            if parent is not None and channel_name:
                owner = parent.channels.get(channel_name)
            if owner is not None and ids:
                owner.redefer = {k.encode(): v for k, v in ids.items()}
        self._deferred_read = not worker  # removed once nsqd.dat is written (persist_metadata_now)

    def _open_queues_missing_from(self, topics: list[metadata.TopicMeta]) -> bool:
        """Topics and channels whose disk queue is in --data-path but not in nsqd.dat (a
        crash after they got messages, before nsqd.dat was written): made again, so that
        their messages are delivered without waiting for a client to name them (beyond Go,
        which leaves them until then)."""
        known = {t.name for t in topics} | {
            f"{t.name}:{c.name}" for t in topics for c in t.channels
        }
        found = False
        for name in metadata.queue_names(self.data_path):
            if name in known:
                continue
            topic_name, _, channel_name = name.partition(":")
            if not self.owns(topic_name) or is_ephemeral(topic_name):
                continue
            try:
                topic = self.get_topic(topic_name)
                if channel_name:
                    topic.get_channel(channel_name)
            except InvalidNameError:
                continue
            found = True
            self.logger.warn(
                f"NSQ: queue {name} found in {self.data_path}, not in nsqd.dat: reopened"
            )
        return found

    def metadata_snapshot(self) -> list[metadata.TopicMeta]:
        """nsqd.dat's topics: this engine's (and with --workers, in worker 0, the others')."""
        own = self.own_metadata()
        if self.remote_metadata is None:
            return own
        return sorted([*own, *self.remote_metadata()], key=lambda t: t.name)

    def own_metadata(self) -> list[metadata.TopicMeta]:
        return [
            metadata.TopicMeta(
                t.name,
                t.paused,
                [
                    metadata.ChannelMeta(c.name, c.paused)
                    for c in sorted(t.channels.values(), key=lambda c: c.name)
                    if not c.ephemeral
                ],
            )
            for t in sorted(self.topics.values(), key=lambda t: t.name)
            if not t.ephemeral
        ]

    def persist_metadata_now(self) -> None:
        """Write nsqd.dat on this thread (start-up and exit), then, at start-up, remove the
        deferred side file that load_metadata read (in this order, so that a data path
        nsqd cannot write fails as the Go nsqd's does); raises OSError."""
        if self.metadata_sink is not None:  # a worker but the first: worker 0 writes it
            self.metadata_sink(self.own_metadata())
            return
        self.logger.info(
            f"NSQ: persisting topic/channel metadata to {os.path.join(self.data_path, metadata.METADATA_FILE)}"
        )
        metadata.write_metadata(self.data_path, self.metadata_snapshot())
        if self._deferred_read:  # start-up: its due times are now kept in memory
            metadata.remove_deferred(self.data_path)
            self._deferred_read = False

    def persist_metadata(self) -> None:
        """Write nsqd.dat soon, off the loop; calls close together coalesce into one write."""
        if self._loading or not self.use_disk:
            return
        if self.metadata_sink is not None:  # a worker but the first: worker 0 writes it
            self.metadata_sink(self.own_metadata())
            return
        self._metadata_dirty = True
        if not self._metadata_writing:
            self._write_metadata()

    def _write_metadata(self) -> None:
        self._metadata_dirty = False
        topics = self.metadata_snapshot()

        def write() -> None:
            metadata.write_metadata(self.data_path, topics)

        if self.run_in_thread is None:
            try:
                write()
            except OSError as err:
                self._metadata_written(err)
            else:
                self._metadata_written(None)
            return
        self._metadata_writing = True
        self.run_in_thread(write, self._metadata_written)

    def _metadata_written(self, err: BaseException | None) -> None:
        self._metadata_writing = False
        if err is not None:
            # retried at the next sync tick (a full disk may have room again by then);
            # logged once per distinct error, not at every try
            self._metadata_dirty = True
            if str(err) != self._metadata_error:
                self.logf_error(f"failed to persist metadata - {err} (will retry)")
            self._metadata_error = str(err)
            return
        if self._metadata_error is not None:
            self.logf_info("NSQ: persisted topic/channel metadata after an earlier failure")
            self._metadata_error = None
        if self._metadata_dirty:
            self._write_metadata()

    def _persist_at_exit(self, due: dict[str, dict[str, int]]) -> None:
        """nsqd.deferred.dat and nsqd.dat at exit, retried for up to EXIT_DISK_RETRY seconds
        while the disk refuses them (full, read-only): room made meanwhile lets the exit
        keep deferred due times and, as the queues are written next, in-flight and deferred
        messages. Past that, the error is logged and the exit goes on, as Go's does."""
        deadline = time.monotonic() + EXIT_DISK_RETRY
        while True:
            try:
                metadata.write_deferred(self.data_path, due, self.deferred_name)
                self.persist_metadata_now()
            except OSError as err:
                if time.monotonic() >= deadline:
                    self.logf_error(f"failed to persist metadata - {err}")
                    return
                if str(err) != self._metadata_error:
                    self.logf_error(f"failed to persist metadata - {err} (retrying)")
                    self._metadata_error = str(err)
                time.sleep(0.1)
                continue
            self._metadata_error = None
            return

    def _persist_on_change(self, event: str, topic: Topic | None, channel: Channel | None) -> None:
        if (channel is not None and channel.ephemeral) or (topic is not None and topic.ephemeral):
            return
        self.persist_metadata()

    def _backend_touched(self, backend: DiskBackend) -> None:
        if backend not in self._touched:
            self._touched.add(backend)
            self.wakeup()

    def flush_touched(self) -> str | None:
        """Hand every buffered disk write to the OS now; the first error, if any.

        Called before a publish is acknowledged, so that a write the disk refuses (full,
        read-only) fails that publish, as Go's per-message write would, instead of being
        acknowledged and kept only in memory."""
        if not self._touched:
            return None
        first: str | None = None
        for backend in self._touched:
            try:
                backend.dq.flush()
            except DiskQueueError as err:
                first = first or str(err)
        return first

    def sync_tick(self) -> None:
        """Every --sync-timeout: sync each disk queue that had any activity (go-diskqueue),
        and retry a failed nsqd.dat write."""
        if self._metadata_error is not None and not self._metadata_writing:
            self._write_metadata()
        for backend in list(self.disk_backends):
            if backend.dq.dirty():
                self.request_sync(backend)

    def sync_touched(self, callback: Callable[[BaseException | None], None]) -> int:
        """Sync every disk queue written or read since the last pending run, calling
        ``callback`` once per queue when its data is durable; returns how many."""
        touched, self._touched = self._touched, set()
        for backend in touched:
            self.request_sync(backend, callback)
        return len(touched)

    def request_sync(
        self, backend: DiskBackend, callback: Callable[[BaseException | None], None] | None = None
    ) -> None:
        """fsync a disk queue off the loop; a request during a running sync runs one more after it."""
        if backend.syncing:
            backend.rerun = True
            if callback is not None:
                backend.after_next_sync.append(callback)
            return
        if callback is not None:
            backend.on_synced.append(callback)
        try:
            job = backend.dq.begin_sync()
        except DiskQueueError as err:
            self._sync_done(backend, err)
            return
        backend.syncing = True
        if self.run_in_thread is None:
            try:
                job.run()
            except DiskQueueError as err:
                self._sync_done(backend, err)
                return
            self._sync_done(backend, None)
            return
        self.run_in_thread(job.run, lambda err: self._sync_done(backend, err))

    def _sync_done(self, backend: DiskBackend, err: BaseException | None) -> None:
        backend.syncing = False
        if err is not None:
            self.logf_error(f"DISKQUEUE({backend.dq.name}) failed to sync - {err}")
        callbacks, backend.on_synced = backend.on_synced, []
        for callback in callbacks:
            callback(err)
        if backend.rerun:
            backend.rerun = False
            backend.on_synced, backend.after_next_sync = backend.after_next_sync, []
            self.request_sync(backend)

    # -- topics -------------------------------------------------------------------------------

    def get_topic(self, name: str) -> Topic:
        """The topic, created (and announced) if it does not exist; raises InvalidNameError."""
        return self.topics.get(name) or self.open_topic(name)[0]

    def open_topic(self, name: str) -> tuple[Topic, bool]:
        """The topic, created if it does not exist, and whether the caller must wait for
        ``topic.when_started`` before it answers: this call created the topic, and the
        channels nsqlookupd knows of are still being made (Go's GetTopic blocks on that
        query; here only the caller that created the topic waits, and the loop goes on).
        Raises InvalidNameError: no path can make a topic with an invalid name."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic, False
        if not is_valid_topic_name(name):
            raise InvalidNameError(f"invalid topic name {name!r}")
        if self.shards is not None and not self.shards.owns(name):
            raise RuntimeError(f"topic {name!r} belongs to another worker")  # a routing bug
        topic = Topic(name, self, self.new_backend(name, is_ephemeral(name)))
        self.topics[name] = topic
        self.logf_info(f"TOPIC({name}): created")
        self._emit("topic_created", topic, None)
        return topic, topic.starting

    def publish(
        self,
        topic_name: str,
        bodies: list[bytes] | MPubBody,
        delay: float = 0.0,
        timestamps: list[int] | None = None,
    ) -> tuple[int, Topic | None]:
        """The one way messages enter nsqd (PUB, MPUB, DPUB, /pub, /mpub, dead letters):
        into the topic, created if new. Returns how many were queued and, when this call
        created a topic that is still starting, that topic: answer once it has started
        (``Topic.when_started``). Raises InvalidNameError, or BackendError (exiting, a disk
        that refuses the write: then nothing was queued)."""
        if self.exiting:
            raise BackendError("exiting")
        topic = self.topics.get(topic_name)
        if topic is not None:
            return topic.put_messages(bodies, delay, timestamps), None
        if self.forward_publish is not None and not self.owns(topic_name):
            # --workers: another worker owns it (a dead letter, say); it publishes there
            self.forward_publish(topic_name, bodies, delay, timestamps)
            return len(bodies), None
        topic, wait = self.open_topic(topic_name)
        return topic.put_messages(bodies, delay, timestamps), topic if wait else None

    # -- delivery after the replies ------------------------------------------------------------

    def hold_dispatch(self) -> None:
        """Until release_dispatch(), what is published reaches consumers only then: a server
        answers a read's publishes first, as Go's topic pump runs beside the publisher."""
        self._dispatch_held = True

    def release_dispatch(self) -> None:
        self._dispatch_held = False
        later = self._dispatch_later
        if later:
            self._dispatch_later = {}
            for channel in later:
                channel.dispatch()

    def request_dispatch(self, channel: Channel) -> None:
        """A publish queued messages in ``channel``, which has consumers: deliver them now,
        or at release_dispatch() while dispatch is held."""
        if self._dispatch_held:
            self._dispatch_later[channel] = None
        else:
            channel.dispatch()

    def owns(self, topic_name: str) -> bool:
        """Whether this engine may hold ``topic_name`` (always, but with --workers)."""
        return self.shards is None or self.shards.owns(topic_name)

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its channels; raises KeyError if it does not exist."""
        topic = self.topics[name]
        self.logf_info(f"TOPIC({name}): deleting")
        topic.close(deleted=True)
        del self.topics[name]
        self._pump_set.discard(topic)
        self.policies.forget_topic(name)
        self._emit("topic_deleted", topic, None)

    def delete_ephemeral_channel(self, channel: Channel) -> None:
        """The last consumer of an ephemeral channel left: delete it (spec §7.4)."""
        topic = self.topics.get(channel.topic_name)
        if topic is not None and topic.channels.get(channel.name) is channel:
            topic.delete_channel(channel.name)

    # -- hooks used by topics and channels -------------------------------------------------------

    def notify_channel_created(self, channel: Channel) -> None:
        self._emit("channel_created", self.topics.get(channel.topic_name), channel)

    def notify_channel_deleted(self, channel: Channel) -> None:
        self._scan_set.discard(channel)
        self._emit("channel_deleted", self.topics.get(channel.topic_name), channel)

    def _emit(self, event: str, topic: Topic | None, channel: Channel | None) -> None:
        for listener in self.listeners:
            try:
                listener(event, topic, channel)
            except Exception as err:  # a listener's failure must not break the engine
                self.logf_error(f"listener for {event} failed - {err!r}")

    def scan_candidate(self, channel: Channel) -> None:
        """A channel now has in-flight or deferred messages for the queue scan to watch."""
        self._scan_set.add(channel)

    def request_pump(self, topic: Topic) -> None:
        if topic not in self._pump_set:
            self._pump_set.add(topic)
            self.wakeup()

    def run_pending(self) -> bool:
        """One step of deferred work (backlog pumps, disk flushes and syncs); True if more is pending."""
        if self.exiting:
            return False
        for topic in list(self._pump_set):
            if not topic.pump(PUMP_BUDGET):
                self._pump_set.discard(topic)
        if self._touched:
            touched, self._touched = self._touched, set()
            for backend in touched:
                # Hand buffered records to the OS once per loop pass, so a process crash
                # loses no more than Go's per-record writes would.
                try:
                    backend.dq.flush()
                except DiskQueueError as err:
                    self.logf_error(f"DISKQUEUE({backend.dq.name}) failed to flush - {err}")
                if backend.dq.needs_sync():
                    self.request_sync(backend)
        return bool(self._pump_set)

    # -- the queue scan (spec §7.8) ---------------------------------------------------------------

    def queue_scan(self, now: float | None = None) -> int:
        """One tick of NSQ's queueScanLoop; returns how many channels were processed.

        Go samples from all channels (a list refreshed every 5 s, so a new channel's
        timeouts may fire seconds late); this samples only channels that have in-flight
        or deferred messages, kept up to date as they get them, so a deadline fires
        within one scan interval whenever there are at most --queue-scan-selection-count
        such channels.
        """
        if now is None:
            now = time.monotonic()
        self.policies.tick(now)
        processed = 0
        for _ in range(MAX_SCAN_ROUNDS):
            candidates = [c for c in self._scan_set if c.has_scan_work() and not c.exiting]
            self._scan_set = set(candidates)
            if not candidates:
                break
            count = min(self.opts.queue_scan_selection_count, len(candidates))
            sample = random.sample(candidates, count) if count < len(candidates) else candidates
            dirty = 0
            for channel in sample:
                in_flight_dirty = channel.process_in_flight_queue(now)
                deferred_dirty = channel.process_deferred_queue(now)
                if in_flight_dirty or deferred_dirty:
                    dirty += 1
            processed += count
            if dirty / count <= self.opts.queue_scan_dirty_percent:
                break
        return processed

    # -- shutdown -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Graceful exit of the engine (spec §7.6): nsqd.dat, then every topic and channel hands
        its memory queue, in-flight and deferred messages to its disk queue, which syncs.

        Deferred messages also get their due time recorded in a side file, so that a restart
        defers them again (beyond NSQ: its issue #1107); the Go nsqd ignores that file.
        """
        self.exiting = True
        if self.use_disk:
            due: dict[str, dict[str, int]] = {}
            for topic in self.topics.values():
                if topic.ephemeral:
                    continue
                if d := topic.deferred_due():
                    due[topic.name] = {k.decode(): v for k, v in d.items()}
                for channel in topic.channels.values():
                    if not channel.ephemeral and (d := channel.deferred_due()):
                        due[f"{topic.name}:{channel.name}"] = {k.decode(): v for k, v in d.items()}
            self._persist_at_exit(due)
        for topic in list(self.topics.values()):
            topic.close(deleted=False)
        self._scan_set.clear()
        self._pump_set.clear()
        self._touched.clear()  # the queues are closed: nothing left to flush or sync
