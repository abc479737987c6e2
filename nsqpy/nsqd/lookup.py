"""nsqd's side of discovery: registration with every nsqlookupd (spec §4.2, §7.1). Being built."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQDServer


class LookupPeers:
    """Connections to the --lookupd-tcp-address peers, kept registered."""

    def __init__(self, server: NSQDServer) -> None:
        self.server = server

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def set_addresses(self, addresses: list[str]) -> None:
        """PUT /config/nsqlookupd_tcp_addresses: reconcile the peers live."""
