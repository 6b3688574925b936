"""Looked-up full documents that belong to another incarnation of their collection's name.

``fullDocument: updateLookup`` reads the document by namespace and ``_id`` when the server builds the
reply, not when the update happened. MongoDB looks it up by name only (unless
``matchCollectionUUIDForUpdateLookup``), so once the collection was renamed away or dropped and a new one
took its name, an update of the old collection carries a document of the new one, with the same ``_id``
and other contents. Applied, it would travel with the rename into the archived copy (log rotation:
``log -> log_13`` then a new ``log``).

Every event names its incarnation (``collectionUUID``, with showExpandedEvents). After a batch is read,
the collections' UUIDs are read from the source: where the name now belongs to another collection (or to
none), the lookup may have read another incarnation, so the update keeps only its delta
(``updateDescription``), which is exact. Where the UUIDs match, the name was not taken over between the
event and now, so the lookup read the event's own collection (at a later time, which later events
reconcile as usual).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from replicator.events import ChangeEvent, Namespace, Op
from replicator.source.connection import DICT_CODEC, Client

#: The UUID of each namespace now, None where it does not exist.
Uuids = Mapping[Namespace, bytes | None]


def looked_up(events: Sequence[ChangeEvent]) -> set[Namespace]:
    """The namespaces of updates carrying a looked-up document and their collection's UUID."""
    return {e.ns for e in events if e.op is Op.UPDATE and e.document is not None and e.uuid is not None}


def keep_own_lookups(events: Sequence[ChangeEvent], uuids: Uuids) -> list[ChangeEvent]:
    """The events, with the looked-up document dropped from each update whose collection name now
    belongs to another collection (``uuids``: from :func:`collection_uuids`, read after the batch)."""
    out = list(events)
    update = Op.UPDATE
    for i, event in enumerate(out):
        if event.op is not update or event.document is None or event.update is None or event.uuid is None:
            continue
        now = uuids.get(event.ns, event.uuid)
        if now != event.uuid:
            out[i] = replace(event, document=None)
    return out


def uuid_of(info: Mapping[str, Any]) -> bytes | None:
    """The UUID in a listCollections entry."""
    value = (info.get("info") or {}).get("uuid")
    if value is None:
        return None
    raw = getattr(value, "bytes", None)
    return bytes(raw if raw is not None else value)


def uuids_from(db: str, names: set[str], infos: Sequence[Mapping[str, Any]]) -> dict[Namespace, bytes | None]:
    """Each of ``names`` of ``db`` with its UUID from listCollections' ``infos`` (None when absent)."""
    found = {str(info["name"]): uuid_of(info) for info in infos}
    return {Namespace(db, name): found.get(name) for name in names}


def by_database(namespaces: Iterable[Namespace]) -> dict[str, set[str]]:
    """The collection names of ``namespaces``, by database: one listCollections each."""
    by_db: dict[str, set[str]] = {}
    for ns in namespaces:
        by_db.setdefault(ns.db, set()).add(ns.coll or "")
    return by_db


async def collection_uuids(client: Client, namespaces: set[Namespace]) -> dict[Namespace, bytes | None]:
    """The UUID of each namespace on the source now (one listCollections per database)."""
    out: dict[Namespace, bytes | None] = {}
    for db, names in by_database(namespaces).items():
        cursor = await client.get_database(db, codec_options=DICT_CODEC).list_collections(
            filter={"name": {"$in": sorted(names)}}
        )
        out.update(uuids_from(db, names, await cursor.to_list()))
    return out


async def own_lookups(client: Client, events: Sequence[ChangeEvent]) -> list[ChangeEvent]:
    """:func:`keep_own_lookups` with the UUIDs read from the source now."""
    namespaces = looked_up(events)
    if not namespaces:
        return list(events)
    return keep_own_lookups(events, await collection_uuids(client, namespaces))
