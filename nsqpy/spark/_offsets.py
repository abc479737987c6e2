"""Synthetic offsets and the partition plan of a micro-batch (pure functions, no I/O).

NSQ has no offsets: a message is gone once FIN'd. The connector's offset therefore does not
point into the broker; it *names* a micro-batch and fixes its plan::

    {"v": 1, "run": "<id>", "batch": k, "q": {"<nsqd tcp address>": [quota, quota, ...]}}

"batch k reads up to ``quota`` messages in each of these partitions". The write-ahead log
keeps what partition ``i`` of batch ``k`` actually read, under ``<walLocation>/<run>/<k>/<i>``,
so a replay (task retry, or restart from the checkpoint, where Spark calls ``partitions`` with
the logged offsets and never ``latestOffset``) returns the same rows. That is why
:func:`partitions_between` depends on the two offsets only, never on the options or the time.

``run`` is drawn when a query starts without a checkpoint, so a query whose checkpoint was
deleted cannot replay another query's log that was left in the same ``walLocation``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "Offset",
    "PartitionPlan",
    "partitions_between",
    "plan_partitions",
    "proportional",
]

OFFSET_VERSION: Final = 1


@dataclass(frozen=True)
class Offset:
    """One offset: batch ``batch`` of run ``run`` with per-nsqd partition quotas."""

    run: str
    batch: int
    quotas: Mapping[str, tuple[int, ...]]

    def to_json(self) -> dict[str, Any]:
        return {
            "v": OFFSET_VERSION,
            "run": self.run,
            "batch": self.batch,
            "q": {address: list(self.quotas[address]) for address in sorted(self.quotas)},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Offset:
        if data.get("v") != OFFSET_VERSION:
            raise ValueError(f"unsupported nsq offset {dict(data)!r}")
        quotas = {str(a): tuple(int(n) for n in q) for a, q in dict(data.get("q") or {}).items()}
        return cls(run=str(data["run"]), batch=int(data["batch"]), quotas=quotas)

    @property
    def total(self) -> int:
        return sum(sum(q) for q in self.quotas.values())


@dataclass(frozen=True)
class PartitionPlan:
    """What one read task does: partition ``index`` of batch ``batch`` reads up to ``quota``
    messages of ``topic``/``channel`` from the nsqd at ``nsqd`` (a TCP address)."""

    run: str
    batch: int
    index: int
    nsqd: str
    quota: int
    topic: str
    channel: str


def partitions_between(
    start: Mapping[str, Any], end: Mapping[str, Any], topic: str, channel: str
) -> list[PartitionPlan]:
    """The read tasks of the micro-batch ``(start, end]``: a pure function of the offsets.

    ``start == end`` (Spark may plan an empty range) has none.
    """
    s = Offset.from_json(start)
    e = Offset.from_json(end)
    if e.run == s.run and e.batch <= s.batch:
        return []
    plans: list[PartitionPlan] = []
    for address in sorted(e.quotas):
        for quota in e.quotas[address]:
            plans.append(PartitionPlan(e.run, e.batch, len(plans), address, quota, topic, channel))
    return plans


def proportional(weights: Mapping[str, int], total: int) -> dict[str, int]:
    """Share ``total`` out in proportion to ``weights`` (largest remainder, ties by key); every
    share is at most its weight. With ``total >= sum(weights)`` every key gets its weight."""
    weight_sum = sum(max(0, w) for w in weights.values())
    if weight_sum <= total:
        return {k: max(0, w) for k, w in weights.items()}
    shares = {k: total * max(0, w) // weight_sum for k, w in weights.items()}
    left = total - sum(shares.values())
    by_remainder = sorted(weights, key=lambda k: (-(total * max(0, weights[k]) % weight_sum), k))
    for k in by_remainder[:left]:
        shares[k] += 1
    return shares


def plan_partitions(
    quotas: Mapping[str, int], num_partitions: int, max_per_partition: int
) -> dict[str, tuple[int, ...]]:
    """Split each nsqd's quota into partitions.

    At least ``num_partitions`` in all (spread over the nsqds in proportion to their quotas),
    at least one per nsqd with a quota, and none above ``max_per_partition`` or empty.
    """
    active = {a: q for a, q in quotas.items() if q > 0}
    total = sum(active.values())
    if not total:
        return {}
    wanted = max(num_partitions, math.ceil(total / max_per_partition))
    # One partition per nsqd first, the rest in proportion to the quotas.
    more = proportional(active, max(0, wanted - len(active)))
    plan: dict[str, tuple[int, ...]] = {}
    for address, quota in sorted(active.items()):
        n = min(quota, max(1 + more[address], math.ceil(quota / max_per_partition)))
        base, extra = divmod(quota, n)
        plan[address] = tuple(base + (1 if j < extra else 0) for j in range(n))
    return plan
