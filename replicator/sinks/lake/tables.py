"""The lake tables' layout, columns and rows. Pure: pyarrow values, no I/O.

Each selected collection ``db.coll`` (named as on the target, after --rename) has two tables:

* a **state table**, one row per live document: ``_id`` (the ``_id`` value as canonical Extended JSON, the
  merge key), ``document`` (canonical Extended JSON), ``bson`` (the raw BSON, byte-exact) and
  ``cluster_time`` (the last change applied; null for a document as a snapshot copied it);
* a **change table**, one row per event, in the ``mcdc`` data source's row schema
  (:data:`replicator.spark_datasource.rows.COLUMNS`) plus ``seq``, the event's order within its cluster time.

Delta keeps them at ``PATH/state/<db>/<coll>`` and ``PATH/changes/<db>/<coll>``; Iceberg as tables
``(<db>, <coll>)`` and ``(<db>_changes, <coll>)``.

Each table records the position it covers: the cluster time of the last event committed to it, as one
integer (:func:`version_of`: ``t << 32 | i``, the order of cluster times). A batch's events at or before it
are already in that table and are not written to it again: exactly once per table, whatever was killed
between two tables' commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from ...events import ChangeEvent, Namespace
from ...extjson import dumps_str
from ...spark_datasource.rows import COLUMNS, bson_bytes, event_row

Kind = Literal["state", "changes"]

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
    "struct<t: bigint not null, i: bigint not null>": CLUSTER_TIME,
}


def _change_schema() -> pa.Schema:
    fields = []
    for name, kind in COLUMNS:
        required = kind.endswith(" not null")
        fields.append(pa.field(name, _ARROW[kind.removesuffix(" not null")], nullable=not required))
    fields.append(pa.field("seq", pa.int64(), nullable=False))
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


def version_of(event: ChangeEvent) -> int | None:
    """The event's cluster time as one ordered integer (None for a snapshot read)."""
    ts = event.position.cluster_time if event.position is not None else None
    return None if ts is None else (ts.time << 32) | ts.inc


def id_json(value: Any) -> str:
    """An ``_id`` value as the state table's key: canonical Extended JSON."""
    return dumps_str(value)


def state_table(rows: Sequence[tuple[str, bytes | None, str | None, int | None]]) -> pa.Table:
    """State rows from ``(_id, bson, document, version)``; a null version leaves ``cluster_time`` null."""
    return pa.table(
        {
            "_id": [r[0] for r in rows],
            "document": [r[2] for r in rows],
            "bson": [r[1] for r in rows],
            "cluster_time": [_cluster_time(r[3]) for r in rows],
        },
        schema=STATE_SCHEMA,
    )


def _cluster_time(version: int | None) -> dict[str, int] | None:
    return None if version is None else {"t": version >> 32, "i": version & 0xFFFFFFFF}


def change_table(events: Iterable[ChangeEvent]) -> pa.Table:
    """Change rows, one per event, each with its order among the events of its cluster time (the events of
    one cluster time, a transaction's, always come in one batch, in the same order)."""
    rows: list[tuple[Any, ...]] = []
    last: int | None = None
    seq = 0
    for event in events:
        version = version_of(event)
        seq = seq + 1 if version is not None and version == last else 0
        last = version
        rows.append((*event_row(event), seq))
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in CHANGE_SCHEMA.names]
    return pa.table(dict(zip(CHANGE_SCHEMA.names, map(list, columns), strict=True)), schema=CHANGE_SCHEMA)


def snapshot_tables(ns: Namespace, events: Sequence[ChangeEvent]) -> tuple[pa.Table, pa.Table]:
    """A snapshot batch's state rows and change rows (op ``r``) at once: each document's bytes and JSON are
    made once for both (the same values :func:`state_table` and :func:`change_table` give)."""
    ids, keys, documents, raws = [], [], [], []
    for event in events:
        doc = event.document
        assert doc is not None
        key = id_json(doc["_id"])
        ids.append(key)
        keys.append('{"_id":' + key + "}")
        documents.append(dumps_str(doc))
        raws.append(bson_bytes(doc))
    n = len(ids)
    state = pa.table(
        {"_id": ids, "document": documents, "bson": raws, "cluster_time": pa.array([None] * n, CLUSTER_TIME)},
        schema=STATE_SCHEMA,
    )
    columns: dict[str, Any] = {f.name: pa.array([None] * n, f.type) for f in CHANGE_SCHEMA}
    columns.update(op=["r"] * n, db=[ns.db] * n, coll=[ns.coll] * n, key=keys, document=documents, bson=raws)
    columns["seq"] = [0] * n
    return state, pa.table(columns, schema=CHANGE_SCHEMA)
