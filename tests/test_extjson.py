"""The fast Extended JSON encoder (replicator.bsonkit.extjson.to_json_value / dumps_bytes / dumps_str).

The oracle is pymongo's json_util with the module's CANONICAL / RELAXED options: for every value the fast
encoder must give the same JSON data (same types, same key order, same float bits), and in canonical mode
the JSON must decode back to the very same BSON bytes.
"""

from __future__ import annotations

import collections
import datetime as dt
import enum
import json
import math
import random
import re
import struct
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import bson
import orjson
import pytest
from bson import SON, json_util
from bson.binary import PYTHON_LEGACY, STANDARD, Binary, UuidRepresentation
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.errors import InvalidBSON
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import (
    CANONICAL,
    RELAXED,
    dumps_bytes,
    dumps_str,
    from_jsonable,
    to_json_value,
    to_jsonable,
)
from tests.support.corpus import MIXED_ID_BRACKETS, bson_corpus_documents, mixed_id_values

CORPUS = bson_corpus_documents()
CORPUS_IDS = [f"{i}-{str(doc['_id'])[:20]}" for i, doc in enumerate(CORPUS)]
MODES = pytest.mark.parametrize("relaxed", [False, True], ids=["canonical", "relaxed"])
NEG_NAN = struct.unpack("<d", bytes.fromhex("000000000000f8ff"))[0]
MAX_UTC_MS = 253_402_300_799_999
NOT_REPRESENTABLE = {"neg_nan", "snan"}
"""Corpus fields Extended JSON cannot carry bit for bit: it has one NaN, so a double NaN with the sign bit set
and a Decimal128 sNaN both become "NaN" (json_util does the same; see test_nan_payloads_are_written_as_nan)."""
# json_util reading a RawBSONDocument decodes it with the document's own options: make those lossless too.
RAW_JSON_UTIL_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)


def strict(data: Any) -> Any:
    """JSON data in a form where == also checks types, key order and float bits (-0.0 != 0.0, 1 != 1.0)."""
    if type(data) is dict:
        return ("object", [(k, strict(v)) for k, v in data.items()])
    if type(data) is list:
        return ("array", [strict(v) for v in data])
    if type(data) is float:
        return ("float", struct.pack("<d", data).hex() if data == data else "nan")
    assert type(data) in (str, int, bool, type(None)), f"not plain JSON data: {type(data)!r}"
    return (type(data).__name__, data)


def oracle(value: Any, relaxed: bool) -> Any:
    return strict(json.loads(json_util.dumps(value, json_options=RELAXED if relaxed else CANONICAL)))


def fast(value: Any, relaxed: bool) -> Any:
    """What the fast encoder gives, through orjson; also checks that the three entry points agree."""
    data = to_json_value(value, relaxed=relaxed)
    encoded = dumps_bytes(value, relaxed=relaxed)
    assert encoded == orjson.dumps(data)
    assert dumps_str(value, relaxed=relaxed) == encoded.decode()
    parsed = strict(json.loads(encoded))
    assert strict(data) == parsed  # to_json_value is plain data, equal to what the JSON text says
    return parsed


def raw(doc: Mapping[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


def assert_same_as_json_util(value: Any, relaxed: bool) -> None:
    assert fast(value, relaxed) == oracle(value, relaxed)


# --- the corpus -----------------------------------------------------------------------------------------------


@MODES
@pytest.mark.parametrize("doc", CORPUS, ids=CORPUS_IDS)
def test_corpus_dict_matches_json_util(doc: dict[str, Any], relaxed: bool) -> None:
    assert_same_as_json_util(doc, relaxed)


@MODES
@pytest.mark.parametrize("doc", CORPUS, ids=CORPUS_IDS)
def test_corpus_raw_matches_json_util(doc: dict[str, Any], relaxed: bool) -> None:
    encoded = bson.encode(doc)
    expected = oracle(RawBSONDocument(encoded, codec_options=RAW_JSON_UTIL_OPTIONS), relaxed)
    assert expected == oracle(doc, relaxed)
    assert fast(RawBSONDocument(encoded), relaxed) == expected


@pytest.mark.parametrize("form", ["dict", "raw"])
@pytest.mark.parametrize("doc", CORPUS, ids=CORPUS_IDS)
def test_corpus_canonical_round_trip_is_byte_exact(doc: dict[str, Any], form: str) -> None:
    original = bson.encode(doc)
    back = json_util.loads(dumps_str(doc if form == "dict" else RawBSONDocument(original)), json_options=CANONICAL)
    assert list(back) == list(doc)
    lossy = NOT_REPRESENTABLE & doc.keys()
    if not lossy:
        assert bson.encode(back) == original
        return
    differing = {key for key in doc if bson.encode({key: doc[key]}) != bson.encode({key: back[key]})}
    assert differing == lossy
    assert bson.encode({k: v for k, v in back.items() if k not in lossy}) == bson.encode(
        {k: v for k, v in doc.items() if k not in lossy}
    )


@MODES
def test_corpus_output_is_new_plain_data_and_input_untouched(relaxed: bool) -> None:
    for doc in CORPUS[:-1]:  # the 16 MiB document is covered above
        before = bson.encode(doc)
        document = raw(doc)
        first = to_json_value(document, relaxed=relaxed)
        strict(first)  # asserts plain types only
        assert strict(to_json_value(document, relaxed=relaxed)) == strict(first)  # decoding is not cached
        assert strict(to_json_value(doc, relaxed=relaxed)) == strict(first)
        assert bson.encode(doc) == before


def test_nan_payloads_are_written_as_nan_like_json_util() -> None:
    for value, expected in (
        (NEG_NAN, b'{"$numberDouble":"NaN"}'),
        (Decimal128("sNaN"), b'{"$numberDecimal":"NaN"}'),
        (Decimal128("-NaN"), b'{"$numberDecimal":"NaN"}'),
        (Decimal128("-sNaN"), b'{"$numberDecimal":"NaN"}'),
    ):
        for relaxed in (False, True):
            assert dumps_bytes(value, relaxed=relaxed) == expected
            assert_same_as_json_util(value, relaxed)
            assert_same_as_json_util(raw({"v": value}), relaxed)


@MODES
@pytest.mark.parametrize("value", mixed_id_values(), ids=MIXED_ID_BRACKETS)
def test_mixed_ids(value: Any, relaxed: bool) -> None:
    assert_same_as_json_util(value, relaxed)
    assert_same_as_json_util({"_id": value}, relaxed)
    assert fast(raw({"_id": value}), relaxed) == oracle({"_id": value}, relaxed)
    if not relaxed:
        back = json_util.loads(dumps_str(raw({"_id": value})), json_options=CANONICAL)
        assert bson.encode(back) == bson.encode({"_id": value})


# --- numbers --------------------------------------------------------------------------------------------------

FLOATS = [
    1.0,
    -1.0,
    0.0,
    -0.0,
    0.1,
    1 / 3,
    math.pi,
    123456789.0,
    1e15 + 0.3,
    1e16,
    1e22,
    1e100,
    -1e100,
    1e-100,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
    NEG_NAN,
]


@MODES
@pytest.mark.parametrize("value", FLOATS, ids=[repr(f) for f in FLOATS])
def test_floats(value: float, relaxed: bool) -> None:
    assert_same_as_json_util(value, relaxed)
    assert_same_as_json_util([value], relaxed)
    assert fast(raw({"v": value, "a": [value]}), relaxed) == oracle({"v": value, "a": [value]}, relaxed)
    out = json.loads(dumps_bytes(value, relaxed=relaxed))
    if math.isfinite(value):
        number = out if relaxed else float(out["$numberDouble"])
        assert struct.pack("<d", number) == struct.pack("<d", value)  # the exact double, sign of zero included


def test_float_texts() -> None:
    assert dumps_bytes(1.0) == b'{"$numberDouble":"1.0"}'
    assert dumps_bytes(-0.0) == b'{"$numberDouble":"-0.0"}'
    assert dumps_bytes(1e100) == b'{"$numberDouble":"1e+100"}'
    assert dumps_bytes(5e-324) == b'{"$numberDouble":"5e-324"}'
    assert dumps_bytes(math.inf) == b'{"$numberDouble":"Infinity"}'
    assert dumps_bytes(-math.inf, relaxed=True) == b'{"$numberDouble":"-Infinity"}'
    assert dumps_bytes(math.nan, relaxed=True) == b'{"$numberDouble":"NaN"}'
    assert dumps_bytes(1.0, relaxed=True) == b"1.0"
    assert dumps_bytes(-0.0, relaxed=True) == b"-0.0"
    assert json.loads(dumps_bytes(1e100, relaxed=True)) == 1e100


INTS: list[int] = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**53 + 1, 2**63 - 1, -(2**63)]
INT64S: list[int] = [Int64(0), Int64(-1), Int64(2**31 - 1), Int64(2**31), Int64(2**63 - 1), Int64(-(2**63))]


@MODES
@pytest.mark.parametrize("value", INTS + INT64S, ids=[f"{type(v).__name__}({v})" for v in INTS + INT64S])
def test_integers(value: int, relaxed: bool) -> None:
    assert_same_as_json_util(value, relaxed)
    assert_same_as_json_util({"v": value, "a": [value]}, relaxed)
    assert fast(raw({"v": value, "a": [value]}), relaxed) == oracle({"v": value, "a": [value]}, relaxed)


def test_integer_texts() -> None:
    assert dumps_bytes(2**31 - 1) == b'{"$numberInt":"2147483647"}'
    assert dumps_bytes(-(2**31)) == b'{"$numberInt":"-2147483648"}'
    assert dumps_bytes(2**31) == b'{"$numberLong":"2147483648"}'
    assert dumps_bytes(Int64(1)) == b'{"$numberLong":"1"}'
    assert dumps_bytes(Int64(-(2**63)), relaxed=True) == b"-9223372036854775808"
    assert dumps_bytes([True, False, None]) == b"[true,false,null]"  # bool is not an int here
    assert dumps_bytes(raw({"i": 1, "l": 2**40})) == b'{"i":{"$numberInt":"1"},"l":{"$numberLong":"1099511627776"}}'
    assert type(to_json_value(Int64(5), relaxed=True)) is int


# --- dates ----------------------------------------------------------------------------------------------------

PLUS_ONE = dt.timezone(dt.timedelta(hours=1))
DATES: list[Any] = [
    dt.datetime(1970, 1, 1),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999000),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    dt.datetime(1, 1, 1),
    dt.datetime(1899, 12, 31, 23, 59, 59),
    dt.datetime(2024, 2, 29, 12, 34, 56, 789000),
    dt.datetime(2024, 1, 1, 0, 0, 0, 500),  # below a millisecond: truncated, and no fraction written
    dt.datetime(2024, 1, 1, 0, 0, 0, 1500),
    dt.datetime(2024, 1, 1, 0, 0, 0, 10000),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999000),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2020, 1, 1, 12, 0, 0, 123000, tzinfo=PLUS_ONE),
    dt.datetime(2020, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))),
    dt.datetime(1970, 1, 1, 0, 30, tzinfo=PLUS_ONE),  # 1969-12-31T23:30Z: before the epoch
    dt.datetime(1969, 12, 31, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-1))),  # 1970-01-01T00:30Z
    DatetimeMS(-1),
    DatetimeMS(0),
    DatetimeMS(1),
    DatetimeMS(MAX_UTC_MS),
    DatetimeMS(MAX_UTC_MS + 1),
    DatetimeMS(-65_322_892_800_000),  # year -100
    DatetimeMS(568_971_820_800_000),  # year 20000
    DatetimeMS(2**63 - 1),
    DatetimeMS(-(2**63)),
]


@MODES
@pytest.mark.parametrize("value", DATES, ids=[repr(d) for d in DATES])
def test_dates(value: Any, relaxed: bool) -> None:
    assert_same_as_json_util(value, relaxed)
    assert_same_as_json_util({"d": value, "a": [value]}, relaxed)
    document = raw({"d": value, "a": [value]})
    expected = oracle(RawBSONDocument(document.raw, codec_options=RAW_JSON_UTIL_OPTIONS), relaxed)
    assert fast(document, relaxed) == expected
    if not relaxed:
        back = json_util.loads(dumps_str(document), json_options=CANONICAL)
        assert bson.encode(back) == document.raw


def test_date_texts() -> None:
    assert dumps_bytes(dt.datetime(2024, 2, 29, 12, 34, 56, 789000)) == b'{"$date":{"$numberLong":"1709210096789"}}'
    assert dumps_bytes(dt.datetime(2024, 2, 29, 12, 34, 56, 789000), relaxed=True) == (
        b'{"$date":"2024-02-29T12:34:56.789Z"}'
    )
    assert dumps_bytes(dt.datetime(2024, 1, 1, 0, 0, 0, 999), relaxed=True) == b'{"$date":"2024-01-01T00:00:00Z"}'
    assert dumps_bytes(dt.datetime(2024, 1, 1, 0, 0, 0, 10000), relaxed=True) == b'{"$date":"2024-01-01T00:00:00.010Z"}'
    assert dumps_bytes(dt.datetime(1969, 12, 31, 23, 59, 59, 999000), relaxed=True) == (
        b'{"$date":{"$numberLong":"-1"}}'
    )
    assert dumps_bytes(DatetimeMS(MAX_UTC_MS), relaxed=True) == b'{"$date":"9999-12-31T23:59:59.999Z"}'
    assert dumps_bytes(DatetimeMS(MAX_UTC_MS + 1), relaxed=True) == b'{"$date":{"$numberLong":"253402300800000"}}'
    assert dumps_bytes(dt.datetime(2020, 1, 1, 12, tzinfo=PLUS_ONE), relaxed=True) == (
        b'{"$date":"2020-01-01T12:00:00+0100"}'
    )
    assert dumps_bytes(raw({"d": DatetimeMS(-65_322_892_800_000)}), relaxed=True) == (
        b'{"d":{"$date":{"$numberLong":"-65322892800000"}}}'
    )


# --- strings and keys -----------------------------------------------------------------------------------------

STRINGS = [
    "",
    "plain",
    "àéîõü ñ ß",
    "漢字かなカナ한글",
    "שלום مرحبا",
    "🙂👩‍👩‍👧‍👦",
    "\U0001d11e\U0010ffff",
    "\x00",
    "a\x00b\x00",
    "".join(chr(c) for c in range(32)),
    "\x7f\x80\x9f",
    "\u2028\u2029",
    '"quoted" \\back\\slash/ </script>',
    "\ud7ff\ue000\ufeff\uffff",
    "x" * 100_000,
]


@MODES
@pytest.mark.parametrize("value", STRINGS, ids=[f"s{i}" for i in range(len(STRINGS))])
def test_strings(value: str, relaxed: bool) -> None:
    assert json.loads(dumps_bytes(value, relaxed=relaxed)) == value
    doc: dict[str, Any] = {"v": value, "a": [value]}
    if "\x00" not in value:  # BSON keys are C strings
        doc[value] = 1
    assert_same_as_json_util(doc, relaxed)
    assert fast(raw(doc), relaxed) == oracle(doc, relaxed)
    if not relaxed:
        assert bson.encode(json_util.loads(dumps_str(raw(doc)), json_options=CANONICAL)) == bson.encode(doc)


@MODES
def test_key_order_is_kept(relaxed: bool) -> None:
    doc = {
        "z": 1,
        "a": {"y": 1, "b": 2, "$x": 3},
        "m.n": [{"q": 1, "p": 2}],
        "$dollar": "not first",
        "": "empty key",
        "é🙂": 2.5,
        "id": 0,  # not _id, which bson.encode moves to the front of a top-level document
    }
    for value in (doc, raw(doc), SON(doc), collections.OrderedDict(doc)):
        out = json.loads(dumps_bytes(value, relaxed=relaxed))
        assert list(out) == list(doc)
        assert list(out["a"]) == ["y", "b", "$x"]
        assert list(out["m.n"][0]) == ["q", "p"]
        assert strict(out) == oracle(doc, relaxed)


# --- the other BSON types -------------------------------------------------------------------------------------

UUID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
OTHERS: list[Any] = [
    ObjectId("5f0000000000000000000abc"),
    b"",
    b"\x00\xff",
    *[Binary(b"\x00\x01\xfe\xff" * 3, subtype) for subtype in (0, 1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0xFF)],
    Binary.from_uuid(UUID, STANDARD),
    Binary.from_uuid(UUID, PYTHON_LEGACY),
    Binary(b"", 5),
    Decimal128("0"),
    Decimal128("-0"),
    Decimal128("1.000"),
    Decimal128("-0.00"),
    Decimal128("1E+3"),
    Decimal128("Infinity"),
    Decimal128("-Infinity"),
    Decimal128("NaN"),
    Decimal128("9.999999999999999999999999999999999E+6144"),
    Decimal128("1E-6176"),
    Timestamp(0, 0),
    Timestamp(1_700_000_000, 7),
    Timestamp(2**32 - 1, 2**32 - 1),
    Regex("^a.*", "imsx"),
    Regex("b|c", ""),
    Regex("all", "ilmsux"),
    Regex(b"bytes pattern", "i"),
    re.compile("a.b", re.I | re.M | re.S | re.X),
    re.compile(b"raw bytes"),
    Code("function () { return 1; }"),
    Code("function () { return x; }", {}),
    Code("f", {"x": 1, "l": Int64(2), "d": dt.datetime(2000, 1, 1), "n": {"f": 1.5}}),
    DBRef("things", ObjectId("000000000000000000000002")),
    DBRef("things", 5, database="other"),
    DBRef("things", {"k": 1, "j": [Int64(2)]}, database="other", note="extra", n=2, when=dt.datetime(1960, 1, 1)),
    MinKey(),
    MaxKey(),
    None,
    True,
    False,
    [],
    {},
    [[[]], {}, [{}]],
]


@MODES
@pytest.mark.parametrize("value", OTHERS, ids=[f"{type(v).__name__}{i}" for i, v in enumerate(OTHERS)])
def test_other_types(value: Any, relaxed: bool) -> None:
    assert_same_as_json_util(value, relaxed)
    doc = {"v": value, "a": [value, {"v": value}]}
    assert_same_as_json_util(doc, relaxed)
    document = raw(doc)
    assert fast(document, relaxed) == oracle(
        RawBSONDocument(document.raw, codec_options=RAW_JSON_UTIL_OPTIONS), relaxed
    )
    if not relaxed:
        assert bson.encode(json_util.loads(dumps_str(document), json_options=CANONICAL)) == document.raw


def test_type_texts() -> None:
    assert dumps_bytes(ObjectId("5f0000000000000000000abc")) == b'{"$oid":"5f0000000000000000000abc"}'
    assert dumps_bytes(Binary(b"\x00\xff", 0x80)) == b'{"$binary":{"base64":"AP8=","subType":"80"}}'
    assert dumps_bytes(b"") == b'{"$binary":{"base64":"","subType":"00"}}'
    assert dumps_bytes(Regex("a", "xsmi")) == b'{"$regularExpression":{"pattern":"a","options":"imsx"}}'
    assert dumps_bytes(Timestamp(5, 6), relaxed=True) == b'{"$timestamp":{"t":5,"i":6}}'
    assert dumps_bytes(Code("f", {"x": 1})) == b'{"$code":"f","$scope":{"x":{"$numberInt":"1"}}}'
    assert dumps_bytes(Code("f", {"x": 1}), relaxed=True) == b'{"$code":"f","$scope":{"x":1}}'
    assert dumps_bytes(DBRef("c", 1, "db", extra=2)) == (
        b'{"$ref":"c","$id":{"$numberInt":"1"},"$db":"db","extra":{"$numberInt":"2"}}'
    )
    assert dumps_bytes([MinKey(), MaxKey()]) == b'[{"$minKey":1},{"$maxKey":1}]'
    assert dumps_bytes(Decimal128("1.000")) == b'{"$numberDecimal":"1.000"}'


class _Int64Subclass(Int64):
    pass


class _StrSubclass(str):
    pass


class _DictSubclass(dict[str, Any]):
    pass


class _Color(enum.IntEnum):
    RED = 1


class _Mapping(Mapping[str, Any]):
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@MODES
def test_containers_and_subclasses_resolve_like_json_util(relaxed: bool) -> None:
    values: list[Any] = [
        SON([("b", 1), ("a", Int64(2))]),
        collections.OrderedDict([("b", 1), ("a", 2.5)]),
        _DictSubclass(x=1, y=[1.5]),
        _Mapping({"k": Int64(3), "n": {"m": 1}}),
        (1, "two", 3.0),
        [(1, 2), {"t": (Int64(3),)}],
        _Int64Subclass(7),
        _StrSubclass("sub"),
        _Color.RED,
        {"nested": _Int64Subclass(-1), "s": _StrSubclass("x")},
    ]
    for value in values:
        assert_same_as_json_util(value, relaxed)
        assert_same_as_json_util({"v": value}, relaxed)
        strict(to_json_value(value, relaxed=relaxed))  # plain types only


@MODES
def test_raw_documents_nested_in_plain_data(relaxed: bool) -> None:
    inner = {"_id": ObjectId("000000000000000000000001"), "n": 1, "d": DatetimeMS(-65_322_892_800_000)}
    lossless = RawBSONDocument(bson.encode(inner), codec_options=RAW_JSON_UTIL_OPTIONS)
    event = {"op": "insert", "fullDocument": raw(inner), "docs": [raw(inner)], "key": SON([("_id", raw(inner))])}
    expected_event = {"op": "insert", "fullDocument": lossless, "docs": [lossless], "key": {"_id": lossless}}
    assert fast(event, relaxed) == oracle(expected_event, relaxed)
    # A RawBSONDocument is decoded with the encoder's own options, whatever it carries.
    tz_aware = CodecOptions(document_class=RawBSONDocument, tz_aware=True, uuid_representation=STANDARD)
    other = {"d": dt.datetime(2020, 1, 1), "u": Binary.from_uuid(UUID, STANDARD), "b": Binary(b"x", 3)}
    assert fast(RawBSONDocument(bson.encode(other), codec_options=tz_aware), relaxed) == oracle(other, relaxed)


def test_errors_like_json_util() -> None:
    for relaxed in (False, True):
        with pytest.raises(ValueError, match="uuid"):
            to_json_value({"u": UUID}, relaxed=relaxed)
        with pytest.raises(ValueError):
            json_util.dumps({"u": UUID}, json_options=RELAXED if relaxed else CANONICAL)
        with pytest.raises(TypeError):
            to_json_value({"o": object()}, relaxed=relaxed)
        with pytest.raises(TypeError):
            json_util.dumps({"o": object()}, json_options=RELAXED if relaxed else CANONICAL)
    bad = RawBSONDocument(b"\x0c\x00\x00\x00\x99a\x00\x01\x00\x00\x00\x00")  # element type 0x99
    for relaxed in (False, True):
        with pytest.raises(InvalidBSON):
            to_json_value(bad, relaxed=relaxed)


def test_existing_helpers_agree() -> None:
    for doc in CORPUS[:-1]:
        assert strict(to_jsonable(doc)) == strict(to_json_value(doc))
        lossy = NOT_REPRESENTABLE & doc.keys()
        back = from_jsonable(to_json_value(doc))
        assert bson.encode({k: v for k, v in back.items() if k not in lossy}) == bson.encode(
            {k: v for k, v in doc.items() if k not in lossy}
        )


# --- random documents -----------------------------------------------------------------------------------------


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(22 if depth < 4 else 20)
    if kind == 0:
        return rng.choice(["", "a", "héllo", "\x00\x01", "🙂", "x" * rng.randrange(50)])
    if kind == 1:
        return rng.randrange(-(2**31), 2**31)
    if kind == 2:
        return rng.randrange(-(2**63), 2**63)
    if kind == 3:
        return Int64(rng.randrange(-(2**63), 2**63))
    if kind == 4:
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10 ** rng.randrange(-300, 300), -0.0, math.nan])
    if kind == 5:
        number = struct.unpack("<d", rng.randbytes(8))[0]  # any bit pattern; every NaN is written "NaN", so
        return math.nan if math.isnan(number) else number  # only the default NaN comes back bit for bit
    if kind == 6:
        return rng.choice([True, False, None])
    if kind == 7:
        return ObjectId(rng.randbytes(12))
    if kind == 8:
        return DatetimeMS(rng.randrange(-(2**45), 2**48))
    if kind == 9:
        return dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=rng.randrange(-(2**40), 2**44))
    if kind == 10:
        return Binary(rng.randbytes(rng.randrange(20)), rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 128]))
    if kind == 11:
        return Decimal128(rng.choice(["0", "-1.50", "1E+10", "123456789012345678901234567890", "NaN", "-Infinity"]))
    if kind == 12:
        return Timestamp(rng.randrange(2**32), rng.randrange(2**32))
    if kind == 13:
        return Regex(rng.choice(["^a", "b+", ""]), rng.choice(["", "i", "imsx", "lu"]))
    if kind == 14:
        return rng.choice([MinKey(), MaxKey()])
    if kind == 15:
        return Code(rng.choice(["f()", "x"]), rng.choice([None, {}, {"k": rng.randrange(9)}]))
    if kind == 16:
        return DBRef("c", rng.randrange(100), rng.choice([None, "db"]))
    if kind in (17, 18, 19):
        return rng.choice(["k", "key", "$k", "a.b", "ü"])
    if kind == 20:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return _random_document(rng, depth + 1)


def _random_document(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for i in range(rng.randrange(8)):
        doc[f"{rng.choice(['f', 'é', '$', 'a.b', 'Z'])}{i}"] = _random_value(rng, depth)
    return doc


@MODES
def test_random_documents(relaxed: bool) -> None:
    rng = random.Random(20240601)
    for _ in range(400):
        doc = _random_document(rng)
        document = raw(doc)
        lossless = RawBSONDocument(document.raw, codec_options=RAW_JSON_UTIL_OPTIONS)
        assert fast(document, relaxed) == oracle(lossless, relaxed), doc
        assert fast(doc, relaxed) == oracle(doc, relaxed), doc
        if not relaxed:
            assert bson.encode(json_util.loads(dumps_str(document), json_options=CANONICAL)) == document.raw


# --- the spec corpus's deprecated types -------------------------------------------------------------------------
def _element(kind: int, name: str, value: bytes) -> bytes:
    return bytes([kind]) + name.encode() + b"\x00" + value


def _string(text: str) -> bytes:
    data = text.encode() + b"\x00"
    return len(data).to_bytes(4, "little") + data


def _document(*elements: bytes) -> bytes:
    body = b"".join(elements) + b"\x00"
    return (len(body) + 4).to_bytes(4, "little") + body


OID = bytes.fromhex("56e1fc72e0c917e9c4714161")
DEPRECATED_CASES = [
    # the BSON corpus's symbol.json, undefined.json and dbpointer.json valid cases, in their canonical form
    *[(_document(_element(0x0E, "a", _string(s))), {"a": {"$symbol": s}})
      for s in ("", "b", "abababababab", "éééééé", "☆☆☆☆", "ab\x00bab\x00babab")],
    (_document(_element(0x06, "a", b"")), {"a": {"$undefined": True}}),
    *[(_document(_element(0x0C, "a", _string(ns) + OID)),
       {"a": {"$dbPointer": {"$ref": ns, "$id": {"$oid": OID.hex()}}}}) for ns in ("b", "é", "☆")],
    # deeper, beside ordinary values, in arrays and in a code's scope
    (
        _document(
            _element(0x08, "n", b"\x01"),
            _element(0x03, "sub", _document(_element(0x06, "u", b""), _element(0x02, "s", _string("x")))),
            _element(0x04, "arr", _document(_element(0x0E, "0", _string("sym")), _element(0x0A, "1", b""))),
        ),
        {
            "n": True,
            "sub": {"u": {"$undefined": True}, "s": "x"},
            "arr": [{"$symbol": "sym"}, None],
        },
    ),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "expected"), DEPRECATED_CASES)
@pytest.mark.parametrize("relaxed", [False, True])
def test_deprecated_types_keep_the_specs_canonical_form(raw: bytes, expected: dict[str, Any], relaxed: bool) -> None:
    """Symbol, Undefined and DBPointer (pymongo decodes them as str, None and DBRef) in the spec's form,
    which relaxed mode shares."""
    assert orjson.loads(dumps_bytes(RawBSONDocument(raw), relaxed=relaxed)) == expected


def test_a_code_with_scope_holding_a_deprecated_type() -> None:
    scope = _document(_element(0x06, "u", b""))
    code = _string("f()")
    body = code + scope
    raw = _document(_element(0x0F, "c", (len(body) + 4).to_bytes(4, "little") + body))
    assert orjson.loads(dumps_bytes(RawBSONDocument(raw))) == {
        "c": {"$code": "f()", "$scope": {"u": {"$undefined": True}}}
    }


def test_a_document_that_only_looks_like_holding_one_goes_the_fast_way() -> None:
    from replicator.bsonkit.deprecated import CANDIDATE, holds_deprecated

    raw = bson.encode({"bin": bson.Binary(b"\x06abc\x00\x01" + b"\x0eab\x00\x05\x00\x00\x00", 0), "n": 6})
    assert CANDIDATE.search(raw) is not None and not holds_deprecated(raw)
    assert orjson.loads(dumps_bytes(RawBSONDocument(raw))) == json.loads(
        json_util.dumps(bson.decode(raw), json_options=CANONICAL)
    )
