"""nsqd and nsqlookupd together (spec §4.2, §7.1, §7.4, §11): registration, its repair
after either side restarts, ephemeral keys, and channels pre-created from nsqlookupd.

Everything waits by polling nsqlookupd's HTTP API with a deadline, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nsqpy.common.log import Logger, LogLevel
from nsqpy.nsqd.options import Options as NSQDOptions
from nsqpy.nsqd.server import NSQDServer
from nsqpy.nsqlookupd.lookupd import NSQLookupd
from nsqpy.nsqlookupd.options import Options as LookupdOptions
from nsqpy.nsqlookupd.registration_db import Registration
from tests.e2e.test_nsqlookupd import LOOKUPD, get_json, http, lookup, reply, wait_until
from tests.support.procs import NSQD, ServerPool, ServerProcess
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def lookupd_pool(tmp_path: Path) -> Iterator[ServerPool]:
    pool = ServerPool(LOOKUPD, tmp_path / "lookupd")
    try:
        yield pool
    finally:
        pool.stop_all()


@dataclass
class Cluster:
    """Two nsqlookupds and an nsqd registered with both."""

    lookupd: ServerProcess
    other: ServerProcess
    nsqd: ServerProcess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Shared by the tests that neither kill nor restart anything (own topic names)."""
    base = tmp_path_factory.mktemp("cluster")
    lookupds = ServerPool(LOOKUPD, base / "lookupd")
    nsqds = ServerPool(NSQD, base / "nsqd")
    try:
        lookupd, other = lookupds.start(), lookupds.start()
        yield Cluster(lookupd, other, start_nsqd(nsqds, lookupd, other))
    finally:
        nsqds.stop_all()
        lookupds.stop_all()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return "".join(c if c.isalnum() else "_" for c in request.node.name)[:50]


def start_nsqd(pool: ServerPool, *lookupds: ServerProcess, **options: Any) -> ServerProcess:
    return pool.start(
        *(f"--lookupd-tcp-address={lookupd.tcp_address}" for lookupd in lookupds),
        broadcast_address="127.0.0.1",
        **options,
    )


def port(address: str | None) -> int:
    assert address is not None
    return int(address.rpartition(":")[2])


def producers(lookupd: ServerProcess, topic: str) -> list[dict[str, Any]]:
    resp = lookup(lookupd.http_address or "", topic)
    return list(resp.json()["producers"]) if resp.status == 200 else []


def producer_ports(lookupd: ServerProcess, topic: str) -> set[int]:
    """The broadcast TCP ports of the topic's producers (one per nsqd)."""
    return {p["tcp_port"] for p in producers(lookupd, topic)}


def channels(lookupd: ServerProcess, topic: str) -> list[str]:
    return sorted(get_json(lookupd.http_address or "", f"/channels?topic={topic}")["channels"])


def debug_ids(lookupd: ServerProcess, key: str) -> list[str]:
    return [entry["id"] for entry in get_json(lookupd.http_address or "", "/debug").get(key, [])]


def test_lookup_lists_every_producer_until_killed(
    lookupd_pool: ServerPool, nsqd_pool: ServerPool, topic: str
) -> None:
    lookupd = lookupd_pool.start(inactive_producer_timeout="1h")
    n1 = start_nsqd(nsqd_pool, lookupd)
    n2 = start_nsqd(
        nsqd_pool,
        lookupd,
        broadcast_tcp_port=14150,
        broadcast_http_port=14151,
        topology_zone="zone-a",
        topology_region="region-1",
    )
    for nsqd in (n1, n2):
        with RawClient(nsqd.tcp_address) as client:
            client.pub(topic, b"hello")
    wait_until(lambda: producer_ports(lookupd, topic) == {port(n1.tcp_address), 14150})
    by_port = {p["tcp_port"]: p for p in producers(lookupd, topic)}
    first = by_port[port(n1.tcp_address)]
    assert first["http_port"] == port(n1.http_address)
    assert first["broadcast_address"] == "127.0.0.1"
    assert first["hostname"] == socket.gethostname()
    assert first["version"] == "1.3.0"
    assert first["remote_address"].startswith("127.0.0.1:")
    second = by_port[14150]
    assert (second["http_port"], second["topology_zone"], second["topology_region"]) == (
        14151,
        "zone-a",
        "region-1",
    )

    nodes = get_json(lookupd.http_address or "", "/nodes")["producers"]
    assert sorted(n["tcp_port"] for n in nodes) == sorted([port(n1.tcp_address), 14150])
    assert all(n["topics"] == [topic] and n["tombstones"] == [False] for n in nodes)
    assert topic in get_json(lookupd.http_address or "", "/topics")["topics"]

    # a SIGKILLed nsqd's connection closes: it is gone from /lookup at once (spec §11)
    n1.kill()
    killed = time.monotonic()
    wait_until(
        lambda: producer_ports(lookupd, topic) == {14150}, timeout=2, what="killed nsqd gone"
    )
    assert time.monotonic() - killed < 2
    assert len(get_json(lookupd.http_address or "", "/nodes")["producers"]) == 1

    # PUT /config/nsqlookupd_tcp_addresses reconciles the peers live
    config = "/config/nsqlookupd_tcp_addresses"
    assert http(n2.http_address or "", "PUT", config, body=b"[]").status == 200
    wait_until(lambda: not producers(lookupd, topic), what="unregistered by PUT /config")
    body = json.dumps([lookupd.tcp_address]).encode()
    assert http(n2.http_address or "", "PUT", config, body=body).status == 200
    wait_until(lambda: producer_ports(lookupd, topic) == {14150}, what="registered by PUT /config")
    assert get_json(n2.http_address or "", config) == [lookupd.tcp_address]


def test_channels_and_deletions(cluster: Cluster, topic: str) -> None:
    lookupd, nsqd = cluster.lookupd, cluster.nsqd
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(topic, "c1")
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(topic, "c2")
    wait_until(lambda: channels(lookupd, topic) == ["c1", "c2"], what="channels registered")
    assert get_json(lookupd.http_address or "", f"/lookup?topic={topic}")["channels"] in (
        ["c1", "c2"],
        ["c2", "c1"],
    )
    assert len(debug_ids(lookupd, f"channel:{topic}:c1")) == 1

    # deleting on nsqd unregisters that producer; the keys stay (spec §11)
    api = nsqd.http_address or ""
    assert http(api, "POST", f"/channel/delete?topic={topic}&channel=c1").status == 200
    wait_until(lambda: not debug_ids(lookupd, f"channel:{topic}:c1"), what="channel unregistered")
    assert channels(lookupd, topic) == ["c1", "c2"]
    assert http(api, "POST", f"/topic/delete?topic={topic}").status == 200
    wait_until(lambda: not producers(lookupd, topic), what="topic unregistered")
    assert not debug_ids(lookupd, f"channel:{topic}:c2")
    assert get_json(lookupd.http_address or "", f"/lookup?topic={topic}")["producers"] == []


def test_nsqd_restart_registers_again(
    lookupd_pool: ServerPool, nsqd_pool: ServerPool, topic: str, tmp_path: Path
) -> None:
    lookupd = lookupd_pool.start()
    data_path = tmp_path / "restarted-nsqd"
    nsqd = nsqd_pool.start(
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        data_path=data_path,
        broadcast_address="127.0.0.1",
    )
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(topic, "durable")
    wait_until(lambda: debug_ids(lookupd, f"channel:{topic}:durable"))
    assert nsqd.stop() == 0
    wait_until(lambda: not producers(lookupd, topic), what="stopped nsqd gone")

    restarted = nsqd_pool.start(
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        data_path=data_path,
        broadcast_address="127.0.0.1",
    )
    # nsqd.dat brings the topic and channel back, and both are registered again
    wait_until(
        lambda: producer_ports(lookupd, topic) == {port(restarted.tcp_address)},
        what="restarted nsqd registered",
    )
    wait_until(lambda: debug_ids(lookupd, f"channel:{topic}:durable"), what="channel again")


def test_lookupd_restart_gets_everything_back(
    lookupd_pool: ServerPool, nsqd_pool: ServerPool, topic: str
) -> None:
    lookupd = lookupd_pool.start()
    nsqd = start_nsqd(nsqd_pool, lookupd)
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(topic, "c")
        with RawClient(nsqd.tcp_address) as producer:
            producer.pub(f"{topic}_alone", b"x")
        wait_until(lambda: debug_ids(lookupd, f"channel:{topic}:c"))
        wait_until(lambda: producers(lookupd, f"{topic}_alone"))
        lookupd.kill()

        restarted = lookupd_pool.start(
            f"--tcp-address={lookupd.tcp_address}", f"--http-address={lookupd.http_address}"
        )
        ready = time.monotonic()
        # nsqd saw the connection close and retries with back-off (at most 2 s apart)
        wait_until(
            lambda: producer_ports(restarted, topic) == {port(nsqd.tcp_address)},
            timeout=10,
            what="re-registered after a lookupd restart",
        )
        wait_until(lambda: debug_ids(restarted, f"channel:{topic}:c"))
        wait_until(lambda: producers(restarted, f"{topic}_alone"))
        assert time.monotonic() - ready < 5  # Go can take ~30 s (spec §11)


def test_ephemeral_keys_go_when_empty(cluster: Cluster, topic: str) -> None:
    lookupd, nsqd = cluster.lookupd, cluster.nsqd
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(topic, "keep")
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(topic, "tmp#ephemeral")
        wait_until(lambda: channels(lookupd, topic) == ["keep", "tmp#ephemeral"])
    # the last consumer left: nsqd deletes the channel, nsqlookupd drops the key
    wait_until(lambda: channels(lookupd, topic) == ["keep"], what="ephemeral channel key gone")

    eph = f"{topic}#ephemeral"
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(eph, "c#ephemeral")
        wait_until(lambda: lookup(lookupd.http_address or "", eph).status == 200)
    # its last (ephemeral) channel deleted → ephemeral topic deleted → both keys gone
    wait_until(
        lambda: lookup(lookupd.http_address or "", eph).status == 404,
        what="ephemeral topic key gone",
    )
    assert eph not in get_json(lookupd.http_address or "", "/topics")["topics"]


def test_new_topic_creates_channels_known_to_lookupd(cluster: Cluster, topic: str) -> None:
    lookupd, other, nsqd = cluster.lookupd, cluster.other, cluster.nsqd
    api = lookupd.http_address or ""
    for channel in ("known", "other#ephemeral"):
        resp = http(api, "POST", f"/channel/create?topic={topic}&channel={channel}")
        assert resp.status == 200
    resp = http(other.http_address or "", "POST", f"/channel/create?topic={topic}&channel=known2")
    assert resp.status == 200
    wait_until(lambda: len(get_json(api, "/nodes")["producers"]) == 1, what="nsqd identified")
    wait_until(
        lambda: len(get_json(other.http_address or "", "/nodes")["producers"]) == 1,
        what="nsqd identified with the second lookupd",
    )

    with RawClient(nsqd.tcp_address) as producer:
        producer.pub(topic, b"before any consumer")
    # both lookupds are asked; the union of their channels is created
    wait_until(lambda: debug_ids(lookupd, f"channel:{topic}:known"), what="known created")
    wait_until(lambda: debug_ids(other, f"channel:{topic}:known2"), what="known2 created")
    assert not debug_ids(lookupd, f"channel:{topic}:other#ephemeral")

    # the pre-created channel got the message published before anyone subscribed
    with RawClient(nsqd.tcp_address) as consumer:
        consumer.sub(topic, "known")
        consumer.rdy(1)
        assert consumer.read_message().body == b"before any consumer"


# -- in-process: nsqd's LookupPeers driven directly ----------------------------------------------


async def _poll(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        await asyncio.sleep(0.01)


def _has_producer(lookupd: NSQLookupd, topic: str) -> bool:
    return bool(lookupd.db.find_producers("topic", topic, ""))


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


async def _started_lookupd(logger: Logger) -> NSQLookupd:
    lookupd = NSQLookupd(
        LookupdOptions(
            tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="127.0.0.1"
        ),
        logger,
    )
    await lookupd.start()
    return lookupd


def _nsqd_options(tmp_path: Path, lookupd_address: str, **kw: Any) -> NSQDOptions:
    """An in-process nsqd on free ports that registers with ``lookupd_address``."""
    return NSQDOptions(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        https_address="",
        data_path=str(tmp_path),
        broadcast_address="127.0.0.1",
        lookupd_tcp_addresses=[lookupd_address],
        **kw,
    )


def test_in_process_peers(tmp_path: Path) -> None:
    """set_addresses (PUT /config/nsqlookupd_tcp_addresses) and an early topic, in one loop."""
    quiet = Logger("", LogLevel.FATAL)

    async def scenario() -> None:
        lookupds = [await _started_lookupd(quiet) for _ in range(2)]
        first, second = lookupds
        opts = _nsqd_options(tmp_path, first.tcp_address)
        server = NSQDServer(opts, quiet)
        first.db.add_registration(Registration("channel", "early", "known"))
        await server.start()
        try:
            assert server.lookup is not None
            # a topic created before any nsqlookupd answered IDENTIFY still gets its channels
            assert not server.lookup.http_addresses()
            early = server.nsqd.get_topic("early")
            await _poll(lambda: "known" in early.channels, "channel pre-created")
            server.nsqd.get_topic("t").get_channel("c")
            await _poll(lambda: _has_producer(first, "t"), "registered with the first")

            server.lookup.set_addresses([second.tcp_address])
            await _poll(lambda: not _has_producer(first, "t"), "dropped by the first")
            await _poll(lambda: _has_producer(second, "t"), "registered with the second")
            assert second.db.find_producers("channel", "t", "c")
            assert opts.lookupd_tcp_addresses == [second.tcp_address]

            # live events go to the current peers only
            server.nsqd.get_topic("t2")
            await _poll(lambda: _has_producer(second, "t2"), "new topic on the second")
            assert Registration("topic", "t2", "") not in first.db

            server.lookup.set_addresses([first.tcp_address, second.tcp_address])
            await _poll(lambda: _has_producer(first, "t2"), "both again")
            server.nsqd.delete_topic("t2")
            await _poll(
                lambda: not _has_producer(first, "t2") and not _has_producer(second, "t2"),
                "unregistered from both",
            )
        finally:
            await server.stop()
            for lookupd in lookupds:
                await lookupd.stop()

    _run(scenario)


def test_in_process_late_channel_list_does_not_bring_back_a_deleted_channel(
    tmp_path: Path,
) -> None:
    """A new topic asks nsqlookupd for its channels without blocking; when the answer
    comes after this nsqd made and deleted a channel (its own REGISTER is in the answer),
    that channel stays deleted, here and on nsqlookupd. Go asks before the topic exists."""
    quiet = Logger("", LogLevel.FATAL)

    async def scenario() -> None:
        lookupd = await _started_lookupd(quiet)
        route = lookupd.http.router.routes["/channels"]["GET"]
        answer, asked = asyncio.Event(), asyncio.Event()
        channels_of = route.handler

        async def late_channels(*args: Any) -> Any:
            asked.set()
            await answer.wait()
            return await channels_of(*args)

        object.__setattr__(route, "handler", late_channels)
        server = NSQDServer(_nsqd_options(tmp_path, lookupd.tcp_address), quiet)
        await server.start()
        try:
            assert server.lookup is not None
            await _poll(
                lambda: bool(server.lookup and server.lookup.http_addresses()), "identified"
            )
            topic = server.nsqd.get_topic("t")
            await asyncio.wait_for(asked.wait(), 5)
            for name in ("c1", "c2"):
                topic.get_channel(name)
            db = lookupd.db
            await _poll(
                lambda: (
                    bool(db.find_producers("channel", "t", "c1"))
                    and bool(db.find_producers("channel", "t", "c2"))
                ),
                "both registered",
            )
            topic.delete_channel("c1")
            await _poll(lambda: not db.find_producers("channel", "t", "c1"), "c1 unregistered")
            answer.set()  # the answer lists c1 and c2, as registered a moment ago
            await _poll(lambda: not topic.starting, "the answer applied")
            assert sorted(topic.channels) == ["c2"]
            assert not db.find_producers("channel", "t", "c1")
        finally:
            await server.stop()
            await lookupd.stop()

    _run(scenario)


def test_in_process_unhealthy_lookupd(tmp_path: Path) -> None:
    """A lookupd that does not answer, then refuses IDENTIFY, then works: nsqd keeps trying."""
    quiet = Logger("", LogLevel.FATAL)

    async def scenario() -> None:
        connections: list[bytes] = []
        registered = asyncio.Event()

        async def fake_lookupd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            attempt = len(connections)
            connections.append(b"")
            try:
                while data := await reader.read(65536):
                    connections[attempt] += data
                    if attempt == 0:
                        continue  # silent: nsqd must time out
                    if attempt == 1:
                        writer.write(reply("E_INVALID"))
                    elif b"IDENTIFY" in data:
                        info = (
                            b'{"tcp_port":1,"http_port":1,"version":"1.3.0","broadcast_address":""}'
                        )
                        writer.write(reply(info))
                        writer.write(reply("OK") * data.count(b"REGISTER"))
                    else:
                        writer.write(reply("OK") * data.count(b"\n"))
                    if b"REGISTER t " in connections[attempt]:
                        registered.set()
            finally:
                writer.close()

        fake = await asyncio.start_server(fake_lookupd, "127.0.0.1", 0)
        host, fake_port = fake.sockets[0].getsockname()[:2]
        opts = _nsqd_options(tmp_path, f"{host}:{fake_port}", http_client_request_timeout=0.2)
        server = NSQDServer(opts, quiet)
        await server.start()
        try:
            server.nsqd.get_topic("t").get_channel("c")
            await asyncio.wait_for(registered.wait(), 10)
            assert len(connections) >= 3
            assert connections[0].startswith(b"  V1IDENTIFY\n")
            assert b"REGISTER t c\n" in connections[-1]
        finally:
            await server.stop()
            fake.close()

    _run(scenario)


async def _pub_tcp(address: str, *commands: bytes) -> tuple[asyncio.StreamReader, Any]:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"  V2" + b"".join(commands))
    await writer.drain()
    return reader, writer


def _pub(topic: str, body: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + len(body).to_bytes(4, "big") + body


def _http_request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: nsqd\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _nothing_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return True
    raise AssertionError(f"answered before its channels exist: {data!r}")


FRAME_OK = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def test_in_process_new_topic_answers_after_its_known_channels_exist(tmp_path: Path) -> None:
    """With nsqlookupd, Go creates a new topic's known channels before it answers the request
    that created the topic (GetTopic blocks on the query): a TCP PUB, a SUB, HTTP /pub and
    /topic/create each answer only once nsqlookupd's answer is applied, with the commands
    pipelined behind them; other connections, and publishes to the topic from them, go on.
    A channel registered on nsqlookupd after the answer is not created here."""
    quiet = Logger("", LogLevel.FATAL)

    async def scenario() -> None:
        lookupd = await _started_lookupd(quiet)
        route = lookupd.http.router.routes["/channels"]["GET"]
        answer = asyncio.Event()
        asked: list[str] = []
        channels_of = route.handler

        async def held_channels(request: Any, *args: Any) -> Any:
            asked.append(request.query_string)
            await answer.wait()
            return await channels_of(request, *args)

        object.__setattr__(route, "handler", held_channels)
        for topic in ("t", "s", "h", "c"):
            lookupd.db.add_registration(Registration("channel", topic, "known"))
        lookupd.db.add_registration(Registration("channel", "t", "gone#ephemeral"))
        server = NSQDServer(_nsqd_options(tmp_path, lookupd.tcp_address), quiet)
        await server.start()
        assert server.lookup is not None and server.http is not None
        http_address = f"127.0.0.1:{server.http.port}"
        try:
            await _poll(
                lambda: bool(server.lookup and server.lookup.http_addresses()), "identified"
            )
            # the creating requests, each with something pipelined behind it
            pub, pub_w = await _pub_tcp(
                server.tcp_address, _pub("t", b"1"), b"NOP\n", _pub("t", b"2")
            )
            sub, sub_w = await _pub_tcp(server.tcp_address, b"SUB s known\nRDY 5\n")
            h_host, _, h_port = http_address.rpartition(":")
            http_pub, http_w = await asyncio.open_connection(h_host, int(h_port))
            http_w.write(_http_request("POST", "/pub?topic=h", b"x"))
            http_create, create_w = await asyncio.open_connection(h_host, int(h_port))
            create_w.write(_http_request("POST", "/topic/create?topic=c"))
            await _poll(lambda: len(asked) == 4, "every new topic asked nsqlookupd")
            # another connection's publish to the starting topic is answered at once
            other, other_w = await _pub_tcp(server.tcp_address, _pub("t", b"3"))
            assert await asyncio.wait_for(other.readexactly(10), 5) == FRAME_OK
            for reader in (pub, sub, http_pub, http_create):
                assert await _nothing_within(reader, 0.3)
            answer.set()
            assert await asyncio.wait_for(pub.readexactly(20), 5) == FRAME_OK * 2
            assert await asyncio.wait_for(sub.readexactly(10), 5) == FRAME_OK
            for reader in (http_pub, http_create):
                status = await asyncio.wait_for(reader.readline(), 5)
                assert status == b"HTTP/1.1 200 OK\r\n"
            # registered elsewhere after the answer: not created here
            lookupd.db.add_registration(Registration("channel", "t", "late"))
            await _poll(lambda: server.nsqd.topics["t"].channels["known"].depth == 3, "pumped")
            for name in ("t", "s", "h", "c"):
                assert sorted(server.nsqd.topics[name].channels) == ["known"], name
            assert server.nsqd.topics["h"].channels["known"].depth == 1
            for writer in (pub_w, sub_w, http_w, create_w, other_w):
                writer.close()
        finally:
            await server.stop()
            await lookupd.stop()

    _run(scenario)


def test_in_process_unreachable_lookupd_does_not_hold_a_new_topic(tmp_path: Path) -> None:
    """An nsqlookupd that cannot be reached is not waited for: a new topic's PUB is answered
    at once (Go has no nsqlookupd HTTP address to ask, and logs that)."""
    quiet = Logger("", LogLevel.FATAL)

    async def scenario() -> None:
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        opts = _nsqd_options(tmp_path, address, http_client_connect_timeout=30.0)
        server = NSQDServer(opts, quiet)
        await server.start()
        try:
            peer = next(iter(server.lookup.peers.values())) if server.lookup else None
            assert peer is not None
            await _poll(lambda: not peer.first_attempt, "the first connection failed")
            pub, writer = await _pub_tcp(server.tcp_address, _pub("fresh", b"x"))
            assert await asyncio.wait_for(pub.readexactly(10), 5) == FRAME_OK
            writer.close()
        finally:
            await server.stop()
            closed.close()

    _run(scenario)


def test_in_process_an_empty_topic_name_is_refused_everywhere(tmp_path: Path) -> None:
    """PUB and one-message MPUB to topic "" (the fast parse's case), then /pub?topic=: Go's
    errors, no topic "" is made, and the node stays registered with nsqlookupd (a REGISTER
    of "" would make nsqlookupd drop it)."""
    quiet = Logger("", LogLevel.FATAL)

    async def scenario() -> None:
        lookupd = await _started_lookupd(quiet)
        server = NSQDServer(_nsqd_options(tmp_path, lookupd.tcp_address), quiet)
        await server.start()
        assert server.http is not None
        try:
            await _poll(
                lambda: bool(server.lookup and server.lookup.http_addresses()), "identified"
            )
            mpub = b"MPUB \n" + (9).to_bytes(4, "big") + (1).to_bytes(4, "big")
            mpub += (1).to_bytes(4, "big") + b"x"
            for command, error in (
                (_pub("", b"x"), b'E_BAD_TOPIC PUB topic name "" is not valid'),
                (mpub, b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "" is not valid'),
            ):
                reader, writer = await _pub_tcp(server.tcp_address, command)
                frame = await asyncio.wait_for(reader.read(), 5)  # then the connection closes
                assert frame[8:] == error
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", server.http.port)
            writer.write(_http_request("POST", "/pub?topic=", b"x"))
            assert await asyncio.wait_for(reader.readline(), 5) == b"HTTP/1.1 400 Bad Request\r\n"
            writer.close()
            assert "" not in server.nsqd.topics
            server.nsqd.get_topic("after")
            await _poll(lambda: _has_producer(lookupd, "after"), "a later topic registered")
        finally:
            await server.stop()
            await lookupd.stop()

    _run(scenario)
