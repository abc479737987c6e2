"""The nsqlookupd V1 codec (nsqpy.wire.v1): bytes in, events or Go's exact errors out."""

from __future__ import annotations

import json
import struct

import pytest

from nsqpy.wire.v1 import (
    MAGIC_V1,
    RESPONSE_OK,
    BadProtocol,
    CommandParser,
    ConnectionFailure,
    Event,
    Identify,
    LookupdInfo,
    PeerIdentity,
    Ping,
    ProtocolError,
    ProtocolMagic,
    Register,
    ResponseError,
    ResponseParser,
    Unregister,
    decode_identify_response,
    encode_error,
    encode_identify,
    encode_identify_response,
    encode_json,
    encode_ping,
    encode_register,
    encode_response,
    encode_unregister,
    parse_identify_body,
)

PEER = {
    "version": "1.3.0",
    "tcp_port": 4150,
    "http_port": 4151,
    "hostname": "host",
    "broadcast_address": "10.0.0.1",
    "topology_zone": "z",
    "topology_region": "r",
}


def int32(n: int) -> bytes:
    return struct.pack(">i", n)


def identify(body: bytes) -> bytes:
    return b"IDENTIFY\n" + int32(len(body)) + body


def events_of(data: bytes, *, chunk: int | None = None) -> list[Event]:
    """Feed ``data`` (all at once, or ``chunk`` bytes at a time) the way the server does:
    each event handled (IDENTIFY accepted) before the next is asked for."""
    parser = CommandParser()
    out: list[Event] = []
    pieces = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    for piece in pieces:
        parser.feed(piece)
        while (event := parser.next_event()) is not None:
            if isinstance(event, Identify):
                parser.identified = True
            out.append(event)
    return out


def error_of(data: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        events_of(data)
    return info.value


SESSION = (
    MAGIC_V1
    + b"PING\n"
    + identify(json.dumps(PEER).encode())
    + b"REGISTER orders\n"
    + b"REGISTER orders email\n"
    + b"  UNREGISTER orders email \r\n"
    + b"UNREGISTER orders\n"
    + b"PING ignored params\n"
)
SESSION_EVENTS: list[Event] = [
    ProtocolMagic(MAGIC_V1),
    Ping(),
    Identify(PeerIdentity("10.0.0.1", 4150, 4151, "1.3.0", "host", "z", "r")),
    Register("orders", ""),
    Register("orders", "email"),
    Unregister("orders", "email"),
    Unregister("orders", ""),
    Ping(),
]


# -- server side ------------------------------------------------------------------------------


def test_session_all_at_once() -> None:
    assert events_of(SESSION) == SESSION_EVENTS


def test_session_byte_at_a_time() -> None:
    assert events_of(SESSION, chunk=1) == SESSION_EVENTS


@pytest.mark.parametrize("chunk", [2, 3, 5, 7, 64])
def test_session_in_chunks(chunk: int) -> None:
    assert events_of(SESSION, chunk=chunk) == SESSION_EVENTS


def test_nothing_before_a_full_line() -> None:
    parser = CommandParser()
    parser.feed(MAGIC_V1 + b"PIN")
    assert parser.next_event() == ProtocolMagic(MAGIC_V1)
    assert parser.next_event() is None
    parser.feed(b"G\n")
    assert parser.next_event() == Ping()
    assert parser.next_event() is None


@pytest.mark.parametrize("magic", [b"  V2", b"V1  ", b"GET ", b"\x00\x00\x00\x00"])
def test_bad_magic(magic: bytes) -> None:
    err = error_of(magic + b"PING\n")
    assert isinstance(err, BadProtocol)
    assert err.text == "E_BAD_PROTOCOL"
    assert err.magic == magic
    assert encode_error(err.text) == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"


def test_no_magic_expected() -> None:
    parser = CommandParser(expect_magic=False)
    parser.feed(b"PING\n")
    assert parser.next_event() == Ping()


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"FOO\n", "E_INVALID invalid command FOO"),
        (b"ping\n", "E_INVALID invalid command ping"),
        (b"\n", "E_INVALID invalid command "),
        (b"   \r\n", "E_INVALID invalid command "),
        (b"FOO BAR\n", "E_INVALID invalid command FOO"),
        (b" PING\x1f\n", "E_INVALID invalid command PING\x1f"),  # Go keeps \x1f
        (b"REGISTER t\n", "E_INVALID client must IDENTIFY"),
        (b"UNREGISTER t c\n", "E_INVALID client must IDENTIFY"),
        (b"REGISTER\n", "E_INVALID client must IDENTIFY"),
    ],
)
def test_command_errors(data: bytes, text: str) -> None:
    assert error_of(MAGIC_V1 + data).text == text


IDENTIFIED = MAGIC_V1 + identify(json.dumps(PEER).encode())


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"REGISTER\n", "E_INVALID REGISTER insufficient number of params"),
        (b"UNREGISTER\n", "E_INVALID UNREGISTER insufficient number of params"),
        (b"REGISTER bad!topic\n", "E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
        (b"UNREGISTER a*b c\n", "E_BAD_TOPIC UNREGISTER topic name 'a*b' is not valid"),
        (b"REGISTER  t\n", "E_BAD_TOPIC REGISTER topic name '' is not valid"),
        (
            b"REGISTER " + b"x" * 65 + b"\n",
            f"E_BAD_TOPIC REGISTER topic name '{'x' * 65}' is not valid",
        ),
        (b"REGISTER t bad/chan\n", "E_BAD_CHANNEL REGISTER channel name 'bad/chan' is not valid"),
        (b"UNREGISTER t c#eph\n", "E_BAD_CHANNEL UNREGISTER channel name 'c#eph' is not valid"),
        (b"IDENTIFY\n", "E_INVALID cannot IDENTIFY again"),
    ],
)
def test_identified_errors(data: bytes, text: str) -> None:
    assert error_of(IDENTIFIED + data).text == text


def test_invalid_utf8_name_is_echoed_byte_exactly() -> None:
    err = error_of(IDENTIFIED + b"REGISTER t\xff\n")
    assert encode_error(err.text) == encode_response(
        b"E_BAD_TOPIC REGISTER topic name 't\xff' is not valid"
    )


def test_extra_params_and_ephemeral_names_are_fine() -> None:
    events = events_of(IDENTIFIED + b"REGISTER t#ephemeral c#ephemeral extra\n")
    assert events[-1] == Register("t#ephemeral", "c#ephemeral")


def test_empty_channel_param_means_topic() -> None:
    # "REGISTER t " is trimmed; "REGISTER t  x" has an empty channel param
    assert events_of(IDENTIFIED + b"REGISTER t  x\n")[-1] == Register("t", "")


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b"", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"{", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"[]", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'"x"', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"{} x", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"null", "E_BAD_BODY IDENTIFY missing fields"),
        (b"{}", "E_BAD_BODY IDENTIFY missing fields"),
    ],
)
def test_identify_body_errors(body: bytes, text: str) -> None:
    assert error_of(MAGIC_V1 + identify(body)).text == text


@pytest.mark.parametrize("missing", ["broadcast_address", "tcp_port", "http_port", "version"])
def test_identify_missing_fields(missing: str) -> None:
    peer = {k: v for k, v in PEER.items() if k != missing}
    with pytest.raises(ProtocolError, match=r"^E_BAD_BODY IDENTIFY missing fields$"):
        parse_identify_body(json.dumps(peer).encode())
    peer[missing] = 0 if missing.endswith("port") else ""
    with pytest.raises(ProtocolError, match=r"^E_BAD_BODY IDENTIFY missing fields$"):
        parse_identify_body(json.dumps(peer).encode())


@pytest.mark.parametrize(
    "patch",
    [
        {"tcp_port": "4150"},
        {"tcp_port": 4150.0},
        {"tcp_port": True},
        {"tcp_port": 1 << 63},
        {"version": 1},
        {"hostname": ["h"]},
        {"topology_zone": {"a": 1}},
    ],
)
def test_identify_wrong_types(patch: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match=r"^E_BAD_BODY IDENTIFY failed to decode JSON body$"):
        parse_identify_body(json.dumps({**PEER, **patch}).encode())


def test_identify_like_go_unmarshal() -> None:
    # keys match case-insensitively, the last one wins, null keeps the zero value,
    # unknown keys are skipped whatever they hold
    body = (
        b'{"VERSION":"1.3.0","Tcp_Port":1,"http_port":2,"broadcast_address":"a",'
        b'"hostname":null,"unknown":[1,{"x":1e400}],"tcp_port":3}'
    )
    peer = parse_identify_body(body)
    assert peer == PeerIdentity("a", 3, 2, "1.3.0", "")
    with pytest.raises(ProtocolError):
        parse_identify_body(b'{"version":"1","tcp_port":1,"http_port":1,"broadcast_address":NaN}')
    # negative ports pass Go's "!= 0" check
    assert parse_identify_body(json.dumps({**PEER, "tcp_port": -1}).encode()).tcp_port == -1


def test_identify_size_errors() -> None:
    assert error_of(MAGIC_V1 + b"IDENTIFY\n" + int32(-1)).text == (
        "E_BAD_BODY IDENTIFY invalid body size -1"
    )
    parser = CommandParser(max_body_size=10)
    parser.feed(MAGIC_V1 + b"IDENTIFY\n" + int32(11))
    parser.next_event()
    with pytest.raises(ProtocolError, match=r"^E_BAD_BODY IDENTIFY body too big 11 > 10$"):
        parser.next_event()


def test_identify_params_are_ignored() -> None:
    body = json.dumps(PEER).encode()
    events = events_of(MAGIC_V1 + b"IDENTIFY x y\n" + int32(len(body)) + body)
    assert isinstance(events[-1], Identify)


def test_eof_mid_identify() -> None:
    parser = CommandParser()
    parser.feed(MAGIC_V1 + b"IDENTIFY\n\x00\x00")
    assert parser.next_event() == ProtocolMagic(MAGIC_V1)
    assert parser.next_event() is None
    err = parser.eof()
    assert err is not None and err.text == "E_BAD_BODY IDENTIFY failed to read body size"
    parser.feed(b"\x00\x05{")
    assert parser.next_event() is None
    err = parser.eof()
    assert err is not None and err.text == "E_BAD_BODY IDENTIFY failed to read body"


def test_eof_mid_line_is_silent() -> None:
    parser = CommandParser()
    parser.feed(MAGIC_V1 + b"PIN")
    parser.next_event()
    assert parser.next_event() is None
    assert parser.eof() is None


def test_line_too_long() -> None:
    parser = CommandParser(max_line_length=8)
    parser.feed(MAGIC_V1 + b"REGISTER topic")
    parser.next_event()
    with pytest.raises(ConnectionFailure):
        parser.next_event()


def test_fatal_error_stops_at_the_bad_command() -> None:
    parser = CommandParser()
    parser.feed(MAGIC_V1 + b"PING\nNOPE\nPING\n")
    assert parser.next_event() == ProtocolMagic(MAGIC_V1)
    assert parser.next_event() == Ping()
    with pytest.raises(ProtocolError):
        parser.next_event()


# -- replies ----------------------------------------------------------------------------------


def test_replies() -> None:
    assert RESPONSE_OK == b"\x00\x00\x00\x02OK"
    assert encode_error("E_INVALID client must IDENTIFY") == (
        int32(30) + b"E_INVALID client must IDENTIFY"
    )
    reply = encode_identify_response(
        tcp_port=4160, http_port=4161, version="1.3.0", broadcast_address="b<>", hostname="h"
    )
    body = (
        b'{"broadcast_address":"b\\u003c\\u003e","hostname":"h",'
        b'"http_port":4161,"tcp_port":4160,"version":"1.3.0"}'
    )
    assert reply == int32(len(body)) + body


def test_encode_json_like_go() -> None:
    assert encode_json({"b": [1, True, None], "a": "x&y"}) == b'{"b":[1,true,null],"a":"x\\u0026y"}'
    assert encode_json({"b": 1, "a": {"d": 1, "c": 2}}, sort_keys=True) == (
        b'{"a":{"c":2,"d":1},"b":1}'
    )
    assert encode_json("\udcff\u2028é") == '"\ufffd\\u2028é"'.encode()


# -- client side (nsqd) -----------------------------------------------------------------------


def test_encode_commands() -> None:
    assert encode_register("t") == b"REGISTER t\n"
    assert encode_register("t", "c") == b"REGISTER t c\n"
    assert encode_unregister("t") == b"UNREGISTER t\n"
    assert encode_unregister("t", "c#ephemeral") == b"UNREGISTER t c#ephemeral\n"
    assert encode_ping() == b"PING\n"
    cmd = encode_identify(PEER)
    body = (
        b'{"broadcast_address":"10.0.0.1","hostname":"host","http_port":4151,'
        b'"tcp_port":4150,"topology_region":"r","topology_zone":"z","version":"1.3.0"}'
    )
    assert cmd == b"IDENTIFY\n" + int32(len(body)) + body


def test_client_commands_parse_back() -> None:
    data = MAGIC_V1 + encode_identify(PEER) + encode_register("t", "c") + encode_unregister("t")
    assert events_of(data, chunk=1)[1:] == [
        Identify(PeerIdentity("10.0.0.1", 4150, 4151, "1.3.0", "host", "z", "r")),
        Register("t", "c"),
        Unregister("t", ""),
    ]


def test_response_parser_byte_at_a_time() -> None:
    data = RESPONSE_OK + encode_response(b"") + encode_error("E_INVALID x") + RESPONSE_OK
    parser = ResponseParser()
    out: list[bytes] = []
    for i in range(len(data)):
        out += parser.feed(data[i : i + 1])
    assert out == [b"OK", b"", b"E_INVALID x", b"OK"]
    assert ResponseParser().feed(data) == out


def test_response_parser_limits() -> None:
    with pytest.raises(ResponseError, match=r"response body size \(11\) is greater than limit"):
        ResponseParser(10).feed(int32(11))
    with pytest.raises(ResponseError):
        ResponseParser().feed(int32(-1))


def test_decode_identify_response() -> None:
    data = b'{"tcp_port":4160,"http_port":4161,"version":"1.3.0","broadcast_address":"b","x":1}'
    info = decode_identify_response(data)
    assert info == LookupdInfo(4160, 4161, "1.3.0", "b")
    assert str(info) == "{TCPPort:4160 HTTPPort:4161 Version:1.3.0 BroadcastAddress:b}"
    with pytest.raises(ResponseError, match="E_INVALID"):
        decode_identify_response(b"E_INVALID")
    with pytest.raises(ResponseError, match="parsing response - E_BAD_BODY IDENTIFY missing"):
        decode_identify_response(b"E_BAD_BODY IDENTIFY missing fields")
    assert decode_identify_response(b"{}") == LookupdInfo()
