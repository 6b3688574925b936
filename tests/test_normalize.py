"""Raw change documents -> ChangeEvent, and ChangeEvent -> idempotent MongoDB writes."""

from __future__ import annotations

import datetime

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo import DeleteOne, ReplaceOne, UpdateOne

from replicator.events import ChangeEvent, Namespace, Op, Transaction
from replicator.normalize import OPERATION_TYPES, normalize_change
from replicator.sinks.mongo import _segments
from replicator.sinks.mongo_plan import write_ops
from replicator.source.changestream import token_timestamp


def raw(doc: dict[str, object]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


BASE = {
    "_id": {"_data": "82"},
    "clusterTime": Timestamp(100, 2),
    "wallTime": datetime.datetime(2026, 1, 1),
    "ns": {"db": "shop", "coll": "orders"},
}


def test_every_operation_type_maps_to_one_op() -> None:
    assert len(set(OPERATION_TYPES.values())) == len(OPERATION_TYPES)
    for name in OPERATION_TYPES:
        event = normalize_change(raw({**BASE, "operationType": name, "documentKey": {"_id": 1}}))
        assert event is not None and event.op is OPERATION_TYPES[name]
    assert normalize_change(raw({**BASE, "operationType": "shardCollection"})) is None
    with pytest.raises(ValueError, match="unknown change stream operationType"):
        normalize_change(raw({**BASE, "operationType": "teleport"}))


def test_update_with_transaction_keeps_raw_values() -> None:
    doc = {
        **BASE,
        "operationType": "update",
        "documentKey": {"_id": bson.Int64(7)},
        "updateDescription": {
            "updatedFields": {"a.b": bson.Decimal128("1.10"), "n": -0.0},
            "removedFields": ["gone"],
            "truncatedArrays": [{"field": "arr", "newSize": 2}],
        },
        "lsid": {"id": bson.Binary(b"\x01" * 16, 4)},
        "txnNumber": bson.Int64(3),
    }
    event = normalize_change(raw(doc))
    assert event is not None and event.update is not None and event.txn is not None
    assert event.update.removed_fields == ("gone",)
    assert event.update.truncated_arrays == (("arr", 2),)
    assert isinstance(event.update.updated_fields, RawBSONDocument)
    assert event.txn.txn_number == 3 and event.wall_time_ms == 1767225600000
    assert event.position is not None and event.position.cluster_time == Timestamp(100, 2)


def test_rename_target() -> None:
    event = normalize_change(raw({**BASE, "operationType": "rename", "to": {"db": "shop", "coll": "old"}}))
    assert event is not None and event.to == Namespace("shop", "old")


def test_write_ops_are_idempotent_forms() -> None:
    ns = Namespace("d", "c")
    full = ChangeEvent(Op.UPDATE, ns, key={"_id": 1}, document={"_id": 1, "a": 2})
    assert [type(o) for o in write_ops(full)] == [ReplaceOne]
    ins = ChangeEvent(Op.INSERT, ns, key={"_id": 1}, document={"_id": 1})
    assert write_ops(ins)[0]._upsert is True  # type: ignore[union-attr]
    from replicator.events import UpdateDescription

    delta = ChangeEvent(
        Op.UPDATE, ns, key={"_id": 1},
        update=UpdateDescription({"x": 1}, removed_fields=("y",), truncated_arrays=(("arr", 1),)),
    )  # fmt: skip
    ops = write_ops(delta)
    assert [type(o) for o in ops] == [UpdateOne, UpdateOne]
    assert ops[0]._doc == {"$push": {"arr": {"$each": [], "$slice": 1}}}  # type: ignore[union-attr]
    assert ops[1]._doc == {"$set": {"x": 1}, "$unset": {"y": ""}}  # type: ignore[union-attr]
    assert [type(o) for o in write_ops(ChangeEvent(Op.DELETE, ns, key={"_id": 1}))] == [DeleteOne]


def test_segments_keep_transactions_and_ddl_whole() -> None:
    ns = Namespace("d", "c")
    t1 = Transaction({"id": b"a"}, 1)
    t2 = Transaction({"id": b"a"}, 2)
    events = [
        ChangeEvent(Op.INSERT, ns, key={"_id": 1}),
        ChangeEvent(Op.INSERT, ns, key={"_id": 2}, txn=t1),
        ChangeEvent(Op.UPDATE, ns, key={"_id": 3}, txn=t1),
        ChangeEvent(Op.INSERT, ns, key={"_id": 4}, txn=t2),
        ChangeEvent(Op.DROP, ns),
        ChangeEvent(Op.INSERT, ns, key={"_id": 5}),
        ChangeEvent(Op.DELETE, ns, key={"_id": 6}),
    ]
    assert [(kind, len(evs)) for kind, evs in _segments(events)] == [
        ("plain", 1), ("txn", 2), ("txn", 1), ("ddl", 1), ("plain", 2),
    ]  # fmt: skip


def test_resume_token_time() -> None:
    assert token_timestamp({"_data": "8265A1B2C3000000042B0229"}) == Timestamp(0x65A1B2C3, 4)
    assert token_timestamp({"_data": "3b00000010"}) is None
    assert token_timestamp(None) is None


def test_coalesce_keeps_each_documents_order() -> None:
    from replicator.events import UpdateDescription
    from replicator.sinks.mongo_plan import coalesce

    ns = Namespace("d", "c")

    def full(i: int, v: int) -> ChangeEvent:
        return ChangeEvent(Op.UPDATE, ns, key={"_id": i}, document={"_id": i, "v": v})

    events = [
        full(1, 1), full(2, 1), ChangeEvent(Op.DELETE, ns, key={"_id": 1}), full(2, 2),
        ChangeEvent(Op.UPDATE, ns, key={"_id": 3}, update=UpdateDescription({"v": 1})), full(3, 2),
        ChangeEvent(Op.INSERT, ns, key={"_id": 4}, document={"_id": 4}), ChangeEvent(Op.DELETE, ns, key={"_id": 4}),
        ChangeEvent(Op.DELETE, ns, key={"_id": 5}), ChangeEvent(Op.INSERT, ns, key={"_id": 5}, document={"_id": 5}),
    ]  # fmt: skip
    deletes, replaces, sequences = coalesce(events)
    assert [op._filter for _, op in deletes] == [{"_id": 1}, {"_id": 4}]  # type: ignore[union-attr]
    assert [(op._filter, op._doc) for _, op in replaces] == [  # type: ignore[union-attr]
        ({"_id": 2}, {"_id": 2, "v": 2}), ({"_id": 5}, {"_id": 5}),
    ]  # fmt: skip
    # a delta keeps the document's whole sequence, in order
    assert [type(op) for _, op in sequences] == [UpdateOne, ReplaceOne]


def test_deltas_of_different_documents_keep_the_sources_order() -> None:
    """A unique key moved from one document to another (A->tmp, B->a, A->b) is freed before it is taken."""
    from replicator.events import UpdateDescription
    from replicator.sinks.mongo_plan import coalesce

    ns = Namespace("d", "c")

    def move(i: int, email: str) -> ChangeEvent:
        return ChangeEvent(Op.UPDATE, ns, key={"_id": i}, update=UpdateDescription({"email": email}))

    _, _, sequence = coalesce([move(1, "tmp"), move(2, "a"), move(1, "b")])
    assert [(op._filter["_id"], op._doc["$set"]["email"]) for _, op in sequence] == [  # type: ignore[union-attr]
        (1, "tmp"), (2, "a"), (1, "b"),
    ]  # fmt: skip


def test_literal_ops_carry_dollar_prefixed_fields() -> None:
    from replicator.events import UpdateDescription
    from replicator.sinks.mongo_plan import literal_ops

    ns = Namespace("d", "c")
    doc = {"_id": 1, "$price": 3}
    (replace,) = literal_ops(ChangeEvent(Op.REPLACE, ns, key={"_id": 1}, document=doc))
    assert replace._doc == [{"$replaceWith": {"$literal": doc}}] and replace._upsert  # type: ignore[union-attr]
    delta = UpdateDescription({"$price": 4, "a.b": 1}, removed_fields=("$old", "c"))
    plain, pipeline = literal_ops(ChangeEvent(Op.UPDATE, ns, key={"_id": 1}, update=delta))
    assert plain._doc == {"$set": {"a.b": 1}, "$unset": {"c": ""}}  # type: ignore[union-attr]
    assert [s["$replaceWith"]["$setField"]["field"] for s in pipeline._doc] == [  # type: ignore[union-attr]
        {"$literal": "$price"}, {"$literal": "$old"},
    ]  # fmt: skip


def test_duplicate_key_errors_name_the_index_and_key() -> None:
    from replicator.sinks.mongo_plan import duplicate_key

    error = {
        "code": 11000, "keyPattern": {"email": 1}, "keyValue": {"email": "b@x"},
        "errmsg": 'E11000 duplicate key error collection: p.users index: email_1 dup key: { email: "b@x" }',
    }  # fmt: skip
    dup = duplicate_key(error)
    assert dup is not None and dup.index == "email_1" and "b@x" in dup.describe()
    assert duplicate_key({**error, "errmsg": "E11000 ... index: _id_ dup key: { _id: 1 }"}) is None
    assert duplicate_key({"code": 2}) is None


async def test_an_event_held_back_is_never_acknowledged() -> None:
    """The first event after `until` ends the run unapplied; the batch must not carry the stream's token,
    which already points past that event (the bug: an insert made at the end of a sync was lost)."""
    from replicator.source.changestream import ChangeStreamReader

    late = raw({**BASE, "_id": {"_data": "late"}, "clusterTime": Timestamp(200, 1), "operationType": "insert",
                "documentKey": {"_id": 1}, "fullDocument": {"_id": 1}})  # fmt: skip

    class FakeStream:
        resume_token: object = {"_data": "before"}

        async def try_next(self) -> object:
            self.resume_token = {"_data": "late"}
            return late

    reader = ChangeStreamReader(None, full_document="updateLookup", batch_size=10)  # type: ignore[arg-type]
    reader._stream = FakeStream()  # type: ignore[assignment]
    batches = [b async for b in reader.batches(until=Timestamp(100, 1))]
    assert len(batches) == 1 and not batches[0].events
    assert not batches[0].position  # nothing to acknowledge
