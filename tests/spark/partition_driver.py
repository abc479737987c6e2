"""A streaming driver for the partition tests (tests/faults/test_spark_partitions.py), run in
its own process inside a network namespace, so that its JVM, its Python planner and the
executors' Python workers (``local[...]``: all of them children of this process) are all in
that namespace.

    python -m tests.spark.partition_driver CONFIG.json

Starts one nsq → parquet query per entry of ``queries`` (``{name: {"source", "output",
"checkpoint"}}``) in one Spark session, prints ``STARTED``, and runs until the file
``stop_file`` appears (exiting 1 if a query fails meanwhile); then processes what is
available, stops, prints ``COUNTS {name: {"rows", "distinct", "bodies"}}`` of each output read
back through Spark, and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def start_query(spark: Any, cfg: dict[str, Any]) -> Any:
    reader = spark.readStream.format("nsq")
    for key, value in cfg["source"].items():
        reader = reader.option(key, str(value))
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", cfg["output"])
        .option("checkpointLocation", cfg["checkpoint"])
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def counts(spark: Any, output: str) -> dict[str, int]:
    """Rows, distinct (nsqd, id) and distinct bodies of ``output`` (through _spark_metadata),
    in one Spark job."""
    from pyspark.sql import functions as F

    out = spark.read.parquet(output)
    row = out.agg(
        F.count("*").alias("rows"),
        F.count_distinct("id", "nsqd").alias("distinct"),
        F.count_distinct("body").alias("bodies"),
    ).first()
    return {key: int(row[key]) for key in ("rows", "distinct", "bodies")}


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    from tests.spark.conftest import SPARK_ENV, spark_builder

    os.environ.update(SPARK_ENV)
    from nsqpy.spark import NSQDataSource

    spark = spark_builder(cfg.get("master", "local[2,4]")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    queries = {name: start_query(spark, q) for name, q in cfg["queries"].items()}
    print("STARTED", flush=True)
    while not os.path.exists(cfg["stop_file"]):
        for name, query in queries.items():
            if query.exception() is not None:
                raise SystemExit(f"query {name} failed: {query.exception()}")
        time.sleep(0.1)
    for query in queries.values():
        query.processAllAvailable()
        query.stop()
    result = {name: counts(spark, q["output"]) for name, q in cfg["queries"].items()}
    print("COUNTS " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
