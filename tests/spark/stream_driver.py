"""A streaming driver for the kill -9 test, run as its own process group.

    python -m tests.spark.stream_driver CONFIG.json

Starts nsq → parquet with the checkpoint and WAL of the config, prints ``STARTED``, and runs
until the file ``stop_file`` appears; then processes what is available, stops and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    from tests.spark.conftest import SPARK_ENV, spark_builder

    os.environ.update(SPARK_ENV)
    from nsqpy.spark import NSQDataSource

    spark = spark_builder(cfg.get("master", "local[2]")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    reader = spark.readStream.format("nsq")
    for key, value in cfg["source"].items():
        reader = reader.option(key, str(value))
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", cfg["output"])
        .option("checkpointLocation", cfg["checkpoint"])
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    print("STARTED", flush=True)
    while not os.path.exists(cfg["stop_file"]):
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")
        time.sleep(0.1)
    query.processAllAvailable()
    query.stop()
    print("STOPPED", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
