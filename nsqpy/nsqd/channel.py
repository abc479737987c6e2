"""A channel: one copy of its topic's stream, shared by its consumers (spec §2.5, §7.1).

The hot path is ``put_many`` → ``dispatch`` (deliver to ready consumers) and
``finish``. In-flight messages live in one dict per consumer, keyed by message ID:
a consumer's deliveries all use its own msg_timeout, so the dict's insertion order
is deadline order and the timeout scan only looks at the front of each dict; FIN is
a single ``dict.pop``. The one exception, a TOUCH whose new deadline is capped by
--max-msg-timeout, flags the consumer's dict for a full scan.
"""

from __future__ import annotations

import heapq
import itertools
import operator
import random
import struct
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

from nsqpy.diskqueue import DiskQueue
from nsqpy.nsqd.backend import BackendError, BackendQueue, DiskBackend
from nsqpy.nsqd.e2e import E2EStream
from nsqpy.nsqd.message import (
    HEX3,
    MAX_ATTEMPTS,
    RUN_SIZE,
    Entry,
    Message,
    Run,
    drop_last,
    expand,
    expire_queue,
    requeued,
    split,
    take,
    to_payload,
    to_payloads,
)
from nsqpy.nsqd.policy import Counts, Effective, admit, returned, trim
from nsqpy.nsqd.topology import preference_for
from nsqpy.wire.names import is_ephemeral
from nsqpy.wire.v2 import MESSAGE_FRAME_HEADER, MESSAGE_HEADER

if TYPE_CHECKING:
    from nsqpy.nsqd.nsqd import NSQD

# A message frame up to the ID: size, frame type, timestamp, attempts (MESSAGE_FRAME_HEADER's
# first fields).
_FRAME_HEAD = struct.Struct(">iiqH")
# A run's part of this many messages or more is framed by C loops (map, struct.iter_unpack,
# slice assignment) rather than a Python loop: dearer to set up, cheaper per message (about
# even at 24-32 messages of 100 B, 20 % cheaper from 48 on).
_C_LOOPS_FROM: Final = 32
_first = operator.itemgetter(0)

Delivery: TypeAlias = tuple[bytes, int, int, bytes, float, float]
"""``(id, timestamp_ns, attempts, body, deadline, delivered_at)``; times are monotonic seconds."""


class Flight:
    """The in-flight record shared by the messages of a run that one pass delivered to one
    consumer: bodies of one size, first attempt, one deadline. Storing it under each of their
    IDs costs no allocation per message, where a :data:`Delivery` each cost a tuple and a kept
    body; a message's own record is made from it when needed (:func:`delivery`)."""

    __slots__ = ("deadline", "first", "now", "payload", "pos", "step", "timestamp")

    def __init__(
        self,
        payload: bytes,
        pos: int,
        step: int,
        first: int,
        timestamp: int,
        deadline: float,
        now: float,
    ) -> None:
        self.payload = payload  # the run's: message `first` at `pos`, the next at `pos + step`, ...
        self.pos = pos
        self.step = step  # 4 (the size) + the body's size
        self.first = first  # the ID sequence (its last 3 hex digits) of the message at pos
        self.timestamp = timestamp
        self.deadline = deadline
        self.now = now

    def delivery(self, msg_id: bytes) -> Delivery:
        at = self.pos + (int(msg_id[13:], 16) - self.first) * self.step + 4
        body = self.payload[at : at + self.step - 4]
        return (msg_id, self.timestamp, 1, body, self.deadline, self.now)


InFlight: TypeAlias = Delivery | Flight
"""What a consumer's ``in_flight`` maps an ID to."""


def delivery(msg_id: bytes, entry: InFlight) -> Delivery:
    """The in-flight message ``msg_id`` (stored as ``entry``) as a :data:`Delivery`."""
    return entry if isinstance(entry, tuple) else entry.delivery(msg_id)


def _timestamp(entry: InFlight) -> int:
    return entry[1] if isinstance(entry, tuple) else entry.timestamp


class Consumer(Protocol):
    """What a channel needs of a subscribed client (implemented by the TCP server)."""

    ready_count: int
    in_flight: dict[bytes, InFlight]
    irregular_in_flight: bool
    msg_timeout: float
    sample_rate: int
    message_count: int
    finish_count: int
    requeue_count: int

    def send_messages(self, frames: list[bytes], count: int, nbytes: int) -> None:
        """Queue these ``count`` message frames (header and body pieces, ``nbytes`` in all)
        for output."""

    def close_for_exit(self) -> None:
        """The channel is going away: close the connection."""


class ChannelError(Exception):
    """FIN/REQ/TOUCH failures (non-fatal) and SUB refusals; the text is NSQ's."""


class Channel:
    __slots__ = (
        "_backend",
        "_deferred",
        "_deferred_seq",
        "_depth",
        "_disk",
        "_floor_pinned",
        "_floor_seen",
        "_floor_seen_at",
        "_from_disk",
        "_mem_size",
        "_memory",
        "_next",
        "_nsqd",
        "_orphans",
        "backend_deliveries",
        "clients",
        "delivery_count",
        "e2e",
        "ephemeral",
        "exiting",
        "message_count",
        "name",
        "paused",
        "policy",
        "policy_counts",
        "redefer",
        "requeue_count",
        "timeout_count",
        "topic_name",
        "topology",
    )

    def __init__(self, topic_name: str, name: str, nsqd: NSQD, backend: BackendQueue) -> None:
        self.topic_name = topic_name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self._nsqd = nsqd
        self._backend = backend
        self._mem_size = nsqd.opts.mem_queue_size
        # Messages and runs of messages (message.py); _depth counts the messages.
        self._memory: deque[Entry] = deque()
        self._depth = 0
        self._deferred: list[tuple[float, int, Message]] = []
        self._deferred_seq = itertools.count()
        self.clients: list[Consumer] = []
        # In-flight dicts of consumers that disconnected: their messages wait for
        # their timeout, as in NSQ (spec §2.5).
        self._orphans: list[dict[bytes, InFlight]] = []
        self._next = 0
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.delivery_count = 0  # every delivery, first or not
        # Messages read off the backend to be delivered: Go master's global_msg_count counts
        # only what its consumers take from the memory queue (stats.py subtracts these).
        self.backend_deliveries = 0
        self.e2e: E2EStream | None = nsqd.new_e2e_stream()
        # Topology-aware consumption (topology.py): None unless the experiment is on.
        self.topology = preference_for(nsqd.opts)
        # Message ID → due time (unix ns) of deferred messages written to the backend at the
        # last exit (metadata.py): they are deferred again when read back.
        self.redefer: dict[bytes, int] | None = None
        # Message policies (policy.py): None when nothing applies, so the hot path skips them.
        self.policy: Effective | None = nsqd.policies.rules(topic_name, name)
        self.policy_counts: Counts | None = None
        # Messages read off the disk queue and not finished yet, ID → the read's sequence
        # number, oldest read first: the disk queue keeps them (hold_reads) until they are, so
        # that a kill -9 loses none of them (at least once: the finished ones read after the
        # oldest unfinished one come again too).
        self._disk: DiskQueue | None = None
        self._from_disk: dict[bytes, int] | None = None
        self._floor_seen = b""  # the oldest read last found queued or deferred, and when
        self._floor_seen_at = 0.0
        self._floor_pinned: int | None = None  # what an exit could not write back holds
        if isinstance(backend, DiskBackend):
            self._disk = backend.dq
            self._from_disk = {}
            backend.dq.hold_reads(self._disk_floor)

    def __repr__(self) -> str:
        return f"Channel({self.topic_name}:{self.name})"

    # -- stats --------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return self._depth + self._backend.depth()

    @property
    def backend_depth(self) -> int:
        return self._backend.depth()

    @property
    def in_flight_count(self) -> int:
        return sum(len(c.in_flight) for c in self.clients) + sum(len(d) for d in self._orphans)

    @property
    def deferred_count(self) -> int:
        return len(self._deferred)

    # -- consumers ------------------------------------------------------------------------

    def add_client(self, client: Consumer) -> None:
        if self.exiting:
            raise ChannelError("exiting")
        limit = self._nsqd.opts.max_channel_consumers
        if limit and len(self.clients) >= limit:
            raise ChannelError(
                f"consumers for {self.topic_name}:{self.name} exceeds limit of {limit}"
            )
        self.clients.append(client)

    def remove_client(self, client: Consumer) -> None:
        try:
            self.clients.remove(client)
        except ValueError:
            return
        if client.in_flight:
            self._orphans.append(client.in_flight)
            client.in_flight = {}
        if not self.clients and self.ephemeral and not self.exiting:
            self._nsqd.delete_ephemeral_channel(self)

    # -- putting messages in ------------------------------------------------------------

    def put_many(self, entries: list[Entry], count: int | None = None) -> None:
        """Queue messages (memory first, then the backend) and deliver what can be;
        ``count`` is how many the entries hold (default: they are all single messages).

        All or nothing: on BackendError none of them was queued."""
        self.enqueue(entries, len(entries) if count is None else count)
        if self.clients:
            self.dispatch()

    def enqueue(self, entries: list[Entry], count: int) -> None:
        """put_many without the delivery (a topic queues in every channel first)."""
        self._enqueue(entries, count)
        self.message_count += count
        if self.policy is not None:
            trim(self, self.policy)

    def unqueue(self, count: int) -> bool:
        """Take back the last ``count`` messages queued by enqueue, before any dispatch
        (a multi-channel MPUB that another channel refused); False if they are not all
        still in memory (they reached the backend)."""
        if self._depth < count:
            return False
        drop_last(self._memory, count)
        self._depth -= count
        self.message_count -= count
        return True

    def _enqueue(self, entries: list[Entry], count: int) -> None:
        room = self._mem_size - self._depth
        if room >= count:
            self._memory.extend(entries)
            self._depth += count
            return
        if self.ephemeral and self._mem_size == 0 and self.clients:
            # NSQ's unbuffered hand-off: only what a ready consumer takes right now.
            self._memory.extend(entries)
            self._depth += count
            self.dispatch()
            self._memory.clear()
            self._depth = 0
            return
        # The backend first: if it refuses, nothing of this batch was queued (MPUB is atomic).
        head, rest = split(entries, max(room, 0))
        self._backend.put_many(to_payloads(rest))
        if head:
            self._memory.extend(head)
            self._depth += max(room, 0)

    def keep(self, entries: list[Entry], count: int, why: str) -> None:
        """Messages the backend refused (a full or read-only disk) that nsqd acknowledged
        long ago (a REQ, a timeout, a due deferral): kept in memory beyond --mem-queue-size
        rather than dropped as Go does (docs/RELIABILITY.md)."""
        self._nsqd.logf_error(f"CHANNEL({self.topic_name}:{self.name}): {why} (kept in memory)")
        self._memory.extend(entries)
        self._depth += count

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` messages off the head of the memory queue."""
        msgs = take(self._memory, count)
        self._depth -= len(msgs)
        return msgs

    def put_deferred(self, msg: Message, delay: float) -> None:
        self.message_count += 1
        self._push_deferred(msg, delay)

    def _push_deferred(self, msg: Message, delay: float) -> None:
        heapq.heappush(self._deferred, (time.monotonic() + delay, next(self._deferred_seq), msg))
        self._nsqd.scan_candidate(self)

    # -- delivery -----------------------------------------------------------------------

    def dispatch(self) -> None:
        """Hand queued messages to consumers with room under their RDY.

        In Go every consumer's pump competes for each message, so a burst is spread over
        a channel's ready consumers; here each ready consumer gets at most its share of
        what is queued per pass, and passes repeat while messages and room remain."""
        if self.paused or not self.clients:
            return
        if not self._depth and not self._backend.depth():
            return  # nothing queued (a FIN or RDY after the queue ran dry: the usual case)
        clients = self.clients
        if self.topology is not None:  # zone-local consumers first, then region-local
            self.topology.dispatch(clients, self._dispatch_pass)
            return
        if len(clients) == 1:
            self._dispatch_pass(0)
            return
        while True:
            queued = self._depth + self._backend.depth()
            if queued <= 1:  # none, or one (a PUB): the next consumer with room takes it
                if queued:
                    self._dispatch_pass(0)
                return
            ready = sum(1 for c in clients if c.ready_count > len(c.in_flight))
            if not ready:
                return
            share = -(-queued // ready) if ready > 1 else 0
            if not self._dispatch_pass(share) or not share:
                return

    def _dispatch_pass(self, share: int, order: Sequence[Consumer] | None = None) -> int:
        """One round over the consumers (or over ``order``, first to last), each taking up
        to ``share`` (0: all it has room for)."""
        clients = self.clients if order is None else order
        n = len(clients)
        start = self._next if order is None else 0
        now = 0.0
        delivered = 0
        # the index of the consumer visited: start, start + 1, ... (mod n); start may be
        # past the end (consumers left since it was set): then from the first
        i = start - 1
        for client in clients:
            i += 1
            if i >= n:
                i = 0
            client = clients[i]
            in_flight = client.in_flight
            room = client.ready_count - len(in_flight)
            if room <= 0:
                continue
            if share and room > share:
                room = share
            if self._depth < room and self._backend.depth():
                self._refill(room - self._depth)
            depth = self._depth
            if not depth:
                self._next = i
                break
            if not now:
                now = time.monotonic()
            deadline = now + client.msg_timeout
            frames: list[bytes] = []
            if client.sample_rate or self.policy is not None:
                take = self._sampled(client, room, frames, now, deadline)
                nbytes = sum(map(len, frames))
            else:
                take = left = room if room < depth else depth
                nbytes = 0
                memory = self._memory
                while left:
                    entry = memory.popleft()
                    if len(entry) == 6:  # a Run: its messages straight out of its payload
                        count, size = self._run_into(entry, left, frames, in_flight, deadline, now)
                        nbytes += size
                        left -= count
                        continue
                    msg_id, timestamp, attempts, body = entry
                    attempts += 1
                    size = len(body) + 30
                    nbytes += size + 4
                    frames.append(MESSAGE_FRAME_HEADER.pack(size, 2, timestamp, attempts, msg_id))
                    frames.append(body)
                    in_flight[msg_id] = (msg_id, timestamp, attempts, body, deadline, now)
                    left -= 1
                self._depth = depth - take
            if take:
                client.message_count += take
                self.delivery_count += take
                delivered += take
                client.send_messages(frames, take, nbytes)
        else:
            self._next = start + 1 if start + 1 < n else 0
        if now:
            self._nsqd.scan_candidate(self)
        return delivered

    def _run_into(
        self,
        run: Run,
        left: int,
        frames: list[bytes],
        in_flight: dict[bytes, InFlight],
        deadline: float,
        now: float,
    ) -> tuple[int, int]:
        """Frames for up to ``left`` messages of a run off the memory queue's head, straight
        out of its payload, and their in-flight records; the rest of the run stays at the
        head. Returns how many messages, and their frames' size."""
        payload, pos, length, prefix, seq, timestamp = run
        count = left if left < length else length
        last = seq + count
        # A frame's head up to the ID depends only on the body's size here (same timestamp,
        # attempts 1): packed once per size, not per message.
        size = RUN_SIZE.unpack_from(payload, pos)[0]
        step = 4 + size
        span = count * step
        first_pos = pos
        if pos + span <= len(payload) and all(
            payload[j : pos + span : step] == payload[j : j + 1] * count
            for j in range(pos, pos + 4)
        ):  # bodies of one size (the usual MPUB): no size to read per message, and one
            # in-flight record for them all
            flight = Flight(payload, pos, step, seq, timestamp, deadline, now)
            head = _FRAME_HEAD.pack(size + 30, 2, timestamp, 1)
            if count < _C_LOOPS_FROM:
                append = frames.append
                at = pos + 4
                for hex3 in HEX3[seq:last]:
                    msg_id = prefix + hex3
                    append(head + msg_id)
                    append(payload[at : at + size])
                    at += step
                    in_flight[msg_id] = flight
            else:  # the same in C loops: a frame is three pieces, two shared
                hexes = HEX3[seq:last]
                part = [head + prefix, b"", b""] * count
                part[1::3] = hexes
                part[2::3] = map(
                    _first,
                    struct.iter_unpack(b"4x%ds" % size, memoryview(payload)[pos : pos + span]),
                )
                frames += part
                in_flight.update(zip(map(prefix.__add__, hexes), itertools.repeat(flight)))
            pos += span
        else:
            pos = self._run_frames(
                payload, pos, prefix, seq, last, timestamp, frames, in_flight, deadline, now
            )
        if count < length:  # the rest of the run stays at the head
            self._memory.appendleft(Run(payload, pos, length - count, prefix, last, timestamp))
        return count, pos - first_pos + 30 * count  # <size><body> -> a frame

    @staticmethod
    def _run_frames(
        payload: bytes,
        pos: int,
        prefix: bytes,
        seq: int,
        last: int,
        timestamp: int,
        frames: list[bytes],
        in_flight: dict[bytes, InFlight],
        deadline: float,
        now: float,
    ) -> int:
        """The frames of messages ``seq:last`` of a run whose bodies differ in size, from
        ``pos`` in its payload; returns where the next message starts."""
        append = frames.append
        unpack = RUN_SIZE.unpack_from
        pack_head = _FRAME_HEAD.pack
        step, head = 0, b""
        for hex3 in HEX3[seq:last]:
            end = pos + 4 + unpack(payload, pos)[0]
            if end - pos != step:  # the head up to the ID: packed once per body size
                step = end - pos
                head = pack_head(step + 26, 2, timestamp, 1)
            body = payload[pos + 4 : end]
            pos = end
            msg_id = prefix + hex3
            append(head + msg_id)
            append(body)
            in_flight[msg_id] = (msg_id, timestamp, 1, body, deadline, now)
        return pos

    def _sampled(
        self, client: Consumer, room: int, frames: list[bytes], now: float, deadline: float
    ) -> int:
        # sample_rate S: a message goes out if rand[0,100) <= S, else this channel drops it;
        # like Go's pump, keep reading while the client is still ready. A policy's messages
        # come this way too, each checked before it goes (expired, out of attempts).
        pack = MESSAGE_FRAME_HEADER.pack
        policy = self.policy
        # admit() decides; these two bounds let most messages pass without the call
        oldest = time.time_ns() - policy.ttl_ns if policy is not None and policy.ttl_ns else 0
        attempts_left = policy.max_attempts - 1 if policy is not None else MAX_ATTEMPTS
        if attempts_left < 0:
            attempts_left = MAX_ATTEMPTS
        sent = 0
        batch: list[Message] = []
        i = 0
        while sent < room:
            if i == len(batch):
                # at most what is still wanted: each one taken is sent or dropped
                if not self._depth:
                    self._refill(room - sent)
                batch = self.take(room - sent)
                i = 0
                if not batch:
                    break
            msg = batch[i]
            i += 1
            if (
                policy is not None
                and (msg[1] < oldest or not -1 < msg[2] <= attempts_left)
                and not admit(self, policy, msg, time.time_ns())
            ):
                continue
            msg_id, timestamp, attempts, body = msg
            if client.sample_rate and random.randrange(100) > client.sample_rate:
                continue
            attempts += 1
            frames.append(pack(len(body) + 30, 2, timestamp, attempts, msg_id))
            frames.append(body)
            client.in_flight[msg_id] = (msg_id, timestamp, attempts, body, deadline, now)
            sent += 1
        return sent

    def _refill(self, count: int) -> None:
        msgs = self._read_backend(count)
        self._memory.extend(msgs)
        self._depth += len(msgs)
        self.backend_deliveries += len(msgs)

    def _read_backend(self, count: int) -> list[Message]:
        """Up to ``count`` messages off the backend's head. One that was deferred when nsqd
        last exited is deferred again for what is left of its delay, and not returned."""
        try:
            payloads = self._backend.read_many(count)
        except BackendError as err:
            self._nsqd.logf_error(f"{self.label}: failed to read from backend - {err}")
            return []
        redefer = self.redefer
        unpack = MESSAGE_HEADER.unpack_from
        out: list[Message] = []
        append = out.append
        from_disk = self._from_disk
        seq = 0
        if from_disk is not None:
            assert self._disk is not None
            seq = self._disk.read_seq - len(payloads)
        for payload in payloads:
            # from_payload inlined: this runs once per message read back from disk
            try:
                timestamp, attempts, msg_id = unpack(payload)
                if from_disk is not None:
                    if msg_id in from_disk:  # read again (written back): its place is new
                        del from_disk[msg_id]
                    from_disk[msg_id] = seq
                    seq += 1
            except struct.error:
                self._nsqd.logf_error(
                    f"{self.label}: failed to decode message"
                    f" - message payload too short: {len(payload)} bytes"
                )
                seq += 1
                continue
            msg = (msg_id, timestamp, attempts if attempts < MAX_ATTEMPTS else -1, payload[26:])
            if redefer is not None:
                # deferred when nsqd last exited: deferred again for what is left of its delay
                due = redefer.pop(msg_id, None)
                if due is not None and due > time.time_ns():
                    self._push_deferred(msg, (due - time.time_ns()) / 1e9)
                    continue
            append(msg)
        if redefer is not None and not redefer:
            self.redefer = None
        return out

    # -- what message policies do to the queue (policy.py) -------------------------------------

    def take_oldest(self, count: int) -> list[Message]:
        """Remove up to ``count`` messages from the queue's head (memory, then the backend)."""
        out = self.take(count)
        if len(out) < count and self._backend.depth():
            out.extend(self._read_backend(count - len(out)))
        self._forget(out)
        return out

    def _forget(self, msgs: Sequence[Message]) -> None:
        """Messages that left without a FIN (a policy's): no longer held on the disk queue."""
        from_disk = self._from_disk
        if from_disk:
            for msg in msgs:
                from_disk.pop(msg[0], None)

    def expire(self, oldest: int, disk_budget: int) -> list[Message]:
        """Remove the queued and deferred messages published before ``oldest`` (unix ns):
        memory, then, once memory is empty, the backend's head (reading at most about
        ``disk_budget`` records; the first live ones read wait in memory, and a message
        deferred at the last exit is deferred again, as any read does)."""
        expired: list[Message]
        expired, delta = expire_queue(
            self._memory, oldest, self._backend.depth, self._read_backend, disk_budget
        )
        self._depth += delta
        deferred = self._deferred
        if deferred and any(d[2][1] < oldest for d in deferred):
            expired.extend(d[2] for d in deferred if d[2][1] < oldest)
            deferred[:] = [d for d in deferred if d[2][1] >= oldest]
            heapq.heapify(deferred)
        if expired and self._memory and self.clients:
            self.dispatch()
        self._forget(expired)
        return expired

    @property
    def full_name(self) -> str:
        """``topic`` or ``topic:channel`` (its disk queue's name)."""
        return f"{self.topic_name}:{self.name}"

    @property
    def label(self) -> str:
        """How logs name it: ``CHANNEL(topic:channel)``."""
        return f"CHANNEL({self.full_name})"

    @property
    def nsqd(self) -> NSQD:
        return self._nsqd

    # -- acknowledgements -----------------------------------------------------------------

    def finish(self, client: Consumer, msg_id: bytes) -> None:
        failed = self.finish_many(client, [msg_id])
        if failed:
            raise ChannelError(failed[0][1])

    def finish_many(self, client: Consumer, msg_ids: list[bytes]) -> list[tuple[bytes, str]]:
        """FIN each message; returns ``(id, reason)`` for those that failed, in order. Only
        a FIN that succeeds lets go of its message's disk record (a failed one, say for
        another consumer's message, holds it still)."""
        pop = client.in_flight.pop
        failed: list[tuple[bytes, str]] = []
        e2e = self.e2e
        from_disk = self._from_disk
        if e2e is None and not from_disk:
            for msg_id in msg_ids:
                if pop(msg_id, None) is None:
                    failed.append((msg_id, self._not_in_flight_reason(msg_id)))
        else:
            now = time.time_ns() if e2e is not None else 0
            for msg_id in msg_ids:
                entry = pop(msg_id, None)
                if entry is None:
                    failed.append((msg_id, self._not_in_flight_reason(msg_id)))
                    continue
                if e2e is not None:
                    e2e.add(now - _timestamp(entry))
                if from_disk:
                    from_disk.pop(msg_id, None)
        client.finish_count += len(msg_ids) - len(failed)
        return failed

    def requeue(self, client: Consumer, msg_id: bytes, delay: float) -> None:
        entry = client.in_flight.pop(msg_id, None)
        if entry is None:
            raise ChannelError(self._not_in_flight_reason(msg_id))
        self.requeue_count += 1
        client.requeue_count += 1
        msg = requeued(*delivery(msg_id, entry)[:4])
        if self.policy is not None and returned(self, self.policy, msg):
            self._forget((msg,))
            return
        if delay <= 0:
            if self.exiting:
                raise ChannelError("exiting")
            self._put_back(msg)
        else:
            self._push_deferred(msg, delay)

    def touch(self, client: Consumer, msg_id: bytes) -> None:
        in_flight = client.in_flight
        entry = in_flight.pop(msg_id, None)
        if entry is None:
            raise ChannelError(self._not_in_flight_reason(msg_id))
        now = time.monotonic()
        deadline = now + client.msg_timeout
        msg_id, timestamp, attempts, body, _, delivered = delivery(msg_id, entry)
        max_deadline = delivered + self._nsqd.opts.max_msg_timeout
        if deadline >= max_deadline:
            deadline = max_deadline
            client.irregular_in_flight = True
        in_flight[msg_id] = (msg_id, timestamp, attempts, body, deadline, delivered)

    def _not_in_flight_reason(self, msg_id: bytes) -> str:
        if any(msg_id in c.in_flight for c in self.clients) or any(
            msg_id in d for d in self._orphans
        ):
            return "client does not own message"
        return "ID not in flight"

    def _disk_floor(self) -> int:
        """The disk queue's question (DiskQueue.hold_reads): the sequence number of the
        oldest read whose message is still here (in flight, queued or deferred), or the
        queue's read_seq when none is. Messages that left without a FIN (a policy's, a
        decode error) are forgotten here."""
        disk = self._disk
        from_disk = self._from_disk
        assert disk is not None and from_disk is not None
        if self._floor_pinned is not None:
            return self._floor_pinned
        floor = disk.read_seq
        gone: list[bytes] = []
        for msg_id, seq in from_disk.items():
            if self._holds(msg_id):
                floor = seq
                break
            gone.append(msg_id)
        for msg_id in gone:
            del from_disk[msg_id]
        return floor

    def _holds(self, msg_id: bytes) -> bool:
        for client in self.clients:
            if msg_id in client.in_flight:
                return True
        for orphans in self._orphans:
            if msg_id in orphans:
                return True
        # requeued or deferred: looked for in the queues, at most once a second per message
        now = time.monotonic()
        if msg_id == self._floor_seen and now - self._floor_seen_at < 1.0:
            return True
        if any(len(e) == 4 and e[0] == msg_id for e in self._memory) or any(
            d[2][0] == msg_id for d in self._deferred
        ):
            self._floor_seen = msg_id
            self._floor_seen_at = now
            return True
        return False

    def _put_back(self, msg: Message) -> None:
        """A requeued or timed-out message goes back on the queue (not counted again)."""
        try:
            self._enqueue([msg], 1)
        except BackendError as err:
            self.keep([msg], 1, f"failed to requeue message - {err}")
        if self.policy is not None:
            trim(self, self.policy)

    # -- the queue scan (in-flight timeouts and due deferred messages, spec §7.8) ----------

    def has_scan_work(self) -> bool:
        return bool(self._deferred or self._orphans or any(c.in_flight for c in self.clients))

    def process_in_flight_queue(self, now: float) -> bool:
        """Time out every in-flight message whose deadline has passed; True if any did."""
        dirty = False
        for client in self.clients:
            if client.in_flight and self._expire(client.in_flight, now, client.irregular_in_flight):
                dirty = True
                if not client.in_flight:
                    client.irregular_in_flight = False
        if self._orphans:
            for d in self._orphans:
                if self._expire(d, now, True):
                    dirty = True
            self._orphans = [d for d in self._orphans if d]
        if dirty:
            self.dispatch()
        return dirty

    def _expire(self, in_flight: dict[bytes, InFlight], now: float, full_scan: bool) -> bool:
        expired: list[Delivery] = []
        for msg_id, entry in in_flight.items():
            if (entry[4] if isinstance(entry, tuple) else entry.deadline) <= now:
                expired.append(delivery(msg_id, entry))
            elif not full_scan:
                break
        if not expired:
            return False
        policy = self.policy
        for entry in expired:
            del in_flight[entry[0]]
            msg = requeued(entry[0], entry[1], entry[2], entry[3])
            if policy is not None and returned(self, policy, msg):
                self._forget((msg,))
                continue
            self._put_back(msg)
        self.timeout_count += len(expired)
        return True

    def process_deferred_queue(self, now: float) -> bool:
        deferred = self._deferred
        if not deferred or deferred[0][0] > now:
            return False
        due: list[Entry] = []
        while deferred and deferred[0][0] <= now:
            due.append(heapq.heappop(deferred)[2])
        try:
            self._enqueue(due, len(due))
        except BackendError as err:
            self.keep(due, len(due), f"failed to queue deferred - {err}")
        if self.policy is not None:
            trim(self, self.policy)
        self.dispatch()
        return True

    # -- operations -----------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.dispatch()

    def empty(self) -> None:
        """Drop every queued, in-flight and deferred message (NSQ's Channel.Empty)."""
        self._memory.clear()
        self._depth = 0
        self._deferred.clear()
        self._orphans.clear()
        for client in self.clients:
            client.in_flight.clear()
            client.irregular_in_flight = False
        if self._from_disk:
            self._from_disk.clear()
        self._backend.empty()

    def peek(self, count: int) -> list[Message]:
        """The next ``count`` messages of the memory queue, left in place (GET /channel/peek)."""
        return expand(itertools.islice(self._memory, max(0, count)))[: max(0, count)]

    def deferred_due(self) -> dict[bytes, int]:
        """Due times (unix ns) of the deferred messages, for the side file written at exit."""
        offset = time.time_ns() - int(time.monotonic() * 1e9)
        due = dict(self.redefer or {})
        for deadline, _, msg in self._deferred:
            due[msg[0]] = offset + int(deadline * 1e9)
        return due

    def close(self, *, deleted: bool) -> None:
        """Delete (empty, drop the backend) or close (write everything left to the backend)."""
        if self.exiting:
            return
        self.exiting = True
        for client in list(self.clients):
            client.close_for_exit()
        try:
            if deleted:
                self.empty()
                self._backend.delete()
                return
            self._flush_to_backend()
            self._backend.close()
        except BackendError as err:  # e.g. a full disk: log it and let the others close
            self._nsqd.logf_error(f"CHANNEL({self.topic_name}:{self.name}): error closing - {err}")

    def _flush_to_backend(self) -> None:
        msgs: list[Message] = expand(self._memory)
        self._memory.clear()
        self._depth = 0
        for d in [c.in_flight for c in self.clients] + self._orphans:
            msgs.extend(requeued(*delivery(k, e)[:4]) for k, e in d.items())
            d.clear()
        self._orphans.clear()
        msgs.extend(m for _, _, m in sorted(self._deferred))
        self._deferred.clear()
        if msgs:
            try:
                self._backend.put_many([to_payload(m) for m in msgs])
            except BackendError as err:
                self._nsqd.logf_error(
                    f"CHANNEL({self.topic_name}:{self.name}): failed to flush {len(msgs)} messages - {err}"
                )
                if self._from_disk:
                    # the disk queue keeps what was read of them, for the next start
                    self._floor_pinned = next(iter(self._from_disk.values()))
                return
        if self._from_disk is not None:
            self._from_disk.clear()
