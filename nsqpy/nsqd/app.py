"""The ``nsqd`` command: parse options, start the server, exit gracefully on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from nsqpy.common.aio import event_loop_factory
from nsqpy.common.goflags import GoFlagsError, OptionsError, exit_on_error, version_string
from nsqpy.common.log import Level, Logger
from nsqpy.nsqd.metadata import MetadataError
from nsqpy.nsqd.options import Options, parse_nsqd_args, validate
from nsqpy.nsqd.server import NSQDServer


def tune_gc() -> None:
    """Queued messages are tuples of bytes and ints, which the collector untracks at
    its first pass over them; collecting the youngest generation less often then
    costs nothing in memory and saves the many small passes a fast publisher causes.
    Everything allocated at start-up is frozen out of later full collections."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


async def serve(
    opts: Options, logger: Logger, ready: Callable[[NSQDServer], Any] | None = None
) -> int:
    # Signals are handled from the very start: a SIGTERM during start-up still exits gracefully.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = NSQDServer(opts, logger)
    try:
        server.dir_lock.lock()
    except MetadataError as err:
        logger.fatal(f"failed to instantiate nsqd - {err}")
        return 1
    try:
        server.nsqd.load_metadata()
    except MetadataError as err:
        logger.fatal(f"failed to load metadata - {err}")
        return 1
    try:
        server.nsqd.persist_metadata_now()
    except OSError as err:
        logger.fatal(f"failed to persist metadata - {err}")
        return 1
    try:
        await server.start()
    except (OSError, ValueError) as err:
        logger.fatal(f"listen ({opts.tcp_address}) failed - {err}")
        return 1
    if ready is not None:
        ready(server)
    tune_gc()
    await stop.wait()
    await server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = parse_nsqd_args(args)
    except GoFlagsError as err:
        exit_on_error(err)
    if result.version:
        print(version_string("nsqd"))
        sys.exit(0)
    opts = result.options
    logger = Logger(opts.log_prefix, Level(int(opts.log_level)))
    try:
        validate(opts)
    except OptionsError as err:
        logger.fatal(f"failed to instantiate nsqd - {err}")
        sys.exit(1)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        code = runner.run(serve(opts, logger))
    sys.exit(code)


if __name__ == "__main__":
    main()
