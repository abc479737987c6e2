"""nsqlookupd's TCP protocol V1: a pure codec (spec §4.2), no I/O and no asyncio.

nsqd connects to nsqlookupd, sends the magic ``"  V1"``, then newline-terminated
commands::

    IDENTIFY\\n[4-byte size][JSON]      who this nsqd is (once, before the rest)
    REGISTER <topic> [<channel>]\\n     this nsqd has the topic (and channel)
    UNREGISTER <topic> [<channel>]\\n   ... no longer has it
    PING\\n                             still alive

Every reply is ``[4-byte size][data]`` with **no frame type** (unlike nsqd's V2):
``OK``, the IDENTIFY JSON, or an error ``"E_CODE description"`` after which
nsqlookupd closes the connection (every V1 error is fatal in Go).

Server side (nsqlookupd): :class:`CommandParser` turns received bytes into
:data:`Event` objects and raises :class:`ProtocolError` carrying Go's exact error
string. Client side (nsqd): the ``encode_*`` functions, :class:`ResponseParser`
and :func:`decode_identify_response`.

Exceptions::

    ProtocolError          the peer broke the protocol: send ``text``, then close
     └── BadProtocol       the 4-byte magic was not "  V1" (``E_BAD_PROTOCOL``)
    ConnectionFailure      close without a reply (Go's read failed)
    ResponseError          (client side) a reply nsqd cannot use
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from nsqpy.common.gojson import encode_json
from nsqpy.wire.names import is_valid_channel_name, is_valid_topic_name

__all__ = [
    "MAGIC_V1",
    "MAX_BODY_SIZE",
    "MAX_LINE_LENGTH",
    "RESPONSE_OK",
    "BadProtocol",
    "CommandParser",
    "ConnectionFailure",
    "Event",
    "Identify",
    "LookupdInfo",
    "PeerIdentity",
    "Ping",
    "ProtocolError",
    "ProtocolMagic",
    "Register",
    "ResponseError",
    "ResponseParser",
    "Unregister",
    "decode_identify_response",
    "encode_error",
    "encode_identify",
    "encode_identify_response",
    "encode_json",
    "encode_ping",
    "encode_register",
    "encode_response",
    "encode_unregister",
    "parse_identify_body",
]

MAGIC_V1: Final = b"  V1"

# Go reads lines with bufio.Reader.ReadString, which has no limit; the longest valid
# line is ~140 bytes, so a megabyte without a newline is garbage (closed silently).
MAX_LINE_LENGTH: Final = 1024 * 1024
# Go has no limit on the IDENTIFY body either (and panics on a negative size); nsqd's
# default --max-body-size is a generous bound for a ~200 byte JSON object.
MAX_BODY_SIZE: Final = 5 * 1024 * 1024

_INT32 = struct.Struct(">i")
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1

# Go's strings.TrimSpace trims unicode.IsSpace characters; Python's str.strip() would
# also trim \x1c-\x1f, which Go keeps.
_GO_SPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


# -- errors ---------------------------------------------------------------------------------


class ProtocolError(Exception):
    """The peer broke the protocol; nsqlookupd replies ``text`` and closes the connection."""

    def __init__(self, code: str, desc: str) -> None:
        super().__init__(f"{code} {desc}")
        self.code = code
        self.desc = desc

    @property
    def text(self) -> str:
        """The reply, Go's ``ClientErr.Error()``: ``"<code> <desc>"``."""
        return f"{self.code} {self.desc}"


class BadProtocol(ProtocolError):
    """The connection did not start with ``"  V1"``; the reply is just ``E_BAD_PROTOCOL``."""

    def __init__(self, magic: bytes) -> None:
        super().__init__("E_BAD_PROTOCOL", "")
        self.magic = magic

    @property
    def text(self) -> str:
        return "E_BAD_PROTOCOL"


class ConnectionFailure(Exception):
    """The connection cannot go on and no reply is due (Go's read failed)."""


class ResponseError(ValueError):
    """(nsqd side) nsqlookupd sent a reply that cannot be used."""


# -- events (server side) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProtocolMagic:
    """The connection started with the right magic (Go logs every desired magic)."""

    magic: bytes


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """The IDENTIFY body: an nsqd describing itself (Go's ``PeerInfo`` JSON fields)."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str = ""
    topology_zone: str = ""
    topology_region: str = ""


@dataclass(frozen=True, slots=True)
class Identify:
    """``IDENTIFY``, its body decoded and checked."""

    peer: PeerIdentity


@dataclass(frozen=True, slots=True)
class Register:
    """``REGISTER topic [channel]``; ``channel`` is ``""`` when absent."""

    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class Unregister:
    """``UNREGISTER topic [channel]``; ``channel`` is ``""`` when absent."""

    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class Ping:
    """``PING`` (allowed before IDENTIFY)."""


Event: TypeAlias = ProtocolMagic | Identify | Register | Unregister | Ping


def _wire_str(value: bytes) -> str:
    # Text that encodes back to the same bytes, so error strings echo names byte-exactly.
    return value.decode("utf-8", "surrogateescape")


# Parser states
_MAGIC: Final = 0
_LINE: Final = 1
_IDENTIFY_SIZE: Final = 2
_IDENTIFY_BODY: Final = 3


class CommandParser:
    """Incremental parser for what an nsqd sends to nsqlookupd, magic included.

    ``feed`` bytes as they arrive, then call :meth:`next_event` until it returns
    ``None``, handling each event before asking for the next one: the owner sets
    ``identified`` once it has accepted an :class:`Identify`, because REGISTER,
    UNREGISTER and a second IDENTIFY are judged by it, as in Go. Errors raise
    :class:`ProtocolError` (reply, then close) or :class:`ConnectionFailure` (close).
    """

    __slots__ = ("_body_size", "_buf", "_state", "identified", "max_body_size", "max_line_length")

    def __init__(
        self,
        *,
        expect_magic: bool = True,
        max_line_length: int = MAX_LINE_LENGTH,
        max_body_size: int = MAX_BODY_SIZE,
    ) -> None:
        self.identified = False
        self.max_line_length = max_line_length
        self.max_body_size = max_body_size
        self._buf = bytearray()
        self._state = _MAGIC if expect_magic else _LINE
        self._body_size = 0

    def feed(self, data: bytes) -> None:
        """Add received bytes."""
        self._buf += data

    def next_event(self) -> Event | None:
        """The next complete event, or None until more bytes arrive."""
        buf = self._buf
        while True:
            state = self._state
            if state == _LINE:
                end = buf.find(b"\n")
                if end < 0:
                    if len(buf) > self.max_line_length:
                        raise ConnectionFailure("command line too long")
                    return None
                line = bytes(buf[:end])
                del buf[: end + 1]
                event = self._command(line)
                if event is not None:
                    return event
                continue  # IDENTIFY: its size and body come next
            if state == _MAGIC:
                if len(buf) < 4:
                    return None
                magic = bytes(buf[:4])
                del buf[:4]
                if magic != MAGIC_V1:
                    raise BadProtocol(magic)
                self._state = _LINE
                return ProtocolMagic(magic)
            if state == _IDENTIFY_SIZE:
                if len(buf) < 4:
                    return None
                (size,) = _INT32.unpack_from(buf)
                del buf[:4]
                if size < 0:
                    raise ProtocolError("E_BAD_BODY", f"IDENTIFY invalid body size {size}")
                if size > self.max_body_size:
                    raise ProtocolError(
                        "E_BAD_BODY", f"IDENTIFY body too big {size} > {self.max_body_size}"
                    )
                self._body_size = size
                self._state = _IDENTIFY_BODY
                continue
            # _IDENTIFY_BODY
            size = self._body_size
            if len(buf) < size:
                return None
            body = bytes(buf[:size])
            del buf[:size]
            self._state = _LINE
            return Identify(parse_identify_body(body))

    def eof(self) -> ProtocolError | None:
        """The peer closed its side: the error Go would still reply with, if any.

        A partial command line is dropped silently (Go's ReadString fails); an
        IDENTIFY cut short fails like Go's reads of its size and body.
        """
        if self._state == _IDENTIFY_SIZE:
            return ProtocolError("E_BAD_BODY", "IDENTIFY failed to read body size")
        if self._state == _IDENTIFY_BODY:
            return ProtocolError("E_BAD_BODY", "IDENTIFY failed to read body")
        return None

    def _command(self, line: bytes) -> Event | None:
        params = _wire_str(line).strip(_GO_SPACE).split(" ")
        name = params[0]
        if name == "PING":
            return Ping()
        if name == "IDENTIFY":
            if self.identified:
                raise ProtocolError("E_INVALID", "cannot IDENTIFY again")
            self._state = _IDENTIFY_SIZE
            return None
        if name == "REGISTER" or name == "UNREGISTER":
            if not self.identified:
                raise ProtocolError("E_INVALID", "client must IDENTIFY")
            topic, channel = _topic_channel(name, params[1:])
            return Register(topic, channel) if name == "REGISTER" else Unregister(topic, channel)
        raise ProtocolError("E_INVALID", f"invalid command {name}")


def _topic_channel(command: str, params: list[str]) -> tuple[str, str]:
    """Go's ``getTopicChan``: the names, checked; note the single quotes in its errors."""
    if not params:
        raise ProtocolError("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_topic_name(topic):
        raise ProtocolError("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel and not is_valid_channel_name(channel):
        raise ProtocolError("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
    return topic, channel


# -- IDENTIFY body --------------------------------------------------------------------------


class _JSONTypeError(ValueError):
    pass


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in order (``object_pairs_hook``)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON literal {name}")  # NaN, Infinity: Python-only JSON


def _go_unmarshal_object(data: bytes, fields: Mapping[str, type]) -> dict[str, Any] | None:
    """``json.Unmarshal`` into a Go struct of string and int fields.

    Returns the values of ``fields`` present (matched case-insensitively like Go,
    the last occurrence winning), or None for a top-level ``null``. Raises
    ValueError where Go's Unmarshal returns an error: bad JSON, a top-level value
    that is not an object, or a field of the wrong type (Go reports that after
    filling the rest, but it is an error all the same).
    """
    text = data.decode("utf-8", "replace")  # Go turns invalid UTF-8 into U+FFFD
    value = json.loads(text, object_pairs_hook=_Object, parse_constant=_reject_constant)
    if value is None:
        return None
    if not isinstance(value, _Object):
        raise _JSONTypeError("cannot unmarshal non-object into the struct")
    by_fold = {name.lower(): name for name in fields}
    out: dict[str, Any] = {}
    type_error: _JSONTypeError | None = None
    for key, item in value:
        name = key if key in fields else by_fold.get(key.lower())
        if name is None or item is None:  # unknown keys are skipped, null leaves the zero value
            continue
        kind = fields[name]
        if kind is int:
            if isinstance(item, bool) or not isinstance(item, int):
                type_error = type_error or _JSONTypeError(f"cannot unmarshal into int {name}")
                continue
            if not _INT64_MIN <= item <= _INT64_MAX:
                type_error = type_error or _JSONTypeError(f"{name} overflows int")
                continue
        elif not isinstance(item, str):
            type_error = type_error or _JSONTypeError(f"cannot unmarshal into string {name}")
            continue
        out[name] = item
    if type_error is not None:
        raise type_error
    return out


_PEER_FIELDS: Final[Mapping[str, type]] = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "topology_zone": str,
    "topology_region": str,
}


def parse_identify_body(body: bytes) -> PeerIdentity:
    """Decode and check an IDENTIFY body; raises :class:`ProtocolError` with Go's text."""
    try:
        values = _go_unmarshal_object(body, _PEER_FIELDS) or {}
    except ValueError:
        raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
    peer = PeerIdentity(
        broadcast_address=values.get("broadcast_address", ""),
        tcp_port=values.get("tcp_port", 0),
        http_port=values.get("http_port", 0),
        version=values.get("version", ""),
        hostname=values.get("hostname", ""),
        topology_zone=values.get("topology_zone", ""),
        topology_region=values.get("topology_region", ""),
    )
    if not peer.broadcast_address or not peer.tcp_port or not peer.http_port or not peer.version:
        raise ProtocolError("E_BAD_BODY", "IDENTIFY missing fields")
    return peer


# -- replies (nsqlookupd → nsqd) --------------------------------------------------------------


def encode_response(data: bytes) -> bytes:
    """``protocol.SendResponse``: ``[4-byte size][data]``, no frame type."""
    return _INT32.pack(len(data)) + data


def encode_error(text: str) -> bytes:
    """An error reply ``"E_CODE description"`` (names echoed byte-exactly)."""
    return encode_response(text.encode("utf-8", "surrogateescape"))


RESPONSE_OK: Final = encode_response(b"OK")


def encode_identify_response(
    *, tcp_port: int, http_port: int, version: str, broadcast_address: str, hostname: str
) -> bytes:
    """The reply to IDENTIFY: Go marshals a map, so the keys come sorted."""
    data = {
        "broadcast_address": broadcast_address,
        "hostname": hostname,
        "http_port": http_port,
        "tcp_port": tcp_port,
        "version": version,
    }
    return encode_response(encode_json(data))


# -- commands (nsqd → nsqlookupd) ------------------------------------------------------------


def _command(name: str, *params: str) -> bytes:
    # go-nsq's Register/UnRegister leave out empty names.
    words = [name, *(p for p in params if p)]
    return " ".join(words).encode("utf-8", "surrogateescape") + b"\n"


def encode_identify(info: Mapping[str, Any]) -> bytes:
    """``IDENTIFY\\n[size][JSON]``; nsqd sends a Go map, so the keys come sorted."""
    body = encode_json(dict(info), sort_keys=True)
    return b"IDENTIFY\n" + _INT32.pack(len(body)) + body


def encode_register(topic: str, channel: str = "") -> bytes:
    """``REGISTER topic [channel]\\n``."""
    return _command("REGISTER", topic, channel)


def encode_unregister(topic: str, channel: str = "") -> bytes:
    """``UNREGISTER topic [channel]\\n``."""
    return _command("UNREGISTER", topic, channel)


def encode_ping() -> bytes:
    """``PING\\n``."""
    return b"PING\n"


class ResponseParser:
    """Incremental parser for nsqlookupd's replies: ``feed`` returns complete ones.

    Like Go's ``readResponseBounded``, a size above ``max_size`` (nsqd passes its
    --max-body-size) is an error, and so is a negative one.
    """

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = MAX_BODY_SIZE) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; returns the replies they complete. Raises ResponseError."""
        buf = self._buf
        buf += data
        out: list[bytes] = []
        while len(buf) >= 4:
            (size,) = _INT32.unpack_from(buf)
            if size < 0 or size > self.max_size:
                raise ResponseError(
                    f"response body size ({size}) is greater than limit ({self.max_size})"
                    if size > 0
                    else f"invalid response body size ({size})"
                )
            if len(buf) < 4 + size:
                break
            out.append(bytes(buf[4 : 4 + size]))
            del buf[: 4 + size]
        return out


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """What nsqlookupd says about itself in its IDENTIFY reply (nsqd's ``peerInfo``)."""

    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    broadcast_address: str = ""

    def __str__(self) -> str:
        # Go logs it with %+v
        return (
            f"{{TCPPort:{self.tcp_port} HTTPPort:{self.http_port} "
            f"Version:{self.version} BroadcastAddress:{self.broadcast_address}}}"
        )


_INFO_FIELDS: Final[Mapping[str, type]] = {
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "broadcast_address": str,
}


def decode_identify_response(data: bytes) -> LookupdInfo:
    """nsqd's reading of the IDENTIFY reply; raises ResponseError where Go gives up."""
    if data == b"E_INVALID":
        raise ResponseError("lookupd returned E_INVALID")
    try:
        values = _go_unmarshal_object(data, _INFO_FIELDS) or {}
    except ValueError:
        raise ResponseError(f"parsing response - {_wire_str(data)}") from None
    return LookupdInfo(**values)
