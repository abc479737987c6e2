"""A long run of mixed traffic through nsqlookupd, nsqd and the nsqpy client: does anything grow?

Starts an nsqlookupd and an nsqd (ours, ``python -m``, 127.0.0.1 port 0, a temp data dir,
``--mem-queue-size=100`` so that bursts spill to the disk queue) and drives, for
``--duration``:

* topic ``soak``: publishers coming and going (each replaces its connection every
  ``--churn`` seconds), PUB and, for one message in ten, DPUB (deferred ``--defer``);
  channel ``steady`` read by one long-lived consumer found through nsqlookupd (the latency
  figures: publish → handler, deferred messages left out), channel ``churn`` read by
  consumers that come and go (one new, the oldest closed gracefully, every ``--churn``
  seconds) and REQ one first delivery in twenty;
* topic ``soak_policy`` (a tenth of the rate), channel ``retry`` with a policy
  (``max_attempts`` 3, dead letters to ``soak_policy_dead``) read by a consumer that
  REQs every message, so that each one is dead-lettered and read from ``soak_policy_dead``;
* a topic and channel created, read and deleted every ``--churn`` seconds;
* with ``--spark``, a Spark streaming query (the ``nsq`` source, ``local[1]``, a 5 s trigger)
  reading ``soak`` (channel ``spark``) into Parquet throughout: exactly once at the end.

Every ``--interval`` (60 s) it prints one line: nsqd's and nsqlookupd's RSS and open file
descriptors (``/proc/<pid>``), nsqd's asyncio tasks (the count that nsqd's
``/debug/pprof/goroutine`` page prints), the same three for this driver process (the client
side), the p50/p99 latency of that interval and the message counts. At the end it stops
publishing, waits until every acknowledged message arrived where it must, and fails
(exit 1) if one is missing, a publish failed, or a figure kept growing after the warm-up:
the median of the last third of the samples after ``--warmup`` more than 10 % (plus a small
absolute slack, the noise of small integers) above the median of their first third::

    .venv/bin/python bench/soak.py --duration 1h                 # docs/RELIABILITY.md's hour
    .venv/bin/python bench/soak.py --duration 60 --interval 5    # tests/faults/test_soak.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from nsqpy.client import Consumer, Message, Producer
from nsqpy.testing import NSQCluster

TOPIC = "soak"
POLICY_TOPIC = "soak_policy"
DEAD_TOPIC = "soak_policy_dead"
GROWTH_LIMIT = 0.10
# Absolute slack on top of the 10 %: a handful of fds or tasks come and go with the churn.
SLACK = {"rss_mib": 2.0, "fds": 4, "tasks": 4, "p99_ms": 50.0}
# nsqd flushes a consumer's buffered messages every output_buffer_timeout (250 ms by default,
# as in Go): at a modest rate that alone would be the latency measured.
CONSUMER_OPTIONS: dict[str, Any] = {
    "lookupd_poll_interval": 2.0,
    "max_in_flight": 20,
    "output_buffer_timeout": 0.025,  # nsqd's --min-output-buffer-timeout
}


def parse_seconds(text: str) -> float:
    """``90``, ``90s``, ``15m`` or ``1h`` → seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m|h)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (90, 90s, 15m, 1h)")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


# -- what is measured -----------------------------------------------------------------------


def proc_rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` in MiB (``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def proc_fds(pid: int) -> int:
    """Open file descriptors of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank), 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Sample:
    """One interval's figures."""

    t: float
    nsqd_rss_mib: float
    nsqd_fds: int
    nsqd_tasks: int
    lookupd_rss_mib: float
    lookupd_fds: int
    driver_rss_mib: float
    driver_fds: int
    driver_tasks: int
    p50_ms: float
    p99_ms: float
    published: int
    received: int

    def line(self) -> str:
        return (
            f"[soak] t={self.t:.0f}s nsqd rss={self.nsqd_rss_mib:.1f}MiB fds={self.nsqd_fds}"
            f" tasks={self.nsqd_tasks} | lookupd rss={self.lookupd_rss_mib:.1f}MiB"
            f" fds={self.lookupd_fds} | driver rss={self.driver_rss_mib:.1f}MiB"
            f" fds={self.driver_fds} tasks={self.driver_tasks} | latency p50={self.p50_ms:.1f}ms"
            f" p99={self.p99_ms:.1f}ms | published={self.published} received={self.received}"
        )


# The figures checked for growth, with the slack that applies to each.
GROWTH_CHECKS = {
    "nsqd_rss_mib": "rss_mib",
    "nsqd_fds": "fds",
    "nsqd_tasks": "tasks",
    "lookupd_rss_mib": "rss_mib",
    "lookupd_fds": "fds",
    "driver_fds": "fds",
    "driver_tasks": "tasks",
    "p99_ms": "p99_ms",
}


def growth_failures(samples: list[Sample], warmup: float) -> list[str]:
    """Figures whose last third (after the warm-up) is more than 10 % above their first third."""
    steady = [s for s in samples if s.t > warmup]
    if len(steady) < 3:
        return [f"too few samples after the {warmup:g}s warm-up to judge growth: {len(steady)}"]
    third = max(1, len(steady) // 3)
    failures = []
    for name, slack_kind in GROWTH_CHECKS.items():
        first = statistics.median(getattr(s, name) for s in steady[:third])
        last = statistics.median(getattr(s, name) for s in steady[-third:])
        if last > first * (1 + GROWTH_LIMIT) + SLACK[slack_kind]:
            failures.append(f"{name} grew from {first:g} to {last:g} after the warm-up")
    return failures


# -- the traffic ----------------------------------------------------------------------------


@dataclass
class Ledger:
    """What was acknowledged to publishers and what arrived where."""

    acked: set[int] = field(default_factory=set)  # topic soak
    policy_acked: set[int] = field(default_factory=set)  # topic soak_policy
    steady: set[int] = field(default_factory=set)
    churn: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    latencies_ms: list[float] = field(default_factory=list)  # this interval's
    errors: list[str] = field(default_factory=list)
    tmp_topics: int = 0

    def missing(self) -> dict[str, int]:
        """Acknowledged messages not (yet) seen, by where they should be."""
        return {
            "steady": len(self.acked - self.steady),
            "churn": len(self.acked - self.churn),
            "policy dead letters": len(self.policy_acked - self.dead),
        }


def body_of(seq: int, delay_ms: int) -> bytes:
    return b"%d %d %d" % (seq, time.time_ns(), delay_ms)


def parse_body(body: bytes) -> tuple[int, int, int]:
    seq, sent_ns, delay_ms = body.split()
    return int(seq), int(sent_ns), int(delay_ms)


class Soak:
    """The traffic generators and the sampler, on one event loop."""

    def __init__(self, args: argparse.Namespace, cluster: NSQCluster) -> None:
        self.args = args
        self.cluster = cluster
        self.nsqd = cluster.nsqd
        self.lookupd_http = cluster.lookupd_http_addresses
        self.ledger = Ledger()
        self.samples: list[Sample] = []
        self.seq = itertools.count(1)
        self.stopping = asyncio.Event()
        self.rng = random.Random(args.seed)
        self.http: aiohttp.ClientSession | None = None

    async def api(self, method: str, path: str, body: Any = None) -> Any:
        assert self.http is not None
        data = json.dumps(body).encode() if body is not None else None
        async with self.http.request(method, self.nsqd.url + path, data=data) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"{method} {path}: {resp.status} {text}")
            return text

    async def create_channel(self, topic: str, channel: str) -> None:
        """``/channel/create`` wants the topic made first (Go's TOPIC_NOT_FOUND)."""
        await self.api("POST", f"/topic/create?topic={topic}")
        await self.api("POST", f"/channel/create?topic={topic}&channel={channel}")

    # -- publishers -------------------------------------------------------------------------

    async def publisher(self, topic: str, rate: float, acked: set[int], defer: bool) -> None:
        """Publish at ``rate``/s, replacing the producer every ``--churn`` seconds."""
        period = 1.0 / rate
        next_at = time.monotonic() + self.rng.random() * period
        while not self.stopping.is_set():
            producer = Producer(self.nsqd.tcp_address)
            renew_at = time.monotonic() + self.args.churn * (0.5 + self.rng.random())
            try:
                while not self.stopping.is_set() and time.monotonic() < renew_at:
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    next_at += period
                    seq = next(self.seq)
                    try:
                        if defer and seq % 10 == 0:
                            delay_ms = int(self.args.defer * 1000)
                            await producer.dpub(topic, self.args.defer, body_of(seq, delay_ms))
                        else:
                            await producer.pub(topic, body_of(seq, 0))
                    except Exception as err:
                        self.ledger.errors.append(f"publish {seq} to {topic}: {err!r}")
                        continue
                    acked.add(seq)
            finally:
                await producer.close()

    # -- consumers --------------------------------------------------------------------------

    def consumer(self, topic: str, channel: str, handler: Callable[[Message], None]) -> Consumer:
        options = dict(CONSUMER_OPTIONS)
        if channel == "retry":
            options["max_attempts"] = 0  # nsqd's policy decides, not the client
        return Consumer(
            topic, channel, handler, lookupd_http_addresses=self.lookupd_http, **options
        )

    def on_steady(self, msg: Message) -> None:
        seq, sent_ns, delay_ms = parse_body(msg.body)
        self.ledger.steady.add(seq)
        if not delay_ms:
            self.ledger.latencies_ms.append((time.time_ns() - sent_ns) / 1e6)

    def on_churn(self, msg: Message) -> None:
        if msg.attempts == 1 and self.rng.random() < 0.05:
            msg.requeue(0.2, backoff=False)
            return
        self.ledger.churn.add(parse_body(msg.body)[0])

    @staticmethod
    def on_retry(msg: Message) -> None:
        msg.requeue(0, backoff=False)  # until the policy dead-letters it

    def on_dead(self, msg: Message) -> None:
        self.ledger.dead.add(parse_body(msg.body)[0])

    async def churning_consumers(self) -> None:
        """Keep a consumer on ``churn``; every ``--churn`` s start one more, close the oldest."""
        live = [self.consumer(TOPIC, "churn", self.on_churn)]
        await live[0].start()
        try:
            while not self.stopping.is_set():
                await self.wait_or_stop(self.args.churn)
                fresh = self.consumer(TOPIC, "churn", self.on_churn)
                await fresh.start()
                live.append(fresh)
                if len(live) > 2:
                    await live.pop(0).close()
            await self.wait_for(lambda: not self.ledger.acked - self.ledger.churn, "churn")
        finally:
            await asyncio.gather(*(c.close() for c in live))

    async def topic_churn(self) -> None:
        """A topic and channel created, read whole and deleted, again and again."""
        producer = Producer(self.nsqd.tcp_address)
        try:
            for k in itertools.count(1):
                if self.stopping.is_set():
                    return
                await self.one_tmp_topic(producer, f"soak_tmp_{k}")
                await self.wait_or_stop(self.args.churn)
        finally:
            await producer.close()

    async def one_tmp_topic(self, producer: Producer, topic: str) -> None:
        await self.create_channel(topic, "c")
        bodies = [b"%d" % i for i in range(20)]
        await producer.mpub(topic, bodies)
        got: set[bytes] = set()
        consumer = Consumer(
            topic, "c", lambda m: got.add(m.body), nsqd_tcp_addresses=[self.nsqd.tcp_address]
        )
        await consumer.start()
        try:
            await self.wait_for(lambda: len(got) == len(bodies), topic, timeout=30)
        finally:
            await consumer.close()
        await self.api("POST", f"/channel/delete?topic={topic}&channel=c")
        await self.api("POST", f"/topic/delete?topic={topic}")
        self.ledger.tmp_topics += 1

    # -- waiting ----------------------------------------------------------------------------

    async def wait_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def wait_for(self, done: Callable[[], bool], what: str, timeout: float = 60) -> None:
        """Poll ``done`` with a deadline; a miss is recorded as an error, not raised."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                self.ledger.errors.append(f"{what}: not everything arrived within {timeout:g}s")
                return
            await asyncio.sleep(0.05)

    # -- the sampler ------------------------------------------------------------------------

    async def nsqd_tasks(self) -> int:
        text = await self.api("GET", "/debug/pprof/goroutine")
        m = re.search(r"^asyncio tasks: (\d+)$", text, re.M)
        return int(m.group(1)) if m else -1

    async def sample(self, started: float) -> Sample:
        nsqd_pid, lookupd_pid, me = self.nsqd.pid, self.cluster.lookupd.pid, os.getpid()
        latencies, self.ledger.latencies_ms = self.ledger.latencies_ms, []
        return Sample(
            t=time.monotonic() - started,
            nsqd_rss_mib=proc_rss_mib(nsqd_pid),
            nsqd_fds=proc_fds(nsqd_pid),
            nsqd_tasks=await self.nsqd_tasks(),
            lookupd_rss_mib=proc_rss_mib(lookupd_pid),
            lookupd_fds=proc_fds(lookupd_pid),
            driver_rss_mib=proc_rss_mib(me),
            driver_fds=proc_fds(me),
            driver_tasks=len(asyncio.all_tasks()),
            p50_ms=percentile(latencies, 0.50),
            p99_ms=percentile(latencies, 0.99),
            published=len(self.ledger.acked) + len(self.ledger.policy_acked),
            received=len(self.ledger.steady),
        )

    async def sampler(self, started: float) -> None:
        while not self.stopping.is_set():
            await self.wait_or_stop(self.args.interval)
            if self.stopping.is_set():
                return
            sample = await self.sample(started)
            self.samples.append(sample)
            print(sample.line(), flush=True)

    # -- the run ----------------------------------------------------------------------------

    async def run(self) -> None:
        args = self.args
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            policy = {"max_attempts": 3, "dead_letter_topic": DEAD_TOPIC}
            await self.api("POST", f"/channel/policy?topic={POLICY_TOPIC}&channel=retry", policy)
            await self.create_channel(DEAD_TOPIC, "ch")
            for channel in ("steady", "churn"):
                await self.create_channel(TOPIC, channel)
            fixed = [
                self.consumer(TOPIC, "steady", self.on_steady),
                self.consumer(POLICY_TOPIC, "retry", self.on_retry),
                self.consumer(DEAD_TOPIC, "ch", self.on_dead),
            ]
            for consumer in fixed:
                await consumer.start()
            started = time.monotonic()
            per_publisher = args.rate / args.publishers
            publishers: list[Awaitable[None]] = [
                self.publisher(TOPIC, per_publisher, self.ledger.acked, True)
                for _ in range(args.publishers)
            ]
            publishers.append(
                self.publisher(POLICY_TOPIC, args.rate / 10, self.ledger.policy_acked, False)
            )
            tasks = [asyncio.ensure_future(p) for p in publishers]
            others = [
                asyncio.ensure_future(c)
                for c in (self.churning_consumers(), self.topic_churn(), self.sampler(started))
            ]
            await asyncio.sleep(args.duration)
            self.stopping.set()
            await asyncio.gather(*tasks)
            await self.wait_for(lambda: not self.ledger.acked - self.ledger.steady, "steady")
            await self.wait_for(
                lambda: not self.ledger.policy_acked - self.ledger.dead, "dead letters"
            )
            await asyncio.gather(*others)
            for consumer in fixed:
                await consumer.close()
        finally:
            await self.http.close()


def report(soak: Soak, args: argparse.Namespace) -> int:
    ledger = soak.ledger
    missing = {k: v for k, v in ledger.missing().items() if v}
    failures = [*ledger.errors[:20], *growth_failures(soak.samples, args.warmup)]
    if missing:
        failures.append(f"acknowledged messages lost: {missing}")
    print(
        f"[soak] published {len(ledger.acked)} to {TOPIC} and {len(ledger.policy_acked)} to"
        f" {POLICY_TOPIC}; {ledger.tmp_topics} temporary topics created, read and deleted;"
        f" lost: {sum(missing.values())}; publish/arrival errors: {len(ledger.errors)}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": [asdict(s) for s in soak.samples], "failures": failures}, f)
    for failure in failures:
        print(f"[soak] FAIL: {failure}")
    print("[soak] FAIL" if failures else "[soak] OK: nothing lost, nothing kept growing")
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=parse_seconds, default=3600.0, help="how long (1h)")
    p.add_argument("--interval", type=parse_seconds, default=60.0, help="between samples (60s)")
    p.add_argument(
        "--warmup", type=parse_seconds, default=None, help="not judged (a quarter, at most 10m)"
    )
    p.add_argument("--rate", type=float, default=100.0, help="messages/s to topic soak (100)")
    p.add_argument("--publishers", type=int, default=2, help="concurrent publishers (2)")
    p.add_argument("--churn", type=parse_seconds, default=10.0, help="connection churn period")
    p.add_argument("--defer", type=float, default=0.5, help="DPUB delay, seconds (0.5)")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--json", help="also write the samples and failures to this file")
    p.add_argument("--spark", action="store_true", help="a Spark query reading throughout")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = min(args.duration / 4, 600.0)
    return args


class SparkReader:
    """``--spark``: a streaming query reading topic ``soak`` (channel ``spark``) into Parquet
    for the whole run, every 5 s; at the end every acknowledged message must be in the Parquet
    output exactly once."""

    def __init__(self, nsqd: Any, work: str) -> None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need nsqpy
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession

        from nsqpy.spark import NSQDataSource

        self.out = os.path.join(work, "parquet")
        self.spark = (
            SparkSession.builder.master("local[1]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        self.spark.dataSource.register(NSQDataSource)
        events = (
            self.spark.readStream.format("nsq")
            .option("nsqdTCPAddresses", nsqd.tcp_address)
            .option("nsqdHTTPAddresses", nsqd.http_address)
            .option("topic", TOPIC)
            .option("channel", "spark")
            .option("walLocation", os.path.join(work, "wal"))
            .load()
        )
        self.query = (
            events.select("body")
            .writeStream.format("parquet")
            .option("path", self.out)
            .option("checkpointLocation", os.path.join(work, "checkpoint"))
            .trigger(processingTime="5 seconds")
            .start()
        )

    def seqs(self) -> list[int]:
        if not os.path.isdir(self.out):
            return []
        rows = self.spark.read.parquet(self.out).select("body").collect()
        return [parse_body(bytes(row.body))[0] for row in rows]

    def finish(self, acked: set[int], timeout: float = 180.0) -> list[str]:
        """Wait until the Parquet output holds every acknowledged message; the failures."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.query.exception() is not None:
                    return [f"spark query failed: {self.query.exception()}"]
                seqs = self.seqs()
                missing = acked - set(seqs)
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(5)
            duplicates = len(seqs) - len(set(seqs))
            print(f"[soak] spark: {len(seqs)} rows in Parquet, {duplicates} duplicates")
            failures = [f"spark: {len(missing)} acknowledged messages not in Parquet"]
            failures += [f"spark: {duplicates} duplicate rows in Parquet"]
            return [f for f, bad in zip(failures, (missing, duplicates), strict=True) if bad]
        finally:
            self.query.stop()
            self.spark.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    flags = {"mem_queue_size": 100, "msg_timeout": "10s"}
    with NSQCluster(1, nsqd_flags=flags) as cluster, tempfile.TemporaryDirectory() as work:
        print(
            f"[soak] nsqd pid {cluster.nsqd.pid} {cluster.nsqd.tcp_address}, nsqlookupd pid"
            f" {cluster.lookupd.pid}; {args.duration:g}s at {args.rate:g} msg/s",
            flush=True,
        )
        if args.spark:  # the channel first: nothing published before the query starts is lost
            cluster.nsqd.create_topic(TOPIC)
            cluster.nsqd.create_channel(TOPIC, "spark")
        spark = SparkReader(cluster.nsqd, work) if args.spark else None
        soak = Soak(args, cluster)
        asyncio.run(soak.run())
        if spark is not None:
            soak.ledger.errors.extend(spark.finish(soak.ledger.acked))
    return report(soak, args)


if __name__ == "__main__":
    sys.exit(main())
