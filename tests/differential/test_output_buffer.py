"""When a lone message goes out to a consumer with RDY to spare: at a flush of its output
buffer. Go's messagePump flushes on a ticker started with the consumer, and a tick that
nobody took waits in the ticker's channel: after a quiet spell longer than
``output_buffer_timeout`` a message goes at once; within one, at the next tick. nsqpy's
nsqd must do the same, not hold every lone message for the whole timeout."""

from __future__ import annotations

import random
import statistics
import time

from tests.differential.harness import Pair
from tests.support.rawclient import RawClient, consumer

TIMEOUT = 0.2  # the consumer's output_buffer_timeout


def delays(address: str, topic: str, quiet: tuple[float, float]) -> list[float]:
    """Seconds from each PUB's OK to its delivery, for messages published one at a time,
    each after a quiet spell drawn from ``quiet`` (the pacing is the scenario)."""
    rng = random.Random(7)
    out: list[float] = []
    with consumer(address, topic, "c", rdy=50, output_buffer_timeout=int(TIMEOUT * 1000)) as reader:
        with RawClient(address) as pub:
            for i in range(6):
                time.sleep(rng.uniform(*quiet))
                pub.pub(topic, b"%d" % i)
                sent = time.monotonic()
                message = reader.read_message(timeout=2.0)
                out.append(time.monotonic() - sent)
                reader.fin(message.id)
    return out


def test_a_lone_message_goes_at_the_next_tick_or_at_once_like_go(pair: Pair) -> None:
    for server, topic in ((pair.go, "tick_go"), (pair.py, "tick_py")):
        # quiet for longer than the timeout: a tick is waiting, the message goes at once
        after_quiet = delays(server.tcp_address, topic, (TIMEOUT + 0.05, TIMEOUT + 0.15))
        assert max(after_quiet) < 0.06, (server, after_quiet)
        # right after a flush: the next tick, within the timeout (never a whole one more)
        busy = delays(server.tcp_address, topic, (0.01, 0.09))
        assert max(busy) < TIMEOUT + 0.1, (server, busy)
        assert statistics.median(busy) > TIMEOUT / 3, (server, busy)
