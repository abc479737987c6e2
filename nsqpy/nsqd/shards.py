"""``--workers N``: one nsqd as N processes, each owning a share of the topics (docs/SCALING.md).

Every worker runs the whole nsqd (engine, TCP and HTTP) on the listening sockets it
inherited from the supervisor (workers.py), and owns the topics whose name hashes to its
index (:func:`owner_of`). A topic exists only in its owner, so NSQ's semantics hold as
they are: a topic's messages reach all its channels, a channel's consumers are all in one
process. What arrives at another worker goes to the owner:

* a plain TCP connection that subscribes or publishes to a topic owned elsewhere *moves*
  there: its socket is passed with ``SCM_RIGHTS``, with the connection's state and the
  bytes read but not handled, and the owner goes on with it as if it had accepted it;
* a connection that cannot move (TLS, compressed, already subscribed here) has its
  publishes forwarded (the owner publishes through :meth:`NSQD.publish`, the one entry)
  and, for a ``SUB``, is relayed: the worker keeps the TLS/compression and passes the
  plain protocol through a socket pair that moves to the owner;
* an HTTP request about one topic is answered by its owner's router; ``/stats``,
  ``/metrics`` and ``/ping`` gather every worker's; ``PUT /config`` reaches them all.

Worker 0 also speaks for the node: it alone registers with the nsqlookupds (the others
tell it of their topics and channels) and writes the files the workers share
(``nsqd.dat``, the policies), from each worker's part.

The workers talk over a mesh of unix stream sockets (:class:`Link`): length-prefixed
pickled frames, file descriptors alongside. Nothing here runs unless ``--workers`` > 1.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import os
import pickle
import socket
import struct
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from nsqpy.common.log import Logger

__all__ = ["Link", "RemoteError", "Shards", "owner_of"]

_LEN = struct.Struct(">I")
_MAX_FDS = 4
_SOCK_BUFFER = 4 << 20


def owner_of(topic: str, workers: int) -> int:
    """The worker that owns ``topic``: stable across restarts for the same ``workers``."""
    if workers <= 1:
        return 0
    return zlib.crc32(topic.encode("utf-8", "surrogateescape")) % workers


class RemoteError(Exception):
    """A request another worker failed: ``kind`` names the exception it raised there."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text


class Link:
    """One end of the unix stream socket between two workers: framed messages, each
    optionally carrying file descriptors (which travel with the frame's first byte)."""

    def __init__(
        self,
        sock: socket.socket,
        on_frame: Callable[[Any, list[int]], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.sock = sock
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCK_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCK_BUFFER)
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._in = bytearray()
        self._fds: deque[int] = deque()
        # frames to send, in order: (bytes, fds to pass with the first byte and then close)
        self._out: deque[tuple[memoryview, list[int]]] = deque()
        self._loop = asyncio.get_running_loop()
        self._writing = False
        self.closed = False
        self._loop.add_reader(sock.fileno(), self._readable)

    def send(self, message: Any, fds: list[int] | None = None) -> None:
        """Queue ``message`` (pickled); ``fds`` are closed here once they are sent."""
        if self.closed:
            for fd in fds or ():
                os.close(fd)
            raise ConnectionError("worker link closed")
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        self._out.append((memoryview(_LEN.pack(len(data)) + data), fds or []))
        if not self._writing:
            self._writable()

    def _writable(self) -> None:
        out = self._out
        try:
            while out:
                data, fds = out[0]
                if fds:
                    sent = self.sock.sendmsg(
                        [data],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
                    )
                    for fd in fds:
                        os.close(fd)
                    fds.clear()
                else:
                    sent = self.sock.send(data)
                if sent < len(data):
                    out[0] = (data[sent:], fds)
                    break
                out.popleft()
        except BlockingIOError:
            pass
        except OSError:
            self._lost()
            return
        if out and not self._writing:
            self._writing = True
            self._loop.add_writer(self.sock.fileno(), self._writable)
        elif not out and self._writing:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        try:
            data, ancdata, _, _ = self.sock.recvmsg(
                1 << 18, socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancdata = b"", []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                passed = array.array("i")
                passed.frombytes(payload[: len(payload) - len(payload) % passed.itemsize])
                self._fds.extend(passed)
        if not data:
            self._lost()
            return
        buf = self._in
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if len(buf) - pos - 4 < size:
                break
            message = pickle.loads(memoryview(buf)[pos + 4 : pos + 4 + size])
            pos += 4 + size
            count = message[-1] if message[0] == "fds" else 0
            fds = [self._fds.popleft() for _ in range(min(count, len(self._fds)))]
            self._on_frame(message, fds)
        del buf[:pos]

    def _lost(self) -> None:
        if self.closed:
            return
        self.close()
        self._on_lost()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self.sock.fileno())
        if self._writing:
            with contextlib.suppress(Exception):
                self._loop.remove_writer(self.sock.fileno())
        self.sock.close()
        while self._fds:
            os.close(self._fds.popleft())


Handler = Callable[..., Any]


class Shards:
    """This worker's view of the others: who owns what, requests to them, and the
    handlers they call here."""

    def __init__(self, index: int, count: int, sockets: dict[int, socket.socket], logger: Logger):
        self.index = index
        self.count = count
        self.logger = logger
        self._sockets = sockets
        self.links: dict[int, Link] = {}
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        self.handlers: dict[str, Handler] = {}
        # ("fds", op, args..., count): a frame whose file descriptors a handler takes
        self.fd_handlers: dict[str, Callable[..., None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closing = False
        self._gone: set[int] = set()  # workers that said they are exiting
        self.handlers["bye"] = self._gone.add

    def start(self) -> None:
        for peer, sock in self._sockets.items():
            self.links[peer] = self._link(peer, sock)

    def _link(self, peer: int, sock: socket.socket) -> Link:
        def on_frame(message: Any, fds: list[int]) -> None:
            self._on_frame(peer, message, fds)

        return Link(sock, on_frame, lambda: self._on_lost(peer))

    def close(self) -> None:
        self.closing = True
        for peer in self.links:
            self.tell(peer, "bye", self.index)  # (before the link closes: not a crash)
        for link in self.links.values():
            link.close()
        for _, future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("nsqd worker exiting"))
        self._waiting.clear()

    def owns(self, topic: str) -> bool:
        return owner_of(topic, self.count) == self.index

    def owner(self, topic: str) -> int:
        return owner_of(topic, self.count)

    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]

    # -- requests ---------------------------------------------------------------------------

    def call(self, peer: int, op: str, *args: Any) -> asyncio.Future[Any]:
        """Run the handler ``op`` in worker ``peer``; its result, or RemoteError."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        request_id = next(self._ids)
        self._waiting[request_id] = (peer, future)
        try:
            self.links[peer].send(("req", request_id, op, args))
        except ConnectionError as err:
            del self._waiting[request_id]
            future.set_exception(err)
        return future

    def tell(self, peer: int, op: str, *args: Any) -> None:
        """Run the handler ``op`` in worker ``peer``, with no reply (in order with calls)."""
        link = self.links.get(peer)
        if link is not None and not link.closed:
            link.send(("tell", op, args))

    def send_fds(self, peer: int, op: str, fds: list[int], *args: Any) -> None:
        """Hand ``fds`` (closed here) to worker ``peer``'s fd handler ``op``."""
        self.links[peer].send(("fds", op, args, len(fds)), fds)

    async def gather(self, op: str, *args: Any) -> list[Any]:
        """``op`` run in every worker (this one first, here), in worker order."""
        local = self.handlers[op](*args)
        if asyncio.iscoroutine(local):
            local = await local
        results: list[Any] = [None] * self.count
        results[self.index] = local
        futures = {peer: self.call(peer, op, *args) for peer in self.others()}
        for peer, future in futures.items():
            results[peer] = await future
        return results

    def _on_frame(self, peer: int, message: Any, fds: list[int]) -> None:
        kind = message[0]
        if kind == "rep":
            _, request_id, ok, value = message
            _, future = self._waiting.pop(request_id, (peer, None))
            if future is not None and not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(RemoteError(*value))
        elif kind == "req":
            _, request_id, op, args = message
            self._spawn(self._answer(peer, request_id, op, args))
        elif kind == "tell":
            _, op, args = message
            self._run(op, args)
        elif kind == "fds":
            _, op, args, _count = message
            try:
                self.fd_handlers[op](fds, *args)
            except Exception as err:  # never leak what was handed over
                self.logger.error(f"WORKER: failed to take over {op} - {err!r}")
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _run(self, op: str, args: tuple[Any, ...]) -> None:
        try:
            result = self.handlers[op](*args)
            if asyncio.iscoroutine(result):
                self._spawn(result)
        except Exception as err:
            self.logger.error(f"WORKER: {op} failed - {err!r}")

    async def _answer(self, peer: int, request_id: int, op: str, args: tuple[Any, ...]) -> None:
        try:
            result = self.handlers[op](*args)
            if isinstance(result, Awaitable):
                result = await result
            reply: tuple[Any, ...] = ("rep", request_id, True, result)
        except Exception as err:
            reply = ("rep", request_id, False, (type(err).__name__, str(err)))
        link = self.links.get(peer)
        if link is not None and not link.closed:
            link.send(reply)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_lost(self, peer: int) -> None:
        if not self.closing and peer not in self._gone:
            self.logger.error(f"WORKER({self.index}): lost worker {peer}")
        for request_id, (to, future) in list(self._waiting.items()):
            if to != peer:
                continue
            if not future.done():
                future.set_exception(ConnectionError(f"nsqd worker {peer} is gone"))
            del self._waiting[request_id]
