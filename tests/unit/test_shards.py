"""The wire between ``nsqd --workers`` processes (nsqpy/nsqd/shards.py), over real unix
socket pairs in one event loop: frames of any size in order, file descriptors with their
frame, requests and their errors, a peer that goes away."""

from __future__ import annotations

import asyncio
import os
import socket
import zlib
from typing import Any

import pytest

from nsqpy.common.log import Logger
from nsqpy.nsqd.shards import Link, RemoteError, Shards, owner_of


def test_owner_is_crc32_of_the_name() -> None:
    assert owner_of("anything", 1) == 0
    names = [f"topic_{i}" for i in range(1000)]
    for workers in (2, 3, 8):
        owners = [owner_of(n, workers) for n in names]
        assert owners == [zlib.crc32(n.encode()) % workers for n in names]
        counts = [owners.count(i) for i in range(workers)]
        assert min(counts) > len(names) / workers * 0.8, counts  # a fair share each


def test_frames_and_fds_arrive_in_order() -> None:
    async def run() -> None:
        a, b = socket.socketpair()
        got: list[tuple[Any, list[int]]] = []
        done = asyncio.Event()

        def on_frame(message: Any, fds: list[int]) -> None:
            got.append((message, fds))
            if len(got) == 4:
                done.set()

        receiver = Link(b, on_frame, lambda: None)
        sender = Link(a, lambda m, f: None, lambda: None)
        big = os.urandom(8 << 20)  # far more than a socket buffer: written in pieces
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        sender.send(("tell", "x", (1,)))
        sender.send(("fds", "adopt", (big,), 1), [r1])
        sender.send(("tell", "y", (2,)))
        sender.send(("fds", "adopt", (b"small",), 1), [r2])
        await asyncio.wait_for(done.wait(), 10)
        assert [m[1] for m, _ in got] == ["x", "adopt", "y", "adopt"]
        assert got[1][0][2][0] == big
        assert [len(f) for _, f in got] == [0, 1, 0, 1]
        os.write(w1, b"one")
        os.write(w2, b"two")
        assert os.read(got[1][1][0], 3) == b"one"  # each fd with its own frame
        assert os.read(got[3][1][0], 3) == b"two"
        for fd in (got[1][1][0], got[3][1][0], w1, w2):
            os.close(fd)
        sender.close()
        receiver.close()

    asyncio.run(run())


def _pair(logger: Logger) -> tuple[Shards, Shards]:
    a, b = socket.socketpair()
    return Shards(0, 2, {1: a}, logger), Shards(1, 2, {0: b}, logger)


def test_calls_answers_errors_and_a_lost_peer() -> None:
    logger = Logger("[test] ")

    async def run() -> None:
        zero, one = _pair(logger)
        zero.start()
        one.start()

        async def slow(x: int) -> int:
            await asyncio.sleep(0.01)
            return x * 2

        def fails() -> None:
            raise KeyError("no such thing")

        one.handlers["double"] = slow
        one.handlers["fails"] = fails
        zero.handlers["double"] = lambda x: x + 100
        assert await zero.call(1, "double", 21) == 42
        with pytest.raises(RemoteError) as err:
            await zero.call(1, "fails")
        assert err.value.kind == "KeyError"
        assert await zero.gather("double", 1) == [101, 2]
        pending = zero.call(1, "double", 1)
        one.links[0].close()  # the peer is gone: its pending requests fail at once
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(pending, 5)
        zero.close()

    asyncio.run(run())


@pytest.mark.parametrize("says_bye", [True, False])
def test_only_a_peer_that_did_not_say_bye_is_reported_lost(
    capfd: pytest.CaptureFixture[str], says_bye: bool
) -> None:
    logger = Logger("[test] ")

    async def run() -> None:
        zero, one = _pair(logger)
        zero.start()
        one.start()
        if says_bye:
            one.close()  # (an exiting worker)
        else:
            one.links[0].close()  # (a worker that died)
        deadline = asyncio.get_running_loop().time() + 5
        while not zero.links[1].closed:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        zero.close()

    asyncio.run(run())
    assert ("lost worker 1" in capfd.readouterr().err) is not says_bye
