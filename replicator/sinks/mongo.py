"""The MongoDB target: idempotent replay of change events, snapshot bulk inserts, and schema.

Every write is idempotent, so re-delivering events after a crash converges to the same state:
inserts and replaces are upserts by documentKey, updates replace with the full document when the stream
looked it up (else apply the delta), deletes delete by documentKey, and DDL tolerates "already done".
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import DeleteOne, ReplaceOne, UpdateOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import BulkWriteError, OperationFailure

from ..events import ChangeEvent, CollectionSpec, Namespace, Op
from ..filters import Scope
from ..source.connection import ServerInfo, make_client, probe
from .base import Sink
from .mongo_schema import MongoSchema

log = logging.getLogger("mcdc.sink.mongo")

DUPLICATE_KEY = 11000
# "Transaction numbers are only allowed on a replica set member or mongos" and friends
_NO_TRANSACTIONS = frozenset({20, 263})

WriteOp = ReplaceOne[Any] | UpdateOne | DeleteOne


def write_ops(event: ChangeEvent) -> list[WriteOp]:
    """The idempotent writes that replay one document event."""
    op = event.op
    if op in (Op.READ, Op.INSERT, Op.REPLACE) or (op is Op.UPDATE and event.document is not None):
        if event.document is None:
            return []
        return [ReplaceOne(event.document_key, event.document, upsert=True)]
    if op is Op.UPDATE:
        update = event.update
        if update is None:
            return []
        ops: list[WriteOp] = []
        if update.truncated_arrays:
            push = {field: {"$each": [], "$slice": size} for field, size in update.truncated_arrays}
            ops.append(UpdateOne(event.document_key, {"$push": push}))
        change: dict[str, Any] = {}
        if update.updated_fields:
            change["$set"] = update.updated_fields
        if update.removed_fields:
            change["$unset"] = dict.fromkeys(update.removed_fields, "")
        if change:
            ops.append(UpdateOne(event.document_key, change))
        return ops
    if op is Op.DELETE:
        return [DeleteOne(event.document_key)]
    raise ValueError(f"{op.value} is not a document operation")


def coalesce(events: Sequence[ChangeEvent]) -> tuple[list[WriteOp], list[WriteOp], list[WriteOp]]:
    """One namespace's document events as (deletes, replacements, ordered sequences).

    A document whose events in the batch all carry their full document or delete it ends in the state
    of its last event: one write replaces them all. Those writes touch different documents, so they go
    unordered, one command per kind. A document with a delta update keeps its whole sequence, in order.
    """
    by_key: dict[bytes, list[ChangeEvent]] = {}
    for event in events:
        by_key.setdefault(_key_bytes(event.document_key), []).append(event)
    deletes: list[WriteOp] = []
    replaces: list[WriteOp] = []
    sequences: list[WriteOp] = []
    for evs in by_key.values():
        if all(e.op is Op.DELETE or e.document is not None for e in evs):
            last = evs[-1]
            (deletes if last.op is Op.DELETE else replaces).extend(write_ops(last))
        else:
            sequences.extend(op for e in evs for op in write_ops(e))
    return deletes, replaces, sequences


def _key_bytes(key: Any) -> bytes:
    return bytes(key.raw) if isinstance(key, RawBSONDocument) else bson.encode(key)


def _segments(batch: Sequence[ChangeEvent]) -> list[tuple[str, list[ChangeEvent]]]:
    """Split a batch into runs applied as one unit: plain document events, one transaction, or one DDL."""
    out: list[tuple[str, list[ChangeEvent]]] = []
    for event in batch:
        kind = "ddl" if event.op.is_ddl else ("txn" if event.txn is not None else "plain")
        if out and kind != "ddl" and out[-1][0] == kind and (kind == "plain" or out[-1][1][-1].txn == event.txn):
            out[-1][1].append(event)
        else:
            out.append((kind, [event]))
    return out


class MongoSink(Sink):
    """Writes events into a MongoDB deployment."""

    schemes = ("mongodb", "mongodb+srv")

    def __init__(self, uri: str, *, timeout_s: float = 10.0, scope: Scope | None = None) -> None:
        """``scope``: the target namespaces this run maps its selection to; DDL touches no other."""
        self.uri = uri
        self._client = make_client(uri, timeout_s=timeout_s, durable_writes=True)
        self._schema = MongoSchema(self._client, scope=scope)
        self._transactions = True
        self.server: ServerInfo | None = None

    async def start(self) -> None:
        self.server = await probe(self._client, self.uri, "target")
        self._transactions = self.server.kind != "standalone"

    async def close(self) -> None:
        await self._client.close()

    async def existing(self, namespaces: Sequence[Namespace]) -> list[Namespace]:
        found = await asyncio.gather(*(self._schema.has_data(ns) for ns in namespaces))
        return [ns for ns, has in zip(namespaces, found, strict=True) if has]

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:
        await self._schema.prepare(specs, drop_existing=drop_existing)

    async def finish_snapshot(self, specs: Sequence[CollectionSpec]) -> None:
        await self._schema.reconcile_indexes(specs)

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        for kind, events in _segments(batch):
            if kind == "ddl":
                await self._schema.apply(events[0])
            elif kind == "txn" and self._transactions:
                await self._apply_transaction(events)
            elif events[0].op is Op.READ and all(e.op is Op.READ for e in events):
                await self._insert_snapshot(events)
            else:
                await self._apply(events)

    async def _apply(self, events: Sequence[ChangeEvent], session: AsyncClientSession | None = None) -> None:
        """Apply document events: namespaces in parallel, each namespace's events in order.

        Outside a transaction, a namespace's events are first coalesced per document (see
        :func:`coalesce`), which keeps every document's order but lets the writes of different
        documents go as one command per kind instead of one per run of alternating kinds."""
        by_ns: dict[Namespace, list[ChangeEvent]] = defaultdict(list)
        for event in events:
            by_ns[event.ns].append(event)
        if session is None:
            await asyncio.gather(*(self._apply_namespace(ns, evs) for ns, evs in by_ns.items()))
        else:  # one session cannot run operations concurrently, and a transaction keeps its exact order
            for ns, evs in by_ns.items():
                ops = [op for e in evs for op in write_ops(e)]
                if ops:
                    await self._bulk(ns, ops, session)

    async def _apply_namespace(self, ns: Namespace, events: Sequence[ChangeEvent]) -> None:
        deletes, replaces, sequences = coalesce(events)
        coll = self._client[ns.db][ns.coll or ""]
        # deletes first: they free unique keys the replacements may take
        for ops in (deletes, replaces):
            if ops:
                await coll.bulk_write(ops, ordered=False, bypass_document_validation=True)
        if sequences:
            await self._bulk(ns, sequences, None)

    async def _bulk(self, ns: Namespace, ops: list[WriteOp], session: AsyncClientSession | None) -> None:
        """One ordered bulk_write; a delta update the target's document cannot take is skipped and the
        rest of the batch applied.

        That happens when the target's copy is ahead of the event (it came from a snapshot read or a
        full-document lookup made later than the event): ``$set`` of ``a.b`` on a document whose ``a``
        has since become a number. The events that made it ahead follow, so skipping converges. Inside
        a transaction nothing is skipped: the server aborts it and the error stands."""
        coll = self._client[ns.db][ns.coll or ""]
        start = 0
        while start < len(ops):
            try:
                await coll.bulk_write(ops[start:], ordered=True, bypass_document_validation=True, session=session)
                return
            except BulkWriteError as exc:
                error = exc.details["writeErrors"][0]
                failed = start + int(error["index"])
                if session is not None or not _skippable(ops[failed], error):
                    raise
                log.warning("skipped a delta update on %s the target cannot apply: %s", ns, error.get("errmsg"))
                start = failed + 1

    async def _apply_transaction(self, events: Sequence[ChangeEvent]) -> None:
        try:
            async with self._client.start_session() as session:
                await session.with_transaction(lambda s: self._apply(events, s))
        except OperationFailure as exc:
            if exc.code not in _NO_TRANSACTIONS:
                raise
            log.warning("target does not support transactions; applying them without one")
            self._transactions = False
            await self._apply(events)

    async def _insert_snapshot(self, events: Sequence[ChangeEvent]) -> None:
        """Snapshot copies are plain inserts (fast); a document already there (a partition copied again
        after a crash) is replaced instead, so the target holds the newer copy."""
        ns = events[0].ns
        coll = self._client[ns.db][ns.coll or ""]
        docs = [e.document for e in events]
        try:
            await coll.insert_many(docs, ordered=False, bypass_document_validation=True)  # type: ignore[arg-type]
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") != DUPLICATE_KEY for err in errors):
                raise
            retry = [ReplaceOne({"_id": _id_of(docs[e["index"]])}, docs[e["index"]], upsert=True) for e in errors]
            await coll.bulk_write(retry, ordered=False, bypass_document_validation=True)


#: Errors of a delta update against a document that moved on: PathNotViable, TypeMismatch, BadValue,
#: ConflictingUpdateOperators, and "cannot apply $push to a non-array" (DollarPrefixedFieldName is not one).
_STALE_DELTA_CODES = frozenset({2, 14, 28, 40})


def _skippable(op: WriteOp, error: dict[str, Any]) -> bool:
    return isinstance(op, UpdateOne) and error.get("code") in _STALE_DELTA_CODES


def _id_of(doc: Any) -> Any:
    return doc["_id"] if isinstance(doc, RawBSONDocument) else doc.get("_id")
