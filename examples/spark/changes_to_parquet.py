"""Land a MongoDB deployment's change events in Parquet with Spark, and keep a latest-state table.

    python examples/spark/changes_to_parquet.py --source "mongodb://src/?replicaSet=rs0" --out /data/shop \
        --include 'shop\\..*' --available-now

Writes, under --out:

* ``changes/``: every change event as a row of the ``mcdc`` data source (op, db, coll, key, document,
  bson, update, before, cluster_time, sequence, wall_time, txn, resume_token, shard, change), appended per
  micro-batch (with ``--snapshot``, the collections' documents first, as rows of op ``r``);
* ``latest/v<batch>/``: the newest version of every document (with ``--snapshot``; else of every document
  changed since the stream started), one row per (db, coll, key), deletes applied; ``latest/CURRENT`` names
  the version to read;
* ``checkpoint/``: Spark's checkpoint (the stream's per-shard resume tokens): run the job again and it goes
  on where it stopped, without reading an event twice.

``--available-now`` reads what the source holds now and exits (for cron); without it the job runs until
killed. Needs ``pip install 'mcdc[spark]'`` and Java 17+.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DOCUMENT_OPS = ("r", "c", "u", "replace", "d")
KEY = ("db", "coll", "key")


def latest_of(batch: Any) -> Any:
    """The last event of each (db, coll, key) in one micro-batch, by ``sequence``: the stream's total order
    (events of one transaction share a cluster time, not a sequence)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*KEY).orderBy(F.col("sequence").desc())
    return (
        batch.filter(F.col("op").isin(*DOCUMENT_OPS))
        .withColumn("_n", F.row_number().over(order))
        .filter("_n = 1")
        .select(*KEY, "op", "document", "bson", "cluster_time", "sequence", "wall_time")
    )


def apply_batch(spark: Any, batch: Any, batch_id: int, out: Path) -> None:
    """Append a micro-batch to ``changes`` and write the next version of ``latest``."""
    batch = batch.persist()
    try:
        batch.write.mode("append").parquet(str(out / "changes"))
        current = out / "latest" / "CURRENT"
        if not current.exists() and batch.isEmpty():
            return
        newest = latest_of(batch)
        if current.exists():
            previous = spark.read.parquet(str(out / "latest" / current.read_text().strip()))
            newest = previous.join(newest.select(*KEY), list(KEY), "left_anti").unionByName(newest)
        version = f"v{batch_id:09d}"
        newest.filter("op != 'd'").write.mode("overwrite").parquet(str(out / "latest" / version))
        tmp = current.with_suffix(".tmp")
        tmp.write_text(version)
        tmp.replace(current)  # readers switch to the new version at once
    finally:
        batch.unpersist()


def run(
    spark: Any, source: str, out: Path, *, available_now: bool = True, options: dict[str, str] | None = None
) -> Any:
    """Start the job on ``spark``; with ``available_now``, wait for it to finish. Returns the query."""
    from replicator.spark import register

    register(spark)
    reader = spark.readStream.format("mcdc").option("source", source)
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.foreachBatch(lambda batch, batch_id: apply_batch(spark, batch, batch_id, out))
        .option("checkpointLocation", str(out / "checkpoint"))
    )
    query = writer.trigger(availableNow=True).start() if available_now else writer.start()
    if available_now:
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
    return query


def read_latest(spark: Any, out: Path) -> Any:
    """The latest-state table as a DataFrame."""
    return spark.read.parquet(str(out / "latest" / (out / "latest" / "CURRENT").read_text().strip()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="source MongoDB URI (replica set or mongos)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--include", help="only namespaces matching this regex (comma-separated list)")
    parser.add_argument("--available-now", action="store_true", help="read what is there now, then exit")
    parser.add_argument("--snapshot", action="store_true", help="the collections' documents first (a new --out)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(args.master).appName("mcdc-changes-to-parquet").getOrCreate()
    options = {"include": args.include} if args.include else {}
    if args.snapshot:
        options["snapshot"] = "initial"
    query = run(spark, args.source, args.out, available_now=args.available_now, options=options)
    if not args.available_now:
        query.awaitTermination()


if __name__ == "__main__":
    main()
