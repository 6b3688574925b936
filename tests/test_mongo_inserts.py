"""Snapshot inserts as insert commands of raw documents (sinks/mongo/inserts): how a batch is cut into
commands, and, against the server, that it lands byte for byte, reports its write errors as insert_many
does, and keeps the write concern."""

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
from replicator.sinks.mongo.inserts import chunks, insert_unordered


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
        if event.command_name == "insert":
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
