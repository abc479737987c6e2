"""The nsqpy client (nsqpy.client) against real nsqd and nsqlookupd processes."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nsqpy.client import (
    BlockingConsumer,
    BlockingProducer,
    Consumer,
    Message,
    NSQConnectionError,
    NSQError,
    Producer,
)
from nsqpy.client._conn import Conn
from tests.support.procs import NSQD, ServerPool, ServerProcess, ServerSpec

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")

LOOKUPD = ServerSpec(
    name="nsqlookupd",
    module="nsqpy.nsqlookupd",
    default_args=lambda _: [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ],
    ready=("tcp", "http"),
)


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """For state only visible by asking (nsqd's /stats): ask until true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def wait(event: asyncio.Event, timeout: float = 10.0) -> None:
    await asyncio.wait_for(event.wait(), timeout)


def http_address(server: ServerProcess) -> str:
    server.wait_for_log(r"HTTP: listening on")
    address = server.http_address
    assert address is not None
    return address


def channel_stats(server: ServerProcess, topic: str, channel: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"format": "json", "topic": topic})
    with urllib.request.urlopen(f"http://{http_address(server)}/stats?{query}", timeout=5) as r:
        stats = json.load(r)
    for t in stats["topics"] or []:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return dict(c)
    raise AssertionError(f"no channel {topic}/{channel}")


def drained(server: ServerProcess, topic: str, channel: str) -> Callable[[], bool]:
    def check() -> bool:
        c = channel_stats(server, topic, channel)
        return bool(c["depth"] == 0 and c["in_flight_count"] == 0 and c["deferred_count"] == 0)

    return check


class Cluster:
    """An nsqlookupd and three nsqd registered with it, shared by a module's tests
    (each test uses its own topic)."""

    def __init__(self, lookupd: ServerProcess, nsqds: list[ServerProcess]) -> None:
        self.lookupd = lookupd
        self.nsqds = nsqds

    @property
    def lookupd_http(self) -> str:
        return self.lookupd.address("http")

    @property
    def addresses(self) -> list[str]:
        return [s.tcp_address for s in self.nsqds]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("cluster")
    lookupds = ServerPool(LOOKUPD, base)
    nsqds = ServerPool(NSQD, base)
    try:
        lookupd = lookupds.start()
        servers = [
            nsqds.start(lookupd_tcp_address=lookupd.tcp_address, broadcast_address="127.0.0.1")
            for _ in range(3)
        ]
        yield Cluster(lookupd, servers)
    finally:
        nsqds.stop_all()
        lookupds.stop_all()


class Collector:
    """A handler recording bodies; ``done`` is set once ``expected`` arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.bodies: list[bytes] = []
        self.addresses: set[str] = set()
        self.done = asyncio.Event()

    def __call__(self, msg: Message) -> None:
        self.bodies.append(msg.body)
        self.addresses.add(msg.nsqd_address)
        if len(self.bodies) >= self.expected:
            self.done.set()


# -- publishing ---------------------------------------------------------------------------


def test_pub_mpub_dpub_round_trip(shared_nsqd: ServerProcess, topic: str) -> None:
    nsqd = shared_nsqd

    async def main() -> None:
        collector = Collector(1 + 3 + 1 + 200)
        async with Consumer(
            topic, "ch", collector, nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=50
        ):
            async with Producer(nsqd.tcp_address) as producer:
                await producer.pub(topic, b"one")
                await producer.mpub(topic, [b"m1", b"m2", "m3"])
                await producer.dpub(topic, 0.05, b"deferred")
                # many publishes in flight at once on one connection, replies in order
                await asyncio.gather(*(producer.pub(topic, b"p%d" % i) for i in range(200)))
                assert producer.connected == [nsqd.tcp_address]
            await wait(collector.done)
        assert sorted(collector.bodies[:4]) == [b"m1", b"m2", b"m3", b"one"]
        assert b"deferred" in collector.bodies
        assert {b"p%d" % i for i in range(200)} <= set(collector.bodies)
        await eventually(drained(nsqd, topic, "ch"))

    arun(main())


def test_errors_carry_the_nsq_code(shared_nsqd: ServerProcess, topic: str) -> None:
    nsqd = shared_nsqd

    async def main() -> None:
        async with Producer(nsqd.tcp_address) as producer:
            with pytest.raises(NSQError) as bad_topic:
                await producer.pub("not valid!", b"x")
            assert bad_topic.value.code == "E_BAD_TOPIC"
            assert str(bad_topic.value) == 'E_BAD_TOPIC PUB topic name "not valid!" is not valid'
            with pytest.raises(NSQError) as empty:
                await producer.pub(topic, b"")
            assert empty.value.code == "E_BAD_MESSAGE"
            # nsqd's own check: a deferral above --max-req-timeout (1h by default)
            with pytest.raises(NSQError) as too_long:
                await producer.dpub(topic, 7200, b"x")
            assert too_long.value.code == "E_INVALID"
            assert too_long.value.fatal
            assert "DPUB timeout 7200000 out of range" in str(too_long.value)
            # the connection nsqd closed is reopened for the next publish
            await producer.pub(topic, b"after")
        async with Producer("127.0.0.1:1", dial_timeout=0.5) as nowhere:
            with pytest.raises(NSQConnectionError):
                await nowhere.pub(topic, b"x")

    arun(main())


def test_snappy_deflate_and_tls(
    nsqd_factory: Callable[..., ServerProcess], tmp_path: Path, topic: str
) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    nsqd = nsqd_factory(tls_cert=cert_file, tls_key=key_file)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    variants: list[dict[str, Any]] = [
        {"snappy": True},
        {"deflate": True, "deflate_level": 1},
        {"tls_v1": True, "tls_context": context},
        {"tls_v1": True, "tls_context": context, "snappy": True},
    ]

    async def main() -> None:
        for i, options in enumerate(variants):
            bodies = [b"%d-%d" % (i, n) * 50 for n in range(300)]
            collector = Collector(len(bodies))
            async with Producer(nsqd.tcp_address, **options) as producer:
                await producer.mpub(topic, bodies)
                conn = producer._endpoints[0].conn
                assert conn is not None
                for key in ("snappy", "deflate", "tls_v1"):
                    assert conn.negotiated[key] == bool(options.get(key)), key
            async with Consumer(
                topic,
                f"ch{i}#ephemeral",
                collector,
                nsqd_tcp_addresses=[nsqd.tcp_address],
                max_in_flight=100,
                **options,
            ):
                await wait(collector.done)
            assert sorted(collector.bodies) == sorted(bodies)

    # the channels are created first so that each sees only its own messages
    arun(main())


# -- consuming ----------------------------------------------------------------------------


def test_several_nsqd_and_batch_handler(cluster: Cluster, topic: str) -> None:
    servers = cluster.nsqds
    addresses = cluster.addresses

    async def main() -> None:
        batches: list[int] = []
        seen: list[bytes] = []
        done = asyncio.Event()

        def handle(messages: list[Message]) -> None:
            batches.append(len(messages))
            seen.extend(m.body for m in messages)
            if len(seen) >= 300:
                done.set()

        for address in addresses:
            async with Producer(address) as producer:
                await producer.mpub(topic, [b"%s-%d" % (address.encode(), n) for n in range(100)])
        async with Consumer(
            topic, "ch", batch_handler=handle, nsqd_tcp_addresses=addresses, max_in_flight=90
        ) as consumer:
            await wait(done)
            assert sorted(consumer.connections) == sorted(addresses)
        assert len(set(seen)) == 300
        assert max(batches) > 1  # whole reads go to the handler at once
        for server in servers:
            await eventually(drained(server, topic, "ch"))

    arun(main())


def test_rdy_redistribution_three_nsqd_max_in_flight_two(cluster: Cluster, topic: str) -> None:
    addresses = cluster.addresses

    async def main() -> None:
        for address in addresses:
            async with Producer(address) as producer:
                await producer.mpub(topic, [b"%s %d" % (address.encode(), n) for n in range(5)])
        collector = Collector(15)
        over_budget: list[int] = []
        consumer: Consumer

        def handle(msg: Message) -> None:
            total = sum(c.rdy for c in consumer._conns.values())
            if total > 2:
                over_budget.append(total)
            collector(msg)

        consumer = Consumer(
            topic,
            "ch",
            handle,
            nsqd_tcp_addresses=addresses,
            max_in_flight=2,
            rdy_redistribute_interval=0.05,
            low_rdy_idle_timeout=0.2,
            low_rdy_timeout=0.5,
        )
        async with consumer:
            # 3 connections, 2 RDY: one nsqd at a time waits at RDY 0 for redistribution
            rdys = [c.rdy for c in consumer._conns.values()]
            assert sum(rdys) <= 2 and 0 in rdys
            await wait(collector.done)
        assert collector.addresses == set(addresses)
        assert not over_budget

    arun(main())


def test_max_attempts_gives_up(shared_nsqd: ServerProcess, topic: str) -> None:
    nsqd = shared_nsqd

    async def main() -> None:
        calls: list[int] = []
        given_up: list[Message] = []
        gave_up = asyncio.Event()

        async def failing(msg: Message) -> None:
            calls.append(msg.attempts)
            raise RuntimeError("cannot handle it")

        def give_up(msg: Message) -> None:
            given_up.append(msg)
            gave_up.set()

        async with Producer(nsqd.tcp_address) as producer:
            await producer.pub(topic, b"poison")
        async with Consumer(
            topic,
            "ch",
            failing,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_attempts=3,
            default_requeue_delay=0,
            max_backoff_duration=0,
            on_give_up=give_up,
        ) as consumer:
            await wait(gave_up)
            await eventually(drained(nsqd, topic, "ch"))
            stats = consumer.stats()
        assert calls == [1, 2, 3]
        assert [m.attempts for m in given_up] == [4]
        assert given_up[0].body == b"poison"
        assert (stats.messages_requeued, stats.messages_finished) == (3, 1)

    arun(main())


def test_backoff_after_handler_failures(
    shared_nsqd: ServerProcess, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nsqd = shared_nsqd
    rdy_sent: list[int] = []
    original = Conn.send_rdy

    def record(self: Conn, count: int) -> None:
        rdy_sent.append(count)
        original(self, count)

    monkeypatch.setattr(Conn, "send_rdy", record)

    async def main() -> None:
        failures = 2
        collector = Collector(6)
        backed_off = []

        async def handle(msg: Message) -> None:
            nonlocal failures
            if failures:
                failures -= 1
                msg.requeue(0)  # back to nsqd at once, and back off
                return
            backed_off.append(consumer.in_backoff)
            collector(msg)

        async with Producer(nsqd.tcp_address) as producer:
            await producer.mpub(topic, [b"%d" % n for n in range(6)])
        consumer = Consumer(
            topic,
            "ch",
            handle,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=10,
            backoff_multiplier=0.02,
        )
        async with consumer:
            await wait(collector.done)
            assert not consumer.in_backoff
        # RDY 10, then 0 while backing off, 1 to test the waters, 10 again at the end
        assert rdy_sent[0] == 10
        assert 0 in rdy_sent and 1 in rdy_sent
        assert rdy_sent.index(0) < rdy_sent.index(1) < len(rdy_sent) - 1
        assert rdy_sent[-1] == 10
        assert backed_off[0] is True  # the first success came while backing off
        assert consumer.stats().messages_requeued == 2

    arun(main())


def test_close_waits_for_in_flight(shared_nsqd: ServerProcess, topic: str) -> None:
    nsqd = shared_nsqd

    async def main() -> None:
        started = asyncio.Event()
        release = asyncio.Event()

        async def slow(msg: Message) -> None:
            started.set()
            await release.wait()

        async with Producer(nsqd.tcp_address) as producer:
            await producer.pub(topic, b"slow")
        consumer = Consumer(topic, "ch", slow, nsqd_tcp_addresses=[nsqd.tcp_address])
        await consumer.start()
        await wait(started)
        closing = asyncio.ensure_future(consumer.close())

        def cls_received() -> bool:
            clients = channel_stats(nsqd, topic, "ch")["clients"]
            return bool(clients) and clients[0]["state"] == 4  # closing

        await eventually(cls_received)
        assert not closing.done()
        assert channel_stats(nsqd, topic, "ch")["in_flight_count"] == 1
        release.set()
        await asyncio.wait_for(closing, 10)
        await eventually(drained(nsqd, topic, "ch"))

    arun(main())


def test_nsqd_killed_and_restarted(
    nsqd_factory: Callable[..., ServerProcess], tmp_path: Path, topic: str
) -> None:
    data = tmp_path / "restarting"
    first = nsqd_factory(data_path=data)
    address = first.tcp_address

    async def main() -> None:
        collector = Collector(40)
        async with (
            Producer(address, reconnect_delay=0.05, max_reconnect_delay=0.2) as producer,
            Consumer(
                topic,
                "ch",
                collector,
                nsqd_tcp_addresses=[address],
                max_in_flight=5,
                reconnect_delay=0.05,
                max_reconnect_delay=0.2,
            ) as consumer,
        ):
            for n in range(20):
                await producer.pub(topic, b"before %d" % n)
            await eventually(lambda: len(collector.bodies) == 20)

            lost = asyncio.Event()
            original = consumer.on_close

            def on_close(conn: Conn, exc: BaseException | None) -> None:
                original(conn, exc)
                lost.set()

            consumer.on_close = on_close  # type: ignore[method-assign]
            first.kill()
            await wait(lost)
            assert consumer.connections == []
            with pytest.raises(NSQConnectionError):
                await producer.pub(topic, b"while down")

            second = await asyncio.to_thread(nsqd_factory, data_path=data, tcp_address=address)
            assert second.tcp_address == address
            # the producer reconnects in the background; a publish waits for the attempt
            for n in range(20):
                await producer.pub(topic, b"after %d" % n)
            await wait(collector.done)
            assert consumer.connections == [address]
        assert {b"before %d" % n for n in range(20)} <= set(collector.bodies)
        assert {b"after %d" % n for n in range(20)} <= set(collector.bodies)

    arun(main())


def test_lookupd_discovery_join_and_leave(cluster: Cluster, topic: str) -> None:
    one, two, three = cluster.nsqds

    async def publish(server: ServerProcess, body: bytes) -> None:
        async with Producer(server.tcp_address) as producer:
            await producer.pub(topic, body)

    async def main() -> None:
        await publish(one, b"one")
        await publish(two, b"two")
        collector = Collector(3)
        async with Consumer(
            topic,
            "ch",
            collector,
            lookupd_http_addresses=[cluster.lookupd_http],
            max_in_flight=10,
            lookupd_poll_interval=0.1,
        ) as consumer:
            await eventually(lambda: len(collector.bodies) == 2)
            assert sorted(consumer.connections) == sorted([one.tcp_address, two.tcp_address])
            await publish(three, b"three")  # registers the topic: the next poll joins it
            await wait(collector.done)
            assert sorted(consumer.connections) == sorted(cluster.addresses)
            # a tombstoned producer is no longer listed: the consumer leaves it
            node = f"127.0.0.1:{http_address(two).rpartition(':')[2]}"
            query = urllib.parse.urlencode({"topic": topic, "node": node})
            req = urllib.request.Request(
                f"http://{cluster.lookupd_http}/topic/tombstone?{query}", method="POST"
            )
            await asyncio.to_thread(urllib.request.urlopen, req, None, 5)
            await eventually(lambda: two.tcp_address not in consumer.connections)
            assert sorted(consumer.connections) == sorted(s.tcp_address for s in (one, three))
        assert sorted(collector.bodies) == [b"one", b"three", b"two"]

    arun(main())


# -- blocking wrappers --------------------------------------------------------------------


def test_blocking_producer_and_consumer(shared_nsqd: ServerProcess, topic: str) -> None:
    nsqd = shared_nsqd
    with BlockingProducer(nsqd.tcp_address) as producer:
        producer.connect(timeout=5)
        producer.pub(topic, b"a")
        producer.mpub(topic, [b"b%d" % n for n in range(99)])
        producer.dpub(topic, 0.01, b"c")

    with BlockingConsumer(
        topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=30
    ) as consumer:
        got: list[bytes] = []
        while len(got) < 101:
            batch = consumer.get_batch(25, timeout=5)
            assert batch, "no message within 5s"
            assert len(batch) <= 25
            got.extend(m.body for m in batch)
            consumer.finish(batch)
        assert sorted(got) == sorted([b"a", b"c", *(b"b%d" % n for n in range(99))])
        assert consumer.get(timeout=0.05) is None
    asyncio.run(eventually(drained(nsqd, topic, "ch")))


def test_blocking_consumer_run_in_a_thread(shared_nsqd: ServerProcess, topic: str) -> None:
    nsqd = shared_nsqd
    with BlockingProducer(nsqd.tcp_address) as producer:
        producer.mpub(topic, [b"%d" % n for n in range(50)])
    seen: list[bytes] = []
    done = threading.Event()
    consumer = BlockingConsumer(
        topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=10
    )

    def handle(msg: Message) -> None:
        seen.append(msg.body)
        if len(seen) == 50:
            done.set()

    worker = threading.Thread(target=consumer.run, args=(handle,))
    worker.start()
    assert done.wait(10)
    consumer.close()
    worker.join(10)
    assert sorted(seen, key=int) == [b"%d" % n for n in range(50)]
    asyncio.run(eventually(drained(nsqd, topic, "ch")))
