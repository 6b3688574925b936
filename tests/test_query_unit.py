"""The query matcher, rule by rule, without a server: each case is what mongod's find() answers (its
matcher's code and MongoDB's documentation); tests/test_query_server.py checks the same against a server."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit.rawbson import RAW_CODEC
from replicator.errors import ConfigError
from replicator.events.query import compile_query


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
        assert matches({"a": {"$lt": MaxKey()}}, {"a": value})
        assert matches({"a": {"$gt": MinKey()}}, {"a": value})
        assert not matches({"a": {"$gt": MaxKey()}}, {"a": value})
    assert matches({"a": MaxKey()}, {"a": MaxKey()})
    assert not matches({"a": {"$lt": MaxKey()}}, {"a": MaxKey()})


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
    assert matches({"a.b": None}, {"a": [{"c": 1}]})  # an element without b
    assert not matches({"a.b": None}, {"a": [1, 2]})  # no element is a document: no value at all
    assert matches({"a.b": None}, {"a": 1})  # missing: a is no document


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
    assert not matches({"a.b.c": None}, {"a": [[{"b": {"c": 1}}]]})  # arrays in arrays are not entered
    assert not matches({"a.b": 1}, {"a": [[{"b": 1}]]})


def test_numeric_path_parts_name_array_positions() -> None:
    assert matches({"a.1": 2}, {"a": [1, 2]})
    assert not matches({"a.0": 2}, {"a": [1, 2]})
    assert matches({"a.0.b": 1}, {"a": [{"b": 1}]})
    assert matches({"a.0": 5}, {"a": [{"0": 5}]})  # a field named "0" in an element, too
    assert matches({"a.0.0": 7}, {"a": [[7]]})
    assert matches({"a.1": {"$exists": False}}, {"a": [1]})
    assert matches({"a.0": 1}, {"a": {"0": 1}})
    assert not matches({"a.01": 2}, {"a": [1, 2]})


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
        {"a": {"$bitsAllSet": 1}},
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
    with pytest.raises(ConfigError, match="--filter: "):
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
    with pytest.raises(ConfigError, match="^--filter: "):
        compile_query(query)


def test_fields_names_the_top_level_fields_read() -> None:
    query = compile_query({"a.b": 1, "$or": [{"c": 1}, {"d.e": {"$elemMatch": {"f": 1}}}], "$comment": "x"})
    assert query.fields() == frozenset({"a", "c", "d"})
