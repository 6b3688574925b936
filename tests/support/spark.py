"""The test session's SparkSession: one ``local[2,2]`` session (2 cores, a failed task tried twice) shared
by every Spark test (its start costs 5-10 s and its Python workers about a gigabyte), with the UI off and
the driver on 127.0.0.1.

The executors' Python is this interpreter, so they import the mcdc under test.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
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
