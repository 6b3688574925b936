"""Unordered writes as commands of their statements (sinks/mongo/commands): how a batch is cut into
commands, and, against the server, that they land byte for byte, report their write errors as insert_many
and bulk_write do, and keep the write concern."""

from __future__ import annotations

import random
from typing import Any

import bson
import pymongo
import pytest
from bson import Int64
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, monitoring
from pymongo.errors import BulkWriteError
from pymongo.write_concern import WriteConcern

from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument
from replicator.events import ChangeEvent, Namespace, Op
from replicator.sinks.mongo.commands import chunks, delete_unordered, insert_unordered, replace_unordered

NS = Namespace("insdb", "rep")


def test_a_batch_is_cut_at_the_count_and_at_the_bytes_a_bigger_document_alone() -> None:
    assert list(chunks([10] * 5, 1000, 2)) == [(0, 2), (2, 4), (4, 5)]
    assert list(chunks([10, 10, 10], 36, 100)) == [(0, 2), (2, 3)]  # 18 bytes an element: two fit in 36
    assert list(chunks([10, 500, 10], 100, 100)) == [(0, 1), (1, 2), (2, 3)]
    assert list(chunks([], 100, 100)) == []


def test_random_batches_are_cut_into_consecutive_commands_within_the_limits() -> None:
    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.choice((5, 50, 500, 5000)) for _ in range(rng.randrange(0, 40))]
        most_bytes, most_docs = rng.randrange(100, 20000), rng.randrange(1, 10)
        cut = list(chunks(sizes, most_bytes, most_docs))
        assert [i for start, stop in cut for i in range(start, stop)] == list(range(len(sizes)))
        for start, stop in cut:
            assert 0 < stop - start <= most_docs
            assert stop - start == 1 or sum(sizes[start:stop]) + 8 * (stop - start) <= most_bytes


def test_decoded_documents_are_raw_documents_of_their_own_bytes() -> None:
    docs = [{"_id": Int64(i), "s": "x" * i, "sub": {"a": [1, {"b": None}]}} for i in range(3)]
    data = b"".join(bson.encode(doc) for doc in docs)
    decoded = bson.decode_all(data, RAW_CODEC)
    assert [type(doc) for doc in decoded] == [RawDocument] * 3
    assert [doc.raw for doc in decoded] == [bson.encode(doc) for doc in docs]
    assert dict(decoded[2]["sub"]["a"][1]) == {"b": None}
    assert RawDocument(bson.encode(docs[1]))["s"] == "x"


class _Inserts(monitoring.CommandListener):
    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("insert", "update", "delete"):
            self.commands.append(dict(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


@pytest.mark.integration
async def test_raw_documents_land_byte_for_byte_with_the_collections_write_concern(target_uri: str) -> None:
    docs = [
        _raw({"_id": i, "d": bson.Decimal128("1.10"), "f": -0.0, "n": None, "a": [{"z": 1, "y": 2}], "i": Int64(i)})
        for i in range(50)
    ]
    listener = _Inserts()
    async with AsyncMongoClient(target_uri, event_listeners=[listener]) as client:
        coll = client.insdb.get_collection("exact", write_concern=WriteConcern(w="majority", j=True))
        await insert_unordered(coll, docs)
    with pymongo.MongoClient(target_uri, document_class=RawBSONDocument) as client:
        got = [doc.raw for doc in client.insdb.exact.find().sort("_id", 1)]
    assert got == [doc.raw for doc in docs]
    assert len(listener.commands) == 1
    assert listener.commands[0]["writeConcern"] == {"w": "majority", "j": True}
    assert listener.commands[0]["ordered"] is False and listener.commands[0]["bypassDocumentValidation"] is True


@pytest.mark.integration
async def test_write_errors_are_raised_with_their_index_in_the_batch_once_the_rest_is_written(
    target_uri: str,
) -> None:
    """As insert_many(ordered=False) raises them; a batch bigger than one command (about 9 MB documents:
    two in one 16 MB command at most) gives indexes in the whole batch."""
    big = "x" * (9 * 1024 * 1024)
    with pymongo.MongoClient(target_uri) as client:
        client.insdb.dups.insert_many([{"_id": 1}, {"_id": 3, "big": "old"}])
    docs = [_raw({"_id": i, "big": big if i % 2 else "small"}) for i in range(5)]
    listener = _Inserts()
    async with AsyncMongoClient(target_uri, event_listeners=[listener]) as client:
        with pytest.raises(BulkWriteError) as raised:
            await insert_unordered(client.insdb.dups, docs)
    errors = raised.value.details["writeErrors"]
    assert [(error["index"], error["code"]) for error in errors] == [(1, 11000), (3, 11000)]
    assert raised.value.details["nInserted"] == 3
    assert len(listener.commands) >= 2  # documents 1 and 3 never share a command
    with pymongo.MongoClient(target_uri) as client:
        got = {doc["_id"]: len(doc.get("big", "")) for doc in client.insdb.dups.find()}
    assert got == {0: 5, 1: 0, 2: 5, 3: 3, 4: 5}  # the old 1 and 3 kept, the others inserted


def _event(op: Op, doc: dict[str, Any]) -> ChangeEvent:
    key = _raw({"_id": doc["_id"]})
    return ChangeEvent(op, NS, key=key, document=None if op is Op.DELETE else _raw(doc))


@pytest.mark.integration
async def test_replacements_upsert_and_deletes_delete_by_key_as_bulk_write_does(target_uri: str) -> None:
    """The statements bulk_write sends for ReplaceOne(key, doc, upsert=True) and DeleteOne(key): a
    replacement lands byte for byte whether its document was there or not, a delete of a missing document
    is no error, and a write error comes with its index (a unique key another document holds)."""
    with pymongo.MongoClient(target_uri) as client:
        client.insdb.rep.create_index("email", unique=True, sparse=True)
        client.insdb.rep.insert_many([{"_id": 1, "old": True}, {"_id": 2}, {"_id": 9, "email": "taken"}])
    replaced = [{"_id": 1, "z": {"b": 1, "a": 2}, "n": None}, {"_id": 3, "new": [1.5, "x"]}]
    listener = _Inserts()
    async with AsyncMongoClient(target_uri, event_listeners=[listener]) as client:
        coll = client.insdb.get_collection("rep", write_concern=WriteConcern(w=1))
        await delete_unordered(coll, [_event(Op.DELETE, {"_id": 2}), _event(Op.DELETE, {"_id": 7})])
        await replace_unordered(coll, [_event(Op.UPDATE, doc) for doc in replaced])
        with pytest.raises(BulkWriteError) as raised:
            await replace_unordered(
                coll, [_event(Op.INSERT, {"_id": 4}), _event(Op.INSERT, {"_id": 5, "email": "taken"})]
            )
    assert [(error["index"], error["code"]) for error in raised.value.details["writeErrors"]] == [(1, 11000)]
    assert raised.value.details["nUpserted"] == 1
    with pymongo.MongoClient(target_uri, document_class=RawBSONDocument) as client:
        got = {doc["_id"]: doc.raw for doc in client.insdb.rep.find()}
    assert got == {1: bson.encode(replaced[0]), 3: bson.encode(replaced[1]), 4: bson.encode({"_id": 4}),
                   9: bson.encode({"_id": 9, "email": "taken"})}  # fmt: skip
    updates = [command for command in listener.commands if command.get("update") == "rep"]
    assert updates and all(command["writeConcern"] == {"w": 1} for command in updates)
    assert updates[0]["updates"][0].keys() == {"q", "u", "upsert"}
