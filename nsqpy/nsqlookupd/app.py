"""The ``nsqlookupd`` command: parse options, start the server, exit on SIGINT/SIGTERM."""

from __future__ import annotations

from collections.abc import Sequence

from nsqpy.common.aio import stop_on_signals
from nsqpy.common.app import ListenError, run_server
from nsqpy.common.log import Logger
from nsqpy.nsqlookupd.lookupd import NSQLookupd
from nsqpy.nsqlookupd.options import Options, parse_nsqlookupd_args, validate


async def serve(opts: Options, logger: Logger) -> int:
    """Run nsqlookupd until SIGINT or SIGTERM; returns the exit code."""
    stop = stop_on_signals()  # first: a SIGTERM during start-up still exits gracefully
    lookupd = NSQLookupd(opts, logger)
    try:
        await lookupd.start()
    except ListenError as err:
        # Go's nsqlookupd passes the error as an argument its format has no verb for
        logger.fatal(f"failed to instantiate nsqlookupd%!(EXTRA *errors.errorString={err})")
        return 1
    except (OSError, ValueError) as err:
        logger.fatal(f"failed to instantiate nsqlookupd - {err}")
        return 1
    await stop.wait()
    await lookupd.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``nsqlookupd`` console script."""
    run_server("nsqlookupd", argv, parse_nsqlookupd_args, validate, serve)


if __name__ == "__main__":
    main()
