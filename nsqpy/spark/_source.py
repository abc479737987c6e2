"""The source: a partitioned ``DataSourceStreamReader`` (and a batch ``DataSourceReader``).

Where things run (pyspark-notes §2.2): ``initialOffset``, ``latestOffset``, ``partitions``,
``commit`` and ``prepareForTriggerAvailableNow`` run in one long-lived Python process on the
driver, on the same object; they only *plan*. ``read`` runs in executor tasks, on a fresh copy
unpickled from the planner's instance: only what ``__init__`` sets reaches it, and everything a
batch needs travels in the :class:`~nsqpy.spark._offsets.PartitionPlan`.

Planning reads from each nsqd's ``/stats`` (HTTP address from nsqlookupd's ``/lookup``
producers, or the ``nsqdHTTPAddresses`` option) what the channel holds *and what is still on its
way to it* (:class:`~nsqpy.spark._http.Backlog`): a channel created by the query gets the
topic's backlog pumped in over time, so its depth alone undercounts. The answer is cached for
250 ms: Spark polls ``latestOffset`` every 10 ms when idle. Without a depth (no HTTP address, or
``/stats`` failing) it plans a fixed quota and waits ``emptyPollInterval`` after a batch that
found that nsqd empty.

Trigger.AvailableNow takes a snapshot of everything the channel holds or will get back
(ready, incoming, in flight, deferred) and reads until that many rows were read, or nothing is
left. When only messages in flight elsewhere or deferred remain, ``latestOffset`` waits for them
(polling ``/stats``) up to ``IN_TRANSIT_WAIT`` before ending the query: returning "no new
offset" is what ends an AvailableNow query.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Final

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from nsqpy.spark._http import (
    Backlog,
    HTTPError,
    Producer,
    channel_backlogs,
    lookup_producers,
    lookup_topics,
    nsqd_topics,
)
from nsqpy.spark._offsets import (
    Offset,
    PartitionPlan,
    Source,
    partitions_between,
    plan_partitions,
    proportional,
)
from nsqpy.spark._options import SourceOptions
from nsqpy.spark._task import read_partition
from nsqpy.spark._wal import WAL

__all__ = ["NSQBatchReader", "NSQStreamReader"]

log = logging.getLogger("nsqpy.spark")

DEPTH_CACHE_SECONDS: Final = 0.25
HTTP_TIMEOUT: Final = 5.0
# ReadAllAvailable still caps a micro-batch: all its rows pass through the read tasks' memory.
MAX_ROWS_PER_BATCH: Final = 1_000_000
# Batch reads leave their log behind for dedupe; whole runs older than this are removed.
BATCH_RUN_RETENTION: Final = 3600.0
# Trigger.AvailableNow: how long to wait for messages in flight elsewhere (they come back after
# the consumer's msg_timeout, nsqd's default 60 s) or deferred, when nothing else is left.
IN_TRANSIT_WAIT: Final = 75.0
IN_TRANSIT_POLL: Final = 0.25


class _Planner:
    """Driver-side planning state (discovery and depth caches, Trigger.AvailableNow budget,
    the minimum per trigger). Everything is keyed by :data:`Source`: (topic, nsqd)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.wal = WAL(
            options.wal_location,
            fsync=options.fsync,
            fail_on_data_loss=options.fail_on_data_loss,
        )
        self.run = uuid.uuid4().hex[:12]
        self._sources: tuple[float, list[tuple[str, Producer]]] | None = None
        self._depths: tuple[float, dict[Source, Backlog | None]] | None = None
        self._idle_until: dict[Source, float] = {}
        self._accounted: set[tuple[str, int]] = set()
        self._checked_runs: set[str] = set()
        # minMessagesPerTrigger: when the last batch was planned (or the query started).
        self._last_trigger = time.monotonic()
        # Trigger.AvailableNow: rows left per source with a depth (None: not in that mode),
        # the sources without one, the batch the budget starts after, and those found drained.
        self._available: dict[Source, int] | None = None
        self._available_unknown: set[Source] = set()
        self._available_base: int | None = None
        self._drained: set[Source] = set()
        self._in_transit_wait = IN_TRANSIT_WAIT

    # -- discovery and depth ----------------------------------------------------------------

    def sources(self) -> list[tuple[str, Producer]]:
        """Every (topic, nsqd) to read: the given topics, or those matching ``topicPattern``,
        on each nsqd that has them. Discovery through HTTP is re-read at most every
        ``lookupdPollInterval``; while it fails, the last answer is used."""
        o = self.options
        if o.nsqd_tcp_addresses and o.topic_pattern is None:
            return [(t, p) for t in o.topics for p in self._listed()]
        now = time.monotonic()
        if self._sources is None or now - self._sources[0] >= o.lookupd_poll_interval:
            try:
                found = self._discover()
            except HTTPError as err:
                if self._sources is None:
                    raise
                log.warning("nsq source: discovery failed, using the last answer: %s", err)
                found = self._sources[1]
            self._sources = (now, found)
        return self._sources[1]

    def _listed(self) -> list[Producer]:
        o = self.options
        https: Sequence[str | None] = o.nsqd_http_addresses or [None] * len(o.nsqd_tcp_addresses)
        return [Producer(t, h) for t, h in zip(o.nsqd_tcp_addresses, https, strict=True)]

    def _discover(self) -> list[tuple[str, Producer]]:
        o = self.options
        pattern = o.topic_pattern
        if o.nsqd_tcp_addresses:  # topicPattern over each listed nsqd's /stats
            assert pattern is not None
            found: list[tuple[str, Producer]] = []
            for p in self._listed():
                assert p.http_address is not None  # checked with the options
                try:
                    names = nsqd_topics(p.http_address, HTTP_TIMEOUT)
                except HTTPError as err:
                    log.warning("nsq source: no topics from %s: %s", p.http_address, err)
                    names = [t for t, q in self._sources[1] if q == p] if self._sources else []
                found.extend((t, p) for t in names if pattern.fullmatch(t))
            return found
        lookupds = o.lookupd_http_addresses
        topics = list(o.topics)
        if pattern is not None:
            topics = [t for t in lookup_topics(lookupds, HTTP_TIMEOUT) if pattern.fullmatch(t)]
        return [(t, p) for t in topics for p in lookup_producers(lookupds, t, HTTP_TIMEOUT)]

    def depths(self, *, fresh: bool = False) -> dict[Source, Backlog | None]:
        """The channel's backlog per (topic, nsqd TCP address); None where unknown. One
        ``/stats`` request per nsqd, whatever the number of topics."""
        now = time.monotonic()
        if not fresh and self._depths is not None and now - self._depths[0] < DEPTH_CACHE_SECONDS:
            return self._depths[1]
        o = self.options
        by_nsqd: dict[Producer, list[str]] = {}
        for topic, p in self.sources():
            by_nsqd.setdefault(p, []).append(topic)
        depths: dict[Source, Backlog | None] = {}
        for p, topics in by_nsqd.items():
            backlogs: dict[str, Backlog] = {}
            if p.http_address is not None:
                try:
                    backlogs = channel_backlogs(p.http_address, topics, o.channel, HTTP_TIMEOUT)
                except HTTPError as err:
                    log.warning("nsq source: no depth from %s: %s", p.http_address, err)
            for topic in topics:
                depths[(topic, p.tcp_address)] = backlogs.get(topic)
        self._depths = (time.monotonic(), depths)
        return depths

    def lag(self) -> dict[str, Any] | None:
        """How far behind the query is (``reportLatestOffset``): per topic and nsqd, what the
        channel holds (``channelDepth``), what the topic still moves into it
        (``topicDepth``), and what is ``inFlight`` or ``deferred``; the sum is
        ``messagesBehind``. From the last ``/stats`` (at most 250 ms old while the query
        plans)."""
        try:
            depths = self.depths()
        except HTTPError as err:
            log.warning("nsq source: no lag: %s", err)
            return None
        topics: dict[str, dict[str, Any]] = {}
        behind = 0
        unknown = 0
        for (topic, address), backlog in sorted(depths.items()):
            if backlog is None:
                unknown += 1
                topics.setdefault(topic, {})[address] = {"unknown": True}
                continue
            behind += backlog.total
            topics.setdefault(topic, {})[address] = {
                "channelDepth": backlog.ready,
                "topicDepth": backlog.incoming,
                "inFlight": backlog.in_flight,
                "deferred": backlog.deferred,
                "messagesBehind": backlog.total,
            }
        return {
            "channel": self.options.channel,
            "messagesBehind": behind,
            "nsqdWithoutDepth": unknown,
            "topics": topics,
        }

    # -- offsets ----------------------------------------------------------------------------

    def initial_offset(self) -> dict[str, Any]:
        return Offset(self.run, 0, {}).to_json()

    @property
    def offset_topic(self) -> str:
        """The topic of version 1 offsets and of seals that name none: the query's one."""
        return self.options.topics[0] if len(self.options.topics) == 1 else ""

    def offset(self, data: dict[str, Any]) -> Offset:
        """Parse one of this query's offsets."""
        return Offset.from_json(data, self.offset_topic)

    def check_log(self, offset: Offset) -> None:
        """Once per run: an offset past batch 0 needs its run's log (``failOnDataLoss``)."""
        if offset.batch > 0 and offset.run not in self._checked_runs:
            self.wal.check_run(offset.run)
            self._checked_runs.add(offset.run)

    def _account(self, start: Offset) -> None:
        """Learn from the finished batch ``start`` (read counts from its seals), once."""
        if start.batch == 0 or (start.run, start.batch) in self._accounted:
            return
        self._accounted.add((start.run, start.batch))
        try:
            counts = self.wal.sealed_counts(start.run, start.batch, self.offset_topic)
        except OSError as err:
            log.warning("nsq source: cannot read the seals of batch %d: %s", start.batch, err)
            return
        now = time.monotonic()
        for source, quotas in start.quotas.items():
            got = counts.get(source, 0)
            if got == 0:
                self._idle_until[source] = now + self.options.empty_poll_interval
            base = self._available_base
            if self._available is not None and base is not None and start.batch > base:
                if source in self._available:
                    self._available[source] -= got
                elif got < sum(quotas):
                    self._drained.add(source)

    def latest_offset(self, start_json: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        o = self.options
        start = self.offset(start_json)
        self.check_log(start)
        if self._available is not None and self._available_base is None:
            self._available_base = start.batch
        self._account(start)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else MAX_ROWS_PER_BATCH
        wants = self._wants(self.depths())
        if not any(wants.values()) and self._awaits_in_transit():
            wants = self._wait_for_in_transit()
        quotas = proportional(wants, budget)
        if not sum(quotas.values()) or self._too_few(sum(quotas.values())):
            return start_json
        parts = plan_partitions(
            quotas, o.num_partitions or max(2, len(quotas)), o.max_messages_per_partition
        )
        self.wal.start_run(start.run)
        self._last_trigger = time.monotonic()
        return Offset(start.run, start.batch + 1, parts).to_json()

    def _too_few(self, count: int) -> bool:
        """``minMessagesPerTrigger``: wait for more, unless ``maxTriggerDelay`` passed since
        the last batch (or the start); as Kafka's ``minOffsetsPerTrigger``, not under
        Trigger.AvailableNow."""
        least = self.options.min_messages_per_trigger
        if least is None or count >= least or self._available is not None:
            return False
        return time.monotonic() - self._last_trigger < self.options.max_trigger_delay

    def _wants(self, depths: dict[Source, Backlog | None]) -> dict[Source, int]:
        """How many messages each nsqd could give the next batch: ready or on their way in.
        In flight and deferred messages are left out: planning them would only make read tasks
        wait; they are planned once they are back in the channel."""
        o = self.options
        now = time.monotonic()
        fallback = o.max_in_flight_per_connection * 4
        wants: dict[Source, int] = {}
        for source, depth in depths.items():
            if depth is None:
                idle = now < self._idle_until.get(source, 0.0)
                wants[source] = 0 if idle or source in self._drained else fallback
            else:
                wants[source] = depth.available
            if self._available is not None:
                if source in self._available:
                    wants[source] = min(wants[source], max(0, self._available[source]))
                elif source not in self._available_unknown:
                    wants[source] = 0  # an nsqd or topic that appeared after the query started
        return wants

    def _awaits_in_transit(self) -> bool:
        """Trigger.AvailableNow with rows still owed by an nsqd whose channel has nothing ready
        but messages in flight or deferred (in the cached stats)."""
        if self._available is None or self._depths is None:
            return False
        return any(
            backlog is not None and backlog.in_transit > 0 and self._available.get(a, 0) > 0
            for a, backlog in self._depths[1].items()
        )

    def _wait_for_in_transit(self) -> dict[Source, int]:
        """Poll ``/stats`` until something is ready again, nothing is in transit any more, or
        ``IN_TRANSIT_WAIT`` passed; the wants at that point."""
        deadline = time.monotonic() + self._in_transit_wait
        log.info("nsq source: AvailableNow waits for in-flight or deferred messages")
        while True:
            time.sleep(IN_TRANSIT_POLL)
            wants = self._wants(self.depths(fresh=True))
            if any(wants.values()) or not self._awaits_in_transit():
                return wants
            if time.monotonic() >= deadline:
                log.warning(
                    "nsq source: AvailableNow ends with messages still in flight or deferred"
                )
                return wants

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read what the channel holds or will get (ready, incoming, in
        flight, deferred) when the query starts, then stop (budget spent or nothing left)."""
        depths = self.depths(fresh=True)
        self._available = {a: d.total for a, d in depths.items() if d is not None}
        self._available_unknown = {a for a, d in depths.items() if d is None}
        self._available_base = None
        self._drained = set()

    def commit(self, end_json: dict[str, Any]) -> None:
        """Garbage collection only: batches before ``end`` can never be replayed."""
        end = self.offset(end_json)
        try:
            self.wal.collect_garbage(end.run, end.batch - 1, self.options.dedupe_retention)
        except OSError as err:
            log.warning("nsq source: WAL garbage collection failed: %s", err)


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("nsq")``: see :mod:`nsqpy.spark` for the guarantees."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._planner_state: _Planner | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; the planner's state belongs to the driver.
        return {"options": self.options, "_planner_state": None}

    @property
    def _planner(self) -> _Planner:
        if self._planner_state is None:
            self._planner_state = _Planner(self.options)
        return self._planner_state

    def initialOffset(self) -> dict[str, Any]:
        return self._planner.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return self._planner.latest_offset(start, limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._planner.prepare_available_now()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The lag, for ``StreamingQueryProgress.sources[].latestOffset`` (the Python API has
        no source metrics): see :meth:`_Planner.lag` and docs/SPARK.md, "Lag"."""
        return self._planner.lag()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        planner = self._planner
        planner.check_log(planner.offset(end))
        plans = partitions_between(start, end, planner.offset_topic, self.options.channel)
        return [InputPartition(p) for p in plans]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        plan: PartitionPlan = partition.value
        return read_partition(plan, self.options)

    def commit(self, end: dict[str, Any]) -> None:
        self._planner.commit(end)


def _even_split(addresses: list[Source], total: int) -> dict[Source, int]:
    if not addresses:
        return {}
    base, extra = divmod(total, len(addresses))
    return {a: base + (1 if j < extra else 0) for j, a in enumerate(sorted(addresses))}


class NSQBatchReader(DataSourceReader):
    """``spark.read.format("nsq")``: takes up to ``maxMessages`` messages (all that are ready
    when the plan is made, if not given) or until the channel is idle, through the log."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        planner = _Planner(o)
        wal = planner.wal
        try:
            wal.collect_stale_runs("b-", BATCH_RUN_RETENTION, o.dedupe_retention)
        except OSError as err:
            log.warning("nsq source: WAL garbage collection failed: %s", err)
        depths = planner.depths(fresh=True)
        if not depths:
            log.warning("nsq source: no topic to read (topicPattern matched none)")
        if o.max_messages is not None:
            known = {a: d.available for a, d in depths.items() if d is not None}
            if len(known) == len(depths):
                wants = proportional(known, o.max_messages)
            else:  # without every depth, share maxMessages evenly
                wants = _even_split(list(depths), o.max_messages)
        else:
            fallback = o.max_messages_per_partition
            wants = {a: fallback if d is None else d.available for a, d in depths.items()}
        parts = plan_partitions(
            wants, o.num_partitions or max(2, len(wants)), o.max_messages_per_partition
        )
        run = f"b-{int(time.time())}-{uuid.uuid4().hex[:8]}"
        offset = Offset(run, 1, parts).to_json()
        plans = partitions_between(Offset(run, 0, {}).to_json(), offset, "", o.channel)
        if not plans:  # nothing to read: one task that returns no rows
            plans = [PartitionPlan(run, 1, 0, "", 0, "", o.channel)]
        return [InputPartition(p) for p in plans]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        plan: PartitionPlan = partition.value
        return read_partition(plan, self.options)
