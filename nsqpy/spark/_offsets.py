"""Synthetic offsets and the partition plan of a micro-batch (pure functions, no I/O).

NSQ has no offsets: a message is gone once FIN'd. The connector's offset therefore does not
point into the broker; it *names* a micro-batch and fixes its plan::

    {"v": 2, "run": "<id>", "batch": k,
     "q": {"<topic>": {"<nsqd tcp address>": [quota, quota, ...]}}}

"batch k reads up to ``quota`` messages of ``topic`` from that nsqd in each of these
partitions" (version 1, written before a query could read several topics, had
``{"<nsqd>": [...]}`` for the query's one topic; it is still read). The write-ahead log
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
from typing import Any, Final, TypeVar

__all__ = [
    "Offset",
    "PartitionPlan",
    "Source",
    "partitions_between",
    "plan_partitions",
    "proportional",
]

OFFSET_VERSION: Final = 2

Source = tuple[str, str]  # (topic, nsqd TCP address): where a partition reads


@dataclass(frozen=True)
class Offset:
    """One offset: batch ``batch`` of run ``run`` with partition quotas per (topic, nsqd)."""

    run: str
    batch: int
    quotas: Mapping[Source, tuple[int, ...]]

    def to_json(self) -> dict[str, Any]:
        q: dict[str, dict[str, list[int]]] = {}
        for topic, address in sorted(self.quotas):
            q.setdefault(topic, {})[address] = list(self.quotas[(topic, address)])
        return {"v": OFFSET_VERSION, "run": self.run, "batch": self.batch, "q": q}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], topic: str = "") -> Offset:
        """Parse an offset; a version 1 offset's quotas are for ``topic``."""
        version = data.get("v")
        raw = dict(data.get("q") or {})
        if version == 1:
            nested = {topic: raw}
        elif version == OFFSET_VERSION:
            nested = raw
        else:
            raise ValueError(f"unsupported nsq offset {dict(data)!r}")
        quotas = {
            (str(t), str(a)): tuple(int(n) for n in q)
            for t, per_nsqd in nested.items()
            for a, q in dict(per_nsqd).items()
        }
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
    """The read tasks of the micro-batch ``(start, end]``: a pure function of the offsets
    (``topic``: the query's topic, for a version 1 offset).

    ``start == end`` (Spark may plan an empty range) has none.
    """
    s = Offset.from_json(start, topic)
    e = Offset.from_json(end, topic)
    if e.run == s.run and e.batch <= s.batch:
        return []
    plans: list[PartitionPlan] = []
    for source in sorted(e.quotas):
        for quota in e.quotas[source]:
            plans.append(
                PartitionPlan(e.run, e.batch, len(plans), source[1], quota, source[0], channel)
            )
    return plans


K = TypeVar("K", str, Source)


def proportional(weights: Mapping[K, int], total: int) -> dict[K, int]:
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
    quotas: Mapping[K, int], num_partitions: int, max_per_partition: int
) -> dict[K, tuple[int, ...]]:
    """Split each source's quota (a (topic, nsqd)'s) into partitions.

    At least ``num_partitions`` in all (spread over the sources in proportion to their
    quotas), at least one per source with a quota, and none above ``max_per_partition`` or
    empty.
    """
    active = {a: q for a, q in quotas.items() if q > 0}
    total = sum(active.values())
    if not total:
        return {}
    wanted = max(num_partitions, math.ceil(total / max_per_partition))
    # One partition per nsqd first, the rest in proportion to the quotas.
    more = proportional(active, max(0, wanted - len(active)))
    plan: dict[K, tuple[int, ...]] = {}
    for address, quota in sorted(active.items()):
        n = min(quota, max(1 + more[address], math.ceil(quota / max_per_partition)))
        base, extra = divmod(quota, n)
        plan[address] = tuple(base + (1 if j < extra else 0) for j in range(n))
    return plan
