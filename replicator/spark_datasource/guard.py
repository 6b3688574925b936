"""The class :func:`~replicator.spark_datasource.register` gives Spark: the data source behind a door that
opens without mcdc.

Spark sends a data source's class to its Python workers pickled, and a class of an importable module goes
by name: a worker whose Python lacks mcdc fails in Spark's own unpickling, with ``ModuleNotFoundError: No
module named 'replicator'`` in Spark's traceback, before any code of ours runs. register() has cloudpickle
send this module by value instead; it imports nothing of mcdc's at its top, and imports the data source
only when Spark makes an instance (at ``load()``, ``save()``, a stream's start). A worker without mcdc then
says so in mcdc's one line, naming its own Python and ``PYSPARK_PYTHON``. This reaches what register()'s
check of the workers' Python (workers.py) cannot: a Spark Connect server's workers (``spark-pipelines``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql.datasource import DataSource

#: What to do about a worker Python without mcdc (``{here}``: where mcdc is, when known).
FIX = (
    "set PYSPARK_PYTHON to the Python mcdc is installed in{here} before the session starts (spark-submit: "
    "--conf spark.pyspark.python=...), or install mcdc in that Python"
)


def cannot_import(python: str, why: str, here: str = "") -> str:
    """The one line for Spark's Python workers running ``python``, which fails to import mcdc with ``why``."""
    where = f" ({here} here)" if here else ""
    return f"Spark's Python workers run {python}, which cannot import mcdc ({why}): {FIX.format(here=where)}"


class mcdc(Exception):  # Spark shows a worker's error as "<class>: <message>"
    """A worker's Python cannot import mcdc (``mcdc: ...`` as Spark shows it, see options.DataSourceError)."""

    __module__ = "builtins"


class GuardedSource(DataSource):
    """``format("mcdc")``: :class:`~replicator.spark_datasource.datasource.MongoChanges`, imported when Spark
    makes the data source in a worker; every call goes to it."""

    @classmethod
    def name(cls) -> str:
        return "mcdc"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        try:
            from replicator.spark_datasource.datasource import MongoChanges
        except ImportError as exc:
            if os.environ.get("SPARK_PYTHON_RUNTIME") == "PYTHON_WORKER":  # this worker is about to end
                os.environ["SPARK_HIDE_TRACEBACK"] = "1"
            raise mcdc(cannot_import(sys.executable, f"{type(exc).__name__}: {exc}")) from None
        self.source = MongoChanges(options)

    def schema(self) -> Any:
        return self.source.schema()

    def reader(self, schema: Any) -> Any:
        return self.source.reader(schema)

    def streamReader(self, schema: Any) -> Any:
        return self.source.streamReader(schema)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        return self.source.writer(schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return self.source.streamWriter(schema, overwrite)
