"""The MongoDB target: idempotent replay of change events, snapshot bulk inserts, and schema.

Every write is idempotent, so re-delivering events after a crash converges to the same state:
inserts and replaces are upserts by documentKey, updates replace with the full document when the stream
looked it up (else apply the delta), deletes delete by documentKey, and DDL tolerates "already done".
The plan (which writes) is :mod:`.plan`'s; this module sends it.

Unique secondary indexes: the fast path reorders writes across documents (see ``coalesce``), and a
looked-up full document or a re-applied event after a crash can hold a key that the target still gives
to another document. On such a conflict the namespace's batch is applied again in source order, and a
write that still collides is settled as the source has it (:mod:`.unique`); the settled documents'
later events in the batch are older than that settlement, so they are skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError, WriteConcernError

from replicator.errors import SinkError, SinkUnavailable
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op, Position, by_namespace
from replicator.settings.guard import TargetGuard
from replicator.settings.selection import Scope
from replicator.settings.uri import redact
from replicator.sinks.base import Sink, SourceLookup
from replicator.sinks.mongo.commands import UnorderedWrites, delete_unordered, insert_unordered, replace_unordered
from replicator.sinks.mongo.concern import concern_failed
from replicator.sinks.mongo.guarded import Guarded
from replicator.sinks.mongo.plan import (
    DOLLAR_PREFIXED,
    DUPLICATE_KEY,
    STALE_DELTA_CODES,
    DuplicateKey,
    Planned,
    coalesce,
    duplicate_key,
    id_bytes,
    literal_ops,
    plan,
    refused,
    segments,
    stale_delta,
)
from replicator.sinks.mongo.schema import MongoSchema
from replicator.sinks.mongo.sharding import TargetSharding, lacking
from replicator.sinks.mongo.ttl import Held, hold_existing
from replicator.sinks.mongo.txn_limits import NO_SUCH_TRANSACTION, refusal, transaction_key
from replicator.sinks.mongo.unique import settle
from replicator.source.connection import ServerInfo, grants, make_client, probe, server_message
from replicator.source.privileges import Grants
from replicator.source.retry import is_retryable

log = logging.getLogger("mcdc.sink.mongo")

#: IllegalOperation: broad; only with this message does it say the deployment has no transactions
_ILLEGAL_OPERATION = 20
_NO_TRANSACTIONS_MESSAGE = "transaction numbers are only allowed on a replica set member or mongos"
#: OperationNotSupportedInTransaction: this transaction's writes cannot run in one (e.g. creating a
#: collection inside a transaction before MongoDB 4.4), others can
_NOT_IN_TRANSACTION = 263
#: how long ending a failed transaction's session may take (the target may be the reason it failed)
_KILL_TIMEOUT_S = 5.0
#: MongoDB 7.0's wire version: time-series collections take deletes by any filter
_DELETES_BY_TIME = 21


class _Conflict(Exception):
    """A write was refused by a unique secondary index (internal: the slow path takes over). ``rest``:
    the writes after it that were not sent."""

    def __init__(self, dup: DuplicateKey, event: ChangeEvent, rest: list[Planned]) -> None:
        self.dup = dup
        self.event = event
        self.rest = rest


def no_transactions(exc: OperationFailure) -> bool:
    """Does this error say the target deployment has no transactions at all (a standalone server)?"""
    return exc.code == _ILLEGAL_OPERATION and _NO_TRANSACTIONS_MESSAGE in str(exc).lower()


def _acknowledged(ns: Namespace, exc: BulkWriteError) -> None:
    """Raise :func:`concern_failed` when the write concern failed, whatever the write errors beside it."""
    concern = exc.details.get("writeConcernErrors")
    if concern:
        raise concern_failed(ns, concern[0]) from None


class MongoSink(Sink):
    """Writes events into a MongoDB deployment."""

    schemes = ("mongodb", "mongodb+srv")
    holds_state = True
    builds_indexes = True
    spreads = "document"

    def __init__(
        self,
        uri: str,
        *,
        timeout_s: float = 10.0,
        scope: Scope | None = None,
        io_timeout_s: float | None = None,
        guard: TargetGuard | None = None,
    ) -> None:
        """``scope``: the target namespaces this run maps its selection to; DDL touches no other.
        ``io_timeout_s``: how long a batch's document writes may wait for the target's answers. ``guard``: a
        way back's, what the target holds that its migration did not copy (see .guarded)."""
        self.uri = uri
        self._io_timeout = io_timeout_s
        self._client = make_client(uri, timeout_s=timeout_s, durable_writes=True, side="target")
        self._guarded = Guarded(self._client, guard or TargetGuard())
        self._schema = MongoSchema(self._client, scope=scope)
        self._transactions = True
        self._aborted: set[Any] = set()  # source transactions the target aborted once (see txn_limits)
        self._lookup: SourceLookup | None = None
        self.server: ServerInfo | None = None
        self._sharding = TargetSharding(self._client, 0)

    async def start(self) -> None:
        self.server = await probe(self._client, self.uri, "target")
        self._transactions = self.server.kind != "standalone"
        self.shards = self.server.kind == "sharded"
        self._sharding = TargetSharding(self._client, self.server.max_wire_version)

    async def close(self) -> None:
        await self._client.close()

    async def user_grants(self) -> Grants | None:
        """What the target's user may do (None: the server does not say; see :func:`grants`)."""
        return await grants(self._client)

    async def existing(self, namespaces: Sequence[Namespace]) -> list[Namespace]:
        found = await asyncio.gather(*(self._schema.has_data(ns) for ns in namespaces))
        return [ns for ns, has in zip(namespaces, found, strict=True) if has]

    async def unfit(self, specs: Sequence[CollectionSpec], *, replacing: bool) -> str | None:
        declared = next((s for s in specs if s.shard is not None and s.shard.declared and s.shard.key), None)
        if not self.shards:
            if declared is None:
                return None
            return (
                f"--shard-target {declared.ns}: target {redact(self.uri)} is not a mongos: only a sharded cluster "
                "shards collections"
            )
        if any(s.shard is not None and s.shard.key for s in specs):
            missing = lacking(await self.user_grants(), specs)
            if missing is not None:
                return missing
        return None if replacing else await self._sharding.unfit(specs)

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:
        """Collections with their options, then (on a mongos) sharded as ``specs`` say, before any copy. A way
        back's collection that holds what its migration did not copy is not dropped: its copy is a merge."""
        if drop_existing and self._guarded:
            specs = await self._guarded.merge(specs, self._schema.align_options)
        await self._schema.prepare(specs, drop_existing=drop_existing)
        if self.shards:
            await self._sharding.shard(specs)

    async def finish_snapshot(self, specs: Sequence[CollectionSpec]) -> None:
        await self._guarded.finish(specs, self._lookup)
        await self._schema.reconcile_indexes(specs)

    async def reconcile(self, spec: CollectionSpec) -> bool:
        return await self._schema.reconcile(spec)

    async def hold_ttls(self, namespaces: Sequence[Namespace], record: Mapping[str, Any] | None) -> None:
        self._schema.held = Held(record)
        if record is None:
            await hold_existing(self._client, namespaces, self._schema.held)

    def held_ttls(self) -> dict[str, dict[str, Any]] | None:
        return self._schema.held.to_json()

    @property
    def deletes_time_ranges(self) -> bool:
        """MongoDB deletes measurements by any filter from 7.0 (wire version 21); 5.1 to 6.x by the meta field
        alone (or all of them), and 5.0 not at all."""
        return self.server is None or self.server.max_wire_version >= _DELETES_BY_TIME

    async def discard(self, ns: Namespace, where: Mapping[str, Any]) -> None:
        if self._schema.scope is not None and not self._schema.scope(ns):  # never ours to delete from
            raise SinkError(f"refusing to delete from {ns}: it is outside the selection's target namespaces")
        if self._guarded.guards(ns):
            return  # a guarded copy upserts, and its cleanup deletes what the source no longer has
        try:
            result = await self._client[ns.db][ns.coll or ""].delete_many(where)
        except OperationFailure as exc:
            if is_retryable(exc):
                raise
            raise SinkError(
                f"{ns}: could not delete what an interrupted copy wrote, to copy it again "
                f"({server_message(exc)}); deleting from a time-series collection takes MongoDB 5.1, and "
                "deleting a time range of one 7.0"
            ) from exc
        if result.deleted_count:
            log.info("%s: deleted %d documents an interrupted copy wrote, to copy them again", ns, result.deleted_count)

    def attach_source(self, lookup: SourceLookup) -> None:
        """Where to re-read documents when a unique-key conflict must be settled as the source has it."""
        self._lookup = lookup

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        """Apply a batch. Each of its writes, documents and schema alike, carries the client's write concern
        (mcdc's journaled majority unless the URI sets its own: make_client), so once this returns the
        batch is as durable as that concern makes it."""
        if self._guarded:
            batch = await self._guarded.events(batch)
        for kind, events in segments(batch):
            if kind == "ddl":  # not bounded: an index build or a rename across databases takes its time
                if self._guarded:
                    await self._guarded.check_ddl(events[0])
                await self._schema.apply(events[0])
            else:
                await self._bounded(self._write_documents(kind, events))

    async def _write_documents(self, kind: str, events: Sequence[ChangeEvent]) -> None:
        if kind == "txn" and self._transactions:
            await self._apply_transaction(events)
        elif events[0].op is Op.READ and all(e.op is Op.READ for e in events):
            await self._insert_snapshot(events)
        else:
            await self._apply(events)

    async def _bounded(self, writes: Coroutine[Any, Any, None]) -> None:
        """Document writes whose answers must come within --io-timeout: a target that took a write and never
        answered (a restarted server, a black-holing network) would otherwise hold the run forever. The
        writes are cancelled and the batch counts as failed: it is retried, idempotently."""
        if self._io_timeout is None:
            await writes
            return
        try:
            await asyncio.wait_for(writes, self._io_timeout)
        except TimeoutError:
            raise SinkUnavailable(
                f"the target did not answer within {self._io_timeout:g} s (--io-timeout); writing the batch again"
            ) from None

    async def _apply(self, events: Sequence[ChangeEvent]) -> None:
        """Apply document events: namespaces in parallel, each namespace's events in order. When one fails, the
        others are cancelled and waited for before its error is raised: none of them may land after the batch's
        retry has written newer events."""
        writes = [asyncio.ensure_future(self._apply_namespace(ns, evs)) for ns, evs in by_namespace(events).items()]
        try:
            await asyncio.gather(*writes)
        except BaseException:
            for write in writes:
                write.cancel()
            await asyncio.gather(*writes, return_exceptions=True)
            raise

    async def _apply_namespace(self, ns: Namespace, events: Sequence[ChangeEvent]) -> None:
        """The fast path: coalesced writes (see :func:`coalesce`), deletes first since they free unique
        keys the replacements may take. A unique-key conflict switches to :meth:`_apply_in_order`."""
        deletes, replaces, sequence = coalesce(events)
        try:
            if deletes:
                await self._unordered(ns, deletes, delete_unordered)
            if replaces:
                await self._unordered(ns, replaces, replace_unordered)
            if sequence:
                await self._ordered(ns, sequence)
        except _Conflict as conflict:
            log.info("%s: %s; applying the batch in source order", ns, conflict.dup.describe())
            await self._apply_in_order(ns, events)

    async def _apply_in_order(self, ns: Namespace, events: Sequence[ChangeEvent]) -> None:
        """Every write in source order; a write that collides on a unique key is settled from the source
        (unique.settle), and the settled documents' remaining writes in the batch are skipped."""
        todo = plan(events)
        settled: set[bytes] = set()
        while todo:
            try:
                await self._ordered(ns, todo)
                return
            except _Conflict as conflict:
                settled |= await settle(
                    self._client, ns, conflict.event, conflict.dup, self._lookup, transactions=self._transactions,
                    guarded=self._guarded,
                )  # fmt: skip
                todo = [p for p in conflict.rest if id_bytes(p[0].document_key) not in settled]

    async def _unordered(self, ns: Namespace, group: list[ChangeEvent], send: UnorderedWrites) -> None:
        """Writes to different documents (deletes, or replacements), in one unordered command."""
        coll = self._client[ns.db][ns.coll or ""]
        try:
            await send(coll, group)
        except BulkWriteError as exc:
            _acknowledged(ns, exc)
            errors = exc.details.get("writeErrors", [])
            retry: list[Planned] = []
            for error in errors:
                event = group[int(error["index"])]
                dup = duplicate_key(error)
                if dup is not None:
                    raise _Conflict(dup, event, []) from None
                self._guarded.check_clash(ns, event, error)
                if error.get("code") != DOLLAR_PREFIXED:
                    raise refused(ns, event, error) from None
                retry.extend((event, op) for op in literal_ops(event))
            await self._ordered(ns, retry)

    async def _ordered(self, ns: Namespace, todo: list[Planned], session: AsyncClientSession | None = None) -> None:
        """One ordered bulk_write, going on past the writes it can settle by itself:

        * a delta update the target's document cannot take is skipped. That happens when the target's
          copy is ahead of the event (it came from a snapshot read or a full-document lookup made later
          than the event): ``$set`` of ``a.b`` on a document whose ``a`` has since become a number. The
          events that made it ahead follow, so skipping converges;
        * a document with ``$``-prefixed top-level fields is written again in a form that carries them
          literally (:func:`literal_ops`).

        A unique-key conflict raises :class:`_Conflict` with the writes after it. Inside a transaction nothing
        is settled: the server aborted it and the error stands."""
        coll = self._client[ns.db][ns.coll or ""]
        ops = list(todo)
        rewritten: set[int] = set()  # events already in their literal form
        start = 0
        while start < len(ops):
            try:
                await coll.bulk_write(
                    [op for _, op in ops[start:]], ordered=True, bypass_document_validation=True, session=session
                )
                return
            except BulkWriteError as exc:
                _acknowledged(ns, exc)
                error = exc.details["writeErrors"][0]
                failed = start + int(error["index"])
                event, op = ops[failed]
                dup = duplicate_key(error)
                if session is not None:
                    raise
                if dup is not None:
                    raise _Conflict(dup, event, ops[failed + 1 :]) from None
                self._guarded.check_clash(ns, event, error)
                if error.get("code") == DOLLAR_PREFIXED and id(event) not in rewritten:
                    rewritten.add(id(event))
                    ops[failed : failed + 1] = [(event, o) for o in literal_ops(event)]
                    start = failed
                    continue
                if not stale_delta(op, error):
                    raise refused(ns, event, error) from None
                log.warning("skipped a delta update on %s the target cannot apply: %s", ns, error.get("errmsg"))
                start = failed + 1

    async def _apply_transaction(self, events: Sequence[ChangeEvent]) -> None:
        """One target transaction for one source transaction. Where the target cannot keep it one unit
        (no transactions, or a unique-key conflict the writes in source order do not avoid), its events
        are applied as plain events: the end state is the same."""
        literal = False
        while True:
            started = time.monotonic()
            try:
                await self._transaction(events, literal=literal)
                self._aborted.discard(transaction_key(events))
                return
            except WriteConcernError as exc:  # the commit's: not written, as any batch's (concern_failed)
                raise concern_failed(events[0].ns, exc.details or {}) from None
            except OperationFailure as exc:
                code = _write_error_code(exc)
                stop = refusal(exc, events, time.monotonic() - started, transaction_key(events) in self._aborted)
                if stop is not None:
                    raise stop from None
                if exc.code == NO_SUCH_TRANSACTION:  # aborted by the target: once may be an election
                    self._aborted.add(transaction_key(events))
                if code == DOLLAR_PREFIXED and not literal:
                    literal = True  # again, with every write in the form that carries $-prefixed fields
                    continue
                if no_transactions(exc):
                    log.warning("target does not support transactions; applying them without one")
                    self._transactions = False
                elif code in (DUPLICATE_KEY, DOLLAR_PREFIXED, _NOT_IN_TRANSACTION) or code in STALE_DELTA_CODES:
                    # a delta the target's newer copy cannot take (events applied again), a unique key
                    # the writes in source order do not free: the end state is the same without the unit
                    log.info("a transaction on %s could not be replayed as one unit (error %s): applying its "
                             "writes one by one", events[0].ns, code)  # fmt: skip
                elif isinstance(exc, BulkWriteError):
                    errors = exc.details.get("writeErrors") or [{}]
                    raise refused(events[0].ns, events[0], errors[0]) from None
                else:
                    raise
                await self._apply(events)
                return

    async def _transaction(self, events: Sequence[ChangeEvent], *, literal: bool) -> None:
        """The writes in one target transaction, committed once. A failure of a statement or of the commit
        goes to the run's retries, logged and counted (the driver's ``with_transaction`` would retry it
        unseen for up to two minutes, past --io-timeout), and its transaction is ended on the server: one
        whose commit was cut off (a closed connection, --io-timeout) stays open, its documents locked
        against the next attempt, until the server reaps it (a minute on mongod)."""
        async with self._client.start_session() as session:
            try:
                async with await session.start_transaction():
                    await self._apply_in_session(events, session, literal=literal)
            except BaseException:
                await self._end_on_server(session)
                raise

    async def _end_on_server(self, session: AsyncClientSession) -> None:
        """killSessions on ``session``, which aborts its transaction (a user may kill its own sessions);
        best effort: a target that cannot answer it now has lost the transaction, or will reap it."""
        try:
            await asyncio.wait_for(self._client.admin.command("killSessions", [session.session_id]), _KILL_TIMEOUT_S)
        except (PyMongoError, TimeoutError) as exc:
            log.debug("could not end a failed transaction's session on the target: %s", exc)

    async def _apply_in_session(
        self, events: Sequence[ChangeEvent], session: AsyncClientSession, *, literal: bool = False
    ) -> None:
        """A transaction's writes, each namespace in order (one session runs one operation at a time);
        ``literal``: every write in the form of :func:`literal_ops`."""
        for ns, evs in by_namespace(events).items():
            todo = [(e, op) for e in evs for op in literal_ops(e)] if literal else plan(evs)
            if todo:
                await self._ordered(ns, todo, session)

    async def write_copy(
        self, ns: Namespace, documents: Sequence[Mapping[str, Any]], at: Position | None, *, last: bool = False
    ) -> None:
        """A snapshot batch, inserted as it is: no event per document."""
        await self._bounded(self._insert_copies(ns, documents))

    async def _insert_snapshot(self, events: Sequence[ChangeEvent]) -> None:
        await self._insert_copies(events[0].ns, [e.document for e in events if e.document is not None])

    async def _insert_copies(self, ns: Namespace, docs: Sequence[Mapping[str, Any]]) -> None:
        """Snapshot copies are plain inserts (fast); a document already there (a partition copied again
        after a crash) is replaced instead, so the target holds the newer copy."""
        if self._guarded.guards(ns):  # upserts narrowed to the migration's documents, with their kept fields
            await self._apply(await self._guarded.events([ChangeEvent(Op.READ, ns, document=d) for d in docs]))
            return
        coll = self._client[ns.db][ns.coll or ""]
        try:
            await insert_unordered(coll, docs)
        except BulkWriteError as exc:
            _acknowledged(ns, exc)
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") != DUPLICATE_KEY for err in errors):
                raise
            retry = [ChangeEvent(Op.READ, ns, document=docs[int(error["index"])]) for error in errors]
            try:
                await self._unordered(ns, retry, replace_unordered)
            except _Conflict:  # a unique index already built (a collection copied after the snapshot)
                await self._apply_in_order(ns, retry)


def _write_error_code(exc: OperationFailure) -> int | None:
    if isinstance(exc, BulkWriteError):
        errors = exc.details.get("writeErrors") or [{}]
        code = errors[0].get("code")
        return int(code) if code is not None else None
    return exc.code
