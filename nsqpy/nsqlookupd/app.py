"""The ``nsqlookupd`` command: parse options, start the server, exit on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

from nsqpy.common.aio import event_loop_factory
from nsqpy.common.goflags import GoFlagsError, OptionsError, exit_on_error, version_string
from nsqpy.common.log import Level, Logger
from nsqpy.nsqlookupd.lookupd import NSQLookupd
from nsqpy.nsqlookupd.options import Options, parse_nsqlookupd_args, validate


async def serve(opts: Options, logger: Logger) -> int:
    """Run nsqlookupd until SIGINT or SIGTERM; returns the exit code."""
    lookupd = NSQLookupd(opts, logger)
    try:
        await lookupd.start()
    except (OSError, ValueError) as err:
        logger.fatal(f"failed to instantiate nsqlookupd - {err}")
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await lookupd.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``nsqlookupd`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = parse_nsqlookupd_args(args)
    except GoFlagsError as err:
        exit_on_error(err)
    if result.version:
        print(version_string("nsqlookupd"))
        sys.exit(0)
    opts = result.options
    logger = Logger(opts.log_prefix, Level(int(opts.log_level)))
    try:
        validate(opts)
    except OptionsError as err:
        logger.fatal(f"failed to instantiate nsqlookupd - {err}")
        sys.exit(1)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        code = runner.run(serve(opts, logger))
    sys.exit(code)


if __name__ == "__main__":
    main()
