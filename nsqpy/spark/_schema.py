"""The source's row schema, as Spark sees it and as Arrow carries it (exactly equal, as Spark
checks for ``RecordBatch`` output), and the conversion of a read task's messages to Arrow."""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from nsqpy.spark._conn import Columns

__all__ = ["ARROW_SCHEMA", "SCHEMA", "SEGMENT_SCHEMA", "to_record_batch", "with_constants"]

SCHEMA: Final = StructType(
    [
        StructField("id", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("attempts", IntegerType()),
        StructField("body", BinaryType()),
        StructField("topic", StringType()),
        StructField("channel", StringType()),
        StructField("nsqd", StringType()),
    ]
)

# What pyspark's to_arrow_schema(SCHEMA, timezone="UTC") gives.
ARROW_SCHEMA: Final[Any] = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("attempts", pa.int32()),
        pa.field("body", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("channel", pa.string()),
        pa.field("nsqd", pa.string()),
    ]
)

# What a log segment stores: the per-message columns. topic, channel and nsqd are the same for
# every row of a partition (its plan and seal say them), so they are added back on replay.
SEGMENT_SCHEMA: Final[Any] = pa.schema(list(ARROW_SCHEMA)[:4])


def with_constants(segment: Any, topic: str, channel: str, nsqd: str) -> Any:
    """A segment's batch (:data:`SEGMENT_SCHEMA`) as a batch of :data:`ARROW_SCHEMA`."""
    if segment.num_columns == len(ARROW_SCHEMA):  # a segment written with every column
        return segment
    n = segment.num_rows
    return pa.RecordBatch.from_arrays(
        [
            *segment.columns,
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(channel, pa.string()), n),
            pa.repeat(pa.scalar(nsqd, pa.string()), n),
        ],
        schema=ARROW_SCHEMA,
    )


def to_record_batch(cols: Columns, topic: str, channel: str, nsqd: str) -> Any:
    """The kept messages as one ``pyarrow.RecordBatch`` of :data:`ARROW_SCHEMA`, built from
    the column buffers (no per-message objects).

    NSQ timestamps are nanoseconds since the epoch; Spark's are microseconds.
    """
    n = len(cols)
    # IDs are 16 ASCII hex characters: build the string column from buffers (a cast from
    # binary validates UTF-8 and costs ten times as much).
    ids = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), n, [None, pa.py_buffer(cols.ids)])
    ids = ids.cast(pa.binary())
    # Hex ids are ASCII, so valid UTF-8 as they are: a view, not a validating cast.
    ids = ids.view(pa.string()) if cols.ids.isascii() else ids.cast(pa.string())
    ns = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(cols.timestamps)])
    timestamps = pc.divide(ns, 1000).cast(pa.timestamp("us", tz="UTC"))
    attempts = pa.Array.from_buffers(pa.uint16(), n, [None, pa.py_buffer(cols.attempts)])
    if len(cols.bodies) == 1:
        bodies = cols.bodies[0]
    else:
        bodies = pa.concat_arrays(cols.bodies) if cols.bodies else pa.array([], pa.binary())
    segment = pa.RecordBatch.from_arrays(
        [ids, timestamps, attempts.cast(pa.int32()), bodies], schema=SEGMENT_SCHEMA
    )
    return with_constants(segment, topic, channel, nsqd)
