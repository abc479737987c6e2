"""End-to-end processing latency quantiles (spec §7.9), as NSQ computes them.

NSQ's ``internal/quantile`` keeps, per channel, two streams of the latencies
(``FIN time - message timestamp``, in ns) of the messages FINed in each half of
the window (``--e2e-processing-latency-window-time``): every ``window / 2`` the
older stream is cleared and becomes the current one, so a query covers between
half a window and a whole one. A query merges both streams; a topic's value is
the merge of its channels' streams.

Each stream is a port of the Go package NSQ pins, ``bmizerany/perks/quantile``
(2014-12 revision): the CKMS "Effective Computation of Biased Quantiles over
Data Streams" summary with the *targeted* invariant for the configured
percentiles and epsilon 0.01. Inserts go to a 500-sample buffer that is sorted
and merged into the compressed summary when full. Being the same algorithm on
the same inputs, it gives the numbers Go nsqd gives (e.g. p50 of 1..10 is 7):
rank error at most 1% of the count at the targeted quantiles, memory bounded by
the summary size whatever the message rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypedDict

__all__ = ["E2EResult", "E2EStream", "Percentile", "TargetedStream", "empty_result"]

# perks' defaultEpsilon and buffer capacity
EPSILON = 0.01
BUFFER_SIZE = 500

Sample = tuple[int, float, float]
"""``(value, width, delta)`` as in perks' ``Sample``."""


class Percentile(TypedDict):
    """One entry of ``e2e_processing_latency.percentiles`` (Go marshals a map: keys sorted)."""

    quantile: float
    value: int


class E2EResult(TypedDict):
    """``e2e_processing_latency`` in /stats: ``percentiles`` is null when none are tracked."""

    count: int
    percentiles: list[Percentile] | None


def empty_result() -> E2EResult:
    """What Go reports for a nil stream (no percentiles configured, or a topic without channels)."""
    return {"count": 0, "percentiles": None}


class TargetedStream:
    """perks' ``quantile.NewTargeted(quantiles...)``: a CKMS summary, buffered."""

    __slots__ = ("_buffer", "_n", "_sorted", "_summary", "_targets")

    def __init__(self, quantiles: Sequence[float]) -> None:
        # (q, 2e/q, 2e/(1-q)) per targeted quantile; Go's float division by zero gives +Inf.
        self._targets = tuple(
            (q, 2 * EPSILON / q, 2 * EPSILON / (1 - q) if q < 1 else math.inf) for q in quantiles
        )
        self._buffer: list[int] = []
        self._sorted = True
        # The compressed summary: [value, width, delta] in value order, and its weight.
        self._summary: list[list[float]] = []
        self._n = 0.0

    def insert(self, value: int) -> None:
        buffer = self._buffer
        buffer.append(value)
        self._sorted = False
        if len(buffer) == BUFFER_SIZE:
            self._flush()
            self._compress()

    def query(self, q: float) -> int:
        """The value at quantile ``q`` (one of the targeted ones); 0 when empty."""
        if not self._summary:
            # perks' fast path before the first flush: exact on the buffer.
            size = len(self._buffer)
            if size == 0:
                return 0
            i = int(size * q)
            if i > 0:
                i -= 1
            self._sort_buffer()
            return self._buffer[i]
        self._flush()
        summary = self._summary
        t = math.ceil(q * self._n)
        t += math.ceil(self._invariant(t) / 2)
        p = summary[0]
        r = 0.0
        for c in summary[1:]:
            if r + c[1] + c[2] > t:
                return int(p[0])
            r += p[1]
            p = c
        return int(p[0])

    def merge(self, samples: list[Sample]) -> None:
        """Merge another stream's samples into this one (perks' ``Stream.Merge``)."""
        samples.sort(key=lambda s: s[0])
        self._merge(samples)

    def samples(self) -> list[Sample]:
        """What another stream needs to merge this one (flushes and compresses first)."""
        if not self._summary:
            return [(v, 1.0, 0.0) for v in self._buffer]
        self._flush()
        self._compress()
        return [(int(s[0]), s[1], s[2]) for s in self._summary]

    def count(self) -> int:
        return len(self._buffer) + int(self._n)

    def reset(self) -> None:
        self._summary.clear()
        self._n = 0.0
        self._buffer.clear()
        self._sorted = True

    # -- the summary (perks' unexported stream type) ---------------------------------------

    def _sort_buffer(self) -> None:
        if not self._sorted:
            self._sorted = True
            self._buffer.sort()

    def _flush(self) -> None:
        self._sort_buffer()
        self._merge([(v, 1.0, 0.0) for v in self._buffer])
        self._buffer.clear()

    def _invariant(self, r: float) -> float:
        """f(r) of the targeted invariant: the allowed error at rank ``r``."""
        n = self._n
        m = math.inf
        for q, below, above in self._targets:
            f = below * r if q * n <= r else above * (n - r)
            if f < m:
                m = f
        return m

    def _merge(self, samples: Iterable[Sample]) -> None:
        summary = self._summary
        r = 0.0
        i = 0
        for value, width, _ in samples:
            while i < len(summary):
                c = summary[i]
                if c[0] > value:
                    summary.insert(i, [value, width, math.floor(self._invariant(r)) - 1])
                    i += 1
                    break
                r += c[1]
                i += 1
            else:
                summary.append([value, width, 0.0])
                i += 1
            self._n += width

    def _compress(self) -> None:
        summary = self._summary
        if len(summary) < 2:
            return
        x = summary[-1]
        r = self._n - 1 - x[1]
        for i in range(len(summary) - 2, -1, -1):
            c = summary[i]
            if c[1] + x[1] + x[2] <= self._invariant(r):
                x[1] += c[1]
                del summary[i]
            else:
                x = c
            r -= c[1]


class E2EStream:
    """Latencies (ns) of FINed messages over a rolling window (NSQ's ``quantile.Quantile``).

    ``percentiles`` are the configured ones, highest first; ``window`` is in seconds.
    A window of 0 or less never rotates (Go would loop forever there).
    """

    __slots__ = ("_clock", "_current", "_index", "_last_move", "_streams", "percentiles", "window")

    def __init__(
        self,
        percentiles: Sequence[float],
        window: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.percentiles = list(percentiles)
        self.window = window
        self._clock = clock
        self._streams = (TargetedStream(self.percentiles), TargetedStream(self.percentiles))
        self._index = 0
        self._current = self._streams[0]
        self._last_move = clock()

    def add(self, latency_ns: int) -> None:
        """Record one FIN (called on the FIN path: keep it cheap)."""
        if self._clock() > self._last_move + self.window / 2:
            self._rotate()
        self._current.insert(latency_ns)

    def _rotate(self) -> None:
        half = self.window / 2
        if half <= 0:
            return
        behind = self._clock() - self._last_move
        # Go moves one half-window at a time while ``now > last_move + half``.
        steps = math.ceil(behind / half) - 1 if behind > half else 0
        if steps >= 2:
            # Idle for a whole window: both halves are stale (Go moves one step at a time).
            for stream in self._streams:
                stream.reset()
            self._index ^= steps & 1
            self._current = self._streams[self._index]
            self._last_move += steps * half
            return
        for _ in range(steps):
            self._index ^= 1
            self._current = self._streams[self._index]
            self._last_move += half
            self._current.reset()

    def merge(self, other: E2EStream) -> None:
        """Fold ``other``'s two half-windows into ours (a topic aggregating its channels)."""
        ours, theirs = self._index, other._index
        self._streams[ours].merge(other._streams[theirs].samples())
        self._streams[ours ^ 1].merge(other._streams[theirs ^ 1].samples())
        self._last_move = max(self._last_move, other._last_move)

    @classmethod
    def aggregate(cls, streams: Iterable[E2EStream | None]) -> E2EStream | None:
        """A topic's stream: the merge of its channels' (None if none of them tracks latency)."""
        merged: E2EStream | None = None
        for stream in streams:
            if stream is None:
                continue
            if merged is None:
                merged = cls(stream.percentiles, stream.window, stream._clock)
            merged.merge(stream)
        return merged

    def result(self) -> E2EResult:
        """Count and percentiles over the current window, as /stats reports them."""
        if self._clock() > self._last_move + self.window / 2:
            self._rotate()
        merged = TargetedStream(self.percentiles)
        for stream in self._streams:
            merged.merge(stream.samples())
        return {
            "count": merged.count(),
            "percentiles": [{"quantile": q, "value": merged.query(q)} for q in self.percentiles],
        }

    @property
    def count(self) -> int:
        """FINs recorded in the current window."""
        return sum(s.count() for s in self._streams)
