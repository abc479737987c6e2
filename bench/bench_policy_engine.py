#!/usr/bin/env python3
"""The engine's publish → deliver → FIN path in one process, with or without message policies.

Unlike the other tools this imports nsqpy: it drives ``NSQD`` directly (no sockets), so the
figure is the engine's CPU per message, the part policies change (docs/POLICIES.md), and it
is measured in CPU time (``time.process_time``), steady on a busy machine. MPUB batches of
200 messages of 200 bytes go into a topic with one channel and one consumer (RDY 2500) that
FINs in batches; the best of 7 rounds of 400,000 messages is printed.

    uv run python bench/bench_policy_engine.py
    uv run python bench/bench_policy_engine.py --max-attempts=5 --message-ttl=3600 --max-queue-depth=100000000
    uv run python bench/bench_policy_engine.py --rounds 1 --batches 10   # a smoke run (the tests')

Compare two trees by running it with ``PYTHONPATH=<tree>`` from outside both.
"""

from __future__ import annotations

import argparse
import io
import time

from nsqpy.common.log import Logger
from nsqpy.nsqd.channel import InFlight
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options

ROUNDS = 7
BATCHES = 2000
BATCH = 200


class Consumer:
    """The smallest channel.Consumer: counts what it is sent."""

    def __init__(self) -> None:
        self.ready_count = 2500
        self.in_flight: dict[bytes, InFlight] = {}
        self.irregular_in_flight = False
        self.msg_timeout = 60.0
        self.sample_rate = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.received = 0

    def send_messages(self, frames: list[bytes], count: int, nbytes: int) -> None:
        self.received += count

    def close_for_exit(self) -> None:
        pass


def one_round(opts: Options, batches: int = BATCHES) -> float:
    nsqd = NSQD(opts, logger=Logger("", stream=io.StringIO()))
    topic = nsqd.get_topic("t")
    channel = topic.get_channel("c")
    consumer = Consumer()
    channel.add_client(consumer)
    bodies = [b"x" * 200] * BATCH
    start = time.process_time()
    for _ in range(batches):
        topic.put_messages(bodies)
        if len(consumer.in_flight) >= 2000:
            channel.finish_many(consumer, list(consumer.in_flight))
            channel.dispatch()
    while consumer.in_flight:
        channel.finish_many(consumer, list(consumer.in_flight))
        channel.dispatch()
    elapsed = time.process_time() - start
    assert consumer.received == batches * BATCH, consumer.received
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-attempts", type=int, default=0)
    p.add_argument("--message-ttl", type=float, default=0.0, help="seconds")
    p.add_argument("--max-queue-depth", type=int, default=0)
    p.add_argument("--rounds", type=int, default=ROUNDS, help="rounds; the best is printed")
    p.add_argument(
        "--batches", type=int, default=BATCHES, help=f"MPUBs of {BATCH} messages per round"
    )
    args = p.parse_args()
    if args.rounds < 1 or args.batches < 1:
        p.error("--rounds and --batches must be >= 1")
    # only the policy flags that are set: the tool also runs on a tree without policies
    policy = {
        k: v
        for k, v in (
            ("max_attempts", args.max_attempts),
            ("message_ttl", args.message_ttl),
            ("max_queue_depth", args.max_queue_depth),
        )
        if v
    }
    opts = Options(mem_queue_size=1_000_000, **policy)
    best = min(one_round(opts, args.batches) for _ in range(args.rounds))
    print(f"{best / (args.batches * BATCH) * 1e9:.0f} ns/msg engine cpu (best of {args.rounds})")


if __name__ == "__main__":
    main()
