"""The name users import the ``mcdc`` Spark data source by (``from replicator.spark import register``); the
package itself is :mod:`replicator.spark_datasource`."""

from __future__ import annotations

from ..spark_datasource import SCHEMA, MongoChanges, event_from_row, register
from ..spark_datasource import rows as rows

__all__ = ["SCHEMA", "MongoChanges", "event_from_row", "register", "rows"]
