"""The nsqadmin library object (Go's ``nsqadmin/nsqadmin.go``): options in, a listening
web UI out.  ``app.py`` only parses the command line and runs one of these."""

from __future__ import annotations

import asyncio
import socket
import ssl

from aiohttp import web

from nsqpy.common.app import ListenError
from nsqpy.common.goflags import OptionsError, version_string
from nsqpy.common.gotls import go_client_context
from nsqpy.common.log import Logger
from nsqpy.nsqadmin.clusterinfo import ClusterInfo, HTTPClient
from nsqpy.nsqadmin.golimits import GoAppRunner
from nsqpy.nsqadmin.history import History, Sampler
from nsqpy.nsqadmin.http_api import HTTPServer
from nsqpy.nsqadmin.notify import Notifier
from nsqpy.nsqadmin.options import Options, split_host_port

__all__ = ["NSQAdmin", "client_ssl_context"]


def client_ssl_context(opts: Options) -> ssl.SSLContext | None:
    """The TLS settings of nsqadmin's outbound requests (``--http-client-tls-*``)."""
    if not (
        opts.http_client_tls_insecure_skip_verify
        or opts.http_client_tls_root_ca_file
        or opts.http_client_tls_cert
    ):
        return None
    try:
        ctx = go_client_context(opts.http_client_tls_root_ca_file or None)
    except (OSError, ssl.SSLError) as err:
        raise OptionsError(
            f"failed to read TLS root CA file {opts.http_client_tls_root_ca_file} - {err}"
        ) from None
    if opts.http_client_tls_insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if opts.http_client_tls_cert:
        try:
            ctx.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
        except (OSError, ssl.SSLError) as err:
            raise OptionsError(
                f"failed to LoadX509KeyPair {opts.http_client_tls_cert}, "
                f"{opts.http_client_tls_key} - {err}"
            ) from None
    return ctx


class NSQAdmin:
    """Owns the HTTP listener, the upstream client, the notifier and the history sampler."""

    def __init__(self, opts: Options, logger: Logger) -> None:
        self.opts = opts
        self.log = logger
        self.client = HTTPClient(
            opts.http_client_connect_timeout,
            opts.http_client_request_timeout,
            client_ssl_context(opts),
        )
        self.ci = ClusterInfo(self.client, logger)
        self.notifier = Notifier(opts.notification_http_endpoint, self.client, logger)
        self.history = History(opts.sample_interval, opts.history_duration)
        self.sampler = Sampler(self.ci, self.history, self._addresses, logger)
        self.http = HTTPServer(self)
        self._runner: web.AppRunner | None = None
        self.http_address = ""
        """The address actually listened on (``ip:port``), once started."""

    def _addresses(self) -> tuple[list[str], list[str]]:
        return self.opts.nsqlookupd_http_addresses, self.opts.nsqd_http_addresses

    def _listen(self) -> socket.socket:
        host, port = split_host_port(self.opts.http_address)
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        return sock

    async def start(self) -> None:
        """Listen on ``--http-address`` and start the notifier and the sampler."""
        self.log.info(version_string("nsqadmin"))
        try:
            sock = self._listen()
        except OSError as err:
            failed = ListenError(self.opts.http_address, err)
            raise OptionsError(f"failed to instantiate nsqadmin - {failed}") from None
        except ValueError as err:
            raise OptionsError(f"listen ({self.opts.http_address}) failed - {err}") from None
        self._runner = GoAppRunner(self.http.make_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.SockSite(self._runner, sock)
        await site.start()
        name = sock.getsockname()
        host = f"[{name[0]}]" if ":" in name[0] else name[0]
        self.http_address = f"{host}:{name[1]}"
        self.log.info(f"HTTP: listening on {self.http_address}")
        self.notifier.start()
        self.sampler.start()

    async def stop(self) -> None:
        """Stop listening, flush the queued notifications, close upstream connections."""
        self.log.info("HTTP: closing")
        await self.sampler.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.notifier.close()
        await self.client.close()
        await asyncio.sleep(0)
