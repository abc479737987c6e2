"""Spark cut off by network partitions (issue 28, docs/RELIABILITY.md "Spark cut off from nsqd
and nsqlookupd"), in the private networks of tests/faults/_netns.py.

One Spark driver (``local[2,4]``: the driver, its executors and their Python workers in one
process tree, all inside the node ``spark``; tests/spark/partition_driver.py) runs two
nsq → Parquet queries at once while a publisher in nsqd's node trickles messages into both
topics:

* ``direct`` reads nsqd by its TCP address only (no depth: each read task waits for its
  quota, up to ``readBudget``, holding what it received in flight). The node ``spark`` is cut
  off from nsqd (packets dropped both ways, silently) while tasks hold messages: the FINs
  cannot get out, nsqd's ``timeout_count`` rises and the messages come back to the query
  after the heal.
* ``looked`` finds nsqd through nsqlookupd (``lookupdHTTPAddresses``). The driver is cut off
  from nsqlookupd for several poll intervals: planning goes on with the last answer, and the
  query keeps reading during the cut.

Both queries must keep going (a failure ends the driver, and the test), and after the heal the
Parquet output of each, read back through Spark, has every published message exactly once.
One JVM for both cases: Spark's start-up is most of the cost.

Root only (namespaces); skipped otherwise, a failure in CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.faults import test_partitions
from tests.faults._netns import Node
from tests.faults.conftest import wait_until
from tests.faults.test_partitions import REPO, Lab
from tests.spark.conftest import SPARK_ENV

pytestmark = pytest.mark.timeout(300)

MSG_TIMEOUT = 4.0  # the queries' msgTimeout: how soon nsqd takes back what a cut task held
RATE = 100  # messages a second into each topic
# The driver cut off from nsqlookupd: longer than a poll (1 s) plus the planner's HTTP timeout
# (5 s), so that a discovery fails during the cut.
LOOKUPD_CUT = 7.0


lab = test_partitions.lab  # the fixture: a Net and every process started in it


class Trickle(threading.Thread):
    """Publishes ``RATE`` numbered messages a second into each topic, from inside nsqd's node,
    until stopped; ``published`` is what nsqd acknowledged."""

    def __init__(self, lab: Lab, node: Node, nsqd: Any, topics: list[str]) -> None:
        super().__init__(name="trickle", daemon=True)
        self.lab, self.node, self.nsqd, self.topics = lab, node, nsqd, topics
        self.published = {topic: 0 for topic in topics}
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.lab.net.call(self.node, self._loop)
        except BaseException as err:  # reported by stop()
            self.error = err

    def _loop(self) -> None:
        tick = 0.1
        per_tick = int(RATE * tick)
        while not self.stopping.wait(tick):
            for topic in self.topics:
                n = self.published[topic]
                self.nsqd.mpub(topic, [f"{topic}-{i:08d}" for i in range(n, n + per_tick)])
                self.published[topic] = n + per_tick

    def stop(self) -> dict[str, int]:
        self.stopping.set()
        self.join(30)
        assert self.error is None, self.error
        return dict(self.published)


class Driver:
    """tests/spark/partition_driver.py inside a node, in its own process group (its JVM and
    Python workers are its children)."""

    def __init__(self, lab: Lab, node: Node, base: Path, queries: dict[str, Any]) -> None:
        self.stop_file = base / "STOP"
        self.out = base / "driver.out"
        self.log = base / "driver.log"
        config = base / "driver.json"
        config.write_text(json.dumps({"queries": queries, "stop_file": str(self.stop_file)}))
        argv = [sys.executable, "-m", "tests.spark.partition_driver", str(config)]
        self.proc = subprocess.Popen(
            lab.net.argv(node, argv),
            cwd=REPO,
            stdout=self.out.open("wb"),
            stderr=self.log.open("wb"),
            env={**os.environ, **SPARK_ENV},
            start_new_session=True,
        )

    def printed(self, prefix: str) -> str | None:
        """The first line of the driver's output starting with ``prefix`` (fails if it
        exited without one)."""
        for line in self.out.read_text().splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :]
        assert self.proc.poll() is None, f"driver exited: {self.log.read_text()[-4000:]}"
        return None

    def counts(self) -> dict[str, dict[str, int]]:
        self.stop_file.touch()
        found = wait_until_value(lambda: self.printed("COUNTS "), "the driver's counts", 120)
        return dict(json.loads(found))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def wait_until_value(fn: Callable[[], str | None], what: str, timeout: float) -> str:
    found: list[str] = []

    def check() -> bool:
        value = fn()
        if value is not None:
            found.append(value)
        return value is not None

    wait_until(check, what, timeout)
    return found[0]


def test_spark_cut_off_from_nsqd_and_from_nsqlookupd(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    net = lab.net
    lookupd_node, nsqd_node, spark_node = net.add("lookupd"), net.add("nsqd"), net.add("spark")
    lookupd = lab.lookupd(False, lookupd_node)
    nsqd = lab.nsqd(False, nsqd_node, lookupd_tcp_address=lookupd.tcp_address)
    topics = ["direct", "looked"]
    for topic in topics:
        net.call(nsqd_node, nsqd.create_topic, topic)
        net.call(nsqd_node, nsqd.create_channel, topic, "spark")

    def channel(topic: str) -> dict[str, Any]:
        stats = net.call(nsqd_node, nsqd.stats, topic)
        (found,) = [t for t in stats["topics"] if t["topic_name"] == topic]
        (chan,) = found["channels"]
        return dict(chan)

    def finished(topic: str) -> int:
        c = channel(topic)
        return int(c["message_count"] - c["depth"] - c["in_flight_count"] - c["deferred_count"])

    common = {
        "channel": "spark",
        "msgTimeout": f"{MSG_TIMEOUT:g}s",
        "connectTimeout": "2s",
        "idleTimeout": "1s",
        "readBudget": f"{MSG_TIMEOUT / 2:g}s",
    }
    queries = {
        "direct": {"nsqdTCPAddresses": nsqd.tcp_address, "topic": "direct", **common},
        "looked": {
            "lookupdHTTPAddresses": lookupd.http_address,
            "lookupdPollInterval": "1s",
            "topic": "looked",
            **common,
        },
    }
    config = {
        name: {
            "source": {**source, "walLocation": str(tmp_path / name / "wal")},
            "output": str(tmp_path / name / "out"),
            "checkpoint": str(tmp_path / name / "ckpt"),
        }
        for name, source in queries.items()
    }
    trickle = Trickle(lab, nsqd_node, nsqd, topics)
    trickle.start()
    driver = Driver(lab, spark_node, tmp_path, config)
    try:
        t0 = time.monotonic()
        wait_until_value(lambda: driver.printed("STARTED"), "the driver starts", 180)
        started = time.monotonic() - t0
        for topic in topics:
            wait_until(partial(lambda t: finished(t) > 0, topic), f"{topic}: reads", 120)

        # -- the executors cut off from nsqd while a task holds messages --------------------
        for _ in range(5):  # a task may finish between the look and the cut: try again
            wait_until(lambda: channel("direct")["in_flight_count"] > 0, "a task holds", 30)
            net.cut_between(spark_node, nsqd_node)
            cut = time.monotonic()
            held = channel("direct")["in_flight_count"]  # no FIN gets through any more
            if held:
                break
            net.cut_between(spark_node, nsqd_node, heal=True)
        assert held, "no cut fell while a task held messages"
        wait_until(lambda: channel("direct")["timeout_count"] > 0, "held messages time out", 30)
        timed_out_at = time.monotonic() - cut
        wait_until(lambda: time.monotonic() - cut > MSG_TIMEOUT + 2, "the cut lasts", 30)
        net.cut_between(spark_node, nsqd_node, heal=True)
        healed = time.monotonic()
        before = finished("direct")
        wait_until(lambda: finished("direct") > before, "reading again after the heal", 60)
        resumed = time.monotonic() - healed
        timeouts = {t: channel(t)["timeout_count"] for t in topics}

        # -- the driver cut off from nsqlookupd ----------------------------------------------
        before = finished("looked")
        net.cut_between(spark_node, lookupd_node)
        cut = time.monotonic()
        wait_until(
            lambda: finished("looked") > before + RATE, "reading on during the lookupd cut", 30
        )
        read_during = time.monotonic() - cut
        wait_until(lambda: time.monotonic() - cut > LOOKUPD_CUT, "the lookupd cut lasts", 30)
        during = finished("looked") - before
        net.cut_between(spark_node, lookupd_node, heal=True)

        published = trickle.stop()

        def drained() -> bool:
            return all(finished(t) == published[t] for t in topics)

        wait_until(drained, "every message finished", 90)
        counts = driver.counts()
    finally:
        trickle.stopping.set()
        driver.kill()
    for topic in topics:
        n = published[topic]
        assert counts[topic] == {"rows": n, "distinct": n, "bodies": n}, (topic, counts, n)
    assert timeouts["direct"] > 0
    with capsys.disabled():
        print(
            f"\n  spark cut off: driver up in {started:.0f}s; from nsqd: {held} in flight at the "
            f"cut, timeouts from {timed_out_at:.1f}s (timeout_count {timeouts}), reading again "
            f"{resumed:.1f}s after the heal; from nsqlookupd: {during} read during a "
            f"{LOOKUPD_CUT:g} s cut "
            f"(the first {RATE} within {read_during:.1f}s); output {counts}, published "
            f"{published}: exactly once"
        )
