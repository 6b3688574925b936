"""verify: the pure per-partition diff and report formatting, then end to end against two servers."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import bson
import pymongo
import pytest
from bson import SON
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit import extjson
from replicator.checking.verify import (
    Difference,
    DocumentDiff,
    VerifyReport,
    diff_documents,
    schema_differences,
    verify,
)
from replicator.events import CollectionSpec, Namespace
from replicator.settings.config import Settings
from replicator.settings.resolve import resolve
from replicator.source.connection import RAW_CODEC


def raw(doc: Any) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc), codec_options=RAW_CODEC)


def docs(*items: Any) -> list[RawBSONDocument]:
    return [raw(d) for d in items]


# --- the per-partition diff -------------------------------------------------------------------------


def test_identical_documents_in_any_order_do_not_differ() -> None:
    source = docs({"_id": 1, "a": "x"}, {"_id": "k", "a": [1, 2]}, {"_id": {"x": 1}, "a": None})
    diff = diff_documents(source, list(reversed(source)), sample=5)
    assert diff.counts == {"missing": 0, "extra": 0, "changed": 0}
    assert (diff.source_docs, diff.target_docs) == (3, 3)
    assert diff.differences("db.c") == []


def test_int32_and_int64_ids_are_different_documents() -> None:
    diff = diff_documents(docs({"_id": 1, "a": 1}), docs({"_id": Int64(1), "a": 1}), sample=5)
    assert diff.counts == {"missing": 1, "extra": 1, "changed": 0}
    assert [extjson.dumps(1)] == [d.ids[0] for d in diff.differences("db.c") if d.kind == "missing"]
    assert [extjson.dumps(Int64(1))] == [d.ids[0] for d in diff.differences("db.c") if d.kind == "extra"]


@pytest.mark.parametrize(
    "target",
    [
        {"_id": 5, "a": Int64(5), "b": "x"},  # Int32 -> Int64
        {"_id": 5, "b": "x", "a": 5},  # field order
        {"_id": 5, "a": 5.0, "b": "x"},  # Int32 -> double
        {"_id": 5, "a": 5, "b": "x", "c": None},  # added field
    ],
)
def test_any_byte_change_is_a_changed_document(target: dict[str, Any]) -> None:
    source = SON([("_id", 5), ("a", 5), ("b", "x")])
    diff = diff_documents(docs(source, {"_id": 6}), docs(target, {"_id": 6}), sample=5)
    assert diff.counts == {"missing": 0, "extra": 0, "changed": 1}
    [difference] = diff.differences("db.c")
    assert difference.kind == "changed"
    assert difference.ids == [extjson.dumps(5)]
    assert difference.line() == f"db.c: 1 document differs (changed) e.g. _id {extjson.dumps(5)}"


def test_counts_are_complete_but_samples_bounded() -> None:
    source = docs(*({"_id": i, "v": 1} for i in range(20)))
    target = docs(*({"_id": i, "v": 2} for i in range(10)), *({"_id": i, "v": 1} for i in range(100, 103)))
    diff = diff_documents(source, target, sample=2)
    assert diff.counts == {"missing": 10, "extra": 3, "changed": 10}
    assert all(len(ids) == 2 for ids in diff.ids.values())
    missing = next(d for d in diff.differences("db.c") if d.kind == "missing")
    assert missing.detail == "10 documents missing on the target (missing; 20 on the source, 13 on the target)"
    assert missing.ids == [extjson.dumps(10), extjson.dumps(11)]  # source order


def test_merge_adds_counts_and_keeps_the_first_samples() -> None:
    first = diff_documents(docs({"_id": 1}, {"_id": 2}), [], sample=3)
    second = diff_documents(docs({"_id": 3}, {"_id": 4}), docs({"_id": 9}), sample=3)
    total = DocumentDiff(sample=3)
    total.merge(first)
    total.merge(second)
    assert total.counts == {"missing": 4, "extra": 1, "changed": 0}
    assert (total.source_docs, total.target_docs) == (4, 1)
    missing = next(d for d in total.differences("db.c") if d.kind == "missing")
    assert missing.ids == [extjson.dumps(i) for i in (1, 2, 3)]


def test_sample_zero_lists_no_ids() -> None:
    diff = diff_documents(docs({"_id": 1}), [], sample=0)
    [difference] = diff.differences("a.b -> c.d")
    assert difference.ids == [] and difference.line() == (
        "a.b -> c.d: 1 document missing on the target (missing; 1 on the source, 0 on the target)"
    )


# --- schema -------------------------------------------------------------------------------------------


def spec(options: dict[str, Any], *indexes: dict[str, Any], kind: str = "collection") -> CollectionSpec:
    return CollectionSpec(Namespace("db", "c"), kind, options, tuple(indexes))


ID_INDEX = {"key": {"_id": 1}, "name": "_id_"}


def test_schema_equal() -> None:
    a = spec({"capped": True, "size": 4096}, ID_INDEX, {"key": {"a": 1, "b": -1}, "name": "ab"})
    assert schema_differences("db.c", a, a) == []


def test_options_are_byte_exact() -> None:
    a = spec({"capped": True, "size": 4096, "max": 10})
    assert [
        d.detail for d in schema_differences("db.c", a, spec({"capped": True, "size": Int64(4096), "max": 10}))
    ] == ["options differ: size"]
    reordered = spec({"size": 4096, "capped": True, "max": 10})
    assert [d.detail for d in schema_differences("db.c", a, reordered)] == ["options differ: field order"]


def test_view_pipeline_and_view_on_are_options() -> None:
    a = spec({"viewOn": "c", "pipeline": [{"$match": {"a": 1}}]}, kind="view")
    b = spec({"viewOn": "d", "pipeline": [{"$match": {"a": Int64(1)}}]}, kind="view")
    [difference] = schema_differences("db.v", a, b)
    assert (difference.kind, difference.detail) == ("options", "options differ: viewOn, pipeline")


def test_indexes_compared_by_name_and_key_order() -> None:
    a = spec({}, ID_INDEX, {"key": {"a": 1, "b": 1}, "name": "ab"}, {"key": {"x": 1}, "name": "x_1"})
    b = spec({}, ID_INDEX, {"key": {"b": 1, "a": 1}, "name": "ab"}, {"key": {"y": 1}, "name": "y_1"})
    details = [d.detail for d in schema_differences("db.c", a, b)]
    assert details[1:] == ["index x_1 missing on the target", "index y_1 only on the target"]
    assert details[0].startswith("index ab differs: source {")
    assert all(d.kind == "index" for d in schema_differences("db.c", a, b))


# --- report -------------------------------------------------------------------------------------------


def test_report_lines_and_json() -> None:
    report = VerifyReport(
        namespaces=2,
        documents=10,
        differences=[
            Difference("db.c", "changed", "2 documents differ (changed)", ['{"$numberInt": "5"}', '"k"']),
            Difference("a.x -> b.x", "missing_namespace", "collection missing on the target"),
        ],
        elapsed_s=0.25,
    )
    assert not report.ok
    assert report.lines() == [
        'db.c: 2 documents differ (changed) e.g. _id {"$numberInt": "5"}, "k"',
        "a.x -> b.x: collection missing on the target",
        "verify: 2 namespaces, 10 documents compared, 2 differences",
    ]
    data = report.to_json()
    assert data["ok"] is False and data["documents"] == 10 and data["elapsed_s"] == 0.25
    assert data["differences"][1] == {
        "ns": "a.x -> b.x",
        "kind": "missing_namespace",
        "detail": "collection missing on the target",
        "ids": [],
    }
    empty = VerifyReport(1, 1, [], 0.0)
    assert empty.ok and empty.lines() == ["verify: 1 namespace, 1 document compared, 0 differences"]


# --- against two servers ------------------------------------------------------------------------------

IDS: list[Any] = [
    *range(1, 7),
    Int64(7),
    Int64(8),
    9.5,
    "a",
    "b",
    "c",
    ObjectId("650000000000000000000001"),
    ObjectId("650000000000000000000002"),
    {"k": 1},
]


def seed(client: pymongo.MongoClient[dict[str, Any]], db: str) -> None:
    items = client[db]["items"]
    items.insert_many([{"_id": i, "n": 5, "big": Int64(5), "s": str(i)} for i in IDS])
    items.create_index([("s", 1), ("n", -1)], name="s_n")
    client[db].command({"create": "items_view", "viewOn": "items", "pipeline": [{"$match": {"n": 5}}]})


@pytest.fixture
def pair(source_uri: str, target_uri: str) -> Iterator[tuple[pymongo.MongoClient[dict[str, Any]], ...]]:
    source: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(source_uri)
    target: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(target_uri)
    try:
        seed(source, "app")
        yield source, target
    finally:
        source.close()
        target.close()


def settings(source_uri: str, target_uri: str, **flags: Any) -> Settings:
    # partition_docs=4 splits the collection into several bracketed _id ranges, as a big one would be
    return resolve(
        {"source": source_uri, "target": target_uri, "partition_docs": 4, "split": "always", **flags}, env={}
    )


def kinds(report: VerifyReport) -> list[tuple[str, str]]:
    return [(d.ns, d.kind) for d in report.differences]


@pytest.mark.integration
async def test_verify_identical_then_each_kind_of_difference(
    pair: tuple[pymongo.MongoClient[dict[str, Any]], ...], source_uri: str, target_uri: str
) -> None:
    _, target = pair
    seed(target, "app")
    s = settings(source_uri, target_uri)
    report = await verify(s)
    assert report.ok, report.lines()
    assert (report.namespaces, report.documents) == (2, len(IDS))

    items = target["app"]["items"]
    items.update_one({"_id": 3}, {"$set": {"n": Int64(5)}})  # same value, one type byte different
    report = await verify(s)
    assert kinds(report) == [("app.items", "changed")]
    assert report.differences[0].ids == [extjson.dumps(3)]

    items.delete_one({"_id": "b"})
    items.delete_one({"_id": 6})
    items.insert_one({"_id": Int64(6), "n": 5})  # in place of the source's Int32 6: not the same _id
    target["app"]["items"].drop_index("s_n")
    report = await verify(s)
    assert sorted(kinds(report)) == sorted([("app.items", k) for k in ("index", "missing", "extra", "changed")]), (
        report.lines()
    )
    by_kind = {d.kind: d for d in report.differences}
    assert sorted(by_kind["missing"].ids) == sorted([extjson.dumps("b"), extjson.dumps(6)])
    assert by_kind["extra"].ids == [extjson.dumps(Int64(6))]
    assert by_kind["index"].detail == "index s_n missing on the target"
    assert report.lines()[-1] == f"verify: 2 namespaces, {len(IDS)} documents compared, 4 differences"


@pytest.mark.integration
async def test_a_target_only_document_of_a_type_the_source_lacks_is_found(
    pair: tuple[pymongo.MongoClient[dict[str, Any]], ...], source_uri: str, target_uri: str
) -> None:
    """The ranges are planned on the source: target documents whose _id types no range names (a date and
    a bool, which the source never had) are compared too."""
    _, target = pair
    seed(target, "app")
    target["app"]["items"].insert_many([{"_id": datetime.datetime(2026, 1, 1)}, {"_id": True}])
    report = await verify(settings(source_uri, target_uri))
    assert kinds(report) == [("app.items", "extra")], report.lines()
    assert "2 documents only on the target" in report.differences[0].detail


@pytest.mark.integration
async def test_verify_namespaces_with_rename(
    pair: tuple[pymongo.MongoClient[dict[str, Any]], ...], source_uri: str, target_uri: str
) -> None:
    source, target = pair
    seed(target, "copy")
    source["app"]["only_source"].insert_one({"_id": 1})
    target["copy"]["stray"].insert_one({"_id": 1})
    target["other"]["unselected"].insert_one({"_id": 1})  # its inverse name, other.unselected, is excluded
    target["copy"]["items_view"].drop()
    target["copy"].command({"create": "items_view", "viewOn": "items", "pipeline": [{"$match": {"n": 6}}]})
    report = await verify(settings(source_uri, target_uri, rename=("app=copy",), include=("app\\..*",)))
    assert sorted(kinds(report)) == [
        ("app.items_view -> copy.items_view", "options"),
        ("app.only_source -> copy.only_source", "missing_namespace"),
        ("app.stray -> copy.stray", "extra_namespace"),
    ], report.lines()
    assert report.documents == len(IDS)
