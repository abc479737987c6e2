"""Seeded generators of the traffic the differential tests send to both nsqd.

Every function takes a ``random.Random`` and returns plain data (bytes, tuples), so a case
is reproduced from its seed alone and can be pasted into a fixed example as it is.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from tests.differential.harness import (
    MAGIC,
    MAX_BODY_SIZE,
    MAX_HEARTBEAT_MS,
    MAX_MSG_SIZE,
    MAX_MSG_TIMEOUT_MS,
    MAX_RDY_COUNT,
    MAX_REQ_TIMEOUT_MS,
    int32,
    mpub_payload,
)

T = TypeVar("T")

# -- names -------------------------------------------------------------------------------------

# The edge cases of a topic or channel name (spec 2.6): 1..64 characters of
# [.a-zA-Z0-9_-], optionally ending in #ephemeral (counted in the 64). They are shared by
# every script of a module, so their state (depth, message_count) builds up alike on both.
VALID_EDGE_NAMES: tuple[bytes, ...] = (
    b"t",
    b"n" * 64,
    b"a#ephemeral",
    b"e" * 54 + b"#ephemeral",  # 64 with the suffix
    b"ok.name-_1",
    b"..",
)
INVALID_EDGE_NAMES: tuple[bytes, ...] = (
    b"",
    b"n" * 65,
    b"e" * 55 + b"#ephemeral",  # 65 with the suffix
    b"#ephemeral",
    b"bad/char",
    b"bad*",
    b"t\tx",
    b"t\xc3\xb4pic",  # UTF-8
    b"t\xff",  # not UTF-8 (Go quotes it as \xff)
    b"x#ephemeral#ephemeral",
    b"a#Ephemeral",
)
# Names with a separator: "bad name" is two parameters ("bad" and "name"), "t\r" is "t" at
# the end of a line (Go strips one trailing \r) and an invalid name before a space.
SPLITTING_NAMES: tuple[bytes, ...] = (b"bad name", b"t\r", b" t")

SIZES = (0, 1, 2, 100, MAX_MSG_SIZE - 1, MAX_MSG_SIZE, MAX_MSG_SIZE + 1, -1, 2**31 - 1, -(2**31))
BODY_SIZES = (0, 1, 9, MAX_BODY_SIZE, MAX_BODY_SIZE + 1, -1, 2**31 - 1)


def pick(rng: random.Random, options: Sequence[T]) -> T:
    return options[rng.randrange(len(options))]


def body_of(rng: random.Random, size: int) -> bytes:
    """``size`` bytes whose content says which body it is (newlines included sometimes)."""
    if size <= 0:
        return b""
    alphabet = b"abcdefghij\n\x00 " if rng.random() < 0.2 else b"abcdefghijklmnop"
    return bytes(alphabet[rng.randrange(len(alphabet))] for _ in range(min(size, 64))) + (
        b"z" * max(0, size - 64)
    )


# -- one TCP command -----------------------------------------------------------------------


@dataclass
class Names:
    """The names a script may use: the edge cases and its own fresh ones."""

    prefix: str  # unique per script: fresh names never collide with another script's

    def fresh(self, rng: random.Random) -> bytes:
        return f"{self.prefix}{rng.randrange(3)}".encode()

    def fresh_sub_topic(self, rng: random.Random) -> bytes:
        # Topics only ever subscribed to, never published to: no script ever gets a
        # message, so every transcript is a deterministic sequence of replies.
        suffix = b"#ephemeral" if rng.random() < 0.2 else b""
        return f"s{self.prefix}{rng.randrange(2)}".encode() + suffix

    def pub_topic(self, rng: random.Random) -> bytes:
        r = rng.random()
        if r < 0.35:
            return pick(rng, VALID_EDGE_NAMES)
        if r < 0.6:
            return pick(rng, INVALID_EDGE_NAMES)
        if r < 0.7:
            return pick(rng, SPLITTING_NAMES)
        return self.fresh(rng)

    def sub_topic(self, rng: random.Random) -> bytes:
        return pick(rng, INVALID_EDGE_NAMES) if rng.random() < 0.4 else self.fresh_sub_topic(rng)

    def channel(self, rng: random.Random) -> bytes:
        r = rng.random()
        if r < 0.4:
            return pick(rng, VALID_EDGE_NAMES)
        if r < 0.7:
            return pick(rng, INVALID_EDGE_NAMES)
        return b"c" + self.fresh(rng)


def eol(rng: random.Random) -> bytes:
    return b"\r\n" if rng.random() < 0.1 else b"\n"


def sized(rng: random.Random, size: int, content: bytes | None = None) -> bytes:
    """A 4-byte size and, unless it is out of range, that much body (sometimes less: the
    next bytes of the script then count as the rest of the body)."""
    out = int32(size)
    if 0 < size <= MAX_BODY_SIZE + 1:
        data = content if content is not None and len(content) == size else body_of(rng, size)
        if rng.random() < 0.05:
            data = data[: rng.randrange(len(data) + 1)]
        out += data
    return out


def gen_pub(rng: random.Random, names: Names) -> bytes:
    size = pick(rng, SIZES)
    return b"PUB " + names.pub_topic(rng) + eol(rng) + sized(rng, size)


def gen_dpub(rng: random.Random, names: Names) -> bytes:
    timeout = pick(
        rng,
        (b"0", b"1", b"60000", str(MAX_REQ_TIMEOUT_MS).encode(),
         str(MAX_REQ_TIMEOUT_MS + 1).encode(), b"-1", b"abc", b"", b"1.5",
         b"99999999999999999999"),
    )  # fmt: skip
    size = pick(rng, SIZES)
    line = b"DPUB " + names.pub_topic(rng)
    if rng.random() < 0.95:
        line += b" " + timeout
    return line + eol(rng) + sized(rng, size)


def gen_mpub(rng: random.Random, names: Names) -> bytes:
    count_choice = pick(rng, (0, 1, 1, 2, 3, -1, (MAX_BODY_SIZE - 4) // 5,
                              (MAX_BODY_SIZE - 4) // 5 + 1))  # fmt: skip
    count = int(count_choice)
    sent = max(0, min(count, 4))
    items = [body_of(rng, pick(rng, (1, 2, 50, MAX_MSG_SIZE))) for _ in range(sent)]
    if items and rng.random() < 0.3:  # one bad message
        i = rng.randrange(len(items))
        bad = pick(rng, (0, -1, MAX_MSG_SIZE + 1))
        items[i] = b""
        payload = int32(count) + b"".join(
            int32(bad if j == i else len(b)) + (b"" if j == i else b) for j, b in enumerate(items)
        )
    else:
        payload = int32(count) + b"".join(int32(len(b)) + b for b in items)
    r = rng.random()
    if r < 0.8:
        size = len(payload)
    elif r < 0.9:
        size = pick(rng, BODY_SIZES)
    else:
        size = len(payload) + rng.choice((-3, -1, 1, 5))
    body = int32(size)
    if 0 < size <= MAX_BODY_SIZE:
        body += payload
    return b"MPUB " + names.pub_topic(rng) + eol(rng) + body


IDENTIFY_BODIES: tuple[object, ...] = (
    {},
    {"feature_negotiation": True},
    {"feature_negotiation": True, "tls_v1": True},
    {"feature_negotiation": True, "deflate": True, "snappy": True},
    {"deflate": True, "deflate_level": 9},  # no negotiation: no compression either
    {"client_id": "c", "hostname": "h", "user_agent": "differential/1.0"},
    {"heartbeat_interval": -1},
    {"heartbeat_interval": 0},
    {"heartbeat_interval": 999},
    {"heartbeat_interval": MAX_HEARTBEAT_MS},
    {"heartbeat_interval": MAX_HEARTBEAT_MS + 1},
    {"output_buffer_size": -1},
    {"output_buffer_size": 63},
    {"output_buffer_size": 64},
    {"output_buffer_size": 65536},
    {"output_buffer_size": 65537},
    {"output_buffer_timeout": -1},
    {"output_buffer_timeout": 24},
    {"output_buffer_timeout": 25},
    {"output_buffer_timeout": 30000},
    {"output_buffer_timeout": 30001},
    {"msg_timeout": 999},
    {"msg_timeout": 1000},
    {"msg_timeout": MAX_MSG_TIMEOUT_MS},
    {"msg_timeout": MAX_MSG_TIMEOUT_MS + 1},
    {"sample_rate": -1},
    {"sample_rate": 99},
    {"sample_rate": 100},
    {"feature_negotiation": True, "msg_timeout": 5000, "sample_rate": 10,
     "output_buffer_size": 128, "output_buffer_timeout": 100},
    {"feature_negotiation": "yes"},
    {"heartbeat_interval": "1000"},
    {"heartbeat_interval": 1.5},
    {"client_id": 5},
    {"unknown_field": [1, 2, 3], "short_id": "s", "long_id": "l"},
    b"not json",
    b"[]",
    b"null",
    b'{"feature_negotiation": true} trailing',
    b'{"a":',
    b"{}" + b" " * 10,
)  # fmt: skip


def identify_body(rng: random.Random) -> bytes:
    choice = pick(rng, IDENTIFY_BODIES)
    return choice if isinstance(choice, bytes) else json.dumps(choice).encode()


def gen_identify(rng: random.Random, names: Names) -> bytes:
    line = b"IDENTIFY" if rng.random() < 0.95 else b"IDENTIFY extra"
    body = identify_body(rng)
    r = rng.random()
    if r < 0.9:
        return line + eol(rng) + int32(len(body)) + body
    size = pick(rng, (0, -1, MAX_BODY_SIZE + 1, 2**31 - 1))
    return line + eol(rng) + int32(size)


def gen_auth(rng: random.Random, names: Names) -> bytes:
    line = b"AUTH" if rng.random() < 0.85 else b"AUTH extra"
    size = pick(rng, (6, 6, 6, 0, -1, MAX_BODY_SIZE + 1))
    return line + eol(rng) + int32(size) + (b"secret" if size == 6 else b"")


def gen_sub(rng: random.Random, names: Names) -> bytes:
    r = rng.random()
    if r < 0.05:
        return b"SUB" + eol(rng)
    if r < 0.1:
        return b"SUB " + names.sub_topic(rng) + eol(rng)
    line = b"SUB " + names.sub_topic(rng) + b" " + names.channel(rng)
    if rng.random() < 0.05:
        line += b" extra"
    return line + eol(rng)


def gen_rdy(rng: random.Random, names: Names) -> bytes:
    arg = pick(rng, (None, b"0", b"1", str(MAX_RDY_COUNT).encode(),
                     str(MAX_RDY_COUNT + 1).encode(), b"-1", b"abc", b"", b"1 2",
                     b"99999999999999999999", b"+1"))  # fmt: skip
    return (b"RDY" if arg is None else b"RDY " + arg) + eol(rng)


def message_id(rng: random.Random) -> bytes:
    return pick(rng, (b"0123456789abcdef", b"zzzzzzzzzzzzzzzz", b"0123456789abcde",
                      b"0123456789abcdef0", b"", b"0000000000000000"))  # fmt: skip


def gen_fin_touch(rng: random.Random, names: Names) -> bytes:
    cmd = pick(rng, (b"FIN", b"TOUCH"))
    if rng.random() < 0.1:
        return cmd + eol(rng)
    return cmd + b" " + message_id(rng) + eol(rng)


def gen_req(rng: random.Random, names: Names) -> bytes:
    line = b"REQ " + message_id(rng)
    if rng.random() < 0.9:
        timeout = pick(rng, (b"0", b"1000", str(MAX_REQ_TIMEOUT_MS + 1).encode(), b"-1",
                             b"abc", b""))  # fmt: skip
        line += b" " + timeout
    return line + eol(rng)


def gen_simple(rng: random.Random, names: Names) -> bytes:
    return pick(rng, (b"NOP", b"NOP", b"NOP extra", b"CLS", b"CLS x")) + eol(rng)


GARBAGE = (
    b"\n",
    b"\r\n",
    b"FOO\n",
    b"pub t\n",
    b" PUB t\n",
    b"PUB\n",
    b"MPUB\n",
    b"DPUB t\n",
    b"PUB  t\n",
    b"\x00\x01\x02\n",
    b"  V2\n",
    b"IDENTIFY\r\n\x00\x00\x00\x02{}",
    b"NOP\nNOP\nNOP\n",
)


def gen_garbage(rng: random.Random, names: Names) -> bytes:
    return pick(rng, GARBAGE)


TCP_GENERATORS = {
    "pub": gen_pub,
    "dpub": gen_dpub,
    "mpub": gen_mpub,
    "identify": gen_identify,
    "auth": gen_auth,
    "sub": gen_sub,
    "rdy": gen_rdy,
    "fin_touch": gen_fin_touch,
    "req": gen_req,
    "simple": gen_simple,
    "garbage": gen_garbage,
}


def gen_script(
    rng: random.Random, prefix: str, weights: dict[str, float], max_commands: int = 6
) -> list[bytes]:
    """One connection's bytes, cut into the pieces to send one by one."""
    names = Names(prefix)
    kinds = list(weights)
    data = bytearray()
    r = rng.random()
    if r < 0.02:
        data += pick(rng, (b"  V1", b"V2  ", b"  v2", b"\n\n\n\n"))
    elif r < 0.03:
        data += MAGIC[: rng.randrange(4)]  # cut short: EOF before a whole magic
        return [bytes(data)]
    else:
        data += MAGIC
    commands = [
        TCP_GENERATORS[rng.choices(kinds, [weights[k] for k in kinds])[0]](rng, names)
        for _ in range(rng.randint(1, max_commands))
    ]
    if rng.random() < 0.05:  # a last line cut short
        commands.append(b"PUB " + names.pub_topic(rng))
    if rng.random() < 0.25:
        # as a client waiting for each reply sends them: the magic, then one command a
        # write (nsqd may take a read holding exactly one command its own quick way)
        return [bytes(data), *commands]
    return cut(rng, bytes(data) + b"".join(commands))


def cut(rng: random.Random, data: bytes) -> list[bytes]:
    """``data`` cut at random points (sometimes one byte at a time, often not at all)."""
    r = rng.random()
    if r < 0.4 or len(data) < 2:
        return [data]
    if r < 0.5 and len(data) <= 200:
        return [data[i : i + 1] for i in range(len(data))]
    points = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 5))))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# -- HTTP requests -----------------------------------------------------------------------------

HTTP_TOPICS: tuple[str, ...] = (
    "",
    "t",
    "n" * 64,
    "n" * 65,
    "a#ephemeral",
    "bad/char",
    "bad%20name",
    "ok.name-_1",
    "%ff",
    "t%00",
)
HTTP_CHANNELS: tuple[str, ...] = ("", "c", "c" * 64, "c" * 65, "c#ephemeral", "bad*")


@dataclass(frozen=True)
class HTTPCase:
    method: str
    target: str
    body: bytes | None
    headers: tuple[tuple[str, str], ...] = ()


def _query(**params: str | None) -> str:
    parts = [f"{k}={v}" for k, v in params.items() if v is not None]
    return "?" + "&".join(parts) if parts else ""


def gen_http(rng: random.Random, prefix: str) -> HTTPCase:
    """One request to nsqd's HTTP API: a route (sometimes the wrong method, sometimes an
    unknown path), its parameters from the name edge cases or fresh names, a body."""

    def topic() -> str | None:
        r = rng.random()
        if r < 0.1:
            return None
        if r < 0.5:
            return pick(rng, HTTP_TOPICS)
        return f"{prefix}{rng.randrange(3)}"

    def channel() -> str | None:
        r = rng.random()
        if r < 0.1:
            return None
        if r < 0.5:
            return pick(rng, HTTP_CHANNELS)
        return f"c{rng.randrange(2)}"

    route = pick(rng, ("/pub", "/pub", "/mpub", "/mpub", "/topic/create", "/topic/delete",
                       "/topic/empty", "/topic/pause", "/topic/unpause", "/channel/create",
                       "/channel/delete", "/channel/empty", "/channel/pause",
                       "/channel/unpause", "/ping", "/info", "/stats", "/config/",
                       "/nope", "/put", "/create_topic"))  # fmt: skip
    route = str(route)
    method = {"/ping": "GET", "/info": "GET", "/stats": "GET", "/config/": "GET"}.get(route, "POST")
    if rng.random() < 0.08:
        method = pick(rng, ("GET", "PUT", "DELETE", "POST", "PATCH"))
    body: bytes | None = None
    if route == "/pub":
        size = pick(rng, (0, 1, 10, MAX_MSG_SIZE, MAX_MSG_SIZE + 1))
        body = body_of(rng, size)
        defer = pick(rng, (None, None, None, "0", "1000", str(MAX_REQ_TIMEOUT_MS),
                           str(MAX_REQ_TIMEOUT_MS + 1), "-1", "abc", ""))  # fmt: skip
        target = route + _query(topic=topic(), defer=defer)
    elif route == "/mpub":
        binary = pick(rng, (None, "true", "false", "1", "0", "yes"))
        is_binary = binary not in (None, "false", "0")
        if is_binary:
            sizes = [pick(rng, (1, 5, MAX_MSG_SIZE))
                     for _ in range(rng.randint(0, 3))]  # fmt: skip
            body = mpub_payload(body_of(rng, s) for s in sizes)
            if rng.random() < 0.2:
                body = body[: rng.randrange(len(body) + 1)]
            if rng.random() < 0.1:
                body = int32(pick(rng, (0, -1, 10**6))) + body[4:]
        else:
            lines = [body_of(rng, pick(rng, (0, 1, 5, MAX_MSG_SIZE, MAX_MSG_SIZE + 1))).replace(b"\n", b"")
                     for _ in range(rng.randint(0, 4))]  # fmt: skip
            body = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
            if rng.random() < 0.1:
                body = b"x" * (MAX_BODY_SIZE + 1)
        target = route + _query(topic=topic(), binary=binary)
    elif route.startswith("/topic/"):
        target = route + _query(topic=topic())
    elif route.startswith("/channel/"):
        target = route + _query(topic=topic(), channel=channel())
    elif route == "/stats":
        fmt = pick(rng, ("json", "json", "json", None, "text"))
        if fmt != "json":
            fmt = "json"  # the text format carries build and timing details: JSON only
        target = route + _query(
            format=fmt,
            topic=topic() if rng.random() < 0.5 else None,
            channel=channel() if rng.random() < 0.3 else None,
            include_clients=pick(rng, (None, "true", "false", "0")),
            include_mem=pick(rng, (None, "false")),
        )
    elif route == "/config/":
        target = route + pick(rng, CONFIG_OPTIONS)
    else:
        target = route
    if method in ("GET", "DELETE") and body is not None and rng.random() < 0.5:
        body = None
    if rng.random() < 0.04:  # a path that is not clean: Go's router redirects
        path, sep, query = target.partition("?")
        path = pick(rng, (path + "/", "/" + path, "/stats/.." + path, path.replace("/", "//", 1)))
        target = path + sep + query
    return HTTPCase(method, target, body)


# GET /config/<opt>: every option whose value both servers were given alike (not the data
# path, not the node id's default) and a few unknown ones.
CONFIG_OPTIONS: tuple[str, ...] = (
    "max_msg_size",
    "max_body_size",
    "max_rdy_count",
    "max_req_timeout",
    "max_msg_timeout",
    "msg_timeout",
    "mem_queue_size",
    "max_bytes_per_file",
    "sync_every",
    "sync_timeout",
    "nsqlookupd_tcp_addresses",
    "log_level",
    "log_prefix",
    "tcp_address",
    "http_address",
    "https_address",
    "broadcast_address",
    "broadcast_tcp_port",
    "broadcast_http_port",
    "max_heartbeat_interval",
    "max_output_buffer_size",
    "max_output_buffer_timeout",
    "min_output_buffer_timeout",
    "output_buffer_timeout",
    "max_channel_consumers",
    "statsd_prefix",
    "statsd_interval",
    "statsd_mem_stats",
    "statsd_udp_packet_size",
    "e2e_processing_latency_percentiles",
    "e2e_processing_latency_window_time",
    "deflate",
    "max_deflate_level",
    "snappy",
    "tls_required",
    "tls_min_version",
    "auth_http_addresses",
    "auth_http_request_method",
    "id",
    "node_id",
    "queue_scan_interval",
    "queue_scan_selection_count",
    "queue_scan_worker_pool_max",
    "queue_scan_dirty_percent",
    "client_timeout",
    "no_such_option",
    "",
    "MAX_MSG_SIZE",
)
