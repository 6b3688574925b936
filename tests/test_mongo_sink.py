"""The MongoDB sink against a real server: idempotent replay, transactions, stale deltas."""

from __future__ import annotations

import logging

import bson
import pymongo
import pytest
from bson import Int64
from bson.raw_bson import RawBSONDocument

from replicator.events import ChangeEvent, Namespace, Op, Transaction, UpdateDescription
from replicator.sinks.mongo.sink import MongoSink

pytestmark = pytest.mark.integration
NS = Namespace("sinkdb", "c")


def raw(doc: dict[str, object]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


async def test_replaying_twice_converges(target_uri: str) -> None:
    events = [
        ChangeEvent(Op.INSERT, NS, key=raw({"_id": 1}), document=raw({"_id": 1, "n": Int64(1), "z": -0.0})),
        ChangeEvent(Op.INSERT, NS, key=raw({"_id": 2}), document=raw({"_id": 2})),
        ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 1}), update=UpdateDescription(raw({"n": Int64(2)}), ("z",))),
        ChangeEvent(Op.REPLACE, NS, key=raw({"_id": 2}), document=raw({"_id": 2, "b": 1, "a": 2})),
        ChangeEvent(Op.DELETE, NS, key=raw({"_id": 3})),
        ChangeEvent(Op.CREATE_INDEXES, NS, ddl={"indexes": [{"key": {"a": 1}, "name": "a_1"}]}),
    ]
    async with MongoSink(target_uri) as sink:
        await sink.write(events)
        await sink.write(events)  # at-least-once: the same batch again after a crash
    with pymongo.MongoClient(target_uri, document_class=RawBSONDocument) as client:
        docs = {d["_id"]: d.raw for d in client.sinkdb.c.find()}
        assert docs == {1: bson.encode({"_id": 1, "n": Int64(2)}), 2: bson.encode({"_id": 2, "b": 1, "a": 2})}
        assert "a_1" in client.sinkdb.c.index_information()


async def test_stale_delta_is_skipped_and_the_rest_applied(target_uri: str) -> None:
    with pymongo.MongoClient(target_uri) as client:
        client.sinkdb.c.insert_one({"_id": 1, "a": 5})  # ahead of the event: "a" is no longer a document
    events = [
        ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 1}), update=UpdateDescription(raw({"a.b": 1}))),
        ChangeEvent(Op.INSERT, NS, key=raw({"_id": 2}), document=raw({"_id": 2})),
    ]
    async with MongoSink(target_uri) as sink:
        await sink.write(events)
    with pymongo.MongoClient(target_uri) as client:
        assert list(client.sinkdb.c.find().sort("_id", 1)) == [{"_id": 1, "a": 5}, {"_id": 2}]


async def test_transaction_applies_together(target_uri: str) -> None:
    txn = Transaction(raw({"id": bson.Binary(b"\x01" * 16, 4)}), 7)
    other = Namespace("sinkdb", "d")
    events = [
        ChangeEvent(Op.INSERT, NS, key=raw({"_id": 1}), document=raw({"_id": 1}), txn=txn),
        ChangeEvent(Op.INSERT, other, key=raw({"_id": 1}), document=raw({"_id": 1}), txn=txn),
    ]
    with pymongo.MongoClient(target_uri) as client:  # collections exist: DDL is not allowed in every txn
        client.sinkdb.create_collection("c")
        client.sinkdb.create_collection("d")
    async with MongoSink(target_uri) as sink:
        await sink.write(events)
    with pymongo.MongoClient(target_uri) as client:
        assert client.sinkdb.c.count_documents({}) == 1 and client.sinkdb.d.count_documents({}) == 1


async def test_dollar_prefixed_top_level_fields_replay_and_recopy(target_uri: str) -> None:
    """Legal since MongoDB 5.0 ($setField); a replacement document refuses them (code 52)."""
    doc = raw({"_id": 1, "$price": 3, "a": {"$inner": 1}, "z": -0.0})
    newer = raw({"_id": 1, "$price": 4, "b": Int64(2)})
    async with MongoSink(target_uri) as sink:
        await sink.write([ChangeEvent(Op.READ, NS, document=doc)])
        await sink.write([ChangeEvent(Op.READ, NS, document=doc)])  # a partition copied again after a crash
        await sink.write([ChangeEvent(Op.REPLACE, NS, key=raw({"_id": 1}), document=newer)])
        second = raw({"_id": 2, "$x": {"$y": 1}})
        await sink.write([ChangeEvent(Op.INSERT, NS, key=raw({"_id": 2}), document=second)])
        looked_up = raw({"_id": 2, "$x": 5, "n": 1.5})
        await sink.write([ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 2}), document=looked_up)])
    with pymongo.MongoClient(target_uri, document_class=RawBSONDocument) as client:
        assert [d.raw for d in client.sinkdb.c.find().sort("_id")] == [newer.raw, looked_up.raw]


async def test_a_transaction_with_dollar_prefixed_fields_stays_one_unit(
    target_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcdc.sink.mongo")
    txn = Transaction({"id": bson.Binary(b"s" * 16, 4)}, 7)
    first = raw({"_id": 1, "$price": 1})
    newer = raw({"_id": 1, "$price": 2, "note": "in a transaction"})
    other = raw({"_id": 2, "$x": True})
    async with MongoSink(target_uri) as sink:
        await sink.write([ChangeEvent(Op.INSERT, NS, key=raw({"_id": 1}), document=first)])
        await sink.write([
            ChangeEvent(Op.REPLACE, NS, key=raw({"_id": 1}), document=newer, txn=txn),
            ChangeEvent(Op.INSERT, NS, key=raw({"_id": 2}), document=other, txn=txn),
        ])  # fmt: skip
    with pymongo.MongoClient(target_uri, document_class=RawBSONDocument) as client:
        assert [d.raw for d in client.sinkdb.c.find().sort("_id")] == [newer.raw, other.raw]
    assert "one by one" not in caplog.text  # replayed again in the literal form, still one transaction


async def test_an_unsettled_unique_key_conflict_names_namespace_index_and_key(target_uri: str) -> None:
    from replicator.errors import SinkError

    with pymongo.MongoClient(target_uri) as client:
        client.sinkdb.c.create_index("email", unique=True)
        client.sinkdb.c.insert_one({"_id": 1, "email": "a@x"})
    clash = raw({"_id": 2, "email": "a@x"})
    async with MongoSink(target_uri) as sink:  # no source attached: nothing to settle it from
        with pytest.raises(SinkError) as failed:
            await sink.write([ChangeEvent(Op.INSERT, NS, key=raw({"_id": 2}), document=clash)])
    message = str(failed.value)
    assert "sinkdb.c" in message and "email_1" in message and "a@x" in message, message


async def test_a_stale_delta_inside_a_transaction_converges(target_uri: str) -> None:
    """Re-applied after the target moved on ($set a.b where a is now 5): the transaction cannot commit as
    it is, and its events are applied without it; the stale delta is skipped as outside a transaction."""
    txn = Transaction(raw({"id": bson.Binary(b"\x02" * 16, 4)}), 3)
    with pymongo.MongoClient(target_uri) as client:
        client.sinkdb.c.insert_many([{"_id": 1, "a": 5}, {"_id": 2, "n": 1}])
    events = [
        ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 1}), update=UpdateDescription(raw({"a.b": 1})), txn=txn),
        ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 2}), update=UpdateDescription(raw({"n": 2})), txn=txn),
    ]
    async with MongoSink(target_uri) as sink:
        await sink.write(events)
    with pymongo.MongoClient(target_uri) as client:
        assert list(client.sinkdb.c.find().sort("_id", 1)) == [{"_id": 1, "a": 5}, {"_id": 2, "n": 2}]


async def test_a_write_the_target_refuses_names_the_namespace_document_and_code(target_uri: str) -> None:
    from replicator.errors import SinkError

    with pymongo.MongoClient(target_uri) as client:
        client.sinkdb.c.insert_one({"_id": 1, "arr": [1, 2]})
    bad = UpdateDescription(raw({"_id": 2}))  # refused by the server: _id is immutable
    async with MongoSink(target_uri) as sink:
        with pytest.raises(SinkError, match=r"sinkdb\.c: the target refused .*_id 1.*code \d+"):
            await sink.write([ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 1}), update=bad)])


def test_only_a_deployment_without_transactions_turns_them_off() -> None:
    """Code 20 (IllegalOperation) is broad: only its "transaction numbers are only allowed on a replica set
    member or mongos" form says the target has no transactions."""
    from pymongo.errors import OperationFailure

    from replicator.sinks.mongo.sink import no_transactions

    standalone = OperationFailure("Transaction numbers are only allowed on a replica set member or mongos", code=20)
    assert no_transactions(standalone)
    assert not no_transactions(OperationFailure("cannot write to 'config.system.sessions'", code=20))
    assert not no_transactions(OperationFailure("Cannot create namespace in a multi-document transaction", code=263))


async def test_a_namespace_failing_mid_batch_leaves_no_other_namespaces_write_running(target_uri: str) -> None:
    """A batch across namespaces writes them in parallel; when one fails, the others' writes are stopped and
    waited for before the failure is raised, so none of them lands after the batch's retry has written newer
    events (a write of the failed attempt, still running, would put an older state back)."""
    import asyncio

    from replicator.errors import SinkError
    from tests.support import failpoint

    with pymongo.MongoClient(target_uri) as client:
        client.sinkdb.c.insert_one({"_id": 1, "arr": [1, 2]})
        client.sinkdb.other.insert_one({"_id": 1})
    refused = ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 1}), update=UpdateDescription(raw({"_id": 2})))
    slow = ChangeEvent(Op.DELETE, Namespace("sinkdb", "other"), key=raw({"_id": 1}))
    async with MongoSink(target_uri) as sink:
        with failpoint.failing(target_uri, failpoint.block(5_000), ["delete"], app=None):
            with pytest.raises(SinkError):
                await sink.write([refused, slow])
            running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            assert not [task for task in running if "_apply_namespace" in repr(task.get_coro())], running
