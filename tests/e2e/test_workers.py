"""``nsqd --workers=N``: one nsqd as N processes (docs/SCALING.md).

What a user must not notice: one address, one nsqlookupd registration, one ``/stats``, a
channel's consumers on any connection sharing its messages, nsqd.dat and the deferred
due times across restarts (with the same or another number of workers). What they may:
a worker that dies takes the node down with it, so that its supervisor restarts it whole.
The protocol, HTTP and differential suites also run against ``--workers=2``
(NSQPY_NSQD_WORKERS in scripts/test.sh); these tests are about the workers themselves.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsqpy.wire.v2 import encode_pub
from tests.e2e.test_nsqlookupd import LOOKUPD
from tests.support.procs import NSQD, ServerProcess, run_once, start_server
from tests.support.rawclient import RawClient, consumer
from tests.support.secure_client import SecureClient

pytestmark = pytest.mark.timeout(60)

NsqdFactory = Callable[..., ServerProcess]
# Topics owned by worker 0 and by worker 1 of two (owner: crc32(name) % workers).
TOPICS = [f"w{i}" for i in range(12)]


def owner(topic: str, workers: int = 2) -> int:
    return zlib.crc32(topic.encode()) % workers


def test_topics_cover_both_workers() -> None:
    assert {owner(t) for t in TOPICS} == {0, 1}


def stats(server: ServerProcess, query: str = "") -> Any:
    url = f"http://{server.http_address}/stats?format=json{query}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def http(server: ServerProcess, method: str, path: str, body: bytes | None = None) -> bytes:
    request = urllib.request.Request(
        f"http://{server.http_address}{path}", data=body, method=method
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        data: bytes = resp.read()
        return data


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def depths(server: ServerProcess) -> dict[str, int]:
    return {t["topic_name"]: t["depth"] for t in stats(server)["topics"] or []}


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_two_workers_serve_one_node(nsqd_factory: NsqdFactory) -> None:
    """Two processes under the supervisor; a producer's connection publishes to every
    topic (it moves to the first topic's owner, the rest are forwarded); /stats is one."""
    nsqd = nsqd_factory(workers=2)
    assert len(children(nsqd.pid)) == 2
    with RawClient(nsqd.tcp_address) as pub:
        for topic in TOPICS:
            pub.pub(topic, b"tcp")  # (each waits for its OK)
        pub.mpub(TOPICS[0], [b"a", b"b"])
        pub.dpub(TOPICS[1], 60_000, b"later")
    for topic in TOPICS:
        assert http(nsqd, "POST", f"/pub?topic={topic}", b"http") == b"OK"
    got = depths(nsqd)
    assert sorted(got) == sorted(TOPICS)
    # (a topic with no channel keeps a DPUB's message in its depth, as Go's does)
    assert got == {t: 2 for t in TOPICS} | {TOPICS[0]: 4, TOPICS[1]: 3}
    producers = stats(nsqd)["producers"]
    assert producers is None or all(p["pub_counts"] for p in producers)


def test_a_channels_consumers_on_any_connection_share_it(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory(workers=2)
    for topic in (t for t in TOPICS[:4]):
        clients = [consumer(nsqd.tcp_address, topic, "ch", rdy=100) for _ in range(4)]
        try:
            with RawClient(nsqd.tcp_address) as pub:
                pub.mpub(topic, [b"%d" % i for i in range(100)])
            seen: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(seen) < 100 and time.monotonic() < deadline:
                for client in clients:
                    message = client.poll_message(0.01)
                    if message is not None:
                        seen.append(message.body)
                        client.fin(message.id)
            assert sorted(seen) == sorted(b"%d" % i for i in range(100))
            channel = stats(nsqd, f"&topic={topic}")["topics"][0]["channels"][0]
            assert len(channel["clients"]) == 4
        finally:
            for client in clients:
                client.close()


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_compressed_consumers_are_relayed_to_the_owner(
    nsqd_factory: NsqdFactory, compression: str
) -> None:
    """A compressed connection cannot move: the worker it reached keeps the compression
    and relays the plain protocol to the owner; its publishes are forwarded."""
    nsqd = nsqd_factory(workers=2)
    for topic in TOPICS[:4]:
        client = SecureClient(nsqd.tcp_address)
        try:
            client.negotiate(**{compression: True})
            client.pub(f"{topic}_other", b"forwarded")
            client.sub(topic, "ch")
            client.rdy(10)
            http(nsqd, "POST", f"/pub?topic={topic}", b"hello")
            message = client.read_message()
            assert message.body == b"hello"
            client.fin(message.id)
            client.nop()

            def channel(topic: str = topic) -> Any:
                return stats(nsqd, f"&topic={topic}")["topics"][0]["channels"][0]

            wait_for(lambda: channel()["clients"][0]["finish_count"] == 1)
            assert channel()["clients"][0][compression] is True
        finally:
            client.close()
        assert depths(nsqd)[f"{topic}_other"] == 1


def test_nsqlookupd_sees_one_producer_with_every_topic(
    nsqd_factory: NsqdFactory, tmp_path: Path
) -> None:
    lookupd = start_server(LOOKUPD, tmp_path / "lookupd")
    try:
        nsqd = nsqd_factory(workers=2, lookupd_tcp_address=lookupd.tcp_address)
        for topic in TOPICS:
            http(nsqd, "POST", f"/topic/create?topic={topic}")
            http(nsqd, "POST", f"/channel/create?topic={topic}&channel=c")

        def nodes() -> list[Any]:
            with urllib.request.urlopen(f"http://{lookupd.http_address}/nodes", timeout=5) as r:
                return list(json.load(r)["producers"])

        wait_for(lambda: len(nodes()) == 1 and sorted(nodes()[0]["topics"]) == sorted(TOPICS))
        http(nsqd, "POST", f"/topic/delete?topic={TOPICS[1]}")
        wait_for(lambda: TOPICS[1] not in nodes()[0]["topics"])
        with urllib.request.urlopen(
            f"http://{lookupd.http_address}/channels?topic={TOPICS[2]}", timeout=5
        ) as r:
            assert json.load(r)["channels"] == ["c"]
    finally:
        lookupd.stop()


def test_restarts_keep_metadata_and_deferrals_whatever_the_workers(
    nsqd_factory: NsqdFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    nsqd = nsqd_factory(workers=2, data_path=data)
    for topic in TOPICS[:6]:
        http(nsqd, "POST", f"/topic/create?topic={topic}")
        http(nsqd, "POST", f"/channel/create?topic={topic}&channel=c")
        http(nsqd, "POST", f"/pub?topic={topic}&defer=60000", b"later")
    http(nsqd, "POST", f"/topic/pause?topic={TOPICS[0]}")
    http(nsqd, "POST", f"/topic/pause?topic={TOPICS[1]}")
    assert nsqd.stop() == 0
    saved = json.loads((data / "nsqd.dat").read_text())
    assert sorted(t["name"] for t in saved["topics"]) == sorted(TOPICS[:6])
    for workers in (1, 2, 3):
        nsqd = nsqd_factory(workers=workers, data_path=data)
        topics = {t["topic_name"]: t for t in stats(nsqd)["topics"]}
        assert sorted(topics) == sorted(TOPICS[:6]), workers
        assert {t for t, s in topics.items() if s["paused"]} == {TOPICS[0], TOPICS[1]}
        readers = [consumer(nsqd.tcp_address, topic, "c", rdy=10) for topic in topics]
        try:
            for reader in readers:  # deferred again (nsqd.deferred.dat or its parts)
                assert reader.poll_message(0.2) is None, workers

            wait_for(lambda: deferred_counts(nsqd, list(topics)) == [1] * len(topics))  # noqa: B023
        finally:
            for reader in readers:
                reader.close()
        assert nsqd.stop() == 0
        assert not list(data.glob("*.tmp"))


def deferred_counts(nsqd: ServerProcess, topics: list[str]) -> list[int]:
    return [
        stats(nsqd, f"&topic={t}")["topics"][0]["channels"][0]["deferred_count"] for t in topics
    ]


def test_policies_of_every_worker_are_kept(nsqd_factory: NsqdFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    nsqd = nsqd_factory(workers=2, data_path=data)
    for topic in TOPICS[:6]:
        http(nsqd, "POST", f"/topic/policy?topic={topic}", b'{"message_ttl": "1h"}')
    assert nsqd.stop() == 0
    nsqd = nsqd_factory(workers=2, data_path=data)
    for topic in TOPICS[:6]:
        reply = json.loads(http(nsqd, "GET", f"/topic/policy?topic={topic}"))
        assert reply["policy"]["message_ttl"] == "1h0m0s", reply


def test_dead_letters_to_another_workers_topic(nsqd_factory: NsqdFactory) -> None:
    """A channel of worker 0 dead-letters to a topic of worker 1: the dead letter has an
    ID of its own (each worker's IDs carry its own node bits), and the dead-letter topic's
    /stats entry names its source, as with one worker (nsqadmin links back by it)."""
    source = next(t for t in TOPICS if owner(t) == 0)
    target = next(t for t in TOPICS if owner(t) == 1)
    nsqd = nsqd_factory(workers=2)
    http(nsqd, "POST", f"/topic/create?topic={source}")
    http(nsqd, "POST", f"/channel/create?topic={source}&channel=c")
    policy = json.dumps({"max_attempts": 1, "dead_letter_topic": target}).encode()
    http(nsqd, "POST", f"/channel/policy?topic={source}&channel=c", policy)
    with consumer(nsqd.tcp_address, source, "c", rdy=1) as c:
        with RawClient(nsqd.tcp_address) as pub:
            pub.pub(source, b"once")
        first = c.read_message()
        c.req(first.id, 0)  # its one attempt is used up: dead-lettered at once
        c.expect_no_frame(0.2)
    with consumer(nsqd.tcp_address, target, "dl", rdy=1) as c:
        parked = c.read_message()
    assert parked.body == b"once" and parked.timestamp == first.timestamp
    assert parked.id != first.id
    (entry,) = stats(nsqd, f"&topic={target}")["topics"]
    assert entry["dead_letter_sources"] == [f"{source}:c"], entry
    keys = list(entry)
    assert keys.index("dead_letter_sources") == keys.index("e2e_processing_latency") + 1


def test_a_dead_worker_takes_the_node_down(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory(workers=2)
    workers = children(nsqd.pid)
    os.kill(workers[1], signal.SIGKILL)
    assert nsqd.wait(10) == 1
    assert "exited (-9): stopping the others" in nsqd.log_text()
    for pid in workers:
        wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid))  # noqa: B023


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_kill_9_of_the_supervisor_kills_its_workers(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory(workers=2)
    workers = children(nsqd.pid)
    assert nsqd.kill() == -9
    for pid in workers:
        wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid))  # noqa: B023


@pytest.mark.parametrize("value", ["0", "257", "x"])
def test_bad_workers_flag(value: str) -> None:
    result = run_once(NSQD, [f"--workers={value}", "--data-path=/nonexistent"])
    assert result.returncode != 0
    assert "workers" in result.stderr


def test_forwarded_publishes_are_pipelined_and_answered_in_order(
    nsqd_factory: NsqdFactory,
) -> None:
    """A subscribed connection cannot move: its publishes to the other worker's topics are
    forwarded, without waiting for each answer before reading the next command, and every
    answer still comes in the order of the commands (a local error between them too)."""
    nsqd = nsqd_factory(workers=2)
    here = TOPICS[0]
    there = next(t for t in TOPICS if owner(t) != owner(here))
    with consumer(nsqd.tcp_address, here, "ch") as client:
        client.send(
            encode_pub(there, b"1")
            + b"FIN 0123456789abcdef\n"  # answered here, at once: E_FIN_FAILED
            + encode_pub(there, b"2")
            + encode_pub(here, b"local")
        )
        client.expect_response(b"OK")
        client.expect_error(
            "E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", fatal=False
        )
        client.expect_response(b"OK")
        client.expect_response(b"OK")
        count = 2000  # all sent before the first answer is read
        client.send(b"".join(encode_pub(there, b"%d" % i) for i in range(count)))
        for _ in range(count):
            client.expect_response(b"OK")
    assert depths(nsqd)[there] == count + 2
