"""Partition queries: ranges never span BSON type brackets, and together they cover every _id."""

from __future__ import annotations

import datetime

import bson
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from bson.raw_bson import RawBSONDocument

from replicator.events import Namespace
from replicator.source.partitions import ALL, BRACKETS, OTHER, Partition, bracket_of

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
