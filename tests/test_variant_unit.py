"""BSON documents in VARIANT's binary encoding (replicator/bsonkit/variant.py), read back by PySpark's own
decoder (``VariantVal.toPython``/``toJson``, no Spark session): each BSON type as the module's table says,
every document of the BSON corpus, and the sizes past one byte (over 255 fields, long strings)."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

import bson
import pytest
from bson import json_util
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import CANONICAL
from replicator.bsonkit.variant import encode, encode_bson
from tests.support.corpus import bson_corpus_documents

pytest.importorskip("pyspark")
from pyspark.sql.types import VariantVal

OID = ObjectId("65f0a1b2c3d4e5f601234567")
WHEN = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=datetime.UTC)
UUID = Binary(uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, 4)


def _read(document: dict[str, Any]) -> Any:
    with decimal.localcontext(prec=38):  # PySpark's reader makes decimals in the context's 28 digits
        return VariantVal(*encode_bson(bson.encode(document))).toPython()


def _ext(value: Any) -> Any:
    return json.loads(json_util.dumps(value, json_options=CANONICAL))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, 5),
        (-70000, -70000),
        (Int64(2**40), 2**40),
        (1.5, 1.5),
        ("hé", "hé"),
        ("x" * 100, "x" * 100),
        (True, True),
        (None, None),
        ({"z": 1, "a": [1, "two", {"k": 3.0}]}, {"a": [1, "two", {"k": 3.0}], "z": 1}),
        (WHEN, WHEN),
        (Decimal128("12.345"), decimal.Decimal("12.345")),
        (Decimal128("-1E+3"), decimal.Decimal("-1000")),
        (
            Decimal128("1234567890123456789012345678.901234"),
            decimal.Decimal("1234567890123456789012345678.901234"),
        ),
        (b"\x00\x01", b"\x00\x01"),
        (OID, "65f0a1b2c3d4e5f601234567"),
        # no VARIANT counterpart: their canonical Extended JSON
        (Decimal128("NaN"), {"$numberDecimal": "NaN"}),
        (Decimal128("1E-40"), {"$numberDecimal": "1E-40"}),
        (Decimal128("1E+40"), {"$numberDecimal": "1E+40"}),
        (UUID, _ext(UUID)),
        (Timestamp(4294967295, 7), {"$timestamp": {"t": 4294967295, "i": 7}}),
        (Regex("a.*", "i"), {"$regularExpression": {"pattern": "a.*", "options": "i"}}),
        (Code("x = 1"), {"$code": "x = 1"}),
        (MinKey(), {"$minKey": 1}),
        (MaxKey(), {"$maxKey": 1}),
        (DatetimeMS(2**62), {"$date": {"$numberLong": str(2**62)}}),
        (DBRef("c", 1), {"$ref": "c", "$id": 1}),
    ],
    ids=repr,
)
def test_each_bson_type_reads_back_as_the_table_says(value: Any, expected: Any) -> None:
    assert _read({"v": value}) == {"v": expected}


def test_a_long_is_a_long_and_an_int_an_int_in_the_encoding() -> None:
    """Spark's variant_get casts either way; the widths keep BSON's own (4 bytes, 8 bytes)."""
    int32, _ = encode({"v": 1})
    int64, _ = encode({"v": Int64(1)})
    assert len(int64) - len(int32) == 4


def test_objects_and_arrays_past_a_byte_of_size() -> None:
    wide = {f"f{i:03}": i for i in range(300)}
    long_array = [{"k": "v" * 70} for _ in range(300)]
    assert _read({"wide": wide, "long": long_array}) == {"wide": wide, "long": long_array}


def test_field_names_are_in_java_s_order_so_spark_finds_them() -> None:
    """A name with a character beyond the BMP sorts before U+FFFD in UTF-16 (Java's String order), not in
    code point order as Python sorts str: Spark's lookup by name is a binary search in that order."""
    document = {"\U0001f600": 1, "\ufffd": 2, "a": 3}
    variant = VariantVal(*encode(document))
    assert json.loads(variant.toJson()) == document
    value = variant.toPython()
    assert list(value) == ["a", "\U0001f600", "\ufffd"]


def test_every_document_of_the_bson_corpus_encodes_and_reads_back() -> None:
    for document in bson_corpus_documents():
        assert _read(document).keys() == document.keys()
