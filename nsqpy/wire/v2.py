"""NSQ TCP protocol V2: a pure codec (spec §2), no I/O and no asyncio.

Server side: :class:`CommandParser` turns the bytes a client sends into commands,
raising :class:`ProtocolError` with NSQ's exact error strings as soon as the input
is known to be wrong. Client side: :class:`FrameParser` turns the bytes nsqd sends
into frames, and the ``encode_*`` functions build every command.

A command is ``(params, body)``: ``params`` is the command line split on single
spaces exactly like Go's ``bytes.Split`` (``params[0]`` is the command name) and
``body`` is ``None``, the body ``bytes`` (IDENTIFY, AUTH, PUB, DPUB) or, for MPUB,
an :data:`MPubBody`: the message bodies as they came, each behind its size, not split
(nsqd queues them so, message.py); or, for one message or bodies of kilobytes
(``MPUB_SPLIT_FROM``), the list of bodies. Plain tuples keep the per-command cost low: a consumer
sends one FIN per message.
"""

from __future__ import annotations

import json
import operator
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

from nsqpy.wire.names import MAX_NAME_LENGTH, go_quote, is_valid_topic_name

MAGIC_V2: Final = b"  V2"

FRAME_TYPE_RESPONSE: Final = 0
FRAME_TYPE_ERROR: Final = 1
FRAME_TYPE_MESSAGE: Final = 2

# Client states as nsqd reports them in /stats (spec §2.2).
STATE_INIT: Final = 0
STATE_SUBSCRIBED: Final = 3
STATE_CLOSING: Final = 4

# A message payload: int64 timestamp (ns), uint16 attempts, 16 hex chars of ID, body.
MESSAGE_HEADER_SIZE: Final = 26
MSG_ID_LENGTH: Final = 16

# Go's bufio.Reader on the connection is 16 KiB: a longer command line fails the read
# and nsqd closes the connection (no error frame).
MAX_LINE_LENGTH: Final = 16 * 1024


MPubBody: TypeAlias = tuple[bytes, int]
"""An MPUB's messages, ``(payload, count)``: ``payload`` is ``(<int32 size><body>)*`` as
received. (A plain tuple: one is made per MPUB, and an MPUB may hold one message.)"""

MPUB_SPLIT_FROM: Final = 2048
"""MPUBs whose bodies average this size or more, and MPUBs of one message, come as a list
of bodies instead: kept whole, kilobyte bodies would be copied twice (out of the read
buffer, then out of the payload) to save an overhead that is small beside them."""


def mpub_bodies(body: MPubBody) -> list[bytes]:
    """The message bodies of an MPUB."""
    payload, count = body
    out: list[bytes] = []
    pos = 0
    for _ in range(count):
        end = pos + 4 + _INT32.unpack_from(payload, pos)[0]
        out.append(payload[pos + 4 : end])
        pos = end
    return out


Body: TypeAlias = bytes | MPubBody | list[bytes] | None
Command: TypeAlias = tuple[list[bytes], Body]

_INT32 = struct.Struct(">i")
_FRAME_HEADER = struct.Struct(">ii")
# Frame size, frame type, timestamp, attempts, ID: everything of a message frame but the body.
MESSAGE_FRAME_HEADER: Final = struct.Struct(">iiqH16s")
# Timestamp, attempts, ID: the 26-byte header of a message payload (§2.1).
MESSAGE_HEADER: Final = struct.Struct(">qH16s")
_MESSAGE = MESSAGE_HEADER
_FIN_LINE = struct.Struct("4x16s1x")  # "FIN <16-byte id>\n": the ID
_first = operator.itemgetter(0)


class ProtocolError(Exception):
    """The peer broke the protocol; nsqd answers with an error frame ``"<code> <desc>"``.

    ``fatal`` errors close the connection after the frame (all but FIN/REQ/TOUCH failures).
    """

    def __init__(self, code: str, desc: str, *, fatal: bool = True) -> None:
        super().__init__(f"{code} {desc}")
        self.code = code
        self.desc = desc
        self.fatal = fatal

    @property
    def text(self) -> str:
        return f"{self.code} {self.desc}"


class ConnectionFailure(Exception):
    """The connection cannot go on and no error frame is due (Go closes it silently)."""


def parse_base10(value: bytes) -> int | None:
    """NSQ's ``protocol.ByteToBase10``: digits only, empty means 0, wraps like a uint64."""
    if value and not value.isdigit():
        return None
    return int(value) % (1 << 64) if value else 0


def wire_str(value: bytes) -> str:
    """Wire bytes as text that encodes back to the same bytes (for error strings)."""
    return value.decode("utf-8", "surrogateescape")


def _fatal(code: str, desc: str) -> ProtocolError:
    return ProtocolError(code, desc)


def bad_topic(cmd: bytes, topic: bytes) -> ProtocolError:
    """PUB, MPUB and DPUB's refusal of an invalid topic name."""
    # MPUB's description really has the code twice (Go quirk, spec §2.3).
    prefix = "E_BAD_TOPIC " if cmd == b"MPUB" else ""
    return _fatal(
        "E_BAD_TOPIC", f"{prefix}{cmd.decode()} topic name {go_quote(topic)} is not valid"
    )


class CommandParser:
    """Incremental parser for the commands a V2 client sends (after the magic).

    ``feed`` bytes as they arrive, then call ``next_command`` until it returns ``None``.
    Errors raise :class:`ProtocolError` (send it, then close) or
    :class:`ConnectionFailure` (close). The owner keeps ``state`` in step with the
    client's state: IDENTIFY and AUTH are refused before their body is read, as Go does.
    """

    __slots__ = (
        "_buf",
        "_mpub",
        "_need",
        "_need_body",
        "_pending",
        "_pending_len",
        "_pos",
        "_pub_head",
        "_pub_mpub",
        "_pub_size",
        "_pub_topic",
        "_ready",
        "_short",
        "_valid_topic",
        "max_body_size",
        "max_msg_size",
        "max_req_timeout_ms",
        "mpub_topic",
        "state",
    )

    def __init__(self, max_msg_size: int, max_body_size: int, max_req_timeout_ms: int) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_req_timeout_ms = max_req_timeout_ms
        self.state = STATE_INIT
        self._buf = b""
        self._pos = 0
        # Bytes (counted from _pos) needed before parsing can progress; lets large
        # bodies accumulate as a list of chunks that is joined once.
        self._need = 0
        self._pending: list[bytes] = []
        self._pending_len = 0
        # The error Go sends if the connection ends (EOF, read timeout) while waiting here.
        self._short: tuple[str, str] | None = None
        # An MPUB being read message by message: (params, bytes of the messages read so far
        # (a piece per buffer they came in) or their bodies when split, messages read,
        # count, split).
        self._mpub: tuple[list[bytes], list[bytes], int, int, bool] | None = None
        # The valid topic name of the MPUB being read, until the command is complete.
        self.mpub_topic: bytes | None = None
        # The topic name take_publish last found valid (None: none yet; b"" is invalid).
        self._valid_topic: bytes | None = None
        # The head (command line and sizes) of the PUB or MPUB take_publish last took, its
        # message's size, topic and command: a read with the same head and a message of that
        # size is that command again (a producer sending one topic's messages of one size).
        self._pub_head: bytes | None = None
        self._pub_size = 0
        self._pub_topic = b""
        self._pub_mpub = False
        # The wait is for one body of a split MPUB (its size at _pos): it is joined exactly,
        # out of the buffer and the reads that complete it, into _ready (see _take_body).
        self._need_body = False
        self._ready: bytes | None = None

    def feed(self, data: bytes) -> None:
        """Add received bytes."""
        pending = self._pending
        if pending or (self._need and len(self._buf) - self._pos + len(data) < self._need):
            pending.append(data)
            self._pending_len += len(data)
            if len(self._buf) - self._pos + self._pending_len < self._need:
                return
            if self._need_body:
                self._take_body(pending, self._pending_len)
            else:
                if self._pos < len(self._buf):
                    # what is left of the buffer joins in the same copy (a body's start)
                    self._buf = b"".join([memoryview(self._buf)[self._pos :], *pending])
                else:
                    self._buf = b"".join(pending)
                self._pos = 0
            pending.clear()
            self._pending_len = 0
        elif self._need_body:  # (a wait, then: the body arrived in this read)
            self._take_body([data], len(data))
        elif self._pos >= len(self._buf):
            self._buf = data
            self._pos = 0
        else:
            self._buf = self._buf[self._pos :] + data
            self._pos = 0
        self._need = 0

    def _take_body(self, reads: list[bytes], size: int) -> None:
        """The awaited body of a split MPUB, out of the buffer's rest (its 4-byte size
        first) and ``reads`` (``size`` bytes, the last of them complete it): joined into
        ``_ready`` in one copy, which no slice copies again; the last read, where the body
        ends, becomes the buffer."""
        last = reads[-1]
        # the bytes past the body are all in the last read: before it the body was short
        cut = len(last) - (len(self._buf) - self._pos + size - self._need)
        self._ready = b"".join(
            [memoryview(self._buf)[self._pos + 4 :], *reads[:-1], memoryview(last)[:cut]]
        )
        self._buf = last
        self._pos = cut
        self._need_body = False

    def truncated_error(self) -> ProtocolError | None:
        """The "failed to read ..." error due if the input ends now, in the middle of a
        command's body (Go's io.ReadFull failing); None between commands or in a line."""
        if self._need and self._short is not None:
            return ProtocolError(*self._short)
        return None

    def buffered(self) -> int:
        """Bytes received but not yet consumed by a complete command."""
        ready = 0 if self._ready is None else 4 + len(self._ready)
        return len(self._buf) - self._pos + self._pending_len + ready

    def can_hand_over(self) -> bool:
        """Whether :meth:`take_rest` gives all that is buffered: no MPUB is half read."""
        return self._mpub is None and self._ready is None and not self._need_body

    def take_rest(self) -> bytes:
        """Every byte received but not consumed, in order, forgotten here (a connection
        moving to another nsqd worker, which parses them again); see can_hand_over."""
        rest = b"".join([memoryview(self._buf)[self._pos :], *self._pending])
        self._buf = b""
        self._pos = 0
        self._pending = []
        self._pending_len = 0
        self._need = 0
        self._short = None
        return rest

    def next_command(self) -> Command | None:
        """The next complete command, or ``None`` until more bytes are fed."""
        if self._need:
            return None
        self._short = None
        if self._mpub is not None:
            return self._mpub_messages()
        buf = self._buf
        pos = self._pos
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if len(buf) - pos >= MAX_LINE_LENGTH:
                raise ConnectionFailure("failed to read command - bufio: buffer full")
            return None
        if nl - pos >= MAX_LINE_LENGTH:
            raise ConnectionFailure("failed to read command - bufio: buffer full")
        end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # strip one '\r'
        params = buf[pos:end].split(b" ")
        name = params[0]
        if name in _BODY_COMMANDS:
            return self._body_command(name, params, nl + 1)
        self._pos = nl + 1
        return (params, None)

    def take_fin_block(self) -> list[bytes] | None:
        """The IDs of a run of well-formed ``FIN <16-byte id>\n`` lines, if that is all the
        complete lines buffered now are; else ``None`` and nothing is consumed.

        A consumer sends one FIN per message, so this is the commonest input there is.
        Every line is checked byte-exactly with strided slices (C speed): record i of 21
        bytes starts with ``FIN `` and ends with its only newline.
        """
        buf = self._buf
        pos = self._pos
        last = buf.rfind(b"\n", pos) + 1
        size = last - pos
        if size < 21 or size % 21 or self._need or self._mpub is not None:
            return None
        n = size // 21
        block = buf[pos:last]
        if (
            block[20::21] != b"\n" * n
            or block.count(b"\n") != n
            or block[0::21] != b"F" * n
            or block[1::21] != b"I" * n
            or block[2::21] != b"N" * n
            or block[3::21] != b" " * n
            or b"\r"
            in block[19::21]  # "FIN <15 bytes>\r\n": Go strips the \r, then the ID is short
        ):
            return None
        self._pos = last
        return list(map(_first, _FIN_LINE.iter_unpack(block)))  # C loops: ~half the slicing's cost

    def take_publish(self, data: bytes) -> Command | None:
        """The command, as next_command would return it, if nothing is buffered and
        ``data`` is exactly one well-formed ``PUB`` or one-message ``MPUB``; else ``None``,
        nothing consumed, and ``data`` is to be fed as usual (which finds any error in it).

        A producer waiting for each OK sends exactly that, one command per read: this
        checks it with a few compares instead of the general parse. It only parses: every
        rule it does not check with certainty sends the read to the general parse.
        """
        if self._pos < len(self._buf) or self._pending or self._mpub is not None:
            return None
        head = self._pub_head
        if head is not None and data.startswith(head) and len(data) == len(head) + self._pub_size:
            if self._pub_mpub:
                return ([b"MPUB", self._pub_topic], [data[len(head) :]])
            return ([b"PUB", self._pub_topic], data[len(head) :])
        if data.startswith(b"MPUB "):
            is_mpub, first = True, 5
        elif data.startswith(b"PUB "):
            is_mpub, first = False, 4
        else:
            return None
        nl = data.find(b"\n", first, first + MAX_NAME_LENGTH + 1)
        # the body follows the line and, for MPUB, the body size, count and message size
        start = nl + 13 if is_mpub else nl + 5
        if nl < 0 or len(data) <= start:
            return None
        (size,) = _INT32.unpack_from(data, start - 4)
        if len(data) != start + size or size > self.max_msg_size:  # size > 0: len > start
            return None
        topic = data[first:nl]
        if topic != self._valid_topic:
            # a space (more parameters) or a "\r" makes the name invalid: the general path
            if not is_valid_topic_name(wire_str(topic)):
                return None
            self._valid_topic = topic
        if is_mpub:
            body_size, count = _FRAME_HEADER.unpack_from(data, nl + 1)
            if count != 1 or not 0 < body_size <= self.max_body_size or self.max_body_size < 9:
                return None
        self._pub_head = data[:start]
        self._pub_size = size
        self._pub_topic = topic
        self._pub_mpub = is_mpub
        if is_mpub:
            return ([b"MPUB", topic], [data[start:]])
        return ([b"PUB", topic], data[start:])

    # -- commands with a body ---------------------------------------------------------

    def _body_command(self, name: bytes, params: list[bytes], start: int) -> Command | None:
        if name == b"MPUB":
            return self._mpub_command(params, start)
        if name == b"PUB":
            if len(params) < 2:
                raise _fatal("E_INVALID", "PUB insufficient number of parameters")
            self._check_topic(b"PUB", params[1])
            return self._message_body(b"PUB", params, start)
        if name == b"DPUB":
            if len(params) < 3:
                raise _fatal("E_INVALID", "DPUB insufficient number of parameters")
            self._check_topic(b"DPUB", params[1])
            timeout_ms = parse_base10(params[2])
            if timeout_ms is None:
                raise _fatal("E_INVALID", f"DPUB could not parse timeout {wire_str(params[2])}")
            if timeout_ms > self.max_req_timeout_ms:
                raise _fatal(
                    "E_INVALID",
                    f"DPUB timeout {timeout_ms} out of range 0-{self.max_req_timeout_ms}",
                )
            return self._message_body(b"DPUB", params, start)
        if name == b"IDENTIFY":
            if self.state != STATE_INIT:
                raise _fatal("E_INVALID", "cannot IDENTIFY in current state")
            return self._sized_body(b"IDENTIFY", params, start, too_big_first=True)
        # AUTH
        if self.state != STATE_INIT:
            raise _fatal("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise _fatal("E_INVALID", "AUTH invalid number of parameters")
        return self._sized_body(b"AUTH", params, start, too_big_first=False)

    def _check_topic(self, cmd: bytes, topic: bytes) -> None:
        if not is_valid_topic_name(wire_str(topic)):
            raise bad_topic(cmd, topic)

    def _wait(self, upto: int, code: str, desc: str) -> None:
        self._need = upto - self._pos
        self._short = (code, desc)

    def _message_body(self, cmd: bytes, params: list[bytes], start: int) -> Command | None:
        buf = self._buf
        c = cmd.decode()
        if len(buf) < start + 4:
            self._wait(start + 4, "E_BAD_MESSAGE", f"{c} failed to read message body size")
            return None
        (size,) = _INT32.unpack_from(buf, start)
        if size <= 0:
            raise _fatal("E_BAD_MESSAGE", f"{c} invalid message body size {size}")
        if size > self.max_msg_size:
            raise _fatal("E_BAD_MESSAGE", f"{c} message too big {size} > {self.max_msg_size}")
        end = start + 4 + size
        if len(buf) < end:
            self._wait(end, "E_BAD_MESSAGE", f"{c} failed to read message body")
            return None
        self._pos = end
        return (params, buf[start + 4 : end])

    def _sized_body(
        self, cmd: bytes, params: list[bytes], start: int, *, too_big_first: bool
    ) -> Command | None:
        buf = self._buf
        c = cmd.decode()
        if len(buf) < start + 4:
            self._wait(start + 4, "E_BAD_BODY", f"{c} failed to read body size")
            return None
        (size,) = _INT32.unpack_from(buf, start)
        too_big = size > self.max_body_size
        if too_big and too_big_first:
            raise _fatal("E_BAD_BODY", f"{c} body too big {size} > {self.max_body_size}")
        if size <= 0:
            raise _fatal("E_BAD_BODY", f"{c} invalid body size {size}")
        if too_big:
            raise _fatal("E_BAD_BODY", f"{c} body too big {size} > {self.max_body_size}")
        end = start + 4 + size
        if len(buf) < end:
            self._wait(end, "E_BAD_BODY", f"{c} failed to read body")
            return None
        self._pos = end
        return (params, buf[start + 4 : end])

    def _mpub_command(self, params: list[bytes], start: int) -> Command | None:
        if len(params) < 2:
            raise _fatal("E_INVALID", "MPUB insufficient number of parameters")
        self._check_topic(b"MPUB", params[1])
        # Go's MPUB gets (creates) its topic before it reads the body: from here on, a body
        # refused or cut short has made the topic all the same (ClientV2 does that)
        self.mpub_topic = params[1]
        buf = self._buf
        if len(buf) < start + 8:
            if len(buf) >= start + 4:
                self._check_mpub_size(_INT32.unpack_from(buf, start)[0])
                self._wait(start + 8, "E_BAD_BODY", "MPUB failed to read message count")
            else:
                self._wait(start + 4, "E_BAD_BODY", "MPUB failed to read body size")
            return None
        body_size, count = struct.unpack_from(">ii", buf, start)
        self._check_mpub_size(body_size)
        if count <= 0 or count > (self.max_body_size - 4) // 5:
            raise _fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
        # From here the command line is consumed and the messages are read one by one, like
        # Go's readMPUB (the declared size is only range-checked): each size is checked as
        # soon as it arrives, and bytes of complete messages are dropped from the buffer.
        self._pos = start + 8
        # one message, or kilobytes each: a list of bodies (see MPubBody)
        split = count == 1 or body_size - 4 >= (MPUB_SPLIT_FROM + 4) * count
        self._mpub = (params, [], 0, count, split)
        return self._mpub_messages()

    def _mpub_messages(self) -> Command | None:
        assert self._mpub is not None
        params, pieces, i, count, split = self._mpub
        ready = self._ready
        if ready is not None:  # the body waited for, joined as it completed (_take_body)
            self._ready = None
            pieces.append(ready)
            i += 1
        buf = self._buf
        max_msg_size = self.max_msg_size
        unpack = _INT32.unpack_from
        n = len(buf)
        p = start = self._pos
        while i < count:
            if n < p + 4:
                self._mpub_wait(pieces, start, p, i)
                self._wait(p + 4, "E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
                return None
            (size,) = unpack(buf, p)
            if size <= 0:
                raise _fatal("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
            if size > max_msg_size:
                raise _fatal("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
            end = p + 4 + size
            if n < end:
                self._mpub_wait(pieces, start, p, i)
                self._wait(end, "E_BAD_MESSAGE", "MPUB failed to read message body")
                self._need_body = split
                return None
            if split:
                pieces.append(buf[p + 4 : end])
            p = end
            i += 1
        self._mpub = None
        self.mpub_topic = None
        self._pos = p
        if split:
            return (params, pieces)
        if pieces:
            pieces.append(buf[start:p])
            return (params, (b"".join(pieces), count))
        return (params, (buf[start:p], count))

    def _mpub_wait(self, pieces: list[bytes], start: int, p: int, i: int) -> None:
        # the complete messages of this buffer are kept; the buffer drops them
        assert self._mpub is not None
        params, _, _, count, split = self._mpub
        if p > start and not split:
            pieces.append(self._buf[start:p])
        self._mpub = (params, pieces, i, count, split)
        self._pos = p

    def _check_mpub_size(self, body_size: int) -> None:
        if body_size <= 0:
            raise _fatal("E_BAD_BODY", f"MPUB invalid body size {body_size}")
        if body_size > self.max_body_size:
            raise _fatal("E_BAD_BODY", f"MPUB body too big {body_size} > {self.max_body_size}")


_BODY_COMMANDS: Final = frozenset((b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH"))


# -- frames (server → client) ---------------------------------------------------------


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """``[size][frame type][data]`` with ``size = 4 + len(data)``."""
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return encode_frame(FRAME_TYPE_RESPONSE, data)


def encode_error(text: str) -> bytes:
    return encode_frame(FRAME_TYPE_ERROR, text.encode("utf-8", "surrogateescape"))


def encode_message_frame(msg_id: bytes, timestamp: int, attempts: int, body: bytes) -> bytes:
    return (
        MESSAGE_FRAME_HEADER.pack(len(body) + 30, FRAME_TYPE_MESSAGE, timestamp, attempts, msg_id)
        + body
    )


def encode_message(msg_id: bytes, timestamp: int, attempts: int, body: bytes) -> bytes:
    """The message payload of §2.1, also the on-disk record payload."""
    return _MESSAGE.pack(timestamp, attempts, msg_id) + body


def decode_message(payload: bytes) -> tuple[bytes, int, int, bytes]:
    """``(id, timestamp_ns, attempts, body)`` from a message payload."""
    if len(payload) < MESSAGE_HEADER_SIZE:
        raise ValueError(f"message payload too short: {len(payload)} bytes")
    timestamp, attempts, msg_id = _MESSAGE.unpack_from(payload)
    return (msg_id, timestamp, attempts, payload[MESSAGE_HEADER_SIZE:])


FRAME_OK: Final = encode_response(b"OK")
FRAME_HEARTBEAT: Final = encode_response(b"_heartbeat_")
FRAME_CLOSE_WAIT: Final = encode_response(b"CLOSE_WAIT")


class FrameParser:
    """Incremental parser for the frames nsqd sends: ``feed`` returns complete frames."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf + data if self._buf else data
        frames: list[tuple[int, bytes]] = []
        pos = 0
        n = len(buf)
        unpack = _FRAME_HEADER.unpack_from
        while n - pos >= 8:
            size, frame_type = unpack(buf, pos)
            if size < 4:
                raise ValueError(f"invalid frame size {size}")
            end = pos + 4 + size
            if end > n:
                break
            frames.append((frame_type, buf[pos + 8 : end]))
            pos = end
        self._buf = buf[pos:]
        return frames


# -- commands (client → server) ---------------------------------------------------------


def encode_command(name: bytes, *params: bytes, body: bytes | None = None) -> bytes:
    line = b" ".join((name, *params)) + b"\n"
    if body is None:
        return line
    return line + _INT32.pack(len(body)) + body


def encode_identify(data: Mapping[str, Any]) -> bytes:
    return encode_command(b"IDENTIFY", body=json.dumps(data).encode())


def encode_auth(secret: bytes) -> bytes:
    return encode_command(b"AUTH", body=secret)


def encode_sub(topic: str, channel: str) -> bytes:
    return encode_command(b"SUB", topic.encode(), channel.encode())


def encode_rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def encode_fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def encode_req(msg_id: bytes, delay_ms: int) -> bytes:
    return b"REQ %s %d\n" % (msg_id, delay_ms)


def encode_touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def encode_cls() -> bytes:
    return b"CLS\n"


def encode_nop() -> bytes:
    return b"NOP\n"


def encode_pub(topic: str, body: bytes) -> bytes:
    return encode_command(b"PUB", topic.encode(), body=body)


def encode_dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    return encode_command(b"DPUB", topic.encode(), b"%d" % delay_ms, body=body)


def encode_mpub(topic: str, bodies: Iterable[bytes]) -> bytes:
    parts = [b""]
    count = 0
    for body in bodies:
        parts.append(_INT32.pack(len(body)))
        parts.append(body)
        count += 1
    parts[0] = _INT32.pack(count)
    payload = b"".join(parts)
    return b"MPUB " + topic.encode() + b"\n" + _INT32.pack(len(payload)) + payload
