"""What NSQ's command-line tools share: flags, checks, logging, the event loop, signals."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import nsqpy
from nsqpy.client import Consumer, NSQClientError
from nsqpy.client._config import (
    ConnectionOptions,
    ProducerOptions,
    apply_go_option,
    tls_context_from_go,
)
from nsqpy.client._lookup import http_get_json
from nsqpy.common.aio import event_loop_factory, on_signals
from nsqpy.common.app import parse_or_exit
from nsqpy.common.goflags import Kind, ParseResult, flag, parse_args

if TYPE_CHECKING:
    import aiohttp
    from _typeshed import DataclassInstance

__all__ = [
    "ConsumerFlags",
    "HTTPClientFlags",
    "HostPoolFlags",
    "StatusTimer",
    "consume_until_stopped",
    "consumer_options",
    "fatal",
    "get_json_from_each",
    "go_log",
    "on_signals",
    "parse_tool_args",
    "producer_options",
    "require_one_source",
    "run",
    "setup_client_logging",
    "status_timers",
    "user_agent",
]

D = TypeVar("D", bound="DataclassInstance")


@dataclass
class ConsumerFlags:
    """The flags every consuming tool has (each tool adds its own and its channel)."""

    nsqd_tcp_addresses: list[str] = flag(
        "nsqd-tcp-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="nsqd TCP address (may be given multiple times)",
    )
    lookupd_http_addresses: list[str] = flag(
        "lookupd-http-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="lookupd HTTP address (may be given multiple times)",
    )
    consumer_opts: list[str] = flag(
        "consumer-opt",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="option to passthrough to nsq.Consumer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    )
    max_in_flight: int = flag(
        "max-in-flight", 200, kind=Kind.INT, help="max number of messages to allow in flight"
    )

    def new_consumer(
        self, topic: str, channel: str, options: dict[str, Any], **handler: Any
    ) -> Consumer:
        """A Consumer on these flags' addresses with ``options`` (see
        :func:`consumer_options`) and ``handler`` arguments; a bad value is fatal."""
        try:
            return Consumer(
                topic,
                channel,
                nsqd_tcp_addresses=self.nsqd_tcp_addresses,
                lookupd_http_addresses=self.lookupd_http_addresses,
                **handler,
                **options,
            )
        except (ValueError, TypeError) as err:
            fatal(str(err))


@dataclass
class HTTPClientFlags:
    """The HTTP client timeouts of the tools that call nsqd's or nsqlookupd's HTTP API."""

    http_connect_timeout: float = flag(
        "http-client-connect-timeout", 2.0, kind=Kind.DURATION, help="timeout for HTTP connect"
    )
    http_request_timeout: float = flag(
        "http-client-request-timeout", 5.0, kind=Kind.DURATION, help="timeout for HTTP request"
    )

    def check_http_timeouts(self) -> None:
        """Both timeouts positive, or exit with the Go tools' messages."""
        if self.http_connect_timeout <= 0:
            fatal("--http-client-connect-timeout should be positive")
        if self.http_request_timeout <= 0:
            fatal("--http-client-request-timeout should be positive")

    def client_timeout(self) -> aiohttp.ClientTimeout:
        """The timeouts for an ``aiohttp.ClientSession``."""
        import aiohttp  # slow to import: only the tools that use it pay

        return aiohttp.ClientTimeout(
            total=self.http_request_timeout, sock_connect=self.http_connect_timeout
        )


@dataclass
class HostPoolFlags:
    """``--mode`` of the tools that spread their requests over destinations."""

    mode: str = flag(
        "mode",
        "hostpool",
        kind=Kind.STRING,
        help="the upstream request mode options: round-robin, hostpool (default), epsilon-greedy",
    )

    def check_mode(self) -> None:
        """Exit unless ``--mode`` is one the Go tools know."""
        if self.mode not in ("round-robin", "hostpool", "epsilon-greedy"):
            fatal(f"invalid --mode {self.mode!r}")


def parse_tool_args(cls: type[D], argv: Sequence[str] | None, prog: str) -> ParseResult[D]:
    """Go ``flag.Parse`` for a tool: exits on a bad flag, prints ``--version`` and exits."""
    return parse_or_exit(
        lambda args: parse_args(cls, args, prog=prog, config_flag=False), argv, prog
    )


async def get_json_from_each(
    session: aiohttp.ClientSession,
    addresses: Sequence[str],
    url: Callable[[str], str],
    *,
    not_found_ok: bool = False,
) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """GET ``url(address)`` of every address at once (clusterinfo's fan-out): the
    ``(address, JSON document)`` answers (a 404 with ``not_found_ok`` as ``{}``) and
    the failures as ``"<address>: <error>"``."""
    results = await asyncio.gather(
        *(http_get_json(session, url(a), not_found_ok=not_found_ok) for a in addresses),
        return_exceptions=True,
    )
    answers: list[tuple[str, dict[str, Any]]] = []
    errors: list[str] = []
    for address, result in zip(addresses, results, strict=True):
        if isinstance(result, BaseException):
            errors.append(f"{address}: {result}")
        else:
            answers.append((address, result or {}))
    return answers, errors


def go_log(msg: str) -> None:
    """Go's ``log.Printf`` with the standard flags: ``2026/11/21 17:00:00 msg`` on stderr."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S")
    try:
        sys.stderr.write(f"{stamp} {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def fatal(msg: str) -> NoReturn:
    """Go's ``log.Fatal``: log the message and exit with status 1."""
    go_log(msg)
    sys.exit(1)


def require_one_source(
    nsqd: Sequence[str],
    lookupd: Sequence[str],
    *,
    nsqd_flag: str = "--nsqd-tcp-address",
    suffix: str = "",
) -> None:
    """Exactly one of the two address kinds, with the Go tools' messages."""
    if not nsqd and not lookupd:
        fatal(f"{nsqd_flag} or --lookupd-http-address required{suffix}")
    if nsqd and lookupd:
        fatal(f"use {nsqd_flag} or --lookupd-http-address not both")


def user_agent(tool: str) -> str:
    """``nsq_tail/1.3.0 nsqpy/0.1.0`` (go-nsq tools send ``nsq_tail/1.3.0 go-nsq/1.1.0``)."""
    return f"{tool}/{nsqpy.NSQ_VERSION} nsqpy/{nsqpy.__version__}"


def _go_options(opts: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    tls: dict[str, str] = {}
    for opt in opts:
        try:
            apply_go_option(options, opt, tls)
        except ValueError as err:
            fatal(str(err))
    if tls:
        try:
            options["tls_context"] = tls_context_from_go(tls)
        except (ValueError, OSError) as err:
            fatal(str(err))
    return options


def consumer_options(opts: Sequence[str], tool: str, max_in_flight: int) -> dict[str, Any]:
    """``--consumer-opt`` values as Consumer keyword arguments; the tool's own
    ``--max-in-flight`` and user agent win, as in the Go tools."""
    options = _go_options(opts)
    options.setdefault("user_agent", user_agent(tool))
    options["max_in_flight"] = max_in_flight
    return options


def producer_options(opts: Sequence[str], tool: str) -> dict[str, Any]:
    """``--producer-opt`` values as Producer keyword arguments (consumer-only go-nsq
    options are accepted and ignored)."""
    options = _go_options(opts)
    options.setdefault("user_agent", user_agent(tool))
    allowed = ProducerOptions.__annotations__.keys() | ConnectionOptions.__annotations__.keys()
    return {k: v for k, v in options.items() if k in allowed}


class _GoLogFormatter(logging.Formatter):
    """go-nsq's log lines: ``2026/11/21 17:00:00 INF    1 [topic/channel] message``."""

    LEVELS = {
        logging.DEBUG: "DBG",
        logging.INFO: "INF",
        logging.WARNING: "WRN",
        logging.ERROR: "ERR",
        logging.CRITICAL: "ERR",
    }

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(record.created))
        level = self.LEVELS.get(record.levelno, "INF")
        return f"{stamp} {level:<4s} {1:3d} {record.getMessage()}"


def setup_client_logging(level: int = logging.INFO) -> None:
    """Send the client's log lines to stderr the way go-nsq logs them in the Go tools."""
    logger = logging.getLogger("nsqpy.client")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_GoLogFormatter())
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def _quiet_exit(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: a task that ended in :func:`fatal`'s SystemExit has
    already said why (its one error line); the exit must not add a "Task exception was
    never retrieved" traceback after it."""
    if isinstance(context.get("exception"), SystemExit):
        return
    loop.default_exception_handler(context)


async def _with_quiet_exit(main: Callable[[], Coroutine[Any, Any, int | None]]) -> int | None:
    asyncio.get_running_loop().set_exception_handler(_quiet_exit)
    return await main()


def run(main: Callable[[], Coroutine[Any, Any, int | None]]) -> NoReturn:
    """Run the tool's coroutine on uvloop (where installed) and exit with its status.

    A :func:`fatal` in any of its tasks ends the run with that task's SystemExit (asyncio
    lets it through the loop) and nothing printed after the error line."""
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            code = runner.run(_with_quiet_exit(main))
    except KeyboardInterrupt:
        code = 1
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code or 0)


async def consume_until_stopped(consumers: Sequence[Consumer], stop: asyncio.Event) -> None:
    """Start the consumers (a failure is fatal), run until ``stop`` is set or SIGINT or
    SIGTERM arrives, then close them."""
    on_signals(stop.set)
    try:
        for consumer in consumers:
            await consumer.start()
    except NSQClientError as err:
        fatal(str(err))
    await stop.wait()
    await asyncio.gather(*(c.close() for c in consumers))


class StatusTimer:
    """bitly/timer_metrics: every ``status_every`` durations, log the 99th and 95th
    percentiles and the average as ``<prefix> finished <n> - 99th: ..ms - 95th: ..ms -
    avg: ..ms``."""

    def __init__(self, status_every: int, prefix: str) -> None:
        self.status_every = status_every
        self.prefix = prefix
        self._timings: list[float] = []
        if 0 < status_every < 100:
            go_log(
                "Warning: use more than 100 status values for accurate percentiles "
                f"(configured with {status_every})"
            )

    def status(self, start: float) -> None:
        """Record the time since ``start`` (a ``time.monotonic()`` value)."""
        if self.status_every <= 0:
            return
        self._timings.append(time.monotonic() - start)
        if len(self._timings) >= self.status_every:
            timings = sorted(self._timings)
            n = len(timings)
            p99 = timings[max(0, min(n - 1, int(n * 0.99 + 0.5) - 1))]
            p95 = timings[max(0, min(n - 1, int(n * 0.95 + 0.5) - 1))]
            avg = sum(timings) / n
            go_log(
                f"{self.prefix} finished {n} - 99th: {p99 * 1000:.02f}ms - "
                f"95th: {p95 * 1000:.02f}ms - avg: {avg * 1000:.02f}ms"
            )
            self._timings.clear()


def status_timers(
    addresses: Sequence[str], status_every: int
) -> tuple[dict[str, StatusTimer], StatusTimer]:
    """One timer per destination (silent when there is only one) and the aggregate."""
    if len(addresses) == 1:
        timers = {addresses[0]: StatusTimer(0, "")}
    else:
        timers = {a: StatusTimer(status_every, f"[{a}]:") for a in addresses}
    return timers, StatusTimer(status_every, "[aggregate]:")
