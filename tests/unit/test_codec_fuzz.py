"""Property tests of the V2 codec: arbitrary input never breaks the parsers, and chunking
never changes what they produce."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqpy.wire.v2 import (
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    Command,
    CommandParser,
    ConnectionFailure,
    FrameParser,
    ProtocolError,
    encode_error,
    encode_message_frame,
    encode_response,
)

MAX_MSG = 64
MAX_BODY = 512
MAX_REQ_MS = 10_000

FUZZ = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def new_parser(state: int = STATE_INIT) -> CommandParser:
    p = CommandParser(MAX_MSG, MAX_BODY, MAX_REQ_MS)
    p.state = state
    return p


Outcome = tuple[list[Command], str | None]


def run(data: bytes, cuts: list[int], state: int = STATE_INIT) -> Outcome:
    """Feed `data` split at `cuts`; commands until the first error, and that error.

    The loop is bounded: every command consumes at least its '\\n', so there can be
    no more commands than bytes fed.
    """
    p = new_parser(state)
    commands: list[Command] = []
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    try:
        for start, end in itertools.pairwise(bounds):
            p.feed(data[start:end])
            while (cmd := p.next_command()) is not None:
                commands.append(cmd)
                assert len(commands) <= len(data), "parser produced commands from nothing"
    except ProtocolError as err:
        assert err.text == f"{err.code} {err.desc}"
        return commands, f"P:{err.text}"
    except ConnectionFailure as err:
        return commands, f"C:{err}"
    return commands, None


# -- valid command streams --------------------------------------------------------------------------

NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
NAMES = st.builds(
    lambda name, eph: name + ("#ephemeral" if eph else ""),
    st.text(alphabet=NAME_CHARS, min_size=1, max_size=20),
    st.booleans(),
)
BODIES = st.binary(min_size=1, max_size=MAX_MSG)
MSG_IDS = st.binary(min_size=16, max_size=16).filter(
    lambda b: b"\n" not in b and b" " not in b and not b.endswith(b"\r")  # a last \r is stripped
)
EOL = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def commands(draw: st.DrawFn) -> tuple[bytes, Command]:
    kind = draw(st.integers(0, 11))
    eol = draw(EOL)
    if kind == 0:
        return b"NOP" + eol, ([b"NOP"], None)
    if kind == 1:
        n = b"%d" % draw(st.integers(0, 10_000))
        return b"RDY " + n + eol, ([b"RDY", n], None)
    if kind == 2:
        t, c = draw(NAMES).encode(), draw(NAMES).encode()
        return b"SUB " + t + b" " + c + eol, ([b"SUB", t, c], None)
    if kind == 3:
        verb = draw(st.sampled_from([b"FIN", b"TOUCH"]))
        msg_id = draw(MSG_IDS)
        return verb + b" " + msg_id + eol, ([verb, msg_id], None)
    if kind == 4:
        msg_id = draw(MSG_IDS)
        ms = b"%d" % draw(st.integers(0, 10**7))
        return b"REQ " + msg_id + b" " + ms + eol, ([b"REQ", msg_id, ms], None)
    if kind == 5:
        t = draw(NAMES).encode()
        body = draw(BODIES)
        return b"PUB " + t + eol + i32(len(body)) + body, ([b"PUB", t], body)
    if kind == 6:
        t = draw(NAMES).encode()
        ms = b"%d" % draw(st.integers(0, MAX_REQ_MS))
        body = draw(BODIES)
        return b"DPUB " + t + b" " + ms + eol + i32(len(body)) + body, ([b"DPUB", t, ms], body)
    if kind == 7:
        t = draw(NAMES).encode()
        bodies = draw(st.lists(BODIES, min_size=1, max_size=5))
        payload = i32(len(bodies)) + b"".join(i32(len(b)) + b for b in bodies)
        # the bodies as sent, not split (one message: a list, see MPUB_SPLIT_FROM)
        expected = bodies if len(bodies) == 1 else (payload[4:], len(bodies))
        return b"MPUB " + t + eol + i32(len(payload)) + payload, ([b"MPUB", t], expected)
    if kind == 8:
        body = draw(st.binary(min_size=1, max_size=200))
        return b"IDENTIFY" + eol + i32(len(body)) + body, ([b"IDENTIFY"], body)
    if kind == 9:
        body = draw(st.binary(min_size=1, max_size=100))
        return b"AUTH" + eol + i32(len(body)) + body, ([b"AUTH"], body)
    if kind == 10:
        return b"CLS" + eol, ([b"CLS"], None)
    # any other line: unknown commands are the protocol layer's business
    line = draw(st.binary(max_size=40).filter(lambda b: b"\n" not in b))
    params = line.split(b" ")
    if params[0] in (b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH"):
        line = b"X" + line
        params[0] = b"X" + params[0]
    if line.endswith(b"\r"):
        line += b"\r"  # one trailing '\r' is stripped, so keep the one the params hold
    return line + b"\n", (params, None)


STREAMS = st.lists(commands(), min_size=1, max_size=8)


def cut_points(data_len: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, max(data_len, 1)), max_size=30)


@FUZZ
@given(STREAMS, st.data())
def test_valid_streams_parse_identically_however_chunked(
    stream: list[tuple[bytes, Command]], data: st.DataObject
) -> None:
    raw = b"".join(b for b, _ in stream)
    expected = [c for _, c in stream]
    assert run(raw, []) == (expected, None)
    cuts = data.draw(cut_points(len(raw)))
    assert run(raw, cuts) == (expected, None)


@FUZZ
@given(STREAMS)
def test_valid_streams_parse_bytewise(stream: list[tuple[bytes, Command]]) -> None:
    raw = b"".join(b for b, _ in stream)
    assert run(raw, list(range(len(raw)))) == ([c for _, c in stream], None)


# -- mutated and random input ------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    return mutate(draw, b"".join(b for b, _ in draw(STREAMS)), 1)


def mutate(draw: st.DrawFn, data: bytes, least: int) -> bytes:
    raw = bytearray(data)
    for _ in range(draw(st.integers(least, 4))):
        op = draw(st.integers(0, 4))
        pos = draw(st.integers(0, len(raw)))
        if op == 0 and raw:  # bit flip
            i = min(pos, len(raw) - 1)
            raw[i] ^= 1 << draw(st.integers(0, 7))
        elif op == 1:  # truncation
            del raw[pos:]
        elif op == 2:  # insertion
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == 3:  # deletion
            del raw[pos : pos + draw(st.integers(1, 8))]
        else:  # a size field overwritten with an interesting value
            value = draw(st.sampled_from([0, -1, 1, MAX_MSG, MAX_MSG + 1, MAX_BODY + 1, 2**31 - 1]))
            raw[pos : pos + 4] = i32(value)
    return bytes(raw)


STATES = st.sampled_from([STATE_INIT, STATE_SUBSCRIBED, STATE_CLOSING])


@FUZZ
@given(mutated(), st.data(), STATES)
def test_mutated_streams_fail_only_with_protocol_errors(
    raw: bytes, data: st.DataObject, state: int
) -> None:
    whole = run(raw, [], state)
    chunked = run(raw, data.draw(cut_points(len(raw))), state)
    # run() lets anything but ProtocolError/ConnectionFailure escape, failing the test;
    # the outcome (commands, then the same error or none) does not depend on chunking
    assert chunked == whole


@FUZZ
@given(st.binary(max_size=3000), st.data(), STATES)
def test_random_bytes_fail_only_with_protocol_errors(
    raw: bytes, data: st.DataObject, state: int
) -> None:
    whole = run(raw, [], state)
    assert run(raw, data.draw(cut_points(len(raw))), state) == whole


@settings(deadline=None, max_examples=60)
@given(st.binary(max_size=300), STATES)
def test_random_bytes_bytewise(raw: bytes, state: int) -> None:
    assert run(raw, list(range(len(raw))), state) == run(raw, [], state)


@FUZZ
@given(
    st.sampled_from([b"PUB t\n", b"DPUB t 5\n", b"MPUB t\n", b"IDENTIFY\n", b"AUTH\n"]),
    st.binary(min_size=4, max_size=40),
)
def test_body_commands_with_random_bodies(prefix: bytes, tail: bytes) -> None:
    whole = run(prefix + tail, [])
    assert run(prefix + tail, list(range(len(prefix + tail)))) == whole


# -- the one-publish fast path ---------------------------------------------------------------------------


@st.composite
def publishes(draw: st.DrawFn) -> bytes:
    """A PUB or an MPUB of one or two messages, perhaps mutated; the topic name may be
    empty (invalid, and what the name cache held before any name)."""
    topic = draw(st.one_of(st.just(""), NAMES)).encode()
    bodies = draw(st.lists(BODIES, min_size=1, max_size=2))
    if draw(st.booleans()) and len(bodies) == 1:
        raw = b"PUB " + topic + b"\n" + i32(len(bodies[0])) + bodies[0]
    else:
        payload = i32(len(bodies)) + b"".join(i32(len(b)) + b for b in bodies)
        raw = b"MPUB " + topic + b"\n" + i32(len(payload)) + payload
    return mutate(draw, raw, 0)


@FUZZ
@given(publishes(), st.sampled_from(["cold", "warm", "same", "same head"]), STATES)
def test_take_publish_agrees_with_the_general_parse(raw: bytes, warm: str, state: int) -> None:
    """take_publish takes a read only if the general parse finds exactly that one command
    in it, and leaves the parser untouched otherwise; whatever it took before (its caches
    of the last valid topic name and PUB or MPUB head) changes neither."""
    p = new_parser(state)
    if warm == "warm":  # a topic found valid before (the cached name)
        assert p.take_publish(b"PUB t\n" + i32(1) + b"x") == ([b"PUB", b"t"], b"x")
    elif warm == "same":  # this very read taken before, or not
        p.take_publish(raw)
    elif warm == "same head" and raw.startswith((b"PUB ", b"MPUB ")) and b"\n" in raw:
        # a PUB (an MPUB of one) with this read's head and a body of the size it says taken
        head = raw[: raw.index(b"\n") + (5 if raw.startswith(b"PUB ") else 13)]
        size = int.from_bytes(head[-4:], "big", signed=True)
        if 0 <= size <= 64:
            p.take_publish(head + b"y" * size)
    whole = run(raw, [], state)
    taken = p.take_publish(raw)
    if taken is not None:
        assert whole == ([taken], None)
        return
    commands: list[Command] = []
    try:
        p.feed(raw)
        while (cmd := p.next_command()) is not None:
            commands.append(cmd)
    except ProtocolError as err:
        assert (commands, f"P:{err.text}") == whole
    except ConnectionFailure as err:
        assert (commands, f"C:{err}") == whole
    else:
        assert (commands, None) == whole


def test_take_publish_leaves_an_empty_topic_name_to_the_general_parse() -> None:
    p = new_parser()
    assert p.take_publish(b"PUB \n" + i32(1) + b"x") is None
    assert p.take_publish(b"MPUB \n" + i32(9) + i32(1) + i32(1) + b"x") is None
    p.feed(b"PUB \n" + i32(1) + b"x")
    with pytest.raises(ProtocolError, match='PUB topic name "" is not valid'):
        p.next_command()


def test_take_publish_takes_the_same_head_again_only_with_a_message_of_its_size() -> None:
    p = new_parser()
    head = b"PUB t\n" + i32(3)
    assert p.take_publish(head + b"abc") == ([b"PUB", b"t"], b"abc")
    assert p.take_publish(head + b"xyz") == ([b"PUB", b"t"], b"xyz")  # the head cached
    assert p.take_publish(head + b"xy") is None  # short: the general parse waits for more
    assert p.take_publish(head + b"xyzPUB") is None  # more than one command
    assert p.take_publish(b"PUB t\n" + i32(2) + b"xy") == ([b"PUB", b"t"], b"xy")
    mpub = b"MPUB t\n" + i32(11) + i32(1) + i32(3)
    assert p.take_publish(mpub + b"abc") == ([b"MPUB", b"t"], [b"abc"])
    assert p.take_publish(mpub + b"xyz") == ([b"MPUB", b"t"], [b"xyz"])
    assert p.take_publish(mpub + b"xy") is None
    assert p.take_publish(head + b"abc") == ([b"PUB", b"t"], b"abc")


def test_take_publish_only_between_commands() -> None:
    pub = b"PUB t\n" + i32(1) + b"x"
    p = new_parser()
    p.feed(pub[:3])
    assert p.next_command() is None
    assert p.take_publish(pub) is None  # the bytes continue a command already begun


# -- frames ----------------------------------------------------------------------------------------------


def feed_frames(raw: bytes, cuts: list[int]) -> tuple[list[tuple[int, bytes]], bool]:
    fp = FrameParser()
    frames: list[tuple[int, bytes]] = []
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(raw)}), len(raw)]
    try:
        for start, end in itertools.pairwise(bounds):
            frames.extend(fp.feed(raw[start:end]))
    except ValueError:
        return frames, True
    return frames, False


@FUZZ
@given(st.binary(max_size=2000), st.data())
def test_frame_parser_random_bytes_only_value_error(raw: bytes, data: st.DataObject) -> None:
    whole = feed_frames(raw, [])
    chunked = feed_frames(raw, data.draw(cut_points(len(raw))))
    assert chunked == whole


FRAMES = st.one_of(
    st.builds(lambda d: (encode_response(d), (0, d)), st.binary(max_size=100)),
    st.builds(
        lambda t: (encode_error(t), (1, t.encode())),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=50),
    ),
    st.builds(
        lambda i, ts, a, b: (
            encode_message_frame(i, ts, a, b),
            (2, struct.pack(">qH", ts, a) + i + b),
        ),
        st.binary(min_size=16, max_size=16),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 0xFFFF),
        st.binary(max_size=100),
    ),
)


@FUZZ
@given(st.lists(FRAMES, max_size=10), st.data())
def test_frames_round_trip_however_chunked(
    frames: list[tuple[bytes, tuple[int, bytes]]], data: st.DataObject
) -> None:
    raw = b"".join(f for f, _ in frames)
    expected = [e for _, e in frames]
    assert feed_frames(raw, []) == (expected, False)
    assert feed_frames(raw, data.draw(cut_points(len(raw)))) == (expected, False)
    assert feed_frames(raw, list(range(len(raw)))) == (expected, False)
