"""Data directories move between the Go nsqd and ours, both ways (spec §7.5, §7.7, §9 row 7).

The Go formats are written and parsed here with ``struct`` and ``json`` only, never with
nsqpy's own code, so that a mistake shared by our writer and our reader cannot hide:

* ``nsqd.dat``: compact JSON ``{"topics":[{"name":..,"paused":..,"channels":[..]|null}]|null,
  "version":"1.3.0"}``;
* ``<name>.diskqueue.%06d.dat``: records ``[int32 BE size][int64 BE timestamp ns]
  [uint16 BE attempts][16-byte hex ID][body]``;
* ``<name>.diskqueue.meta.dat``:
  ``"<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n"``.

Also here: corrupt data files (renamed ``.bad``, the queue goes on with the next file) and a
truncated metadata file (nsqd starts anyway).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import stat
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import ServerError, ServerPool, ServerProcess
from tests.support.rawclient import Message, RawClient, consumer

pytestmark = pytest.mark.timeout(60)

MAX_MSG_SIZE = 1024 * 1024  # --max-msg-size default
HEADER = struct.Struct(">qH16s")  # timestamp, attempts, ID: 26 bytes
SIZE = struct.Struct(">i")
MIN_RECORD = HEADER.size
META_RE = re.compile(rb"\A(-?[0-9]+)\n([0-9]+),([0-9]+)\n([0-9]+),([0-9]+)\n\Z")
ID_RE = re.compile(rb"\A[0-9a-f]{16}\Z")


# -- the Go formats, independently -------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One message as go-diskqueue stores it (nsqd's Message.WriteTo)."""

    id: bytes
    timestamp: int
    attempts: int
    body: bytes

    def encode(self) -> bytes:
        payload = HEADER.pack(self.timestamp, self.attempts, self.id) + self.body
        return SIZE.pack(len(payload)) + payload


class FormatError(AssertionError):
    pass


def decode_records(data: bytes, start: int = 0, *, partial_tail: bool = False) -> list[Record]:
    """Every record of ``data`` from ``start``; a truncated last record is an error unless
    ``partial_tail`` (a file being written when the process died)."""
    records: list[Record] = []
    pos = start
    while pos < len(data):
        if pos + 4 > len(data):
            if partial_tail:
                break
            raise FormatError(f"truncated size field at {pos}")
        (size,) = SIZE.unpack_from(data, pos)
        if not MIN_RECORD <= size <= MAX_MSG_SIZE + MIN_RECORD:
            raise FormatError(f"invalid record size {size} at {pos}")
        if pos + 4 + size > len(data):
            if partial_tail:
                break
            raise FormatError(f"truncated record at {pos}")
        timestamp, attempts, msg_id = HEADER.unpack_from(data, pos + 4)
        if not ID_RE.match(msg_id):
            raise FormatError(f"message ID {msg_id!r} at {pos} is not 16 lowercase hex digits")
        records.append(
            Record(msg_id, timestamp, attempts, data[pos + 4 + MIN_RECORD : pos + 4 + size])
        )
        pos += 4 + size
    return records


@dataclass(frozen=True)
class QueueMeta:
    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int

    def encode(self) -> bytes:
        return b"%d\n%d,%d\n%d,%d\n" % (
            self.depth,
            self.read_file,
            self.read_pos,
            self.write_file,
            self.write_pos,
        )


def data_file(data_path: Path, name: str, num: int) -> Path:
    return data_path / f"{name}.diskqueue.{num:06d}.dat"


def meta_file(data_path: Path, name: str) -> Path:
    return data_path / f"{name}.diskqueue.meta.dat"


def data_file_numbers(data_path: Path, name: str) -> list[int]:
    pattern = re.compile(re.escape(name) + r"\.diskqueue\.([0-9]{6})\.dat\Z")
    return sorted(int(m.group(1)) for p in data_path.iterdir() if (m := pattern.match(p.name)))


def read_meta(data_path: Path, name: str) -> QueueMeta:
    raw = meta_file(data_path, name).read_bytes()
    m = META_RE.match(raw)
    if m is None:
        raise FormatError(f"{name} metadata is not Go's 3 lines: {raw!r}")
    return QueueMeta(*(int(g) for g in m.groups()))


def write_queue(data_path: Path, name: str, files: list[list[Record]]) -> QueueMeta:
    """Files 0..n-1 as go-diskqueue leaves them after a clean exit: nothing read yet, the last
    file is the write file and the metadata's writePos is its size."""
    sizes = []
    for num, records in enumerate(files):
        blob = b"".join(r.encode() for r in records)
        data_file(data_path, name, num).write_bytes(blob)
        sizes.append(len(blob))
    meta = QueueMeta(sum(map(len, files)), 0, 0, len(files) - 1, sizes[-1])
    meta_file(data_path, name).write_bytes(meta.encode())
    return meta


def queued_records(data_path: Path, name: str) -> list[Record]:
    """What a cleanly closed queue holds: its metadata must agree with its files exactly."""
    meta = read_meta(data_path, name)
    nums = data_file_numbers(data_path, name)
    if not nums:
        assert (meta.read_file, meta.read_pos) == (meta.write_file, meta.write_pos), meta
        assert meta.depth == 0, meta
        return []
    assert nums == list(range(meta.read_file, meta.write_file + 1)), (
        f"{name}: files {nums} for metadata {meta} (fully read files are deleted)"
    )
    records: list[Record] = []
    for num in nums:
        data = data_file(data_path, name, num).read_bytes()
        if num == meta.write_file:
            assert len(data) == meta.write_pos, f"{name} file {num}: size {len(data)} vs {meta}"
        records.extend(decode_records(data, meta.read_pos if num == meta.read_file else 0))
    assert meta.depth == len(records), f"{name}: depth {meta.depth}, {len(records)} records"
    return records


def salvageable_records(data_path: Path, name: str) -> list[Record]:
    """After a crash: every whole record from the metadata's read position to the end of the
    files, which go-diskqueue's reader salvages after a restart (spec §7.7 "stale meta")."""
    meta = read_meta(data_path, name)
    records: list[Record] = []
    for num in data_file_numbers(data_path, name):
        if num < meta.read_file:
            continue
        data = data_file(data_path, name, num).read_bytes()
        start = meta.read_pos if num == meta.read_file else 0
        records.extend(decode_records(data, start, partial_tail=True))
    return records


def nsqd_dat(topics: list[tuple[str, bool, list[tuple[str, bool]]]]) -> bytes:
    """nsqd.dat exactly as Go's json.Marshal writes it (spec §7.5)."""
    value = {
        "topics": [
            {
                "name": name,
                "paused": paused,
                "channels": [{"name": c, "paused": p} for c, p in channels] or None,
            }
            for name, paused, channels in topics
        ]
        or None,
        "version": "1.3.0",
    }
    return json.dumps(value, separators=(",", ":")).encode()


# -- helpers --------------------------------------------------------------------------------


def read_all(client: RawClient, count: int, *, timeout: float = 10.0) -> list[Message]:
    """``count`` messages, each FINed as it arrives."""
    deadline = time.monotonic() + timeout
    out: list[Message] = []
    while len(out) < count:
        try:
            msg = client.read_message(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise AssertionError(f"got {len(out)} of {count} messages in {timeout}s") from None
        out.append(msg)
        client.fin(msg.id)
    return out


def http_base(server: ServerProcess, timeout: float = 5.0) -> str | None:
    """The HTTP API's base URL if this nsqd serves one (the line follows the TCP one)."""
    try:
        m = server.wait_for_log(r"\bHTTP: listening on (\S+)", timeout=timeout)
    except ServerError:
        return None
    return f"http://{m.group(1)}"


def http_call(method: str, url: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def channel_stats(base: str, topic: str, channel: str) -> dict[str, object]:
    status, body = http_call("GET", f"{base}/stats?format=json&topic={topic}&channel={channel}")
    assert status == 200, body
    stats = json.loads(body)
    for t in stats["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    raise AssertionError(f"{topic}:{channel} not in /stats: {stats}")


def assert_healthy_log(server: ServerProcess) -> None:
    text = server.log_text()
    assert "Traceback" not in text, text
    assert "FATAL" not in text, text


# -- a Go data directory → our nsqd ----------------------------------------------------------


def go_fixture(data_path: Path, *, paused: bool) -> dict[bytes, Record]:
    """Topic ``orders`` (two messages still in the topic's own queue) with channel ``email``
    (eight messages over two data files), written the way the Go nsqd 1.3.0 leaves them."""
    data_path.mkdir(parents=True, exist_ok=True)
    data_path.joinpath("nsqd.dat").write_bytes(nsqd_dat([("orders", False, [("email", paused)])]))
    bodies = [
        b"order #1",
        b"\x00\x01\x02 binary \xff\xfe\n\r\n",
        b"x",
        b'{"json": true}\n',
        bytes(range(256)) * 40,
        b"a" * 1000,
        b"tail\n",
        b"last of the channel",
        b"topic backlog 1",
        b"topic backlog 2\x00",
    ]
    attempts = [0, 1, 2, 0, 7, 0, 65534, 3, 0, 4]
    records = [
        Record(b"%016x" % (0x0A1B2C3D00000000 + i), 1_700_000_000_123_456_789 + i * 1_000_003, a, b)
        for i, (a, b) in enumerate(zip(attempts, bodies, strict=True))
    ]
    write_queue(data_path, "orders:email", [records[:5], records[5:8]])
    write_queue(data_path, "orders", [records[8:]])
    return {r.id: r for r in records}


def assert_delivered_as_stored(messages: list[Message], expected: dict[bytes, Record]) -> None:
    got = {m.id: m for m in messages}
    assert len(got) == len(messages), "a message was delivered twice"
    assert set(got) == set(expected)
    for msg_id, rec in expected.items():
        m = got[msg_id]
        assert (m.timestamp, m.attempts, m.body) == (rec.timestamp, rec.attempts + 1, rec.body), (
            msg_id
        )


def test_go_data_dir_is_served_byte_exact(nsqd_pool: ServerPool, tmp_path: Path) -> None:
    data = tmp_path / "go"
    expected = go_fixture(data, paused=False)
    nsqd = nsqd_pool.start(data_path=data)
    with consumer(nsqd.tcp_address, "orders", "email", rdy=50) as client:
        assert_delivered_as_stored(read_all(client, len(expected)), expected)
        client.expect_no_frame(0.3)
    assert nsqd.stop() == 0
    assert_healthy_log(nsqd)
    # everything was read: the queues are empty, fully read files are gone
    assert queued_records(data, "orders:email") == []
    assert queued_records(data, "orders") == []
    meta = json.loads(data.joinpath("nsqd.dat").read_bytes())
    assert meta["topics"] == [
        {"name": "orders", "paused": False, "channels": [{"name": "email", "paused": False}]}
    ]


def test_go_data_dir_paused_channel_stays_paused(nsqd_pool: ServerPool, tmp_path: Path) -> None:
    data = tmp_path / "go"
    expected = go_fixture(data, paused=True)
    nsqd = nsqd_pool.start(data_path=data)
    base = http_base(nsqd)
    with consumer(nsqd.tcp_address, "orders", "email", rdy=50) as client:
        # paused: nothing is delivered although ten messages wait
        client.expect_no_frame(1.0)
        if base is not None:
            stats = channel_stats(base, "orders", "email")
            assert stats["paused"] is True
            assert stats["depth"] == len(expected)
            status, body = http_call("POST", f"{base}/channel/unpause?topic=orders&channel=email")
            assert status == 200, body
            assert_delivered_as_stored(read_all(client, len(expected)), expected)
    assert nsqd.stop() == 0
    assert_healthy_log(nsqd)
    meta = json.loads(data.joinpath("nsqd.dat").read_bytes())
    # without HTTP nobody unpaused it: still paused, still holding everything
    assert meta["topics"][0]["channels"] == [{"name": "email", "paused": base is None}]
    if base is None:
        held = queued_records(data, "orders:email")
        assert {r.id: r for r in held} == expected


# -- our nsqd → a Go data directory ------------------------------------------------------------


def test_our_data_dir_is_in_go_format(nsqd_pool: ServerPool, tmp_path: Path) -> None:
    data = tmp_path / "ours"
    max_bytes = 4096
    nsqd = nsqd_pool.start(data_path=data, mem_queue_size=10, max_bytes_per_file=max_bytes)
    for channel in ("email", "sms"):
        with consumer(nsqd.tcp_address, "orders", channel):
            pass
    bodies = [b"%03d:" % i + bytes([i]) * (150 + i) for i in range(100)]
    audit = [b"audit %d \x00\xff" % i for i in range(30)]
    with RawClient(nsqd.tcp_address) as pub:
        for i in range(0, 100, 20):
            pub.mpub("orders", bodies[i : i + 20])
        pub.mpub("audit", audit)
    with consumer(nsqd.tcp_address, "orders", "email", rdy=30) as client:
        got = client.read_messages(30)  # now 30 in flight = RDY: nothing more comes
        client.rdy(0)
        for m in got[:25]:
            client.fin(m.id)
        in_flight = {m.id: m for m in got[25:]}
        finned = {m.body for m in got[:25]}
        client.fin(b"0" * 16)  # a round trip: the FINs before it were processed
        client.expect_error(
            "E_FIN_FAILED FIN 0000000000000000 failed ID not in flight", fatal=False
        )
        assert nsqd.stop() == 0
    assert_healthy_log(nsqd)

    # nsqd.dat: compact JSON, Go's key order, null for no channels, version 1.3.0, mode 0600
    raw = data.joinpath("nsqd.dat").read_bytes()
    meta = json.loads(raw)
    assert json.dumps(meta, separators=(",", ":")).encode() == raw
    assert list(meta) == ["topics", "version"]
    assert meta["version"] == "1.3.0"
    for t in meta["topics"]:
        assert list(t) == ["name", "paused", "channels"]
        for c in t["channels"] or []:
            assert list(c) == ["name", "paused"]
    topics = {t["name"]: t for t in meta["topics"]}
    assert set(topics) == {"orders", "audit"}
    assert topics["audit"]["channels"] is None
    assert sorted(c["name"] for c in topics["orders"]["channels"]) == ["email", "sms"]
    assert stat.S_IMODE(data.joinpath("nsqd.dat").stat().st_mode) == 0o600

    # the queues: metadata consistent with the files, records decodable
    sms = queued_records(data, "orders:sms")
    assert sorted(r.body for r in sms) == sorted(bodies)
    assert all(r.attempts == 0 for r in sms)
    email = queued_records(data, "orders:email")
    assert sorted(r.body for r in email) == sorted(set(bodies) - finned)
    for r in email:
        if r.id in in_flight:
            m = in_flight[r.id]
            assert (r.timestamp, r.attempts, r.body) == (m.timestamp, 1, m.body)
        else:
            assert r.attempts == 0
    assert len(email) == 75
    assert sorted(r.body for r in queued_records(data, "audit")) == sorted(audit)
    assert queued_records(data, "orders") == []  # it always had channels: nothing queued there

    # file rolling (spec §7.7): a completed file was rolled only because the next record
    # did not fit, and the channels took several files
    for name in ("orders:sms", "orders:email"):
        nums = data_file_numbers(data, name)
        assert len(nums) > 2, nums
        for num in nums[:-1]:
            blob = data_file(data, name, num).read_bytes()
            nxt = data_file(data, name, num + 1).read_bytes()
            first_next = 4 + SIZE.unpack_from(nxt, 0)[0]
            assert len(blob) <= max_bytes and len(blob) + first_next > max_bytes, (name, num)
    for path in data.iterdir():
        assert not path.name.endswith((".tmp", ".bad")), path.name
        if ".diskqueue." in path.name:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
    assert not data.joinpath("nsqd.deferred.dat").exists()  # nothing was deferred


# -- corruption (spec §7.7, §9 row 7) -----------------------------------------------------------


def plain_records(prefix: bytes, count: int, start: int = 0) -> list[Record]:
    return [
        Record(
            b"%016x" % (0x0B00000000000000 + start + i),
            1_700_000_000_000_000_000 + i,
            0,
            prefix + b"%d" % i,
        )
        for i in range(count)
    ]


def write_corrupt_queue(data: Path, *, in_write_file: bool) -> tuple[list[Record], str]:
    """A channel queue whose data has a garbage size field in the middle of a file.

    Returns the records a reader can get, in order, and the name of the corrupt file.
    """
    data.mkdir(parents=True, exist_ok=True)
    data.joinpath("nsqd.dat").write_bytes(nsqd_dat([("logs", False, [("ch", False)])]))
    good = plain_records(b"good ", 3)
    before = plain_records(b"before garbage ", 2, 10)
    after = plain_records(b"after garbage ", 2, 20)
    garbage = SIZE.pack(0x7FFFFFF0) + b"\xde\xad\xbe\xef" * 8
    corrupt = b"".join(r.encode() for r in before) + garbage + b"".join(r.encode() for r in after)
    if in_write_file:
        files = [corrupt]
        readable = before
        bad = "logs:ch.diskqueue.000000.dat"
    else:
        tail = plain_records(b"next file ", 3, 30)
        files = [b"".join(r.encode() for r in good), corrupt, b"".join(r.encode() for r in tail)]
        readable = good + before + tail
        bad = "logs:ch.diskqueue.000001.dat"
    for num, blob in enumerate(files):
        data_file(data, "logs:ch", num).write_bytes(blob)
    depth = len(readable) + len(after)
    meta = QueueMeta(depth, 0, 0, len(files) - 1, len(files[-1]))
    meta_file(data, "logs:ch").write_bytes(meta.encode())
    return readable, bad


@pytest.mark.parametrize("in_write_file", [False, True], ids=["middle-file", "write-file"])
def test_corrupt_data_file_is_renamed_bad_and_reading_goes_on(
    nsqd_pool: ServerPool, tmp_path: Path, in_write_file: bool
) -> None:
    data = tmp_path / "corrupt"
    readable, bad = write_corrupt_queue(data, in_write_file=in_write_file)
    nsqd = nsqd_pool.start(data_path=data)
    with consumer(nsqd.tcp_address, "logs", "ch", rdy=20) as client:
        got = read_all(client, len(readable))
        assert [(m.id, m.body, m.attempts) for m in got] == [(r.id, r.body, 1) for r in readable]
        nsqd.wait_for_log(r"invalid message read size")
        nsqd.wait_for_log(rf"jump to next file and saving bad file as \S*{re.escape(bad)}\.bad")
        client.expect_no_frame(0.3)
        assert data.joinpath(bad + ".bad").exists()
        assert not data.joinpath(bad).exists()
        # the queue goes on: new messages go to a fresh file and are delivered
        with RawClient(nsqd.tcp_address) as pub:
            pub.mpub("logs", [b"fresh 1", b"fresh 2\n"])
        assert [m.body for m in read_all(client, 2)] == [b"fresh 1", b"fresh 2\n"]
    assert nsqd.stop() == 0
    assert "Traceback" not in nsqd.log_text()
    assert queued_records(data, "logs:ch") == []


def test_stale_meta_depth_after_a_crash_still_delivers_every_record(
    nsqd_pool: ServerPool, tmp_path: Path
) -> None:
    """The metadata was synced after 4 of the file's 10 records (then kill -9): its depth and
    writePos say 4. The file is longer than writePos, so writing moves to a new file and the
    reader salvages all 10; the stale depth must not stop delivery at 4 (Go reads on, then
    resets the count at the tail)."""
    data = tmp_path / "stale"
    data.mkdir()
    data.joinpath("nsqd.dat").write_bytes(nsqd_dat([("orders", False, [("email", False)])]))
    records = plain_records(b"salvaged", 10)
    write_queue(data, "orders:email", [records])
    synced = sum(len(r.encode()) for r in records[:4])
    meta_file(data, "orders:email").write_bytes(QueueMeta(4, 0, 0, 0, synced).encode())
    nsqd = nsqd_pool.start(data_path=data)
    # RDY 1: the channel reads the queue one message at a time, asking its depth each time
    with consumer(nsqd.tcp_address, "orders", "email", rdy=1) as client:
        got = read_all(client, len(records))
        assert [m.body for m in got] == [r.body for r in records]
        client.expect_no_frame(0.3)
    assert nsqd.stop() == 0
    assert_healthy_log(nsqd)
    text = nsqd.log_text()
    assert f"metadata writePos {synced} < file size of" in text, text
    assert "negative depth at tail (-6), metadata corruption, resetting 0..." in text, text


def test_truncated_meta_file_does_not_stop_nsqd(nsqd_pool: ServerPool, tmp_path: Path) -> None:
    data = tmp_path / "truncated"
    data.mkdir()
    data.joinpath("nsqd.dat").write_bytes(nsqd_dat([("logs", False, [("ch", False)])]))
    old = plain_records(b"old ", 3)
    blob = b"".join(r.encode() for r in old)
    data_file(data, "logs:ch", 0).write_bytes(blob)
    meta_file(data, "logs:ch").write_bytes(b"3\n0,0\n")  # the third line is missing
    nsqd = nsqd_pool.start(data_path=data)
    nsqd.wait_for_log(r"DISKQUEUE\(logs:ch\) failed to retrieveMetaData")
    with consumer(nsqd.tcp_address, "logs", "ch", rdy=20) as client:
        with RawClient(nsqd.tcp_address) as pub:
            pub.mpub("logs", [b"new 1", b"new 2"])
        seen: list[Message] = []
        deadline = time.monotonic() + 10
        while b"new 2" not in [m.body for m in seen]:
            msg = client.read_message(max(0.0, deadline - time.monotonic()))
            seen.append(msg)
            client.fin(msg.id)
        # whatever else comes is an old record, whole, never a torn or garbage one
        old_by_id = {r.id: r for r in old}
        for m in seen:
            if m.body in (b"new 1", b"new 2"):
                continue
            assert m.id in old_by_id and old_by_id[m.id].body == m.body, m
    assert nsqd.stop(signal.SIGINT) == 0
    assert "Traceback" not in nsqd.log_text()


def test_copy_of_a_data_dir_can_be_served_again(nsqd_pool: ServerPool, tmp_path: Path) -> None:
    """A data dir our nsqd wrote, copied elsewhere, is a valid data dir (no absolute paths)."""
    first = tmp_path / "first"
    nsqd = nsqd_pool.start(data_path=first, mem_queue_size=0)
    with consumer(nsqd.tcp_address, "moved", "ch"):
        pass
    bodies = [b"moved %d" % i for i in range(50)]
    with RawClient(nsqd.tcp_address) as pub:
        pub.mpub("moved", bodies)
    assert nsqd.stop() == 0
    second = tmp_path / "second"
    shutil.copytree(first, second)
    nsqd = nsqd_pool.start(data_path=second)
    with consumer(nsqd.tcp_address, "moved", "ch", rdy=100) as client:
        assert [m.body for m in read_all(client, 50)] == bodies
