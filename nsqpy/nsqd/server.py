"""nsqd's asyncio side: listeners, the timers that drive the engine, and graceful exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from nsqpy.common.log import Logger
from nsqpy.nsqd.lookup import LookupPeers
from nsqpy.nsqd.metadata import DataDirLock
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.protocol_v2 import ClientV2
from nsqpy.nsqd.statsd import StatsdPusher

if TYPE_CHECKING:
    from nsqpy.nsqd.http_api import NSQDHTTPServer


def split_host_port(address: str) -> tuple[str, int]:
    """Go's net.SplitHostPort for ``host:port`` and ``[v6]:port``; raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, int(port)


def is_unix_address(address: str) -> bool:
    """NSQ treats an address that is not ``host:port`` as a unix socket path."""
    return "/" in address or ":" not in address


def format_address(sock_name: object) -> str:
    if isinstance(sock_name, tuple):
        host, port = sock_name[0], sock_name[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(sock_name)


class NSQDServer:
    """One running nsqd: the engine plus its TCP listener and timers."""

    def __init__(self, opts: Options, logger: Logger | None = None) -> None:
        self.opts = opts
        self.logger = logger or Logger(opts.log_prefix)
        self.nsqd = NSQD(opts, logger=self.logger, use_disk=True)
        self.dir_lock = DataDirLock(self.nsqd.data_path)
        # fsyncs and metadata writes run here, off the event loop
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="nsqd-disk")
        self._sync_timer: asyncio.TimerHandle | None = None
        self.clients: set[ClientV2] = set()
        self._tcp_server: asyncio.Server | None = None
        self._scan_timer: asyncio.TimerHandle | None = None
        self._pending_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tcp_address = ""
        self.http: NSQDHTTPServer | None = None
        self.lookup: LookupPeers | None = None
        self.statsd: StatsdPusher | None = None

    def _run_in_thread(
        self, fn: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        assert self._loop is not None
        future = self._loop.run_in_executor(self._executor, fn)
        future.add_done_callback(lambda f: done(None if f.cancelled() else f.exception()))

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.nsqd.wakeup = self._wakeup
        self.nsqd.run_in_thread = self._run_in_thread
        address = self.opts.tcp_address
        if is_unix_address(address):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
            self._tcp_server = await loop.create_unix_server(self._new_client, address)
        else:
            host, port = split_host_port(address)
            self._tcp_server = await loop.create_server(
                self._new_client, host or None, port, reuse_address=True, backlog=1024
            )
            for sock in self._tcp_server.sockets:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tcp_address = format_address(self._tcp_server.sockets[0].getsockname())
        self.logger.info(f"TCP: listening on {self.tcp_address}")
        self._scan_timer = loop.call_later(self.opts.queue_scan_interval, self._queue_scan)
        self._sync_timer = loop.call_later(self.opts.sync_timeout, self._sync_tick)
        self.nsqd.wakeup()  # topics loaded from nsqd.dat may have a backlog to pump
        self.lookup = LookupPeers(self)
        if self.opts.http_address:
            from nsqpy.nsqd.http_api import NSQDHTTPServer

            self.http = NSQDHTTPServer(self)
            await self.http.start()
        if self.opts.statsd_address:  # Go pushes to statsd whether or not HTTP is on
            self.statsd = StatsdPusher.for_engine(
                self.nsqd, self.opts, self.http.port if self.http is not None else 0, self.logger
            )
            self.statsd.start()
        await self.lookup.start()

    def _new_client(self) -> ClientV2:
        return ClientV2(self.nsqd, self.clients)

    def _wakeup(self) -> None:
        if not self._pending_scheduled and self._loop is not None:
            self._pending_scheduled = True
            self._loop.call_soon(self._run_pending)

    def _run_pending(self) -> None:
        self._pending_scheduled = False
        if self.nsqd.run_pending():
            self._wakeup()

    def _queue_scan(self) -> None:
        assert self._loop is not None
        try:
            self.nsqd.queue_scan()
        finally:
            self._scan_timer = self._loop.call_later(
                self.opts.queue_scan_interval, self._queue_scan
            )

    def _sync_tick(self) -> None:
        assert self._loop is not None
        try:
            self.nsqd.sync_tick()
        finally:
            self._sync_timer = self._loop.call_later(self.opts.sync_timeout, self._sync_tick)

    async def stop(self) -> None:
        """Graceful exit (spec §7.6): stop accepting, close clients, hand queues to the backends."""
        self.logger.info("NSQ: closing")
        if self._tcp_server is not None:
            self._tcp_server.close()
            self.logger.info(f"TCP: closing {self.tcp_address}")
        for client in list(self.clients):
            client.close()
        if self.statsd is not None:
            await self.statsd.stop()
        if self.http is not None:
            await self.http.stop()
        if self.lookup is not None:
            await self.lookup.stop()
        for timer in (self._scan_timer, self._sync_timer):
            if timer is not None:
                timer.cancel()
        self.nsqd.run_in_thread = None  # from here on, disk work runs inline
        self.nsqd.close()
        self._executor.shutdown(wait=True)
        self.dir_lock.unlock()
        if self._tcp_server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp_server.wait_closed(), 1.0)
        if is_unix_address(self.opts.tcp_address):
            with contextlib.suppress(OSError):
                os.unlink(self.opts.tcp_address)
        self.logger.info("NSQ: bye")
