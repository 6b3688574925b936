"""The ``mcdc`` data source's one row schema, for batch and streaming alike, and the pure functions that
turn change-stream documents and snapshot documents into rows and rows back into ChangeEvents.

Nothing is lost on the way: ``bson`` holds the full document's raw bytes and ``change`` the change-stream
document as the server sent it (split fragments assembled), so :func:`event_from_row` rebuilds the exact
ChangeEvent that :func:`~replicator.events.normalize.normalize_change` makes. The JSON columns are canonical
Extended JSON (lossless, for readers that never touch BSON). No Spark here: rows are plain tuples.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import bson
from bson import json_util
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import CANONICAL, dumps_str
from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument
from replicator.events import ChangeEvent, Namespace, Op, Position, Transaction, UpdateDescription
from replicator.events.normalize import normalize_change, snapshot_read
from replicator.events.positions import seq_of

#: Column name and Spark type, in row order. ``cluster_time``'s ``t`` and ``i`` are BSON timestamp halves,
#: unsigned 32-bit: bigint holds every value (an int would overflow for ``t`` after 2038 and for large ``i``).
#: Struct fields are nullable (the values never are): a table that copies the type into a nullable column
#: of its own (Auto CDC's SCD2 ``__END_AT``) needs them to be.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("op", "string not null"),  # an Op value: r, c, u, replace, d, or the DDL's name
    ("db", "string not null"),
    ("coll", "string"),  # null for database events
    ("key", "string"),  # the document key (documentKey), canonical Extended JSON
    ("document", "string"),  # the full document when known, Extended JSON (canonical, or relaxed)
    ("bson", "binary"),  # the full document's raw BSON bytes when known
    ("update", "string"),  # {updatedFields, removedFields, truncatedArrays}, Extended JSON
    ("before", "string"),  # the pre-image (pre-images option), Extended JSON
    ("cluster_time", "struct<t: bigint, i: bigint>"),  # null for snapshot rows
    # the row's place in the stream's total order (replicator.events.positions): sort or sequence by it
    ("sequence", "struct<t: bigint, i: bigint, shard: string, n: bigint>"),
    ("wall_time", "timestamp"),  # UTC
    ("txn", "string"),  # {lsid, txnNumber} as canonical Extended JSON; null outside transactions
    ("resume_token", "string"),  # the event's _id, canonical Extended JSON
    ("shard", "string"),  # the shard's name; null for a replica set
    ("change", "binary"),  # the change-stream document's raw bytes; null for snapshot rows
)
SCHEMA = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)
"""The schema as a Spark DDL string."""
NAMES = tuple(name for name, _ in COLUMNS)

Row = tuple[Any, ...]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def snapshot_row(ns: Namespace, document: RawBSONDocument, at: Position | None = None, *, relaxed: bool = False) -> Row:
    """A document read by a snapshot: op ``r`` with key, document and bson set; ``at``: the snapshot's read
    time (:func:`replicator.events.positions.snapshot_position`), its ``sequence``. ``relaxed``: the document as
    relaxed Extended JSON (``from_json`` with a schema then gives typed values)."""
    seq = seq_of(at)
    return (
        "r", ns.db, ns.coll, dumps_str({"_id": document["_id"]}), dumps_str(document, relaxed=relaxed),
        bson_bytes(document), None, None, None, None if seq is None else seq.to_json(), None, None, None, None, None,
    )  # fmt: skip


def event_row(event: ChangeEvent, change: bytes | None = None, *, relaxed: bool = False) -> Row:
    """Any ChangeEvent as a row; ``change``: the raw change-stream document it was made from. ``relaxed``:
    the document columns (document, update, before) as relaxed Extended JSON; the key stays canonical."""
    position = event.position or Position()
    ts = position.cluster_time
    seq = seq_of(position)
    txn = None
    if event.txn is not None:
        txn = dumps_str({"lsid": event.txn.lsid, "txnNumber": Int64(event.txn.txn_number)})
    return (
        event.op.value,
        event.ns.db,
        event.ns.coll,
        _json(event.key if event.key is not None else _key_of(event.document)),
        _json(event.document, relaxed),
        bson_bytes(event.document) if event.document is not None else None,
        _json(_update_json(event.update), relaxed) if event.update is not None else None,
        _json(event.before, relaxed),
        {"t": ts.time, "i": ts.inc} if ts is not None else None,
        None if seq is None else seq.to_json(),
        _EPOCH + datetime.timedelta(milliseconds=event.wall_time_ms) if event.wall_time_ms is not None else None,
        txn,
        _json(position.resume_token),
        event.rs,
        change,
    )


def bson_bytes(document: Mapping[str, Any]) -> bytes:
    """A document's BSON: the bytes received, or encoded (a change event assembled from fragments)."""
    if isinstance(document, RawBSONDocument):
        return bytes(document.raw)
    return bson.encode(document, codec_options=RAW_CODEC)


def event_from_row(row: Mapping[str, Any]) -> ChangeEvent:
    """The ChangeEvent a row stands for. From ``change`` when the row has it (exactly the event
    normalize_change made, at the place ``sequence`` gives); else from the other columns: r/c/replace from
    ``bson``, d from ``key``, u from ``bson`` (the full document) and/or ``update`` (canonical Extended
    JSON: a relaxed one may read an Int64 back as an int). DDL needs ``change``."""
    shard = row.get("shard")
    change = row.get("change")
    seq = row.get("sequence")
    index, stream = (int(seq["n"]), seq["shard"] or None) if seq is not None and seq["n"] is not None else (None, None)
    if change is not None:
        event = normalize_change(RawDocument(bytes(change), RAW_CODEC), shard, index, stream)
        if event is None:
            raise ValueError("the row's change column holds an event mcdc does not replay")
        return event
    op = Op(row["op"])
    ns = Namespace(row["db"], row.get("coll"))
    document = RawDocument(bytes(row["bson"]), RAW_CODEC) if row.get("bson") is not None else None
    if op is Op.READ:
        if document is None:
            raise ValueError(f"an r row of {ns} has no bson column")
        at = (
            None
            if seq is None or index is None
            else Position(cluster_time=Timestamp(int(seq["t"]), int(seq["i"])), index=index)
        )
        return snapshot_read(ns, document, at)
    if op.is_ddl or op is Op.INVALIDATE:
        raise ValueError(f"a {op.value} row of {ns} needs its change column to be replayed")
    key = _load(row.get("key"))
    update = _update_from_json(_load_plain(row.get("update")))
    if document is None and (op in (Op.INSERT, Op.REPLACE) or (op is Op.UPDATE and update is None)):
        raise ValueError(f"a {op.value} row of {ns} has no bson column" + (" nor update" if op is Op.UPDATE else ""))
    if key is None and document is None:
        raise ValueError(f"a {op.value} row of {ns} has no key")
    ct = row.get("cluster_time")
    token = _load(row.get("resume_token"))
    position = Position(token, Timestamp(int(ct["t"]), int(ct["i"])) if ct is not None else None, index, stream)
    return ChangeEvent(
        op=op,
        ns=ns,
        key=key,
        document=document,
        update=update,
        position=position if position else None,
        wall_time_ms=_millis(row.get("wall_time")),
        txn=_txn(_load_plain(row.get("txn"))),
        before=_load(row.get("before")),
        rs=shard,
    )


def _json(value: Mapping[str, Any] | None, relaxed: bool = False) -> str | None:
    return dumps_str(value, relaxed=relaxed) if value is not None else None


def _key_of(document: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return {"_id": document["_id"]} if document is not None else None


def _update_json(update: UpdateDescription) -> dict[str, Any]:
    return {
        "updatedFields": update.updated_fields,
        "removedFields": list(update.removed_fields),
        "truncatedArrays": [{"field": f, "newSize": n} for f, n in update.truncated_arrays],
    }


def _load_plain(text: str | None) -> Any:
    """Canonical Extended JSON -> BSON values (Int64 stays Int64, binary subtypes kept)."""
    return json_util.loads(text, json_options=CANONICAL) if text is not None else None


def _load(text: str | None) -> RawBSONDocument | None:
    """Canonical Extended JSON of a document -> its raw BSON, as the change stream would have sent it."""
    value = _load_plain(text)
    return _raw_document(value) if value is not None else None


def _raw_document(value: Mapping[str, Any]) -> RawBSONDocument:
    return RawDocument(bson.encode(value, codec_options=RAW_CODEC), RAW_CODEC)


def _update_from_json(data: Mapping[str, Any] | None) -> UpdateDescription | None:
    if data is None:
        return None
    updated = data.get("updatedFields") or {}
    return UpdateDescription(
        updated_fields=_raw_document(updated),
        removed_fields=tuple(data.get("removedFields") or ()),
        truncated_arrays=tuple((t["field"], int(t["newSize"])) for t in data.get("truncatedArrays") or ()),
    )


def _txn(data: Mapping[str, Any] | None) -> Transaction | None:
    if data is None:
        return None
    return Transaction(_raw_document(data["lsid"]), int(data["txnNumber"]))


def _millis(value: datetime.datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:  # Spark hands timestamps back as naive local time
        value = value.astimezone(datetime.UTC)
    return (value - _EPOCH) // datetime.timedelta(milliseconds=1)
