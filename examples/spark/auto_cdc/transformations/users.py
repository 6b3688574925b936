"""SCD type 1 (``users``: each document as it is now) and type 2 (``users_history``: every version, with
``__START_AT`` and ``__END_AT``) of one MongoDB collection, from its existing documents on: Spark's Auto
CDC over the ``mcdc`` data source. The pipeline's ``configuration`` names the source (see
../spark-pipeline.yml); ``spark`` is the session the pipeline runner gives this file."""

from pyspark import pipelines as dp

from replicator.spark import auto_cdc_source, register

register(spark)  # noqa: F821 - defined by the pipeline runner; the query functions below may not register
conf = spark.conf  # noqa: F821
SOURCE = conf.get("mcdc.source")
COLLECTION = conf.get("mcdc.collection")
FIELDS = conf.get("mcdc.fields")
FULL_DOCUMENT = conf.get("mcdc.full-document", "updateLookup")


@dp.temporary_view
def users_changes():  # type: ignore[no-untyped-def]
    return auto_cdc_source(spark, SOURCE, COLLECTION, FIELDS, **{"full-document": FULL_DOCUMENT})  # noqa: F821


for scd, table in ((1, "users"), (2, "users_history")):
    dp.create_streaming_table(table)
    dp.create_auto_cdc_flow(
        target=table,
        source="users_changes",
        keys=["key"],
        sequence_by="sequence",
        apply_as_deletes="op = 'd'",
        except_column_list=["op", "sequence"],
        stored_as_scd_type=scd,
    )
