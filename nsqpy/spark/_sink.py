"""The sink: Arrow writers that MPUB a DataFrame's ``body`` column to NSQ topics.

**Routing** (as Kafka's sink): the ``topic`` option, when set, names the topic of every row;
without it, each row's ``topic`` column does (rows are grouped per topic with Arrow, and each
topic gets its own MPUBs). A row with a non-null ``deferMs`` column is published alone with
``DPUB`` (NSQ has no deferred MPUB); the others still go by MPUB.

Each write task publishes its rows to one nsqd (``nsqdTCPAddresses``, or every nsqd nsqlookupd
knows through ``/nodes``, chosen by partition id) in MPUB commands that respect nsqd's limits
(``--max-body-size`` 5 MiB per command, ``--max-msg-size`` 1 MiB per message, at most
``(max_body_size - 4) / 5`` messages), with several commands in flight at once.

At least once: NSQ has no transactions and no producer idempotence, so a task that fails after
some ``OK``\\ s, or a micro-batch that Spark re-executes, publishes again. With
``markerLocation`` a streaming task writes ``<markerLocation>/<batchId>/<partitionId>`` after
its last ``OK``, and a re-execution of that partition (same input, thanks to the source's
log) skips it; this shrinks the duplicate window to a task that dies mid-publish. The
marker's file is written (with a placeholder count) *before* the first publish and only
completed in place and renamed after the last ``OK``, which takes no new space: a full file
system fails the task before anything is published, never between the last ``OK`` and the
marker (which would publish the partition again on the retry).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import sys
import time
import uuid
from array import array
from bisect import bisect_right
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegralType, StringType, StructType

from nsqpy.spark._conn import NSQConnectionError, Publisher
from nsqpy.spark._http import lookupd_nodes
from nsqpy.spark._options import SinkOptions
from nsqpy.spark._wal import LogWriteError, report_loss, writing
from nsqpy.wire.names import is_valid_topic_name
from nsqpy.wire.v2 import encode_dpub

__all__ = [
    "NSQBatchWriter",
    "NSQCommitMessage",
    "NSQStreamWriter",
    "Routing",
    "check_sink_schema",
    "encode_commands",
    "encode_mpubs",
]

log = logging.getLogger("nsqpy.spark")

_INT32 = struct.Struct(">i")
_SWAP: Final = sys.byteorder == "little"  # the wire is big-endian
BODY_COLUMN: Final = "body"
TOPIC_COLUMN: Final = "topic"
DEFER_COLUMN: Final = "deferms"  # Spark's column names are case-insensitive: deferMs
# Markers: the last batch whose commit the driver ran (see _check_markers).
COMMITTED: Final = "COMMITTED"
_MARKERS: Final = "nsq sink markers"
_COUNT_WIDTH: Final = 20  # a marker's count, right-aligned: completed in place


@dataclass(frozen=True)
class Routing:
    """What a write needs besides the bodies, decided once from the schema and the options:
    route rows by their ``topic`` column (no ``topic`` option), DPUB rows with ``deferMs``."""

    by_column: bool
    deferred: bool

    @property
    def plain(self) -> bool:
        """Every row to the option's topic by MPUB: the path the benchmark measures."""
        return not self.by_column and not self.deferred


def check_sink_schema(schema: StructType, options: SinkOptions | None = None) -> Routing:
    """The DataFrame must have a ``body`` column of binary or string type; a ``topic`` column
    (string) when the option ``topic`` is not set; ``deferMs``, if present, is an integer."""
    fields = {f.name.lower(): f for f in schema.fields}
    field = fields.get(BODY_COLUMN)
    if field is None:
        raise ValueError(f"the nsq sink needs a 'body' column; the columns are {schema.names}")
    if not isinstance(field.dataType, BinaryType | StringType):
        raise ValueError(f"column 'body' must be binary or string, not {field.dataType}")
    by_column = options is not None and options.topic is None
    if by_column:
        topic = fields.get(TOPIC_COLUMN)
        if topic is None:
            raise ValueError(
                "the nsq sink needs the option topic or a 'topic' column; "
                f"the columns are {schema.names}"
            )
        if not isinstance(topic.dataType, StringType):
            raise ValueError(f"column 'topic' must be a string, not {topic.dataType}")
    defer = fields.get(DEFER_COLUMN)
    if defer is not None and not isinstance(defer.dataType, IntegralType):
        raise ValueError(f"column 'deferMs' must be an integer (ms), not {defer.dataType}")
    return Routing(by_column=by_column, deferred=defer is not None)


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one write task did (travels to the driver's ``commit``)."""

    batch_id: int | None
    partition_id: int
    messages: int
    commands: int
    skipped: bool = False
    nsqd: str = ""


def encode_mpubs(
    topic: str, batches: Iterator[Any], options: SinkOptions, counter: list[int]
) -> Iterator[bytes]:
    """MPUB commands for the ``body`` column of every Arrow batch, within nsqd's limits.

    Vectorised: Arrow prefixes every body with its 4-byte big-endian size in one step, so the
    bodies of an MPUB are one contiguous slice of that column's data; Python only picks the
    cut points (one bisect per command). Batches are gathered up to a command's worth of rows
    first, so that commands are not cut at Spark's batch boundaries. ``counter[0]`` counts the
    messages encoded.
    """
    mpubs = _Mpubs(topic, options, counter)
    for batch in batches:
        yield from mpubs.add(_body_column(batch, options.max_msg_size))
    yield from mpubs.finish()


class _Mpubs:
    """The MPUBs of one topic, fed column by column (see :func:`encode_mpubs`)."""

    def __init__(self, topic: str, options: SinkOptions, counter: list[int]) -> None:
        self.head = b"MPUB " + topic.encode() + b"\n"
        self.max_body = options.max_body_size
        self.max_count = max(1, min(options.publish_batch_size, (self.max_body - 4) // 5))
        self.counter = counter
        self.pending: list[Any] = []
        self.rows = self.size = 0  # what pending holds (size: its bodies' bytes)

    def add(self, column: Any) -> Iterator[bytes]:
        """Take ``column``'s bodies; the commands that are full."""
        if not len(column):
            return
        self.pending.append(column)
        self.rows += len(column)
        self.size += _body_bytes(column)
        if self.rows >= self.max_count or self.size >= self.max_body:  # a command's worth
            tail = yield from _commands(
                self.head, self.pending, self.max_count, self.max_body, self.counter, final=False
            )
            self.pending = [tail] if tail is not None else []
            self.rows = len(tail) if tail is not None else 0
            self.size = _body_bytes(tail) if tail is not None else 0

    def finish(self) -> Iterator[bytes]:
        if self.rows:
            yield from _commands(
                self.head, self.pending, self.max_count, self.max_body, self.counter, final=True
            )
        self.pending, self.rows, self.size = [], 0, 0


def encode_commands(
    batches: Iterator[Any], options: SinkOptions, routing: Routing, counter: list[int]
) -> Iterator[bytes]:
    """The commands that publish every row of ``batches``: MPUBs per topic, and a DPUB for
    each row with a ``deferMs``. With nothing to route, exactly :func:`encode_mpubs`."""
    if routing.plain:
        assert options.topic is not None
        yield from encode_mpubs(options.topic, batches, options, counter)
        return
    mpubs: dict[str, _Mpubs] = {}
    for batch in batches:
        bodies = _body_column(batch, options.max_msg_size)
        names = [n.lower() for n in batch.schema.names]
        defer = batch.column(names.index(DEFER_COLUMN)) if routing.deferred else None
        for topic, mask in _by_topic(batch, names, options.topic):
            now, later, delays = _split_deferred(
                bodies if mask is None else bodies.filter(mask),
                defer if mask is None or defer is None else defer.filter(mask),
            )
            if topic not in mpubs:
                mpubs[topic] = _Mpubs(topic, options, counter)
            yield from mpubs[topic].add(now)
            for delay, body in zip(delays, later.to_pylist(), strict=True):
                yield encode_dpub(topic, delay, body)
                counter[0] += 1
    for encoder in mpubs.values():
        yield from encoder.finish()


def _by_topic(batch: Any, names: list[str], option: str | None) -> Iterator[tuple[str, Any]]:
    """``(topic, mask)`` for each topic of the rows (mask None: every row): the option's,
    else the ``topic`` column's (one mask per distinct topic; rows keep their order)."""
    if option is not None:
        yield option, None
        return
    topics = batch.column(names.index(TOPIC_COLUMN))
    if topics.null_count:
        raise ValueError("nsq sink: a row has a null 'topic' and the option topic is not set")
    distinct = topics.unique().to_pylist()
    for topic in distinct:
        if not is_valid_topic_name(topic):
            raise ValueError(f"nsq sink: column 'topic': {topic!r} is not a valid NSQ topic name")
    if len(distinct) == 1:
        yield distinct[0], None
        return
    for topic in distinct:
        yield topic, pc.equal(topics, topic)


def _split_deferred(bodies: Any, delays: Any | None) -> tuple[Any, Any, list[int]]:
    """The ``bodies`` to MPUB now, and those to DPUB with their ``delays`` (ms; null: now)."""
    if delays is None or delays.null_count == len(delays):
        return bodies, bodies.slice(0, 0), []
    if not delays.null_count:
        return bodies.slice(0, 0), bodies, delays.cast(pa.int64()).to_pylist()
    later = delays.is_valid()
    return (
        bodies.filter(pc.invert(later)),
        bodies.filter(later),
        delays.filter(later).cast(pa.int64()).to_pylist(),
    )


def _commands(
    head: bytes,
    columns: list[Any],
    max_count: int,
    max_body: int,
    counter: list[int],
    *,
    final: bool,
) -> Generator[bytes, None, Any]:
    """The MPUBs of ``columns`` (binary bodies); unless ``final``, the rows that would make a
    short last command are returned instead, to open the next one."""
    column = columns[0] if len(columns) == 1 else pa.concat_arrays(columns)
    k = len(column)
    sizes = array("i", _int32_bytes(pc.binary_length(column)))
    if _SWAP:
        sizes.byteswap()
    prefixes = pa.Array.from_buffers(pa.binary(4), k, [None, pa.py_buffer(sizes)])
    framed = pc.binary_join_element_wise(prefixes.cast(pa.binary()), column, b"")
    offsets = array("i", _int32_bytes(framed, k + 1, buffer=1))
    data = framed.buffers()[2]
    budget = max_body - 4  # the count takes 4 of the body
    start = 0
    while start < k:
        stop = min(start + max_count, k)
        if offsets[stop] - offsets[start] > budget:
            stop = max(start + 1, bisect_right(offsets, offsets[start] + budget, start, stop) - 1)
        if not final and stop == k and stop - start < max_count:
            return column.slice(start)
        payload = data[offsets[start] : offsets[stop]].to_pybytes()
        yield head + _INT32.pack(len(payload) + 4) + _INT32.pack(stop - start) + payload
        counter[0] += stop - start
        start = stop
    return None


def _body_bytes(column: Any) -> int:
    """The bytes of a binary column's values (from its offsets, not its buffers' sizes)."""
    offsets = column.buffers()[1]
    first, last = (
        int.from_bytes(offsets[4 * i : 4 * i + 4].to_pybytes(), sys.byteorder, signed=True)
        for i in (column.offset, column.offset + len(column))
    )
    return last - first


def _int32_bytes(values: Any, count: int | None = None, buffer: int = 1) -> bytes:
    """The native int32s of ``values`` (its ``buffer``: 1 = values or offsets), from its offset."""
    n = len(values) if count is None else count
    return bytes(values.buffers()[buffer][4 * values.offset : 4 * (values.offset + n)].to_pybytes())


def _body_column(batch: Any, max_msg: int) -> Any:
    """The ``body`` column of an Arrow batch as ``binary`` (strings are UTF-8), every value
    checked against NSQ's 1 to ``max_msg`` bytes."""
    names = [n.lower() for n in batch.schema.names]
    column = batch.column(names.index(BODY_COLUMN))
    if column.null_count:
        raise ValueError("nsq sink: column 'body' has nulls (NSQ messages cannot be empty)")
    if not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())  # string, large_string, large_binary
    if len(column):
        bounds = pc.min_max(pc.binary_length(column))
        smallest, largest = bounds["min"].as_py(), bounds["max"].as_py()
        if smallest == 0 or largest > max_msg:
            n = 0 if smallest == 0 else largest
            raise ValueError(
                f"nsq sink: a body of {n} bytes cannot be published "
                f"(NSQ takes 1 to maxMsgSize={max_msg} bytes)"
            )
    return column


def _addresses(options: SinkOptions) -> list[str]:
    if options.nsqd_tcp_addresses:
        return list(options.nsqd_tcp_addresses)
    nodes = lookupd_nodes(options.lookupd_http_addresses, options.connect_timeout)
    if not nodes:
        raise NSQConnectionError("nsq sink: nsqlookupd knows no nsqd to publish to")
    return [n.tcp_address for n in nodes]


def _marker_path(options: SinkOptions, batch_id: int, partition_id: int) -> str | None:
    if options.marker_location is None:
        return None
    return os.path.join(options.marker_location, str(batch_id), str(partition_id))


def _check_markers(options: SinkOptions, batch_id: int, marker: str) -> None:
    """Were the markers lost or tampered with between runs? The driver's commit of batch *b*
    writes ``COMMITTED`` = *b* and keeps only *b*'s markers, so batch *b* runs after
    ``COMMITTED`` *b* - 1 (or *b*, re-executed after its commit): anything else means the
    markers are not this query's any more, and re-executed partitions would publish again."""
    assert options.marker_location is not None
    location = options.marker_location
    committed: int | None = None
    try:
        with open(os.path.join(location, COMMITTED), "rb") as f:
            committed = int(f.read())
    except FileNotFoundError:
        pass
    except ValueError:
        committed = -2
    problem = None
    if committed is None and batch_id > 0:
        problem = f"no marker of the batches before {batch_id} (deleted, or a new markerLocation)"
    elif committed is not None and committed not in (batch_id - 1, batch_id):
        problem = f"{COMMITTED} names batch {committed}, not {batch_id - 1}: damaged or not ours"
    else:
        try:
            with open(marker, "rb") as f:
                int(f.read())
        except FileNotFoundError:
            pass
        except ValueError:
            problem = f"marker {marker} is damaged"
    if problem is not None:
        report_loss(f"nsq sink markers {location}: {problem}", options.fail_on_data_loss)


def _write_marker(path: str, body: bytes) -> None:
    """Replace ``path`` with ``body`` atomically (a temporary file, fsync, rename); a failure
    leaves the old file and no temporary one (:class:`~nsqpy.spark._wal.LogWriteError`)."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with writing(_MARKERS, tmp, tmp):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _marker_body(count: int) -> bytes:
    return f"{count:>{_COUNT_WIDTH}}\n".encode()


def _reserve_marker(path: str) -> str:
    """Before publishing: the marker's file, under a temporary name, with room for its count.
    If the file system is full, the task fails here, before anything is published."""
    pending = f"{path}.{uuid.uuid4().hex}.tmp"
    with writing(_MARKERS, pending, pending):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(pending, "wb") as f:
            f.write(_marker_body(0))
            f.flush()
            os.fsync(f.fileno())
    return pending


def _complete_marker(pending: str, path: str, count: int) -> None:
    """After the last OK: the count written over the placeholder (same size, so no new
    space), then the rename that makes the partition published."""
    with writing(_MARKERS, path):
        fd = os.open(pending, os.O_WRONLY)
        try:
            os.pwrite(fd, _marker_body(count), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(pending, path)


def publish_partition(
    options: SinkOptions, routing: Routing, batches: Iterator[Any]
) -> NSQCommitMessage:
    """Publish one write task's rows (the body of every writer's ``write``)."""
    ctx = TaskContext.get()
    partition_id = ctx.partitionId() if ctx is not None else 0
    raw_batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    batch_id = int(raw_batch_id) if raw_batch_id is not None else None
    marker = None if batch_id is None else _marker_path(options, batch_id, partition_id)
    if marker is not None and batch_id is not None:
        _check_markers(options, batch_id, marker)
    if marker is not None and os.path.exists(marker):
        for _ in batches:  # consume the input all the same
            pass
        log.info("nsq sink: batch %s partition %d already published", batch_id, partition_id)
        return NSQCommitMessage(batch_id, partition_id, 0, 0, skipped=True)

    started = time.monotonic()
    counter = [0]
    commands = encode_commands(batches, options, routing, counter)
    first = next(commands, None)
    if first is None:
        return NSQCommitMessage(batch_id, partition_id, 0, 0)
    pending = None if marker is None else _reserve_marker(marker)
    try:
        published = _publish(options, partition_id, _chain(first, commands))
    except BaseException:
        if pending is not None:
            with contextlib.suppress(OSError):
                os.unlink(pending)
        raise
    if marker is not None and pending is not None:
        _complete_marker(pending, marker, counter[0])
    log.info(
        "nsq sink: batch %s partition %d: %d messages in %d MPUBs to %s in %.0fms",
        batch_id,
        partition_id,
        counter[0],
        published.acked,
        published.address,
        (time.monotonic() - started) * 1000,
    )
    return NSQCommitMessage(
        batch_id, partition_id, counter[0], published.acked, nsqd=published.address
    )


@dataclass(frozen=True)
class _Published:
    address: str
    acked: int


def _publish(options: SinkOptions, partition_id: int, commands: Iterator[bytes]) -> _Published:
    """Publish ``commands`` to one nsqd (by partition id, the next one if it cannot be
    reached); how many commands it acknowledged."""
    addresses = _addresses(options)
    publisher: Publisher | None = None
    errors: list[str] = []
    for k in range(len(addresses)):
        address = addresses[(partition_id + k) % len(addresses)]
        try:
            publisher = Publisher(address, options.connect_timeout, options.reply_timeout)
            break
        except NSQConnectionError as err:
            errors.append(str(err))
    if publisher is None:
        raise NSQConnectionError("nsq sink: no nsqd reachable: " + "; ".join(errors))
    try:
        acked = publisher.publish(commands, options.publish_pipeline)
    finally:
        publisher.close()
    return _Published(publisher.address, acked)


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


class NSQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``."""

    def __init__(self, options: SinkOptions, routing: Routing) -> None:
        self.options = options
        self.routing = routing

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return publish_partition(self.options, self.routing, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Runs on the driver, in a fresh writer, before Spark's commit log entry."""
        done = [m for m in messages if isinstance(m, NSQCommitMessage)]
        log.info(
            "nsq sink: batch %d committed: %d messages (%d partitions skipped)",
            batchId,
            sum(m.messages for m in done),
            sum(1 for m in done if m.skipped),
        )
        # Markers of earlier batches are no longer needed: only the last batch is re-executed.
        location = self.options.marker_location
        if location is not None:
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(location):
                    if name.isdigit() and int(name) < batchId:
                        shutil.rmtree(os.path.join(location, name), ignore_errors=True)
            try:
                _write_marker(os.path.join(location, COMMITTED), f"{batchId}\n".encode())
            except LogWriteError as err:
                raise err.explained(
                    f"batch {batchId} was published and its markers stay: a restart from the "
                    f"checkpoint, once there is room, skips its partitions"
                ) from err

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published = sum(m.messages for m in messages if isinstance(m, NSQCommitMessage))
        log.warning(
            "nsq sink: batch %d aborted; %d messages were already published (NSQ cannot take "
            "them back)",
            batchId,
            published,
        )


class NSQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("nsq").mode("append").save()``."""

    def __init__(self, options: SinkOptions, routing: Routing) -> None:
        self.options = options
        self.routing = routing

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return publish_partition(self.options, self.routing, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, NSQCommitMessage))
        where = self.options.topic or "the topics of the 'topic' column"
        log.info("nsq sink: %d messages published to %s", total, where)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        published = sum(m.messages for m in messages if isinstance(m, NSQCommitMessage))
        log.warning("nsq sink: write aborted; %d messages were already published", published)
