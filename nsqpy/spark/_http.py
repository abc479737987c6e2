"""The HTTP calls the connector makes, blocking and stdlib-only: nsqlookupd ``/lookup``,
``/topics`` and ``/nodes`` (spec §4.3) for discovery, nsqd ``/stats`` (spec §3.2) for what a
channel holds and will receive (and which topics an nsqd has), and ``/channel/create`` so that
a new query's channel starts retaining messages at once.

These run in the driver-side planner processes and, for the sink's discovery, in write tasks.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

__all__ = [
    "Backlog",
    "HTTPError",
    "Producer",
    "channel_backlogs",
    "lookup_producers",
    "lookup_topics",
    "lookupd_nodes",
    "nsqd_topics",
]

log = logging.getLogger("nsqpy.spark")

ACCEPT: Final = "application/vnd.nsq; version=1.0"


class HTTPError(Exception):
    """An nsqd or nsqlookupd HTTP request failed (connection, status or JSON)."""


@dataclass(frozen=True, order=True)
class Producer:
    """One nsqd: the TCP address the connector connects to, and its HTTP address if known."""

    tcp_address: str
    http_address: str | None


def _url(address: str, path: str, params: dict[str, str]) -> str:
    base = address if "://" in address else "http://" + address
    query = urlencode(params)
    return f"{base.rstrip('/')}{path}" + (f"?{query}" if query else "")


def _request(url: str, timeout: float, *, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), bytes(err.read() or b"")
    except (OSError, ValueError) as err:
        raise HTTPError(f"{method} {url}: {err}") from err


def get_json(url: str, timeout: float, *, not_found_ok: bool = False) -> dict[str, Any] | None:
    """GET NSQ JSON, unwrapping the pre-1.0 ``{"status_code", "data"}`` envelope."""
    status, body = _request(url, timeout)
    if status == 404 and not_found_ok:
        return None
    if status != 200:
        raise HTTPError(f"GET {url}: HTTP {status} {body[:200]!r}")
    try:
        data = json.loads(body)
    except ValueError:
        raise HTTPError(f"GET {url}: invalid JSON {body[:200]!r}") from None
    if not isinstance(data, dict):
        raise HTTPError(f"GET {url}: unexpected JSON {body[:200]!r}")
    if "status_code" in data and isinstance(data.get("data"), dict):
        data = data["data"]
    return dict(data)


def _peer(peer: dict[str, Any]) -> Producer:
    host = str(peer["broadcast_address"])
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return Producer(f"{host}:{int(peer['tcp_port'])}", f"{host}:{int(peer['http_port'])}")


def _from_lookupds(
    lookupds: tuple[str, ...], path: str, params: dict[str, str], timeout: float
) -> list[Producer]:
    """The union of the producers every reachable lookupd reports; an error if none answers."""
    found: set[Producer] = set()
    errors: list[str] = []
    for address in lookupds:
        try:
            data = get_json(_url(address, path, params), timeout, not_found_ok=True)
        except HTTPError as err:
            errors.append(str(err))
            continue
        for peer in (data or {}).get("producers") or []:
            found.add(_peer(peer))
    if errors and len(errors) == len(lookupds):
        raise HTTPError("no nsqlookupd answered: " + "; ".join(errors))
    for message in errors:
        log.warning("nsqlookupd query failed: %s", message)
    return sorted(found)


def lookup_producers(lookupds: tuple[str, ...], topic: str, timeout: float) -> list[Producer]:
    """The nsqd producing ``topic`` (``/lookup?topic=``), sorted; an unknown topic has none."""
    return _from_lookupds(lookupds, "/lookup", {"topic": topic}, timeout)


def lookup_topics(lookupds: tuple[str, ...], timeout: float) -> list[str]:
    """Every topic the lookupds know (``/topics``), sorted; an error if none answers."""
    found: set[str] = set()
    errors: list[str] = []
    for address in lookupds:
        try:
            data = get_json(_url(address, "/topics", {}), timeout) or {}
        except HTTPError as err:
            errors.append(str(err))
            continue
        found.update(str(t) for t in data.get("topics") or [])
    if errors and len(errors) == len(lookupds):
        raise HTTPError("no nsqlookupd answered: " + "; ".join(errors))
    return sorted(found)


def nsqd_topics(http_address: str, timeout: float) -> list[str]:
    """The topics one nsqd has (its ``/stats``), sorted."""
    params = {"format": "json", "include_clients": "false", "include_mem": "false"}
    data = get_json(_url(http_address, "/stats", params), timeout) or {}
    return sorted(str(t.get("topic_name")) for t in data.get("topics") or [])


def lookupd_nodes(lookupds: tuple[str, ...], timeout: float) -> list[Producer]:
    """Every nsqd registered with the lookupds (``/nodes``), sorted: where to publish."""
    return _from_lookupds(lookupds, "/nodes", {}, timeout)


@dataclass(frozen=True)
class Backlog:
    """What one nsqd holds for a channel, from ``/stats``.

    ``ready`` is the channel's depth (memory + disk): a consumer gets these now. ``incoming`` is
    the topic's own depth, which nsqd moves into every channel of the topic over time: all of
    it while the topic has no channel (a new query's channel then gets the whole backlog), and
    whatever the topic's pump has not moved yet (nsqd moves it in steps, Go's messagePump one
    message at a time). ``in_flight`` (delivered, neither FIN'd nor timed out: a dead consumer's
    messages come back after ``msg_timeout``) and ``deferred`` are not ready either.
    A paused topic moves nothing and a paused channel delivers nothing: they count as 0.
    """

    ready: int
    incoming: int = 0
    in_flight: int = 0
    deferred: int = 0

    @property
    def available(self) -> int:
        """What a read task can get now or while it reads: ready + incoming."""
        return self.ready + self.incoming

    @property
    def in_transit(self) -> int:
        """What the channel will get back later (in flight, deferred)."""
        return self.in_flight + self.deferred

    @property
    def total(self) -> int:
        return self.available + self.in_transit


def _find_topic(data: dict[str, Any], topic: str) -> dict[str, Any] | None:
    for t in data.get("topics") or []:
        if t.get("topic_name") == topic:
            return dict(t)
    return None


def _find_channel(topic_stats: dict[str, Any] | None, channel: str) -> dict[str, Any] | None:
    for c in (topic_stats or {}).get("channels") or []:
        if c.get("channel_name") == channel:
            return dict(c)
    return None


def _backlog(topic_stats: dict[str, Any], channel_stats: dict[str, Any]) -> Backlog:
    if channel_stats.get("paused"):
        return Backlog(0)
    incoming = 0 if topic_stats.get("paused") else int(topic_stats.get("depth") or 0)
    return Backlog(
        ready=int(channel_stats.get("depth") or 0),
        incoming=incoming,
        in_flight=int(channel_stats.get("in_flight_count") or 0),
        deferred=int(channel_stats.get("deferred_count") or 0),
    )


def _stats_channel(http_address: str, topics: list[str], channel: str, timeout: float) -> Any:
    """``/stats`` of ``channel`` (and of the one topic, if only one is asked for)."""
    params = {
        "format": "json",
        "channel": channel,
        "include_clients": "false",
        "include_mem": "false",
    }
    if len(topics) == 1:
        params["topic"] = topics[0]
    return get_json(_url(http_address, "/stats", params), timeout) or {}


def _create_channel(http_address: str, topic: str, channel: str, timeout: float) -> None:
    # /channel/create needs the topic to exist (404 TOPIC_NOT_FOUND otherwise).
    for path, args in (
        ("/topic/create", {"topic": topic}),
        ("/channel/create", {"topic": topic, "channel": channel}),
    ):
        url = _url(http_address, path, args)
        status, body = _request(url, timeout, method="POST")
        if status != 200:
            raise HTTPError(f"POST {url}: HTTP {status} {body[:200]!r}")


def channel_backlogs(
    http_address: str, topics: list[str], channel: str, timeout: float
) -> dict[str, Backlog]:
    """What ``channel`` holds and will receive on one nsqd, per topic (see :class:`Backlog`):
    one ``/stats`` request for all of them.

    A missing channel (or topic) is created (``POST /topic/create``, then
    ``/channel/create``), as a consumer's SUB would: from then on nsqd keeps every new message
    for it, and a topic that had no channel at all moves its backlog into it (counted as
    ``incoming``).
    """
    data = _stats_channel(http_address, topics, channel, timeout)
    missing = [t for t in topics if _find_channel(_find_topic(data, t), channel) is None]
    if missing:
        for topic in missing:
            _create_channel(http_address, topic, channel, timeout)
        data = _stats_channel(http_address, topics, channel, timeout)
    backlogs: dict[str, Backlog] = {}
    for topic in topics:
        topic_stats = _find_topic(data, topic)
        channel_stats = _find_channel(topic_stats, channel)
        if topic_stats is None or channel_stats is None:
            backlogs[topic] = Backlog(0)
        else:
            backlogs[topic] = _backlog(topic_stats, channel_stats)
    return backlogs
