"""Delta updates with truncated arrays against a real server: what the MongoDB sink and the Debezium
legacy patch make of them lands as on the source."""

from __future__ import annotations

import json
from typing import Any

import bson
import pymongo
import pytest
from bson import json_util
from bson.raw_bson import RawBSONDocument
from pymongo import monitoring

from replicator.bsonkit.extjson import CANONICAL
from replicator.events import ChangeEvent, Namespace, Op, UpdateDescription
from replicator.sinks.mongo.sink import MongoSink
from replicator.sinks.records.envelope import Encoder, EnvelopeOptions
from replicator.sinks.records.topics import TopicNamer

pytestmark = pytest.mark.integration
NS = Namespace("plandb", "c")

#: (document before, the delta MongoDB reports for the update, document after)
CASES: list[tuple[dict[str, Any], UpdateDescription, dict[str, Any]]] = [
    # $push: {arr: {$each: [4], $slice: -2}}
    ({"_id": 1, "arr": [1, 2, 3]}, UpdateDescription({"arr.0": 3, "arr.1": 4}, (), (("arr", 2),)),
     {"_id": 1, "arr": [3, 4]}),
    # $pull: {arr: 2} (arr.2 was 3 and stays 3: not reported)
    ({"_id": 2, "arr": [1, 2, 3, 3]}, UpdateDescription({"arr.1": 3}, (), (("arr", 3),)), {"_id": 2, "arr": [1, 3, 3]}),
    # an update pipeline [{$set: {a: [[1]]}}]: an array cut inside an array cut
    ({"_id": 3, "a": [[1, 2], [3]]}, UpdateDescription({}, (), (("a.0", 1), ("a", 1))), {"_id": 3, "a": [[1]]}),
    # an array of documents: the first lost "x", the second went
    ({"_id": 4, "arr": [{"x": 1, "y": 1}, {"x": 2}]}, UpdateDescription({}, ("arr.0.x",), (("arr", 1),)),
     {"_id": 4, "arr": [{"y": 1}]}),
]  # fmt: skip


def raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


def update(before: dict[str, Any], delta: UpdateDescription) -> ChangeEvent:
    return ChangeEvent(Op.UPDATE, NS, key=raw({"_id": before["_id"]}), update=delta)


async def test_the_mongodb_sink_replays_deltas_with_truncated_arrays(target_uri: str) -> None:
    with pymongo.MongoClient(target_uri) as client:
        client.plandb.c.insert_many([before for before, _, _ in CASES])
    async with MongoSink(target_uri) as sink:
        await sink.write([update(before, delta) for before, delta, _ in CASES])
    with pymongo.MongoClient(target_uri) as client:
        assert list(client.plandb.c.find().sort("_id", 1)) == [after for _, _, after in CASES]


def test_the_legacy_patch_replays_deltas_with_truncated_arrays(target_uri: str) -> None:
    encoder = Encoder(EnvelopeOptions(style="debezium-legacy"), TopicNamer("p"))
    with pymongo.MongoClient(target_uri) as client:
        coll = client.plandb.c
        coll.insert_many([before for before, _, _ in CASES])
        for before, delta, after in CASES:
            [message] = encoder.encode([update(before, delta)])
            assert message.value is not None
            payload = json.loads(message.value)
            patch = json_util.loads(payload["patch"], json_options=CANONICAL)
            filt = json_util.loads(payload["filter"], json_options=CANONICAL)
            for step in patch if isinstance(patch, list) else [patch]:  # a list: updates to apply in order
                coll.update_one(filt, step)
            assert coll.find_one({"_id": before["_id"]}) == after


class _Writes(monitoring.CommandListener):
    """The write commands sent to the plandb database: (command name, ordered, the number of statements)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, int]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.database_name == "plandb" and event.command_name in ("update", "delete"):
            statements = event.command.get("updates") or event.command.get("deletes") or []
            self.seen.append((event.command_name, bool(event.command.get("ordered", True)), len(statements)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_a_document_deleted_later_in_the_batch_frees_its_unique_key_before_anything_is_written(
    target_uri: str,
) -> None:
    """Its delta update is not replayed: its delete goes first, with the other deletes, and the document that
    takes its unique key is written in the same unordered command as the other replacements."""
    with pymongo.MongoClient(target_uri) as client:
        client.plandb.c.create_index("email", unique=True)
        client.plandb.c.insert_many([{"_id": 1, "email": "a"}, {"_id": 3, "v": 0}])
    listener = _Writes()
    monitoring.register(listener)
    try:
        async with MongoSink(target_uri) as sink:
            await sink.write([
                ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 1}), update=UpdateDescription({"email": "tmp"})),
                ChangeEvent(Op.DELETE, NS, key=raw({"_id": 1})),
                ChangeEvent(Op.INSERT, NS, key=raw({"_id": 2}), document=raw({"_id": 2, "email": "a"})),
                ChangeEvent(Op.UPDATE, NS, key=raw({"_id": 3}), update=UpdateDescription({"v": 1})),
            ])  # fmt: skip
    finally:
        monitoring._LISTENERS.command_listeners.remove(listener)
    with pymongo.MongoClient(target_uri) as client:
        assert list(client.plandb.c.find().sort("_id", 1)) == [{"_id": 2, "email": "a"}, {"_id": 3, "v": 1}]
    writes = listener.seen
    assert ("delete", False, 1) in writes and ("update", False, 1) in writes  # document 1's delete, document 2
    assert ("update", True, 1) in writes  # document 3's delta, alone in the ordered sequence
    assert not [seen for seen in writes if seen[0] == "delete" and seen[1]], writes  # no delete kept in order
