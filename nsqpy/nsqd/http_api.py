"""nsqd's HTTP API (spec §3), on the same event loop as the TCP server. Being built."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQDServer


class NSQDHTTPServer:
    def __init__(self, server: NSQDServer) -> None:
        self.server = server

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass
