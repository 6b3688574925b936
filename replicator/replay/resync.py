"""Copying namespaces again from the source during a replay.

When the DDL window (ddl_window) cannot replay a rename, drop or dropDatabase as it is, when a collection
is renamed into the selection, or when the selection grew, the namespaces concerned are made what the
source holds now: the target's copy is dropped, the collection (or view) created again with its options,
its documents copied and its indexes built. A namespace the source no longer has is dropped from the
target. Namespaces whose catalog alone changed get the source's indexes, and are copied again only where
their options differ. On a sharded target, a collection created again is sharded again (as the source is,
or as --shard-target says) before its documents are copied.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op
from replicator.events.positions import snapshot_position
from replicator.observe.progress import Reporter
from replicator.observe.tally import CollectionProgress, listing, plural
from replicator.replay.ddl_window import Resync
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.selection import rename_spec
from replicator.sinks.base import Sink
from replicator.snapshot.copy import CopyLimits, copy_partitions
from replicator.source import catalog
from replicator.source.changestream import current_time
from replicator.source.connection import Client
from replicator.source.partitions import Partition, plan_spec
from replicator.source.reads import ReadPolicy
from replicator.source.sharding import shard_specs


@dataclass
class Copied:
    """What copies made again wrote, for the run's summary: documents, time, and which namespaces were
    copied again (``recopied``) or had only their indexes and options made the source's (``reconciled``)."""

    documents: int = 0
    seconds: float = 0.0
    recopied: set[str] = field(default_factory=set)
    reconciled: set[str] = field(default_factory=set)
    #: namespaces to copy again that the source no longer had: dropped on the target instead
    dropped: set[str] = field(default_factory=set)


class Resyncer:
    """Makes namespaces of the target what the source holds now (see the module's docstring)."""

    def __init__(
        self,
        client: Client,
        sink: Sink,
        settings: Settings,
        reporter: Reporter,
        *,
        fields: FieldRules | None = None,
        copied: Copied | None = None,
    ) -> None:
        self._client = client
        self._sink = sink
        self.s = settings
        self._reporter = reporter
        self._fields = fields
        self.copied = copied if copied is not None else Copied()

    async def __call__(self, todo: Resync) -> tuple[set[Namespace], Timestamp]:
        """Copy again what ``todo`` names; returns the source namespaces made current, and the source's time
        once they were (later events are applied on top of it)."""
        data = set(todo.data)
        for db in sorted(todo.databases):
            data |= await self._database(db)
        if todo.databases:
            await self._drop_databases(todo.databases)
        catalog = sorted(todo.catalog - data, key=str)
        if catalog:
            self._reporter.info(f"making indexes and options the source's: {listing(list(map(str, catalog)), 20)}")
        for ns in catalog:
            if await self._catalog(ns):
                self.copied.reconciled.add(str(ns))
            else:
                data.add(ns)  # options that only a new copy can take
        if data:
            self._reporter.info(f"copying again from the source: {listing(list(map(str, data)), 20)}")
        for ns in sorted(data, key=str):
            await self.copy(ns)
        return data | todo.catalog, await current_time(self._client)

    async def _database(self, db: str) -> set[Namespace]:
        """What the selection maps from source database ``db``: its collections and views on the source
        now, and every collection rule's source in it (their targets may live in other databases)."""
        found = {Namespace(db, name) for name in await self._client[db].list_collection_names()}
        found |= {Namespace(*src) for src in self.s.renamer.collections if src[0] == db}
        return {ns for ns in found if self.s.selection(ns) and not (ns.coll or "").startswith("system.")}

    async def _drop_databases(self, databases: set[str]) -> None:
        """The target's collections mapped from these source databases (the sink drops only those)."""
        renamer = self.s.renamer
        await self._sink.write(
            [ChangeEvent(Op.DROP_DATABASE, renamer(Namespace(db)), origin=Namespace(db)) for db in sorted(databases)]
        )

    async def _catalog(self, ns: Namespace) -> bool:
        """The source's indexes and options onto the target's collection; False when only copying it again
        can do that (options differ, or it is gone from the source)."""
        spec = await self._describe(ns)
        if spec is None:
            return False
        return await self._sink.reconcile(rename_spec(spec, self.s.renamer))

    async def _describe(self, ns: Namespace) -> CollectionSpec | None:
        """Source namespace ``ns`` as the catalog has it, with how a sharded target shards it."""
        spec = await catalog.describe_one(self._client, ns)
        if spec is None:
            return None
        (spec,) = await shard_specs(self._client, [spec], self.s.shard_target, target_shards=self._sink.shards)
        return spec

    async def copy(self, ns: Namespace) -> None:
        """Make the target's image of source namespace ``ns`` what the source holds now: a copy (counted as
        copied again), or a drop (counted as dropped) when the source no longer has it."""
        target = self.s.renamer(ns)
        spec = await self._describe(ns)
        if spec is None:  # gone from the source: gone from the target
            await self._sink.write([ChangeEvent(Op.DROP, target, origin=ns)])
            self._reporter.info(f"{ns}: gone from the source, dropped on the target")
            self.copied.dropped.add(str(ns))
            return
        renamed = rename_spec(spec, self.s.renamer)
        at = snapshot_position(await current_time(self._client))  # before anything is read: the rows' place
        await self._sink.prepare([renamed], drop_existing=True)
        self.copied.recopied.add(str(ns))
        if spec.is_view:
            return
        # into a collection just created: no partition is begun twice, so time-series ones may split by time
        plan = await plan_spec(
            self._client, spec, self.s.partition_docs, split=self.s.split,
            read_preference=ReadPolicy.of(self.s).preference, where=self.s.filters.where,
        )  # fmt: skip

        async def done(part: Partition, docs: int) -> None:
            pass

        total = sum(p.estimated_docs for p in plan)
        self._reporter.snapshot_begin([CollectionProgress(str(ns), total=total or None)])
        started = time.monotonic()
        s = self.s
        limits = CopyLimits(s.workers, s.batch_docs, s.batch_bytes, s.queue_batches, ReadPolicy.of(s))
        documents = await copy_partitions(
            self._client, self._sink, plan, limits=limits, rename=s.renamer, on_done=done,
            reporter=self._reporter, fields=self._fields, at=at,
        )  # fmt: skip
        self._reporter.snapshot_end(complete=True)
        await self._sink.finish_snapshot([renamed])
        self.copied.documents += documents
        self.copied.seconds += time.monotonic() - started
        self._reporter.info(f"{ns}: copied {plural(documents, 'document')} again")
