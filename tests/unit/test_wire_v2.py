"""The V2 codec (nsqpy.wire.v2) against spec §2: command parsing, error strings, frames."""

from __future__ import annotations

import itertools
import json
import random
import struct
from collections.abc import Iterable, Iterator

import pytest

from nsqpy.wire.v2 import (
    FRAME_CLOSE_WAIT,
    FRAME_HEARTBEAT,
    FRAME_OK,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    MAX_LINE_LENGTH,
    MESSAGE_HEADER_SIZE,
    MPUB_SPLIT_FROM,
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    Command,
    CommandParser,
    ConnectionFailure,
    FrameParser,
    ProtocolError,
    decode_message,
    encode_auth,
    encode_cls,
    encode_command,
    encode_dpub,
    encode_error,
    encode_fin,
    encode_identify,
    encode_message,
    encode_message_frame,
    encode_mpub,
    encode_nop,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_response,
    encode_sub,
    encode_touch,
    mpub_bodies,
    parse_base10,
)

MAX_MSG = 1024
MAX_BODY = 4096
MAX_REQ_MS = 3_600_000
MAX_COUNT = (MAX_BODY - 4) // 5  # 818
MSG_ID = b"0123456789abcdef"


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def parser(state: int = STATE_INIT, **limits: int) -> CommandParser:
    p = CommandParser(
        limits.get("max_msg_size", MAX_MSG),
        limits.get("max_body_size", MAX_BODY),
        limits.get("max_req_timeout_ms", MAX_REQ_MS),
    )
    p.state = state
    return p


def chunked(data: bytes, sizes: Iterable[int]) -> Iterator[bytes]:
    pos = 0
    for size in sizes:
        if pos >= len(data):
            return
        yield data[pos : pos + size]
        pos += size
    if pos < len(data):
        yield data[pos:]


def drain(p: CommandParser) -> list[tuple[list[bytes], bytes | list[bytes] | None]]:
    """The commands, an MPUB's body as its list of bodies (checked to be whole)."""
    out: list[tuple[list[bytes], bytes | list[bytes] | None]] = []
    while (cmd := p.next_command()) is not None:
        params, body = cmd
        if isinstance(body, tuple):
            bodies = mpub_bodies(body)
            assert body[0] == b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
            out.append((params, bodies))
        else:
            out.append((params, body))
    return out


def parse_whole(data: bytes, p: CommandParser | None = None) -> list[Command]:
    p = p or parser()
    p.feed(data)
    return drain(p)


def parse_bytewise(data: bytes, p: CommandParser | None = None) -> list[Command]:
    p = p or parser()
    out: list[Command] = []
    for i in range(len(data)):
        p.feed(data[i : i + 1])
        out.extend(drain(p))
    return out


def parse_chunks(
    data: bytes, sizes: Iterable[int], p: CommandParser | None = None
) -> list[Command]:
    p = p or parser()
    out: list[Command] = []
    for chunk in chunked(data, sizes):
        p.feed(chunk)
        out.extend(drain(p))
    return out


def error_at(data: bytes, p: CommandParser | None = None) -> tuple[int, Exception]:
    """Feed one byte at a time; return the index of the byte after which it failed."""
    p = p or parser()
    for i in range(len(data)):
        p.feed(data[i : i + 1])
        try:
            drain(p)
        except (ProtocolError, ConnectionFailure) as err:
            return i, err
    raise AssertionError("no error raised")


def both_ways(data: bytes, state: int = STATE_INIT) -> list[Command]:
    whole = parse_whole(data, parser(state))
    assert parse_bytewise(data, parser(state)) == whole
    return whole


# -- every command parses -----------------------------------------------------------------------

VALID_COMMANDS: list[tuple[bytes, Command]] = [
    (b"NOP\n", ([b"NOP"], None)),
    (b"CLS\n", ([b"CLS"], None)),
    (b"SUB orders email\n", ([b"SUB", b"orders", b"email"], None)),
    (b"SUB t#ephemeral c#ephemeral\n", ([b"SUB", b"t#ephemeral", b"c#ephemeral"], None)),
    (b"RDY 100\n", ([b"RDY", b"100"], None)),
    (b"RDY\n", ([b"RDY"], None)),
    (b"FIN " + MSG_ID + b"\n", ([b"FIN", MSG_ID], None)),
    (b"REQ " + MSG_ID + b" 1500\n", ([b"REQ", MSG_ID, b"1500"], None)),
    (b"TOUCH " + MSG_ID + b"\n", ([b"TOUCH", MSG_ID], None)),
    (b"PUB t\n" + i32(5) + b"hello", ([b"PUB", b"t"], b"hello")),
    (b"PUB t\n" + i32(MAX_MSG) + b"x" * MAX_MSG, ([b"PUB", b"t"], b"x" * MAX_MSG)),
    (b"PUB t\n" + i32(3) + b"\n\r\n", ([b"PUB", b"t"], b"\n\r\n")),
    (b"DPUB t 1000\n" + i32(2) + b"hi", ([b"DPUB", b"t", b"1000"], b"hi")),
    (b"DPUB t 0\n" + i32(1) + b"x", ([b"DPUB", b"t", b"0"], b"x")),
    (b"DPUB t 3600000\n" + i32(1) + b"x", ([b"DPUB", b"t", b"3600000"], b"x")),
    # an empty timeout parses as 0 (ByteToBase10), extra params are ignored
    (b"DPUB t \n" + i32(1) + b"x", ([b"DPUB", b"t", b""], b"x")),
    (b"DPUB t 5 extra\n" + i32(1) + b"x", ([b"DPUB", b"t", b"5", b"extra"], b"x")),
    # 2**64 wraps to 0 like Go's uint64 arithmetic
    (
        b"DPUB t 18446744073709551616\n" + i32(1) + b"x",
        ([b"DPUB", b"t", b"18446744073709551616"], b"x"),
    ),
    (
        b"MPUB t\n" + i32(4 + 5 + 6) + i32(2) + i32(1) + b"a" + i32(2) + b"bc",
        ([b"MPUB", b"t"], [b"a", b"bc"]),
    ),
    (b"IDENTIFY\n" + i32(2) + b"{}", ([b"IDENTIFY"], b"{}")),
    (b"IDENTIFY extra\n" + i32(2) + b"{}", ([b"IDENTIFY", b"extra"], b"{}")),
    (b"IDENTIFY\n" + i32(MAX_BODY) + b" " * MAX_BODY, ([b"IDENTIFY"], b" " * MAX_BODY)),
    (b"AUTH\n" + i32(6) + b"secret", ([b"AUTH"], b"secret")),
    # unknown commands and empty lines are the protocol layer's business
    (b"FOO bar\n", ([b"FOO", b"bar"], None)),
    (b"pub t\n", ([b"pub", b"t"], None)),
    (b"\n", ([b""], None)),
    (b"\r\n", ([b""], None)),
]


@pytest.mark.parametrize(("data", "expected"), VALID_COMMANDS)
def test_command_parses_whole_and_bytewise(data: bytes, expected: Command) -> None:
    assert both_ways(data) == [expected]


@pytest.mark.parametrize(("data", "expected"), VALID_COMMANDS)
def test_command_with_crlf(data: bytes, expected: Command) -> None:
    nl = data.index(b"\n")
    if data[nl - 1 : nl] == b"\r":
        return
    assert both_ways(data[:nl] + b"\r" + data[nl:]) == [expected]


def test_all_commands_pipelined_in_one_stream() -> None:
    stream = b"".join(d for d, _ in VALID_COMMANDS)
    expected = [c for _, c in VALID_COMMANDS]
    assert both_ways(stream) == expected
    rng = random.Random(7)
    for _ in range(20):
        sizes = [rng.randint(1, 40) for _ in range(len(stream))]
        assert parse_chunks(stream, sizes) == expected


def test_nothing_until_the_line_is_complete() -> None:
    p = parser()
    p.feed(b"SUB t c")
    assert p.next_command() is None
    assert p.buffered() == 7
    p.feed(b"\n")
    assert p.next_command() == ([b"SUB", b"t", b"c"], None)
    assert p.next_command() is None
    assert p.buffered() == 0


def test_identify_and_auth_allowed_again_in_init_state() -> None:
    # spec §11: a second IDENTIFY before SUB is accepted
    data = b"IDENTIFY\n" + i32(2) + b"{}" + b"IDENTIFY\n" + i32(2) + b"{}"
    assert both_ways(data) == [([b"IDENTIFY"], b"{}")] * 2


@pytest.mark.parametrize("state", [STATE_INIT, STATE_SUBSCRIBED, STATE_CLOSING])
def test_publish_commands_in_any_state(state: int) -> None:
    data = encode_pub("t", b"x") + encode_dpub("t", 5, b"y") + encode_mpub("t", [b"z"])
    assert [c[1] for c in both_ways(data, state)] == [b"x", b"y", [b"z"]]


# -- line endings and parameter splitting --------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "params"),
    [
        (b"NOP\r\n", [b"NOP"]),
        (b"RDY 1\r\r\n", [b"RDY", b"1\r"]),  # only one '\r' is stripped
        (b"A\rB\n", [b"A\rB"]),  # a '\r' elsewhere is kept
        (b"SUB  t c\n", [b"SUB", b"", b"t", b"c"]),  # bytes.Split: double space → empty param
        (b"RDY \n", [b"RDY", b""]),
        (b"FIN " + MSG_ID + b" \n", [b"FIN", MSG_ID, b""]),
        (b" NOP\n", [b"", b"NOP"]),
        (b"   \n", [b"", b"", b"", b""]),
        (b"REQ\t" + MSG_ID + b" 0\n", [b"REQ\t" + MSG_ID, b"0"]),  # only spaces separate
        (b"X \r\n", [b"X", b""]),
    ],
)
def test_params_split_like_go_bytes_split(line: bytes, params: list[bytes]) -> None:
    assert both_ways(line) == [(params, None)]


def test_crlf_before_a_body() -> None:
    assert both_ways(b"PUB t\r\n" + i32(2) + b"ab") == [([b"PUB", b"t"], b"ab")]
    assert both_ways(b"MPUB t\r\n" + i32(9) + i32(1) + i32(1) + b"a") == [([b"MPUB", b"t"], [b"a"])]


def test_double_space_in_pub_makes_an_empty_topic() -> None:
    _idx, err = error_at(b"PUB  t\n")
    assert isinstance(err, ProtocolError)
    assert err.text == 'E_BAD_TOPIC PUB topic name "" is not valid'


# -- every error string, byte-exact ------------------------------------------------------------

HUGE = 2**31 - 1

# (stream, error text, number of bytes fed when it must fail, parser state)
ERROR_CASES: list[tuple[bytes, str, int, int]] = []


def _err(stream: bytes, text: str, upto: int | None = None, state: int = STATE_INIT) -> None:
    ERROR_CASES.append((stream, text, len(stream) if upto is None else upto, state))


# PUB
_err(b"PUB\n", "E_INVALID PUB insufficient number of parameters")
_err(b"PUB\r\n", "E_INVALID PUB insufficient number of parameters")
_err(b"PUB b@d\n", 'E_BAD_TOPIC PUB topic name "b@d" is not valid')
_err(b"PUB " + b"a" * 65 + b"\n", f'E_BAD_TOPIC PUB topic name "{"a" * 65}" is not valid')
_err(b'PUB a"b\n', 'E_BAD_TOPIC PUB topic name "a\\"b" is not valid')
_err(b"PUB a\tb\n", 'E_BAD_TOPIC PUB topic name "a\\tb" is not valid')
_err(b"PUB \xff\xfe\n", 'E_BAD_TOPIC PUB topic name "\\xff\\xfe" is not valid')
_err(b"PUB t\r\r\n", 'E_BAD_TOPIC PUB topic name "t\\r" is not valid')
_err(b"PUB t\n" + i32(0), "E_BAD_MESSAGE PUB invalid message body size 0")
_err(b"PUB t\n" + i32(-1), "E_BAD_MESSAGE PUB invalid message body size -1")
_err(b"PUB t\n" + i32(-(2**31)), "E_BAD_MESSAGE PUB invalid message body size -2147483648")
_err(b"PUB t\n" + i32(MAX_MSG + 1), "E_BAD_MESSAGE PUB message too big 1025 > 1024")
_err(b"PUB t\n" + i32(HUGE), "E_BAD_MESSAGE PUB message too big 2147483647 > 1024")
# DPUB
_err(b"DPUB\n", "E_INVALID DPUB insufficient number of parameters")
_err(b"DPUB t\n", "E_INVALID DPUB insufficient number of parameters")
_err(b"DPUB b@d 10\n", 'E_BAD_TOPIC DPUB topic name "b@d" is not valid')
_err(b"DPUB b@d x\n", 'E_BAD_TOPIC DPUB topic name "b@d" is not valid')  # topic before timeout
_err(b"DPUB t abc\n", "E_INVALID DPUB could not parse timeout abc")
_err(b"DPUB t -1\n", "E_INVALID DPUB could not parse timeout -1")
_err(b"DPUB t +1\n", "E_INVALID DPUB could not parse timeout +1")
_err(b"DPUB t 1.5\n", "E_INVALID DPUB could not parse timeout 1.5")
_err(b"DPUB t 3600001\n", "E_INVALID DPUB timeout 3600001 out of range 0-3600000")
_err(
    b"DPUB t 18446744073709551615\n",
    "E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000",
)
_err(b"DPUB t 10\n" + i32(0), "E_BAD_MESSAGE DPUB invalid message body size 0")
_err(b"DPUB t 10\n" + i32(-5), "E_BAD_MESSAGE DPUB invalid message body size -5")
_err(b"DPUB t 10\n" + i32(MAX_MSG + 1), "E_BAD_MESSAGE DPUB message too big 1025 > 1024")
# MPUB
_err(b"MPUB\n", "E_INVALID MPUB insufficient number of parameters")
_err(b"MPUB b@d\n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "b@d" is not valid')
_err(b"MPUB \n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "" is not valid')
_err(b"MPUB t\n" + i32(0), "E_BAD_BODY MPUB invalid body size 0")
_err(b"MPUB t\n" + i32(-3), "E_BAD_BODY MPUB invalid body size -3")
_err(b"MPUB t\n" + i32(MAX_BODY + 1), "E_BAD_BODY MPUB body too big 4097 > 4096")
_err(b"MPUB t\n" + i32(HUGE), "E_BAD_BODY MPUB body too big 2147483647 > 4096")
_err(b"MPUB t\n" + i32(100) + i32(0), "E_BAD_BODY MPUB invalid message count 0")
_err(b"MPUB t\n" + i32(100) + i32(-1), "E_BAD_BODY MPUB invalid message count -1")
_err(b"MPUB t\n" + i32(100) + i32(MAX_COUNT + 1), "E_BAD_BODY MPUB invalid message count 819")
_err(
    b"MPUB t\n" + i32(4 + 5 + 4) + i32(2) + i32(1) + b"a" + i32(0),
    "E_BAD_MESSAGE MPUB invalid message(1) body size 0",
)
_err(
    b"MPUB t\n" + i32(4 + 5 + 4) + i32(2) + i32(1) + b"a" + i32(-7),
    "E_BAD_MESSAGE MPUB invalid message(1) body size -7",
)
_err(b"MPUB t\n" + i32(8) + i32(1) + i32(0), "E_BAD_MESSAGE MPUB invalid message(0) body size 0")
_err(
    b"MPUB t\n" + i32(4 + 5 + 4) + i32(2) + i32(1) + b"a" + i32(MAX_MSG + 1),
    "E_BAD_MESSAGE MPUB message too big 1025 > 1024",
)
# IDENTIFY (state checked before the body; too big checked before ≤ 0)
_err(b"IDENTIFY\n", "E_INVALID cannot IDENTIFY in current state", state=STATE_SUBSCRIBED)
_err(b"IDENTIFY\n", "E_INVALID cannot IDENTIFY in current state", state=STATE_CLOSING)
_err(b"IDENTIFY\n" + i32(MAX_BODY + 1), "E_BAD_BODY IDENTIFY body too big 4097 > 4096")
_err(b"IDENTIFY\n" + i32(0), "E_BAD_BODY IDENTIFY invalid body size 0")
_err(b"IDENTIFY\n" + i32(-1), "E_BAD_BODY IDENTIFY invalid body size -1")
# AUTH (state, then params, then ≤ 0 before too big)
_err(b"AUTH\n", "E_INVALID cannot AUTH in current state", state=STATE_SUBSCRIBED)
_err(b"AUTH x\n", "E_INVALID cannot AUTH in current state", state=STATE_CLOSING)
_err(b"AUTH x\n", "E_INVALID AUTH invalid number of parameters")
_err(b"AUTH \n", "E_INVALID AUTH invalid number of parameters")
_err(b"AUTH\n" + i32(0), "E_BAD_BODY AUTH invalid body size 0")
_err(b"AUTH\n" + i32(-9), "E_BAD_BODY AUTH invalid body size -9")
_err(b"AUTH\n" + i32(MAX_BODY + 1), "E_BAD_BODY AUTH body too big 4097 > 4096")


@pytest.mark.parametrize(("stream", "text", "upto", "state"), ERROR_CASES)
def test_error_string_fed_whole(stream: bytes, text: str, upto: int, state: int) -> None:
    p = parser(state)
    p.feed(stream)
    with pytest.raises(ProtocolError) as info:
        drain(p)
    assert info.value.text == text
    assert str(info.value) == text
    assert info.value.fatal
    assert f"{info.value.code} {info.value.desc}" == text


@pytest.mark.parametrize(("stream", "text", "upto", "state"), ERROR_CASES)
def test_error_raised_as_soon_as_known(stream: bytes, text: str, upto: int, state: int) -> None:
    """Fed one byte at a time, the error comes with the byte that decides it, no later."""
    idx, err = error_at(stream + b"\x00" * 64, parser(state))
    assert isinstance(err, ProtocolError)
    assert err.text == text
    assert idx == upto - 1


@pytest.mark.parametrize(("stream", "text", "upto", "state"), ERROR_CASES)
def test_error_frame_bytes(stream: bytes, text: str, upto: int, state: int) -> None:
    p = parser(state)
    p.feed(stream)
    with pytest.raises(ProtocolError) as info:
        drain(p)
    body = text.encode()
    assert encode_error(info.value.text) == struct.pack(">ii", len(body) + 4, 1) + body


def test_mpub_topic_error_code_is_doubled() -> None:
    p = parser()
    p.feed(b"MPUB b@d\n")
    with pytest.raises(ProtocolError) as info:
        p.next_command()
    assert info.value.code == "E_BAD_TOPIC"
    assert info.value.desc == 'E_BAD_TOPIC MPUB topic name "b@d" is not valid'


def test_raw_bytes_in_timeout_error_survive_to_the_frame() -> None:
    p = parser()
    p.feed(b"DPUB t \xff1\n")
    with pytest.raises(ProtocolError) as info:
        p.next_command()
    assert encode_error(info.value.text)[8:] == b"E_INVALID DPUB could not parse timeout \xff1"


@pytest.mark.parametrize(
    "prefix",
    [b"PUB t\n", b"DPUB t 10\n", b"MPUB t\n", b"IDENTIFY\n", b"AUTH\n"],
)
@pytest.mark.parametrize("size", [0, -1, MAX_BODY + 1, HUGE])
def test_out_of_range_size_rejected_without_waiting_for_body(prefix: bytes, size: int) -> None:
    p = parser()
    p.feed(prefix + i32(size))
    with pytest.raises(ProtocolError):
        p.next_command()


def test_identify_refused_by_state_before_reading_size() -> None:
    p = parser(STATE_SUBSCRIBED)
    p.feed(b"IDENTIFY\n")  # no size bytes at all
    with pytest.raises(ProtocolError, match="cannot IDENTIFY in current state"):
        p.next_command()


def test_state_follows_the_owner() -> None:
    p = parser()
    p.feed(b"SUB t c\n")
    assert p.next_command() == ([b"SUB", b"t", b"c"], None)
    p.state = STATE_SUBSCRIBED
    p.feed(b"AUTH\n")
    with pytest.raises(ProtocolError, match="cannot AUTH in current state"):
        p.next_command()


def test_max_count_boundary_is_accepted() -> None:
    p = parser()
    p.feed(b"MPUB t\n" + i32(MAX_BODY) + i32(MAX_COUNT))
    assert p.next_command() is None  # valid header: waits for the messages


def test_sizes_at_the_limits_are_accepted() -> None:
    for data in (
        b"PUB t\n" + i32(MAX_MSG),
        b"DPUB t 1\n" + i32(1),
        b"IDENTIFY\n" + i32(MAX_BODY),
        b"AUTH\n" + i32(MAX_BODY),
        b"MPUB t\n" + i32(MAX_BODY) + i32(1) + i32(MAX_MSG),
    ):
        p = parser()
        p.feed(data)
        assert p.next_command() is None


# -- MPUB per-message sizes and the declared body size (spec §2.3, §11) -----------------------------


def test_mpub_bad_message_size_rejected_before_the_declared_body_arrives() -> None:
    """§11: an out-of-range size field is rejected as soon as it is read. Go's readMPUB
    reads message(0)'s size right after the count and fails at once; it never waits
    for the rest of the declared body size."""
    data = b"MPUB t\n" + i32(100) + i32(3) + i32(0)
    p = parser()
    p.feed(data)
    with pytest.raises(ProtocolError) as info:
        p.next_command()
    assert info.value.text == "E_BAD_MESSAGE MPUB invalid message(0) body size 0"


def test_mpub_too_big_message_rejected_before_the_declared_body_arrives() -> None:
    data = b"MPUB t\n" + i32(2000) + i32(2) + i32(MAX_MSG + 1)
    p = parser()
    p.feed(data)
    with pytest.raises(ProtocolError) as info:
        p.next_command()
    assert info.value.text == "E_BAD_MESSAGE MPUB message too big 1025 > 1024"


def test_mpub_declared_body_size_overstated_still_completes() -> None:
    """§2.3: the declared body size is only range-checked; Go reads `count` messages
    and answers, whatever the size said. A client that overstates it gets its OK."""
    data = b"MPUB t\n" + i32(200) + i32(2) + i32(1) + b"a" + i32(1) + b"b"
    assert parse_whole(data) == [([b"MPUB", b"t"], [b"a", b"b"])]


def test_mpub_declared_body_size_understated_still_reads_count_messages() -> None:
    body = i32(3) + i32(2) + b"ab" + i32(2) + b"cd" + i32(2) + b"ef"
    data = b"MPUB t\n" + i32(4) + body + b"NOP\n"
    assert both_ways(data) == [([b"MPUB", b"t"], [b"ab", b"cd", b"ef"]), ([b"NOP"], None)]


# -- bodies arriving in pieces ----------------------------------------------------------------------


def test_pub_body_in_many_chunks_parses_once_complete() -> None:
    body = bytes(range(256)) * 400  # 102400 bytes
    data = b"PUB big\n" + i32(len(body)) + body
    p = parser(max_msg_size=len(body))
    pieces = list(chunked(data, [100] * (len(data) // 100 + 1)))
    for piece in pieces[:-1]:
        p.feed(piece)
        assert p.next_command() is None
    p.feed(pieces[-1])
    assert p.next_command() == ([b"PUB", b"big"], body)
    assert p.next_command() is None
    assert p.buffered() == 0


def test_buffered_counts_pending_chunks() -> None:
    p = parser()
    p.feed(b"PUB t\n" + i32(100))
    assert p.next_command() is None
    p.feed(b"x" * 40)
    assert p.buffered() == 6 + 4 + 40
    assert p.next_command() is None
    p.feed(b"x" * 60 + b"NOP\n")
    assert drain(p) == [([b"PUB", b"t"], b"x" * 100), ([b"NOP"], None)]
    assert p.buffered() == 0


def test_buffered_counts_a_body_joined_as_it_completed() -> None:
    bodies = [b"a" * 5000, b"b" * 5000]  # split: each body comes on its own
    data = encode_mpub("t", bodies)
    p = parser(max_msg_size=1 << 20, max_body_size=1 << 22)
    head = len(b"MPUB t\n") + 8  # consumed once the MPUB's sizes are read
    p.feed(data[:3000])
    assert p.next_command() is None
    assert p.buffered() == 3000 - head
    p.feed(data[3000:6000])  # completes the first body: joined, not yet taken
    assert p.buffered() == 6000 - head
    p.feed(data[6000:])
    assert p.next_command() == ([b"MPUB", b"t"], bodies)
    assert p.buffered() == 0


def test_large_mpub_in_random_chunks() -> None:
    rng = random.Random(1234)
    bodies = [rng.randbytes(rng.randint(1, 200)) for _ in range(5000)]
    data = encode_mpub("big", bodies) + b"NOP\n" + encode_pub("big", b"after")
    expected = [([b"MPUB", b"big"], bodies), ([b"NOP"], None), ([b"PUB", b"big"], b"after")]
    p_opts = {"max_msg_size": 1024, "max_body_size": 5 * 1024 * 1024}
    assert parse_whole(data, parser(**p_opts)) == expected
    for _ in range(5):
        sizes = [rng.choice((1, 3, 7, 64, 1000, 4096, 65536)) for _ in range(len(data))]
        assert parse_chunks(data, sizes, parser(**p_opts)) == expected


def test_mpub_fed_bytewise() -> None:
    bodies = [b"one", b"two", b"three", b"x" * 300]
    data = encode_mpub("t", bodies) + encode_mpub("t", [b"z"])
    assert both_ways(data) == [([b"MPUB", b"t"], bodies), ([b"MPUB", b"t"], [b"z"])]


def test_mpub_stays_packed_unless_its_bodies_average_kilobytes() -> None:
    """Small bodies come as (payload, count), the bytes as sent (nsqd queues them as one
    run); bodies of MPUB_SPLIT_FROM bytes or more on average, or a single body, come split,
    as a list."""
    big = [b"x" * MPUB_SPLIT_FROM, b"y" * (MPUB_SPLIT_FROM + 1)]
    small = [b"a", b"b" * (2 * MPUB_SPLIT_FROM - 2)]  # averages just under
    payload = b"".join(len(b).to_bytes(4, "big") + b for b in small)
    expected = [
        ([b"MPUB", b"t"], big),
        ([b"MPUB", b"t"], (payload, 2)),
        ([b"MPUB", b"t"], [b"one"]),
    ]
    data = encode_mpub("t", big) + encode_mpub("t", small) + encode_mpub("t", [b"one"])
    for sizes in ([len(data)], itertools.repeat(1000)):  # whole, and in pieces
        p = parser(max_msg_size=1 << 20, max_body_size=1 << 22)
        got = []
        for chunk in chunked(data, sizes):
            p.feed(chunk)
            while (cmd := p.next_command()) is not None:
                got.append(cmd)
        assert got == expected


# -- the 16 KiB line limit (Go's bufio.Reader of 16 KiB + ReadSlice) ------------------------------


def test_longest_line_fits_the_buffer() -> None:
    # ReadSlice('\n') succeeds when the line, '\n' included, fits the 16384-byte buffer
    line = b"X" * (MAX_LINE_LENGTH - 1) + b"\n"
    assert parse_whole(line) == [([b"X" * (MAX_LINE_LENGTH - 1)], None)]


def test_line_one_byte_over_the_buffer_fails() -> None:
    # 16384 bytes + '\n' = 16385 bytes: bufio.ErrBufferFull in Go, the connection closes
    line = b"X" * MAX_LINE_LENGTH + b"\n"
    with pytest.raises(ConnectionFailure):
        parse_whole(line)


def test_full_buffer_without_newline_fails() -> None:
    p = parser()
    p.feed(b"X" * MAX_LINE_LENGTH)  # the buffer is full and holds no '\n'
    with pytest.raises(ConnectionFailure):
        p.next_command()


@pytest.mark.parametrize("extra", [1, 100, 20000])
def test_line_over_16k_fails(extra: int) -> None:
    data = b"SUB " + b"t" * (MAX_LINE_LENGTH + extra) + b" c\n"
    with pytest.raises(ConnectionFailure):
        parse_whole(data)
    p = parser()
    with pytest.raises(ConnectionFailure):
        for piece in chunked(data, [997] * 100):
            p.feed(piece)
            drain(p)


def test_long_line_without_newline_fails_before_the_newline_arrives() -> None:
    p = parser()
    with pytest.raises(ConnectionFailure):
        for _ in range(100):
            p.feed(b"a" * 1000)
            drain(p)


def test_body_may_exceed_the_line_limit() -> None:
    body = b"\x00" * 100_000  # no '\n' anywhere: bodies are read with ReadFull
    data = b"PUB t\n" + i32(len(body)) + body
    assert parse_whole(data, parser(max_msg_size=len(body))) == [([b"PUB", b"t"], body)]


# -- parse_base10 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"", 0),
        (b"0", 0),
        (b"000", 0),
        (b"7", 7),
        (b"0123", 123),
        (b"3600000", 3600000),
        (b"18446744073709551615", 2**64 - 1),
        (b"18446744073709551616", 0),
        (b"18446744073709551617", 1),
        (b"99999999999999999999", 99999999999999999999 % 2**64),
        (b"-1", None),
        (b"+1", None),
        (b" 1", None),
        (b"1 ", None),
        (b"1a", None),
        (b"0x10", None),
        (b"1_000", None),
        (b"1.0", None),
        ("\u0661".encode(), None),  # ARABIC-INDIC DIGIT ONE: not an ASCII digit
        (b"\xb2", None),
    ],
)
def test_parse_base10(raw: bytes, value: int | None) -> None:
    assert parse_base10(raw) == value


# -- frames and client-side encoders ----------------------------------------------------------------


def test_frame_constants() -> None:
    assert MAGIC_V2 == b"  V2"
    assert FRAME_TYPE_RESPONSE == 0
    assert FRAME_TYPE_ERROR == 1
    assert FRAME_TYPE_MESSAGE == 2
    assert FRAME_OK == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert FRAME_HEARTBEAT == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert FRAME_CLOSE_WAIT == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"


def test_encode_response_and_error() -> None:
    assert encode_response(b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"
    assert encode_response(b'{"a":1}') == b'\x00\x00\x00\x0b\x00\x00\x00\x00{"a":1}'
    assert (
        encode_error("E_INVALID invalid command ")
        == b"\x00\x00\x00\x1e\x00\x00\x00\x01E_INVALID invalid command "
    )
    assert encode_error("E_BAD_PROTOCOL") == b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"


def test_encode_message_frame_exact_bytes() -> None:
    ts = 0x0102030405060708
    frame = encode_message_frame(MSG_ID, ts, 3, b"hi")
    assert frame == (
        b"\x00\x00\x00\x20"  # size = 4 + 26 + 2
        b"\x00\x00\x00\x02"  # FrameTypeMessage
        b"\x01\x02\x03\x04\x05\x06\x07\x08"  # timestamp (ns)
        b"\x00\x03"  # attempts
        b"0123456789abcdef"  # id
        b"hi"
    )
    assert frame[8:] == encode_message(MSG_ID, ts, 3, b"hi")
    assert len(encode_message(MSG_ID, ts, 3, b"")) == MESSAGE_HEADER_SIZE == 26


def test_encode_message_extremes() -> None:
    payload = encode_message(MSG_ID, -1, 0xFFFF, b"")
    assert payload == b"\xff" * 8 + b"\xff\xff" + MSG_ID
    assert decode_message(payload) == (MSG_ID, -1, 0xFFFF, b"")


def test_decode_message_round_trip() -> None:
    assert decode_message(encode_message(MSG_ID, 1_700_000_000_000_000_000, 1, b"body")) == (
        MSG_ID,
        1_700_000_000_000_000_000,
        1,
        b"body",
    )


@pytest.mark.parametrize("size", [0, 1, 10, 25])
def test_decode_message_too_short(size: int) -> None:
    with pytest.raises(ValueError):
        decode_message(b"\x00" * size)


def test_encode_commands_exact_bytes() -> None:
    assert encode_nop() == b"NOP\n"
    assert encode_cls() == b"CLS\n"
    assert encode_rdy(0) == b"RDY 0\n"
    assert encode_rdy(2500) == b"RDY 2500\n"
    assert encode_sub("orders", "email#ephemeral") == b"SUB orders email#ephemeral\n"
    assert encode_fin(MSG_ID) == b"FIN 0123456789abcdef\n"
    assert encode_req(MSG_ID, 0) == b"REQ 0123456789abcdef 0\n"
    assert encode_req(MSG_ID, 60000) == b"REQ 0123456789abcdef 60000\n"
    assert encode_touch(MSG_ID) == b"TOUCH 0123456789abcdef\n"
    assert encode_pub("t", b"hello") == b"PUB t\n\x00\x00\x00\x05hello"
    assert encode_dpub("t", 1500, b"x") == b"DPUB t 1500\n\x00\x00\x00\x01x"
    assert encode_auth(b"secret") == b"AUTH\n\x00\x00\x00\x06secret"
    assert encode_command(b"NOP") == b"NOP\n"
    assert encode_command(b"SUB", b"a", b"b") == b"SUB a b\n"
    assert encode_command(b"PUB", b"t", body=b"") == b"PUB t\n\x00\x00\x00\x00"


def test_encode_mpub_exact_bytes() -> None:
    assert encode_mpub("t", [b"a", b"bc"]) == (
        b"MPUB t\n"
        b"\x00\x00\x00\x0f"  # body size: 4 (count) + (4 + 1) + (4 + 2)
        b"\x00\x00\x00\x02"  # count
        b"\x00\x00\x00\x01a"
        b"\x00\x00\x00\x02bc"
    )
    assert encode_mpub("t", iter([b"xyz"])) == (
        b"MPUB t\n\x00\x00\x00\x0b\x00\x00\x00\x01\x00\x00\x00\x03xyz"
    )


def test_encode_identify() -> None:
    data = encode_identify({"client_id": "c", "feature_negotiation": True})
    assert data.startswith(b"IDENTIFY\n")
    (size,) = struct.unpack(">i", data[9:13])
    assert size == len(data) - 13
    assert json.loads(data[13:]) == {"client_id": "c", "feature_negotiation": True}
    assert parse_whole(data) == [([b"IDENTIFY"], data[13:])]


def test_encoders_round_trip_through_command_parser() -> None:
    stream = b"".join(
        [
            encode_identify({"a": 1}),
            encode_auth(b"s3cr3t"),
            encode_sub("t", "c"),
            encode_rdy(10),
            encode_fin(MSG_ID),
            encode_req(MSG_ID, 250),
            encode_touch(MSG_ID),
            encode_nop(),
            encode_cls(),
            encode_pub("t", b"p"),
            encode_dpub("t", 99, b"d"),
            encode_mpub("t", [b"m1", b"m2"]),
        ]
    )
    assert both_ways(stream) == [
        ([b"IDENTIFY"], b'{"a": 1}'),
        ([b"AUTH"], b"s3cr3t"),
        ([b"SUB", b"t", b"c"], None),
        ([b"RDY", b"10"], None),
        ([b"FIN", MSG_ID], None),
        ([b"REQ", MSG_ID, b"250"], None),
        ([b"TOUCH", MSG_ID], None),
        ([b"NOP"], None),
        ([b"CLS"], None),
        ([b"PUB", b"t"], b"p"),
        ([b"DPUB", b"t", b"99"], b"d"),
        ([b"MPUB", b"t"], [b"m1", b"m2"]),
    ]


FRAMES: list[tuple[bytes, tuple[int, bytes]]] = [
    (FRAME_OK, (0, b"OK")),
    (FRAME_HEARTBEAT, (0, b"_heartbeat_")),
    (encode_response(b""), (0, b"")),
    (
        encode_error("E_INVALID cannot RDY in current state"),
        (1, b"E_INVALID cannot RDY in current state"),
    ),
    (
        encode_message_frame(MSG_ID, 1234567890, 1, b"body\n"),
        (2, encode_message(MSG_ID, 1234567890, 1, b"body\n")),
    ),
    (encode_response(b"x" * 70000), (0, b"x" * 70000)),
    (FRAME_CLOSE_WAIT, (0, b"CLOSE_WAIT")),
]


def test_frame_parser_whole_and_bytewise() -> None:
    stream = b"".join(f for f, _ in FRAMES)
    expected = [e for _, e in FRAMES]
    assert FrameParser().feed(stream) == expected
    fp = FrameParser()
    got: list[tuple[int, bytes]] = []
    for i in range(len(stream)):
        got.extend(fp.feed(stream[i : i + 1]))
    assert got == expected
    rng = random.Random(3)
    fp = FrameParser()
    got = []
    for piece in chunked(stream, [rng.randint(1, 5000) for _ in range(len(stream))]):
        got.extend(fp.feed(piece))
    assert got == expected


def test_frame_parser_message_decodes() -> None:
    fp = FrameParser()
    frame = encode_message_frame(MSG_ID, 42, 7, b"payload")
    got: list[tuple[int, bytes]] = []
    for i in range(len(frame)):
        got.extend(fp.feed(frame[i : i + 1]))
    assert len(got) == 1
    ftype, payload = got[0]
    assert ftype == FRAME_TYPE_MESSAGE
    assert decode_message(payload) == (MSG_ID, 42, 7, b"payload")


def test_frame_parser_waits_for_the_whole_frame() -> None:
    fp = FrameParser()
    assert fp.feed(FRAME_OK[:7]) == []
    assert fp.feed(FRAME_OK[7:9]) == []
    assert fp.feed(FRAME_OK[9:] + FRAME_OK[:1]) == [(0, b"OK")]
    assert fp.feed(FRAME_OK[1:]) == [(0, b"OK")]


@pytest.mark.parametrize("size", [3, 0, -1, -(2**31)])
def test_frame_parser_rejects_small_sizes(size: int) -> None:
    with pytest.raises(ValueError):
        FrameParser().feed(struct.pack(">ii", size, 0))


def _fin(i: int) -> bytes:
    return b"FIN %016x\n" % i


def test_fin_block_gives_every_id_in_order() -> None:
    p = parser()
    p.feed(b"".join(_fin(i) for i in range(300)))
    assert p.take_fin_block() == [b"%016x" % i for i in range(300)]
    assert p.next_command() is None  # all consumed
    p.feed(_fin(7))
    assert p.take_fin_block() == [b"%016x" % 7]


def _outcome(p: CommandParser) -> object:
    try:
        return drain(p)
    except (ProtocolError, ConnectionFailure) as err:
        return repr(err)


@pytest.mark.parametrize(
    "data",
    [
        b"FIN 0123456789abcde\r\n",  # "FIN <15 bytes>\r\n": Go strips \r, the ID is short
        b"REQ 0123456789abcdef 0\n",
        b"FIN 0123456789abcdef0\n",  # 22 bytes: not a run of 21-byte lines
        b"FIN 0123456789\nabcdef\n",  # 21 bytes, but two lines
        b"fin 0123456789abcdef\n",
        b"FIN\t0123456789abcdef\n",
        b"NOP\n" * 7,
    ],
)
def test_fin_block_refuses_anything_else_and_consumes_nothing(data: bytes) -> None:
    stream = _fin(1) + data
    p = parser(STATE_SUBSCRIBED)
    p.feed(stream)
    assert p.take_fin_block() is None
    fresh = parser(STATE_SUBSCRIBED)
    fresh.feed(stream)
    assert _outcome(p) == _outcome(fresh)  # the general parse reads it all, from the start


def test_fin_block_leaves_an_incomplete_line_for_later() -> None:
    p = parser(STATE_SUBSCRIBED)
    p.feed(_fin(1) + _fin(2) + b"FIN 0123")
    assert p.take_fin_block() == [b"%016x" % 1, b"%016x" % 2]
    assert p.next_command() is None
    p.feed(b"456789abcdef\n")
    assert drain(p) == [([b"FIN", b"0123456789abcdef"], None)]
