"""The change stream reader against an in-memory stream: split on demand after an event over 16 MB.

(The reader against a real server: tests/test_tail.py.)"""

from __future__ import annotations

from collections import deque
from typing import Any

import bson
import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument
from replicator.errors import OversizeEvent
from replicator.events import Position
from replicator.source.changestream import ChangeStreamReader

SPLIT = {"$changeStreamSplitLargeEvent": {}}


def token(n: int) -> dict[str, str]:
    return {"_data": f"82{100:08X}{n:08X}2B0229"}


def change(n: int, **extra: Any) -> RawDocument:
    doc = {"_id": token(n), "operationType": "insert", "clusterTime": Timestamp(100, n),
           "ns": {"db": "db", "coll": "c"}, "documentKey": {"_id": n}, "fullDocument": {"_id": n}, **extra}  # fmt: skip
    return RawDocument(bson.encode(doc), RAW_CODEC)


class FakeStream:
    """Hands out its events, then raises ``error`` (a server code) or, with none, has nothing more."""

    def __init__(self, events: list[RawDocument], error: int | None = None) -> None:
        self._events = deque(events)
        self._error = error
        self.resume_token: Any = None
        self.closed = False

    def take(self) -> RawDocument | None:
        if self._events:
            event = self._events.popleft()
            self.resume_token = dict(event["_id"])
            return event
        if self._error is not None:
            raise OperationFailure("failed", code=self._error)
        return None

    async def try_next(self) -> RawDocument | None:
        return self.take()

    async def close(self) -> None:
        self.closed = True


class FakeClient:
    """watch() answers with its scripted streams, or raises a scripted error code."""

    def __init__(self, *answers: FakeStream | int) -> None:
        self._answers = list(answers)
        self.calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    async def watch(self, pipeline: list[dict[str, Any]], **kwargs: Any) -> FakeStream:
        self.calls.append((pipeline, kwargs))
        answer = self._answers.pop(0)
        if isinstance(answer, int):
            raise OperationFailure("refused", code=answer)
        return answer


async def _read(reader: ChangeStreamReader, count: int) -> list[int]:
    got: list[int] = []
    async for batch in reader.batches():
        got.extend(e.key["_id"] for e in batch.events if e.key is not None)
        if len(got) >= count:
            break
    return got


async def test_opened_without_the_split_stage_and_split_only_once_an_event_is_too_large() -> None:
    first = FakeStream([change(1), change(2)], error=10334)  # BSONObjectTooLarge after event 2
    last_part = {"_id": token(4), "splitEvent": {"fragment": 2, "of": 2}}
    parts = [change(3, splitEvent={"fragment": 1, "of": 2}), RawDocument(bson.encode(last_part), RAW_CODEC)]
    second = FakeStream([*parts, change(5)])
    client = FakeClient(first, second)
    reader = ChangeStreamReader(client, full_document="updateLookup", batch_size=10)  # type: ignore[arg-type]
    try:
        await reader.open(Position(resume_token=token(0)))
        assert await _read(reader, 4) == [1, 2, 3, 5]  # the split event whole, nothing lost or twice
    finally:
        await reader.close()
    (plain, opened), (split, reopened) = client.calls
    assert plain == [] and opened["resume_after"] == token(0)
    assert split == [SPLIT] and reopened["resume_after"] == token(2)  # right after the last event handed out
    assert reopened["full_document"] == "updateLookup" and first.closed


@pytest.mark.parametrize("oversize", ["fail", "skip"])
async def test_a_server_that_cannot_split_fails_or_trims_as_oversize_says(oversize: str) -> None:
    trimmed = FakeStream([change(3)])
    client = FakeClient(FakeStream([change(1)], error=10334), 40324, trimmed)
    reader = ChangeStreamReader(client, full_document="default", batch_size=10, oversize=oversize)  # type: ignore[arg-type]
    try:
        await reader.open(Position(resume_token=token(0)))
        if oversize == "fail":
            with pytest.raises(OversizeEvent, match="upgrade, or pass --oversize skip"):
                await _read(reader, 2)
            return
        assert await _read(reader, 2) == [1, 3]
        pipeline, kwargs = client.calls[-1]
        assert pipeline and "$set" in pipeline[0] and kwargs["resume_after"] == token(1)
    finally:
        await reader.close()


class SyncStream(FakeStream):
    def try_next(self) -> RawDocument | None:  # type: ignore[override]
        return self.take()

    def close(self) -> None:  # type: ignore[override]
        self.closed = True


class SyncClient(FakeClient):
    def watch(self, pipeline: list[dict[str, Any]], **kwargs: Any) -> FakeStream:  # type: ignore[override]
        self.calls.append((pipeline, kwargs))
        answer = self._answers.pop(0)
        if isinstance(answer, int):
            raise OperationFailure("refused", code=answer)
        return answer


def test_the_spark_data_sources_reader_splits_on_demand_too() -> None:
    pytest.importorskip("pyspark")
    from replicator.settings.resolve import resolve
    from replicator.spark_datasource.changes import RawChangeStream

    last_part = {"_id": token(4), "splitEvent": {"fragment": 2, "of": 2}, "fullDocument": {"_id": 3, "big": 1}}
    first = SyncStream([change(1), change(2)], error=10334)
    second = SyncStream(
        [change(3, splitEvent={"fragment": 1, "of": 2}), RawDocument(bson.encode(last_part), RAW_CODEC)]
    )
    client = SyncClient(first, second)
    stream = RawChangeStream(client, resolve({"source": "mongodb://h", "target": "stdout"}, env={}))  # type: ignore[arg-type]
    stream.open(Position(resume_token=token(0)))
    got = []
    while (raw := stream.poll()) is not None:
        got.append(raw)
    assert [dict(r["documentKey"])["_id"] for r in got] == [1, 2, 3] and dict(got[2]["fullDocument"])["big"] == 1
    (plain, _), (split, reopened) = client.calls
    assert plain == [] and split == [SPLIT] and reopened["resume_after"] == token(2) and first.closed
