"""Reading a change stream a server reply at a time (source/changestream._replies), against the real server:
the events taken from the driver's buffer in one go leave the stream as try_next leaves it event by event."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest

from replicator.events import ChangeEvent, Op, Position
from replicator.source.changestream import ChangeStreamReader, _replies, _take_buffered
from replicator.source.connection import make_client

pytestmark = pytest.mark.integration


async def test_events_taken_a_reply_at_a_time_leave_the_resume_token_try_next_leaves(source_uri: str) -> None:
    source = make_client(source_uri)
    try:
        start = (await source.admin.command("ping"))["operationTime"]
        with pymongo.MongoClient(source_uri) as client:
            for n in range(7):
                client.readdb.c.insert_one({"_id": n})
        options: dict[str, Any] = {"start_at_operation_time": start, "batch_size": 3}
        bulk, one_by_one = await source.watch(**options), await source.watch(**options)
        taken: list[Any] = []
        async for reply in _replies(bulk, most=3):
            assert 0 < len(reply.docs) <= 3 or not reply.docs
            for doc in reply.docs:  # the reference: try_next per event, as the driver documents it
                same = await one_by_one.try_next()
                assert same is not None and same.raw == doc.raw
            assert bulk.resume_token == one_by_one.resume_token  # after the same events, the same token
            taken.extend(reply.docs)
            if len(taken) >= 7:
                break
        assert [doc["documentKey"]["_id"] for doc in taken] == list(range(7))
        assert _take_buffered(bulk, 5) == []  # the buffer is empty now: nothing taken, nothing changed
        await bulk.close()
        await one_by_one.close()
    finally:
        await source.close()


async def _read_all(source: Any, database: str, start: Position, until: Any) -> list[ChangeEvent]:
    reader = ChangeStreamReader(source, full_document="updateLookup", batch_size=2, max_await_ms=100, database=database)
    try:
        await reader.open(start)
        return [event async for batch in reader.batches(until=until) for event in batch.events]
    finally:
        await reader.close()


async def test_a_database_stream_reads_on_through_a_drop_and_resumes_from_every_event_alike(source_uri: str) -> None:
    """A database's own stream (db.watch) ends with an invalidate when the database is dropped: the reader
    opens it again after it and hands out the events before and after, never the invalidate. Opened at any
    event's position (a checkpoint's: the dropDatabase's included), it reads the same events after it, at
    the same positions."""
    source = make_client(source_uri)
    try:
        with pymongo.MongoClient(source_uri) as client:
            client.drop_database("scoped")
        start = Position(cluster_time=(await source.admin.command("ping"))["operationTime"])
        with pymongo.MongoClient(source_uri) as client:
            client.scoped.create_collection("c")
            client.scoped.c.insert_many([{"_id": n} for n in range(3)])
            client.elsewhere.c.insert_one({"_id": 1})  # another database: not in this stream
            client.drop_database("scoped")
            client.scoped.create_collection("c")
            client.scoped.c.insert_many([{"_id": n} for n in range(10, 13)])
            client.scoped.c.delete_one({"_id": 10})
        until = (await source.admin.command("ping"))["operationTime"]
        events = await _read_all(source, "scoped", start, until)
        ops = [e.op for e in events]
        assert Op.INVALIDATE not in ops
        assert ops.count(Op.DROP_DATABASE) == 1 and ops.count(Op.INSERT) == 6 and ops[-1] == Op.DELETE, ops
        assert {e.ns.db for e in events} == {"scoped"}
        after_drop = ops.index(Op.DROP_DATABASE) + 1
        assert [e.op for e in events[after_drop:] if e.op is Op.INSERT] == [Op.INSERT] * 3
        for i, event in enumerate(events):
            assert event.position is not None and event.position.resume_token is not None
            again = await _read_all(source, "scoped", event.position, until)
            assert [(e.op, e.ns, e.position) for e in again] == [(e.op, e.ns, e.position) for e in events[i + 1 :]]
    finally:
        await source.close()
