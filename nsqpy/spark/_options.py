"""The connector's options: parsed once from Spark's case-insensitive option map into frozen,
picklable dataclasses that travel to the executors inside the readers and writers.

Spark lower-cases option keys (``CaseInsensitiveDict``), so every lookup here uses the
lower-cased camelCase name. Durations accept ``250ms``, ``5s``, ``1m``, ``1h`` or a bare number
of milliseconds (NSQ's IDENTIFY unit).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from nsqpy.wire.names import is_valid_channel_name, is_valid_topic_name

__all__ = [
    "SinkOptions",
    "SourceOptions",
    "parse_addresses",
    "parse_duration",
    "split_host_port",
]

# Test hooks (fault injection) are honoured only when this variable is "1" in the executor's
# environment, so that an option copied into production by mistake does nothing.
TEST_HOOKS_ENV: Final = "NSQPY_SPARK_TEST_HOOKS"

DEFAULT_MAX_IN_FLIGHT: Final = 2500  # nsqd's default --max-rdy-count
DEFAULT_MAX_MSG_SIZE: Final = 1024 * 1024  # nsqd's default --max-msg-size
DEFAULT_MAX_BODY_SIZE: Final = 5 * 1024 * 1024  # nsqd's default --max-body-size

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 0.001}


def parse_duration(name: str, value: str) -> float:
    """``"250ms"``, ``"5s"``, ``"1m"``, ``"1h"`` or a bare number of milliseconds → seconds."""
    m = _DURATION.match(value)
    if not m:
        raise ValueError(f"option {name}: invalid duration {value!r} (e.g. 500ms, 5s, 1m)")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def parse_addresses(value: str) -> tuple[str, ...]:
    """A comma-separated list of ``host:port`` (or URLs for lookupd), blanks dropped."""
    return tuple(a.strip() for a in value.split(",") if a.strip())


def split_host_port(address: str) -> tuple[str, int]:
    """``"127.0.0.1:4150"`` / ``"[::1]:4150"`` → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def _digest(topics: tuple[str, ...], pattern: re.Pattern[str] | None) -> str:
    """A short stable name for a set of topics (a batch read's default log directory)."""
    text = pattern.pattern if pattern is not None else ",".join(topics)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


class _Options:
    """Typed access to Spark's option map (keys lower-cased by Spark)."""

    def __init__(self, raw: Mapping[str, str]) -> None:
        self._raw = {str(k).lower(): str(v) for k, v in raw.items()}

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self._raw.get(name.lower())
        return default if value is None or value == "" else value

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise ValueError(f"option {name} is required")
        return value

    def integer(self, name: str, default: int | None, *, minimum: int = 0) -> int | None:
        value = self.text(name)
        if value is None:
            return default
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"option {name}: {value!r} is not an integer") from None
        if n < minimum:
            raise ValueError(f"option {name}: {n} is below the minimum {minimum}")
        return n

    def duration(self, name: str, default: float) -> float:
        value = self.text(name)
        return default if value is None else parse_duration(name, value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"option {name}: {value!r} is not a boolean")


def _check_topic(name: str, topic: str) -> str:
    if not is_valid_topic_name(topic):
        raise ValueError(f"option {name}: {topic!r} is not a valid NSQ topic name")
    return topic


def _source_topics(o: _Options) -> tuple[tuple[str, ...], re.Pattern[str] | None]:
    """The source's topics: exactly one of ``topic``, ``topics`` (comma-separated) or
    ``topicPattern`` (a regular expression a whole topic name must match, as Kafka's
    ``subscribePattern``; the topics are then discovered)."""
    given = [n for n in ("topic", "topics", "topicPattern") if o.text(n) is not None]
    if len(given) != 1:
        raise ValueError("give exactly one of the options topic, topics, topicPattern")
    if given[0] == "topicPattern":
        text = o.required("topicPattern")
        try:
            return (), re.compile(text)
        except re.error as err:
            raise ValueError(f"option topicPattern: {text!r} is not a regular expression: {err}")
    names = parse_addresses(o.required(given[0]))
    if not names:
        raise ValueError(f"option {given[0]}: no topic given")
    if len(set(names)) != len(names):
        raise ValueError(f"option {given[0]}: a topic is listed twice")
    return tuple(_check_topic(given[0], t) for t in names), None


def _absolute_location(name: str, value: str) -> str:
    """A local path or ``file:`` URI as an absolute path (executors may have another cwd)."""
    if value.startswith("file://"):
        value = value[len("file://") :]
    elif value.startswith("file:"):
        value = value[len("file:") :]
    elif "://" in value:
        raise ValueError(
            f"option {name}: {value!r}: only local or shared (NFS) file-system paths are supported"
        )
    return os.path.abspath(value)


@dataclass(frozen=True)
class SourceOptions:
    """Options of ``spark.read`` / ``spark.readStream`` with ``format("nsq")``.

    ``topics`` are the topics named by ``topic`` or ``topics``; with ``topicPattern`` they are
    empty and ``topic_pattern`` is set (the planner discovers the topics).
    """

    topics: tuple[str, ...]
    topic_pattern: re.Pattern[str] | None
    channel: str
    nsqd_tcp_addresses: tuple[str, ...]
    nsqd_http_addresses: tuple[str, ...]
    lookupd_http_addresses: tuple[str, ...]
    wal_location: str
    wal_given: bool
    max_messages_per_trigger: int | None
    min_messages_per_trigger: int | None
    max_trigger_delay: float
    max_messages: int | None
    num_partitions: int | None
    max_messages_per_partition: int
    max_in_flight_per_connection: int
    read_budget: float
    idle_timeout: float
    connect_timeout: float
    msg_timeout_ms: int
    output_buffer_timeout_ms: int
    output_buffer_size: int
    dedupe_retention: float
    empty_poll_interval: float
    lookupd_poll_interval: float
    fail_on_data_loss: bool
    fsync: bool
    wal_segment_rows: int
    test_crash_after_wal: tuple[int, int] | None
    # The columns a read produces, from the schema Spark passes (the user's subset of the
    # source's columns, see _schema.columns_of); None: all of them.
    columns: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        o = _Options(raw)
        topics, pattern = _source_topics(o)
        channel = o.required("channel")
        if not is_valid_channel_name(channel):
            raise ValueError(f"option channel: {channel!r} is not a valid NSQ channel name")
        if channel.endswith("#ephemeral"):
            # nsqd deletes an ephemeral channel, and its messages, as soon as no client is
            # connected: between two micro-batches there is none.
            raise ValueError("option channel: ephemeral channels cannot be read by Spark")
        nsqd_tcp = parse_addresses(o.text("nsqdTCPAddresses", "") or "")
        lookupd = parse_addresses(o.text("lookupdHTTPAddresses", "") or "")
        nsqd_http = parse_addresses(o.text("nsqdHTTPAddresses", "") or "")
        if bool(nsqd_tcp) == bool(lookupd):
            raise ValueError(
                "give exactly one of the options nsqdTCPAddresses, lookupdHTTPAddresses"
            )
        for address in nsqd_tcp:
            split_host_port(address)
        if nsqd_http and len(nsqd_http) != len(nsqd_tcp):
            raise ValueError(
                "option nsqdHTTPAddresses must list one HTTP address per nsqdTCPAddresses entry"
            )
        if pattern is not None and nsqd_tcp and not nsqd_http:
            raise ValueError(
                "option topicPattern needs lookupdHTTPAddresses or nsqdHTTPAddresses "
                "(the topics are found in nsqlookupd's /topics or each nsqd's /stats)"
            )
        wal = o.text("walLocation")
        if wal is None:
            if streaming:
                raise ValueError(
                    "option walLocation is required for streaming reads "
                    "(e.g. <checkpointLocation>/nsq-wal, on storage every executor sees)"
                )
            name = topics[0] if len(topics) == 1 else f"multi-{_digest(topics, pattern)}"
            wal = os.path.join(tempfile.gettempdir(), "nsqpy-spark-wal", f"{name}.{channel}")
        max_rdy = o.integer("maxInFlightPerConnection", DEFAULT_MAX_IN_FLIGHT, minimum=1)
        assert max_rdy is not None
        per_partition = o.integer("maxMessagesPerPartition", 250_000, minimum=1)
        assert per_partition is not None
        msg_timeout = o.duration("msgTimeout", 0.0)
        obt = o.duration("outputBufferTimeout", 0.025)
        idle = o.duration("idleTimeout", 0.5)
        if idle <= obt:
            raise ValueError("option idleTimeout must exceed outputBufferTimeout")
        # nsqd's default --max-output-buffer-size: fewer, larger writes than its 16 KiB default.
        buffer_size = o.integer("outputBufferSize", 64 * 1024, minimum=0)
        assert buffer_size is not None
        segment_rows = o.integer("walSegmentRows", 10_000, minimum=1)
        assert segment_rows is not None
        crash = o.text("_testCrashAfterWal")
        crash_at: tuple[int, int] | None = None
        if crash is not None and os.environ.get(TEST_HOOKS_ENV) == "1":
            batch, _, index = crash.partition(",")
            crash_at = (int(batch), int(index or 0))
        per_trigger = o.integer("maxMessagesPerTrigger", None, minimum=1)
        min_per_trigger = o.integer("minMessagesPerTrigger", None, minimum=1)
        if (
            per_trigger is not None
            and min_per_trigger is not None
            and min_per_trigger > per_trigger
        ):
            raise ValueError("option minMessagesPerTrigger must not exceed maxMessagesPerTrigger")
        return cls(
            topics=topics,
            topic_pattern=pattern,
            channel=channel,
            nsqd_tcp_addresses=nsqd_tcp,
            nsqd_http_addresses=nsqd_http,
            lookupd_http_addresses=lookupd,
            wal_location=_absolute_location("walLocation", wal),
            wal_given=o.text("walLocation") is not None,
            max_messages_per_trigger=per_trigger,
            min_messages_per_trigger=min_per_trigger,
            max_trigger_delay=o.duration("maxTriggerDelay", 15 * 60.0),
            max_messages=o.integer("maxMessages", None, minimum=1),
            num_partitions=o.integer("numPartitions", None, minimum=1),
            max_messages_per_partition=per_partition,
            max_in_flight_per_connection=max_rdy,
            read_budget=o.duration("readBudget", 10.0),
            idle_timeout=idle,
            connect_timeout=o.duration("connectTimeout", 5.0),
            msg_timeout_ms=int(msg_timeout * 1000),
            output_buffer_timeout_ms=int(obt * 1000),
            output_buffer_size=buffer_size,
            dedupe_retention=o.duration("dedupeRetention", 24 * 3600.0),
            empty_poll_interval=o.duration("emptyPollInterval", 1.0),
            lookupd_poll_interval=o.duration("lookupdPollInterval", 5.0),
            fail_on_data_loss=o.boolean("failOnDataLoss", True),
            fsync=o.boolean("walFsync", True),
            wal_segment_rows=segment_rows,
            test_crash_after_wal=crash_at,
        )


@dataclass(frozen=True)
class SinkOptions:
    """Options of ``df.write`` / ``df.writeStream`` with ``format("nsq")``.

    ``topic`` None: every row names its topic in a ``topic`` column (checked with the schema).
    """

    topic: str | None
    nsqd_tcp_addresses: tuple[str, ...]
    lookupd_http_addresses: tuple[str, ...]
    marker_location: str | None
    publish_batch_size: int
    publish_pipeline: int
    max_msg_size: int
    max_body_size: int
    connect_timeout: float
    reply_timeout: float
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SinkOptions:
        o = _Options(raw)
        nsqd_tcp = parse_addresses(o.text("nsqdTCPAddresses", "") or "")
        lookupd = parse_addresses(o.text("lookupdHTTPAddresses", "") or "")
        if bool(nsqd_tcp) == bool(lookupd):
            raise ValueError(
                "give exactly one of the options nsqdTCPAddresses, lookupdHTTPAddresses"
            )
        for address in nsqd_tcp:
            split_host_port(address)
        marker = o.text("markerLocation")
        batch = o.integer("publishBatchSize", 2000, minimum=1)
        pipeline = o.integer("publishPipeline", 4, minimum=1)
        max_msg = o.integer("maxMsgSize", DEFAULT_MAX_MSG_SIZE, minimum=1)
        max_body = o.integer("maxBodySize", DEFAULT_MAX_BODY_SIZE, minimum=9)
        assert batch is not None and pipeline is not None
        assert max_msg is not None and max_body is not None
        topic = o.text("topic")
        return cls(
            topic=None if topic is None else _check_topic("topic", topic),
            nsqd_tcp_addresses=nsqd_tcp,
            lookupd_http_addresses=lookupd,
            marker_location=None
            if marker is None
            else _absolute_location("markerLocation", marker),
            publish_batch_size=batch,
            publish_pipeline=pipeline,
            max_msg_size=max_msg,
            max_body_size=max_body,
            connect_timeout=o.duration("connectTimeout", 5.0),
            reply_timeout=o.duration("replyTimeout", 30.0),
            fail_on_data_loss=o.boolean("failOnDataLoss", True),
        )
