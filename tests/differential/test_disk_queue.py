"""Both nsqd with ``--mem-queue-size=0``: every message goes through the disk queue.

Generated publish scripts and consumer sessions as in the other modules, less what Go
does by chance with no memory queue: an ephemeral topic or channel keeps a message only
if a reader happens to be waiting at that very moment, and a deferred publish keeps its
deferral only if the topic's pump happens to be idle (else it goes to disk and loses
it, spec 11), so sessions have neither ephemeral names nor DPUB.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.differential.harness import (
    Pair,
    StatsWatch,
    close_all,
    examples,
    report,
    require_go,
    seed,
    start_pair,
)
from tests.differential.test_consumer import deliver_two_finish_one, run_sessions
from tests.differential.test_tcp_generated import run_scripts


@pytest.fixture(scope="module")
def disk_pair() -> Iterator[Pair]:
    require_go("nsqd")
    servers = start_pair(mem_queue_size=0)
    try:
        yield servers
    finally:
        close_all(servers.go, servers.py)


@pytest.fixture(scope="module")
def stats_watch(disk_pair: Pair) -> StatsWatch:
    return StatsWatch(disk_pair)


def test_generated_publish_scripts(disk_pair: Pair, stats_watch: StatsWatch) -> None:
    divergences = run_scripts(disk_pair, stats_watch, "publish", seed(7501), examples(40))
    assert not divergences, report(divergences)


def test_generated_consumer_sessions(disk_pair: Pair, stats_watch: StatsWatch) -> None:
    divergences = run_sessions(
        disk_pair, stats_watch, seed(7502), examples(20), ephemeral=False, deferred=False
    )
    assert not divergences, report(divergences)


def test_delivery_counts_in_stats(disk_pair: Pair, stats_watch: StatsWatch) -> None:
    """Found: messages delivered from the disk queue counted in nsqpy's channel (and, at
    50786ea, client) ``global_msg_count``, which Go leaves at zero without the topology
    experiment, so omits."""
    deliver_two_finish_one(disk_pair, "delivered_from_disk")
    assert stats_watch.check() is None
