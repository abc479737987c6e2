"""A topic: copies every message to each of its channels (spec §7.1).

Go runs a pump goroutine between the topic's queue and its channels. Here a publish
goes straight into the channels when the topic is *flowing* (it has channels, is
not paused and has no backlog), which is what Go's pump would do at once. Otherwise
messages wait in the topic's own queue (memory, then backend) and the engine drains
that backlog in bounded steps once the topic flows again, so that order is kept and
the event loop is never held for long.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING, Any

from nsqpy.nsqd.backend import BackendError, BackendQueue
from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.message import (
    Entry,
    Message,
    Run,
    cut,
    expand,
    from_payload,
    new_runs,
    split,
    take,
    to_payload,
    to_payloads,
)
from nsqpy.nsqd.policy import Counts, Effective, trim
from nsqpy.wire.names import is_ephemeral
from nsqpy.wire.v2 import MPubBody

if TYPE_CHECKING:
    from nsqpy.nsqd.nsqd import NSQD

# A backlog entry is a Message, a deferred one carrying its delay as a fifth field, or a Run.
BacklogMessage = tuple[bytes, int, int, bytes] | tuple[bytes, int, int, bytes, float]
BacklogEntry = BacklogMessage | Run


class Topic:
    __slots__ = (
        "_backend",
        "_depth",
        "_flowing",
        "_held",
        "_ids",
        "_memory",
        "_nsqd",
        "channels",
        "ephemeral",
        "exiting",
        "message_bytes",
        "message_count",
        "name",
        "paused",
        "policy",
        "policy_counts",
        "redefer",
    )

    def __init__(self, name: str, nsqd: NSQD, backend: BackendQueue) -> None:
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self._nsqd = nsqd
        self._backend = backend
        self._memory: deque[BacklogEntry] = deque()
        self._depth = 0  # messages in _memory
        self._ids = nsqd.ids
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        # Channels that take publishes directly right now (see the module docstring).
        self._flowing: list[Channel] = []
        # >0 while the channels nsqlookupd knows of are being created (Go's startChan):
        # messages wait in the backlog so that those channels get them too.
        self._held = 0
        # Deferred messages written to the backend at the last exit: ID → due (unix ns).
        self.redefer: dict[bytes, int] | None = None
        # Message policies (policy.py) of the backlog; None when nothing applies.
        self.policy: Effective | None = nsqd.policies.rules(name, None)
        self.policy_counts: Counts | None = None

    def __repr__(self) -> str:
        return f"Topic({self.name})"

    @property
    def depth(self) -> int:
        return self._depth + self._backend.depth()

    @property
    def backend_depth(self) -> int:
        return self._backend.depth()

    # -- publishing -------------------------------------------------------------------------

    def put_messages(self, bodies: list[bytes] | MPubBody) -> int:
        """PUB and MPUB: all the messages are queued, or none (raises BackendError).
        Returns how many. An MPUB's packed bodies (wire.v2.MPubBody) are queued as runs
        (message.py)."""
        if self.exiting:
            raise BackendError("exiting")
        entries: list[Entry]
        if isinstance(bodies, tuple):
            payload, count = bodies
            entries = list(new_runs(payload, count, time.time_ns(), self._ids.new_spans(count)))
            size = len(payload) - 4 * count
        elif len(bodies) == 1:
            self.put_one(bodies[0])
            return 1
        else:
            count = len(bodies)
            ids = self._ids.new_ids(count)
            entries = list(zip(ids, repeat(time.time_ns()), repeat(0), bodies, strict=False))
            size = sum(map(len, bodies))
        self._queue(entries, count, size)
        return count

    def put_one(self, body: bytes) -> None:
        """PUB (and MPUB of one): put_messages([body]) without its batch cases."""
        if self.exiting:
            raise BackendError("exiting")
        self._queue([(self._ids.new_id(), time.time_ns(), 0, body)], 1, len(body))

    def put_copies(self, copies: list[tuple[int, bytes]]) -> None:
        """Publish ``(timestamp_ns, body)`` messages keeping their timestamps (dead letters,
        policy.py): new IDs, attempts from zero; all or none (raises BackendError)."""
        if self.exiting:
            raise BackendError("exiting")
        ids = self._ids.new_ids(len(copies))
        msgs: list[Entry] = [(i, ts, 0, body) for i, (ts, body) in zip(ids, copies, strict=True)]
        self._queue(msgs, len(msgs), sum(len(body) for _, body in copies))

    def _queue(self, entries: list[Entry], count: int, size: int) -> None:
        """Into the channels if they flow, else the topic's backlog; then count them."""
        if self._flowing:
            self._put_channels(entries, count)
        else:
            self._put_backlog(entries, count)
        self.message_count += count
        self.message_bytes += size

    def _put_channels(self, entries: list[Entry], count: int) -> None:
        """Copy to every channel, all or nothing: if one refuses (a disk error), the
        channels before it give the batch back, so the publisher's retry duplicates nothing."""
        done: list[Channel] = []
        for channel in self._flowing:
            try:
                channel.enqueue(entries, count)
            except BackendError:
                for earlier in done:
                    if not earlier.unqueue(count):
                        self._nsqd.logf_error(
                            f"TOPIC({self.name}): channel({earlier.name}) keeps {count} message(s)"
                            f" that channel({channel.name}) refused"
                        )
                raise
            done.append(channel)
        later = self._nsqd.dispatch_after_reply
        for channel in done:
            if channel.clients:
                if later is None:
                    channel.dispatch()
                else:
                    later[channel] = None

    def put_deferred(self, body: bytes, delay: float) -> None:
        """DPUB: the message enters each channel's deferred queue."""
        if self.exiting:
            raise BackendError("exiting")
        msg: Message = (self._ids.new_id(), time.time_ns(), 0, body)
        if self._flowing:
            for channel in self._flowing:
                channel.put_deferred(msg, delay)
        elif self._depth < self._nsqd.opts.mem_queue_size:
            self._memory.append((*msg, delay))
            self._depth += 1
        else:
            # Go writes it to the backend, where the deferral is lost (spec §11).
            self._backend.put(to_payload(msg))
        if self.policy is not None and not self._flowing:
            trim(self, self.policy)
        self.message_count += 1
        self.message_bytes += len(body)

    def _put_backlog(self, entries: list[Entry], count: int) -> None:
        room = self._nsqd.opts.mem_queue_size - self._depth
        if room < count:
            entries, rest = split(entries, max(room, 0))
            self._backend.put_many(to_payloads(rest))
            count = max(room, 0)
        self._memory.extend(entries)
        self._depth += count
        if self.policy is not None:
            trim(self, self.policy)
        if self.channels and not self.paused and not self._held:
            self._nsqd.request_pump(self)

    # -- the backlog pump -----------------------------------------------------------------

    def pump(self, budget: int) -> bool:
        """Move up to ``budget`` backlog messages into the channels; True if more remain."""
        live = [c for c in self.channels.values() if not c.exiting]
        if not live or self.paused or self.exiting or self._held:
            return False
        moved = 0
        while moved < budget:
            batch: list[BacklogEntry]
            if self._memory:
                batch = self._take_entries(budget - moved)
            elif self._backend.depth():
                try:
                    batch = [
                        self._redeferred(from_payload(p))
                        for p in self._backend.read_many(budget - moved)
                    ]
                except (BackendError, ValueError) as err:
                    self._nsqd.logf_error(
                        f"TOPIC({self.name}): failed to read from backend - {err}"
                    )
                    break
                if not batch:
                    break
            else:
                break
            plain: list[Entry] = []
            count = 0
            for entry in batch:
                if isinstance(entry, Run):
                    plain.append(entry)  # shared by the channels, as a publish's runs are
                    count += entry.length
                elif len(entry) == 5:
                    for channel in live:
                        channel.put_deferred(entry[:4], entry[4])
                    moved += 1
                else:
                    plain.append(entry)
                    count += 1
            moved += count
            for channel in live:
                try:
                    channel.put_many(plain, count)
                except BackendError as err:
                    self._nsqd.logf_error(
                        f"TOPIC({self.name}): failed to put msg(s) to channel({channel.name}) - {err}"
                    )
        if self._memory or self._backend.depth():
            return True
        self._update_flowing()
        return False

    def _take_entries(self, count: int) -> list[BacklogEntry]:
        """Entries of up to ``count`` messages off the backlog's head (runs stay runs)."""
        memory = self._memory
        out: list[BacklogEntry] = []
        while memory and count > 0:
            entry = memory[0]
            if isinstance(entry, Run) and entry.length > count:
                head, memory[0] = cut(entry, count)  # only the head of this run fits
                out.append(head)
                self._depth -= count
                break
            memory.popleft()
            out.append(entry)
            n = entry.length if isinstance(entry, Run) else 1
            self._depth -= n
            count -= n
        return out

    def take(self, count: int) -> list[BacklogMessage]:
        """Up to ``count`` messages off the backlog's memory head (policy.py)."""
        memory: deque[Any] = self._memory  # (mypy cannot infer take's type from the union)
        out: list[BacklogMessage] = take(memory, count)
        self._depth -= len(out)
        return out

    def _redeferred(self, msg: Message) -> BacklogEntry:
        if self.redefer is None:
            return msg
        due = self.redefer.pop(msg[0], None)
        if not self.redefer:
            self.redefer = None
        now = time.time_ns()
        if due is None or due <= now:
            return msg
        return (*msg, (due - now) / 1e9)

    def deferred_due(self) -> dict[bytes, int]:
        """Due times (unix ns) of deferred messages in the backlog, for the exit side file."""
        now = time.time_ns()
        due = dict(self.redefer or {})
        for entry in self._memory:
            if not isinstance(entry, Run) and len(entry) == 5:
                due[entry[0]] = now + int(entry[4] * 1e9)
        return due

    def _update_flowing(self) -> None:
        has_backlog = bool(self._memory) or self._backend.depth() > 0
        if self.paused or self.exiting or has_backlog or self._held:
            self._flowing = []
        else:
            self._flowing = [c for c in self.channels.values() if not c.exiting]
        if has_backlog and self.channels and not self.paused and not self._held:
            self._nsqd.request_pump(self)

    def hold(self) -> None:
        """Keep messages in the topic until release() (while its known channels are created)."""
        self._held += 1
        self._update_flowing()

    def release(self) -> None:
        self._held = max(0, self._held - 1)
        self._update_flowing()

    # -- channels ---------------------------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """The channel, created (and announced) if it does not exist."""
        channel = self.channels.get(name)
        if channel is None:
            backend = self._nsqd.new_backend(
                f"{self.name}:{name}", self.ephemeral or is_ephemeral(name)
            )
            channel = Channel(self.name, name, self._nsqd, backend)
            self.channels[name] = channel
            self._nsqd.logf_info(f"TOPIC({self.name}): new channel({name})")
            self._update_flowing()
            self._nsqd.notify_channel_created(channel)
        return channel

    def delete_channel(self, name: str) -> None:
        """Delete the channel (closes its consumers); raises KeyError if it does not exist."""
        channel = self.channels[name]
        self._nsqd.logf_info(f"TOPIC({self.name}): deleting channel {name}")
        channel.close(deleted=True)
        del self.channels[name]
        self._update_flowing()
        self._nsqd.notify_channel_deleted(channel)
        if not self.channels and self.ephemeral:
            self._nsqd.delete_topic(self.name)

    # -- operations ---------------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self._update_flowing()

    def unpause(self) -> None:
        self.paused = False
        self._update_flowing()

    def empty(self) -> None:
        self._memory.clear()
        self._depth = 0
        self._backend.empty()
        self._update_flowing()

    def close(self, *, deleted: bool) -> None:
        """Delete (channels too, files removed) or close (everything left goes to the backends)."""
        if self.exiting:
            return
        self.exiting = True
        self._flowing = []
        if deleted:
            for channel in list(self.channels.values()):
                channel.close(deleted=True)
                self._nsqd.notify_channel_deleted(channel)
            self.channels.clear()
            self._memory.clear()
            self._depth = 0
            try:
                self._backend.empty()
                self._backend.delete()
            except BackendError as err:
                self._nsqd.logf_error(f"TOPIC({self.name}): error deleting - {err}")
            return
        for channel in self.channels.values():
            channel.close(deleted=False)
        if self._memory:
            payloads: list[bytes] = []
            memory: deque[Any] = self._memory
            entry: BacklogMessage
            for entry in expand(memory):
                payloads.append(to_payload(entry if len(entry) == 4 else entry[:4]))
            self._memory.clear()
            self._depth = 0
            try:
                self._backend.put_many(payloads)
            except BackendError as err:
                self._nsqd.logf_error(
                    f"TOPIC({self.name}): failed to flush {len(payloads)} messages - {err}"
                )
        try:
            self._backend.close()
        except BackendError as err:  # e.g. a full disk: log it, nsqd goes on closing
            self._nsqd.logf_error(f"TOPIC({self.name}): error closing - {err}")
