"""Settling a unique-key conflict on a MongoDB target as the source has it now.

A write applied in source order can still collide: a looked-up full document, or an event applied again
after a crash, may hold a key the target still gives to another document. The documents involved (the
event's, and each target document holding a key it needs) are read again from the source and written in
one transaction: deletes, then inserts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import BulkWriteError

from replicator.errors import SinkError
from replicator.events import ChangeEvent, Namespace
from replicator.sinks.base import SourceLookup
from replicator.sinks.mongo.guarded import Guarded
from replicator.sinks.mongo.plan import DuplicateKey, duplicate_key, id_bytes
from replicator.source.connection import Client

log = logging.getLogger("mcdc.sink.mongo")

#: rounds of re-reading documents from the source to settle one unique-key conflict
_RESOLVE_ROUNDS = 100


async def settle(
    client: Client,
    ns: Namespace,
    event: ChangeEvent,
    dup: DuplicateKey,
    lookup: SourceLookup | None,
    *,
    transactions: bool,
    guarded: Guarded | None = None,
) -> set[bytes]:
    """Settle ``event``'s conflict ``dup`` on target ``ns`` from the source (``lookup``), in one transaction
    where the target has them. Returns the settled documents' ``_id``s (as :func:`id_bytes`). ``guarded``: a
    way back's guard, which never lets a document its migration did not copy be deleted, nor the fields it
    excluded be lost."""
    if lookup is None:
        raise SinkError(f"replaying into {ns}: {dup.describe()} and no source to settle it from")
    ids: dict[bytes, Any] = {id_bytes(event.document_key): event.document_key["_id"]}
    current = dup
    idle = 0  # rounds in a row that found no new holder (the source changing under the reads)
    for attempt in range(_RESOLVE_ROUNDS):
        holder = await _holder(client, ns, current, list(ids.values()))
        if holder is not None:
            ids[id_bytes(holder)], idle = holder["_id"], 0
        elif (idle := idle + 1) > 3:
            break
        # no older than the event: a secondary that is behind waits until it has applied it
        docs = await lookup(ns, list(ids.values()), after=event.position.cluster_time if event.position else None)
        if guarded:
            await guarded.check_holders(ns, event, current, ids.values())
            docs = await guarded.kept_in(ns, docs)
        try:
            await _replace_documents(client, ns, list(ids.values()), docs, transactions=transactions)
            log.info("%s: settled %s from the source (%d documents, %d rounds)", ns, current.describe(),
                     len(ids), attempt + 1)  # fmt: skip
            return set(ids)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            found = duplicate_key(errors[0]) if errors else None
            if found is None:
                raise
            current = found
    raise SinkError(
        f"replaying into {ns}: {current.describe()}, and reading the documents involved again from the "
        "source did not settle it (is the source changing them right now?)"
    )


async def _holder(client: Client, ns: Namespace, dup: DuplicateKey, exclude: list[Any]) -> Mapping[str, Any] | None:
    """The target document that holds ``dup``'s key, found the way its index compares keys (its
    collation, its partial filter)."""
    coll = client[ns.db][ns.coll or ""]
    spec: Mapping[str, Any] = {}
    async for index in await coll.list_indexes():
        if index.get("name") == dup.index:
            spec = index
    query: dict[str, Any] = {**dup.key_value, "_id": {"$nin": exclude}}
    if spec.get("partialFilterExpression"):
        query = {"$and": [query, spec["partialFilterExpression"]]}
    collation = spec.get("collation")
    return await coll.find_one(query, {"_id": 1}, collation=collation)


async def _replace_documents(
    client: Client, ns: Namespace, ids: list[Any], docs: list[Mapping[str, Any]], *, transactions: bool
) -> None:
    """Delete these ``_id``s and insert the given documents, atomically where the target can."""
    coll = client[ns.db][ns.coll or ""]

    async def swap(session: AsyncClientSession | None) -> None:
        await coll.delete_many({"_id": {"$in": ids}}, session=session)
        if docs:
            await coll.insert_many(docs, ordered=True, bypass_document_validation=True, session=session)  # type: ignore[arg-type]

    if not transactions:
        await swap(None)
        return
    async with client.start_session() as session:
        await session.with_transaction(swap)
