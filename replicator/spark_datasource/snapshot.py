"""``spark.read.format("mcdc")``: the selected collections as ``r`` rows, one Spark partition per ``_id``
range of the snapshot's own plan (type-bracket aware, so mixed ``_id`` types all come back).

The plan is made on the driver with the asyncio engine's catalog and planner; each task reads its range
with the synchronous driver, documents staying raw BSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..config import Settings
from ..errors import ConfigError
from ..source import catalog
from ..source.connection import make_client
from ..source.partitions import Partition, plan_specs
from .changes import sync_client
from .options import settings_for
from .rows import Row, snapshot_row


@dataclass(frozen=True)
class Range(InputPartition):
    """One snapshot partition (Partition.to_json), read by one task."""

    partition: dict[str, Any]


class SnapshotReader(DataSourceReader):
    """The ``mcdc`` source's batch reader. Holds only option strings (it is pickled to the executors)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        settings_for(self.options, "source")  # a bad option fails now, on the driver

    def partitions(self) -> list[Range]:
        plan = asyncio.run(plan_snapshot(settings_for(self.options, "source")))
        return [Range(p.to_json()) for p in plan]

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, Range)
        s = settings_for(self.options, "source")
        part = Partition.from_json(partition.partition)
        with sync_client(s.source, s.connect_timeout_s, s.io_timeout_s) as client:
            coll = client[part.ns.db][part.ns.coll or ""]
            sort = [("_id", 1)] if part.resumable else None
            for doc in coll.find(part.query(), sort=sort, batch_size=s.batch_docs):
                yield snapshot_row(part.ns, doc)


async def plan_snapshot(s: Settings) -> list[Partition]:
    """The snapshot's partitions of every selected collection (views have no documents of their own)."""
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        if s.include:
            problem = catalog.unmatched(s.selection, await catalog.list_namespaces(client))
            if problem is not None:
                raise ConfigError(problem)
        return await plan_specs(client, await catalog.describe(client, s.selection), s.partition_docs, split=s.split)
    finally:
        await client.close()
