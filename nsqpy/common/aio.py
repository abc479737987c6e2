"""The event loop every nsqpy server runs on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop where it is installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
