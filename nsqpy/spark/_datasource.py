"""``NSQDataSource``: the ``nsq`` format for Spark's Python Data Source API."""

from __future__ import annotations

import dataclasses

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from nsqpy.spark._options import SinkOptions, SourceOptions
from nsqpy.spark._schema import SCHEMA, columns_of
from nsqpy.spark._sink import NSQBatchWriter, NSQStreamWriter, check_sink_schema
from nsqpy.spark._source import NSQBatchReader, NSQStreamReader

__all__ = ["NSQDataSource"]


class NSQDataSource(DataSource):
    """NSQ topics as Spark sources and sinks::

        spark.dataSource.register(NSQDataSource)
        df = (spark.readStream.format("nsq")
              .option("nsqdTCPAddresses", "127.0.0.1:4150")
              .option("nsqdHTTPAddresses", "127.0.0.1:4151")
              .option("topic", "events").option("channel", "spark")
              .option("walLocation", "/data/ckpt/events/nsq-wal")
              .load())

    Rows: ``id`` string, ``timestamp`` timestamp, ``attempts`` int, ``body`` binary, ``topic``,
    ``channel`` and ``nsqd`` strings; ``.schema("id string, body binary")`` (any subset, any
    order) reads only those columns; ``topics`` or ``topicPattern`` read several topics.
    Writes publish the ``body`` column (binary or string) to the ``topic`` option, else to
    each row's ``topic`` column; rows with a ``deferMs`` are published deferred (DPUB).
    See docs/SPARK.md for every option and the guarantees.
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return NSQBatchReader(self._source_options(schema, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NSQStreamReader(self._source_options(schema, streaming=True))

    def _source_options(self, schema: StructType, *, streaming: bool) -> SourceOptions:
        """The options, and the columns of ``schema``: a user-given ``.schema(...)`` may name
        any subset of the source's columns, and only those are built and handed to Spark."""
        options = SourceOptions.parse(self.options, streaming=streaming)
        return dataclasses.replace(options, columns=columns_of(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _check_mode(overwrite)
        options = SinkOptions.parse(self.options)
        return NSQBatchWriter(options, check_sink_schema(schema, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _check_mode(overwrite)
        options = SinkOptions.parse(self.options)
        return NSQStreamWriter(options, check_sink_schema(schema, options))


def _check_mode(overwrite: bool) -> None:
    if overwrite:
        raise ValueError("an NSQ topic cannot be overwritten: use mode('append')")
