"""End-to-end processing latency quantiles (spec §7.9). Filled in by the HTTP/stats work."""

from __future__ import annotations


class E2EStream:
    """Latencies (ns) of FINed messages over a rolling window, queried as quantiles."""

    def __init__(self, percentiles: list[float], window: float) -> None:
        self.percentiles = percentiles
        self.window = window
        self.count = 0

    def add(self, latency_ns: int) -> None:
        self.count += 1
