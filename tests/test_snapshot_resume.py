"""Snapshot resume points without a server: the low watermark over out-of-order batches, the pace of its
saves, the copy that reports it and goes on after it, and its place in the checkpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pymongo
import pytest

from replicator.bsonkit.extjson import from_jsonable, to_jsonable
from replicator.checkpoint.store import Checkpoint, SnapshotProgress
from replicator.events import ChangeEvent, Namespace
from replicator.observe.progress import LogReporter
from replicator.sinks.memory import MemorySink
from replicator.snapshot.copy import CopyLimits, CopyResult, copy_partitions
from replicator.snapshot.watermark import SavePace, Watermark
from replicator.source.partitions import ALL, Partition, Resume

NS = Namespace("db", "c")


def test_watermark_is_the_end_of_the_acknowledged_prefix() -> None:
    marks = Watermark()
    numbers = [marks.sent(last_id) for last_id in (9, 19, 29, 39, 49)]
    assert numbers == [0, 1, 2, 3, 4] and marks.pending == 5
    assert marks.acked(1) is None  # batch 0 still in flight: nothing after it is safe to skip
    assert marks.acked(0) == Resume(19)  # 0 and 1 are both acknowledged
    assert marks.acked(3) is None
    assert marks.acked(2) == Resume(39)
    assert marks.pending == 1
    assert marks.acked(4) == Resume(49) and marks.pending == 0


def test_watermark_keeps_a_none_id_apart_from_no_progress() -> None:
    marks = Watermark()
    marks.sent(None)  # a null _id is an _id
    assert marks.acked(0) == Resume(None)


def test_save_pace_bounds_the_time_spent_saving() -> None:
    now = [100.0]
    pace = SavePace(share=0.1, clock=lambda: now[0])
    assert pace.due() and not pace.owed
    pace.saved(0.5)  # a save of a big plan: the next one no sooner than 5 s later
    now[0] += 1
    assert not pace.due() and pace.owed
    now[0] += 4
    assert pace.due()
    pace.saved(0.001)  # a small plan: not dozens of saves a second, once a second at most
    assert not pace.owed
    now[0] += 0.5
    assert not pace.due()
    now[0] += 0.5
    assert pace.due()


class _Ids:
    """A fake read_partition over ``_id``s 0..n-1 that honours the resume point, as the server would."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads: list[Resume | None] = []

    async def __call__(
        self,
        client: object,
        part: Partition,
        *,
        batch_docs: int,
        batch_bytes: int,
        after: Resume | None = None,
        reads: object = None,
    ) -> AsyncIterator[list[dict[str, int]]]:
        self.reads.append(after)
        start = 0 if after is None else after.last_id + 1
        for first in range(start, self.n, batch_docs):
            yield [{"_id": i} for i in range(first, min(first + batch_docs, self.n))]


class _OutOfOrder(MemorySink):
    """Batch 0 is acknowledged last; the write of the batch starting at ``fail_at`` fails."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.first = asyncio.Event()

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        first = batch[0].document_key["_id"]
        if first == self.fail_at:
            raise ConnectionError("target went away")
        if first == 0:
            await self.first.wait()
        else:
            self.first.set()
        await super().write(batch)


async def _copy(
    monkeypatch: pytest.MonkeyPatch, sink: MemorySink, ids: _Ids, resume: dict[str, Resume], result: CopyResult
) -> list[Any]:
    import replicator.snapshot.copy as pipeline

    monkeypatch.setattr(pipeline, "read_partition", ids)
    points: list[Any] = []
    start = resume[f"{NS}#0"].last_id + 1 if resume else 0

    async def progress(part: Partition, after: Resume) -> None:
        acknowledged = {e.document_key["_id"] for e in sink.events}
        assert set(range(start, after.last_id + 1)) <= acknowledged  # never past an unacknowledged document
        points.append(after.last_id)
        resume[part.id] = after

    async def done(part: Partition, docs: int) -> None:
        resume.pop(part.id, None)

    limits = CopyLimits(workers=3, batch_docs=10, batch_bytes=1 << 20, queue_batches=2)
    await copy_partitions(
        None, sink, [Partition(NS, 0, ALL)], limits=limits, rename=lambda ns: ns, on_done=done,  # type: ignore[arg-type]
        reporter=LogReporter(), resume=resume, on_progress=progress, result=result,
    )  # fmt: skip
    return points


async def test_copy_reports_the_low_watermark_and_a_retry_goes_on_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    resume: dict[str, Resume] = {}
    result = CopyResult()
    failing = _OutOfOrder(fail_at=150)
    with pytest.raises(ConnectionError):
        await _copy(monkeypatch, failing, _Ids(300), resume, result)
    point = resume[f"{NS}#0"]
    assert point.last_id % 10 == 9 and point.last_id < 150  # the end of a batch before the failed one
    # at most `workers` batches were past the acknowledged prefix when the write failed
    assert max(e.document_key["_id"] for e in failing.events) - point.last_id <= 3 * 10
    assert result.documents == len(failing.events)  # the failed attempt's writes are counted

    ids = _Ids(300)
    again = _OutOfOrder()
    points = await _copy(monkeypatch, again, ids, resume, result)
    assert ids.reads == [point]
    written = [e.document_key["_id"] for e in again.events]
    assert sorted(written) == list(range(point.last_id + 1, 300))  # nothing skipped, nothing before
    assert points == sorted(points) and points[-1] == 299
    assert resume == {}  # done: no resume point left


async def test_a_partition_that_cannot_resume_reports_no_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    import replicator.snapshot.copy as pipeline

    ids = _Ids(50)
    monkeypatch.setattr(pipeline, "read_partition", ids)
    reported: list[Resume] = []

    async def progress(part: Partition, after: Resume) -> None:
        reported.append(after)

    async def done(part: Partition, docs: int) -> None:
        pass

    capped = Partition(NS, 0, ALL, ordered=True)  # insertion order: read again from its start
    limits = CopyLimits(workers=2, batch_docs=10, batch_bytes=1 << 20, queue_batches=2)
    copied = await copy_partitions(
        None, MemorySink(), [capped], limits=limits, rename=lambda ns: ns, on_done=done,  # type: ignore[arg-type]
        reporter=LogReporter(), resume={capped.id: Resume(20)}, on_progress=progress,
    )  # fmt: skip
    assert copied == 50 and reported == [] and ids.reads == [None]


def test_resume_points_and_drop_target_survive_the_checkpoint_file() -> None:
    import bson
    from bson import Decimal128, Int64, ObjectId
    from bson.raw_bson import RawBSONDocument

    values = [None, Int64(1 << 40), Decimal128("NaN"), ObjectId(), "x", RawBSONDocument(bson.encode({"b": 1, "a": 2}))]
    progress = SnapshotProgress(
        status="in_progress", drop_target=True, resume={f"db.c#{i}": to_jsonable(v) for i, v in enumerate(values)}
    )
    back = Checkpoint.from_json(Checkpoint("rs:x", snapshot=progress).to_json()).snapshot
    assert back.drop_target is True
    for i, value in enumerate(values):
        restored = from_jsonable(back.resume[f"db.c#{i}"])
        assert bson.encode({"_id": restored}) == bson.encode({"_id": value})
    assert Checkpoint.from_json(Checkpoint("rs:x").to_json()).snapshot.resume == {}


async def test_a_failed_progress_save_fails_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that cannot be written stops the copy, even when it is the last batch's."""
    import replicator.snapshot.copy as pipeline
    from replicator.errors import CheckpointError

    monkeypatch.setattr(pipeline, "read_partition", _Ids(30))

    async def progress(part: Partition, after: Resume) -> None:
        if after.last_id == 29:
            raise CheckpointError("disk full")

    async def done(part: Partition, docs: int) -> None:
        raise AssertionError("marked done")

    limits = CopyLimits(workers=2, batch_docs=10, batch_bytes=1 << 20, queue_batches=2)
    with pytest.raises(CheckpointError):
        await copy_partitions(
            None, MemorySink(), [Partition(NS, 0, ALL)], limits=limits, rename=lambda ns: ns,  # type: ignore[arg-type]
            on_done=done, reporter=LogReporter(), on_progress=progress,
        )  # fmt: skip


@pytest.mark.integration
async def test_a_partition_is_read_in_batches_bounded_by_documents_and_bytes(source_uri: str) -> None:
    """Replies are taken whole (to_list), then cut where a batch would pass --batch-docs or --batch-bytes (a
    document bigger than the bound is a batch of its own)."""
    from replicator.events import Namespace
    from replicator.source.connection import make_client
    from replicator.source.partitions import ALL, Partition
    from replicator.source.snapshot import read_partition

    with pymongo.MongoClient(source_uri) as plain:
        plain.p.c.insert_many([{"_id": i, "pad": "x" * (5000 if i == 30 else 200)} for i in range(75)])
    client = make_client(source_uri, timeout_s=10)
    try:
        part = Partition(Namespace("p", "c"), 0, ALL)
        for docs, size in ((20, 1 << 20), (20, 2000), (1000, 1 << 20)):
            batches = [b async for b in read_partition(client, part, batch_docs=docs, batch_bytes=size)]
            assert [d["_id"] for b in batches for d in b] == list(range(75))
            for batch in batches:
                assert len(batch) <= docs
                assert len(batch) == 1 or sum(len(d.raw) for d in batch) <= size
            if size == 2000:
                assert [d["_id"] for d in next(b for b in batches if any(d["_id"] == 30 for d in b))] == [30]
    finally:
        await client.close()


async def test_several_failed_writes_of_a_partition_are_all_retrieved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write in flight fails: the copy raises one of them, and none is left for asyncio to report
    as "Task exception was never retrieved"."""
    import gc

    import replicator.snapshot.copy as pipeline

    monkeypatch.setattr(pipeline, "read_partition", _Ids(100))
    reported: list[str] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context["message"]))
    started = asyncio.Event()
    writes = 0

    class Fails(MemorySink):
        async def write_copy(self, ns: Namespace, docs: Sequence[Any], at: Any = None) -> None:
            nonlocal writes
            writes += 1
            if writes == 3:
                started.set()
            await started.wait()  # three writes in flight, then they all fail at once
            raise ConnectionError("target went away")

    async def done(part: Partition, docs: int) -> None:
        pass

    async def copy() -> str:
        limits = CopyLimits(workers=3, batch_docs=10, batch_bytes=1 << 20, queue_batches=2)
        try:
            await copy_partitions(
                None, Fails(), [Partition(NS, 0, ALL)], limits=limits, rename=lambda ns: ns,  # type: ignore[arg-type]
                on_done=done, reporter=LogReporter(),
            )  # fmt: skip
        except ConnectionError as exc:
            return str(exc)  # not the exception: its frames would keep the failed writes alive
        return "copied"

    assert await copy() == "target went away"
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()] == []  # nor reads
    gc.collect()
    await asyncio.sleep(0)
    assert reported == []
