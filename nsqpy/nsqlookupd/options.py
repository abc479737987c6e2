"""nsqlookupd's options: every command line flag of Go nsqlookupd, its config key and default.

Mirrors ``nsqlookupd/options.go`` (the ``Options`` struct and ``NewOptions``) and
``apps/nsqlookupd/options.go`` (the flag set) of NSQ v1.3.0 (spec §4.1).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from nsqpy.common.goflags import (
    Kind,
    LogLevel,
    OptionsError,
    ParseResult,
    flag,
    log_level_flag,
    log_prefix_flag,
    parse_args,
    verbose_flag,
)

__all__ = ["LogLevel", "Options", "parse_nsqlookupd_args", "validate"]


@dataclass
class Options:
    """Everything nsqlookupd can be configured with; durations are float seconds."""

    log_level: LogLevel = log_level_flag()
    log_prefix: str = log_prefix_flag("[nsqlookupd] ")
    verbose: bool = verbose_flag()
    tcp_address: str = flag(
        "tcp-address",
        "0.0.0.0:4160",
        kind=Kind.STRING,
        help="<addr>:<port> to listen on for TCP clients",
    )
    http_address: str = flag(
        "http-address",
        "0.0.0.0:4161",
        kind=Kind.STRING,
        help="<addr>:<port> to listen on for HTTP clients",
    )
    broadcast_address: str = flag(
        "broadcast-address",
        default_factory=socket.gethostname,
        kind=Kind.STRING,
        help="address of this lookupd node, (default to the OS hostname)",
    )
    inactive_producer_timeout: float = flag(
        "inactive-producer-timeout",
        300.0,
        kind=Kind.DURATION,
        help="duration of time a producer will remain in the active list since its last ping",
    )
    tombstone_lifetime: float = flag(
        "tombstone-lifetime",
        45.0,
        kind=Kind.DURATION,
        help="duration of time a producer will remain tombstoned if registration remains",
    )


def parse_nsqlookupd_args(argv: Sequence[str]) -> ParseResult[Options]:
    """Parse nsqlookupd's command line (without the program name) and ``--config`` file.

    ``result.version`` tells the caller to print ``version_string("nsqlookupd")`` and
    exit 0. Raises ``FlagError``, ``HelpRequested`` or ``ConfigError``.
    """
    return parse_args(Options, argv, prog="nsqlookupd")


def validate(opts: Options) -> None:
    """Startup checks (Go has none beyond parsing); raises :class:`OptionsError`."""
    if not isinstance(opts.log_level, LogLevel):
        try:
            opts.log_level = LogLevel(opts.log_level)
        except ValueError:
            raise OptionsError(f"invalid log level '{opts.log_level}'") from None
