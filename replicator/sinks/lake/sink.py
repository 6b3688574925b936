"""Lakehouse tables as a target: ``--target delta:PATH`` and ``--target iceberg:PATH``.

Each target collection has a state table and a change table (layout and columns: :mod:`.tables`).

* A snapshot's documents are appended to both (op ``r``) when this run made or emptied the tables; a
  partition copied again (a retry) appends them twice, so :meth:`LakeSink.finish_snapshot` keeps one row
  per document (one commit per table). A resumed copy may meet rows that another run wrote, perhaps one
  that no finish_snapshot follows (an older checkpoint restored): its rows replace those of their keys.
* A replay batch is cut at each DDL event. Between two, each collection's events make one commit per
  table: the change rows appended, and the documents' end states merged into the state table (by ``_id``:
  set, or deleted). Each commit records how far its events go in each stream (their positions, which order
  every event: :mod:`replicator.events.positions`), and the events at or before a table's mark are not written
  to it again: a batch applied twice (a retry, a kill, an older checkpoint), or cut anywhere (at a DDL
  event inside a transaction, between two shards' events of one cluster time), adds nothing twice and
  loses nothing.
* Events the DDL window holds back from the state tables (their namespace waits to be copied again) still
  reach the change tables (:meth:`LakeSink.history`): a change table keeps every event once, in order.
* DDL: drop and dropDatabase empty the state tables (their change tables keep the history); rename moves
  the rows (the new name's table is written before the old one is emptied, so a kill in between loses
  nothing); create makes the tables; index and option changes are rows of the change table only.

The sink keeps state (``holds_state``): DDL that may be older than what a table holds is settled as for a
MongoDB target, by copying the namespace again (:mod:`replicator.replay.ddl_window`). Nothing outside the
selection's target namespaces is ever written.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from replicator.errors import ConfigError, SinkError, SinkUnavailable
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op, by_namespace
from replicator.events.positions import Mark, advanced, stamp_of
from replicator.settings.config import Settings
from replicator.settings.selection import Scope
from replicator.settings.uri import redact
from replicator.sinks.base import Sink
from replicator.sinks.lake import typed
from replicator.sinks.lake.backend import duplicates, key_column, unreachable
from replicator.sinks.lake.fold import fold, needs_base
from replicator.sinks.lake.formats import open_backend
from replicator.sinks.lake.tables import SCHEMAS, TableRef, change_table, snapshot_tables, state_table

log = logging.getLogger("mcdc.sinks.lake")

T = TypeVar("T")
_DOCUMENT_OPS = frozenset({Op.READ, Op.INSERT, Op.UPDATE, Op.REPLACE, Op.DELETE})


def _streams(events: Iterable[ChangeEvent]) -> set[str]:
    """The streams (shards) whose marks tell whether these events are in a table already."""
    return {(e.position.shard or "") for e in events if e.position is not None}


class LakeSink(Sink):
    """Writes each collection's changes into a change table and its latest state into a state table."""

    schemes = ("delta", "iceberg")
    holds_state = True
    spreads = "namespace"  # a table's commits carry the position they cover: one writer per table

    def __init__(self, uri: str, settings: Settings) -> None:
        self.backend = open_backend(uri, settings.lake_opts)
        self.scope = Scope(settings.selection, settings.renamer)
        self._locks: dict[TableRef, asyncio.Lock] = {}
        self.commits = 0
        self._compact_every = settings.lake_compact_every
        self._since_compaction: dict[TableRef, int] = {}
        self._staging = False
        self._staged: list[tuple[TableRef, Any]] = []
        self._typed = settings.lake_columns == "typed"
        self._spark = settings.engine == "spark"
        self._kinds: dict[TableRef, typed.Kinds] = {}
        self._on_executor = False  # a Spark task: it writes the lossless columns only
        self._executor_appends = False  # a Spark task's copy may append (its driver made or emptied the table)
        self._untyped: set[TableRef] = set()  # state tables given rows without their typed columns
        #: namespaces whose tables this process made or emptied for a copy: its rows are appended there (a
        #: row written twice is dropped by finish_snapshot); elsewhere they replace rows of the same keys
        self._emptied: set[Namespace] = set()

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        """A backend call in a thread; the table library's failures as one line: retried when another try may
        succeed (a commit that lost a race, storage that did not answer), else they stop the run."""
        try:
            return await asyncio.to_thread(call, *args)
        except (ConfigError, SinkError):
            raise
        except Exception as exc:
            retry = True if isinstance(exc, OSError) else self.backend.retryable(exc)
            if retry is None:
                raise
            reason = unreachable(exc)  # the store or catalog did not answer: said as an outage is
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            said = f" is unreachable: {reason}" if reason is not None else f": {first[:300]}"
            message = redact(self.backend.label + said)
            raise (SinkUnavailable(message) if retry else SinkError(message)) from exc

    def _lock(self, ref: TableRef) -> asyncio.Lock:
        return self._locks.setdefault(ref, asyncio.Lock())

    async def start(self) -> None:
        await self._run(self.backend.check_writable)

    async def existing(self, namespaces: Sequence[Namespace]) -> list[Namespace]:
        found = []
        for ns in namespaces:
            rows = await self._run(self.backend.read, TableRef("state", ns), ["_id"])
            if rows.num_rows:
                found.append(ns)
        return found

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:
        for spec in specs:
            if spec.is_view:
                continue
            new = await self._run(self.backend.create, TableRef("state", spec.ns))
            await self._run(self.backend.create, TableRef("changes", spec.ns))
            if drop_existing:
                await self._replace(TableRef("state", spec.ns), SCHEMAS["state"].empty_table(), None)
            if new or drop_existing:
                self._emptied.add(spec.ns)

    async def finish_snapshot(self, specs: Sequence[CollectionSpec]) -> None:
        """Rows a copy wrote twice (a partition copied again after a kill) are kept once; state tables that
        Spark tasks filled get their typed columns (the ``_id_key``, and under --lake-columns typed each
        field's)."""
        for spec in specs:
            if not spec.is_view:
                for kind in ("state", "changes"):
                    await self._dedupe(TableRef(kind, spec.ns))
                if self._spark or TableRef("state", spec.ns) in self._untyped:
                    await self._type_whole(TableRef("state", spec.ns))

    async def _type_whole(self, ref: TableRef) -> None:
        """Every row's typed columns made again from its ``bson``, in one commit (Spark tasks wrote none)."""
        async with self._lock(ref):
            if not await self._run(self.backend.exists, ref):
                return
            rows = await self._run(self.backend.read, ref, SCHEMAS["state"].names)
            known = await self._run(self.backend.schema, ref)
            kinds, _ = typed.learn(typed.kinds_of(known) if known is not None else {},
                                   (typed.decode_top(raw) for raw in rows["bson"].to_pylist()),
                                   fields=self._typed)  # fmt: skip
            await self._retype(ref, rows, kinds)
            self._untyped.discard(ref)

    async def _retype(self, ref: TableRef, rows: pa.Table, kinds: typed.Kinds) -> None:
        """The table's ``rows`` (all of them) written again with the typed columns of ``kinds``, their types
        changed where they differ, at the mark the table has. Called with ``ref``'s lock held."""
        await self._commit(self.backend.replace, ref, typed.with_columns(rows, kinds), None, new_schema=True)
        self._kinds[ref] = kinds

    async def reconcile(self, spec: CollectionSpec) -> bool:
        """Lake tables have no indexes or collection options to match."""
        return True

    @property
    def deletes_time_ranges(self) -> bool:
        return False

    async def discard(self, ns: Namespace, where: Mapping[str, Any]) -> None:
        """Only whole collections are copied again from scratch here (``deletes_time_ranges`` is False)."""
        if where:
            raise SinkError(f"{ns}: a lake table cannot delete a partition's range, only the whole collection")
        await self._replace(TableRef("state", ns), SCHEMAS["state"].empty_table(), None)

    async def _dedupe(self, ref: TableRef) -> None:
        async with self._lock(ref):
            column = key_column(ref)
            light = await self._run(
                self.backend.read, ref, [column] if ref.kind == "state" else [column, "op", "sequence"]
            )
            _, keys, _ = duplicates(ref, light)
            if not keys:
                return
            rows = await self._run(self.backend.read, ref, SCHEMAS[ref.kind].names, (column, keys))
            _, keys, keep = duplicates(ref, rows)
            await self._run(self.backend.rewrite, ref, column, keys, keep, ref.kind == "changes")
            log.info("%s: %d documents a copy wrote twice are kept once", ref, len(keys))

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        if batch and all(e.op is Op.READ for e in batch):
            await self._copied(batch)
            return
        await self._in_order(batch, state=True)

    async def history(self, events: Sequence[ChangeEvent]) -> None:
        """Events held back from the state tables (their namespace waits to be copied again): their rows
        go into the change tables all the same, DDL included, once each."""
        await self._in_order(events, state=False)

    async def _in_order(self, events: Sequence[ChangeEvent], *, state: bool) -> None:
        """Events cut at each DDL event: the document events between two make one commit per table."""
        run: list[ChangeEvent] = []
        for event in events:
            if event.op.is_ddl:
                await self._documents(run, state=state)
                run = []
                await (self._ddl(event) if state else self._ddl_rows(event))
            elif event.op in _DOCUMENT_OPS:
                run.append(event)
        await self._documents(run, state=state)

    def copies_append(self, ns: Namespace) -> bool:
        return ns in self._emptied

    def stage(self, *, appends: bool = True) -> bool:
        """On a Spark executor: data files are written for the driver to commit (a local lake), or else rows
        committed here, by key where the driver did not make or empty the table (``appends`` False); typed
        columns are left to the driver (tasks would each see other types), once the snapshot is done."""
        self._on_executor = True
        self._staging = self.backend.stages
        self._executor_appends = appends
        return self._staging

    def staged(self) -> list[Any]:
        return list(self._staged)

    async def flush(self) -> None:
        if self._staging:
            self._staged += await self._run(self.backend.finish_files)

    async def commit_staged(self, staged: Sequence[Any]) -> None:
        """The data files a Spark task wrote for one partition: one commit per table."""
        by_ref: dict[TableRef, list[Any]] = {}
        for ref, written in staged:
            by_ref.setdefault(ref, []).append(written)
        for ref, files in by_ref.items():
            if ref.ns in self._emptied:
                async with self._lock(ref):
                    await self._commit(self.backend.commit_files, ref, files)
                if ref.kind == "state":
                    self._untyped.add(ref)
            else:  # a resumed copy: the files' rows replace those of the same keys, the files are not kept
                rows = await self._run(self.backend.read_files, ref, files)
                await self._copy_rows(ref, rows, appends=False)
                await self._run(self.backend.remove_files, ref, files)

    async def _copied(self, batch: Sequence[ChangeEvent]) -> None:
        """Snapshot reads: appended to both tables of their collection (on a Spark executor that stages, only
        written as data files, for the driver to commit)."""
        for ns, events in by_namespace(batch).items():
            state_rows, change_rows = snapshot_tables(ns, events)
            rows = {TableRef("changes", ns): change_rows, TableRef("state", ns): state_rows}
            if self._staging:
                for ref, table in rows.items():
                    async with self._lock(ref):
                        await self._run(self.backend.write_files, ref, table)
                continue
            appends = ns in self._emptied or self._executor_appends  # else a resumed copy: they may be there
            await asyncio.gather(*(self._copy_rows(ref, table, appends=appends) for ref, table in rows.items()))

    async def _copy_rows(self, ref: TableRef, rows: pa.Table, *, appends: bool) -> None:
        """Snapshot rows into one table: appended, or (``appends`` False: a resumed copy, the table may hold
        them) replacing the rows of their keys (a change table's snapshot rows) in one commit, so no
        finish_snapshot is needed to drop twins. A state table's typed columns are made under the same lock
        as the commit, so no other writer changes their types in between (except on an executor, which
        leaves them to the driver)."""
        async with self._lock(ref):
            if ref.kind == "state" and not self._on_executor:
                rows = await self._state_rows(ref, rows)
            if appends:
                await self._commit(self.backend.append, ref, rows, None)
                return
            column = key_column(ref)
            keys = [str(key) for key in rows[column].to_pylist()]
            await self._commit(self.backend.rewrite, ref, column, keys, rows, ref.kind == "changes")

    async def _documents(self, events: Sequence[ChangeEvent], *, state: bool = True) -> None:
        await asyncio.gather(*(self._namespace(ns, evs, state=state) for ns, evs in by_namespace(events).items()))

    async def _namespace(self, ns: Namespace, events: Sequence[ChangeEvent], *, state: bool) -> None:
        writes = [self._changes(TableRef("changes", ns), events)]
        if state:
            writes.append(self._state(TableRef("state", ns), events))
        await asyncio.gather(*writes)

    async def _mark(self, ref: TableRef, events: Iterable[ChangeEvent]) -> Mark:
        return await self._run(self.backend.mark, ref, _streams(events))

    async def _changes(self, ref: TableRef, events: Sequence[ChangeEvent]) -> None:
        async with self._lock(ref):
            covered = await self._mark(ref, events)
            new = [e for e in events if e.position is not None and not covered.covers(e)]
            if new:
                await self._commit(self.backend.append, ref, change_table(new), advanced(new))

    async def _state(self, ref: TableRef, events: Sequence[ChangeEvent]) -> None:
        async with self._lock(ref):
            covered = await self._mark(ref, events)
            new = [e for e in events if not covered.covers(e)]
            if not new:
                return
            wanted = needs_base(new)
            base: dict[str, bytes] = {}
            if wanted:
                rows = await self._run(self.backend.read, ref, ["_id", "bson"], ("_id", sorted(wanted)))
                base = dict(zip(rows["_id"].to_pylist(), rows["bson"].to_pylist(), strict=True))
            folded = fold(new, base)
            if not folded.rows:
                return  # nothing to write (events applied again come back to nothing again)
            rows = await self._state_rows(ref, state_table(folded.upserts()))
            await self._commit(self.backend.merge_state, ref, rows, folded.deletes(), advanced(new))

    async def _state_rows(self, ref: TableRef, rows: pa.Table) -> pa.Table:
        """State rows as the table takes them: with typed columns (the ``_id_key``, and under --lake-columns
        typed each field's; a column that became mixed is first written again as Extended JSON for every
        row, and so is a table that had rows before it had an ``_id_key``). Called with ``ref``'s lock held."""
        if ref not in self._kinds:
            schema = await self._run(self.backend.schema, ref)
            self._kinds[ref] = typed.kinds_of(schema) if schema is not None else {}
        documents = [typed.decode_top(raw) for raw in rows["bson"].to_pylist()]
        known = self._kinds[ref]
        kinds, became_json = typed.learn(known, documents, fields=self._typed)
        # a table an older mcdc filled, without the _id's column: its rows get theirs too
        unkeyed = typed.KEY not in known and (await self._run(self.backend.read, ref, ["_id"])).num_rows > 0
        if became_json or unkeyed:
            await self._retype(ref, await self._run(self.backend.read, ref, SCHEMAS["state"].names), kinds)
        if became_json:
            log.info("%s: column %s holds mixed types: now Extended JSON", ref, ", ".join(sorted(became_json)))
        self._kinds[ref] = kinds
        return typed.with_columns(rows, kinds, documents)

    async def _replace(self, ref: TableRef, rows: pa.Table, mark: Mark | None) -> None:
        async with self._lock(ref):
            await self._commit(self.backend.replace, ref, rows, mark)

    async def _commit(self, call: Callable[..., None], ref: TableRef, *args: Any, **kwargs: Any) -> None:
        """One commit to ``ref`` (its lock held); every ``--lake-compact-every`` commits, a compaction."""
        await self._run(functools.partial(call, **kwargs), ref, *args)
        self.commits += 1
        since = self._since_compaction[ref] = self._since_compaction.get(ref, 0) + 1
        if self._compact_every and since >= self._compact_every:
            removed = await self._run(self.backend.compact, ref)
            self._since_compaction[ref] = 0
            log.info("%s: compacted (%d small files rewritten)", ref, removed)

    async def _ddl(self, event: ChangeEvent) -> None:
        outside = self.scope.outside(event)
        if outside is not None:
            log.warning("not replaying %s: %s is outside the selection's target namespaces", event.op.value, outside)
            return
        if event.op is Op.DROP_DATABASE:
            for ns in await self._dropped_with(event):
                await self._ddl_row(ns, event)
                await self._empty(TableRef("state", ns), event)
            return
        if event.op is Op.CREATE:
            if (event.ddl or {}).get("viewOn") is not None:
                return  # a view holds no documents: no tables
            for kind in ("state", "changes"):
                await self._run(self.backend.create, TableRef(kind, event.ns))
        await self._ddl_row(event.ns, event)
        if event.op is Op.DROP:
            await self._empty(TableRef("state", event.ns), event)
        elif event.op is Op.RENAME and event.to is not None:
            source, target = TableRef("state", event.ns), TableRef("state", event.to)
            await self._run(self.backend.create, TableRef("changes", event.to))
            async with self._lock(target):
                if not (await self._mark(target, [event])).covers(event):
                    rows = await self._run(self.backend.read, source, SCHEMAS["state"].names)
                    rows = await self._state_rows(target, rows)
                    await self._commit(self.backend.replace, target, rows, stamp_of(event), new_schema=True)
            await self._empty(source, event)

    async def _dropped_with(self, event: ChangeEvent) -> list[Namespace]:
        """The target collections a dropDatabase event drops: those of its database that it maps to."""
        names = [ref.ns.coll or "" for ref in await self._run(self.backend.tables)
                 if ref.kind == "state" and ref.ns.db == event.ns.db]  # fmt: skip
        return self.scope.database_drops((event.origin or event.ns).db, event.ns.db, sorted(set(names)))

    async def _ddl_rows(self, event: ChangeEvent) -> None:
        """A DDL event held back from the state tables, as rows of the change tables it concerns."""
        if self.scope.outside(event) is not None:
            return
        for ns in await self._dropped_with(event) if event.op is Op.DROP_DATABASE else [event.ns]:
            await self._ddl_row(ns, event)

    async def _ddl_row(self, ns: Namespace, event: ChangeEvent) -> None:
        """The DDL event as a row of the collection's change table, where the collection has tables (a view
        has none; a resync's own drop is no source event)."""
        ref = TableRef("changes", ns)
        if ns.coll is None or event.position is None or not await self._run(self.backend.exists, ref):
            return
        await self._changes(ref, [event])

    async def _empty(self, ref: TableRef, event: ChangeEvent) -> None:
        """A drop's (or a rename's source's) state table emptied, unless it holds the event already."""
        async with self._lock(ref):
            if not await self._run(self.backend.exists, ref):
                return
            if not (await self._mark(ref, [event])).covers(event):
                await self._commit(self.backend.replace, ref, SCHEMAS["state"].empty_table(), stamp_of(event))
