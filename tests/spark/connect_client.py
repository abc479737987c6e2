"""A Spark Connect client, run as its own process by tests/spark/test_connect.py (a Connect
session changes process-wide state: ``SPARK_CONNECT_MODE_ENABLED``, so it stays out of the
test process and its classic session).

    python -m tests.spark.connect_client CONFIG.json

Registers NSQDataSource on the remote session, runs the source query (nsq → parquet,
Trigger.AvailableNow) and the sink query (a DataFrame → nsq), and prints one JSON line with
what it counted.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    from pyspark.sql import SparkSession

    from nsqpy.spark import NSQDataSource

    spark = SparkSession.builder.remote(cfg["remote"]).getOrCreate()
    spark.dataSource.register(NSQDataSource)
    query = (
        spark.readStream.format("nsq")
        .option("nsqdTCPAddresses", cfg["tcp"])
        .option("nsqdHTTPAddresses", cfg["http"])
        .option("topic", cfg["topic"])
        .option("channel", "spark")
        .option("walLocation", cfg["wal"])
        .load()
        .writeStream.format("parquet")
        .option("path", cfg["output"])
        .option("checkpointLocation", cfg["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    out = spark.read.parquet(cfg["output"])
    rows = out.count()
    distinct = out.select("id", "nsqd").distinct().count()
    (
        spark.range(cfg["sink_rows"])
        .selectExpr("concat('connect-', cast(id as string)) AS body")
        .write.format("nsq")
        .mode("append")
        .option("nsqdTCPAddresses", cfg["tcp"])
        .option("topic", cfg["sink_topic"])
        .save()
    )
    print(json.dumps({"rows": rows, "distinct": distinct}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
