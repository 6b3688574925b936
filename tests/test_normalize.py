"""Raw change documents -> ChangeEvent, and ChangeEvent -> idempotent MongoDB writes."""

from __future__ import annotations

import datetime

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo import DeleteOne, ReplaceOne, UpdateOne

from replicator.events import ChangeEvent, Namespace, Op, Transaction
from replicator.events.normalize import OPERATION_TYPES, normalize_change
from replicator.sinks.mongo.plan import segments as _segments
from replicator.sinks.mongo.plan import write_ops
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


def test_an_unknown_operation_type_is_skipped_unless_it_changes_documents(caplog: pytest.LogCaptureFixture) -> None:
    """MongoDB adds operation types: one without a document (a new kind of DDL) is skipped with a warning
    naming it; one about a document stops the run in one line (skipping it would lose the change)."""
    from replicator.errors import UnknownChange

    assert normalize_change(raw({**BASE, "operationType": "createSearchIndexes"})) is None
    for event in ({**BASE, "operationType": "teleport"}, {**BASE, "operationType": "teleport", "lsid": {"id": 1}}):
        assert normalize_change(raw(event)) is None
        assert normalize_change(event) is None  # a decoded mapping, not bytes: the other reading
    assert [r.getMessage() for r in caplog.records if "teleport" in r.getMessage()] == [
        "skipping change events of operationType 'teleport', unknown to mcdc (they hold no document)"
    ]
    for field in ("documentKey", "fullDocument", "updateDescription"):
        with pytest.raises(UnknownChange, match=r"document change of operationType 'beam'.*upgrade mcdc"):
            normalize_change(raw({**BASE, "operationType": "beam", field: {"_id": 1}}))


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


def test_an_update_description_is_decoded_when_a_stage_first_reads_it() -> None:
    """The MongoDB sink applies an update's looked-up document and never reads its delta: normalizing
    leaves the description as bytes; read, it is the description the decoded mapping gives, and it
    compares and pickles as one."""
    import pickle

    from replicator.events import UpdateDescription
    from replicator.events.normalize import _from_mapping

    desc = {"updatedFields": {"a": 1}, "removedFields": ["b"], "truncatedArrays": [{"field": "c", "newSize": 1}]}
    data = bson.encode({**BASE, "operationType": "update", "documentKey": {"_id": 1}, "updateDescription": desc})
    event = normalize_change(RawBSONDocument(data))
    assert event is not None and event.update is not None
    assert event.update._parts is None  # not decoded yet
    eager = UpdateDescription(RawBSONDocument(bson.encode({"a": 1})), ("b",), (("c", 1),))
    assert event.update == eager
    assert event.update.removed_fields == ("b",) and event.update.truncated_arrays == (("c", 1),)
    assert pickle.loads(pickle.dumps(event.update)) == eager
    decoded = _from_mapping(RawBSONDocument(data), None)
    assert decoded is not None and decoded.update == event.update


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
    from replicator.sinks.mongo.plan import coalesce

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
    assert [event.document_key for event in deletes] == [{"_id": 1}, {"_id": 4}]
    assert [(event.document_key, event.document) for event in replaces] == [
        ({"_id": 2}, {"_id": 2, "v": 2}), ({"_id": 5}, {"_id": 5}),
    ]  # fmt: skip
    # a delta keeps the document's whole sequence, in order
    assert [type(op) for _, op in sequences] == [UpdateOne, ReplaceOne]


def test_a_document_deleted_at_the_end_of_the_batch_is_only_deleted_delta_updates_or_not() -> None:
    """Its updates cannot matter: the deletes go first. A document re-inserted after its delete keeps them."""
    from replicator.events import UpdateDescription
    from replicator.sinks.mongo.plan import coalesce

    ns = Namespace("d", "c")

    def delta(i: int) -> ChangeEvent:
        return ChangeEvent(Op.UPDATE, ns, key={"_id": i}, update=UpdateDescription({"v": i}))

    def delete(i: int) -> ChangeEvent:
        return ChangeEvent(Op.DELETE, ns, key={"_id": i})

    events = [
        delta(1), delta(2), delete(1),
        delta(3), delete(3), ChangeEvent(Op.INSERT, ns, key={"_id": 3}, document={"_id": 3}),
    ]  # fmt: skip
    deletes, replaces, sequence = coalesce(events)
    assert [event.document_key for event in deletes] == [{"_id": 1}]
    assert replaces == []
    assert [(type(op), op._filter) for _, op in sequence] == [  # type: ignore[union-attr]
        (UpdateOne, {"_id": 2}), (UpdateOne, {"_id": 3}), (DeleteOne, {"_id": 3}), (ReplaceOne, {"_id": 3}),
    ]  # fmt: skip


def test_deltas_of_different_documents_keep_the_sources_order() -> None:
    """A unique key moved from one document to another (A->tmp, B->a, A->b) is freed before it is taken."""
    from replicator.events import UpdateDescription
    from replicator.sinks.mongo.plan import coalesce

    ns = Namespace("d", "c")

    def move(i: int, email: str) -> ChangeEvent:
        return ChangeEvent(Op.UPDATE, ns, key={"_id": i}, update=UpdateDescription({"email": email}))

    _, _, sequence = coalesce([move(1, "tmp"), move(2, "a"), move(1, "b")])
    assert [(op._filter["_id"], op._doc["$set"]["email"]) for _, op in sequence] == [  # type: ignore[union-attr]
        (1, "tmp"), (2, "a"), (1, "b"),
    ]  # fmt: skip


def test_literal_ops_carry_dollar_prefixed_fields() -> None:
    from replicator.events import UpdateDescription
    from replicator.sinks.mongo.plan import literal_ops

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
    from replicator.sinks.mongo.plan import duplicate_key

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


def _change_variants() -> list[dict[str, object]]:
    """Change documents with every optional field in turn, in server order and shuffled."""
    lsid = {"id": bson.Binary(b"\x02" * 16, 4), "uid": bson.Binary(b"\x03" * 32, 0)}
    desc = {
        "updatedFields": {"a.0": bson.Int64(1), "b": {"c": -0.0}},
        "removedFields": ["x", "y.z"],
        "truncatedArrays": [{"field": "arr", "newSize": 1}, {"field": "o.arr", "newSize": bson.Int64(0)}],
        "disambiguatedPaths": {"a.0": ["a", 0]},
    }
    head = {
        "_id": {"_data": "8200000064000000022B0229296E04"},
        "clusterTime": Timestamp(0xFFFFFFFF, 0xFFFFFFFE),
        "wallTime": datetime.datetime(2026, 5, 17, 3, 4, 5),
        "collectionUUID": bson.Binary(b"\x04" * 16, 4),
        "ns": {"db": "shop", "coll": "orders"},
    }
    variants: list[dict[str, object]] = [
        {
            **head,
            "operationType": "insert",
            "fullDocument": {"_id": 1, "r": bson.Regex("^a", "i")},
            "documentKey": {"_id": 1},
        },
        {
            **head,
            "operationType": "update",
            "fullDocument": None,
            "documentKey": {"_id": 2},
            "updateDescription": desc,
            "lsid": lsid,
            "txnNumber": bson.Int64(9),
        },
        {
            **head,
            "operationType": "update",
            "documentKey": {"_id": 3},
            "updateDescription": {"updatedFields": {}, "removedFields": [], "truncatedArrays": []},
            "txnNumber": 4,
            "lsid": lsid,
        },
        {
            **head,
            "operationType": "replace",
            "fullDocument": {"_id": 4},
            "fullDocumentBeforeChange": {"_id": 4, "o": 1},
            "documentKey": {"_id": 4, "sk": "x"},
        },
        {**head, "operationType": "delete", "documentKey": {"_id": bson.ObjectId()}, "fullDocumentBeforeChange": None},
        {
            **head,
            "operationType": "rename",
            "to": {"db": "shop", "coll": "new"},
            "operationDescription": {"to": {"db": "shop", "coll": "new"}, "dropTarget": bson.Binary(b"\x05" * 16, 4)},
        },
        {**head, "operationType": "rename", "operationDescription": {"to": {"db": "b", "coll": "c"}}},
        {
            **head,
            "operationType": "createIndexes",
            "nsType": "collection",
            "operationDescription": {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]},
        },
        {**head, "operationType": "dropDatabase", "ns": {"db": "shop"}},
        {**head, "operationType": "invalidate"},
        {
            **head,
            "operationType": "insert",
            "documentKey": {"_id": 5},
            "fullDocument": {"_id": 5},
            "splitEvent": {"fragment": 1, "of": 1},
            "wallTime": bson.DatetimeMS(-(10**15)),
        },
        {**head, "operationType": "insert", "documentKey": {"_id": 6}, "odd": bson.Regex("x")},  # not walked
        {**head, "operationType": "reshardCollection"},
    ]
    shuffled = [dict(reversed(list(v.items()))) for v in variants]
    return variants + shuffled


@pytest.mark.parametrize("change", _change_variants())
def test_reading_the_raw_bytes_gives_the_event_decoding_gives(change: dict[str, object]) -> None:
    """The walk over a change document's bytes and the decoded (RawBSONDocument mapping) reading agree on
    every field of the event, documents byte for byte."""
    from replicator.events.normalize import _from_mapping
    from replicator.source.connection import RAW_CODEC

    data = bson.encode(change)
    walked = normalize_change(RawBSONDocument(data, RAW_CODEC), "rs0")
    decoded = _from_mapping(RawBSONDocument(data, RAW_CODEC), "rs0")
    assert walked == decoded
    if walked is not None and walked.document is not None:
        assert isinstance(walked.document, RawBSONDocument)


def test_wall_time_keeps_every_millisecond() -> None:
    """The walk reads wallTime's int64 milliseconds as they are (no float on the way)."""
    when = datetime.datetime(2286, 11, 20, 17, 46, 39, 999000)
    event = normalize_change(raw({**BASE, "wallTime": when, "operationType": "delete", "documentKey": {"_id": 1}}))
    assert event is not None and event.wall_time_ms == 9_999_999_999_999


def test_a_raw_documents_leading_id_is_read_without_decoding_the_rest() -> None:
    """What the driver reads of every change event: its ``_id``, equal to the decoded one; a document
    whose ``_id`` is not a leading sub-document reads it as usual."""
    from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument

    token = {"_data": "82AB", "extra": bson.Int64(1)}
    event = RawDocument(bson.encode({"_id": token, "fullDocument": {"_id": 1}}), RAW_CODEC)
    assert isinstance(event["_id"], RawDocument) and event["_id"] == RawBSONDocument(bson.encode(token))
    assert dict(event["_id"]) == token and dict(event["fullDocument"]) == {"_id": 1}
    for doc in ({"_id": bson.ObjectId(), "a": 1}, {"a": 1, "_id": {"x": 1}}, {"_idx": {"y": 2}, "_id": 3}):
        assert RawDocument(bson.encode(doc), RAW_CODEC)["_id"] == bson.decode(bson.encode(doc), RAW_CODEC)["_id"]


def test_a_wrapped_document_is_the_raw_document_its_constructor_makes() -> None:
    """rawbson.wrap sets RawBSONDocument's private fields itself (the constructor's checks cost more than
    the object): a pymongo that names them otherwise must fail here, not in the output."""
    import pickle

    import bson

    from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument, wrap

    data = bson.encode({"_id": 1, "a": {"b": [1, "x"]}, "s": "é"})
    made, wrapped = RawDocument(data, RAW_CODEC), wrap(data)
    assert type(wrapped) is RawDocument and wrapped == made and wrapped.raw == data
    assert dict(wrapped) == dict(made) and repr(wrapped) == repr(made)
    assert wrapped["a"] == made["a"] and list(wrapped) == ["_id", "a", "s"]
    assert pickle.loads(pickle.dumps(wrapped)) == made and bson.encode(wrapped) == data


def test_a_raw_documents_truth_is_read_from_its_length_without_decoding_it() -> None:
    """pymongo's ReplaceOne asks ``if replacement`` of every replacement: RawBSONDocument answered from
    ``__len__``, which decodes every field. A RawDocument answers from its bytes, and stays undecoded."""
    from pymongo.common import validate_ok_for_replace

    from replicator.bsonkit.rawbson import wrap

    empty, doc = wrap(bson.encode({})), wrap(bson.encode({"_id": 1, "a": {"b": 2}}))
    assert bool(doc) is True and bool(empty) is False
    validate_ok_for_replace(doc)  # what ReplaceOne's add_replace asks of every replacement
    assert doc._RawBSONDocument__inflated_doc is None  # type: ignore[attr-defined]
    assert bson.decode(doc.raw) == {"_id": 1, "a": {"b": 2}}


def test_a_timestamps_parts_read_in_c_order_as_the_timestamps_do() -> None:
    """The catch-up's ``until`` test compares ``ts_parts`` tuples: they are ``(time, inc)`` and order
    as Timestamp's own comparisons do (a pymongo that renamed the slots fails here, not in a replay)."""
    from replicator.bsonkit.rawbson import ts_parts

    stamps = [Timestamp(5, 6), Timestamp(5, 7), Timestamp(6, 0), Timestamp(2**32 - 1, 2**32 - 1), Timestamp(0, 0)]
    assert ts_parts(Timestamp(5, 6)) == (5, 6)
    for a in stamps:
        for b in stamps:
            assert (ts_parts(a) > ts_parts(b)) == (a > b) and (ts_parts(a) == ts_parts(b)) == (a == b)


def test_events_are_grouped_by_namespace_in_order_equal_namespaces_together() -> None:
    """by_namespace groups by value: runs of one Namespace object, and equal objects made apart."""
    from replicator.events import by_namespace

    a, b, a_again = Namespace("d", "a"), Namespace("d", "b"), Namespace("d", "a")
    events = [ChangeEvent(Op.DELETE, ns, key={"_id": i}) for i, ns in enumerate([a, a, b, a_again, b, a])]
    groups = by_namespace(events)
    assert list(groups) == [a, b]
    assert [e.key["_id"] for e in groups[a] if e.key] == [0, 1, 3, 5]
    assert [e.key["_id"] for e in groups[b] if e.key] == [2, 4]
