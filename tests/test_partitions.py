"""Partition queries: ranges never span BSON type brackets, and together they cover every _id."""

from __future__ import annotations

import datetime

import bson
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from bson.raw_bson import RawBSONDocument

from replicator.events import Namespace
from replicator.source.partitions import ALL, BRACKETS, OTHER, UNBRACKETED, Partition, Resume, bracket_of

NS = Namespace("db", "c")


def test_bracket_of_every_id_type() -> None:
    cases = {
        "minKey": MinKey(),
        "null": None,
        "maxKey": MaxKey(),
        "bool": True,
        "objectId": ObjectId(),
        "timestamp": Timestamp(1, 1),
        "date": datetime.datetime(1900, 1, 1),
        "string": "x",
        "binData": Binary(b"x", 4),
        "object": RawBSONDocument(bson.encode({"a": 1})),
    }
    for bracket, value in cases.items():
        assert bracket_of(value) == bracket
    for number in (1, 2.5, Int64(3), Decimal128("4.5"), float("nan")):
        assert bracket_of(number) == "number"
    assert bracket_of(b"raw") == "binData"
    assert bracket_of(False) == "bool"  # bool is an int in Python, not in BSON


def test_queries() -> None:
    assert Partition(NS, 0, ALL).query() == {}
    first = Partition(NS, 0, "number", upper=100).query()
    # "not >= upper" keeps NaN (the lowest number) in the first range
    assert first == {"_id": {"$type": list(BRACKETS["number"]), "$not": {"$gte": 100}}}
    mid = Partition(NS, 1, "number", lower=100, upper=200).query()
    assert mid == {"_id": {"$type": list(BRACKETS["number"]), "$gte": 100, "$lt": 200}}
    last = Partition(NS, 2, "number", lower=200).query()
    assert last == {"_id": {"$type": list(BRACKETS["number"]), "$gte": 200}}
    other = Partition(NS, 3, OTHER, excluded=("number", "string")).query()
    assert other == {"_id": {"$not": {"$type": [*BRACKETS["number"], *BRACKETS["string"]]}}}


def test_json_round_trip_keeps_bound_types() -> None:
    p = Partition(NS, 4, "number", lower=Int64(10), upper=Decimal128("20.5"), estimated_docs=9)
    q = Partition.from_json(p.to_json())
    assert q == p and isinstance(q.lower, Int64) and isinstance(q.upper, Decimal128)
    doc_bound = Partition(NS, 5, "object", lower=RawBSONDocument(bson.encode({"b": 1, "a": 2})))
    back = Partition.from_json(doc_bound.to_json())
    assert list(back.lower) == ["b", "a"]  # field order survives


def test_partitions_pickle_for_worker_processes() -> None:
    import pickle

    p = Partition(NS, 2, "objectId", lower=ObjectId(), upper=None, estimated_docs=10)
    assert pickle.loads(pickle.dumps(p)) == p


def test_index_bounded_plans_are_recognised() -> None:
    from replicator.source.partitions import _uses_index

    mongod_classic = {"winningPlan": {"stage": "FETCH", "inputStage": {"stage": "IXSCAN", "indexName": "_id_"}}}
    mongod_sbe = {"winningPlan": {"queryPlan": {"stage": "FETCH", "inputStage": {"stage": "IXSCAN"}}}}
    clustered = {"winningPlan": {"stage": "CLUSTERED_IXSCAN"}}
    mongos = {"winningPlan": {"stage": "SINGLE_SHARD", "shards": [{"winningPlan": {"stage": "IXSCAN"}}]}}
    collscan = {"winningPlan": {"stage": "COLLSCAN"}, "rejectedPlans": [{"stage": "IXSCAN"}]}
    assert all(_uses_index(p) for p in (mongod_classic, mongod_sbe, clustered, mongos))
    assert not _uses_index(collscan)


def test_queries_after_a_resume_point() -> None:
    numbers = list(BRACKETS["number"])
    mid = Partition(NS, 1, "number", lower=100, upper=200)
    assert mid.query(Resume(150)) == {"_id": {"$type": numbers, "$gt": 150, "$lt": 200}}
    last = Partition(NS, 2, "number", lower=200)
    assert last.query(Resume(250)) == {"_id": {"$type": numbers, "$gt": 250}}
    # NaN sorts first among numbers but matches no $gt: after it comes every other number
    first = Partition(NS, 0, "number", upper=100)
    assert first.query(Resume(float("nan"))) == {"_id": {"$type": numbers, "$gte": float("-inf"), "$lt": 100}}
    assert first.query(Resume(Decimal128("NaN")))["_id"]["$gte"] == float("-inf")
    assert Partition(NS, 3, "null").query(Resume(None)) == {"_id": {"$type": ["null"], "$gt": None}}


def test_a_whole_collection_goes_on_into_later_brackets() -> None:
    whole = Partition(NS, 0, ALL)
    later_than_strings = [t for b in list(BRACKETS)[4:] for t in BRACKETS[b]] + list(UNBRACKETED)
    assert whole.query(Resume("m")) == {
        "$or": [{"_id": {"$type": ["string", "symbol"], "$gt": "m"}}, {"_id": {"$type": later_than_strings}}]
    }
    after_max = whole.query(Resume(MaxKey()))["$or"]
    assert after_max[1] == {"_id": {"$type": list(UNBRACKETED)}}  # only what has no bracket (copied again)
    assert whole.query(Resume(bson.Regex("x"))) == {}  # an _id type without a bracket: from the start


def test_what_cannot_resume_starts_over() -> None:
    capped = Partition(NS, 0, ALL, ordered=True)
    other = Partition(NS, 4, OTHER, excluded=("number",))
    measurements = Partition(NS, 0, ALL, keyed=False)  # a time-series collection: _ids may repeat
    assert not capped.resumable and not other.resumable and not measurements.resumable
    assert Partition(NS, 0, ALL).resumable
    assert capped.query(Resume(5)) == {} and other.query(Resume(5)) == other.query()
    assert measurements.query(Resume(5)) == {}
    assert Partition.from_json(measurements.to_json()) == measurements
    older = {k: v for k, v in Partition(NS, 1, "number").to_json().items() if k != "keyed"}
    assert Partition.from_json(older).keyed  # a plan saved before the field: every _id was unique


def test_range_cutter_cuts_at_brackets_and_every_n_keys() -> None:
    from bson.regex import Regex

    from replicator.source.partitions import RangeCutter

    cutter = RangeCutter(Namespace("d", "c"), 2)
    for value in (1, 2.5, Int64(3), 4, 5, "a", "b", Regex("x"), ObjectId(b"\x00" * 12)):
        cutter.add(value)
    parts = cutter.partitions()
    shape = [(p.bracket, p.lower, p.upper, p.estimated_docs) for p in parts]
    assert shape == [
        ("number", None, Int64(3), 2), ("number", Int64(3), 5, 2), ("number", 5, None, 1),
        ("string", None, None, 2), ("objectId", None, None, 1), (OTHER, None, None, 1),
    ]  # fmt: skip
    assert parts[-1].excluded == ("number", "string", "objectId")
    assert [p.index for p in parts] == list(range(6))
    assert RangeCutter(Namespace("d", "c"), 2).partitions()[0].bracket == ALL
