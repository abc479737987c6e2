"""``nsq_to_nsq``: consume topics and re-publish the messages to other nsqd (spec §6)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nsqpy.client import Message, NSQClientError, Producer
from nsqpy.common.goflags import Kind, flag, parse_go_float
from nsqpy.common.gojson import encode_json
from nsqpy.tools._common import (
    ConsumerFlags,
    HostPoolFlags,
    StatusTimer,
    consume_until_stopped,
    consumer_options,
    fatal,
    go_log,
    parse_tool_args,
    producer_options,
    require_one_source,
    run,
    setup_client_logging,
    status_timers,
)
from nsqpy.tools._hostpool import HostPool
from nsqpy.wire.names import is_valid_channel_name, is_valid_topic_name

__all__ = ["Options", "main"]


@dataclass
class Options(ConsumerFlags, HostPoolFlags):
    """nsq_to_nsq's flags (apps/nsq_to_nsq)."""

    topics: list[str] = flag(
        "topic",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="nsq topic (may be given multiple times)",
    )
    channel: str = flag("channel", "nsq_to_nsq", kind=Kind.STRING, help="nsq channel")
    destination_topic: str = flag(
        "destination-topic",
        "",
        kind=Kind.STRING,
        help="use this destination topic for all consumed topics (default is consumed topic name)",
    )
    destination_nsqd_tcp_addresses: list[str] = flag(
        "destination-nsqd-tcp-address",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="destination nsqd TCP address (may be given multiple times)",
    )
    producer_opts: list[str] = flag(
        "producer-opt",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="option to passthrough to nsq.Producer (may be given multiple times, "
        "see http://godoc.org/github.com/nsqio/go-nsq#Config)",
    )
    status_every: int = flag(
        "status-every",
        250,
        kind=Kind.INT,
        help="the # of requests between logging status (per destination), 0 disables",
    )
    require_json_field: str = flag(
        "require-json-field",
        "",
        kind=Kind.STRING,
        help="for JSON messages: only pass messages that contain this field",
    )
    require_json_value: str = flag(
        "require-json-value",
        "",
        kind=Kind.STRING,
        help="for JSON messages: only pass messages in which the required field has this value",
    )
    whitelist_json_fields: list[str] = flag(
        "whitelist-json-field",
        default_factory=list,
        kind=Kind.STRING_LIST,
        help="for JSON messages: pass this field (may be given multiple times)",
    )


_PASS, _DROP, _BACKOFF = 0, 1, 2


class JSONFilter:
    """--require-json-field / --require-json-value / --whitelist-json-field."""

    def __init__(self, field: str, value: str, whitelist: list[str]) -> None:
        self.field = field
        self.value = value
        self.whitelist = whitelist
        self.active = bool(field or whitelist)
        try:
            self.number: float | None = parse_go_float(value) if value else None
        except ValueError:
            self.number = None

    def check(self, doc: Any) -> int:
        """Go's shouldPassMessage: pass, drop (finish), or back off (requeue)."""
        if not self.field:
            return _PASS
        if not isinstance(doc, dict) or self.field not in doc:
            if self.value:
                go_log("ERROR: missing field to check required value")
                return _BACKOFF
            return _DROP
        if not self.value:
            return _PASS
        got = doc[self.field]
        if isinstance(got, str):
            return _PASS if got == self.value else _DROP
        if self.number is not None and isinstance(got, int | float) and not isinstance(got, bool):
            return _PASS if float(got) == self.number else _DROP
        return _DROP

    def filter(self, doc: Any, raw: bytes) -> bytes:
        """Go's filterMessage: keep only the whitelisted fields (numbers as Go writes them)."""
        if not self.whitelist:
            return raw
        if not isinstance(doc, dict):
            raise ValueError("json is not an object")
        return go_json({key: doc[key] for key in self.whitelist if key in doc})


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON for Go's decoder (nor could they be re-encoded)
    raise ValueError(name)


def go_json(value: Any) -> bytes:
    """Go's ``json.Marshal`` of a ``map[string]interface{}``: the keys sorted."""
    return encode_json(value, sort_keys=True)


class PublishHandler:
    """Batch handler re-publishing to the destinations with one MPUB per batch."""

    def __init__(
        self,
        dest_topic: str,
        producers: dict[str, Producer],
        pool: HostPool,
        json_filter: JSONFilter,
        timers: dict[str, StatusTimer],
        aggregate: StatusTimer,
    ) -> None:
        self.dest_topic = dest_topic
        self.producers = producers
        self.pool = pool
        self.json_filter = json_filter
        self.timers = timers
        self.aggregate = aggregate

    async def __call__(self, messages: list[Message]) -> None:
        bodies: list[bytes] = []
        jf = self.json_filter
        for msg in messages:
            if not jf.active:
                bodies.append(msg.body)
                continue
            try:
                doc = json.loads(msg.body, parse_constant=_reject_constant)
            except ValueError:
                go_log(f"ERROR: Unable to decode json: {msg.body.decode('utf-8', 'replace')}")
                msg.finish()
                continue
            verdict = jf.check(doc)
            if verdict == _DROP:
                msg.finish()
                continue
            if verdict == _BACKOFF:
                msg.requeue()
                continue
            try:
                bodies.append(jf.filter(doc, msg.body))
            except ValueError as err:
                go_log(f"ERROR: filterMessage() failed: {err}")
                msg.requeue()
        if not bodies:
            return
        start = time.monotonic()
        address = self.pool.get()
        try:
            if len(bodies) == 1:
                await self.producers[address].pub(self.dest_topic, bodies[0])
            else:
                await self.producers[address].mpub(self.dest_topic, bodies)
        except NSQClientError:
            self.pool.mark(address, False)
            raise  # the consumer requeues what is left, with back-off
        self.pool.mark(address, True)
        for _ in bodies:
            self.timers[address].status(start)
            self.aggregate.status(start)


async def relay(opts: Options) -> int:
    topics = list(dict.fromkeys(opts.topics))
    if not topics or not opts.channel:
        fatal("--topic and --channel are required")
    for topic in topics:
        if not is_valid_topic_name(topic):
            fatal("--topic is invalid")
    if opts.destination_topic and not is_valid_topic_name(opts.destination_topic):
        fatal("--destination-topic is invalid")
    if not is_valid_channel_name(opts.channel):
        fatal("--channel is invalid")
    require_one_source(opts.nsqd_tcp_addresses, opts.lookupd_http_addresses)
    destinations = list(dict.fromkeys(opts.destination_nsqd_tcp_addresses))
    if not destinations:
        fatal("--destination-nsqd-tcp-address required")
    opts.check_mode()
    setup_client_logging()
    c_options = consumer_options(opts.consumer_opts, "nsq_to_nsq", opts.max_in_flight)
    p_options = producer_options(opts.producer_opts, "nsq_to_nsq")
    try:
        producers = {a: Producer(a, **p_options) for a in destinations}
    except (ValueError, TypeError) as err:
        fatal(f"failed creating producer {err}")
    timers, aggregate = status_timers(destinations, opts.status_every)
    pool = HostPool(destinations, opts.mode)
    json_filter = JSONFilter(
        opts.require_json_field, opts.require_json_value, opts.whitelist_json_fields
    )
    consumers = []
    for topic in topics:
        handler = PublishHandler(
            opts.destination_topic or topic, producers, pool, json_filter, timers, aggregate
        )
        consumers.append(
            opts.new_consumer(
                topic,
                opts.channel,
                c_options,
                batch_handler=handler,
                concurrency=len(destinations),
            )
        )
    await consume_until_stopped(consumers, asyncio.Event())
    await asyncio.gather(*(p.close() for p in producers.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """The ``nsq_to_nsq`` command."""
    opts = parse_tool_args(Options, argv, "nsq_to_nsq").options
    run(lambda: relay(opts))


if __name__ == "__main__":
    main()
