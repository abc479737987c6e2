"""Crashes at every step (issue 28, part 1): ``kill -9`` of nsqd at seeded random points
while it writes its disk queues, ``nsqd.dat`` (topics and channels created as it runs) and,
when the kill lands during a graceful exit, ``nsqd.deferred.dat``, with --sync-every=1.

Every iteration restarts nsqd on the same data path; it must start again each time. At
the end every message whose publish was acknowledged (OK received) must have been
delivered at least once, during the run or in the final drain, those in flight at a kill
included (the Go nsqd, same steps, loses those: counted). Deferred messages are held
in memory until due (as in the Go nsqd): one acknowledged in an iteration that ended in a
kill before its exit finished may be lost, and is counted, not asserted; one whose
iteration ended in a clean exit must be delivered.

``NSQPY_CRASH_SEED`` (default 28) and ``NSQPY_CRASH_SECONDS`` (default 25) change the
seed and the time spent; the figures go to docs/RELIABILITY.md.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nsqpy.testing import NSQD
from nsqpy.wire.v2 import FRAME_TYPE_ERROR, decode_message
from tests.faults.conftest import GoNSQD, PyNSQD, require_go
from tests.support.rawclient import RawClient

SEED = int(os.environ.get("NSQPY_CRASH_SEED", "28"))
SECONDS = float(os.environ.get("NSQPY_CRASH_SECONDS", "25"))

pytestmark = pytest.mark.timeout(SECONDS + 120)

BASE_TOPIC = "crash_a"
RDY = 10  # the consumer's: how many messages are in flight at a kill


@dataclass
class Ledger:
    """What the publishers were told and what the consumers got, across iterations."""

    acked: dict[bytes, int] = field(default_factory=dict)  # body → iteration
    deferred: dict[bytes, int] = field(default_factory=dict)
    delivered: set[bytes] = field(default_factory=set)
    topics: list[str] = field(default_factory=lambda: [BASE_TOPIC])
    backlog: list[str] = field(default_factory=list)  # topics without a channel yet
    clean_exits: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def publisher(address: str, ledger: Ledger, iteration: int, rng: random.Random) -> None:
    """PUB, MPUB and DPUB until the connection dies; records each acknowledged body."""
    n = 0
    try:
        with RawClient(address, timeout=2.0) as client:
            while True:
                with ledger.lock:
                    topic = rng.choice(ledger.topics + ledger.backlog)
                n += 1
                kind = rng.random()
                if kind < 0.6:
                    bodies = [b"%d-%d|%s" % (iteration, n, topic.encode())]
                    client.pub(topic, bodies[0])
                    target = ledger.acked
                elif kind < 0.9:
                    bodies = [
                        b"%d-%d.%d|%s" % (iteration, n, j, topic.encode())
                        for j in range(rng.randint(2, 6))
                    ]
                    client.mpub(topic, bodies)
                    target = ledger.acked
                else:
                    bodies = [b"%d-%d~|%s" % (iteration, n, topic.encode())]
                    client.dpub(topic, rng.randint(10, 150), bodies[0])
                    target = ledger.deferred
                with ledger.lock:
                    for body in bodies:
                        target[body] = iteration
    except (OSError, AssertionError, TimeoutError):
        return  # killed: the publish in flight was not acknowledged


def consumer(address: str, ledger: Ledger, rng: random.Random) -> None:
    """Read from the base topic, FIN most, REQ some (they come back), until killed."""
    try:
        with RawClient(address, timeout=2.0) as client:
            client.sub(BASE_TOPIC, "c")
            client.rdy(RDY)
            while True:
                msg = client.read_message(2.0)
                with ledger.lock:
                    ledger.delivered.add(msg.body)
                if rng.random() < 0.1:
                    client.req(msg.id, rng.randint(0, 50))
                else:
                    client.fin(msg.id)
    except (OSError, AssertionError, TimeoutError):
        return


def new_topic_and_channel(address: str, name: str) -> bool:
    """Create a topic with a channel (both written to nsqd.dat in the background)."""
    try:
        with RawClient(address, timeout=2.0) as client:
            client.sub(name, "c")
            client.send(b"NOP\n")
        return True
    except (OSError, AssertionError, TimeoutError):
        return False


def drain(nsqd: NSQD, topic: str, ledger: Ledger) -> None:
    with RawClient(nsqd.tcp_address) as client:
        client.sub(topic, "c")
        client.rdy(200)
        while True:
            try:
                frame = client.next_frame(1.0)
            except TimeoutError:
                return
            if frame.type == FRAME_TYPE_ERROR:
                # a FIN of a copy whose ID was in flight twice (the Go nsqd after a kill
                # may hold a message twice); non-fatal, the drain goes on
                assert frame.data.startswith(b"E_FIN_FAILED"), frame
                continue
            msg_id, _, _, body = decode_message(frame.data)
            with ledger.lock:
                ledger.delivered.add(body)
            client.fin(msg_id)


def crash_once(nsqd: NSQD, ledger: Ledger, iteration: int, rng: random.Random) -> bool:
    """One iteration: traffic, a new topic and channel, an older topic's backlog moving into
    its new channel, then ``kill -9`` (after a SIGTERM three times in ten); nsqd is started
    again. True if the kill came during (or after) an exit."""
    address = nsqd.tcp_address
    threads = [
        threading.Thread(
            target=publisher, args=(address, ledger, iteration, random.Random(rng.random()))
        ),
        threading.Thread(target=consumer, args=(address, ledger, random.Random(rng.random()))),
    ]
    for t in threads:
        t.start()
    fresh = f"crash_t{iteration}"
    if new_topic_and_channel(address, fresh):
        with ledger.lock:
            ledger.topics.append(fresh)
    with ledger.lock:
        ledger.backlog.append(f"crash_n{iteration}")  # its backlog waits on disk
        older = ledger.backlog.pop(0) if len(ledger.backlog) > 2 else None
    if older is not None:  # the topic's backlog now moves into the new channel
        new_topic_and_channel(address, older)
        with ledger.lock:
            ledger.topics.append(older)
    time.sleep(rng.uniform(0.02, 0.4))
    assert nsqd.process is not None
    in_exit = rng.random() < 0.3
    if in_exit:  # during the exit's writes, or after them
        nsqd.process.send_signal(signal.SIGTERM)
        time.sleep(rng.uniform(0.0, 0.15))
    if nsqd.kill() == 0:
        ledger.clean_exits.add(iteration)
    for t in threads:
        t.join(10)
    assert "Traceback" not in nsqd.log_text(), nsqd.log_text()
    nsqd.start()  # must start again, every time
    return in_exit


def drain_all(nsqd: NSQD, ledger: Ledger) -> None:
    """Every topic's channel c, side by side, until each is quiet."""
    drains = [
        threading.Thread(target=drain, args=(nsqd, topic, ledger))
        for topic in ledger.topics + ledger.backlog
    ]
    for t in drains:
        t.start()
    for t in drains:
        t.join(60)


@pytest.mark.parametrize("name", ["ours", "go"])
def test_kill_minus_nine_at_random_points_loses_nothing_queued(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ours is held to the promise; the Go nsqd, run the same way for a third of the time,
    gives the figures beside it (asserted only to start again every time)."""
    if name == "go":
        require_go("nsqd")
    kind = PyNSQD if name == "ours" else GoNSQD
    seconds = SECONDS if name == "ours" else SECONDS / 3
    rng = random.Random(SEED)
    ledger = Ledger()
    (tmp_path / "data").mkdir()
    nsqd = kind(directory=tmp_path / "data", mem_queue_size=0, sync_every=1, msg_timeout="1s")
    iterations = kills_in_exit = 0
    try:
        nsqd.start()
        with RawClient(nsqd.tcp_address) as client:
            client.sub(BASE_TOPIC, "c")
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            iterations += 1
            kills_in_exit += crash_once(nsqd, ledger, iterations, rng)
        drain_all(nsqd, ledger)
        log = nsqd.log_text()
        assert nsqd.stop() == 0
    finally:
        nsqd.close()
    lost = [b for b in ledger.acked if b not in ledger.delivered]
    lost_deferred = [b for b in ledger.deferred if b not in ledger.delivered]
    must = [b for b in lost_deferred if ledger.deferred[b] in ledger.clean_exits]
    queued = [b for b in lost if not b.endswith(b"|" + BASE_TOPIC.encode())]
    by_kill = Counter(ledger.acked[body] for body in lost)
    most = max(by_kill.values(), default=0)
    with capsys.disabled():
        print(
            f"\n  crashes [{name}]: seed {SEED}, {iterations} kill -9 in "
            f"{time.monotonic() - started:.0f}s ({kills_in_exit} during an exit, "
            f"{len(ledger.clean_exits)} exits finished first), "
            f"{len(ledger.topics) + len(ledger.backlog)} topics, {len(ledger.acked)} "
            f"acknowledged messages, {len(lost) - len(queued)} lost in flight (most in one "
            f"kill: {most}), {len(queued)} lost from queues; {len(ledger.deferred)} deferred, "
            f"{len(lost_deferred)} lost in memory"
        )
    assert iterations >= 5
    if name == "go":
        return
    # Nothing acknowledged may be lost, not even what was in flight at a kill: the disk
    # queue's saved read position is its oldest unfinished message's (the Go nsqd loses
    # those the consumer had not received, up to its RDY count).
    assert not queued, f"{len(queued)} acknowledged messages lost from queues: {queued[:5]}"
    assert not lost, (
        f"{len(lost)} of {len(ledger.acked)} acknowledged messages lost in flight: "
        f"{lost[:5]}; by kill: {dict(by_kill)}"
    )
    assert not must, f"deferred messages lost although the exit finished: {must[:5]}"
    assert not list((tmp_path / "data").glob("*.bad")), "a queue file was found corrupt"
    assert "Traceback" not in log


@pytest.mark.parametrize("name", ["ours", "go"])
def test_kill_before_the_first_metadata_sync(name: str, tmp_path: Path) -> None:
    """With the default --sync-every, a new queue's metadata is first written up to
    --sync-timeout after its first message. A kill before that leaves data files and no
    metadata: ours reads them (every acknowledged message comes back), the Go nsqd starts
    the queue empty (they are never delivered)."""
    if name == "go":
        require_go("nsqd")
    kind = PyNSQD if name == "ours" else GoNSQD
    (tmp_path / "data").mkdir()
    nsqd = kind(directory=tmp_path / "data", mem_queue_size=0, sync_timeout="1h")
    try:
        nsqd.start()
        with RawClient(nsqd.tcp_address) as client:
            client.sub("early", "c")
        wait_for_dat = time.monotonic() + 5
        while b'"c"' not in (tmp_path / "data" / "nsqd.dat").read_bytes():
            assert time.monotonic() < wait_for_dat
            time.sleep(0.02)
        bodies = [b"early-%d" % i for i in range(10)]
        with RawClient(nsqd.tcp_address) as client:
            for b in bodies:
                client.pub("early", b)
        nsqd.kill()
        nsqd.start()
        ledger = Ledger()
        drain(nsqd, "early", ledger)
        log = nsqd.log_text()
    finally:
        nsqd.close()
    if name == "ours":
        assert ledger.delivered == set(bodies)
        assert "no metadata for data files" in log
    else:
        print(f"\n  kill before the first metadata sync [go]: {len(ledger.delivered)} of 10")
