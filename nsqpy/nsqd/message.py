"""Messages as the engine keeps them, and their IDs (spec §2.1, §7.3).

A message is a plain tuple ``(id, timestamp_ns, attempts, body)``: no per-message
class instance, so millions of them cost the garbage collector nothing (tuples of
bytes and ints are untracked after their first collection). In-flight, requeued,
deferred and disk-read messages, and those of a PUB, are such tuples.

The messages of one MPUB are queued as one :class:`Run` instead: the MPUB's body
as it came off the wire (each message body behind its 4-byte size) and what the
messages have in common: their IDs are consecutive (one 13-hex-digit prefix and a
3-hex-digit sequence), their timestamp is the publish time, their attempts are 0.
So a queued message costs its bytes on the wire and no object of its own (a tuple,
an ID and a body: ~390 B for a 200-byte body, ~205 B in a run). A channel reads
messages off the head of a run when it delivers them (``Channel._dispatch_pass``,
:func:`take`); what is left is a new, shorter run in its place: runs are immutable,
and shared by all the channels of a topic. (MPUBs of one message or of kilobyte
bodies come from the parser as lists of bodies and are queued as tuples:
``wire.v2.MPUB_SPLIT_FROM``.)
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar

from nsqpy.wire.v2 import MESSAGE_HEADER, decode_message, encode_message

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
HEX3: Final = [b"%03x" % seq for seq in range(_SEQUENCE_MASK + 1)]  # 12 bits = 3 hex digits


RUN_SIZE: Final = struct.Struct(">I")  # a body's size in a run's payload


class Run(NamedTuple):
    """``length`` messages of one MPUB: their bodies are ``payload[start:]`` as on the wire
    (``<size><body>`` each), their IDs ``prefix + %03x(seq + i)``; attempts are 0."""

    payload: bytes
    start: int
    length: int
    prefix: bytes
    seq: int
    timestamp: int


Entry: TypeAlias = Message | Run
"""A memory-queue entry: one message, or a run of them."""

_T = TypeVar("_T")


def new_runs(
    payload: bytes, count: int, timestamp: int, spans: list[tuple[bytes, int, int]]
) -> list[Run]:
    """The runs of ``count`` packed bodies, one per span of IDs (GUIDFactory.new_spans)."""
    if len(spans) == 1:
        prefix, seq, _ = spans[0]
        return [Run(payload, 0, count, prefix, seq, timestamp)]
    runs: list[Run] = []
    pos = 0
    unpack = RUN_SIZE.unpack_from
    for prefix, seq, n in spans:  # the 4096 IDs of a tick ran out: a new prefix
        runs.append(Run(payload, pos, n, prefix, seq, timestamp))
        for _ in range(n):
            pos += 4 + unpack(payload, pos)[0]
    return runs


def run_messages(run: Run, count: int) -> tuple[list[Message], Run | None]:
    """The first ``count`` messages of ``run`` as tuples, and the run of the others (None if
    there are none)."""
    payload, pos, total, prefix, seq, timestamp = run
    unpack = RUN_SIZE.unpack_from
    msgs: list[Message] = []
    append = msgs.append
    for hex3 in HEX3[seq : seq + min(count, total)]:
        (size,) = unpack(payload, pos)
        pos += 4
        append((prefix + hex3, timestamp, 0, payload[pos : pos + size]))
        pos += size
    if count >= total:
        return msgs, None
    if not count:
        return msgs, run
    return msgs, Run(payload, pos, total - count, prefix, seq + count, timestamp)


def run_head(run: Run, count: int) -> Run:
    """The run of the first ``count`` messages of ``run``."""
    return Run(run.payload, run.start, count, run.prefix, run.seq, run.timestamp)


def cut(run: Run, count: int) -> tuple[Run, Run]:
    """``run`` in two: its first ``count`` messages and the others (0 < count < run.length)."""
    payload, start, total, prefix, seq, timestamp = run
    pos = start
    unpack = RUN_SIZE.unpack_from
    for _ in range(count):
        pos += 4 + unpack(payload, pos)[0]
    return (
        Run(payload, start, count, prefix, seq, timestamp),
        Run(payload, pos, total - count, prefix, seq + count, timestamp),
    )


def take(memory: deque[_T | Run], count: int) -> list[_T | Message]:
    """Up to ``count`` messages off the head of a memory queue: the head of a longer run is
    cut off and the rest of it left in its place. Other entries come out as they are."""
    out: list[_T | Message] = []
    popleft = memory.popleft
    while memory and len(out) < count:
        entry = popleft()
        if isinstance(entry, Run):
            msgs, rest = run_messages(entry, count - len(out))
            out.extend(msgs)
            if rest is not None:
                memory.appendleft(rest)
        else:
            out.append(entry)
    return out


# The TTL sweep (expire_queue): queues of up to this many entries are searched whole for
# expired messages behind live ones; a backend is read this many records at a time.
FULL_SCAN_MAX: Final = 10_000
_DISK_CHUNK: Final = 64


def expire_queue(
    memory: deque[Any],
    oldest: int,
    backend_depth: Callable[[], int],
    read_backend: Callable[[int], list[Any]],
    disk_budget: int,
) -> tuple[list[Any], int]:
    """Remove the messages published before ``oldest`` (unix ns) from a queue: its memory,
    then, once memory is empty, its backend's head (``read_backend(n)``: decoded messages,
    reading at most about ``disk_budget`` records), where the first live ones read stay in
    memory. Returns the expired messages (runs taken apart; a topic's deferred ones keep
    their fifth field) and by how many messages memory's depth changed.

    Publish order is timestamp order: expired messages are at the head, except requeued
    ones at the back, found by a full pass on queues of up to FULL_SCAN_MAX entries (on
    bigger ones the delivery check still stops them). A run's messages share one
    timestamp: it expires whole."""
    expired: list[Any] = []
    while memory and _timestamp(memory[0]) < oldest:
        expired.extend(expand([memory.popleft()]))
    if memory and len(memory) <= FULL_SCAN_MAX and any(_timestamp(e) < oldest for e in memory):
        keep = [e for e in memory if _timestamp(e) >= oldest]
        expired.extend(expand(e for e in memory if _timestamp(e) < oldest))
        memory.clear()
        memory.extend(keep)
    delta = -len(expired)
    read = 0
    while not memory and backend_depth() and read < disk_budget:
        chunk = read_backend(_DISK_CHUNK)
        read += _DISK_CHUNK
        expired.extend(m for m in chunk if m[1] < oldest)
        live = [m for m in chunk if m[1] >= oldest]
        memory.extend(live)
        delta += len(live)
    return expired, delta


def _timestamp(entry: Any) -> int:
    ts: int = entry.timestamp if isinstance(entry, Run) else entry[1]
    return ts


def drop_last(memory: deque[_T | Run], count: int) -> None:
    """Remove the last ``count`` messages of a memory queue (it holds that many)."""
    while count > 0:
        entry = memory.pop()
        if isinstance(entry, Run):
            if entry.length > count:
                memory.append(run_head(entry, entry.length - count))
                return
            count -= entry.length
        else:
            count -= 1


def split(entries: list[Entry], count: int) -> tuple[list[Entry], list[Entry]]:
    """The entries of the first ``count`` messages, and those of the others."""
    head: list[Entry] = []
    n = 0
    for i, entry in enumerate(entries):
        if n == count:
            return head, entries[i:]
        if isinstance(entry, Run):
            if n + entry.length > count:
                first, rest = cut(entry, count - n)  # count > n here
                head.append(first)
                return head, [rest, *entries[i + 1 :]]
            n += entry.length
        else:
            n += 1
        head.append(entry)
    return head, []


def expand(entries: Iterable[_T | Run]) -> list[_T | Message]:
    """Every message of these entries, runs taken apart (other entries as they are)."""
    out: list[_T | Message] = []
    for entry in entries:
        if isinstance(entry, Run):
            out.extend(run_messages(entry, entry.length)[0])
        else:
            out.append(entry)
    return out


def to_payloads(entries: Iterable[Entry]) -> list[bytes]:
    """The disk-queue records of these entries' messages (to_payload, runs taken apart
    without a tuple per message)."""
    out: list[bytes] = []
    append = out.append
    pack = MESSAGE_HEADER.pack  # a record's head: timestamp, attempts, ID
    unpack = RUN_SIZE.unpack_from
    for entry in entries:
        if isinstance(entry, Run):
            payload, pos, length, prefix, seq, timestamp = entry
            for hex3 in HEX3[seq : seq + length]:
                end = pos + 4 + unpack(payload, pos)[0]
                append(pack(timestamp, 0, prefix + hex3) + payload[pos + 4 : end])
                pos = end
        else:
            append(to_payload(entry))
    return out


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

    __slots__ = ("_last_ts", "_node_bits", "_prefix", "_sequence")

    def __init__(self, node_id: int) -> None:
        self._node_bits = node_id << _SEQUENCE_BITS
        self._last_ts = -1
        self._sequence = 0
        # The 13 hex digits shared by the IDs of the current tick (all but the sequence's 3)
        self._prefix = b""

    def _tick(self, ts: int) -> None:
        self._last_ts = ts
        self._sequence = 0
        base = ((ts - _TWEPOCH) << (_SEQUENCE_BITS + _NODE_ID_BITS)) | self._node_bits
        self._prefix = b"%013x" % (base >> _SEQUENCE_BITS)

    def new_ids(self, count: int) -> list[bytes]:
        """``count`` new IDs as 16 lowercase hex bytes each."""
        ids: list[bytes] = []
        for prefix, first, n in self.new_spans(count):
            # Each ID is one concatenation (in C, through map).
            ids.extend(map(prefix.__add__, HEX3[first : first + n]))
        return ids

    def new_spans(self, count: int) -> list[tuple[bytes, int, int]]:
        """``count`` new IDs as spans ``(prefix, first sequence, n)``: the IDs of a span are
        ``prefix`` (13 hex digits) followed by the sequences first..first+n-1 (3 hex digits).
        One span, unless the 4096 sequences of a tick run out."""
        spans: list[tuple[bytes, int, int]] = []
        now = time.time_ns() >> 20
        while count > 0:
            if now > self._last_ts:
                self._tick(now)
                first = 0
            else:
                first = self._sequence + 1
                if first > _SEQUENCE_MASK:
                    self._tick(self._last_ts + 1)
                    first = 0
            last = min(_SEQUENCE_MASK, first + count - 1)
            spans.append((self._prefix, first, last - first + 1))
            count -= last - first + 1
            self._sequence = last
        return spans

    def new_id(self, now_ns: int) -> bytes:
        """One new ID at ``now_ns`` (time.time_ns(), the message's timestamp): new_ids(1)'s,
        for PUB, without the run arithmetic."""
        now = now_ns >> 20
        if now > self._last_ts:
            self._tick(now)
            return self._prefix + HEX3[0]
        sequence = self._sequence + 1
        if sequence > _SEQUENCE_MASK:
            return self.new_ids(1)[0]
        self._sequence = sequence
        return self._prefix + HEX3[sequence]
