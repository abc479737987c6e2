import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest


@pytest.fixture
def run() -> Callable[[Awaitable[Any]], Any]:
    """``run(coro)``: run one of events_app's coroutines on a fresh loop, with a deadline."""

    def run(coro: Awaitable[Any], timeout: float = 20.0) -> Any:
        async def main() -> Any:
            return await asyncio.wait_for(coro, timeout)

        return asyncio.run(main())

    return run
