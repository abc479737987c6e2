"""Fixed TCP V2 examples, each sent alike to Go's nsqd and nsqpy's: the edge cases of
names and sizes one by one, pipelined and split commands, commands after IDENTIFY and
AUTH, and every divergence the generators found (marked "found:"), pinned byte for byte.
"""

from __future__ import annotations

import json

import pytest

from tests.differential.generators import INVALID_EDGE_NAMES, SPLITTING_NAMES, VALID_EDGE_NAMES
from tests.differential.harness import (
    MAGIC,
    MAX_BODY_SIZE,
    MAX_MSG_SIZE,
    MAX_RDY_COUNT,
    MAX_REQ_TIMEOUT_MS,
    Pair,
    StatsWatch,
    assert_same_stats,
    command,
    diff_text,
    int32,
    mpub_payload,
    run_script,
)

MAX_MPUB_COUNT = (MAX_BODY_SIZE - 4) // 5
NAMES = VALID_EDGE_NAMES + INVALID_EDGE_NAMES + SPLITTING_NAMES


def name_id(name: bytes) -> str:
    text = name.decode("utf-8", "backslashreplace")
    if len(text) > 12:
        text = f"{text[:4]}..{len(name)}"
    return text.replace(" ", "_sp_").replace("\r", "_cr_").replace("\t", "_tab_") or "empty"


def mpub(topic: bytes, bodies: list[bytes]) -> bytes:
    return command(b"MPUB " + topic, mpub_payload(bodies))


def identify(fields: dict[str, object]) -> bytes:
    return command(b"IDENTIFY", json.dumps(fields).encode())


# id → the pieces sent on one connection, one after the other
CASES: dict[str, list[bytes]] = {}

for _name in NAMES:
    _id = name_id(_name)
    CASES[f"pub-name-{_id}"] = [MAGIC + command(b"PUB " + _name, b"x")]
    CASES[f"pub-name-{_id}-after-magic"] = [MAGIC, command(b"PUB " + _name, b"x")]
    CASES[f"mpub-name-{_id}"] = [MAGIC + mpub(_name, [b"x"])]
    CASES[f"mpub-name-{_id}-after-magic"] = [MAGIC, mpub(_name, [b"x"])]
    CASES[f"dpub-name-{_id}"] = [MAGIC + command(b"DPUB " + _name + b" 0", b"x")]
    CASES[f"sub-topic-{_id}"] = [MAGIC + command(b"SUB " + _name + b" c")]
    CASES[f"sub-channel-{_id}"] = [MAGIC + command(b"SUB fixed_sub " + _name)]

for _size in (0, 1, MAX_MSG_SIZE, MAX_MSG_SIZE + 1, -1, 2**31 - 1):
    _body = b"b" * max(0, min(_size, MAX_MSG_SIZE + 1))
    for _kind, _line, _data in (
        ("pub-size", b"PUB", int32(_size) + _body),
        ("dpub-size", b"DPUB", int32(_size) + _body),  # " 10" added below
        ("mpub-message-size", b"MPUB", int32(4 + 4 + len(_body)) + int32(1) + int32(_size) + _body),
    ):
        _topic = f"{_kind}{_size}".encode()  # a topic per case: each case's stats apart
        _extra = b" 10" if _line == b"DPUB" else b""
        CASES[f"{_kind}-{_size}"] = [MAGIC + _line + b" " + _topic + _extra + b"\n" + _data]

for _size in (0, 9, MAX_BODY_SIZE, MAX_BODY_SIZE + 1, -1):
    CASES[f"mpub-body-size-{_size}"] = [
        MAGIC + b"MPUB mpub-body-size%d\n" % _size + int32(_size) + mpub_payload([b"x"]),
    ]
    CASES[f"identify-body-size-{_size}"] = [MAGIC + b"IDENTIFY\n" + int32(_size) + b"{}"]

for _count in (0, -1, 1, MAX_MPUB_COUNT, MAX_MPUB_COUNT + 1):
    _items = b"".join(int32(1) + b"m" for _ in range(max(0, _count)))
    CASES[f"mpub-count-{_count}"] = [
        MAGIC + command(b"MPUB mpub-count%d" % _count, int32(_count) + _items)
    ]

for _arg in (b"", b" 0", b" 1", b" %d" % MAX_RDY_COUNT, b" %d" % (MAX_RDY_COUNT + 1), b" -1"):
    CASES[f"rdy{_arg.decode().replace(' ', '-')}-subscribed"] = [
        MAGIC + command(b"SUB fixed_rdy c") + b"RDY" + _arg + b"\n"
    ]
    CASES[f"rdy{_arg.decode().replace(' ', '-')}-init"] = [MAGIC + b"RDY" + _arg + b"\n"]

for _timeout in (b"0", b"%d" % MAX_REQ_TIMEOUT_MS, b"%d" % (MAX_REQ_TIMEOUT_MS + 1), b"-1"):
    CASES[f"dpub-defer-{_timeout.decode()}"] = [
        MAGIC + command(b"DPUB fixed_defer " + _timeout, b"d")
    ]

CASES.update(
    {
        # pipelined: several commands in one write, replies in order
        "pipelined-publishes": [
            MAGIC
            + command(b"PUB pipe", b"1")
            + mpub(b"pipe", [b"2", b"3"])
            + command(b"DPUB pipe 100", b"4")
            + b"NOP\n"
            + command(b"PUB pipe", b"5")
        ],
        "pipelined-error-in-the-middle": [
            MAGIC + command(b"PUB pipe", b"1") + b"FOO\n" + command(b"PUB pipe", b"2")
        ],
        # split across reads: one byte a write, and a cut in every field
        "split-byte-by-byte": [
            bytes([b]) for b in MAGIC + command(b"PUB split", b"hello") + mpub(b"split", [b"a"])
        ],
        "split-in-size": [MAGIC + b"PUB split\n\x00\x00", b"\x00\x02h", b"i"],
        "split-mpub-everywhere": [
            MAGIC + b"MPUB split\n\x00\x00",
            b"\x00\x0e\x00\x00\x00\x02\x00",
            b"\x00\x00\x01a\x00\x00",
            b"\x00\x01b",
        ],
        # after IDENTIFY and AUTH
        "identify-then-pub": [MAGIC + identify({}) + command(b"PUB after_id", b"x")],
        "identify-negotiation-then-pub": [
            MAGIC + identify({"feature_negotiation": True}) + command(b"PUB after_id", b"x")
        ],
        "identify-twice": [MAGIC + identify({}) + identify({"feature_negotiation": True})],
        "identify-then-empty-pub": [MAGIC + identify({}) + command(b"PUB ", b"x")],
        "identify-then-empty-mpub": [MAGIC + identify({}), mpub(b"", [b"x"])],
        "auth-disabled": [MAGIC + command(b"AUTH", b"secret") + command(b"PUB after_auth", b"x")],
        "auth-empty-body": [MAGIC + b"AUTH\n" + int32(0)],
        "identify-after-sub": [MAGIC + command(b"SUB fixed_id c") + identify({})],
        "sub-heartbeats-disabled": [
            MAGIC + identify({"heartbeat_interval": -1}) + command(b"SUB fixed_hb c")
        ],
        "cls-then-rdy": [MAGIC + command(b"SUB fixed_cls c") + b"CLS\nRDY 5\nCLS\n"],
        "fin-not-in-flight": [
            MAGIC + command(b"SUB fixed_fin c") + b"FIN 0123456789abcdef\nTOUCH 0123456789abcdef\n"
            b"REQ 0123456789abcdef 0\nFIN zzzzzzzzzzzzzzzz\nFIN short\n"
        ],
        "empty-line": [MAGIC + b"\n"],
        "line-longer-than-go-buffer": [MAGIC + b"PUB " + b"x" * 17000 + b"\n"],
        "bad-magic": [b"  V1PUB t\n"],
        "magic-cut-short": [b"  V"],
        "body-cut-short": [MAGIC + b"PUB cut\n" + int32(10) + b"abc"],
        "mpub-cut-short": [MAGIC + b"MPUB cut\n" + int32(20) + int32(2) + int32(1) + b"a"],
        "line-cut-short": [MAGIC + b"PUB cut"],
        # found: Go's MPUB gets (creates) its topic before reading the body, so a bad body
        # still leaves the topic behind.
        "found-mpub-bad-body-size-creates-topic": [MAGIC + b"MPUB mpub_creates_1\n" + int32(-1)],
        "found-mpub-bad-message-creates-topic": [
            MAGIC + b"MPUB mpub_creates_2\n" + int32(8) + int32(1) + int32(MAX_MSG_SIZE + 1)
        ],
        "found-mpub-bad-count-creates-topic": [
            MAGIC + b"MPUB mpub_creates_3\n" + int32(4) + int32(0)
        ],
    }
)


@pytest.fixture(scope="module")
def stats_watch(pair: Pair) -> StatsWatch:
    return StatsWatch(pair)


@pytest.mark.parametrize("pieces", CASES.values(), ids=CASES.keys())
def test_script(pair: Pair, stats_watch: StatsWatch, pieces: list[bytes]) -> None:
    go = run_script(pair.go.tcp_address, pieces).norm()
    py = run_script(pair.py.tcp_address, pieces).norm()
    problems = [] if py == go else [f"replies differ:\n{diff_text(go, py)}"]
    stats_diff = stats_watch.check()  # even after different replies: the state is this case's
    if stats_diff is not None:
        problems.append(f"/stats differ after the script:\n{stats_diff}")
    assert not problems, "\n".join(problems)


def test_pub_empty_topic_name(fresh_pair: Pair) -> None:
    """Known: a read holding exactly ``PUB \\n`` and its body was published to topic ""."""
    pieces = [MAGIC + command(b"PUB ", b"x")]
    expected = {
        "frames": [("error", b'E_BAD_TOPIC PUB topic name "" is not valid')],
        "closed": True,
        "partial": b"",
    }
    assert run_script(fresh_pair.go.tcp_address, pieces).norm() == expected
    assert run_script(fresh_pair.py.tcp_address, pieces).norm() == expected
    assert_same_stats(fresh_pair)


def test_mpub_empty_topic_name(fresh_pair: Pair) -> None:
    """Known: a one-message ``MPUB \\n`` in one read was published to topic ""."""
    pieces = [MAGIC + mpub(b"", [b"x"])]
    expected = {
        "frames": [("error", b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "" is not valid')],
        "closed": True,
        "partial": b"",
    }
    assert run_script(fresh_pair.go.tcp_address, pieces).norm() == expected
    assert run_script(fresh_pair.py.tcp_address, pieces).norm() == expected
    assert_same_stats(fresh_pair)
