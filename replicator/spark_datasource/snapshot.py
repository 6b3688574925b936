"""The selected collections read as ``r`` rows: ``spark.read.format("mcdc")`` (a snapshot), and the snapshot
that ``readStream`` emits first with ``snapshot=initial``. One Spark partition per ``_id`` range of the
snapshot's own plan (type-bracket aware, so mixed ``_id`` types all come back).

The plan is made on the driver with the asyncio engine's catalog and planner, after the source's time is
read: every row sits at that time in the stream's order (its ``sequence``), before every event after it.
Each partition of the plan keeps its collection's UUID (``uuid``, hex), and the plan is made again while
a rename or drop touched one of its collections between that time and the plan's end: so the plan names
the collections as they were at its time, and a task finds its collection wherever it is when it reads
it (moves.py). Each task reads its range with the synchronous driver, documents staying raw BSON.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp
from pymongo.errors import ConnectionFailure, OperationFailure
from pyspark.sql.datasource import DataSourceReader, InputPartition

from replicator.errors import ConfigError, McdcError
from replicator.events.positions import snapshot_position
from replicator.events.rows import Row, snapshot_row
from replicator.settings.config import Settings
from replicator.settings.unmatched import refusal, unmatched_rule
from replicator.source import catalog
from replicator.source.changestream import current_time
from replicator.source.connection import Client, failure, make_client, probe
from replicator.source.incarnations import collection_uuids
from replicator.source.partitions import Partition, plan_specs
from replicator.source.reads import ReadPolicy, SourceReads, check_members
from replicator.spark_datasource.changes import sync_client
from replicator.spark_datasource.moves import documents, moved_since
from replicator.spark_datasource.options import one_line, settings_for
from replicator.spark_datasource.variant import VARIANT, as_variant, document_type

log = logging.getLogger("mcdc.spark")

#: The ``snapshot`` option's values that emit a snapshot before the stream (the CLI's vocabulary: a query is
#: new when its checkpointLocation is, so initial, always and when_needed all mean "snapshot first").
SNAPSHOT_FIRST = frozenset({"initial", "always", "when_needed"})
#: How many times a snapshot is planned before renames and drops of its collections, each made while it was
#: planned, make it give up.
PLAN_ATTEMPTS = 5


@dataclass(frozen=True)
class Range(InputPartition):
    """One snapshot partition (Partition.to_json), read by one task; ``t, i``: the snapshot's read time;
    ``readers``: the partitions read with it, which share --max-read-rate equally (Spark may run them all
    at once, and its tasks share no bucket)."""

    partition: Mapping[str, Any]
    t: int | None = None
    i: int | None = None
    readers: int = 1


class SnapshotReader(DataSourceReader):
    """The ``mcdc`` source's batch reader. Holds only option strings (it is pickled to the executors)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        settings_for(self.options, "source")  # a bad option fails now, on the driver

    def partitions(self) -> list[Range]:
        with one_line():
            at, plan = plan_steadily(settings_for(self.options, "source"), lambda: None)
        return [Range(part, at.time, at.inc, len(plan)) for part in plan]

    def read(self, partition: InputPartition) -> Iterator[Row]:
        if not isinstance(partition, Range):  # Spark's own stand-in for an empty plan: nothing to read
            return
        with one_line():
            rows = read_range(settings_for(self.options, "source"), partition)
            yield from as_variant(rows) if document_type(self.options) == VARIANT else rows


def read_range(s: Settings, part: Range) -> Iterator[Row]:
    """The rows of one snapshot partition, read wherever its collection is now, under its planned name."""
    plan = Partition.from_json(part.partition)
    uuid = part.partition.get("uuid")
    read_at = Timestamp(part.t, part.i) if part.t is not None and part.i is not None else None
    at = snapshot_position(read_at)
    relaxed = s.extended_json == "relaxed"
    # no read older than the snapshot's time where it may reach a secondary; this task's share of the rate
    reads = SourceReads.start(ReadPolicy.of(s).shared(part.readers), read_at)
    with sync_client(s.source, s.connect_timeout_s, s.io_timeout_s) as client:
        for doc in documents(client, s, plan, bytes.fromhex(uuid) if uuid else None, read_at, reads):
            yield snapshot_row(plan.ns, doc, at, relaxed=relaxed)


def plan_steadily(
    s: Settings, begin: Callable[[], Timestamp | None], *, check: bool = True
) -> tuple[Timestamp, list[dict[str, Any]]]:
    """The snapshot's time and plan (:func:`plan_snapshot`, from the time ``begin`` takes, None: the
    source's now), made again while renames or drops touch its collections before it is done."""
    for _ in range(PLAN_ATTEMPTS):
        at, plan = asyncio.run(plan_snapshot(s, begin(), check=check))
        with sync_client(s.source, s.connect_timeout_s, s.io_timeout_s) as client:
            moved = moved_since(client, s, at, {Partition.from_json(part).ns for part in plan})
        if not moved:
            return at, plan
        log.info("planning the snapshot again: %s while it was planned", ", ".join(moved))
    raise McdcError(
        f"the source's selected collections were renamed or dropped each of the {PLAN_ATTEMPTS} times the "
        "snapshot was planned: start the query again once they are left alone"
    )


async def check_selection(client: Client, s: Settings) -> None:
    """A query's selection and rules, before it reads anything, as a first run of the CLI checks them: an
    ``include`` or another rule that names namespaces (``exclude``, ``filter``, ``rename``, the field rules,
    ``shard-target``) and matches none on the source is refused, unless ``allow-unmatched`` is set (then
    it is logged)."""
    namespaces = await catalog.list_namespaces(client, s.selection)
    problem = catalog.unmatched(s.selection, namespaces) if s.include else None
    for said in (problem, unmatched_rule(s, namespaces)):
        if said is not None and not s.allow_unmatched:
            raise ConfigError(refusal(said, '.option("allow-unmatched", "true")'))
        if said is not None:
            log.warning("%s", said)


async def check_source(s: Settings) -> None:
    """:func:`check_selection` on a client of its own (a stream that takes no snapshot)."""
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        await probe(client, s.source, "source")
        await check_selection(client, s)
    except (ConnectionFailure, OperationFailure) as exc:
        raise await failure(exc, client, s.source, "source") from None
    finally:
        await client.close()


async def plan_snapshot(
    s: Settings, at: Timestamp | None = None, *, check: bool = True
) -> tuple[Timestamp, list[dict[str, Any]]]:
    """The source's time (``at`` when the stream's positions were taken already), then the snapshot's
    partitions of every selected collection (views have no documents of their own), each as
    ``Partition.to_json`` with its collection's ``uuid`` (hex) when the source reports one. ``check``: the
    selection's rules first (:func:`check_selection`), unless the caller did already."""
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        await probe(client, s.source, "source")  # unreachable, refusing us: the CLI's one line
        policy = ReadPolicy.of(s)
        await check_members(client, policy)  # --read-preference secondary: servable?
        at = at if at is not None else await current_time(client)
        if check:
            await check_selection(client, s)
        specs = await catalog.describe(client, s.selection)
        refusal = s.filters.collation_refusal(specs)
        if refusal is not None:
            raise ConfigError(refusal)
        plan = await plan_specs(
            client, specs, s.partition_docs, split=s.split, read_preference=policy.preference, where=s.filters.where
        )
        uuids = await collection_uuids(client, {p.ns for p in plan})
        return at, [_with_uuid(p.to_json(), uuids.get(p.ns)) for p in plan]
    except (ConnectionFailure, OperationFailure) as exc:  # gone since, or refusing a command: one line
        raise await failure(exc, client, s.source, "source") from None
    finally:
        await client.close()


def _with_uuid(part: dict[str, Any], uuid: bytes | None) -> dict[str, Any]:
    return {**part, "uuid": uuid.hex()} if uuid is not None else part


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
