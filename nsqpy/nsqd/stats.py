"""nsqd's statistics: what ``/stats`` (JSON and text), statsd and ``/metrics`` report.

:func:`get_stats` snapshots the engine into plain JSON-ready dicts shaped like Go's
``TopicStats`` / ``ChannelStats`` / ``ClientV2Stats`` (same keys, same order, the same
``omitempty`` fields), so the HTTP layer only encodes them (:func:`encode_json`
renders like Go's ``encoding/json``) and statsd only diffs them.

Memory (``/stats`` ``memory`` and statsd ``mem.*``) keeps Go's keys, filled with the
nearest figures CPython can give cheaply (no walk over all objects):

==========================  =================================================================
``heap_objects``            ``sys.getallocatedblocks()``: live pymalloc blocks (≈ small objects)
``heap_idle_bytes``         virtual size - resident size (``/proc/self/statm``): mapped, not in use
``heap_in_use_bytes``       resident set size (``/proc/self/statm``; ``ru_maxrss`` elsewhere)
``heap_released_bytes``     peak RSS (``ru_maxrss``) - current RSS: memory given back since the peak
``gc_pause_usec_100/99/95`` percentiles of the last 256 garbage-collector pauses (µs), timed by a
                            ``gc.callbacks`` hook (see :func:`track_gc_pauses`)
``next_gc_bytes``           objects still to allocate before the next young-generation collection
                            (CPython's GC is triggered by object counts, not bytes)
``gc_total_runs``           collections so far, all generations (``gc.get_stats()``)
==========================  =================================================================
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import resource
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NotRequired, Protocol, TypedDict, cast

from nsqpy import NSQ_VERSION
from nsqpy.common.goflags import format_duration_ns, version_string
from nsqpy.common.gojson import encode_json, go_json_float
from nsqpy.nsqd.e2e import E2EResult, E2EStream, empty_result
from nsqpy.nsqd.policy import PolicyOwner, stats_fields, stats_text
from nsqpy.nsqd.topology import delivery_counts

__all__ = [
    "ChannelStats",
    "ClientStats",
    "MemStats",
    "Stats",
    "StatsClient",
    "TopicStats",
    "encode_json",
    "format_prometheus",
    "format_stats_text",
    "get_stats",
    "mem_stats",
    "track_gc_pauses",
]


# -- the shapes (Go's JSON field names and order) ------------------------------------------


class PubCount(TypedDict):
    topic: str
    count: int


class ClientStats(TypedDict):
    """Go's ``ClientV2Stats``; ``NotRequired`` keys are Go's ``omitempty`` ones."""

    client_id: str
    hostname: str
    version: str
    remote_address: str
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    zone_local_msg_count: NotRequired[int]
    region_local_msg_count: NotRequired[int]
    global_msg_count: NotRequired[int]
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    authed: NotRequired[bool]
    auth_identity: NotRequired[str]
    auth_identity_url: NotRequired[str]
    topology_zone: str
    topology_region: str
    pub_counts: NotRequired[list[PubCount]]
    tls: bool
    tls_cipher_suite: str
    tls_version: str
    tls_negotiated_protocol: str
    tls_negotiated_protocol_is_mutual: bool


class ChannelStats(TypedDict):
    channel_name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    zone_local_msg_count: NotRequired[int]
    region_local_msg_count: NotRequired[int]
    global_msg_count: NotRequired[int]
    requeue_count: int
    timeout_count: int
    client_count: int
    clients: list[ClientStats] | None
    paused: bool
    e2e_processing_latency: E2EResult
    # message policies (policy.py): only where a policy applies or a count is not zero
    dead_letter_count: NotRequired[int]
    expired_count: NotRequired[int]
    overflow_count: NotRequired[int]
    policy: NotRequired[dict[str, Any]]


class TopicStats(TypedDict):
    topic_name: str
    channels: list[ChannelStats]
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    e2e_processing_latency: E2EResult
    dead_letter_sources: NotRequired[list[str]]
    expired_count: NotRequired[int]
    overflow_count: NotRequired[int]
    policy: NotRequired[dict[str, Any]]


class Stats(TypedDict):
    """Go's ``Stats``: ``topics`` is None when ``?topic=`` names a missing topic."""

    topics: list[TopicStats] | None
    producers: list[ClientStats] | None


class MemStats(TypedDict):
    heap_objects: int
    heap_idle_bytes: int
    heap_in_use_bytes: int
    heap_released_bytes: int
    gc_pause_usec_100: int
    gc_pause_usec_99: int
    gc_pause_usec_95: int
    next_gc_bytes: int
    gc_total_runs: int


# -- what is read from the engine -----------------------------------------------------------


class StatsClient(Protocol):
    """What stats read of a TCP connection (``protocol_v2.ClientV2`` has it all).

    TLS, compression, auth and topology fields are read with ``getattr`` so that the
    features that set them (``tls``, ``deflate``, ``snappy``, ``auth_identity``...) need
    no change here; until then they report false/empty, as a Go client without them.
    """

    @property
    def id(self) -> int: ...
    @property
    def client_id(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def user_agent(self) -> str: ...
    @property
    def remote_address(self) -> str: ...
    @property
    def state(self) -> int: ...
    @property
    def ready_count(self) -> int: ...
    @property
    def in_flight(self) -> Mapping[bytes, object]: ...
    @property
    def message_count(self) -> int: ...
    @property
    def finish_count(self) -> int: ...
    @property
    def requeue_count(self) -> int: ...
    @property
    def connect_ts(self) -> int: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def pub_counts(self) -> Mapping[str, int]: ...


class _Channel(PolicyOwner, Protocol):
    name: str
    paused: bool
    message_count: int
    delivery_count: int
    backend_deliveries: int
    requeue_count: int
    timeout_count: int
    e2e: E2EStream | None

    @property
    def depth(self) -> int: ...
    @property
    def backend_depth(self) -> int: ...
    @property
    def in_flight_count(self) -> int: ...
    @property
    def deferred_count(self) -> int: ...
    @property
    def clients(self) -> Sequence[object]: ...


class _Topic(PolicyOwner, Protocol):
    name: str
    paused: bool
    message_count: int
    message_bytes: int

    @property
    def depth(self) -> int: ...
    @property
    def backend_depth(self) -> int: ...
    @property
    def channels(self) -> Mapping[str, Any]: ...


class _Engine(Protocol):
    @property
    def topics(self) -> Mapping[str, Any]: ...


def client_stats(client: StatsClient, topic_filter: str = "") -> ClientStats:
    """Go's ``clientV2.Stats(topicName)``.

    ``pub_counts`` holds one topic at most (Go breaks out of its loop after the
    first entry, spec §11): the filtered topic, or the first one published to.
    """
    pub_counts: list[PubCount] = []
    for topic, count in client.pub_counts.items():
        if topic_filter and topic != topic_filter:
            continue
        pub_counts.append({"topic": topic, "count": count})
        break
    stats: dict[str, Any] = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": "V2",
        "remote_address": client.remote_address,
        "state": client.state,
        "ready_count": client.ready_count,
        "in_flight_count": len(client.in_flight),
        "message_count": client.message_count,
    }
    # (Go master's ClientStats declares zone/region/global counts but never fills them, so
    # omitempty leaves them out: the channel's counters are the only ones, topology.py.)
    stats["finish_count"] = client.finish_count
    stats["requeue_count"] = client.requeue_count
    stats["connect_ts"] = client.connect_ts
    stats["sample_rate"] = client.sample_rate
    stats["deflate"] = bool(getattr(client, "deflate", False))
    stats["snappy"] = bool(getattr(client, "snappy", False))
    stats["user_agent"] = client.user_agent
    if getattr(client, "authed", False):
        stats["authed"] = True
    for key in ("auth_identity", "auth_identity_url"):
        value = str(getattr(client, key, "") or "")
        if value:
            stats[key] = value
    stats["topology_zone"] = str(getattr(client, "topology_zone", "") or "")
    stats["topology_region"] = str(getattr(client, "topology_region", "") or "")
    if pub_counts:
        stats["pub_counts"] = pub_counts
    stats["tls"] = bool(getattr(client, "tls", False))
    for key in ("tls_cipher_suite", "tls_version", "tls_negotiated_protocol"):
        stats[key] = str(getattr(client, key, "") or "")
    stats["tls_negotiated_protocol_is_mutual"] = bool(
        getattr(client, "tls_negotiated_protocol_is_mutual", False)
    )
    return cast(ClientStats, stats)


def channel_stats(channel: _Channel, clients: list[ClientStats] | None) -> ChannelStats:
    """Go's ``NewChannelStats``."""
    stats: dict[str, Any] = {
        "channel_name": channel.name,
        "depth": channel.depth,
        "backend_depth": channel.backend_depth,
        "in_flight_count": channel.in_flight_count,
        "deferred_count": channel.deferred_count,
        "message_count": channel.message_count,
    }
    _put_locality_counts(
        stats,
        delivery_counts(
            getattr(channel, "topology", None),
            channel.delivery_count - channel.backend_deliveries,
        ),
    )
    stats["requeue_count"] = channel.requeue_count
    stats["timeout_count"] = channel.timeout_count
    stats["client_count"] = len(channel.clients)
    stats["clients"] = clients
    stats["paused"] = channel.paused
    stats["e2e_processing_latency"] = (
        channel.e2e.result() if channel.e2e is not None else empty_result()
    )
    stats.update(stats_fields(channel, channel=True))
    return cast(ChannelStats, stats)


def _put_locality_counts(stats: dict[str, Any], counts: tuple[int, int, int]) -> None:
    for key, count in zip(_LOCALITY_KEYS, counts, strict=True):
        if count:
            stats[key] = count


_LOCALITY_KEYS = ("zone_local_msg_count", "region_local_msg_count", "global_msg_count")


def topic_stats(topic: _Topic, channels: list[ChannelStats], streams: Iterable[Any]) -> TopicStats:
    """Go's ``NewTopicStats``; ``streams`` are the channels' e2e streams to aggregate."""
    aggregate = E2EStream.aggregate(streams)
    stats: TopicStats = {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth,
        "backend_depth": topic.backend_depth,
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": aggregate.result() if aggregate is not None else empty_result(),
    }
    stats.update(stats_fields(topic, channel=False))  # type: ignore[typeddict-item]
    return stats


def get_stats(
    nsqd: _Engine,
    connections: Iterable[StatsClient] = (),
    topic: str = "",
    channel: str = "",
    include_clients: bool = True,
) -> Stats:
    """Go's ``NSQD.GetStats(topic, channel, includeClients)``.

    Topics sorted by name, channels by name. A ``topic`` filter naming a missing
    topic gives ``topics`` None (and no producers, as Go returns early); a ``channel``
    filter skips the topics without that channel. Producers are the ``connections``
    that published at least once, only gathered with ``include_clients``.
    """
    if topic:
        found = nsqd.topics.get(topic)
        if found is None:
            return {"topics": None, "producers": None}
        topics = [found]
    else:
        topics = sorted(nsqd.topics.values(), key=lambda t: str(t.name))
    result: list[TopicStats] = []
    for t in topics:
        if channel:
            c = t.channels.get(channel)
            if c is None:
                continue
            channels = [c]
        else:
            channels = sorted(t.channels.values(), key=lambda c: str(c.name))
        channel_list: list[ChannelStats] = []
        for c in channels:
            clients: list[ClientStats] | None = None
            if include_clients:
                clients = [client_stats(cast(StatsClient, cl), topic) for cl in c.clients]
            channel_list.append(channel_stats(c, clients))
        result.append(topic_stats(t, channel_list, (c.e2e for c in t.channels.values())))
    producers: list[ClientStats] | None = None
    if include_clients:
        producers = [
            client_stats(conn, topic)
            for conn in sorted(connections, key=lambda conn: conn.id)
            if conn.pub_counts
        ] or None
    return {"topics": result, "producers": producers}


# -- memory ----------------------------------------------------------------------------------

_GC_PAUSES: deque[int] = deque(maxlen=256)  # ns, like Go's MemStats.PauseNs ring
_gc_started = 0


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter_ns()
    elif _gc_started:
        _GC_PAUSES.append(time.perf_counter_ns() - _gc_started)
        _gc_started = 0


def track_gc_pauses() -> None:
    """Start timing garbage collections (idempotent); pauses feed ``gc_pause_usec_*``."""
    if _gc_callback not in gc.callbacks:
        gc.callbacks.append(_gc_callback)


def _percentile(perc: float, values: Sequence[int]) -> int:
    # statsd.go's percentile(): nearest rank on the sorted pauses.
    if not values:
        return 0
    index = math.floor((perc / 100.0) * len(values) + 0.5)
    return values[min(index, len(values) - 1)]


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _statm() -> tuple[int, int] | None:
    """(virtual, resident) bytes of this process, or None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return int(fields[0]) * _PAGE_SIZE, int(fields[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


def _max_rss() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def mem_stats() -> MemStats:
    """The ``memory`` section (see the module docstring for what each figure means)."""
    peak = _max_rss()
    statm = _statm()
    virtual, resident = statm if statm is not None else (peak, peak)
    pauses = sorted(_GC_PAUSES)
    young_count = gc.get_count()[0]
    threshold = gc.get_threshold()[0]
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": max(virtual - resident, 0),
        "heap_in_use_bytes": resident,
        "heap_released_bytes": max(peak - resident, 0),
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": max(threshold - young_count, 0),
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }


# -- /stats text format (Go's printStats) ---------------------------------------------------


def _human_ns(value: float) -> str:
    # stringy.NanoSecondToHuman
    if value > 1_000_000_000:
        return f"{value / 1_000_000_000:.1f}s"
    if value > 1_000_000:
        return f"{value / 1_000_000:.1f}ms"
    if value > 1000:
        return f"{value / 1000:.1f}us"
    return f"{float(value):.1f}ns"


def _e2e_text(result: E2EResult) -> str:
    return ", ".join(_human_ns(p["value"]) for p in result["percentiles"] or ())


def _rfc3339(unix: float) -> str:
    moment = datetime.datetime.fromtimestamp(int(unix)).astimezone()
    text = moment.isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def client_line(client: ClientStats, now: float) -> str:
    """Go's ``ClientV2Stats.String()``: a producer's or a consumer's one-line summary."""
    connected = format_duration_ns(int(now - client["connect_ts"]) * 1_000_000_000)
    _, sep, port = client["remote_address"].rpartition(":")
    ident = f"{client['hostname']}:{port if sep else ''} {client['user_agent']}"
    pub_counts = client.get("pub_counts")
    if pub_counts:
        total = sum(p["count"] for p in pub_counts)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pub_counts)
        return (
            f"[{client['version']} {ident:<21}] msgs: {total:<8} topics: {topics}"
            f" connected: {connected}"
        )
    return (
        f"[{client['version']} {ident:<21}] state: {client['state']}"
        f" inflt: {client['in_flight_count']:<4} rdy: {client['ready_count']:<4}"
        f" fin: {client['finish_count']:<8} re-q: {client['requeue_count']:<8}"
        f" msgs: {client['message_count']:<8} connected: {connected}"
    )


_MEM_KEYS = (
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
)


def format_stats_text(
    stats: Stats, mem: MemStats | None, health: str, start_time: float, now: float
) -> str:
    """``/stats`` without ``format=json``, byte for byte as Go's ``printStats``."""
    out: list[str] = [
        f"{version_string('nsqd')}\n",
        f"start_time {_rfc3339(start_time)}\n",
        f"uptime {format_duration_ns(int((now - start_time) * 1e9))}\n",
        f"\nHealth: {health}\n",
    ]
    if mem is not None:
        out.append("\nMemory:\n")
        out.extend(f"   {key:<25}\t{mem[key]}\n" for key in _MEM_KEYS)  # type: ignore[literal-required]
    topics = stats["topics"] or []
    out.append("\nTopics: None\n" if not topics else "\nTopics:")
    for t in topics:
        prefix = "*P " if t["paused"] else "   "
        out.append(
            f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5}"
            f" be-depth: {t['backend_depth']:<5} msgs: {t['message_count']:<8}"
            f" e2e%: {_e2e_text(t['e2e_processing_latency'])}\n"
        )
        if policy_line := stats_text(t):
            out.append(f"      {policy_line}\n")
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            out.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5}"
                f" be-depth: {c['backend_depth']:<5} inflt: {c['in_flight_count']:<4}"
                f" def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5}"
                f" timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8}"
                f" e2e%: {_e2e_text(c['e2e_processing_latency'])}\n"
            )
            if policy_line := stats_text(c):
                out.append(f"          {policy_line}\n")
            out.extend(f"        {client_line(cl, now)}\n" for cl in c["clients"] or ())
    producers = stats["producers"] or []
    if not producers:
        out.append("\nProducers: None\n")
    else:
        out.append("\nProducers:\n")
        out.extend(f"   {client_line(p, now)}\n" for p in producers)
    return "".join(out)


# -- Prometheus text exposition format 0.0.4 ------------------------------------------------

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _prom_number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class _Family:
    __slots__ = ("help", "kind", "name", "samples")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples: list[str] = []

    def add(self, value: float, **labels: str) -> None:
        if labels:
            text = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
            self.samples.append(f"{self.name}{{{text}}} {_prom_number(value)}")
        else:
            self.samples.append(f"{self.name} {_prom_number(value)}")

    def render(self) -> str:
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        head = f"# HELP {self.name} {help_text}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(s + "\n" for s in self.samples)


def _process_start_time() -> float | None:
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def format_prometheus(
    stats: Stats,
    *,
    health_ok: bool,
    start_time: float,
    connections: int,
) -> str:
    """``/metrics``: per-topic, per-channel and process metrics, conventional names."""
    fam: dict[str, _Family] = {}

    def family(name: str, kind: str, help_text: str) -> _Family:
        f = fam.get(name)
        if f is None:
            f = fam[name] = _Family(name, kind, help_text)
        return f

    family("nsq_info", "gauge", "nsqd build information.").add(1, version=NSQ_VERSION)
    family("nsq_healthy", "gauge", "1 when nsqd is healthy (no standing disk write error).").add(
        1 if health_ok else 0
    )
    family("nsq_start_time_seconds", "gauge", "When nsqd started, in unix seconds.").add(start_time)
    family("nsq_connections", "gauge", "Open TCP protocol connections.").add(connections)
    family("nsq_producers", "gauge", "TCP connections that have published.").add(
        len(stats["producers"] or ())
    )
    topic_families = (
        (
            "nsq_topic_messages_total",
            "counter",
            "Messages published to the topic.",
            "message_count",
        ),
        (
            "nsq_topic_message_bytes_total",
            "counter",
            "Bytes of message bodies published to the topic.",
            "message_bytes",
        ),
        ("nsq_topic_depth", "gauge", "Messages queued in the topic (memory and disk).", "depth"),
        (
            "nsq_topic_backend_depth",
            "gauge",
            "Messages queued in the topic's disk queue.",
            "backend_depth",
        ),
        ("nsq_topic_paused", "gauge", "1 when the topic is paused.", "paused"),
    )
    channel_families = (
        (
            "nsq_channel_messages_total",
            "counter",
            "Messages put into the channel.",
            "message_count",
        ),
        (
            "nsq_channel_depth",
            "gauge",
            "Messages queued in the channel (memory and disk).",
            "depth",
        ),
        (
            "nsq_channel_backend_depth",
            "gauge",
            "Messages queued in the channel's disk queue.",
            "backend_depth",
        ),
        (
            "nsq_channel_in_flight",
            "gauge",
            "Messages delivered and not yet finished.",
            "in_flight_count",
        ),
        (
            "nsq_channel_deferred",
            "gauge",
            "Deferred messages waiting for their time.",
            "deferred_count",
        ),
        (
            "nsq_channel_requeued_total",
            "counter",
            "Messages requeued by consumers.",
            "requeue_count",
        ),
        (
            "nsq_channel_timed_out_total",
            "counter",
            "In-flight messages that timed out.",
            "timeout_count",
        ),
        ("nsq_channel_clients", "gauge", "Consumers subscribed to the channel.", "client_count"),
        ("nsq_channel_paused", "gauge", "1 when the channel is paused.", "paused"),
    )
    for name, kind, help_text, _ in topic_families:
        family(name, kind, help_text)
    family("nsq_topic_channels", "gauge", "Channels of the topic.")
    for name, kind, help_text, _ in channel_families:
        family(name, kind, help_text)
    e2e_topic = family(
        "nsq_topic_e2e_processing_latency_seconds",
        "gauge",
        "End-to-end processing latency quantiles over the window (all channels).",
    )
    e2e_channel = family(
        "nsq_channel_e2e_processing_latency_seconds",
        "gauge",
        "End-to-end processing latency quantiles over the window.",
    )
    for t in stats["topics"] or ():
        tname = t["topic_name"]
        for name, _, _, key in topic_families:
            fam[name].add(t[key], topic=tname)  # type: ignore[literal-required]
        fam["nsq_topic_channels"].add(len(t["channels"]), topic=tname)
        for p in t["e2e_processing_latency"]["percentiles"] or ():
            e2e_topic.add(p["value"] / 1e9, topic=tname, quantile=go_json_float(p["quantile"]))
        for c in t["channels"]:
            cname = c["channel_name"]
            for name, _, _, key in channel_families:
                fam[name].add(c[key], topic=tname, channel=cname)  # type: ignore[literal-required]
            for p in c["e2e_processing_latency"]["percentiles"] or ():
                e2e_channel.add(
                    p["value"] / 1e9,
                    topic=tname,
                    channel=cname,
                    quantile=go_json_float(p["quantile"]),
                )
    _locality_families(family, stats)
    _policy_families(stats, family)
    _process_families(family)
    return "".join(f.render() for f in fam.values())


def _locality_families(family: Any, stats: Stats) -> None:
    # topology.py's per-channel delivery counters; like the JSON, only the non-zero ones.
    helps = (
        "Deliveries to zone-local consumers (topology-aware consumption).",
        "Deliveries to region-local consumers (topology-aware consumption).",
        "Deliveries to other consumers (all of them without topology-aware consumption).",
    )
    names = (
        "nsq_channel_zone_local_messages_total",
        "nsq_channel_region_local_messages_total",
        "nsq_channel_global_messages_total",
    )
    for name, key, help_text in zip(names, _LOCALITY_KEYS, helps, strict=True):
        fam = family(name, "counter", help_text)
        for t in stats["topics"] or ():
            for c in t["channels"]:
                count = c.get(key, 0)
                if count:
                    fam.add(count, topic=t["topic_name"], channel=c["channel_name"])


_POLICY_COUNTERS = (
    ("dead_letter_count", "dead_lettered", "Messages dead-lettered after max_attempts deliveries."),
    ("expired_count", "expired", "Messages dead-lettered because they outlived message_ttl."),
    ("overflow_count", "overflowed", "Oldest messages dead-lettered beyond max_depth."),
)


def _policy_families(stats: Stats, family: Any) -> None:
    """Policy counters (policy.py), only for the topics and channels that show them."""
    for t in stats["topics"] or ():
        tname = t["topic_name"]
        for key, name, help_text in _POLICY_COUNTERS:
            if key in t:
                family(f"nsq_topic_{name}_total", "counter", help_text).add(
                    t[key],  # type: ignore[literal-required]
                    topic=tname,
                )
        for c in t["channels"]:
            for key, name, help_text in _POLICY_COUNTERS:
                if key in c:
                    family(f"nsq_channel_{name}_total", "counter", help_text).add(
                        c[key],  # type: ignore[literal-required]
                        topic=tname,
                        channel=c["channel_name"],
                    )


def _process_families(family: Any) -> None:
    times = os.times()
    family(
        "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."
    ).add(times.user + times.system)
    statm = _statm()
    if statm is not None:
        family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.").add(
            statm[0]
        )
        family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.").add(
            statm[1]
        )
    else:
        family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.").add(
            _max_rss()
        )
    started = _process_start_time()
    if started is not None:
        family(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
        ).add(started)
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = -1
    if open_fds >= 0:
        family("process_open_fds", "gauge", "Number of open file descriptors.").add(open_fds)
    family("process_max_fds", "gauge", "Maximum number of open file descriptors.").add(
        resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    )
    collections = family(
        "python_gc_collections_total", "counter", "Number of times this generation was collected."
    )
    collected = family(
        "python_gc_objects_collected_total", "counter", "Objects collected during gc."
    )
    for generation, s in enumerate(gc.get_stats()):
        collections.add(s["collections"], generation=str(generation))
        collected.add(s["collected"], generation=str(generation))
