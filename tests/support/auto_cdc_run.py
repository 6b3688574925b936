"""Run a Spark Declarative Pipeline (a spec file, as ``spark-pipelines run`` takes it) several times in one
process, over a local Spark Connect server whose catalog ``lake`` takes MERGE (tests/support/autocdc's
RowLevelCatalog: Auto CDC needs one, and Delta's and Iceberg's jars cannot be had on these machines).

    python -m tests.support.auto_cdc_run JAR CATALOG_DIR SPEC OUT RUNS

Each run does what ``spark-pipelines run --spec SPEC`` does (pyspark.pipelines.cli: the graph, the spec's
files registered, the run and its events), then writes every table of ``lake.$MCDC_DATABASE`` (the
example's schema, ``shop`` by default) to
``OUT/run-<k>.json`` and, before the next run, waits for the file ``OUT/go-<k+1>`` (the test changes the
source in between).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

CATALOG = "lake"


def _plain(value: Any) -> Any:
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return value


def main(jar: str, catalog_dir: str, spec_path: str, out: str, runs: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.pipelines.cli import load_pipeline_spec, register_definitions
    from pyspark.pipelines.spark_connect_graph_element_registry import SparkConnectGraphElementRegistry
    from pyspark.pipelines.spark_connect_pipeline import create_dataflow_graph, handle_pipeline_events, start_run
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.remote("local[2]")
        .config("spark.jars", jar)
        .config(f"spark.sql.catalog.{CATALOG}", "mcdc.testcatalog.RowLevelCatalog")
        .config(f"spark.sql.catalog.{CATALOG}.path", catalog_dir)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spec_file = Path(spec_path)
    target = Path(out)
    for k in range(1, int(runs) + 1):
        if k > 1:
            while not (target / f"go-{k}").exists():
                time.sleep(0.1)
        spec = load_pipeline_spec(spec_file)
        for key, value in spec.configuration.items():  # as the CLI gives them to its session's builder
            spark.conf.set(key, value)
        conf = {**spec.configuration, "spark.sql.pipelines.maxFlowRetryAttempts": "0"}
        graph = create_dataflow_graph(
            spark, default_catalog=spec.catalog, default_database=spec.database, sql_conf=conf
        )
        register_definitions(spec_file, SparkConnectGraphElementRegistry(spark, graph), spec, spark, graph)
        events = start_run(
            spark, graph, full_refresh=[], full_refresh_all=False, refresh=[], dry=False, storage=spec.storage
        )
        handle_pipeline_events(events)  # raises on a failed run, and (without mcdc's mend) on its last response
        tables = {}
        schema = os.environ.get("MCDC_DATABASE") or "shop"
        for row in spark.sql(f"SHOW TABLES IN {CATALOG}.{schema}").collect():
            name = row["tableName"]
            tables[name] = [_plain(r) for r in spark.table(f"{CATALOG}.{schema}.{name}").collect()]
        tmp = target / f".run-{k}.json"
        tmp.write_text(json.dumps(tables))
        tmp.replace(target / f"run-{k}.json")
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
