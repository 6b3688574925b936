"""SCD type 1 (``CATALOG.DATABASE.COLLECTION``: each document as it is now) and type 2
(``..._history``: every version, with ``__START_AT`` and ``__END_AT``) of one MongoDB collection, from its
existing documents on: Spark's Auto CDC over the ``mcdc`` data source.

The source comes from the environment, with ``mcdc dev-server``'s defaults: ``MCDC_SOURCE`` (the URI,
as mcdc's own commands read it), ``MCDC_DATABASE`` and ``MCDC_COLLECTION``. The fields come from the
pipeline's ``configuration`` (../spark-pipeline.yml); ``spark`` is the session the pipeline runner gives
this file. The catalog is checked before the run starts (:func:`replicator.spark.merge_catalog`)."""

import os

from pyspark import pipelines as dp

from replicator.spark import auto_cdc_source, merge_catalog, register

#: ``mcdc dev-server``'s URI on its default port
DEV_SERVER = "mongodb://127.0.0.1:27017/?replicaSet=secantus"

register(spark)  # noqa: F821 - defined by the pipeline runner; the query functions below may not register
SOURCE = os.environ.get("MCDC_SOURCE") or DEV_SERVER
DATABASE = os.environ.get("MCDC_DATABASE") or "shop"
COLLECTION = os.environ.get("MCDC_COLLECTION") or "users"
NAMESPACE = f"{DATABASE}.{COLLECTION}"
FIELDS = spark.conf.get("mcdc.fields")  # noqa: F821
FULL_DOCUMENT = spark.conf.get("mcdc.full-document", "updateLookup")  # noqa: F821
# one line and no run when the catalog cannot take Auto CDC's MERGE, or lacks the schema
CATALOG = merge_catalog(spark, DATABASE, "lake")  # noqa: F821


@dp.temporary_view(name=f"{COLLECTION}_changes")
def changes():  # type: ignore[no-untyped-def]
    return auto_cdc_source(spark, SOURCE, NAMESPACE, FIELDS, **{"full-document": FULL_DOCUMENT})  # noqa: F821


for scd, table in ((1, COLLECTION), (2, f"{COLLECTION}_history")):
    target = f"{CATALOG}.{DATABASE}.{table}"
    dp.create_streaming_table(target)
    dp.create_auto_cdc_flow(
        target=target,
        source=f"{COLLECTION}_changes",
        keys=["key"],
        sequence_by="sequence",
        apply_as_deletes="op = 'd'",
        except_column_list=["op", "sequence"],
        stored_as_scd_type=scd,
    )
