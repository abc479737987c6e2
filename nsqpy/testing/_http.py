"""The HTTP requests behind the fixtures' ``pub``/``mpub``/``stats`` helpers.

Request building is pure (:func:`pub_request`, :func:`mpub_request`, :func:`stats_path`)
so that the blocking helpers (urllib, for :class:`~nsqpy.testing.NSQD`) and the async
ones (aiohttp, for :class:`~nsqpy.testing.AsyncNSQD`) send the same bytes.
"""

from __future__ import annotations

import json
import ssl
import struct
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

__all__ = ["HTTPError", "get_json", "mpub_request", "post", "pub_request", "stats_path"]

Body = bytes | str


class HTTPError(AssertionError):
    """nsqd or nsqlookupd answered with an error status; the text is NSQ's error body."""

    def __init__(self, status: int, url: str, body: str) -> None:
        super().__init__(f"{status} from {url}: {body}")
        self.status = status
        self.body = body


def _bytes(body: Body) -> bytes:
    return body.encode() if isinstance(body, str) else body


def pub_request(topic: str, body: Body, defer_ms: int | None = None) -> tuple[str, bytes]:
    """``POST /pub``'s path and body (``defer_ms`` → ``&defer=``)."""
    query = {"topic": topic} if defer_ms is None else {"topic": topic, "defer": str(defer_ms)}
    return f"/pub?{urlencode(query)}", _bytes(body)


def mpub_request(topic: str, bodies: Iterable[Body]) -> tuple[str, bytes]:
    """``POST /mpub?binary=true``'s path and body: any bytes, newlines included."""
    encoded = [_bytes(b) for b in bodies]
    parts = [struct.pack(">I", len(encoded))]
    for body in encoded:
        parts += (struct.pack(">I", len(body)), body)
    return f"/mpub?{urlencode({'topic': topic, 'binary': 'true'})}", b"".join(parts)


def stats_path(topic: str | None = None, channel: str | None = None) -> str:
    """``GET /stats?format=json``, narrowed to ``topic`` (and ``channel``) if given."""
    query = {"format": "json"}
    if topic is not None:
        query["topic"] = topic
    if channel is not None:
        query["channel"] = channel
    return f"/stats?{urlencode(query)}"


def _request(
    url: str, data: bytes | None, method: str, context: ssl.SSLContext | None, timeout: float
) -> bytes:
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as err:
        raise HTTPError(err.code, url, err.read().decode("utf-8", "replace")) from None


def post(
    url: str, data: bytes = b"", *, context: ssl.SSLContext | None = None, timeout: float = 10.0
) -> bytes:
    """POST ``data`` to ``url``; the response body, or :class:`HTTPError`."""
    return _request(url, data, "POST", context, timeout)


def get_json(url: str, *, context: ssl.SSLContext | None = None, timeout: float = 10.0) -> Any:
    """GET ``url`` and decode its JSON body, or :class:`HTTPError`."""
    return json.loads(_request(url, None, "GET", context, timeout))
