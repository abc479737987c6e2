"""TCP keep-alive on the server's side of a client connection, read from /proc/net/tcp:
the Go nsqd's listener arms it (Go's default since 1.13: first probe after 15 s idle), so a
client that vanished without a FIN or RST (a host down, a partition) is found out by the
kernel; nsqpy's must too."""

from __future__ import annotations

import socket
import time

from tests.differential.harness import MAGIC, Pair

# /proc/net/tcp's tm->when is in clock ticks (USER_HZ)
USER_HZ = 100
KEEPALIVE_TIMER = 2  # "tr" 2: the keep-alive timer is pending


def server_side_timer(address: str) -> tuple[int, float]:
    """(the timer kind, seconds until it fires) of the server's end of a fresh connection
    to ``address``, idle once the server has answered an IDENTIFY (so it has accepted it)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(MAGIC + b"IDENTIFY\n" + len(b"{}").to_bytes(4, "big") + b"{}")
        assert conn.recv(64).endswith(b"OK")
        client_port = conn.getsockname()[1]
        deadline = time.monotonic() + 5
        while True:
            with open("/proc/net/tcp") as table:
                lines = table.read().splitlines()[1:]
            for line in lines:
                fields = line.split()
                local, remote = fields[1], fields[2]
                if (
                    int(local.split(":")[1], 16) == int(port)
                    and int(remote.split(":")[1], 16) == client_port
                ):
                    kind, when = fields[5].split(":")
                    return int(kind, 16), int(when, 16) / USER_HZ
            assert time.monotonic() < deadline, "the server's socket is not in /proc/net/tcp"
            time.sleep(0.01)


def test_client_connections_have_keepalive_like_go(pair: Pair) -> None:
    for server in (pair.go, pair.py):
        kind, seconds = server_side_timer(server.tcp_address)
        assert kind == KEEPALIVE_TIMER, (server, kind)
        assert 10 < seconds <= 15, (server, seconds)
