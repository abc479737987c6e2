"""The backend queue interface: where a topic's or channel's messages go beyond
--mem-queue-size (spec §7.2, §7.4), and its in-memory implementations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from nsqpy.diskqueue import DiskQueue, DiskQueueError


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


class DiskBackend:
    """A durable topic's or channel's backend: a go-diskqueue compatible DiskQueue.

    Translates its errors to BackendError and reports activity to the engine, which
    decides when to sync (every --sync-every operations, every --sync-timeout) and runs
    the fsync off the event loop.
    """

    __slots__ = (
        "_on_activity",
        "_on_gone",
        "after_next_sync",
        "depth",
        "dq",
        "on_synced",
        "rerun",
        "syncing",
    )

    def __init__(
        self,
        dq: DiskQueue,
        on_activity: Callable[[DiskBackend], None],
        on_gone: Callable[[DiskBackend], None],
    ) -> None:
        self.dq = dq
        # asked at every delivery: the disk queue's own method, not one more call around it
        self.depth: Callable[[], int] = dq.depth
        self._on_activity = on_activity
        self._on_gone = on_gone
        self.syncing = False
        self.rerun = False
        # callbacks waiting for the running sync, and for one that starts after it
        self.on_synced: list[Callable[[BaseException | None], None]] = []
        self.after_next_sync: list[Callable[[BaseException | None], None]] = []

    def put(self, data: bytes) -> None:
        try:
            self.dq.put(data)
        except DiskQueueError as err:
            raise BackendError(str(err)) from None
        finally:
            self._on_activity(self)

    def put_many(self, datas: Sequence[bytes]) -> None:
        if not datas:
            return
        try:
            self.dq.put_many(datas)
        except DiskQueueError as err:
            raise BackendError(str(err)) from None
        finally:
            self._on_activity(self)

    def read_many(self, max_count: int) -> list[bytes]:
        try:
            return self.dq.read_many(max_count)
        except DiskQueueError as err:
            raise BackendError(str(err)) from None
        finally:
            self._on_activity(self)

    def empty(self) -> None:
        try:
            self.dq.empty()
        except DiskQueueError as err:
            raise BackendError(str(err)) from None

    def close(self) -> None:
        self._on_gone(self)
        try:
            self.dq.close()
        except DiskQueueError as err:
            raise BackendError(str(err)) from None

    def delete(self) -> None:
        self._on_gone(self)
        try:
            self.dq.delete()
        except DiskQueueError as err:
            raise BackendError(str(err)) from None
