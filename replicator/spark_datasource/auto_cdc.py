"""One MongoDB collection as the source of Spark's Auto CDC (``pyspark.pipelines.create_auto_cdc_flow``):
SCD type 1 and 2 tables from an existing collection and its change stream, in three lines.

    from pyspark import pipelines as dp
    from replicator.spark import auto_cdc_source, merge_catalog, register

    register(spark)  # at the top of the file: a pipeline's query functions may not register anything
    catalog = merge_catalog(spark, "shop", "lake")  # one line, before the run, if it takes no MERGE

    @dp.temporary_view
    def users_changes():
        return auto_cdc_source(spark, "mongodb://src/?replicaSet=rs0", "shop.users", "name STRING, age INT")

    dp.create_streaming_table(f"{catalog}.shop.users")
    dp.create_auto_cdc_flow(
        target=f"{catalog}.shop.users", source="users_changes", keys=["key"], sequence_by="sequence",
        apply_as_deletes="op = 'd'", except_column_list=["op", "sequence"], stored_as_scd_type=2,
    )

Every row has its place in the stream's total order (``sequence``: no two events share one, a
transaction's included), the collection's documents come first (``snapshot=initial``), and a delete
carries its key. Auto CDC needs a target that takes MERGE (Delta Lake or Iceberg tables):
:func:`merge_catalog` checks the catalog before the run starts, so a missing setting costs one line, not
a run that fails after its streams started.
"""

from __future__ import annotations

import concurrent.futures
import re
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from replicator.errors import ConfigError, McdcError

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


#: Spark's own catalog: its tables (parquet unless a plug-in such as Delta's replaces it) take no MERGE.
SESSION_CATALOG = "spark_catalog"


def merge_catalog(spark: Any, schema: str, catalog: str) -> str:
    """The catalog an Auto CDC pipeline writes its tables ``CATALOG.schema.table`` to, checked before the
    run starts: ``catalog`` when ``spark.sql.catalog.<catalog>`` names its plug-in (Iceberg's, say), else
    ``spark_catalog`` when a plug-in replaces Spark's own (Delta's catalog works only there).

    Raises :class:`~replicator.errors.ConfigError`, in one line, where Spark would fail later (after the
    run's streams started) or with a long trace:

    * neither is configured: Spark's built-in ``spark_catalog`` takes no MERGE
      (``AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE``), and an unknown catalog is ``CATALOG_NOT_FOUND``;
    * the catalog's class cannot be loaded (its jars are not on the classpath);
    * ``schema`` does not exist in it (``SCHEMA_NOT_FOUND``).
    """
    conf = spark.conf
    name, plugin = catalog, conf.get(f"spark.sql.catalog.{catalog}", None)
    if plugin is None:
        name, plugin = SESSION_CATALOG, conf.get(f"spark.sql.catalog.{SESSION_CATALOG}", None)
    if plugin is None:
        raise ConfigError(
            f"Auto CDC merges into its tables, and no catalog here takes MERGE: set spark.sql.catalog.{catalog} "
            f"(Iceberg's org.apache.iceberg.spark.SparkCatalog) or spark.sql.catalog.{SESSION_CATALOG} (Delta's "
            "org.apache.spark.sql.delta.catalog.DeltaCatalog), with the jars, in $SPARK_CONF_DIR/spark-defaults.conf"
        )
    try:
        exists = spark.catalog.databaseExists(f"{_quoted(name)}.{_quoted(schema)}")
    except Exception as exc:  # the server's: a class not found, a catalog refusing its settings
        _settle(spark)
        raise ConfigError(
            f"the catalog {name} (spark.sql.catalog.{name}={plugin}) cannot be loaded: are its jars on the "
            f"classpath (spark.jars.packages)? {_first_line(exc)}"
        ) from None
    if not exists:
        _settle(spark)
        raise ConfigError(
            f"the schema {name}.{schema} does not exist: create it with "
            f'spark-sql -e "CREATE NAMESPACE {name}.{schema}" (with the same SPARK_CONF_DIR)'
        )
    return name


def _settle(spark: Any) -> None:
    """Wait (a little) for a Spark Connect client's pending ReleaseExecute calls: raising at once stops the
    session under them, and the server logs a trace of INVALID_HANDLE.SESSION_CLOSED below mcdc's line."""
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        return
    try:
        from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as Calls
    except ImportError:
        return
    calls = list(getattr(Calls, "_instances", ()))
    pending = [f for call in calls for f in list(getattr(call, "_release_futures", ()))]
    concurrent.futures.wait(pending, timeout=_SETTLE_S)


#: How long an error waits for those calls at most: they take milliseconds on a live server.
_SETTLE_S = 5.0


def _quoted(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def one_line_errors() -> None:
    """In ``spark-pipelines``' Python process, print an mcdc error raised by a pipeline's definitions
    (such as :func:`merge_catalog`'s) as ``mcdc: message``, not as a traceback; other errors keep theirs.
    Elsewhere (a notebook, a job of one's own) it does nothing. :func:`replicator.spark.register` calls it."""
    main = sys.modules.get("__main__")
    if Path(getattr(main, "__file__", None) or "").parts[-2:] != ("pipelines", "cli.py"):
        return
    previous = sys.excepthook
    if getattr(previous, "_mcdc_one_line", False):
        return

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, McdcError):
            print(f"mcdc: {exc}", file=sys.stderr)
        else:
            previous(kind, exc, tb)

    hook._mcdc_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook


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
