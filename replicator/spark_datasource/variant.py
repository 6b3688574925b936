"""``option("document-type", "variant")``: the ``document`` and ``before`` columns as Spark's VARIANT
(``document:path::type`` and ``variant_get`` in SQL), made from the documents' BSON
(:mod:`replicator.bsonkit.variant` says how each BSON type maps). The default, ``json``, keeps them
Extended JSON strings. A data-source-only option: the CLI has no VARIANT to write.

PySpark reads a ``VariantVal`` from a Python data source's rows into a VARIANT column (checked on 4.3 by
tests/test_spark_variant.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from bson import json_util
from bson.raw_bson import RawBSONDocument
from pyspark.sql.types import VariantVal

from replicator.bsonkit.extjson import CANONICAL
from replicator.bsonkit.variant import TooLarge, encode, encode_bson
from replicator.errors import ConfigError
from replicator.events.rows import COLUMNS, NAMES, Row
from replicator.spark_datasource.options import DOCUMENT_TYPE

log = logging.getLogger("mcdc.spark")

#: The option's values.
JSON, VARIANT = "json", "variant"
TYPES = (JSON, VARIANT)
#: The columns that become VARIANT.
VARIANT_COLUMNS = ("document", "before")
#: The rows' schema with ``document`` and ``before`` as VARIANT.
VARIANT_SCHEMA = ", ".join(f"{name} {'variant' if name in VARIANT_COLUMNS else kind}" for name, kind in COLUMNS)

_DOCUMENT, _BSON, _BEFORE, _CHANGE = (NAMES.index(name) for name in ("document", "bson", "before", "change"))
_PRE_IMAGE = "fullDocumentBeforeChange"


def document_type(options: Mapping[str, str]) -> str:
    """The ``document-type`` option's value (json by default), checked as the option table checks a choice."""
    given = next((value for key, value in options.items() if key.lower() == DOCUMENT_TYPE), JSON)
    if given.strip().lower() not in TYPES:
        raise ConfigError(f"option {DOCUMENT_TYPE} must be one of {', '.join(TYPES)}, got {given!r}")
    return given.strip().lower()


def as_variant(rows: Iterable[Row]) -> Iterator[Row]:
    """The rows with ``document`` (from the ``bson`` column) and ``before`` (from the change event's
    pre-image) as VariantVals. A document over VARIANT's 16 MiB is left null (its ``bson`` column holds
    it), with a warning."""
    for row in rows:
        values = list(row)
        document = row[_BSON]
        values[_DOCUMENT] = _variant(encode_bson, bytes(document), row) if document is not None else None
        if row[_BEFORE] is not None:
            values[_BEFORE] = _variant(_before, row, row)
        yield tuple(values)


def _before(row: Row) -> tuple[bytes, bytes]:
    """The pre-image's variant: from the change event's own bytes, else the column's Extended JSON."""
    if row[_CHANGE] is not None:
        pre_image = RawBSONDocument(bytes(row[_CHANGE])).get(_PRE_IMAGE)
        if isinstance(pre_image, RawBSONDocument):
            return encode_bson(bytes(pre_image.raw))
    return encode(json_util.loads(row[_BEFORE], json_options=CANONICAL))


def _variant(make: Callable[[Any], tuple[bytes, bytes]], source: Any, row: Row) -> VariantVal | None:
    try:
        value, metadata = make(source)
    except TooLarge as exc:
        log.warning("a document of %s.%s is %s: its VARIANT column is null (bson holds it)", row[1], row[2], exc)
        return None
    return VariantVal(value, metadata)
