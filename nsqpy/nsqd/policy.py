"""Message policies (beyond NSQ): max attempts, dead-letter topics, message TTL, bounded queues.

Everything about policies lives here: the policy object and its JSON (parsing, validation
with NSQ-style error codes), the effective policy of a topic or channel (channel > topic >
nsqd flag, with where each value comes from), the side file that keeps them across restarts,
and the decisions "deliver / dead-letter / drop". Topics and channels call in at a few named
points, each behind ``if x.policy is not None`` so that nothing is paid when nothing is set:

- ``Channel.requeue`` and the in-flight timeout: :func:`returned` (max attempts);
- delivery (``Channel._sampled``, the careful path): :func:`admit` (TTL, max attempts);
- ``Channel._enqueue`` and ``Topic._put_backlog``: :func:`trim` (max depth, RabbitMQ's drop-head);
- the queue scan (``NSQD.queue_scan``): :meth:`PolicyBook.tick` expires what no one reads,
  from memory, the deferred heap and the disk queue.

A dead-lettered message is published on this nsqd to the dead-letter topic with the same
body and timestamp and attempts from zero (a new ID: IDs are unique per topic). Without a
dead-letter topic it is dropped, counted and logged (WARN, once per queue per minute).

Policies are stored in ``nsqd.policies.dat`` next to ``nsqd.dat`` (which stays exactly the
Go nsqd's, so a Go nsqd still opens the data directory; it ignores the side file).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Final, Protocol

from nsqpy.common.goflags import format_duration_ns, parse_duration_ns
from nsqpy.nsqd.backend import BackendError
from nsqpy.nsqd.message import MAX_ATTEMPTS, Message
from nsqpy.nsqd.metadata import write_file_atomically
from nsqpy.wire.names import is_ephemeral, is_valid_topic_name

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.nsqd import NSQD
    from nsqpy.nsqd.topic import Topic

__all__ = [
    "CHANNEL_FIELDS",
    "POLICY_FILE",
    "TOPIC_FIELDS",
    "Counts",
    "Effective",
    "Policy",
    "PolicyBook",
    "PolicyError",
    "admit",
    "returned",
    "trim",
]

POLICY_FILE: Final = "nsqd.policies.dat"
CHANNEL_FIELDS: Final = ("max_attempts", "dead_letter_topic", "message_ttl", "max_depth")
TOPIC_FIELDS: Final = ("dead_letter_topic", "message_ttl", "max_depth")

# How often the queue scan expires what nobody reads, and how much it reads from disk per go.
SWEEP_INTERVAL: Final = 1.0
SWEEP_DISK_BUDGET: Final = 50_000
# Dead letters published while publishing dead letters (two full queues dead-lettering to
# each other): beyond this depth they are dropped instead of bouncing for ever.
_MAX_NESTING: Final = 4
_WARN_EVERY: Final = 60.0


class PolicyError(ValueError):
    """A policy the HTTP API refuses: ``str(err)`` is the NSQ-style code (400)."""


@dataclass(frozen=True)
class Policy:
    """The fields set at one level (topic or channel); None means "not set here"."""

    max_attempts: int | None = None
    dead_letter_topic: str | None = None
    message_ttl: int | None = None  # nanoseconds
    max_depth: int | None = None

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = format_duration_ns(value) if f.name == "message_ttl" else value
        return out

    def updated(self, body: bytes, owner_topic: str, *, channel: bool) -> Policy:
        """This policy with a POSTed JSON object applied (absent fields kept, null clears)."""
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise PolicyError("INVALID_BODY") from None
        if not isinstance(raw, dict):
            raise PolicyError("INVALID_BODY")
        return replace(self, **parse_fields(raw, owner_topic, channel=channel))


def parse_fields(raw: dict[str, Any], owner_topic: str, *, channel: bool) -> dict[str, Any]:
    """Validated field values (None to clear); raises PolicyError."""
    allowed = CHANNEL_FIELDS if channel else TOPIC_FIELDS
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in allowed:
            raise PolicyError("UNKNOWN_FIELD")
        if value is None:
            out[key] = None
        elif key in ("max_attempts", "max_depth"):
            limit = MAX_ATTEMPTS if key == "max_attempts" else (1 << 63) - 1
            if type(value) is not int or not 0 <= value <= limit:
                raise PolicyError(f"INVALID_{key.upper()}")
            out[key] = value
        elif key == "message_ttl":
            out[key] = _parse_ttl(value)
        else:
            if (
                not isinstance(value, str)
                or not is_valid_topic_name(value)
                or is_ephemeral(value)
                or value == owner_topic
            ):
                raise PolicyError("INVALID_DEAD_LETTER_TOPIC")
            out[key] = value
    return out


def _parse_ttl(value: object) -> int:
    if type(value) is int and value == 0:
        return 0
    if not isinstance(value, str):
        raise PolicyError("INVALID_MESSAGE_TTL")
    try:
        ns = parse_duration_ns(value)
    except ValueError:
        raise PolicyError("INVALID_MESSAGE_TTL") from None
    if ns < 0:
        raise PolicyError("INVALID_MESSAGE_TTL")
    return ns


def policy_from_json(raw: object, owner_topic: str, *, channel: bool) -> Policy:
    """A stored policy (the side file); raises PolicyError on anything invalid."""
    if not isinstance(raw, dict):
        raise PolicyError("INVALID_BODY")
    return Policy(**parse_fields(raw, owner_topic, channel=channel))


# -- the effective policy ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Effective:
    """What applies to one topic or channel, every level resolved; 0 / "" = off."""

    max_attempts: int
    dead_letter_topic: str
    ttl_ns: int
    max_depth: int
    sources: dict[str, str]

    @property
    def active(self) -> bool:
        return bool(self.max_attempts or self.ttl_ns or self.max_depth)

    def to_json(self) -> dict[str, Any]:
        """``{field: {"value": v, "source": "channel"|"topic"|"flag"|"default"}}``."""
        values: dict[str, Any] = {
            "max_attempts": self.max_attempts,
            "dead_letter_topic": self.dead_letter_topic,
            "message_ttl": format_duration_ns(self.ttl_ns),
            "max_depth": self.max_depth,
        }
        return {k: {"value": v, "source": self.sources[k]} for k, v in values.items()}

    def values_json(self) -> dict[str, Any]:
        return {k: v["value"] for k, v in self.to_json().items()}


class Counts:
    """What a topic's or channel's policy did (``/stats``, ``/metrics``, statsd)."""

    __slots__ = ("dead_letter_count", "expired_count", "last_warn", "overflow_count")

    def __init__(self) -> None:
        self.dead_letter_count = 0
        self.expired_count = 0
        self.overflow_count = 0
        self.last_warn = -_WARN_EVERY


# -- the book: every policy of an nsqd ----------------------------------------------------------


class PolicyBook:
    """Policies by name (they outlive the topic/channel objects: a channel deleted and
    re-created by a consumer keeps its policy), their persistence, and the TTL sweep."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.topics: dict[str, Policy] = {}
        self.channels: dict[tuple[str, str], Policy] = {}
        self._next_sweep = 0.0
        self._nesting = 0
        # dead-letter topic → the queues ("topic" or "topic:channel") that send it messages
        self.sources: dict[str, set[str]] = {}

    def _has_ttl(self) -> bool:
        return bool(
            self.nsqd.opts.message_ttl
            or any(p.message_ttl for p in self.topics.values())
            or any(p.message_ttl for p in self.channels.values())
        )

    # -- resolution ---------------------------------------------------------------------

    def effective(self, topic: str, channel: str | None) -> Effective:
        opts = self.nsqd.opts
        tp = self.topics.get(topic) or Policy()
        cp = (self.channels.get((topic, channel)) or Policy()) if channel is not None else Policy()
        sources: dict[str, str] = {}

        def pick(name: str, flag_value: Any, empty: Any) -> Any:
            for level, p in (("channel", cp), ("topic", tp)):
                if level == "topic" and name == "max_attempts":
                    continue
                value = getattr(p, name)
                if value is not None:
                    sources[name] = level
                    return value
            if flag_value:
                sources[name] = "flag"
                return flag_value
            sources[name] = "default"
            return empty

        suffix = opts.dead_letter_topic_suffix
        derived = topic + suffix if suffix and is_valid_topic_name(topic + suffix) else ""
        return Effective(
            pick("max_attempts", opts.max_attempts if channel is not None else 0, 0),
            pick("dead_letter_topic", derived, ""),
            pick("message_ttl", int(opts.message_ttl * 1e9), 0),
            pick("max_depth", opts.max_queue_depth, 0),
            sources,
        )

    def rules(self, topic: str, channel: str | None) -> Effective | None:
        """The effective policy, or None when it does nothing (the hot path's test)."""
        eff = self.effective(topic, channel)
        if not eff.active:
            return None
        if eff.dead_letter_topic:  # what the dead-letter topic's page links back to
            source = topic if channel is None else f"{topic}:{channel}"
            self.sources.setdefault(eff.dead_letter_topic, set()).add(source)
        return eff

    def refresh(self, topic: Topic) -> None:
        """Re-resolve a live topic's and its channels' policies after a change."""
        topic.policy = self.rules(topic.name, None)
        if topic.policy is not None and not topic.exiting:
            trim(topic, topic.policy)  # a new max_depth applies to what is queued now
        for channel in list(topic.channels.values()):
            channel.policy = self.rules(topic.name, channel.name)
            if channel.policy is not None and not channel.exiting:
                trim(channel, channel.policy)

    # -- changes (HTTP) -----------------------------------------------------------------

    def get(self, topic: str, channel: str | None) -> Policy:
        if channel is None:
            return self.topics.get(topic) or Policy()
        return self.channels.get((topic, channel)) or Policy()

    def set(self, topic: str, channel: str | None, policy: Policy) -> None:
        """Store (or, for an empty policy, clear) a level's policy; persists it; raises OSError."""
        if channel is None:
            table: dict[Any, Policy] = self.topics
            key: Any = topic
        else:
            table = self.channels
            key = (topic, channel)
        before = table.get(key)
        if policy.is_empty():
            table.pop(key, None)
        else:
            table[key] = policy
        live = self.nsqd.topics.get(topic)
        if live is not None:
            self.refresh(live)
        if (channel is None or not is_ephemeral(channel)) and not is_ephemeral(topic):
            try:
                self.save()
            except OSError:
                if before is None:
                    table.pop(key, None)
                else:
                    table[key] = before
                if live is not None:
                    self.refresh(live)
                raise

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: its and its channels' policies go with it."""
        had = self.topics.pop(topic, None) is not None
        for key in [k for k in self.channels if k[0] == topic]:
            del self.channels[key]
            had = True
        if had:
            try:
                self.save()
            except OSError as err:
                self.nsqd.logf_error(f"failed to persist policies - {err}")

    # -- persistence ----------------------------------------------------------------------

    def save(self) -> None:
        if not self.nsqd.use_disk:
            return
        path = os.path.join(self.nsqd.data_path, POLICY_FILE)
        data = {
            "version": 1,
            "topics": {
                t: p.to_json() for t, p in sorted(self.topics.items()) if not is_ephemeral(t)
            },
            "channels": {
                f"{t}:{c}": p.to_json()
                for (t, c), p in sorted(self.channels.items())
                if not is_ephemeral(t) and not is_ephemeral(c)
            },
        }
        if self.nsqd.policy_sink is not None:  # --workers: worker 0 writes every worker's
            self.nsqd.policy_sink(data)
            return
        write_file_atomically(path, json.dumps(data, separators=(",", ":")).encode())

    def load(self) -> None:
        """Read the side file (before topics are created); what is invalid is logged and skipped."""
        path = os.path.join(self.nsqd.data_path, POLICY_FILE)
        try:
            with open(path, "rb") as f:
                raw = json.loads(f.read())
            topics = raw.get("topics") or {}
            channels = raw.get("channels") or {}
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError) as err:
            self.nsqd.logger.warn(f"POLICY: ignoring unreadable {path} - {err}")
            return
        owns = self.nsqd.owns
        for name, value in topics.items():
            if not owns(str(name)):
                continue  # --workers: another worker's
            try:
                self.topics[str(name)] = policy_from_json(value, str(name), channel=False)
            except (PolicyError, TypeError) as err:
                self.nsqd.logger.warn(f"POLICY: skipping policy of topic {name} - {err}")
        for name, value in channels.items():
            t, _, c = str(name).partition(":")
            if not owns(t):
                continue
            try:
                self.channels[(t, c)] = policy_from_json(value, t, channel=True)
            except (PolicyError, TypeError) as err:
                self.nsqd.logger.warn(f"POLICY: skipping policy of channel {name} - {err}")

    # -- dead letters ---------------------------------------------------------------------

    def dead_letter(
        self, source: str, label: str, rules: Effective, counts: Counts, msgs: list[Message]
    ) -> bool:
        """Publish ``msgs`` to the dead-letter topic (True), or drop them (logged); never raises."""
        if not msgs:
            return False
        target = rules.dead_letter_topic
        nsqd = self.nsqd
        topic_name = source.partition(":")[0]
        if target and target != topic_name and not nsqd.exiting and self._nesting < _MAX_NESTING:
            self._nesting += 1
            try:
                nsqd.publish(target, [m[3] for m in msgs], timestamps=[m[1] for m in msgs])
                self.sources.setdefault(target, set()).add(source)
                return True
            except BackendError as err:
                nsqd.logf_error(
                    f"{label}: failed to dead-letter {len(msgs)} message(s) to {target} - {err}"
                )
            finally:
                self._nesting -= 1
        now = time.monotonic()
        if now - counts.last_warn >= _WARN_EVERY:
            counts.last_warn = now
            nsqd.logger.warn(
                f"{label}: dropped {len(msgs)} dead-lettered message(s)"
                + (
                    f" (dead-letter topic {target} unavailable)"
                    if target
                    else " (no dead-letter topic)"
                )
            )
        return False

    def count(self, counts: Counts, kind: str, n: int, *, moved: bool) -> None:
        """Count ``n`` dead letters; with --sync-every=1 a move counts once it is on disk."""
        nsqd = self.nsqd
        if not (moved and nsqd.use_disk and nsqd.opts.sync_every == 1):
            setattr(counts, kind, getattr(counts, kind) + n)
            return
        pending = 0

        def synced(err: BaseException | None) -> None:
            nonlocal pending
            pending -= 1
            if not pending:
                setattr(counts, kind, getattr(counts, kind) + n)

        pending = nsqd.sync_touched(synced)
        if not pending:  # nothing reached a disk queue (it waits in memory, as a publish does)
            setattr(counts, kind, getattr(counts, kind) + n)

    # -- the sweep (called by the queue scan) ------------------------------------------------

    def tick(self, now: float) -> None:
        """Once a second: expire what nobody reads (topic backlogs, channels without consumers)."""
        if now < self._next_sweep or not self._has_ttl():
            return
        self._next_sweep = now + SWEEP_INTERVAL
        now_ns = time.time_ns()
        for topic in list(self.nsqd.topics.values()):
            if topic.exiting:
                continue
            if topic.policy is not None and topic.policy.ttl_ns:
                sweep(topic, topic.policy, now_ns)
            for channel in list(topic.channels.values()):
                if channel.policy is not None and channel.policy.ttl_ns and not channel.exiting:
                    sweep(channel, channel.policy, now_ns)


# -- what /stats, /metrics and statsd show ---------------------------------------------------------


class PolicyOwner(Protocol):
    """What stats read of a topic or channel's policy (Topic and Channel have it)."""

    name: str
    policy: Effective | None
    policy_counts: Counts | None

    @property
    def nsqd(self) -> NSQD: ...


def stats_fields(owner: PolicyOwner, *, channel: bool) -> dict[str, Any]:
    """The counters and the effective policy of a topic or channel, for its stats entry;
    empty when no policy applies and nothing was ever counted (``/stats`` stays Go's)."""
    counts = owner.policy_counts
    rules = owner.policy
    out: dict[str, Any] = {}
    if not channel:
        sources = owner.nsqd.policies.sources.get(owner.name)
        if sources:
            # a dead-letter topic: where its messages came from (nsqadmin links back)
            out["dead_letter_sources"] = sorted(sources)
    if counts is None and rules is None:
        return out
    if channel:
        out["dead_letter_count"] = counts.dead_letter_count if counts else 0
    out["expired_count"] = counts.expired_count if counts else 0
    out["overflow_count"] = counts.overflow_count if counts else 0
    if rules is not None:
        out["policy"] = rules.values_json()
    return out


def stats_text(entry: Mapping[str, Any]) -> str:
    """The ``/stats`` text line of a topic's or channel's policy ("" when it shows none)."""
    if "expired_count" not in entry:
        return ""
    policy = entry.get("policy")
    rules = " ".join(f"{k}={v}" for k, v in policy.items()) if policy else "none"
    dead = f" dead-lettered: {entry['dead_letter_count']}" if "dead_letter_count" in entry else ""
    return (
        f"policy: {rules}{dead} expired: {entry['expired_count']}"
        f" overflow: {entry['overflow_count']}"
    )


# -- decisions on a channel ---------------------------------------------------------------------


def _counts(owner: Topic | Channel) -> Counts:
    counts = owner.policy_counts
    if counts is None:
        counts = owner.policy_counts = Counts()
    return counts


def _send(owner: Topic | Channel, rules: Effective, msgs: list[Message], kind: str) -> None:
    if not msgs:
        return
    counts = _counts(owner)
    book = owner.nsqd.policies
    moved = book.dead_letter(owner.full_name, owner.label, rules, counts, msgs)
    book.count(counts, kind, len(msgs), moved=moved)


def returned(channel: Channel, rules: Effective, msg: Message) -> bool:
    """A message comes back (REQ, in-flight timeout): True if it was dead-lettered
    (it has been delivered max_attempts times) instead of going back on the queue."""
    limit = rules.max_attempts
    if not limit or (msg[2] & MAX_ATTEMPTS) < limit or channel.exiting:
        return False  # (at exit it goes to disk with the others, decided after the restart)
    _send(channel, rules, [msg], "dead_letter_count")
    return True


def admit(channel: Channel, rules: Effective, msg: Message, now_ns: int) -> bool:
    """At delivery: False if the message expired or used its attempts (it is dead-lettered)."""
    if rules.ttl_ns and now_ns - msg[1] > rules.ttl_ns:
        _send(channel, rules, [msg], "expired_count")
        return False
    if rules.max_attempts and (msg[2] & MAX_ATTEMPTS) >= rules.max_attempts:
        _send(channel, rules, [msg], "dead_letter_count")
        return False
    return True


def trim(owner: Channel | Topic, rules: Effective) -> None:
    """After messages were queued in a channel or a topic: drop-head down to max_depth
    (overflow)."""
    limit = rules.max_depth
    if not limit or owner.exiting:
        return
    excess = owner.depth - limit
    if excess > 0:
        _send(owner, rules, owner.take_oldest(excess), "overflow_count")


def sweep(owner: Topic | Channel, rules: Effective, now_ns: int) -> None:
    """Expire what waits in a topic's backlog or a channel (queued or deferred) past the TTL."""
    _send(owner, rules, owner.expire(now_ns - rules.ttl_ns, SWEEP_DISK_BUDGET), "expired_count")
