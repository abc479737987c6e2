"""nsqlookupd's TCP side: one :class:`LookupProtocolV1` per nsqd connection (spec §4.2).

Go splits this over ``tcp.go`` (magic check), ``lookup_protocol_v1.go`` (the
commands) and ``client_v1.go`` (the connection's peer info); here the codec lives
in :mod:`nsqpy.wire.v1` and this module only moves bytes and updates the
:class:`~nsqpy.nsqlookupd.registration_db.RegistrationDB`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import TYPE_CHECKING, cast

from nsqpy import NSQ_VERSION
from nsqpy.common.goflags import format_duration_ns
from nsqpy.common.net import format_address
from nsqpy.nsqlookupd.registration_db import PeerInfo, Producer, Registration
from nsqpy.wire.names import is_ephemeral
from nsqpy.wire.v1 import (
    RESPONSE_OK,
    BadProtocol,
    CommandParser,
    ConnectionFailure,
    Event,
    Identify,
    Ping,
    ProtocolError,
    ProtocolMagic,
    Register,
    Unregister,
    encode_error,
    encode_identify_response,
)

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.lookupd import NSQLookupd

__all__ = ["LookupProtocolV1"]

CLIENT_KEY = Registration("client", "", "")
# Go's listeners turn TCP keep-alive on for every accepted connection, probing after 15 s idle
# and every 15 s (the kernel's 9 probes): an nsqd cut off by a partition, whose connection
# nothing else would ever end, is dropped within ~2.5 minutes with its registrations.
KEEPALIVE_SECONDS = 15


def enable_keepalive(sock: socket.socket | None) -> None:
    """Go's ``SetKeepAlive(true)``, ``SetKeepAlivePeriod(15s)`` on an accepted socket."""
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_SECONDS)


class LookupProtocolV1(asyncio.Protocol):
    """One nsqd connection: magic, then commands, every error fatal.

    When the connection ends, the nsqd is removed from every registration key it
    was under (the keys themselves stay).
    """

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.logger = lookupd.logger
        self.parser = CommandParser()
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.peer_info: PeerInfo | None = None
        self._closing = False
        # "magic" until the magic is read, then "ioloop"; "rejected" after a bad magic
        self._stage = "magic"
        # What ended the connection, as Go's IOLoop error (logged at the end)
        self._exit_error = "EOF"

    def __str__(self) -> str:
        return self.remote

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.remote = format_address(self.transport.get_extra_info("peername"))
        enable_keepalive(self.transport.get_extra_info("socket"))
        self.lookupd.clients.add(self)
        self.logger.info(f"TCP: new client({self.remote})")

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self.parser.feed(data)
        out: list[bytes] = []
        try:
            while (event := self.parser.next_event()) is not None:
                reply = self._exec(event)
                if reply is not None:
                    out.append(reply)
        except BadProtocol as err:
            magic = err.magic.decode("utf-8", "replace")
            self.logger.info(f"CLIENT({self.remote}): desired protocol magic '{magic}'")
            out.append(encode_error(err.text))
            self.logger.error(f"client({self.remote}) bad protocol magic '{magic}'")
            self._stage = "rejected"
            self._close(out)
        except ProtocolError as err:
            self.logger.error(f"[{self.remote}] - {err.text}")
            out.append(encode_error(err.text))
            self._exit_error = err.text
            self._close(out)
        except ConnectionFailure as err:
            self._exit_error = str(err)
            self._close(out)
        else:
            if out and self.transport is not None:
                self.transport.write(b"".join(out))

    def eof_received(self) -> bool | None:
        err = self.parser.eof()
        if err is not None and not self._closing:
            self.logger.error(f"[{self.remote}] - {err.text}")
            self._exit_error = err.text
            self._close([encode_error(err.text)])
        return None  # close the transport once the reply is written

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.lookupd.clients.discard(self)
        if self._stage != "ioloop":
            if self._stage == "magic":
                self.logger.error("failed to read protocol version - EOF")
            return  # Go never started the ioloop
        if exc is not None and self._exit_error == "EOF":
            self._exit_error = str(exc) or type(exc).__name__
        self.logger.info(f"PROTOCOL(V1): [{self.remote}] exiting ioloop")
        info = self.peer_info
        if info is not None:
            for k in self.db.lookup_registrations(info.id):
                removed, _ = self.db.remove_producer(k, info.id)
                if removed:
                    self.logger.info(
                        f"DB: client({self.remote}) UNREGISTER "
                        f"category:{k.category} key:{k.key} subkey:{k.subkey}"
                    )
        self.logger.error(f"client({self.remote}) - {self._exit_error}")

    def close(self) -> None:
        """Close the connection (nsqlookupd is exiting)."""
        self._close([])

    def _close(self, out: list[bytes]) -> None:
        self._closing = True
        if self.transport is not None:
            if out:
                self.transport.write(b"".join(out))
            self.transport.close()

    # -- commands ---------------------------------------------------------------------------

    def _exec(self, event: Event) -> bytes | None:
        if isinstance(event, Register):
            return self._register(event)
        if isinstance(event, Unregister):
            return self._unregister(event)
        if isinstance(event, Ping):
            return self._ping()
        if isinstance(event, Identify):
            return self._identify(event)
        if isinstance(event, ProtocolMagic):
            magic = event.magic.decode("utf-8", "replace")
            self.logger.info(f"CLIENT({self.remote}): desired protocol magic '{magic}'")
            self._stage = "ioloop"
        return None

    def _identify(self, event: Identify) -> bytes:
        peer = event.peer
        info = PeerInfo(
            id=self.remote,
            remote_address=self.remote,
            hostname=peer.hostname,
            broadcast_address=peer.broadcast_address,
            tcp_port=peer.tcp_port,
            http_port=peer.http_port,
            version=peer.version,
            topology_zone=peer.topology_zone,
            topology_region=peer.topology_region,
        )
        self.logger.info(
            f"CLIENT({self.remote}): IDENTIFY Address:{info.broadcast_address} "
            f"TCP:{info.tcp_port} HTTP:{info.http_port} Version:{info.version}"
        )
        self.peer_info = info
        self.parser.identified = True
        if self.db.add_producer(CLIENT_KEY, Producer(info)):
            self.logger.info(f"DB: client({self.remote}) REGISTER category:client key: subkey:")
        lookupd = self.lookupd
        return encode_identify_response(
            tcp_port=lookupd.tcp_port,
            http_port=lookupd.http_port,
            version=NSQ_VERSION,
            broadcast_address=lookupd.opts.broadcast_address,
            hostname=lookupd.hostname,
        )

    def _register(self, event: Register) -> bytes:
        info = self.peer_info
        assert info is not None  # the parser refuses REGISTER before IDENTIFY
        topic, channel = event.topic, event.channel
        if channel and self.db.add_producer(
            Registration("channel", topic, channel), Producer(info)
        ):
            self.logger.info(
                f"DB: client({self.remote}) REGISTER category:channel key:{topic} subkey:{channel}"
            )
        if self.db.add_producer(Registration("topic", topic, ""), Producer(info)):
            self.logger.info(
                f"DB: client({self.remote}) REGISTER category:topic key:{topic} subkey:"
            )
        return RESPONSE_OK

    def _unregister(self, event: Unregister) -> bytes:
        info = self.peer_info
        assert info is not None
        db = self.db
        topic, channel = event.topic, event.channel
        if channel:
            key = Registration("channel", topic, channel)
            removed, left = db.remove_producer(key, info.id)
            if removed:
                self.logger.info(
                    f"DB: client({self.remote}) UNREGISTER "
                    f"category:channel key:{topic} subkey:{channel}"
                )
            # an ephemeral channel goes away with its last producer
            if left == 0 and is_ephemeral(channel):
                db.remove_registration(key)
            return RESPONSE_OK
        # A topic unregistration: nsqd unregisters each channel first, so removing the
        # producer from channel keys here is unexpected, hence the warning.
        for k in db.find_registrations("channel", topic, "*"):
            removed, _ = db.remove_producer(k, info.id)
            if removed:
                self.logger.warn(
                    f"client({self.remote}) unexpected UNREGISTER "
                    f"category:channel key:{topic} subkey:{k.subkey}"
                )
        key = Registration("topic", topic, "")
        removed, left = db.remove_producer(key, info.id)
        if removed:
            self.logger.info(
                f"DB: client({self.remote}) UNREGISTER category:topic key:{topic} subkey:"
            )
        if left == 0 and is_ephemeral(topic):
            db.remove_registration(key)
        return RESPONSE_OK

    def _ping(self) -> bytes:
        info = self.peer_info
        if info is not None:
            # a PING may come before IDENTIFY; it only refreshes an identified peer
            now = time.time_ns()
            last = format_duration_ns(now - info.last_update)
            self.logger.info(f"CLIENT({info.id}): pinged (last ping {last})")
            info.last_update = now
        return RESPONSE_OK
