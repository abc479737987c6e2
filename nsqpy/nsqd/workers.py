"""``--workers N``: the supervisor that starts N worker processes, and what ties each
worker's nsqd to the others (the design: docs/SCALING.md; the wire between them:
shards.py).

The supervisor does, once, what one nsqd does before it serves: the data directory lock,
the TLS configuration, reading ``nsqd.dat`` and the deferred side file and writing
``nsqd.dat`` back (so every start-up fault is the one ``FATAL:`` line it always is), and
opening the listeners. Then it forks the workers, which inherit the listening sockets, the
metadata it read and a socket to each other worker; it passes SIGTERM/SIGINT on to them and
exits once they all have. A worker that dies takes the others down with it (exit 1), so
that whatever supervises nsqd restarts it whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nsqpy.common.aio import event_loop_factory
from nsqpy.common.app import ListenError
from nsqpy.common.log import Logger
from nsqpy.common.net import format_address, is_unix_address, split_host_port
from nsqpy.nsqd import metadata
from nsqpy.nsqd.backend import BackendError
from nsqpy.nsqd.message import GUIDFactory
from nsqpy.nsqd.metadata import DataDirLock, MetadataError, TopicMeta
from nsqpy.nsqd.policy import POLICY_FILE
from nsqpy.nsqd.shards import Shards, owner_of
from nsqpy.nsqd.tls import TLSConfigError, build_tls_context
from nsqpy.nsqd.topic import InvalidNameError

if TYPE_CHECKING:
    from nsqpy.common.httpserver import Request, Response
    from nsqpy.nsqd.options import Options
    from nsqpy.nsqd.server import NSQDServer
    from nsqpy.nsqd.stats import Stats

__all__ = ["WorkerSetup", "attach", "run_workers"]


@dataclass
class WorkerSetup:
    """What a worker inherits from the supervisor."""

    index: int
    count: int
    links: dict[int, socket.socket]
    tcp: socket.socket
    http: socket.socket | None
    https: socket.socket | None
    topics: list[TopicMeta] | None
    due: dict[str, dict[str, int]]
    ready_fd: int
    extra: dict[str, Any] = field(default_factory=dict)


# -- the supervisor ----------------------------------------------------------------------------


def _listen(address: str) -> socket.socket:
    """A listening socket on ``address`` (``host:port`` or a unix socket path), as the
    single-process nsqd's asyncio listener would open it; raises ListenError."""
    try:
        if is_unix_address(address):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(address)
        else:
            host, port = split_host_port(address)
            family, kind, proto, _, sockaddr = socket.getaddrinfo(
                host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
        sock.listen(1024)
    except OSError as err:
        raise ListenError(address, err) from None
    return sock


def run_workers(opts: Options, logger: Logger) -> int:
    """The supervisor's main: its exit status."""
    data_path = opts.data_path or os.getcwd()
    lock = DataDirLock(data_path)
    try:  # Go's nsqd.New: the data dir lock, then the TLS config
        lock.lock()
        build_tls_context(opts)
    except (MetadataError, TLSConfigError) as err:
        logger.fatal(f"failed to instantiate nsqd - {err}")
        return 1
    try:
        topics = metadata.read_metadata(data_path)
        due = metadata.read_deferred(data_path)
    except MetadataError as err:
        logger.fatal(f"failed to load metadata - {err}")
        return 1
    try:
        path = os.path.join(data_path, metadata.METADATA_FILE)
        logger.info(f"NSQ: persisting topic/channel metadata to {path}")
        metadata.write_metadata(data_path, topics or [])
        metadata.remove_deferred(data_path)  # the workers keep the due times in memory
    except OSError as err:
        logger.fatal(f"failed to persist metadata - {err}")
        return 1
    try:
        tcp = _listen(opts.tcp_address)
        https = _listen(opts.https_address) if opts.https_address and opts.tls_cert else None
        http = _listen(opts.http_address) if opts.http_address else None
    except ListenError as err:
        logger.fatal(f"failed to instantiate nsqd - {err}")
        return 1
    # what one nsqd logs once it listens, logged once every worker serves
    listening = [
        f"{name}: listening on {format_address(sock.getsockname())}"
        for name, sock in (("HTTPS", https), ("HTTP", http), ("TCP", tcp))
        if sock is not None
    ]
    count = opts.workers
    pairs = {(i, j): socket.socketpair() for i in range(count) for j in range(i + 1, count)}
    ready_r, ready_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    supervisor = os.getpid()
    for index in range(count):
        pid = os.fork()
        if pid == 0:  # the worker
            _die_with(supervisor)
            os.close(ready_r)
            links: dict[int, socket.socket] = {}
            for (i, j), (a, b) in pairs.items():
                if i == index:
                    links[j] = a
                    b.close()
                elif j == index:
                    links[i] = b
                    a.close()
                else:
                    a.close()
                    b.close()
            setup = WorkerSetup(index, count, links, tcp, http, https, topics, due, ready_w)
            os._exit(_run_worker(opts, logger, setup))
        pids[pid] = index
    for a, b in pairs.values():
        a.close()
        b.close()
    os.close(ready_w)
    for sock in (tcp, http, https):
        if sock is not None:
            sock.close()
    code = _supervise(pids, ready_r, logger, listening)
    lock.unlock()
    return code


def _die_with(supervisor: int) -> None:
    """A worker gets SIGKILL when the supervisor dies (kill -9 of nsqd kills it whole)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != supervisor:  # it died before that
        os._exit(1)


def _run_worker(opts: Options, logger: Logger, setup: WorkerSetup) -> int:
    from nsqpy.nsqd.app import serve

    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(serve(opts, logger, worker=setup))
    except BaseException as err:  # never return into the supervisor's code
        logger.fatal(f"worker {setup.index} failed - {err!r}")
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _supervise(pids: dict[int, int], ready_fd: int, logger: Logger, listening: list[str]) -> int:
    """Wait for every worker; pass SIGTERM/SIGINT on; one that dies stops the rest."""
    live = dict(pids)
    stopping = False

    def forward(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    ready = 0
    while live:
        if ready < len(pids) and ready_fd >= 0:
            readable, _, _ = select.select([ready_fd], [], [], 0.2)
            if readable:
                got = os.read(ready_fd, 64)
                ready += len(got)
                if ready == len(pids):
                    for line in listening:
                        logger.info(line)
                if not got:
                    os.close(ready_fd)
                    ready_fd = -1
            pid, status = os.waitpid(-1, os.WNOHANG)
        else:
            pid, status = os.waitpid(-1, 0)
        if pid == 0:
            continue
        index = live.pop(pid, None)
        if index is None:
            continue
        exit_code = os.waitstatus_to_exitcode(status)
        if exit_code != 0 or not stopping:
            code = 1
            if not stopping:
                logger.error(f"worker {index} exited ({exit_code}): stopping the others")
                stopping = True
                for other in live:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(other, signal.SIGTERM)
    if ready_fd >= 0:
        os.close(ready_fd)
    return code


# -- a worker's ties to the others ---------------------------------------------------------------


def attach(server: NSQDServer, setup: WorkerSetup) -> Shards:
    """Make ``server`` worker ``setup.index`` of ``setup.count`` (before it loads nsqd.dat)."""
    shards = Shards(setup.index, setup.count, setup.links, server.logger)
    nsqd = server.nsqd
    nsqd.shards = shards
    nsqd.deferred_name = metadata.deferred_file(setup.index)
    # Message IDs are unique per topic and node (Go's guid.go); a worker's topic may take in
    # another worker's message (a dead letter), so each worker has its own node ID bits.
    nsqd.ids = GUIDFactory((server.opts.node_id + setup.index) % 1024)
    from nsqpy.nsqd.protocol_v2 import number_clients

    number_clients(setup.index + 1, setup.count)

    def forward_publish(
        topic: str, bodies: Any, delay: float, timestamps: list[int] | None
    ) -> None:
        shards.tell(shards.owner(topic), "publish_nowait", topic, list(bodies), delay, timestamps)

    nsqd.forward_publish = forward_publish
    handlers = shards.handlers
    handlers["publish"] = lambda *args: _publish(server, *args)
    handlers["publish_nowait"] = lambda *args: _publish_nowait(server, *args)
    handlers["stats"] = lambda *args: _local_stats(server, *args)
    handlers["create_topic"] = lambda name: _create_topic(server, name)
    handlers["http"] = lambda *args: _http(server, *args)
    shards.fd_handlers["adopt"] = lambda fds, *args: _adopt(server, fds, *args)
    if setup.index == 0:
        _speak_for_the_node(server, shards, setup)
    else:
        nsqd.metadata_sink = lambda topics: shards.tell(0, "metadata", setup.index, topics)
        nsqd.policy_sink = lambda data: shards.tell(0, "policies", setup.index, data)
    return shards


def tie_lookup(server: NSQDServer, setup: WorkerSetup) -> None:
    """Before the nsqlookupd connections start: worker 0 registers the other workers'
    topics too; the others register nothing and ask worker 0 for a new topic's channels."""
    lookup = server.lookup
    assert lookup is not None
    shards = nsqd_shards(server)
    if setup.index == 0:
        lookup.remote = setup.extra.pop("remote_channels", {})
        return
    lookup.registers = False
    lookup.query_channels = lambda name: _query_channels(shards, name)

    def tell_worker0(event: str, topic: Any, channel: Any) -> None:
        shards.tell(
            0,
            "lookup_event",
            setup.index,
            event,
            topic.name if topic is not None else channel.topic_name,
            channel.name if channel is not None else None,
        )

    server.nsqd.listeners.append(tell_worker0)


def after_start(server: NSQDServer, setup: WorkerSetup) -> None:
    """Once serving: worker 0 learns what this one has; the supervisor that it is ready."""
    if setup.index != 0:
        mine = {t.name: set(t.channels) for t in server.nsqd.topics.values()}
        nsqd_shards(server).tell(0, "lookup_sync", setup.index, mine)
    os.write(setup.ready_fd, b"r")
    os.close(setup.ready_fd)


def nsqd_shards(server: NSQDServer) -> Shards:
    shards = server.nsqd.shards
    assert shards is not None
    return shards


async def _query_channels(shards: Shards, topic: str) -> set[str]:
    names: list[str] = await shards.call(0, "channels", topic)
    return set(names)


def _speak_for_the_node(server: NSQDServer, shards: Shards, setup: WorkerSetup) -> None:
    """Worker 0: nsqd.dat, the policies and the nsqlookupd registrations of every worker."""
    nsqd = server.nsqd
    meta: dict[int, list[TopicMeta]] = {i: [] for i in range(1, setup.count)}
    for topic in setup.topics or []:
        owner = owner_of(topic.name, setup.count)
        if owner != 0:
            meta[owner].append(topic)
    nsqd.remote_metadata = lambda: [t for part in meta.values() for t in part]
    remote_channels = {
        i: {t.name: {c.name for c in t.channels} for t in part} for i, part in meta.items()
    }
    setup.extra["remote_channels"] = remote_channels

    def metadata_part(worker: int, topics: list[TopicMeta]) -> None:
        meta[worker] = topics
        nsqd.persist_metadata()

    policies: dict[int, dict[str, Any]] = {i: {"topics": {}, "channels": {}} for i in meta}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(os.path.join(nsqd.data_path, POLICY_FILE), "rb") as f:
            raw = json.loads(f.read())
        for kind in ("topics", "channels"):
            for name, value in (raw.get(kind) or {}).items():
                owner = owner_of(str(name).partition(":")[0], setup.count)
                if owner != 0:
                    policies[owner][kind][name] = value

    def write_policies(own: dict[str, Any]) -> None:
        data: dict[str, Any] = {"version": 1, "topics": {}, "channels": {}}
        for part in [own, *policies.values()]:
            for kind in ("topics", "channels"):
                data[kind].update(part.get(kind) or {})
        for kind in ("topics", "channels"):
            data[kind] = dict(sorted(data[kind].items()))
        path = os.path.join(nsqd.data_path, POLICY_FILE)
        metadata.write_file_atomically(path, json.dumps(data, separators=(",", ":")).encode())

    def policies_part(worker: int, data: dict[str, Any]) -> None:
        policies[worker] = data
        try:
            nsqd.policies.save()
        except OSError as err:
            nsqd.logf_error(f"failed to persist policies - {err}")

    nsqd.policy_sink = write_policies
    handlers = shards.handlers
    handlers["metadata"] = metadata_part
    handlers["policies"] = policies_part

    def lookup_event(worker: int, event: str, topic: str, channel: str | None) -> None:
        if server.lookup is not None:
            server.lookup.remote_event(worker, event, topic, channel)

    def lookup_sync(worker: int, topics: dict[str, set[str]]) -> None:
        if server.lookup is not None:
            server.lookup.remote_sync(worker, topics)

    async def channels(topic: str) -> list[str]:
        if server.lookup is None or not server.lookup.peers:
            return []
        return sorted(await server.lookup.known_channels(topic))

    handlers["lookup_event"] = lookup_event
    handlers["lookup_sync"] = lookup_sync
    handlers["channels"] = channels


async def _publish(server: NSQDServer, topic: str, bodies: list[bytes], delay: float) -> int:
    """A publish another worker forwarded here: NSQD.publish, the one entry, with what a
    TCP connection adds (the disk write handed to the OS before the answer; with
    --sync-every=1, synced)."""
    from nsqpy.nsqd.protocol_v2 import until_started

    nsqd = server.nsqd
    count, starting = nsqd.publish(topic, bodies, delay)
    failed = nsqd.flush_touched()
    if failed is not None:
        raise BackendError(failed)
    if server.opts.sync_every == 1:
        await _synced(server)
    if starting is not None:
        await until_started(starting)
    return count


async def _synced(server: NSQDServer) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    errors: list[BaseException] = []
    pending = 0

    def one(err: BaseException | None) -> None:
        nonlocal pending
        pending -= 1
        if err is not None:
            errors.append(err)
        if pending <= 0 and not done.done():
            done.set_result(None)

    pending = server.nsqd.sync_touched(one)
    if pending:
        await done
    if errors:
        raise BackendError(str(errors[0]))


def _publish_nowait(
    server: NSQDServer,
    topic: str,
    bodies: list[bytes],
    delay: float,
    timestamps: list[int] | None,
) -> None:
    """A publish with no one waiting (a dead letter from another worker's channel)."""
    try:
        server.nsqd.publish(topic, bodies, delay, timestamps)
    except Exception as err:
        server.logger.error(f"TOPIC({topic}): failed to put message(s) - {err}")


def _create_topic(server: NSQDServer, name: str) -> None:
    """A topic another worker's connection made as Go makes it (an MPUB refused after its
    name was read)."""
    if not server.nsqd.exiting:
        with contextlib.suppress(InvalidNameError):
            server.nsqd.get_topic(name)


def _local_stats(
    server: NSQDServer, topic: str, channel: str, include_clients: bool
) -> tuple[Any, Any, str | None, int, dict[str, list[str]]]:
    """This worker's part of /stats: its topics, its connections that published, its
    health, how many connections it serves, and the dead-letter sources its channels name
    (a dead-letter topic may be another worker's)."""
    from nsqpy.nsqd.stats import client_stats, get_stats

    nsqd, clients = server.nsqd, server.clients
    stats = get_stats(nsqd, clients, topic, channel, include_clients)
    producers = stats["producers"]
    if topic and stats["topics"] is None and include_clients:  # (get_stats returned early)
        ordered = sorted(clients, key=lambda conn: conn.id)
        producers = [client_stats(conn, topic) for conn in ordered if conn.pub_counts]
    sources = {name: sorted(srcs) for name, srcs in nsqd.policies.sources.items() if srcs}
    return stats["topics"], producers, nsqd.health_error, len(clients), sources


async def _http(server: NSQDServer, *args: Any) -> tuple[int, bytes, dict[str, str], str | None]:
    assert server.http is not None
    response = await server.http.replayed(*args)
    return response.status, response.body, response.headers, response.reason


def _adopt(server: NSQDServer, fds: list[int], state: dict[str, Any], rest: bytes) -> None:
    """A connection another worker moved here (ClientV2._to_owner)."""
    sock = socket.socket(fileno=fds[0])
    for fd in fds[1:]:
        os.close(fd)
    client = server.new_client()
    client.moved_in(state, rest)
    loop = asyncio.get_running_loop()

    async def connect() -> None:
        try:
            await loop.connect_accepted_socket(lambda: client, sock)
        except OSError as err:
            server.logger.error(f"WORKER: failed to take over a connection - {err}")
            sock.close()

    task = loop.create_task(connect())
    server.background.add(task)
    task.add_done_callback(server.background.discard)


# -- HTTP ------------------------------------------------------------------------------------------


# The routes about one topic (its ``topic`` parameter), answered by the topic's owner, and
# how much of the body the owner's handler reads (None: none, which then is not read here
# either: with ``Expect: 100-continue`` a body is asked for only when the handler reads it).
def _topic_routes(opts: Options) -> dict[str, int | None]:
    routes: dict[str, int | None] = dict.fromkeys(
        (
            "/topic/create",
            "/topic/delete",
            "/topic/empty",
            "/topic/pause",
            "/topic/unpause",
            "/channel/create",
            "/channel/delete",
            "/channel/empty",
            "/channel/pause",
            "/channel/unpause",
            "/channel/peek",
        )
    )
    routes["/pub"] = opts.max_msg_size
    routes["/mpub"] = opts.max_body_size
    routes["/topic/policy"] = routes["/channel/policy"] = POLICY_BODY_LIMIT
    return routes


POLICY_BODY_LIMIT = 65536  # (http_api._policy's)


async def route_http(server: NSQDServer, request: Request) -> Response | None:
    """The answer from the worker that owns the request's topic, or from every worker for a
    ``PUT /config``; None when this worker answers alone (also whenever the answer does not
    depend on the topic's owner: no route or method, no valid topic name)."""
    from nsqpy.common.httpapi import HTTPError, ReqParams
    from nsqpy.wire.names import is_valid_topic_name

    shards = nsqd_shards(server)
    path = request.path
    assert server.http is not None
    routes = _topic_routes(server.opts)
    if path in routes:
        methods, _ = server.http.router.match(path)
        if methods is None or request.method not in methods:
            return None
        try:
            topic = ReqParams(request).get("topic")
        except HTTPError:
            return None
        if not topic or not is_valid_topic_name(topic) or shards.owns(topic):
            return None
        return await _forward(server, shards.owner(topic), request, routes[path])
    if request.method == "PUT" and path.startswith("/config/"):
        args = await _replay_args(server, request, server.opts.max_msg_size)
        response = await server.http.replayed(*args)
        if response.status == 200:
            for peer in shards.others():
                with contextlib.suppress(Exception):
                    await shards.call(peer, "http", *args)
        return response
    return None


async def _replay_args(server: NSQDServer, request: Request, limit: int | None) -> tuple[Any, ...]:
    """The request as another worker's replayed() takes it, with its body read here as the
    handler there reads it: up to ``limit`` (one byte more, as Go's LimitReader, so that
    the handler's own check answers 413), none with ``limit`` None or a Content-Length
    the handler refuses unread."""
    from nsqpy.common.httpapi import HTTPError
    from nsqpy.common.httpserver import BodyError, BodyTooLarge

    length = request.content_length
    body = b""
    if limit is not None and not (length is not None and length > limit):
        try:
            body = await request.read(limit)
        except BodyTooLarge:
            body = bytes(limit + 1)  # what the handler's read sees: more than its limit
        except BodyError:
            raise HTTPError(500, "INTERNAL_ERROR") from None
    return (
        request.method,
        request.raw_path,
        request.path,
        request.query_string,
        request.version,
        dict(request.headers.items()),
        body,
        length,
        request.secure,
        request.peername,
    )


async def _forward(server: NSQDServer, owner: int, request: Request, limit: int | None) -> Response:
    from nsqpy.common.httpapi import HTTPError, v1_error
    from nsqpy.common.httpserver import Response

    try:
        args = await _replay_args(server, request, limit)
        status, body, headers, reason = await nsqd_shards(server).call(owner, "http", *args)
    except HTTPError as err:
        return v1_error(err.status, err.text)
    except Exception as err:
        server.logger.error(f"WORKER: worker {owner} did not answer {request.raw_path} - {err}")
        return v1_error(503, "EXITING")
    return Response(status, body, headers, reason)


async def gather_stats(
    server: NSQDServer, topic: str, channel: str, include_clients: bool
) -> tuple[Stats, str, int]:
    """Every worker's get_stats, merged as one nsqd's: topics by name, producers by ID
    (every worker's connections publish to any topic); the health is the first worker's
    that is not OK."""
    parts = await nsqd_shards(server).gather("stats", topic, channel, include_clients)
    topics: list[Any] | None = None
    producers: list[Any] | None = None
    health = "OK"
    connections = 0
    sources: dict[str, set[str]] = {}
    for part_topics, part_producers, error, count, part_sources in parts:
        if part_topics is not None:
            topics = [*(topics or []), *part_topics]
        if part_producers:
            producers = [*(producers or []), *part_producers]
        if error and health == "OK":
            health = f"NOK - {error}"
        connections += count
        for name, names in part_sources.items():
            sources.setdefault(name, set()).update(names)
    if topics is not None:
        topics.sort(key=lambda t: str(t["topic_name"]))
        if sources:
            topics = [_with_sources(t, sources.get(t["topic_name"])) for t in topics]
    elif topic:
        producers = None  # Go returns early for a topic it does not have
    return {"topics": topics, "producers": producers}, health, connections


def _with_sources(topic: dict[str, Any], sources: set[str] | None) -> dict[str, Any]:
    """A topic's stats entry with the dead-letter sources of every worker's channels, where
    one worker's policy.stats_fields puts them (after the e2e latency)."""
    if not sources:
        return topic
    out: dict[str, Any] = {}
    for key, value in topic.items():
        if key != "dead_letter_sources":
            out[key] = value
        if key == "e2e_processing_latency":
            out["dead_letter_sources"] = sorted(sources)
    return out
