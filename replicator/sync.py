"""``mcdc sync`` and ``mcdc catch-up``: snapshot (when needed) then change replay up to "now".

The order of a sync, each step checkpointed so a killed run resumes where it stopped:

1. capture the change stream position (before anything is read), plan partitions, save
   ``snapshot.status = in_progress``;
2. create target collections and views, copy partitions (each marked done after the sink acked it,
   and until then resumable after the end of its acknowledged batches), save ``copied``;
3. replay changes up to the source's time at the end of the copy, deferring index DDL;
4. reconcile indexes with the source's current catalog (secondary indexes are built after the data),
   save ``done``;
5. replay up to the source's time once more (index DDL now applied) and exit.

Steps 1 to 4 retry through outages of the source or the target as the replay does (same backoff and
--max-retries): each retry goes on from the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from pymongo.errors import PyMongoError

from .checkpoint import Checkpoint, CheckpointStore, SnapshotProgress
from .config import Settings, parse_start_at
from .ddl_window import DdlWindow, Resync
from .errors import ConfigError, HistoryLost, ServerUnavailable, TopologyError
from .events import ChangeEvent, Namespace, Op, Position
from .extjson import from_jsonable, to_jsonable
from .fields import FieldRules
from .filters import Scope, check_collisions, make_transform, rename_spec, renamed_into_selection
from .metrics import Metrics
from .pipeline import Copier, CopyLimits, CopyResult, Transform, copy_partitions
from .preflight import refuse_same_server, source_name, target_identity
from .progress import Reporter
from .recorded import Recorded, narrowed, refused_change, widened
from .replay_stage import ReplayStage
from .resync import Copied, Resyncer
from .retry import Retrier, is_retryable
from .sinks.base import Sink
from .sinks.registry import open_sink
from .snapshot_mode import Checkpointed, Start, decide, drops_target
from .source import catalog
from .source.connection import Client, ServerInfo, deployment_identity, make_client, probe
from .source.lookup import source_lookup
from .source.partitions import ALL, Partition, Resume, plan_specs
from .source.shards import MergedReader
from .source.topology import Reader, StreamTopology
from .streaming import StreamApplier
from .summary import Summary
from .tally import CollectionProgress, duration, format_ts, listing, plural
from .uri import is_mongo_uri, redact
from .watermark import SavePace

T = TypeVar("T")


class SyncJob:
    """One sync, catch-up or tail run. Construct with Settings; ``await run()``.

    ``tail`` follows the stream after the snapshot phases until ``stop`` is set; ``metrics`` (optional)
    is kept up to date for the metrics endpoint."""

    def __init__(
        self,
        settings: Settings,
        reporter: Reporter,
        *,
        command: str = "sync",
        stop: asyncio.Event | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.s = settings
        self.reporter = reporter
        self.command = command
        self.stop = stop
        self.metrics = metrics
        self.store = CheckpointStore(settings.checkpoint_path())
        self._fields = FieldRules(settings.field_exclude, settings.field_rename)
        self._retrier = Retrier.of(settings, reporter, stop=stop, metrics=metrics)  # the snapshot's retries
        self._copier: Copier = copy_partitions  # the asyncio engine's; --engine spark's runs Spark tasks
        self._spark: Any = None  # the SparkSession of --engine spark
        self._spark_before: Any = None  # the session that ran before this job (spark-submit's): not stopped
        self._resnapshot = False  # a new snapshot is due whatever the checkpoint says (history lost)
        self._started_snapshot = False  # this run planned the snapshot it copies
        self._window: DdlWindow | None = None  # the replay's DDL window, kept across its phases
        self._recopied = Copied()  # what namespaces copied again during the replay wrote
        self.summary = Summary(
            command=command,
            source=redact(settings.source),
            target=redact(settings.target),
            checkpoint=str(self.store.path),
        )

    async def run(self) -> Summary:
        started = time.monotonic()
        if self.s.verify and self.command == "tail" and not is_mongo_uri(self.s.target):
            raise ConfigError(f"--verify compares two MongoDB deployments: --target {redact(self.s.target)} is not")
        sink = open_sink(self.s)  # before any connection: a bad target or sink option fails at once
        try:
            with self.store.locked():
                client = make_client(
                    self.s.source, timeout_s=self.s.connect_timeout_s, io_timeout_s=self.s.io_timeout_s
                )
                try:
                    reached = await self._reach(lambda: probe(client, self.s.source, "source"), "source")
                    if reached is None:  # stopped while waiting for the source
                        self.summary.elapsed_s = round(time.monotonic() - started, 3)
                        return self.summary
                    (info,) = reached
                    sink.source_name = info.set_name or ""
                    cp = self.store.load()
                    if cp is not None and cp.cutover is not None:
                        raise ConfigError(
                            f"checkpoint {self.store.path} was cut over (mcdc cutover): the target is the one "
                            "written to now; its reverse checkpoint carries writes the other way"
                        )
                    self._check_recorded(cp)
                    await self._check_selection(client, first_run=cp is None)
                    # an event sink's identity needs no I/O: claim before start() opens (or trims) its file
                    claimed = self._claim(info, sink, cp, started=False)
                    scope = Scope(self.s.selection, self.s.renamer)
                    transform = make_transform(self.s.selection, self.s.renamer, fields=self._fields)
                    sink.attach_source(source_lookup(client, scope, transform))
                    if not await self._start_sink(sink):  # stopped while the target was unreachable
                        self.summary.elapsed_s = round(time.monotonic() - started, 3)
                        return self.summary
                    await refuse_same_server(client, info, sink, self.s, first_run=cp is None)
                    if not claimed:  # a MongoDB target, known now that start() probed it; nothing written yet
                        self._claim(info, sink, cp, started=True)
                    if self.s.engine == "spark":  # after every check: a mistake costs no JVM start
                        await self._start_spark()
                    await self._run(client, info, sink, cp)
                finally:
                    await client.close()
        finally:
            await sink.close()
            if self._spark is not None:
                from .engines.spark.session import stop_owned

                await asyncio.to_thread(stop_owned, self._spark, self._spark_before)
        self.summary.elapsed_s = round(time.monotonic() - started, 3)
        return self.summary

    async def _start_spark(self) -> None:
        """--engine spark: the session (started here, or spark-submit's), and the Spark copier."""
        from .engines.spark.session import existing, session
        from .engines.spark.snapshot import SparkCopier

        self._spark_before = existing()
        if self._spark_before is None:
            self.reporter.info(f"starting Spark ({self.s.spark_master})")
        self._spark = await asyncio.to_thread(session, self.s)
        self._copier = SparkCopier(self.s, self._spark)

    def _check_recorded(self, cp: Checkpoint | None) -> None:
        """Refuse, before anything is written, to go on from a checkpoint whose target copies were made
        under other renames or field rules (unless this run takes a new snapshot)."""
        if cp is None or cp.recorded is None or self.s.snapshot == "always":
            return
        problem = refused_change(Recorded.from_json(cp.recorded), Recorded.of(self.s), str(self.store.path))
        if problem is not None:
            raise ConfigError(problem)

    async def _check_selection(self, client: Client, *, first_run: bool) -> None:
        """A first run whose --include matches nothing on the source is a mistake: refused before anything
        is written. Otherwise a selection that matches nothing is worth a warning (sync and tail): the
        source may be empty yet, or its namespaces dropped since the last run. Two selected namespaces that
        --rename maps onto one target namespace, and a field rule that names an _id, are refused on every
        run."""
        namespaces = await catalog.list_namespaces(client)
        check_collisions([ns for ns in namespaces if self.s.selection(ns)], self.s.renamer)
        self._fields.check([ns for ns in namespaces if self.s.selection(ns)])
        problem = catalog.unmatched(self.s.selection, namespaces)
        if problem is not None and self.s.include and first_run:
            raise ConfigError(problem)
        if problem is not None and self.command != "catch-up":
            self.reporter.warn(problem)

    async def _start_sink(self, sink: Sink) -> bool:
        """Start the sink; False when stopped while waiting for an unreachable target (see :meth:`_reach`)."""
        return await self._reach(sink.start, "target") is not None

    async def _reach(self, attempt: Callable[[], Awaitable[T]], what: str) -> tuple[T] | None:
        """``attempt()``'s result, once a server answers it. An outage at start (a Kafka broker not up yet,
        or any unreachable server when :meth:`Settings.waits_at_start`: tail, or --max-retries given) is
        said once, then waited for under --max-retries as an outage later in the run would be. None when
        stopped meanwhile."""
        retries, waiting_since = self._retrier.retries, 0.0
        try:
            while True:
                try:
                    result = await attempt()
                except Exception as exc:
                    unreachable = isinstance(exc, ServerUnavailable) and self.s.waits_at_start(self.command)
                    if not (unreachable or is_retryable(exc)):
                        raise
                    if not waiting_since:
                        waiting_since = time.monotonic()
                        self.reporter.warn(f"{exc}; waiting for the {what}, retrying {self._retrier.budget()}")
                    if await self._retrier.wait(exc, "source" if what == "source" else "sink", quiet=True):
                        return None
                    continue
                if waiting_since:
                    self.reporter.info(f"the {what} answered after {duration(time.monotonic() - waiting_since)}")
                self._retrier.progress()
                return (result,)
        finally:
            self.summary.retries += self._retrier.retries - retries

    def _claim(self, info: ServerInfo, sink: Sink, cp: Checkpoint | None, *, started: bool) -> bool:
        """Refuse a checkpoint written for another source or target; False when the target's identity
        needs the sink started first."""
        target = target_identity(sink, self.s)
        if target is None and not started:
            return False
        self.store.claim(
            cp,
            source=deployment_identity(info, self.s.source),
            target=target or redact(self.s.target),  # a MongoDB sink that did not expose its server
            source_name=source_name(info, self.s.source),
        )
        return True

    async def _run(self, client: Client, info: ServerInfo, sink: Sink, cp: Checkpoint | None) -> None:
        s = self.s
        if not info.has_change_streams and not s.snapshot_only:
            raise TopologyError(
                f"source {redact(s.source)} is a standalone server: it has no change stream, so writes made "
                "during the copy would be lost. Convert it to a one-member replica set, or pass "
                "--snapshot-only to copy anyway"
            )
        identity = source_name(info, s.source)
        if self.command == "catch-up" and cp is None:  # a cron job's first run: begins as sync would
            self.reporter.info(
                f"no checkpoint at {self.store.path} yet: this first run begins as --snapshot {s.snapshot} says"
            )
        if s.snapshot_only:
            self.reporter.warn("--snapshot-only: writes made to the source during the copy are not replayed")
        # a bounded run stops at the first empty poll: a short await keeps its tail short
        await_ms = 1000 if self.command == "tail" else 200
        self._client = client
        self._topology = StreamTopology(s, self.reporter, client)
        reader = await self._topology.reader(info, max_await_ms=await_ms, cp=cp)
        try:
            while True:
                try:
                    cp = await self._snapshot_phase(client, reader, sink, cp, identity)
                    if cp is None or self._stopped():
                        break
                    cp.shard_hosts.update(self._topology.hosts)  # saved with the next position
                    if self.metrics is not None and cp.snapshot.status in ("done", "none"):
                        self.metrics.snapshot_done()
                    if not s.snapshot_only:
                        await self._follow_selection(client, sink, cp)
                        await self._replay(reader, sink, cp, snapshot_window=False, follow=self.command == "tail")
                    break
                except HistoryLost as exc:
                    if s.on_history_lost != "resnapshot":
                        raise
                    self.reporter.warn(f"{exc}; taking a new snapshot (--on-history-lost resnapshot)")
                    self._resnapshot = True
        finally:
            if isinstance(reader, MergedReader):
                await reader.close_clients()
            else:
                await reader.close()
        self.summary.position = cp.position.cluster_time if cp is not None else None
        self.summary.documents += self._recopied.documents
        self.summary.snapshot_s += self._recopied.seconds

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    async def _snapshot_phase(
        self, client: Client, reader: Reader, sink: Sink, cp: Checkpoint | None, identity: str
    ) -> Checkpoint | None:
        """Everything up to a finished snapshot: the decision, the copy, its window's replay and the index
        build. A retryable failure of the source or the target backs off as the stream does (and counts
        against the same --max-retries in a row; an acknowledged batch resets the count), then goes on
        from the checkpoint: partitions done are skipped, the others resume after the end of their
        acknowledged batches. None when stopped before any checkpoint was saved."""
        retries = self._retrier.retries
        try:
            while True:
                try:
                    cp = await self._snapshot_if_needed(client, reader, sink, cp, identity)
                    if not self._stopped():
                        await self._finish_snapshot(client, reader, sink, cp)
                    return cp
                except Exception as exc:
                    if not is_retryable(exc):
                        raise
                    with contextlib.suppress(Exception):  # a stream the failure left open; it may be dead
                        await reader.close()
                    stopped = await self._retrier.wait(exc, "snapshot")
                    cp = self.store.load()  # what was acknowledged: go on from there
                    if stopped:
                        return cp
        finally:
            self.summary.retries += self._retrier.retries - retries

    async def _finish_snapshot(self, client: Client, reader: Reader, sink: Sink, cp: Checkpoint) -> None:
        """A copied snapshot: replay its window, build indexes, save ``done``."""
        s = self.s
        if cp.snapshot.status != "copied":
            return
        if not s.snapshot_only:
            await self._replay(reader, sink, cp, snapshot_window=True)
            if self._stopped():
                return  # the window is not replayed to its end: the next run goes on with it
        specs = [rename_spec(x, s.renamer) for x in await catalog.describe(client, s.selection)]
        if sink.holds_state:  # an event sink has no indexes to build
            self.reporter.info(f"building indexes on {plural(len(specs), 'collection')}")
        await sink.finish_snapshot(specs)
        cp.snapshot.status = "done"
        cp.snapshot.finished_at = time.time()
        self.store.save(cp)

    async def _snapshot_if_needed(
        self, client: Client, reader: Reader, sink: Sink, cp: Checkpoint | None, identity: str
    ) -> Checkpoint:
        s = self.s
        force = self._resnapshot
        saved = Checkpointed(cp.snapshot.status, bool(cp.position)) if cp is not None else None
        start = decide(
            saved, mode=s.snapshot, snapshot_only=s.snapshot_only, start_at=s.start_at is not None, force=force
        )
        if start is Start.RESUME:
            self.reporter.info(f"resuming the snapshot recorded in {self.store.path}")
            assert cp is not None
            return await self._copy(client, sink, cp, fresh=False)
        if start is Start.START_AT:
            assert s.start_at is not None
            at = parse_start_at(s.start_at)
            cp = self._new_checkpoint(identity, position=Position(cluster_time=at))
            self.store.save(cp)
            self.reporter.info(f"no snapshot: replicating from --start-at {s.start_at} ({format_ts(at)})")
            return cp
        if start is Start.CHECK_HISTORY:
            assert cp is not None
            try:  # the saved position must still be in the oplog, or the data is copied again
                await _open(reader, cp)
                await reader.close()
                start = Start.REPLAY
            except HistoryLost as exc:
                self.reporter.warn(f"{exc}; taking a new snapshot (--snapshot when_needed)")
                start = Start.FRESH
        if start is Start.REPLAY:
            if cp is None:
                position, shard_positions = await _capture(reader)
                cp = self._new_checkpoint(identity, position=position, shards=shard_positions)
                self.store.save(cp)
                self.reporter.info("no snapshot (--snapshot never): replicating from now")
            return cp
        position, shard_positions = Position(), {}
        if not s.snapshot_only:
            position, shard_positions = await _capture(reader)
        specs = await catalog.describe(client, s.selection)
        targets = [rename_spec(x, s.renamer) for x in specs]
        drop = drops_target(saved, drop_target=s.drop_target, force=force)
        busy = await sink.existing([t.ns for t in targets if not t.is_view])
        if busy and not drop:
            raise ConfigError(
                f"the target already holds data in {listing(busy, 5)}; pass --drop-target to replace it, "
                "or --snapshot never to only replay changes"
            )
        plan = await plan_specs(client, specs, s.partition_docs, split=s.split, split_time=sink.deletes_time_ranges)
        cp = self._new_checkpoint(
            identity,
            position=position,
            shards=shard_positions,
            snapshot=SnapshotProgress(
                status="in_progress", plan=[p.to_json() for p in plan], drop_target=drop, started_at=time.time()
            ),
        )
        self.store.save(cp)
        self._resnapshot, self._started_snapshot = False, True  # from here on, a retry resumes this one
        self.reporter.info(
            f"snapshot of {plural(len(targets), 'namespace')} in {plural(len(plan), 'partition')}"
            + (f", stream position captured at {format_ts(position.cluster_time)}" if position.cluster_time else "")
        )
        if busy:  # say what is replaced before it is gone
            why = "--drop-target" if s.drop_target else "a new snapshot"
            self.reporter.info(f"{why}: replacing the target's data in {listing(busy, 50)}")
        await sink.prepare(targets, drop_existing=drop)
        cp.snapshot.prepared = {str(t.ns) for t in targets}
        self.store.save(cp)  # before any copy: a resumed run must not prepare (drop) them again
        return await self._copy(client, sink, cp, fresh=True)

    def _new_checkpoint(self, identity: str, **fields: Any) -> Checkpoint:
        """A checkpoint that starts here, recording the selection and rules its copies follow."""
        hosts = dict(self._topology.hosts)
        return Checkpoint(identity, recorded=Recorded.of(self.s).to_json(), shard_hosts=hosts, **fields)

    async def _follow_selection(self, client: Client, sink: Sink, cp: Checkpoint) -> None:
        """A run whose selection differs from the one the checkpoint recorded: namespaces it adds are copied
        from the source before the replay (their earlier changes were never replicated), namespaces it
        leaves are no longer followed; both are said. Then the checkpoint records this run's."""
        now = Recorded.of(self.s)
        saved = Recorded.from_json(cp.recorded) if cp.recorded is not None else now
        if saved != now:
            namespaces = await catalog.list_namespaces(client)
            left = narrowed(saved, self.s.selection, namespaces)
            if left:
                self.reporter.warn(
                    f"the selection no longer includes {listing(left, 20)}: not followed from now on (their copies "
                    "on the target stay as they are)"
                )
            added = widened(saved, self.s.selection, namespaces)
            if added:
                self.reporter.info(f"the selection now includes {listing(added, 20)}: copying them from the source")
                copied, at = await self._resyncer(sink)(Resync(data=set(added)))
                if self._window is not None:
                    self._window.copied(copied, at)
        if cp.recorded != now.to_json():
            cp.recorded = now.to_json()
            self.store.save(cp)

    async def _count(self, client: Client, uncounted: Sequence[Namespace]) -> None:
        """Progress totals, alongside the copy: a collection kept whole was not counted when planned
        (a count can be a full scan), so count it here without holding up the copy."""
        for ns in uncounted:
            try:
                count = await client[ns.db][ns.coll or ""].estimated_document_count()
            except PyMongoError:
                return  # only progress: the copy itself retries the source's failures
            self.reporter.snapshot_totals({str(ns): count})
            if self.metrics is not None:
                self.metrics.snapshot_estimate(count)

    def _limits(self) -> CopyLimits:
        s = self.s
        return CopyLimits(s.workers, s.batch_docs, s.batch_bytes, s.queue_batches)

    async def _copy(self, client: Client, sink: Sink, cp: Checkpoint, *, fresh: bool) -> Checkpoint:
        s = self.s
        if cp.snapshot.status == "in_progress":
            if not fresh:  # a resumed run: create what the killed run had not created yet
                specs = [rename_spec(x, s.renamer) for x in await catalog.describe(client, s.selection)]
                unprepared = [t for t in specs if str(t.ns) not in cp.snapshot.prepared]
                await sink.prepare(unprepared, drop_existing=cp.snapshot.drop_target or s.drop_target)
                cp.snapshot.prepared.update(str(t.ns) for t in unprepared)
                self.store.save(cp)
            plan = [Partition.from_json(p) for p in cp.snapshot.plan]
            todo = [p for p in plan if p.id not in cp.snapshot.done]
            resume = {pid: Resume(from_jsonable(value)) for pid, value in cp.snapshot.resume.items()}
            collections, uncounted = _progress_plan(plan, cp.snapshot.done)
            self.reporter.snapshot_begin(collections)  # partitions done before show as done, not as copied now
            if self.metrics is not None:
                before = sum(c.done for c in collections)  # copied by earlier runs
                self.metrics.snapshot_estimate(sum(c.total or 0 for c in collections), copied_before=before)
            counting = asyncio.create_task(self._count(client, uncounted))
            left = Counter(p.ns for p in todo)

            namespaces = {p.ns for p in plan}
            pace = SavePace()

            def save() -> None:
                started = time.monotonic()
                self.store.save(cp)
                pace.saved(time.monotonic() - started)

            async def progress(part: Partition, after: Resume) -> None:
                self._retrier.progress()
                cp.snapshot.resume[part.id] = to_jsonable(after.last_id)
                if pace.due():
                    save()

            async def start(part: Partition) -> None:
                cp.snapshot.resume[part.id] = None  # begun: a retry deletes its range from the target first
                save()  # now, before it writes anything

            async def done(part: Partition, docs: int) -> None:
                self._retrier.progress()
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
            started = time.monotonic()
            try:
                await self._copier(
                    client, sink, todo, limits=self._limits(), rename=s.renamer, on_done=done,
                    reporter=self.reporter, stop=self.stop, resume=resume, on_progress=progress, result=copied,
                    fields=self._fields, on_start=start,
                )  # fmt: skip
            except Exception:
                if pace.owed:  # a resume point the pace held back: the retry goes on from it
                    save()
                raise
            finally:
                counting.cancel()
                self.summary.documents += copied.documents  # a failed attempt's too: they were written
                self.summary.snapshot_s += time.monotonic() - started
            self.reporter.snapshot_end(complete=not self._stopped())
            if self._stopped():
                return cp  # stopped: the partitions not done are copied by the next run
            self.summary.collections = len({p.ns for p in plan})
            cp.snapshot.status = "copied"
            self.store.save(cp)
            self.summary.snapshot = "completed" if self._started_snapshot else "resumed"
        return cp

    async def _replay(
        self, reader: Reader, sink: Sink, cp: Checkpoint, *, snapshot_window: bool, follow: bool = False
    ) -> None:
        """Replay from the checkpoint up to the source's current time (``follow``: until stopped).

        In the snapshot window (changes made while the copy ran), index DDL waits for the index build at
        the end. Into a sink that holds state, DDL the target may be ahead of is settled by copying its
        namespaces again (see ddl_window; the snapshot's window is such a stretch: the copy is newer than
        its events). Into an event sink, a collection renamed into the selection is copied from the
        source (its earlier changes were never replicated), as is, in the window, one renamed within it
        (the snapshot may have listed it under its old name and read nothing)."""
        transform = make_transform(
            self.s.selection, self.s.renamer, skip_index_ddl=snapshot_window, fields=self._fields
        )
        stage = self._stage(sink, transform, snapshot_window=snapshot_window)
        self.reporter.replay_begin()
        started = time.monotonic()
        async with self._verifying(stage, cp, follow=follow):
            try:
                await self._replay_until_done(reader, cp, stage, follow=follow)
            finally:
                self.summary.replay_s += time.monotonic() - started
        self.reporter.replay_end()

    @contextlib.asynccontextmanager
    async def _verifying(self, stage: ReplayStage, cp: Checkpoint, *, follow: bool) -> AsyncIterator[None]:
        """tail --verify: the embedded verifier runs beside the replay (as the stage's observer), from
        its place in the checkpoint."""
        if not (follow and self.s.verify):
            yield
            return
        from .verifier import RECHECK_CAPACITY, EmbeddedVerifier

        target = make_client(self.s.target, timeout_s=self.s.connect_timeout_s, io_timeout_s=self.s.io_timeout_s)
        differ, at_once = None, 1
        if self._spark is not None:  # the ranges hashed as Spark tasks, a few at once
            from .engines.spark.verify import SparkDiffer

            differ = SparkDiffer(replace(self.s, verify_sample=RECHECK_CAPACITY), self._spark)
            at_once = int(self._spark.sparkContext.defaultParallelism)
        verifier = EmbeddedVerifier(
            self.s, self._client, target, cp, self.reporter, metrics=self.metrics, differ=differ, ranges_at_once=at_once
        )
        stage.observer = verifier
        task = asyncio.create_task(verifier.run())
        try:
            yield
        finally:
            await verifier.stop(task)
            stage.observer = None
            await target.close()

    def _stage(self, sink: Sink, transform: Transform, *, snapshot_window: bool) -> ReplayStage:
        """The stages of a replayed batch for this sink (shared by both engines)."""
        resync = self._resyncer(sink)
        if sink.holds_state:
            if self._window is None:
                self._window = DdlWindow(self.s.selection)
            return ReplayStage(sink, transform, client=self._client, window=self._window, resync=resync)

        async def recopy_renamed(events: Sequence[ChangeEvent]) -> None:
            for event in events:
                if event.op is not Op.RENAME or event.to is None:
                    continue
                copy = snapshot_window and self.s.selection(event.to)
                if copy or renamed_into_selection(event, self.s.selection):
                    await resync.copy(event.to)

        return ReplayStage(sink, transform, client=self._client, after_write=recopy_renamed)

    def _resyncer(self, sink: Sink) -> Resyncer:
        return Resyncer(self._client, sink, self.s, self.reporter, fields=self._fields, copied=self._recopied)

    async def _replay_until_done(self, reader: Reader, cp: Checkpoint, stage: ReplayStage, *, follow: bool) -> None:
        """The replay, with a new stream for each change of the shard set while it follows."""
        if self._spark is not None:  # a streaming query over the shards' streams (shards it follows are fixed)
            from .engines.spark.replay import SparkReplay

            spark_replay = SparkReplay(
                self.s, self._spark, self.store, self.reporter, stop=self.stop, metrics=self.metrics
            )
            try:
                self.summary.events += await spark_replay.run(cp, stage, follow=follow)
            finally:
                self.summary.retries += spark_replay.retries
            return
        while True:
            merged = reader if follow and isinstance(reader, MergedReader) and self._topology.discovered else None
            local_stop = asyncio.Event()  # set by the watcher: on the user's stop, or when shards change
            stop = local_stop if merged is not None else self.stop
            watcher = None
            if merged is not None:
                watcher = asyncio.create_task(self._topology.watch(merged, local_stop, self.stop))
            applier = StreamApplier(
                reader, self.store, cp, settings=self.s, reporter=self.reporter, stop=stop, metrics=self.metrics
            )
            try:
                result = await applier.run(stage, to_now=not follow)
            finally:
                if watcher is not None and not watcher.done():
                    watcher.cancel()
            self.summary.events += result.events
            self.summary.retries += applier.retries
            if merged is None or watcher is None or (self.stop is not None and self.stop.is_set()):
                return
            await self._topology.apply(merged, cp, watcher.result())  # then go on with the new set


def _progress_plan(plan: Sequence[Partition], done: set[str]) -> tuple[list[CollectionProgress], list[Namespace]]:
    """What the reporter is told as a copy begins, per collection: its estimated documents (None for one
    kept whole, which is not counted when planned), those of its partitions already done, and whether
    all are. Also the collections to count."""
    collections: dict[Namespace, CollectionProgress] = {}
    uncounted: list[Namespace] = []
    for p in plan:
        c = collections.setdefault(p.ns, CollectionProgress(str(p.ns), total=0, finished=True))
        if p.bracket == ALL and not p.estimated_docs:
            c.total = None
            uncounted.append(p.ns)
        elif c.total is not None:
            c.total += p.estimated_docs
        if p.id in done:
            c.done += p.estimated_docs
        else:
            c.finished = False
    return list(collections.values()), sorted(uncounted, key=str)


async def _capture(reader: Reader) -> tuple[Position, dict[str, Position]]:
    """The stream position(s) now; with shards, the checkpoint's time is the earliest shard's."""
    if isinstance(reader, MergedReader):
        shards = await reader.positions_now()
        times = [p.cluster_time for p in shards.values() if p.cluster_time is not None]
        return Position(cluster_time=min(times) if times else None), shards
    position = await reader.position_now()
    await reader.close()
    return position, {}


async def _open(reader: Reader, cp: Checkpoint) -> None:
    if isinstance(reader, MergedReader):
        await reader.open(cp.shards, cp.position)
    else:
        await reader.open(cp.position)
