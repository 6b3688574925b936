"""The JSON a record's documents, key and updatedFields are written in (``--extended-json``), chosen once per run.

``canonical`` (the default) and ``relaxed``
    MongoDB Extended JSON v2 (:mod:`replicator.bsonkit.extjson`): lossless in canonical mode. Documents are
    converted once; the key's ``_id`` is taken from the converted document.
``debezium``
    The bytes Debezium 3.6's MongoDB connector writes (:mod:`replicator.bsonkit.extjson_java`): documents in the
    Java driver's strict mode, the key's ``_id`` in its relaxed mode, ``updatedFields`` as
    ``BsonDocument.toJson()``. With the same key bytes, Kafka's default partitioner puts a document's records on
    the partition Debezium's went to, and a compacted topic keeps one key per document across a switch.

The encoder asks a :class:`JsonDialect` for those four things and nothing else: the default path calls the same
C functions as before (``to_json_value``, ``orjson.dumps``), bound once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import orjson
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit import extjson_java
from replicator.bsonkit.extjson import to_json_value
from replicator.events import ChangeEvent

#: the values --extended-json takes
DIALECTS = ("canonical", "relaxed", "debezium")


class JsonDialect:
    """How documents become JSON text in records. ``convert`` makes a document's intermediate form (Extended
    JSON data, or the Java dialect's text already), ``text`` its JSON text, ``key_id`` the JSON text of the
    event's ``_id`` (given the converted document, or None), ``fields`` an updatedFields document's text."""

    name = "canonical"
    #: Debezium 3.6's source block (no ``rs``, mcdc's own field)
    debezium_source = False

    def __init__(self, relaxed: bool = False) -> None:
        self.relaxed = relaxed
        self.convert: Callable[[Any], Any] = (
            functools.partial(to_json_value, relaxed=True) if relaxed else to_json_value
        )
        self.text: Callable[[Any], bytes] = orjson.dumps
        self.name = "relaxed" if relaxed else "canonical"

    def key_id(self, event: ChangeEvent, converted: Any) -> bytes:
        if converted is not None and "_id" in converted:
            return orjson.dumps(converted["_id"])
        return orjson.dumps(self.convert(event.document_key["_id"]))

    def fields(self, value: Any) -> str:
        return orjson.dumps(self.convert(value)).decode()


class DebeziumDialect(JsonDialect):
    """Debezium 3.6's bytes (see the module's docstring)."""

    name = "debezium"
    debezium_source = True

    def __init__(self) -> None:
        self.relaxed = False
        self.convert = extjson_java.strict
        self.text = _same

    def key_id(self, event: ChangeEvent, converted: Any) -> bytes:
        document = event.document
        if isinstance(document, RawBSONDocument):
            found = extjson_java.relaxed_key(document)
            if found is not None:
                return found
        key = event.document_key
        if isinstance(key, RawBSONDocument):  # an _id of a type the Python walk would not tell apart, say
            found = extjson_java.relaxed_key(key)
            if found is not None:
                return found
        return extjson_java.relaxed_id(key["_id"])

    def fields(self, value: Any) -> str:
        return extjson_java.relaxed(value).decode()


def _same(text: bytes) -> bytes:
    return text


def dialect(name: str) -> JsonDialect:
    """The dialect ``--extended-json NAME`` names."""
    if name == "debezium":
        return DebeziumDialect()
    return JsonDialect(relaxed=name == "relaxed")
