"""A message delivered to a consumer, and the responses it allows (FIN, REQ, TOUCH)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsqpy.client._conn import Conn

__all__ = ["Message"]


class Message:
    """One delivery of a message from nsqd.

    Respond with exactly one of :meth:`finish` or :meth:`requeue` (the consumer does it
    for you when the handler returns or raises, unless :meth:`disable_auto_response` was
    called). :meth:`touch` resets nsqd's in-flight timeout. Responding is a plain call,
    not a coroutine: the command is queued and written with the others of the same turn
    of the event loop. Each may be called from any thread.
    """

    __slots__ = ("_auto", "_conn", "_responded", "attempts", "body", "id", "timestamp")

    def __init__(self, msg_id: bytes, timestamp: int, attempts: int, body: bytes, conn: Conn):
        self.id = msg_id
        """The 16 ASCII hex bytes nsqd identifies the message with."""
        self.timestamp = timestamp
        """Publish time, nanoseconds since the epoch."""
        self.attempts = attempts
        """Delivery count, 1 on the first delivery."""
        self.body = body
        self._conn = conn
        self._responded = False
        self._auto = True

    @property
    def nsqd_address(self) -> str:
        """``host:port`` of the nsqd that delivered the message."""
        return self._conn.address

    @property
    def has_responded(self) -> bool:
        """Whether FIN or REQ was sent already."""
        return self._responded

    @property
    def auto_response_disabled(self) -> bool:
        """Whether the consumer leaves FIN/REQ to the handler."""
        return not self._auto

    def disable_auto_response(self) -> None:
        """Keep the consumer from finishing or requeueing this message after the handler:
        the application will call :meth:`finish` or :meth:`requeue` later."""
        self._auto = False

    def finish(self) -> None:
        """Tell nsqd the message was processed (FIN). Does nothing after a response."""
        if not self._responded:
            self._responded = True
            self._conn.respond(self, True, 0, False)

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None:
        """Hand the message back to nsqd for redelivery after ``delay`` seconds (REQ).

        ``None`` uses the consumer's default: ``default_requeue_delay`` x attempts, capped
        at ``max_requeue_delay``. With ``backoff`` the consumer also slows down (go-nsq's
        ``Requeue``; ``backoff=False`` is its ``RequeueWithoutBackoff``).
        """
        if not self._responded:
            self._responded = True
            self._conn.respond(self, False, -1.0 if delay is None else delay, backoff)

    def touch(self) -> None:
        """Reset nsqd's in-flight timeout of the message (TOUCH)."""
        if not self._responded:
            self._conn.touch(self)

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id.decode('ascii', 'replace')} attempts={self.attempts} "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''}>"
        )
