"""NSQ topics as Spark sources and sinks (Spark's Python Data Source API, PySpark >= 4.2).

::

    from nsqpy.spark import NSQDataSource

    spark.dataSource.register(NSQDataSource)
    events = (spark.readStream.format("nsq")
              .option("lookupdHTTPAddresses", "127.0.0.1:4161")
              .option("topic", "events").option("channel", "spark")
              .option("walLocation", "/shared/ckpt/events/nsq-wal")
              .option("maxMessagesPerTrigger", 100_000)
              .load())
    alerts.writeStream.format("nsq").option("nsqdTCPAddresses", "127.0.0.1:4150") \\
        .option("topic", "alerts").option("checkpointLocation", ...).start()

Guarantees (docs/SPARK.md): read tasks run on the executors and write what they take to a
write-ahead log before any FIN; replays come from the log; redeliveries of logged messages are
dropped. Into Spark's file sink (and other idempotent sinks) nothing is lost or duplicated
across driver crashes; into any other sink, at least once. The NSQ sink is at least once.

Only this package imports pyspark and pyarrow; the rest of nsqpy never imports it.
"""

try:
    import pyarrow  # type: ignore[import-untyped]  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"nsqpy.spark needs pyspark (>= 4.2) and pyarrow: pip install 'nsqpy[spark]' ({err})"
    ) from err

from nsqpy.spark._datasource import NSQDataSource

__all__ = ["NSQDataSource"]
