"""nsqd inside the test's own event loop: :class:`AsyncNSQD`.

It is the server the ``nsqd`` command runs (:class:`~nsqpy.nsqd.server.NSQDServer`,
started the way :func:`nsqpy.nsqd.app.serve` does), without a process around it: no
interpreter start-up and no imports to pay per server, so a test gets a ready nsqd in
a few milliseconds. It shares the caller's loop, so blocking clients must not be used
against it from that loop's thread; use :class:`~nsqpy.testing.NSQD` for those.

Its loop is the test's, where the clients run too: polling after input (``--idle-poll``)
would only spin it, so it is off unless asked for (``AsyncNSQD(idle_poll="100us")``).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from nsqpy.testing._http import Body, HTTPError, mpub_request, pub_request, stats_path
from nsqpy.testing._process import ServerError, flag_args
from nsqpy.testing._servers import normalize_flags, nsqd_default_flags, with_tls
from nsqpy.testing._tls import TLSFiles

if TYPE_CHECKING:
    import aiohttp

    from nsqpy.nsqd.server import NSQDServer

__all__ = ["AsyncNSQD"]

_open_directories: set[Path] = set()


@atexit.register
def _remove_leftovers() -> None:
    for directory in list(_open_directories):
        shutil.rmtree(directory, ignore_errors=True)


class AsyncNSQD:
    """An nsqd running on the current event loop: ``async with AsyncNSQD() as nsqd: ...``.

    Takes the same arguments as :class:`~nsqpy.testing.NSQD` (nsqd's flags as keywords,
    ``tls=True``) and offers the same addresses and, as coroutines, the same helpers.
    """

    def __init__(
        self, *args: str, directory: Path | str | None = None, tls: bool | TLSFiles = False,
        **flags: object,
    ) -> None:  # fmt: skip
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="nsqpy-nsqd-"))
        if self._own_directory:
            _open_directories.add(self.directory)
        self.args = list(args)
        self.flags: dict[str, object] = {
            **nsqd_default_flags(self.directory),
            **normalize_flags(flags),
        }
        self.tls = with_tls(self.flags, flags, self.directory, tls)
        self.server: NSQDServer | None = None
        """The running :class:`~nsqpy.nsqd.server.NSQDServer` (its engine is ``.nsqd``)."""
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> Self:
        """Build and start the server; raises :class:`ServerError` with nsqd's reason."""
        from nsqpy.common.goflags import GoFlagsError, OptionsError
        from nsqpy.common.log import Level, Logger
        from nsqpy.nsqd.metadata import MetadataError
        from nsqpy.nsqd.options import parse_nsqd_args, validate
        from nsqpy.nsqd.server import NSQDServer
        from nsqpy.nsqd.tls import TLSConfigError

        if self.server is not None:
            return self
        try:
            # the last occurrence of a flag wins: the caller's --idle-poll, if any
            argv = ["--idle-poll=0", *flag_args(self.flags), *self.args]
            opts = parse_nsqd_args(argv).options
            validate(opts)
        except (GoFlagsError, OptionsError) as err:
            raise ServerError(f"nsqd: {err}") from None
        server = NSQDServer(opts, Logger(opts.log_prefix, Level(int(opts.log_level))))
        try:  # as nsqpy.nsqd.app.serve
            server.dir_lock.lock()
            server.build_tls()
            server.nsqd.load_metadata()
            server.nsqd.persist_metadata_now()
            await server.start()
        except (MetadataError, TLSConfigError, OSError, ValueError) as err:
            with contextlib.suppress(Exception):
                await server.stop()
            raise ServerError(f"nsqd did not start: {err}") from err
        self.server = server
        return self

    async def stop(self) -> None:
        """Graceful exit: clients closed, queues handed to disk."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        server, self.server = self.server, None
        if server is not None:
            await server.stop()

    async def restart(self, **flags: object) -> Self:
        """Stop and start again on the same addresses, with the same data directory."""
        if self.server is not None:
            self.flags["tcp_address"] = self.tcp_address
            if self.server.http is not None:
                self.flags["http_address"] = self.server.http.address
                if self.server.http.https_address:
                    self.flags["https_address"] = self.server.http.https_address
            await self.stop()
        self.flags.update(normalize_flags(flags))
        return await self.start()

    async def close(self) -> None:
        """Stop and remove the directory (if it made it)."""
        try:
            await self.stop()
        finally:
            if self._own_directory:
                shutil.rmtree(self.directory, ignore_errors=True)
                _open_directories.discard(self.directory)

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- addresses ----------------------------------------------------------------------------

    def _server(self) -> NSQDServer:
        if self.server is None:
            raise ServerError("nsqd is not running")
        return self.server

    @property
    def tcp_address(self) -> str:
        """``127.0.0.1:<port>`` of the TCP listener."""
        return self._server().tcp_address

    @property
    def http_address(self) -> str:
        """``127.0.0.1:<port>`` of the HTTP listener."""
        http = self._server().http
        if http is None:
            raise ServerError("nsqd has no HTTP listener")
        return http.address

    @property
    def https_address(self) -> str:
        """``127.0.0.1:<port>`` of the HTTPS listener (with ``tls``)."""
        http = self._server().http
        if http is None or not http.https_address:
            raise ServerError("nsqd has no HTTPS listener")
        return http.https_address

    @property
    def url(self) -> str:
        """The HTTP API's base URL."""
        return f"http://{self.http_address}"

    # -- helpers ------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, data: bytes | None = None) -> bytes:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = self.url + path
        async with self._session.request(method, url, data=data) as resp:
            body = await resp.read()
            if resp.status >= 400:
                raise HTTPError(resp.status, url, body.decode("utf-8", "replace"))
            return body

    async def pub(self, topic: str, body: Body, *, defer_ms: int | None = None) -> None:
        """Publish one message over HTTP (``POST /pub``)."""
        await self._request("POST", *pub_request(topic, body, defer_ms))

    async def mpub(self, topic: str, bodies: Iterable[Body]) -> None:
        """Publish several messages at once (``POST /mpub``, binary)."""
        await self._request("POST", *mpub_request(topic, bodies))

    async def stats(self, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
        """``GET /stats?format=json``."""
        import json

        stats: dict[str, Any] = json.loads(await self._request("GET", stats_path(topic, channel)))
        return stats
