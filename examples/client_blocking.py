"""Blocking producer and consumer, for threads and scripts (and Spark workers).

uv run python examples/client_blocking.py 127.0.0.1:4150 events
"""

from __future__ import annotations

import sys

from nsqpy.client import BlockingConsumer, BlockingProducer


def main(address: str, topic: str) -> None:
    with BlockingProducer(address) as producer:
        producer.mpub(topic, [b"record %d" % i for i in range(1000)])

    with BlockingConsumer(
        topic, "blocking", nsqd_tcp_addresses=[address], max_in_flight=500
    ) as consumer:
        seen = 0
        while seen < 1000:
            batch = consumer.get_batch(500, timeout=5.0)
            if not batch:
                break
            seen += len(batch)  # process the batch here
            consumer.finish(batch)  # one hop to the consumer's event loop for all FINs
        print(seen, "messages", consumer.stats())


if __name__ == "__main__":
    main(*(sys.argv[1:3] or ["127.0.0.1:4150", "events"]))
