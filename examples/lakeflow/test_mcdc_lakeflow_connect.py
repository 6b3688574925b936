"""Databricks Labs' conformance suite (LakeflowConnectTests) against mcdc's connector, in live mode.

scripts/lakeflow_conformance.py (in mcdc's repository) copies this file into a checkout of
lakeflow-community-connectors as tests/unit/sources/mcdc/, starts a test server, loads data and runs
pytest there with CONNECTOR_TEST_MODE=live and CONNECTOR_TEST_CONFIG_JSON={"source": ..., "include": ...}.

The suite reads each table from ``{}``: mcdc's first call plans the snapshot and returns its offset with
no record (a first page read again after a crash must be the same page). So the two tests of this class
below read the next page of each flow too, through the suite's own record checks (schema parsing,
non-nullable fields, primary keys of upserts and of deletes). A third streams both flows of every table
through their Spark data source (``LakeflowSource``, format ``lakeflow_connect``) with availableNow.
"""

import json
import os
import sys
import tempfile

from databricks.labs.community_connector.sources.mcdc import McdcDataSource, McdcLakeflowConnect
from tests.unit.sources.test_suite import LakeflowConnectTests


class TestMcdcConnector(LakeflowConnectTests):
    connector_class = McdcLakeflowConnect
    sample_records = 200

    def _first_records(self, read):
        """``read`` (a flow's method) paged from ``{}`` as the framework pages it, up to its first page
        with records: in the shape of a read method, for the suite's ``_validate_read``."""

        def first_page_with_records(table, _start, options):
            records, offset = read(table, {}, options)
            for _ in range(self.read_termination_max_iterations):
                records, end = read(table, offset, options)
                records = list(records)
                if records or end == offset:
                    break
                offset = end
            assert records, f"[{table}] no record in any page: load data (with deletes) first"
            return iter(records), end

        return first_page_with_records

    def test_read_table_records(self):
        read = self._first_records(self.connector.read_table)
        errors = [err for table in self._tables() if (err := self._validate_read(table, read, "read_table"))]
        assert not errors, "\n\n".join(errors)

    def test_read_table_deletes_records(self):
        read = self._first_records(self.connector.read_table_deletes)
        errors = [
            err
            for table in self._tables()
            if (err := self._validate_read(table, read, "read_table_deletes", is_read_table=False))
        ]
        assert not errors, "\n\n".join(errors)

    def test_both_flows_stream_through_their_spark_data_source(self):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        try:
            spark.dataSource.register(McdcDataSource)
            options = {k: str(v) for k, v in self.config.items()}
            tables = self._tables()
            meta = (
                spark.read.format("lakeflow_connect")
                .options(**options)
                .options(tableName="_community_table_metadata", tableNameList=json.dumps(tables))
                .load()
            )
            assert {row["tableName"]: row["cursor_field"] for row in meta.collect()} == dict.fromkeys(
                tables, "sequence"
            )
            with tempfile.TemporaryDirectory() as checkpoints:
                for n, (table, flow) in enumerate((t, f) for t in tables for f in ("upserts", "deletes")):
                    reader = spark.readStream.format("lakeflow_connect").options(**options).option("tableName", table)
                    if flow == "deletes":
                        reader = reader.option("isDeleteFlow", "true")
                    query = (
                        reader.load().writeStream.format("memory").queryName(f"flow{n}")
                        .option("checkpointLocation", f"{checkpoints}/{n}").trigger(availableNow=True).start()
                    )  # fmt: skip
                    query.awaitTermination()
                    rows = spark.sql(f"SELECT _id, op, sequence FROM flow{n}").collect()
                    ops = {row["op"] for row in rows}
                    assert rows and all(row["sequence"] is not None for row in rows), (table, flow)
                    expected = ops == {"d"} if flow == "deletes" else ("r" in ops and "d" not in ops)
                    assert expected, (table, flow, ops)
        finally:
            spark.stop()
