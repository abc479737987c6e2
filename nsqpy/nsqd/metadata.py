"""nsqd's files in --data-path besides the disk queues (spec §7.5).

- ``nsqd.dat``: topics, channels and their pause state, in the Go nsqd's exact JSON,
  written atomically (``nsqd.dat.<rand>.tmp`` mode 0600, fsync, rename).
- the data directory lock (``flock(LOCK_EX|LOCK_NB)`` on the directory), so that two
  nsqd never share one data path.
- ``nsqd.deferred.dat`` (nsqpy only, ignored by the Go nsqd): when deferred messages are
  written to a channel's disk queue at exit, this remembers when each was due, so that
  after a restart they are deferred again instead of delivered at once (NSQ issue #1107).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

from nsqpy import NSQ_VERSION

METADATA_FILE = "nsqd.dat"
DEFERRED_FILE = "nsqd.deferred.dat"


class MetadataError(Exception):
    """nsqd.dat or the data directory cannot be used; nsqd refuses to start."""


@dataclass
class ChannelMeta:
    name: str
    paused: bool = False


@dataclass
class TopicMeta:
    name: str
    paused: bool = False
    channels: list[ChannelMeta] = field(default_factory=list)


def encode_metadata(topics: list[TopicMeta]) -> bytes:
    """The Go nsqd's ``json.Marshal(meta)``: compact, ``null`` for empty lists."""
    data: dict[str, Any] = {
        "topics": [
            {
                "name": t.name,
                "paused": t.paused,
                "channels": [{"name": c.name, "paused": c.paused} for c in t.channels] or None,
            }
            for t in topics
        ]
        or None,
        "version": NSQ_VERSION,
    }
    return json.dumps(data, separators=(",", ":")).encode()


def decode_metadata(data: bytes, path: str) -> list[TopicMeta]:
    """Parse nsqd.dat; raises MetadataError with Go's wording when it is not valid JSON."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        topics: list[TopicMeta] = []
        for t in raw.get("topics") or []:
            channels = [
                ChannelMeta(str(c.get("name", "")), bool(c.get("paused", False)))
                for c in t.get("channels") or []
            ]
            topics.append(TopicMeta(str(t.get("name", "")), bool(t.get("paused", False)), channels))
    except (ValueError, AttributeError, TypeError) as err:
        raise MetadataError(f"failed to parse metadata in {path} - {err}") from None
    return topics


def read_metadata(data_path: str) -> list[TopicMeta] | None:
    """The topics of nsqd.dat, or None when there is none (a fresh start)."""
    path = os.path.join(data_path, METADATA_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise MetadataError(f"failed to read metadata from {path} - {err.strerror}") from None
    return decode_metadata(data, path)


def write_file_atomically(path: str, data: bytes) -> None:
    """Go's writeSyncFile + rename: ``<path>.<rand>.tmp`` (0600), fsync, rename over ``path``."""
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_metadata(data_path: str, topics: list[TopicMeta]) -> None:
    write_file_atomically(os.path.join(data_path, METADATA_FILE), encode_metadata(topics))


# -- the deferred side file ------------------------------------------------------------


def write_deferred(data_path: str, due: dict[str, dict[str, int]]) -> None:
    """``due``: queue name (``topic`` or ``topic:channel``) → message ID → due time (unix ns).

    An empty mapping removes the file.
    """
    path = os.path.join(data_path, DEFERRED_FILE)
    if not due:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    write_file_atomically(
        path, json.dumps({"version": 1, "due": due}, separators=(",", ":")).encode()
    )


def read_deferred(data_path: str) -> dict[str, dict[str, int]]:
    """The side file's contents; a missing or unreadable file means no deferrals (logged by caller)."""
    path = os.path.join(data_path, DEFERRED_FILE)
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read())
        due = raw["due"]
        return {str(q): {str(i): int(t) for i, t in ids.items()} for q, ids in due.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def remove_deferred(data_path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(data_path, DEFERRED_FILE))


# -- the data directory lock -------------------------------------------------------------


class DataDirLock:
    """An exclusive, non-blocking flock on the data directory (Go's dirlock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def lock(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            raise MetadataError(f"failed to lock data-path: {_go_errno(err)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            raise MetadataError(
                f"failed to lock data-path: cannot flock directory {self.path} - {_go_errno(err)}"
                " (possibly in use by another instance of nsqd)"
            ) from None
        self._fd = fd

    def unlock(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _go_errno(err: OSError) -> str:
    """An OSError worded like Go's syscall.Errno.Error() (lowercase strerror)."""
    text = err.strerror or str(err)
    return text[:1].lower() + text[1:]
