"""Topology-aware consumption (NSQ master, ``--enable-experiment=topology-aware-consumption``).

All of the feature's rules live here:

* **Locality of a consumer**, fixed at IDENTIFY. With the experiment on, a client is
  *zone-local* when the ``topology_zone`` it sent equals nsqd's ``--topology-zone``, else
  *region-local* when its ``topology_region`` equals ``--topology-region``, else *global*.
  Plain string equality, as Go compares them (so with no zone set anywhere, "" == ""
  makes every client zone-local). A client that never IDENTIFYs is global, and so is
  every client without the experiment.
* **Preference**. Go's channel offers each message first to a zone-local consumer that is
  waiting for one (only when ``--topology-zone`` is set), then to one that reads the
  region hand-off (zone- or region-local consumers, only when ``--topology-region`` is
  set), then queues it for anyone. Here a dispatch pass visits the ready consumers in
  that order, so a local consumer with room under its RDY takes what is queued before the
  others; when no local consumer has room, the others get it: a preference, not a
  partition, and no message waits for a local consumer.
* **Counters**, as Go master keeps them: a delivery to a zone-local consumer counts in
  ``zone_local_msg_count``, to a region-local one in ``region_local_msg_count``, to any
  other in ``global_msg_count``; without the experiment every delivery is global.

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
    "client_counts",
    "delivery_counts",
    "locality",
    "preference_for",
]

ZONE_LOCAL: Final = 0
REGION_LOCAL: Final = 1
GLOBAL: Final = 2


def locality(opts: Options, zone: str, region: str) -> int:
    """The locality of a client that sent ``zone`` and ``region`` in IDENTIFY."""
    if not opts.has_experiment(TOPOLOGY_AWARE_CONSUMPTION):
        return GLOBAL
    if zone == opts.topology_zone:
        return ZONE_LOCAL
    if region == opts.topology_region:
        return REGION_LOCAL
    return GLOBAL


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
        if where == ZONE_LOCAL and self._zone_set:
            return 0  # reads the zone-local hand-off
        if where != GLOBAL and self._region_set:
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
                    counts[consumer.locality] += consumer.message_count - count
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


def client_counts(where: int, message_count: int) -> tuple[int, int, int]:
    """A client's (zone_local, region_local, global) counts: all its deliveries in its class."""
    counts = [0, 0, 0]
    counts[where] = message_count
    return counts[0], counts[1], counts[2]
