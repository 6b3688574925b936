"""MongoDB as a Databricks Lakeflow Connect source: :class:`MongoLakeflowConnect` has the interface of
Databricks Labs' ``LakeflowConnect`` (lakeflow-community-connectors), without importing it::

    from replicator.lakeflow import MongoLakeflowConnect
    source = MongoLakeflowConnect({"source": "mongodb://...", "include": "shop\\\\..*"})
    source.list_tables()                                   # ["shop.orders", ...]
    records, offset = source.read_table("shop.orders", None, {})

examples/lakeflow/ shows the few lines that make it a community connector of that repository.
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError:
    raise ImportError("the mcdc Lakeflow Connect source needs PySpark: pip install 'mcdc[spark]'") from None

from replicator.lakeflow.connect import LakeflowError, MongoLakeflowConnect
from replicator.lakeflow.records import SCHEMA

__all__ = ["SCHEMA", "LakeflowError", "MongoLakeflowConnect"]
