"""Deterministic test data: every BSON type and edge value, mixed ``_id`` types, and bulk documents.

Everything here is built from fixed values (no clock, no random seed drift), so two calls return equal
data and a replica can be compared byte for byte with what was written to the source.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import struct
import uuid
from collections.abc import Callable
from typing import Any

import pymongo
from bson import SON, encode
from bson.binary import (
    PYTHON_LEGACY,
    STANDARD,
    USER_DEFINED_SUBTYPE,
    Binary,
    BinaryVectorDtype,
)
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
from pymongo.collection import Collection
from pymongo.errors import OperationFailure

Document = dict[str, Any]
Client = pymongo.MongoClient[Document]

MAX_BSON_SIZE = 16 * 1024 * 1024
BIG_DOCUMENT_SIZE = MAX_BSON_SIZE - 4096
"""Size of the largest corpus document: the 16 MiB limit less a 4 KiB margin."""
OPTIONAL_IDS = frozenset({"keys_dotted", "keys_dollar", "dates_out_of_range"})
"""``_id`` of corpus documents that are legal BSON but that a server may refuse (load_corpus records it)."""
CANNOT_CREATE_INDEX = 67
_UUID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
_NEG_NAN = struct.unpack("<d", bytes.fromhex("000000000000f8ff"))[0]  # NaN with the sign bit set


def _nested(depth: int) -> Document:
    doc: Document = {"leaf": depth}
    for level in range(depth - 1, 0, -1):
        doc = {"level": level, "child": doc}
    return doc


def big_document(total_size: int = BIG_DOCUMENT_SIZE) -> Document:
    """A document of exactly ``total_size`` encoded bytes, half binary payload and half string."""
    doc: Document = {"_id": "big", "bin": Binary(b""), "text": ""}
    overhead = len(encode(doc))
    payload = total_size - overhead
    doc["bin"] = Binary(bytes(range(256)) * (payload // 2 // 256) + b"\x5a" * (payload // 2 % 256))
    doc["text"] = "x" * (payload - len(doc["bin"]))
    assert len(encode(doc)) == total_size
    return doc


def bson_corpus_documents() -> list[Document]:
    """One document per family of BSON values (every type pymongo can round-trip), plus size/depth extremes.

    Field order is deliberately not alphabetical, since a replica must keep it. Deprecated types
    (Symbol, Undefined, DBPointer) are left out: pymongo cannot write them back unchanged.
    """
    binaries = {f"subtype_{s}": Binary(b"\x00\x01\xfe\xff" * 4, s) for s in (0, 1, 2, 3, 5, 6, 7, 8)}
    binaries["subtype_4"] = Binary(_UUID.bytes, 4)
    binaries["user_defined"] = Binary(b"custom", USER_DEFINED_SUBTYPE)
    binaries["vector"] = Binary.from_vector([1.5, -2.0, 0.0], BinaryVectorDtype.FLOAT32)
    binaries["empty"] = Binary(b"")
    # fmt: off
    return [
        {"_id": 1, "z": 1.5, "a": -0.0, "m": 0.0, "nan": math.nan, "neg_nan": _NEG_NAN, "inf": math.inf,
         "neg_inf": -math.inf, "big": 1e308, "max": 1.7976931348623157e308, "tiny": 5e-324, "pi": math.pi},
        {"_id": Int64(2), "int32_min": -(2**31), "int32_max": 2**31 - 1, "zero": 0,
         "int64_min": Int64(-(2**63)), "int64_max": Int64(2**63 - 1), "int64_small": Int64(1)},
        {"_id": 3.25, "nan": Decimal128("NaN"), "neg_zero": Decimal128("-0"), "inf": Decimal128("Infinity"),
         "neg_inf": Decimal128("-Infinity"), "trailing": Decimal128("1.000"),
         "neg_scaled": Decimal128("-0.00"), "snan": Decimal128("sNaN"),
         "digits34": Decimal128("1234567890123456789012345678901234"),
         "frac34": Decimal128("0.1234567890123456789012345678901234"),
         "max": Decimal128("9.999999999999999999999999999999999E+6144"), "min_pos": Decimal128("1E-6176")},
        {"_id": "strings", "empty": "", "ascii": "plain", "accents": "àéîõü ñ ß", "cjk": "漢字かなカナ한글",
         "rtl": "שלום مرحبا", "emoji": "🙂👩‍👩‍👧‍👦🏳️‍🌈", "combining": "e\u0301", "controls": "\t\n\r\x01\x7f",
         "bom": "\ufeffbom", "astral": "\U0001d11e\U0010fffd", "long": "abc" * 10_000},
        {"_id": ObjectId("000000000000000000000001"), "b": {"y": 2, "x": {"deep": [1, {"k": "v"}]}},
         "empty_doc": {}, "empty_array": [], "nested_arrays": [[1, 2], [[3]], []],
         "mixed_array": [1, "two", 3.0, None, True, {"six": 6}, [7], Int64(8), Decimal128("9")],
         "array_of_docs": [{"b": 1, "a": 2}, {"a": 3}], "": "empty key", "é🙂": "unicode key"},
        {"_id": Decimal128("6"), **binaries, "uuid_standard": Binary.from_uuid(_UUID, STANDARD),
         "uuid_python_legacy": Binary.from_uuid(_UUID, PYTHON_LEGACY)},
        {"_id": dt.datetime(2000, 1, 1), "oid": ObjectId("5f0000000000000000000abc"), "t": True, "f": False,
         "null": None, "regex": Regex("^a.*", "imsx"), "regex_plain": Regex("b|c", ""),
         "code": Code("function () { return 1; }"),
         "code_w_scope": Code("function () { return x; }", {"x": 1}),
         "ts": Timestamp(1_700_000_000, 7), "nested_zero_ts": {"ts": Timestamp(0, 0)},
         "min": MinKey(), "max": MaxKey()},
        {"_id": "dates", "pre_1900": dt.datetime(1899, 12, 31, 23, 59, 59), "y1900": dt.datetime(1900, 1, 1),
         "epoch": dt.datetime(1970, 1, 1), "before_epoch": DatetimeMS(-1),
         "ms": dt.datetime(2024, 2, 29, 12, 34, 56, 789000),
         "year1": dt.datetime(1, 1, 1), "year9999": dt.datetime(9999, 12, 31, 23, 59, 59, 999000)},
        {"_id": "dates_out_of_range", "year_minus_100": DatetimeMS(-65_322_892_800_000),  # -0100-01-01T00:00Z
         "year_20000": DatetimeMS(568_971_820_800_000)},  # +20000-01-01T00:00Z
        {"_id": "dbrefs", "plain": DBRef("things", ObjectId("000000000000000000000002")),
         "with_db": DBRef("things", 5, database="other"),
         "with_extra": DBRef("things", "k", database="other", note="extra field", n=2)},
        {"_id": "deep", "root": _nested(80)},
        {"_id": "keys_dotted", "a.b": 1, "nested": {"c.d": {"e.f": 2}}},
        {"_id": "keys_dollar", "plain": 1, "nested": {"ok": 1, "$dollar": 2}, "$top_not_first": 3},
        big_document(),
    ]
    # fmt: on


# One entry per _id bracket: a fixed value, and a maker of distinct values for doc number i (i >= 0).
# Numbers of all four numeric types compare equal across types, so each maker uses its own residue.
_MIXED_ID_TYPES: dict[str, tuple[Any, Callable[[int], Any] | None]] = {
    "minKey": (MinKey(), None),
    "null": (None, None),
    "double_nan": (math.nan, None),  # NaN sorts below every other number
    "decimal": (Decimal128("-4.25"), lambda i: Decimal128(f"{4 * i + 3}.25")),
    "double": (-3.5, lambda i: 4 * i + 2.5),
    "long": (Int64(-2), lambda i: Int64(4 * i + 1)),
    "int": (-1, lambda i: 4 * i),
    "string": ("id", lambda i: f"id-{i:06d}"),
    "object": (SON([("b", 1), ("a", 2)]), lambda i: SON([("k", i), ("a", "x")])),
    "binData": (b"\x00\xff", lambda i: i.to_bytes(4, "big")),
    "uuid": (Binary.from_uuid(_UUID), lambda i: Binary.from_uuid(uuid.UUID(int=i + 1))),
    "objectId": (ObjectId("ffffffffffffffffffffffff"), lambda i: ObjectId(i.to_bytes(12, "big"))),
    "bool_false": (False, None),
    "bool_true": (True, None),
    "date": (dt.datetime(1969, 7, 20, 20, 17), lambda i: dt.datetime(2001, 1, 1) + dt.timedelta(seconds=i)),
    "timestamp": (Timestamp(1, 1), lambda i: Timestamp(1_600_000_000 + i, 1)),
    "maxKey": (MaxKey(), None),
}
MIXED_ID_BRACKETS = tuple(_MIXED_ID_TYPES)


def mixed_id_values() -> list[Any]:
    """One ``_id`` of every kind allowed, in MongoDB's sort order; all distinct under MongoDB equality."""
    return [fixed for fixed, _ in _MIXED_ID_TYPES.values()]


def mixed_id_documents(n: int) -> list[Document]:
    """``n`` documents (n >= number of brackets) whose ``_id`` types cycle through every bracket."""
    docs = [{"_id": fixed, "bracket": name} for name, (fixed, _) in _MIXED_ID_TYPES.items()]
    makers = [(name, make) for name, (_, make) in _MIXED_ID_TYPES.items() if make is not None]
    for i in range(n - len(docs)):
        name, make = makers[i % len(makers)]
        docs.append({"_id": make(i), "bracket": name})
    return [{**doc, "n": n} for n, doc in enumerate(docs)]


def _errmsg(exc: OperationFailure) -> str:
    return str(exc.details.get("errmsg", exc) if exc.details else exc)


def _indexed_document(i: int) -> Document:
    doc: Document = {
        "_id": i,
        "sku": f"sku-{i % 50}",
        "region": i // 50,
        "qty": i,
        "name": f"Name{i}",
        "created": dt.datetime(2020, 1, 1) + dt.timedelta(hours=i),
        "location": {"type": "Point", "coordinates": [-180 + i % 360, -90 + i % 180]},
        "expires_at": dt.datetime(2100, 1, 1),
    }
    if i % 3 == 0:
        doc["optional"] = i
    return doc


def _create_indexes(coll: Collection[Document]) -> list[str]:
    ci = {"locale": "en", "strength": 2}
    coll.create_index([("sku", 1), ("region", -1)], unique=True)
    coll.create_index("qty", partialFilterExpression={"qty": {"$gt": 10}})
    coll.create_index("expires_at", expireAfterSeconds=10 * 365 * 24 * 3600)
    coll.create_index("optional", sparse=True)
    coll.create_index([("location", "2dsphere")])
    coll.create_index([("created", -1)])
    coll.create_index("name", name="by_name_ci", collation=ci)
    skipped = []
    for key in ([("h", "hashed")], [("description", "text")], [("$**", 1)]):
        try:
            coll.create_index(key)
        except OperationFailure as exc:
            if exc.code != CANNOT_CREATE_INDEX:
                raise
            skipped.append(f"{coll.full_name}: {key[0][0]}_{key[0][1]} ({_errmsg(exc)})")
    return skipped


def load_corpus(client: Client, db_name: str = "corpus", mixed_count: int = 3000) -> dict[str, Any]:
    """Create the corpus on ``client``; return namespace counts, refused documents and skipped indexes.

    Collections: ``types`` (bson_corpus_documents), ``mixed_ids``, ``capped``, ``validated`` (validator and
    collation), ``validated_view`` (a view), ``indexed`` (many index kinds), plus ``<db_name>_other.things``.
    """
    db = client[db_name]
    rejected: dict[str, str] = {}
    for doc in bson_corpus_documents():
        try:
            db.types.insert_one(doc)
        except OperationFailure as exc:
            if not (isinstance(doc["_id"], str) and doc["_id"] in OPTIONAL_IDS):  # Decimal128 is unhashable
                raise
            rejected[doc["_id"]] = _errmsg(exc)
    db.mixed_ids.insert_many(mixed_id_documents(mixed_count))
    db.create_collection("capped", capped=True, size=64 * 1024, max=100)
    for i in range(150):  # one at a time: some servers trim a capped collection only between inserts
        db.capped.insert_one({"_id": i, "seq": i})
    db.create_collection(
        "validated",
        validator={
            "$jsonSchema": {
                "bsonType": "object",
                "required": ["name"],
                "properties": {"name": {"bsonType": "string"}},
            }
        },
        validationLevel="moderate",
        validationAction="error",
        collation={"locale": "fr", "strength": 1},
    )
    db.validated.insert_many([{"_id": i, "name": n} for i, n in enumerate(["côte", "cote", "Coté", "zèbre"])])
    view_pipeline = [{"$match": {"name": {"$ne": "zèbre"}}}]
    db.create_collection("validated_view", viewOn="validated", pipeline=view_pipeline)
    skipped = _create_indexes(db.indexed)
    db.indexed.insert_many([_indexed_document(i) for i in range(200)])
    other = client[f"{db_name}_other"]
    other.things.insert_many([{"_id": i, "v": str(i)} for i in range(10)])
    other["dotted.name"].insert_one({"_id": 1})
    names = {
        f"{d.name}.{n}": d[n].count_documents({})
        for d in (db, other)
        for n in d.list_collection_names()
        if not n.startswith("system.")
    }  # system.views exists on some servers only
    return {
        "namespaces": dict(sorted(names.items())),
        "rejected_documents": rejected,
        "skipped_indexes": skipped,
        "views": [f"{db_name}.validated_view"],
    }


def load_bulk(client: Client, db_name: str, coll_name: str, n: int, doc_size: int = 1024, seed: int = 0) -> int:
    """Insert ``n`` synthetic documents of about ``doc_size`` bytes each (``_id`` 0..n-1); return n."""
    rng = random.Random(seed)
    coll = client[db_name][coll_name]
    sample = _bulk_document(0, rng, "")
    padding = "p" * max(0, doc_size - len(encode(sample)))
    batch: list[Document] = []
    for i in range(n):
        batch.append(_bulk_document(i, rng, padding))
        if len(batch) == 1000:
            coll.insert_many(batch, ordered=False)
            batch = []
    if batch:
        coll.insert_many(batch, ordered=False)
    return n


def _bulk_document(i: int, rng: random.Random, padding: str) -> Document:
    return {
        "_id": i,
        "name": f"user-{i:08d}",
        "score": rng.random() * 1000,
        "count": rng.randrange(1 << 40),
        "active": i % 2 == 0,
        "at": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i),
        "tags": [f"t{rng.randrange(20)}" for _ in range(3)],
        "address": {"city": f"c{i % 97}", "zip": i % 100_000},
        "ref": ObjectId(i.to_bytes(12, "big")),
        "pad": padding,
    }
