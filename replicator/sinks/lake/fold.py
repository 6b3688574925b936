"""A run of document events of one collection, folded into what its state table must become. Pure.

Events are applied in source order, per document: insert, replace and an update that carries the full
document set the row; a delete removes it; an update that carries only its delta (``--full-document
default``, or a document deleted before the lookup) is applied to the row as it stands, read from the
table when no earlier event of the batch gave it. Only each document's end state is written (one merge
per table and batch), with the cluster time of its last event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import bson

from replicator.bsonkit.extjson import dumps_str
from replicator.bsonkit.rawbson import DICT_CODEC, RAW_CODEC
from replicator.events import ChangeEvent, Op, UpdateDescription
from replicator.events.rows import bson_bytes
from replicator.sinks.lake.tables import cluster_time_of, id_json

#: the ops that set a whole document
_SETS = frozenset({Op.INSERT, Op.REPLACE, Op.READ})


@dataclass
class Folded:
    """The end state of each document a run of events touched: ``rows[_id] = (bson, cluster time)``, or
    ``None`` for a document deleted (or not known to exist)."""

    rows: dict[str, tuple[bytes, tuple[int, int] | None] | None] = field(default_factory=dict)

    def upserts(self) -> list[tuple[str, bytes, str, tuple[int, int] | None]]:
        """``(_id, bson, document, cluster time)`` of the documents that exist."""
        out = []
        for key, row in self.rows.items():
            if row is not None:
                out.append((key, row[0], dumps_str(bson.decode(row[0], RAW_CODEC)), row[1]))
        return out

    def deletes(self) -> list[str]:
        return [key for key, row in self.rows.items() if row is None]


def key_of(event: ChangeEvent) -> str:
    """The state table's key of the event's document."""
    if event.document is not None:
        return id_json(event.document["_id"])
    return id_json(event.document_key["_id"])


def needs_base(events: Sequence[ChangeEvent]) -> set[str]:
    """The documents whose current row the fold needs: an update with only a delta, with no earlier event of
    these that sets or deletes the document."""
    known: set[str] = set()
    wanted: set[str] = set()
    for event in events:
        key = key_of(event)
        if event.op is Op.UPDATE and event.document is None and key not in known:
            wanted.add(key)
        known.add(key)
    return wanted


def fold(events: Sequence[ChangeEvent], base: Mapping[str, bytes]) -> Folded:
    """The end state of the documents ``events`` (document events of one collection, in order) touch;
    ``base``: the current rows of :func:`needs_base`'s documents that exist."""
    folded = Folded()
    rows = folded.rows
    for event in events:
        key = key_of(event)
        at = cluster_time_of(event)
        if event.op in _SETS or (event.op is Op.UPDATE and event.document is not None):
            assert event.document is not None
            rows[key] = (bson_bytes(event.document), at)
        elif event.op is Op.DELETE:
            rows[key] = None
        elif event.op is Op.UPDATE and event.update is not None:
            current = rows[key][0] if rows.get(key) is not None else base.get(key)  # type: ignore[index]
            if current is None:
                rows.setdefault(key, None)  # nothing to apply the delta to: the document is gone
                continue
            rows[key] = (apply_update(current, event.update), at)
    return folded


def apply_update(raw: bytes, update: UpdateDescription) -> bytes:
    """A document's BSON after an update's delta, as the server applied it: arrays truncated first, then
    fields set (dotted paths into sub-documents and array elements), then fields removed."""
    doc = bson.decode(raw, DICT_CODEC)
    for path, size in update.truncated_arrays:
        parent, last = _walk(doc, path)
        value = _get(parent, last)
        if isinstance(value, list):
            del value[size:]
    for path, value in bson.decode(bson_bytes(update.updated_fields), DICT_CODEC).items():
        parent, last = _walk(doc, path, create=True)
        _set(parent, last, value)
    for path in update.removed_fields:
        parent, last = _walk(doc, path)
        if isinstance(parent, dict):
            parent.pop(last, None)
        elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
            parent[int(last)] = None  # $unset of an array element leaves null
    return bson.encode(doc, codec_options=DICT_CODEC)


def _walk(doc: dict[str, Any], path: str, *, create: bool = False) -> tuple[Any, str]:
    parts = path.split(".")
    node: Any = doc
    for part in parts[:-1]:
        child = _get(node, part)
        if child is None and create and isinstance(node, dict):
            child = node[part] = {}
        node = child
    return node, parts[-1]


def _get(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return None


def _set(node: Any, part: str, value: Any) -> None:
    if isinstance(node, dict):
        node[part] = value
    elif isinstance(node, list) and part.isdigit():
        index = int(part)
        node.extend([None] * (index + 1 - len(node)))
        node[index] = value
