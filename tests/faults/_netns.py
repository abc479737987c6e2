"""Private networks for the partition tests: Linux network namespaces joined by veth pairs.

A :class:`Net` is a router namespace and one namespace per node (nsqd, nsqlookupd, a
consumer...), each node joined to the router by a veth pair (node side ``eth0``,
``10.28.<n>.2/24``; router side ``n<n>``, ``10.28.<n>.1``, the node's default route). Every
address lives inside those namespaces, so nothing is visible from the host or from another
test's net, and ports can be 0 as everywhere else. Servers run in a node with
``ip netns exec`` (which execs, so the process id is the server's); the test itself reaches a
node through :meth:`Net.call`, which runs a function in a thread that has joined the node's
namespace (``setns(2)`` changes the calling thread only).

Faults, as the kernel here allows them (it has no ``netem``, so no added delay):

* :meth:`Net.cut` / :meth:`Net.heal`: the node's link down / up (``ip link set``): every
  packet to or from it is lost, connections are not closed (nobody is told; a new
  connection is refused at once by the router, "network is unreachable");
* :meth:`Net.cut_between`: two nodes cut off from each other only (iptables ``DROP`` at the
  router, silently: a new connection times out), both keep their other links;
* :meth:`Net.lose`: ``iptables -m statistic --mode random`` drops a share of the packets on
  every link, each way (the router's FORWARD chain for packets towards the router, each
  node's INPUT from ``eth0`` for packets towards the node).

:meth:`Net.close` deletes every namespace (their veths go with them); a net left behind by a
test process that was killed is deleted by the next :class:`Net` (namespace names carry the
process id).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from tests.faults.conftest import require_prerequisite

__all__ = ["Net", "Node", "ensure_iptables", "network_namespaces"]

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
PREFIX = "nsqpyf"
_nets = itertools.count(1)
_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str) -> str:
    """Run ``ip <args>``; raises with its stderr if it fails."""
    return _run("ip", *args)


def _run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def ensure_iptables() -> str:
    """The ``iptables`` command, installed from Debian's archive when missing (as root, as in
    CI: ``apt-get update`` first); skipped elsewhere (a failure in CI)."""
    found = shutil.which("iptables")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "iptables"]):
            subprocess.run(argv, capture_output=True, env=env, check=False, timeout=300)
        found = shutil.which("iptables")
    require_prerequisite(found is not None, "iptables is missing (Debian package iptables)")
    assert found is not None
    return found


def _remove_leftovers() -> None:
    """Namespaces of earlier test processes that are gone (killed before their teardown)."""
    for name in ip("netns", "list").split():
        m = re.fullmatch(rf"{PREFIX}(\d+)-\d+-\w+", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            with contextlib.suppress(RuntimeError):
                ip("netns", "delete", name)


@dataclass(frozen=True)
class Node:
    """One namespace on the net: its name, its address and the router's end of its link."""

    name: str
    netns: str
    address: str
    link: str

    def join(self, port: int | str) -> str:
        """``<address>:<port>``."""
        return f"{self.address}:{port}"


class Net:
    """A router and its nodes, each in its own network namespace (see the module doc)."""

    def __init__(self) -> None:
        _remove_leftovers()
        self._prefix = f"{PREFIX}{os.getpid()}-{next(_nets)}-"
        self.router = self._prefix + "router"
        self.nodes: dict[str, Node] = {}
        self._namespaces: list[str] = []
        self._losing = False
        self._add_namespace(self.router)
        ip("-n", self.router, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", self.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self._namespaces.append(name)

    def add(self, name: str) -> Node:
        """A new node joined to the router (named ``name`` in this net)."""
        n = len(self.nodes) + 1
        netns = self._prefix + name
        node = Node(name, netns, f"10.28.{n}.2", f"n{n}")
        self._add_namespace(netns)
        peer = ("peer", "eth0", "netns", netns)
        ip("-n", self.router, "link", "add", node.link, "type", "veth", *peer)
        ip("-n", self.router, "addr", "add", f"10.28.{n}.1/24", "dev", node.link)
        ip("-n", self.router, "link", "set", node.link, "up")
        ip("-n", netns, "link", "set", "lo", "up")
        ip("-n", netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "route", "add", "default", "via", f"10.28.{n}.1")
        self.nodes[name] = node
        return node

    # -- faults -----------------------------------------------------------------------------

    def cut(self, node: Node) -> None:
        """Take the node's link down: nothing reaches it or leaves it."""
        ip("-n", self.router, "link", "set", node.link, "down")

    def heal(self, node: Node) -> None:
        """Bring the node's link up again (its address and route come back with it)."""
        ip("-n", self.router, "link", "set", node.link, "up")

    def cut_between(self, a: Node, b: Node, *, heal: bool = False) -> None:
        """Drop every packet between ``a`` and ``b`` (silently, at the router), both ways;
        each keeps its other links. ``heal=True`` lets them through again."""
        iptables = ensure_iptables()
        action = "-D" if heal else "-I"
        for src, dst in ((a, b), (b, a)):
            rule = ["FORWARD", "-s", src.address, "-d", dst.address, "-j", "DROP"]
            _run("ip", "netns", "exec", self.router, iptables, action, *rule)

    def lose(self, probability: float) -> None:
        """Drop ``probability`` of the packets on every link, both ways (0 stops it)."""
        iptables = ensure_iptables()
        if self._losing:
            self._iptables(iptables, "-F")
            self._losing = False
        if probability <= 0:
            return
        rule = ["-m", "statistic", "--mode", "random", "--probability", f"{probability}"]
        _run("ip", "netns", "exec", self.router, iptables, "-A", "FORWARD", *rule, "-j", "DROP")
        for node in self.nodes.values():
            _run("ip", "netns", "exec", node.netns, iptables, "-A", "INPUT", "-i", "eth0", *rule,
                 "-j", "DROP")  # fmt: skip
        self._losing = True

    def _iptables(self, iptables: str, *args: str) -> None:
        for netns in (self.router, *(node.netns for node in self.nodes.values())):
            _run("ip", "netns", "exec", netns, iptables, *args)

    # -- running things inside --------------------------------------------------------------

    def argv(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` run inside ``node`` (``ip netns exec`` execs it: same process id)."""
        return ["ip", "netns", "exec", node.netns, *argv]

    def call(self, node: Node, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a thread that has joined ``node``'s network namespace."""
        outcome: list[object] = []

        def run() -> None:
            try:
                fd = os.open(f"/run/netns/{node.netns}", os.O_RDONLY)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns {node.netns}: {os.strerror(err)}")
                finally:
                    os.close(fd)
                outcome.append(fn(*args))
            except BaseException as err:
                outcome.append(err)

        thread = threading.Thread(target=run, name=f"netns-{node.name}", daemon=True)
        thread.start()
        thread.join()
        (result,) = outcome
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[return-value]

    def close(self) -> None:
        """Delete every namespace of this net (their links go with them)."""
        for netns in reversed(self._namespaces):
            with contextlib.suppress(RuntimeError):
                ip("netns", "delete", netns)
        self._namespaces.clear()


@contextlib.contextmanager
def network_namespaces() -> Iterator[Net]:
    """A :class:`Net`, deleted at the end whatever happened; skipped unless root (a failure
    in CI)."""
    require_prerequisite(os.geteuid() == 0, "network namespaces need root")
    require_prerequisite(shutil.which("ip") is not None, "the ip command (iproute2) is missing")
    net = Net()
    try:
        yield net
    finally:
        net.close()
