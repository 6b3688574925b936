"""The selected collections read as ``r`` rows: ``spark.read.format("mcdc")`` (a snapshot), and the snapshot
that ``readStream`` emits first with ``snapshot=initial``. One Spark partition per ``_id`` range of the
snapshot's own plan (type-bracket aware, so mixed ``_id`` types all come back).

The plan is made on the driver with the asyncio engine's catalog and planner, after the source's time is
read: every row sits at that time in the stream's order (its ``sequence``), before every event after it.
Each task reads its range with the synchronous driver, documents staying raw BSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp
from pyspark.sql.datasource import DataSourceReader, InputPartition

from replicator.errors import ConfigError
from replicator.events.positions import snapshot_position
from replicator.events.rows import Row, snapshot_row
from replicator.settings.config import Settings
from replicator.source import catalog
from replicator.source.changestream import current_time
from replicator.source.connection import make_client
from replicator.source.partitions import Partition, plan_specs
from replicator.spark_datasource.changes import sync_client
from replicator.spark_datasource.options import settings_for

#: The ``snapshot`` option's values that emit a snapshot before the stream (the CLI's vocabulary: a query is
#: new when its checkpointLocation is, so initial, always and when_needed all mean "snapshot first").
SNAPSHOT_FIRST = frozenset({"initial", "always", "when_needed"})


@dataclass(frozen=True)
class Range(InputPartition):
    """One snapshot partition (Partition.to_json), read by one task; ``t, i``: the snapshot's read time."""

    partition: Mapping[str, Any]
    t: int | None = None
    i: int | None = None


class SnapshotReader(DataSourceReader):
    """The ``mcdc`` source's batch reader. Holds only option strings (it is pickled to the executors)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        settings_for(self.options, "source")  # a bad option fails now, on the driver

    def partitions(self) -> list[Range]:
        at, plan = asyncio.run(plan_snapshot(settings_for(self.options, "source")))
        return [Range(p.to_json(), at.time, at.inc) for p in plan]

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, Range)
        yield from read_range(settings_for(self.options, "source"), partition)


def read_range(s: Settings, part: Range) -> Iterator[Row]:
    """The rows of one snapshot partition."""
    plan = Partition.from_json(part.partition)
    at = snapshot_position(Timestamp(part.t, part.i) if part.t is not None and part.i is not None else None)
    relaxed = s.extended_json == "relaxed"
    with sync_client(s.source, s.connect_timeout_s, s.io_timeout_s) as client:
        coll = client[plan.ns.db][plan.ns.coll or ""]
        sort = [("_id", 1)] if plan.resumable else None
        for doc in coll.find(plan.query(), sort=sort, batch_size=s.batch_docs):
            yield snapshot_row(plan.ns, doc, at, relaxed=relaxed)


async def plan_snapshot(s: Settings, at: Timestamp | None = None) -> tuple[Timestamp, list[Partition]]:
    """The source's time (``at`` when the stream's positions were taken already), then the snapshot's
    partitions of every selected collection (views have no documents of their own)."""
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        at = at if at is not None else await current_time(client)
        if s.include:
            problem = catalog.unmatched(s.selection, await catalog.list_namespaces(client))
            if problem is not None:
                raise ConfigError(problem)
        specs = await catalog.describe(client, s.selection)
        return at, await plan_specs(client, specs, s.partition_docs, split=s.split)
    finally:
        await client.close()


def snapshot_first(options: Mapping[str, str], s: Settings) -> bool:
    """Does a stream emit the snapshot first? Only when the ``snapshot`` option asks (a stream starts at its
    position "now" by default, as it always did); ``start-at`` cannot go with it."""
    given = any(key.lower() == "snapshot" for key in options)
    if not given or s.snapshot not in SNAPSHOT_FIRST:
        return False
    if s.start_at is not None:
        raise ConfigError(
            f"option snapshot {s.snapshot} reads the collections first and the stream from then on: "
            "it takes no start-at (drop one of them)"
        )
    return True


def read_next(plan: Sequence[Mapping[str, Any]], done: int, rows: int | None) -> int:
    """How many partitions are read once a micro-batch of at most ``rows`` rows (None: no limit) has read
    those after the first ``done``: as many as their estimated documents allow, at least one."""
    if rows is None:
        return len(plan)
    end, total = done, 0
    while end < len(plan):
        docs = max(1, int(plan[end].get("estimated_docs") or 0))
        if end > done and total + docs > rows:
            break
        total += docs
        end += 1
    return end
