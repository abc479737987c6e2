"""nsqd's asyncio side: listeners, the timers that drive the engine, and graceful exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from nsqpy.common.app import ListenError
from nsqpy.common.idlepoll import IdlePoll
from nsqpy.common.log import Logger
from nsqpy.common.net import format_address, is_unix_address, split_host_port
from nsqpy.nsqd.auth import AuthClient
from nsqpy.nsqd.lookup import LookupPeers
from nsqpy.nsqd.metadata import DataDirLock
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options, resolve_listeners
from nsqpy.nsqd.protocol_v2 import ClientV2
from nsqpy.nsqd.tls import build_client_tls_context, build_tls_context

if TYPE_CHECKING:
    from nsqpy.nsqd.http_api import NSQDHTTPServer
    from nsqpy.nsqd.stats import Stats
    from nsqpy.nsqd.statsd import StatsdPusher
    from nsqpy.nsqd.workers import WorkerSetup


class NSQDServer:
    """One running nsqd: the engine plus its TCP listener and timers."""

    def __init__(
        self, opts: Options, logger: Logger | None = None, worker: WorkerSetup | None = None
    ) -> None:
        """``worker``: this nsqd is one of ``--workers`` processes (workers.py)."""
        self.opts = opts
        self.logger = logger or Logger(opts.log_prefix)
        self.nsqd = NSQD(opts, logger=self.logger, use_disk=True)
        self.dir_lock = DataDirLock(self.nsqd.data_path)
        self.worker = worker
        self.background: set[asyncio.Task[None]] = set()
        if worker is not None:
            from nsqpy.nsqd.workers import attach

            attach(self, worker)
        # fsyncs and metadata writes run here, off the event loop
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="nsqd-disk")
        self._sync_timer: asyncio.TimerHandle | None = None
        self.clients: set[ClientV2] = set()
        self._tcp_server: asyncio.Server | None = None
        self._scan_timer: asyncio.TimerHandle | None = None
        self._pending_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tcp_address = ""
        # Go's tlsConfig (TCP tls_v1 upgrades and HTTPS) and the auth server client.
        self.tls_context: ssl.SSLContext | None = None
        self.authd: AuthClient | None = None
        self.http: NSQDHTTPServer | None = None
        self.lookup: LookupPeers | None = None
        self.statsd: StatsdPusher | None = None

    def _run_in_thread(
        self, fn: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        assert self._loop is not None
        future = self._loop.run_in_executor(self._executor, fn)
        future.add_done_callback(lambda f: done(None if f.cancelled() else f.exception()))

    def build_tls(self) -> None:
        """Go's buildTLSConfig, part of nsqd.New; raises TLSConfigError."""
        self.tls_context = build_tls_context(self.opts)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.nsqd.wakeup = self._wakeup
        if self.opts.idle_poll > 0:
            self.nsqd.input_seen = IdlePoll(loop, self.opts.idle_poll).input
        self.nsqd.run_in_thread = self._run_in_thread
        opts = self.opts
        if self.tls_context is None:
            self.build_tls()
        if opts.auth_http_addresses:
            self.authd = AuthClient(
                opts.auth_http_addresses,
                method=opts.auth_http_request_method,
                connect_timeout=opts.http_client_connect_timeout,
                request_timeout=opts.http_client_request_timeout,
                tls_context=build_client_tls_context(opts),
            )
        try:
            self._tcp_server = await self._listen_tcp(loop, self.opts.tcp_address)
        except OSError as err:
            raise ListenError(self.opts.tcp_address, err) from None
        self.tcp_address = format_address(self._tcp_server.sockets[0].getsockname())
        self._scan_timer = loop.call_later(self.opts.queue_scan_interval, self._queue_scan)
        self._sync_timer = loop.call_later(self.opts.sync_timeout, self._sync_tick)
        self.nsqd.wakeup()  # topics loaded from nsqd.dat may have a backlog to pump
        self.lookup = LookupPeers(self)
        if self.worker is not None:
            from nsqpy.nsqd import workers

            assert self.nsqd.shards is not None
            self.nsqd.shards.start()
            workers.tie_lookup(self, self.worker)
        if self.opts.http_address:
            from nsqpy.nsqd.http_api import NSQDHTTPServer

            self.http = NSQDHTTPServer(self)
            await self.http.start()
        resolve_listeners(
            self.opts,
            0 if is_unix_address(self.opts.tcp_address) else split_host_port(self.tcp_address)[1],
            self.http.port if self.http is not None else 0,
        )
        worker0 = self.worker is None or self.worker.index == 0
        if self.opts.statsd_address and worker0:  # Go pushes whether or not HTTP is on
            from nsqpy.nsqd.statsd import StatsdPusher  # loaded only when configured

            self.statsd = StatsdPusher.for_engine(
                self.nsqd,
                self.opts,
                self.http.port if self.http is not None else 0,
                self.logger,
                None if self.worker is None else self._all_workers_stats,
            )
            self.statsd.start()
        await self.lookup.start()
        # Clients come in only now, so that a topic they create finds the lookupd peers
        # started (and gets the channels nsqlookupd knows of).
        await self._tcp_server.start_serving()
        if self.worker is not None:  # the supervisor logs it once every worker serves
            from nsqpy.nsqd.workers import after_start

            after_start(self, self.worker)
        else:
            self.logger.info(f"TCP: listening on {self.tcp_address}")

    async def _all_workers_stats(self) -> Stats:
        """--workers: what worker 0 pushes to statsd for the whole node."""
        from nsqpy.nsqd.workers import gather_stats

        return (await gather_stats(self, "", "", False))[0]

    async def _listen_tcp(self, loop: asyncio.AbstractEventLoop, address: str) -> asyncio.Server:
        """The TCP protocol's listener on ``address`` (``host:port`` or a unix socket path)."""
        if self.worker is not None:  # the supervisor's listener, shared by every worker
            sock = self.worker.tcp
            if sock.family == socket.AF_UNIX:
                return await loop.create_unix_server(
                    self.new_client, sock=sock, start_serving=False
                )
            return await loop.create_server(self.new_client, sock=sock, start_serving=False)
        if is_unix_address(address):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
            return await loop.create_unix_server(self.new_client, address, start_serving=False)
        host, port = split_host_port(address)
        server = await loop.create_server(
            self.new_client,
            host or None,
            port,
            reuse_address=True,
            backlog=1024,
            start_serving=False,
        )
        for sock in server.sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return server

    def new_client(self) -> ClientV2:
        return ClientV2(self.nsqd, self.clients, tls_context=self.tls_context, authd=self.authd)

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
        if self.nsqd.shards is not None:
            self.nsqd.shards.closing = True  # the other workers are exiting too
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
        if self.nsqd.shards is not None:
            self.nsqd.shards.close()
        if self.authd is not None:
            await self.authd.close()
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
