"""nsqlookupd's HTTP API (spec §4.3), Go's ``nsqlookupd/http.go``.

Routing, replies and parameters are NSQ's ``http_api`` (:mod:`nsqpy.common.httpapi`):
JSON data, empty bodies for the mutations, errors as ``{"message": <TEXT>}``;
``/ping`` is plain text without the NSQ header. Go's ``/debug/pprof`` pages are not
served.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from nsqpy import NSQ_VERSION
from nsqpy.common.goflags import seconds_to_ns
from nsqpy.common.httpapi import (
    HTTPError,
    ReqParams,
    Router,
    text_response,
    v1_response,
)
from nsqpy.common.httpserver import HTTPServer, Request
from nsqpy.common.net import format_address
from nsqpy.nsqlookupd.registration_db import (
    Registration,
    filter_by_active,
    filter_registrations,
    keys,
    subkeys,
)
from nsqpy.wire.names import is_valid_topic_name

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.lookupd import NSQLookupd

__all__ = ["LookupdHTTPServer"]


# -- the server -----------------------------------------------------------------------------


class LookupdHTTPServer:
    """The HTTP listener of one nsqlookupd (``--http-address``)."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.opts = lookupd.opts
        self.logger = lookupd.logger
        self.address = ""
        self.port = 0
        self._http: HTTPServer | None = None
        self.router = Router(self.logger)
        add = self.router.add
        add("GET", "/ping", self._ping, v1=False)
        add("GET", "/info", self._info)
        add("GET", "/debug", self._debug)
        add("GET", "/lookup", self._lookup)
        add("GET", "/topics", self._topics)
        add("GET", "/channels", self._channels)
        add("GET", "/nodes", self._nodes)
        add("POST", "/topic/create", self._topic_create)
        add("POST", "/topic/delete", self._topic_delete)
        add("POST", "/channel/create", self._channel_create)
        add("POST", "/channel/delete", self._channel_delete)
        add("POST", "/topic/tombstone", self._topic_tombstone)

    async def start(self, host: str | None, port: int) -> None:
        """Listen on ``host:port`` (port 0: any free port) and log the real address."""
        http = HTTPServer(self.router.handle, self.logger)
        sock_name = await http.listen_tcp(host, port)
        self._http = http
        self.address = format_address(sock_name)
        self.port = int(sock_name[1])
        self.logger.info(f"HTTP: listening on {self.address}")

    async def stop(self) -> None:
        """Stop listening and close the connections."""
        if self._http is not None:
            self.logger.info(f"HTTP: closing {self.address}")
            await self._http.close()
            self._http = None

    # -- handlers -------------------------------------------------------------------------

    async def _ping(self, request: Request, _: str) -> object:
        return text_response(200, "OK")

    async def _info(self, request: Request, _: str) -> object:
        return {"version": NSQ_VERSION}

    async def _topics(self, request: Request, _: str) -> object:
        return {"topics": keys(self.db.find_registrations("topic", "*", ""))}

    async def _channels(self, request: Request, _: str) -> object:
        topic = ReqParams(request).topic()
        channels = subkeys(self.db.find_registrations("channel", topic, "*"))
        return {"channels": channels}

    async def _lookup(self, request: Request, _: str) -> object:
        topic = ReqParams(request).topic()
        db = self.db
        if not db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels = subkeys(db.find_registrations("channel", topic, "*"))
        producers = filter_by_active(
            db.find_producers("topic", topic, ""),
            seconds_to_ns(self.opts.inactive_producer_timeout),
            seconds_to_ns(self.opts.tombstone_lifetime),
        )
        return {"channels": channels, "producers": [p.peer_info.to_json() for p in producers]}

    async def _topic_create(self, request: Request, _: str) -> object:
        topic = ReqParams(request).topic()
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        self.logger.info(f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def _topic_delete(self, request: Request, _: str) -> object:
        topic = ReqParams(request).topic()
        db = self.db
        for k in db.find_registrations("channel", topic, "*"):
            self.logger.info(f"DB: removing channel({k.subkey}) from topic({topic})")
            db.remove_registration(k)
        for k in db.find_registrations("topic", topic, ""):
            self.logger.info(f"DB: removing topic({topic})")
            db.remove_registration(k)
        return None

    async def _topic_tombstone(self, request: Request, _: str) -> object:
        params = ReqParams(request)
        topic = params.topic()
        node = params.get("node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        self.logger.info(f"DB: setting tombstone for producer@{node} of topic({topic})")
        for producer in self.db.find_producers("topic", topic, ""):
            info = producer.peer_info
            if f"{info.broadcast_address}:{info.http_port}" == node:
                producer.tombstone()
        return None

    async def _channel_create(self, request: Request, _: str) -> object:
        topic, channel = ReqParams(request).topic_channel()
        self.logger.info(f"DB: adding channel({channel}) in topic({topic})")
        self.db.add_registration(Registration("channel", topic, channel))
        self.logger.info(f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def _channel_delete(self, request: Request, _: str) -> object:
        topic, channel = ReqParams(request).topic_channel()
        registrations = self.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.logger.info(f"DB: removing channel({channel}) from topic({topic})")
        for k in registrations:
            self.db.remove_registration(k)
        return None

    async def _nodes(self, request: Request, _: str) -> object:
        db = self.db
        lifetime = seconds_to_ns(self.opts.tombstone_lifetime)
        # tombstoned nodes are listed: only inactivity filters here
        producers = filter_by_active(
            db.find_producers("client", "", ""),
            seconds_to_ns(self.opts.inactive_producer_timeout),
            0,
        )
        now = time.time_ns()
        nodes: list[dict[str, Any]] = []
        for p in producers:
            info = p.peer_info
            topics = keys(filter_registrations(db.lookup_registrations(info.id), "topic", "*", ""))
            # for each topic, the producer entry of this peer holds its tombstone
            tombstones = []
            for topic in topics:
                tombstoned = False
                for tp in db.find_producers("topic", topic, ""):
                    if tp.peer_info is info:
                        tombstoned = tp.is_tombstoned(lifetime, now)
                tombstones.append(tombstoned)
            nodes.append({**info.to_json(), "tombstones": tombstones, "topics": topics})
        return {"producers": nodes}

    async def _debug(self, request: Request, _: str) -> object:
        # maps all the way down: json.Marshal sorts the keys at every level
        data: dict[str, Any] = {}
        for k, producers in self.db.items():
            entries = [
                {
                    "id": p.peer_info.id,
                    "hostname": p.peer_info.hostname,
                    "broadcast_address": p.peer_info.broadcast_address,
                    "tcp_port": p.peer_info.tcp_port,
                    "http_port": p.peer_info.http_port,
                    "version": p.peer_info.version,
                    "topology_zone": p.peer_info.topology_zone,
                    "topology_region": p.peer_info.topology_region,
                    "last_update": p.peer_info.last_update,
                    "tombstoned": p.tombstoned,
                    "tombstoned_at": p.tombstoned_at,
                }
                for p in producers.values()
            ]
            if entries:
                data[f"{k.category}:{k.key}:{k.subkey}"] = entries
        return v1_response(data, sort_keys=True)
