"""What NSQ's command-line tools share: flags, checks, logging, the event loop, signals."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import nsqpy
from nsqpy.client._config import (
    ConnectionOptions,
    ProducerOptions,
    apply_go_option,
    tls_context_from_go,
)
from nsqpy.common.goflags import (
    GoFlagsError,
    Kind,
    ParseResult,
    exit_on_error,
    flag,
    parse_args,
    version_string,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ConsumerFlags",
    "StatusTimer",
    "consumer_options",
    "fatal",
    "go_log",
    "on_signals",
    "parse_tool_args",
    "producer_options",
    "require_one_source",
    "run",
    "setup_client_logging",
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


def parse_tool_args(cls: type[D], argv: Sequence[str] | None, prog: str) -> ParseResult[D]:
    """Go ``flag.Parse`` for a tool: exits on a bad flag, prints ``--version`` and exits."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = parse_args(cls, args, prog=prog, config_flag=False)
    except GoFlagsError as err:
        exit_on_error(err)
    if result.version:
        print(version_string(prog))
        sys.exit(0)
    return result


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


def run(main: Callable[[], Coroutine[Any, Any, int | None]]) -> NoReturn:
    """Run the tool's coroutine on uvloop (where installed) and exit with its status."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = asyncio.new_event_loop
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            code = runner.run(main())
    except KeyboardInterrupt:
        code = 1
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code or 0)


def on_signals(
    handler: Callable[[], object], signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)
) -> None:
    """Call ``handler`` on the running loop when one of ``signals`` arrives."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, handler)


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
