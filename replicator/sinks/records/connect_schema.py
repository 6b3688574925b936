"""Kafka Connect schemas for ``--schemas``: the ``{schema, payload}`` wrapping of Kafka Connect's JsonConverter.

The schemas follow Debezium's MongoDB connector: documents are strings named ``io.debezium.data.Json``,
the source block is ``io.debezium.connector.mongo.Source``, key and envelope are named after the topic
(``<prefix>.<db>.<collection>.Key`` / ``.Envelope``).
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

#: The ``snapshot`` enum's values, as Debezium 3.x's ``SnapshotRecord`` lists them (its MongoDB connector writes
#: ``true``, ``last``, ``false`` and ``incremental``; the others are its relational connectors').
_SNAPSHOT_VALUES = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"


def _field(field: str, kind: str, *, optional: bool = True, **extra: Any) -> Schema:
    return {"type": kind, "optional": optional, **extra, "field": field}


def _array(field: str, items: Schema) -> Schema:
    """An optional array field, its keys in the JsonConverter's order (``items`` before ``optional``)."""
    return {"type": "array", "items": items, "optional": True, "field": field}


def _json_field(field: str) -> Schema:
    return _field(field, "string", name="io.debezium.data.Json", version=1)


def _struct(
    name: str, fields: list[Schema], *, optional: bool = False, field: str | None = None, version: int | None = None
) -> Schema:
    schema: Schema = {"type": "struct", "fields": fields, "optional": optional, "name": name}
    if version is not None:
        schema["version"] = version
    if field is not None:
        schema["field"] = field
    return schema


def wrap(schema: Schema, payload: Any) -> dict[str, Any]:
    return {"schema": schema, "payload": payload}


def key_schema(name: str) -> Schema:
    return _struct(name, [_field("id", "string", optional=False)])


def _source(legacy: bool, *, rs: bool = True) -> Schema:
    fields = [
        _field("version", "string", optional=False),
        _field("connector", "string", optional=False),
        _field("name", "string", optional=False),
        _field("ts_ms", "int64", optional=False),
        _field("snapshot", "boolean", default=False)
        if legacy
        else _field(
            "snapshot",
            "string",
            name="io.debezium.data.Enum",
            version=1,
            parameters={"allowed": _SNAPSHOT_VALUES},
            default="false",
        ),
        _field("db", "string", optional=False),
        _field("sequence", "string"),
    ]
    if not legacy:  # Debezium 2.6+
        fields += [_field("ts_us", "int64"), _field("ts_ns", "int64")]
    if rs or legacy:  # mcdc's own; Debezium 2.x dropped it
        fields.append(_field("rs", "string", optional=False))
    fields += [
        _field("collection", "string", optional=False),
        _field("ord", "int32", optional=False),
    ]
    if legacy:
        fields += [_field("h", "int64"), _field("tord", "int64"), _field("stxnid", "string")]
    else:
        fields += [_field("lsid", "string"), _field("txnNumber", "int64"), _field("wallTime", "int64")]
    return _struct("io.debezium.connector.mongo.Source", fields, field="source", version=1)


_TRANSACTION = _struct(
    "event.block",
    [
        _field("id", "string", optional=False),
        _field("total_order", "int64", optional=False),
        _field("data_collection_order", "int64", optional=False),
    ],
    optional=True,
    field="transaction",
    version=1,
)

_UPDATE_DESCRIPTION = _struct(
    "io.debezium.connector.mongodb.changestream.updatedescription",
    [
        _array("removedFields", {"type": "string", "optional": False}),
        _json_field("updatedFields"),
        _array(
            "truncatedArrays",
            _struct(
                "io.debezium.connector.mongodb.changestream.truncatedarray",
                [_field("field", "string", optional=False), _field("size", "int32", optional=False)],
                version=1,
            ),
        ),
    ],
    optional=True,
    field="updateDescription",
    version=1,
)


def value_schema(name: str, *, legacy: bool, rs: bool = True) -> Schema:
    """The envelope's schema for one collection (``rs``: its source block has mcdc's ``rs``)."""
    if legacy:
        fields = [_json_field("after"), _json_field("patch"), _json_field("filter")]
    else:
        fields = [_json_field("before"), _json_field("after"), _UPDATE_DESCRIPTION]
    fields += [_source(legacy, rs=rs), _field("op", "string"), _field("ts_ms", "int64"), _TRANSACTION]
    return _struct(name, fields)


TX_KEY = _struct(
    "io.debezium.connector.common.TransactionMetadataKey", [_field("id", "string", optional=False)], version=1
)
TX_VALUE = _struct(
    "io.debezium.connector.common.TransactionMetadataValue",
    [
        _field("status", "string", optional=False),
        _field("id", "string", optional=False),
        _field("event_count", "int64"),
        _array(
            "data_collections",
            _struct(
                "event.collection",
                [_field("data_collection", "string", optional=False), _field("event_count", "int64", optional=False)],
                optional=True,
                version=1,
            ),
        ),
        _field("ts_ms", "int64", optional=False),
    ],
    version=1,
)
DDL_KEY = _struct("io.mcdc.connector.mongo.DdlKey", [_field("db", "string", optional=False)])


def _ddl_value(rs: bool) -> Schema:
    return _struct(
        "io.mcdc.connector.mongo.DdlValue",
        [
            _field("op", "string", optional=False),
            _field("db", "string", optional=False),
            _field("collection", "string"),
            _struct(
                "io.mcdc.connector.mongo.Namespace",
                [_field("db", "string", optional=False), _field("collection", "string")],
                optional=True,
                field="to",
            ),
            _json_field("operationDescription"),
            _source(False, rs=rs),
            _field("ts_ms", "int64"),
        ],
    )


#: mcdc's DDL records (``rs``: their source block has mcdc's ``rs``, as unless --extended-json debezium)
DDL_VALUE, DDL_VALUE_WITHOUT_RS = _ddl_value(True), _ddl_value(False)
HEARTBEAT_KEY = _struct("io.debezium.connector.common.ServerNameKey", [_field("serverName", "string", optional=False)])
HEARTBEAT_VALUE = _struct("io.debezium.connector.common.Heartbeat", [_field("ts_ms", "int64", optional=False)])
