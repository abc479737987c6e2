"""The ``nsqadmin`` command: parse options, serve the web UI, exit on SIGINT/SIGTERM."""

from __future__ import annotations

from collections.abc import Sequence

from nsqpy.common.aio import stop_on_signals
from nsqpy.common.app import run_server
from nsqpy.common.goflags import OptionsError
from nsqpy.common.log import Logger
from nsqpy.nsqadmin.nsqadmin import NSQAdmin
from nsqpy.nsqadmin.options import Options, parse_nsqadmin_args, validate

__all__ = ["main", "serve"]


async def serve(opts: Options, logger: Logger) -> int:
    """Run nsqadmin until SIGINT or SIGTERM; the exit code."""
    stop = stop_on_signals()  # first: a SIGTERM during start-up still exits gracefully
    admin = NSQAdmin(opts, logger)
    try:
        await admin.start()
    except OptionsError as err:
        logger.fatal(str(err))
        await admin.stop()
        return 1
    await stop.wait()
    await admin.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``nsqadmin`` console script."""
    run_server("nsqadmin", argv, parse_nsqadmin_args, validate, serve)


if __name__ == "__main__":
    main()
