"""One MongoDB collection as the source of Spark's Auto CDC (``pyspark.pipelines.create_auto_cdc_flow``):
SCD type 1 and 2 tables from an existing collection and its change stream, in three lines.

    from pyspark import pipelines as dp
    from replicator.spark import auto_cdc_source, register

    register(spark)  # at the top of the file: a pipeline's query functions may not register anything

    @dp.temporary_view
    def users_changes():
        return auto_cdc_source(spark, "mongodb://src/?replicaSet=rs0", "shop.users", "name STRING, age INT")

    dp.create_streaming_table("users")
    dp.create_auto_cdc_flow(
        target="users", source="users_changes", keys=["key"], sequence_by="sequence",
        apply_as_deletes="op = 'd'", except_column_list=["op", "sequence"], stored_as_scd_type=2,
    )

Every row has its place in the stream's total order (``sequence``: no two events share one, a
transaction's included), the collection's documents come first (``snapshot=initial``), and a delete
carries its key. Auto CDC needs a target that takes MERGE (Delta Lake or Iceberg tables).
"""

from __future__ import annotations

import re
from typing import Any

#: The rows an Auto CDC flow takes: document events (DDL, which changes no document, is left out).
DOCUMENT_OPS = ("r", "c", "u", "replace", "d")


def auto_cdc_source(
    spark: Any, source: str, namespace: str, schema: Any, *, snapshot: str = "initial", **options: str
) -> Any:
    """The streaming DataFrame of collection ``namespace`` (``db.coll``) on MongoDB ``source``, with columns

    * ``key``: the document's ``_id`` as canonical Extended JSON (the same value for every row of a
      document, a delete's included, and for every ``_id`` type): Auto CDC's ``keys``;
    * ``sequence``: the row's place in the stream's total order (struct<t, i, shard, n>): ``sequence_by``;
    * ``op``: ``r`` (a document as the snapshot read it), ``c``, ``u``, ``replace`` or ``d``: deletes are
      ``op = 'd'``;
    * the fields of ``schema`` (a DDL string such as ``"name STRING, age INT"``, or a StructType), read
      from the document as relaxed Extended JSON: numbers, strings, booleans, arrays and sub-documents
      come typed; dates, ObjectIds and other BSON types stay Extended JSON objects (declare them as
      ``STRUCT<`$date`: STRING>`` and the like). Null on a delete.

    ``snapshot``: ``initial`` (the collection's documents first, then its changes) or ``never`` (changes
    from now). Other ``options`` are the ``mcdc`` data source's (``full-document``, ``max-batch-size``, ...).
    The data source must be registered first (:func:`replicator.spark.register`).
    """
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("mcdc")
        .option("source", source)
        .option("include", re.escape(namespace))
        .option("snapshot", snapshot)
        .option("extended-json", "relaxed")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    document = F.from_json(F.col("document"), schema)
    return (
        reader.load()
        .where(F.col("op").isin(*DOCUMENT_OPS))
        .select(
            F.get_json_object(F.col("key"), "$._id").alias("key"),
            F.col("sequence"),
            F.col("op"),
            document.alias("_document"),
        )
        .select("key", "sequence", "op", "_document.*")
    )


def tolerate_observed_metrics(spark: Any) -> None:
    """Let ``spark-pipelines run`` end cleanly after it read a Python data source.

    PySpark 4.3's Spark Connect client raises ``[UNKNOWN_RESPONSE] Unknown response: Plan
    observed(__python_accumulator__=...)`` at the end of a pipeline run: the Python data source's planning
    workers hand back two (empty) profiler accumulators, which the server reports as observed metrics, and
    the iterator the pipeline run reads takes only dicts (SPARK-59135). The run itself completed. This
    makes that iterator pass over such responses, as the client's other paths do; it changes nothing on a
    classic (non-Connect) session, nor on a client without that iterator. :func:`replicator.spark.register`
    calls it."""
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        return
    try:
        from pyspark.sql.connect.client.core import SparkConnectClient
    except ImportError:  # no Spark Connect client installed: nothing to mend
        return
    if getattr(SparkConnectClient, "_mcdc_tolerates_metrics", False):
        return
    needed = ("_execute_plan_request_with_metadata", "_set_command_in_plan", "_execute_and_fetch_as_iterator")
    if not all(hasattr(SparkConnectClient, name) for name in needed):
        return

    def execute_command_as_iterator(self: Any, command: Any, observations: Any = None) -> Any:
        request = self._execute_plan_request_with_metadata()
        self._set_command_in_plan(request.plan, command)
        for response in self._execute_and_fetch_as_iterator(request, observations or {}):
            if isinstance(response, dict):  # a pipeline's events; observed metrics are left out
                yield response

    SparkConnectClient.execute_command_as_iterator = execute_command_as_iterator  # type: ignore[method-assign]
    SparkConnectClient._mcdc_tolerates_metrics = True  # type: ignore[attr-defined]
