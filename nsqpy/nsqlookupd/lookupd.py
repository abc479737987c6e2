"""One running nsqlookupd: the registration DB and its TCP and HTTP listeners.

Go's ``nsqlookupd/nsqlookupd.go``. :meth:`NSQLookupd.start` listens on both
addresses (a failure raises ``OSError``/``ValueError``) and logs
``TCP: listening on <ip>:<port>`` and ``HTTP: listening on <ip>:<port>`` with the
real ports; :meth:`NSQLookupd.stop` closes listeners and connections.
"""

from __future__ import annotations

import asyncio
import socket

from nsqpy.common.app import ListenError
from nsqpy.common.goflags import version_string
from nsqpy.common.log import Logger
from nsqpy.common.net import format_address, split_host_port
from nsqpy.nsqlookupd.http_api import LookupdHTTPServer
from nsqpy.nsqlookupd.options import Options
from nsqpy.nsqlookupd.registration_db import RegistrationDB
from nsqpy.nsqlookupd.tcp import LookupProtocolV1

__all__ = ["NSQLookupd"]


class NSQLookupd:
    """The discovery service: nsqds register over TCP, clients look up over HTTP."""

    def __init__(self, opts: Options, logger: Logger | None = None) -> None:
        self.opts = opts
        self.logger = logger or Logger(opts.log_prefix, opts.log_level)
        self.db = RegistrationDB()
        self.hostname = socket.gethostname()
        self.clients: set[LookupProtocolV1] = set()
        self.tcp_address = ""
        self.tcp_port = 0
        self.http = LookupdHTTPServer(self)
        self._tcp_server: asyncio.Server | None = None

    @property
    def http_address(self) -> str:
        """The HTTP listener's ``ip:port`` once started."""
        return self.http.address

    @property
    def http_port(self) -> int:
        """The HTTP listener's real port (the IDENTIFY reply's ``http_port``)."""
        return self.http.port

    async def start(self) -> None:
        """Listen on --tcp-address and --http-address; raises OSError or ValueError."""
        self.logger.info(version_string("nsqlookupd"))
        loop = asyncio.get_running_loop()
        tcp_host, tcp_port = split_host_port(self.opts.tcp_address)
        http_host, http_port = split_host_port(self.opts.http_address)
        try:
            self._tcp_server = await loop.create_server(
                lambda: LookupProtocolV1(self), tcp_host or None, tcp_port, reuse_address=True
            )
        except OSError as err:
            raise ListenError(self.opts.tcp_address, err) from None
        sock_name = self._tcp_server.sockets[0].getsockname()
        self.tcp_address = format_address(sock_name)
        self.tcp_port = int(sock_name[1])
        self.logger.info(f"TCP: listening on {self.tcp_address}")
        try:
            try:
                await self.http.start(http_host or None, http_port)
            except OSError as err:
                raise ListenError(self.opts.http_address, err) from None
        except BaseException:
            self._tcp_server.close()
            self._tcp_server = None
            raise

    async def stop(self) -> None:
        """Go's ``Exit``: close the TCP listener, every nsqd connection, then HTTP."""
        if self._tcp_server is not None:
            self._tcp_server.close()
            self.logger.info(f"TCP: closing {self.tcp_address}")
        for client in list(self.clients):
            client.close()
        await self.http.stop()
        if self._tcp_server is not None:
            try:
                await asyncio.wait_for(self._tcp_server.wait_closed(), 1.0)
            except (TimeoutError, OSError):
                pass
            self._tcp_server = None
