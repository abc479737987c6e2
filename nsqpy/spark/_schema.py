"""The source's row schema, as Spark sees it and as Arrow carries it (exactly equal, as Spark
checks for ``RecordBatch`` output), and the conversion of a read task's messages to Arrow."""

from __future__ import annotations

import array
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

__all__ = ["ARROW_SCHEMA", "SCHEMA", "to_record_batch"]

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


def to_record_batch(cols: Columns, topic: str, channel: str, nsqd: str) -> Any:
    """The kept messages as one ``pyarrow.RecordBatch`` of :data:`ARROW_SCHEMA`.

    NSQ timestamps are nanoseconds since the epoch; Spark's are microseconds.
    """
    n = len(cols)
    # IDs are 16 ASCII hex characters: build the string column from buffers (a cast from
    # binary validates UTF-8 and costs ten times as much).
    id_bytes = b"".join(cols.ids)
    if id_bytes.isascii() and len(id_bytes) == 16 * n:
        offsets = pa.py_buffer(array.array("i", range(0, 16 * n + 1, 16)))
        ids = pa.StringArray.from_buffers(n, offsets, pa.py_buffer(id_bytes))
    else:
        ids = pa.array(cols.ids, pa.binary()).cast(pa.string())
    ns = pa.array(cols.timestamps, pa.int64())
    timestamps = pc.divide(ns, 1000).cast(pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(
        [
            ids,
            timestamps,
            pa.array(cols.attempts, pa.int32()),
            pa.array(cols.bodies, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(channel, pa.string()), n),
            pa.repeat(pa.scalar(nsqd, pa.string()), n),
        ],
        schema=ARROW_SCHEMA,
    )
