"""Exceptions raised by the nsqpy client.

The tree::

    NSQClientError              base of everything the client raises
     ├── NSQError               nsqd answered with an error frame: ``code`` ("E_BAD_TOPIC"),
     │                          ``desc`` and ``fatal`` (nsqd closes the connection after it)
     ├── NSQConnectionError     could not connect, or the connection was lost before a reply
     │    └── NSQTimeoutError   connecting, or waiting for a reply, took too long
     ├── NSQProtocolError       nsqd (or nsqlookupd) sent something the client cannot parse
     ├── NSQLookupdError        an nsqlookupd HTTP query failed
     └── NSQClosedError         the producer or consumer is closed
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "NON_FATAL_CODES",
    "NSQClientError",
    "NSQClosedError",
    "NSQConnectionError",
    "NSQError",
    "NSQLookupdError",
    "NSQProtocolError",
    "NSQTimeoutError",
]

# The only errors after which nsqd keeps the connection open (spec §2.2).
NON_FATAL_CODES: Final = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class NSQClientError(Exception):
    """Base class of every exception the nsqpy client raises."""


class NSQError(NSQClientError):
    """nsqd answered with an error frame ``"<code> <desc>"``.

    ``str(err)`` is the wire text, e.g. ``E_BAD_TOPIC PUB topic name "a b" is not valid``.
    """

    def __init__(self, code: str, desc: str = "") -> None:
        super().__init__(f"{code} {desc}" if desc else code)
        self.code = code
        self.desc = desc

    @property
    def fatal(self) -> bool:
        """Whether nsqd closes the connection after this error (all but FIN/REQ/TOUCH failures)."""
        return self.code not in NON_FATAL_CODES

    @classmethod
    def from_frame(cls, data: bytes) -> NSQError:
        """Parse the data of an error frame."""
        text = data.decode("utf-8", "replace")
        code, _, desc = text.partition(" ")
        return cls(code, desc)


class NSQConnectionError(NSQClientError):
    """Connecting to nsqd failed, or the connection was lost before the reply came."""


class NSQTimeoutError(NSQConnectionError):
    """Connecting, or waiting for a reply, took longer than allowed."""


class NSQProtocolError(NSQClientError):
    """The server sent something the client cannot make sense of."""


class NSQLookupdError(NSQClientError):
    """An nsqlookupd HTTP query failed (connection, status or JSON)."""


class NSQClosedError(NSQClientError):
    """The producer or consumer was closed."""
