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
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable
from typing import Any, Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from nsqpy.spark._options import split_host_port
from nsqpy.wire.v2 import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    MAGIC_V2,
    MESSAGE_HEADER_SIZE,
    MSG_ID_LENGTH,
    encode_fin,
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
_RECV_SIZE: Final = 1 << 20
# Where a message frame's fields are, counted from the frame's first byte: size (4), frame type
# (4), then the message header: timestamp (8, ns), attempts (2), id (16), then the body.
_TS_AT: Final = 8
_ATTEMPTS_AT: Final = 16
_ID_AT: Final = 18
_BODY_AT: Final = 8 + MESSAGE_HEADER_SIZE
_TO_THE_END: Final = 1 << 40  # binary_slice's stop for "the rest of the value"
_SWAP: Final = sys.byteorder == "little"  # the wire is big-endian
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
    """The messages a read task keeps, ready for Arrow: whole-buffer pieces, not per-message
    objects (:meth:`ConsumerConnection.feed` cuts them out of each receive buffer)."""

    __slots__ = ("attempts", "bodies", "ids", "timestamps")

    def __init__(self) -> None:
        self.ids = bytearray()  # 16 bytes per message
        self.timestamps = array("q")  # ns since the epoch
        self.attempts = array("H")
        self.bodies: list[Any] = []  # pyarrow binary arrays

    def __len__(self) -> int:
        return len(self.attempts)

    def append(self, msg_id: bytes, timestamp: int, attempts: int, body: bytes) -> None:
        """Add one message (tests; the read path adds whole buffers)."""
        self.ids += msg_id
        self.timestamps.append(timestamp)
        self.attempts.append(attempts)
        self.bodies.append(pa.array([body], pa.binary()))

    def add_frames(self, frames: Any, ids: bytes, attempts: bytes) -> None:
        """Add message frames (a binary array, one whole frame per value) whose ids and
        big-endian attempts were already cut out."""
        k = len(frames)
        timestamps = _data(pc.binary_slice(frames, _TS_AT, _ATTEMPTS_AT), 8 * k)
        self.add(ids, timestamps, attempts, pc.binary_slice(frames, _BODY_AT, _TO_THE_END))

    def add(self, ids: bytes, timestamps: bytes, attempts: bytes, bodies: Any) -> None:
        """Add messages: their ids, big-endian timestamps and attempts, and bodies (a binary
        array)."""
        stamps = array("q", timestamps)
        counts = array("H", attempts)
        if _SWAP:
            stamps.byteswap()
            counts.byteswap()
        self.ids += ids
        self.timestamps.extend(stamps)
        self.attempts.extend(counts)
        self.bodies.append(bodies)

    def add_first(self, ids: bytes, timestamps: bytes, bodies: Any) -> None:
        """Add first attempts: their ids, native-order timestamps and bodies (a binary
        array)."""
        self.ids += ids
        self.timestamps.frombytes(timestamps)
        self.attempts.frombytes(_ONE * (len(timestamps) // 8))
        self.bodies.append(bodies)


_ONE: Final = array("H", [1]).tobytes()


def _data(column: Any, size: int, buffer: int = 2) -> bytes:
    """The first ``size`` bytes of a fresh array's values (one contiguous buffer: the third
    of a binary array, the second of a fixed-size one)."""
    return bytes(column.buffers()[buffer][:size].to_pybytes())


_OFFSETS: dict[int, Any] = {}


def fixed_width_offsets(width: int, count: int) -> Any:
    """The offsets buffer of ``count`` values of ``width`` bytes each: a zero-copy slice of one
    kept per width (a read sees one or a few body sizes)."""
    offsets = _OFFSETS.get(width)
    if offsets is None or len(offsets) <= count:
        if len(_OFFSETS) >= 64:
            _OFFSETS.clear()
        rows = max(count, 16_384)
        offsets = _OFFSETS[width] = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.py_buffer(offsets[: count + 1])


def id_commands(verb: bytes, ids: bytes, tail: bytes = b"\n") -> bytes:
    """``<verb> <id><tail>`` for every 16-byte id in ``ids``, built as the columns of one
    matrix (a row per command) instead of one bytes object per message."""
    k = len(ids) // MSG_ID_LENGTH
    head = verb + b" "
    width = len(head) + MSG_ID_LENGTH + len(tail)
    out = np.empty((k, width), np.uint8)
    out[:, : len(head)] = np.frombuffer(head, np.uint8)
    out[:, len(head) : len(head) + MSG_ID_LENGTH] = np.frombuffer(ids, np.uint8, k * 16).reshape(
        k, MSG_ID_LENGTH
    )
    out[:, len(head) + MSG_ID_LENGTH :] = np.frombuffer(tail, np.uint8)
    return out.tobytes()


def split_ids(blobs: Iterable[bytes]) -> list[bytes]:
    """The single ids of blobs of concatenated 16-byte ids."""
    return [
        blob[i : i + MSG_ID_LENGTH] for blob in blobs for i in range(0, len(blob), MSG_ID_LENGTH)
    ]


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
    :attr:`ids` and :attr:`late` hold blobs of concatenated 16-byte ids, one per receive buffer.
    """

    def __init__(self, address: str, timeout: float) -> None:
        super().__init__(address, timeout)
        self.ids: list[bytes] = []
        self.late: list[bytes] = []
        self.kept = 0
        self.fin_failed: list[bytes] = []
        self.dropped = 0
        self.accepting = True
        self.closing = False  # CLS sent
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
        ready: int = 0,
    ) -> None:
        """Send IDENTIFY (feature negotiation) and SUB, and ``RDY ready`` if given, in one
        write. :meth:`await_subscribed` reads the replies, so that many connections can
        subscribe at once; with ``ready`` the replies are left to :meth:`feed` (which ignores
        them, and raises on an error), so that messages flow without a round trip."""
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
        rdy = encode_rdy(ready) if ready else b""
        self.send(encode_identify(identify) + encode_sub(topic, channel) + rdy)

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
        """Parse ``data``; returns the number of messages kept.

        A run of equal-size first-attempt message frames (the usual buffer) is cut by
        :meth:`_uniform`. Otherwise the complete frames become one binary array (a value per
        frame, over the buffer itself) and Arrow cuts the columns out of it; Python only walks
        the frame sizes.
        """
        buf = self._buf + data if self._buf else data
        if self.accepting:
            # Replies first (a connection's first buffer starts with IDENTIFY's and SUB's).
            start = self._replies(buf)
            uniform = self._uniform(buf, cols, start)
            if uniform is not None:  # then the rest, if any, the same way
                kept, end = uniform
                self._buf = b""
                return kept if end == len(buf) else kept + self.feed(buf[end:], cols, is_duplicate)
            if start:
                buf = buf[start:]
        end, starts, messages = self._scan(buf)
        self._buf = buf[end:] if end < len(buf) else b""
        if not messages:
            return 0
        frames = pa.BinaryArray.from_buffers(
            pa.binary(), len(starts) - 1, [None, pa.py_buffer(starts), pa.py_buffer(buf)]
        )
        if isinstance(messages, list):
            first = messages[0]
            if messages[-1] - first + 1 == len(messages):  # one run, e.g. after replies
                frames = frames.slice(first, len(messages))
            else:
                frames = frames.take(pa.array(messages, pa.int32()))
        k = len(frames)
        ids = _data(pc.binary_slice(frames, _ID_AT, _BODY_AT), MSG_ID_LENGTH * k)
        if not self.accepting:
            self.late.append(ids)
            return 0
        attempts = _data(pc.binary_slice(frames, _ATTEMPTS_AT, _ID_AT), 2 * k)
        if attempts != _FIRST_ATTEMPT * k:  # redeliveries: the log may have them already
            keep = self._drop_duplicates(ids, attempts, is_duplicate)
            if len(keep) < k:
                if not keep:
                    return 0
                frames = frames.take(pa.array(keep, pa.int32()))
                ids = b"".join(ids[16 * i : 16 * i + 16] for i in keep)
                attempts = b"".join(attempts[2 * i : 2 * i + 2] for i in keep)
                k = len(keep)
        cols.add_frames(frames, ids, attempts)
        self.ids.append(ids)
        self.kept += k
        return k

    def _replies(self, buf: bytes) -> int:
        """Handle the complete frames other than messages at the start of ``buf`` (see
        :meth:`_frame`); returns where the first message (or incomplete frame) starts."""
        n = len(buf)
        pos = 0
        while n - pos >= 8:
            size, frame_type = _FRAME.unpack_from(buf, pos)
            if frame_type == FRAME_TYPE_MESSAGE or size < 4 or pos + 4 + size > n:
                break  # a message, or left to _scan (which raises on a bad size)
            self._frame(frame_type, buf[pos + 8 : pos + 4 + size])
            pos += 4 + size
        return pos

    def _uniform(self, buf: bytes, cols: Columns, start: int = 0) -> tuple[int, int] | None:
        """The usual case: ``buf[start:]`` starts with a run of message frames of one size, all
        first attempts. Each field of the run's frames is a strided numpy view, copied out in one
        step (no offsets to walk, and a few numpy calls per buffer where Arrow's compute calls
        cost microseconds each). Returns (messages kept, where the run ends), or None if
        ``buf[start:]`` does not start that way (then :meth:`_scan` and the general path take
        it)."""
        n = len(buf) - start
        if n < 8:
            return None
        size, frame_type = _FRAME.unpack_from(buf, start)
        if frame_type != FRAME_TYPE_MESSAGE or size <= 4 + MESSAGE_HEADER_SIZE:
            return None  # not a message with a body (_scan rejects a bad size)
        step = 4 + size
        count = n // step
        if count < 2:
            return None
        end = start + count * step

        def column(dtype: str, at: int) -> Any:  # one field of every frame: a strided view
            return np.ndarray((count,), dtype, buf, start + at, (step,))

        # Every frame of the run has the same 8 header bytes (size, type), and attempts 1: else
        # the general path (redeliveries are checked against the log there).
        head = column("<u8", 0)
        if not (head == head[0]).all() or not (column(">u2", _ATTEMPTS_AT) == 1).all():
            return None
        ids = column("V16", _ID_AT).tobytes()
        width = step - _BODY_AT
        bodies = pa.Array.from_buffers(
            pa.binary(),
            count,
            [
                None,
                fixed_width_offsets(width, count),
                pa.py_buffer(column(f"V{width}", _BODY_AT).tobytes()),
            ],
        )
        cols.add_first(ids, column(">i8", _TS_AT).astype(np.int64).tobytes(), bodies)
        self.ids.append(ids)
        self.kept += count
        return count, end

    def _scan(self, buf: bytes) -> tuple[int, array[int], list[int] | object]:
        """The complete frames at the start of ``buf``: (bytes they span, their start offsets
        and end, the indices of the message frames or :data:`_ALL`). Other frames are handled
        here (heartbeats, CLOSE_WAIT, errors)."""
        n = len(buf)
        starts = array("i", [0])
        messages: list[int] = []
        pos = 0
        unpack = _FRAME.unpack_from
        while n - pos >= 8:
            size, frame_type = unpack(buf, pos)
            step = 4 + size
            if pos + step > n:
                break
            if frame_type == FRAME_TYPE_MESSAGE:
                if size < 4 + MESSAGE_HEADER_SIZE:
                    raise NSQConnectionError(f"{self.address}: message frame of {size} bytes")
                # A run of equal-size message frames (the usual case): the 8 header bytes of
                # every frame are those of the first, checked a byte column at a time.
                count = (n - pos) // step
                end = pos + count * step
                if count > 1 and all(
                    buf[j:end:step] == buf[j : j + 1] * count for j in range(pos, pos + 8)
                ):
                    first = len(starts) - 1
                    starts.extend(range(pos + step, end + 1, step))
                    messages.extend(range(first, first + count))
                    pos = end
                    continue
                messages.append(len(starts) - 1)
            elif size < 4:
                raise NSQConnectionError(f"{self.address}: invalid frame size {size}")
            else:
                self._frame(frame_type, buf[pos + 8 : pos + step])
            pos += step
            starts.append(pos)
        if messages and len(messages) == len(starts) - 1:
            return pos, starts, _ALL
        return pos, starts, messages  # [] when there are none (a partial frame)

    def _drop_duplicates(
        self, ids: bytes, attempts: bytes, is_duplicate: Callable[[bytes], bool]
    ) -> list[int]:
        """FIN (at once) the redeliveries already in the log; the indices of the others."""
        keep: list[int] = []
        for i in range(len(attempts) // 2):
            msg_id = ids[16 * i : 16 * i + 16]
            if (attempts[2 * i] or attempts[2 * i + 1] > 1) and is_duplicate(msg_id):
                self._out.append(encode_fin(msg_id))
                self.dropped += 1
            else:
                keep.append(i)
        return keep

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
        self.closing = True
        self.send(b"CLS\n")

    def keepalive(self, touch: bool) -> None:
        """From the keepalive thread: a NOP, and TOUCH of every kept message if ``touch``."""
        lines = [id_commands(b"TOUCH", b"".join(list(self.ids)))] if touch else []
        lines.append(b"NOP\n")
        self.send(b"".join(lines))

    def send_finish(self) -> None:
        """FIN every kept message, REQ late ones, then half-close (see :meth:`read_closing`).

        nsqd handles one connection's commands in order and closes after the EOF, so reading
        EOF proves every FIN was applied; failures (``E_FIN_FAILED <id>``) arrive before it, in
        :attr:`fin_failed`.
        """
        self.accepting = False
        lines = id_commands(b"FIN", b"".join(self.ids))
        lines += id_commands(b"REQ", b"".join(self.late), b" 0\n")
        self.late.clear()
        self.flush()
        if lines:
            self.send(lines)
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

    def requeue_all(self) -> None:
        """REQ every kept and late message (this attempt's rows must not be used)."""
        lines = id_commands(b"REQ", b"".join(self.ids + self.late), b" 0\n")
        if lines:
            self.send(lines)


_SCRATCH = Columns()  # messages after send_finish are "late": never kept, so this stays empty
_ALL: Final = object()  # every frame of the buffer is a message
_FIRST_ATTEMPT: Final = (1).to_bytes(2, "big")


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
