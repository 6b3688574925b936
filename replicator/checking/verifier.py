"""The embedded verifier of ``mcdc tail --verify``: sweeps that compare the target with the source while
the replay runs, and re-checks that tell a real difference from one the replay has not caught up with.

Each pass compares every selected namespace as ``mcdc verify`` does (kind, options, indexes; documents
by the same ``_id`` ranges, hashed on both sides; a time-series collection's count), one range at a time
(``--engine spark``: a few ranges at once, as Spark tasks). What differs goes onto the re-check list
(recheck.py), where it is read again on the source, then on the target once the replay has passed
that read: only a difference seen with no change of it applied in between is a mismatch. When a pass
and its re-checks are over, the next pass begins (at most one each ``--verify-interval``).

Its place (the pass, the namespace, the ranges compared, the re-check list) is kept in the checkpoint
(``Checkpoint.verifier``, saved with the replay's position), so a restarted tail goes on with the
current pass. Memory holds one range's digests and the re-check list (at most RECHECK_CAPACITY entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo.read_concern import ReadConcern

from replicator.checking.recheck import COUNT, DOC, MISMATCH, RESOLVED, SCHEMA, Entry, RecheckList, ReplayClock
from replicator.checking.sweep_state import SweepState
from replicator.checking.verify import (
    DOCUMENT_KINDS,
    DocumentDiff,
    RangeDiffer,
    diff_partition,
    digest,
    edited,
    id_json,
    namespace_differences,
)
from replicator.checkpoint.store import Checkpoint
from replicator.events import ChangeEvent, CollectionSpec, Namespace
from replicator.observe.metrics import Metrics
from replicator.observe.migration import COMMIT_LAG_S, Verification
from replicator.observe.progress import Reporter, lag_seconds
from replicator.observe.tally import Throttle, duration, plural
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.filters import filtered
from replicator.settings.selection import rename_spec, target_databases
from replicator.source import catalog
from replicator.source.changestream import current_time
from replicator.source.connection import RAW_CODEC, Client
from replicator.source.partitions import Partition, plan_collection, with_catch_all
from replicator.source.reads import ReadPolicy, SourceReads
from replicator.source.retry import is_retryable
from replicator.source.sharding import with_shard_keys

log = logging.getLogger("mcdc.verify")

#: differences waiting for their re-check, at most (about 200 bytes each)
RECHECK_CAPACITY = 10_000
#: entries read per re-check round
_ROUND = 500
#: how long the verifier waits when it has nothing to do, or after a server did not answer
_IDLE_S = 0.2
_RETRY_S = 2.0
#: mismatch lines logged per pass (all are counted, and listed in /progress)
_LOGGED = 10
#: the replay counts as busy this long after a batch with events; while it is, the verifier sleeps _GIVE
#: times as long as it worked
_BUSY_S = 1.0
_GIVE = 3.0
#: a replay further behind the source than this (the lag canCommit allows) is catching up: the verifier
#: waits for it instead of sharing the servers with it (what it would compare is about to change anyway)
_BEHIND_S = COMMIT_LAG_S
#: clean passes in a row are logged at most this often
_CLEAN_LINES_S = 60.0
#: first mismatches shown in /progress
_SHOWN = 5


class EmbeddedVerifier:
    """Construct with the run's settings, the source and target clients and the checkpoint the replay
    moves; give it to the replay's stage as its observer (see replay_stage.Observer), and ``await run()``
    beside the replay (cancel it to stop). ``differ``: how a few ranges are compared at once (``--engine
    spark``: as Spark tasks; default: here, one at a time)."""

    def __init__(
        self,
        settings: Settings,
        source: Client,
        target: Client,
        cp: Checkpoint,
        reporter: Reporter,
        *,
        metrics: Metrics | None = None,
        differ: RangeDiffer | None = None,
        ranges_at_once: int = 1,
    ) -> None:
        self.s = settings
        self.source = source
        self.target = target
        self.cp = cp
        self.reporter = reporter
        self.metrics = metrics
        self.clock = ReplayClock()
        self.state = SweepState.from_json(cp.verifier)
        self.rechecks = RecheckList(RECHECK_CAPACITY)
        self.rechecks.load(self.state.recheck)
        self._differ = differ
        self._at_once = max(1, ranges_at_once)
        self._fields = FieldRules(settings.field_exclude, settings.field_rename)
        # the sweep's source reads (--read-preference, --max-read-rate); its re-checks read the primary,
        # after the replay passed them, so a lagging secondary can only send a document to be re-checked
        policy = ReadPolicy.of(settings)
        self._reads = SourceReads.start(policy)
        self._todo: list[Namespace] | None = None  # this pass's namespaces not compared yet
        self._logged = 0
        self._quiet = Throttle(_CLEAN_LINES_S)
        self._stopping = False
        self._busy_until = self._paced_at = 0.0
        self._behind = False
        self._heard = False  # has the replay acknowledged anything yet (a batch, or an empty poll)?
        self.phase = "scanning"
        self._publish()

    async def stop(self, task: asyncio.Task[None]) -> None:
        """End ``run()`` (its task): cancelled, and told to stop, since a cancellation that reaches the
        driver mid-request can come back as a network error, which run() would otherwise retry."""
        self._stopping = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # --- the replay's observer (replay_stage.Observer) ---

    def seen(self, events: Sequence[ChangeEvent]) -> None:
        self.rechecks.seen(events)
        if events:
            self._busy_until = time.monotonic() + _BUSY_S
            last = events[-1].position
            lag = lag_seconds(last.cluster_time if last is not None else None)
            self._behind = lag is not None and lag > _BEHIND_S

    async def _pace(self) -> None:
        """Give way to a busy replay: while events flow, the verifier works at most a 1 / (1 + _GIVE)
        share of the time (it shares the event loop, and the servers' CPUs); while the replay is catching up
        (more than _BEHIND_S behind the source), it waits until the replay has caught up or gone idle. It
        begins once the replay has acknowledged its first batch or empty poll: a tail started on a backlog
        first shows it is behind, and the verifier's first reads do not delay the replay's first batch."""
        while (not self._heard or (self._behind and time.monotonic() < self._busy_until)) and not self._stopping:
            await asyncio.sleep(_IDLE_S)
        now = time.monotonic()
        if now < self._busy_until:
            await asyncio.sleep(min(_GIVE * (now - self._paced_at), 1.0))
        self._paced_at = time.monotonic()

    def recopied(self, namespaces: Iterable[Namespace]) -> None:
        for ns in namespaces:
            self.rechecks.namespace_changed(ns)

    def acked(self, applied: Timestamp | None, *, idle_since: float | None = None) -> None:
        self.clock.acked(applied, idle_since=idle_since)
        self._heard = True

    # --- the loop ---

    async def run(self) -> None:
        """Sweep and re-check until :meth:`stop`. A server that does not answer is waited for (the replay
        reports the outage); any other failure stops the verifier, not the replay, and is said once."""
        try:
            while not self._stopping:
                try:
                    await self._step()
                except Exception as exc:
                    if self._stopping:  # a cancellation the driver turned into an error
                        return
                    if not is_retryable(exc):
                        raise
                    log.debug("verify: waiting for the servers: %s", exc)
                    await asyncio.sleep(_RETRY_S)
        except Exception as exc:
            self.phase = "failed"
            self._publish()
            self.reporter.warn(f"verify stopped: {exc}; the replay goes on, and canCommit stays false")

    async def _step(self) -> None:
        """One unit of work: a re-check round, then the next range or namespace of the pass (while the
        re-check list has room), or the end of the pass once its re-checks are over; sleeps briefly when
        there was nothing to do."""
        await self._pace()
        did = await self._recheck_round()
        if self.state.pass_started_at is None:
            wait = self._next_pass_in()
            if wait > 0:
                self._set_phase("idle")
                await asyncio.sleep(min(wait, 1.0) if not did else 0)
                return
            self.state.pass_started_at = time.time()
            self.state.pass_from = await current_time(self.source)
        if self.rechecks.room and await self._sweep_step():
            self._set_phase("scanning")
            self._save()
            return
        if self.rechecks.room and not len(self.rechecks):  # all compared, all re-checked
            self._pass_done()
            return
        self._set_phase("rechecking")  # (a full list holds the sweep back until it has room again)
        if did:
            self._save()
        else:
            await asyncio.sleep(_IDLE_S)

    def _set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self._publish()

    def _next_pass_in(self) -> float:
        last = self.state.last_pass_at
        return 0.0 if last is None else last + self.s.verify_interval_s - time.time()

    # --- sweeps ---

    async def _sweep_step(self) -> bool:
        """Compare the next ranges of the namespace being compared, or the next namespace, or (last) look
        for namespaces only on the target. False when the pass has nothing left to compare."""
        s = self.state
        if s.current is not None:
            await self._ranges()
            return True
        if self._todo is None:
            names = sorted(await catalog.list_namespaces(self.source, self.s.selection), key=str)
            self._todo = [ns for ns in names if self.s.selection(ns) and str(ns) not in s.done]
        if self._todo:
            await self._namespace(self._todo.pop(0))
            return True
        if not s.extra_checked:
            await self._extra_namespaces()
            s.extra_checked = True
            return True
        return False

    async def _namespace(self, src: Namespace) -> None:
        spec = await catalog.describe_one(self.source, src)
        if spec is None:  # dropped since it was listed: its drop reaches the target through the replay
            self.state.done.append(str(src))
            return
        want = rename_spec(spec, self.s.renamer)
        found = await _target_spec(self.target, want.ns)
        if namespace_differences(src, want, found):
            self._add(Entry(src, want.ns, SCHEMA))
        if found is not None and found.kind == want.kind == "collection":
            coll = self._reads.collection(self.source, src)
            plan = with_catch_all(await plan_collection(coll, src, self.s.partition_docs, split=self.s.split))
            where = self.s.filters.where(src)  # --filter: the source's side of each range is its matches
            plan = [replace(part, where=where) for part in plan] if where is not None else plan
            self.state.current = str(src)
            self.state.plan = [p.to_json() for p in plan]
            self.state.parts_done = 0
            return
        if found is not None and found.kind == want.kind == "timeseries":
            on_source = await self._count(self.source, src, self.s.filters.where(src))
            if on_source != await self._count(self.target, want.ns):
                self._add(Entry(src, want.ns, COUNT))
        self.state.done.append(str(src))

    async def _ranges(self) -> None:
        s = self.state
        plan = [Partition.from_json(p) for p in s.plan]
        parts = plan[s.parts_done : s.parts_done + self._at_once]
        if not parts:
            s.done.append(str(s.current))
            s.current, s.plan, s.parts_done = None, [], 0
            return
        src = parts[0].ns
        dst = self.s.renamer(src)
        room = self.rechecks.room
        diffs = await self._diff(parts, dst, room)
        for diff in diffs:
            for kind in DOCUMENT_KINDS:
                for key in diff.ids[kind]:
                    self._add(Entry(src, dst, DOC, key))
                s.unchecked += diff.counts[kind] - len(diff.ids[kind])  # more than the list could take
            s.scanned += diff.source_docs
            s.total_scanned += diff.source_docs
        s.parts_done += len(parts)

    async def _diff(self, parts: Sequence[Partition], dst: Namespace, room: int) -> list[DocumentDiff]:
        self._reads.since = self.state.pass_from  # no source read older than the pass's start
        if self._differ is not None:
            return await self._differ(parts, dst, self._reads)
        return [
            await diff_partition(
                self.s, self.source, self.target, p, dst, self._fields, sample=room, pace=self._pace, reads=self._reads
            )
            for p in parts
        ]

    async def _extra_namespaces(self) -> None:
        """Target namespaces the selection maps to that the source does not have."""
        inverse = self.s.renamer.inverse()
        for spec in await catalog.describe(self.target, target_databases(self.s.selection, self.s.renamer)):
            origin = inverse(spec.ns)
            if self.s.renamer(origin) != spec.ns or not self.s.selection(origin):
                continue
            if await catalog.describe_one(self.source, origin) is None:
                self._add(Entry(origin, spec.ns, SCHEMA))

    def _add(self, entry: Entry) -> None:
        if not self.rechecks.add(entry):
            self.state.unchecked += 1

    # --- re-checks ---

    async def _recheck_round(self) -> bool:
        """Read on the source what waits for its first read, then on the target what the replay has
        passed. True when anything was read."""
        entries, now = list(self.rechecks), time.monotonic()
        unread = [e for e in entries if e.ready(now)][:_ROUND]
        for entry in unread:
            entry.reading()
        values = []
        for entry in unread:
            values.append(await self._read(self.source, entry, entry.src))
            await self._pace()
        if unread:
            at, ended = await current_time(self.source), time.monotonic()
            for entry, value in zip(unread, values, strict=True):
                entry.read_source(value, at, ended)
        due = [e for e in entries if e.due(self.clock)][:_ROUND]
        for entry in due:
            value = await self._read(self.target, entry, entry.dst)
            await self._pace()
            verdict = entry.verdict(self._same(entry, value), time.monotonic())
            if verdict == RESOLVED:
                self.rechecks.remove(entry)
            elif verdict == MISMATCH:
                self.rechecks.remove(entry)
                self._mismatch(entry, value)
        return bool(unread or due)

    async def _read(self, client: Client, entry: Entry, ns: Namespace) -> Any:
        """What the re-check compares: a document's digest, a namespace's spec (as named on the target),
        or a time-series collection's count. None when absent."""
        if entry.kind == DOC:
            assert entry.key is not None
            coll = client.get_database(ns.db, codec_options=RAW_CODEC, read_concern=ReadConcern("majority"))
            key: Mapping[str, Any] = RawBSONDocument(entry.key, codec_options=RAW_CODEC)
            if client is self.source:  # --filter: a document that does not match is not the target's to hold
                key = filtered(key, self.s.filters.where(entry.src))
            doc = await coll[ns.coll or ""].find_one(key)
            if doc is None:
                return None
            editor = self._fields.for_namespace(entry.src) if client is self.source else None
            return digest(edited([doc], editor)[0])
        if entry.kind == COUNT:
            where = self.s.filters.where(entry.src) if client is self.source else None
            return await self._count(client, ns, where)
        if client is not self.source:
            return await _target_spec(client, ns)
        spec = await catalog.describe_one(client, ns)
        return rename_spec(spec, self.s.renamer) if spec is not None else None

    def _same(self, entry: Entry, target: Any) -> bool:
        if entry.kind == SCHEMA:
            want: CollectionSpec | None = entry.source
            return not namespace_differences(entry.src, want, target)
        return bool(entry.source == target)

    async def _count(self, client: Client, ns: Namespace, where: Mapping[str, Any] | None = None) -> int:
        return int(await client[ns.db][ns.coll or ""].count_documents(where or {}))

    def _mismatch(self, entry: Entry, target: Any) -> None:
        detail = ""
        if entry.kind == SCHEMA:
            found = namespace_differences(entry.src, entry.source, target)
            detail = "; ".join(d.detail for d in found)
        elif entry.kind == COUNT:
            detail = f"{entry.source} documents on the source, {target} on the target"
        elif entry.source is None:
            detail = "only on the target"
        elif target is None:
            detail = "missing on the target"
        else:
            detail = "differs"
        if not self.state.found.add(entry, detail) or self.state.last.has(entry):
            return  # said already: in this pass, or found in the last one too
        if self._logged < _LOGGED:
            self._logged += 1
            what = f" _id {id_json(entry.key)}" if entry.key is not None else ""
            self.reporter.warn(f"verify: {entry.dst}{what} {detail} (confirmed by a re-check)")

    # --- passes, state and counts ---

    def _pass_done(self) -> None:
        s = self.state
        started = s.pass_started_at or time.time()
        scanned, found = s.scanned, s.found.count + s.unchecked
        was_clean = s.clean_passes > 0
        clean = s.pass_completed(time.time())
        self._todo, self._logged = None, 0
        # a line per pass, but a run of clean passes (back to back with --verify-interval 0) says so
        # once a minute at most
        if not (clean and was_clean) or self._quiet():
            self.reporter.info(
                f"verify: pass {s.passes} done in {duration(time.time() - started, precise=True)}: "
                f"{plural(scanned, 'document')} compared, " + ("no mismatch" if clean else f"{found:,} mismatched")
            )
        self._save()

    def _save(self) -> None:
        self.state.recheck = self.rechecks.to_json()
        self.cp.verifier = self.state.to_json()  # saved with the replay's next checkpoint
        self._publish()

    def verification(self) -> Verification:
        return self.state.verification(self.phase, len(self.rechecks), shown=_SHOWN)

    def _publish(self) -> None:
        if self.metrics is not None:
            self.metrics.verification = self.verification()


async def _target_spec(client: Client, ns: Namespace) -> CollectionSpec | None:
    """A target namespace as its catalog has it, with its shard key on a mongos (see with_shard_keys)."""
    spec = await catalog.describe_one(client, ns)
    return None if spec is None else (await with_shard_keys(client, [spec]))[0]
