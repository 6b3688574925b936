"""The ``mcdc`` Spark data source: MongoDB read as change rows (batch: a snapshot; streaming: the change
streams) and change rows written to MongoDB. Options are mcdc's own option names (see README)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from .rows import SCHEMA
from .snapshot import SnapshotReader
from .stream import ChangeStreamReader
from .writer import TargetStreamWriter, TargetWriter, check_mode


class MongoChanges(DataSource):
    """``spark.read/readStream/write/writeStream.format("mcdc")``."""

    @classmethod
    def name(cls) -> str:
        return "mcdc"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: object) -> SnapshotReader:
        return SnapshotReader(self.options)

    def streamReader(self, schema: object) -> ChangeStreamReader:
        return ChangeStreamReader(self.options)

    def writer(self, schema: object, overwrite: bool) -> TargetWriter:
        check_mode(overwrite)
        return TargetWriter(self.options)

    def streamWriter(self, schema: object, overwrite: bool) -> TargetStreamWriter:
        check_mode(overwrite)
        return TargetStreamWriter(self.options)
