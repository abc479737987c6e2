"""Offsets and partition planning: pure functions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.spark._offsets import (
    Offset,
    PartitionPlan,
    partitions_between,
    plan_partitions,
    proportional,
)


def test_offset_json_round_trip() -> None:
    offset = Offset("r1", 3, {("t", "b:2"): (5, 5), ("t", "a:1"): (7,), ("s", "a:1"): (1,)})
    data = offset.to_json()
    assert data == {
        "v": 2,
        "run": "r1",
        "batch": 3,
        "q": {"s": {"a:1": [1]}, "t": {"a:1": [7], "b:2": [5, 5]}},
    }
    assert Offset.from_json(data) == offset
    assert offset.total == 18


def test_version_1_offsets_are_for_the_query_topic() -> None:
    """Checkpoints written before a query could read several topics still replay."""
    old = {"v": 1, "run": "r1", "batch": 3, "q": {"a:1": [7], "b:2": [5, 5]}}
    assert Offset.from_json(old, "t") == Offset("r1", 3, {("t", "a:1"): (7,), ("t", "b:2"): (5, 5)})
    plans = partitions_between({**old, "batch": 2, "q": {}}, old, "t", "c")
    assert [(p.topic, p.nsqd, p.quota) for p in plans] == [
        ("t", "a:1", 7),
        ("t", "b:2", 5),
        ("t", "b:2", 5),
    ]


def test_partitions_between_is_a_pure_function_of_the_offsets() -> None:
    start = Offset("r", 4, {("t", "x:1"): (9,)}).to_json()
    end = Offset("r", 5, {("t", "b:2"): (3, 4), ("t", "a:1"): (10,), ("s", "b:2"): (2,)}).to_json()
    plans = partitions_between(start, end, "", "c")
    assert plans == partitions_between(dict(start), dict(end), "", "c")
    assert plans == [
        PartitionPlan("r", 5, 0, "b:2", 2, "s", "c"),
        PartitionPlan("r", 5, 1, "a:1", 10, "t", "c"),
        PartitionPlan("r", 5, 2, "b:2", 3, "t", "c"),
        PartitionPlan("r", 5, 3, "b:2", 4, "t", "c"),
    ]


def test_empty_range_has_no_partitions() -> None:
    offset = Offset("r", 2, {("t", "a:1"): (10,)}).to_json()
    assert partitions_between(offset, offset, "t", "c") == []


def test_proportional_examples() -> None:
    assert proportional({"a": 30, "b": 10}, 100) == {"a": 30, "b": 10}
    assert proportional({"a": 30, "b": 10}, 20) == {"a": 15, "b": 5}
    assert proportional({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}
    assert proportional({}, 10) == {}


@given(
    st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 10**6), max_size=5),
    st.integers(0, 10**6),
)
def test_proportional_properties(weights: dict[str, int], total: int) -> None:
    shares = proportional(weights, total)
    assert sum(shares.values()) == min(total, sum(weights.values()))
    assert all(0 <= shares[k] <= weights[k] for k in weights)


def test_plan_partitions_examples() -> None:
    assert plan_partitions({"a": 10}, 2, 50_000) == {"a": (5, 5)}
    assert plan_partitions({"a": 1}, 2, 50_000) == {"a": (1,)}
    assert plan_partitions({"a": 0, "b": 9}, 2, 50_000) == {"b": (5, 4)}
    assert plan_partitions({"a": 120_000}, 2, 50_000) == {"a": (40_000, 40_000, 40_000)}
    assert plan_partitions({"a": 9000, "b": 1000}, 4, 50_000) == {
        "a": (3000, 3000, 3000),
        "b": (1000,),
    }
    assert plan_partitions({}, 2, 10) == {}


@settings(deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcde"), st.integers(0, 10**5), max_size=5),
    st.integers(1, 16),
    st.integers(50, 10**5),
)
def test_plan_partitions_properties(quotas: dict[str, int], num: int, per_partition: int) -> None:
    plan = plan_partitions(quotas, num, per_partition)
    for address, quota in quotas.items():
        if quota == 0:
            assert address not in plan
            continue
        parts = plan[address]
        assert sum(parts) == quota
        assert all(0 < p <= per_partition for p in parts)
        assert max(parts) - min(parts) <= 1
    total = sum(quotas.values())
    if total:
        assert sum(len(p) for p in plan.values()) >= min(num, total)
