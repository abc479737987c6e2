"""Go net/http's request size limits, shared by every nsqpy HTTP server.

Go's ``http.Server`` reads a request's line and headers under one budget,
``DefaultMaxHeaderBytes`` (1 MiB) plus 4096 bytes of bufio slop; past it the client gets
``431 Request Header Fields Too Large`` and the connection is closed. There is no limit of
its own on a header's length, on the number of headers or on the request line. A
slowloris client costs one idle connection and at most the budget in memory.

nsqd and nsqlookupd apply them in their own server (``httpserver.py``); nsqadmin, an
aiohttp application, through ``nsqadmin/golimits.py``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CLOSE_DELAY", "MAX_HEADER_BYTES", "TOO_LARGE"]

MAX_HEADER_BYTES: Final = (1 << 20) + 4096  # http.DefaultMaxHeaderBytes + bufio slop
# Go's reply, byte for byte (net/http server.go, errTooLarge)
TOO_LARGE: Final = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n"
    b"431 Request Header Fields Too Large"
)
CLOSE_DELAY: Final = 0.5  # Go's rstAvoidanceDelay: how long a refused connection is read
