"""ConsumerConnection.feed: the columns cut out of receive buffers, whatever their shape.

A read task parses what nsqd sends in whole buffers: a run of equal-size first-attempt message
frames (the usual case) is viewed as fixed-size values; anything else (other sizes,
redeliveries, responses, heartbeats, frames cut by the buffer's end) goes through the general
scan. Both must give exactly the messages sent, in order, whatever the cut points.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from typing import Any

import pyarrow.compute as pc  # type: ignore[import-untyped]
import pytest

from nsqpy.spark._conn import (
    Columns,
    ConsumerConnection,
    NSQConnectionError,
    NSQErrorFrame,
    id_commands,
)
from nsqpy.spark._schema import to_segment
from nsqpy.wire.v2 import encode_error, encode_message_frame, encode_response

Message = tuple[bytes, int, int, bytes]


@pytest.fixture
def conn() -> Iterator[ConsumerConnection]:
    """A connection to a real listening socket that nobody answers (feed never reads)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        c = ConsumerConnection(f"127.0.0.1:{server.getsockname()[1]}", 5.0)
        try:
            yield c
        finally:
            c.close()


def _messages(n: int, sizes: list[int], attempts: list[int], seed: int) -> list[Message]:
    rng = random.Random(seed)
    return [
        (
            f"{i:016x}".encode(),
            1_764_000_000_000_000_000 + rng.randrange(10**12),
            rng.choice(attempts),
            rng.randbytes(rng.choice(sizes)),
        )
        for i in range(n)
    ]


def _feed_all(conn: ConsumerConnection, stream: bytes, cuts: list[int]) -> Columns:
    cols = Columns()
    prev = 0
    for cut in [*cuts, len(stream)]:
        conn.feed(stream[prev:cut], cols, lambda _: False)
        prev = cut
    return cols


def _rows(cols: Columns) -> list[dict[str, Any]]:
    return [row for row in to_segment(cols).to_pylist()] if len(cols) else []


def _expected(msgs: list[Message]) -> list[dict[str, Any]]:
    cols = Columns()
    for msg_id, timestamp, attempts, body in msgs:
        cols.append(msg_id, timestamp, attempts, body)
    return _rows(cols)


@pytest.mark.parametrize(
    ("sizes", "attempts"),
    [
        ([100], [1]),  # one run of equal frames: the fixed-size path
        ([100, 101, 5000], [1]),  # mixed sizes: runs broken up
        ([100], [1, 1, 1, 2]),  # redeliveries among first attempts
        ([1], [1]),
    ],
)
@pytest.mark.parametrize("seed", range(4))
def test_feed_keeps_every_message_in_order(
    conn: ConsumerConnection, sizes: list[int], attempts: list[int], seed: int
) -> None:
    msgs = _messages(500, sizes, attempts, seed)
    rng = random.Random(seed)
    pieces: list[bytes] = []
    for i, msg in enumerate(msgs):
        pieces.append(encode_message_frame(*msg))
        if i % 97 == 5:
            pieces.append(encode_response(b"_heartbeat_"))
    stream = b"".join(pieces)
    cuts = sorted(rng.sample(range(1, len(stream)), 12))
    cols = _feed_all(conn, stream, cuts)
    assert _rows(cols) == _expected(msgs)
    assert b"".join(conn.ids) == b"".join(m[0] for m in msgs)
    assert conn.kept == len(msgs)
    assert conn._out.count(b"NOP\n") == len(range(5, 500, 97))  # every heartbeat answered


def test_feed_of_one_whole_run(conn: ConsumerConnection) -> None:
    msgs = _messages(1000, [100], [1], 7)
    cols = _feed_all(conn, b"".join(encode_message_frame(*m) for m in msgs), [])
    assert _rows(cols) == _expected(msgs)
    assert len(conn.ids) == 1  # one blob of ids for the whole buffer


def test_late_messages_are_not_kept(conn: ConsumerConnection) -> None:
    msgs = _messages(50, [100], [1], 3)
    conn.accepting = False
    cols = _feed_all(conn, b"".join(encode_message_frame(*m) for m in msgs), [1000])
    assert len(cols) == 0 and conn.kept == 0
    assert b"".join(conn.late) == b"".join(m[0] for m in msgs)


def test_replies_before_a_run_are_handled_once_and_the_run_takes_the_fast_path(
    conn: ConsumerConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection's first buffer: the IDENTIFY and SUB replies (and whatever else nsqd sent
    before the first message), then the messages."""

    def general_path(*args: Any) -> None:
        raise AssertionError("a run after replies took the general path")

    monkeypatch.setattr(pc, "binary_slice", general_path)
    msgs = _messages(300, [100], [1], 11)
    replies = [
        encode_response(b'{"max_rdy_count":2500}'),
        encode_response(b"OK"),
        encode_response(b"_heartbeat_"),
        encode_error("E_FIN_FAILED FIN 0123456789abcdef failed not in flight"),
    ]
    stream = b"".join(replies) + b"".join(encode_message_frame(*m) for m in msgs)
    for cut in (len(stream), len(b"".join(replies)) + 1000):  # whole, or cut inside the run
        conn.ids.clear()
        conn.fin_failed.clear()
        conn._out.clear()
        cols = _feed_all(conn, stream, [cut] if cut < len(stream) else [])
        assert _rows(cols) == _expected(msgs)
        assert b"".join(conn.ids) == b"".join(m[0] for m in msgs)
        assert conn._out == [b"NOP\n"]  # the heartbeat answered once
        assert conn.fin_failed == [b"0123456789abcdef"]
        assert len(conn.ids) == (1 if cut == len(stream) else 2)  # one blob per buffer


def test_a_fatal_error_before_the_messages_raises(conn: ConsumerConnection) -> None:
    msgs = _messages(10, [100], [1], 12)
    stream = encode_error("E_BAD_TOPIC SUB topic name is not valid") + b"".join(
        encode_message_frame(*m) for m in msgs
    )
    with pytest.raises(NSQErrorFrame, match="E_BAD_TOPIC"):
        conn.feed(stream, Columns(), lambda _: False)


@pytest.mark.parametrize("count", [0, 1, 2500])
def test_id_commands_are_one_line_per_id(count: int) -> None:
    ids = [f"{i:016x}".encode() for i in range(count)]
    blob = b"".join(ids)
    assert id_commands(b"FIN", blob) == b"".join(b"FIN " + i + b"\n" for i in ids)
    assert id_commands(b"REQ", blob, b" 0\n") == b"".join(b"REQ " + i + b" 0\n" for i in ids)


@pytest.mark.parametrize("size", [-4, -1, 0, 3, 4 + 25])
def test_a_corrupt_frame_size_is_a_connection_error(conn: ConsumerConnection, size: int) -> None:
    """Never a crash (a division by zero, a negative count): a clear error about the frame."""
    frame = size.to_bytes(4, "big", signed=True) + (2).to_bytes(4, "big") + bytes(200)
    with pytest.raises(NSQConnectionError, match="frame"):
        conn.feed(frame * 3, Columns(), lambda _: False)
