"""Fixtures for the end-to-end suite: nsqd as a real process on 127.0.0.1, port 0."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.procs import NSQD, ServerPool, ServerProcess
from tests.support.rawclient import RawClient

_names = itertools.count(1)

Connect = Callable[..., RawClient]


@pytest.fixture
def nsqd_pool(tmp_path: Path) -> Iterator[ServerPool]:
    pool = ServerPool(NSQD, tmp_path)
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def nsqd_factory(nsqd_pool: ServerPool) -> Callable[..., ServerProcess]:
    """``nsqd_factory(msg_timeout="1s", mem_queue_size=10)`` starts an nsqd with those flags.

    Keyword options become ``--flag=value`` (underscores → dashes); positional
    strings are passed as they are. Every nsqd started is stopped at teardown.
    """
    return nsqd_pool.start


@pytest.fixture
def nsqd(nsqd_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A fresh nsqd with default options, for this test only."""
    return nsqd_factory()


@pytest.fixture(scope="module")
def shared_nsqd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One nsqd with default options for a whole module of independent tests.

    Only for tests that use their own topic names and do not depend on global state.
    """
    pool = ServerPool(NSQD, tmp_path_factory.mktemp("shared-nsqd"))
    try:
        yield pool.start()
    finally:
        pool.stop_all()


def _connector(server: ServerProcess) -> tuple[Connect, list[RawClient]]:
    clients: list[RawClient] = []

    def factory(*, magic: bytes | None = b"  V2", timeout: float = 5.0) -> RawClient:
        client = RawClient(server.tcp_address, magic=magic, timeout=timeout)
        clients.append(client)
        return client

    return factory, clients


@pytest.fixture
def connect(nsqd: ServerProcess) -> Iterator[Connect]:
    """``connect()`` opens a raw V2 connection (magic sent) to the ``nsqd`` fixture."""
    factory, clients = _connector(nsqd)
    yield factory
    for client in clients:
        client.close()


@pytest.fixture
def shared_connect(shared_nsqd: ServerProcess) -> Iterator[Connect]:
    """Like ``connect`` but to the module's ``shared_nsqd``."""
    factory, clients = _connector(shared_nsqd)
    yield factory
    for client in clients:
        client.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (valid per spec §2.6)."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name)[:40]
    return f"{base}_{next(_names)}"
