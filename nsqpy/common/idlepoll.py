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

Whether polling pays at all depends on the machine: where an idle CPU halts and waking it
is dear (a VM whose guest halts at once), polling takes a round trip of two publishers from
27k to 41k a second; where wake-ups are cheap, or the CPUs are all busy and the turns that
find nothing take a core from the publishers themselves, the same load is 8-10 % faster
without, at 15 % less CPU per message. So under a steady load the poll runs a trial:
epochs of 100 ms alternate between polling and sleeping at once, three of each; the mode
that handled more input per second (by more than 3 %), or, at the same rate (a paced load),
spent less CPU per input, is kept for the next ten seconds, after which the trial runs
again; sooner if the input rate halves or doubles. An epoch with little input (under 2,000
a second), or much longer than 100 ms (the load stopped), drops the trial, and the loop
polls as it did before any: the next steady load starts a new trial.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

__all__ = ["IdlePoll"]

_PERIOD: Final = 0.1  # seconds over which the polling budget is counted

# The trial between polling and sleeping at once (see above).
_EPOCH: Final = 0.1  # seconds of one mode
_TRIAL_EPOCHS: Final = 6  # polling, sleeping, polling, ... : three of each
_MIN_INPUTS: Final = 200  # an epoch with less input has no load worth a trial (2,000/s)
_RATE_MARGIN: Final = 1.03  # more input per second by more than this decides
_HOLD: Final = 10.0  # seconds the better mode is kept before the next trial


class IdlePoll:
    """Keeps ``loop`` polling after input (:meth:`input`, called on every read)."""

    __slots__ = (
        "_budget",
        "_clock",
        "_cpu_clock",
        "_epoch_cpu",
        "_epoch_end",
        "_epoch_inputs",
        "_epoch_start",
        "_hold_until",
        "_idle",
        "_kept_rate",
        "_last",
        "_loop",
        "_max",
        "_period_end",
        "_polling",
        "_prev",
        "_start",
        "_trial",
        "polls",
        "window",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        max_window: float,
        budget: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self._loop = loop
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._max = max_window
        self._start = max_window / 8
        self._budget = budget * _PERIOD
        self.window = 0.0
        self._last = 0.0  # when input last arrived
        self._polling = False
        self._prev = 0.0  # when the loop last polled
        self._idle = 0.0  # loop turns that found no input, in this period (seconds)
        self._period_end = 0.0
        # The trial: whether the loop polls at all (the mode of this epoch, or the one kept),
        # and per epoch of the trial so far (input count, CPU and wall seconds).
        self.polls = True
        self._trial: list[tuple[int, float, float]] | None = None
        self._epoch_start = 0.0
        self._epoch_end = 0.0
        self._epoch_inputs = 0
        self._epoch_cpu = 0.0
        self._hold_until = 0.0  # until when the mode kept holds
        self._kept_rate = 0.0  # the input per second of the mode kept (0: none)

    def input(self) -> float:
        """Input arrived: adapt the window to the gap since the last, and poll after it.
        Returns the clock's time of it (the reader's time.monotonic())."""
        now = self._clock()
        gap = now - self._last
        self._last = now
        self._epoch_inputs += 1
        if now >= self._epoch_end:
            self._next_epoch(now)
        window = self.window
        if gap > self._max:
            if window:
                window = window / 2 if window > self._start else 0.0
                self.window = window
        elif gap > window:
            window = self.window = window * 2 if window else self._start
        if window and not self._polling and self.polls:
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
        if now - self._last < self.window and self._idle < self._budget and self.polls:
            self._loop.call_soon(self._poll)
        else:
            self._polling = False

    def _next_epoch(self, now: float) -> None:
        """An epoch ended: count it into the trial running, or start a trial when the mode
        kept has been held long enough, the load changed, or a load came after none."""
        inputs = self._epoch_inputs - 1  # this input belongs to the next epoch
        wall = now - self._epoch_start
        cpu = self._cpu_clock()
        steady = inputs >= _MIN_INPUTS and wall <= 2 * _EPOCH
        if self._trial is not None:
            if not steady:  # the load stopped, or changed: polling as before, no trial
                self._trial = None
                self.polls = True
            else:
                self._trial.append((inputs, cpu - self._epoch_cpu, wall))
                if len(self._trial) == _TRIAL_EPOCHS:
                    self._decide(now, self._trial)
                    self._trial = None
                else:
                    self.polls = not self.polls
        elif not steady:
            self.polls = True
            self._kept_rate = 0.0
        elif (
            now >= self._hold_until
            or not self._kept_rate
            or not 0.5 < inputs / wall / self._kept_rate < 2.0
        ):
            self._trial = []  # a trial starts: polling first
            self.polls = True
        self._epoch_start = now
        self._epoch_end = now + _EPOCH
        self._epoch_inputs = 1
        self._epoch_cpu = cpu

    def _decide(self, now: float, trial: list[tuple[int, float, float]]) -> None:
        """Keep the mode that handled more input per second or, at the same rate, spent
        less CPU per input; the trial's epochs alternate, polling first."""
        # [inputs, CPU seconds, wall seconds] of the polling epochs, then of the sleeping ones
        sums = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
        for i, (inputs, cpu, wall) in enumerate(trial):
            mode = sums[i % 2]
            mode[0] += inputs
            mode[1] += cpu
            mode[2] += wall
        (inputs_p, cpu_p, wall_p), (inputs_s, cpu_s, wall_s) = sums
        rate_p = inputs_p / wall_p
        rate_s = inputs_s / wall_s
        if rate_p > rate_s * _RATE_MARGIN:
            polls = True
        elif rate_s > rate_p * _RATE_MARGIN:
            polls = False
        else:
            polls = cpu_p / inputs_p <= cpu_s / inputs_s
        self.polls = polls
        self._kept_rate = rate_p if polls else rate_s
        self._hold_until = now + _HOLD
