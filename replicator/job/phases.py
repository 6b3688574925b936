"""``mcdc sync``, ``catch-up`` and ``tail``: snapshot (when needed) then change replay up to "now" (tail:
until stopped). The order of phases, the same whichever engine runs them (:mod:`replicator.engines`: the
engine copies partitions and replays the stream; the job keeps the checkpoint and the progress).

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
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from replicator.checkpoint.debezium_offset import DebeziumOffset
from replicator.checkpoint.store import DEPLOYMENT, Checkpoint, CheckpointStore, SnapshotProgress
from replicator.errors import ConfigError, HistoryLost, TopologyError
from replicator.events import Namespace, Position
from replicator.job import handover
from replicator.job.copy import SnapshotCopy, target_specs
from replicator.job.engines import open_engine
from replicator.job.migrations import hold_targets
from replicator.job.preflight import (
    check_source_privileges,
    check_target_privileges,
    refuse_same_server,
    source_name,
    target_keys,
)
from replicator.job.replay import Replay
from replicator.job.startup import check_recorded, check_selection, claim, reach
from replicator.observe.metrics import Metrics
from replicator.observe.progress import Reporter
from replicator.observe.summary import Summary
from replicator.observe.tally import format_ts, listing, plural
from replicator.replay.recorded import Recorded
from replicator.settings.config import Settings, parse_start_at
from replicator.settings.fields import FieldRules
from replicator.settings.selection import Scope
from replicator.settings.stream_match import StreamFilter
from replicator.settings.uri import is_mongo_uri, redact
from replicator.sinks.base import Sink
from replicator.sinks.registry import open_sink
from replicator.snapshot.mode import Checkpointed, Start, copies, decide, drops_target, stopped_at
from replicator.source import catalog
from replicator.source.changestream import refuse_later_start
from replicator.source.connection import Client, ServerInfo, make_client, probe
from replicator.source.lookup import source_lookup
from replicator.source.partitions import plan_specs
from replicator.source.reads import ReadPolicy, check_members
from replicator.source.retry import Retrier, is_retryable
from replicator.source.shards import MergedReader
from replicator.source.topology import Reader, StreamTopology, adopt_filter, capture, latest_time, open_at

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
        self.engine = open_engine(settings, self.store, reporter, stop=stop, metrics=metrics)
        self._resnapshot = False  # a new snapshot is due whatever the checkpoint says (history lost)
        self._started_snapshot = False  # this run planned the snapshot it copies
        self._scope = DEPLOYMENT  # the change stream followed (decided with the source's privileges)
        self._handover: DebeziumOffset | None = None  # --start-after-debezium-offset's, read when the run starts
        self._info: ServerInfo | None = None  # the source, once reached
        self.summary = Summary(
            command=command,
            source=redact(settings.source),
            target=redact(settings.target),
            checkpoint=str(self.store.path),
        )
        self._replay = Replay(
            settings, self.store, self.engine, reporter, self.summary, fields=self._fields, metrics=metrics
        )
        self._copy = SnapshotCopy(
            settings, self.store, reporter, self.engine, retrier=self._retrier, summary=self.summary,
            fields=self._fields, stop=stop, metrics=metrics,
        )  # fmt: skip

    async def run(self) -> Summary:
        started = time.monotonic()
        if self.s.verify and self.command == "tail" and not is_mongo_uri(self.s.target):
            raise ConfigError(f"--verify compares two MongoDB deployments: --target {redact(self.s.target)} is not")
        sink = open_sink(self.s)  # before any connection: a bad target or sink option fails at once
        self._handover = handover.read(self.s)  # and so does an unusable Debezium offset
        try:
            with self.store.locked():
                client = make_client(
                    self.s.source, timeout_s=self.s.connect_timeout_s, io_timeout_s=self.s.io_timeout_s
                )
                try:
                    # the source's checks, retried as a whole: a retryable error in one (an election, a
                    # connection lost) is met as the run's later reads meet it, not as the end of the run
                    reached = await self._reach(lambda: self._check_source(client, sink), "source")
                    if reached is None:  # stopped while waiting for the source
                        self.summary.elapsed_s = round(time.monotonic() - started, 3)
                        self.summary.never_reached = "source"
                        return self.summary
                    ((info, cp, namespaces),) = reached
                    # an event sink's identity needs no I/O: claim before start() opens (or trims) its file
                    claimed = claim(self.store, self.s, info, sink, cp, started=False)
                    sink.attach_source(source_lookup(client, self.s))
                    if await self._reach(sink.start, "target") is None:  # stopped while the target was unreachable
                        self.summary.elapsed_s = round(time.monotonic() - started, 3)
                        self.summary.never_reached = "target"
                        return self.summary
                    await check_target_privileges(sink, self.s, namespaces)
                    await refuse_same_server(client, info, sink, self.s, first_run=cp is None)
                    if not claimed:  # a MongoDB target, known now that start() probed it; nothing written yet
                        claim(self.store, self.s, info, sink, cp, started=True)
                    assert self.store.owner is not None
                    source_id, target_id = self.store.owner
                    hold_targets(self.store, self.s, cp, source=source_id, target=target_id, namespaces=namespaces,
                                 keys=target_keys(sink, self.s))  # fmt: skip
                    # the target's own TTL monitor deletes nothing while the migration writes it (sinks/mongo/ttl.py)
                    mapped = Scope(self.s.selection, self.s.renamer).mapped(namespaces)
                    await sink.hold_ttls(sorted(mapped, key=str), cp.held if cp is not None else None)
                    self.store.held = sink.held_ttls
                    if self.metrics is not None:
                        self.metrics.held = sink.held_ttls
                    # after every check: a mistake costs no JVM start
                    await self.engine.start(replay_only=self._replays_only(cp))
                    await self._run(client, info, sink, cp)
                finally:
                    await client.close()
        finally:
            await sink.close()
            await self.engine.close()
        self.summary.elapsed_s = round(time.monotonic() - started, 3)
        if self.engine.note is not None:
            self.summary.engine_note = f"{self.command} {self.engine.note}"
            self.reporter.info(self.summary.engine_note)
        return self.summary

    def _replays_only(self, cp: Checkpoint | None) -> bool:
        """A catch-up whose checkpoint needs no copy: it replays up to now, and ends."""
        s = self.s
        saved = Checkpointed(cp.snapshot.status, bool(cp.position)) if cp is not None else None
        return self.command == "catch-up" and not copies(
            saved, mode=s.snapshot, snapshot_only=s.snapshot_only, start_at=self._starts_at
        )

    @property
    def _starts_at(self) -> bool:
        """With no checkpoint, the run starts at a given position (--start-at, a Debezium offset)."""
        return self.s.start_at is not None or self.s.start_after_debezium_offset is not None

    async def _check_source(self, client: Client, sink: Sink) -> tuple[ServerInfo, Checkpoint | None, list[Namespace]]:
        """Reach the source and check it before anything is written: its members (--read-preference
        secondary: servable?), the checkpoint's fit, the user's privileges and the selection's namespaces.
        Returns the source, the checkpoint and the source's namespaces."""
        info = await probe(client, self.s.source, "source")
        await check_members(client, ReadPolicy.of(self.s))
        sink.source_name = info.set_name or ""
        cp = self.store.load()
        if cp is not None and cp.cutover is not None:
            reverse = (cp.cutover.get("reverse_checkpoint") or "") if cp.cutover else ""
            raise ConfigError(
                f"checkpoint {self.store.path} was cut over (mcdc cutover): the target is the one written to "
                f"now. Carry its writes back with mcdc tail on the reverse checkpoint {reverse} (source and "
                "target swapped), or pass another --checkpoint to begin a new migration"
            )
        check_recorded(self.s, cp, str(self.store.path))
        self._scope = await check_source_privileges(client, self.s, cp)
        if cp is not None and cp.stream is None:  # saved with its next position
            cp.stream = self._scope
        namespaces = await check_selection(
            client, self.s, self._fields, self.reporter, command=self.command, first_run=cp is None
        )
        return info, cp, namespaces

    async def _reach(self, attempt: Callable[[], Awaitable[T]], what: str) -> tuple[T] | None:
        """``attempt()``'s result once a server answers it (see :func:`.startup.reach`)."""
        return await reach(
            attempt, what, settings=self.s, command=self.command, retrier=self._retrier, reporter=self.reporter,
            summary=self.summary,
        )  # fmt: skip

    async def _run(self, client: Client, info: ServerInfo, sink: Sink, cp: Checkpoint | None) -> None:
        s = self.s
        if not info.has_change_streams and not s.snapshot_only:
            raise TopologyError(
                f"source {redact(s.source)} is a standalone server: it has no change stream, so writes made "
                "during the copy would be lost. Convert it to a one-member replica set, or pass "
                "--snapshot-only to copy anyway"
            )
        identity = source_name(info, s.source)
        self._info = info
        if self.command == "catch-up" and cp is None:  # a cron job's first run: begins as sync would
            self.reporter.info(
                f"no checkpoint at {self.store.path} yet: this first run begins as --snapshot {s.snapshot} says"
            )
        if s.snapshot_only:
            self.reporter.warn("--snapshot-only: writes made to the source during the copy are not replayed")
        # a bounded run stops at the first empty poll: a short await keeps its tail short
        await_ms = 1000 if self.command == "tail" else 200
        if self._scope.database is not None and not s.snapshot_only:
            self.reporter.info(
                f"following the change stream of database {self._scope.database} (the source user may read "
                "only that database)"
            )
        self._topology = StreamTopology(s, self.reporter, client, database=self._scope.database)
        self._replay.bind(client, self._topology)
        reader = await self._topology.reader(info, max_await_ms=await_ms, cp=cp)
        self._reader = reader
        if cp is not None and not s.snapshot_only:
            before = cp.stream_filter
            adopt_filter(self._topology, reader, cp)
            if cp.stream_filter != before:
                self.store.save(cp)  # before any event is read with it
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
                        handover.carry(sink, cp)
                        await self._replay.follow_selection(client, sink, cp, reader)
                        await self._replay.run(reader, sink, cp, snapshot_window=False, follow=self.command == "tail")
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
        if self._stopped():
            saved = Checkpointed(cp.snapshot.status, bool(cp.position)) if cp is not None else None
            self.summary.stopped = stopped_at(saved, follows=self.command == "tail")
        self.summary.documents += self._replay.recopied.documents
        self.summary.snapshot_s += self._replay.recopied.seconds
        self.summary.recopied_documents += self._replay.recopied.documents
        self.summary.recopied_s += self._replay.recopied.seconds
        self.summary.recopied = sorted(self._replay.recopied.recopied)
        self.summary.dropped = sorted(self._replay.recopied.dropped - self._replay.recopied.recopied)
        self.summary.reconciled = sorted(self._replay.recopied.reconciled - self._replay.recopied.recopied)

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
            await self._replay.run(reader, sink, cp, snapshot_window=True)
            if self._stopped():
                return  # the window is not replayed to its end: the next run goes on with it
        specs = await target_specs(client, s, sink)
        if sink.builds_indexes:  # an event sink or a lake has no indexes to build
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
        start = decide(saved, mode=s.snapshot, snapshot_only=s.snapshot_only, start_at=self._starts_at, force=force)
        if start is Start.RESUME:
            self.reporter.info(f"resuming the snapshot recorded in {self.store.path}")
            assert cp is not None
            return await self._copy(client, sink, cp, fresh=False, started=self._started_snapshot)
        if start is Start.START_AT and self._handover is not None:
            assert self._info is not None
            await handover.check(self._handover, client, self._info, shard_streams=isinstance(reader, MergedReader))
            cp = self._new_checkpoint(identity)
            handover.record(cp, self._handover)
            self.store.save(cp)
            self.reporter.info(f"no snapshot: replicating right after the Debezium offset {handover.describe(cp)}")
            return cp
        if start is Start.START_AT:
            assert s.start_at is not None
            at = parse_start_at(s.start_at)
            # of several shards (which share no clock), the latest: later than every one is in the future
            now = await latest_time(reader, client)
            refuse_later_start(s.start_at, at, now, option="--start-at", otherwise="--snapshot never replays from now")
            await self._shard_without_snapshot(client, sink)
            cp = self._new_checkpoint(identity, position=Position(cluster_time=at))
            self.store.save(cp)
            self.reporter.info(f"no snapshot: replicating from --start-at {s.start_at} ({format_ts(at)})")
            return cp
        if start is Start.CHECK_HISTORY:
            assert cp is not None
            try:  # the saved position must still be in the oplog, or the data is copied again
                await open_at(reader, cp)
                await reader.close()
                start = Start.REPLAY
            except HistoryLost as exc:
                self.reporter.warn(f"{exc}; taking a new snapshot (--snapshot when_needed)")
                start = Start.FRESH
        if start is Start.REPLAY:
            if cp is None:
                await self._shard_without_snapshot(client, sink)
                position, shard_positions = await capture(reader)
                cp = self._new_checkpoint(identity, position=position, shards=shard_positions)
                self.store.save(cp)
                self.reporter.info("no snapshot (--snapshot never): replicating from now")
            else:  # said before any change comes: a quiet source would leave a resumed run silent
                resumed = cp.position.cluster_time
                since = f" (its position at {format_ts(resumed)})" if resumed is not None else ""
                self.reporter.info(f"replaying changes from the checkpoint {self.store.path}{since}")
            return cp
        position, shard_positions = Position(), {}
        if not s.snapshot_only:
            position, shard_positions = await capture(reader)
        specs = await catalog.describe(client, s.selection)
        refusal = s.filters.collation_refusal(specs)
        if refusal is not None:
            raise ConfigError(refusal)
        targets = await target_specs(client, s, sink, specs)
        drop = drops_target(saved, drop_target=s.drop_target, force=force)
        busy = await sink.existing([t.ns for t in targets if not t.is_view])
        if busy and not drop:
            raise ConfigError(
                f"the target already holds data in {listing(busy, 5)}: pass --drop-target to replace it with the "
                "source's copy, or leave it out of the selection (--include, --exclude)"
            )
        unfit = await sink.unfit([t for t in targets if not t.is_view], replacing=drop)
        if unfit is not None:
            raise ConfigError(unfit)
        plan = await plan_specs(
            client, specs, s.partition_docs, split=s.split, split_time=sink.deletes_time_ranges,
            read_preference=ReadPolicy.of(s).preference, where=s.filters.where,
        )  # fmt: skip
        cp = self._new_checkpoint(
            identity,
            position=position,
            shards=shard_positions,
            reverse_of=cp.reverse_of if cp is not None else None,  # a way back copied again is still one
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
            kept = [ns for ns in busy if s.guard.guards(ns)]  # a way back's: merged (sinks/mongo/guarded.py)
            if kept:
                self.reporter.info(f"{why}: replacing the migration's documents in {listing(kept, 50)}, keeping "
                                   "what it did not copy")  # fmt: skip
            rest = [ns for ns in busy if ns not in kept]
            if rest:
                self.reporter.info(f"{why}: replacing the target's data in {listing(rest, 50)}")
        await sink.prepare(targets, drop_existing=drop)
        cp.snapshot.prepared = {str(t.ns) for t in targets}
        self.store.save(cp)  # before any copy: a resumed run must not prepare (drop) them again
        return await self._copy(client, sink, cp, fresh=True, started=self._started_snapshot)

    async def _shard_without_snapshot(self, client: Client, sink: Sink) -> None:
        """A new checkpoint that copies nothing (--snapshot never, --start-at): on a sharded target, the
        collections to shard are created and sharded before the first replayed write, as a snapshot shards
        them (one that exists unsharded is refused as a snapshot refuses it)."""
        if not (sink.shards or self.s.shard_target):
            return
        targets = [t for t in await target_specs(client, self.s, sink) if t.shard is not None and t.shard.key]
        unfit = await sink.unfit(targets, replacing=False)
        if unfit is not None:
            raise ConfigError(unfit)
        await sink.prepare(targets, drop_existing=False)

    def _new_checkpoint(self, identity: str, **fields: Any) -> Checkpoint:
        """A checkpoint that starts here, recording the selection and rules its copies follow."""
        hosts = dict(self._topology.hosts)
        recorded = Recorded.of(self.s).to_json()
        cp = Checkpoint(
            identity, recorded=recorded, shard_hosts=hosts, migration_id=uuid.uuid4().hex, stream=self._scope, **fields
        )
        if not self.s.snapshot_only:  # its positions are read with this run's match alone
            cp.stream_filter = StreamFilter(self._topology.stream_filter.match)
            self._topology.use(self._reader, cp.stream_filter)
        return cp
