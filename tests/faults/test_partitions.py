"""Network partitions (docs/RELIABILITY.md "Network partitions"): links cut and healed, and
packet loss, between nsqd, nsqlookupd and consumers each in its own network namespace
(tests/faults/_netns.py).

* nsqd cut off from nsqlookupd for longer than nsqlookupd's ``--inactive-producer-timeout``,
  then healed: the producer leaves ``/lookup`` and comes back with every topic and channel.
  Consumers that find nsqd through nsqlookupd (the nsqpy client and Go's ``nsq_tail``) keep
  reading when only nsqlookupd lost nsqd, and reconnect after the heal when nsqd was cut off
  from everyone. Ours and Go's nsqd/nsqlookupd side by side in the same net, each with both
  faults, at the same moment.
* a consumer cut off mid-delivery: its in-flight messages time out and go to the other
  consumer; nothing is lost and the duplicates are exactly the timed-out messages it had
  received (ours and Go's nsqd).
* 5 % packet loss on every link during steady publishing: nothing acknowledged is lost;
  the latency figures are printed (``-s`` shows them).

Root only (namespaces); skipped otherwise, a failure in CI. Every process is stopped and
every namespace deleted at teardown, whatever happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nsqpy.testing import NSQLookupd, ServerProcess
from nsqpy.testing._http import get_json
from nsqpy.testing._servers import NSQD as _NSQD
from tests.differential.harness import GO_DIR, GoNSQD, GoNSQLookupd, PyNSQD, require_go
from tests.faults._netns import Net, Node, network_namespaces
from tests.faults.conftest import wait_until

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
# Go's nsqd PINGs nsqlookupd every 15 s (so does ours): anything shorter and a healthy
# producer would flicker out of /lookup between two pings.
INACTIVE = 16.0
S = TypeVar("S", _NSQD, NSQLookupd)


class Lab:
    """A :class:`Net` and every process started in it, stopped before the net goes."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.servers: list[_NSQD | NSQLookupd] = []
        self.agents: list[ServerProcess] = []

    def server(self, cls: type[S], node: Node, **flags: object) -> S:
        """``cls`` (one of nsqpy.testing's servers or the Go ones) started inside ``node``."""
        net = self.net

        class Placed(cls):  # type: ignore[valid-type,misc]
            @property
            def argv(self) -> list[str]:
                return net.argv(node, super().argv)

        addresses = {flag: f"{node.address}:0" for flag in cls.address_flags.values()}
        server: S = Placed(**addresses, broadcast_address=node.address, **flags)
        self.servers.append(server)
        return server.start()

    def lookupd(self, go: bool, node: Node) -> NSQLookupd:
        cls = GoNSQLookupd if go else NSQLookupd
        return self.server(cls, node, inactive_producer_timeout=f"{INACTIVE:g}s")

    def nsqd(self, go: bool, node: Node, **flags: object) -> _NSQD:
        return self.server(GoNSQD if go else PyNSQD, node, **flags)

    def agent(self, node: Node, *args: str) -> ServerProcess:
        """``tests/faults/_agent.py`` inside ``node``; its JSON lines are its stdout."""
        argv = [sys.executable, "-u", "-m", "tests.faults._agent", *args]
        process = ServerProcess(args[0], self.net.argv(node, argv), ready=(), cwd=REPO)
        self.agents.append(process)
        return process

    def tail(self, node: Node, lookupd: NSQLookupd, topic: str, channel: str) -> ServerProcess:
        """Go's nsq_tail, finding nsqd through ``lookupd``, with go-nsq options that notice a
        dead connection in 2 s and poll nsqlookupd every second."""
        argv = [
            str(GO_DIR / "nsq_tail"),
            f"--lookupd-http-address={lookupd.http_address}",
            f"--topic={topic}",
            f"--channel={channel}",
            "--consumer-opt=heartbeat_interval,1s",
            "--consumer-opt=read_timeout,2s",
            "--consumer-opt=lookupd_poll_interval,1s",
            "--consumer-opt=lookupd_poll_jitter,0",
            "--consumer-opt=max_backoff_duration,0",
        ]
        process = ServerProcess("nsq_tail", self.net.argv(node, argv), ready=())
        self.agents.append(process)
        return process

    def close(self) -> None:
        for agent in self.agents:
            agent.stop(timeout=5)
        for server in self.servers:
            server.close()


@pytest.fixture
def lab() -> Iterator[Lab]:
    with network_namespaces() as net:
        lab = Lab(net)
        try:
            yield lab
        finally:
            lab.close()


_parsed: weakref.WeakKeyDictionary[ServerProcess, list[dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


def records(agent: ServerProcess) -> list[dict[str, Any]]:
    """The JSON lines an agent printed so far (each parsed once: tests poll this)."""
    lines = agent.stdout_lines[: len(agent.stdout_lines)]
    parsed = _parsed.setdefault(agent, [])
    parsed.extend(json.loads(line) for line in lines[len(parsed) :])
    return list(parsed)


def bodies(agent: ServerProcess) -> list[str]:
    return [r["body"] for r in records(agent) if "body" in r]


def redelivered(agent: ServerProcess) -> set[str]:
    """Bodies the agent got again after a timeout (no REQ here: attempts > 1 is a timeout)."""
    return {r["body"] for r in records(agent) if r.get("attempts", 1) > 1}


# -- nsqd cut off from nsqlookupd and its consumers -------------------------------------------


class Stack:
    """One implementation's nsqlookupd and nsqd, in their own nodes, with two consumers that
    find nsqd through nsqlookupd (the nsqpy client and Go's nsq_tail), and the fault it gets:
    ``isolated`` (nsqd's link down: cut off from everyone) or ``from-lookupd`` (only nsqd and
    nsqlookupd cut off from each other)."""

    def __init__(self, lab: Lab, impl: str, fault: str, consumers: Node) -> None:
        self.lab = lab
        self.impl = impl
        self.fault = fault
        self.name = f"{impl} nsqd {fault}"
        go = impl == "go"
        self.lookupd_node = lab.net.add(f"{impl}{fault[0]}lookupd")
        self.nsqd_node = lab.net.add(f"{impl}{fault[0]}nsqd")
        self.lookupd = lab.lookupd(go, self.lookupd_node)
        self.nsqd = lab.nsqd(go, self.nsqd_node, lookupd_tcp_address=self.lookupd.tcp_address)
        self.topology = {"orders": {"billing", "tail"}, "audit": set()}
        for topic, channels in self.topology.items():
            self.at_nsqd(self.nsqd.create_topic, topic)
            for channel in channels:
                self.at_nsqd(self.nsqd.create_channel, topic, channel)
        self.timings: dict[str, float] = {}
        wait_until(self.registered, f"{self.name}: nsqd registers everything", 10)
        address = self.lookupd.http_address
        self.client = lab.agent(
            consumers, "consume", "--topic=orders", "--channel=billing", f"--lookupd={address}"
        )
        self.nsq_tail = lab.tail(consumers, self.lookupd, "orders", "tail")

    def cut(self, heal: bool = False) -> None:
        net = self.lab.net
        if self.fault == "from-lookupd":
            net.cut_between(self.nsqd_node, self.lookupd_node, heal=heal)
        elif heal:
            net.heal(self.nsqd_node)
        else:
            net.cut(self.nsqd_node)

    def at_nsqd(self, fn: Callable[..., object], *args: object) -> object:
        return self.lab.net.call(self.nsqd_node, fn, *args)

    def at_lookupd(self, fn: Callable[..., Any], *args: object) -> Any:
        return self.lab.net.call(self.lookupd_node, fn, *args)

    def listed(self, topic: str) -> bool:
        """``/lookup?topic=`` lists this nsqd (with its broadcast address)."""
        producers = self.at_lookupd(self.lookupd.lookup, topic)
        return any(p["broadcast_address"] == self.nsqd_node.address for p in producers)

    def registered(self) -> bool:
        """Every topic listed with this nsqd, every channel known to nsqlookupd."""
        for topic, channels in self.topology.items():
            if not self.listed(topic):
                return False
            known = self.at_lookupd(get_json, f"{self.lookupd.url}/channels?topic={topic}")
            if set(known["channels"]) != channels:
                return False
        return True

    def lookupd_connections(self) -> list[str]:
        """``ss`` lines (with timers) of the TCP connections nsqlookupd accepted."""
        port = self.lookupd.tcp_address.rpartition(":")[2]
        ss = ["ss", "-tnoH", "state", "established", f"( sport = :{port} )"]
        argv = self.lab.net.argv(self.lookupd_node, ss)
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        return out.splitlines()

    def unlisted(self) -> bool:
        return not self.listed("orders")

    def received(self, body: str) -> bool:
        """Both consumers printed ``body`` (nsq_tail prints bodies, one a line)."""
        return body in bodies(self.client) and body in self.nsq_tail.stdout_lines


Goal = tuple[str, list[Stack], Callable[[Stack], bool]]


def each_until(since: float, timeout: float, *goals: Goal) -> None:
    """Poll until every goal (event, its stacks, its check) holds for each of its stacks; when
    it first did goes in the stack's timings (seconds after ``since``). Fails naming what is
    late."""
    waiting = [(stack, event, check) for event, stacks, check in goals for stack in stacks]
    while waiting:
        for item in list(waiting):
            stack, event, check = item
            if check(stack):
                stack.timings[event] = round(time.monotonic() - since, 1)
                waiting.remove(item)
        late = [f"{stack.name}: {event}" for stack, event, _ in waiting]
        assert time.monotonic() - since < timeout, f"not within {timeout:g}s: {late}"
        time.sleep(0.1)


def test_nsqd_cut_off_from_nsqlookupd_leaves_lookup_and_comes_back(lab: Lab) -> None:
    require_go("nsqd", "nsqlookupd", "nsq_tail")
    consumers = lab.net.add("consumers")
    stacks = [
        Stack(lab, impl, fault, consumers)
        for impl in ("py", "go")
        for fault in ("isolated", "from-lookupd")
    ]
    for stack in stacks:
        stack.at_nsqd(stack.nsqd.pub, "orders", "before")
    for stack in stacks:
        wait_until(partial(stack.received, "before"), f"{stack.name}: consumers read", 20)

    cut = time.monotonic()
    for stack in stacks:
        stack.cut()
    each_until(cut, INACTIVE + 25, ("left /lookup after the cut", stacks, Stack.unlisted))
    published = time.monotonic()
    for stack in stacks:  # accepted by nsqd while nsqlookupd does not list it
        stack.at_nsqd(stack.nsqd.pub, "orders", "during")
    read: Callable[[Stack], bool] = partial(Stack.received, body="during")
    # consumers that still reach nsqd keep reading from it (go-nsq never leaves a producer;
    # the nsqpy client leaves one only while nsqlookupd still lists it in /nodes)
    reachable = [stack for stack in stacks if stack.fault == "from-lookupd"]
    each_until(published, 10, ("consumers read during the cut", reachable, read))

    healed = time.monotonic()
    for stack in stacks:
        stack.cut(heal=True)
    # Go's nsqd reconnects on its next PING, up to 15 s after the heal; ours at once
    isolated = [stack for stack in stacks if stack.fault == "isolated"]
    each_until(
        healed,
        40,
        ("registered again after the heal", stacks, Stack.registered),
        ("consumers read after the heal", isolated, read),
    )
    for stack in stacks:
        # the connection from before the cut is still open on nsqlookupd's side (nsqd's end
        # of it is gone): TCP keep-alive, on as in Go, is what ends it (~2.5 min)
        connections = stack.lookupd_connections()
        assert connections and all("keepalive" in c for c in connections), connections
    print({stack.name: stack.timings for stack in stacks})
    for stack in stacks:
        if stack.impl == "py":  # ours re-registers at once, Go's at its next PING
            assert stack.timings["registered again after the heal"] < 8, stack.timings


# -- a consumer cut off mid-delivery -----------------------------------------------------------


@pytest.mark.parametrize("impl", ["py", "go"])
def test_consumer_cut_off_mid_delivery_loses_nothing(lab: Lab, impl: str) -> None:
    if impl == "go":
        require_go("nsqd")
    node = lab.net.add("nsqd")
    nsqd = lab.nsqd(impl == "go", node, msg_timeout="2s")
    lab.net.call(node, nsqd.create_topic, "jobs")
    lab.net.call(node, nsqd.create_channel, "jobs", "work")
    hold = 0.3
    slow_node, fast_node = lab.net.add("slow"), lab.net.add("fast")
    common = ("--topic=jobs", "--channel=work", f"--nsqd={nsqd.tcp_address}", "--max-in-flight=5")
    slow = lab.agent(slow_node, "consume", *common, f"--hold={hold}")
    fast = lab.agent(fast_node, "consume", *common, "--hold=0.02")
    total = 600
    lab.net.call(node, nsqd.mpub, "jobs", [f"m{i}" for i in range(total)])

    wait_until(lambda: len(bodies(slow)) >= 10, "the slow consumer gets messages", 20)
    cut_ns = time.time_ns()
    lab.net.cut(slow_node)
    # held (not yet finished) when the link went down: their FIN cannot get out (50 ms for
    # the cut itself to happen); they time out and go to the other consumer meanwhile
    since = cut_ns - hold * 1e9 + 50e6
    held = {r["body"] for r in records(slow) if "body" in r and since < r["at"] < cut_ns}
    assert held, "the consumer had nothing in flight at the cut"
    wait_until(lambda: held <= redelivered(fast), "the held messages go to the other", 20)
    sent = {f"m{i}" for i in range(total)}
    wait_until(lambda: sent <= set(bodies(fast)) | set(bodies(slow)), "all delivered", 30)
    lab.net.heal(slow_node)
    # the cut-off consumer reconnects; what is published after the heal arrives too
    wait_until(lambda: clients(lab.net, node, nsqd, "jobs") == 2, "the consumer reconnects", 20)
    after = [f"after{i}" for i in range(20)]
    lab.net.call(node, nsqd.mpub, "jobs", after)
    everything = sent | set(after)
    wait_until(
        lambda: everything <= set(bodies(fast)) | set(bodies(slow)), "all delivered after", 20
    )

    deliveries = Counter(bodies(slow) + bodies(fast))
    duplicates = {body for body, n in deliveries.items() if n > 1}
    timed_out = redelivered(slow) | redelivered(fast)
    # exactly the timed-out messages that the cut-off consumer had received
    assert duplicates == timed_out & set(bodies(slow))
    timeouts = channel_stats(lab.net, node, nsqd, "jobs")["timeout_count"]
    assert timeouts >= len(timed_out), (timeouts, len(timed_out))
    print(
        f"{impl} nsqd: {len(held)} held at the cut, {len(timed_out)} redelivered after a "
        f"timeout (timeout_count {timeouts}), {len(duplicates)} duplicates, 0 lost"
    )


def channel_stats(net: Net, node: Node, nsqd: _NSQD, topic: str) -> dict[str, Any]:
    """The ``/stats`` of ``topic``'s one channel."""
    stats = net.call(node, nsqd.stats, topic)
    (found,) = [t for t in stats["topics"] if t["topic_name"] == topic]
    (channel,) = found["channels"]
    return dict(channel)


def clients(net: Net, node: Node, nsqd: _NSQD, topic: str) -> int:
    """Consumers subscribed to ``topic``'s one channel."""
    return len(channel_stats(net, node, nsqd, topic)["clients"])


# -- packet loss --------------------------------------------------------------------------------


def loss_seconds() -> float:
    """A minute locally, 15 s in CI (NSQPY_FAULT_LOSS_SECONDS overrides)."""
    default = "15" if os.environ.get("CI") == "true" else "60"
    return float(os.environ.get("NSQPY_FAULT_LOSS_SECONDS", default))


def loss_percent() -> float:
    """5 % (NSQPY_FAULT_LOSS_PERCENT overrides it, 0 for the figures without loss)."""
    return float(os.environ.get("NSQPY_FAULT_LOSS_PERCENT", "5"))


@pytest.mark.timeout(240)
def test_five_percent_packet_loss_loses_nothing(lab: Lab) -> None:
    net = lab.net
    lookupd_node, nsqd_node = net.add("lookupd"), net.add("nsqd")
    pub_node, c1_node, c2_node = net.add("pub"), net.add("c1"), net.add("c2")
    lookupd = lab.lookupd(False, lookupd_node)
    nsqd = lab.nsqd(False, nsqd_node, lookupd_tcp_address=lookupd.tcp_address)
    net.call(nsqd_node, nsqd.create_topic, "steady")
    net.call(nsqd_node, nsqd.create_channel, "steady", "all")
    consume = ("consume", "--topic=steady", "--channel=all", f"--lookupd={lookupd.http_address}")
    c1, c2 = lab.agent(c1_node, *consume), lab.agent(c2_node, *consume)
    for consumer in (c1, c2):
        wait_until(partial(records, consumer), "a consumer starts", 20)
    wait_until(lambda: clients(net, nsqd_node, nsqd, "steady") == 2, "both subscribe", 20)

    seconds, rate, percent = loss_seconds(), 100, loss_percent()
    count = int(seconds * rate)
    publisher = lab.agent(
        pub_node, "publish", f"--nsqd={nsqd.tcp_address}", "--topic=steady",
        f"--rate={rate}", f"--count={count}",
    )  # fmt: skip
    # the loss starts once the publisher is connected: under loss a dial can fail (a lost
    # SYN is sent again after 1 s, go-nsq's and nsqpy's dial timeout), a clear error
    wait_until(partial(records, publisher), "the publisher connects", 20)
    net.lose(percent / 100)
    wait_until(
        lambda: any(r.get("done") for r in records(publisher)), "publishing ends", seconds + 60
    )
    net.lose(0)
    acked = {str(r["acked"]) for r in records(publisher) if "acked" in r}
    failed = [r for r in records(publisher) if "failed" in r]

    def seen() -> set[str]:
        return {body.split()[0] for body in bodies(c1) + bodies(c2)}

    wait_until(lambda: acked <= seen(), "every acknowledged message arrives", 60)
    first: dict[str, float] = {}
    for r in records(c1) + records(c2):
        if "body" in r:
            seq, sent_ns = r["body"].split()
            latency = (r["at"] - int(sent_ns)) / 1e6
            first[seq] = min(first.get(seq, latency), latency)
    ordered = sorted(first.values())
    p50, p99 = ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99)]
    print(
        f"{percent:g}% loss on every link, {seconds:g}s at {rate}/s: {len(acked)} acked, "
        f"{len(failed)} publishes failed, 0 lost; latency p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )
    assert len(acked) + len(failed) == count
    errors = Counter(r["error"] for r in failed)
    assert not failed, f"publishes failed: {errors}\n{publisher.log_text()[-3000:]}"
