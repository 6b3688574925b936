"""MongoDB as a Spark data source named ``mcdc`` (Spark's Python Data Source API, PySpark 4.2+).

    from replicator.spark import register    # or replicator.spark_datasource: the same
    register(spark)
    spark.read.format("mcdc").option("source", URI).load()           # a snapshot, as rows of op "r"
    spark.readStream.format("mcdc").option("source", URI).load()     # the change streams
    df.write.format("mcdc").option("target", URI).mode("append").save()

The rows' schema is :data:`.rows.SCHEMA`; :func:`.rows.event_from_row` turns a row back into a ChangeEvent.
"""

from __future__ import annotations

from typing import Any

try:
    import pyspark  # noqa: F401
except ImportError:
    raise ImportError("the mcdc Spark data source needs PySpark: pip install 'mcdc[spark]'") from None

from replicator.events.rows import SCHEMA, event_from_row
from replicator.spark_datasource.datasource import MongoChanges

__all__ = ["SCHEMA", "MongoChanges", "event_from_row", "register"]


def register(spark: Any) -> None:
    """Make ``format("mcdc")`` available in ``spark``'s session (on Spark Connect, a pipeline's run then
    ends cleanly too: :func:`replicator.spark_datasource.auto_cdc.tolerate_observed_metrics`; and under
    ``spark-pipelines``, mcdc's errors are one line: :func:`~replicator.spark_datasource.auto_cdc.one_line_errors`).

    Raises a one-line ConfigError when Spark's Python workers run a Python without mcdc (see
    :mod:`.workers`): ``PYSPARK_PYTHON`` names the one to use. Where that cannot be checked (Spark
    Connect), such a worker says it in one line when it makes the data source (:mod:`.guard`)."""
    from pyspark import cloudpickle

    from replicator.spark_datasource import guard, workers
    from replicator.spark_datasource.auto_cdc import one_line_errors, tolerate_observed_metrics

    one_line_errors()
    workers.check(spark)
    cloudpickle.register_pickle_by_value(guard)  # type: ignore[no-untyped-call]  # sent whole, see guard.py
    spark.dataSource.register(guard.GuardedSource)
    tolerate_observed_metrics(spark)
