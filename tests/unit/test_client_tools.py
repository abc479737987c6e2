"""The tools' logic without processes: nsq_to_file's files, nsq_stat's rows, filters."""

from __future__ import annotations

import gzip
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from nsqpy.client import Message
from nsqpy.common.log import Logger
from nsqpy.tools._hostpool import HostPool
from nsqpy.tools.nsq_stat import BANNER, HEADER, ChannelTotals, format_row
from nsqpy.tools.nsq_to_file import FileLogger, Options, compute_filename_format, go_strftime
from nsqpy.tools.nsq_to_http import parse_custom_headers
from nsqpy.tools.nsq_to_nsq import JSONFilter, go_json


class FakeConn:
    address = "127.0.0.1:4150"

    def __init__(self) -> None:
        self.finished: list[bytes] = []

    def respond(self, msg: Message, finished: bool, delay: float, backoff: bool) -> None:
        assert finished
        self.finished.append(msg.body)


def test_go_strftime() -> None:
    t = time.struct_time((2024, 3, 9, 7, 5, 3, 5, 69, 0))
    assert go_strftime("%Y-%m-%d_%H", t) == "2024-03-09_07"
    assert go_strftime("%y%b%d %I:%M:%S %p %A %a %B", t) == "24Mar09 07:05:03 AM Saturday Sat March"
    assert go_strftime("100%% %Q %", t) == "100% %Q %"


def test_filename_format() -> None:
    short = socket.gethostname().split(".")[0]
    opts = Options(output_dir="/out")
    assert compute_filename_format(opts, "t") == f"t.{short}.<DATETIME>.log"
    opts = Options(output_dir="/out", gzip=True)
    assert compute_filename_format(opts, "t") == f"t.{short}<REV>.<DATETIME>.log.gz"
    opts = Options(output_dir="/out", gzip=True, filename_format="<TOPIC>-<PID><REV>.gz")
    assert compute_filename_format(opts, "t") == f"t-{os.getpid()}<REV>.gz"
    opts = Options(output_dir="/out", host_identifier="x-<SHORT_HOST>", filename_format="<HOST>")
    assert compute_filename_format(opts, "t") == f"x-{short}"
    for needs_rev in ({"rotate_size": 1}, {"rotate_interval": 1.0}, {"work_dir": "/work"}):
        opts = Options(output_dir="/out", filename_format="<TOPIC>.log", **needs_rev)
        with pytest.raises(ValueError, match="missing <REV>"):
            compute_filename_format(opts, "t")


def file_logger(tmp_path: Path, **kw: Any) -> tuple[FileLogger, FakeConn]:
    opts = Options(
        output_dir=str(tmp_path / "out"),
        filename_format=kw.pop("filename_format", "<TOPIC><REV>.log"),
        nsqd_tcp_addresses=["127.0.0.1:4150"],
        **kw,
    )
    os.makedirs(opts.output_dir, exist_ok=True)
    logger = Logger("[test] ", stream=open(os.devnull, "w"))  # noqa: SIM115
    return FileLogger(opts, "t", logger, {}), FakeConn()


def feed(fl: FileLogger, conn: FakeConn, *bodies: bytes) -> None:
    fl.handle([Message(b"%016d" % i, 0, 1, b, conn) for i, b in enumerate(bodies)])  # type: ignore[arg-type]


def test_rotate_by_size_before_the_write(tmp_path: Path) -> None:
    fl, conn = file_logger(tmp_path, rotate_size=10)
    feed(fl, conn, b"12345678")  # 9 bytes with the newline
    feed(fl, conn, b"abc")  # 9 <= 10: same file, now 13 bytes
    feed(fl, conn, b"next")  # 13 > 10: rotates first
    fl.sync_pending()
    fl.close()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["t-000000.log", "t-000001.log"]
    assert (out / "t-000000.log").read_bytes() == b"12345678\nabc\n"
    assert (out / "t-000001.log").read_bytes() == b"next\n"
    assert conn.finished == [b"12345678", b"abc", b"next"]


def test_messages_are_finished_only_after_a_sync(tmp_path: Path) -> None:
    fl, conn = file_logger(tmp_path, max_in_flight=3)
    feed(fl, conn, b"a")  # opening a file syncs
    assert conn.finished == [b"a"]
    feed(fl, conn, b"b", b"c")
    assert conn.finished == [b"a"]
    feed(fl, conn, b"d")  # max-in-flight messages held: sync
    assert conn.finished == [b"a", b"b", b"c", b"d"]
    feed(fl, conn, b"e")
    fl.hup()  # SIGHUP syncs and closes the file; the next message reopens it (appends)
    assert fl.out is None and conn.finished[-1] == b"e"
    feed(fl, conn, b"f")
    fl.sync_pending()
    fl.close()
    assert (tmp_path / "out" / "t.log").read_bytes() == b"a\nb\nc\nd\ne\nf\n"


def test_gzip_members_and_work_dir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    fl, conn = file_logger(tmp_path, gzip=True, gzip_level=9, work_dir=str(work))
    feed(fl, conn, b"one")
    fl.sync_pending()
    feed(fl, conn, b"two")
    fl.sync_pending()
    assert [p.name for p in work.iterdir()] == ["t-000000.log.gz"]
    fl.close()
    assert list(work.iterdir()) == []
    data = (tmp_path / "out" / "t-000000.log.gz").read_bytes()
    assert data.count(b"\x1f\x8b\x08") >= 2  # one gzip member per sync
    assert gzip.decompress(data) == b"one\ntwo\n"
    # a name already taken in the output dir bumps the revision
    fl2, conn2 = file_logger(tmp_path, gzip=True, work_dir=str(work))
    feed(fl2, conn2, b"three")
    fl2.sync_pending()
    fl2.close()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "t-000000.log.gz",
        "t-000001.log.gz",
    ]


def test_nsq_stat_rows() -> None:
    assert BANNER.count("+") == 2
    assert HEADER == (
        "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients"
    )
    before, after = ChannelTotals(), ChannelTotals()
    before.add({"depth": 10, "backend_depth": 4, "message_count": 100, "client_count": 1})
    after.add({"depth": 20, "backend_depth": 5, "message_count": 150, "in_flight_count": 3})
    after.add({"depth": 1, "message_count": 10, "clients": [{}, {}], "requeue_count": 2})
    assert (after.depth, after.memory_depth, after.client_count) == (21, 16, 2)
    assert format_row(after, before, 2.0) == (
        "     30      24 |      21      16       5     3     0 |       2       0          160       2"
    )


def test_custom_headers() -> None:
    assert parse_custom_headers(["header1: value1", "header2:value2", "X: a:b"]) == {
        "header1": "value1",
        "header2": "value2",
        "X": "a:b",
    }
    for bad in ("header1:", ": value2", ":", "novalue"):
        with pytest.raises(ValueError):
            parse_custom_headers([bad])


def test_hostpool_modes() -> None:
    rr = HostPool(["a", "b", "c"], "round-robin")
    assert [rr.get() for _ in range(4)] == ["a", "b", "c", "a"]
    pool = HostPool(["a", "b"], "hostpool")
    assert pool.get() == "a"
    pool.mark("a", False)
    assert [pool.get() for _ in range(3)] == ["b", "b", "b"]
    pool.mark("b", False)
    assert pool.get() in ("a", "b")  # all down: all revived
    pool.mark("a", True)


def test_json_filter() -> None:
    f = JSONFilter("kind", "click", [])
    assert f.check({"kind": "click"}) == 0
    assert f.check({"kind": "view"}) == 1
    assert f.check({"other": 1}) == 2  # a required value but no field: back off
    assert JSONFilter("kind", "", []).check({"other": 1}) == 1
    assert JSONFilter("n", "3", []).check({"n": 3.0}) == 0
    assert JSONFilter("n", "x", []).check({"n": 3}) == 1
    w = JSONFilter("", "", ["b", "a", "missing"])
    assert w.filter({"a": 1.0, "b": "<x>", "c": 3}, b"") == b'{"a":1,"b":"\\u003cx\\u003e"}'
    with pytest.raises(ValueError):
        w.filter([1, 2], b"")
    assert go_json({"z": 1, "a": [True, None]}) == b'{"a":[true,null],"z":1}'
