"""The cluster's figures as nsqadmin aggregates them (Go's ``internal/clusterinfo/types.go``).

nsqd reports one node's topics, channels and clients (``/stats?format=json``, spec §3.2);
nsqlookupd reports which nsqd exist (``/nodes``) and which produce a topic (``/lookup``,
spec §4.3).  The classes here read those JSON documents, tolerate missing or mistyped
fields (an upstream is never trusted to be well-formed), add the stats of several nodes
together, and render the JSON nsqadmin's API answers with (Go's field names and order).

Aggregation differs from Go on purpose in two places, both bugs there: Go reuses the first
node's channel object as the cluster-wide one (so that node is missing from its ``nodes``),
and stops merging channels by name once one name matched.  Here every aggregate is a fresh
object whose ``nodes`` lists each node once.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChannelStats",
    "ClientStats",
    "E2ELatency",
    "Producer",
    "ProducerTopic",
    "TopicStats",
    "version_key",
]

JSON = dict[str, Any]


def _int(doc: JSON, key: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    return 0


def _str(doc: JSON, key: str) -> str:
    value = doc.get(key)
    return value if isinstance(value, str) else ""


def _bool(doc: JSON, key: str) -> bool:
    return doc.get(key) is True


def _list(doc: JSON, key: str) -> list[Any]:
    value = doc.get(key)
    return value if isinstance(value, list) else []


_SEMVER = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")


def version_key(version: str) -> tuple[int, int, int, int, str]:
    """A sortable key for a semantic version; unparsable versions sort as 0.0.0.

    A pre-release (``1.3.0-alpha``) sorts before its release (``1.3.0``).
    """
    m = _SEMVER.fullmatch(version.strip())
    if m is None:
        return (0, 0, 0, 1, "")
    pre = m.group(4)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0 if pre else 1, pre or "")


# --------------------------------------------------------------------------- producers


@dataclass
class ProducerTopic:
    """One topic of an nsqd as nsqlookupd lists it, and whether it is tombstoned there."""

    topic: str
    tombstoned: bool = False

    def to_json(self) -> JSON:
        return {"topic": self.topic, "tombstoned": self.tombstoned}


@dataclass
class Producer:
    """One nsqd, as registered with nsqlookupd (or asked directly with ``/info``)."""

    remote_address: str = ""
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    topology_zone: str = ""
    topology_region: str = ""
    topics: list[ProducerTopic] = field(default_factory=list)
    remote_addresses: list[str] = field(default_factory=list)
    """``<lookupd>/<nsqd's address as that lookupd sees it>``, one per lookupd knowing it."""
    out_of_date: bool = False

    @classmethod
    def from_lookupd(cls, doc: JSON) -> Producer:
        """From an entry of ``/nodes`` (with ``topics`` and ``tombstones``) or ``/lookup``."""
        names = [t for t in _list(doc, "topics") if isinstance(t, str)]
        tombstones = _list(doc, "tombstones")
        topics = [
            ProducerTopic(name, i < len(tombstones) and tombstones[i] is True)
            for i, name in enumerate(names)
        ]
        topics.sort(key=lambda t: t.topic)
        return cls(
            remote_address=_str(doc, "remote_address"),
            hostname=_str(doc, "hostname"),
            broadcast_address=_str(doc, "broadcast_address"),
            tcp_port=_int(doc, "tcp_port"),
            http_port=_int(doc, "http_port"),
            version=_str(doc, "version"),
            topology_zone=_str(doc, "topology_zone"),
            topology_region=_str(doc, "topology_region"),
            topics=topics,
        )

    @property
    def address(self) -> str:
        """The address the lookupd saw the nsqd connect from (``N/A`` if unknown)."""
        return self.remote_address or "N/A"

    @property
    def http_address(self) -> str:
        """``broadcast_address:http_port``: how nsqadmin reaches the nsqd, and its node id."""
        return f"{self.broadcast_address}:{self.http_port}"

    @property
    def tcp_address(self) -> str:
        """``broadcast_address:tcp_port``: the nsqd's identity across lookupds."""
        return f"{self.broadcast_address}:{self.tcp_port}"

    def is_inconsistent(self, num_lookupd: int) -> bool:
        """Not registered with every lookupd, or several nsqd share one broadcast address."""
        return len(self.remote_addresses) != num_lookupd

    def to_json(self) -> JSON:
        return {
            "remote_addresses": list(self.remote_addresses),
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topology_zone": self.topology_zone,
            "topology_region": self.topology_region,
            "topics": [t.to_json() for t in self.topics],
            "out_of_date": self.out_of_date,
        }


# --------------------------------------------------------------------------- e2e latency


@dataclass
class E2ELatency:
    """Go's ``quantile.E2eProcessingLatencyAggregate``: percentiles summed over nodes.

    Each percentile is ``{"quantile", "value", "min", "max", "average", "count"}`` (values
    in nanoseconds); a node's own value is its min, max and average.
    """

    count: int = 0
    percentiles: list[dict[str, float]] | None = None
    topic: str = ""
    channel: str = ""
    host: str = ""

    @classmethod
    def from_nsqd(cls, doc: Any) -> E2ELatency:
        if not isinstance(doc, dict):
            return cls()
        count = _int(doc, "count")
        raw = doc.get("percentiles")
        percentiles: list[dict[str, float]] | None = None
        if isinstance(raw, list):
            percentiles = []
            for p in raw:
                if not isinstance(p, dict):
                    continue
                quantile = p.get("quantile")
                value = p.get("value")
                if not isinstance(quantile, (int, float)) or not isinstance(value, (int, float)):
                    continue
                percentiles.append(
                    {
                        "quantile": float(quantile),
                        "value": float(value),
                        "min": float(value),
                        "max": float(value),
                        "average": float(value),
                        "count": float(count),
                    }
                )
        return cls(count=count, percentiles=percentiles)

    def add(self, other: E2ELatency) -> None:
        """Merge another node's latencies: max of maxima, min of minima, weighted average."""
        self.count += other.count
        for value in other.percentiles or ():
            if self.percentiles is None:
                self.percentiles = []
            mine = next((p for p in self.percentiles if p["quantile"] == value["quantile"]), None)
            if mine is None:
                self.percentiles.append(dict(value))
                continue
            mine["max"] = max(mine["max"], value["max"])
            mine["min"] = min(mine["min"], value["min"])
            mine["value"] = mine["max"]
            total = mine["count"] + value["count"]
            if total:
                mine["average"] = (
                    mine["average"] * mine["count"] + value["average"] * value["count"]
                ) / total
            mine["count"] = total
        if self.percentiles:
            self.percentiles.sort(key=lambda p: p["quantile"], reverse=True)

    def to_json(self) -> JSON:
        return {
            "count": self.count,
            "percentiles": self.percentiles,
            "topic": self.topic,
            "channel": self.channel,
            "host": self.host,
        }


# --------------------------------------------------------------------------- clients


_CLIENT_STRINGS = (
    "remote_address",
    "name",
    "version",
    "client_id",
    "hostname",
    "user_agent",
    "auth_identity",
    "auth_identity_url",
    "topology_zone",
    "topology_region",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
)


@dataclass
class ClientStats:
    """One consumer connection of a channel, with the nsqd (``node``) it is connected to."""

    node: str
    doc: JSON
    """The nsqd's ClientStats JSON, normalised to Go's nsqadmin field set."""

    @classmethod
    def from_nsqd(cls, doc: Any, node: str, now: float | None = None) -> ClientStats:
        src: JSON = doc if isinstance(doc, dict) else {}
        out: JSON = {key: _str(src, key) for key in _CLIENT_STRINGS}
        for key in (
            "connect_ts",
            "in_flight_count",
            "ready_count",
            "finish_count",
            "requeue_count",
            "message_count",
            "sample_rate",
        ):
            out[key] = _int(src, key)
        for key in ("deflate", "snappy", "authed", "tls", "tls_negotiated_protocol_is_mutual"):
            out[key] = _bool(src, key)
        if not out["client_id"]:
            port = out["remote_address"].rpartition(":")[2] or "NA"
            out["client_id"] = f"{out['name']}:{port}"
        wall = int(time.time() if now is None else now)
        out["connected"] = max(0, wall - out["connect_ts"]) * 1_000_000_000
        return cls(node=node, doc=out)

    @property
    def hostname(self) -> str:
        return str(self.doc.get("hostname", ""))

    def to_json(self) -> JSON:
        return {
            "node": self.node,
            "remote_address": self.doc["remote_address"],
            "name": self.doc["name"],
            "version": self.doc["version"],
            "client_id": self.doc["client_id"],
            "hostname": self.doc["hostname"],
            "user_agent": self.doc["user_agent"],
            "connect_ts": self.doc["connect_ts"],
            "connected": self.doc["connected"],
            "in_flight_count": self.doc["in_flight_count"],
            "ready_count": self.doc["ready_count"],
            "finish_count": self.doc["finish_count"],
            "requeue_count": self.doc["requeue_count"],
            "message_count": self.doc["message_count"],
            "sample_rate": self.doc["sample_rate"],
            "deflate": self.doc["deflate"],
            "snappy": self.doc["snappy"],
            "authed": self.doc["authed"],
            "auth_identity": self.doc["auth_identity"],
            "auth_identity_url": self.doc["auth_identity_url"],
            # the nsqd's own topology, next to the client's (Go master, omitempty)
            **{k: self.doc[k] for k in _NODE_TOPOLOGY if self.doc.get(k)},
            "topology_zone": self.doc["topology_zone"],
            "topology_region": self.doc["topology_region"],
            "tls": self.doc["tls"],
            "tls_cipher_suite": self.doc["tls_cipher_suite"],
            "tls_version": self.doc["tls_version"],
            "tls_negotiated_protocol": self.doc["tls_negotiated_protocol"],
            "tls_negotiated_protocol_is_mutual": self.doc["tls_negotiated_protocol_is_mutual"],
        }


_NODE_TOPOLOGY = ("node_topology_region", "node_topology_zone")


def _host_order(node: str, hostname: str) -> tuple[str, str]:
    return (hostname, node)


# --------------------------------------------------------------------------- policies


@dataclass
class PolicyStats:
    """A topic's or channel's message-policy fields of nsqd's ``/stats`` (only there when a
    policy applies or something was counted), summed over nodes; the first node's policy."""

    dead_letter_count: int = 0
    expired_count: int = 0
    overflow_count: int = 0
    policy: JSON | None = None
    dead_letter_sources: list[str] = field(default_factory=list)

    @classmethod
    def from_nsqd(cls, doc: JSON) -> PolicyStats | None:
        keys = ("expired_count", "policy", "dead_letter_sources")
        if not any(k in doc for k in keys):
            return None
        policy = doc.get("policy")
        sources = doc.get("dead_letter_sources")
        return cls(
            dead_letter_count=_int(doc, "dead_letter_count"),
            expired_count=_int(doc, "expired_count"),
            overflow_count=_int(doc, "overflow_count"),
            policy=policy if isinstance(policy, dict) else None,
            dead_letter_sources=[str(x) for x in sources] if isinstance(sources, list) else [],
        )

    @staticmethod
    def combine(total: PolicyStats | None, other: PolicyStats | None) -> PolicyStats | None:
        if other is None:
            return total
        if total is None:
            total = PolicyStats()
        total.dead_letter_count += other.dead_letter_count
        total.expired_count += other.expired_count
        total.overflow_count += other.overflow_count
        total.policy = total.policy or other.policy
        total.dead_letter_sources = sorted({*total.dead_letter_sources, *other.dead_letter_sources})
        return total

    def to_json(self) -> JSON:
        return {
            "dead_letter_count": self.dead_letter_count,
            "expired_count": self.expired_count,
            "overflow_count": self.overflow_count,
            "policy": self.policy,
            "dead_letter_sources": self.dead_letter_sources,
        }


# --------------------------------------------------------------------------- channels


_LOCALITY_COUNTS = ("zone_local_msg_count", "region_local_msg_count", "global_msg_count")


@dataclass
class ChannelStats:
    """A channel on one node, or (``node == "*"``) summed over the nodes in ``nodes``."""

    node: str
    hostname: str
    topic_name: str
    channel_name: str
    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    in_flight_count: int = 0
    deferred_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    message_count: int = 0
    # topology-aware consumption's delivery counters (Go master, omitted when zero)
    zone_local_msg_count: int = 0
    region_local_msg_count: int = 0
    global_msg_count: int = 0
    client_count: int = 0
    paused: bool = False
    nodes: list[ChannelStats] = field(default_factory=list)
    clients: list[ClientStats] = field(default_factory=list)
    e2e_processing_latency: E2ELatency = field(default_factory=E2ELatency)
    # message policies (nsqd's policy.py, docs/POLICIES.md): counters and the policy
    policy: PolicyStats | None = None

    @classmethod
    def from_nsqd(
        cls, doc: JSON, node: str, hostname: str, topic_name: str, now: float | None = None
    ) -> ChannelStats:
        depth = _int(doc, "depth")
        backend = _int(doc, "backend_depth")
        clients = [ClientStats.from_nsqd(c, node, now) for c in _list(doc, "clients")]
        client_count = _int(doc, "client_count") if "client_count" in doc else len(clients)
        return cls(
            node=node,
            hostname=hostname,
            topic_name=topic_name,
            channel_name=_str(doc, "channel_name"),
            depth=depth,
            memory_depth=depth - backend,
            backend_depth=backend,
            in_flight_count=_int(doc, "in_flight_count"),
            deferred_count=_int(doc, "deferred_count"),
            requeue_count=_int(doc, "requeue_count"),
            timeout_count=_int(doc, "timeout_count"),
            message_count=_int(doc, "message_count"),
            zone_local_msg_count=_int(doc, "zone_local_msg_count"),
            region_local_msg_count=_int(doc, "region_local_msg_count"),
            global_msg_count=_int(doc, "global_msg_count"),
            client_count=client_count,
            paused=_bool(doc, "paused"),
            clients=clients,
            e2e_processing_latency=E2ELatency.from_nsqd(doc.get("e2e_processing_latency")),
            policy=PolicyStats.from_nsqd(doc),
        )

    @classmethod
    def aggregate(cls, topic_name: str, channel_name: str) -> ChannelStats:
        """An empty cluster-wide channel to :meth:`add` nodes' channels into."""
        return cls(
            node="*",
            hostname="",
            topic_name=topic_name,
            channel_name=channel_name,
            e2e_processing_latency=E2ELatency(topic=topic_name, channel=channel_name, host="*"),
        )

    def add(self, other: ChannelStats) -> None:
        """Add one node's channel into this aggregate (Go's ``ChannelStats.Add``)."""
        self.node = "*"
        self.depth += other.depth
        self.memory_depth += other.memory_depth
        self.backend_depth += other.backend_depth
        self.in_flight_count += other.in_flight_count
        self.deferred_count += other.deferred_count
        self.requeue_count += other.requeue_count
        self.timeout_count += other.timeout_count
        self.message_count += other.message_count
        self.zone_local_msg_count += other.zone_local_msg_count
        self.region_local_msg_count += other.region_local_msg_count
        self.global_msg_count += other.global_msg_count
        self.client_count += other.client_count
        self.paused = self.paused or other.paused
        self.policy = PolicyStats.combine(self.policy, other.policy)
        self.nodes.append(other)
        self.nodes.sort(key=lambda c: _host_order(c.node, c.hostname))
        self.e2e_processing_latency.add(other.e2e_processing_latency)
        self.clients.extend(other.clients)
        self.clients.sort(key=lambda c: _host_order(c.node, c.hostname))

    def to_json(self) -> JSON:
        return {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "channel_name": self.channel_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "in_flight_count": self.in_flight_count,
            "deferred_count": self.deferred_count,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
            "message_count": self.message_count,
            **{k: getattr(self, k) for k in _LOCALITY_COUNTS if getattr(self, k)},
            "client_count": self.client_count,
            "nodes": [n.to_json() for n in self.nodes],
            "clients": [c.to_json() for c in self.clients],
            "paused": self.paused,
            "e2e_processing_latency": self.e2e_processing_latency.to_json(),
            **(self.policy.to_json() if self.policy is not None else {}),
        }


# --------------------------------------------------------------------------- topics


@dataclass
class TopicStats:
    """A topic on one node, or (``node == "*"``) summed over the nodes in ``nodes``."""

    node: str
    hostname: str
    topic_name: str
    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    message_count: int = 0
    paused: bool = False
    nodes: list[TopicStats] = field(default_factory=list)
    channels: list[ChannelStats] = field(default_factory=list)
    e2e_processing_latency: E2ELatency = field(default_factory=E2ELatency)
    policy: PolicyStats | None = None

    @classmethod
    def from_nsqd(cls, doc: JSON, node: str, hostname: str, now: float | None = None) -> TopicStats:
        name = _str(doc, "topic_name")
        depth = _int(doc, "depth")
        backend = _int(doc, "backend_depth")
        channels = [
            ChannelStats.from_nsqd(c, node, hostname, name, now)
            for c in _list(doc, "channels")
            if isinstance(c, dict)
        ]
        return cls(
            node=node,
            hostname=hostname,
            topic_name=name,
            depth=depth,
            memory_depth=depth - backend,
            backend_depth=backend,
            message_count=_int(doc, "message_count"),
            paused=_bool(doc, "paused"),
            channels=channels,
            e2e_processing_latency=E2ELatency.from_nsqd(doc.get("e2e_processing_latency")),
            policy=PolicyStats.from_nsqd(doc),
        )

    @classmethod
    def aggregate(cls, topic_name: str) -> TopicStats:
        """An empty cluster-wide topic to :meth:`add` nodes' topics into."""
        return cls(
            node="*",
            hostname="",
            topic_name=topic_name,
            e2e_processing_latency=E2ELatency(topic=topic_name, host="*"),
        )

    def add(self, other: TopicStats) -> None:
        """Add one node's topic (and its channels) into this aggregate."""
        self.node = "*"
        self.depth += other.depth
        self.memory_depth += other.memory_depth
        self.backend_depth += other.backend_depth
        self.message_count += other.message_count
        self.paused = self.paused or other.paused
        self.policy = PolicyStats.combine(self.policy, other.policy)
        by_name = {c.channel_name: c for c in self.channels}
        for channel in other.channels:
            total = by_name.get(channel.channel_name)
            if total is None:
                total = ChannelStats.aggregate(self.topic_name, channel.channel_name)
                by_name[channel.channel_name] = total
                self.channels.append(total)
            total.add(channel)
        self.channels.sort(key=lambda c: c.channel_name)
        self.nodes.append(other)
        self.nodes.sort(key=lambda t: _host_order(t.node, t.hostname))
        self.e2e_processing_latency.add(other.e2e_processing_latency)

    def to_json(self) -> JSON:
        return {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "message_count": self.message_count,
            "nodes": [n.to_json() for n in self.nodes],
            "channels": [c.to_json() for c in self.channels],
            "paused": self.paused,
            "e2e_processing_latency": self.e2e_processing_latency.to_json(),
            **(self.policy.to_json() if self.policy is not None else {}),
        }
