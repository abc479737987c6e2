"""nsqpy.client._lookup against a fake nsqlookupd HTTP server in this process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from nsqpy.client import NSQLookupdError
from nsqpy.client._lookup import LookupdPoller, lookup, lookup_url, producer_tcp_address

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def peer(host: str, tcp: int) -> dict[str, Any]:
    return {
        "remote_address": f"{host}:5000",
        "hostname": "h",
        "broadcast_address": host,
        "tcp_port": tcp,
        "http_port": tcp + 1,
        "version": "1.3.0",
    }


@asynccontextmanager
async def fake_lookupd(routes: dict[str, tuple[int, Any, bool]]) -> AsyncIterator[str]:
    """Serves /lookup?topic=<t> from ``routes[t] = (status, body, v1_header)``."""

    async def handler(request: web.Request) -> web.Response:
        status, body, v1 = routes[request.query["topic"]]
        headers = {"X-NSQ-Content-Type": "nsq; version=1.0"} if v1 else {}
        return web.Response(status=status, text=json.dumps(body), headers=headers)

    app = web.Application()
    app.router.add_get("/lookup", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def test_lookup_url() -> None:
    assert lookup_url("127.0.0.1:4161", "t") == "http://127.0.0.1:4161/lookup?topic=t"
    assert lookup_url("http://h:4161/", "a b") == "http://h:4161/lookup?topic=a+b"
    assert lookup_url("https://h:4161/custom?x=1", "t") == "https://h:4161/custom?x=1&topic=t"
    with pytest.raises(ValueError):
        lookup_url("h", "t")


def test_producer_tcp_address() -> None:
    assert producer_tcp_address(peer("10.0.0.1", 4150)) == "10.0.0.1:4150"
    assert producer_tcp_address(peer("::1", 4150)) == "[::1]:4150"


def test_lookup_replies() -> None:
    routes = {
        "v1": (200, {"channels": ["c"], "producers": [peer("127.0.0.1", 4150)]}, True),
        "legacy": (
            200,
            {"status_code": 200, "status_txt": "OK", "data": {"producers": [peer("h", 1)]}},
            False,
        ),
        "missing": (404, {"message": "TOPIC_NOT_FOUND"}, True),
        "broken": (500, {"message": "INTERNAL_ERROR"}, True),
    }

    async def main() -> None:
        async with fake_lookupd(routes) as address, aiohttp.ClientSession() as session:
            assert await lookup(session, address, "v1") == ["127.0.0.1:4150"]
            assert await lookup(session, address, "legacy") == ["h:1"]
            assert await lookup(session, address, "missing") == []
            with pytest.raises(NSQLookupdError, match="got response 500"):
                await lookup(session, address, "broken")
        with pytest.raises(NSQLookupdError):
            async with aiohttp.ClientSession() as session:
                await lookup(session, "127.0.0.1:1", "t")

    arun(main())


def test_poller_unions_lookupds_and_reports_completeness() -> None:
    one = {"t": (200, {"producers": [peer("127.0.0.1", 1), peer("127.0.0.1", 2)]}, True)}
    two = {"t": (200, {"producers": [peer("127.0.0.1", 2), peer("127.0.0.1", 3)]}, True)}

    async def main() -> None:
        results: list[tuple[set[str], bool]] = []
        got = asyncio.Event()

        def on_result(found: set[str], complete: bool) -> None:
            results.append((found, complete))
            got.set()

        async with fake_lookupd(one) as a, fake_lookupd(two) as b:
            poller = LookupdPoller([a, b], "t", 60.0, 0.3, on_result)
            poller.start()
            await asyncio.wait_for(got.wait(), 5)
            got.clear()
            poller.add("127.0.0.1:1")  # unreachable: polls at once, incomplete
            await asyncio.wait_for(got.wait(), 5)
            await poller.close()
        addresses = {f"127.0.0.1:{n}" for n in (1, 2, 3)}
        assert results == [(addresses, True), (addresses, False)]

    arun(main())
