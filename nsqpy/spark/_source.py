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

from nsqpy.spark._http import Backlog, HTTPError, Producer, channel_backlog, lookup_producers
from nsqpy.spark._offsets import (
    Offset,
    PartitionPlan,
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
DISCOVERY_CACHE_SECONDS: Final = 5.0
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
    """Driver-side planning state (discovery and depth caches, Trigger.AvailableNow budget)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.wal = WAL(options.wal_location, fsync=options.fsync)
        self.run = uuid.uuid4().hex[:12]
        self._producers: tuple[float, list[Producer]] | None = None
        self._depths: tuple[float, dict[str, Backlog | None]] | None = None
        self._idle_until: dict[str, float] = {}
        self._accounted: set[tuple[str, int]] = set()
        # Trigger.AvailableNow: rows left per nsqd with a depth (None: not in that mode), the
        # nsqd without one, the batch the budget starts after, and those found drained.
        self._available: dict[str, int] | None = None
        self._available_unknown: set[str] = set()
        self._available_base: int | None = None
        self._drained: set[str] = set()
        self._in_transit_wait = IN_TRANSIT_WAIT

    # -- discovery and depth ----------------------------------------------------------------

    def producers(self) -> list[Producer]:
        o = self.options
        if o.nsqd_tcp_addresses:
            https: Sequence[str | None] = o.nsqd_http_addresses or [None] * len(
                o.nsqd_tcp_addresses
            )
            return [Producer(t, h) for t, h in zip(o.nsqd_tcp_addresses, https, strict=True)]
        now = time.monotonic()
        if self._producers is None or now - self._producers[0] > DISCOVERY_CACHE_SECONDS:
            try:
                found = lookup_producers(o.lookupd_http_addresses, o.topic, HTTP_TIMEOUT)
            except HTTPError as err:
                if self._producers is None:
                    raise
                log.warning("nsq source: discovery failed, using the last answer: %s", err)
                found = self._producers[1]
            self._producers = (now, found)
        return self._producers[1]

    def depths(self, *, fresh: bool = False) -> dict[str, Backlog | None]:
        """The channel's backlog per nsqd TCP address; None where unknown."""
        now = time.monotonic()
        if not fresh and self._depths is not None and now - self._depths[0] < DEPTH_CACHE_SECONDS:
            return self._depths[1]
        o = self.options
        depths: dict[str, Backlog | None] = {}
        for p in self.producers():
            if p.http_address is None:
                depths[p.tcp_address] = None
                continue
            try:
                depths[p.tcp_address] = channel_backlog(
                    p.http_address, o.topic, o.channel, HTTP_TIMEOUT
                )
            except HTTPError as err:
                log.warning("nsq source: no depth from %s: %s", p.http_address, err)
                depths[p.tcp_address] = None
        self._depths = (time.monotonic(), depths)
        return depths

    # -- offsets ----------------------------------------------------------------------------

    def initial_offset(self) -> dict[str, Any]:
        return Offset(self.run, 0, {}).to_json()

    def _account(self, start: Offset) -> None:
        """Learn from the finished batch ``start`` (read counts from its seals), once."""
        if start.batch == 0 or (start.run, start.batch) in self._accounted:
            return
        self._accounted.add((start.run, start.batch))
        try:
            counts = self.wal.sealed_counts(start.run, start.batch)
        except OSError as err:
            log.warning("nsq source: cannot read the seals of batch %d: %s", start.batch, err)
            return
        now = time.monotonic()
        for address, quotas in start.quotas.items():
            got = counts.get(address, 0)
            if got == 0:
                self._idle_until[address] = now + self.options.empty_poll_interval
            base = self._available_base
            if self._available is not None and base is not None and start.batch > base:
                if address in self._available:
                    self._available[address] -= got
                elif got < sum(quotas):
                    self._drained.add(address)

    def latest_offset(self, start_json: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        o = self.options
        start = Offset.from_json(start_json)
        if self._available is not None and self._available_base is None:
            self._available_base = start.batch
        self._account(start)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else MAX_ROWS_PER_BATCH
        wants = self._wants(self.depths())
        if not any(wants.values()) and self._awaits_in_transit():
            wants = self._wait_for_in_transit()
        quotas = proportional(wants, budget)
        if not sum(quotas.values()):
            return start_json
        parts = plan_partitions(
            quotas, o.num_partitions or max(2, len(quotas)), o.max_messages_per_partition
        )
        return Offset(start.run, start.batch + 1, parts).to_json()

    def _wants(self, depths: dict[str, Backlog | None]) -> dict[str, int]:
        """How many messages each nsqd could give the next batch: ready or on their way in.
        In flight and deferred messages are left out: planning them would only make read tasks
        wait; they are planned once they are back in the channel."""
        o = self.options
        now = time.monotonic()
        fallback = o.max_in_flight_per_connection * 4
        wants: dict[str, int] = {}
        for address, depth in depths.items():
            if depth is None:
                idle = now < self._idle_until.get(address, 0.0)
                wants[address] = 0 if idle or address in self._drained else fallback
            else:
                wants[address] = depth.available
            if self._available is not None:
                if address in self._available:
                    wants[address] = min(wants[address], max(0, self._available[address]))
                elif address not in self._available_unknown:
                    wants[address] = 0  # an nsqd that appeared after the query started
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

    def _wait_for_in_transit(self) -> dict[str, int]:
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
        end = Offset.from_json(end_json)
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

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        o = self.options
        return [InputPartition(p) for p in partitions_between(start, end, o.topic, o.channel)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        plan: PartitionPlan = partition.value
        return read_partition(plan, self.options)

    def commit(self, end: dict[str, Any]) -> None:
        self._planner.commit(end)


def _even_split(addresses: list[str], total: int) -> dict[str, int]:
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
        plans = partitions_between(Offset(run, 0, {}).to_json(), offset, o.topic, o.channel)
        if not plans:  # nothing to read: one task that returns no rows
            plans = [PartitionPlan(run, 1, 0, "", 0, o.topic, o.channel)]
        return [InputPartition(p) for p in plans]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        plan: PartitionPlan = partition.value
        return read_partition(plan, self.options)
