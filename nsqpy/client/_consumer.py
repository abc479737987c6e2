"""The asyncio consumer: connections to nsqd, RDY management, handlers, back-off.

RDY follows go-nsq. ``max_in_flight`` is spread over the connections (at least 1 each);
when there are more connections than ``max_in_flight`` (or the consumer is backing off)
a periodic pass takes RDY from connections idle for ``low_rdy_idle_timeout`` (or holding
it for ``low_rdy_timeout``) and hands RDY 1 to connections picked at random, so that
many nsqd with few messages each are all read.

Back-off also follows go-nsq: a handler failure (requeue with back-off) raises the
back-off level, sets every connection to RDY 0 and, after multiplier x 2^level seconds,
lets one message through on one connection; each success lowers the level, and at 0
the normal RDY counts come back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Unpack

from nsqpy.client._config import ConsumerOptions, resolve
from nsqpy.client._conn import Conn, split_address
from nsqpy.client._errors import NSQClientError, NSQClosedError
from nsqpy.client._lookup import LookupdPoller
from nsqpy.client._message import Message
from nsqpy.wire.names import is_valid_channel_name, is_valid_topic_name
from nsqpy.wire.v2 import encode_cls, encode_sub

__all__ = ["BatchHandler", "Consumer", "ConsumerStats", "GiveUpHandler", "MessageHandler"]

log = logging.getLogger("nsqpy.client")

MessageHandler = Callable[[Message], Awaitable[object] | object]
"""``handler(message)``: a coroutine function or a plain function."""
BatchHandler = Callable[[list[Message]], Awaitable[object] | object]
"""``handler(messages)``: called with every message received (or queued) at once."""
GiveUpHandler = Callable[[Message], Awaitable[object] | object]
"""Called with a message delivered more than ``max_attempts`` times, before it is finished."""

# Delay before retrying a RDY update that found no RDY left to give (go-nsq's 5 s).
_RDY_RETRY = 5.0
_RESUME, _BACKOFF, _CONTINUE = 0, 1, 2


class ConsumerStats(NamedTuple):
    """Counters of a consumer (go-nsq's ``ConsumerStats``)."""

    messages_received: int
    messages_finished: int
    messages_requeued: int
    connections: int


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


class Consumer:
    """Reads ``topic``/``channel`` from nsqd and calls a handler for the messages.

    ::

        async def handle(msg: Message) -> None:
            print(msg.body)              # returning finishes the message, raising requeues it

        async with Consumer("events", "archive", handle,
                            lookupd_http_addresses=["127.0.0.1:4161"],
                            max_in_flight=100) as consumer:
            await consumer.wait_closed()

    Give either ``handler`` (one message per call) or ``batch_handler`` (a list per call:
    every message one read from the network delivered, or that queued up while the
    previous call ran). Both may be coroutine functions, run by ``concurrency`` worker
    tasks, or plain functions, called right away from the connection's read callback with
    no task in between (the fastest path, for handlers that do not block). After the
    handler returns, the consumer finishes each message it did not respond to itself
    (unless :meth:`Message.disable_auto_response` was called); after it raises, it
    requeues them and backs off.

    Connects to the ``nsqd_tcp_addresses`` (lost connections are reopened with back-off)
    and to the producers that the ``lookupd_http_addresses`` list for the topic, polled
    every ``lookupd_poll_interval``: new producers are joined, producers no longer listed
    (but still registered: tombstoned) are left (gracefully, with CLS). Options:
    :class:`~nsqpy.client._config.ConsumerOptions`.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: MessageHandler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        nsqd_tcp_addresses: Sequence[str] = (),
        lookupd_http_addresses: Sequence[str] = (),
        concurrency: int = 1,
        on_give_up: GiveUpHandler | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        if not is_valid_topic_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        if not is_valid_channel_name(channel):
            raise ValueError(f"invalid channel name {channel!r}")
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler and batch_handler")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if isinstance(nsqd_tcp_addresses, str) or isinstance(lookupd_http_addresses, str):
            raise TypeError("addresses must be a list of strings")
        for address in nsqd_tcp_addresses:
            split_address(address)
        self.topic = topic
        self.channel = channel
        self._config = cfg = resolve(options, ConsumerOptions)
        self._handler: Callable[[Any], Awaitable[object] | object] = (
            handler if handler is not None else batch_handler  # type: ignore[assignment]
        )
        self._batch = batch_handler is not None
        self._async = _is_async(self._handler)
        self._concurrency = concurrency
        self._on_give_up = on_give_up
        self._prefix = f"[{topic}/{channel}] "
        self._direct: list[str] = list(dict.fromkeys(nsqd_tcp_addresses))
        self._lookupd_addresses: list[str] = list(dict.fromkeys(lookupd_http_addresses))
        self._max_in_flight = cfg.max_in_flight
        self._max_attempts = cfg.max_attempts

        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: dict[str, Conn] = {}
        self._connecting: set[str] = set()
        self._reconnects: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poller: LookupdPoller | None = None
        self._rdy_task: asyncio.Task[None] | None = None
        self._rdy_retry: dict[str, asyncio.TimerHandle] = {}
        self._total_rdy = 0
        self._need_redistribute = False
        self._backoff_counter = 0
        self._backoff_timer: asyncio.TimerHandle | None = None

        self._queue: deque[Message] = deque()
        self._idle: list[asyncio.Future[None]] = []
        self._workers: list[asyncio.Task[None]] = []

        self._received = 0
        self._finished = 0
        self._requeued = 0
        self._started = False
        self._stopping = False
        self._stopped: asyncio.Future[None] | None = None

    # -- public ---------------------------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect to the nsqd addresses (raising if one cannot be reached, like go-nsq's
        ``ConnectToNSQD``), query the lookupds and connect to the producers they list
        (failures there are logged and retried at the next poll), then keep polling."""
        if self._started:
            return
        if self._stopping:
            raise NSQClosedError("consumer closed")
        if not self._direct and not self._lookupd_addresses:
            raise ValueError("give nsqd_tcp_addresses or lookupd_http_addresses")
        self._started = True
        loop = self._loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        if self._async:
            self._workers = [loop.create_task(self._worker()) for _ in range(self._concurrency)]
        self._rdy_task = loop.create_task(self._rdy_loop())
        try:
            for address in self._direct:
                await self._connect(address)
        except BaseException:
            await self.close()
            raise
        if self._lookupd_addresses:
            cfg = self._config
            self._poller = LookupdPoller(
                self._lookupd_addresses,
                self.topic,
                cfg.lookupd_poll_interval,
                cfg.lookupd_poll_jitter,
                self._on_lookup,
                prefix=self._prefix,
            )
            # Like go-nsq, the first query and its connections happen before start returns.
            found, _ = await self._poller.poll_once()
            await asyncio.gather(*(self._connect_logged(a) for a in sorted(found)))
            self._poller.start(polled=True)

    async def connect_to_nsqd(self, address: str) -> None:
        """Add an nsqd to read from (kept connected like the constructor's addresses)."""
        split_address(address)
        if address not in self._direct:
            self._direct.append(address)
        if self._started:
            await self._connect(address)

    def connect_to_lookupd(self, address: str) -> None:
        """Add an nsqlookupd to the discovery polls."""
        if address not in self._lookupd_addresses:
            self._lookupd_addresses.append(address)
        if self._poller is not None:
            self._poller.add(address)

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` and respread RDY (go-nsq's ``ChangeMaxInFlight``);
        0 pauses the consumer."""
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self._max_in_flight = max_in_flight
        if self._loop is None:
            return
        if max_in_flight == 0:
            for conn in self._active():
                self._update_rdy(conn, 0)
            return
        # Lower first so that raising others finds the budget.
        share = self._per_conn_max_in_flight()
        conns = sorted(self._active(), key=lambda c: c.rdy <= share)
        for conn in conns:
            self._maybe_update_rdy(conn)

    def stats(self) -> ConsumerStats:
        """Messages received, finished and requeued so far, and the connections up."""
        return ConsumerStats(self._received, self._finished, self._requeued, len(self._conns))

    @property
    def connections(self) -> list[str]:
        """Addresses of the nsqd this consumer is connected to."""
        return list(self._conns)

    @property
    def in_backoff(self) -> bool:
        """Whether handler failures have slowed the consumer down."""
        return self._backoff_counter > 0

    def is_starved(self) -> bool:
        """Whether some connection has (nearly) as many messages in flight as its RDY:
        the application holds messages and should respond before more can come."""
        for conn in self._conns.values():
            if conn.in_flight > 0 and conn.in_flight >= conn.rdy * 0.85:
                return True
        return False

    async def wait_closed(self) -> None:
        """Wait until :meth:`close` has finished."""
        if self._stopped is None:
            raise RuntimeError("consumer not started")
        await asyncio.shield(self._stopped)

    async def close(self) -> None:
        """Stop gracefully: CLS to every nsqd, wait (up to ``close_timeout``) for the
        messages in flight to be finished or requeued, then close the connections."""
        if self._stopping:
            if self._stopped is not None:
                await asyncio.shield(self._stopped)
            return
        self._stopping = True
        if self._stopped is None:
            return
        log.info("%sstopping...", self._prefix)
        if self._poller is not None:
            await self._poller.close()
        for task in [*self._reconnects.values(), *([self._rdy_task] if self._rdy_task else [])]:
            task.cancel()
        for timer in self._rdy_retry.values():
            timer.cancel()
        self._rdy_retry.clear()
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
        conns = list(self._conns.values())
        for conn in conns:
            self._start_close(conn)
        if conns:
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(c.wait_closed()) for c in conns],
                timeout=self._config.close_timeout,
            )
            if pending:
                log.warning("%sclose timeout: dropping %d connections", self._prefix, len(pending))
                for conn in conns:
                    conn.abort()
                await asyncio.gather(*pending, return_exceptions=True)
        for task in [*self._workers, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._workers, *self._tasks, return_exceptions=True)
        self._workers.clear()
        log.info("%sstopped", self._prefix)
        if not self._stopped.done():
            self._stopped.set_result(None)

    # -- connections ----------------------------------------------------------------------

    async def _connect(self, address: str) -> None:
        if address in self._conns or address in self._connecting or self._stopping:
            return
        self._connecting.add(address)
        conn = Conn(address, self._config, self, self._prefix)
        log.info("%s(%s) connecting to nsqd", self._prefix, address)
        try:
            await conn.connect()
            if conn.max_rdy < self._max_in_flight:
                log.warning(
                    "%s(%s) max RDY count %d < consumer max in flight %d, truncation possible",
                    self._prefix,
                    address,
                    conn.max_rdy,
                    self._max_in_flight,
                )
            await conn.command(encode_sub(self.topic, self.channel))
        except BaseException:
            conn.abort()
            raise
        finally:
            self._connecting.discard(address)
        if self._stopping:
            conn.close()
            return
        self._conns[address] = conn
        # Lower the others first so that the budget is there for the new one.
        for other in list(self._conns.values()):
            if other is not conn:
                self._maybe_update_rdy(other)
        self._maybe_update_rdy(conn)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        assert self._loop is not None
        task: asyncio.Task[Any] = asyncio.ensure_future(coro, loop=self._loop)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect_logged(self, address: str) -> None:
        try:
            await self._connect(address)
        except NSQClientError as err:
            log.error("%s(%s) error connecting to nsqd - %s", self._prefix, address, err)

    def _on_lookup(self, found: set[str], complete: bool) -> None:
        if self._stopping:
            return
        for address in sorted(found):
            if address not in self._conns and address not in self._connecting:
                self._spawn(self._connect_logged(address))
        if complete:
            unlisted = [
                address
                for address, conn in self._conns.items()
                if address not in found and address not in self._direct and not conn.closing
            ]
            if unlisted:
                self._spawn(self._leave_unlisted(unlisted))

    async def _leave_unlisted(self, addresses: list[str]) -> None:
        """Leave the producers nsqlookupd no longer lists for the topic, but only those it
        still lists as active nodes (tombstoned there, or the topic deleted there).

        One missing from ``/nodes`` too has only gone quiet for nsqlookupd: cut off from it
        by a partition, or nsqlookupd restarted. Like go-nsq, which never leaves a producer,
        the connection is kept: it is healthy, or its heartbeats will end it.
        """
        assert self._poller is not None
        nodes = await self._poller.active_nodes()
        if nodes is None or self._stopping:
            return
        dropped = False
        for address in addresses:
            conn = self._conns.get(address)
            if conn is None or conn.closing or address not in nodes:
                continue
            log.info("%s(%s) no longer a producer of the topic, closing", self._prefix, address)
            self._start_close(conn)
            dropped = True
        if dropped:
            for conn in self._active():
                self._maybe_update_rdy(conn)

    def _start_close(self, conn: Conn) -> None:
        """CLS: nsqd stops sending; close when nsqd said CLOSE_WAIT and nothing is in flight."""
        if conn.closing or conn.closed:
            return
        conn.closing = True
        self._total_rdy -= conn.rdy
        conn.rdy = 0
        timer = self._rdy_retry.pop(conn.address, None)
        if timer is not None:
            timer.cancel()

        def on_close_wait(fut: asyncio.Future[bytes]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                return
            log.info("%s(%s) received CLOSE_WAIT from nsqd", self._prefix, conn.address)
            conn.close_when_idle = True
            if conn.in_flight <= 0:
                conn.close()

        try:
            conn.command(encode_cls()).add_done_callback(on_close_wait)
        except NSQClientError:
            conn.abort()

    def _reconnect(self, address: str) -> None:
        if address in self._reconnects or self._stopping:
            return
        assert self._loop is not None
        task = self._loop.create_task(self._reconnect_loop(address))
        self._reconnects[address] = task
        task.add_done_callback(lambda _: self._reconnects.pop(address, None))

    async def _reconnect_loop(self, address: str) -> None:
        cfg = self._config
        delay = cfg.reconnect_delay
        while not self._stopping and address in self._direct and address not in self._conns:
            log.info("%s(%s) re-connecting in %.3gs", self._prefix, address, delay)
            await asyncio.sleep(delay)
            try:
                await self._connect(address)
                return
            except NSQClientError as err:
                log.error("%s(%s) error connecting to nsqd - %s", self._prefix, address, err)
                delay = min(delay * 2, cfg.max_reconnect_delay)

    # -- ConnDelegate ---------------------------------------------------------------------

    def on_close(self, conn: Conn, exc: BaseException | None) -> None:
        address = conn.address
        if self._conns.get(address) is not conn:
            return
        del self._conns[address]
        rdy = conn.rdy
        self._total_rdy -= rdy
        conn.rdy = 0
        timer = self._rdy_retry.pop(address, None)
        if timer is not None:
            timer.cancel()
        left = len(self._conns)
        if exc is not None and not conn.closing:
            log.warning("%s(%s) connection lost - %s", self._prefix, address, exc)
        log.log(
            logging.INFO if self._stopping or conn.closing else logging.WARNING,
            "%sthere are %d connections left alive",
            self._prefix,
            left,
        )
        if (timer is not None or rdy > 0) and (left == self._max_in_flight or self.in_backoff):
            self._need_redistribute = True
        if self._stopping:
            return
        # Give the freed RDY to the others (go-nsq waits for a new connection).
        if rdy > 0 and left and self._backoff_counter == 0 and self._backoff_timer is None:
            for other in list(self._conns.values()):
                self._maybe_update_rdy(other)
        if address in self._direct:
            self._reconnect(address)
        if self._poller is not None:
            self._poller.poke()

    def on_messages(self, conn: Conn, messages: list[Message]) -> None:
        self._received += len(messages)
        max_attempts = self._max_attempts
        if max_attempts:
            for msg in messages:
                if msg.attempts > max_attempts:
                    keep = []
                    for m in messages:
                        if m.attempts > max_attempts:
                            self._give_up(m)
                        else:
                            keep.append(m)
                    if not keep:
                        return
                    messages = keep
                    break
        if self._async:
            self._queue.extend(messages)
            idle = self._idle
            wake = 1 if self._batch else len(messages)
            while idle and wake:
                fut = idle.pop()
                if not fut.done():
                    fut.set_result(None)
                    wake -= 1
        elif self._batch:
            self._call_batch(messages)
        else:
            handler = self._handler
            done = []
            for msg in messages:
                try:
                    result = handler(msg)
                except Exception as err:
                    self._handler_failed(err, (msg,))
                    continue
                if result is not None and inspect.isawaitable(result):
                    self._spawn(self._await_result(result, [msg]))
                    continue
                done.append(msg)
            if done:
                conn.finish_all(done)

    def on_finished(self, conn: Conn, count: int) -> None:
        self._finished += count
        if self._backoff_counter:
            self._backoff_signal(_RESUME)

    def on_response(self, conn: Conn, msg: Message, finished: bool, backoff: bool) -> None:
        if finished:
            self._finished += 1
            if self._backoff_counter:
                self._backoff_signal(_RESUME)
        else:
            self._requeued += 1
            if backoff:
                self._backoff_signal(_BACKOFF)
            elif self._backoff_counter:
                self._backoff_signal(_CONTINUE)

    # -- handlers -------------------------------------------------------------------------

    def _give_up(self, msg: Message) -> None:
        log.warning(
            "%smsg %s attempted %d times, giving up",
            self._prefix,
            msg.id.decode("ascii", "replace"),
            msg.attempts,
        )
        hook = self._on_give_up
        if hook is None:
            msg.finish()
            return
        try:
            result = hook(msg)
        except Exception as err:
            log.error("%sgive-up handler failed (%s) for msg %s", self._prefix, err, msg.id)
            msg.finish()
            return
        if inspect.isawaitable(result):
            self._spawn(self._await_then_finish(result, msg))
        else:
            msg.finish()

    async def _await_then_finish(self, result: Awaitable[object], msg: Message) -> None:
        try:
            await result
        except Exception as err:
            log.error("%sgive-up handler failed (%s) for msg %s", self._prefix, err, msg.id)
        msg.finish()

    def _handler_failed(self, err: BaseException, msgs: Sequence[Message]) -> None:
        ids = ", ".join(m.id.decode("ascii", "replace") for m in msgs[:3])
        more = f" (+{len(msgs) - 3})" if len(msgs) > 3 else ""
        log.error("%sHandler returned error (%r) for msg %s%s", self._prefix, err, ids, more)
        for msg in msgs:
            if msg._auto and not msg._responded:
                msg.requeue()

    @staticmethod
    def _finish_all(msgs: list[Message]) -> None:
        """Auto-finish: one FIN write per connection (messages may come from several)."""
        conn = msgs[0]._conn
        if all(m._conn is conn for m in msgs):
            conn.finish_all(msgs)
            return
        by_conn: dict[Conn, list[Message]] = {}
        for msg in msgs:
            by_conn.setdefault(msg._conn, []).append(msg)
        for c, group in by_conn.items():
            c.finish_all(group)

    def _call_batch(self, msgs: list[Message]) -> None:
        try:
            result = self._handler(msgs)
        except Exception as err:
            self._handler_failed(err, msgs)
            return
        if result is not None and inspect.isawaitable(result):
            self._spawn(self._await_result(result, msgs))
            return
        self._finish_all(msgs)

    async def _await_result(self, result: Awaitable[object], msgs: list[Message]) -> None:
        try:
            await result
        except Exception as err:
            self._handler_failed(err, msgs)
        else:
            self._finish_all(msgs)

    async def _worker(self) -> None:
        queue = self._queue
        handler = self._handler
        assert self._loop is not None
        loop = self._loop
        while True:
            while queue:
                if self._batch:
                    msgs = list(queue)
                    queue.clear()
                    try:
                        await handler(msgs)  # type: ignore[misc]
                    except Exception as err:
                        self._handler_failed(err, msgs)
                    else:
                        self._finish_all(msgs)
                else:
                    msg = queue.popleft()
                    try:
                        await handler(msg)  # type: ignore[misc]
                    except Exception as err:
                        self._handler_failed(err, (msg,))
                    else:
                        if msg._auto and not msg._responded:
                            msg.finish()
            fut: asyncio.Future[None] = loop.create_future()
            self._idle.append(fut)
            await fut

    # -- RDY ------------------------------------------------------------------------------

    def _active(self) -> list[Conn]:
        return [c for c in self._conns.values() if not c.closing]

    def _per_conn_max_in_flight(self) -> int:
        n = len(self._active())
        mif = self._max_in_flight
        share = mif / n if n else mif
        return int(min(max(1.0, share), mif))

    def _maybe_update_rdy(self, conn: Conn) -> None:
        if self._backoff_counter or self._backoff_timer is not None:
            return
        count = self._per_conn_max_in_flight()
        if count != conn.rdy:
            self._update_rdy(conn, count)

    def _update_rdy(self, conn: Conn, count: int) -> None:
        if conn.closing or conn.closed:
            return
        count = min(count, conn.max_rdy)
        timer = self._rdy_retry.pop(conn.address, None)
        if timer is not None:
            timer.cancel()
        rdy = conn.rdy
        if count > rdy:
            # Never exceed max_in_flight over all connections: truncate if possible.
            # (Lowering is always allowed; go-nsq refuses it too when over the budget.)
            max_possible = self._max_in_flight - self._total_rdy + rdy
            if 0 < max_possible < count:
                count = max_possible
            if max_possible <= 0:
                if rdy == 0 and self._loop is not None:
                    # Wanted to leave RDY 0 but nothing is left; retry so it cannot starve.
                    self._rdy_retry[conn.address] = self._loop.call_later(
                        _RDY_RETRY, self._update_rdy, conn, count
                    )
                return
        if count == 0 and rdy == 0:
            return
        self._total_rdy += count - rdy
        conn.send_rdy(count)

    async def _rdy_loop(self) -> None:
        interval = self._config.rdy_redistribute_interval
        while True:
            await asyncio.sleep(interval)
            try:
                self._redistribute()
            except Exception:  # must not end the loop
                log.exception("%sRDY redistribution failed", self._prefix)

    def _redistribute(self) -> None:
        if self._backoff_timer is not None:
            return
        conns = self._active()
        if not conns:
            return
        mif = self._max_in_flight
        if len(conns) > mif:
            self._need_redistribute = True
        if self.in_backoff and len(conns) > 1:
            self._need_redistribute = True
        if not self._need_redistribute:
            return
        self._need_redistribute = False
        assert self._loop is not None
        now = self._loop.time()
        cfg = self._config
        possible = []
        for conn in conns:
            if conn.rdy > 0:
                if now - conn.last_msg_time > cfg.low_rdy_idle_timeout:
                    log.debug("%s(%s) idle connection, giving up RDY", self._prefix, conn.address)
                    self._update_rdy(conn, 0)
                elif now - conn.last_rdy_time > cfg.low_rdy_timeout:
                    log.debug("%s(%s) RDY timeout, giving up RDY", self._prefix, conn.address)
                    self._update_rdy(conn, 0)
            # go-nsq also re-picks connections still holding RDY, wasting the turn
            if conn.rdy == 0:
                possible.append(conn)
        available = (1 if self.in_backoff else mif) - self._total_rdy
        while possible and available > 0:
            available -= 1
            conn = possible.pop(random.randrange(len(possible)))
            log.debug("%s(%s) redistributing RDY", self._prefix, conn.address)
            self._update_rdy(conn, 1)

    # -- back-off -------------------------------------------------------------------------

    def _backoff_duration(self, level: int) -> float:
        cfg = self._config
        duration: float = cfg.backoff_multiplier * (2**level)
        if cfg.backoff_strategy == "full_jitter":
            duration = random.uniform(0, duration)
        return duration

    def _backoff_signal(self, signal: int) -> None:
        if self._backoff_timer is not None:
            return  # one change per back-off period, whatever else completes meanwhile
        cfg = self._config
        updated = False
        counter = self._backoff_counter
        if signal == _RESUME:
            if counter > 0:
                counter -= 1
                updated = True
        elif signal == _BACKOFF and (
            self._backoff_duration(counter + 1) <= cfg.max_backoff_duration
        ):
            counter += 1
            updated = True
        self._backoff_counter = counter
        if counter == 0 and updated:
            count = self._per_conn_max_in_flight()
            log.warning("%sexiting backoff, returning all to RDY %d", self._prefix, count)
            for conn in self._active():
                self._update_rdy(conn, count)
        elif counter > 0:
            duration = min(self._backoff_duration(counter), cfg.max_backoff_duration)
            log.warning(
                "%sbacking off for %.4gs (backoff level %d), setting all to RDY 0",
                self._prefix,
                duration,
                counter,
            )
            for conn in self._active():
                self._update_rdy(conn, 0)
            self._backoff(duration)

    def _backoff(self, duration: float) -> None:
        assert self._loop is not None
        self._backoff_timer = self._loop.call_later(duration, self._resume)

    def _resume(self) -> None:
        self._backoff_timer = None
        if self._stopping:
            return
        conns = self._active()
        if not conns:
            log.warning("%sno connection available to resume, backing off for 1s", self._prefix)
            self._backoff(1.0)
            return
        choice = random.choice(conns)
        log.warning("%s(%s) backoff timeout expired, sending RDY 1", self._prefix, choice.address)
        # While backing off only one message at a time goes through.
        self._update_rdy(choice, 1)
