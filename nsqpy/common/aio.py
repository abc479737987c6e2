"""The event loop every nsqpy server runs on, and how it hears SIGINT and SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop where it is installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def on_signals(
    handler: Callable[[], object], signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)
) -> None:
    """Call ``handler`` on the running loop when one of ``signals`` arrives."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, handler)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM.

    Call it before starting anything: a signal that arrives during start-up then
    still ends in a graceful stop, once start-up is over.
    """
    stop = asyncio.Event()
    on_signals(stop.set)
    return stop
