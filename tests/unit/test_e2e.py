"""E2E processing latency quantiles (nsqpy/nsqd/e2e.py, spec §7.9)."""

from __future__ import annotations

import random

import pytest

from nsqpy.nsqd.e2e import BUFFER_SIZE, E2EStream, TargetedStream, empty_result


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def values(result: dict[str, object]) -> list[int]:
    percentiles = result["percentiles"]
    assert isinstance(percentiles, list)
    return [p["value"] for p in percentiles]


def test_no_fins_reports_zero_for_every_percentile() -> None:
    stream = E2EStream([1.0, 0.99, 0.5], 600)
    assert stream.result() == {
        "count": 0,
        "percentiles": [
            {"quantile": 1.0, "value": 0},
            {"quantile": 0.99, "value": 0},
            {"quantile": 0.5, "value": 0},
        ],
    }


def test_empty_result_is_gos_nil_stream() -> None:
    assert empty_result() == {"count": 0, "percentiles": None}


def test_small_set_follows_perks_merged_query() -> None:
    # Worked by hand from perks' query(): the merged summary of 1..10 answers p50 with 7.
    stream = E2EStream([0.99, 0.5], 600)
    for latency in range(1, 11):
        stream.add(latency)
    assert stream.result() == {
        "count": 10,
        "percentiles": [{"quantile": 0.99, "value": 10}, {"quantile": 0.5, "value": 7}],
    }


def test_unflushed_stream_queries_its_buffer_exactly() -> None:
    stream = TargetedStream([0.5, 0.9])
    for v in (9, 1, 5, 3, 7, 2, 10, 4, 8, 6):
        stream.insert(v)
    # perks' fast path: index int(n*q) - 1 of the sorted buffer
    assert stream.query(0.5) == 5
    assert stream.query(0.9) == 9
    assert stream.count() == 10


def test_empty_targeted_stream_queries_zero() -> None:
    assert TargetedStream([0.99]).query(0.99) == 0


@pytest.mark.parametrize("quantiles", [[0.99, 0.95, 0.5], [1.0, 0.99]])
def test_large_stream_stays_within_the_rank_error(quantiles: list[float]) -> None:
    rng = random.Random(7)
    n = 50_000
    data = list(range(1, n + 1))
    rng.shuffle(data)
    stream = E2EStream(quantiles, 600)
    for latency in data:
        stream.add(latency)
    result = stream.result()
    assert result["count"] == n
    for q, value in zip(quantiles, values(result), strict=True):
        # values are their own ranks here; epsilon is 1% (perks' default), the merge of
        # the two half-window summaries adds at most as much again
        assert abs(value - q * n) <= 0.02 * n, (q, value)


def test_summary_memory_is_bounded() -> None:
    stream = TargetedStream([0.99, 0.5])
    for latency in range(200_000):
        stream.insert(latency)
    samples = stream.samples()
    assert sum(s[1] for s in samples) == 200_000
    assert len(samples) < 2_000


def test_buffer_flushes_into_the_summary_when_full() -> None:
    stream = TargetedStream([0.5])
    for latency in range(BUFFER_SIZE - 1):
        stream.insert(latency)
    assert stream.samples()[0] == (0, 1.0, 0.0)  # still the raw buffer
    stream.insert(BUFFER_SIZE)
    assert stream.count() == BUFFER_SIZE
    assert len(stream.samples()) < BUFFER_SIZE  # compressed


def test_percentile_one_is_the_maximum() -> None:
    stream = E2EStream([1.0], 600)
    for latency in (5, 500, 50, 5000, 50000):
        stream.add(latency)
    assert values(stream.result()) == [50000]


def test_window_rotates_every_half_window() -> None:
    clock = FakeClock()
    stream = E2EStream([0.5], 10, clock)  # halves of 5 s
    stream.add(100)
    clock.now += 6  # one rotation: the first half is kept as the older stream
    stream.add(200)
    assert stream.result()["count"] == 2
    clock.now += 5  # another rotation: the first FIN falls out of the window
    assert stream.result()["count"] == 1
    assert values(stream.result()) == [200]
    clock.now += 3600  # idle for much longer than the window: nothing left
    assert stream.result()["count"] == 0
    stream.add(300)
    assert stream.result()["count"] == 1


def test_exactly_one_rotation_at_twice_the_half_window() -> None:
    # Go moves while now > last_move + half: at exactly 2 halves it moves once
    clock = FakeClock()
    stream = E2EStream([0.5], 10, clock)
    stream.add(1)
    clock.now += 10
    stream.add(2)
    assert stream.result()["count"] == 2


def test_non_positive_window_never_rotates() -> None:
    clock = FakeClock()
    stream = E2EStream([0.5], 0, clock)
    stream.add(1)
    clock.now += 1e6
    stream.add(2)
    assert stream.result()["count"] == 2


def test_topic_aggregate_merges_its_channels() -> None:
    a = E2EStream([0.99, 0.5], 600)
    b = E2EStream([0.99, 0.5], 600)
    for latency in range(1, 101):
        a.add(latency)
    for latency in range(1001, 1101):
        b.add(latency)
    merged = E2EStream.aggregate([a, None, b])
    assert merged is not None
    result = merged.result()
    assert result["count"] == 200
    p99, p50 = values(result)
    assert 1090 <= p99 <= 1100
    assert 90 <= p50 <= 1010
    # the channels' own figures are untouched by the aggregation
    assert a.result()["count"] == 100
    assert b.result()["count"] == 100


def test_aggregate_of_no_stream_is_none() -> None:
    assert E2EStream.aggregate([]) is None
    assert E2EStream.aggregate([None, None]) is None
