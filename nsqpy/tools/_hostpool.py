"""Choosing a destination per request: ``--mode`` of nsq_to_http and nsq_to_nsq.

``round-robin`` rotates over the hosts. ``hostpool`` approximates bitly/go-hostpool's
standard pool: rotation that skips a host marked failed until its retry time (30 s,
doubling up to 900 s while it keeps failing); if every host is down, all are tried again.
``epsilon-greedy`` (go-hostpool's response-time weighted pool) is served by the same
pool here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

__all__ = ["HostPool"]

_INITIAL_RETRY = 30.0
_MAX_RETRY = 900.0


class HostPool:
    """Picks the host for the next request and learns from ``mark``."""

    def __init__(self, hosts: Sequence[str], mode: str = "hostpool") -> None:
        if not hosts:
            raise ValueError("HostPool needs at least one host")
        self.hosts = list(hosts)
        self.mode = mode
        self._next = 0
        self._retry_at: dict[str, float] = {}
        self._retry_delay: dict[str, float] = {}

    def get(self) -> str:
        """The host for the next request."""
        n = len(self.hosts)
        if self.mode == "round-robin":
            host = self.hosts[self._next % n]
            self._next += 1
            return host
        now = time.monotonic()
        for i in range(n):
            host = self.hosts[(self._next + i) % n]
            if self._retry_at.get(host, 0.0) <= now:
                self._next += i + 1
                return host
        # All down: revive them all (go-hostpool's doResetAll).
        self._retry_at.clear()
        host = self.hosts[self._next % n]
        self._next += 1
        return host

    def mark(self, host: str, ok: bool) -> None:
        """Record the outcome of a request to ``host``."""
        if self.mode == "round-robin":
            return
        if ok:
            self._retry_at.pop(host, None)
            self._retry_delay.pop(host, None)
            return
        delay = self._retry_delay.get(host)
        delay = _INITIAL_RETRY if delay is None else min(delay * 2, _MAX_RETRY)
        self._retry_delay[host] = delay
        self._retry_at[host] = time.monotonic() + delay
