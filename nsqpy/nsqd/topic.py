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
from collections.abc import Callable
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
    expire_queue,
    from_payload,
    new_runs,
    split,
    take,
    to_payload,
    to_payloads,
)
from nsqpy.nsqd.policy import Counts, Effective, trim
from nsqpy.wire.names import is_ephemeral, is_valid_channel_name
from nsqpy.wire.v2 import MPubBody

if TYPE_CHECKING:
    from nsqpy.nsqd.nsqd import NSQD

# A backlog entry is a Message, a deferred one carrying its delay as a fifth field, or a Run.
BacklogMessage = tuple[bytes, int, int, bytes] | tuple[bytes, int, int, bytes, float]
BacklogEntry = BacklogMessage | Run


def _plain(entry: BacklogEntry) -> Message:
    """A backlog message without its delay (a deferred one dropped or expired)."""
    return entry if len(entry) == 4 else entry[:4]


class InvalidNameError(ValueError):
    """A topic or channel name that NSQ's rules refuse (wire.names): none is ever made."""


class Topic:
    __slots__ = (
        "_backend",
        "_depth",
        "_flowing",
        "_held",
        "_ids",
        "_memory",
        "_nsqd",
        "_on_start",
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
        # Called once the topic has started (release() of the last hold): the answers to
        # the request that created it (NSQD.open_topic).
        self._on_start: list[Callable[[], None]] = []
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

    def put_messages(
        self,
        bodies: list[bytes] | MPubBody,
        delay: float = 0.0,
        timestamps: list[int] | None = None,
    ) -> int:
        """Queue messages (Go's PutMessage(s)): all of them, or none (raises BackendError).
        Returns how many. An MPUB's packed bodies (wire.v2.MPubBody) are queued as runs
        (message.py); ``delay`` defers a single message (DPUB); ``timestamps`` keeps each
        message's own (dead letters: new IDs, attempts from zero)."""
        if self.exiting:
            raise BackendError("exiting")
        entries: list[Entry]
        if isinstance(bodies, tuple):
            payload, count = bodies
            entries = list(new_runs(payload, count, time.time_ns(), self._ids.new_spans(count)))
            size = len(payload) - 4 * count
        elif len(bodies) == 1 and timestamps is None:
            body = bodies[0]
            now = time.time_ns()
            msg: Message = (self._ids.new_id(now), now, 0, body)
            if delay > 0:
                self._defer(msg, delay)
            elif self._flowing:  # into the channels if they flow, else the topic's backlog
                self._put_channels([msg], 1)
            else:
                self._put_backlog([msg], 1)
            self.message_count += 1
            self.message_bytes += len(body)
            return 1
        else:
            count = len(bodies)
            ids = self._ids.new_ids(count)
            stamps = repeat(time.time_ns()) if timestamps is None else timestamps
            entries = list(zip(ids, stamps, repeat(0), bodies, strict=False))
            size = sum(map(len, bodies))
        if delay > 0:
            raise ValueError("only a single message can be deferred")
        if self._flowing:
            self._put_channels(entries, count)
        else:
            self._put_backlog(entries, count)
        self.message_count += count
        self.message_bytes += size
        return count

    def _put_channels(self, entries: list[Entry], count: int) -> None:
        """Copy to every channel, all or nothing: if one refuses (a disk error), the
        channels before it give the batch back, so the publisher's retry duplicates nothing."""
        flowing = self._flowing
        try:
            for channel in flowing:
                channel.enqueue(entries, count)
        except BackendError:
            for earlier in flowing:
                if earlier is channel:
                    break
                if not earlier.unqueue(count):
                    self._nsqd.logf_error(
                        f"TOPIC({self.name}): channel({earlier.name}) keeps {count} message(s)"
                        f" that channel({channel.name}) refused"
                    )
            raise
        for channel in flowing:
            if channel.clients:
                self._nsqd.request_dispatch(channel)

    def _defer(self, msg: Message, delay: float) -> None:
        """DPUB: the message enters each channel's deferred queue."""
        if self._flowing:
            for channel in self._flowing:
                channel.put_deferred(msg, delay)
            return
        if self._depth < self._nsqd.opts.mem_queue_size:
            self._memory.append((*msg, delay))
            self._depth += 1
        else:
            # Go writes it to the backend, where the deferral is lost (spec §11).
            self._backend.put(to_payload(msg))
        if self.policy is not None:
            trim(self, self.policy)

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
                batch = self._read_backend(budget - moved)
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
                    channel.keep(
                        plain, count, f"failed to put msg(s) from TOPIC({self.name}) - {err}"
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

    def _read_backend(self, count: int) -> list[BacklogEntry]:
        """Up to ``count`` messages off the backend's head (deferred again if they were
        deferred at the last exit); a record that cannot be decoded is logged and skipped."""
        try:
            payloads = self._backend.read_many(count)
        except BackendError as err:
            self._nsqd.logf_error(f"TOPIC({self.name}): failed to read from backend - {err}")
            return []
        out: list[BacklogEntry] = []
        for payload in payloads:
            try:
                out.append(self._redeferred(from_payload(payload)))
            except ValueError as bad:
                self._nsqd.logf_error(f"TOPIC({self.name}): failed to decode message - {bad}")
        return out

    # -- what message policies do to the backlog (policy.py) -----------------------------------

    def take_oldest(self, count: int) -> list[Message]:
        """Remove up to ``count`` messages from the backlog's head (memory, then the backend)."""
        memory: deque[Any] = self._memory  # (mypy cannot infer take's type from the union)
        out: list[Message] = [_plain(e) for e in take(memory, count)]
        self._depth -= len(out)
        if len(out) < count and self._backend.depth():
            out.extend(_plain(e) for e in self._read_backend(count - len(out)))
        return out

    def expire(self, oldest: int, disk_budget: int) -> list[Message]:
        """Remove the backlog's messages published before ``oldest`` (unix ns): from memory,
        then, once memory is empty, off the backend's head (reading at most about
        ``disk_budget`` records); the first live ones read stay at the head."""
        entries, delta = expire_queue(
            self._memory, oldest, self._backend.depth, self._read_backend, disk_budget
        )
        self._depth += delta
        expired = [_plain(e) for e in entries]
        if expired:
            self._update_flowing()
        return expired

    @property
    def full_name(self) -> str:
        """``topic`` or ``topic:channel`` (its disk queue's name)."""
        return self.name

    @property
    def label(self) -> str:
        """How logs name it: ``TOPIC(name)``."""
        return f"TOPIC({self.name})"

    @property
    def nsqd(self) -> NSQD:
        return self._nsqd

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
        if not self._held:
            self._started()

    @property
    def starting(self) -> bool:
        """The channels nsqlookupd knows of are still being made (Go's topic before Start)."""
        return self._held > 0

    def when_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the topic has started (at once if it has; also if it is
        deleted or closed first, so that nobody waits for ever)."""
        if self._held and not self.exiting:
            self._on_start.append(callback)
        else:
            callback()

    def _started(self) -> None:
        callbacks, self._on_start = self._on_start, []
        for callback in callbacks:
            callback()

    # -- channels ---------------------------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """The channel, created (and announced) if it does not exist; raises InvalidNameError."""
        channel = self.channels.get(name)
        if channel is None:
            if not is_valid_channel_name(name):
                raise InvalidNameError(f"invalid channel name {name!r}")
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
        self._started()  # whoever waits for the start answers now
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
