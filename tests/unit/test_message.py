"""Message tuples, their payload encoding and GUIDFactory (spec §2.1, §7.3)."""

from __future__ import annotations

import itertools
import re
import time
from collections import deque

import pytest

import nsqpy.nsqd.message as message_mod
from nsqpy.nsqd.message import (
    MAX_ATTEMPTS,
    MSG_ATTEMPTS,
    MSG_BODY,
    MSG_ID,
    MSG_TIMESTAMP,
    GUIDFactory,
    Message,
    Run,
    cut,
    drop_last,
    expand,
    from_payload,
    new_runs,
    requeued,
    split,
    take,
    to_payload,
    to_payloads,
)
from nsqpy.wire.v2 import decode_message, encode_message

TWEPOCH = 1288834974288
HEX16 = re.compile(rb"[0-9a-f]{16}")


def decode_id(msg_id: bytes) -> tuple[int, int, int]:
    """(ts in ns >> 20 units, node id, sequence) per spec §7.3."""
    value = int(msg_id, 16)
    return (value >> 22) + TWEPOCH, (value >> 12) & 0x3FF, value & 0xFFF


class FrozenTime:
    """Stands in for the `time` module inside nsqpy.nsqd.message."""

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def time_ns(self) -> int:
        return self.ns


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> FrozenTime:
    clock = FrozenTime(time.time_ns())
    monkeypatch.setattr(message_mod, "time", clock)
    return clock


# -- GUIDFactory ---------------------------------------------------------------------------------


def test_ids_are_16_lowercase_hex() -> None:
    factory = GUIDFactory(5)
    for msg_id in [*factory.new_ids(100), factory.new_id(message_mod.time.time_ns())]:
        assert isinstance(msg_id, bytes)
        assert len(msg_id) == 16
        assert HEX16.fullmatch(msg_id)


def test_ids_strictly_increasing_and_unique() -> None:
    factory = GUIDFactory(1)
    ids = [factory.new_id(message_mod.time.time_ns()) for _ in range(3000)]
    for n in (1, 7, 500, 4096, 5000):
        ids.extend(factory.new_ids(n))
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(a < b for a, b in itertools.pairwise(ids))
    values = [int(i, 16) for i in ids]
    assert all(a < b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("node_id", [0, 1, 42, 512, 1023])
def test_node_id_in_bits_12_to_21(node_id: int) -> None:
    factory = GUIDFactory(node_id)
    for msg_id in factory.new_ids(50):
        assert decode_id(msg_id)[1] == node_id


def test_timestamp_part_is_now() -> None:
    before = time.time_ns() >> 20
    ids = GUIDFactory(3).new_ids(10)
    after = time.time_ns() >> 20
    for msg_id in ids:
        ts, _, _ = decode_id(msg_id)
        assert before <= ts <= after + 1


def test_sequence_starts_at_zero_on_a_new_tick(frozen: FrozenTime) -> None:
    factory = GUIDFactory(9)
    first = factory.new_ids(3)
    assert [decode_id(i)[2] for i in first] == [0, 1, 2]
    frozen.ns += 1 << 20  # next tick
    ts, node, seq = decode_id(factory.new_id(message_mod.time.time_ns()))
    assert (ts, node, seq) == (frozen.ns >> 20, 9, 0)


def test_exact_encoding(frozen: FrozenTime) -> None:
    frozen.ns = (TWEPOCH + 1) << 20
    factory = GUIDFactory(2)
    assert factory.new_ids(2) == [
        b"%016x" % ((1 << 22) | (2 << 12)),
        b"%016x" % ((1 << 22) | (2 << 12) | 1),
    ]
    assert factory.new_id(message_mod.time.time_ns()) == b"0000000000402002"


def test_more_than_4096_in_one_tick_moves_the_tick_forward(frozen: FrozenTime) -> None:
    """Sequence exhaustion: Go sleeps 1 ms; this factory advances its own tick instead."""
    tick = frozen.ns >> 20
    factory = GUIDFactory(7)
    started = time.monotonic()
    ids = factory.new_ids(6000) + [factory.new_id(message_mod.time.time_ns()) for _ in range(6000)]
    assert time.monotonic() - started < 5  # nothing slept per exhausted tick
    assert len(set(ids)) == 12000
    assert all(a < b for a, b in itertools.pairwise(ids))
    decoded = [decode_id(i) for i in ids]
    assert all(node == 7 for _, node, _ in decoded)
    # 4096 IDs per tick: ticks tick, tick+1, tick+2 (the last one partly used)
    assert [d[0] for d in decoded] == [tick + k // 4096 for k in range(12000)]
    assert [d[2] for d in decoded] == [k % 4096 for k in range(12000)]


def test_unique_across_more_than_10000_single_calls_in_one_tick(frozen: FrozenTime) -> None:
    factory = GUIDFactory(0)
    ids = [factory.new_id(message_mod.time.time_ns()) for _ in range(10_001)]
    assert len(set(ids)) == 10_001
    assert ids == sorted(ids)


def test_clock_going_backwards_keeps_ids_increasing(frozen: FrozenTime) -> None:
    factory = GUIDFactory(4)
    a = factory.new_ids(10)
    frozen.ns -= 50 << 20  # the wall clock steps back 50 ticks
    b = factory.new_ids(10)
    frozen.ns += 200 << 20
    c = factory.new_ids(10)
    ids = a + b + c
    assert len(set(ids)) == 30
    assert all(x < y for x, y in itertools.pairwise(ids))
    assert decode_id(c[0])[0] == frozen.ns >> 20


def test_new_ids_zero() -> None:
    assert GUIDFactory(0).new_ids(0) == []


def test_factories_are_independent() -> None:
    a, b = GUIDFactory(1), GUIDFactory(2)
    ids_a, ids_b = a.new_ids(100), b.new_ids(100)
    assert not set(ids_a) & set(ids_b)  # different node ids never collide


# -- payloads -------------------------------------------------------------------------------------


def test_field_positions() -> None:
    msg = (b"0123456789abcdef", 123, 4, b"body")
    assert msg[MSG_ID] == b"0123456789abcdef"
    assert msg[MSG_TIMESTAMP] == 123
    assert msg[MSG_ATTEMPTS] == 4
    assert msg[MSG_BODY] == b"body"


@pytest.mark.parametrize("attempts", [0, 1, 2, 1000, 0xFFFE])
@pytest.mark.parametrize("body", [b"", b"x", b"\x00\n" * 100])
def test_payload_round_trip(attempts: int, body: bytes) -> None:
    msg = (b"fedcba9876543210", 1_700_000_000_123_456_789, attempts, body)
    payload = to_payload(msg)
    assert payload == encode_message(*msg)
    assert len(payload) == 26 + len(body)
    assert from_payload(payload) == msg
    assert decode_message(payload) == msg


def test_payload_exact_bytes() -> None:
    payload = to_payload((b"0123456789abcdef", 0x0A0B0C0D0E0F1011, 0x0102, b"hi"))
    assert payload == b"\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x01\x020123456789abcdefhi"


def test_from_payload_too_short() -> None:
    with pytest.raises(ValueError):
        from_payload(b"\x00" * 25)


def test_requeued_keeps_attempts_below_the_maximum() -> None:
    assert requeued(b"i" * 16, 5, 0, b"b") == (b"i" * 16, 5, 0, b"b")
    assert requeued(b"i" * 16, 5, 3, b"b") == (b"i" * 16, 5, 3, b"b")
    assert requeued(b"i" * 16, 5, 0xFFFE, b"b")[MSG_ATTEMPTS] == 0xFFFE


def test_attempts_0xffff_wraps_to_zero_on_next_delivery() -> None:
    """uint16 attempts: after the 65535th delivery the next one reports 0 (Go's msg.Attempts++)."""
    assert MAX_ATTEMPTS == 0xFFFF
    msg = requeued(b"i" * 16, 5, 0xFFFF, b"b")
    next_delivery_attempts = msg[MSG_ATTEMPTS] + 1
    assert next_delivery_attempts == 0
    # still written to disk as 0xFFFF (the count so far), and read back the same way
    payload = to_payload(msg)
    assert payload[8:10] == b"\xff\xff"
    assert from_payload(payload)[MSG_ATTEMPTS] + 1 == 0


# -- runs: the messages of one MPUB --------------------------------------------------------------


def packed(bodies: list[bytes]) -> bytes:
    return b"".join(len(b).to_bytes(4, "big") + b for b in bodies)


BODIES = [b"a", b"bb", b"", b"dddd", b"e" * 300]


def make_run(bodies: list[bytes] = BODIES) -> Run:
    return new_runs(packed(bodies), len(bodies), 42, [(b"0" * 13, 5, len(bodies))])[0]


def ids(msgs: list[Message]) -> list[bytes]:
    return [m[0] for m in msgs]


def test_run_messages_are_the_mpub_in_order_with_consecutive_ids() -> None:
    msgs = expand([make_run()])
    assert [m[3] for m in msgs] == BODIES
    assert ids(msgs) == [b"0" * 13 + b"%03x" % i for i in range(5, 10)]
    assert {(m[1], m[2]) for m in msgs} == {(42, 0)}


def test_runs_split_where_the_ids_of_a_tick_run_out(frozen: FrozenTime) -> None:
    factory = GUIDFactory(1)
    factory.new_ids(4094)
    bodies = [b"%d" % i for i in range(5)]
    spans = factory.new_spans(5)
    assert [n for _, _, n in spans] == [2, 3]
    runs = new_runs(packed(bodies), 5, 7, spans)
    msgs = expand(runs)
    assert [m[3] for m in msgs] == bodies
    assert all(a < b for a, b in itertools.pairwise(ids(msgs)))
    assert [decode_id(i)[2] for i in ids(msgs)] == [4094, 4095, 0, 1, 2]


def test_take_cuts_the_head_off_a_run_and_leaves_the_rest() -> None:
    run = make_run()
    single: Message = (b"f" * 16, 1, 3, b"single")
    memory = deque([run, single])
    first = take(memory, 2)
    assert [m[3] for m in first] == BODIES[:2] and len(memory) == 2
    assert memory[0] != run and memory[0].payload is run.payload  # shared, not copied
    assert [m[3] for m in take(memory, 4)] == [*BODIES[2:], b"single"]
    assert not memory and take(memory, 3) == []
    assert ids(first) + ids(expand([cut(run, 2)[1]])) == ids(expand([run]))


def test_cut_split_and_drop_last_count_messages_inside_runs() -> None:
    run = make_run()
    head, rest = cut(run, 3)
    assert (head.length, rest.length) == (3, 2)
    assert expand([head]) + expand([rest]) == expand([run])
    single: Message = (b"f" * 16, 1, 0, b"z")
    entries: list[Message | Run] = [single, run]
    kept, spilled = split(entries, 3)
    assert expand(kept) == expand(entries)[:3] and expand(spilled) == expand(entries)[3:]
    assert to_payloads(spilled) == [to_payload(m) for m in expand(entries)[3:]]
    assert split(entries, 0) == ([], entries)
    assert split(entries, 6) == (entries, [])
    memory = deque(entries)
    drop_last(memory, 4)
    assert expand(memory) == expand(entries)[:2]
    drop_last(memory, 2)
    assert not memory
