"""Every TCP protocol error a client can trigger today, byte-exact (spec §2.1-§2.3, §2.6, §11).

Each test sends raw bytes and asserts the exact error frame nsqd answers with and,
for fatal errors, that nsqd then closes the connection. Non-fatal errors
(E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED) must leave the connection usable,
which :meth:`RawClient.expect_error` proves with a following PUB that works.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Connect
from tests.support.procs import ServerProcess
from tests.support.rawclient import RawClient, int32, mpub_body

pytestmark = pytest.mark.timeout(30)

MAX_BODY = 5 * 1024 * 1024  # --max-body-size default
MAX_MSG = 1024 * 1024  # --max-msg-size default
MAX_RDY = 2500
MAX_MPUB_COUNT = (MAX_BODY - 4) // 5
FAKE_ID = b"0123456789abcdef"


@pytest.fixture
def connect(shared_connect: Connect) -> Connect:
    """These tests are independent (own topic names): one nsqd serves the whole module."""
    return shared_connect


def subscribed(connect: Connect, topic: str, channel: str = "ch") -> RawClient:
    client = connect()
    client.sub(topic, channel)
    return client


def consumer_with_message(
    connect: Connect, topic: str, channel: str = "ch"
) -> tuple[RawClient, bytes]:
    """A consumer holding one in-flight message; returns it and the message ID."""
    client = subscribed(connect, topic, channel)
    client.rdy(1)
    connect().pub(topic, b"payload")
    return client, client.read_message().id


# -- magic --------------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"GET ", b"\x00\x00\x00\x00"])
def test_bad_magic(connect: Connect, magic: bytes) -> None:
    client = connect(magic=None)
    client.send(magic)
    client.expect_error("E_BAD_PROTOCOL")


def test_bad_magic_sent_in_pieces(connect: Connect) -> None:
    client = connect(magic=None)
    client.send(b"  ")
    client.send(b"V3")
    client.expect_error("E_BAD_PROTOCOL")


# -- IDENTIFY -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("heartbeat_interval", 100, "heartbeat interval (100) is invalid"),
        ("heartbeat_interval", 999, "heartbeat interval (999) is invalid"),
        ("heartbeat_interval", 60001, "heartbeat interval (60001) is invalid"),
        ("heartbeat_interval", -2, "heartbeat interval (-2) is invalid"),
        ("output_buffer_size", 63, "output buffer size (63) is invalid"),
        ("output_buffer_size", 65537, "output buffer size (65537) is invalid"),
        ("output_buffer_size", -2, "output buffer size (-2) is invalid"),
        ("output_buffer_timeout", 24, "output buffer timeout (24) is invalid"),
        ("output_buffer_timeout", 30001, "output buffer timeout (30001) is invalid"),
        ("output_buffer_timeout", -2, "output buffer timeout (-2) is invalid"),
        ("sample_rate", 100, "sample rate (100) is invalid"),
        ("sample_rate", -1, "sample rate (-1) is invalid"),
        ("msg_timeout", 999, "msg timeout (999) is invalid"),
        ("msg_timeout", 900001, "msg timeout (900001) is invalid"),
        ("msg_timeout", -1, "msg timeout (-1) is invalid"),
    ],
)
def test_identify_bad_field(connect: Connect, field: str, value: int, reason: str) -> None:
    client = connect()
    client.send_cmd(b"IDENTIFY", body=json.dumps({field: value}).encode())
    client.expect_error(f"E_BAD_BODY IDENTIFY {reason}")


def test_identify_heartbeat_interval_100_exact_string(connect: Connect) -> None:
    """The exact string go-nsq's tests assert."""
    client = connect()
    client.send_cmd(b"IDENTIFY", body=b'{"heartbeat_interval":100}')
    client.expect_error("E_BAD_BODY IDENTIFY heartbeat interval (100) is invalid")


def test_identify_fields_checked_in_go_order(connect: Connect) -> None:
    """Heartbeat, then output buffer (timeout before size), then sample rate, then msg timeout."""
    client = connect()
    body = {
        "msg_timeout": 1,
        "sample_rate": 500,
        "output_buffer_size": 1,
        "output_buffer_timeout": 1,
        "heartbeat_interval": 1,
    }
    client.send_cmd(b"IDENTIFY", body=json.dumps(body).encode())
    client.expect_error("E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid")
    client = connect()
    del body["heartbeat_interval"]
    client.send_cmd(b"IDENTIFY", body=json.dumps(body).encode())
    client.expect_error("E_BAD_BODY IDENTIFY output buffer timeout (1) is invalid")


def test_identify_limits_follow_server_flags(nsqd_factory: Callable[..., ServerProcess]) -> None:
    nsqd = nsqd_factory(
        max_heartbeat_interval="5s", max_msg_timeout="10s", max_output_buffer_size=1000
    )
    for field, value, reason in [
        ("heartbeat_interval", 5001, "heartbeat interval (5001) is invalid"),
        ("msg_timeout", 10001, "msg timeout (10001) is invalid"),
        ("output_buffer_size", 1001, "output buffer size (1001) is invalid"),
    ]:
        with RawClient(nsqd.tcp_address) as client:
            client.send_cmd(b"IDENTIFY", body=json.dumps({field: value}).encode())
            client.expect_error(f"E_BAD_BODY IDENTIFY {reason}")
    with RawClient(nsqd.tcp_address) as client:
        client.identify_ok(heartbeat_interval=5000, msg_timeout=10000, output_buffer_size=1000)


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"not json",
        b'{"heartbeat_interval":"1000"}',
        b'{"sample_rate":2147483648}',
        b"[]",
        b"{} x",
    ],
)
def test_identify_bad_json(connect: Connect, body: bytes) -> None:
    client = connect()
    client.send_cmd(b"IDENTIFY", body=body)
    client.expect_error("E_BAD_BODY IDENTIFY failed to decode JSON body")


def test_identify_json_null_is_accepted(connect: Connect) -> None:
    """Go's json.Unmarshal of ``null`` into a struct is a no-op, not an error."""
    client = connect()
    client.send_cmd(b"IDENTIFY", body=b"null")
    client.expect_response(b"OK")


def test_identify_unknown_fields_are_ignored(connect: Connect) -> None:
    client = connect()
    client.identify_ok(short_id="a", long_id="a.b", some_future_field=[1, 2])
    client.assert_open()


@pytest.mark.parametrize("size", [0, -1, -(2**31)])
def test_identify_invalid_body_size(connect: Connect, size: int) -> None:
    client = connect()
    client.send(b"IDENTIFY\n" + int32(size))
    client.expect_error(f"E_BAD_BODY IDENTIFY invalid body size {size}")


def test_identify_body_too_big_answered_before_the_body(connect: Connect) -> None:
    client = connect()
    client.send(b"IDENTIFY\n" + int32(MAX_BODY + 1))  # and no body
    client.expect_error(f"E_BAD_BODY IDENTIFY body too big {MAX_BODY + 1} > {MAX_BODY}")


def test_identify_body_too_big_follows_max_body_size(
    nsqd_factory: Callable[..., ServerProcess],
) -> None:
    nsqd = nsqd_factory(max_body_size=100)
    with RawClient(nsqd.tcp_address) as client:
        client.send(b"IDENTIFY\n" + int32(101))
        client.expect_error("E_BAD_BODY IDENTIFY body too big 101 > 100")


def test_identify_after_sub(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.send_cmd(b"IDENTIFY", body=b"{}")
    client.expect_error("E_INVALID cannot IDENTIFY in current state")


def test_identify_after_cls(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.cls()
    client.send_cmd(b"IDENTIFY", body=b"{}")
    client.expect_error("E_INVALID cannot IDENTIFY in current state")


def test_identify_refused_in_wrong_state_before_the_body(connect: Connect, topic: str) -> None:
    """The state is checked before the size is read: no body is needed for the answer."""
    client = subscribed(connect, topic)
    client.send(b"IDENTIFY\n")
    client.expect_error("E_INVALID cannot IDENTIFY in current state")


def test_identify_deflate_and_snappy(connect: Connect) -> None:
    client = connect()
    client.send_cmd(
        b"IDENTIFY",
        body=json.dumps({"feature_negotiation": True, "deflate": True, "snappy": True}).encode(),
    )
    client.expect_error("E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")


# -- AUTH -----------------------------------------------------------------------------------------


def test_auth_disabled(connect: Connect) -> None:
    client = connect()
    client.send_cmd(b"AUTH", body=b"secret")
    client.expect_error("E_AUTH_DISABLED AUTH disabled")


def test_auth_with_params(connect: Connect) -> None:
    client = connect()
    client.send(b"AUTH secret\n")
    client.expect_error("E_INVALID AUTH invalid number of parameters")


def test_auth_after_sub(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.send_cmd(b"AUTH", body=b"secret")
    client.expect_error("E_INVALID cannot AUTH in current state")


@pytest.mark.parametrize("size", [0, -7])
def test_auth_invalid_body_size(connect: Connect, size: int) -> None:
    client = connect()
    client.send(b"AUTH\n" + int32(size))
    client.expect_error(f"E_BAD_BODY AUTH invalid body size {size}")


def test_auth_body_too_big(connect: Connect) -> None:
    client = connect()
    client.send(b"AUTH\n" + int32(MAX_BODY + 1))
    client.expect_error(f"E_BAD_BODY AUTH body too big {MAX_BODY + 1} > {MAX_BODY}")


# -- SUB ------------------------------------------------------------------------------------------


def test_sub_twice(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.send(f"SUB {topic} other\n".encode())
    client.expect_error("E_INVALID cannot SUB in current state")


def test_sub_after_cls(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.cls()
    client.send(f"SUB {topic} ch\n".encode())
    client.expect_error("E_INVALID cannot SUB in current state")


def test_sub_with_heartbeats_disabled(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(heartbeat_interval=-1)
    client.send(f"SUB {topic} ch\n".encode())
    client.expect_error("E_INVALID cannot SUB with heartbeats disabled")


def test_sub_heartbeats_checked_before_params(connect: Connect) -> None:
    client = connect()
    client.identify_ok(heartbeat_interval=-1)
    client.send(b"SUB\n")
    client.expect_error("E_INVALID cannot SUB with heartbeats disabled")


@pytest.mark.parametrize("line", [b"SUB\n", b"SUB onlytopic\n"])
def test_sub_insufficient_params(connect: Connect, line: bytes) -> None:
    client = connect()
    client.send(line)
    client.expect_error("E_INVALID SUB insufficient number of parameters")


# Invalid names and how Go's %q renders them.
BAD_NAMES: list[tuple[bytes, str]] = [
    (b"bad!name", '"bad!name"'),
    (b"a" * 65, '"' + "a" * 65 + '"'),
    (b"", '""'),
    (b"#ephemeral", '"#ephemeral"'),
    (b"x#ephemeral#ephemeral", '"x#ephemeral#ephemeral"'),
    (b"a" * 55 + b"#ephemeral", '"' + "a" * 55 + '#ephemeral"'),
    (b"tab\there", '"tab\\there"'),
    (b'qu"ote', '"qu\\"ote"'),
    (b"back\\slash", '"back\\\\slash"'),
    (b"nul\x00", '"nul\\x00"'),
    (b"del\x7f", '"del\\x7f"'),
    (b"bell\x07", '"bell\\a"'),
    (b"caf\xc3\xa9", '"café"'),
    (b"smile\xf0\x9f\x98\x80", '"smile\U0001f600"'),
    (b"nbsp\xc2\xa0", '"nbsp\\u00a0"'),
    (b"zwsp\xe2\x80\x8b", '"zwsp\\u200b"'),
    (b"bad\xff", '"bad\\xff"'),
    (b"cut\xe2\x82", '"cut\\xe2\\x82"'),
]


@pytest.mark.parametrize(("name", "quoted"), BAD_NAMES)
def test_sub_bad_topic(connect: Connect, name: bytes, quoted: str) -> None:
    client = connect()
    client.send(b"SUB " + name + b" ch\n")
    client.expect_error(f"E_BAD_TOPIC SUB topic name {quoted} is not valid")


@pytest.mark.parametrize(("name", "quoted"), BAD_NAMES)
def test_sub_bad_channel(connect: Connect, topic: str, name: bytes, quoted: str) -> None:
    client = connect()
    client.send(b"SUB " + topic.encode() + b" " + name + b"\n")
    client.expect_error(f"E_BAD_CHANNEL SUB channel name {quoted} is not valid")


@pytest.mark.parametrize(
    ("topic_name", "channel_name"),
    [
        ("a" * 64, "b" * 64),
        ("t.-_09AZ", "c.-_09AZ"),
        ("a" * 54 + "#ephemeral", "b" * 54 + "#ephemeral"),
    ],
)
def test_sub_longest_and_odd_valid_names(
    connect: Connect, topic_name: str, channel_name: str
) -> None:
    client = connect()
    client.sub(topic_name, channel_name)
    client.assert_open()


# -- RDY ------------------------------------------------------------------------------------------


def test_rdy_before_sub(connect: Connect) -> None:
    client = connect()
    client.send(b"RDY 1\n")
    client.expect_error("E_INVALID cannot RDY in current state")


@pytest.mark.parametrize("count", [b"abc", b"-1", b"+1", b"1.5", b"0x10"])
def test_rdy_unparsable(connect: Connect, topic: str, count: bytes) -> None:
    client = subscribed(connect, topic)
    client.send(b"RDY " + count + b"\n")
    client.expect_error(f"E_INVALID RDY could not parse count {count.decode()}")


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (b"2501", "2501"),
        (b"99999999999", "99999999999"),
        # ByteToBase10 wraps like a uint64, then Go converts to int64
        (b"18446744073709551615", "-1"),
        (b"9223372036854775808", "-9223372036854775808"),
    ],
)
def test_rdy_out_of_range(connect: Connect, topic: str, count: bytes, shown: str) -> None:
    client = subscribed(connect, topic)
    client.send(b"RDY " + count + b"\n")
    client.expect_error(f"E_INVALID RDY count {shown} out of range 0-{MAX_RDY}")


def test_rdy_range_follows_max_rdy_count(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(max_rdy_count=10)
    with RawClient(nsqd.tcp_address) as client:
        client.sub(topic, "ch")
        client.rdy(10)
        client.send(b"RDY 11\n")
        client.expect_error("E_INVALID RDY count 11 out of range 0-10")


def test_rdy_after_cls_is_silently_ignored(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.cls()
    client.send(b"RDY 5\n")
    client.pub(topic, b"not for a closing client")  # the connection is still fine
    client.expect_no_frame(0.5)  # and RDY 5 did not make it ready


# -- FIN / REQ / TOUCH ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "cmd"),
    [
        (b"FIN " + FAKE_ID + b"\n", "FIN"),
        (b"REQ " + FAKE_ID + b" 0\n", "REQ"),
        (b"TOUCH " + FAKE_ID + b"\n", "TOUCH"),
    ],
)
def test_ack_before_sub(connect: Connect, line: bytes, cmd: str) -> None:
    client = connect()
    client.send(line)
    client.expect_error(f"E_INVALID cannot {cmd} in current state")


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b"FIN\n", "E_INVALID FIN insufficient number of params"),
        (b"REQ\n", "E_INVALID REQ insufficient number of params"),
        (b"REQ " + FAKE_ID + b"\n", "E_INVALID REQ insufficient number of params"),
        (b"REQ abc\n", "E_INVALID REQ insufficient number of params"),
        (b"TOUCH\n", "E_INVALID TOUCH insufficient number of params"),
    ],
)
def test_ack_insufficient_params(connect: Connect, topic: str, line: bytes, text: str) -> None:
    client = subscribed(connect, topic)
    client.send(line)
    client.expect_error(text)


@pytest.mark.parametrize(
    "line",
    [
        b"FIN abc\n",
        b"FIN 0123456789abcdef0\n",
        b"FIN \n",
        b"REQ 0123456789abcde 0\n",
        b"TOUCH 0123456789abcdef00\n",
    ],
)
def test_ack_invalid_message_id_is_fatal(connect: Connect, topic: str, line: bytes) -> None:
    client = subscribed(connect, topic)
    client.send(line)
    client.expect_error("E_INVALID invalid message ID")


def test_req_unparsable_timeout(connect: Connect, topic: str) -> None:
    client, msg_id = consumer_with_message(connect, topic)
    client.send(b"REQ " + msg_id + b" -1\n")
    client.expect_error("E_INVALID REQ could not parse timeout -1")


def test_req_timeout_parsed_before_the_id_is_looked_up(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.send(b"REQ " + FAKE_ID + b" soon\n")
    client.expect_error("E_INVALID REQ could not parse timeout soon")


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b"FIN " + FAKE_ID + b"\n", f"E_FIN_FAILED FIN {FAKE_ID.decode()} failed ID not in flight"),
        (
            b"REQ " + FAKE_ID + b" 0\n",
            f"E_REQ_FAILED REQ {FAKE_ID.decode()} failed ID not in flight",
        ),
        (
            b"TOUCH " + FAKE_ID + b"\n",
            f"E_TOUCH_FAILED TOUCH {FAKE_ID.decode()} failed ID not in flight",
        ),
        # IDs are only checked for length, not for being hex (spec §11)
        (b"FIN zzzzzzzzzzzzzzzz\n", "E_FIN_FAILED FIN zzzzzzzzzzzzzzzz failed ID not in flight"),
    ],
)
def test_ack_not_in_flight_is_not_fatal(
    connect: Connect, topic: str, line: bytes, text: str
) -> None:
    client = subscribed(connect, topic)
    client.send(line)
    client.expect_error(text, fatal=False)


def test_fin_twice_second_is_not_in_flight(connect: Connect, topic: str) -> None:
    client, msg_id = consumer_with_message(connect, topic)
    client.fin(msg_id)
    client.fin(msg_id)
    client.expect_error(f"E_FIN_FAILED FIN {msg_id.decode()} failed ID not in flight", fatal=False)


@pytest.mark.parametrize(
    ("cmd", "code"),
    [(b"FIN", "E_FIN_FAILED"), (b"REQ", "E_REQ_FAILED"), (b"TOUCH", "E_TOUCH_FAILED")],
)
def test_ack_of_another_consumers_message(
    connect: Connect, topic: str, cmd: bytes, code: str
) -> None:
    owner, msg_id = consumer_with_message(connect, topic)
    other = subscribed(connect, topic)  # same channel, RDY 0
    line = cmd + b" " + msg_id + (b" 0\n" if cmd == b"REQ" else b"\n")
    other.send(line)
    other.expect_error(
        f"{code} {cmd.decode()} {msg_id.decode()} failed client does not own message", fatal=False
    )
    owner.fin(msg_id)  # the owner still can
    owner.assert_open()


def test_cls_then_fin_still_works(connect: Connect, topic: str) -> None:
    client, msg_id = consumer_with_message(connect, topic)
    client.cls()
    client.fin(msg_id)
    client.fin(msg_id)  # a second FIN proves the first one found the message
    client.expect_error(f"E_FIN_FAILED FIN {msg_id.decode()} failed ID not in flight", fatal=False)


def test_cls_then_a_block_of_fins(connect: Connect, topic: str) -> None:
    """A consumer that drains before closing sends its FINs at once after CLS (the Spark
    connector does): one write of FIN lines, one of them unknown, each answered as alone."""
    client = subscribed(connect, topic)
    client.rdy(5)
    connect().mpub(topic, [b"m%d" % i for i in range(5)])
    ids = [m.id for m in client.read_messages(5)]
    client.cls()
    client.send(b"".join(b"FIN " + i + b"\n" for i in [*ids[:3], FAKE_ID, *ids[3:]]))
    client.expect_error(f"E_FIN_FAILED FIN {FAKE_ID.decode()} failed ID not in flight", fatal=False)
    client.fin(ids[0])  # all five were finished: a second FIN fails
    client.expect_error(f"E_FIN_FAILED FIN {ids[0].decode()} failed ID not in flight", fatal=False)
    client.assert_open()


# -- CLS ------------------------------------------------------------------------------------------


def test_cls_before_sub(connect: Connect) -> None:
    client = connect()
    client.send(b"CLS\n")
    client.expect_error("E_INVALID cannot CLS in current state")


def test_cls_twice(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.cls()
    client.send(b"CLS\n")
    client.expect_error("E_INVALID cannot CLS in current state")


def test_cls_does_not_close_the_connection(connect: Connect, topic: str) -> None:
    client = subscribed(connect, topic)
    client.cls()
    client.assert_open()


# -- PUB ------------------------------------------------------------------------------------------


def test_pub_insufficient_params(connect: Connect) -> None:
    client = connect()
    client.send(b"PUB\n")
    client.expect_error("E_INVALID PUB insufficient number of parameters")


@pytest.mark.parametrize(("name", "quoted"), BAD_NAMES[:8])
def test_pub_bad_topic(connect: Connect, name: bytes, quoted: str) -> None:
    client = connect()
    client.send(b"PUB " + name + b"\n")  # no body: the name is checked first
    client.expect_error(f"E_BAD_TOPIC PUB topic name {quoted} is not valid")


@pytest.mark.parametrize("size", [0, -1, -(2**31)])
def test_pub_invalid_body_size(connect: Connect, topic: str, size: int) -> None:
    client = connect()
    client.send(f"PUB {topic}\n".encode() + int32(size))
    client.expect_error(f"E_BAD_MESSAGE PUB invalid message body size {size}")


def test_pub_too_big_answered_before_the_body(connect: Connect, topic: str) -> None:
    client = connect()
    client.send(f"PUB {topic}\n".encode() + int32(MAX_MSG + 1))
    client.expect_error(f"E_BAD_MESSAGE PUB message too big {MAX_MSG + 1} > {MAX_MSG}")


def test_pub_size_limit_follows_max_msg_size(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(max_msg_size=10)
    with RawClient(nsqd.tcp_address) as client:
        client.pub(topic, b"x" * 10)
        client.send(f"PUB {topic}\n".encode() + int32(11) + b"x" * 11)
        client.expect_error("E_BAD_MESSAGE PUB message too big 11 > 10")


# -- MPUB -----------------------------------------------------------------------------------------


def test_mpub_insufficient_params(connect: Connect) -> None:
    client = connect()
    client.send(b"MPUB\n")
    client.expect_error("E_INVALID MPUB insufficient number of parameters")


@pytest.mark.parametrize(("name", "quoted"), BAD_NAMES[:8])
def test_mpub_bad_topic_doubled_code(connect: Connect, name: bytes, quoted: str) -> None:
    client = connect()
    client.send(b"MPUB " + name + b"\n")
    client.expect_error(f"E_BAD_TOPIC E_BAD_TOPIC MPUB topic name {quoted} is not valid")


@pytest.mark.parametrize("size", [0, -1])
def test_mpub_invalid_body_size(connect: Connect, topic: str, size: int) -> None:
    client = connect()
    client.send(f"MPUB {topic}\n".encode() + int32(size))
    client.expect_error(f"E_BAD_BODY MPUB invalid body size {size}")


def test_mpub_body_too_big_answered_before_the_body(connect: Connect, topic: str) -> None:
    client = connect()
    client.send(f"MPUB {topic}\n".encode() + int32(MAX_BODY + 1))
    client.expect_error(f"E_BAD_BODY MPUB body too big {MAX_BODY + 1} > {MAX_BODY}")


@pytest.mark.parametrize("count", [0, -1, MAX_MPUB_COUNT + 1])
def test_mpub_invalid_count(connect: Connect, topic: str, count: int) -> None:
    client = connect()
    client.send(f"MPUB {topic}\n".encode() + int32(100) + int32(count))
    client.expect_error(f"E_BAD_BODY MPUB invalid message count {count}")


def test_mpub_count_limit_follows_max_body_size(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(max_body_size=104)  # (104 - 4) / 5 = 20 messages at most
    with RawClient(nsqd.tcp_address) as client:
        client.mpub(topic, [b"x"] * 20)
        client.send(f"MPUB {topic}\n".encode() + int32(50) + int32(21))
        client.expect_error("E_BAD_BODY MPUB invalid message count 21")


@pytest.mark.parametrize(("index", "size"), [(1, 0), (0, -1), (2, -100)])
def test_mpub_invalid_message_size(connect: Connect, topic: str, index: int, size: int) -> None:
    client = connect()
    items = b"".join(int32(1) + b"x" for _ in range(index)) + int32(size)
    body = int32(3) + items
    client.send(f"MPUB {topic}\n".encode() + int32(len(body)) + body)
    client.expect_error(f"E_BAD_MESSAGE MPUB invalid message({index}) body size {size}")


def test_mpub_message_too_big(nsqd_factory: Callable[..., ServerProcess], topic: str) -> None:
    nsqd = nsqd_factory(max_msg_size=10)
    with RawClient(nsqd.tcp_address) as client:
        body = mpub_body([b"ok", b"x" * 11])
        client.send(f"MPUB {topic}\n".encode() + int32(len(body)) + body)
        client.expect_error("E_BAD_MESSAGE MPUB message too big 11 > 10")


def test_mpub_message_too_big_answered_before_its_body(connect: Connect, topic: str) -> None:
    """A streaming MPUB whose 2nd message is too big: refused once its size is read (§11)."""
    client = connect()
    big = MAX_MSG + 1
    declared = 4 + (4 + 2) + (4 + big)
    client.send(
        f"MPUB {topic}\n".encode() + int32(declared) + int32(2) + int32(2) + b"ok" + int32(big)
    )
    client.expect_error(f"E_BAD_MESSAGE MPUB message too big {big} > {MAX_MSG}")


def test_mpub_is_atomic_when_a_message_is_invalid(connect: Connect, topic: str) -> None:
    client = connect()
    body = int32(2) + int32(5) + b"first" + int32(0)
    client.send(f"MPUB {topic}\n".encode() + int32(len(body)) + body)
    client.expect_error("E_BAD_MESSAGE MPUB invalid message(1) body size 0")
    consumer = subscribed(connect, topic)
    consumer.rdy(10)
    connect().pub(topic, b"second")
    assert consumer.read_message().body == b"second"  # "first" was never queued
    consumer.expect_no_frame(0.3)


# -- DPUB -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [b"DPUB\n", b"DPUB topic\n"])
def test_dpub_insufficient_params(connect: Connect, line: bytes) -> None:
    client = connect()
    client.send(line)
    client.expect_error("E_INVALID DPUB insufficient number of parameters")


@pytest.mark.parametrize(("name", "quoted"), BAD_NAMES[:8])
def test_dpub_bad_topic(connect: Connect, name: bytes, quoted: str) -> None:
    client = connect()
    client.send(b"DPUB " + name + b" 100\n")
    client.expect_error(f"E_BAD_TOPIC DPUB topic name {quoted} is not valid")


@pytest.mark.parametrize("timeout", [b"abc", b"-1", b"1s", b"1.5"])
def test_dpub_unparsable_timeout(connect: Connect, topic: str, timeout: bytes) -> None:
    client = connect()
    client.send(f"DPUB {topic} ".encode() + timeout + b"\n")
    client.expect_error(f"E_INVALID DPUB could not parse timeout {timeout.decode()}")


def test_dpub_timeout_out_of_range_default(connect: Connect, topic: str) -> None:
    client = connect()
    client.send(f"DPUB {topic} 3600001\n".encode())  # no body: refused first
    client.expect_error("E_INVALID DPUB timeout 3600001 out of range 0-3600000")


def test_dpub_timeout_out_of_range_follows_max_req_timeout(
    nsqd_factory: Callable[..., ServerProcess], topic: str
) -> None:
    nsqd = nsqd_factory(max_req_timeout="2s")
    with RawClient(nsqd.tcp_address) as client:
        client.dpub(topic, 2000, b"at the limit")  # inclusive
        client.dpub(topic, 0, b"no delay")
        client.send(f"DPUB {topic} 2001\n".encode())
        client.expect_error("E_INVALID DPUB timeout 2001 out of range 0-2000")


@pytest.mark.parametrize("size", [0, -3])
def test_dpub_invalid_body_size(connect: Connect, topic: str, size: int) -> None:
    client = connect()
    client.send(f"DPUB {topic} 10\n".encode() + int32(size))
    client.expect_error(f"E_BAD_MESSAGE DPUB invalid message body size {size}")


def test_dpub_too_big(connect: Connect, topic: str) -> None:
    client = connect()
    client.send(f"DPUB {topic} 10\n".encode() + int32(MAX_MSG + 1))
    client.expect_error(f"E_BAD_MESSAGE DPUB message too big {MAX_MSG + 1} > {MAX_MSG}")


# -- truncated commands: the "failed to read" errors ----------------------------------------------
#
# Go reads command bodies with io.ReadFull; a client that half-closes its side in the
# middle of a body gets the "failed to read ..." error frame before nsqd closes.


TRUNCATED: list[tuple[bytes, str]] = [
    (b"IDENTIFY\n\x00\x00", "E_BAD_BODY IDENTIFY failed to read body size"),
    (b"IDENTIFY\n" + int32(10) + b"{}", "E_BAD_BODY IDENTIFY failed to read body"),
    (b"AUTH\n\x00", "E_BAD_BODY AUTH failed to read body size"),
    (b"AUTH\n" + int32(10) + b"abc", "E_BAD_BODY AUTH failed to read body"),
    (b"PUB t\n\x00\x00\x00", "E_BAD_MESSAGE PUB failed to read message body size"),
    (b"PUB t\n" + int32(5) + b"ab", "E_BAD_MESSAGE PUB failed to read message body"),
    (b"DPUB t 10\n\x00", "E_BAD_MESSAGE DPUB failed to read message body size"),
    (b"DPUB t 10\n" + int32(5) + b"ab", "E_BAD_MESSAGE DPUB failed to read message body"),
    (b"MPUB t\n\x00\x00", "E_BAD_BODY MPUB failed to read body size"),
    (b"MPUB t\n" + int32(20) + b"\x00", "E_BAD_BODY MPUB failed to read message count"),
    (
        b"MPUB t\n" + int32(20) + int32(2),
        "E_BAD_MESSAGE MPUB failed to read message(0) body size",
    ),
    (
        b"MPUB t\n" + int32(20) + int32(2) + int32(1) + b"x" + b"\x00",
        "E_BAD_MESSAGE MPUB failed to read message(1) body size",
    ),
    (
        b"MPUB t\n" + int32(20) + int32(2) + int32(1) + b"x" + int32(3) + b"y",
        "E_BAD_MESSAGE MPUB failed to read message body",
    ),
]


@pytest.mark.parametrize(("data", "text"), TRUNCATED)
def test_truncated_body_then_eof(connect: Connect, data: bytes, text: str) -> None:
    client = connect()
    client.send(data)
    client.shutdown_write()
    client.expect_error(text)


def test_truncated_body_then_read_deadline(connect: Connect, topic: str) -> None:
    """A PUB body that never completes: after 2 heartbeat intervals the read fails."""
    client = connect(timeout=8.0)
    client.identify_ok(heartbeat_interval=1000)
    client.send(f"PUB {topic}\n".encode() + int32(10) + b"abc")
    client.expect_error("E_BAD_MESSAGE PUB failed to read message body", timeout=6.0)


# -- unknown commands and line limits -------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (b"FOO\n", "FOO"),
        (b"nop\n", "nop"),
        (b"PUBLISH t\n", "PUBLISH"),
        (b"\n", ""),
        (b"\r\n", ""),
        (b" NOP\n", ""),
    ],
)
def test_invalid_command(connect: Connect, line: bytes, name: str) -> None:
    client = connect()
    client.send(line)
    client.expect_error(f"E_INVALID invalid command {name}")


def test_empty_line_has_trailing_space(connect: Connect) -> None:
    client = connect()
    client.send(b"\n")
    frame = client.read_frame()
    assert frame.data == b"E_INVALID invalid command "
    client.assert_closed()


def test_crlf_and_extra_params_accepted(connect: Connect, topic: str) -> None:
    client = connect()
    client.send(b"NOP\r\n")
    client.send(b"NOP with extra params\n")
    client.send(f"PUB {topic}\r\n".encode() + int32(1) + b"x")
    client.expect_response(b"OK")


def test_command_line_longer_than_16k_closes(connect: Connect) -> None:
    client = connect()
    client.send(b"NOP " + b"x" * 20000 + b"\n")
    client.assert_closed()


def test_command_line_without_newline_over_16k_closes(connect: Connect) -> None:
    client = connect()
    client.send(b"NOP " + b"x" * 20000)
    client.assert_closed()


def test_command_line_of_16k_minus_one_plus_newline_is_fine(connect: Connect) -> None:
    """Go's 16 KiB bufio.Reader holds a line of 16383 bytes plus its newline."""
    client = connect()
    client.send(b"NOP " + b"x" * (16383 - 4) + b"\n")
    client.assert_open()


def test_command_line_of_16k_plus_newline_closes(connect: Connect) -> None:
    """16384 bytes before the newline fill Go's 16 KiB buffer: ReadSlice fails, nsqd closes."""
    client = connect()
    client.send(b"NOP " + b"x" * (16384 - 4) + b"\n")
    client.assert_closed()
