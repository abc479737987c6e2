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

import pytest

from nsqpy.spark._conn import Columns, ConsumerConnection
from nsqpy.spark._schema import to_segment
from nsqpy.wire.v2 import encode_message_frame, encode_response

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
