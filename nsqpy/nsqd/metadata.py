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
import errno
import fcntl
import json
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

from nsqpy import NSQ_VERSION
from nsqpy.diskqueue import go_errno, go_error

METADATA_FILE = "nsqd.dat"
DEFERRED_FILE = "nsqd.deferred.dat"


class MetadataError(OSError):
    """nsqd.dat, the deferred side file or the data directory cannot be used.

    Its text is worded like the Go nsqd's (``open /data/nsqd.dat.123.tmp: read-only file
    system``): at start-up nsqd refuses to start with it as its one ``FATAL:`` line; later
    a failed write is logged and retried. An OSError, so that callers which handle any
    I/O failure handle it too.
    """


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
        raise MetadataError(
            f"failed to read metadata from {path} - {_read_error(path, err)}"
        ) from None
    return decode_metadata(data, path)


def _read_error(path: str, err: OSError) -> str:
    """Go's os.ReadFile error: opening a directory works there, reading it fails."""
    return go_error("read" if err.errno == errno.EISDIR else "open", path, err)


def write_file_atomically(path: str, data: bytes) -> None:
    """Go's writeSyncFile + rename: ``<path>.<rand>.tmp`` (0600), fsync, rename over ``path``.

    Raises MetadataError worded as Go's (``open``/``write``/``sync``/``rename`` and the
    cause); the temporary file is removed on failure.
    """
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise MetadataError(go_error("open", tmp, err)) from None
    op, what = "write", tmp
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            op = "sync"
            os.fsync(fd)
        finally:
            os.close(fd)
        op, what = "rename", f"{tmp} {path}"
        os.rename(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise MetadataError(go_error(op, what, err)) from None


def write_metadata(data_path: str, topics: list[TopicMeta]) -> None:
    write_file_atomically(os.path.join(data_path, METADATA_FILE), encode_metadata(topics))


_QUEUE_FILE = re.compile(r"(.+)\.diskqueue\.(?:meta|\d{6})\.dat")


def queue_names(data_path: str) -> list[str]:
    """The disk queues in ``data_path`` (``topic`` or ``topic:channel``), from their files."""
    try:
        entries = os.listdir(data_path)
    except OSError:
        return []
    return sorted({m.group(1) for e in entries if (m := _QUEUE_FILE.fullmatch(e))})


# -- the deferred side file ------------------------------------------------------------


def deferred_file(worker: int | None = None) -> str:
    """The side file's name: ``nsqd.deferred.dat``, or with ``--workers`` each worker's
    own part (``nsqd.deferred.<worker>.dat``), which a start-up reads with the rest."""
    return DEFERRED_FILE if worker is None else f"nsqd.deferred.{worker}.dat"


def _deferred_paths(data_path: str) -> list[str]:
    """The side file and every worker's part found in ``data_path``."""
    paths = [os.path.join(data_path, DEFERRED_FILE)]
    with contextlib.suppress(OSError):
        paths += sorted(
            os.path.join(data_path, name)
            for name in os.listdir(data_path)
            if name.startswith("nsqd.deferred.")
            and name.endswith(".dat")
            and name != DEFERRED_FILE
            and name[len("nsqd.deferred.") : -len(".dat")].isdigit()
        )
    return paths


def write_deferred(
    data_path: str, due: dict[str, dict[str, int]], name: str = DEFERRED_FILE
) -> None:
    """``due``: queue name (``topic`` or ``topic:channel``) → message ID → due time (unix ns).

    An empty mapping removes the file.
    """
    path = os.path.join(data_path, name)
    if not due:
        _remove(path)
        return
    write_file_atomically(
        path, json.dumps({"version": 1, "due": due}, separators=(",", ":")).encode()
    )


def read_deferred(data_path: str) -> dict[str, dict[str, int]]:
    """The side file's contents (and its workers' parts, merged); a missing or malformed
    file means no deferrals (the messages are then delivered when read back, as the Go
    nsqd would). A file that cannot be read raises MetadataError, as nsqd.dat does."""
    merged: dict[str, dict[str, int]] = {}
    for path in _deferred_paths(data_path):
        for queue, ids in _read_deferred_file(path).items():
            merged.setdefault(queue, {}).update(ids)
    return merged


def _read_deferred_file(path: str) -> dict[str, dict[str, int]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise MetadataError(f"failed to read {path} - {_read_error(path, err)}") from None
    try:
        due = json.loads(data)["due"]
        return {str(q): {str(i): int(t) for i, t in ids.items()} for q, ids in due.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def remove_deferred(data_path: str) -> None:
    """Remove the side file and its parts (read at start-up, rewritten at exit); raises
    MetadataError."""
    for path in _deferred_paths(data_path):
        _remove(path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        if not os.path.lexists(path):  # a read-only filesystem refuses even a missing file
            return
        raise MetadataError(go_error("remove", path, err)) from None


# -- the data directory lock -------------------------------------------------------------


class DataDirLock:
    """An exclusive, non-blocking flock on the data directory (Go's dirlock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def lock(self) -> None:
        try:  # Go's os.Open: a file in the directory's place is found out by the next read
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise MetadataError(
                f"failed to lock data-path: {go_error('open', self.path, err)}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            raise MetadataError(
                f"failed to lock data-path: cannot flock directory {self.path} - {go_errno(err)}"
                " (possibly in use by another instance of nsqd)"
            ) from None
        self._fd = fd

    def unlock(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
