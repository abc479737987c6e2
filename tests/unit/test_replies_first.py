"""A publisher's reply goes out before the fan-out of what it published (NSQD.hold_dispatch):
a producer waiting for each ``OK`` (TCP ``PUB``) or ``200`` (HTTP ``POST /pub``) is not
kept waiting while the message is handed to consumers, as Go's topic pump runs beside the
publisher's connection. Checked in the server's own loop: when a channel's dispatch runs,
the publisher's socket must already hold its reply."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from nsqpy.nsqd.channel import Channel
from nsqpy.testing import AsyncNSQD

MAGIC = b"  V2"


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def _connect(address: str) -> socket.socket:
    sock = socket.create_connection(_address(address))  # loopback: no wait on the loop
    sock.setblocking(False)
    return sock


def _pending(sock: socket.socket) -> bytes:
    """What ``sock`` has received so far, without waiting."""
    try:
        return sock.recv(65536, socket.MSG_PEEK)
    except BlockingIOError:
        return b""


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0)  # a turn of the server's loop (it shares this one)
    raise AssertionError("the server did not get there")


@pytest.fixture
def on_dispatch(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None]]:
    """Hooks called at every Channel.dispatch(), before it runs."""
    hooks: list[Callable[[], None]] = []
    real = Channel.dispatch

    def dispatch(self: Channel) -> None:
        for hook in hooks:
            hook()
        real(self)

    monkeypatch.setattr(Channel, "dispatch", dispatch)
    return hooks


def _run(
    publish: Callable[[AsyncNSQD, list[socket.socket]], Awaitable[None]],
    reply: bytes,
    on_dispatch: list[Callable[[], None]],
) -> None:
    async def scenario() -> None:
        async with AsyncNSQD() as nsqd:
            consumer = _connect(nsqd.tcp_address)
            # (the OK is written once the whole read is handled: RDY 1 too)
            consumer.sendall(MAGIC + b"SUB t c\nRDY 1\n")
            await _until(lambda: b"OK" in _pending(consumer))
            publisher: list[socket.socket] = []
            found: list[bytes] = []
            on_dispatch.append(lambda: found.append(_pending(publisher[0])))
            await publish(nsqd, publisher)  # (appends its socket once connected)
            await _until(lambda: b"hello" in _pending(consumer))
            publisher[0].close()
            consumer.close()
            assert found, "no dispatch after the publish"
            assert all(reply in got for got in found), found

    asyncio.run(scenario())


def test_a_pubs_ok_is_written_before_its_message_is_dispatched(
    on_dispatch: list[Callable[[], None]],
) -> None:
    async def publish(nsqd: AsyncNSQD, into: list[socket.socket]) -> None:
        into.append(_connect(nsqd.tcp_address))
        into[0].sendall(MAGIC + b"PUB t\n" + (5).to_bytes(4, "big") + b"hello")

    _run(publish, b"\x00\x00\x00\x06\x00\x00\x00\x00OK", on_dispatch)


def test_an_http_pubs_reply_is_written_before_its_message_is_dispatched(
    on_dispatch: list[Callable[[], None]],
) -> None:
    async def publish(nsqd: AsyncNSQD, into: list[socket.socket]) -> None:
        into.append(_connect(nsqd.http_address))
        into[0].sendall(b"POST /pub?topic=t HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")

    _run(publish, b"HTTP/1.1 200 OK\r\n", on_dispatch)


def test_an_http_mpubs_reply_is_written_before_its_messages_are_dispatched(
    on_dispatch: list[Callable[[], None]],
) -> None:
    """A handler that waits for its body publishes from a task, not from data_received:
    its last step is held the same way (httpserver._Resumed)."""

    async def publish(nsqd: AsyncNSQD, into: list[socket.socket]) -> None:
        into.append(_connect(nsqd.http_address))
        into[0].sendall(
            b"POST /mpub?topic=t HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        # the handler waits for the body it asked for: only then does the body go
        await _until(lambda: b"100 Continue" in _pending(into[0]))
        into[0].sendall(b"hello\nworld\n")

    _run(publish, b"HTTP/1.1 200 OK\r\n", on_dispatch)
