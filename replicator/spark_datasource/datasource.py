"""The ``mcdc`` Spark data source: MongoDB read as change rows (batch: a snapshot; streaming: the change
streams) and change rows written to MongoDB. Options are mcdc's own option names (see docs/reference/options.md)."""

from __future__ import annotations

from collections.abc import MutableMapping

from pyspark.sql.datasource import DataSource

from replicator.events.rows import SCHEMA
from replicator.spark_datasource.options import one_line, settings_for
from replicator.spark_datasource.snapshot import SnapshotReader
from replicator.spark_datasource.stream import ChangeStreamReader
from replicator.spark_datasource.variant import VARIANT, VARIANT_SCHEMA, document_type
from replicator.spark_datasource.writer import TargetStreamWriter, TargetWriter, check_mode


class MongoChanges(DataSource):
    """``spark.read/readStream/write/writeStream.format("mcdc")``.

    A mistake in the options fails where Spark hands them over (a read's ``load()``, a write's ``save()``
    or ``start()``), as mcdc's one line (see :func:`.options.one_line`), before any connection."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        # PySpark asks data sources not to replace its __init__: this one keeps its signature and runs it
        # first, then checks every option's name and value, whatever the read or write
        super().__init__(options)
        with one_line():
            settings_for(self.options)
            document_type(self.options)

    @classmethod
    def name(cls) -> str:
        return "mcdc"

    def schema(self) -> str:
        with one_line():  # only a read asks for the schema (at load()): the moment to miss its source
            settings_for(self.options, "source")
            return VARIANT_SCHEMA if document_type(self.options) == VARIANT else SCHEMA

    def reader(self, schema: object) -> SnapshotReader:
        with one_line():
            return SnapshotReader(self.options)

    def streamReader(self, schema: object) -> ChangeStreamReader:
        # not under one_line(): PySpark's stream runner replaces an error raised here by its own (an unbound
        # reader it stops) unless the traceback shows both; schema() has checked the options at load()
        return ChangeStreamReader(self.options)

    def writer(self, schema: object, overwrite: bool) -> TargetWriter:
        with one_line():
            check_mode(overwrite)
            return TargetWriter(self.options)

    def streamWriter(self, schema: object, overwrite: bool) -> TargetStreamWriter:
        with one_line():
            check_mode(overwrite)
            return TargetStreamWriter(self.options)
