"""The name users import the ``mcdc`` Spark data source by (``from replicator.spark import register``); the
package itself is :mod:`replicator.spark_datasource`. :func:`auto_cdc_source` gives one collection as the
source of Spark's Auto CDC (SCD type 1 and 2 tables), :func:`merge_catalog` checks its target catalog."""

from __future__ import annotations

from replicator.events import rows
from replicator.spark_datasource import SCHEMA, MongoChanges, event_from_row, register
from replicator.spark_datasource.auto_cdc import auto_cdc_source, merge_catalog, tolerate_observed_metrics

__all__ = [
    "SCHEMA",
    "MongoChanges",
    "auto_cdc_source",
    "event_from_row",
    "merge_catalog",
    "register",
    "rows",
    "tolerate_observed_metrics",
]
