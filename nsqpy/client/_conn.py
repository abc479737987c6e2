"""One client connection to nsqd: handshake, pipelined commands, message frames.

``Conn`` is an :class:`asyncio.Protocol`. Commands that get a reply (IDENTIFY, AUTH, SUB,
PUB, MPUB, DPUB, CLS) queue a future in ``_pending``; nsqd answers in order, so each
response or error frame settles the oldest one. Commands without a reply (RDY, FIN, REQ,
TOUCH, NOP) are only written. Everything written during one ``data_received`` (the FINs a
synchronous handler produces, the NOP answering a heartbeat) goes out in one write at its
end; writes from elsewhere are coalesced until the next turn of the event loop.

Message frames are decoded in ``data_received`` and handed to the owner in one list per
read (``ConnDelegate.on_messages``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol, cast

from nsqpy.client._config import Config
from nsqpy.client._errors import (
    NSQClientError,
    NSQConnectionError,
    NSQError,
    NSQProtocolError,
    NSQTimeoutError,
)
from nsqpy.client._message import Message
from nsqpy.common.gotls import go_client_context
from nsqpy.wire.compression import (
    CompressionError,
    DeflateStreamDecoder,
    DeflateStreamEncoder,
    SnappyStreamDecoder,
    SnappyStreamEncoder,
)
from nsqpy.wire.v2 import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    MESSAGE_FRAME_HEADER,
    encode_auth,
    encode_identify,
)

__all__ = ["Conn", "ConnDelegate", "split_address"]

log = logging.getLogger("nsqpy.client")

_FRAME_HEADER: Final = struct.Struct(">ii")
_MSG_HEADER_END: Final = MESSAGE_FRAME_HEADER.size  # 34: size, type, timestamp, attempts, id
_HEARTBEAT: Final = b"_heartbeat_"
_WATCHDOG_PERIOD: Final = 1.0

Codec = Callable[[bytes], bytes]


class ConnDelegate(Protocol):
    """What a connection tells its owner (the producer or the consumer)."""

    def on_messages(self, conn: Conn, messages: list[Message]) -> None:
        """Messages decoded from one read, in order."""

    def on_response(self, conn: Conn, msg: Message, finished: bool, backoff: bool) -> None:
        """``msg`` was finished (``finished``) or requeued; ``backoff`` asks to slow down."""

    def on_finished(self, conn: Conn, count: int) -> None:
        """``count`` messages were finished at once by :meth:`Conn.finish_all`."""

    def on_close(self, conn: Conn, exc: BaseException | None) -> None:
        """An established connection closed; ``exc`` says why if it was not asked to."""


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"invalid address {address!r}: want host:port")
    return host.strip("[]"), int(port)


def stream_codecs(kind: str, level: int) -> tuple[Codec, Codec]:
    """(decoder, encoder) for the stream compression negotiated in IDENTIFY.

    A decoder takes bytes as they arrive and returns what they complete; an encoder
    compresses what one flush writes, flushed so that nsqd can read it at once.
    """
    if kind == "snappy":
        return SnappyStreamDecoder().decode, SnappyStreamEncoder().encode
    if kind == "deflate":
        return DeflateStreamDecoder().decode, DeflateStreamEncoder(level).encode
    raise NSQClientError(f"unknown stream compression {kind!r}")


class Conn(asyncio.Protocol):
    """A connection to one nsqd; see the module docstring."""

    def __init__(self, address: str, config: Config, delegate: ConnDelegate, prefix: str = ""):
        self.address = address
        self.host, self.port = split_address(address)
        self.config = config
        self.log_prefix = prefix
        self._delegate = delegate
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = 0
        self._transport: asyncio.Transport | None = None
        # Received bytes not parsed yet. While a frame is incomplete, later reads collect
        # in _chunks until _need bytes are there, so a big message is joined only once.
        self._buf = b""
        self._chunks: list[bytes] = []
        self._chunks_len = 0
        self._need = 0
        self._pending: deque[asyncio.Future[bytes]] = deque()
        self._head_since = 0.0
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        self._in_read = False
        # Parsing stops after the next response when TLS or compression may start with
        # the very next byte (IDENTIFY's reply, TLS's OK before compression); the held
        # bytes go through the new decoder on release.
        self._hold_next = False
        self._held = False
        self._held_data: list[bytes] = []
        self._decoder: Codec | None = None
        self._encoder: Codec | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._watchdog: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._read_timeout = 0.0
        self._error: BaseException | None = None
        self._closed_future: asyncio.Future[None] | None = None
        self.established = False
        self.closed = False
        self.failed = False  # a fatal error arrived: closing, not to be used
        self.negotiated: dict[str, Any] = {}
        self.auth: dict[str, Any] | None = None
        # consumer state (the consumer owns the RDY logic)
        self.max_rdy = 2500
        self.rdy = 0
        self.last_rdy_time = 0.0
        self.last_msg_time = 0.0
        self.in_flight = 0
        self.closing = False  # CLS sent: no more RDY
        self.close_when_idle = False  # CLOSE_WAIT received: close at in_flight 0

    def __repr__(self) -> str:
        return f"<Conn {self.address} rdy={self.rdy} in_flight={self.in_flight}>"

    # -- connecting ----------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the TCP connection and do the handshake: magic, IDENTIFY, upgrades, AUTH."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._thread_id = threading.get_ident()
        self._closed_future = loop.create_future()
        cfg = self.config
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: self, self.host, self.port), cfg.dial_timeout
            )
        except TimeoutError:
            raise NSQTimeoutError(f"dial tcp {self.address}: i/o timeout") from None
        except OSError as err:
            raise NSQConnectionError(
                f"dial tcp {self.address}: {err.strerror or err}".lower()
            ) from err
        try:
            await asyncio.wait_for(self._handshake(), max(cfg.reply_timeout, cfg.dial_timeout))
        except TimeoutError:
            self.abort()
            raise NSQTimeoutError(f"({self.address}) timed out in IDENTIFY") from None
        except BaseException:
            self.abort()
            raise
        self.established = True
        self._start_watchdog()

    async def _handshake(self) -> None:
        cfg = self.config
        transport = self._transport
        assert transport is not None
        transport.write(MAGIC_V2)
        self._hold_next = True
        resp = await self.command(encode_identify(cfg.identify_body()))
        if resp != b"OK":
            try:
                self.negotiated = json.loads(resp)
            except ValueError:
                raise NSQProtocolError(f"invalid IDENTIFY response {resp[:100]!r}") from None
        neg = self.negotiated
        self.max_rdy = int(neg.get("max_rdy_count", 2500))
        hb = neg.get("heartbeat_interval", None)
        hb_s = cfg.heartbeat_interval if hb is None else hb / 1000
        self._read_timeout = 0.0 if hb_s < 0 else max(cfg.read_timeout, 2 * hb_s)
        # Each upgrade's OK comes over the upgraded stream: its future is queued first.
        compress = bool(neg.get("snappy") or neg.get("deflate"))
        if neg.get("tls_v1"):
            ok = self._expect_response()
            self._hold_next = compress
            await self._upgrade_tls()
            await self._check_ok(ok, "TLS")
        if compress:
            kind = "snappy" if neg.get("snappy") else "deflate"
            ok = self._expect_response()
            level = int(neg.get("deflate_level", cfg.deflate_level))
            self._decoder, self._encoder = stream_codecs(kind, level)
            await self._check_ok(ok, kind)
        self._hold_next = False
        self._release()
        if neg.get("auth_required"):
            if cfg.auth_secret is None:
                raise NSQClientError(f"({self.address}) nsqd requires AUTH: set auth_secret")
            secret = cfg.auth_secret
            raw = secret.encode() if isinstance(secret, str) else secret
            reply = await self.command(encode_auth(raw))
            try:
                self.auth = json.loads(reply)
            except ValueError:
                raise NSQProtocolError(f"invalid AUTH response {reply[:100]!r}") from None
            log.info(
                "%s(%s) Auth accepted. Identity: %r %s Permissions: %s",
                self.log_prefix,
                self.address,
                self.auth.get("identity"),
                self.auth.get("identity_url"),
                self.auth.get("permission_count"),
            )

    async def _upgrade_tls(self) -> None:
        if self._held_data:
            raise NSQProtocolError("unexpected data before the TLS handshake")
        assert self._loop is not None and self._transport is not None
        cfg = self.config
        ctx = cfg.tls_context or go_client_context()
        self._held = False
        new = await self._loop.start_tls(
            self._transport,
            self,
            ctx,
            server_hostname=cfg.tls_server_hostname or self.host,
            ssl_handshake_timeout=max(cfg.dial_timeout, 5.0),
        )
        if new is None:
            raise NSQConnectionError(f"({self.address}) TLS upgrade failed")
        self._transport = new

    def _expect_response(self) -> asyncio.Future[bytes]:
        assert self._loop is not None
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._pending.append(fut)
        return fut

    async def _check_ok(self, fut: asyncio.Future[bytes], what: str) -> None:
        self._release()
        resp = await fut
        if resp != b"OK":
            raise NSQProtocolError(f"({self.address}) unexpected {what} upgrade reply {resp!r}")

    def _release(self) -> None:
        """Resume parsing after a hold, running the held bytes through a new decoder."""
        if not self._held:
            return
        self._held = False
        data = b"".join(self._held_data)
        self._held_data.clear()
        if data:
            self.data_received(data)

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        if self._loop is not None:
            self._last_read = self._loop.time()

    def data_received(self, data: bytes) -> None:
        if self._held:
            self._held_data.append(data)
            return
        if self._decoder is not None:
            try:
                data = self._decoder(data)
            except CompressionError as err:
                self.abort(NSQProtocolError(f"({self.address}) bad compressed stream - {err}"))
                return
            if not data:
                return
        assert self._loop is not None
        self._last_read = self._loop.time()
        if self._need:
            self._chunks.append(data)
            self._chunks_len += len(data)
            if self._chunks_len < self._need:
                return
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._chunks_len = 0
            self._need = 0
        buf = self._buf + data if self._buf else data
        self._in_read = True
        try:
            self._parse(buf)
        except NSQProtocolError as err:
            self.abort(err)
        finally:
            self._in_read = False
        if self._wbuf:
            self._flush()

    def _parse(self, buf: bytes) -> None:
        n = len(buf)
        pos = 0
        msgs: list[Message] | None = None
        unpack = _FRAME_HEADER.unpack_from
        unpack_msg = MESSAGE_FRAME_HEADER.unpack_from
        timestamp = attempts = 0
        msg_id = b""
        while n - pos >= 8:
            # One unpack per message frame: its 34-byte header (size, type, timestamp,
            # attempts, id) is read whole; for other frames the extra fields go unused.
            if n - pos >= _MSG_HEADER_END:
                size, frame_type, timestamp, attempts, msg_id = unpack_msg(buf, pos)
            else:
                size, frame_type = unpack(buf, pos)
            end = pos + 4 + size
            if end > n:
                break
            if frame_type == FRAME_TYPE_MESSAGE:
                if size < 30:
                    raise NSQProtocolError(f"message frame too short ({size} bytes)")
                msg = Message(msg_id, timestamp, attempts, buf[pos + _MSG_HEADER_END : end], self)
                if msgs is None:
                    msgs = [msg]
                else:
                    msgs.append(msg)
                pos = end
                continue
            if size < 4:
                raise NSQProtocolError(f"invalid frame size {size}")
            if msgs:
                self._deliver(msgs)
                msgs = None
            data = buf[pos + 8 : end]
            pos = end
            if frame_type == FRAME_TYPE_RESPONSE:
                self._on_response(data)
                if self._hold_next and data != _HEARTBEAT:
                    self._hold_next = False
                    self._held = True
                    if pos < n:
                        self._held_data.append(buf[pos:])
                    self._buf = b""
                    return
            elif frame_type == FRAME_TYPE_ERROR:
                self._on_error(data)
            else:
                raise NSQProtocolError(f"unknown frame type {frame_type}")
        if pos < n:
            self._buf = buf[pos:]
            if n - pos >= 8:
                self._need = _FRAME_HEADER.unpack_from(buf, pos)[0] + 4 - (n - pos)
        else:
            self._buf = b""
        if msgs:
            self._deliver(msgs)

    def _deliver(self, msgs: list[Message]) -> None:
        assert self._loop is not None
        self.in_flight += len(msgs)
        self.last_msg_time = self._loop.time()
        self._delegate.on_messages(self, msgs)

    def _on_response(self, data: bytes) -> None:
        if data == _HEARTBEAT:
            log.debug("%s(%s) heartbeat received", self.log_prefix, self.address)
            self._write(b"NOP\n")
            return
        if not self._pending:
            log.warning("%s(%s) unexpected response %r", self.log_prefix, self.address, data[:100])
            return
        fut = self._pending.popleft()
        if self._pending and self._loop is not None:
            self._head_since = self._loop.time()
        if not fut.done():
            fut.set_result(data)

    def _on_error(self, data: bytes) -> None:
        err = NSQError.from_frame(data)
        if not err.fatal:
            log.warning("%s(%s) protocol error - %s", self.log_prefix, self.address, err)
            return
        log.error("%s(%s) protocol error - %s", self.log_prefix, self.address, err)
        self._error = err
        self.failed = True
        if self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(err)
        # nsqd closes the connection after a fatal error; so do we, now.
        if self._transport is not None:
            self._transport.close()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain_waiters()

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._transport = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        cause = self._error or exc
        if self._pending:
            if isinstance(cause, NSQClientError) and not isinstance(cause, NSQError):
                err: NSQClientError = cause
            else:
                err = NSQConnectionError(
                    f"({self.address}) connection closed" + (f" - {cause}" if cause else "")
                )
                err.__cause__ = cause
            pending, self._pending = self._pending, deque()
            for fut in pending:
                if not fut.done():
                    fut.set_exception(err)
                    fut.exception()  # nobody may be waiting (e.g. a CLS): not "never retrieved"
        self._wake_drain_waiters()
        if self._closed_future is not None and not self._closed_future.done():
            self._closed_future.set_result(None)
        if self.established:
            self._delegate.on_close(self, cause)

    # -- writing -------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._wbuf.append(data)
        if not self._flush_scheduled and not self._in_read:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        wbuf = self._wbuf
        if not wbuf:
            return
        data = wbuf[0] if len(wbuf) == 1 else b"".join(wbuf)
        wbuf.clear()
        transport = self._transport
        if transport is None:
            return
        if self._encoder is not None:
            data = self._encoder(data)
        transport.write(data)

    def command(self, data: bytes) -> asyncio.Future[bytes]:
        """Write a command that gets a reply; the future settles with the response data or
        fails with :class:`NSQError` / :class:`NSQConnectionError`."""
        if self._transport is None or self._loop is None:
            raise NSQConnectionError(f"({self.address}) not connected")
        fut: asyncio.Future[bytes] = self._loop.create_future()
        if not self._pending:
            self._head_since = self._loop.time()
        self._pending.append(fut)
        self._write(data)
        return fut

    def send(self, data: bytes) -> None:
        """Write a command that gets no reply (RDY, NOP, ...)."""
        self._write(data)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._write_paused and self._transport is not None and self._loop is not None:
            fut: asyncio.Future[None] = self._loop.create_future()
            self._drain_waiters.append(fut)
            await fut

    @property
    def pending(self) -> int:
        """Commands written and still waiting for their reply."""
        return len(self._pending)

    def send_rdy(self, count: int) -> None:
        assert self._loop is not None
        self.rdy = count
        self.last_rdy_time = self._loop.time()
        self._write(b"RDY %d\n" % count)

    # -- message responses (any thread) ---------------------------------------------------

    def respond(self, msg: Message, finished: bool, delay: float, backoff: bool) -> None:
        """FIN (``finished``) or REQ ``msg``; called by :class:`Message`."""
        if threading.get_ident() != self._thread_id:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self.respond, msg, finished, delay, backoff)
            return
        self.in_flight -= 1
        if finished:
            self._write(b"FIN " + msg.id + b"\n")
        else:
            if delay < 0:
                cfg = self.config
                delay = min(cfg.default_requeue_delay * msg.attempts, cfg.max_requeue_delay)
            self._write(b"REQ %s %d\n" % (msg.id, int(delay * 1000)))
        self._delegate.on_response(self, msg, finished, backoff)
        if self.close_when_idle and self.in_flight <= 0:
            self.close()

    def finish_all(self, msgs: list[Message]) -> None:
        """FIN, in one write, every message of ``msgs`` that has not been responded to and
        whose auto-response is on (the consumer's auto-finish; event loop thread only)."""
        ids = []
        for msg in msgs:
            if msg._auto and not msg._responded:
                msg._responded = True
                ids.append(msg.id)
        if not ids:
            return
        self.in_flight -= len(ids)
        self._write(b"FIN " + b"\nFIN ".join(ids) + b"\n")
        self._delegate.on_finished(self, len(ids))
        if self.close_when_idle and self.in_flight <= 0:
            self.close()

    def touch(self, msg: Message) -> None:
        """TOUCH ``msg``; called by :class:`Message`."""
        if threading.get_ident() != self._thread_id:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self.touch, msg)
            return
        self._write(b"TOUCH " + msg.id + b"\n")

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what is queued and close the connection."""
        if self._transport is not None:
            self._flush()
            if self._transport is not None:
                self._transport.close()

    def abort(self, exc: BaseException | None = None) -> None:
        """Drop the connection now."""
        if exc is not None and self._error is None:
            self._error = exc
        if self._transport is not None:
            self._transport.abort()
        elif not self.closed:
            self.connection_lost(None)

    async def wait_closed(self) -> None:
        if self._closed_future is not None:
            await asyncio.shield(self._closed_future)

    def _start_watchdog(self) -> None:
        assert self._loop is not None
        self._watchdog = self._loop.call_later(_WATCHDOG_PERIOD, self._check)

    def _check(self) -> None:
        """Read timeout (nothing, not even a heartbeat, for too long) and reply timeout."""
        self._watchdog = None
        if self.closed or self._loop is None:
            return
        now = self._loop.time()
        if self._read_timeout and now - self._last_read > self._read_timeout:
            log.error(
                "%s(%s) read timeout: nothing for %.1fs",
                self.log_prefix,
                self.address,
                now - self._last_read,
            )
            self.abort(NSQTimeoutError(f"({self.address}) read timeout"))
            return
        if self._pending and now - self._head_since > self.config.reply_timeout:
            log.error(
                "%s(%s) no reply for %.1fs", self.log_prefix, self.address, now - self._head_since
            )
            self.abort(NSQTimeoutError(f"({self.address}) timed out waiting for a reply"))
            return
        self._watchdog = self._loop.call_later(_WATCHDOG_PERIOD, self._check)
