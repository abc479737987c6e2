"""nsqd's side of discovery: registration with every nsqlookupd (spec §4.2, §7.1).

Go's ``nsqd/lookup.go`` and ``nsqd/lookup_peer.go``. Each ``--lookupd-tcp-address``
gets a :class:`LookupPeer` that connects at start-up, sends the magic and
IDENTIFY, REGISTERs every topic (topic only when it has no channel, else once per
channel), PINGs every 15 s and forwards each topic/channel creation and deletion
as REGISTER/UNREGISTER.

Beyond Go, which notices a dead connection only when its next command fails and
reconnects on the command after (spec §11): a closed connection is seen at once
and the peer reconnects with exponential back-off, re-registering everything.
Events that happen while a peer is disconnected are not queued: the next
connection registers the state of that moment.

A topic created outside nsqd.dat loading asks the nsqlookupds' HTTP ``/channels``
for the topic's channels and creates the non-ephemeral ones before it starts (Go's
GetTopic blocks on that query): the topic is held (Topic.hold) meanwhile, and the
request that created it is answered once it has started (Topic.when_started), while
the event loop and other connections go on. The answer may come after this nsqd made
and deleted one of them, which then stays deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, cast

from nsqpy import NSQ_VERSION
from nsqpy.common.log import LogLevel
from nsqpy.common.net import split_host_port
from nsqpy.wire.names import is_ephemeral, is_valid_channel_name
from nsqpy.wire.v1 import (
    MAGIC_V1,
    LookupdInfo,
    ResponseError,
    ResponseParser,
    decode_identify_response,
    encode_identify,
    encode_ping,
    encode_register,
    encode_unregister,
)

if TYPE_CHECKING:
    import aiohttp  # imported when first used: it is slow to import

    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.server import NSQDServer
    from nsqpy.nsqd.topic import Topic

__all__ = ["LookupPeer", "LookupPeers"]

PING_INTERVAL: Final = 15.0
RECONNECT_MIN: Final = 0.1
RECONNECT_MAX: Final = 2.0


def _join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _command_text(cmd: bytes) -> str:
    # go-nsq's Command.String(): the line without its newline (and no body)
    return cmd.split(b"\n", 1)[0].decode("utf-8", "replace")


class _Connection(asyncio.Protocol):
    """One TCP connection to an nsqlookupd: commands out, replies matched in order.

    Every command waits at most ``timeout`` for its reply (Go's 1 s deadlines);
    a late reply or any protocol error aborts the connection.
    """

    def __init__(self, max_size: int, timeout: float) -> None:
        self.timeout = timeout
        self.parser = ResponseParser(max_size)
        self.transport: asyncio.Transport | None = None
        self.waiters: deque[tuple[asyncio.Future[bytes], asyncio.TimerHandle]] = deque()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            replies = self.parser.feed(data)
        except ResponseError as err:
            self.abort(err)
            return
        for reply in replies:
            if not self.waiters:
                self.abort(ResponseError(f"unexpected response {reply!r}"))
                return
            future, timer = self.waiters.popleft()
            timer.cancel()
            if not future.done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        error = self.error or exc or ConnectionError("connection closed by nsqlookupd")
        while self.waiters:
            future, timer = self.waiters.popleft()
            timer.cancel()
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: nobody may be waiting for this one
        if not self.lost.done():
            self.lost.set_result(None)

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("not connected")
        self.transport.write(data)

    def command(self, cmd: bytes) -> asyncio.Future[bytes]:
        """Send ``cmd``; the future gets its reply, or the error that ended the connection."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        if self.lost.done():
            future.set_exception(ConnectionError("connection closed"))
            return future
        self.write(cmd)
        timer = loop.call_later(self.timeout, self._timed_out, future)
        self.waiters.append((future, timer))
        return future

    def _timed_out(self, future: asyncio.Future[bytes]) -> None:
        if not future.done():
            self.abort(TimeoutError(f"no response within {self.timeout:g}s"))

    def abort(self, error: BaseException) -> None:
        self.error = self.error or error
        if self.transport is not None:
            self.transport.abort()


class LookupPeer:
    """One nsqlookupd, kept connected and registered (Go's ``lookupPeer``)."""

    def __init__(self, peers: LookupPeers, address: str) -> None:
        self.peers = peers
        self.address = address
        self.logger = peers.logger
        # What nsqlookupd said about itself at the last IDENTIFY (kept when disconnected)
        self.info: LookupdInfo | None = None
        self._conn: _Connection | None = None  # set while identified and registering
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._registered = False
        self._last_failure: str | None = None

    def __str__(self) -> str:
        return self.address

    @property
    def connected(self) -> bool:
        """Identified with nsqlookupd: events are being forwarded."""
        return self._conn is not None

    @property
    def first_attempt(self) -> bool:
        """The first connection to this nsqlookupd is under way (neither identified nor
        failed yet)."""
        return self.info is None and self._last_failure is None and not self._closing

    @property
    def http_address(self) -> str | None:
        """``broadcast_address:http_port`` from the IDENTIFY reply (Go's lookupdHTTPAddrs)."""
        if self.info is None or not self.info.broadcast_address:
            return None
        return _join_host_port(self.info.broadcast_address, self.info.http_port)

    def start(self) -> None:
        """Connect now, and again whenever the connection ends, until :meth:`close`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"lookupd-peer-{self.address}"
            )

    async def close(self) -> None:
        """Disconnect for good."""
        self._closing = True
        conn = self._conn
        self._conn = None
        if conn is not None and conn.transport is not None:
            conn.transport.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def send(self, cmd: bytes, branch: str) -> None:
        """Forward a REGISTER/UNREGISTER; dropped while disconnected (see the module doc)."""
        conn = self._conn
        if conn is None:
            return
        self.logger.info(f"LOOKUPD({self}): {branch} {_command_text(cmd)}")
        try:
            future = conn.command(cmd)
        except ConnectionError as err:
            self._log_command_error(cmd, err)
            return
        future.add_done_callback(lambda f: self._check_reply(cmd, f))

    def _check_reply(self, cmd: bytes, future: asyncio.Future[bytes]) -> None:
        if future.cancelled():
            return
        err = future.exception()
        if err is not None:
            self._log_command_error(cmd, err)
        elif future.result() != b"OK":
            reply = future.result().decode("utf-8", "replace")
            self.logger.error(f"LOOKUPD({self}): {_command_text(cmd)} - {reply}")

    def _log_command_error(self, cmd: bytes, err: BaseException) -> None:
        if not self._closing:
            self.logger.error(f"LOOKUPD({self}): {_command_text(cmd)} - {err}")

    # -- the connection loop ------------------------------------------------------------------

    async def _run(self) -> None:
        delay = RECONNECT_MIN
        while not self._closing:
            self._registered = False
            conn: _Connection | None = None
            try:
                conn = await self._connect()
                await self._session(conn)
            except (OSError, ResponseError, ValueError) as err:
                if not self._closing:
                    self._log_failure(str(err) or type(err).__name__)
            except Exception as err:  # a bug must not end the reconnecting
                self._log_failure(f"unexpected error - {err!r}")
            finally:
                self._conn = None
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
            if self._closing:
                break
            if self._registered:
                delay = RECONNECT_MIN  # it worked until now: try again at once
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX)

    def _log_failure(self, text: str) -> None:
        # The same failure again and again (nsqlookupd down) is logged once.
        if text != self._last_failure:
            self._last_failure = text
            self.logger.error(f"LOOKUPD({self}): {text}")
        else:
            self.logger.debug(f"LOOKUPD({self}): {text}")

    async def _connect(self) -> _Connection:
        opts = self.peers.opts
        host, port = split_host_port(self.address)
        # every attempt is logged until one fails; the retries after that are debug
        level = LogLevel.INFO if self._last_failure is None else LogLevel.DEBUG
        self.logger.log(level, f"LOOKUP connecting to {self.address}")
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(opts.max_body_size, opts.http_client_request_timeout),
                    host,
                    port,
                ),
                opts.http_client_connect_timeout,
            )
        except TimeoutError:
            raise TimeoutError(f"dial tcp {self.address}: i/o timeout") from None
        except OSError as err:
            reason = (err.strerror or str(err)).lower()
            raise OSError(f"dial tcp {self.address}: connect: {reason}") from None
        return conn

    async def _session(self, conn: _Connection) -> None:
        """Identify and register, then PING until the connection ends; raises on failures.

        ``_registered`` tells whether every registration was accepted: only then does
        the next connection attempt come without back-off.
        """
        conn.write(MAGIC_V1)
        identify = encode_identify(self.peers.identify_data())
        reply = await conn.command(identify)
        try:
            info = decode_identify_response(reply)
        except ResponseError as err:
            self.logger.error(f"LOOKUPD({self}): {err}")
            return
        self.info = info
        self.peers.identified.set()
        self.logger.info(f"LOOKUPD({self}): peer info {info}")
        if not info.broadcast_address:
            self.logger.error(f"LOOKUPD({self}): no broadcast address")
        # From here on, every engine event goes out after these registrations.
        self._conn = conn
        replies = []
        for cmd in self.peers.registrations():
            self.logger.info(f"LOOKUPD({self}): {_command_text(cmd)}")
            replies.append((cmd, conn.command(cmd)))
        registered = True
        for cmd, future in replies:
            if await future != b"OK":
                self._check_reply(cmd, future)
                registered = False
        self._registered = registered
        self._last_failure = None
        while not conn.lost.done():
            done, _ = await asyncio.wait((conn.lost,), timeout=PING_INTERVAL)
            if done:
                break
            self.logger.debug(f"LOOKUPD({self}): sending heartbeat")
            ping = encode_ping()
            reply = await conn.command(ping)
            if reply != b"OK":
                self.logger.error(f"LOOKUPD({self}): PING - {reply.decode('utf-8', 'replace')}")
        if conn.error is not None:
            raise ConnectionError(str(conn.error))
        if not self._closing:
            self._log_failure("connection closed by nsqlookupd, reconnecting")


class LookupPeers:
    """nsqd's connections to the ``--lookupd-tcp-address`` nsqlookupds (Go's lookupLoop)."""

    def __init__(self, server: NSQDServer) -> None:
        self.server = server
        self.opts = server.opts
        self.logger = server.logger
        self.hostname = socket.gethostname()
        self.peers: dict[str, LookupPeer] = {}
        self._addresses: list[str] = list(server.opts.lookupd_tcp_addresses)
        self._started = False
        self._http: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # new topics whose nsqlookupds are being asked for channels, with the channels
        # deleted here meanwhile: the late answer must not create those again
        self._deleted_while_asking: dict[Topic, set[str]] = {}
        # Set once any nsqlookupd has answered an IDENTIFY (its HTTP address is known).
        self.identified = asyncio.Event()
        # --workers (shards.py). In worker 0, the other workers' topics → channels, which it
        # registers for them; in the others, worker 0's answer to "which channels do the
        # nsqlookupds know of for this new topic" (they have no nsqlookupd connections).
        self.remote: dict[int, dict[str, set[str]]] = {}
        self.registers = True
        self.query_channels: Callable[[str], Awaitable[set[str]]] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to every nsqlookupd now and follow the engine's topic/channel events."""
        self._started = True
        self.server.nsqd.listeners.append(self._on_event)
        self._reconcile()

    async def stop(self) -> None:
        """Close every connection (nsqlookupd then forgets this nsqd's registrations)."""
        self._started = False
        with contextlib.suppress(ValueError):
            self.server.nsqd.listeners.remove(self._on_event)
        for task in list(self._tasks):
            task.cancel()
        peers = list(self.peers.values())
        self.peers.clear()
        await asyncio.gather(*(peer.close() for peer in peers))
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.logger.info("LOOKUP: closing")

    def set_addresses(self, addresses: list[str]) -> None:
        """PUT /config/nsqlookupd_tcp_addresses: drop peers no longer listed, add new ones."""
        self._addresses = list(addresses)
        self.opts.lookupd_tcp_addresses = list(addresses)
        if self._started:
            self._reconcile()

    def _reconcile(self) -> None:
        if not self.registers:
            return  # --workers: worker 0 registers for every worker
        wanted = list(dict.fromkeys(self._addresses))
        for address in list(self.peers):
            if address not in wanted:
                peer = self.peers.pop(address)
                self.logger.info(f"LOOKUP({address}): removing peer")
                self._spawn(peer.close())
        for address in wanted:
            if address not in self.peers:
                self.logger.info(f"LOOKUP({address}): adding peer")
                peer = LookupPeer(self, address)
                self.peers[address] = peer
                peer.start()

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what nsqd tells nsqlookupd -------------------------------------------------------------

    def identify_data(self) -> dict[str, Any]:
        """The IDENTIFY body: who this nsqd is, with its broadcast ports."""
        opts = self.opts
        return {
            "version": NSQ_VERSION,
            "tcp_port": opts.broadcast_tcp_port or self._listening_port(self.server.tcp_address),
            "http_port": opts.broadcast_http_port or self._http_port(),
            "hostname": self.hostname,
            "broadcast_address": opts.broadcast_address,
            "topology_zone": opts.topology_zone,
            "topology_region": opts.topology_region,
        }

    @staticmethod
    def _listening_port(address: str) -> int:
        # 0 for a unix socket, which nsqlookupd then refuses ("IDENTIFY missing fields")
        try:
            return split_host_port(address)[1]
        except ValueError:
            return 0

    def _http_port(self) -> int:
        http = self.server.http
        if http is None:
            return 0
        return max(http.port, 0)

    def registrations(self) -> list[bytes]:
        """REGISTER commands for everything this nsqd has: a topic without channels
        alone, else one per channel (which registers the topic too)."""
        commands: list[bytes] = []
        topics: list[tuple[str, Iterable[str]]] = [
            (topic.name, topic.channels) for topic in self.server.nsqd.topics.values()
        ]
        for remote in self.remote.values():
            topics.extend(remote.items())
        for name, channels in topics:
            if not channels:
                commands.append(encode_register(name))
            else:
                commands.extend(encode_register(name, channel) for channel in channels)
        return commands

    def _on_event(self, event: str, topic: Topic | None, channel: Channel | None) -> None:
        if channel is not None:
            if event == "channel_deleted":
                deleted = self._deleted_while_asking.get(topic) if topic is not None else None
                if deleted is not None:
                    deleted.add(channel.name)
            self.announce(event, channel.topic_name, channel.name)
        elif topic is not None:
            self.announce(event, topic.name, None)
        if event == "topic_created" and topic is not None:
            self._topic_created(topic)

    def announce(self, event: str, topic: str, channel: str | None) -> None:
        """Tell every nsqlookupd of a topic or channel created or deleted here."""
        if channel is not None:
            branch = "channel"
            if event == "channel_created":
                cmd = encode_register(topic, channel)
            else:
                cmd = encode_unregister(topic, channel)
        else:
            branch = "topic"
            created = event == "topic_created"
            cmd = encode_register(topic) if created else encode_unregister(topic)
        for peer in self.peers.values():
            peer.send(cmd, branch)

    def remote_event(self, worker: int, event: str, topic: str, channel: str | None) -> None:
        """--workers, in worker 0: another worker's topic or channel event."""
        topics = self.remote.setdefault(worker, {})
        if event == "topic_created":
            topics.setdefault(topic, set())
        elif event == "topic_deleted":
            topics.pop(topic, None)
        elif channel is not None and event == "channel_created":
            topics.setdefault(topic, set()).add(channel)
        elif channel is not None:
            topics.get(topic, set()).discard(channel)
        self.announce(event, topic, channel)

    def remote_sync(self, worker: int, topics: dict[str, set[str]]) -> None:
        """--workers, in worker 0: everything another worker has (at its start-up)."""
        old = self.remote.get(worker, {})
        self.remote[worker] = {}
        for name in old:
            if name not in topics:
                self.remote_event(worker, "topic_deleted", name, None)
        for name, channels in topics.items():
            self.remote_event(worker, "topic_created", name, None)
            for channel in channels:
                self.remote_event(worker, "channel_created", name, channel)

    # -- channels of a new topic ------------------------------------------------------------------

    def http_addresses(self) -> list[str]:
        """The nsqlookupds' HTTP addresses, from their IDENTIFY replies."""
        return [addr for peer in self.peers.values() if (addr := peer.http_address)]

    def _topic_created(self, topic: Topic) -> None:
        if self.server.nsqd.loading:
            return  # topics from nsqd.dat have their channels already
        if self.peers or (self.query_channels is not None and self.opts.lookupd_tcp_addresses):
            topic.hold()  # until the known channels exist, like Go's topic startChan
            self._deleted_while_asking[topic] = set()
            self._spawn(self._create_known_channels(topic))

    async def _create_known_channels(self, topic: Topic) -> None:
        """Create the topic's non-ephemeral channels that nsqlookupd knows of, so that they
        receive the topic's messages (Go's GetLookupdTopicChannels, then GetChannel).

        Right after start-up no nsqlookupd may have answered IDENTIFY yet: while a first
        connection is under way, wait for it for up to --http-client-connect-timeout (Go
        gives up at once). An nsqlookupd that could not be reached is not waited for.
        """
        try:
            await self._create_known_channels_held(topic)
        finally:
            self._deleted_while_asking.pop(topic, None)
            topic.release()

    async def _create_known_channels_held(self, topic: Topic) -> None:
        if self.query_channels is not None:
            names = await self.query_channels(topic.name)
        else:
            names = await self.known_channels(topic.name)
        nsqd = self.server.nsqd
        if nsqd.topics.get(topic.name) is not topic or topic.exiting:
            return  # deleted (or deleted and created again) meanwhile
        # Go asks before the topic is handed out, so its answer never holds a channel made
        # here since; this one may (our own REGISTER), and one deleted meanwhile stays so.
        names -= self._deleted_while_asking.get(topic, set())
        for name in sorted(names):
            if is_ephemeral(name):
                continue  # do not create an ephemeral channel with no consumer
            if is_valid_channel_name(name):
                topic.get_channel(name)

    async def known_channels(self, topic_name: str) -> set[str]:
        """The channels the nsqlookupds know of for ``topic_name`` (errors are logged)."""
        if not self.identified.is_set() and any(p.first_attempt for p in self.peers.values()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.identified.wait(), self.opts.http_client_connect_timeout
                )
        addresses = self.http_addresses()
        if not addresses:
            self.logger.error(
                f"no available nsqlookupd to query for channels to pre-create for topic {topic_name}"
            )
            return set()
        results = await asyncio.gather(
            *(self._get_channels(address, topic_name) for address in addresses),
            return_exceptions=True,
        )
        names: set[str] = set()
        errors: list[str] = []
        for address, result in zip(addresses, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(f"{address}: {result or type(result).__name__}")
            else:
                names.update(result)
        if errors:
            self.logger.warn(
                f"failed to query nsqlookupd for channels to pre-create for topic "
                f"{topic_name} - {'; '.join(errors)}"
            )
        return names

    async def _get_channels(self, address: str, topic_name: str) -> list[str]:
        """``GET http://<address>/channels?topic=<topic>`` (http_api.Client.GETV1)."""
        opts = self.opts
        if self._http is None:
            import aiohttp

            timeout = aiohttp.ClientTimeout(
                total=opts.http_client_request_timeout,
                sock_connect=opts.http_client_connect_timeout,
            )
            self._http = aiohttp.ClientSession(timeout=timeout)
        async with self._http.get(
            f"http://{address}/channels",
            params={"topic": topic_name},
            headers={"Accept": "application/vnd.nsq; version=1.0"},
        ) as response:
            body = await response.read()
            if response.status != 200:
                raise ValueError(f"got response {response.status} {body!r}")
        data = json.loads(body)
        channels = data.get("channels") if isinstance(data, dict) else None
        if not isinstance(channels, list):
            raise ValueError(f"unexpected response {body!r}")
        return [name for name in channels if isinstance(name, str)]
