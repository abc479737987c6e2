"""IDENTIFY feature negotiation (spec §2.4) and heartbeats / read deadlines (spec §2.1)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.conftest import Connect
from tests.support.procs import ServerProcess
from tests.support.rawclient import ConnectionClosed, RawClient

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def nsqd(shared_nsqd: ServerProcess) -> ServerProcess:
    """Tests here are independent (own topic names): one nsqd serves the whole module."""
    return shared_nsqd


NEGOTIATION_KEYS = [
    "max_rdy_count",
    "version",
    "max_msg_timeout",
    "msg_timeout",
    "tls_v1",
    "deflate",
    "deflate_level",
    "max_deflate_level",
    "snappy",
    "sample_rate",
    "auth_required",
    "output_buffer_size",
    "output_buffer_timeout",
]
# master builds may append the server's topology (spec §2.4, "(master)")
OPTIONAL_TRAILING_KEYS = {"topology_region", "topology_zone"}

DEFAULT_NEGOTIATION = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


def negotiate(client: RawClient, **fields: Any) -> dict[str, object]:
    """IDENTIFY with feature negotiation; checks key order and compact JSON, returns the values."""
    frame = client.identify(feature_negotiation=True, **fields)
    assert frame.type == 0, frame
    pairs: list[tuple[str, object]] = json.loads(frame.data, object_pairs_hook=list)
    keys = [k for k, _ in pairs]
    assert keys[: len(NEGOTIATION_KEYS)] == NEGOTIATION_KEYS, keys
    assert set(keys[len(NEGOTIATION_KEYS) :]) <= OPTIONAL_TRAILING_KEYS, keys
    compact = json.dumps(dict(pairs), separators=(",", ":")).encode()
    assert frame.data == compact, "Go's json.Marshal output is compact"
    return {k: v for k, v in pairs if k in NEGOTIATION_KEYS}


# -- feature negotiation ---------------------------------------------------------------------------


def test_negotiation_defaults_keys_and_order(connect: Connect) -> None:
    client = connect()
    assert negotiate(client) == DEFAULT_NEGOTIATION
    client.assert_open()


def test_negotiation_prefix_is_byte_exact(connect: Connect) -> None:
    client = connect()
    frame = client.identify(feature_negotiation=True)
    expected = json.dumps(DEFAULT_NEGOTIATION, separators=(",", ":")).encode()
    # Go master ends with nsqd's topology (empty strings when unset)
    assert frame.data == expected[:-1] + b',"topology_region":"","topology_zone":""}'


def test_negotiation_without_feature_negotiation_is_ok(connect: Connect) -> None:
    client = connect()
    frame = client.identify(msg_timeout=5000)
    assert frame.data == b"OK"


def test_negotiation_reflects_client_settings(connect: Connect) -> None:
    client = connect()
    got = negotiate(
        client,
        msg_timeout=5000,
        sample_rate=10,
        output_buffer_size=-1,
        heartbeat_interval=2000,
        client_id="cid",
        hostname="host.example",
        user_agent="rawclient/1.0",
    )
    assert got == {
        **DEFAULT_NEGOTIATION,
        "msg_timeout": 5000,
        "sample_rate": 10,
        "output_buffer_size": 1,  # -1: unbuffered, which also zeroes the timeout
        "output_buffer_timeout": 0,
    }


def test_negotiation_output_buffer_values(connect: Connect) -> None:
    got = negotiate(connect(), output_buffer_size=64, output_buffer_timeout=-1)
    assert (got["output_buffer_size"], got["output_buffer_timeout"]) == (64, 0)
    got = negotiate(connect(), output_buffer_size=65536, output_buffer_timeout=25)
    assert (got["output_buffer_size"], got["output_buffer_timeout"]) == (65536, 25)


def test_negotiation_reflects_server_flags(nsqd_factory: Callable[..., ServerProcess]) -> None:
    nsqd = nsqd_factory(
        max_rdy_count=100, max_msg_timeout="30s", msg_timeout="7s", max_deflate_level=3
    )
    with RawClient(nsqd.tcp_address) as client:
        got = negotiate(client)
    assert got == {
        **DEFAULT_NEGOTIATION,
        "max_rdy_count": 100,
        "max_msg_timeout": 30000,
        "msg_timeout": 7000,
        "max_deflate_level": 3,
        "deflate_level": 3,  # 6 capped by --max-deflate-level even when not deflating
    }


def test_negotiation_deflate_level_ignored_without_deflate(connect: Connect) -> None:
    got = negotiate(connect(), deflate_level=1)
    assert got["deflate_level"] == 6 and got["deflate"] is False


def test_tls_requested_without_server_cert_stays_plain(connect: Connect, topic: str) -> None:
    client = connect()
    got = negotiate(client, tls_v1=True)
    assert got["tls_v1"] is False
    client.pub(topic, b"in the clear")


def test_second_identify_before_sub_is_accepted(connect: Connect, topic: str) -> None:
    client = connect()
    assert negotiate(client, msg_timeout=3000)["msg_timeout"] == 3000
    assert negotiate(client, msg_timeout=2000)["msg_timeout"] == 2000
    client.sub(topic, "ch")
    client.rdy(1)
    connect().pub(topic, b"m")
    first = client.read_message()
    # the second IDENTIFY's msg_timeout (2 s) is the one in force
    again = client.read_message(timeout=4.0)
    assert again.id == first.id and again.attempts == 2
    assert 1.8 <= again.received_at - first.received_at < 3.0


# -- heartbeats ----------------------------------------------------------------------------------------


def test_producer_receives_heartbeats(connect: Connect) -> None:
    client = connect()
    client.identify_ok(heartbeat_interval=1000)
    start = time.monotonic()
    frame = client.read_frame(timeout=3.0)
    assert frame.is_heartbeat, frame
    assert 0.7 <= time.monotonic() - start < 2.2


def test_consumer_receives_heartbeats(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(heartbeat_interval=1000)
    client.sub(topic, "ch")
    client.rdy(1)
    assert client.read_frame(timeout=3.0).is_heartbeat


def test_idle_client_disconnected_after_two_intervals(connect: Connect) -> None:
    client = connect(timeout=10.0)
    start = time.monotonic()  # the IDENTIFY is the last thing nsqd reads
    client.identify_ok(heartbeat_interval=1000)
    heartbeats = 0
    with pytest.raises(ConnectionClosed):
        while True:
            frame = client.read_frame(timeout=6.0)
            assert frame.is_heartbeat, frame
            heartbeats += 1  # never answered
    elapsed = time.monotonic() - start
    assert 1.95 <= elapsed <= 3.5, elapsed
    assert heartbeats >= 1


def test_idle_consumer_disconnected_after_two_intervals(connect: Connect, topic: str) -> None:
    client = connect(timeout=10.0)
    client.identify_ok(heartbeat_interval=1000)
    start = time.monotonic()  # the SUB is the last thing nsqd reads
    client.sub(topic, "ch")
    with pytest.raises(ConnectionClosed):
        while True:
            assert client.read_frame(timeout=6.0).is_heartbeat
    assert 1.95 <= time.monotonic() - start <= 3.5


def test_client_answering_heartbeats_stays_connected(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(heartbeat_interval=1000)
    client.sub(topic, "ch")
    client.expect_no_frame(4.0)  # answers every heartbeat with NOP
    assert client.heartbeats >= 3
    client.rdy(1)
    connect().pub(topic, b"still here")
    assert client.read_message().body == b"still here"


def test_heartbeats_tick_regardless_of_traffic(connect: Connect, topic: str) -> None:
    """A busy producer still gets heartbeats on the fixed ticker."""
    client = connect()
    client.identify_ok(heartbeat_interval=1000)
    deadline = time.monotonic() + 2.6
    heartbeats = 0
    while time.monotonic() < deadline:
        client.send(f"PUB {topic}\n".encode() + b"\x00\x00\x00\x01x")
        while (frame := client.read_frame()).is_heartbeat:
            heartbeats += 1
        assert frame.data == b"OK", frame
        extra = client.poll_frame(0.2)  # paces the loop
        if extra is not None:
            assert extra.is_heartbeat, extra
            heartbeats += 1
    assert heartbeats >= 2


def test_heartbeats_disabled_producer_gets_none(connect: Connect, topic: str) -> None:
    client = connect()
    client.identify_ok(heartbeat_interval=-1)
    client.expect_no_frame(1.5)
    assert client.heartbeats == 0
    client.pub(topic, b"no deadline either")
