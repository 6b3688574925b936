"""The ``plain`` envelope: mcdc's own event as JSON data, documents as extended JSON objects (for jq and
scripts); the transaction id every envelope names a transaction by; and the legacy envelope's ``patch``."""

from __future__ import annotations

from typing import Any

from replicator.bsonkit.extjson import to_json_value
from replicator.events import ChangeEvent, Transaction
from replicator.events.update_ops import update_document, update_steps


def plain_event(event: ChangeEvent, *, relaxed: bool, source_name: str) -> dict[str, Any]:
    """mcdc's own event as JSON data; documents as extended JSON objects (relaxed or canonical)."""
    out: dict[str, Any] = {"op": event.op.value, "ns": str(event.ns)}
    if event.to is not None:
        out["to"] = str(event.to)
    if event.key is not None:
        out["key"] = to_json_value(event.key, relaxed=relaxed)
    if event.document is not None:
        out["document"] = to_json_value(event.document, relaxed=relaxed)
    if event.before is not None:
        out["before"] = to_json_value(event.before, relaxed=relaxed)
    if event.update is not None:
        u = event.update
        out["update"] = {
            "updatedFields": to_json_value(u.updated_fields, relaxed=relaxed),
            "removedFields": list(u.removed_fields),
            "truncatedArrays": [{"field": f, "newSize": size} for f, size in u.truncated_arrays],
        }
    if event.ddl is not None:
        out["ddl"] = to_json_value(event.ddl, relaxed=relaxed)
    if (ct := event.change_time) is not None:
        out["clusterTime"] = {"t": ct.time, "i": ct.inc}
    if event.wall_time_ms is not None:
        out["wallTime"] = event.wall_time_ms
    if event.txn is not None:
        out["txn"] = {"id": transaction_id(event.txn), "txnNumber": event.txn.txn_number}
    if event.rs or source_name:
        out["rs"] = event.rs or source_name
    return out


def transaction_id(txn: Transaction) -> str:
    """``<session id>:<txnNumber>``: what identifies a transaction in a change stream."""
    lsid = txn.lsid.get("id")
    as_uuid = getattr(lsid, "as_uuid", None)
    try:
        session = str(as_uuid()) if as_uuid is not None else bytes(lsid or b"").hex()
    except ValueError:  # a binary that is not a UUID
        session = bytes(lsid or b"").hex()
    return f"{session}:{txn.txn_number}"


def update_operators(event: ChangeEvent) -> dict[str, Any] | list[dict[str, Any]]:
    """An update event's delta as one idempotent MongoDB update (``$set``, ``$unset`` with ``true`` as in
    Debezium 1.x's patch, ``$push`` with ``$slice`` for a truncated array); where MongoDB cannot take it
    as one (an array truncated while only some of its elements change), the updates to apply in order."""
    assert event.update is not None
    one = update_document(event.update, unset_value=True)
    return one if one is not None else update_steps(event.update, unset_value=True)
