"""Thin synchronous V2 connections for the connector's tasks, on the pure codec.

Why not :mod:`nsqpy.client`: a read task needs exact control that a general consumer hides on
purpose: a fixed ``RDY`` per connection that is never topped up (RDY caps in-flight, so a task
can never receive more than its quota), no FIN until the messages are in the write-ahead log,
FINs sent on the very connection that received the message, and proof that nsqd applied them
(half-close, then EOF; ``E_FIN_FAILED <id>`` arrives before it). The client's blocking wrappers
also run an event loop thread per instance, which buys nothing in a short-lived task. The sink
needs a bounded window of pipelined MPUBs with one ``OK`` each. Both fit in a few methods over
a blocking socket.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from nsqpy.spark._options import split_host_port
from nsqpy.wire.v2 import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    MAGIC_V2,
    encode_identify,
    encode_rdy,
    encode_sub,
)

__all__ = [
    "Columns",
    "ConsumerConnection",
    "NSQConnectionError",
    "NSQErrorFrame",
    "Publisher",
]

_FRAME = struct.Struct(">ii")
# size, frame type, then the message header: timestamp (ns), attempts, 16-byte id.
_MESSAGE = struct.Struct(">iiqH16s")
_RECV_SIZE: Final = 1 << 20
_HEARTBEAT: Final = b"_heartbeat_"
_NON_FATAL: Final = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")
USER_AGENT: Final = "nsqpy-spark/0.1.0"


class NSQConnectionError(Exception):
    """The connection to nsqd failed or closed unexpectedly."""


class NSQErrorFrame(Exception):
    """nsqd answered with a (fatal) error frame ``"<E_CODE> <description>"``."""

    def __init__(self, address: str, text: bytes) -> None:
        super().__init__(f"{address}: {text.decode('utf-8', 'replace')}")
        self.text = text


class Columns:
    """The messages a read task keeps, as column lists ready for Arrow."""

    __slots__ = ("attempts", "bodies", "ids", "timestamps")

    def __init__(self) -> None:
        self.ids: list[bytes] = []
        self.timestamps: list[int] = []
        self.attempts: list[int] = []
        self.bodies: list[bytes] = []

    def __len__(self) -> int:
        return len(self.ids)


class _Connection:
    """A blocking socket speaking V2 (magic sent), with a frame buffer."""

    def __init__(self, address: str, timeout: float) -> None:
        host, port = split_host_port(address)
        self.address = address
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as err:
            raise NSQConnectionError(f"{address}: connect: {err}") from err
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self._buf = b""
        # A read task's keepalive thread sends too (TOUCH, NOP).
        self._send_lock = threading.Lock()
        self.send(MAGIC_V2)

    def send(self, data: bytes) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError as err:
            raise NSQConnectionError(f"{self.address}: send: {err}") from err

    def recv(self) -> bytes:
        """Bytes from nsqd (``b""`` at EOF); blocks up to the socket timeout."""
        try:
            return self.sock.recv(_RECV_SIZE)
        except TimeoutError:
            raise NSQConnectionError(f"{self.address}: no reply within the timeout") from None
        except OSError as err:
            raise NSQConnectionError(f"{self.address}: recv: {err}") from err

    def read_response(self) -> bytes:
        """The next response frame's data, answering heartbeats; error frames raise.

        Only for the command/reply phase, before any message can arrive.
        """
        while True:
            buf = self._buf
            if len(buf) >= 8:
                size, frame_type = _FRAME.unpack_from(buf)
                end = 4 + size
                if len(buf) >= end:
                    data = buf[8:end]
                    self._buf = buf[end:]
                    if frame_type == FRAME_TYPE_ERROR:
                        raise NSQErrorFrame(self.address, data)
                    if data == _HEARTBEAT:
                        self.send(b"NOP\n")
                        continue
                    return data
            chunk = self.recv()
            if not chunk:
                raise NSQConnectionError(f"{self.address}: connection closed by nsqd")
            self._buf += chunk

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class ConsumerConnection(_Connection):
    """One subscribed connection of a read task (see :mod:`nsqpy.spark._task`).

    ``feed`` parses what nsqd sent: kept messages go to the shared :class:`Columns` and their
    ids to :attr:`ids` (they are FIN'd on this connection later); known redeliveries are FIN'd
    at once and dropped; once :attr:`accepting` is off, messages go to :attr:`late`.
    """

    def __init__(self, address: str, timeout: float) -> None:
        super().__init__(address, timeout)
        self.ids: list[bytes] = []
        self.late: list[bytes] = []
        self.fin_failed: list[bytes] = []
        self.dropped = 0
        self.accepting = True
        self.close_wait = False
        self.eof = False
        self.identity: dict[str, Any] = {}
        self._out: list[bytes] = []

    def send_subscribe(
        self,
        topic: str,
        channel: str,
        *,
        msg_timeout_ms: int,
        output_buffer_timeout_ms: int,
        output_buffer_size: int = 0,
    ) -> None:
        """Send IDENTIFY (feature negotiation) and SUB; :meth:`await_subscribed` reads the
        replies, so that many connections can subscribe at once."""
        identify: dict[str, Any] = {
            "client_id": socket.gethostname(),
            "hostname": socket.gethostname(),
            "user_agent": USER_AGENT,
            "feature_negotiation": True,
            "output_buffer_timeout": output_buffer_timeout_ms,
        }
        if msg_timeout_ms:
            identify["msg_timeout"] = msg_timeout_ms
        if output_buffer_size:
            identify["output_buffer_size"] = output_buffer_size
        self.send(encode_identify(identify) + encode_sub(topic, channel))

    def await_subscribed(self) -> dict[str, Any]:
        """nsqd's IDENTIFY reply, once SUB was acknowledged."""
        reply = self.read_response()
        try:
            self.identity = dict(json.loads(reply)) if reply != b"OK" else {}
        except ValueError:
            raise NSQConnectionError(
                f"{self.address}: bad IDENTIFY reply {reply[:100]!r}"
            ) from None
        sub = self.read_response()
        if sub != b"OK":
            raise NSQConnectionError(f"{self.address}: unexpected SUB reply {sub[:100]!r}")
        return self.identity

    def subscribe(
        self,
        topic: str,
        channel: str,
        *,
        msg_timeout_ms: int,
        output_buffer_timeout_ms: int,
        output_buffer_size: int = 0,
    ) -> dict[str, Any]:
        """IDENTIFY and SUB; returns nsqd's IDENTIFY reply."""
        self.send_subscribe(
            topic,
            channel,
            msg_timeout_ms=msg_timeout_ms,
            output_buffer_timeout_ms=output_buffer_timeout_ms,
            output_buffer_size=output_buffer_size,
        )
        return self.await_subscribed()

    def ready(self, count: int) -> None:
        self.send(encode_rdy(count))

    def feed(self, data: bytes, cols: Columns, is_duplicate: Callable[[bytes], bool]) -> int:
        """Parse ``data``; returns the number of messages kept."""
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        before = len(cols.ids)
        unpack_frame = _FRAME.unpack_from
        unpack_message = _MESSAGE.unpack_from
        ids = self.ids
        cids = cols.ids
        timestamps = cols.timestamps
        attempts = cols.attempts
        bodies = cols.bodies
        while n - pos >= 8:
            if n - pos >= 34:  # room for a message header: one unpack for frame and header
                size, frame_type, ts, att, msg_id = unpack_message(buf, pos)
            else:
                size, frame_type = unpack_frame(buf, pos)
            end = pos + 4 + size
            if end > n:
                break
            if frame_type == FRAME_TYPE_MESSAGE:
                if not self.accepting:
                    self.late.append(msg_id)
                elif att > 1 and is_duplicate(msg_id):
                    self._out.append(b"FIN " + msg_id + b"\n")
                    self.dropped += 1
                else:
                    ids.append(msg_id)
                    cids.append(msg_id)
                    timestamps.append(ts)
                    attempts.append(att)
                    bodies.append(buf[pos + 34 : end])
            else:
                self._frame(frame_type, buf[pos + 8 : end])
            pos = end
        self._buf = buf[pos:] if pos < n else b""
        return len(cols.ids) - before

    def _frame(self, frame_type: int, data: bytes) -> None:
        if frame_type == FRAME_TYPE_ERROR:
            if data.startswith(_NON_FATAL):
                if data.startswith(b"E_FIN_FAILED"):
                    parts = data.split(b" ")
                    if len(parts) > 2:
                        self.fin_failed.append(parts[2])
                return
            raise NSQErrorFrame(self.address, data)
        if data == _HEARTBEAT:
            self._out.append(b"NOP\n")
        elif data == b"CLOSE_WAIT":
            self.close_wait = True

    def flush(self) -> None:
        """Send the queued NOPs and FINs of dropped redeliveries."""
        if self._out:
            out = b"".join(self._out)
            self._out.clear()
            self.send(out)

    def pump(self, cols: Columns, is_duplicate: Callable[[bytes], bool]) -> int:
        """One ``recv`` (the socket is readable) fed to :meth:`feed`; sets :attr:`eof`."""
        data = self.recv()
        if not data:
            self.eof = True
            return 0
        kept = self.feed(data, cols, is_duplicate)
        if self._out:
            self.flush()
        return kept

    def start_close(self) -> None:
        """CLS: nsqd stops delivering (RDY 0) and answers CLOSE_WAIT."""
        self.send(b"CLS\n")

    def keepalive(self, touch: bool) -> None:
        """From the keepalive thread: a NOP, and TOUCH of every kept message if ``touch``."""
        lines = [b"TOUCH " + i + b"\n" for i in list(self.ids)] if touch else []
        lines.append(b"NOP\n")
        self.send(b"".join(lines))

    def send_finish(self) -> None:
        """FIN every kept message, REQ late ones, then half-close (see :meth:`read_closing`).

        nsqd handles one connection's commands in order and closes after the EOF, so reading
        EOF proves every FIN was applied; failures (``E_FIN_FAILED <id>``) arrive before it, in
        :attr:`fin_failed`.
        """
        self.accepting = False
        lines = [b"FIN " + i + b"\n" for i in self.ids]
        lines.extend(b"REQ " + i + b" 0\n" for i in self.late)
        self.late.clear()
        self.flush()
        if lines:
            self.send(b"".join(lines))
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as err:
            raise NSQConnectionError(f"{self.address}: shutdown: {err}") from err

    def read_closing(self, is_duplicate: Callable[[bytes], bool]) -> None:
        """One ``recv`` after :meth:`send_finish` (the socket is readable); sets :attr:`eof`."""
        try:
            data = self.sock.recv(_RECV_SIZE)
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return
        self._out.clear()  # heartbeats can no longer be answered; nsqd closes soon anyway
        self.feed(data, _SCRATCH, is_duplicate)

    def finish_and_confirm(self, timeout: float, is_duplicate: Callable[[bytes], bool]) -> bool:
        """:meth:`send_finish`, then read until nsqd closes; False if it did not in time."""
        self.send_finish()
        deadline = time.monotonic() + timeout
        while not self.eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(remaining)
            self.read_closing(is_duplicate)
        self.close()
        return True


_SCRATCH = Columns()  # messages after CLS are "late": never kept, so this stays empty


class Publisher(_Connection):
    """A producer connection that keeps up to ``window`` MPUBs in flight, one ``OK`` each."""

    def __init__(self, address: str, timeout: float, reply_timeout: float) -> None:
        super().__init__(address, timeout)
        self.sock.settimeout(reply_timeout)
        self.outstanding = 0
        # No heartbeats: a write task may wait on Spark for its next rows longer than two
        # heartbeat intervals, and nsqd would then close a connection that does not answer.
        identify = {
            "client_id": socket.gethostname(),
            "hostname": socket.gethostname(),
            "user_agent": USER_AGENT,
            "heartbeat_interval": -1,
        }
        self.send(encode_identify(identify))
        reply = self.read_response()
        if reply != b"OK":
            raise NSQConnectionError(f"{address}: unexpected IDENTIFY reply {reply[:100]!r}")

    def publish(self, commands: Iterable[bytes], window: int) -> int:
        """Send every encoded PUB/MPUB command, pipelined; returns how many were acknowledged."""
        acked = 0
        for command in commands:
            while self.outstanding >= window:
                self._await_ok()
                acked += 1
            self.send(command)
            self.outstanding += 1
        while self.outstanding:
            self._await_ok()
            acked += 1
        return acked

    def _await_ok(self) -> None:
        reply = self.read_response()
        if reply != b"OK":
            raise NSQConnectionError(f"{self.address}: unexpected reply {reply[:100]!r}")
        self.outstanding -= 1
