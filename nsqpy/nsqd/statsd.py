"""Pushing stats to statsd over UDP (spec §7.9), as Go nsqd's ``statsdLoop``.

Every ``--statsd-interval`` a new UDP socket is opened to ``--statsd-address`` and
one line per metric is sent, ``<prefix><stat>:<value>|c`` (counters: the change
since the previous push) or ``|g`` (gauges), packed into datagrams of at most
``--statsd-udp-packet-size`` bytes (a line is never split; a longer line goes
alone) and spread over ``interval - 1s`` like Go's ``SpreadWriter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from nsqpy.common.log import Logger
from nsqpy.nsqd.options import statsd_prefix
from nsqpy.nsqd.stats import MemStats, Stats, TopicStats, get_stats, mem_stats
from nsqpy.wire.names import is_ephemeral

if TYPE_CHECKING:
    from nsqpy.nsqd.nsqd import NSQD
    from nsqpy.nsqd.options import Options

__all__ = ["StatsdPusher", "pack_datagrams", "statsd_lines", "statsd_prefix"]


def _pct(quantile: float) -> str:
    # Go's %.0f of quantile*100 (round half to even on the binary value, like Python)
    return f"{quantile * 100.0:.0f}"


def statsd_lines(
    prefix: str,
    topics: Sequence[TopicStats],
    last_topics: Sequence[TopicStats],
    mem: MemStats | None,
    last_mem: MemStats | None,
    *,
    exclude_ephemeral: bool = False,
) -> list[bytes]:
    """The lines of one push, in Go's order; counters are deltas against ``last_*``."""
    lines: list[str] = []

    def count(stat: str, value: int) -> None:
        lines.append(f"{prefix}{stat}:{value}|c\n")

    def gauge(stat: str, value: int) -> None:
        lines.append(f"{prefix}{stat}:{value}|g\n")

    last_by_name = {t["topic_name"]: t for t in last_topics}
    for topic in topics:
        name = topic["topic_name"]
        if exclude_ephemeral and is_ephemeral(name):
            continue
        last = last_by_name.get(name)
        count(
            f"topic.{name}.message_count",
            topic["message_count"] - (last["message_count"] if last else 0),
        )
        count(
            f"topic.{name}.message_bytes",
            topic["message_bytes"] - (last["message_bytes"] if last else 0),
        )
        gauge(f"topic.{name}.depth", topic["depth"])
        gauge(f"topic.{name}.backend_depth", topic["backend_depth"])
        for key in ("expired_count", "overflow_count"):
            if key in topic:  # message policies (policy.py)
                count(f"topic.{name}.{key}", topic[key] - (last.get(key, 0) if last else 0))
        for p in topic["e2e_processing_latency"]["percentiles"] or ():
            gauge(f"topic.{name}.e2e_processing_latency_{_pct(p['quantile'])}", int(p["value"]))
        last_channels = {c["channel_name"]: c for c in last["channels"]} if last else {}
        for channel in topic["channels"]:
            cname = channel["channel_name"]
            if exclude_ephemeral and is_ephemeral(cname):
                continue
            stat = f"topic.{name}.channel.{cname}"
            lc = last_channels.get(cname)
            count(
                f"{stat}.message_count",
                channel["message_count"] - (lc["message_count"] if lc else 0),
            )
            gauge(f"{stat}.depth", channel["depth"])
            gauge(f"{stat}.backend_depth", channel["backend_depth"])
            gauge(f"{stat}.in_flight_count", channel["in_flight_count"])
            gauge(f"{stat}.deferred_count", channel["deferred_count"])
            count(
                f"{stat}.requeue_count",
                channel["requeue_count"] - (lc["requeue_count"] if lc else 0),
            )
            count(
                f"{stat}.timeout_count",
                channel["timeout_count"] - (lc["timeout_count"] if lc else 0),
            )
            gauge(f"{stat}.clients", channel["client_count"])
            for key in ("dead_letter_count", "expired_count", "overflow_count"):
                if key in channel:  # message policies (policy.py)
                    count(f"{stat}.{key}", channel[key] - (lc.get(key, 0) if lc else 0))  # type: ignore[literal-required]
            for p in channel["e2e_processing_latency"]["percentiles"] or ():
                gauge(f"{stat}.e2e_processing_latency_{_pct(p['quantile'])}", int(p["value"]))
    if mem is not None:
        gauge("mem.heap_objects", mem["heap_objects"])
        gauge("mem.heap_idle_bytes", mem["heap_idle_bytes"])
        gauge("mem.heap_in_use_bytes", mem["heap_in_use_bytes"])
        gauge("mem.heap_released_bytes", mem["heap_released_bytes"])
        gauge("mem.gc_pause_usec_100", mem["gc_pause_usec_100"])
        gauge("mem.gc_pause_usec_99", mem["gc_pause_usec_99"])
        gauge("mem.gc_pause_usec_95", mem["gc_pause_usec_95"])
        gauge("mem.next_gc_bytes", mem["next_gc_bytes"])
        count("mem.gc_runs", mem["gc_total_runs"] - (last_mem["gc_total_runs"] if last_mem else 0))
    return [line.encode("utf-8", "surrogateescape") for line in lines]


def pack_datagrams(lines: Iterable[bytes], size: int) -> list[bytes]:
    """Go's ``BoundaryBufferedWriter`` over a ``bufio.Writer`` of ``size`` bytes."""
    datagrams: list[bytes] = []
    buffer: list[bytes] = []
    buffered = 0
    for line in lines:
        if len(line) > size - buffered and buffered:
            datagrams.append(b"".join(buffer))
            buffer, buffered = [], 0
        if len(line) > size:
            datagrams.append(line)  # bufio writes a too-long line straight through
            continue
        buffer.append(line)
        buffered += len(line)
    if buffer:
        datagrams.append(b"".join(buffer))
    return datagrams


class StatsdPusher:
    """The push loop; ``start()`` and ``stop()`` on the server's event loop.

    ``source`` gives the stats to push (``get_stats(nsqd, include_clients=False)``; with
    --workers, worker 0 pushes for all, gathering every worker's).
    """

    def __init__(
        self,
        address: str,
        prefix: str,
        interval: float,
        packet_size: int,
        *,
        source: Callable[[], Stats | Awaitable[Stats]],
        mem_stats_enabled: bool,
        exclude_ephemeral: bool,
        logger: Logger,
    ) -> None:
        self.address = address
        self.prefix = prefix
        self.interval = interval
        self.packet_size = packet_size
        self._source = source
        self._mem_stats_enabled = mem_stats_enabled
        self._exclude_ephemeral = exclude_ephemeral
        self._logger = logger
        self._last_topics: list[TopicStats] = []
        self._last_mem: MemStats | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_engine(
        cls,
        nsqd: NSQD,
        opts: Options,
        http_port: int,
        logger: Logger,
        source: Callable[[], Stats | Awaitable[Stats]] | None = None,
    ) -> StatsdPusher:
        """A pusher configured from nsqd's options; ``http_port`` fills ``%s`` when
        ``--broadcast-http-port`` is 0 (Go uses the real HTTP port then; a started server
        has expanded it already, options.resolve_listeners)."""
        port = opts.broadcast_http_port or http_port
        return cls(
            opts.statsd_address,
            statsd_prefix(opts.statsd_prefix, opts.broadcast_address, port),
            opts.statsd_interval,
            opts.statsd_udp_packet_size,
            source=source or (lambda: get_stats(nsqd, include_clients=False)),
            mem_stats_enabled=opts.statsd_mem_stats,
            exclude_ephemeral=opts.statsd_exclude_ephemeral,
            logger=logger,
        )

    def start(self) -> None:
        if self._task is None and self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="statsd")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._logger.info("STATSD: closing")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + self.interval
        while True:
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            try:
                await self.push()
            except Exception as err:  # the loop must survive anything a push does
                self._logger.error(f"STATSD: push failed - {err!r}")
            next_tick += self.interval
            now = loop.time()
            if next_tick < now:  # Go's ticker drops the ticks it missed
                next_tick = now + self.interval - (now - next_tick) % self.interval

    async def push(self) -> None:
        """One push: open a socket, send every line, close."""
        sock = await self._connect()
        if sock is None:
            return
        try:
            self._logger.info(f"STATSD: pushing stats to {self.address}")
            got = self._source()
            stats = await got if inspect.isawaitable(got) else got
            topics = stats["topics"] or []
            mem = mem_stats() if self._mem_stats_enabled else None
            lines = statsd_lines(
                self.prefix,
                topics,
                self._last_topics,
                mem,
                self._last_mem,
                exclude_ephemeral=self._exclude_ephemeral,
            )
            self._last_topics = topics
            if mem is not None:
                self._last_mem = mem
            datagrams = pack_datagrams(lines, self.packet_size)
            spacing = max(self.interval - 1.0, 0.0) / max(len(datagrams), 1)
            for datagram in datagrams:
                started = time.monotonic()
                with contextlib.suppress(OSError):  # Go ignores write errors
                    sock.send(datagram)
                if spacing:
                    await asyncio.sleep(max(0.0, spacing - (time.monotonic() - started)))
        finally:
            sock.close()

    async def _connect(self) -> socket.socket | None:
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host or None, int(port), type=socket.SOCK_DGRAM
            )
            family, kind, proto, _, sockaddr = infos[0]
            sock = socket.socket(family, kind, proto)
        except (OSError, ValueError, IndexError):
            self._logger.error(f"failed to create UDP socket to statsd({self.address})")
            return None
        try:
            sock.setblocking(False)
            sock.connect(sockaddr)
        except OSError:
            sock.close()
            self._logger.error(f"failed to create UDP socket to statsd({self.address})")
            return None
        return sock
