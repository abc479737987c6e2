"""``nsq_stat``: poll ``/stats`` of every producer of a topic and print channel totals."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from nsqpy.client import NSQLookupdError
from nsqpy.client._lookup import lookup_url
from nsqpy.common.goflags import Kind, flag
from nsqpy.tools._common import (
    HTTPClientFlags,
    fatal,
    get_json_from_each,
    go_log,
    on_signals,
    parse_tool_args,
    run,
)

if TYPE_CHECKING:
    import aiohttp  # imported when first used: it is slow to import

__all__ = ["ChannelTotals", "Options", "format_row", "main"]

BANNER = (
    "------rate------+----------------depth----------------+--------------metadata---------------"
)
HEADER = "%7s %7s | %7s %7s %7s %5s %5s | %7s %7s %12s %7s" % (  # noqa: UP031 - Go's format
    "ingress",
    "egress",
    "total",
    "mem",
    "disk",
    "inflt",
    "def",
    "req",
    "t-o",
    "msgs",
    "clients",
)


@dataclass
class Options(HTTPClientFlags):
    """nsq_stat's flags (apps/nsq_stat)."""

    topic: str = flag("topic", "", kind=Kind.STRING, help="NSQ topic")
    channel: str = flag("channel", "", kind=Kind.STRING, help="NSQ channel")
    interval: float = flag(
        "interval", 2.0, kind=Kind.DURATION, help="duration of time between polling/printing output"
    )
    status_every: float = flag(
        "status-every",
        0.0,
        kind=Kind.DURATION,
        help="(deprecated) duration of time between polling/printing output",
    )
    count: int = flag("count", 0, kind=Kind.INT, help="number of reports")
    nsqd_http_addresses: list[str] = flag(
        "nsqd-http-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="nsqd HTTP address (may be given multiple times)",
    )
    lookupd_http_addresses: list[str] = flag(
        "lookupd-http-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="lookupd HTTP address (may be given multiple times)",
    )


@dataclass
class ChannelTotals:
    """One channel's stats summed over the producers (clusterinfo's ChannelStats.Add)."""

    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    in_flight_count: int = 0
    deferred_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    message_count: int = 0
    client_count: int = 0

    def add(self, ch: dict[str, Any]) -> None:
        depth = int(ch.get("depth", 0))
        backend = int(ch.get("backend_depth", 0))
        self.depth += depth
        self.memory_depth += depth - backend
        self.backend_depth += backend
        self.in_flight_count += int(ch.get("in_flight_count", 0))
        self.deferred_count += int(ch.get("deferred_count", 0))
        self.requeue_count += int(ch.get("requeue_count", 0))
        self.timeout_count += int(ch.get("timeout_count", 0))
        self.message_count += int(ch.get("message_count", 0))
        clients = ch.get("client_count")
        self.client_count += int(clients) if clients is not None else len(ch.get("clients") or [])


def format_row(c: ChannelTotals, o: ChannelTotals, interval: float) -> str:
    """One data row: rates since the previous poll, then the current totals."""
    ingress = int((c.message_count - o.message_count) / interval)
    egress = int((c.message_count - o.message_count - (c.depth - o.depth)) / interval)
    return "%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d" % (  # noqa: UP031 - Go's format
        ingress,
        egress,
        c.depth,
        c.memory_depth,
        c.backend_depth,
        c.in_flight_count,
        c.deferred_count,
        c.requeue_count,
        c.timeout_count,
        c.message_count,
        c.client_count,
    )


def _http_address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _stats_url(address: str, topic: str) -> str:
    base = address if "://" in address else "http://" + address
    query = urlencode({"format": "json", "topic": topic, "include_clients": "false"})
    return f"{base.rstrip('/')}/stats?{query}"


async def lookupd_producers(
    session: aiohttp.ClientSession, lookupds: Sequence[str], topic: str
) -> list[str]:
    """nsqd HTTP addresses producing ``topic``, from every lookupd (clusterinfo's
    GetLookupdTopicProducers); any failure is an error, as nsq_stat treats it."""
    answers, errors = await get_json_from_each(
        session, lookupds, lambda a: lookup_url(a, topic), not_found_ok=True
    )
    found: dict[str, None] = {}
    for _, doc in answers:
        for peer in doc.get("producers") or []:
            found[_http_address(str(peer["broadcast_address"]), int(peer["http_port"]))] = None
    if errors:
        raise NSQLookupdError("; ".join(errors))
    return list(found)


async def nsqd_producers(
    session: aiohttp.ClientSession, nsqds: Sequence[str], topic: str
) -> list[str]:
    """The given nsqd that have ``topic`` (clusterinfo's GetNSQDTopicProducers)."""
    answers, errors = await get_json_from_each(session, nsqds, lambda a: _stats_url(a, topic))
    found = []
    for address, doc in answers:
        if any(t.get("topic_name") == topic for t in doc.get("topics") or []):
            found.append(address)
    if errors:
        raise NSQLookupdError("; ".join(errors))
    return found


async def channel_totals(
    session: aiohttp.ClientSession, producers: Sequence[str], topic: str, channel: str
) -> ChannelTotals | None:
    """``channel`` of ``topic`` summed over ``producers``; None if no producer has it."""
    answers, errors = await get_json_from_each(session, producers, lambda a: _stats_url(a, topic))
    totals: ChannelTotals | None = None
    for _, doc in answers:
        for t in doc.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            for ch in t.get("channels") or []:
                if ch.get("channel_name") == channel:
                    totals = totals or ChannelTotals()
                    totals.add(ch)
    if errors:
        raise NSQLookupdError("; ".join(errors))
    return totals


class _Screen:
    """Output: Go's rows, or on a terminal a table redrawn in place after each poll."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.rows: list[str] = []
        self.printed = 0

    def header(self) -> None:
        if not self.tty:
            sys.stdout.write(f"{BANNER}\n{HEADER}\n")
            sys.stdout.flush()
        else:
            self.redraw()

    def row(self, text: str) -> None:
        if not self.tty:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            return
        self.rows.append(text)
        self.redraw()

    def redraw(self) -> None:
        height = shutil.get_terminal_size((100, 24)).lines
        keep = max(1, height - 3)
        self.rows = self.rows[-keep:]
        sys.stdout.write("\x1b[H\x1b[2J" + BANNER + "\n" + HEADER + "\n")
        for r in self.rows:
            sys.stdout.write(r + "\n")
        sys.stdout.flush()


async def stat(opts: Options, count_set: bool, status_every_set: bool) -> int:
    if not opts.topic or not opts.channel:
        fatal("--topic and --channel are required")
    interval = opts.interval
    if status_every_set:
        go_log("--status-every is deprecated, use --interval")
        interval = opts.status_every
    if interval <= 0:
        fatal("--interval should be positive")
    opts.check_http_timeouts()
    if count_set and opts.count <= 0:
        fatal("--count should be positive")
    nsqds, lookupds = opts.nsqd_http_addresses, opts.lookupd_http_addresses
    if not nsqds and not lookupds:
        fatal("--nsqd-http-address or --lookupd-http-address required")
    if nsqds and lookupds:
        fatal("use --nsqd-http-address or --lookupd-http-address not both")
    if any(a.startswith("http") for a in nsqds):
        fatal("--nsqd-http-address error - address should not contain scheme")
    if any(a.startswith("http") for a in lookupds):
        fatal("--lookupd-http-address error - address should not contain scheme")

    stop = asyncio.Event()
    on_signals(stop.set, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    import aiohttp

    screen = _Screen()
    async with aiohttp.ClientSession(timeout=opts.client_timeout()) as session:
        previous: ChannelTotals | None = None
        i = 0
        # Go's loop: `for i := 0; !countNum.isSet || countNum.value >= i; i++` -- the
        # first poll only sets the baseline, so --count N prints N rows.
        while not stop.is_set() and (not count_set or opts.count >= i):
            try:
                if lookupds:
                    producers = await lookupd_producers(session, lookupds, opts.topic)
                else:
                    producers = await nsqd_producers(session, nsqds, opts.topic)
            except NSQLookupdError as err:
                fatal(f"ERROR: failed to get topic producers - {err}")
            try:
                current = await channel_totals(session, producers, opts.topic, opts.channel)
            except NSQLookupdError as err:
                fatal(f"ERROR: failed to get nsqd stats - {err}")
            if current is None:
                fatal(
                    f"ERROR: failed to find channel({opts.channel}) in stats metadata "
                    f"for topic({opts.topic})"
                )
            if i % 25 == 0:
                screen.header()
            if previous is not None:
                screen.row(format_row(current, previous, interval))
            previous = current
            i += 1
            if count_set and opts.count < i:
                break
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """The ``nsq_stat`` command."""
    result = parse_tool_args(Options, argv, "nsq_stat")
    opts = result.options
    run(lambda: stat(opts, result.is_explicit("count"), result.is_explicit("status_every")))


if __name__ == "__main__":
    main()
