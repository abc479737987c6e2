"""Addresses as NSQ's Go code handles them (net.SplitHostPort, net.Addr.String())."""

from __future__ import annotations


def split_host_port(address: str) -> tuple[str, int]:
    """Go's ``net.SplitHostPort`` for ``host:port`` and ``[v6]:port``; raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, int(port)


def is_unix_address(address: str) -> bool:
    """NSQ treats an address that is not ``host:port`` as a unix socket path."""
    return "/" in address or ":" not in address


def format_address(sock_name: object) -> str:
    """A socket address as Go's ``net.Addr.String()``: ``ip:port`` or ``[v6]:port``."""
    if isinstance(sock_name, tuple):
        host, port = sock_name[0], sock_name[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(sock_name)
