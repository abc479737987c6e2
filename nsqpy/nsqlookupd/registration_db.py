"""nsqlookupd's registration database (spec §4.2), Go's ``registration_db.go``.

A *registration* is a key ``(category, key, subkey)``:

=========  =========  ==========  ==========================================
category   key        subkey      meaning
=========  =========  ==========  ==========================================
client     ""         ""          every identified nsqd (``/nodes``)
topic      topic      ""          nsqds that have the topic
channel    topic      channel     nsqds that have the channel
=========  =========  ==========  ==========================================

Each maps producer id (the nsqd connection's remote ``ip:port``) to a
:class:`Producer`. Keys outlive their producers: a disconnected nsqd is removed
from every key, but the keys stay (``/topics`` keeps listing them) until removed
over HTTP or, for ``#ephemeral`` names, when UNREGISTER leaves them empty.

``"*"`` as key or subkey in the ``find_*`` methods matches any value, as in Go.
No locking: nsqlookupd runs on one event loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PeerInfo",
    "Producer",
    "Registration",
    "RegistrationDB",
    "filter_by_active",
    "filter_registrations",
    "keys",
    "subkeys",
]

# time.Time{}.UnixNano(): what Go's /debug shows as tombstoned_at of a producer never tombstoned.
ZERO_TIME_UNIX_NANO = -6795364578871345152


@dataclass(frozen=True, slots=True)
class Registration:
    """A registration key."""

    category: str
    key: str
    subkey: str

    def is_match(self, category: str, key: str, subkey: str) -> bool:
        """Whether this key matches the pattern (``"*"`` is a wildcard for key and subkey)."""
        if category != self.category:
            return False
        if key != "*" and self.key != key:
            return False
        return subkey == "*" or self.subkey == subkey


@dataclass(eq=False, slots=True)
class PeerInfo:
    """One identified nsqd connection, shared by all its :class:`Producer` entries."""

    id: str
    """Producer id: the remote ``ip:port`` of the nsqd's TCP connection."""
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    topology_zone: str = ""
    topology_region: str = ""
    last_update: int = field(default_factory=time.time_ns)
    """Wall clock (unix ns) of the last IDENTIFY or PING."""

    def to_json(self) -> dict[str, Any]:
        """The ``PeerInfo`` JSON object of ``/lookup`` (Go's struct field order)."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topology_zone": self.topology_zone,
            "topology_region": self.topology_region,
        }


@dataclass(eq=False, slots=True)
class Producer:
    """An nsqd under one registration key; tombstones are per key, so per topic."""

    peer_info: PeerInfo
    tombstoned: bool = False
    tombstoned_at: int = ZERO_TIME_UNIX_NANO
    """Wall clock (unix ns) of the tombstone."""

    def tombstone(self, now: int | None = None) -> None:
        """Hide this producer of this key from ``/lookup`` for --tombstone-lifetime."""
        self.tombstoned = True
        self.tombstoned_at = time.time_ns() if now is None else now

    def is_tombstoned(self, lifetime_ns: int, now: int | None = None) -> bool:
        """Tombstoned less than ``lifetime_ns`` ago (the flag itself is never cleared)."""
        if not self.tombstoned:
            return False
        now = time.time_ns() if now is None else now
        return now - self.tombstoned_at < lifetime_ns

    def __str__(self) -> str:
        info = self.peer_info
        return f"{info.broadcast_address} [{info.tcp_port}, {info.http_port}]"


ProducerMap = dict[str, Producer]


class RegistrationDB:
    """Registration keys and their producers.

    Besides Go's one map, two indexes keep every operation proportional to what
    it touches: keys by category and key (for the ``"*"`` lookups) and keys by
    producer id (for a disconnect).
    """

    __slots__ = ("_by_id", "_index", "_map")

    def __init__(self) -> None:
        self._map: dict[Registration, ProducerMap] = {}
        # category → key → subkey → Registration, in insertion order
        self._index: dict[str, dict[str, dict[str, Registration]]] = {}
        # producer id → the registrations it is in
        self._by_id: dict[str, dict[Registration, None]] = {}

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, k: Registration) -> bool:
        return k in self._map

    def items(self) -> Iterator[tuple[Registration, ProducerMap]]:
        """Every key with its producers (``/debug``)."""
        return iter(self._map.items())

    # -- changes -----------------------------------------------------------------------------

    def add_registration(self, k: Registration) -> None:
        """Add the key if it is not there (``/topic/create``, ``/channel/create``)."""
        self._ensure(k)

    def _ensure(self, k: Registration) -> ProducerMap:
        producers = self._map.get(k)
        if producers is None:
            producers = self._map[k] = {}
            self._index.setdefault(k.category, {}).setdefault(k.key, {})[k.subkey] = k
        return producers

    def add_producer(self, k: Registration, producer: Producer) -> bool:
        """Add ``producer`` under ``k`` (creating the key); False if its id was already there."""
        producers = self._ensure(k)
        peer_id = producer.peer_info.id
        if peer_id in producers:
            return False
        producers[peer_id] = producer
        self._by_id.setdefault(peer_id, {})[k] = None
        return True

    def remove_producer(self, k: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a producer from ``k``: (whether it was there, producers left). The key stays."""
        producers = self._map.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._forget(peer_id, k)
        return removed, len(producers)

    def remove_registration(self, k: Registration) -> None:
        """Remove the key and its producers."""
        producers = self._map.pop(k, None)
        if producers is None:
            return
        for peer_id in producers:
            self._forget(peer_id, k)
        keys_of_category = self._index[k.category]
        subkeys_of_key = keys_of_category[k.key]
        del subkeys_of_key[k.subkey]
        if not subkeys_of_key:
            del keys_of_category[k.key]
            if not keys_of_category:
                del self._index[k.category]

    def _forget(self, peer_id: str, k: Registration) -> None:
        registrations = self._by_id.get(peer_id)
        if registrations is not None:
            registrations.pop(k, None)
            if not registrations:
                del self._by_id[peer_id]

    # -- queries -----------------------------------------------------------------------------

    def _matching(self, category: str, key: str, subkey: str) -> Iterator[Registration]:
        keys_of_category = self._index.get(category)
        if not keys_of_category:
            return
        if key == "*":
            subkey_maps: Iterable[dict[str, Registration]] = keys_of_category.values()
        else:
            one = keys_of_category.get(key)
            subkey_maps = () if one is None else (one,)
        for subkeys_of_key in subkey_maps:
            if subkey == "*":
                yield from subkeys_of_key.values()
            else:
                k = subkeys_of_key.get(subkey)
                if k is not None:
                    yield k

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        """The keys matching the pattern."""
        return list(self._matching(category, key, subkey))

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """The producers under the matching keys, one per producer id (the first found)."""
        if key != "*" and subkey != "*":
            return list(self._map.get(Registration(category, key, subkey), {}).values())
        seen: set[str] = set()
        out: list[Producer] = []
        for k in self._matching(category, key, subkey):
            for peer_id, producer in self._map[k].items():
                if peer_id not in seen:
                    seen.add(peer_id)
                    out.append(producer)
        return out

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key the producer id is under."""
        return list(self._by_id.get(peer_id, ()))


def filter_registrations(
    registrations: Iterable[Registration], category: str, key: str, subkey: str
) -> list[Registration]:
    """Go's ``Registrations.Filter``."""
    return [k for k in registrations if k.is_match(category, key, subkey)]


def keys(registrations: Iterable[Registration]) -> list[str]:
    """Go's ``Registrations.Keys``."""
    return [k.key for k in registrations]


def subkeys(registrations: Iterable[Registration]) -> list[str]:
    """Go's ``Registrations.SubKeys``."""
    return [k.subkey for k in registrations]


def filter_by_active(
    producers: Iterable[Producer],
    inactivity_timeout_ns: int,
    tombstone_lifetime_ns: int,
    now: int | None = None,
) -> list[Producer]:
    """Go's ``Producers.FilterByActive``: drop producers not heard from within the
    timeout and producers tombstoned within the lifetime (0 keeps tombstoned ones)."""
    now = time.time_ns() if now is None else now
    return [
        p
        for p in producers
        if now - p.peer_info.last_update <= inactivity_timeout_ns
        and not p.is_tombstoned(tombstone_lifetime_ns, now)
    ]
