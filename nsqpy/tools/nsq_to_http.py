"""``nsq_to_http``: consume a topic and GET or POST every message to HTTP endpoints."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote_plus

from yarl import URL

import nsqpy
from nsqpy.client import Message
from nsqpy.common.goflags import Kind, flag
from nsqpy.tools._common import (
    ConsumerFlags,
    HostPoolFlags,
    HTTPClientFlags,
    consume_until_stopped,
    consumer_options,
    fatal,
    parse_tool_args,
    require_one_source,
    run,
    setup_client_logging,
    status_timers,
)
from nsqpy.tools._hostpool import HostPool

if TYPE_CHECKING:
    import aiohttp  # imported when first used: it is slow to import

__all__ = ["Options", "main", "parse_custom_headers"]

DEFAULT_CONTENT_TYPE = "application/octet-stream"


@dataclass
class Options(ConsumerFlags, HTTPClientFlags, HostPoolFlags):
    """nsq_to_http's flags (apps/nsq_to_http)."""

    topic: str = flag("topic", "", kind=Kind.STRING, help="nsq topic")
    channel: str = flag("channel", "nsq_to_http", kind=Kind.STRING, help="nsq channel")
    num_publishers: int = flag("n", 100, kind=Kind.INT, help="number of concurrent publishers")
    sample: float = flag(
        "sample", 1.0, kind=Kind.FLOAT, help="% of messages to publish (float b/w 0 -> 1)"
    )
    http_request_timeout: float = flag(  # 20s here, 5s in the other tools
        "http-client-request-timeout", 20.0, kind=Kind.DURATION, help="timeout for HTTP request"
    )
    status_every: int = flag(
        "status-every",
        250,
        kind=Kind.INT,
        help="the # of requests between logging status (per handler), 0 disables",
    )
    content_type: str = flag(
        "content-type",
        DEFAULT_CONTENT_TYPE,
        kind=Kind.STRING,
        help="the Content-Type used for POST requests",
    )
    get_addrs: list[str] = flag(
        "get",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="HTTP address to make a GET request to. '%s' will be printf replaced with data "
        "(may be given multiple times)",
    )
    post_addrs: list[str] = flag(
        "post",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="HTTP address to make a POST request to.  data will be in the body "
        "(may be given multiple times)",
    )
    headers: list[str] = flag(
        "header",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="Custom header for HTTP requests (may be given multiple times)",
    )


def parse_custom_headers(values: Sequence[str]) -> dict[str, str]:
    """``Name: value`` → ``{"Name": "value"}``, split on the first colon, both trimmed;
    an empty name or value is an error (Go's parseCustomHeaders)."""
    headers: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition(":")
        key, val = name.strip(), rest.strip()
        if not sep or not key or not val:
            raise ValueError(f"Invalid header: {value!r}")
        headers[key] = val
    return headers


class PublishHandler:
    """Per message: sample, pick the endpoint (``--mode``), GET or POST, time it."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        opts: Options,
        addresses: list[str],
        headers: dict[str, str],
    ) -> None:
        self.session = session
        self.post = bool(opts.post_addrs)
        self.sample = opts.sample
        self.content_type = opts.content_type
        self.headers = {"User-Agent": f"nsq_to_http v{nsqpy.NSQ_VERSION}", **headers}
        self.pool = HostPool(addresses, opts.mode)
        self.timers, self.aggregate = status_timers(addresses, opts.status_every)

    async def __call__(self, msg: Message) -> None:
        if self.sample < 1.0 and random.random() > self.sample:
            return
        start = time.monotonic()
        address = self.pool.get()
        try:
            await self.publish(address, msg.body)
        except Exception:
            self.pool.mark(address, False)
            raise
        self.pool.mark(address, True)
        self.timers[address].status(start)
        self.aggregate.status(start)

    async def publish(self, address: str, body: bytes) -> None:
        if self.post:
            headers = {**self.headers, "Content-Type": self.content_type}
            async with self.session.post(address, data=body, headers=headers) as resp:
                await resp.read()
                if not 200 <= resp.status < 300:
                    raise RuntimeError(f"got status code {resp.status}")
        else:
            # encoded=True: send the URL as given (aiohttp would unescape %2F and friends)
            url = URL(address.replace("%s", quote_plus(body, safe=""), 1), encoded=True)
            async with self.session.get(url, headers=self.headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"got status code {resp.status}")


async def forward(opts: Options) -> int:
    if not opts.topic or not opts.channel:
        fatal("--topic and --channel are required")
    if opts.content_type != DEFAULT_CONTENT_TYPE:
        if not opts.post_addrs:
            fatal("--content-type only used with --post")
        if not opts.content_type:
            fatal("--content-type requires a value when used")
    require_one_source(opts.nsqd_tcp_addresses, opts.lookupd_http_addresses)
    if not opts.get_addrs and not opts.post_addrs:
        fatal("--get or --post required")
    if opts.get_addrs and opts.post_addrs:
        fatal("use --get or --post not both")
    for get in opts.get_addrs:
        if get.count("%s") != 1:
            fatal("invalid GET address - must be a printf string")
    opts.check_mode()
    if not 0.0 <= opts.sample <= 1.0:
        fatal("ERROR: --sample must be between 0.0 and 1.0")
    try:
        headers = parse_custom_headers(opts.headers)
    except ValueError as err:
        fatal(str(err))
    if opts.num_publishers < 1:
        fatal("-n must be at least 1")
    setup_client_logging()
    options = consumer_options(opts.consumer_opts, "nsq_to_http", opts.max_in_flight)
    import aiohttp

    connector = aiohttp.TCPConnector(limit=opts.num_publishers)
    async with aiohttp.ClientSession(timeout=opts.client_timeout(), connector=connector) as session:
        addresses = opts.post_addrs or opts.get_addrs
        handler = PublishHandler(session, opts, addresses, headers)
        consumer = opts.new_consumer(
            opts.topic,
            opts.channel,
            options,
            handler=handler,
            concurrency=opts.num_publishers,
        )
        await consume_until_stopped([consumer], asyncio.Event())
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """The ``nsq_to_http`` command."""
    opts = parse_tool_args(Options, argv, "nsq_to_http").options
    run(lambda: forward(opts))


if __name__ == "__main__":
    main()
