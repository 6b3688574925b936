"""The snapshot's copy, checkpointed: each partition is marked begun before it writes, its resume point
saved (paced) as its batches are acknowledged, and marked done once the sink acknowledged all of it. The
engine's copier does the copying; this module keeps the checkpoint and the progress."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence

from pymongo.errors import PyMongoError

from replicator.bsonkit.extjson import from_jsonable, to_jsonable
from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.engines.base import Engine
from replicator.events import CollectionSpec, Namespace
from replicator.events.positions import snapshot_position
from replicator.observe.metrics import Metrics
from replicator.observe.progress import Reporter
from replicator.observe.summary import Summary
from replicator.observe.tally import CollectionProgress
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.selection import rename_spec
from replicator.sinks.base import Sink
from replicator.snapshot.copy import CopyLimits, CopyResult
from replicator.snapshot.watermark import SavePace
from replicator.source import catalog
from replicator.source.connection import Client
from replicator.source.partitions import ALL, Partition, Resume
from replicator.source.reads import ReadPolicy
from replicator.source.retry import Retrier
from replicator.source.sharding import shard_specs


async def target_specs(
    client: Client, s: Settings, sink: Sink, specs: Sequence[CollectionSpec] | None = None
) -> list[CollectionSpec]:
    """The selected collections and views (``specs``, else the source's catalog) as the target names them,
    with how a sharded target shards each: --shard-target's key, else as the source is sharded (read
    through its mongos)."""
    if specs is None:
        specs = await catalog.describe(client, s.selection)
    specs = await shard_specs(client, specs, s.shard_target, target_shards=sink.shards)
    return [rename_spec(x, s.renamer) for x in specs]


class SnapshotCopy:
    """Copies a checkpoint's planned partitions that are not done yet."""

    def __init__(
        self,
        settings: Settings,
        store: CheckpointStore,
        reporter: Reporter,
        engine: Engine,
        *,
        retrier: Retrier,
        summary: Summary,
        fields: FieldRules,
        stop: asyncio.Event | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.s = settings
        self.store = store
        self.reporter = reporter
        self.engine = engine
        self.retrier = retrier
        self.summary = summary
        self.fields = fields
        self.stop = stop
        self.metrics = metrics
        self._began = False  # a copy of this run began: what a retry finds copied, this run copied

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    async def __call__(self, client: Client, sink: Sink, cp: Checkpoint, *, fresh: bool, started: bool) -> Checkpoint:
        """Copy what ``cp``'s plan has not done; ``fresh``: this run prepared the targets (a resumed run
        prepares what the killed one had not); ``started``: this run planned the snapshot."""
        s = self.s
        if cp.snapshot.status != "in_progress":
            return cp
        if not fresh:  # a resumed run: create what the killed run had not created yet
            specs = await target_specs(client, s, sink)
            unprepared = [t for t in specs if str(t.ns) not in cp.snapshot.prepared]
            await sink.prepare(unprepared, drop_existing=cp.snapshot.drop_target or s.drop_target)
            cp.snapshot.prepared.update(str(t.ns) for t in unprepared)
            self.store.save(cp)
        plan = [Partition.from_json(p) for p in cp.snapshot.plan]
        todo = [p for p in plan if p.id not in cp.snapshot.done]
        resume = {pid: Resume(from_jsonable(value)) for pid, value in cp.snapshot.resume.items()}
        collections, uncounted = progress_plan(plan, cp.snapshot.done)
        # a Spark session coming up beside the run is its start, not the copy's: the progress (its lines'
        # rates) and the summary's time both begin after it, at the same moment, so that they agree
        await self.engine.ready()
        started_at = time.monotonic()
        self.reporter.snapshot_begin(collections)  # partitions done before show as done, not as copied now
        if self.metrics is not None:
            before = sum(c.done for c in collections)  # copied by earlier runs
            self.metrics.snapshot_estimate(sum(c.total or 0 for c in collections), copied_before=before)
        # what an earlier run copied of the partitions this copy goes on with: counted first, so that the
        # progress starts where that run stopped (an _id range count, bounded by the _id index)
        halfway = [(p, resume[p.id]) for p in todo if p.resumable and p.id in resume]
        await self._copied_before(client, halfway, earlier_run=not self._began)
        self._began = True
        done_filtered = [p for p in plan if p.id in cp.snapshot.done and p.where is not None]
        counting = asyncio.create_task(self._count(client, uncounted, done_filtered))
        left = Counter(p.ns for p in todo)

        namespaces = {p.ns for p in plan}
        pace = SavePace()

        def save() -> None:
            started = time.monotonic()
            self.store.save(cp)
            pace.saved(time.monotonic() - started)

        async def progress(part: Partition, after: Resume) -> None:
            self.retrier.progress()
            cp.snapshot.resume[part.id] = to_jsonable(after.last_id)
            if pace.due():
                save()

        async def start(part: Partition) -> None:
            cp.snapshot.resume[part.id] = None  # begun: a retry deletes its range from the target first
            save()  # now, before it writes anything

        async def done(part: Partition, docs: int) -> None:
            self.retrier.progress()
            cp.snapshot.resume.pop(part.id, None)
            cp.snapshot.done.add(part.id)
            save()
            left[part.ns] -= 1
            if not left[part.ns]:
                self.reporter.snapshot_collection_done(str(part.ns))
            if self.metrics is not None:
                remaining = {p.ns for p in plan if p.id not in cp.snapshot.done}
                self.metrics.snapshot(len(namespaces), len(remaining))
                self.metrics.snapshot_docs(docs)

        if self.metrics is not None:
            self.metrics.set_state("snapshot")

        copied = CopyResult()
        try:
            await self.engine.copier(
                client, sink, todo, limits=self._limits(), rename=s.renamer, on_done=done,
                reporter=self.reporter, stop=self.stop, resume=resume, on_progress=progress, result=copied,
                fields=self.fields, on_start=start, at=snapshot_position(cp.position.cluster_time), mark_last=True,
            )  # fmt: skip
        except Exception:
            if pace.owed:  # a resume point the pace held back: the retry goes on from it
                save()
            raise
        finally:
            counting.cancel()
            self.summary.documents += copied.documents  # a failed attempt's too: they were written
            self.summary.snapshot_s += time.monotonic() - started_at
        self.reporter.snapshot_end(complete=not self._stopped())
        self.summary.collections_planned = len(namespaces)
        if self._stopped():  # the partitions not done are copied by the next run
            self.summary.snapshot = "stopped"
            self.summary.collections = len(namespaces - {p.ns for p in plan if p.id not in cp.snapshot.done})
            return cp
        self.summary.collections = len(namespaces)
        cp.snapshot.status = "copied"
        self.store.save(cp)
        self.summary.snapshot = "completed" if started else "resumed"
        return cp

    async def _copied_before(
        self, client: Client, halfway: Sequence[tuple[Partition, Resume]], *, earlier_run: bool
    ) -> None:
        """Count what was copied of each partition this copy goes on with (its range up to its resume
        point), for the progress; ``earlier_run``: by another run (this one's first copy), for the summary
        too (a retry's were written by this run, and counted as such)."""
        for part, after in halfway:
            coll = client[part.ns.db][part.ns.coll or ""]
            try:
                before = await coll.count_documents(part.find_filter()) - await coll.count_documents(
                    part.find_filter(after)
                )
            except PyMongoError:
                return  # only progress: the copy itself retries the source's failures
            self.reporter.snapshot_copied_before(str(part.ns), max(before, 0))
            if earlier_run:
                self.summary.copied_before += max(before, 0)

    async def _count(
        self, client: Client, uncounted: Sequence[Namespace], done_filtered: Sequence[Partition] = ()
    ) -> None:
        """Progress totals, alongside the copy: a collection kept whole was not counted when planned
        (a count can be a full scan), so count it here without holding up the copy. A filtered one's total
        is its matches (a count of the query), and so are its partitions done before (``done_filtered``):
        the plan's estimates are of all its documents."""
        try:
            for ns in uncounted:
                coll = client[ns.db][ns.coll or ""]
                where = self.s.filters.where(ns)
                count = await coll.estimated_document_count() if where is None else await coll.count_documents(where)
                self.reporter.snapshot_totals({str(ns): count})
                if self.metrics is not None:
                    self.metrics.snapshot_estimate(count)
            for part in done_filtered:
                copied = await client[part.ns.db][part.ns.coll or ""].count_documents(part.find_filter())
                self.reporter.snapshot_copied_before(str(part.ns), copied)
        except PyMongoError:
            return  # only progress: the copy itself retries the source's failures

    def _limits(self) -> CopyLimits:
        s = self.s
        return CopyLimits(s.workers, s.batch_docs, s.batch_bytes, s.queue_batches, ReadPolicy.of(s))


def progress_plan(plan: Sequence[Partition], done: set[str]) -> tuple[list[CollectionProgress], list[Namespace]]:
    """What the reporter is told as a copy begins, per collection: its estimated documents (None for one
    kept whole, which is not counted when planned, and for a filtered one, whose matches are counted
    later), those of its partitions already done (a filtered one's counted later too), and whether all
    are. Also the collections to count."""
    collections: dict[Namespace, CollectionProgress] = {}
    uncounted: dict[Namespace, None] = {}
    for p in plan:
        c = collections.setdefault(p.ns, CollectionProgress(str(p.ns), total=0, finished=True))
        if (p.bracket == ALL and not p.estimated_docs) or p.where is not None:
            c.total = None
            uncounted[p.ns] = None
        elif c.total is not None:
            c.total += p.estimated_docs
        if p.id in done:
            c.done += p.estimated_docs if p.where is None else 0
        else:
            c.finished = False
    return list(collections.values()), sorted(uncounted, key=str)
