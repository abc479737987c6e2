"""The event loop's polling after input (nsqpy/common/idlepoll.py): the window's adaptation
and the budget, on a real loop with a clock the test moves."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from nsqpy.common.idlepoll import IdlePoll

US = 1e-6


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def turn(loop: asyncio.AbstractEventLoop) -> None:
    """One turn of the loop: the callbacks ready now run (a poll schedules its next turn)."""
    loop.call_soon(loop.stop)
    loop.run_forever()


def grown(loop: asyncio.AbstractEventLoop, clock: Clock, largest: float) -> IdlePoll:
    """A poll whose window grew to ``largest``: input after gaps of 60 % of it."""
    poll = IdlePoll(loop, largest, clock=clock)
    for _ in range(5):
        clock.advance(largest * 0.6)
        poll.input()
    assert poll.window == pytest.approx(largest)
    return poll


def test_window_grows_while_input_comes_back_quickly(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    poll = IdlePoll(loop, 100 * US, clock=clock)
    assert poll.input() == clock.now  # the first input (a long gap since "never"); its time
    assert poll.window == 0
    windows = []
    for _ in range(5):
        clock.advance(30 * US)
        poll.input()
        windows.append(round(poll.window / US, 3))
    # 12.5 missed the 30 µs gap, 25 missed it, 50 catches it: no further growth
    assert windows == [12.5, 25.0, 50.0, 50.0, 50.0]
    clock.advance(90 * US)  # missed by 50, within the largest window
    poll.input()
    assert poll.window == pytest.approx(100 * US)
    clock.advance(99 * US)
    poll.input()
    assert poll.window == pytest.approx(100 * US)  # never past the largest


def test_window_shrinks_to_nothing_when_gaps_are_long(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    poll = grown(loop, clock, 100 * US)
    windows = []
    for _ in range(5):
        clock.advance(0.002)  # a gap no window could catch
        poll.input()
        windows.append(round(poll.window / US, 3))
    assert windows == [50.0, 25.0, 12.5, 0.0, 0.0]


def test_loop_polls_until_the_window_has_passed(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    poll = grown(loop, clock, 100 * US)
    turns = 0
    while poll._polling:
        turn(loop)
        turns += 1
        clock.advance(10 * US)
        if turns == 5:
            poll.input()  # input caught while polling: the window starts again from it
            caught = clock.now
    # polling ended on the first turn at least a window after the input caught
    assert 100 * US <= clock.now - caught <= 120 * US
    assert turns >= 15
    turn(loop)
    assert not loop._ready  # type: ignore[attr-defined]  # nothing scheduled any more


def test_no_polling_with_a_zero_window(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    poll = IdlePoll(loop, 100 * US, clock=clock)
    clock.advance(1.0)
    poll.input()
    assert poll.window == 0
    assert not poll._polling
    assert not loop._ready  # type: ignore[attr-defined]  # nothing scheduled


def test_budget_bounds_the_idle_turns_of_a_period(loop: asyncio.AbstractEventLoop) -> None:
    """A window of 10 ms and input every 9 ms: the loop would poll all the time; the budget
    (25 % of each 100 ms) stops it, and the next period starts afresh."""
    clock = Clock()
    poll = grown(loop, clock, 0.01)
    period_end = poll._period_end
    step = 0
    while clock.now < period_end - 0.002:
        if poll._polling:
            turn(loop)
        clock.advance(0.001)
        step += 1
        if step % 9 == 0:
            poll.input()
    assert not poll._polling  # stopped before the period's end
    assert 0.025 <= poll._idle < 0.027  # after 25 ms of turns that found nothing
    clock.now = period_end  # the next period
    poll.input()
    assert poll._polling
