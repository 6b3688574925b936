"""A Lakeflow pipeline ingesting two MongoDB collections through mcdc (a Databricks pipeline's source
file, as pipeline-spec/example_ingest.py of lakeflow-community-connectors). The Unity Catalog
connection ``mongodb_mcdc`` holds mcdc's options: ``source`` (a secret), and ``include`` / ``exclude``
/ ``full-document`` / ``max-batch-size`` / ``partition-docs`` as needed."""

from databricks.labs.community_connector.pipeline import ingest
from databricks.labs.community_connector.sources.mcdc import McdcDataSource

spark.conf.set("spark.databricks.unityCatalog.connectionDfOptionInjection.enabled", "true")  # noqa: F821

pipeline_spec = {
    "connection_name": "mongodb_mcdc",
    "objects": [
        # each collection's documents by _id, deletes applied, in mcdc's sequence order (SCD type 1)
        {"table": {"source_table": "shop.orders", "destination_table": "orders"}},
        {
            "table": {
                "source_table": "shop.customers",
                "destination_table": "customers_history",
                "table_configuration": {"scd_type": "SCD_TYPE_2", "max-batch-size": "5000"},
            }
        },
    ],
}

spark.dataSource.register(McdcDataSource)  # noqa: F821  (format "lakeflow_connect", which ingest reads)
ingest(spark, pipeline_spec)  # noqa: F821
