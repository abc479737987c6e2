"""A short in-memory history of the cluster, so the UI can draw rates and depths.

Go nsqadmin draws its graphs from Graphite (fed by nsqd's statsd).  nsqpy's nsqadmin
also samples every nsqd's ``/stats`` itself every ``--sample-interval`` and keeps the
last ``--history-duration`` of samples: per node, per topic and per channel the depth,
in-flight and deferred counts (gauges) and the message, requeue and timeout counts
(counters, turned into per-second rates).

A rate between two samples only counts nodes present in both, so an nsqd that failed to
answer once shows as a gap in its figures, not as a spike; a counter that went down (the
nsqd restarted) counts from zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nsqpy.common.log import Logger
from nsqpy.nsqadmin.clusterinfo import ClusterInfo, NodeStats, UpstreamError

__all__ = ["ChannelPoint", "History", "Sample", "Sampler", "TopicPoint", "sample_from_stats"]


@dataclass(frozen=True)
class ChannelPoint:
    """One channel on one node at one time."""

    depth: int
    in_flight: int
    deferred: int
    message_count: int
    requeue_count: int
    timeout_count: int
    clients: int


@dataclass(frozen=True)
class TopicPoint:
    """One topic on one node at one time."""

    depth: int
    message_count: int
    paused: bool
    channels: dict[str, ChannelPoint] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """The whole cluster at one time: node (``host:http_port``) → topic → figures."""

    wall: float
    """Unix time of the sample, for display."""
    mono: float
    """Monotonic time of the sample, for rates."""
    nodes: dict[str, dict[str, TopicPoint]]
    errors: tuple[str, ...] = ()


def sample_from_stats(
    nodes: Iterable[NodeStats], wall: float, mono: float, errors: Sequence[str] = ()
) -> Sample:
    """Reduce ``/stats`` answers to a :class:`Sample`."""
    by_node: dict[str, dict[str, TopicPoint]] = {}
    for node in nodes:
        topics: dict[str, TopicPoint] = {}
        for topic in node.topics:
            channels = {
                c.channel_name: ChannelPoint(
                    depth=c.depth,
                    in_flight=c.in_flight_count,
                    deferred=c.deferred_count,
                    message_count=c.message_count,
                    requeue_count=c.requeue_count,
                    timeout_count=c.timeout_count,
                    clients=c.client_count,
                )
                for c in topic.channels
            }
            topics[topic.topic_name] = TopicPoint(
                depth=topic.depth,
                message_count=topic.message_count,
                paused=topic.paused,
                channels=channels,
            )
        by_node[node.producer.http_address] = topics
    return Sample(wall=wall, mono=mono, nodes=by_node, errors=tuple(errors))


Gauge = Callable[[Sample], int | None]
Counter = Callable[[Sample], dict[str, int]]


def _rate(prev: Sample, cur: Sample, counter: Counter) -> float | None:
    a, b = counter(prev), counter(cur)
    common = a.keys() & b.keys()
    dt = cur.mono - prev.mono
    if not common or dt <= 0:
        return None
    delta = sum(b[n] - a[n] if b[n] >= a[n] else b[n] for n in common)
    return round(delta / dt, 3)


def _sum_or_none(values: Iterable[int]) -> int | None:
    total = None
    for v in values:
        total = v if total is None else total + v
    return total


class History:
    """The last ``duration`` seconds of samples taken every ``interval`` seconds."""

    def __init__(self, interval: float, duration: float) -> None:
        self.interval = interval
        self.duration = duration
        size = max(2, math.ceil(duration / interval) + 1) if interval > 0 else 2
        self.samples: deque[Sample] = deque(maxlen=size)
        # Answers are recomputed only when a sample arrives: every open page polls them.
        self._cache: dict[tuple[str, ...], dict[str, Any]] = {}

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        self._cache.clear()

    def _cached(self, key: tuple[str, ...], build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        doc = self._cache.get(key)
        if doc is None:
            if len(self._cache) > 1024:
                self._cache.clear()
            doc = self._cache[key] = build()
        return doc

    # -- series ----------------------------------------------------------------------------

    def _frame(self) -> dict[str, Any]:
        latest = self.samples[-1] if self.samples else None
        return {
            "interval": self.interval,
            "duration": self.duration,
            "timestamps": [round(s.wall, 3) for s in self.samples],
            "sampled_at": round(latest.wall, 3) if latest else None,
            "message": "WARNING: " + "; ".join(latest.errors) if latest and latest.errors else "",
        }

    def gauge(self, fn: Gauge) -> list[int | None]:
        return [fn(s) for s in self.samples]

    def rate(self, fn: Counter) -> list[float | None]:
        samples = list(self.samples)
        if not samples:
            return []
        return [None] + [_rate(a, b, fn) for a, b in itertools.pairwise(samples)]

    def overview(self) -> dict[str, Any]:
        """Every topic: its latest totals and its depth and message-rate series."""
        return self._cached(("overview",), self._overview)

    def _overview(self) -> dict[str, Any]:
        names: set[str] = set()
        for s in self.samples:
            for topics in s.nodes.values():
                names.update(topics)
        latest = self.samples[-1] if self.samples else None
        topics_doc: dict[str, Any] = {}
        for name in sorted(names):
            current = [t[name] for t in latest.nodes.values() if name in t] if latest else []
            channels = {c for t in current for c in t.channels}
            topics_doc[name] = {
                "depth": sum(t.depth for t in current) if current else None,
                "message_count": sum(t.message_count for t in current) if current else None,
                "channel_count": len(channels),
                "node_count": len(current),
                "paused": any(t.paused for t in current),
                "series": {
                    "depth": self.gauge(_topic_gauge(name, lambda t: t.depth)),
                    "rate": self.rate(_topic_counter(name, lambda t: t.message_count)),
                },
            }
        doc = self._frame()
        doc["topics"] = topics_doc
        return doc

    def topic(self, topic: str) -> dict[str, Any]:
        """One topic's depth and message rate, and each of its channels' figures."""
        return self._cached(("topic", topic), lambda: self._topic(topic))

    def _topic(self, topic: str) -> dict[str, Any]:
        names: set[str] = set()
        for s in self.samples:
            for topics in s.nodes.values():
                if topic in topics:
                    names.update(topics[topic].channels)
        doc = self._frame()
        doc["series"] = {
            "depth": self.gauge(_topic_gauge(topic, lambda t: t.depth)),
            "rate": self.rate(_topic_counter(topic, lambda t: t.message_count)),
        }
        doc["channels"] = {
            name: {"series": self._channel_series(topic, name)} for name in sorted(names)
        }
        return doc

    def channel(self, topic: str, channel: str) -> dict[str, Any]:
        """One channel's gauges and rates."""

        def build() -> dict[str, Any]:
            doc = self._frame()
            doc["series"] = self._channel_series(topic, channel)
            return doc

        return self._cached(("channel", topic, channel), build)

    def node(self, node: str) -> dict[str, Any]:
        """One nsqd's total depth and message rate over all its topics."""
        return self._cached(("node", node), lambda: self._node(node))

    def _node(self, node: str) -> dict[str, Any]:

        def depth(s: Sample) -> int | None:
            topics = s.nodes.get(node)
            return None if topics is None else sum(t.depth for t in topics.values())

        def count(s: Sample) -> dict[str, int]:
            topics = s.nodes.get(node)
            return {} if topics is None else {node: sum(t.message_count for t in topics.values())}

        doc = self._frame()
        doc["series"] = {"depth": self.gauge(depth), "rate": self.rate(count)}
        return doc

    def _channel_series(self, topic: str, channel: str) -> dict[str, list[Any]]:
        def gauge(fn: Callable[[ChannelPoint], int]) -> list[int | None]:
            return self.gauge(_channel_gauge(topic, channel, fn))

        def rate(fn: Callable[[ChannelPoint], int]) -> list[float | None]:
            return self.rate(_channel_counter(topic, channel, fn))

        return {
            "depth": gauge(lambda c: c.depth),
            "in_flight": gauge(lambda c: c.in_flight),
            "deferred": gauge(lambda c: c.deferred),
            "clients": gauge(lambda c: c.clients),
            "rate": rate(lambda c: c.message_count),
            "requeue_rate": rate(lambda c: c.requeue_count),
            "timeout_rate": rate(lambda c: c.timeout_count),
        }


def _topic_gauge(topic: str, fn: Callable[[TopicPoint], int]) -> Gauge:
    def gauge(s: Sample) -> int | None:
        return _sum_or_none(fn(t[topic]) for t in s.nodes.values() if topic in t)

    return gauge


def _topic_counter(topic: str, fn: Callable[[TopicPoint], int]) -> Counter:
    def counter(s: Sample) -> dict[str, int]:
        return {node: fn(t[topic]) for node, t in s.nodes.items() if topic in t}

    return counter


def _channel_points(s: Sample, topic: str, channel: str) -> Iterable[tuple[str, ChannelPoint]]:
    for node, topics in s.nodes.items():
        t = topics.get(topic)
        if t is not None and channel in t.channels:
            yield node, t.channels[channel]


def _channel_gauge(topic: str, channel: str, fn: Callable[[ChannelPoint], int]) -> Gauge:
    def gauge(s: Sample) -> int | None:
        return _sum_or_none(fn(c) for _, c in _channel_points(s, topic, channel))

    return gauge


def _channel_counter(topic: str, channel: str, fn: Callable[[ChannelPoint], int]) -> Counter:
    def counter(s: Sample) -> dict[str, int]:
        return {node: fn(c) for node, c in _channel_points(s, topic, channel)}

    return counter


class Sampler:
    """Samples the cluster into a :class:`History` every ``history.interval`` seconds."""

    def __init__(
        self,
        ci: ClusterInfo,
        history: History,
        addresses: Callable[[], tuple[Sequence[str], Sequence[str]]],
        logger: Logger,
    ) -> None:
        self.ci = ci
        self.history = history
        self.addresses = addresses
        self.log = logger
        self._task: asyncio.Task[None] | None = None

    async def sample_once(self) -> Sample | None:
        """Take one sample and add it to the history (None if no nsqd answered)."""
        wall, mono = time.time(), time.monotonic()
        lookupds, nsqds = self.addresses()
        try:
            producers, errors = await self.ci.get_producers(lookupds, nsqds)
            nodes, more = await self.ci.get_nsqd_stats(producers, include_clients=False)
        except UpstreamError as err:
            self.log.warn(f"history: sample failed - {err}")
            return None
        sample = sample_from_stats(nodes, wall, mono, errors + more)
        self.history.add(sample)
        return sample

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.history.interval
        next_at = loop.time()
        while True:
            try:
                await self.sample_once()
            except Exception as err:  # a bad sample must not stop the sampling
                self.log.error(f"history: sample failed - {err!r}")
            next_at += interval
            now = loop.time()
            if next_at < now:  # fell behind: skip the missed ticks
                next_at = now + interval - (now - next_at) % interval
            await asyncio.sleep(next_at - now)

    def start(self) -> None:
        if self.history.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
