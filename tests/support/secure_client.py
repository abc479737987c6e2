"""A :class:`RawClient` that follows IDENTIFY's upgrades (spec §2.4): TLS, snappy, deflate.

``negotiate()`` sends IDENTIFY with ``feature_negotiation``, reads the JSON reply in the
clear, then performs each upgrade the server granted, in Go's order (TLS, snappy,
deflate), reading the ``OK`` that acknowledges each one in the new framing. After that
``send`` and every ``read_*`` of RawClient go through the negotiated layers.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from nsqpy.wire.compression import (
    DeflateStreamDecoder,
    DeflateStreamEncoder,
    SnappyStreamDecoder,
    SnappyStreamEncoder,
)
from nsqpy.wire.v2 import FRAME_TYPE_RESPONSE, MAGIC_V2, FrameParser, encode_command
from tests.support.rawclient import Frame, RawClient


class SecureClient(RawClient):
    def __init__(
        self,
        address: str,
        *,
        timeout: float = 5.0,
        magic: bytes | None = MAGIC_V2,
    ) -> None:
        self.host = address.rpartition(":")[0].strip("[]")
        self._encode: Callable[[bytes], bytes] | None = None
        self._decode: Callable[[bytes], bytes] | None = None
        self.reply: dict[str, Any] = {}
        super().__init__(address, timeout=timeout, magic=magic)

    # -- I/O through the negotiated layers ---------------------------------------------------

    def send(self, data: bytes) -> None:
        if self._encode is not None:
            data = self._encode(data)
        self.sock.sendall(data)

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are, past the compression layer (to send a corrupt stream)."""
        self.sock.sendall(data)

    def _recv(self, deadline: float, size: int = 65536) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from nsqd in time")
        self.sock.settimeout(remaining)
        try:
            return self.sock.recv(size)
        except TimeoutError:
            raise TimeoutError("no frame from nsqd in time") from None
        except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return b""

    def _fill(self, deadline: float) -> bool:
        data = self._recv(deadline)
        if not data:
            self._eof = True
            return False
        if self._decode is not None:
            data = self._decode(data)
        self._frames.extend(Frame(t, d) for t, d in self._parser.feed(data))
        return True

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        """Exactly n bytes off the socket: nothing of the next framing is read too."""
        buf = b""
        while len(buf) < n:
            data = self._recv(deadline, n - len(buf))
            if not data:
                raise ConnectionError("nsqd closed the connection")
            buf += data
        return buf

    def read_clear_frame(self, timeout: float | None = None) -> Frame:
        """One frame read byte-exactly from the socket, bypassing buffering and codecs."""
        assert not self._frames, self._frames
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        header = self._recv_exact(8, deadline)
        size = int.from_bytes(header[:4], "big")
        frame_type = int.from_bytes(header[4:], "big")
        return Frame(frame_type, self._recv_exact(size - 4, deadline))

    # -- IDENTIFY and its upgrades -------------------------------------------------------------

    def negotiate(
        self,
        *,
        tls: ssl.SSLContext | None = None,
        snappy: bool = False,
        deflate: bool = False,
        **fields: Any,
    ) -> Frame | dict[str, Any]:
        """IDENTIFY with feature negotiation and every granted upgrade; returns the JSON
        reply, or the error frame if IDENTIFY failed."""
        body = {"feature_negotiation": True, "tls_v1": tls is not None, "snappy": snappy}
        body.update({"deflate": deflate, **fields})
        self.sock.sendall(encode_command(b"IDENTIFY", body=json.dumps(body).encode()))
        frame = self.read_clear_frame()
        if frame.type != FRAME_TYPE_RESPONSE:
            return frame
        reply: dict[str, Any] = json.loads(frame.data)
        self.reply = reply
        if reply["tls_v1"]:
            assert tls is not None
            self.upgrade_tls(tls)
        if reply["snappy"]:
            self._encode = SnappyStreamEncoder().encode
            self._decode = SnappyStreamDecoder().decode
            self.expect_response(b"OK")
        if reply["deflate"]:
            self._encode = DeflateStreamEncoder(reply["deflate_level"]).encode
            self._decode = DeflateStreamDecoder().decode
            self.expect_response(b"OK")
        return reply

    def upgrade_tls(self, ctx: ssl.SSLContext) -> None:
        """TLS client handshake on the connection, then the server's OK over TLS."""
        sock = self.sock
        sock.settimeout(self.timeout)
        self.sock = ctx.wrap_socket(sock, server_hostname=self.host)
        self._parser = FrameParser()
        ok = self.read_clear_frame()
        assert ok == Frame(FRAME_TYPE_RESPONSE, b"OK"), ok

    @property
    def ssl_version(self) -> str | None:
        return self.sock.version() if isinstance(self.sock, ssl.SSLSocket) else None


def client_context(
    ca_path: str | None,
    *,
    cert: tuple[str, str] | None = None,
    max_version: ssl.TLSVersion | None = None,
) -> ssl.SSLContext:
    """A client-side context trusting ``ca_path``, optionally with a client certificate."""
    ctx = ssl.create_default_context(cafile=ca_path)
    if ca_path is None:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(*cert)
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def is_socket_error(err: BaseException) -> bool:
    return isinstance(err, ssl.SSLError | ConnectionError | socket.timeout | OSError)
