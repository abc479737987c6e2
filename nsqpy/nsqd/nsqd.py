"""The nsqd engine root: topics, the queue scan, and lifecycle hooks (no socket code).

The servers call into it; it calls back only through the small ``Consumer``
interface (channel.py) and the ``wakeup`` hook, so it runs under an event loop or
under a unit test driving it by hand.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nsqpy.common.log import Level, Logger
from nsqpy.nsqd.backend import BackendQueue, DummyBackend, RefusingBackend
from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.e2e import E2EStream
from nsqpy.nsqd.topic import Topic
from nsqpy.wire.names import is_ephemeral

if TYPE_CHECKING:
    from nsqpy.nsqd.options import Options

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
    ) -> None:
        self.opts = opts
        self.logger = logger or Logger(opts.log_prefix)
        self.topics: dict[str, Topic] = {}
        self.start_time = time.time()
        self.exiting = False
        self._backend_factory = backend_factory
        # Channels that have in-flight or deferred messages: the queue scan's sample space.
        self._scan_set: set[Channel] = set()
        self._pump_set: set[Topic] = set()
        # Set by the server: asks for run_pending() to be called soon.
        self.wakeup: Callable[[], None] = lambda: None
        # Lifecycle listeners (metadata persistence, lookupd registration): (event, topic, channel).
        self.listeners: list[Callable[[str, Topic | None, Channel | None], None]] = []

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
        return RefusingBackend()

    def new_e2e_stream(self) -> E2EStream | None:
        """A latency stream for a channel, when --e2e-processing-latency-percentile is set."""
        percentiles = self.opts.e2e_processing_latency_percentiles
        if not percentiles:
            return None
        return E2EStream(percentiles, self.opts.e2e_processing_latency_window_time)

    def persist_metadata(self) -> None:
        """Write nsqd.dat (topics, channels, pause state); the durability work fills this in."""

    # -- topics -------------------------------------------------------------------------------

    def get_topic(self, name: str) -> Topic:
        """The topic, created (and announced) if it does not exist."""
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(name, self, self.new_backend(name, is_ephemeral(name)))
            self.topics[name] = topic
            self.logf_info(f"TOPIC({name}): created")
            self._emit("topic_created", topic, None)
        return topic

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its channels; raises KeyError if it does not exist."""
        topic = self.topics[name]
        self.logf_info(f"TOPIC({name}): deleting")
        topic.close(deleted=True)
        del self.topics[name]
        self._pump_set.discard(topic)
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
        """One step of deferred work (backlog pumps); True if more is pending."""
        for topic in list(self._pump_set):
            if not topic.pump(PUMP_BUDGET):
                self._pump_set.discard(topic)
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
        """Graceful exit of the engine: every topic and channel hands what it holds to its backend."""
        self.exiting = True
        for topic in list(self.topics.values()):
            topic.close(deleted=False)
        self._scan_set.clear()
        self._pump_set.clear()
