"""Reading a change stream a server reply at a time (source/changestream._replies), against the real server:
the events taken from the driver's buffer in one go leave the stream as try_next leaves it event by event."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest

from replicator.source.changestream import _replies, _take_buffered
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
