"""Messages as the engine keeps them, and their IDs (spec §2.1, §7.3).

A queued message is a plain tuple ``(id, timestamp_ns, attempts, body)``: no
per-message class instance, so millions of queued messages cost the garbage
collector nothing (tuples of bytes and ints are untracked after their first
collection) and one tuple is shared by every channel of a topic.
"""

from __future__ import annotations

import time
from typing import Final, TypeAlias

from nsqpy.wire.v2 import decode_message, encode_message

Message: TypeAlias = tuple[bytes, int, int, bytes]
"""``(id, timestamp_ns, attempts, body)``"""

# Field positions in a Message tuple, for readable indexing where unpacking does not fit.
MSG_ID: Final = 0
MSG_TIMESTAMP: Final = 1
MSG_ATTEMPTS: Final = 2
MSG_BODY: Final = 3

MAX_ATTEMPTS: Final = 0xFFFF

# 2010-11-04 01:42:54.288 UTC, in Go's "pseudo-milliseconds" (ns >> 20) like the ids
_TWEPOCH: Final = 1288834974288
_SEQUENCE_BITS: Final = 12
_NODE_ID_BITS: Final = 10
_SEQUENCE_MASK: Final = (1 << _SEQUENCE_BITS) - 1
_HEX3: Final = [b"%03x" % seq for seq in range(_SEQUENCE_MASK + 1)]  # 12 bits = 3 hex digits


def requeued(msg_id: bytes, timestamp: int, attempts: int, body: bytes) -> Message:
    """The message as it goes back to a queue after a REQ or a timeout.

    Attempts is a uint16 that Go lets wrap; storing 0xFFFF as -1 makes the next
    delivery's ``attempts + 1`` wrap to 0 without a check on the hot path.
    """
    return (msg_id, timestamp, attempts if attempts < MAX_ATTEMPTS else -1, body)


def to_payload(msg: Message) -> bytes:
    """The §2.1 encoding, as written to the disk queue."""
    msg_id, timestamp, attempts, body = msg
    return encode_message(msg_id, timestamp, attempts & MAX_ATTEMPTS, body)


def from_payload(payload: bytes) -> Message:
    msg_id, timestamp, attempts, body = decode_message(payload)
    return requeued(msg_id, timestamp, attempts, body)


class GUIDFactory:
    """Snowflake-style IDs of NSQ's ``guid.go``: unique per topic and node, time-ordered.

    Go sleeps 1 ms and retries when the clock goes backwards or the 4096 sequence
    numbers of one tick are used up; an event loop must not sleep, so this factory
    instead moves its own tick forward, which keeps IDs unique and increasing.
    """

    __slots__ = ("_last_ts", "_node_bits", "_sequence")

    def __init__(self, node_id: int) -> None:
        self._node_bits = node_id << _SEQUENCE_BITS
        self._last_ts = -1
        self._sequence = 0

    def new_ids(self, count: int) -> list[bytes]:
        """``count`` new IDs as 16 lowercase hex bytes each."""
        ids: list[bytes] = []
        now = time.time_ns() >> 20
        while count > 0:
            if now > self._last_ts:
                self._last_ts = now
                self._sequence = 0
                first = 0
            else:
                first = self._sequence + 1
                if first > _SEQUENCE_MASK:
                    self._last_ts += 1
                    self._sequence = 0
                    first = 0
            last = min(_SEQUENCE_MASK, first + count - 1)
            base = (
                (self._last_ts - _TWEPOCH) << (_SEQUENCE_BITS + _NODE_ID_BITS)
            ) | self._node_bits
            # The sequence is the low 12 bits, the last 3 hex digits: the other 13 are the
            # same for the whole run, so each ID is one concatenation (in C, through map).
            ids.extend(map((b"%013x" % (base >> _SEQUENCE_BITS)).__add__, _HEX3[first : last + 1]))
            count -= last - first + 1
            self._sequence = last
        return ids

    def new_id(self) -> bytes:
        """One new ID: new_ids(1)'s, for PUB, without the run arithmetic."""
        now = time.time_ns() >> 20
        if now > self._last_ts:
            self._last_ts = now
            sequence = 0
        else:
            sequence = self._sequence + 1
            if sequence > _SEQUENCE_MASK:
                return self.new_ids(1)[0]
        self._sequence = sequence
        base = ((self._last_ts - _TWEPOCH) << (_SEQUENCE_BITS + _NODE_ID_BITS)) | self._node_bits
        return b"%013x" % (base >> _SEQUENCE_BITS) + _HEX3[sequence]
