"""The ``nsqd`` command: parse options, start the server, exit gracefully on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nsqpy.common.aio import stop_on_signals
from nsqpy.common.app import run_server
from nsqpy.common.log import Logger
from nsqpy.nsqd.metadata import MetadataError
from nsqpy.nsqd.options import Options, parse_nsqd_args, validate
from nsqpy.nsqd.server import NSQDServer
from nsqpy.nsqd.tls import TLSConfigError

if TYPE_CHECKING:
    from nsqpy.nsqd.workers import WorkerSetup


def tune_gc() -> None:
    """Queued messages are tuples of bytes and ints, which the collector untracks at
    its first pass over them; collecting the youngest generation less often then
    costs nothing in memory and saves the many small passes a fast publisher causes.
    Everything allocated at start-up is frozen out of later full collections."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


async def serve(
    opts: Options,
    logger: Logger,
    ready: Callable[[NSQDServer], Any] | None = None,
    *,
    worker: WorkerSetup | None = None,
) -> int:
    """Run one nsqd until SIGTERM/SIGINT; its exit status. With ``--workers`` > 1 this is
    one worker (``worker``): the supervisor has done the start-up checks (workers.py)."""
    stop = stop_on_signals()  # first: a SIGTERM during start-up still exits gracefully
    server = NSQDServer(opts, logger, worker=worker)
    if worker is not None:
        server.build_tls()
        server.nsqd.load_metadata(worker.topics, worker.due)
        return await _run(server, stop, ready)
    try:  # Go's nsqd.New: the data dir lock, then the TLS config
        server.dir_lock.lock()
        server.build_tls()
    except (MetadataError, TLSConfigError) as err:
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
    return await _run(server, stop, ready)


async def _run(
    server: NSQDServer, stop: asyncio.Event, ready: Callable[[NSQDServer], Any] | None
) -> int:
    try:
        await server.start()
    except (OSError, ValueError) as err:  # ListenError names the address it could not bind
        server.logger.fatal(f"failed to instantiate nsqd - {err}")
        return 1
    if ready is not None:
        ready(server)
    tune_gc()
    await stop.wait()
    await server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``nsqd`` console script."""
    run_server("nsqd", argv, parse_nsqd_args, validate, serve, supervise=_supervise)


def _supervise(opts: Options, logger: Logger) -> int | None:
    """With ``--workers`` > 1, the supervisor's run (workers.py) and its status; else None."""
    if opts.workers <= 1:
        return None
    from nsqpy.nsqd.workers import run_workers

    return run_workers(opts, logger)


if __name__ == "__main__":
    main()
