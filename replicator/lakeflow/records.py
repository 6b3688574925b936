"""What a Lakeflow Connect table of mcdc looks like: its name, its options, its schema, its metadata and
its records, made from the ``mcdc`` data source's rows. Pure: no server, no Spark session.

A table is one collection, named ``db.coll``. Its records are JSON-compatible dicts, one per document
read by the snapshot or changed in the stream:

* ``_id``: the document's ``_id`` as canonical Extended JSON (``{"$oid": "..."}``, ``{"$numberLong":
  "7"}``, ``"text"``): lossless, so ``1``, ``"1"`` and ``ObjectId`` keys never meet;
* ``key``: the whole document key, canonical Extended JSON: ``{"_id": ...}``, or on a sharded cluster
  the shard key's fields (in the key's order) then ``_id``, the same for a snapshot's row (read from its
  document) as for the events of its document (from their ``documentKey``);
* ``op``: ``r`` (snapshot), ``c``, ``u``, ``replace`` or ``d``;
* ``document``: the document as Extended JSON text (canonical, or relaxed with ``extended-json
  relaxed``); Databricks reads it with ``parse_json(document)`` into a VARIANT, or ``from_json``;
* ``sequence``: the record's place in mcdc's total order (``t``, ``i``, ``shard``, ``n``), the cursor:
  the snapshot's rows sit at its read time with ``n = -1``, every event after it in stream order;
* ``cluster_time``, ``wall_time``, ``txn``, ``shard``, ``db``, ``coll``: as the data source's columns.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import orjson
from bson import json_util
from bson.raw_bson import RawBSONDocument
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from replicator.bsonkit.extjson import CANONICAL, dumps_str
from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument
from replicator.errors import ConfigError, quoted
from replicator.events import Namespace
from replicator.events.rows import NAMES, Row

#: Options the Lakeflow framework adds to the connector's own (the table, the virtual tables' arguments,
#: Unity Catalog's connection bookkeeping): never mcdc's to check. Compared lower-cased.
FRAMEWORK_OPTIONS = frozenset(
    name.lower()
    for name in (
        "tableName",
        "tableNameList",
        "tableConfigs",
        "isDeleteFlow",
        "namespace",
        "namespacePrefix",
        "databricks.connection",
        "sourceName",
        "externalOptionsAllowList",
    )
)

#: A table's key: the document's ``_id``; ``key`` (the shard key's fields and ``_id``) where the collection is
#: sharded on other fields, whose values then tell two documents of one ``_id`` apart (a document moved
#: between shards by a shard key update is a delete and an insert at one cluster time).
PRIMARY_KEYS = ["_id"]
SHARDED_KEYS = ["key"]
CURSOR = "sequence"
INGESTION_TYPE = "cdc_with_deletes"
#: The ops whose records read_table gives (upserts: each carries the whole document) and read_table_deletes.
UPSERTS = frozenset({"r", "c", "u", "replace"})
DELETES = frozenset({"d"})

_POSITION = StructType(
    [StructField("t", LongType(), True), StructField("i", LongType(), True)]  # BSON timestamp halves: unsigned 32 bits
)
_SEQUENCE = StructType(
    [
        StructField("t", LongType(), True),
        StructField("i", LongType(), True),
        StructField("shard", StringType(), True),
        StructField("n", LongType(), True),
    ]
)
SCHEMA = StructType(
    [
        StructField("_id", StringType(), False),
        StructField("key", StringType(), False),
        StructField("op", StringType(), False),
        StructField("db", StringType(), False),
        StructField("coll", StringType(), False),
        StructField("document", StringType(), True),
        StructField(CURSOR, _SEQUENCE, False),
        StructField("cluster_time", _POSITION, True),
        StructField("wall_time", TimestampType(), True),
        StructField("txn", StringType(), True),
        StructField("shard", StringType(), True),
    ]
)
"""Every table's schema (the same for all: a pure function, as the framework asks)."""


def mcdc_options(options: Mapping[str, str]) -> dict[str, str]:
    """The options that are mcdc's (long option names), without the framework's own."""
    return {k: v for k, v in options.items() if k.lower() not in FRAMEWORK_OPTIONS}


def namespace_of(table: str) -> Namespace:
    """The collection a table name names: ``db.coll`` (the collection's name may hold dots)."""
    db, dot, coll = table.partition(".") if isinstance(table, str) else ("", "", "")
    if not dot or not db or not coll:
        raise ConfigError(f"table {quoted(str(table))} is not a collection: name it as db.collection")
    return Namespace(db, coll)


def metadata(shard_key: tuple[str, ...] = ()) -> dict[str, Any]:
    """A table's metadata: keyed by the document's ``_id`` (by ``key`` where the collection is sharded on
    ``shard_key``'s fields), in the order of ``sequence``, deletes too."""
    keys = SHARDED_KEYS if shard_key else PRIMARY_KEYS
    return {"primary_keys": list(keys), "cursor_field": CURSOR, "ingestion_type": INGESTION_TYPE}


def shard_fields(pattern: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields of a shard key pattern a document key holds besides ``_id`` (none: keyed by ``_id``)."""
    return tuple(name for name in pattern if name != "_id")


def document_key(key: str, document: bytes | None, shard_key: tuple[str, ...]) -> str:
    """The ``key`` of a record: ``key`` (the row's, canonical Extended JSON) as it is without a shard key;
    else ``shard_key``'s fields (from ``document``'s BSON when given: a snapshot's row, whose key holds only
    ``_id``; else from the event's ``documentKey``, where a field may be named by its dotted path) in the
    key's order, then ``_id``. A field the document lacks is null, as the shard key reads it."""
    if not shard_key:
        return key
    given = json_util.loads(key, json_options=CANONICAL)
    source: Mapping[str, Any] = RawDocument(document, RAW_CODEC) if document is not None else given
    out = {path: _at(source, path) for path in shard_key}
    out["_id"] = given["_id"]
    return dumps_str(out)


def _at(doc: Mapping[str, Any], path: str) -> Any:
    if path in doc:
        return doc[path]
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, (Mapping, RawBSONDocument)) or part not in value:
            return None
        value = value[part]
    return value


def record_of(row: Row, shard_key: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The record of one of the data source's rows, or None when it makes none: DDL, and an update whose
    document was not looked up (deleted since, or its name taken by another collection: the delete or the
    next change of the document says the rest). ``shard_key``: the fields the collection is sharded on
    besides ``_id`` (see :func:`document_key`). A record's values are JSON-compatible."""
    r = dict(zip(NAMES, row, strict=True))
    op = r["op"]
    if op not in UPSERTS and op not in DELETES:
        return None
    if op in UPSERTS and r["document"] is None:
        return None
    key = r["key"]
    if key is None:
        return None
    wall = r["wall_time"]
    return {
        "_id": orjson.dumps(orjson.loads(key)["_id"]).decode(),
        "key": document_key(key, r["bson"] if op == "r" else None, shard_key),
        "op": op,
        "db": r["db"],
        "coll": r["coll"],
        "document": r["document"] if op in UPSERTS else None,
        CURSOR: r["sequence"],
        "cluster_time": r["cluster_time"],
        "wall_time": _iso(wall) if wall is not None else None,
        "txn": r["txn"],
        "shard": r["shard"],
    }


def _iso(value: datetime.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return value.isoformat()
