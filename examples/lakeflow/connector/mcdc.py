"""mcdc as a Lakeflow community connector: their ``LakeflowConnect``, each method handed to mcdc's
``MongoLakeflowConnect`` (``pip install 'mcdc[spark]'`` where the pipeline runs)."""

from collections.abc import Iterator

from databricks.labs.community_connector.interface import LakeflowConnect
from pyspark.sql.types import StructType

from replicator.lakeflow import MongoLakeflowConnect


class McdcLakeflowConnect(LakeflowConnect):
    """MongoDB through mcdc: tables are ``db.coll``, options are mcdc's long option names."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._mcdc = MongoLakeflowConnect(options)

    def list_tables(self) -> list[str]:
        return self._mcdc.list_tables()

    def get_table_schema(self, table_name: str, table_options: dict[str, str]) -> StructType:
        return self._mcdc.get_table_schema(table_name, table_options)

    def read_table_metadata(self, table_name: str, table_options: dict[str, str]) -> dict:
        return self._mcdc.read_table_metadata(table_name, table_options)

    def read_table(
        self, table_name: str, start_offset: dict, table_options: dict[str, str]
    ) -> tuple[Iterator[dict], dict]:
        return self._mcdc.read_table(table_name, start_offset, table_options)

    def read_table_deletes(
        self, table_name: str, start_offset: dict, table_options: dict[str, str]
    ) -> tuple[Iterator[dict], dict]:
        return self._mcdc.read_table_deletes(table_name, start_offset, table_options)
