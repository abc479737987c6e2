"""Generated TCP V2 scripts, sent alike to Go's nsqd and nsqpy's (see conftest's docstring).

A script is one connection: the magic, a few commands drawn from the edge cases of
names, sizes and parameters (well-formed or not), the bytes cut at random points and
sent piece by piece. Scripts never receive messages (they subscribe only to topics no
one publishes to), so each transcript is a deterministic sequence of replies; delivery
is ``test_consumer.py``'s.
"""

from __future__ import annotations

import random

import pytest

from tests.differential.generators import gen_script
from tests.differential.harness import (
    Pair,
    StatsWatch,
    diff_text,
    examples,
    report,
    run_script,
    seed,
    short_repr,
)

# area → (weights of the command kinds, default seed)
AREAS: dict[str, tuple[dict[str, float], int]] = {
    "publish": ({"pub": 3, "dpub": 2, "mpub": 3, "simple": 0.5, "garbage": 0.5}, 7101),
    "consumer": (
        {"sub": 3, "rdy": 2, "fin_touch": 2, "req": 2, "simple": 2, "identify": 1, "pub": 0.5},
        7102,
    ),
    "identify_auth": (
        {"identify": 4, "auth": 2, "sub": 1, "pub": 1, "rdy": 0.5, "simple": 0.5},
        7103,
    ),
    "mixed": ({kind: 1.0 for kind in ("pub", "dpub", "mpub", "identify", "auth", "sub",
                                      "rdy", "fin_touch", "req", "simple", "garbage")},
              7104),
}  # fmt: skip
CASES = 60
MAX_DIVERGENCES = 20


@pytest.fixture(scope="module")
def stats_watch(pair: Pair) -> StatsWatch:
    """One watch for the module's servers: a topic found parted in one test stays out of
    the next test's comparisons."""
    return StatsWatch(pair)


def run_scripts(
    pair: Pair, stats_watch: StatsWatch, area: str, case_seed: int, count: int
) -> list[str]:
    """``count`` scripts of ``area`` from ``case_seed`` on ``pair``; the divergences."""
    weights = AREAS[area][0]
    rng = random.Random(case_seed)
    divergences: list[str] = []
    for case in range(count):
        pieces = gen_script(rng, f"{area[0]}{case_seed}_{case}_", weights)
        where = f"seed {case_seed} case {case}: pieces {short_repr(pieces)}"
        go = run_script(pair.go.tcp_address, pieces).norm()
        py = run_script(pair.py.tcp_address, pieces).norm()
        if go != py:
            divergences.append(f"{where}\n  transcript:\n{diff_text(go, py)}")
        stats_diff = stats_watch.check()
        if stats_diff is not None:
            divergences.append(f"{where}\n  /stats after it:\n{stats_diff}")
        if len(divergences) >= MAX_DIVERGENCES:
            break  # enough to go on; each costs a /stats wait
    return divergences


@pytest.mark.parametrize("area", list(AREAS))
def test_generated_scripts(pair: Pair, stats_watch: StatsWatch, area: str) -> None:
    divergences = run_scripts(pair, stats_watch, area, seed(AREAS[area][1]), examples(CASES))
    assert not divergences, report(divergences)
