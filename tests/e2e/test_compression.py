"""Snappy and deflate on nsqd's TCP connections (spec §1, §2.3, §2.4): negotiation, both
directions of the stream, Go's limits and errors, raw clients (with nsqpy's codecs and
with independent ones: cramjam's framing, plain zlib) and the real pynsq client."""

from __future__ import annotations

import importlib
import json
import socket
import sys
import time
import types
import urllib.request
import zlib
from collections.abc import Callable
from typing import Any

import cramjam
import nsq
import pytest

from nsqpy.wire.compression import SNAPPY_STREAM_IDENTIFIER, SnappyStreamDecoder
from nsqpy.wire.v2 import (
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    FrameParser,
    decode_message,
    encode_command,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from tests.support.procs import ServerProcess
from tests.support.pynsq_client import pynsq_round_trip
from tests.support.secure_client import SecureClient

pytestmark = pytest.mark.timeout(60)

NsqdFactory = Callable[..., ServerProcess]
BIG = bytes(range(256)) * 1024  # 256 KiB: several 64 KiB snappy chunks each way


def stats_clients(server: ServerProcess, topic: str) -> list[dict[str, Any]]:
    url = f"http://{server.http_address}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        stats = json.load(resp)
    return [c for t in stats["topics"] for ch in t["channels"] for c in ch["clients"]]


# -- negotiation -----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_round_trip(shared_nsqd: ServerProcess, topic: str, compression: str) -> None:
    producer = SecureClient(shared_nsqd.tcp_address)
    reply = producer.negotiate(**{compression: True})
    assert isinstance(reply, dict) and reply[compression] is True
    other = "deflate" if compression == "snappy" else "snappy"
    assert reply[other] is False and reply["tls_v1"] is False
    producer.pub(topic, b"small")
    producer.pub(topic, BIG)
    producer.mpub(topic, [b"x" * 70_000, b"y"])
    producer.dpub(topic, 0, b"deferred-0")

    consumer = SecureClient(shared_nsqd.tcp_address)
    consumer.negotiate(**{compression: True})
    consumer.sub(topic, "ch")
    consumer.rdy(10)
    messages = consumer.read_messages(5)
    assert [m.body for m in messages] == [b"small", BIG, b"x" * 70_000, b"y", b"deferred-0"]
    for m in messages:
        consumer.fin(m.id)
    consumer.expect_no_frame(0.2)  # FINs were decoded: nothing in flight is redelivered
    [entry] = stats_clients(shared_nsqd, topic)
    assert entry[compression] is True and entry[other] is False and entry["in_flight_count"] == 0
    producer.close()
    consumer.close()


def test_deflate_level_negotiation(nsqd_factory: NsqdFactory) -> None:
    server = nsqd_factory(max_deflate_level=5)
    cases = [
        ({}, 5),
        ({"deflate_level": 9}, 5),
        ({"deflate_level": 2}, 2),
        ({"deflate_level": -1}, 5),
    ]
    for fields, level in cases:
        client = SecureClient(server.tcp_address)
        reply = client.negotiate(deflate=True, **fields)
        assert isinstance(reply, dict)
        assert (reply["deflate"], reply["deflate_level"], reply["max_deflate_level"]) == (
            True,
            level,
            5,
        )
        client.close()
    client = SecureClient(server.tcp_address)
    reply = client.negotiate(deflate_level=9)  # not asked for deflate: 6 capped by the max
    assert isinstance(reply, dict) and (reply["deflate"], reply["deflate_level"]) == (False, 5)


def test_both_compressions_refused(shared_nsqd: ServerProcess) -> None:
    client = SecureClient(shared_nsqd.tcp_address)
    frame = client.negotiate(snappy=True, deflate=True)
    assert not isinstance(frame, dict)
    assert frame.data == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
    client.assert_closed()


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_disabled_on_the_server(nsqd_factory: NsqdFactory, topic: str, compression: str) -> None:
    server = nsqd_factory(**{compression: False})
    client = SecureClient(server.tcp_address)
    reply = client.negotiate(snappy=True, deflate=True)  # only one left: not both
    assert isinstance(reply, dict)
    assert reply[compression] is False
    client.pub(topic, b"works")
    client.close()


def test_without_feature_negotiation_nothing_is_upgraded(
    shared_nsqd: ServerProcess, topic: str
) -> None:
    client = SecureClient(shared_nsqd.tcp_address)
    client.identify_ok(snappy=True, deflate=False)  # plain OK: no JSON, no upgrade
    client.pub(topic, b"plain")
    client.close()


# -- independent codecs ----------------------------------------------------------------------


def recv_until(sock: socket.socket, done: Callable[[bytes], bool], timeout: float = 5.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while not done(data):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data


def cramjam_frames(stream: bytes) -> list[tuple[int, bytes]] | None:
    """Frames in the whole snappy stream received so far, decoded by cramjam, or None if
    the stream ends inside a chunk."""
    try:
        data = bytes(cramjam.snappy.decompress(stream))
    except cramjam.DecompressionError:
        return None
    parser = FrameParser()
    return parser.feed(data)


def test_snappy_with_cramjam_on_the_client(shared_nsqd: ServerProcess, topic: str) -> None:
    host, _, port = shared_nsqd.tcp_address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    body = json.dumps({"feature_negotiation": True, "snappy": True}).encode()
    sock.sendall(b"  V2" + encode_command(b"IDENTIFY", body=body))
    # The JSON reply is in the clear; the OK right after it is the snappy stream's start.
    raw = recv_until(sock, lambda d: len(d) >= 8 and len(d) >= 4 + int.from_bytes(d[:4], "big"))
    size = int.from_bytes(raw[:4], "big")
    assert json.loads(raw[8 : 4 + size])["snappy"] is True
    received = raw[4 + size :]

    def wait_frames(n: int) -> list[tuple[int, bytes]]:
        nonlocal received
        while True:
            frames = cramjam_frames(received) if received else None
            if frames is not None and len(frames) >= n:
                return frames
            received += recv_until(sock, lambda d: len(d) > 0)

    assert SNAPPY_STREAM_IDENTIFIER.startswith(received[:10])
    assert wait_frames(1) == [(FRAME_TYPE_RESPONSE, b"OK")]
    # pynsq-style: every write is a whole snappy stream (identifier included)
    for command in (
        encode_pub(topic, b"one"),
        encode_pub(topic, BIG),
        encode_mpub(topic, [b"a", b"b"]),
    ):
        sock.sendall(bytes(cramjam.snappy.compress(command)))
    sock.sendall(bytes(cramjam.snappy.compress(encode_sub(topic, "ch") + encode_rdy(10))))
    frames = wait_frames(1 + 3 + 1 + 4)
    assert frames[1:5] == [(FRAME_TYPE_RESPONSE, b"OK")] * 4
    bodies = []
    for frame_type, payload in frames[5:]:
        assert frame_type == FRAME_TYPE_MESSAGE
        msg_id, _, _, body = decode_message(payload)
        bodies.append(body)
        sock.sendall(bytes(cramjam.snappy.compress(encode_fin(msg_id))))
    assert bodies == [b"one", BIG, b"a", b"b"]
    sock.close()


def test_deflate_with_zlib_on_the_client(shared_nsqd: ServerProcess, topic: str) -> None:
    host, _, port = shared_nsqd.tcp_address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    body = json.dumps({"feature_negotiation": True, "deflate": True, "deflate_level": 1}).encode()
    sock.sendall(b"  V2" + encode_command(b"IDENTIFY", body=body))
    raw = recv_until(sock, lambda d: len(d) >= 8 and len(d) >= 4 + int.from_bytes(d[:4], "big"))
    size = int.from_bytes(raw[:4], "big")
    reply = json.loads(raw[8 : 4 + size])
    assert (reply["deflate"], reply["deflate_level"]) == (True, 1)
    inflate = zlib.decompressobj(-15)
    parser = FrameParser()
    frames = parser.feed(inflate.decompress(raw[4 + size :]))

    def wait_frames(n: int) -> None:
        while len(frames) < n:
            frames.extend(parser.feed(inflate.decompress(recv_until(sock, lambda d: len(d) > 0))))

    wait_frames(1)
    assert frames[0] == (FRAME_TYPE_RESPONSE, b"OK")
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    commands = encode_pub(topic, BIG) + encode_sub(topic, "ch") + encode_rdy(1)
    for i in range(0, len(commands), 1000):  # arbitrary pieces, flushed each time
        sock.sendall(deflate.compress(commands[i : i + 1000]) + deflate.flush(zlib.Z_SYNC_FLUSH))
    wait_frames(4)
    assert frames[1:3] == [(FRAME_TYPE_RESPONSE, b"OK")] * 2
    assert frames[3][0] == FRAME_TYPE_MESSAGE and decode_message(frames[3][1])[3] == BIG
    sock.close()


# -- broken streams ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compression", "garbage"),
    [
        ("snappy", b"PUB t\n"),  # uncompressed bytes: no stream identifier
        ("snappy", SNAPPY_STREAM_IDENTIFIER + b"\x01\x08\x00\x00\x00\x00\x00\x00NOP\n"),  # bad CRC
        ("snappy", SNAPPY_STREAM_IDENTIFIER + b"\x05\x01\x00\x00x"),  # reserved chunk type
        ("deflate", b"\xff\xff\xff\xff"),
    ],
)
def test_corrupt_stream_closes(nsqd_factory: NsqdFactory, compression: str, garbage: bytes) -> None:
    server = nsqd_factory()
    client = SecureClient(server.tcp_address)
    client.negotiate(**{compression: True})
    client.send_raw(garbage)
    client.assert_closed()
    server.wait_for_log(r"failed to read command - (snappy|flate): ")


def test_snappy_stream_from_decoder_matches_what_nsqd_writes(
    shared_nsqd: ServerProcess, topic: str
) -> None:
    """Heartbeats and several flushes in one stream: the identifier comes only once."""
    client = SecureClient(shared_nsqd.tcp_address)
    client.negotiate(snappy=True, heartbeat_interval=1000)
    raw: list[bytes] = []
    decode = client._decode
    assert decode is not None
    client._decode = lambda data: (raw.append(data), decode(data))[1]
    frame = client.read_frame(timeout=3)
    assert frame.is_heartbeat
    client.pub(topic, b"after heartbeat")
    stream = b"".join(raw)
    assert SNAPPY_STREAM_IDENTIFIER not in stream  # it was sent with the first OK
    client.close()


# -- pynsq --------------------------------------------------------------------------------


@pytest.fixture
def pynsq_snappy(monkeypatch: pytest.MonkeyPatch) -> None:
    """pynsq's snappy support needs python-snappy, which is not installed: give it a
    ``snappy`` module with python-snappy's stream API, on cramjam (compress: every call a
    whole framed stream, as python-snappy's StreamCompressor) and nsqpy's decoder."""
    shim = types.ModuleType("snappy")

    class StreamCompressor:
        def compress(self, data: bytes) -> bytes:
            return bytes(cramjam.snappy.compress(data))

    class StreamDecompressor:
        def __init__(self) -> None:
            self._decoder = SnappyStreamDecoder()

        def decompress(self, data: bytes) -> bytes:
            return self._decoder.decode(data)

    shim.StreamCompressor = StreamCompressor  # type: ignore[attr-defined]
    shim.StreamDecompressor = StreamDecompressor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snappy", shim)
    monkeypatch.delitem(sys.modules, "nsq.snappy_socket", raising=False)
    snappy_socket = importlib.import_module("nsq.snappy_socket")
    monkeypatch.setattr(nsq.conn, "SnappySocket", snappy_socket.SnappySocket)
    monkeypatch.setattr(nsq.conn, "SnappyEncoder", snappy_socket.SnappyEncoder)


def pynsq_snappy_or_deflate_round_trip(
    server: ServerProcess, topic: str, **conn_options: Any
) -> tuple[list[Any], list[bytes]]:
    bodies = [b"p-%d" % i * (i + 1) for i in range(15)] + [BIG]
    responses, received = pynsq_round_trip(
        server.tcp_address,
        topic,
        "pynsq",
        bodies,
        mpub_from=10,
        max_in_flight=5,
        timeout=30,
        **conn_options,
    )
    assert responses == [b"OK"] * 11
    assert received == bodies
    return responses, received


@pytest.mark.usefixtures("pynsq_snappy")
def test_pynsq_snappy(shared_nsqd: ServerProcess, topic: str) -> None:
    pynsq_snappy_or_deflate_round_trip(shared_nsqd, topic, snappy=True)


@pytest.mark.parametrize("level", [1, 6, 9])
def test_pynsq_deflate(shared_nsqd: ServerProcess, topic: str, level: int) -> None:
    pynsq_snappy_or_deflate_round_trip(shared_nsqd, topic, deflate=True, deflate_level=level)
