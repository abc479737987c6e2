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

from nsqpy.spark._conn import Columns, fixed_width_offsets
from nsqpy.wire.v2 import MSG_ID_LENGTH

__all__ = [
    "ARROW_SCHEMA",
    "COLUMNS",
    "SCHEMA",
    "SEGMENT_SCHEMA",
    "columns_of",
    "to_record_batch",
    "to_segment",
    "with_constants",
]

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


COLUMNS: Final = tuple(SCHEMA.names)
_SEGMENT_COLUMNS: Final = frozenset(SEGMENT_SCHEMA.names)


def columns_of(schema: StructType) -> tuple[str, ...] | None:
    """The columns a read produces: those of ``schema``, in its order (None: all, in the
    source's order).

    Spark passes the source's own :data:`SCHEMA`, or the schema the user gave with
    ``.schema(...)``: any subset of its columns, with their types, in any order. The Python Data
    Source API has no column pruning, so this is how a query that needs only some columns keeps
    Spark from converting and writing the others (see docs/SPARK.md, "Performance").
    """
    known = {f.name: f.dataType for f in SCHEMA.fields}
    names = tuple(schema.names)
    if not names:
        raise ValueError(f"the nsq source needs at least one column of: {', '.join(COLUMNS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"the nsq source's schema repeats a column: {', '.join(names)}")
    for field in schema.fields:
        expected = known.get(field.name)
        if expected is None:
            raise ValueError(
                f"the nsq source has no column {field.name!r}; its columns are "
                f"{', '.join(f'{n} {t.simpleString()}' for n, t in known.items())}"
            )
        if field.dataType != expected:
            raise ValueError(
                f"column {field.name!r} of the nsq source is {expected.simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
    return None if names == COLUMNS else names


_OUTPUT_SCHEMAS: dict[tuple[str, ...], Any] = {COLUMNS: ARROW_SCHEMA}


def with_constants(
    segment: Any, topic: str, channel: str, nsqd: str, columns: tuple[str, ...] | None = None
) -> Any:
    """A segment's batch (:data:`SEGMENT_SCHEMA`) as a batch of ``columns`` (None: all of
    :data:`ARROW_SCHEMA`'s): topic, channel and nsqd are added only if asked for."""
    if columns is None:
        columns = COLUMNS
    if columns == COLUMNS and segment.num_columns == len(ARROW_SCHEMA):
        return segment  # a segment written with every column
    schema = _OUTPUT_SCHEMAS.get(columns)
    if schema is None:
        schema = _OUTPUT_SCHEMAS[columns] = pa.schema([ARROW_SCHEMA.field(c) for c in columns])
    n = segment.num_rows
    constants = {"topic": topic, "channel": channel, "nsqd": nsqd}
    return pa.RecordBatch.from_arrays(
        [segment.column(c) if c in _SEGMENT_COLUMNS else _repeat(constants[c], n) for c in columns],
        schema=schema,
    )


_REPEATS: dict[str, Any] = {}


def _repeat(value: str, n: int) -> Any:
    """``value`` ``n`` times, as a string array: a zero-copy slice of one built per value (a
    task's segments all need the same few)."""
    column = _REPEATS.get(value)
    if column is None or len(column) < n:
        if len(_REPEATS) >= 64:
            _REPEATS.clear()
        column = _REPEATS[value] = pa.repeat(pa.scalar(value, pa.string()), max(n, 16_384))
    return column.slice(0, n)


def to_record_batch(cols: Columns, topic: str, channel: str, nsqd: str) -> Any:
    """The kept messages as one ``pyarrow.RecordBatch`` of :data:`ARROW_SCHEMA`."""
    return with_constants(to_segment(cols), topic, channel, nsqd)


def to_segment(cols: Columns) -> Any:
    """The kept messages as one ``pyarrow.RecordBatch`` of :data:`SEGMENT_SCHEMA` (what the log
    stores), built from the column buffers (no per-message objects).

    NSQ timestamps are nanoseconds since the epoch; Spark's are microseconds.
    """
    n = len(cols)
    # IDs are 16 ASCII hex characters, so valid UTF-8 as they are: their bytes with offsets 16
    # apart, viewed as strings (a validating cast costs ten times as much). Anything else (not
    # an id nsqd makes) goes through the validating cast.
    ids = pa.Array.from_buffers(
        pa.binary(), n, [None, fixed_width_offsets(MSG_ID_LENGTH, n), pa.py_buffer(bytes(cols.ids))]
    )
    ids = ids.view(pa.string()) if cols.ids.isascii() else ids.cast(pa.string())
    ns = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(cols.timestamps)])
    timestamps = pc.divide(ns, 1000).cast(pa.timestamp("us", tz="UTC"))
    attempts = pa.Array.from_buffers(pa.uint16(), n, [None, pa.py_buffer(cols.attempts)])
    if len(cols.bodies) == 1:
        bodies = cols.bodies[0]
    else:
        bodies = pa.concat_arrays(cols.bodies) if cols.bodies else pa.array([], pa.binary())
    return pa.RecordBatch.from_arrays(
        [ids, timestamps, attempts.cast(pa.int32()), bodies], schema=SEGMENT_SCHEMA
    )
