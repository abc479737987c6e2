"""A blocking, byte-exact NSQ V2 client for protocol tests (spec §2).

It sends exactly the bytes a test asks for and reads frames one at a time, so a
test can assert on every frame nsqd sends, including the error frame that comes
just before the server closes the connection.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nsqpy.wire.v2 import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    FrameParser,
    decode_message,
    encode_command,
    encode_dpub,
    encode_mpub,
    encode_pub,
)

DEFAULT_TIMEOUT = 5.0
HEARTBEAT = b"_heartbeat_"
_FRAME_NAMES = {
    FRAME_TYPE_RESPONSE: "response",
    FRAME_TYPE_ERROR: "error",
    FRAME_TYPE_MESSAGE: "message",
}


@dataclass(frozen=True)
class Frame:
    type: int
    data: bytes

    @property
    def is_heartbeat(self) -> bool:
        return self.type == FRAME_TYPE_RESPONSE and self.data == HEARTBEAT

    def __repr__(self) -> str:
        return f"Frame({_FRAME_NAMES.get(self.type, self.type)}, {self.data[:200]!r})"


@dataclass(frozen=True)
class Message:
    id: bytes
    timestamp: int
    attempts: int
    body: bytes
    received_at: float  # time.monotonic() when the frame was read


class ConnectionClosed(AssertionError):
    """The server closed the connection while a frame was expected."""


def int32(n: int) -> bytes:
    return struct.pack(">i", n)


def mpub_body(bodies: Iterable[bytes]) -> bytes:
    """MPUB's body without its leading size: ``[count]([size][body])*``."""
    items = list(bodies)
    return int32(len(items)) + b"".join(int32(len(b)) + b for b in items)


class RawClient:
    """One TCP connection to nsqd. Every read has a timeout; nothing is retried."""

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        magic: bytes | None = MAGIC_V2,
    ) -> None:
        if isinstance(address, str):
            host, _, port = address.rpartition(":")
            address = (host.strip("[]"), int(port))
        self.timeout = timeout
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._parser = FrameParser()
        self._frames: deque[Frame] = deque()
        self._eof = False
        self.heartbeats = 0
        if magic is not None:
            self.send(magic)

    # -- raw I/O ---------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_cmd(self, name: bytes, *params: bytes, body: bytes | None = None) -> None:
        self.send(encode_command(name, *params, body=body))

    def shutdown_write(self) -> None:
        """Half-close: the server reads EOF but can still write to us."""
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fill(self, deadline: float) -> bool:
        """Read more bytes; False on EOF. Raises TimeoutError at the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from nsqd in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no frame from nsqd in time") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self._eof = True
            return False
        self._frames.extend(Frame(t, d) for t, d in self._parser.feed(data))
        return True

    def read_frame(self, timeout: float | None = None) -> Frame:
        """The next frame (heartbeats included). Raises TimeoutError or ConnectionClosed."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self._frames:
            if self._eof or not self._fill(deadline):
                raise ConnectionClosed("nsqd closed the connection")
        return self._frames.popleft()

    def poll_frame(self, timeout: float) -> Frame | None:
        """The next frame if one arrives within ``timeout`` seconds, else None."""
        try:
            return self.read_frame(timeout)
        except TimeoutError:
            return None

    def next_frame(self, timeout: float | None = None, *, answer_heartbeats: bool = True) -> Frame:
        """The next frame that is not a heartbeat (heartbeats are answered with NOP)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            frame = self.read_frame(max(0.0, deadline - time.monotonic()))
            if not frame.is_heartbeat:
                return frame
            self.heartbeats += 1
            if answer_heartbeats:
                self._answer_heartbeat()

    def _answer_heartbeat(self) -> None:
        try:
            self.nop()
        except OSError:
            pass  # the server may already have closed; the next read reports it

    def is_closed(self, timeout: float = 2.0) -> bool:
        """True if the server closes the connection within ``timeout`` with no further frame."""
        deadline = time.monotonic() + timeout
        if self._frames:
            return False
        try:
            return not self._fill(deadline) and not self._frames
        except TimeoutError:
            return False

    # -- assertions --------------------------------------------------------------------------------

    def expect_response(self, data: bytes = b"OK", timeout: float | None = None) -> Frame:
        frame = self.next_frame(timeout)
        assert frame == Frame(FRAME_TYPE_RESPONSE, data), f"expected response {data!r}, got {frame}"
        return frame

    def expect_error(
        self, text: str | bytes, *, fatal: bool = True, timeout: float | None = None
    ) -> None:
        """The next frame is exactly this error; for a fatal error the server then closes."""
        expected = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
        # Heartbeats are skipped but not answered: a NOP could complete a truncated command.
        frame = self.next_frame(timeout, answer_heartbeats=False)
        assert frame == Frame(FRAME_TYPE_ERROR, expected), (
            f"expected error {expected!r}, got {frame}"
        )
        if fatal:
            self.assert_closed()
        else:
            self.assert_open()

    def assert_closed(self, timeout: float = 3.0) -> None:
        """The server closes the connection (recv returns b"") with no further frame."""
        deadline = time.monotonic() + timeout
        while True:
            if self._frames:
                frame = self._frames.popleft()
                if frame.is_heartbeat:
                    continue
                raise AssertionError(f"expected the connection to close, got {frame}")
            if self._eof or not self._fill_or_timeout(deadline, timeout):
                leftover = self._parser._buf  # bytes of an incomplete frame
                assert not leftover, f"connection closed after a partial frame: {leftover!r}"
                return

    def _fill_or_timeout(self, deadline: float, timeout: float) -> bool:
        try:
            return self._fill(deadline)
        except TimeoutError:
            raise AssertionError(f"nsqd did not close the connection within {timeout}s") from None

    def assert_open(self) -> None:
        """Prove the connection still works: a PUB gets its OK."""
        self.send(encode_pub("still_open_check#ephemeral", b"x"))  # overflow is dropped
        self.expect_response(b"OK")

    def expect_no_frame(self, duration: float) -> None:
        """No frame but heartbeats for ``duration`` seconds (answering heartbeats)."""
        deadline = time.monotonic() + duration
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            frame = self.poll_frame(remaining)
            if frame is None:
                return
            if frame.is_heartbeat:
                self.heartbeats += 1
                self._answer_heartbeat()
                continue
            raise AssertionError(f"expected no frame for {duration}s, got {frame}")

    def read_message(self, timeout: float | None = None) -> Message:
        frame = self.next_frame(timeout)
        assert frame.type == FRAME_TYPE_MESSAGE, f"expected a message, got {frame}"
        msg_id, ts, attempts, body = decode_message(frame.data)
        return Message(msg_id, ts, attempts, body, time.monotonic())

    def read_messages(self, n: int, timeout: float | None = None) -> list[Message]:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        return [self.read_message(max(0.0, deadline - time.monotonic())) for _ in range(n)]

    def poll_message(self, timeout: float) -> Message | None:
        """A message if one arrives within ``timeout``, else None (heartbeats answered)."""
        try:
            return self.read_message(timeout)
        except TimeoutError:
            return None

    # -- commands ----------------------------------------------------------------------------------

    def identify(self, data: Mapping[str, Any] | None = None, **fields: Any) -> Frame:
        """Send IDENTIFY and return its response frame (OK, or the negotiation JSON)."""
        body = json.dumps({**(data or {}), **fields}).encode()
        self.send_cmd(b"IDENTIFY", body=body)
        return self.next_frame()

    def identify_ok(self, **fields: Any) -> Frame:
        frame = self.identify(**fields)
        if fields.get("feature_negotiation"):
            assert frame.type == FRAME_TYPE_RESPONSE, frame
        else:
            assert frame == Frame(FRAME_TYPE_RESPONSE, b"OK"), frame
        return frame

    def sub(self, topic: str, channel: str) -> None:
        self.send_cmd(b"SUB", topic.encode(), channel.encode())
        self.expect_response(b"OK")

    def rdy(self, count: int | None = 1) -> None:
        self.send(b"RDY\n" if count is None else b"RDY %d\n" % count)

    def fin(self, msg_id: bytes) -> None:
        self.send(b"FIN " + msg_id + b"\n")

    def req(self, msg_id: bytes, delay_ms: int = 0) -> None:
        self.send(b"REQ %s %d\n" % (msg_id, delay_ms))

    def touch(self, msg_id: bytes) -> None:
        self.send(b"TOUCH " + msg_id + b"\n")

    def nop(self) -> None:
        self.send(b"NOP\n")

    def cls(self) -> None:
        self.send(b"CLS\n")
        self.expect_response(b"CLOSE_WAIT")

    def pub(self, topic: str, body: bytes) -> None:
        self.send(encode_pub(topic, body))
        self.expect_response(b"OK")

    def mpub(self, topic: str, bodies: Iterable[bytes]) -> None:
        self.send(encode_mpub(topic, bodies))
        self.expect_response(b"OK")

    def dpub(self, topic: str, delay_ms: int, body: bytes) -> None:
        self.send(encode_dpub(topic, delay_ms, body))
        self.expect_response(b"OK")


def consumer(
    address: str,
    topic: str,
    channel: str,
    *,
    rdy: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    **identify: Any,
) -> RawClient:
    """A subscribed client: IDENTIFY (if fields given), SUB, then RDY (if given)."""
    client = RawClient(address, timeout=timeout)
    if identify:
        client.identify_ok(**identify)
    client.sub(topic, channel)
    if rdy is not None:
        client.rdy(rdy)
    return client
