"""What every nsqpy command does around its own work, as Go's ``apps/<binary>/main.go``.

A server's ``main`` is :func:`run_server`: parse the flags (and ``--config`` file),
answer ``--version``, make the logger, validate, then run the server's ``serve``
coroutine on :func:`~nsqpy.common.aio.event_loop_factory`'s loop and exit with its
status. ``serve`` calls :func:`~nsqpy.common.aio.stop_on_signals` before it starts
anything, and waits on the event it returns.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from nsqpy.common.aio import event_loop_factory
from nsqpy.common.goflags import (
    GoFlagsError,
    OptionsError,
    ParseResult,
    exit_on_error,
    version_string,
)
from nsqpy.common.log import Level, Logger, LogLevel
from nsqpy.common.net import is_unix_address

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    class _ServerOptions(DataclassInstance, Protocol):
        """What :func:`run_server` reads of a server's options."""

        log_prefix: str
        log_level: LogLevel


__all__ = ["ListenError", "parse_or_exit", "run_server"]

D = TypeVar("D", bound="DataclassInstance")
S = TypeVar("S", bound="_ServerOptions")


class ListenError(OSError):
    """A listener could not be opened on the address the user gave.

    Worded as Go's ``listen (<address>) failed - listen tcp <address>: bind: <cause>``, so
    that the message names the address asked for, not the one a socket library reports.
    """

    def __init__(self, address: str, err: OSError) -> None:
        super().__init__(err.errno, _cause(err))
        self.address = address

    def __str__(self) -> str:
        network = "unix" if is_unix_address(self.address) else "tcp"
        return f"listen ({self.address}) failed - listen {network} {self.address}: {self.strerror}"


def _cause(err: OSError) -> str:
    """The errno's text as Go's syscall.Errno words it; a bind failure says so first."""
    if err.errno is None or err.errno <= 0:  # no errno, or a resolver's (gaierror)
        return err.strerror or str(err)
    text = os.strerror(err.errno)
    return f"bind: {text[:1].lower()}{text[1:]}"


def parse_or_exit(
    parse: Callable[[list[str]], ParseResult[D]], argv: Sequence[str] | None, prog: str
) -> ParseResult[D]:
    """Go's ``flag.Parse`` of ``argv`` (default ``sys.argv[1:]``) with ``parse``: a bad
    flag or ``--help`` is reported and exits, ``--version`` is printed and exits 0."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = parse(args)
    except GoFlagsError as err:
        exit_on_error(err)
    if result.version:
        print(version_string(prog))
        sys.exit(0)
    return result


def run_server(
    name: str,
    argv: Sequence[str] | None,
    parse: Callable[[list[str]], ParseResult[S]],
    validate: Callable[[S], None],
    serve: Callable[[S, Logger], Coroutine[Any, Any, int]],
    supervise: Callable[[S, Logger], int | None] | None = None,
) -> NoReturn:
    """The ``main`` of the server ``name``: exits with ``serve``'s status.

    An :class:`OptionsError` from ``validate`` is logged as Go's
    ``failed to instantiate <name> - <err>`` and exits 1. ``supervise``, if given, runs
    first: a status from it is the exit status, without ``serve``.
    """
    opts = parse_or_exit(parse, argv, name).options
    logger = Logger(opts.log_prefix, Level(int(opts.log_level)))
    try:
        validate(opts)
    except OptionsError as err:
        logger.fatal(f"failed to instantiate {name} - {err}")
        sys.exit(1)
    if supervise is not None and (status := supervise(opts, logger)) is not None:
        sys.exit(status)  # the server ran as processes of its own (nsqd --workers)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        code = runner.run(serve(opts, logger))
    sys.exit(code)
