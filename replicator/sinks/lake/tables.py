"""The lake tables' layout, columns and rows. Pure: pyarrow values, no I/O.

Each selected collection ``db.coll`` (named as on the target, after --rename) has two tables:

* a **state table**, one row per live document: ``_id`` (the ``_id`` value as canonical Extended JSON, the
  merge key), ``document`` (canonical Extended JSON), ``bson`` (the raw BSON, byte-exact) and
  ``cluster_time`` (the last change applied; null for a document as a snapshot copied it);
* a **change table**, one row per event, in the ``mcdc`` data source's row schema
  (:data:`replicator.events.rows.COLUMNS`): ``sequence`` orders its rows as the stream does
  (:mod:`replicator.events.positions`), snapshot rows first.

Delta keeps them at ``PATH/state/<db>/<coll>`` and ``PATH/changes/<db>/<coll>``; Iceberg as tables
``(<db>, <coll>)`` and ``(<db>_changes, <coll>)``.

Each table records how far it got in each stream (a :class:`~replicator.events.positions.Mark`, committed with the
data): a batch's events at or before it are already in that table and are not written to it again, exactly
once per table, whatever was killed between two tables' commits or where a batch was cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from replicator.bsonkit.extjson import dumps_str
from replicator.events import ChangeEvent, Namespace
from replicator.events.positions import SNAPSHOT_INDEX, seq_of
from replicator.events.rows import COLUMNS, bson_bytes, event_row

Kind = Literal["state", "changes"]

#: The state table's cluster time (its fields required: tables written before the change tables' became
#: nullable keep this type).
CLUSTER_TIME = pa.struct([pa.field("t", pa.int64(), nullable=False), pa.field("i", pa.int64(), nullable=False)])

STATE_SCHEMA = pa.schema(
    [
        pa.field("_id", pa.string(), nullable=False),
        pa.field("document", pa.string()),
        pa.field("bson", pa.binary()),
        pa.field("cluster_time", CLUSTER_TIME),
    ]
)

_ARROW = {
    "string": pa.string(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "struct<t: bigint, i: bigint>": pa.struct([("t", pa.int64()), ("i", pa.int64())]),
    "struct<t: bigint, i: bigint, shard: string, n: bigint>": pa.struct(
        [("t", pa.int64()), ("i", pa.int64()), ("shard", pa.string()), ("n", pa.int64())]
    ),
}


def _change_schema() -> pa.Schema:
    fields = []
    for name, kind in COLUMNS:
        required = kind.endswith(" not null")
        fields.append(pa.field(name, _ARROW[kind.removesuffix(" not null")], nullable=not required))
    return pa.schema(fields)


CHANGE_SCHEMA = _change_schema()
SCHEMAS: dict[Kind, pa.Schema] = {"state": STATE_SCHEMA, "changes": CHANGE_SCHEMA}


@dataclass(frozen=True, slots=True)
class TableRef:
    """One lake table: which kind, of which target collection."""

    kind: Kind
    ns: Namespace

    def path(self) -> str:
        """Delta: the table's path under the lake's root."""
        return f"{self.kind}/{self.ns.db}/{self.ns.coll}"

    def identifier(self) -> tuple[str, str]:
        """Iceberg: the table's (namespace, name)."""
        db = self.ns.db if self.kind == "state" else f"{self.ns.db}_changes"
        return (db, str(self.ns.coll))

    def __str__(self) -> str:
        return f"{self.kind} table of {self.ns}"


def cluster_time_of(event: ChangeEvent) -> tuple[int, int] | None:
    """The event's cluster time as ``(t, i)``, the state row's ``cluster_time`` (None for a snapshot read)."""
    position = event.position
    ts = position.cluster_time if position is not None and position.index != SNAPSHOT_INDEX else None
    return None if ts is None else (ts.time, ts.inc)


def id_json(value: Any) -> str:
    """An ``_id`` value as the state table's key: canonical Extended JSON."""
    return dumps_str(value)


def state_table(rows: Sequence[tuple[str, bytes | None, str | None, tuple[int, int] | None]]) -> pa.Table:
    """State rows from ``(_id, bson, document, cluster time)``; a null time leaves ``cluster_time`` null."""
    return pa.table(
        {
            "_id": [r[0] for r in rows],
            "document": [r[2] for r in rows],
            "bson": [r[1] for r in rows],
            "cluster_time": [None if r[3] is None else {"t": r[3][0], "i": r[3][1]} for r in rows],
        },
        schema=STATE_SCHEMA,
    )


def change_table(events: Iterable[ChangeEvent]) -> pa.Table:
    """Change rows, one per event."""
    rows = [event_row(event) for event in events]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in CHANGE_SCHEMA.names]
    return pa.table(dict(zip(CHANGE_SCHEMA.names, map(list, columns), strict=True)), schema=CHANGE_SCHEMA)


def snapshot_tables(ns: Namespace, events: Sequence[ChangeEvent]) -> tuple[pa.Table, pa.Table]:
    """A snapshot batch's state rows and change rows (op ``r``, at the snapshot's read time) at once: each
    document's bytes and JSON are made once for both (the same values :func:`state_table` and
    :func:`change_table` give)."""
    ids, keys, documents, raws, sequences = [], [], [], [], []
    for event in events:
        doc = event.document
        assert doc is not None
        key = id_json(doc["_id"])
        ids.append(key)
        keys.append('{"_id":' + key + "}")
        documents.append(dumps_str(doc))
        raws.append(bson_bytes(doc))
        seq = seq_of(event.position)
        sequences.append(None if seq is None else seq.to_json())
    n = len(ids)
    state = pa.table(
        {"_id": ids, "document": documents, "bson": raws, "cluster_time": pa.array([None] * n, CLUSTER_TIME)},
        schema=STATE_SCHEMA,
    )
    columns: dict[str, Any] = {f.name: pa.array([None] * n, f.type) for f in CHANGE_SCHEMA}
    columns.update(op=["r"] * n, db=[ns.db] * n, coll=[ns.coll] * n, key=keys, document=documents, bson=raws)
    columns["sequence"] = pa.array(sequences, CHANGE_SCHEMA.field("sequence").type)
    return state, pa.table(columns, schema=CHANGE_SCHEMA)
