"""statsd push (spec §7.9): a real nsqd sending to a UDP socket of the test."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import requests

from nsqpy.nsqd.stats import TopicStats
from nsqpy.nsqd.statsd import pack_datagrams, statsd_lines, statsd_prefix
from tests.support.procs import ServerProcess
from tests.support.rawclient import consumer

LINE = re.compile(r"^[\w.#-]+:-?\d+\|[cg]$")


@dataclass
class Push:
    datagrams: list[bytes]
    sources: set[tuple[str, int]]

    @property
    def lines(self) -> list[str]:
        text = b"".join(self.datagrams).decode()
        assert text.endswith("\n")
        return text[:-1].split("\n")

    def values(self, prefix: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in self.lines:
            assert line.startswith(prefix), line
            stat, _, value = line[len(prefix) :].partition(":")
            out[stat] = value
        return out


class StatsdListener:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def push(self, last_line: str, timeout: float = 10.0) -> Push:
        """The datagrams of one push, up to the one holding a line matching ``last_line``."""
        pattern = re.compile(last_line, re.M)
        deadline = time.monotonic() + timeout
        datagrams: list[bytes] = []
        sources: set[tuple[str, int]] = set()
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data, source = self.sock.recvfrom(65536)
            datagrams.append(data)
            sources.add(source)
            if pattern.search(data.decode()):
                return Push(datagrams, sources)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    yield listener
    listener.close()


def http_base(server: ServerProcess) -> str:
    return "http://" + server.wait_for_log(r"HTTP: listening on (\S+)").group(1)


def test_push_lines_prefix_and_counter_deltas(
    nsqd_factory: Callable[..., ServerProcess], statsd: StatsdListener
) -> None:
    server = nsqd_factory(
        statsd_address=statsd.address,
        statsd_interval="1s",
        broadcast_address="127.0.0.1",
        e2e_processing_latency_percentile="0.99",
    )
    base = http_base(server)
    port = base.rsplit(":", 1)[1]
    prefix = f"nsq.127_0_0_1_{port}."
    assert requests.post(f"{base}/topic/create?topic=st", timeout=5).status_code == 200
    assert requests.post(f"{base}/channel/create?topic=st&channel=c", timeout=5).ok
    with consumer(server.tcp_address, "st", "c", rdy=1) as c:
        assert requests.post(f"{base}/mpub?topic=st", b"a\nbb\nccc", timeout=5).ok
        c.fin(c.read_message().id)
        c.nop()
        # counters are deltas: add them up until the publish has been reported
        published = 0
        pushes: list[Push] = []
        while published < 3:
            push = statsd.push(r"mem\.gc_runs:")
            values = push.values(prefix)
            published += int(values["topic.st.message_count"].removesuffix("|c"))
            pushes.append(push)
        server.wait_for_log(rf"STATSD: pushing stats to {re.escape(statsd.address)}")
        values = pushes[-1].values(prefix)
        assert values["topic.st.depth"] == "0|g"
        assert values["topic.st.backend_depth"] == "0|g"
        assert values["topic.st.channel.c.clients"] == "1|g"
        assert values["topic.st.channel.c.deferred_count"] == "0|g"
        assert re.fullmatch(r"\d+\|g", values["topic.st.e2e_processing_latency_99"])
        assert re.fullmatch(r"\d+\|g", values["topic.st.channel.c.e2e_processing_latency_99"])
        for key in (
            "heap_objects",
            "heap_idle_bytes",
            "heap_in_use_bytes",
            "heap_released_bytes",
            "gc_pause_usec_100",
            "gc_pause_usec_99",
            "gc_pause_usec_95",
            "next_gc_bytes",
        ):
            assert values[f"mem.{key}"].endswith("|g")
        assert values["mem.gc_runs"].endswith("|c")
        # the next push has nothing new to count
        following = statsd.push(r"mem\.gc_runs:")
        values = following.values(prefix)
        assert values["topic.st.message_count"] == "0|c"
        assert values["topic.st.message_bytes"] == "0|c"
        assert values["topic.st.channel.c.message_count"] == "0|c"
        assert values["topic.st.channel.c.depth"] == "1|g"  # one delivered of three, RDY 1
        assert values["topic.st.channel.c.in_flight_count"] == "1|g"
    for push in [*pushes, following]:
        assert all(len(d) <= 508 for d in push.datagrams)
        assert all(LINE.match(line[len(prefix) :]) for line in push.lines), push.lines
    # each push comes from a new socket
    sources = [next(iter(p.sources)) for p in [*pushes, following]]
    assert all(len(p.sources) == 1 for p in [*pushes, following])
    assert len(set(sources)) == len(sources)
    # Go's order: topic lines, then its channels, then memory
    keys = list(following.values(prefix))
    assert keys.index("topic.st.message_count") < keys.index("topic.st.channel.c.message_count")
    assert keys[-1] == "mem.gc_runs"


def test_custom_prefix_small_packets_no_mem_no_ephemeral(
    nsqd_factory: Callable[..., ServerProcess], statsd: StatsdListener
) -> None:
    server = nsqd_factory(
        statsd_address=statsd.address,
        statsd_interval="1s",
        statsd_prefix="custom.%s.x",
        broadcast_address="127.0.0.1",
        broadcast_http_port=4242,
        statsd_udp_packet_size=100,
        statsd_mem_stats=False,
        statsd_exclude_ephemeral=True,
    )
    base = http_base(server)
    for path in (
        "/topic/create?topic=st",
        "/channel/create?topic=st&channel=c%23ephemeral",
        "/channel/create?topic=st&channel=d",
        "/topic/create?topic=eph%23ephemeral",
    ):
        assert requests.post(base + path, timeout=5).ok
    # the channel "d" is the last one of the last topic: its clients gauge ends a push
    push = statsd.push(r"^custom\.127_0_0_1_4242\.x\.topic\.st\.channel\.d\.clients:")
    lines = push.lines
    assert all(line.startswith("custom.127_0_0_1_4242.x.topic.st.") for line in lines), lines
    assert not any("ephemeral" in line or ".mem." in line for line in lines)
    assert all(len(d) <= 100 for d in push.datagrams)
    assert len(push.datagrams) > 1


# -- the pure parts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "address", "port", "prefix"),
    [
        ("nsq.%s", "myhost", 4151, "nsq.myhost_4151."),
        ("nsq.%s", "10.0.0.1", 4151, "nsq.10_0_0_1_4151."),
        ("nsq.%s", "::1", 4151, "nsq.[__1]_4151."),
        ("nsq.%s.", "h", 1, "nsq.h_1."),
        ("plain", "h", 1, "plain."),
        ("%s-%s", "h", 1, "h_1-h_1."),
        ("", "h", 1, ""),
    ],
)
def test_statsd_prefix(template: str, address: str, port: int, prefix: str) -> None:
    assert statsd_prefix(template, address, port) == prefix


def test_pack_datagrams_never_splits_a_line() -> None:
    lines = [b"a" * 40 + b"\n", b"b" * 40 + b"\n", b"c" * 40 + b"\n", b"d" * 150 + b"\n", b"e\n"]
    assert pack_datagrams(lines, 100) == [
        lines[0] + lines[1],
        lines[2],
        lines[3],  # longer than a packet: goes alone, whole
        lines[4],
    ]
    assert pack_datagrams([], 100) == []
    assert pack_datagrams([b"x" * 99 + b"\n"], 100) == [b"x" * 99 + b"\n"]


def _topic(name: str, count: int, channels: list[tuple[str, int]]) -> TopicStats:
    return {
        "topic_name": name,
        "channels": [
            {
                "channel_name": cname,
                "depth": 1,
                "backend_depth": 0,
                "in_flight_count": 2,
                "deferred_count": 3,
                "message_count": ccount,
                "requeue_count": ccount,
                "timeout_count": ccount,
                "client_count": 4,
                "clients": None,
                "paused": False,
                "e2e_processing_latency": {
                    "count": 1,
                    "percentiles": [{"quantile": 0.999, "value": 7}],
                },
            }
            for cname, ccount in channels
        ],
        "depth": 5,
        "backend_depth": 6,
        "message_count": count,
        "message_bytes": count * 10,
        "paused": False,
        "e2e_processing_latency": {"count": 0, "percentiles": None},
    }


def test_statsd_lines_format_and_deltas() -> None:
    last = [_topic("t", 10, [("c", 4)])]
    now = [_topic("t", 15, [("c", 6), ("new", 2)])]
    lines = [line.decode() for line in statsd_lines("p.", now, last, None, None)]
    assert lines == [
        "p.topic.t.message_count:5|c\n",
        "p.topic.t.message_bytes:50|c\n",
        "p.topic.t.depth:5|g\n",
        "p.topic.t.backend_depth:6|g\n",
        "p.topic.t.channel.c.message_count:2|c\n",
        "p.topic.t.channel.c.depth:1|g\n",
        "p.topic.t.channel.c.backend_depth:0|g\n",
        "p.topic.t.channel.c.in_flight_count:2|g\n",
        "p.topic.t.channel.c.deferred_count:3|g\n",
        "p.topic.t.channel.c.requeue_count:2|c\n",
        "p.topic.t.channel.c.timeout_count:2|c\n",
        "p.topic.t.channel.c.clients:4|g\n",
        "p.topic.t.channel.c.e2e_processing_latency_100:7|g\n",  # %.0f of 99.9
        "p.topic.t.channel.new.message_count:2|c\n",
        "p.topic.t.channel.new.depth:1|g\n",
        "p.topic.t.channel.new.backend_depth:0|g\n",
        "p.topic.t.channel.new.in_flight_count:2|g\n",
        "p.topic.t.channel.new.deferred_count:3|g\n",
        "p.topic.t.channel.new.requeue_count:2|c\n",
        "p.topic.t.channel.new.timeout_count:2|c\n",
        "p.topic.t.channel.new.clients:4|g\n",
        "p.topic.t.channel.new.e2e_processing_latency_100:7|g\n",
    ]
