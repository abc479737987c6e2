"""Topology-aware consumption (NSQ master, ``--enable-experiment=topology-aware-consumption``).

All of the feature's rules live here, as measured against Go's nsqd (tests/e2e/test_topology.py
runs every combination against both):

* **Locality of a consumer**, fixed at IDENTIFY: two separate facts, as Go keeps them.
  *Zone-local* when the ``topology_zone`` it sent equals nsqd's ``--topology-zone``, and
  *region-local* when its ``topology_region`` equals ``--topology-region``, each plain
  string equality (so an unset zone on both sides, "" == "", is a zone match). A client
  may be both, either or neither. One that never IDENTIFYs is neither, and so is every
  client without the experiment.
* **Preference**. Go's channel offers each message first to a waiting consumer that reads
  the zone-local hand-off, then to one that reads the region-local hand-off, then queues it
  for anyone. The zone hand-off exists only when ``--topology-zone`` is set and is read by
  the zone-local consumers; the region hand-off exists only when ``--topology-region`` is
  set and is read by the region-local ones (a zone match does not make a consumer read
  it). So with no ``--topology-zone`` a zone match, even "" == "", gives no preference at
  all. Here a dispatch pass visits the ready consumers in that order, so a preferred
  consumer with room under its RDY takes what is queued before the others; when none has
  room, the others get it: a preference, not a partition, and no message waits for a
  local consumer.
* **Counters**, as Go master keeps them, by the class of the consumer that got the message
  (whichever hand-off it came by): ``zone_local_msg_count`` if it is zone-local, else
  ``region_local_msg_count`` if it is region-local, else ``global_msg_count``; without the
  experiment every delivery is global. They are the channel's; Go's per-client stats carry
  none of them (the fields are declared but never filled, so omitempty leaves them out).

The channel holds a :class:`TopologyPreference` only when the experiment is on, and its
``dispatch`` calls it at one visible point; without it nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from nsqpy.nsqd.options import TOPOLOGY_AWARE_CONSUMPTION

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Consumer, InFlight
    from nsqpy.nsqd.options import Options

__all__ = [
    "GLOBAL",
    "REGION_LOCAL",
    "ZONE_LOCAL",
    "TopologyPreference",
    "counter",
    "delivery_counts",
    "locality",
    "preference_for",
]

# A locality is a set of flags: the two facts are independent (ZONE_LOCAL | REGION_LOCAL
# is a client that matches both).
GLOBAL: Final = 0
ZONE_LOCAL: Final = 1
REGION_LOCAL: Final = 2

# Indexes of the three counters (TopologyPreference.counts, the stats triples).
_ZONE_COUNT, _REGION_COUNT, _GLOBAL_COUNT = 0, 1, 2


def locality(opts: Options, zone: str, region: str) -> int:
    """The locality flags of a client that sent ``zone`` and ``region`` in IDENTIFY."""
    if not opts.has_experiment(TOPOLOGY_AWARE_CONSUMPTION):
        return GLOBAL
    where = GLOBAL
    if zone == opts.topology_zone:
        where |= ZONE_LOCAL
    if region == opts.topology_region:
        where |= REGION_LOCAL
    return where


def counter(where: int) -> int:
    """Which counter a delivery to a consumer of locality ``where`` goes to: the zone one
    if it is zone-local, else the region one if it is region-local, else the global one."""
    if where & ZONE_LOCAL:
        return _ZONE_COUNT
    if where & REGION_LOCAL:
        return _REGION_COUNT
    return _GLOBAL_COUNT


class _Local(Protocol):
    """What the preference reads of a consumer (``protocol_v2.ClientV2`` has it)."""

    ready_count: int
    in_flight: dict[bytes, InFlight]
    message_count: int
    locality: int


class TopologyPreference:
    """One channel's delivery order and its three counters (experiment on only)."""

    __slots__ = ("_region_set", "_turn", "_zone_set", "counts")

    def __init__(self, opts: Options) -> None:
        self._zone_set = bool(opts.topology_zone)
        self._region_set = bool(opts.topology_region)
        self._turn = 0
        # deliveries to zone-local, region-local and other consumers
        self.counts = [0, 0, 0]

    def _tier(self, client: _Local) -> int:
        where = client.locality
        if where & ZONE_LOCAL and self._zone_set:
            return 0  # reads the zone-local hand-off
        if where & REGION_LOCAL and self._region_set:
            return 1  # reads the region-local hand-off
        return 2

    def dispatch(
        self, clients: Sequence[Consumer], deliver: Callable[[int, Sequence[Consumer]], int]
    ) -> int:
        """One delivery pass (``deliver(0, order)``: each consumer takes all it has room
        for) over the ready consumers, local ones first; counts what each class got."""
        tiers: tuple[list[_Local], list[_Local], list[_Local]] = ([], [], [])
        for client in clients:
            local: _Local = client  # type: ignore[assignment]
            if local.ready_count > len(local.in_flight):
                tiers[self._tier(local)].append(local)
        # Within a tier consumers take turns, as Go's pumps compete for each message.
        self._turn += 1
        order: list[_Local] = []
        for tier in tiers:
            if tier:
                k = self._turn % len(tier)
                order.extend(tier[k:])
                order.extend(tier[:k])
        if not order:
            return 0
        before = [c.message_count for c in order]
        delivered = deliver(0, order)  # type: ignore[arg-type]
        if delivered:
            counts = self.counts
            for consumer, count in zip(order, before, strict=True):
                if consumer.message_count != count:
                    counts[counter(consumer.locality)] += consumer.message_count - count
        return delivered


def preference_for(opts: Options) -> TopologyPreference | None:
    """A channel's preference: None (nothing to do) unless the experiment is on."""
    if not opts.has_experiment(TOPOLOGY_AWARE_CONSUMPTION):
        return None
    return TopologyPreference(opts)


def delivery_counts(preference: TopologyPreference | None, deliveries: int) -> tuple[int, int, int]:
    """A channel's (zone_local, region_local, global) message counts for stats."""
    if preference is None:
        return 0, 0, deliveries
    zone, region, other = preference.counts
    return zone, region, other
