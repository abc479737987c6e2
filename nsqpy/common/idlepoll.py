"""Polling briefly before the event loop sleeps, sized by how soon input really comes back.

A server that answers a request and then sleeps in ``epoll_wait`` has to be woken for the
next one: a context switch on its side, a wake-up (an interrupt to the other CPU, dear in a
VM) on the sender's. When requests follow each other closely (a publisher waiting for each
``OK``), most of a round trip is that sleeping and waking. Go's runtime avoids it by spinning
a moment before it parks a thread; this is the event loop's version.

After input the loop keeps polling (each turn a zero-timeout wait) until ``window`` seconds
have passed since the last input, then sleeps. The window adapts as Linux's haltpoll cpuidle
governor does:

* input that came after a gap longer than the largest window means polling could not have
  caught it: the window halves, and stops at zero below its starting size;
* input that came after a gap the window missed but the largest one would have caught: the
  window doubles (from its starting size);
* input caught while polling: the window stays.

So a busy closed loop of round trips polls, and a quiet or slow load (gaps of milliseconds)
does not: after a few long gaps the window is zero and the loop sleeps at once.

A budget bounds what polling can cost when gaps sit just under the largest window (a paced
load a little faster than the window): the loop turns that found no input may take at most
``budget`` of each 100 ms period; past that the loop sleeps at once until the next period.
Measured with bench/run_shapes.py (docs/ARCHITECTURE.md has the figures): round trips gain
10-50 %, and a load paced at 10,000 PUBs a second costs about an eighth of a core more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

__all__ = ["IdlePoll"]

_PERIOD: Final = 0.1  # seconds over which the polling budget is counted


class IdlePoll:
    """Keeps ``loop`` polling after input (:meth:`input`, called on every read)."""

    __slots__ = (
        "_budget",
        "_clock",
        "_idle",
        "_last",
        "_loop",
        "_max",
        "_period_end",
        "_polling",
        "_prev",
        "_start",
        "window",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        max_window: float,
        budget: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._clock = clock
        self._max = max_window
        self._start = max_window / 8
        self._budget = budget * _PERIOD
        self.window = 0.0
        self._last = 0.0  # when input last arrived
        self._polling = False
        self._prev = 0.0  # when the loop last polled
        self._idle = 0.0  # loop turns that found no input, in this period (seconds)
        self._period_end = 0.0

    def input(self) -> float:
        """Input arrived: adapt the window to the gap since the last, and poll after it.
        Returns the clock's time of it (the reader's time.monotonic())."""
        now = self._clock()
        gap = now - self._last
        self._last = now
        window = self.window
        if gap > self._max:
            if window:
                window = window / 2 if window > self._start else 0.0
                self.window = window
        elif gap > window:
            window = self.window = window * 2 if window else self._start
        if window and not self._polling:
            if now >= self._period_end:
                self._period_end = now + _PERIOD
                self._idle = 0.0
            elif self._idle >= self._budget:
                return now
            self._polling = True
            self._prev = now
            self._loop.call_soon(self._poll)
        return now

    def _poll(self) -> None:
        now = self._clock()
        if self._last < self._prev:  # nothing came in since the last turn
            self._idle += now - self._prev
        self._prev = now
        if now - self._last < self.window and self._idle < self._budget:
            self._loop.call_soon(self._poll)
        else:
            self._polling = False
