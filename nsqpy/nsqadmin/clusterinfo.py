"""What nsqadmin asks the cluster, and the admin actions it fans out (Go's
``internal/clusterinfo/data.go`` and ``internal/http_api/api_request.go``).

Every question goes to all the relevant upstreams (nsqlookupd or nsqd HTTP APIs) at once,
each request with its own connect and total timeouts.  The outcome follows Go:

* every upstream failed → :class:`UpstreamError` (nsqadmin answers ``502 UPSTREAM_ERROR: ...``);
* some failed → the answer from the others plus the list of error strings (nsqadmin answers
  200 with ``"message": "WARNING: ..."``);
* none failed → the answer and an empty list.

Unlike Go, asking zero upstreams (a topic no nsqd produces) is not a failure: it is an
empty answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import aiohttp

from nsqpy.common.goflags import go_quote
from nsqpy.common.log import Logger
from nsqpy.nsqadmin.stats import ChannelStats, Producer, ProducerTopic, TopicStats, version_key

__all__ = [
    "ClusterInfo",
    "HTTPClient",
    "NodeStats",
    "RequestError",
    "UpstreamError",
    "aggregate_channels",
]

T = TypeVar("T")
R = TypeVar("R")

_ACCEPT_V1 = "application/vnd.nsq; version=1.0"
_V1_CONTENT_TYPE = "nsq; version=1.0"


class RequestError(Exception):
    """One upstream request failed; the text reads like Go's http client errors."""


class UpstreamError(Exception):
    """Every upstream asked failed (``Failed to query any nsqd: ...``)."""


def _q(value: str) -> str:
    return quote(value, safe="")


# --------------------------------------------------------------------------- HTTP client


class HTTPClient:
    """nsqadmin's outbound HTTP client: NSQ's V1 content negotiation over aiohttp.

    ``GET`` and ``POST`` send ``Accept: application/vnd.nsq; version=1.0``; a reply
    marked ``X-NSQ-Content-Type: nsq; version=1.0`` is plain JSON, any other is unwrapped
    from the legacy ``{"status_code", "status_txt", "data"}`` envelope.  A ``403`` carrying
    an ``https_port`` (an nsqd with ``--tls-required``) is retried once over HTTPS.
    """

    def __init__(
        self,
        connect_timeout: float,
        request_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ssl_context = ssl_context
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
                headers={"User-Agent": "nsqadmin/nsqpy"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ssl(self, url: str) -> ssl.SSLContext | bool:
        # True: aiohttp's default verification; the context when --http-client-tls-* given.
        if url.startswith("https:") and self.ssl_context is not None:
            return self.ssl_context
        return True

    def timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=self.request_timeout or None, sock_connect=self.connect_timeout or None
        )

    async def _request(self, method: str, endpoint: str, body: bytes | None = None) -> Any:
        url = endpoint
        for _ in range(2):
            try:
                async with self.session.request(
                    method,
                    url,
                    data=body,
                    headers={"Accept": _ACCEPT_V1},
                    timeout=self.timeout(),
                    ssl=self._ssl(url),
                ) as resp:
                    raw = await resp.read()
                    if resp.status == 403 and url.startswith("http:"):
                        retry = _https_endpoint(url, raw)
                        if retry is not None:
                            url = retry
                            continue
                    if resp.status != 200:
                        status = f"{resp.status} {resp.reason or ''}".rstrip()
                        text = raw.decode("utf-8", "replace")
                        raise RequestError(f"got response {status} {go_quote(text)}")
                    v1 = resp.headers.get("X-NSQ-Content-Type") == _V1_CONTENT_TYPE
            except RequestError:
                raise
            except TimeoutError:
                raise RequestError(
                    f'{method.title()} "{url}": context deadline exceeded '
                    "(Client.Timeout exceeded while awaiting headers)"
                ) from None
            except aiohttp.ClientConnectorError as err:
                code = err.os_error.errno
                reason = (os.strerror(code) if code else str(err.os_error)).lower()
                raise RequestError(
                    f'{method.title()} "{url}": dial tcp {err.host}:{err.port}: connect: {reason}'
                ) from None
            except (aiohttp.ClientError, OSError, ValueError) as err:
                raise RequestError(
                    f'{method.title()} "{url}": {err or type(err).__name__}'
                ) from None
            return _decode(raw, v1, url)
        raise RequestError(f'{method.title()} "{url}": too many TLS_REQUIRED redirects')

    async def get_v1(self, endpoint: str) -> Any:
        """GET an NSQ V1 endpoint and decode its JSON (Go's ``GETV1`` / ``NegotiateV1``)."""
        return await self._request("GET", endpoint)

    async def post_v1(self, endpoint: str) -> None:
        """POST to an NSQ V1 endpoint with an empty body (Go's ``POSTV1``)."""
        await self._request("POST", endpoint)

    async def send_v1(self, method: str, endpoint: str, body: bytes | None = None) -> None:
        """Any other method to an NSQ V1 endpoint (message policies: POST a body, DELETE)."""
        await self._request(method, endpoint, body)

    async def post_json(self, endpoint: str, payload: bytes) -> int:
        """POST a JSON document (notifications); returns the status code."""
        async with self.session.post(
            endpoint,
            data=payload,
            headers={"Content-Type": "application/json"},
            timeout=self.timeout(),
            ssl=self._ssl(endpoint),
        ) as resp:
            await resp.read()
            return resp.status


def _https_endpoint(url: str, body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("https_port"), int):
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"https://{host}:{doc['https_port']}{rest}"


def _decode(raw: bytes, v1: bool, url: str) -> Any:
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise RequestError(f"failed to decode JSON from {url} - {err}") from None
    if v1:
        return doc
    if isinstance(doc, dict) and "status_code" in doc and "data" in doc:
        return doc["data"]
    return doc


# --------------------------------------------------------------------------- cluster queries


@dataclass
class NodeStats:
    """One nsqd's ``/stats`` as nsqadmin uses it."""

    producer: Producer
    topics: list[TopicStats]
    memory: dict[str, Any] | None


Errors = list[str]


class ClusterInfo:
    """Queries and actions over a set of nsqlookupd or nsqd HTTP addresses."""

    def __init__(self, client: HTTPClient, logger: Logger) -> None:
        self.client = client
        self.log = logger

    # -- fan-out helper --------------------------------------------------------------------

    async def _each(
        self, what: str, items: Sequence[T], fn: Callable[[T], Awaitable[R]]
    ) -> tuple[list[tuple[T, R]], Errors]:
        """Run ``fn`` for every item concurrently; all failed → :class:`UpstreamError`."""
        if not items:
            return [], []
        results = await asyncio.gather(*(fn(item) for item in items), return_exceptions=True)
        ok: list[tuple[T, R]] = []
        errors: Errors = []
        for item, result in zip(items, results, strict=True):
            if isinstance(result, RequestError):
                errors.append(str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                ok.append((item, result))
        if len(errors) == len(items):
            raise UpstreamError(f"Failed to query any {what}: " + "\n".join(errors))
        return ok, errors

    async def _get(self, kind: str, endpoint: str) -> Any:
        self.log.debug(f"CI: querying {kind} {endpoint}")
        return await self.client.get_v1(endpoint)

    async def _post_all(
        self,
        kind: str,
        endpoints: Iterable[str],
        *,
        method: str = "POST",
        body: bytes | None = None,
    ) -> Errors:
        """POST (or ``method``) to every endpoint concurrently; failures (even all) are
        returned as errors."""

        async def post(endpoint: str) -> None:
            self.log.debug(f"CI: querying {kind} {endpoint}")
            if method == "POST" and body is None:
                await self.client.post_v1(endpoint)
            else:
                await self.client.send_v1(method, endpoint, body)

        targets = list(dict.fromkeys(endpoints))
        results = await asyncio.gather(*(post(e) for e in targets), return_exceptions=True)
        errors: Errors = []
        for result in results:
            if isinstance(result, RequestError):
                errors.append(str(result))
            elif isinstance(result, BaseException):
                raise result
        return errors

    # -- nsqlookupd ------------------------------------------------------------------------

    async def get_lookupd_topics(self, lookupds: Sequence[str]) -> tuple[list[str], Errors]:
        """The union of every lookupd's ``/topics``, sorted."""

        async def one(addr: str) -> list[str]:
            doc = await self._get("nsqlookupd", f"http://{addr}/topics")
            return _str_list(doc, "topics")

        ok, errors = await self._each("nsqlookupd", lookupds, one)
        return sorted({t for _, topics in ok for t in topics}), errors

    async def get_lookupd_topic_channels(
        self, topic: str, lookupds: Sequence[str]
    ) -> tuple[list[str], Errors]:
        """The union of every lookupd's ``/channels?topic=``, sorted."""

        async def one(addr: str) -> list[str]:
            doc = await self._get("nsqlookupd", f"http://{addr}/channels?topic={_q(topic)}")
            return _str_list(doc, "channels")

        ok, errors = await self._each("nsqlookupd", lookupds, one)
        return sorted({c for _, channels in ok for c in channels}), errors

    async def get_lookupd_producers(self, lookupds: Sequence[str]) -> tuple[list[Producer], Errors]:
        """Every nsqd registered with any lookupd (``/nodes``), merged by TCP address."""

        async def one(addr: str) -> list[Producer]:
            doc = await self._get("nsqlookupd", f"http://{addr}/nodes")
            return [Producer.from_lookupd(p) for p in _dict_list(doc, "producers")]

        ok, errors = await self._each("nsqlookupd", lookupds, one)
        by_addr: dict[str, Producer] = {}
        for addr, producers in ok:
            for producer in producers:
                merged = by_addr.setdefault(producer.tcp_address, producer)
                merged.remote_addresses.append(f"{addr}/{producer.address}")
        producers = list(by_addr.values())
        if producers:
            newest = max(version_key(p.version) for p in producers)
            for producer in producers:
                producer.out_of_date = version_key(producer.version) < newest
        producers.sort(key=lambda p: (p.hostname, p.http_address))
        return producers, errors

    async def get_lookupd_topic_producers(
        self, topic: str, lookupds: Sequence[str]
    ) -> tuple[list[Producer], Errors]:
        """The nsqd producing ``topic`` according to any lookupd (``/lookup``)."""

        async def one(addr: str) -> list[Producer]:
            doc = await self._get("nsqlookupd", f"http://{addr}/lookup?topic={_q(topic)}")
            return [Producer.from_lookupd(p) for p in _dict_list(doc, "producers")]

        ok, errors = await self._each("nsqlookupd", lookupds, one)
        seen: dict[str, Producer] = {}
        for _, producers in ok:
            for producer in producers:
                seen.setdefault(producer.http_address, producer)
        return sorted(seen.values(), key=lambda p: (p.hostname, p.http_address)), errors

    # -- nsqd ------------------------------------------------------------------------------

    async def _nsqd_info(self, addr: str) -> Producer:
        info = await self._get("nsqd", f"http://{addr}/info")
        doc: dict[str, Any] = info if isinstance(info, dict) else {}
        producer = Producer.from_lookupd(
            {
                k: doc.get(k)
                for k in (
                    "version",
                    "broadcast_address",
                    "hostname",
                    "http_port",
                    "tcp_port",
                    "topology_zone",
                    "topology_region",
                )
            }
        )
        if not producer.broadcast_address:
            # Old nsqd without broadcast_address: address it the way it was given.
            host, _, port = addr.rpartition(":")
            producer.broadcast_address = host
            producer.http_port = int(port) if port.isdigit() else 0
        if not producer.hostname:
            producer.hostname = addr.rpartition(":")[0]
        return producer

    async def _nsqd_topic_names(self, addr: str) -> list[str]:
        doc = await self._get(
            "nsqd", f"http://{addr}/stats?format=json&include_clients=false&include_mem=false"
        )
        return [t for t in (_str(d, "topic_name") for d in _dict_list(doc, "topics")) if t]

    async def get_nsqd_topics(self, nsqds: Sequence[str]) -> tuple[list[str], Errors]:
        """Every topic of the given nsqd, sorted."""
        ok, errors = await self._each("nsqd", nsqds, self._nsqd_topic_names)
        return sorted({t for _, topics in ok for t in topics}), errors

    async def get_nsqd_producers(self, nsqds: Sequence[str]) -> tuple[list[Producer], Errors]:
        """The given nsqd as producers (``/info`` + topic names from ``/stats``)."""

        async def one(addr: str) -> Producer:
            producer, topics = await asyncio.gather(
                self._nsqd_info(addr), self._nsqd_topic_names(addr)
            )
            producer.topics = [ProducerTopic(t) for t in topics]
            return producer

        ok, errors = await self._each("nsqd", nsqds, one)
        producers = [p for _, p in ok]
        if producers:
            newest = max(version_key(p.version) for p in producers)
            for producer in producers:
                producer.out_of_date = version_key(producer.version) < newest
        producers.sort(key=lambda p: (p.hostname, p.http_address))
        return producers, errors

    async def get_nsqd_topic_producers(
        self, topic: str, nsqds: Sequence[str]
    ) -> tuple[list[Producer], Errors]:
        """Those of the given nsqd that have ``topic``."""

        async def one(addr: str) -> Producer | None:
            topics = await self._nsqd_topic_names(addr)
            if topic not in topics:
                return None
            producer = await self._nsqd_info(addr)
            producer.topics = [ProducerTopic(t) for t in topics]
            return producer

        ok, errors = await self._each("nsqd", nsqds, one)
        producers = [p for _, p in ok if p is not None]
        producers.sort(key=lambda p: (p.hostname, p.http_address))
        return producers, errors

    async def get_nsqd_stats(
        self,
        producers: Sequence[Producer],
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
        include_mem: bool = False,
    ) -> tuple[list[NodeStats], Errors]:
        """Every producer's ``/stats``, optionally narrowed to one topic (and channel)."""

        async def one(producer: Producer) -> NodeStats:
            addr = producer.http_address
            query = f"format=json&include_clients={'true' if include_clients else 'false'}"
            query += f"&include_mem={'true' if include_mem else 'false'}"
            if topic:
                query += f"&topic={_q(topic)}"
                if channel:
                    query += f"&channel={_q(channel)}"
            doc = await self._get("nsqd", f"http://{addr}/stats?{query}")
            topics = [
                TopicStats.from_nsqd(t, addr, producer.hostname) for t in _dict_list(doc, "topics")
            ]
            if topic:
                topics = [t for t in topics if t.topic_name == topic]
            if channel:
                for t in topics:
                    t.channels = [c for c in t.channels if c.channel_name == channel]
            if producer.topology_zone or producer.topology_region:
                for t in topics:
                    for c in t.channels:
                        for client in c.clients:
                            client.doc["node_topology_region"] = producer.topology_region
                            client.doc["node_topology_zone"] = producer.topology_zone
            memory = doc.get("memory") if isinstance(doc, dict) else None
            return NodeStats(producer, topics, memory if isinstance(memory, dict) else None)

        ok, errors = await self._each("nsqd", producers, one)
        nodes = [stats for _, stats in ok]
        nodes.sort(key=lambda n: (n.producer.hostname, n.producer.http_address))
        return nodes, errors

    # -- either ----------------------------------------------------------------------------

    async def get_producers(
        self, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> tuple[list[Producer], Errors]:
        """All nsqd: from the lookupds when there are any, else the nsqd given directly."""
        if lookupds:
            return await self.get_lookupd_producers(lookupds)
        return await self.get_nsqd_producers(nsqds)

    async def get_topic_producers(
        self, topic: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> tuple[list[Producer], Errors]:
        """The nsqd producing ``topic``."""
        if lookupds:
            return await self.get_lookupd_topic_producers(topic, lookupds)
        return await self.get_nsqd_topic_producers(topic, nsqds)

    # -- actions ---------------------------------------------------------------------------

    async def create_topic_channel(
        self, topic: str, channel: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> Errors:
        """Create the topic (and channel) on every lookupd; the channel also on its producers.

        Without lookupds (nsqadmin given ``--nsqd-http-address``) Go does nothing; here the
        topic and channel are created on every given nsqd instead.
        """
        qs_topic = f"topic={_q(topic)}"
        qs_channel = f"{qs_topic}&channel={_q(channel)}"
        if not lookupds:
            errors = await self._post_all(
                "nsqd", (f"http://{a}/topic/create?{qs_topic}" for a in nsqds)
            )
            if channel:
                errors += await self._post_all(
                    "nsqd", (f"http://{a}/channel/create?{qs_channel}" for a in nsqds)
                )
            return errors
        errors = await self._post_all(
            "nsqlookupd", (f"http://{a}/topic/create?{qs_topic}" for a in lookupds)
        )
        if channel:
            errors += await self._post_all(
                "nsqlookupd", (f"http://{a}/channel/create?{qs_channel}" for a in lookupds)
            )
            producers, lookup_errors = await self.get_lookupd_topic_producers(topic, lookupds)
            errors += lookup_errors
            errors += await self._post_all(
                "nsqd",
                (f"http://{p.http_address}/channel/create?{qs_channel}" for p in producers),
            )
        return errors

    async def delete_topic(
        self, topic: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> Errors:
        """Delete the topic from every lookupd (the key itself) and every nsqd producing it."""
        producers, errors = await self.get_topic_producers(topic, lookupds, nsqds)
        qs = f"topic={_q(topic)}"
        errors += await self._post_all(
            "nsqlookupd", (f"http://{a}/topic/delete?{qs}" for a in lookupds)
        )
        errors += await self._post_all(
            "nsqd", (f"http://{p.http_address}/topic/delete?{qs}" for p in producers)
        )
        return errors

    async def delete_channel(
        self, topic: str, channel: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> Errors:
        """Delete the channel from every lookupd (the key itself) and every producer."""
        producers, errors = await self.get_topic_producers(topic, lookupds, nsqds)
        qs = f"topic={_q(topic)}&channel={_q(channel)}"
        errors += await self._post_all(
            "nsqlookupd", (f"http://{a}/channel/delete?{qs}" for a in lookupds)
        )
        errors += await self._post_all(
            "nsqd", (f"http://{p.http_address}/channel/delete?{qs}" for p in producers)
        )
        return errors

    async def topic_channel_action(
        self,
        action: str,
        topic: str,
        channel: str,
        lookupds: Sequence[str],
        nsqds: Sequence[str],
        *,
        method: str = "POST",
        body: bytes | None = None,
    ) -> Errors:
        """``pause``, ``unpause`` or ``empty`` a topic (or channel) on every producer (or any
        ``/topic/<action>``, ``/channel/<action>`` with ``method`` and ``body``)."""
        producers, errors = await self.get_topic_producers(topic, lookupds, nsqds)
        if channel:
            path = f"channel/{action}?topic={_q(topic)}&channel={_q(channel)}"
        else:
            path = f"topic/{action}?topic={_q(topic)}"
        errors += await self._post_all(
            "nsqd", (f"http://{p.http_address}/{path}" for p in producers), method=method, body=body
        )
        return errors

    async def set_policy(
        self,
        topic: str,
        channel: str,
        body: bytes | None,
        lookupds: Sequence[str],
        nsqds: Sequence[str],
    ) -> Errors:
        """POST a message policy (docs/POLICIES.md) to every producer, or DELETE it (None)."""
        return await self.topic_channel_action(
            "policy",
            topic,
            channel,
            lookupds,
            nsqds,
            method="DELETE" if body is None else "POST",
            body=body,
        )

    async def tombstone_node_for_topic(
        self, topic: str, node: str, lookupds: Sequence[str]
    ) -> Errors:
        """Tombstone ``node`` for ``topic`` on every lookupd, then delete the topic there."""
        errors = await self._post_all(
            "nsqlookupd",
            (f"http://{a}/topic/tombstone?topic={_q(topic)}&node={_q(node)}" for a in lookupds),
        )
        producers, more = await self.get_nsqd_producers([node])
        errors += more
        errors += await self._post_all(
            "nsqd", (f"http://{p.http_address}/topic/delete?topic={_q(topic)}" for p in producers)
        )
        return errors


def aggregate_channels(nodes: Sequence[NodeStats]) -> dict[tuple[str, str], ChannelStats]:
    """Every (topic, channel) summed over the nodes (Go's ``GetNSQDStats`` channel map)."""
    totals: dict[tuple[str, str], ChannelStats] = {}
    for node in nodes:
        for topic in node.topics:
            for channel in topic.channels:
                key = (topic.topic_name, channel.channel_name)
                total = totals.get(key)
                if total is None:
                    total = totals[key] = ChannelStats.aggregate(*key)
                total.add(channel)
    return totals


def _str(doc: Any, key: str) -> str:
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else ""


def _str_list(doc: Any, key: str) -> list[str]:
    value = doc.get(key) if isinstance(doc, dict) else None
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _dict_list(doc: Any, key: str) -> list[dict[str, Any]]:
    value = doc.get(key) if isinstance(doc, dict) else None
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
