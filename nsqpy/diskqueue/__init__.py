"""A go-diskqueue (v1.1.0) byte-compatible disk queue for a single-threaded asyncio server.

See :mod:`nsqpy.diskqueue.diskqueue` for the design and the on-disk format (spec §7.7).
"""

from nsqpy.diskqueue.diskqueue import (
    DiskQueue,
    DiskQueueError,
    LogFunc,
    LogLevel,
    SyncJob,
    go_errno,
    go_error,
)

__all__ = ["DiskQueue", "DiskQueueError", "LogFunc", "LogLevel", "SyncJob", "go_errno", "go_error"]
