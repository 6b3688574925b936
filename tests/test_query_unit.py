"""The query matcher, rule by rule, without a server: each case is what mongod's find() answers (its
matcher's code and MongoDB's documentation); tests/test_query_server.py checks the same against a server."""

from __future__ import annotations

import base64
import datetime
import pickle
import random
import uuid
from typing import Any

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.raw_bson import RawBSONDocument

from replicator import query as query_module
from replicator.bsonkit.rawbson import RAW_CODEC
from replicator.errors import ConfigError
from replicator.query import compile_query


def matches(query: dict[str, Any], doc: dict[str, Any]) -> bool:
    """The answer for ``doc`` as a dict and as the raw document events carry: they must agree."""
    as_dict = compile_query(query).matches(doc)
    as_raw = compile_query(query).matches(RawBSONDocument(bson.encode(doc), RAW_CODEC))
    assert as_dict == as_raw
    return as_dict


def test_empty_query_matches_everything() -> None:
    assert matches({}, {"a": 1})
    assert matches({"$comment": "why"}, {})


@pytest.mark.parametrize(
    ("value", "equal"),
    [
        (1, True),
        (1.0, True),
        (Int64(1), True),
        (Decimal128("1"), True),
        (Decimal128("1.000"), True),
        (True, False),  # bool is its own bracket
        ("1", False),
        (None, False),
        ([1], True),  # an array holding it
        ([[1]], False),  # not an array inside an array
    ],
)
def test_numbers_are_equal_across_types(value: Any, equal: bool) -> None:
    assert matches({"a": 1}, {"a": value}) is equal
    assert matches({"a": Decimal128("1")}, {"a": value}) is equal


def test_big_integers_compare_exactly_with_doubles() -> None:
    big = 2**53 + 1
    assert not matches({"a": Int64(big)}, {"a": float(2**53)})
    assert matches({"a": {"$gt": float(2**53)}}, {"a": Int64(big)})
    assert matches({"a": Decimal128("0.1")}, {"a": Decimal128("0.10")})
    assert not matches({"a": Decimal128("0.1")}, {"a": 0.1})  # the double 0.1 is not exactly 1/10


def test_nan_equals_nan_and_compares_with_nothing() -> None:
    nan = float("nan")
    assert matches({"a": nan}, {"a": nan})
    assert matches({"a": nan}, {"a": Decimal128("NaN")})
    assert not matches({"a": nan}, {"a": 1})
    for op in ("$lt", "$gt"):
        assert not matches({"a": {op: nan}}, {"a": nan})
        assert not matches({"a": {op: nan}}, {"a": 1})
        assert not matches({"a": {op: 1}}, {"a": nan})
    for op in ("$lte", "$gte"):
        assert matches({"a": {op: nan}}, {"a": nan})
        assert not matches({"a": {op: 1}}, {"a": nan})
    assert not matches({"a": 1}, {"a": Decimal128("sNaN")})


def test_comparisons_stay_in_their_type_bracket() -> None:
    assert matches({"a": {"$gt": 1}}, {"a": 2.5})
    assert not matches({"a": {"$gt": 1}}, {"a": "2"})
    assert not matches({"a": {"$lt": "b"}}, {"a": 1})
    assert matches({"a": {"$lt": "b"}}, {"a": "a"})
    assert matches({"a": {"$gte": datetime.datetime(2020, 1, 1)}}, {"a": datetime.datetime(2021, 1, 1)})
    assert not matches({"a": {"$gte": datetime.datetime(2020, 1, 1)}}, {"a": Timestamp(2_000_000_000, 1)})
    assert matches({"a": {"$gt": Timestamp(1, 2)}}, {"a": Timestamp(1, 3)})
    assert matches({"a": {"$lt": True}}, {"a": False})
    assert matches({"a": {"$gt": ObjectId("000000000000000000000001")}}, {"a": ObjectId("000000000000000000000002")})


def test_strings_compare_by_their_bytes() -> None:
    assert matches({"a": {"$gt": "Z"}}, {"a": "a"})  # lowercase after uppercase
    assert matches({"a": {"$gt": "z"}}, {"a": "é"})  # non-ASCII after ASCII
    assert matches({"a": {"$lt": "ab"}}, {"a": "a"})  # a prefix first
    assert not matches({"a": "a"}, {"a": "A"})


def test_minkey_and_maxkey_bound_every_type() -> None:
    for value in (1, "x", None, [], {"b": 1}, True):
        assert not matches({"a": {"$gt": MaxKey()}}, {"a": value})
        assert not matches({"a": {"$lt": MinKey()}}, {"a": value})
        assert not matches({"a": MaxKey()}, {"a": value})
    assert matches({"a": MaxKey()}, {"a": MaxKey()})
    assert matches({"a": {"$gte": MaxKey()}}, {"a": MaxKey()})
    assert matches({"a": {"$lte": MinKey()}}, {"a": [MinKey()]})
    assert matches({"a": {"$gt": 1}}, {"a": 2}) and not matches({"a": {"$gt": 1}}, {"a": MaxKey()})


@pytest.mark.parametrize("query", [{"a": {"$lt": MaxKey()}}, {"a": {"$lte": MaxKey()}}, {"a": {"$gte": MinKey()}}])
def test_any_value_ranges_are_refused(query: dict[str, Any]) -> None:
    """They hold for every value; for a missing field the answer is the query engine's."""
    with pytest.raises(ConfigError, match=r"^--filter: \$(lt|lte|gte): M(ax|in)Key"):
        compile_query(query)


#: jstests/core/query/null_query_semantics.js (MongoDB 8.0 on): what {a: null}, {a: {$ne: null}},
#: {a: {$in: [null, 75]}} and {a: {$nin: [null, 75]}} match
NULL_DOCS: dict[str, Any] = {
    "a_empty_subobject": {},
    "a_null": None,
    "a_number": 4,
    "a_subobject_b_not_null": {"b": "hi"},
    "a_subobject_b_null": {"b": None},
    "a_double_array": [[]],
    "a_empty_array": [],
    "a_object_array_no_b_nulls": [{"b": 1}, {"b": 3}, {"b": "string"}],
    "a_object_array_some_b_nulls": [{"b": None}, {"b": 3}, {"b": None}],
    "a_object_array_some_b_missing": [{"b": 3}, {}],
    "a_value_array_all_nulls": [None, None],
    "a_value_array_no_nulls": [1, "string", 4],
    "a_value_array_with_null": [1, "string", None, 4],
}
NULL_MATCHES = {"a_null", "a_value_array_all_nulls", "a_value_array_with_null", "no_a"}


def _null_corpus() -> dict[str, dict[str, Any]]:
    docs = {name: {"a": value} for name, value in NULL_DOCS.items()}
    docs["no_a"] = {}
    return docs


@pytest.mark.parametrize(
    ("query", "negated"),
    [
        ({"a": None}, False),
        ({"a": {"$eq": None}}, False),
        ({"a": {"$in": [None, 75]}}, False),
        ({"$or": [{"a": None}, {"a": 75}]}, False),
        ({"a": {"$ne": None}}, True),
        ({"a": {"$nin": [None, 75]}}, True),
        ({"a": {"$not": {"$gte": None}}}, True),
    ],
)
def test_null_as_mongodb_8_answers_it(query: dict[str, Any], negated: bool) -> None:
    docs = _null_corpus()
    got = {name for name, doc in docs.items() if matches(query, doc)}
    assert got == (set(docs) - NULL_MATCHES if negated else NULL_MATCHES)


def test_null_elem_match_as_mongodb_answers_it() -> None:
    docs = _null_corpus()
    eq = {name for name, doc in docs.items() if matches({"a": {"$elemMatch": {"$eq": None}}}, doc)}
    assert eq == {"a_value_array_all_nulls", "a_value_array_with_null"}
    on_documents = {name for name, doc in docs.items() if matches({"a": {"$elemMatch": {"b": {"$eq": None}}}}, doc)}
    assert on_documents == {"a_double_array", "a_object_array_some_b_nulls", "a_object_array_some_b_missing"}
    ne = {name for name, doc in docs.items() if matches({"a": {"$elemMatch": {"b": {"$ne": None}}}}, doc)}
    assert ne == {"a_object_array_no_b_nulls", "a_object_array_some_b_nulls", "a_object_array_some_b_missing"}


def test_null_matches_missing_and_null_and_arrays_holding_null() -> None:
    assert matches({"a": None}, {})
    assert matches({"a": None}, {"a": None})
    assert matches({"a": None}, {"a": [1, None]})
    assert not matches({"a": None}, {"a": []})
    assert not matches({"a": None}, {"a": 0})
    assert matches({"a": {"$gte": None}}, {})
    assert not matches({"a": {"$gt": None}}, {"a": None})
    assert matches({"a": {"$ne": None}}, {"a": 0})
    assert not matches({"a": {"$ne": None}}, {})
    assert not matches({"a": {"$ne": None}}, {"a": [1, None]})
    assert matches({"a": {"$in": [None]}}, {})
    assert matches({"a": {"$elemMatch": {"b": None}}}, {"a": [{"c": 1}]})


@pytest.mark.parametrize(
    "query",
    [
        {"a.b": None},
        {"a.b": {"$eq": None}},
        {"a.b": {"$ne": None}},
        {"a.b": {"$in": [1, None]}},
        {"a.b": {"$nin": [None]}},
        {"a.b": {"$gte": None}},
        {"a.0": {"$lte": None}},
        {"a.b": {"$all": [None]}},
        {"$or": [{"x": 1}, {"a.b": {"$not": {"$eq": None}}}]},
        {"a": {"$elemMatch": {"b.c": None}}},
    ],
)
def test_null_on_a_dotted_path_is_refused(query: dict[str, Any]) -> None:
    """MongoDB 5.0-8.x and 9.0 answer it differently where the path crosses an array without documents
    (jstests/core/query/dotted_path_in_null.js: {a: [5, {b: 5}]} matches {"a.b": {$in: [null]}} from 9.0 on)."""
    with pytest.raises(ConfigError, match=r"^--filter: .*null.* dotted path") as caught:
        compile_query(query)
    assert "\n" not in str(caught.value)


def test_exists() -> None:
    assert matches({"a": {"$exists": True}}, {"a": None})
    assert matches({"a": {"$exists": True}}, {"a": []})
    assert not matches({"a": {"$exists": True}}, {"b": 1})
    assert matches({"a": {"$exists": False}}, {"b": 1})
    assert matches({"a": {"$exists": 0}}, {"b": 1})
    assert matches({"a.b": {"$exists": True}}, {"a": [{"c": 1}, {"b": None}]})
    assert not matches({"a.b": {"$exists": True}}, {"a": [1, {"c": 1}]})
    assert matches({"a.b": {"$exists": False}}, {"a": [1, 2]})


def test_paths_through_documents_and_arrays() -> None:
    doc = {"a": [{"b": 1}, {"b": [2, 3]}, {"c": {"d": 4}}, 5], "e": {"f": {"g": "x"}}}
    assert matches({"a.b": 1}, doc)
    assert matches({"a.b": 3}, doc)
    assert matches({"a.b": [2, 3]}, doc)
    assert matches({"a.c.d": 4}, doc)
    assert matches({"e.f.g": "x"}, doc)
    assert not matches({"e.f.g.h": "x"}, doc)
    assert not matches({"a.b": 5}, doc)
    assert matches({"a.b.c": {"$exists": False}}, {"a": [[{"b": {"c": 1}}]]})  # arrays in arrays are not entered
    assert not matches({"a.b": 1}, {"a": [[{"b": 1}]]})


def test_numeric_path_parts_name_array_positions() -> None:
    assert matches({"a.1": 2}, {"a": [1, 2]})
    assert not matches({"a.0": 2}, {"a": [1, 2]})
    assert matches({"a.0.b": 1}, {"a": [{"b": 1}]})
    assert matches({"a.0": 5}, {"a": [{"0": 5}]})  # a field named "0" in an element, too
    assert matches({"a.0.0": 7}, {"a": [[7]]})
    assert matches({"a.1": {"$exists": False}}, {"a": [1]})
    assert not matches({"a.0": 1}, {"a": [[1]]})  # an element reached by position is not expanded
    assert matches({"a.0": 1}, {"a": {"0": 1}})
    assert not matches({"a.01": 2}, {"a": [1, 2]})


#: jstests/core/query/match_numeric_components.js: the documents, then what each query matches
NUMERIC_DOCS: list[Any] = [
    42, [42], {"0": 42}, [[42]], [{"0": 42}], {"0": [42]}, {"0": {"0": 42}}, [[[42]]], [[{"0": 42}]],
    [{"0": [42]}], [{"0": {"0": 42}}], {"0": [[42]]}, {"0": [{"0": 42}]}, {"0": {"0": [42]}},
    {"0": {"0": {"0": 42}}}, [[[[42]]]], [[[{"0": 42}]]], [[{"0": [42]}]], [[{"0": {"0": 42}}]],
    [{"0": [[42]]}], [{"0": [{"0": 42}]}], [{"0": {"0": [42]}}], [{"0": {"0": {"0": 42}}}], {"0": [[[42]]]},
    {"0": [[{"0": 42}]]}, {"0": [{"0": [42]}]}, {"0": [{"0": {"0": 42}}]}, {"0": {"0": [[42]]}},
    {"0": {"0": [{"0": 42}]}}, {"0": {"0": {"0": [42]}}}, {"0": {"0": {"0": {"0": 42}}}},
]  # fmt: skip
A0 = {1, 2, 4, 5, 9}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"a.0": 42}, A0),
        ({"a.0": {"$ne": 42}}, set(range(31)) - A0),
        ({"a.0.0": 42}, {3, 4, 5, 6, 8, 9, 10, 12, 13, 17, 20, 21, 25}),
        ({"a.0": {"$gt": 41}}, A0),
        ({"a.0": {"$in": [41, 42, 43]}}, A0),
        ({"a.0": {"$nin": [41, 42, 43]}}, set(range(31)) - A0),
        ({"a.0": {"$all": [42]}}, A0),
        ({"a.0": {"$all": [{"$elemMatch": {"0": 42}}]}}, {7, 8, 11, 12, 15, 17, 19, 20, 23, 25}),
        ({"a.0": {"$type": "number"}}, A0),
        ({"a.0": {"$mod": [42, 0]}}, A0),
        ({"$or": [{"a.0": 42}, {"notARealField": 123}]}, A0),
    ],
)
def test_numeric_path_parts_as_mongodb_answers_them(query: dict[str, Any], expected: set[int]) -> None:
    assert {n for n, a in enumerate(NUMERIC_DOCS) if matches(query, {"_id": n, "a": a})} == expected


def test_numeric_path_parts_and_regexes() -> None:
    docs = {1: "hello", 2: {"0": "hello"}, 3: ["hello", "abc", "abc"]}
    for query in ({"b.0": {"$regex": "hello"}}, {"b.0": {"$all": [Regex("^hello")]}}):
        assert {n for n, b in docs.items() if matches(query, {"b": b})} == {2, 3}


def test_array_equality_is_exact_and_also_matches_an_element() -> None:
    assert matches({"a": [1, 2]}, {"a": [1, 2]})
    assert not matches({"a": [1, 2]}, {"a": [2, 1]})
    assert not matches({"a": [1, 2]}, {"a": [1, 2, 3]})
    assert matches({"a": [1, 2]}, {"a": [[1, 2], 3]})
    assert matches({"a": []}, {"a": []})
    assert matches({"a": []}, {"a": [[]]})
    assert matches({"a": {"$gt": [1]}}, {"a": [2]})  # whole arrays compare element by element
    assert matches({"a": {"$gt": [1]}}, {"a": [1, 0]})


def test_documents_compare_field_by_field_in_order() -> None:
    assert matches({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 2}})
    assert not matches({"a": {"b": 1, "c": 2}}, {"a": {"c": 2, "b": 1}})
    assert matches({"a": {"b": 1}}, {"a": {"b": 1.0}})
    assert not matches({"a": {"b": 1}}, {"a": {"b": 1, "c": 1}})
    assert matches({"a": {"$gt": {"b": 1}}}, {"a": {"b": 1, "c": 1}})
    assert matches({"a": {"$lt": {"b": 1}}}, {"a": {"a": 5}})
    assert matches({"a": {}}, {"a": {}})


def test_in_and_nin() -> None:
    assert matches({"a": {"$in": [1, "x"]}}, {"a": "x"})
    assert matches({"a": {"$in": [1, "x"]}}, {"a": [5, 1.0]})
    assert matches({"a": {"$in": [[1, 2]]}}, {"a": [1, 2]})
    assert matches({"a": {"$in": [Regex("^x")]}}, {"a": "xy"})
    assert not matches({"a": {"$in": []}}, {"a": 1})
    assert matches({"a": {"$nin": [1]}}, {})
    assert not matches({"a": {"$nin": [1]}}, {"a": [0, 1]})
    assert not matches({"a": {"$nin": [None]}}, {})


def test_logical_operators() -> None:
    assert matches({"$and": [{"a": 1}, {"b": 2}]}, {"a": 1, "b": 2})
    assert not matches({"$and": [{"a": 1}, {"b": 2}]}, {"a": 1})
    assert matches({"$or": [{"a": 1}, {"b": 2}]}, {"b": 2})
    assert matches({"$nor": [{"a": 1}, {"b": 2}]}, {"c": 3})
    assert not matches({"$nor": [{"a": 1}]}, {"a": [1]})


def test_operators_on_one_path_may_be_met_by_different_elements() -> None:
    assert matches({"a": {"$gt": 1, "$lt": 3}}, {"a": [0, 5]})
    assert not matches({"a": {"$elemMatch": {"$gt": 1, "$lt": 3}}}, {"a": [0, 5]})
    assert matches({"a": {"$elemMatch": {"$gt": 1, "$lt": 3}}}, {"a": [0, 2]})


def test_not() -> None:
    assert matches({"a": {"$not": {"$gt": 3}}}, {"a": 1})
    assert matches({"a": {"$not": {"$gt": 3}}}, {})
    assert not matches({"a": {"$not": {"$gt": 3}}}, {"a": [1, 5]})
    assert matches({"a": {"$not": Regex("^x")}}, {"a": "yx"})
    assert not matches({"a": {"$not": {"$regex": "^x"}}}, {"a": "xy"})


def test_type() -> None:
    assert matches({"a": {"$type": "number"}}, {"a": Decimal128("1")})
    assert matches({"a": {"$type": "int"}}, {"a": 1})
    assert not matches({"a": {"$type": "int"}}, {"a": Int64(1)})
    assert matches({"a": {"$type": "long"}}, {"a": Int64(1)})
    assert matches({"a": {"$type": 1}}, {"a": 1.5})
    assert matches({"a": {"$type": ["string", "null"]}}, {"a": None})
    assert matches({"a": {"$type": "array"}}, {"a": []})
    assert matches({"a": {"$type": "string"}}, {"a": [1, "x"]})
    assert not matches({"a": {"$type": "null"}}, {})
    assert matches({"a": {"$type": "binData"}}, {"a": Binary(uuid.uuid4().bytes, 4)})
    assert matches({"a": {"$type": "object"}}, {"a": {"b": 1}})
    assert matches({"a": {"$type": "javascript"}}, {"a": Code("f()")})
    assert matches({"a": {"$type": "regex"}}, {"a": Regex("x")})
    assert matches({"a": {"$type": "minKey"}}, {"a": MinKey()})


def test_mod() -> None:
    assert matches({"a": {"$mod": [3, 1]}}, {"a": 4})
    assert matches({"a": {"$mod": [3, -1]}}, {"a": -4})  # the dividend's sign, as in C
    assert matches({"a": {"$mod": [3, 1]}}, {"a": 4.9})  # truncated
    assert matches({"a": {"$mod": [3, 1]}}, {"a": Decimal128("-2.5")}) is False
    assert not matches({"a": {"$mod": [3, 1]}}, {"a": float("inf")})
    assert matches({"a": {"$mod": [2.5, 0]}}, {"a": 4})  # divisor truncated to 2


#: MongoDB's $bitsAllSet / $bitsAllClear / $bitsAnySet / $bitsAnyClear reference pages: their collection
BITS_DOCS = {1: 54, 2: 20, 3: 20.0, 4: Binary(base64.b64decode("Zg=="), 0)}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"$bitsAllSet": [1, 5]}, {1, 4}),
        ({"$bitsAllSet": 50}, {1}),
        ({"$bitsAllSet": Binary(base64.b64decode("MC=="), 0)}, {1}),
        ({"$bitsAllClear": [1, 5]}, {2, 3}),
        ({"$bitsAllClear": 35}, {2, 3}),
        ({"$bitsAnySet": [1, 5]}, {1, 4}),
        ({"$bitsAnySet": 35}, {1, 4}),
        ({"$bitsAnyClear": [1, 5]}, {2, 3}),
        ({"$bitsAnyClear": 35}, {1, 2, 3, 4}),
    ],
)
def test_bit_operators_as_the_reference_pages_answer(query: dict[str, Any], expected: set[int]) -> None:
    assert {n for n, a in BITS_DOCS.items() if matches({"a": query}, {"a": a})} == expected


def test_bit_operators_on_other_values() -> None:
    assert matches({"a": {"$bitsAllSet": [63]}}, {"a": -1})  # two's complement
    assert matches({"a": {"$bitsAllSet": [200]}}, {"a": Int64(-1)})  # past 63: the sign bit
    assert not matches({"a": {"$bitsAllSet": [200]}}, {"a": Binary(b"\xff", 0)})  # binData: zero past its end
    assert not matches({"a": {"$bitsAnySet": 1}}, {"a": 1.5})  # not integral
    assert not matches({"a": {"$bitsAnySet": 1}}, {"a": float("nan")})
    assert not matches({"a": {"$bitsAnySet": 1}}, {"a": True})
    assert not matches({"a": {"$bitsAnySet": 1}}, {"a": "1"})
    assert matches({"a": {"$bitsAnySet": 1}}, {"a": Decimal128("3")})
    assert matches({"a": {"$bitsAllSet": []}}, {"a": 0}) and not matches({"a": {"$bitsAnySet": []}}, {"a": 1})
    for bad in (-1, 1.5, "x", [-1], [1.5], Binary(b"\x80", 0)):
        with pytest.raises(ConfigError, match=r"^--filter: \$bitsAllSet"):
            compile_query({"a": {"$bitsAllSet": bad}})


def test_size() -> None:
    assert matches({"a": {"$size": 2}}, {"a": [1, [2, 3]]})
    assert not matches({"a": {"$size": 2}}, {"a": [[1, 2]]})
    assert matches({"a": {"$size": 0}}, {"a": []})
    assert not matches({"a": {"$size": 1}}, {"a": 1})
    assert matches({"a.b": {"$size": 1}}, {"a": [{"b": [1]}]})


def test_all() -> None:
    assert matches({"a": {"$all": [1, 2]}}, {"a": [2, 3, 1]})
    assert not matches({"a": {"$all": [1, 2]}}, {"a": [1]})
    assert matches({"a": {"$all": [1]}}, {"a": 1})
    assert matches({"a": {"$all": [[1, 2]]}}, {"a": [1, 2]})
    assert not matches({"a": {"$all": []}}, {"a": []})
    assert matches({"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"b": 2}}]}}, {"a": [{"b": 1}, {"b": 2}]})


def test_elem_match_on_documents() -> None:
    doc = {"a": [{"b": 1, "c": 1}, {"b": 2, "c": 2}]}
    assert matches({"a": {"$elemMatch": {"b": 1, "c": 1}}}, doc)
    assert not matches({"a": {"$elemMatch": {"b": 1, "c": 2}}}, doc)
    assert matches({"a.b": 1, "a.c": 2}, doc)
    assert matches({"a": {"$elemMatch": {"$or": [{"b": 5}, {"c": 2}]}}}, doc)
    assert not matches({"a": {"$elemMatch": {"b": 1}}}, {"a": {"b": 1}})
    assert matches({"a": {"$elemMatch": {}}}, {"a": [1, {}]})
    assert not matches({"a": {"$elemMatch": {}}}, {"a": [1]})


def test_regex() -> None:
    assert matches({"a": Regex("^ab")}, {"a": "abc"})
    assert matches({"a": {"$regex": "AB", "$options": "i"}}, {"a": "xab"})
    assert matches({"a": {"$regex": "^b", "$options": "m"}}, {"a": "a\nb"})
    assert not matches({"a": {"$regex": "^b"}}, {"a": "a\nb"})
    assert matches({"a": {"$regex": "a.b", "$options": "s"}}, {"a": "a\nb"})
    assert matches({"a": {"$regex": "a b # comment", "$options": "x"}}, {"a": "ab"})
    assert matches({"a": Regex("x")}, {"a": ["y", "xx"]})
    assert not matches({"a": Regex("1")}, {"a": 1})
    assert matches({"a": Regex("x", "i")}, {"a": Regex("x", "i")})  # a stored regex: the same one
    assert matches({"a": {"$eq": Regex("x")}}, {"a": Regex("x")})
    assert not matches({"a": {"$eq": Regex("x")}}, {"a": "x"})


def test_regex_classes_are_ascii_as_in_pcre() -> None:
    assert not matches({"a": Regex(r"^\d$")}, {"a": "٣"})  # an Arabic-Indic digit
    assert not matches({"a": Regex(r"^\w$")}, {"a": "é"})
    assert matches({"a": Regex(r"\bx")}, {"a": "éx"})  # é is no word character: a boundary
    assert matches({"a": Regex(r"^\s$")}, {"a": "\x0b"})
    assert not matches({"a": Regex(r"^\s$")}, {"a": "\u00a0"})
    assert matches({"a": Regex(r"a\Z")}, {"a": "a\n"})
    assert not matches({"a": Regex(r"a\z")}, {"a": "a\n"})
    assert matches({"a": Regex(r"^é$", "i")}, {"a": "É"})


@pytest.mark.parametrize(
    "query",
    [
        {"$where": "this.a == 1"},
        {"$expr": {"$eq": ["$a", 1]}},
        {"$jsonSchema": {}},
        {"$text": {"$search": "x"}},
        {"$sampleRate": 0.5},
        {"a": {"$near": [0, 0]}},
        {"a": {"$geoWithin": {"$center": [[0, 0], 1]}}},
        {"a": {"$geoIntersects": {}}},
        {"$unknown": 1},
        {"a": {"$unknown": 1}},
    ],
)
def test_refused_operators_are_named(query: dict[str, Any]) -> None:
    op = next(iter(query)) if next(iter(query)).startswith("$") else next(iter(query["a"]))
    with pytest.raises(ConfigError, match=rf"^--filter: .*\{op}") as caught:
        compile_query(query)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "pattern",
    [r"\Qa.b\E", r"\p{L}", r"\x{41}", r"\v", r"\h", r"\R", r"(?<n>a)", "[[:alpha:]]", r"a{,3}", r"(?x)a", r"a(?i)b"],
)
def test_regexes_python_reads_otherwise_are_refused(pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"--filter: "):
        compile_query({"a": Regex(pattern)})


@pytest.mark.parametrize(
    "query",
    [
        {"a": {"$in": 1}},
        {"a": {"$in": [{"$gt": 1}]}},
        {"a": {"$ne": Regex("x")}},
        {"a": {"$mod": [0, 1]}},
        {"a": {"$mod": [1]}},
        {"a": {"$size": -1}},
        {"a": {"$size": 1.5}},
        {"a": {"$size": float("inf")}},
        {"a..b": 1},
        {"": 1},
        {"a": {"$type": "nope"}},
        {"a": {"$not": {}}},
        {"a": {"$options": "i"}},
        {"$or": []},
        {"$and": [1]},
        {"a": {"$regex": "x", "$options": "q"}},
        {"a": {"$gt": 1, "b": 2}},
    ],
)
def test_queries_the_server_refuses_are_refused(query: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"^--filter: "):
        compile_query(query)


def _element(kind: int, name: str, value: bytes = b"") -> bytes:
    return bytes([kind]) + name.encode() + b"\x00" + value


def _raw(*elements: bytes) -> RawBSONDocument:
    body = b"".join(elements)
    return RawBSONDocument((len(body) + 5).to_bytes(4, "little") + body + b"\x00", RAW_CODEC)


def _string(text: str) -> bytes:
    data = text.encode() + b"\x00"
    return len(data).to_bytes(4, "little") + data


def test_undefined_is_neither_null_nor_missing() -> None:
    """pymongo reads BSON undefined as None; it is its own type, and from MongoDB 8.0 on null does not match it."""
    doc = _raw(_element(0x10, "_id", (1).to_bytes(4, "little")), _element(0x06, "a"))
    assert not compile_query({"a": None}).matches(doc)
    assert compile_query({"a": {"$ne": None}}).matches(doc)
    assert compile_query({"a": {"$exists": True}}).matches(doc)
    assert compile_query({"a": {"$type": "undefined"}}).matches(doc)
    assert not compile_query({"a": {"$type": "null"}}).matches(doc)
    in_array = _raw(_element(0x04, "a", bytes(_raw(_element(0x06, "0"), _element(0x10, "1", b"\x01\x00\x00\x00")).raw)))
    assert compile_query({"a": 1}).matches(in_array)
    assert not compile_query({"a": None}).matches(in_array)


def test_symbol_compares_as_a_string_with_a_type_of_its_own() -> None:
    doc = _raw(_element(0x0E, "a", _string("xy")))
    assert compile_query({"a": "xy"}).matches(doc)
    assert compile_query({"a": {"$gt": "x"}}).matches(doc)
    assert compile_query({"a": Regex("^x")}).matches(doc)
    assert compile_query({"a": {"$type": "symbol"}}).matches(doc)
    assert not compile_query({"a": {"$type": "string"}}).matches(doc)
    nested = _raw(_element(0x03, "a", bytes(_raw(_element(0x0E, "b", _string("s"))).raw)))
    assert compile_query({"a.b": {"$type": 14}}).matches(nested)
    assert compile_query({"a": {"b": "s"}}).matches(nested)  # the same document, byte for byte but the type
    assert compile_query({"a": {"$type": "object"}}).matches(nested)


def test_code_with_scope_documents_are_read() -> None:
    """pymongo's span decoder cannot build a code-with-scope (its scope must be a dict): read another way."""
    doc = {"a": Code("f()", {"x": 1}), "b": {"c": [1, {"d": 2}]}}
    assert matches({"b.c.d": 2}, doc)
    assert matches({"a": {"$type": "javascriptWithScope"}}, doc)
    assert matches({"a": Code("f()", {"x": 1})}, doc)
    assert not matches({"a": Code("f()", {"x": 2})}, doc)


def test_dbref_shaped_documents_are_equalities_not_operators() -> None:
    ref = {"$ref": "users", "$id": 7}
    assert matches({"a": ref}, {"a": ref})
    assert not matches({"a": ref}, {"a": {"$ref": "users", "$id": 8}})
    with pytest.raises(ConfigError, match=r"\$ref"):
        compile_query({"a": {"$ref": "users"}})  # no $id: read as an operator, as mongod reads it


_FUZZ_KEYS = ["a", "a.b", "a.0", "b", "", "a..b", "$and", "$or", "$nor", "$not", "$eq", "$ne", "$gt", "$lt", "$in"]
_FUZZ_KEYS += ["$nin", "$all", "$elemMatch", "$size", "$mod", "$type", "$exists", "$regex", "$options", "$where"]
_FUZZ_KEYS += ["$comment", "$ref", "$id", "$foo", "0"]
_FUZZ_SCALARS: list[Any] = [None, 0, 1, -1, 2.5, float("nan"), float("inf"), Int64(3), Decimal128("NaN"), "", "a"]
_FUZZ_SCALARS += ["(", "number", Decimal128("-Infinity"), Decimal128("1E+40"), 2**63 - 1, -(2**63)]
_FUZZ_SCALARS += [True, Regex("a"), Regex("(", "i"), MinKey(), MaxKey(), datetime.datetime(2020, 1, 1), b"x"]


def _fuzz(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice(_FUZZ_SCALARS)
    if roll < 0.6:
        return [_fuzz(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_FUZZ_KEYS): _fuzz(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_any_query_compiles_or_is_refused_in_one_line_and_any_document_gets_an_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(38)
    docs = [RawBSONDocument(bson.encode({"a": _fuzz(rng), "b": _fuzz(rng)}), RAW_CODEC) for _ in range(40)]
    compiled = 0
    for _ in range(3000):
        spec = {rng.choice(_FUZZ_KEYS): _fuzz(rng) for _ in range(rng.randint(1, 2))}
        try:
            query = compile_query(spec)
        except ConfigError as exc:
            assert str(exc).startswith("--filter: ") and "\n" not in str(exc), spec
            continue
        compiled += 1
        answers = [query.matches(doc) for doc in docs]
        assert set(answers) <= {True, False}
        with monkeypatch.context() as large:  # every document read as a large one: the same answers
            large.setattr(query_module, "LARGE_DOCUMENT", 0)
            assert [query.matches(doc) for doc in docs] == answers, spec
    assert compiled > 200


@pytest.mark.parametrize(
    ("query", "compares"),
    [
        ({"a": "x"}, True),
        ({"a": {"$in": [1, "x"]}}, True),
        ({"a": {"$gt": {"b": "x"}}}, True),
        ({"$or": [{"b": 1}, {"a": {"$elemMatch": {"c": {"$ne": "x"}}}}]}, True),
        ({"a": {"$all": [{"$elemMatch": {"$lt": "x"}}]}}, True),
        ({"a": 1, "b": {"$regex": "x"}}, False),  # a regex does not follow the collation
        ({"a": {"$type": "string"}, "b": {"$exists": True}}, False),
    ],
)
def test_compares_strings_says_whether_a_collation_could_change_the_answer(
    query: dict[str, Any], compares: bool
) -> None:
    assert compile_query(query).compares_strings is compares


@pytest.mark.parametrize("position", [0, 30, 99])
def test_a_large_document_is_read_by_its_headers(position: int) -> None:
    """Only the fields the query reads are decoded; past a few dozen headers the rest is decoded at once."""
    doc: dict[str, Any] = {f"f{n}": n for n in range(100)}
    doc[f"f{position}"] = {"b": [1, {"c": "x" * 20_000}], "d": Code("f()", {"s": 1})}
    raw = RawBSONDocument(bson.encode(doc), RAW_CODEC)
    assert len(raw.raw) > query_module.LARGE_DOCUMENT
    assert compile_query({f"f{position}.b.c": {"$regex": "^x+$"}, "f50": 50}).matches(raw)
    assert compile_query({f"f{position}.d": {"$type": "javascriptWithScope"}, "f50": {"$gt": 49}}).matches(raw)
    assert not compile_query({f"f{position}.b": 2}).matches(raw)
    assert compile_query({"nothere": None, "f1": {"$exists": True}}).matches(raw)


def test_a_native_uuid_is_binary_subtype_4() -> None:
    value = uuid.uuid4()
    assert matches({"a": value}, {"a": Binary(value.bytes, 4)})
    assert compile_query({"a": value}).matches({"a": value})


@pytest.mark.parametrize("query", [{"a": object()}, {"a": {"$in": [2**70]}}, {1: 2}])
def test_what_bson_cannot_encode_is_refused_in_one_line(query: dict[Any, Any]) -> None:
    with pytest.raises(ConfigError, match=r"^--filter: the query is no BSON document"):
        compile_query(query)


def test_a_query_pickles_as_its_spec_and_compiles_again() -> None:
    query = compile_query({"a.b": {"$gt": 1}, "c": Regex("^x", "i")})
    again = pickle.loads(pickle.dumps(query))
    assert again.spec == query.spec and again.fields() == query.fields()
    assert again.matches({"a": [{"b": 2}], "c": "Xy"}) and not again.matches({"a": {"b": 1}, "c": "x"})


def test_fields_names_the_top_level_fields_read() -> None:
    query = compile_query({"a.b": 1, "$or": [{"c": 1}, {"d.e": {"$elemMatch": {"f": 1}}}], "$comment": "x"})
    assert query.fields() == frozenset({"a", "c", "d"})
