"""The way back of a partial migration, on its MongoDB target (the old side): what settings.guard says the
migration did not copy is never deleted, stripped or replaced.

* Document writes (:meth:`Guarded.events`): on a guarded collection every write's filter is its document
  key narrowed to the migration's documents (:meth:`~replicator.settings.guard.TargetGuard.condition`), so a
  document outside the migration's filter is never replaced or deleted; a document written takes the old
  side's values of the excluded fields, in their places. An upsert that meets a document outside the filter
  fails on the ``_id`` index: :meth:`Guarded.clash` stops the run in one line.
* Data DDL (:meth:`Guarded.check_ddl`): a drop, a rename or a dropped database of a collection that holds
  what the migration did not copy is refused, in one line saying what to do.
* A copy made again (a new snapshot, the DDL window's copy, a changed selection): a guarded collection that
  holds what the migration did not copy is not dropped (:meth:`Guarded.merges`); the copy's documents are
  written as above, and once it is done the migration's documents the source no longer has are deleted
  (:meth:`Guarded.cleanup`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from replicator.bsonkit.extjson import dumps_str
from replicator.errors import SinkError
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op, by_namespace
from replicator.settings.fields import KeptFieldConflict
from replicator.settings.guard import TargetGuard
from replicator.sinks.base import SourceLookup
from replicator.sinks.mongo.plan import DUPLICATE_KEY, DuplicateKey, id_bytes
from replicator.source.connection import Client

log = logging.getLogger("mcdc.sink.mongo")

#: ``_id``s read per query
_CHUNK = 1000
#: the document operations that carry the whole document
_WHOLE = frozenset({Op.READ, Op.INSERT, Op.REPLACE, Op.UPDATE})
_AGAIN = "then run the way back again"


def _id(value: Any) -> str:
    try:
        return dumps_str(value, relaxed=True)
    except ValueError:
        return repr(value)


class Guarded:
    """settings.guard's rules on one MongoDB target (see the module's docstring)."""

    def __init__(self, client: Client, guard: TargetGuard) -> None:
        self._client = client
        self.guard = guard

    def __bool__(self) -> bool:
        return bool(self.guard)

    def guards(self, ns: Namespace) -> bool:
        return bool(self.guard) and self.guard.guards(ns)

    async def events(self, batch: Sequence[ChangeEvent]) -> list[ChangeEvent]:
        """The batch with each document event of a guarded collection in its guarded form: its key narrowed
        to the migration's documents, its document holding the old side's excluded fields. A snapshot read
        becomes an insert (an upsert: the old side has the document already), and an update without its
        document is left out where fields are kept (a delta may replace what holds them; the document is
        gone, and its delete follows)."""
        if not any(not e.op.is_ddl and self.guards(e.ns) for e in batch):
            return list(batch)
        olds: dict[Namespace, dict[bytes, Mapping[str, Any]]] = {}
        for ns, events in by_namespace(e for e in batch if not e.op.is_ddl).items():
            if self.guard.kept(ns) is not None:
                ids = [e.document_key["_id"] for e in events if e.op in _WHOLE and e.document is not None]
                olds[ns] = await self._documents(ns, ids)
        out: list[ChangeEvent] = []
        for event in batch:
            if event.op.is_ddl or not self.guards(event.ns):
                out.append(event)
                continue
            guarded = self._event(event, olds.get(event.ns))
            if guarded is not None:
                out.append(guarded)
        return out

    def _event(self, event: ChangeEvent, olds: dict[bytes, Mapping[str, Any]] | None) -> ChangeEvent | None:
        ns, key = event.ns, event.document_key
        editor = self.guard.kept(ns)
        condition = self.guard.condition(ns, key)
        if event.op in _WHOLE and event.document is not None:
            doc = event.document
            if editor is not None:
                old = (olds or {}).get(id_bytes(key))
                try:
                    doc = editor.kept(old, doc) if old is not None else editor.document(doc)
                except KeptFieldConflict as conflict:
                    raise self._no_place(ns, key, conflict.path) from None
            op = Op.INSERT if event.op is Op.READ else event.op
            return dataclasses.replace(event, op=op, key=condition, document=doc)
        if event.op is Op.UPDATE and editor is not None:
            return None
        return dataclasses.replace(event, key=condition)

    async def _documents(self, ns: Namespace, ids: Sequence[Any]) -> dict[bytes, Mapping[str, Any]]:
        coll = self._client[ns.db][ns.coll or ""]
        found: dict[bytes, Mapping[str, Any]] = {}
        for start in range(0, len(ids), _CHUNK):
            async for doc in coll.find({"_id": {"$in": list(ids[start : start + _CHUNK])}}):
                found[id_bytes(doc)] = doc
        return found

    async def kept_in(self, ns: Namespace, docs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Documents about to replace the old side's of the same ``_id``s, with its excluded fields."""
        editor = self.guard.kept(ns) if self.guard else None
        if editor is None or not docs:
            return list(docs)
        olds = await self._documents(ns, [doc["_id"] for doc in docs])
        out = []
        for doc in docs:
            old = olds.get(id_bytes(doc))
            try:
                out.append(editor.kept(old, doc) if old is not None else editor.document(doc))
            except KeptFieldConflict as conflict:
                raise self._no_place(ns, doc, conflict.path) from None
        return out

    def _no_place(self, ns: Namespace, key: Mapping[str, Any], path: str) -> SinkError:
        return SinkError(
            f"target: {ns} _id {_id(key['_id'])}: the new side's document has no place for {path}'s excluded "
            f"fields, which the old side keeps (the migration did not copy them): not written, the way back "
            f"stops; remove them from the old side's document if they are not needed, {_AGAIN}"
        )

    def check_clash(self, ns: Namespace, event: ChangeEvent, error: Mapping[str, Any]) -> None:
        """A write error: a guarded upsert that met, by its ``_id``, an old-side document the migration did not
        copy stops the run (:meth:`clash`)."""
        if error.get("code") == DUPLICATE_KEY and self.guards(ns):
            raise self.clash(ns, event) from None

    def clash(self, ns: Namespace, event: ChangeEvent) -> SinkError:
        """A guarded upsert failed on the ``_id`` index: the old side's document of that ``_id`` is one the
        migration did not copy."""
        return SinkError(
            f"target: {ns} _id {_id(event.document_key['_id'])} on the old side is a document the migration did "
            f"not copy (outside its --filter), and the new side now has a document with that _id: not "
            f"replaced, the way back stops; move the old side's document elsewhere (or delete it, if it is not "
            f"needed), {_AGAIN}"
        )

    async def check_holders(self, ns: Namespace, event: ChangeEvent, dup: DuplicateKey, ids: Iterable[Any]) -> None:
        """Refuse to settle a unique-key conflict by deleting an old-side document the migration did not
        copy (one of ``ids``, the holders found)."""
        where = self.guard.where(ns) if self.guard else None
        if where is None:
            return
        coll = self._client[ns.db][ns.coll or ""]
        mine = event.document_key["_id"]
        found = await coll.find_one({"_id": {"$in": list(ids)}, "$nor": [where]}, {"_id": 1})
        if found is not None and id_bytes(found) == id_bytes({"_id": mine}):
            raise self.clash(ns, event)
        if found is not None:
            raise SinkError(
                f"target: the old side's {ns} _id {_id(found['_id'])}, which the migration did not copy (outside "
                f"its --filter), holds the key the new side's _id {_id(mine)} now takes ({dup.describe()}): not "
                f"deleted, the way back stops; change that key of the old side's document or move the document "
                f"elsewhere, {_AGAIN}"
            )

    async def holds_unmigrated(self, ns: Namespace, *, fields: bool = True) -> bool:
        """Does the old side's ``ns`` hold what the migration did not copy (documents outside its filter, or,
        with ``fields``, the fields it excluded)?"""
        if not self.guard:
            return False
        query = self.guard.unmigrated(ns) if fields else self.guard.outside(ns)
        if query is None:
            return False
        return await self._client[ns.db][ns.coll or ""].find_one(query, {"_id": 1}) is not None

    async def _dropped_by(self, event: ChangeEvent) -> list[Namespace]:
        """The target namespaces a drop, rename or dropped database replaces."""
        if event.op is Op.DROP:
            return [event.ns]
        if event.op is Op.RENAME:
            return [event.ns] + ([event.to] if event.to is not None else [])
        if event.op is Op.DROP_DATABASE:
            names = await self._client[event.ns.db].list_collection_names()
            return [Namespace(event.ns.db, name) for name in names]
        return []

    async def check_ddl(self, event: ChangeEvent) -> None:
        """Refuse a drop, rename or dropped database that would take the old side's namespaces it drops,
        renames or replaces along with what the migration did not copy. A drop takes the excluded fields
        with the migration's documents, as a delete does; a rename would move them to a name the way back
        does not keep them under."""
        for ns in await self._dropped_by(event):
            moved = event.op is Op.RENAME and ns == event.ns
            if not self.guards(ns) or not await self.holds_unmigrated(ns, fields=moved):
                continue
            if moved:
                done, undone = f"renamed {event.ns} to {event.to}", "renamed"
            elif event.op is Op.RENAME:
                done, undone = f"renamed {event.ns} onto {ns}", "replaced"
            else:
                done, undone = f"dropped {'the database of ' if event.op is Op.DROP_DATABASE else ''}{ns}", "dropped"
            what = self.guard.what(ns) if moved else "documents outside its --filter"
            raise SinkError(
                f"target: the new side {done}, but on the old side {ns} holds what the migration did not copy "
                f"({what}): not {undone}, the way back stops; move that data elsewhere (or delete it, if it is "
                f"not needed), {_AGAIN}"
            )

    async def merges(self, ns: Namespace) -> bool:
        """Is a copy of ``ns`` made again a merge (the old side's ``ns`` holds what the migration did not copy,
        so it is not dropped)?"""
        return self.guards(ns) and await self.holds_unmigrated(ns)

    async def merge(
        self, specs: Sequence[CollectionSpec], align: Callable[[CollectionSpec], Awaitable[bool]]
    ) -> list[CollectionSpec]:
        """Of a copy's collections made again, those to drop (returned); the others hold what the migration did
        not copy and are merged: their options made the source's with ``align`` (collMod), else refused."""
        merged = [spec for spec in specs if await self.merges(spec.ns)]
        for spec in merged:
            if not await align(spec):
                raise self.unaligned(spec.ns)
        if merged:
            names = ", ".join(str(spec.ns) for spec in merged)
            log.info("%s: copied again as a merge: what the migration did not copy stays", names)
        return [spec for spec in specs if spec not in merged]

    async def finish(self, specs: Sequence[CollectionSpec], lookup: SourceLookup | None) -> None:
        """After a copy: each guarded collection's cleanup (see :meth:`cleanup`)."""
        for spec in specs:
            if self.guards(spec.ns) and not spec.is_view:
                gone = await self.cleanup(spec.ns, lookup)
                if gone:
                    log.info("%s: deleted %d documents of the migration the source no longer has", spec.ns, gone)

    def unaligned(self, ns: Namespace) -> SinkError:
        """A merged copy of ``ns`` whose options only a new collection could take."""
        return SinkError(
            f"target: the new side's {ns} has options that only a new collection can take, and the old side's "
            f"holds what the migration did not copy ({self.guard.what(ns)}): not dropped, the way back stops; "
            f"move that data elsewhere (or delete it, if it is not needed), {_AGAIN}"
        )

    async def cleanup(self, ns: Namespace, lookup: SourceLookup | None) -> int:
        """After a merged copy of ``ns``: delete the migration's documents (those the guard's filter finds)
        that the source no longer has. Returns how many."""
        if lookup is None:
            raise SinkError(f"target: {ns} was copied again as a merge, and no source is attached to finish it")
        coll = self._client[ns.db][ns.coll or ""]
        where = self.guard.where(ns) or {}
        ids = [doc["_id"] async for doc in coll.find(where, {"_id": 1})]
        deleted = 0
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            there = {id_bytes(doc) for doc in await lookup(ns, chunk)}
            gone = [value for value in chunk if id_bytes({"_id": value}) not in there]
            if gone:
                result = await coll.delete_many(self.guard.condition(ns, {"_id": {"$in": gone}}))
                deleted += result.deleted_count
        return deleted
