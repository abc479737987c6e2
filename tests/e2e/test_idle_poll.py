"""nsqd's polling before it sleeps (--idle-poll; nsqpy/common/idlepoll.py), in a real process:
round trips over TCP and HTTP with polling off and at its largest window, and an nsqd left
idle after a burst of round trips that stops polling."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from http.client import HTTPConnection

import pytest

from tests.support.procs import ServerProcess
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.timeout(60)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def round_trips(server: ServerProcess, topic: str, n: int) -> None:
    """n PUBs over TCP and n /pub over HTTP, each waiting for its OK; then all 2n consumed."""
    consumer = RawClient(server.tcp_address)
    consumer.sub(topic, "ch")
    publisher = RawClient(server.tcp_address)
    assert server.http_address is not None
    host, _, port = server.http_address.rpartition(":")
    http = HTTPConnection(host, int(port), timeout=5)
    try:
        for i in range(n):
            publisher.pub(topic, b"tcp %d" % i)
            http.request("POST", f"/pub?topic={topic}", body=b"http %d" % i)
            reply = http.getresponse()
            assert (reply.status, reply.read()) == (200, b"OK")
        consumer.rdy(2 * n)
        bodies = set()
        for msg in consumer.read_messages(2 * n):
            bodies.add(msg.body)
            consumer.fin(msg.id)
        assert bodies == {b"%s %d" % (kind, i) for kind in (b"tcp", b"http") for i in range(n)}
    finally:
        http.close()
        publisher.close()
        consumer.close()


@pytest.mark.parametrize("window", ["0", "10ms"])
def test_round_trips_with_polling_off_and_at_its_largest(
    nsqd_factory: Callable[..., ServerProcess], topic: str, window: str
) -> None:
    round_trips(nsqd_factory(idle_poll=window), topic, 300)


def test_an_idle_nsqd_stops_polling(nsqd_factory: Callable[..., ServerProcess], topic: str) -> None:
    """After round trips that grew the window to 10 ms, an nsqd that hears nothing sleeps:
    over a second of quiet it uses almost no CPU (polling on would take most of the second)."""
    server = nsqd_factory(idle_poll="10ms")
    round_trips(server, topic, 300)
    before = cpu_seconds(server.pid)
    time.sleep(1.0)  # the quiet being measured, not a wait for an event
    used = cpu_seconds(server.pid) - before
    assert used < 0.1, f"{used:.2f} s of CPU in a quiet second"
