"""Databricks Labs' conformance suite (LakeflowConnectTests) against mcdc's connector, in live mode.

scripts/lakeflow_conformance.py (in mcdc's repository) copies this file into a checkout of
lakeflow-community-connectors as tests/unit/sources/mcdc/, starts a test server, loads data and runs
pytest there with CONNECTOR_TEST_MODE=live and CONNECTOR_TEST_CONFIG_JSON={"source": ..., "include": ...}.

The suite reads each table from ``{}``: mcdc's first call plans the snapshot and returns its offset with
no record (a first page read again after a crash must be the same page). So the two tests of this class
below read the next page of each flow too, through the suite's own record checks (schema parsing,
non-nullable fields, primary keys of upserts and of deletes).
"""

from databricks.labs.community_connector.sources.mcdc import McdcLakeflowConnect
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
