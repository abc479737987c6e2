"""The TCP protocol V2 server side: one ``ClientV2`` per connection (spec §2).

Bytes in → :class:`CommandParser` → a handler per command → engine calls → frames
out. Everything one ``data_received`` brings is handled in one pass, and what the
pass produces (responses, and messages delivered to this client) is written with a
single ``transport.write`` at its end. Message frames otherwise follow NSQ's output
buffering: flushed when the client stops being ready, when --output-buffer-size is
reached, or when its output_buffer_timeout elapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, cast

from nsqpy import NSQ_VERSION
from nsqpy.common.gojson import encode_json
from nsqpy.nsqd.auth import AuthClient, AuthError, AuthState, auth_reply
from nsqpy.nsqd.backend import BackendError
from nsqpy.nsqd.channel import Channel, ChannelError, InFlight
from nsqpy.nsqd.options import TLSRequired
from nsqpy.nsqd.shards import RemoteError
from nsqpy.nsqd.tls import (
    TLS_HANDSHAKE_TIMEOUT,
    TLSRequiredParser,
    cipher_suite_name,
    peer_common_name,
    tls_version_name,
)
from nsqpy.nsqd.topic import InvalidNameError, Topic
from nsqpy.nsqd.topology import GLOBAL, locality
from nsqpy.wire.compression import (
    CompressionError,
    DeflateStreamDecoder,
    DeflateStreamEncoder,
    SnappyStreamDecoder,
    SnappyStreamEncoder,
)
from nsqpy.wire.names import go_quote, is_valid_channel_name, is_valid_topic_name
from nsqpy.wire.v2 import (
    FRAME_CLOSE_WAIT,
    FRAME_HEARTBEAT,
    FRAME_OK,
    MAGIC_V2,
    MSG_ID_LENGTH,
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    Body,
    Command,
    CommandParser,
    ConnectionFailure,
    MPubBody,
    ProtocolError,
    bad_topic,
    encode_command,
    encode_error,
    encode_mpub,
    encode_response,
    encode_sub,
    mpub_bodies,
    parse_base10,
    wire_str,
)

if TYPE_CHECKING:
    from nsqpy.nsqd.nsqd import NSQD

DEFAULT_OUTPUT_BUFFER_SIZE: Final = 16 * 1024
# Pieces of output this big on average (message bodies of kilobytes) are handed to the
# transport as they are, one writev, instead of being copied into one buffer first.
_WRITEV_MIN_PIECE: Final = 2048
_client_ids = itertools.count(1)


# TCP keep-alive on every accepted connection, as Go's listeners have it (net.ListenConfig's
# default since Go 1.13: probes after 15 s idle, then every 15 s), so that a peer that
# vanished without a FIN or RST (a host down, a partition) is found out by the kernel.
KEEPALIVE_SECONDS: Final = 15


def keep_alive(sock: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_SECONDS)


def number_clients(first: int, step: int) -> None:
    """--workers: worker i numbers its connections i+1, i+1+N, ..., unique in the node."""
    global _client_ids
    _client_ids = itertools.count(first, step)


class ClientV2(asyncio.Protocol):
    """One V2 connection: a producer, a consumer, or both."""

    def __init__(
        self,
        nsqd: NSQD,
        registry: set[ClientV2],
        *,
        tls_context: ssl.SSLContext | None = None,
        authd: AuthClient | None = None,
    ) -> None:
        opts = nsqd.opts
        self.nsqd = nsqd
        self._input_seen = nsqd.input_seen
        self._registry = registry
        # Security and compression (spec §2.4, §7.10, §7.11): what the server offers, what
        # this connection negotiated, and the codecs applied once per batch read/written.
        self._tls_context = tls_context
        self._authd = authd
        # --workers (shards.py): the other workers, and for a connection moved here from
        # one of them, the bytes it had read but not handled (handled at connection_made)
        self._shards = nsqd.shards
        self._moved_in: bytes | None = None
        self._eof_later = False
        # Publishes forwarded to their topic's worker and not yet answered, in the order of
        # the output: frames that may go (lists) and the answers awaited (_Forward). Empty
        # but while some are awaited; _flush then writes up to the first one.
        self._forwards: deque[list[bytes] | _Forward] = deque()
        self.tls = False
        self.tls_version = ""
        self.tls_cipher_suite = ""
        self.tls_negotiated_protocol = ""
        self.tls_negotiated_protocol_is_mutual = False
        self.snappy = False
        self.deflate = False
        self._decoder: Callable[[bytes], bytes] | None = None
        self._encoder: Callable[[bytes], bytes] | None = None
        self.auth_state: AuthState | None = None
        self._auth_secret = b""
        self._tls_common_name = ""
        # Waiting for the auth server or a TLS handshake (see _Suspend); bytes read meanwhile.
        self._suspended: asyncio.Task[None] | None = None
        self._stashed: list[bytes] = []
        self._slow_input = False  # decoding, or suspended: data_received's one extra test
        self.id = next(_client_ids)
        self.transport: asyncio.Transport | None = None
        self.parser: CommandParser | None = None
        self._magic = b""
        self.state = STATE_INIT
        self.channel: Channel | None = None
        # Consumer interface (see channel.Consumer)
        self.ready_count = 0
        self.in_flight: dict[bytes, InFlight] = {}
        self.irregular_in_flight = False
        self.msg_timeout: float = opts.msg_timeout
        self.sample_rate = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        # Identity and negotiated settings
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.topology_zone = ""
        self.topology_region = ""
        self.locality = GLOBAL  # topology.py: fixed by IDENTIFY
        self.remote_address = ""
        self.connect_ts = int(time.time())
        self.heartbeat_interval: float = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout: float = opts.output_buffer_timeout
        self.pub_counts: dict[str, int] = {}
        self._topic_bytes = b""  # the topic of the last publish, and its name decoded
        self._topic_name = ""
        # Output buffering
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._respond_now = False
        self._in_batch = False
        self._want_dispatch = False
        # The first publish of the read batch, as (error code, command): a failed flush fails it.
        self._publish_code: tuple[str, str] | None = None
        self._sync_acks = opts.sync_every == 1
        # Replies held until disk syncs complete (durable acknowledgements, --sync-every=1).
        self._held_syncs = 0
        self._sync_failed: BaseException | None = None
        self._flush_timer: asyncio.TimerHandle | None = None
        self._ticks_from = 0.0
        self._tick_taken = 0.0  # the last tick of that ticker a flush took
        # Deadlines (spec §2.1)
        self._last_read = time.monotonic()
        self._write_blocked_since = 0.0
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"{self.remote_address}"

    # -- asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._ticks_from = asyncio.get_running_loop().time()  # the output buffer's ticker
        if self._moved_in is not None:
            # uvloop starts reading once this returns: what comes before the bytes that were
            # read in the other worker are handled is kept (_filter_input), and the EOF too
            self._magic = MAGIC_V2
            self.parser = self._new_parser()
            self._slow_input = True
            self._registry.add(self)
            self._schedule_heartbeat()
            asyncio.get_running_loop().call_soon(self._moved_here)
            return
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.remote_address = (
                f"{peer[0]}:{peer[1]}" if ":" not in peer[0] else f"[{peer[0]}]:{peer[1]}"
            )
            keep_alive(transport.get_extra_info("socket"))
        else:
            self.remote_address = str(peer or "")
        host = self.remote_address.rsplit(":", 1)[0].strip("[]")
        self.client_id = self.hostname = host
        self._registry.add(self)
        self.nsqd.logf_info(f"TCP: new client({self.remote_address})")
        self._schedule_heartbeat()

    def connection_lost(self, exc: Exception | None) -> None:
        self._make_mpub_topic()
        self._let_go()
        self._out = []
        if self._suspended is not None:
            self._suspended.cancel()  # an auth server query or TLS handshake nobody awaits
            self._suspended = None
        if self.parser is not None:
            self.nsqd.logf_info(f"PROTOCOL(V2): [{self}] exiting ioloop")
        if self.channel is not None:
            channel, self.channel = self.channel, None
            channel.remove_client(self)

    def eof_received(self) -> bool:
        """The client closed its side: a command cut short gets Go's "failed to read" error."""
        if (
            self._moved_in is not None
            or self._suspended is not None
            or self._held_syncs
            or self._forwards
        ):
            # (a connection moved here from another worker reads at once, while what it
            # had read there is still to be handled: the end waits for that)
            self._eof_later = True
            return True
        self._send_truncated_error()
        return False

    def _deferred_eof(self) -> None:
        """The client's EOF that came while commands before it were still being handled."""
        if (
            self._eof_later
            and not self._closed
            and self._suspended is None
            and not self._held_syncs
            and not self._forwards
        ):
            self._eof_later = False
            self._send_truncated_error()
            self._close_after_flush()

    def _send_truncated_error(self) -> None:
        err = self.parser.truncated_error() if self.parser is not None else None
        if err is not None and not self._closed:
            self.nsqd.logger.error(f"[{self}] - {err.text}")
            self._out.append(encode_error(err.text))
            self._respond_now = True
            self._close_after_flush()

    def pause_writing(self) -> None:
        self._write_blocked_since = time.monotonic()

    def resume_writing(self) -> None:
        self._write_blocked_since = 0.0

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._last_read = self._input_seen()  # time.monotonic(), or IdlePoll's reading of it
        parser = self.parser
        if parser is None:
            data = self._read_magic(data)
            parser = self.parser
            if parser is None or not data:
                return
        if self._slow_input:
            data = self._filter_input(data)
            if not data:
                return
        # A read that is exactly one PUB or MPUB of one message (a producer waiting for each
        # OK sends just that) is parsed with a few compares; it is handled as any command.
        command = parser.take_publish(data)
        if command is None:
            parser.feed(data)
        self._run_commands(parser, command)

    def _run_commands(self, parser: CommandParser, first: Command | None = None) -> None:
        """Handle ``first`` and every complete command buffered, then apply the batch's
        effects. What the batch published reaches consumers once the replies are written
        (as Go's topic pump runs beside the publisher's connection), so that a publisher's
        round trip does not include the fan-out."""
        nsqd = self.nsqd
        nsqd.hold_dispatch()
        self._in_batch = True
        try:
            # FINs after CLS too (STATE_CLOSING): a consumer that drains before closing
            # sends them all at once then (the Spark connector does).
            if (
                first is None
                and self.channel is not None
                and (self.state == STATE_SUBSCRIBED or self.state == STATE_CLOSING)
            ):
                fins = parser.take_fin_block()
                if fins is not None:
                    self._fin_many(self.channel, fins)
            handlers = _HANDLERS
            while not self._closed:
                try:
                    command = first or parser.next_command()
                    if command is None:
                        break
                    params, body = command
                    handler = handlers.get(params[0])
                    if handler is None:
                        raise ProtocolError("E_INVALID", f"invalid command {wire_str(params[0])}")
                    handler(self, params, body)
                except ProtocolError as err:
                    self.nsqd.logger.error(f"[{self}] - {err.text}")
                    self._out.append(encode_error(err.text))
                    self._respond_now = True
                    if err.fatal:
                        self._close_after_flush()
                        return
                if first is not None:
                    break  # take_publish's command: nothing else is buffered
            self._in_batch = False
            self._end_batch()
        except ConnectionFailure as failure:
            self.nsqd.logger.error(f"[{self}] - {failure}")
            self._close_after_flush()
        except _Suspend as suspend:
            self._in_batch = False
            self._suspend(suspend, params, body)
        finally:
            self._in_batch = False
            nsqd.release_dispatch()

    def _read_magic(self, data: bytes) -> bytes:
        need = 4 - len(self._magic)
        self._magic += data[:need]
        if len(self._magic) < 4:
            return b""
        if self._magic != MAGIC_V2:
            self.nsqd.logger.error(
                f"client({self.remote_address}) bad protocol magic '{wire_str(self._magic)}'"
            )
            self._out.append(encode_error("E_BAD_PROTOCOL"))
            self._close_after_flush()
            return b""
        self.parser = self._new_parser()
        self.nsqd.logf_info(f"CLIENT({self.remote_address}): desired protocol magic '  V2'")
        return data[need:]

    def _new_parser(self) -> CommandParser:
        """A parser for what follows; until a TLS upgrade, --tls-required lets IDENTIFY only."""
        opts = self.nsqd.opts
        cls = CommandParser
        if opts.tls_required != TLSRequired.NOT_REQUIRED and not self.tls:
            cls = TLSRequiredParser
        return cls(opts.max_msg_size, opts.max_body_size, int(opts.max_req_timeout * 1000))

    # -- compression, TLS and waiting for the auth server -----------------------------------------
    #
    # A connection that compresses or is waiting has _slow_input set: data_received then
    # passes what arrives through _filter_input, once per read, before the parser. The
    # plain path pays that one test per read and one more per flush (_encoder).

    def _filter_input(self, data: bytes) -> bytes:
        if self._suspended is not None or self._moved_in is not None:
            # Nothing is handled until the wait is over: keep the bytes as they came (what a
            # client sends right after the TLS handshake arrives before _upgrade resumes).
            self._stashed.append(data)
            return b""
        assert self._decoder is not None
        try:
            return self._decoder(data)
        except CompressionError as err:
            # Go: "failed to read command - snappy: corrupt input", no error frame.
            self.nsqd.logger.error(f"[{self}] - failed to read command - {err}")
            self._close_after_flush()
            return b""

    def _suspend(self, suspend: _Suspend, params: list[bytes], body: Body) -> None:
        """Stop reading and handling commands until ``suspend.work`` is done (see _Suspend)."""
        self._in_batch = False
        self._end_batch()  # what the commands before this one produced goes out first
        if self._closed or self.transport is None:
            suspend.work.close()
            return
        self.transport.pause_reading()
        self._slow_input = True
        retry = (params, body) if suspend.retry else None
        self._suspended = asyncio.get_running_loop().create_task(self._resume(suspend, retry))

    async def _resume(self, suspend: _Suspend, retry: tuple[list[bytes], Body] | None) -> None:
        try:
            result = await suspend.work
        except ProtocolError as err:
            self._suspended = None
            self._fail(err)
            return
        except ConnectionFailure as failure:  # the connection is gone (a failed TLS handshake)
            self._suspended = None
            self.nsqd.logger.error(f"[{self}] - {failure}")
            self._closed = True
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()
            return
        except Exception as bug:  # a bug: do not leave the connection hanging
            self._suspended = None
            self.nsqd.logger.error(f"[{self}] - {bug!r}")
            self._close_after_flush()
            return
        self._suspended = None
        if self._closed or self.parser is None:
            return
        self._last_read = time.monotonic()  # the read deadline starts over, as Go's next read
        try:
            if suspend.then is not None:
                suspend.then(result)
            if retry is not None:
                params, body = retry
                _HANDLERS[params[0]](self, params, body)
        except ProtocolError as err:
            if self._fail(err):
                return
        except _Suspend as again:
            assert retry is not None
            self._suspend(again, *retry)
            return
        # What arrived meanwhile, then every command still buffered, in order.
        stashed, self._stashed = self._stashed, []
        self._slow_input = self._decoder is not None
        parser = self.parser
        for data in stashed:
            if self._decoder is not None:
                data = self._filter_input(data)
            if data:
                parser.feed(data)
        if self._closed:
            return
        self._run_commands(parser)
        if not self._closed and self._suspended is None and not self._held_syncs:
            assert self.transport is not None
            self.transport.resume_reading()
            if self._eof_later:
                self._deferred_eof()

    def _fail(self, err: ProtocolError) -> bool:
        """Send ``err``; True if it closed the connection (fatal)."""
        self.nsqd.logger.error(f"[{self}] - {err.text}")
        self._respond(encode_error(err.text))
        if err.fatal:
            self._close_after_flush()
            return True
        return False

    async def _upgrade(self, tls: bool, snappy: bool, deflate: bool, deflate_level: int) -> None:
        """IDENTIFY's upgrades, after its JSON reply went out in the clear. Go's order: TLS,
        snappy, deflate, each acknowledged with an OK frame in the new framing."""
        if tls:
            self.nsqd.logf_info(f"PROTOCOL(V2): [{self}] upgrading connection to TLS")
            await self._upgrade_tls()
        if snappy:
            self.nsqd.logf_info(f"PROTOCOL(V2): [{self}] upgrading connection to snappy")
            self._flush()
            self._encoder = SnappyStreamEncoder().encode
            self._decoder = SnappyStreamDecoder().decode
            self.snappy = True
            self._respond(FRAME_OK)
            self._flush()
        if deflate:
            self.nsqd.logf_info(
                f"PROTOCOL(V2): [{self}] upgrading connection to deflate (level {deflate_level})"
            )
            self._flush()
            self._encoder = DeflateStreamEncoder(deflate_level).encode
            self._decoder = DeflateStreamDecoder().decode
            self.deflate = True
            self._respond(FRAME_OK)
            self._flush()
        # Bytes read before the upgrade but not yet parsed belong to the old framing and are
        # dropped, as Go's new reader drops what the old one buffered.
        self.parser = self._new_parser()

    async def _upgrade_tls(self) -> None:
        """TLS server handshake on this connection (5 s deadline), then OK over TLS."""
        assert self.transport is not None and self._tls_context is not None
        loop = asyncio.get_running_loop()
        # Nothing (a heartbeat) may be written in the clear during the handshake.
        self._held_syncs += 1
        try:
            transport = await loop.start_tls(
                self.transport,
                self,
                self._tls_context,
                server_side=True,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as err:
            # start_tls closed the connection: the error frame Go sends in the clear is lost.
            raise ConnectionFailure(f"E_IDENTIFY_FAILED IDENTIFY failed {err}") from None
        finally:
            self._held_syncs -= 1
        if transport is None:
            raise ConnectionFailure("E_IDENTIFY_FAILED IDENTIFY failed connection closed")
        self.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        self.tls = True
        if ssl_object is not None:
            self.tls_version = tls_version_name(ssl_object)
            self.tls_cipher_suite = cipher_suite_name(ssl_object)
            self.tls_negotiated_protocol = ssl_object.selected_alpn_protocol() or ""
            self._tls_common_name = peer_common_name(ssl_object)
        # Go >= 1.16 always reports NegotiatedProtocolIsMutual true (deprecated field).
        self.tls_negotiated_protocol_is_mutual = True
        self._respond(FRAME_OK)
        self._flush()

    async def _query_auth(self) -> AuthState:
        """Ask the auth server about this client's secret (Go's ``QueryAuthd``)."""
        assert self._authd is not None
        host, sep, _ = self.remote_address.rpartition(":")
        try:
            state = await self._authd.query(
                remote_ip=host.strip("[]") if sep else "",
                tls=self.tls,
                common_name=self._tls_common_name,
                secret=self._auth_secret,
            )
        except AuthError as err:
            # The auth server's troubles are not the client's business: logged only.
            self.nsqd.logger.warn(f"PROTOCOL(V2): [{self}] AUTH failed {err}")
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from None
        self.auth_state = state
        return state

    def _check_auth(self, cmd: str, topic: str, channel: str) -> None:
        """Go's ``CheckAuth``, for SUB, PUB, MPUB and DPUB when auth is enabled."""
        state = self.auth_state
        if state is None:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.is_expired():
            raise _Suspend(self._query_auth(), retry=True)
        if not state.is_allowed(topic, channel):
            raise ProtocolError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}",
            )

    @property
    def authed(self) -> bool:
        """Stats: the client holds authorizations (Go's ``HasAuthorizations``)."""
        return self.auth_state is not None and bool(self.auth_state.authorizations)

    @property
    def auth_identity(self) -> str:
        return self.auth_state.identity if self.auth_state is not None else ""

    @property
    def auth_identity_url(self) -> str:
        return self.auth_state.identity_url if self.auth_state is not None else ""

    # -- output --------------------------------------------------------------------------------

    def _respond(self, frame: bytes) -> None:
        self._out.append(frame)
        self._respond_now = True

    def send_messages(self, frames: list[bytes], count: int, nbytes: int) -> None:
        """Consumer interface: queue message frames, then apply the flush rules."""
        if self._closed:
            return
        self._out += frames
        self._out_bytes += nbytes
        if self._in_batch or (
            # buffered, the flush timer armed, and none of the flush rules met (the common
            # case of a consumer with RDY to spare): _apply_flush_rules would do nothing
            self._flush_timer is not None
            and self._out_bytes < self.output_buffer_size
            and len(self.in_flight) < self.ready_count
            and not self._respond_now
        ):
            return
        self._apply_flush_rules()

    def _end_batch(self) -> None:
        if self._want_dispatch:
            self._want_dispatch = False
            if self.channel is not None and self.state == STATE_SUBSCRIBED:
                self.channel.dispatch()
        published = self._publish_code
        if published is not None:
            # The batch's publishes are queued: let the replies go once their disk writes
            # are with the OS (after the fsync with --sync-every=1), or fail them all.
            failed = self.nsqd.flush_touched()
            if failed is not None:
                # Nothing of this batch is acknowledged: the disk refused the write.
                code, cmd = published
                text = f"{code} {cmd} failed {failed}"
                self._out = [encode_error(text)]
                self._respond_now = True
                self.nsqd.logger.error(f"[{self}] - {text}")
                self._close_after_flush()
                return
            self._publish_code = None
            if self._sync_acks:
                self._hold_for_sync()
        if self._out:
            if self._respond_now:
                self._flush()  # (what _apply_flush_rules would do)
            else:
                self._apply_flush_rules()

    def _hold_for_sync(self) -> None:
        """--sync-every=1: what this batch published is acknowledged once it is on disk.

        Go acknowledges before its fsync (a kill -9 window, spec §11); here the OK frames
        wait, and the connection reads nothing more, until every queue written is synced.
        """
        count = self.nsqd.sync_touched(self._synced)
        if count and not self._closed and self.transport is not None:
            if not self._held_syncs:
                self.transport.pause_reading()
            self._held_syncs += count

    def _synced(self, err: BaseException | None) -> None:
        self._held_syncs -= 1
        if err is not None and self._sync_failed is None:
            self._sync_failed = err
        if self._held_syncs or self._closed:
            return
        if self._sync_failed is not None:
            # The OKs already queued would be lies: fail the connection instead (at least once).
            failed, self._sync_failed = self._sync_failed, None
            self._out = [encode_error(f"E_PUB_FAILED PUB failed {failed}")]
            self._close_after_flush()
            return
        self._flush()
        if self.transport is not None and self._suspended is None:  # else _resume resumes
            self.transport.resume_reading()
            if self._eof_later:
                self._deferred_eof()

    def _apply_flush_rules(self) -> None:
        if self._held_syncs:
            return
        if (
            self._respond_now
            or len(self.in_flight) >= self.ready_count
            or self._out_bytes >= self.output_buffer_size
            or self.output_buffer_timeout <= 0
        ):
            self._flush()
        elif self._flush_timer is None:
            # Go's messagePump flushes on a ticker started with the connection, whose channel
            # keeps one tick nobody took: if a tick came since the last one that flushed,
            # flush now (a lone message after a quiet spell goes at once), else at the next
            loop = asyncio.get_running_loop()
            period = self.output_buffer_timeout
            ticks, into = divmod(loop.time() - self._ticks_from, period)
            if ticks > self._tick_taken:
                self._tick_taken = ticks
                self._flush()
            else:
                self._flush_timer = loop.call_later(period - into, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_timer = None
        loop = asyncio.get_running_loop()
        # (the timer was set for a tick: round off its lateness, or a hair of earliness)
        self._tick_taken = float(
            round((loop.time() - self._ticks_from) / self.output_buffer_timeout)
        )
        self._flush()

    def _flush(self) -> None:
        if self._held_syncs:
            return
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        out = self._out
        self._respond_now = False
        if self._forwards:
            self._flush_forwarded()
            return
        if not out or self._closed or self.transport is None:
            return
        self._out = []
        self._write(out)

    def _write(self, out: list[bytes]) -> None:
        assert self.transport is not None
        big_pieces = self._out_bytes >= _WRITEV_MIN_PIECE * len(out)
        self._out_bytes = 0
        if big_pieces and self._encoder is None:
            self.transport.writelines(out)
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        if self._encoder is not None:
            data = self._encoder(data)  # snappy or deflate: one frame or flush per write
        self.transport.write(data)

    def _close_after_flush(self) -> None:
        self._make_mpub_topic()
        self._flush()
        self._closed = True
        if self.transport is not None:
            self.transport.close()

    def _make_mpub_topic(self) -> None:
        """An MPUB whose body was refused or cut short: Go's MPUB got (created) its topic
        before reading the body (after the name and auth checks), so it exists now too."""
        parser = self.parser
        if parser is None or parser.mpub_topic is None:
            return
        name = wire_str(parser.mpub_topic)
        parser.mpub_topic = None
        if self._authd is not None:
            state = self.auth_state
            if state is None or state.is_expired() or not state.is_allowed(name, ""):
                return
        if self._shards is not None and not self._shards.owns(name):
            self._shards.tell(self._shards.owner(name), "create_topic", name)
        elif not self.nsqd.exiting:
            with contextlib.suppress(InvalidNameError):
                self.nsqd.get_topic(name)

    def close_for_exit(self) -> None:
        """Consumer interface: the channel is going away (deleted, or nsqd exiting)."""
        self._close_after_flush()

    def close(self) -> None:
        self._close_after_flush()

    # -- heartbeats and deadlines ----------------------------------------------------------------

    def _schedule_heartbeat(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        if self.heartbeat_interval > 0 and not self._closed:
            loop = asyncio.get_running_loop()
            self._heartbeat_timer = loop.call_later(self.heartbeat_interval, self._heartbeat)

    def _heartbeat(self) -> None:
        self._heartbeat_timer = None
        if self._closed:
            return
        now = time.monotonic()
        interval = self.heartbeat_interval
        # (no read deadline while suspended: Go's next read sets one after the auth query)
        if now - self._last_read >= 2 * interval and self._suspended is None:
            self.nsqd.logger.error(f"[{self}] - read timeout: no command for {2 * interval:g}s")
            self._send_truncated_error()
            self._abort()
            return
        if self._write_blocked_since and now - self._write_blocked_since >= interval:
            self.nsqd.logger.error(f"[{self}] - write timeout")
            self._abort()
            return
        self._respond(FRAME_HEARTBEAT)
        self._flush()
        self._schedule_heartbeat()
        # the read deadline falls between ticks: check it when it is due
        deadline = self._last_read + 2 * interval
        if self._heartbeat_timer is not None and deadline < now + interval:
            asyncio.get_running_loop().call_at(
                asyncio.get_running_loop().time() + max(0.0, deadline - now),
                self._check_read_deadline,
            )

    def _check_read_deadline(self) -> None:
        if (
            not self._closed
            and self._suspended is None
            and time.monotonic() - self._last_read >= 2 * self.heartbeat_interval
        ):
            self.nsqd.logger.error(f"[{self}] - read timeout")
            self._send_truncated_error()
            self._abort()

    def _abort(self) -> None:
        if self._closed:
            return  # already closing gracefully (after a last error frame)
        self._closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- commands ---------------------------------------------------------------------------------

    def _identify(self, params: list[bytes], body: Body) -> None:
        assert isinstance(body, bytes)
        try:
            data = json.loads(body)
            if data is None:
                data = {}  # Go's Unmarshal of null into a struct: a no-op
            if not isinstance(data, dict):
                raise ValueError("not an object")
            fields = _IdentifyFields(data)
        except (ValueError, UnicodeDecodeError):
            raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        self.nsqd.logf_info(f"[{self}] IDENTIFY: {data}")
        opts = self.nsqd.opts
        self.client_id = fields.get_str("client_id") or self.client_id
        self.hostname = fields.get_str("hostname") or self.hostname
        self.user_agent = fields.get_str("user_agent")
        self.topology_zone = fields.get_str("topology_zone")
        self.topology_region = fields.get_str("topology_region")
        self.locality = locality(opts, self.topology_zone, self.topology_region)
        try:
            self._set_heartbeat_interval(fields.get_int("heartbeat_interval"))
            self._set_output_buffer(
                fields.get_int("output_buffer_size"), fields.get_int("output_buffer_timeout")
            )
            self._set_sample_rate(fields.get_int("sample_rate"))
            self._set_msg_timeout(fields.get_int("msg_timeout"))
        except ValueError as err:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY {err}") from None
        if not fields.get_bool("feature_negotiation"):
            self._respond(FRAME_OK)
            return
        deflate = opts.deflate and fields.get_bool("deflate")
        deflate_level = 6
        if deflate and fields.get_int("deflate_level") > 0:
            deflate_level = fields.get_int("deflate_level")
        deflate_level = min(deflate_level, opts.max_deflate_level)
        snappy = opts.snappy and fields.get_bool("snappy")
        if deflate and snappy:
            raise ProtocolError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        tls_v1 = self._tls_context is not None and fields.get_bool("tls_v1")
        reply = {
            "max_rdy_count": opts.max_rdy_count,
            "version": NSQ_VERSION,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(self.msg_timeout * 1000),
            "tls_v1": tls_v1,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": bool(opts.auth_http_addresses),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": int(self.output_buffer_timeout * 1000),
            "topology_region": opts.topology_region,
            "topology_zone": opts.topology_zone,
        }
        self._respond(encode_response(encode_json(reply)))  # Go's escaping of the topology
        if tls_v1 or snappy or deflate:
            # The JSON goes out in the clear; nothing is read until the upgrades are done.
            # (A PUB pipelined before this IDENTIFY is acknowledged without waiting for a
            # --sync-every=1 fsync: the acknowledgement must precede the new framing.)
            self._publish_code = None
            raise _Suspend(self._upgrade(tls_v1, snappy, deflate, deflate_level))

    def _set_heartbeat_interval(self, ms: int) -> None:
        if ms == -1:
            self.heartbeat_interval = 0.0
        elif ms == 0:
            return
        elif 1000 <= ms <= self.nsqd.opts.max_heartbeat_interval * 1000:
            self.heartbeat_interval = ms / 1000
        else:
            raise ValueError(f"heartbeat interval ({ms}) is invalid")
        self._schedule_heartbeat()

    def _set_output_buffer(self, size: int, timeout_ms: int) -> None:
        opts = self.nsqd.opts
        if timeout_ms == -1:
            self.output_buffer_timeout = 0.0
        elif timeout_ms == 0:
            pass
        elif (
            opts.min_output_buffer_timeout * 1000
            <= timeout_ms
            <= opts.max_output_buffer_timeout * 1000
        ):
            self.output_buffer_timeout = timeout_ms / 1000
        else:
            raise ValueError(f"output buffer timeout ({timeout_ms}) is invalid")
        if size == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0.0
        elif size == 0:
            pass
        elif 64 <= size <= opts.max_output_buffer_size:
            self.output_buffer_size = size
        else:
            raise ValueError(f"output buffer size ({size}) is invalid")

    def _set_sample_rate(self, rate: int) -> None:
        if not 0 <= rate <= 99:
            raise ValueError(f"sample rate ({rate}) is invalid")
        self.sample_rate = rate

    def _set_msg_timeout(self, ms: int) -> None:
        if ms == 0:
            return
        if 1000 <= ms <= self.nsqd.opts.max_msg_timeout * 1000:
            self.msg_timeout = ms / 1000
        else:
            raise ValueError(f"msg timeout ({ms}) is invalid")

    def _auth(self, params: list[bytes], body: Body) -> None:
        # State, parameters and body size were checked by the parser, in Go's order.
        assert isinstance(body, bytes)
        if self.authed:
            raise ProtocolError("E_INVALID", "AUTH already set")
        if self._authd is None:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        self._auth_secret = body
        raise _Suspend(self._query_auth(), then=self._auth_answered)

    def _auth_answered(self, state: AuthState) -> None:
        if not state.authorizations:
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        self._respond(encode_response(auth_reply(state)))

    def _sub(self, params: list[bytes], body: Body) -> None:
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = wire_str(params[1])
        if not is_valid_topic_name(topic_name):
            raise ProtocolError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        channel_name = wire_str(params[2])
        if not is_valid_channel_name(channel_name):
            raise ProtocolError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid"
            )
        if self._authd is not None:
            self._check_auth("SUB", topic_name, channel_name)
        if self._shards is not None and not self._shards.owns(topic_name):
            replay = encode_sub(topic_name, channel_name)
            raise _Suspend(self._to_owner(topic_name, replay, relay=True))
        if self.nsqd.exiting:
            raise ProtocolError("E_SUB_FAILED", "SUB failed exiting")
        topic, wait = self.nsqd.open_topic(topic_name)
        channel = topic.get_channel(channel_name)
        try:
            channel.add_client(self)
        except ChannelError as err:
            raise ProtocolError("E_SUB_FAILED", f"SUB failed {err}") from None
        self.state = STATE_SUBSCRIBED
        assert self.parser is not None
        self.parser.state = STATE_SUBSCRIBED
        self.channel = channel
        if wait:  # a new topic answers once the channels nsqlookupd knows of exist
            raise _Suspend(until_started(topic), then=lambda _: self._respond(FRAME_OK))
        self._respond(FRAME_OK)

    def _rdy(self, params: list[bytes], body: Body) -> None:
        if self.state == STATE_CLOSING:
            self.nsqd.logf_info(
                f"PROTOCOL(V2): [{self}] ignoring RDY after CLS in state ClientStateV2Closing"
            )
            return
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = parse_base10(params[1])
            if parsed is None:
                raise ProtocolError("E_INVALID", f"RDY could not parse count {wire_str(params[1])}")
            count = parsed - (1 << 64) if parsed >= 1 << 63 else parsed  # Go's int64(uint64)
        max_rdy = self.nsqd.opts.max_rdy_count
        if count < 0 or count > max_rdy:
            raise ProtocolError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.ready_count = count
        self._want_dispatch = True

    def _check_ack(self, cmd: str, params: list[bytes], min_params: int) -> bytes:
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise ProtocolError("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < min_params:
            raise ProtocolError("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise ProtocolError("E_INVALID", "invalid message ID")
        return msg_id

    def _fin(self, params: list[bytes], body: Body) -> None:
        if self.state == STATE_SUBSCRIBED and len(params) == 2 and len(params[1]) == MSG_ID_LENGTH:
            msg_id = params[1]  # the common case, checked in one line
        else:
            msg_id = self._check_ack("FIN", params, 2)
        assert self.channel is not None
        try:
            self.channel.finish(self, msg_id)
        except ChannelError as err:
            raise ProtocolError(
                "E_FIN_FAILED", f"FIN {wire_str(msg_id)} failed {err}", fatal=False
            ) from None
        self._want_dispatch = True

    def _fin_many(self, channel: Channel, msg_ids: list[bytes]) -> None:
        """A block of FINs (see CommandParser.take_fin_block), finished in one call."""
        failed = channel.finish_many(self, msg_ids)
        if failed:
            for msg_id, reason in failed:
                text = f"E_FIN_FAILED FIN {wire_str(msg_id)} failed {reason}"
                self.nsqd.logger.error(f"[{self}] - {text}")
                self._out.append(encode_error(text))
            self._respond_now = True
        self._want_dispatch = True

    def _req(self, params: list[bytes], body: Body) -> None:
        msg_id = self._check_ack("REQ", params, 3)
        timeout_ms = parse_base10(params[2])
        if timeout_ms is None:
            raise ProtocolError("E_INVALID", f"REQ could not parse timeout {wire_str(params[2])}")
        max_ms = int(self.nsqd.opts.max_req_timeout * 1000)
        if timeout_ms > max_ms:
            self.nsqd.logf_info(
                f"PROTOCOL(V2): [{self}] REQ timeout {timeout_ms}ms out of range 0-{max_ms}ms. Setting to {max_ms}ms"
            )
            timeout_ms = max_ms
        assert self.channel is not None
        try:
            self.channel.requeue(self, msg_id, timeout_ms / 1000)
        except ChannelError as err:
            raise ProtocolError(
                "E_REQ_FAILED", f"REQ {wire_str(msg_id)} failed {err}", fatal=False
            ) from None
        self._want_dispatch = True

    def _touch(self, params: list[bytes], body: Body) -> None:
        msg_id = self._check_ack("TOUCH", params, 2)
        assert self.channel is not None
        try:
            self.channel.touch(self, msg_id)
        except ChannelError as err:
            raise ProtocolError(
                "E_TOUCH_FAILED", f"TOUCH {wire_str(msg_id)} failed {err}", fatal=False
            ) from None

    def _cls(self, params: list[bytes], body: Body) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        self.ready_count = 0
        self.state = STATE_CLOSING
        assert self.parser is not None
        self.parser.state = STATE_CLOSING
        self._respond(FRAME_CLOSE_WAIT)

    def _nop(self, params: list[bytes], body: Body) -> None:
        pass

    def _pub(self, params: list[bytes], body: Body) -> None:
        assert isinstance(body, bytes)
        if self._authd is not None:
            self._check_auth("PUB", wire_str(params[1]), "")
        self._publish("PUB", "E_PUB_FAILED", params[1], [body])

    def _mpub(self, params: list[bytes], body: Body) -> None:
        assert isinstance(body, (tuple, list))
        if self._authd is not None:
            # Go checks before reading the body; the parser has read it already.
            self._check_auth("MPUB", wire_str(params[1]), "")
        self._publish("MPUB", "E_MPUB_FAILED", params[1], body)

    def _dpub(self, params: list[bytes], body: Body) -> None:
        assert isinstance(body, bytes)
        if self._authd is not None:
            self._check_auth("DPUB", wire_str(params[1]), "")
        delay_ms = parse_base10(params[2]) or 0  # the parser validated it
        self._publish("DPUB", "E_DPUB_FAILED", params[1], [body], delay_ms / 1000)

    def _publish(
        self,
        cmd: str,
        code: str,
        topic_bytes: bytes,
        bodies: list[bytes] | MPubBody,
        delay: float = 0.0,
    ) -> None:
        if topic_bytes is self._topic_bytes:  # the parser's cached PUB head: the same name
            topic_name = self._topic_name
        else:
            topic_name = topic_bytes.decode("utf-8", "surrogateescape")  # wire_str, inlined
            self._topic_bytes = topic_bytes
            self._topic_name = topic_name
        if self._shards is not None and not self._shards.owns(topic_name):
            self._publish_elsewhere(cmd, code, topic_bytes, bodies, delay)
            return
        try:
            count, starting = self.nsqd.publish(topic_name, bodies, delay)
        except BackendError as err:
            raise ProtocolError(code, f"{cmd} failed {err}") from None
        except InvalidNameError:  # the parser checked it: the engine agrees
            raise bad_topic(cmd.encode(), topic_bytes) from None
        counts = self.pub_counts
        counts[topic_name] = counts.get(topic_name, 0) + count
        if self._publish_code is None:
            self._publish_code = (code, cmd)
        if starting is not None:
            # a new topic answers once the channels nsqlookupd knows of exist (Go's GetTopic)
            raise _Suspend(until_started(starting), then=lambda _: self._respond(FRAME_OK))
        self._out.append(FRAME_OK)  # self._respond, inlined
        self._respond_now = True

    # -- --workers: moving to the worker that owns the topic (shards.py) -------------------------

    def _publish_elsewhere(
        self, cmd: str, code: str, topic_bytes: bytes, bodies: list[bytes] | MPubBody, delay: float
    ) -> None:
        """A publish to a topic another worker owns: the connection moves there if it can
        (it then publishes there, and so do its next publishes; raises _Suspend), else the
        publish is forwarded, and the commands after it go on meanwhile (its answer keeps
        its place in the output: _Forward)."""
        if not isinstance(bodies, list):
            bodies = mpub_bodies(bodies)
        topic_name = wire_str(topic_bytes)
        shards = self._shards
        assert shards is not None
        if self._can_move():
            if cmd == "PUB":
                replay = encode_command(b"PUB", topic_bytes, body=bodies[0])
            elif cmd == "DPUB":
                delay_ms = b"%d" % round(delay * 1000)
                replay = encode_command(b"DPUB", topic_bytes, delay_ms, body=bodies[0])
            else:
                replay = encode_mpub(topic_name, bodies)
            raise _Suspend(self._to_owner(topic_name, replay, relay=False))
        forward = _Forward(cmd, code, topic_bytes)
        self._forwards.append(self._out)  # what came before it goes first
        self._forwards.append(forward)
        self._out = []
        answer = shards.call(shards.owner(topic_name), "publish", topic_name, bodies, delay)
        answer.add_done_callback(lambda done: self._forwarded(forward, done))

    def _forwarded(self, forward: _Forward, done: asyncio.Future[Any]) -> None:
        """The answer to a forwarded publish: its OK, or the error that ends the connection
        (as the publish's own error would have)."""
        failure = None if done.cancelled() else done.exception()
        if failure is None and not done.cancelled():
            topic_name = wire_str(forward.topic)
            self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + done.result()
            forward.frame = FRAME_OK
        else:
            if isinstance(failure, RemoteError) and failure.kind == "InvalidNameError":
                text = bad_topic(forward.cmd.encode(), forward.topic).text
            elif isinstance(failure, RemoteError):
                text = f"{forward.code} {forward.cmd} failed {failure.text}"
            else:
                text = f"{forward.code} {forward.cmd} failed {failure or 'cancelled'}"
            forward.frame = encode_error(text)
            forward.fatal = text
        if not self._closed:
            self._flush()

    def _flush_forwarded(self) -> None:
        """_flush while forwarded publishes are awaited: everything up to the first one."""
        queue = self._forwards
        if self._out:
            queue.append(self._out)
            self._out = []
        ready: list[bytes] = []
        fatal = ""
        while queue:
            head = queue[0]
            if isinstance(head, _Forward):
                if head.frame is None:
                    break
                ready.append(head.frame)
                fatal = head.fatal
                queue.popleft()
                if fatal:
                    queue.clear()  # Go would not have read what came after it
                    break
            else:
                ready += head
                queue.popleft()
        if ready and not self._closed and self.transport is not None:
            self._write(ready)
        if fatal and not self._closed:
            self.nsqd.logger.error(f"[{self}] - {fatal}")
            self._close_after_flush()
        elif not queue and self._eof_later:
            self._deferred_eof()

    def _can_move(self) -> bool:
        """A plain connection that holds nothing here can move (its socket, its state)."""
        return (
            self._encoder is None
            and not self.tls
            and self.channel is None
            and self.state == STATE_INIT
            and self.parser is not None
            and self.parser.can_hand_over()
        )

    async def _to_owner(self, topic_name: str, replay: bytes, *, relay: bool) -> None:
        """Hand this connection to the worker that owns the topic of the command ``replay``
        (which that worker runs first): its socket when it is plain, else, for a SUB
        (``relay``), one end of a socket pair that this worker relays the plain protocol
        through, keeping the TLS or compression."""
        shards, transport, parser = self._shards, self.transport, self.parser
        assert shards is not None and transport is not None and parser is not None
        # what earlier commands answered goes out first (a --sync-every=1 OK waits its fsync,
        # a forwarded publish its answer)
        while (
            self._held_syncs or self._forwards or transport.get_write_buffer_size()
        ) and not self._closed:
            await asyncio.sleep(0.001)
        if self._closed:
            return
        owner = shards.owner(topic_name)
        movable = self._can_move()
        if not movable and not parser.can_hand_over():
            raise ProtocolError("E_INVALID", "cannot hand over a connection in this state")
        rest = b"".join([replay, parser.take_rest(), *self._undecoded_stash(movable)])
        if movable:
            fd = os.dup(transport.get_extra_info("socket").fileno())
            shards.send_fds(owner, "adopt", [fd], self._state(), rest)
            self._forget_moved()
            transport.close()
            return
        if not relay:
            raise ProtocolError("E_INVALID", "cannot hand over a connection in this state")
        mine, theirs = socket.socketpair()
        shards.send_fds(owner, "adopt", [theirs.detach()], self._state(), rest)
        relayed = _Relay(transport, self._decoder, self._encoder)
        self._forget_moved()
        transport.set_protocol(relayed)  # reads stay paused until the pipe is connected
        await asyncio.get_running_loop().create_unix_connection(lambda: relayed.pipe, sock=mine)

    def _undecoded_stash(self, plain: bool) -> list[bytes]:
        stashed, self._stashed = self._stashed, []
        if plain or self._decoder is None:
            return stashed
        return [self._decoder(data) for data in stashed]

    def _state(self) -> dict[str, Any]:
        """What the connection is, for the worker it moves to (see _moved_here)."""
        return {
            "id": self.id,
            "remote_address": self.remote_address,
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "topology_zone": self.topology_zone,
            "topology_region": self.topology_region,
            "heartbeat_interval": self.heartbeat_interval,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": self.output_buffer_timeout,
            "sample_rate": self.sample_rate,
            "msg_timeout": self.msg_timeout,
            "connect_ts": self.connect_ts,
            "auth_state": self.auth_state,
            "auth_secret": self._auth_secret,
            "pub_counts": self.pub_counts,
            "tls": self.tls,
            "tls_version": self.tls_version,
            "tls_cipher_suite": self.tls_cipher_suite,
            "tls_negotiated_protocol": self.tls_negotiated_protocol,
            "tls_negotiated_protocol_is_mutual": self.tls_negotiated_protocol_is_mutual,
            "tls_common_name": self._tls_common_name,
            "snappy": self.snappy,
            "deflate": self.deflate,
        }

    def moved_in(self, state: dict[str, Any], rest: bytes) -> None:
        """Take over a connection another worker moved here (before connection_made)."""
        self.id = state["id"]
        self.remote_address = state["remote_address"]
        self.client_id = state["client_id"]
        self.hostname = state["hostname"]
        self.user_agent = state["user_agent"]
        self.topology_zone = state["topology_zone"]
        self.topology_region = state["topology_region"]
        self.locality = locality(self.nsqd.opts, self.topology_zone, self.topology_region)
        self.heartbeat_interval = state["heartbeat_interval"]
        self.output_buffer_size = state["output_buffer_size"]
        self.output_buffer_timeout = state["output_buffer_timeout"]
        self.sample_rate = state["sample_rate"]
        self.msg_timeout = state["msg_timeout"]
        self.connect_ts = state["connect_ts"]
        self.auth_state = state["auth_state"]
        self._auth_secret = state["auth_secret"]
        self.pub_counts = state["pub_counts"]
        self.tls = state["tls"]
        self.tls_version = state["tls_version"]
        self.tls_cipher_suite = state["tls_cipher_suite"]
        self.tls_negotiated_protocol = state["tls_negotiated_protocol"]
        self.tls_negotiated_protocol_is_mutual = state["tls_negotiated_protocol_is_mutual"]
        self._tls_common_name = state["tls_common_name"]
        self.snappy = state["snappy"]
        self.deflate = state["deflate"]
        self._moved_in = rest

    def _moved_here(self) -> None:
        rest, self._moved_in = self._moved_in or b"", None
        stashed, self._stashed = self._stashed, []
        self._slow_input = False
        if self._closed:
            return
        data = b"".join([rest, *stashed])
        if data:
            self.data_received(data)
        self._deferred_eof()

    def _forget_moved(self) -> None:
        """This worker is done with a connection that moved: no trace, no log, no timers."""
        self.parser = None
        self._let_go()

    def _let_go(self) -> None:
        """Closed (or moved): out of the registry, its timers cancelled."""
        self._closed = True
        self._registry.discard(self)
        for timer in (self._flush_timer, self._heartbeat_timer):
            if timer is not None:
                timer.cancel()
        self._flush_timer = self._heartbeat_timer = None


class _Forward:
    """A forwarded publish's place in its connection's output, until its answer comes."""

    __slots__ = ("cmd", "code", "fatal", "frame", "topic")

    def __init__(self, cmd: str, code: str, topic: bytes) -> None:
        self.cmd = cmd
        self.code = code
        self.topic = topic
        self.frame: bytes | None = None
        self.fatal = ""  # the error's text, when the answer ends the connection


class _Relay(asyncio.Protocol):
    """--workers: a TLS or compressed connection whose SUB went to another worker. This
    worker keeps the TLS and compression and passes the plain protocol, both ways, through
    a socket pair whose other end the owner serves as a plain connection."""

    def __init__(
        self,
        client: asyncio.Transport,
        decoder: Callable[[bytes], bytes] | None,
        encoder: Callable[[bytes], bytes] | None,
    ) -> None:
        self.client = client
        self.decoder = decoder
        self.pipe = _RelayPipe(client, encoder)

    def data_received(self, data: bytes) -> None:
        if self.decoder is not None:
            try:
                data = self.decoder(data)
            except CompressionError:
                self.client.close()
                return
        transport = self.pipe.transport
        if transport is not None and data:
            transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pipe.transport is not None:
            self.pipe.transport.close()

    def pause_writing(self) -> None:
        if self.pipe.transport is not None:
            self.pipe.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.pipe.transport is not None:
            self.pipe.transport.resume_reading()


class _RelayPipe(asyncio.Protocol):
    """The relay's side of the socket pair: what the owner writes goes to the client."""

    def __init__(self, client: asyncio.Transport, encoder: Callable[[bytes], bytes] | None):
        self.client = client
        self.encoder = encoder
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.client.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.encoder is not None:
            data = self.encoder(data)
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()

    def pause_writing(self) -> None:
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()


async def until_started(topic: Topic) -> None:
    """Wait for a new topic to start (Topic.when_started), without blocking the loop."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    topic.when_started(lambda: None if future.done() else future.set_result(None))
    await future


class _Suspend(Exception):
    """Raised by a command handler that must wait for I/O: a TLS handshake (IDENTIFY) or
    the auth server (AUTH, or an expired authorization at SUB/PUB/MPUB/DPUB).

    The connection stops reading and handling commands (those already buffered wait in
    the parser) until ``work`` is done; then ``then(result)`` runs, or with ``retry`` the
    interrupted command runs again from the start, and the buffered commands follow. An
    exception from ``work`` is a ProtocolError to send (they are all fatal here).
    """

    def __init__(
        self,
        work: Coroutine[Any, Any, Any],
        *,
        then: Callable[[Any], None] | None = None,
        retry: bool = False,
    ) -> None:
        super().__init__("suspended")
        self.work = work
        self.then = then
        self.retry = retry


# identifyDataV2's fields and their Go types (value ranges for the integer ones).
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_IDENTIFY_TYPES: dict[str, type | tuple[int, int]] = {
    "client_id": str,
    "hostname": str,
    "user_agent": str,
    "topology_region": str,
    "topology_zone": str,
    "feature_negotiation": bool,
    "tls_v1": bool,
    "deflate": bool,
    "snappy": bool,
    "heartbeat_interval": _INT64,
    "output_buffer_size": _INT64,
    "output_buffer_timeout": _INT64,
    "deflate_level": _INT64,
    "msg_timeout": _INT64,
    "sample_rate": _INT32,
}


class _IdentifyFields:
    """IDENTIFY's JSON read like Go's json.Unmarshal into identifyDataV2: keys match
    case-insensitively, null leaves the zero value, and a value of the wrong type (or out
    of its Go integer type's range) fails the whole decode, before any field is used."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        pairs = list(data.items())
        pairs.reverse()  # (not reversed(list(...)): mypyc cannot compile that here)
        folded = {k.lower(): v for k, v in pairs}
        # exact-case keys win over case-insensitive ones, as in Go
        folded.update({k: v for k, v in data.items() if k == k.lower()})
        for key, value in folded.items():
            kind = _IDENTIFY_TYPES.get(key)
            if kind is None or value is None:
                continue
            if isinstance(kind, tuple):
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int)
                    or not kind[0] <= value <= kind[1]
                ):
                    raise ValueError(key)
            elif not isinstance(value, kind):
                raise ValueError(key)
        self._data = folded

    def get_int(self, key: str) -> int:
        value = self._data.get(key)
        return 0 if value is None else int(value)

    def get_bool(self, key: str) -> bool:
        return bool(self._data.get(key))

    def get_str(self, key: str) -> str:
        value = self._data.get(key)
        return "" if value is None else str(value)


_HANDLERS: dict[bytes, Callable[[ClientV2, list[bytes], Body], None]] = {
    b"IDENTIFY": ClientV2._identify,
    b"AUTH": ClientV2._auth,
    b"SUB": ClientV2._sub,
    b"RDY": ClientV2._rdy,
    b"FIN": ClientV2._fin,
    b"REQ": ClientV2._req,
    b"TOUCH": ClientV2._touch,
    b"CLS": ClientV2._cls,
    b"NOP": ClientV2._nop,
    b"PUB": ClientV2._pub,
    b"MPUB": ClientV2._mpub,
    b"DPUB": ClientV2._dpub,
}
