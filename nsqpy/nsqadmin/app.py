"""The ``nsqadmin`` command: parse options, serve the web UI, exit on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Sequence

from nsqpy.common.goflags import GoFlagsError, OptionsError, exit_on_error, version_string
from nsqpy.common.log import Level, Logger
from nsqpy.nsqadmin.nsqadmin import NSQAdmin
from nsqpy.nsqadmin.options import Options, parse_nsqadmin_args, validate

__all__ = ["main", "serve"]


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop where it is installed, else asyncio's default loop (as nsqd)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def serve(opts: Options, logger: Logger) -> int:
    """Run nsqadmin until SIGINT or SIGTERM; the exit code."""
    admin = NSQAdmin(opts, logger)
    try:
        await admin.start()
    except OptionsError as err:
        logger.fatal(str(err))
        await admin.stop()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await admin.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = parse_nsqadmin_args(args)
    except GoFlagsError as err:
        exit_on_error(err)
    if result.version:
        print(version_string("nsqadmin"))
        sys.exit(0)
    opts = result.options
    logger = Logger(opts.log_prefix, Level(int(opts.log_level)))
    try:
        validate(opts)
    except OptionsError as err:
        logger.fatal(f"failed to instantiate nsqadmin - {err}")
        sys.exit(1)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        code = runner.run(serve(opts, logger))
    sys.exit(code)


if __name__ == "__main__":
    main()
