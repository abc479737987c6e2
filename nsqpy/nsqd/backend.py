"""The backend queue interface: where a topic's or channel's messages go beyond
--mem-queue-size (spec §7.2, §7.4), and its in-memory implementations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class BackendError(Exception):
    """A backend could not take or give messages; PUBs answer ``E_PUB_FAILED``."""


class BackendQueue(Protocol):
    """What topics and channels need of an overflow queue (NSQ's ``BackendQueue``).

    Records are message payloads (§2.1 encoding). The disk queue implements this.
    """

    def put(self, data: bytes) -> None: ...
    def put_many(self, datas: Sequence[bytes]) -> None: ...
    def read_many(self, max_count: int) -> list[bytes]: ...
    def depth(self) -> int: ...
    def empty(self) -> None: ...
    def close(self) -> None: ...
    def delete(self) -> None: ...


class DummyBackend:
    """Ephemeral topics and channels: overflow is silently dropped, as NSQ does."""

    def put(self, data: bytes) -> None:
        pass

    def put_many(self, datas: Sequence[bytes]) -> None:
        pass

    def read_many(self, max_count: int) -> list[bytes]:
        return []

    def depth(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def close(self) -> None:
        pass

    def delete(self) -> None:
        pass


class RefusingBackend(DummyBackend):
    """A durable queue with nowhere to spill: overflow is refused, never dropped."""

    def put(self, data: bytes) -> None:
        raise BackendError("memory queue full and no disk queue")

    def put_many(self, datas: Sequence[bytes]) -> None:
        if datas:
            raise BackendError("memory queue full and no disk queue")
