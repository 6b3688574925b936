"""The test session's SparkSession: one ``local[2,2]`` session (2 cores, a failed task tried twice) shared
by every Spark test (its start costs 5-10 s and its Python workers about a gigabyte), with the UI off and
the driver on 127.0.0.1.

The executors' Python is this interpreter, so they import the mcdc under test.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# QUICK_JVM: JVM options for short runs, mcdc's own default for a local master's driver (measured here too:
# the cluster test 55 -> 43 s with them on its master, worker and executors)
from replicator.engines.spark.session import QUICK_JVM

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    # measured here over a sync and six catch-ups in one session: no slower than the default JVM, once started
    "spark.driver.extraJavaOptions": QUICK_JVM,
}


def start_session(master: str = "local[2,2]") -> Any:
    """A new (or the already active) SparkSession on ``master``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("mcdc-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def quick_jvm_conf() -> list[str]:
    """``--spark-conf`` options giving a driver and its executors :data:`QUICK_JVM`: for the tests that run
    ``mcdc ... --engine spark`` as a process, each of which starts a JVM."""
    return [
        "--spark-conf", f"spark.driver.extraJavaOptions={QUICK_JVM}",
        "--spark-conf", f"spark.executor.extraJavaOptions={QUICK_JVM}",
    ]  # fmt: skip
