"""Typed columns of the state tables. Pure.

* ``_id_key`` (always): the document's ``_id`` as a value of its own type, so that the table sorts and joins
  in the ``_id``'s order where the ``_id``s share one type: an integer (int32 and int64 alike) as bigint, a
  string as string, an ObjectId as its 24 hex digits (which sort as ObjectIds do), a date as a UTC
  timestamp. ``_id``s of several types (or of another type) make it canonical Extended JSON, as ``_id`` is.
* ``--lake-columns typed``: each top-level field of the documents also as a typed column, as Debezium's
  ExtractNewDocumentState flattens a document.

A field seen with one BSON type gets that type's column (int32, int64, double, bool, string, date as a UTC
timestamp, binary; an ObjectId or a Decimal128 as its string); a sub-document, an array or any other type
is its canonical Extended JSON. A field seen with more than one type (nulls aside) becomes a column of
canonical Extended JSON strings, for all its rows. The BSON type a column stands for is kept in the
column's ``doc`` metadata (``mcdc:<kind>``), so a later run knows it. Column names are the field names, with
characters a table column cannot hold (``[^A-Za-z0-9_]``) as ``_``, and ``_`` after a name the state table
already uses (``document_``). The lossless columns (``document``, ``bson``) are always there.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import bson
import pyarrow as pa
from bson.binary import Binary
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from replicator.bsonkit.extjson import dumps_str
from replicator.bsonkit.rawbson import RAW_CODEC
from replicator.sinks.lake.tables import STATE_SCHEMA

JSON = "json"
_ARROW: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "double": pa.float64(),
    "string": pa.string(),
    "date": pa.timestamp("us", tz="UTC"),
    "objectid": pa.string(),
    "decimal": pa.string(),
    "binary": pa.binary(),
    JSON: pa.string(),
}
#: the column of the ``_id`` as a value of its own type
KEY = "_id_key"
_LOSSLESS = frozenset(STATE_SCHEMA.names)
_RESERVED = _LOSSLESS | {KEY}
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
#: dates further from 1970 than a microsecond timestamp reaches (about 292,000 years) are Extended JSON
_MAX_MS = 2**63 // 1000
#: Kinds: the BSON type each typed column stands for, by column name.
Kinds = dict[str, str]


def column_name(field: str) -> str:
    name = _UNSAFE.sub("_", field) or "_"
    return name + "_" if name in _RESERVED else name


def key_kind(value: Any) -> str:
    """The kind of an ``_id``'s column: as :func:`kind_of` says, int32 and int64 as one (a collection's
    integer ``_id``s are both, by the driver that wrote them); kinds that do not sort as MongoDB sorts
    them (Decimal128 as a string, binary, booleans, others) are Extended JSON."""
    kind = kind_of(value)
    if kind == "int32":
        return "int64"
    return kind if kind in ("int64", "double", "string", "objectid", "date") else JSON


def kind_of(value: Any) -> str | None:
    """The kind of a decoded BSON value; None for null (it fits every column)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "int64"
    if isinstance(value, int):
        return "int32"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, datetime.datetime) or (isinstance(value, DatetimeMS) and abs(int(value)) < _MAX_MS):
        return "date"
    if isinstance(value, ObjectId):
        return "objectid"
    if isinstance(value, Decimal128):
        return "decimal"
    if isinstance(value, bytes) and (not isinstance(value, Binary) or value.subtype == 0):
        return "binary"
    return JSON


def cell(kind: str, value: Any) -> Any:
    """A value as its column of ``kind`` holds it."""
    if value is None:
        return None
    if kind == JSON:
        return dumps_str(value)
    if kind == "date":
        if isinstance(value, DatetimeMS):
            return int(value) * 1000
        if value.tzinfo is None:  # BSON dates decode as naive UTC
            value = value.replace(tzinfo=datetime.UTC)
        return (value - _EPOCH) // datetime.timedelta(microseconds=1)
    if kind in ("objectid", "decimal"):
        return str(value)
    if kind == "binary":
        return bytes(value)
    return value


def field(name: str, kind: str) -> pa.Field:
    return pa.field(name, _ARROW[kind], metadata={"doc": f"mcdc:{kind}"})


def kinds_of(schema: pa.Schema) -> Kinds:
    """The typed columns a table's schema holds, by their ``doc`` metadata."""
    out: Kinds = {}
    for f in schema:
        doc = (f.metadata or {}).get(b"doc", b"").decode()
        if f.name not in _LOSSLESS and doc.startswith("mcdc:"):
            out[f.name] = doc.removeprefix("mcdc:")
    return out


def learn(
    known: Mapping[str, str], documents: Iterable[Mapping[str, Any]], *, fields: bool = True
) -> tuple[Kinds, set[str]]:
    """The kinds after seeing ``documents`` (decoded top levels): the ``_id``'s column, and with ``fields``
    one per top-level field. Also the columns of ``known`` that became JSON (their rows already written
    must be written again as JSON)."""
    kinds = dict(known)
    for doc in documents:
        for key, value in doc.items():
            if key == "_id":
                kind: str | None = key_kind(value)
                name = KEY
            elif fields:
                kind, name = kind_of(value), column_name(key)
            else:
                continue
            if kind is None:
                continue
            seen = kinds.get(name)
            if seen is None:
                kinds[name] = kind
            elif seen != kind:
                kinds[name] = JSON
    became_json = {name for name, kind in known.items() if kind != JSON and kinds[name] == JSON}
    return kinds, became_json


def decode_top(raw: bytes) -> dict[str, Any]:
    """A document's top-level fields, sub-documents left raw (only their JSON is ever needed)."""
    return dict(bson.decode(raw, RAW_CODEC).items())


def with_columns(
    rows: pa.Table, kinds: Mapping[str, str], documents: Sequence[Mapping[str, Any]] | None = None
) -> pa.Table:
    """State rows with a typed column for each of ``kinds`` (``documents``: the rows' decoded top levels,
    decoded here from ``bson`` when not given; deleted rows, without bson, get nulls)."""
    if documents is None:
        documents = [decode_top(raw) if raw is not None else {} for raw in rows["bson"].to_pylist()]
    names = {column_name(k): k for doc in documents for k in doc if k != "_id"}
    names[KEY] = "_id"
    out = rows
    for name in sorted(kinds):
        kind = kinds[name]
        source = names.get(name)
        values = [cell(kind, doc.get(source)) if source is not None else None for doc in documents]
        out = out.append_column(field(name, kind), pa.array(values, _ARROW[kind]))
    return out
