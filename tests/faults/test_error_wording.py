"""The wording of nsqd's file and listener errors, Go's (``open <path>: <cause>``), without
processes or mounts: the start-up and disk-full tests compare whole lines with the Go
nsqd, these pin each operation's error."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from nsqpy.common.app import ListenError
from nsqpy.nsqd import metadata
from nsqpy.nsqd.metadata import DataDirLock, MetadataError


def test_write_errors_name_the_operation_and_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(MetadataError) as info:
        metadata.write_metadata(str(missing), [])
    assert isinstance(info.value, OSError)
    text = str(info.value)
    assert text.startswith(f"open {missing}/nsqd.dat.") and text.endswith(
        ".tmp: no such file or directory"
    ), text

    (tmp_path / "nsqd.dat").mkdir()
    (tmp_path / "nsqd.dat" / "inside").write_bytes(b"")
    with pytest.raises(MetadataError) as info:
        metadata.write_metadata(str(tmp_path), [])
    assert str(info.value).startswith(f"rename {tmp_path}/nsqd.dat.")
    assert str(info.value).endswith(f".tmp {tmp_path}/nsqd.dat: is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nsqd.dat"], "temporary file left"


def test_read_errors(tmp_path: Path) -> None:
    (tmp_path / "nsqd.dat").mkdir()
    with pytest.raises(MetadataError, match=r"read .*/nsqd.dat: is a directory$"):
        metadata.read_metadata(str(tmp_path))
    (tmp_path / "nsqd.deferred.dat").mkdir()
    with pytest.raises(MetadataError, match=r"read .*/nsqd.deferred.dat: is a directory$"):
        metadata.read_deferred(str(tmp_path))
    assert metadata.read_deferred(str(tmp_path / "missing")) == {}
    metadata.remove_deferred(str(tmp_path / "missing"))  # nothing to remove is fine


def test_data_dir_lock_words_as_go(tmp_path: Path) -> None:
    with pytest.raises(MetadataError) as info:
        DataDirLock(str(tmp_path / "missing")).lock()
    assert str(info.value) == (
        f"failed to lock data-path: open {tmp_path}/missing: no such file or directory"
    )
    first, second = DataDirLock(str(tmp_path)), DataDirLock(str(tmp_path))
    first.lock()
    try:
        with pytest.raises(MetadataError, match="possibly in use by another instance of nsqd"):
            second.lock()
    finally:
        first.unlock()


def test_listen_error_names_the_address_asked_for() -> None:
    err = ListenError("127.0.0.1:4150", OSError(errno.EADDRINUSE, "whatever asyncio says"))
    assert str(err) == (
        "listen (127.0.0.1:4150) failed - listen tcp 127.0.0.1:4150: bind: address already in use"
    )
    err = ListenError("/tmp/nsqd.sock", OSError(errno.EACCES, os.strerror(errno.EACCES)))
    assert str(err).endswith("listen unix /tmp/nsqd.sock: bind: permission denied")
