"""The MongoDB write plan: which idempotent writes replay which change events. Pure: no I/O.

* :func:`write_ops` turns one document event into its writes (upserts by document key, deltas as
  :func:`replicator.events.update_ops.update_steps` builds them, deletes); :func:`literal_ops` gives the same
  writes in a form that carries ``$``-prefixed field names literally (an update pipeline), for the
  documents a plain replacement or ``$set`` is refused for.
* :func:`coalesce` groups one namespace's events so that unrelated documents' writes go as a few
  commands instead of one per alternating run.
* :func:`duplicate_key` reads a unique-index conflict out of a write error, :func:`stale_delta` tells a
  delta update that the target's newer copy of the document cannot take, :func:`refused` words an error
  that stops the run.
* :func:`segments` cuts a batch into the runs applied as one unit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import DeleteOne, ReplaceOne, UpdateOne

from replicator.bsonkit.extjson import dumps_str
from replicator.bsonkit.rawbson import RawDocument, raw_of
from replicator.errors import SinkError
from replicator.events import ChangeEvent, Namespace, Op, UpdateDescription
from replicator.events.update_ops import update_steps

WriteOp = ReplaceOne[Any] | UpdateOne | DeleteOne
#: a write and the event it replays (the event is needed to rewrite or resolve the write)
Planned = tuple[ChangeEvent, WriteOp]

DUPLICATE_KEY = 11000
#: "The dollar ($) prefixed field ... is not allowed in the context of an update's replacement document"
DOLLAR_PREFIXED = 52
#: Errors of a delta update against a document that moved on: PathNotViable, TypeMismatch, BadValue,
#: ConflictingUpdateOperators, and "cannot apply $push to a non-array" (DollarPrefixedFieldName is not one).
STALE_DELTA_CODES = frozenset({2, 14, 28, 40})
_ID_INDEX = "_id_"


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
        return [UpdateOne(event.document_key, step) for step in update_steps(update)]
    if op is Op.DELETE:
        return [DeleteOne(event.document_key)]
    raise ValueError(f"{op.value} is not a document operation")


def literal_ops(event: ChangeEvent) -> list[WriteOp]:
    """The writes of :func:`write_ops`, carrying top-level ``$``-prefixed field names (legal since
    MongoDB 5.0, made with ``$setField``) literally: a replacement becomes the update pipeline
    ``$replaceWith: {$literal: doc}``, and a delta sets such fields with ``$setField``."""
    key = event.document_key
    if event.document is not None and event.op is not Op.DELETE:
        return [UpdateOne(key, [{"$replaceWith": {"$literal": event.document}}], upsert=True)]
    update = event.update
    if event.op is not Op.UPDATE or update is None:
        return write_ops(event)
    plain = dict(update.updated_fields.items())
    dollar = {name: plain.pop(name) for name in list(plain) if name.startswith("$") and "." not in name}
    removed = [name for name in update.removed_fields if not (name.startswith("$") and "." not in name)]
    unset_dollar = [name for name in update.removed_fields if name not in removed]
    rest = UpdateDescription(plain, tuple(removed), update.truncated_arrays)
    ops = write_ops(ChangeEvent(Op.UPDATE, event.ns, key=key, update=rest))
    stages: list[dict[str, Any]] = []
    for name, value in dollar.items():
        stages.append({"$replaceWith": _set_field(name, {"$literal": value})})
    for name in unset_dollar:
        stages.append({"$replaceWith": _set_field(name, "$$REMOVE")})
    if stages:
        ops.append(UpdateOne(key, stages))
    return ops


def _set_field(name: str, value: Any) -> dict[str, Any]:
    return {"$setField": {"field": {"$literal": name}, "input": "$$ROOT", "value": value}}


def plan(events: Sequence[ChangeEvent]) -> list[Planned]:
    """Every event's writes, in the events' order."""
    return [(event, op) for event in events for op in write_ops(event)]


def coalesce(events: Sequence[ChangeEvent]) -> tuple[list[ChangeEvent], list[ChangeEvent], list[Planned]]:
    """One namespace's document events as (deletes, replacements, ordered sequence): the events whose
    document is deleted by its key, those whose full document replaces it (upserted by its key), and the
    writes of the others.

    A document whose events in the batch all carry their full document or delete it ends in the state
    of its last event: one write replaces them all. So does a document whose last event deletes it, delta
    updates before it or not: the deletes go first, so what those updates took (a unique key) is freed
    before anything is written. Those writes touch different documents, so they go unordered, one command
    per kind. The other documents with a delta update keep every write, in the source's order across
    documents (a unique secondary key moved from one document to another is freed before it is taken, as
    on the source).
    """
    keys: list[bytes] = []
    last: dict[bytes, ChangeEvent] = {}  # each document's last event, in the order documents first appear
    delta: set[bytes] = set()  # the documents with a delta update
    delete = Op.DELETE
    for event in events:
        key = event.key
        kb = raw_of(key) if type(key) is RawDocument else key_bytes(event.document_key)
        keys.append(kb)
        last[kb] = event
        if event.document is None and event.op is not delete:
            delta.add(kb)
    deletes: list[ChangeEvent] = []
    replaces: list[ChangeEvent] = []  # each with its full document: what write_ops makes a ReplaceOne of
    for kb, event in last.items():
        if kb in delta:
            if event.op is not delete:
                continue
            delta.discard(kb)
        (deletes if event.op is delete else replaces).append(event)
    if not delta:
        return deletes, replaces, []
    return deletes, replaces, plan([e for kb, e in zip(keys, events, strict=True) if kb in delta])


def key_bytes(key: Any) -> bytes:
    """A document key's BSON, to group events by document."""
    return bytes(key.raw) if isinstance(key, RawBSONDocument) else bson.encode(key)


def id_bytes(doc_or_key: Mapping[str, Any]) -> bytes:
    """The BSON of ``{_id: ...}`` alone (a sharded collection's document key also holds the shard key)."""
    return bson.encode({"_id": doc_or_key["_id"]})


def stale_delta(op: WriteOp, error: Mapping[str, Any]) -> bool:
    """Did a delta update fail only because the target's copy of the document is ahead of the event?"""
    return isinstance(op, UpdateOne) and error.get("code") in STALE_DELTA_CODES


@dataclass(frozen=True)
class DuplicateKey:
    """A write refused by a unique secondary index: which index, and the key it already holds."""

    index: str
    key_pattern: Mapping[str, Any]
    key_value: Mapping[str, Any]

    def describe(self) -> str:
        shown = ", ".join(f"{k}: {v!r}" for k, v in self.key_value.items()) or "?"
        return f"unique index {self.index} already holds {{{shown}}}"


_INDEX_NAME = re.compile(r"index: (\S+) dup key")


def duplicate_key(error: Mapping[str, Any]) -> DuplicateKey | None:
    """The unique secondary index conflict a write error reports, or None (another error, or the ``_id``
    index: an upsert by ``_id`` racing itself, which the server retries)."""
    if error.get("code") != DUPLICATE_KEY:
        return None
    match = _INDEX_NAME.search(str(error.get("errmsg") or ""))
    index = match.group(1) if match else "?"
    pattern = error.get("keyPattern") or {}
    if index == _ID_INDEX or (not match and list(pattern) == ["_id"]):
        return None
    return DuplicateKey(index, dict(pattern), dict(error.get("keyValue") or {}))


def segments(batch: Sequence[ChangeEvent]) -> list[tuple[str, list[ChangeEvent]]]:
    """Split a batch into runs applied as one unit: plain document events, one transaction, or one DDL."""
    out: list[tuple[str, list[ChangeEvent]]] = []
    for event in batch:
        kind = "ddl" if event.op.is_ddl else ("txn" if event.txn is not None else "plain")
        if out and kind != "ddl" and out[-1][0] == kind and (kind == "plain" or out[-1][1][-1].txn == event.txn):
            out[-1][1].append(event)
        else:
            out.append((kind, [event]))
    return out


def refused(ns: Namespace, event: ChangeEvent, error: Mapping[str, Any]) -> SinkError:
    """A write error that stops the run, in one line naming the namespace, the document and the code."""
    try:
        what = f"_id {dumps_str(event.document_key['_id'], relaxed=True)}"
    except (ValueError, KeyError):
        what = event.op.value
    message = str(error.get("errmsg") or "").splitlines()[0][:300] if error.get("errmsg") else ""
    return SinkError(
        f"replaying into {ns}: the target refused the write of {what} (code {error.get('code')}: {message})"
    )
