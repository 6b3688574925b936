"""Raw change-stream documents -> :class:`ChangeEvent`; the only reader of raw change documents.

Documents (fullDocument, documentKey, updatedFields) are passed through as the raw BSON the server sent.
A change document that arrives as raw bytes (a RawBSONDocument) has its top level decoded in one C call
with sub-documents left as bytes (:func:`~replicator.bsonkit.rawbson.top_level`): each document the event keeps
becomes a RawDocument of its own bytes, never decoded here.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping
from datetime import UTC, datetime
from typing import Any

import bson

from replicator.bsonkit import rawbson
from replicator.errors import UnknownChange, quoted
from replicator.events import ChangeEvent, Namespace, Op, Position, Transaction, UpdateDescription
from replicator.events.model import UpdateParts

#: One table maps change-stream operation types to ops.
OPERATION_TYPES: dict[str, Op] = {
    "insert": Op.INSERT,
    "update": Op.UPDATE,
    "replace": Op.REPLACE,
    "delete": Op.DELETE,
    "create": Op.CREATE,
    "drop": Op.DROP,
    "dropDatabase": Op.DROP_DATABASE,
    "rename": Op.RENAME,
    "createIndexes": Op.CREATE_INDEXES,
    "dropIndexes": Op.DROP_INDEXES,
    "modify": Op.MODIFY,
    "invalidate": Op.INVALIDATE,
}

#: Events that change no document and no collection mcdc copies: sharding internals and Atlas Search
#: index definitions, never replayed.
IGNORED_TYPES = frozenset(
    {
        "shardCollection", "reshardCollection", "refineCollectionShardKey", "migrateLastChunkFromShard",
        "createSearchIndexes", "dropSearchIndexes", "updateSearchIndex",
    }
)  # fmt: skip
#: Fields of a change event that carry documents: an event type mcdc does not know that has one changes data.
_DOCUMENT_FIELDS = ("documentKey", "fullDocument", "updateDescription")
log = logging.getLogger("mcdc.source")
_warned: set[str] = set()


def normalize_change(
    raw: Mapping[str, Any], rs: str | None = None, index: int | None = None, shard: str | None = None
) -> ChangeEvent | None:
    """Turn one change-stream document into a ChangeEvent, or None for events mcdc does not replay.

    ``rs`` names the replica set (shard) the stream reads, for sinks that report it. ``index`` and
    ``shard`` go into the event's position (see :mod:`replicator.events.positions`): its place among its stream's
    events at its cluster time, and the stream's name (None for a replica set's one stream)."""
    data = getattr(raw, "raw", None)
    if type(data) is bytes and (top := rawbson.top_level(data)) is not None:
        return from_top_level(top, rs, index, shard)
    return _from_mapping(raw, rs, index, shard)


def _op(op_type: str, fields: Container[str]) -> Op | None:
    """The op of an operationType; None for one mcdc does not replay.

    MongoDB adds operation types over time. One that changes documents (it carries a documentKey, a
    fullDocument or an updateDescription) cannot be skipped without the target silently going wrong, so
    it stops the run with one line: the checkpoint stays before it, and a newer mcdc goes on from there.
    Any other (a namespace or index event of a new kind) is skipped with a warning naming it, once."""
    op = OPERATION_TYPES.get(op_type)
    if op is not None or op_type in IGNORED_TYPES:
        return op
    if any(name in fields for name in _DOCUMENT_FIELDS):
        raise UnknownChange(
            f"the change stream reported a document change of operationType {quoted(op_type)}, which this mcdc "
            "cannot apply; the checkpoint stays before it: upgrade mcdc and run again"
        )
    if op_type not in _warned:
        _warned.add(op_type)
        log.warning("skipping change events of operationType %r, unknown to mcdc (they hold no document)", op_type)
    return None


def from_top_level(
    top: dict[str, Any], rs: str | None = None, index: int | None = None, shard: str | None = None
) -> ChangeEvent | None:
    """:func:`normalize_change` of a change document's top-level fields as :func:`rawbson.top_level` gives
    them (sub-documents as Spans)."""
    op = OPERATION_TYPES.get(top["operationType"]) or _op(top["operationType"], top)
    if op is None:
        return None
    get = top.get
    doc = rawbson.document
    ns_span = get("ns")
    ns = _namespace_of(ns_span.start) if ns_span is not None else Namespace("")
    update = None
    if op is Op.UPDATE and (desc := get("updateDescription")) is not None:
        update = _RawUpdate(desc.start)
    ddl = doc(get("operationDescription"))
    to = None
    if op is Op.RENAME:
        to_doc: Mapping[str, Any] | None = rawbson.decoded(to_span) if (to_span := get("to")) is not None else None
        if to_doc is None and ddl is not None:
            to_doc = ddl.get("to")
        if to_doc is not None:
            to = Namespace(to_doc["db"], to_doc["coll"])
    txn = None
    wrap = rawbson.wrap
    lsid, number = get("lsid"), get("txnNumber")
    if lsid is not None and number is not None:
        txn = Transaction(wrap(lsid.start), int(number))
    wall, uuid = get("wallTime"), get("collectionUUID")
    key, document = get("documentKey"), get("fullDocument")  # (wrapped inline: every event)
    # positional, in ChangeEvent's field order: a keyword call of 13 fields costs more, once per event
    return ChangeEvent(
        op,
        ns,
        None if key is None else wrap(key.start),
        None if document is None else wrap(document.start),
        update,
        ddl,
        to,
        Position(doc(top["_id"]), get("clusterTime"), index, shard),
        int(wall) if wall is not None else None,
        txn,
        doc(get("fullDocumentBeforeChange")),
        rs,
        None,  # origin
        None if uuid is None else _uuid(uuid),
    )


def _uuid(value: Any) -> bytes | None:
    """A collectionUUID's 16 bytes (a Binary of subtype 4, or a uuid.UUID where a codec decoded it)."""
    if value is None:
        return None
    raw = getattr(value, "bytes", None)  # uuid.UUID
    return bytes(raw if raw is not None else value)


class _RawUpdate(UpdateDescription):
    """An updateDescription kept as its bytes until a stage reads a part (then decoded once)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:  # the parent's parts are set on first use
        self._raw = raw
        self._parts = None

    def parts(self) -> UpdateParts:
        parts = self._parts
        if parts is None:
            parts = self._parts = _update_parts(rawbson.top_level(self._raw) or {})
        return parts


def _update_parts(desc: dict[str, Any]) -> UpdateParts:
    """An updateDescription's fields as top_level gives them: updatedFields kept as its bytes, the
    documents of truncatedArrays decoded."""
    truncated = desc.get("truncatedArrays")
    return (
        rawbson.document(desc.get("updatedFields")) or {},
        tuple(desc.get("removedFields") or ()),
        tuple((t["field"], int(t["newSize"])) for t in map(rawbson.decoded, truncated)) if truncated else (),
    )


def _update_description(desc: Mapping[str, Any]) -> UpdateDescription:
    return UpdateDescription(
        updated_fields=desc.get("updatedFields") or {},
        removed_fields=tuple(desc.get("removedFields") or ()),
        truncated_arrays=tuple((t["field"], int(t["newSize"])) for t in (desc.get("truncatedArrays") or ())),
    )


def _from_mapping(
    raw: Mapping[str, Any], rs: str | None, index: int | None = None, shard: str | None = None
) -> ChangeEvent | None:
    # one pass over the field names: a missing field then costs a set lookup, not the KeyError a
    # RawBSONDocument's Mapping.get raises and catches (most events lack half of the optional fields)
    present = set(raw)

    def get(name: str) -> Any:
        return raw[name] if name in present else None

    op = _op(raw["operationType"], present)
    if op is None:
        return None
    ns_doc = get("ns")
    ns = _namespace(ns_doc) if ns_doc is not None else Namespace("")
    update = None
    if op is Op.UPDATE:
        desc = get("updateDescription")
        if desc is not None:
            update = _update_description(desc)
    ddl = get("operationDescription")
    to = None
    if op is Op.RENAME:
        to_doc = get("to") or (ddl or {}).get("to")
        if to_doc is not None:
            to = Namespace(to_doc["db"], to_doc["coll"])
    txn = None
    txn_number, lsid = get("txnNumber"), get("lsid")
    if txn_number is not None and lsid is not None:
        txn = Transaction(lsid, int(txn_number))
    return ChangeEvent(
        op=op,
        ns=ns,
        key=get("documentKey"),
        document=get("fullDocument"),
        update=update,
        ddl=ddl,
        to=to,
        position=Position(raw["_id"], get("clusterTime"), index, shard),
        wall_time_ms=_millis(get("wallTime")),
        txn=txn,
        before=get("fullDocumentBeforeChange"),
        rs=rs,
        uuid=_uuid(get("collectionUUID")),
    )


_NAMESPACES: dict[bytes, Namespace] = {}


def _namespace(ns_doc: Mapping[str, Any]) -> Namespace:
    """The event's namespace; the few distinct ``ns`` documents are decoded once (keyed by their bytes)."""
    raw = getattr(ns_doc, "raw", None)
    if raw is None:
        return Namespace(ns_doc["db"], ns_doc.get("coll"))
    return _namespace_of(bytes(raw))


def _namespace_of(raw: bytes) -> Namespace:
    ns = _NAMESPACES.get(raw)
    if ns is None:
        if len(_NAMESPACES) >= 10_000:
            _NAMESPACES.clear()
        ns_doc = bson.decode(raw, rawbson.DICT_CODEC)  # a few distinct ones: decoded once each
        ns = _NAMESPACES[raw] = Namespace(ns_doc["db"], ns_doc.get("coll"))
    return ns


def snapshot_read(ns: Namespace, document: Mapping[str, Any], at: Position | None = None) -> ChangeEvent:
    """A document copied by the snapshot, as a READ event; ``at``: the snapshot's read time
    (:func:`replicator.events.positions.snapshot_position`), where its rows sit in the stream's order."""
    return ChangeEvent(op=Op.READ, ns=ns, document=document, position=at)


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:  # pymongo decodes BSON dates as naive UTC
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp() * 1000)
    return int(value)  # DatetimeMS
