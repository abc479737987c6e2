"""The event loop's polling after input (nsqpy/common/idlepoll.py): the window's adaptation
and the budget, on a real loop with a clock the test moves."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from nsqpy.common.idlepoll import IdlePoll

from .idlepoll_sim import constant, simulate

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


# -- the trial between polling and sleeping at once (idlepoll_sim drives it) -----------------


def _kept(modes: list[tuple[float, bool]], after: float, until: float = 1e9) -> set[bool]:
    """The modes in force at some time from ``after`` to ``until`` seconds into the run."""
    return {polls for t, polls in modes if after < t < until} | {_at(modes, after)}


def _at(modes: list[tuple[float, bool]], t: float) -> bool:
    """The mode in force ``t`` seconds into the run."""
    return [polls for since, polls in modes if since <= t][-1]


def test_trial_keeps_polling_where_it_handles_more_input() -> None:
    """Round trips on a machine where waking is dear: 40k a second polling, 27k sleeping."""
    poll, modes = simulate(IdlePoll, 3.0, constant(40_000, 27_000), constant(25e-6, 25e-6))
    # the first epoch sees the load come; then three of each mode, alternating
    assert [round(t, 1) for t, _ in modes[:7]] == [0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    assert [polls for _, polls in modes[:7]] == [True, False, True, False, True, False, True]
    assert _kept(modes, 0.75) == {True}
    assert poll._kept_rate == pytest.approx(40_000, rel=0.01)


def test_trial_sleeps_where_polling_takes_the_cpu_from_the_publishers() -> None:
    """Wake-ups are cheap and the CPUs busy: sleeping at once handles 9 % more."""
    _, modes = simulate(IdlePoll, 3.0, constant(27_500, 30_000), constant(36e-6, 30e-6))
    assert _kept(modes, 0.75) == {False}


def test_at_the_same_rate_the_mode_spending_less_cpu_per_input_is_kept() -> None:
    """A paced load (10,000 a second either way): CPU per input decides."""
    _, modes = simulate(IdlePoll, 2.0, constant(10_000, 10_000), constant(66e-6, 52e-6))
    assert _kept(modes, 0.75) == {False}
    _, modes = simulate(IdlePoll, 2.0, constant(10_000, 10_100), constant(40e-6, 52e-6))
    assert _kept(modes, 0.75) == {True}  # 1 % more input sleeping: within the margin


def test_a_light_load_runs_no_trial() -> None:
    poll, modes = simulate(IdlePoll, 2.0, constant(1_000, 1_000), constant(60e-6, 50e-6))
    assert modes == [(0.0, True)]
    assert poll._trial is None


def test_the_kept_mode_is_tried_again_after_its_hold_or_when_the_load_changes() -> None:
    # polling wins; after the 10 s hold a trial runs again (it sleeps for an epoch)
    _, modes = simulate(IdlePoll, 12.0, constant(40_000, 27_000), constant(25e-6, 25e-6))
    assert _kept(modes, 0.75, 10.7) == {True}
    assert any(not polls and 10.7 < t < 11.0 for t, polls in modes)
    assert _kept(modes, 11.5) == {True}

    # the rate doubles at 3 s, after a decision for sleeping: a trial runs at once
    def rate(polls: bool, t: float) -> float:
        return (27_500 if polls else 30_000) * (1 if t < 3 else 2.5)

    _, modes = simulate(IdlePoll, 4.0, rate, constant(30e-6, 30e-6))
    assert _kept(modes, 0.75, 3.0) == {False}
    assert any(polls and 3.0 < t < 3.2 for t, polls in modes)  # the new trial's first epoch
    assert _kept(modes, 3.8) == {False}


def test_a_load_that_stops_mid_trial_drops_it_and_polls() -> None:
    """Sleeping wins, but the load stops for a second during the trial: the trial is
    dropped (polling, as before any), and the next steady load runs a whole new one."""
    _, modes = simulate(
        IdlePoll, 3.0, constant(27_500, 30_000), constant(30e-6, 30e-6), gaps=((0.45, 1.45),)
    )
    assert any(not polls and t < 0.45 for t, polls in modes)  # the trial had begun
    assert _kept(modes, 1.45, 1.6) == {True}  # after the gap: polling, the trial dropped
    # the epoch the gap ended, then a new trial of six epochs (the last sleeps, as kept)
    assert [round(t, 2) for t, _ in modes if t > 1.45] == [1.65, 1.75, 1.85, 1.95, 2.05]
    assert _kept(modes, 2.2) == {False}
