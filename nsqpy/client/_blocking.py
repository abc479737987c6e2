"""Blocking producer and consumer for threads and scripts: the asyncio client runs on an
event loop in a daemon thread, one per instance."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar, Unpack

from nsqpy.client._config import ConsumerOptions, ProducerOptions
from nsqpy.client._consumer import Consumer, ConsumerStats, GiveUpHandler
from nsqpy.client._errors import NSQClosedError, NSQTimeoutError
from nsqpy.client._message import Message
from nsqpy.client._producer import Producer

__all__ = ["BlockingConsumer", "BlockingProducer"]

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        if self.loop.is_closed():
            coro.close()
            raise NSQClosedError("closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise NSQTimeoutError(f"no result within {timeout}s") from None

    def call(self, fn: Callable[..., object], *args: object) -> None:
        """Schedule ``fn(*args)`` on the loop (fire and forget)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class BlockingProducer:
    """:class:`~nsqpy.client.Producer` for synchronous code::

        with BlockingProducer("127.0.0.1:4150") as producer:
            producer.pub("events", b"hello")

    Each call waits for nsqd's reply; use :meth:`mpub` for throughput. Safe to share
    between threads (calls from several threads are pipelined on the connection).
    """

    def __init__(
        self, nsqd_tcp_addresses: str | Sequence[str], **options: Unpack[ProducerOptions]
    ) -> None:
        self._producer = Producer(nsqd_tcp_addresses, **options)
        self._thread = _LoopThread("nsqpy-producer")

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, timeout: float | None = None) -> None:
        """Connect now (see :meth:`Producer.connect`)."""
        self._thread.run(self._producer.connect(), timeout)

    def pub(self, topic: str, body: bytes | str, timeout: float | None = None) -> None:
        """Publish one message (PUB)."""
        self._thread.run(self._producer.pub(topic, body), timeout)

    def mpub(self, topic: str, bodies: Iterable[bytes | str], timeout: float | None = None) -> None:
        """Publish several messages atomically (MPUB)."""
        self._thread.run(self._producer.mpub(topic, list(bodies)), timeout)

    def dpub(
        self, topic: str, delay: float, body: bytes | str, timeout: float | None = None
    ) -> None:
        """Publish one message delivered after ``delay`` seconds (DPUB)."""
        self._thread.run(self._producer.dpub(topic, delay, body), timeout)

    def close(self) -> None:
        """Wait for publishes in flight, close the connections and stop the thread."""
        if self._thread.loop.is_closed():
            return
        try:
            self._thread.run(self._producer.close())
        finally:
            self._thread.stop()


class BlockingConsumer:
    """:class:`~nsqpy.client.Consumer` for synchronous code, pull style::

        with BlockingConsumer("events", "spark", nsqd_tcp_addresses=["127.0.0.1:4150"],
                              max_in_flight=1000) as consumer:
            while True:
                batch = consumer.get_batch(1000, timeout=1.0)
                process(batch)
                consumer.finish(batch)        # one hop to the event loop for the lot

    Messages are not finished automatically: respond to each with :meth:`finish` /
    :meth:`requeue` (batched) or the :class:`Message` methods (any thread). At most
    ``max_in_flight`` messages are out at once, so respond before asking for more.
    :meth:`run` is the push-style loop with automatic responses.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd_tcp_addresses: Sequence[str] = (),
        lookupd_http_addresses: Sequence[str] = (),
        on_give_up: GiveUpHandler | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self._cond = threading.Condition()
        self._buffer: deque[Message] = deque()
        self._closed = False
        self._consumer = Consumer(
            topic,
            channel,
            batch_handler=self._on_batch,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            on_give_up=on_give_up,
            **options,
        )
        self._thread = _LoopThread("nsqpy-consumer")
        self._started = False

    def __enter__(self) -> BlockingConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def start(self, timeout: float | None = None) -> None:
        """Connect (see :meth:`Consumer.start`); called by the first :meth:`get` too."""
        if not self._started:
            self._thread.run(self._consumer.start(), timeout)
            self._started = True

    def _on_batch(self, messages: list[Message]) -> None:
        # On the loop thread, from the connection's read callback.
        if self._closed:  # still in flight when close() began: give them back
            _respond_all(messages, False, 0.0)
            return
        for msg in messages:
            msg._auto = False
        with self._cond:
            self._buffer.extend(messages)
            self._cond.notify()

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever); None on
        timeout or once closed."""
        batch = self.get_batch(1, timeout)
        return batch[0] if batch else None

    def get_batch(
        self, max_messages: int | None = None, timeout: float | None = None
    ) -> list[Message]:
        """Up to ``max_messages`` messages (all buffered if None) as soon as there is one,
        waiting up to ``timeout`` seconds; an empty list on timeout or once closed."""
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._buffer and not self._closed:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._cond.wait(remaining)
            buf = self._buffer
            if max_messages is None or max_messages >= len(buf):
                out = list(buf)
                buf.clear()
                return out
            return [buf.popleft() for _ in range(max_messages)]

    def __iter__(self) -> Iterator[Message]:
        """Messages until :meth:`close` (from another thread) stops the consumer."""
        while not self._closed:
            msg = self.get()
            if msg is not None:
                yield msg

    def finish(self, messages: Iterable[Message]) -> None:
        """FIN every message, in one hop to the event loop."""
        self._thread.call(_respond_all, list(messages), True, None)

    def requeue(self, messages: Iterable[Message], delay: float | None = None) -> None:
        """REQ every message (``delay`` seconds, None: the default back-off-free delay)."""
        self._thread.call(_respond_all, list(messages), False, delay)

    def run(
        self,
        handler: Callable[[Message], object] | Callable[[list[Message]], object],
        *,
        batch: bool = False,
        max_batch: int | None = None,
    ) -> None:
        """Call ``handler`` for each message (or each batch with ``batch=True``) in this
        thread until :meth:`close`; finish on return, requeue (with back-off) on error."""
        while not self._closed:
            msgs = self.get_batch(max_batch if batch else 1, timeout=0.5)
            if not msgs:
                continue
            try:
                if batch:
                    handler(msgs)  # type: ignore[arg-type]
                else:
                    handler(msgs[0])  # type: ignore[arg-type]
            except Exception:
                self._thread.call(_requeue_failed, msgs)
            else:
                self.finish([m for m in msgs if not m._responded])

    def stats(self) -> ConsumerStats:
        """See :meth:`Consumer.stats`."""
        return self._consumer.stats()

    def close(self, timeout: float | None = None) -> None:
        """Stop: messages not handed out yet are requeued, messages handed out are waited
        for (up to ``close_timeout``), then the connections and the thread are closed."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            left = list(self._buffer)
            self._buffer.clear()
            self._cond.notify_all()
        try:
            if self._started:
                self._thread.call(_respond_all, left, False, 0.0)
                self._thread.run(self._consumer.close(), timeout)
        finally:
            self._thread.stop()


def _respond_all(messages: list[Message], finished: bool, delay: float | None) -> None:
    for msg in messages:
        if finished:
            msg.finish()
        else:
            msg.requeue(delay, backoff=False)


def _requeue_failed(messages: list[Message]) -> None:
    for msg in messages:
        if not msg._responded:
            msg.requeue()
