"""The replay phases of a job: a batch's stage for the run's sink (the DDL window and the copies made
again, or renames into the selection for an event sink), the embedded verifier beside it (tail --verify),
and the copies a widened selection needs before the replay. The engine runs the replay itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.engines.base import Engine
from replicator.errors import ConfigError
from replicator.events import ChangeEvent, Namespace, Op
from replicator.job.migrations import guard_writes, own
from replicator.observe.metrics import Metrics
from replicator.observe.progress import Reporter
from replicator.observe.summary import Summary
from replicator.observe.tally import format_ts, listing
from replicator.replay.ddl_window import DdlWindow, Resync
from replicator.replay.recorded import Recorded, narrowed, widened
from replicator.replay.resync import Copied, Resyncer
from replicator.replay.stage import ReplayStage, Transform
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.selection import Scope, make_transform, renamed_into_selection
from replicator.settings.stream_match import change_match
from replicator.sinks.base import Sink
from replicator.source import catalog
from replicator.source.connection import Client, make_client
from replicator.source.topology import Reader, StreamTopology, latest_time


class Replay:
    """A job's replays, from the snapshot's window to the end of the run: one DDL window kept across them,
    and the namespaces they copied again (:attr:`recopied`, for the summary)."""

    def __init__(
        self,
        settings: Settings,
        store: CheckpointStore,
        engine: Engine,
        reporter: Reporter,
        summary: Summary,
        *,
        fields: FieldRules,
        metrics: Metrics | None = None,
    ) -> None:
        self.s = settings
        self._store = store
        self._engine = engine
        self._reporter = reporter
        self._summary = summary
        self._fields = fields
        self._metrics = metrics
        self._window: DdlWindow | None = None  # the replay's DDL window, kept across its phases
        self.recopied = Copied()  # what namespaces copied again during the replay wrote

    def bind(self, client: Client, topology: StreamTopology) -> None:
        """The run's source client and streams, once they are open."""
        self._client = client
        self._topology = topology

    async def follow_selection(self, client: Client, sink: Sink, cp: Checkpoint, reader: Reader) -> None:
        """A run whose selection differs from the one the checkpoint recorded: namespaces it adds are copied
        from the source before the replay (their earlier changes were never replicated), namespaces it
        leaves are no longer followed; both are said. Then the checkpoint records this run's, and its
        change stream's match with it: read with the recorded one up to the source's time before any copy,
        with this run's after it (settings/stream_match.py), so that what the old match left out of the
        stream is what the copies bring.

        A namespace added whose target holds data this migration did not write is refused, as a first
        snapshot refuses it (``--drop-target`` replaces it)."""
        now = Recorded.of(self.s)
        saved = Recorded.from_json(cp.recorded) if cp.recorded is not None else now
        wanted = change_match(self.s.selection)
        moves = cp.stream_filter is not None and cp.stream_filter.match != wanted
        switch_at = await latest_time(reader, client) if moves else None  # before any copy begins
        if saved != now:
            namespaces = await catalog.list_namespaces(client)
            left = narrowed(saved, self.s.selection, namespaces)
            if left:
                self._reporter.warn(
                    f"the selection no longer includes {listing(left, 20)}: not followed from now on (their copies "
                    "on the target stay as they are)"
                )
                cp.owned |= {str(self.s.renamer(ns)) for ns in left}  # renames never change on a checkpoint
            added = widened(saved, self.s.selection, namespaces)
            if added:
                targets = [self.s.renamer(ns) for ns in added]
                await self._refuse_foreign(sink, cp, targets)
                self._reporter.info(f"the selection now includes {listing(added, 20)}: copying them from the source")
                # before the first write: a copy killed halfway, or undone by an older checkpoint restored, is
                # this migration's own (the registry remembers what an older checkpoint does not)
                own(self._store, targets)
                cp.owned |= set(map(str, targets))
                self._store.save(cp)
                copied, at = await self._resyncer(sink)(Resync(data=set(added)))
                if self._window is not None:
                    self._window.copied(copied, at)
        if cp.stream_filter is not None and switch_at is not None:
            cp.stream_filter = cp.stream_filter.toward(wanted, switch_at)
            self._topology.use(reader, cp.stream_filter)
            self._reporter.info(
                f"the change stream's filter follows the selection from {format_ts(switch_at)} on (the stream "
                "before it is read with the checkpoint's)"
            )
        if cp.recorded != now.to_json() or switch_at is not None:
            cp.recorded = now.to_json()
            scope = Scope(self.s.selection, self.s.renamer)
            cp.owned = {ns for ns in cp.owned if not scope(Namespace.parse(ns))}  # followed again: no longer outside
            self._store.save(cp)

    async def _refuse_foreign(self, sink: Sink, cp: Checkpoint, targets: Sequence[Namespace]) -> None:
        """Refuse to copy over data in these target namespaces (a widened selection's) that this migration
        never wrote."""
        if self.s.drop_target:
            return
        ours = cp.owned | own(self._store, ())
        busy = await sink.existing([ns for ns in targets if str(ns) not in ours])
        if busy:
            raise ConfigError(
                f"the target already holds data in {listing([str(ns) for ns in busy], 5)}, which this run's "
                f"selection adds to checkpoint {self._store.path}'s: pass --drop-target to replace it with the "
                "source's copy, or leave it out of the selection"
            )

    async def run(
        self, reader: Reader, sink: Sink, cp: Checkpoint, *, snapshot_window: bool, follow: bool = False
    ) -> None:
        """Replay from the checkpoint up to the source's current time (``follow``: until stopped).

        In the snapshot window (changes made while the copy ran), index DDL waits for the index build at
        the end. Into a sink that holds state, DDL the target may be ahead of is settled by copying its
        namespaces again (see ddl_window; the snapshot's window is such a stretch: the copy is newer than
        its events). Into an event sink, a collection renamed into the selection is copied from the
        source (its earlier changes were never replicated), as is, in the window, one renamed within it
        (the snapshot may have listed it under its old name and read nothing, or read a new collection
        made under that name since): a drop of its new name first, so the copy replaces what the rename's
        record moved there."""
        transform = make_transform(
            self.s.selection,
            self.s.renamer,
            skip_index_ddl=snapshot_window,
            fields=self._fields,
            filters=self.s.filters or None,
        )
        transform = guard_writes(self._store, transform)  # nothing onto another migration's namespace
        stage = self._stage(sink, transform, snapshot_window=snapshot_window)
        self._reporter.replay_begin()
        started = time.monotonic()
        async with self._verifying(stage, cp, follow=follow):
            try:
                await self._engine.replay(reader, self._topology, cp, stage, self._summary, follow=follow)
            finally:
                self._summary.replay_s += time.monotonic() - started
        self._reporter.replay_end()

    @contextlib.asynccontextmanager
    async def _verifying(self, stage: ReplayStage, cp: Checkpoint, *, follow: bool) -> AsyncIterator[None]:
        """tail --verify: the embedded verifier runs beside the replay (as the stage's observer), from
        its place in the checkpoint."""
        if not (follow and self.s.verify):
            yield
            return
        from replicator.checking.verifier import RECHECK_CAPACITY, EmbeddedVerifier

        target = make_client(
            self.s.target, timeout_s=self.s.connect_timeout_s, io_timeout_s=self.s.io_timeout_s, side="target"
        )
        differ, at_once = await self._engine.differ(replace(self.s, verify_sample=RECHECK_CAPACITY))
        verifier = EmbeddedVerifier(
            self.s,
            self._client,
            target,
            cp,
            self._reporter,
            metrics=self._metrics,
            differ=differ,
            ranges_at_once=at_once,
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
        apply = self._engine.apply_with(sink)
        if sink.holds_state:
            if self._window is None:
                filters = self.s.filters
                renamed = (lambda ns: filters.where(ns) is not None) if filters else None
                self._window = DdlWindow(self.s.selection, copy_renamed=renamed)
            return ReplayStage(sink, transform, client=self._client, window=self._window, resync=resync, apply=apply)

        async def recopy_renamed(events: Sequence[ChangeEvent]) -> None:
            for event in events:
                if event.op is not Op.RENAME or event.to is None:
                    continue
                copy = snapshot_window and self.s.selection(event.to)
                if copy and self.s.selection(event.ns):
                    # the snapshot read the old name's partitions by name, maybe after a new collection took
                    # it: what the rename's record moved may be that one's documents. The copy replaces it.
                    await sink.write([ChangeEvent(Op.DROP, self.s.renamer(event.to), origin=event.to)])
                if copy or renamed_into_selection(event, self.s.selection):
                    await resync.copy(event.to)

        return ReplayStage(sink, transform, client=self._client, after_write=recopy_renamed, apply=apply)

    def _resyncer(self, sink: Sink) -> Resyncer:
        return Resyncer(self._client, sink, self.s, self._reporter, fields=self._fields, copied=self.recopied)
