"""Blocking producer and consumer, for threads and scripts (and Spark workers).

    .venv/bin/python examples/client_blocking.py 127.0.0.1:4150 records

The consumer subscribes before the producer publishes: nsqd copies a message to the
channels its topic has at that moment, so a channel made afterwards would not get these
1000 (it would get them only if the topic had no channel at all yet). Give it a topic of
its own: on a topic others publish to, the channel also gets their messages (and the
counts below include them).
"""

from __future__ import annotations

import sys

from nsqpy.client import BlockingConsumer, BlockingProducer

COUNT = 1000


def main(address: str, topic: str) -> None:
    consumer = BlockingConsumer(topic, "blocking", nsqd_tcp_addresses=[address], max_in_flight=500)
    with consumer:
        consumer.start()  # SUB: the channel exists from here on
        with BlockingProducer(address) as producer:
            producer.mpub(topic, [b"record %d" % i for i in range(COUNT)])
        seen = 0
        while seen < COUNT:
            batch = consumer.get_batch(500, timeout=5.0)
            if not batch:
                break
            seen += len(batch)  # process the batch here
            consumer.finish(batch)  # one hop to the consumer's event loop for all FINs
    # after close(): every FIN sent above has been written and counted
    print(f"published {COUNT}, finished {seen}:", consumer.stats())


if __name__ == "__main__":
    main(*(sys.argv[1:3] or ["127.0.0.1:4150", "records"]))
