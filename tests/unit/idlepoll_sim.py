"""A load on nsqpy.common.idlepoll.IdlePoll with clocks a simulation moves: input comes at a
rate that depends on whether the loop polls, and each input costs CPU that depends on it too.

Imports nothing but the standard library and takes the IdlePoll class as an argument, so
that tests/e2e/test_wheel.py runs the same simulation against the compiled module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

Rate = Callable[[bool, float], float]  # (polls, seconds into the run) -> per second


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def simulate(
    idle_poll: type[Any],
    seconds: float,
    rate: Rate,
    cpu_per_input: Rate,
    *,
    gaps: tuple[tuple[float, float], ...] = (),
) -> tuple[Any, list[tuple[float, bool]]]:
    """Run ``seconds`` of input; ``gaps`` are (from, to) spans without any. Returns the poll
    and its modes over time: (seconds into the run, polls) at the start and at each change."""
    loop = asyncio.new_event_loop()
    try:
        clock = Clock()
        cpu = Clock(0.0)
        poll = idle_poll(loop, 100e-6, clock=clock, cpu_clock=cpu)
        start = clock.now
        modes = [(0.0, poll.polls)]
        t = 0.0
        while t < seconds:
            for first, last in gaps:
                if first <= t < last:
                    t = last
            clock.now = start + t
            cpu.now += cpu_per_input(poll.polls, t)
            poll.input()
            if poll.polls != modes[-1][1]:
                modes.append((round(t, 6), poll.polls))
            t += 1 / rate(poll.polls, t)
        return poll, modes
    finally:
        loop.close()


def constant(when_polling: float, when_sleeping: float) -> Rate:
    return lambda polls, t: when_polling if polls else when_sleeping
