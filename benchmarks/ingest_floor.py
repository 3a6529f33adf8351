"""The hand-written floor of `benchmarks/ingest.py`: the plainest PySpark job that does the core
of ingest. Read the events, drop exact duplicates, and write each user's time-sorted events to
Parquet.

    python benchmarks/ingest_floor.py EVENTS_DIR OUT_DIR [--shuffle-partitions 8] [--driver-memory 4g]

Run as a script it is a whole process, as a user would write it: its own plain session (no Delta),
local[*], the same shuffle partitions and driver memory as Lumos's defaults.
"""

from __future__ import annotations

import argparse


def floor_job(spark, events_dir: str, out: str) -> None:
    """Read, drop duplicates, write each user's events sorted by time: what any ingest must do."""
    events = spark.read.parquet(events_dir).dropDuplicates()
    events.repartition("user_id").sortWithinPartitions("user_id", "ts").write.mode("overwrite").parquet(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("events_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default="4g")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args.master).appName("ingest-floor")
             .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
             .config("spark.driver.memory", args.driver_memory).config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    floor_job(spark, args.events_dir, args.out_dir)
    spark.stop()


if __name__ == "__main__":
    main()
