"""Admin action notifications (Go's ``nsqadmin/notify.go``).

With ``--notification-http-endpoint``, every admin action (create, delete, empty, pause,
unpause, tombstone) is POSTed there as JSON, fire-and-forget: the request that caused it
never waits, and a failed POST is only logged.  Notifications are sent one at a time in
the order the actions happened.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from nsqpy.common.log import Logger
from nsqpy.nsqadmin.clusterinfo import HTTPClient

__all__ = ["ACTIONS", "AdminAction", "Notifier", "basic_auth_user"]

ACTIONS = (
    "create_topic",
    "create_channel",
    "delete_topic",
    "delete_channel",
    "empty_topic",
    "empty_channel",
    "pause_topic",
    "pause_channel",
    "unpause_topic",
    "unpause_channel",
    "tombstone_topic_producer",
)


@dataclass(frozen=True)
class AdminAction:
    """The notification body; ``channel``, ``node`` and ``user`` are omitted when empty."""

    action: str
    topic: str
    channel: str
    node: str
    timestamp: int
    user: str
    remote_ip: str
    user_agent: str
    url: str
    """The URL of the HTTP request that triggered this action."""
    via: str
    """The hostname of the nsqadmin performing this action."""

    @classmethod
    def from_request(
        cls, action: str, topic: str, channel: str, node: str, request: web.Request
    ) -> AdminAction:
        """Describe ``action`` as done by ``request`` (Go's ``notifyAdminAction``)."""
        scheme = "https" if request.secure or request.headers.get("X-Scheme") == "https" else "http"
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            remote = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
        else:
            remote = request.remote or ""
        return cls(
            action=action,
            topic=topic,
            channel=channel,
            node=node,
            timestamp=int(time.time()),
            user=basic_auth_user(request.headers.get("Authorization", "")),
            remote_ip=remote,
            user_agent=request.headers.get("User-Agent", ""),
            url=f"{scheme}://{request.host}{request.raw_path}",
            via=socket.gethostname(),
        )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"action": self.action, "topic": self.topic}
        if self.channel:
            doc["channel"] = self.channel
        if self.node:
            doc["node"] = self.node
        doc["timestamp"] = self.timestamp
        if self.user:
            doc["user"] = self.user
        doc.update(remote_ip=self.remote_ip, user_agent=self.user_agent, url=self.url, via=self.via)
        return doc


def basic_auth_user(authorization: str) -> str:
    """The user name of an ``Authorization: Basic`` header, or ``""``."""
    scheme, _, encoded = authorization.partition(" ")
    if scheme != "Basic" or not encoded:
        return ""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""
    user, sep, _ = decoded.partition(":")
    return user if sep else ""


class Notifier:
    """Queues admin actions and POSTs them to the endpoint from one background task."""

    def __init__(self, endpoint: str, client: HTTPClient, logger: Logger) -> None:
        self.endpoint = endpoint
        self.client = client
        self.log = logger
        self._queue: asyncio.Queue[AdminAction | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.endpoint and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="notifier")

    def notify(self, action: AdminAction) -> None:
        """Queue ``action``; never blocks, never fails."""
        if self.endpoint:
            self._queue.put_nowait(action)

    async def _run(self) -> None:
        while True:
            action = await self._queue.get()
            if action is None:
                return
            payload = json.dumps(action.to_json(), separators=(",", ":")).encode()
            self.log.info(f"POSTing notification to {self.endpoint}")
            try:
                status = await self.client.post_json(self.endpoint, payload)
            except Exception as err:  # any failure is logged, never raised
                self.log.error(f"failed to POST notification - {err or type(err).__name__}")
                continue
            if status >= 400:
                self.log.error(f"failed to POST notification - got response {status}")

    async def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (for up to ``timeout`` seconds), then stop."""
        if self._task is None:
            return
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
