"""The asyncio publisher: PUB, MPUB and DPUB over pipelined connections."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Sequence
from typing import Unpack

from nsqpy.client._config import ProducerOptions, resolve
from nsqpy.client._conn import Conn
from nsqpy.client._errors import (
    NSQClientError,
    NSQClosedError,
    NSQConnectionError,
    NSQError,
    NSQProtocolError,
)
from nsqpy.client._message import Message
from nsqpy.wire.names import go_quote, is_valid_topic_name
from nsqpy.wire.v2 import encode_dpub, encode_mpub, encode_pub

__all__ = ["Producer"]

log = logging.getLogger("nsqpy.client")


class _Waiter:
    """A publish waiting for any endpoint to connect; fails once every endpoint has failed."""

    __slots__ = ("errors", "future", "remaining")

    def __init__(self, future: asyncio.Future[Conn], endpoints: int) -> None:
        self.future = future
        self.remaining = endpoints
        self.errors: list[BaseException] = []

    def succeed(self, conn: Conn) -> None:
        if not self.future.done():
            self.future.set_result(conn)

    def fail(self, err: BaseException) -> None:
        self.errors.append(err)
        self.remaining -= 1
        if self.remaining <= 0 and not self.future.done():
            if len(self.errors) == 1:
                self.future.set_exception(self.errors[0])
            else:
                text = "; ".join(str(e) for e in self.errors)
                self.future.set_exception(NSQConnectionError(f"no nsqd reachable: {text}"))


class _Endpoint:
    """One nsqd address: its connection, or the task (re)connecting to it."""

    __slots__ = ("address", "conn", "delay", "task", "waiters", "was_connected")

    def __init__(self, address: str) -> None:
        self.address = address
        self.conn: Conn | None = None
        self.task: asyncio.Task[None] | None = None
        self.waiters: list[_Waiter] = []
        self.delay = 0.0
        self.was_connected = False


class Producer:
    """Publishes messages to one or more nsqd over TCP.

    ::

        async with Producer("127.0.0.1:4150") as producer:
            await producer.pub("events", b"hello")
            await producer.mpub("events", [b"a", b"b"])
            await producer.dpub("events", 1.5, b"later")

    Commands are pipelined: any number of concurrent publishes share a connection and
    nsqd's replies are matched to them in order; each call returns when nsqd said ``OK``
    and raises :class:`~nsqpy.client.NSQError` (``err.code == "E_BAD_TOPIC"``, ...) when it
    answered with an error. With several addresses publishes go round-robin over the
    connected ones.

    Connections open on first use (or :meth:`connect`). A lost connection is reopened in
    the background, first at once, then with a back-off from ``reconnect_delay`` doubling
    up to ``max_reconnect_delay``; a publish made while no connection is up waits for the
    next attempt and raises :class:`~nsqpy.client.NSQConnectionError` if it fails.
    Publishes in flight when a connection drops fail with ``NSQConnectionError`` (nsqd may
    or may not have them). Options: :class:`~nsqpy.client._config.ProducerOptions`.
    """

    def __init__(self, nsqd_tcp_addresses: str | Sequence[str], **options: Unpack[ProducerOptions]):
        addresses = (
            [nsqd_tcp_addresses]
            if isinstance(nsqd_tcp_addresses, str)
            else list(nsqd_tcp_addresses)
        )
        if not addresses:
            raise ValueError("Producer needs at least one nsqd TCP address")
        self._config = resolve(options, ProducerOptions)
        self._endpoints = [_Endpoint(a) for a in addresses]
        self._next = 0
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        """The nsqd TCP addresses published to."""
        return [ep.address for ep in self._endpoints]

    @property
    def connected(self) -> list[str]:
        """The addresses with a connection up now."""
        return [ep.address for ep in self._endpoints if ep.conn is not None]

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect to every address now; raises if none could be reached."""
        self._check_open()
        for ep in self._endpoints:
            self._ensure_connecting(ep)
        results = await asyncio.gather(
            *(self._wait_endpoint(ep) for ep in self._endpoints), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) == len(results):
            raise errors[0]

    async def pub(self, topic: str, body: bytes | str) -> None:
        """Publish one message (PUB)."""
        data = _body(body)
        _check_topic("PUB", topic)
        if not data:
            raise NSQError("E_BAD_MESSAGE", "PUB invalid message body size 0")
        await self._publish(encode_pub(topic, data))

    async def mpub(self, topic: str, bodies: Iterable[bytes | str]) -> None:
        """Publish several messages atomically (MPUB): all are queued or none."""
        _check_topic("MPUB", topic)
        items = [_body(b) for b in bodies]
        if not items:
            raise NSQError("E_BAD_BODY", "MPUB invalid message count 0")
        for i, item in enumerate(items):
            if not item:
                raise NSQError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size 0")
        await self._publish(encode_mpub(topic, items))

    async def dpub(self, topic: str, delay: float, body: bytes | str) -> None:
        """Publish one message delivered after ``delay`` seconds (DPUB)."""
        data = _body(body)
        _check_topic("DPUB", topic)
        delay_ms = round(delay * 1000)
        if delay_ms < 0:
            raise NSQError("E_INVALID", f"DPUB could not parse timeout {delay_ms}")
        if not data:
            raise NSQError("E_BAD_MESSAGE", "DPUB invalid message body size 0")
        await self._publish(encode_dpub(topic, delay_ms, data))

    async def _publish(self, command: bytes) -> None:
        conn = self._ready_conn() or await self._wait_any()
        if conn._write_paused:
            await conn.drain()
        resp = await conn.command(command)
        if resp != b"OK":
            raise NSQProtocolError(f"({conn.address}) unexpected reply {resp[:100]!r}")

    def _ready_conn(self) -> Conn | None:
        eps = self._endpoints
        n = len(eps)
        start = self._next
        for i in range(n):
            ep = eps[(start + i) % n]
            conn = ep.conn
            if conn is not None and not conn.closed and not conn.failed:
                self._next = (start + i + 1) % n
                return conn
        self._check_open()
        return None

    async def _wait_any(self) -> Conn:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), len(self._endpoints))
        for ep in self._endpoints:
            ep.waiters.append(waiter)
            self._ensure_connecting(ep)
        return await waiter.future

    async def _wait_endpoint(self, ep: _Endpoint) -> Conn:
        if ep.conn is not None:
            return ep.conn
        waiter = _Waiter(asyncio.get_running_loop().create_future(), 1)
        ep.waiters.append(waiter)
        self._ensure_connecting(ep)
        return await waiter.future

    def _ensure_connecting(self, ep: _Endpoint) -> None:
        if ep.conn is None and ep.task is None:
            ep.task = asyncio.get_running_loop().create_task(self._connect_loop(ep))

    async def _connect_loop(self, ep: _Endpoint) -> None:
        """Connect ``ep``, retrying with back-off while anyone waits or it was connected."""
        cfg = self._config
        try:
            while not self._closed:
                if ep.delay:
                    await asyncio.sleep(ep.delay)
                conn = Conn(ep.address, cfg, self)
                try:
                    await conn.connect()
                except NSQClientError as err:
                    ep.delay = min(max(ep.delay * 2, cfg.reconnect_delay), cfg.max_reconnect_delay)
                    log.error("(%s) error connecting to nsqd - %s", ep.address, err)
                    waiters, ep.waiters = ep.waiters, []
                    for w in waiters:
                        w.fail(err)
                    if not ep.was_connected:
                        return  # never up: the next publish tries again
                    continue
                if self._closed:
                    conn.close()
                    return
                ep.conn = conn
                ep.delay = 0.0
                ep.was_connected = True
                waiters, ep.waiters = ep.waiters, []
                for w in waiters:
                    w.succeed(conn)
                return
        finally:
            ep.task = None
            if self._closed:
                for w in ep.waiters:
                    w.fail(NSQClosedError("producer closed"))
                ep.waiters.clear()

    # -- ConnDelegate ---------------------------------------------------------------------

    def on_messages(self, conn: Conn, messages: list[Message]) -> None:
        log.warning("(%s) producer got %d unexpected messages", conn.address, len(messages))

    def on_response(self, conn: Conn, msg: Message, finished: bool, backoff: bool) -> None:
        pass

    def on_finished(self, conn: Conn, count: int) -> None:
        pass

    def on_close(self, conn: Conn, exc: BaseException | None) -> None:
        for ep in self._endpoints:
            if ep.conn is conn:
                ep.conn = None
                if not self._closed:
                    log.warning("(%s) connection to nsqd lost - %s", conn.address, exc)
                    self._ensure_connecting(ep)

    # -- closing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise NSQClosedError("producer closed")

    async def close(self) -> None:
        """Wait for the replies to publishes in flight (up to ``reply_timeout``), then close
        every connection. Later publishes raise :class:`~nsqpy.client.NSQClosedError`."""
        if self._closed:
            return
        self._closed = True
        tasks = [ep.task for ep in self._endpoints if ep.task is not None]
        for task in tasks:
            task.cancel()
        conns = [ep.conn for ep in self._endpoints if ep.conn is not None]
        for ep in self._endpoints:
            for w in ep.waiters:
                w.fail(NSQClosedError("producer closed"))
            ep.waiters.clear()
        deadline = asyncio.get_running_loop().time() + self._config.reply_timeout
        for conn in conns:
            while conn.pending and not conn.closed and asyncio.get_running_loop().time() < deadline:
                head = conn._pending[-1]
                try:
                    await asyncio.wait_for(
                        asyncio.shield(head), deadline - asyncio.get_running_loop().time()
                    )
                except (NSQClientError, TimeoutError):
                    break
            conn.close()
        await asyncio.gather(*(c.wait_closed() for c in conns), *tasks, return_exceptions=True)


def _body(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


_valid_topic = functools.lru_cache(maxsize=1024)(is_valid_topic_name)


def _check_topic(cmd: str, topic: str) -> None:
    # Checked here, with nsqd's wording: nsqd closes the connection on a bad name, which
    # would fail every other publish in flight on it.
    if not _valid_topic(topic):
        prefix = "E_BAD_TOPIC " if cmd == "MPUB" else ""
        raise NSQError("E_BAD_TOPIC", f"{prefix}{cmd} topic name {go_quote(topic)} is not valid")
