"""Go net/http's request size limits (``common/httplimits.py``) on aiohttp's server, for
nsqadmin.

aiohttp limits each line (8190 bytes) and the number of headers (128), and answers 400,
so a 100 KB header Go serves was refused. Here aiohttp's per-line limits are raised to
the whole budget and the number of headers is left to the budget too;
:class:`GoRequestHandler` counts the bytes of each request head as they arrive and
answers 431 as Go does when they exceed it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from nsqpy.common.httplimits import CLOSE_DELAY, MAX_HEADER_BYTES, TOO_LARGE

__all__ = ["GoAppRunner", "GoServer"]

_PARSER_LIMITS: Final = {
    "max_line_size": MAX_HEADER_BYTES,
    "max_field_size": MAX_HEADER_BYTES,
    "max_headers": MAX_HEADER_BYTES // 4,  # the shortest header line, "a:\r\n"
}


class GoRequestHandler(RequestHandler):
    """aiohttp's connection handler with Go's budget on each request head.

    The bytes counted are those received while no request body is being read: from the
    end of one request's body (or the connection's start) to the next request's head
    being parsed. The count may be off by one read at a head/body boundary, as Go's
    bufio slop is."""

    _head_bytes = 0
    _refused = False
    _body: Any = None  # the payload of the last request parsed, until it is complete

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the connection closes
        body = self._body
        if body is None or body.is_eof():
            self._body = None  # not kept past its end
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse()
                return
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._head_bytes = 0
            self._body = self._messages[-1][1] if self._messages else None

    def _refuse(self) -> None:
        # Go's closeWriteAndWait: reply, half-close, and keep reading a while before the
        # close, so that the client reads the 431 rather than a reset.
        self._refused = True
        transport = self.transport
        if transport is None or transport.is_closing():
            self.force_close()
            return
        transport.write(TOO_LARGE)
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(CLOSE_DELAY, self.force_close)


class GoServer(web.Server):
    """``web.Server`` whose connections get :class:`GoRequestHandler` and Go's limits."""

    def __init__(self, handler: Any, **kwargs: Any) -> None:
        super().__init__(handler, **{**_PARSER_LIMITS, **kwargs})

    def __call__(self) -> RequestHandler:
        return GoRequestHandler(self, loop=self._loop, **self._kwargs)


class GoAppRunner(web.AppRunner):
    """``web.AppRunner`` serving its application through a :class:`GoServer`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return GoServer(
            server.request_handler,
            request_factory=server.request_factory,
            loop=server._loop,
            **server._kwargs,
        )
