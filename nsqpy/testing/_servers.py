"""Real nsqd, nsqlookupd and nsqadmin processes for tests, on free ports of 127.0.0.1.

Each server runs as ``python -m nsqpy.testing._child nsqpy.<server> <flags>`` in a
temporary directory of its own: it is ready when it has logged its listening
addresses (about half a second), and dies with the process that started it (see
:mod:`nsqpy.testing._child`). :meth:`_Server.close` stops it and removes the
directory; whatever is still open at interpreter exit is closed then.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from nsqpy.testing._http import (
    Body,
    HTTPError,
    get_json,
    mpub_request,
    post,
    pub_request,
    stats_path,
)
from nsqpy.testing._process import ServerError, ServerProcess, flag_args
from nsqpy.testing._tls import TLSFiles, make_tls_files

__all__ = ["NSQD", "NSQAdmin", "NSQCluster", "NSQLookupd"]

_open: set[_Server] = set()


@atexit.register
def _close_leftovers() -> None:
    """Servers a test did not close (it failed or was interrupted) are closed at exit."""
    for server in list(_open):
        with contextlib.suppress(Exception):
            server.close()


def normalize_flags(flags: Mapping[str, object]) -> dict[str, object]:
    """Flag names as Python identifiers: ``{"mem-queue-size": 0}`` → ``{"mem_queue_size": 0}``."""
    return {key.replace("-", "_"): value for key, value in flags.items()}


class _Server:
    """What every server has: flags, a directory, a process, addresses and a lifecycle."""

    name: ClassVar[str]
    module: ClassVar[str]
    ready: ClassVar[tuple[str, ...]]
    address_flags: ClassVar[Mapping[str, str]]
    """Listener → the flag that sets its address (pinned by :meth:`restart`)."""

    def __init__(
        self,
        *args: str,
        directory: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 15.0,
        **flags: object,
    ) -> None:
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix=f"nsqpy-{self.name}-"))
        self.args: list[str] = list(args)
        """Raw arguments, passed after the flags (Go's last occurrence wins)."""
        self.flags: dict[str, object] = {**self.default_flags(), **normalize_flags(flags)}
        """The flags the server runs with, defaults included (``mem_queue_size=0`` style)."""
        self.env = dict(env or {})
        self.timeout = timeout
        self.process: ServerProcess | None = None
        self._closed = False
        if self._own_directory:
            _open.add(self)  # the directory goes at exit even if never started or closed

    def default_flags(self) -> dict[str, object]:
        """Flags given unless overridden: every listener on ``127.0.0.1``, port 0."""
        return {flag: "127.0.0.1:0" for flag in self.address_flags.values()}

    @property
    def argv(self) -> list[str]:
        """The command line the server is (re)started with."""
        return [
            sys.executable, "-m", "nsqpy.testing._child", self.module,
            *flag_args(self.flags), *self.args,
        ]  # fmt: skip

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until it listens; raises :class:`ServerError`."""
        if self._closed:
            raise ServerError(f"{self.name} was closed")
        if not self.running:
            self.spawn()
        return self.wait_ready()

    def spawn(self) -> None:
        """Start the process without waiting: :meth:`wait_ready` waits (servers start
        side by side this way)."""
        if self._closed:
            raise ServerError(f"{self.name} was closed")
        _open.add(self)
        env = dict(self.env)
        if self._own_directory:  # removed by the child if we die before we can
            env["NSQPY_TESTING_DIRECTORY"] = str(self.directory)
        self.process = ServerProcess(
            self.name, self.argv, ready=self.ready, env=env, cwd=self.directory, watchdog=True
        )

    def wait_ready(self) -> Self:
        """Wait until the spawned server listens; on failure it is closed, with its log in
        the :class:`ServerError`."""
        try:
            self._process().wait_ready(self.timeout)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def running(self) -> bool:
        """Started and not exited."""
        return self.process is not None and self.process.returncode is None

    def stop(self, timeout: float = 10.0) -> int:
        """Graceful exit (SIGTERM; SIGKILL after ``timeout`` s). Returns the exit code."""
        if self.process is None:
            return 0
        return self.process.stop(signal.SIGTERM, timeout)

    def kill(self) -> int:
        """Crash the server (SIGKILL): nothing is flushed. :meth:`restart` brings it back."""
        if self.process is None:
            return 0
        return self.process.kill()

    def restart(self, **flags: object) -> Self:
        """Stop (gracefully, if still running) and start again on the same addresses.

        ``flags`` change flags for the new run; the data directory is kept.
        """
        if self.process is not None:
            for listener, flag in self.address_flags.items():
                address = self.process.addresses.get(listener)
                if address is not None and flag not in flags:
                    self.flags[flag] = address
            self.stop()
        self.flags.update(normalize_flags(flags))
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its directory (if it made it)."""
        self._closed = True
        _open.discard(self)
        try:
            self.stop()
        finally:
            if self._own_directory:
                shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = self.process.addresses if self.process is not None else "not started"
        return f"<{type(self).__name__} {state}>"

    # -- addresses ----------------------------------------------------------------------------

    def _process(self) -> ServerProcess:
        if self.process is None:
            raise ServerError(f"{self.name} has not been started")
        return self.process

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._process().pid

    @property
    def tcp_address(self) -> str:
        """``127.0.0.1:<port>`` of the TCP listener."""
        return self._process().tcp_address

    @property
    def http_address(self) -> str:
        """``127.0.0.1:<port>`` of the HTTP listener."""
        return self._process().address("http")

    @property
    def url(self) -> str:
        """The HTTP API's base URL, ``http://127.0.0.1:<port>``."""
        return f"http://{self.http_address}"

    def log_text(self) -> str:
        """Everything the server has logged."""
        return self._process().log_text()


def nsqd_default_flags(directory: Path) -> dict[str, object]:
    """An nsqd for tests: 127.0.0.1 port 0 for TCP and HTTP, no HTTPS, data in ``directory``."""
    return {
        "tcp_address": "127.0.0.1:0",
        "http_address": "127.0.0.1:0",
        "https_address": "",
        "broadcast_address": "127.0.0.1",
        "data_path": str(directory),
    }


def with_tls(
    flags: dict[str, object],
    given: Mapping[str, object],
    directory: Path,
    tls: bool | TLSFiles,
) -> TLSFiles | None:
    """With ``tls``, add nsqd's TLS flags (and HTTPS on port 0) to ``flags`` where the
    ``given`` flags do not set them; ``True`` makes a certificate in ``directory/tls``."""
    if not tls:
        return None
    files = make_tls_files(directory / "tls") if tls is True else tls
    given = normalize_flags(given)
    extra = {**files.nsqd_flags(), "https_address": "127.0.0.1:0"}
    flags.update({k: v for k, v in extra.items() if k not in given})
    return files


class NSQD(_Server):
    """An nsqd process: ``with NSQD(mem_queue_size=0) as nsqd: ...``.

    Keyword arguments are nsqd's flags with ``_`` for ``-`` (``msg_timeout="1s"``,
    ``lookupd_tcp_address=[...]``); positional ones are passed as they are. By default it
    listens on ``127.0.0.1`` port 0 (TCP and HTTP; no HTTPS), broadcasts ``127.0.0.1`` and
    keeps its data in its temporary directory. ``tls=True`` makes a certificate
    (:attr:`tls`, needs ``cryptography``) and turns on TLS and HTTPS.
    """

    name = "nsqd"
    module = "nsqpy.nsqd"
    ready = ("tcp",)  # logged last, after HTTP and HTTPS
    address_flags = {"tcp": "tcp_address", "http": "http_address", "https": "https_address"}

    def __init__(
        self,
        *args: str,
        directory: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 15.0,
        tls: bool | TLSFiles = False,
        **flags: object,
    ) -> None:
        super().__init__(*args, directory=directory, env=env, timeout=timeout, **flags)
        self.tls: TLSFiles | None = with_tls(self.flags, flags, self.directory, tls)
        """The certificate files when started with ``tls``."""

    def default_flags(self) -> dict[str, object]:
        """127.0.0.1 port 0 for TCP and HTTP, no HTTPS, data in :attr:`directory`."""
        return nsqd_default_flags(self.directory)

    @property
    def data_path(self) -> Path:
        """Where nsqd keeps its queues and metadata."""
        return Path(str(self.flags["data_path"]))

    @property
    def https_address(self) -> str:
        """``127.0.0.1:<port>`` of the HTTPS listener (with ``tls``)."""
        return self._process().address("https")

    def _api(self) -> tuple[str, ssl.SSLContext | None]:
        process = self._process()
        if process.http_address is None and process.https_address is not None:
            return (
                f"https://{process.https_address}",
                self.tls.client_context() if self.tls else None,
            )
        return self.url, None

    # -- helpers ------------------------------------------------------------------------------

    def pub(self, topic: str, body: Body, *, defer_ms: int | None = None) -> None:
        """Publish one message over HTTP (``POST /pub``); raises :class:`HTTPError`."""
        base, ctx = self._api()
        path, data = pub_request(topic, body, defer_ms)
        post(base + path, data, context=ctx)

    def mpub(self, topic: str, bodies: Iterable[Body]) -> None:
        """Publish several messages at once (``POST /mpub``, binary: any bytes)."""
        base, ctx = self._api()
        path, data = mpub_request(topic, bodies)
        post(base + path, data, context=ctx)

    def stats(self, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
        """``GET /stats?format=json`` (NSQ's shape: ``topics`` → ``channels`` → ``clients``)."""
        base, ctx = self._api()
        stats: dict[str, Any] = get_json(base + stats_path(topic, channel), context=ctx)
        return stats

    def create_topic(self, topic: str) -> None:
        """``POST /topic/create``."""
        base, ctx = self._api()
        post(f"{base}/topic/create?topic={topic}", context=ctx)

    def create_channel(self, topic: str, channel: str) -> None:
        """``POST /topic/create``, then ``POST /channel/create`` (which, as Go's, answers
        404 ``TOPIC_NOT_FOUND`` for a topic that does not exist)."""
        base, ctx = self._api()
        post(f"{base}/topic/create?topic={topic}", context=ctx)
        post(f"{base}/channel/create?topic={topic}&channel={channel}", context=ctx)

    def depth(self, topic: str, channel: str | None = None) -> int:
        """Messages waiting in ``topic`` (or in its ``channel``): memory + disk."""
        for t in self.stats(topic)["topics"] or ():
            if t["topic_name"] != topic:
                continue
            if channel is None:
                return int(t["depth"])
            for c in t["channels"] or ():
                if c["channel_name"] == channel:
                    return int(c["depth"])
        return 0


class NSQLookupd(_Server):
    """An nsqlookupd process (TCP and HTTP on 127.0.0.1 port 0, broadcasting 127.0.0.1)."""

    name = "nsqlookupd"
    module = "nsqpy.nsqlookupd"
    ready = ("tcp", "http")
    address_flags = {"tcp": "tcp_address", "http": "http_address"}

    def default_flags(self) -> dict[str, object]:
        """127.0.0.1 port 0 for TCP and HTTP, broadcast address 127.0.0.1."""
        return {**super().default_flags(), "broadcast_address": "127.0.0.1"}

    def lookup(self, topic: str) -> list[dict[str, Any]]:
        """The producers (nsqd) of ``topic``: ``GET /lookup``; ``[]`` for an unknown topic."""
        try:
            data = get_json(f"{self.url}/lookup?topic={topic}")
        except HTTPError as err:
            if err.status == 404:  # TOPIC_NOT_FOUND
                return []
            raise
        producers: list[dict[str, Any]] = data["producers"]
        return producers

    def nodes(self) -> list[dict[str, Any]]:
        """Every registered nsqd: ``GET /nodes``."""
        producers: list[dict[str, Any]] = get_json(f"{self.url}/nodes")["producers"]
        return producers

    def wait_for_nodes(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until ``count`` nsqd have registered; their ``/nodes`` entries."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.nodes()
            if len(nodes) >= count:
                return nodes
            if time.monotonic() > deadline:
                raise ServerError(f"{len(nodes)} of {count} nsqd registered within {timeout}s")
            time.sleep(0.02)


class NSQAdmin(_Server):
    """An nsqadmin process (HTTP on 127.0.0.1 port 0); give it ``lookupd_http_address``
    or ``nsqd_http_address``."""

    name = "nsqadmin"
    module = "nsqpy.nsqadmin"
    ready = ("http",)
    address_flags = {"http": "http_address"}

    @property
    def tcp_address(self) -> str:
        """nsqadmin has no TCP listener."""
        raise ServerError("nsqadmin has no TCP listener")


class NSQCluster:
    """One nsqlookupd and ``nsqd_count`` nsqd registered with it.

    ``with NSQCluster(3, nsqd_flags={"mem_queue_size": 0}) as cluster:`` starts them
    (every nsqd registered before the block runs); :attr:`nsqds` are the nsqd,
    :attr:`lookupd` the nsqlookupd. :meth:`add_nsqd` starts one more.
    """

    def __init__(
        self,
        nsqd_count: int = 2,
        *,
        nsqd_flags: Mapping[str, object] | None = None,
        lookupd_flags: Mapping[str, object] | None = None,
        timeout: float = 15.0,
    ) -> None:
        if nsqd_count < 1:
            raise ValueError(f"an NSQ cluster needs at least one nsqd, not {nsqd_count}")
        self.nsqd_count = nsqd_count
        self.nsqd_flags: dict[str, Any] = dict(nsqd_flags or {})
        self.timeout = timeout
        lookupd_kwargs: dict[str, Any] = dict(lookupd_flags or {})
        self.lookupd = NSQLookupd(timeout=timeout, **lookupd_kwargs)
        self.nsqds: list[NSQD] = []

    @property
    def nsqd(self) -> NSQD:
        """The first nsqd."""
        return self.nsqds[0]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        """What a consumer's ``lookupd_http_addresses`` should be."""
        return [self.lookupd.http_address]

    def add_nsqd(self, **flags: object) -> NSQD:
        """Start one more nsqd registered with :attr:`lookupd` and wait for its registration."""
        merged: dict[str, Any] = {**self.nsqd_flags, **flags}
        nsqd = NSQD(timeout=self.timeout, lookupd_tcp_address=self.lookupd.tcp_address, **merged)
        self.nsqds.append(nsqd)
        nsqd.start()
        self.lookupd.wait_for_nodes(len(self.nsqds), self.timeout)
        return nsqd

    def start(self) -> Self:
        """Start nsqlookupd, then the nsqd, and wait until all are registered."""
        try:
            self.lookupd.start()
            self.nsqds = [
                NSQD(
                    timeout=self.timeout,
                    lookupd_tcp_address=self.lookupd.tcp_address,
                    **self.nsqd_flags,
                )
                for _ in range(self.nsqd_count)
            ]
            for nsqd in self.nsqds:
                nsqd.spawn()
            for nsqd in self.nsqds:
                nsqd.wait_ready()
            self.lookupd.wait_for_nodes(self.nsqd_count, self.timeout)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every nsqd, then nsqlookupd; remove their directories."""
        try:
            for nsqd in self.nsqds:
                nsqd.close()
        finally:
            self.lookupd.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
