"""nsqlookupd discovery: ``GET /lookup?topic=`` (spec §4.3), polled by consumers."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from nsqpy.client._errors import NSQLookupdError

if TYPE_CHECKING:
    import aiohttp  # imported when first used: it is slow to import

__all__ = [
    "LookupdPoller",
    "http_get_json",
    "lookup",
    "lookup_url",
    "nodes_url",
    "producer_tcp_address",
]

log = logging.getLogger("nsqpy.client")

ACCEPT = "application/vnd.nsq; version=1.0"


def lookup_url(address: str, topic: str, path: str = "/lookup") -> str:
    """go-nsq's ``buildLookupAddr``: ``host:port`` or a URL; an empty path means ``path``."""
    url = address if "://" in address else "http://" + address
    parts = urlsplit(url)
    if parts.port is None:
        raise ValueError(f"lookupd address {address!r} has no port")
    query = parts.query + ("&" if parts.query else "") + urlencode({"topic": topic})
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") or path, query, ""))


def nodes_url(address: str) -> str:
    """``/nodes`` of the nsqlookupd at ``address`` (``host:port`` or a URL)."""
    parts = urlsplit(address if "://" in address else "http://" + address)
    return urlunsplit((parts.scheme, parts.netloc, "/nodes", "", ""))


def producer_tcp_address(peer: dict[str, Any]) -> str:
    """``broadcast_address:tcp_port`` of a producer in a /lookup reply (IPv6 bracketed)."""
    host = str(peer["broadcast_address"])
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{int(peer['tcp_port'])}"


async def http_get_json(
    session: aiohttp.ClientSession, url: str, *, not_found_ok: bool = False
) -> dict[str, Any] | None:
    """GET ``url`` expecting NSQ's JSON; unwraps the pre-1.0 ``{"data": ...}`` envelope.

    Returns None for a 404 when ``not_found_ok``; raises :class:`NSQLookupdError`.
    """
    import aiohttp

    try:
        async with session.get(url, headers={"Accept": ACCEPT}) as resp:
            body = await resp.read()
            status = resp.status
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        raise NSQLookupdError(f"GET {url}: {err or type(err).__name__}") from err
    if status == 404 and not_found_ok:
        return None
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        raise NSQLookupdError(f"GET {url}: invalid JSON {body[:100]!r}") from None
    if status != 200:
        message = data.get("message") if isinstance(data, dict) else None
        raise NSQLookupdError(f"GET {url}: got response {status} {message or body[:100]!r}")
    if not isinstance(data, dict):
        raise NSQLookupdError(f"GET {url}: unexpected JSON {body[:100]!r}")
    if "data" in data and "status_code" in data and isinstance(data["data"], dict):
        data = data["data"]  # legacy (pre-1.0) envelope
    return data


async def lookup(session: aiohttp.ClientSession, address: str, topic: str) -> list[str]:
    """The nsqd TCP addresses producing ``topic`` according to one nsqlookupd.

    An unknown topic (404 ``TOPIC_NOT_FOUND``) has no producers.
    """
    data = await http_get_json(session, lookup_url(address, topic), not_found_ok=True)
    if data is None:
        return []
    try:
        return [producer_tcp_address(p) for p in data.get("producers") or []]
    except (KeyError, TypeError, ValueError) as err:
        raise NSQLookupdError(f"lookupd {address}: bad producer entry ({err})") from None


class LookupdPoller:
    """Polls every nsqlookupd for ``topic`` every ``interval`` seconds.

    After each round, ``on_result(addresses, complete)`` gets the union of the producers
    found; ``complete`` is False when a lookupd could not be queried (so an nsqd missing
    from the union may just be on that lookupd). :meth:`poke` polls at once.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        topic: str,
        interval: float,
        jitter: float,
        on_result: Callable[[set[str], bool], None],
        *,
        prefix: str = "",
        timeout: float = 5.0,
    ) -> None:
        self.addresses = list(addresses)
        self.topic = topic
        self.interval = interval
        self.jitter = jitter
        self._on_result = on_result
        self._prefix = prefix
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def start(self, *, polled: bool = False) -> None:
        """Start polling; ``polled`` says the first poll was just done (by the caller)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(polled))

    def add(self, address: str) -> None:
        if address not in self.addresses:
            self.addresses.append(address)
            self.poke()

    def poke(self) -> None:
        """Poll now (e.g. a connection was lost) instead of at the next tick."""
        self._wake.set()

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        return self._session

    async def poll_once(self) -> tuple[set[str], bool]:
        session = self._http()
        results = await asyncio.gather(
            *(lookup(session, a, self.topic) for a in self.addresses), return_exceptions=True
        )
        found: set[str] = set()
        complete = True
        for address, result in zip(self.addresses, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                complete = False
                log.error("%serror querying nsqlookupd (%s) - %s", self._prefix, address, result)
            else:
                found.update(result)
        return found, complete

    async def active_nodes(self) -> set[str] | None:
        """The nsqd every nsqlookupd lists as active (``/nodes``, whatever their topics);
        None when one of them could not be queried."""
        session = self._http()
        try:
            replies = await asyncio.gather(
                *(http_get_json(session, nodes_url(a)) for a in self.addresses)
            )
            return {
                producer_tcp_address(p) for r in replies for p in (r or {}).get("producers") or []
            }
        except (NSQLookupdError, KeyError, TypeError, ValueError) as err:
            log.error("%serror querying nsqlookupd nodes - %s", self._prefix, err)
            return None

    async def _run(self, polled: bool) -> None:
        # The first query is immediate; like go-nsq, the periodic ones start after a random
        # jitter so that consumers restarted together do not all poll at once.
        delay = self.interval + random.random() * self.jitter * self.interval if polled else 0.0
        while True:
            if delay:
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    pass
                delay = self.interval
            else:
                delay = self.interval + random.random() * self.jitter * self.interval
            self._wake.clear()
            try:
                found, complete = await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop discovery
                log.exception("%slookupd poll failed", self._prefix)
                continue
            self._on_result(found, complete)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
