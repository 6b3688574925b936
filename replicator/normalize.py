"""Raw change-stream documents -> :class:`ChangeEvent`; the only reader of raw change documents.

Documents (fullDocument, documentKey, updatedFields) are passed through as the raw BSON the server sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .events import ChangeEvent, Namespace, Op, Position, Transaction, UpdateDescription

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

#: Events that describe sharding internals, never replayed.
IGNORED_TYPES = frozenset(
    {"shardCollection", "reshardCollection", "refineCollectionShardKey", "migrateLastChunkFromShard"}
)


def normalize_change(raw: Mapping[str, Any], rs: str | None = None) -> ChangeEvent | None:
    """Turn one change-stream document into a ChangeEvent, or None for events mcdc does not replay.

    ``rs`` names the replica set (shard) the stream reads, for sinks that report it."""
    # one pass over the field names: a missing field then costs a set lookup, not the KeyError a
    # RawBSONDocument's Mapping.get raises and catches (most events lack half of the optional fields)
    present = set(raw)

    def get(name: str) -> Any:
        return raw[name] if name in present else None

    op_type = raw["operationType"]
    op = OPERATION_TYPES.get(op_type)
    if op is None:
        if op_type in IGNORED_TYPES:
            return None
        raise ValueError(f"unknown change stream operationType {op_type!r}")
    ns_doc = get("ns")
    ns = _namespace(ns_doc) if ns_doc is not None else Namespace("")
    update = None
    if op is Op.UPDATE:
        desc = get("updateDescription")
        if desc is not None:
            update = UpdateDescription(
                updated_fields=desc.get("updatedFields") or {},
                removed_fields=tuple(desc.get("removedFields") or ()),
                truncated_arrays=tuple((t["field"], int(t["newSize"])) for t in (desc.get("truncatedArrays") or ())),
            )
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
        position=Position(resume_token=raw["_id"], cluster_time=get("clusterTime")),
        wall_time_ms=_millis(get("wallTime")),
        txn=txn,
        before=get("fullDocumentBeforeChange"),
        rs=rs,
    )


_NAMESPACES: dict[bytes, Namespace] = {}


def _namespace(ns_doc: Mapping[str, Any]) -> Namespace:
    """The event's namespace; the few distinct ``ns`` documents are decoded once (keyed by their bytes)."""
    raw = getattr(ns_doc, "raw", None)
    if raw is None:
        return Namespace(ns_doc["db"], ns_doc.get("coll"))
    ns = _NAMESPACES.get(raw)
    if ns is None:
        if len(_NAMESPACES) >= 10_000:
            _NAMESPACES.clear()
        ns = _NAMESPACES[raw] = Namespace(ns_doc["db"], ns_doc.get("coll"))
    return ns


def snapshot_read(ns: Namespace, document: Mapping[str, Any]) -> ChangeEvent:
    """A document copied by the snapshot, as a READ event."""
    return ChangeEvent(op=Op.READ, ns=ns, document=document)


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:  # pymongo decodes BSON dates as naive UTC
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp() * 1000)
    return int(value)  # DatetimeMS
