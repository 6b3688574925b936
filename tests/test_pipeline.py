"""The pipeline with in-memory parts: ordering, bounded read-ahead, and acks only after the sink."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, Namespace, Op, Position
from replicator.observe.progress import LogReporter
from replicator.replay.loop import replay
from replicator.replay.stage import ReplayStage
from replicator.settings.selection import Renamer, Selection, make_transform
from replicator.sinks.memory import MemorySink
from replicator.source.changestream import Batch

NS = Namespace("db", "c")


def _event(i: int) -> ChangeEvent:
    pos = Position(resume_token={"_data": f"{i:04d}"}, cluster_time=Timestamp(1000, i))
    return ChangeEvent(Op.INSERT, NS, key={"_id": i}, document={"_id": i}, position=pos)


class FakeStream:
    def __init__(self, batches: list[list[int]]) -> None:
        self._batches = batches
        self.read = 0

    async def batches(self, *, until: Timestamp | None = None) -> AsyncIterator[Batch]:
        for ids in self._batches:
            self.read += 1
            events = [_event(i) for i in ids]
            yield Batch(events=events, position=events[-1].position or Position(), caught_up=False)


def _stage(sink: MemorySink) -> ReplayStage:
    return ReplayStage(sink, make_transform(Selection(), Renamer()))


async def test_replay_acks_in_order_after_the_sink() -> None:
    sink = MemorySink()
    acked: list[Position] = []

    async def ack(batch: Batch, events: object) -> None:
        pos = batch.position
        assert len(sink.events) >= int(str(pos.resume_token["_data"] if pos.resume_token else 0)) + 1
        acked.append(pos)

    result = await replay(
        FakeStream([[0, 1], [2], [3, 4, 5]]), _stage(sink), until=None,
        on_ack=ack, reporter=LogReporter(), queue_events=1,
    )  # fmt: skip
    assert [e.document_key["_id"] for e in sink.events] == [0, 1, 2, 3, 4, 5]
    assert [p.cluster_time for p in acked] == [Timestamp(1000, 1), Timestamp(1000, 2), Timestamp(1000, 5)]
    assert result.events == 6 and result.last_time == Timestamp(1000, 5)


async def test_a_failed_write_is_never_acked() -> None:
    class FailSecond(MemorySink):
        async def write(self, batch: Sequence[ChangeEvent]) -> None:
            if self.batches == 1:
                raise ConnectionError("target went away")
            await super().write(batch)

    sink = FailSecond()
    acked: list[Position] = []

    async def ack(batch: Batch, events: object) -> None:
        acked.append(batch.position)

    with pytest.raises(ConnectionError):
        await replay(
            FakeStream([[0], [1], [2]]), _stage(sink), until=None,
            on_ack=ack, reporter=LogReporter(), queue_events=1,
        )  # fmt: skip
    assert [p.cluster_time for p in acked] == [Timestamp(1000, 0)]


async def test_slow_sink_bounds_read_ahead() -> None:
    gate = asyncio.Event()

    class Slow(MemorySink):
        async def write(self, batch: Sequence[ChangeEvent]) -> None:
            await gate.wait()
            await super().write(batch)

    stream = FakeStream([[i] for i in range(50)])

    async def ack(batch: Batch, events: object) -> None:
        pass

    task = asyncio.create_task(
        replay(stream, _stage(Slow()), until=None, on_ack=ack,
               reporter=LogReporter(), queue_events=2)
    )  # fmt: skip
    await asyncio.sleep(0.05)
    assert stream.read <= 4  # one being written, two queued, one waiting to be queued
    gate.set()
    result = await task
    assert result.events == 50


async def test_the_replays_read_ahead_is_bounded_in_events_not_batches() -> None:
    """--max-queue-size counts events: batches of 3 events with room for 7 queue two of them, and the reader
    holds a third waiting for room (one more is being written)."""
    gate = asyncio.Event()

    class Slow(MemorySink):
        async def write(self, batch: Sequence[ChangeEvent]) -> None:
            await gate.wait()
            await super().write(batch)

    stream = FakeStream([[3 * i, 3 * i + 1, 3 * i + 2] for i in range(20)])

    async def ack(batch: Batch, events: object) -> None:
        pass

    task = asyncio.create_task(
        replay(stream, _stage(Slow()), until=None, on_ack=ack, reporter=LogReporter(), queue_events=7)
    )
    for _ in range(100):  # the reader runs until the queue is full
        await asyncio.sleep(0)
    assert stream.read == 4  # one being written, two queued (6 events of 7), one waiting for room
    gate.set()
    result = await task
    assert result.events == 60


@pytest.mark.parametrize("seed", range(5))
async def test_a_weighed_read_ahead_keeps_order_and_never_holds_more_than_its_bound(seed: int) -> None:
    import random

    from replicator.source.pump import read_ahead

    rng = random.Random(seed)
    items = [[i] * rng.randint(1, 5) for i in range(100)]
    most = rng.randint(1, 12)
    read: list[int] = []

    async def source() -> AsyncIterator[list[int]]:
        for item in items:
            read.append(len(item))
            if rng.random() < 0.3:
                await asyncio.sleep(0)
            yield item

    got: list[list[int]] = []
    taken = 0
    async for item in read_ahead(source(), most, weigh=len):
        got.append(item)
        taken += len(item)
        # what the reader has read but not handed out: the queue (at most ``most``, or one item) and the
        # one item waiting for room
        waiting = sum(read) - taken
        assert waiting <= max(most, 5) + 5, (waiting, most)
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
    assert got == items


async def test_snapshot_failure_surfaces_as_the_error_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed write stops the copy with that error (not an ExceptionGroup the CLI cannot print)."""
    import replicator.snapshot.copy as pipeline
    from replicator.source.partitions import ALL, Partition

    async def fake_read(client: object, part: Partition, **_: int) -> AsyncIterator[list[dict[str, int]]]:
        for i in range(3):
            yield [{"_id": part.index * 10 + i}]

    monkeypatch.setattr(pipeline, "read_partition", fake_read)
    parts = [Partition(NS, i, ALL) for i in range(4)]
    done: list[str] = []

    async def on_done(part: Partition, docs: int) -> None:
        done.append(part.id)

    limits = pipeline.CopyLimits(workers=2, batch_docs=1, batch_bytes=1 << 20, queue_batches=1)
    ok = MemorySink()
    copied = await pipeline.copy_partitions(
        None, ok, parts, limits=limits, rename=lambda ns: ns, on_done=on_done, reporter=LogReporter()
    )  # type: ignore[arg-type]
    assert copied == 12 and sorted(done) == [p.id for p in parts]
    assert sorted(e.document_key["_id"] for e in ok.events) == sorted(p * 10 + i for p in range(4) for i in range(3))
    done.clear()
    with pytest.raises(ConnectionError, match="injected failure"):
        await pipeline.copy_partitions(
            None, MemorySink(fail_writes=1), parts, limits=limits, rename=lambda ns: ns, on_done=on_done,
            reporter=LogReporter(),
        )  # type: ignore[arg-type]  # fmt: skip
    assert len(done) < len(parts)  # the failed partition was never marked done


async def test_batches_waiting_behind_a_slow_sink_are_written_as_one_up_to_the_limit() -> None:
    class Slow(MemorySink):
        async def write(self, batch: Sequence[ChangeEvent]) -> None:
            await asyncio.sleep(0.05)  # the stream fills the read-ahead queue meanwhile
            sizes.append(len(batch))
            await super().write(batch)

    sink = Slow()
    sizes: list[int] = []
    acked: list[Position] = []

    async def ack(batch: Batch, events: object) -> None:
        acked.append(batch.position)

    result = await replay(
        FakeStream([[0], [1, 2], [3], [4, 5, 6], [7], [8]]), _stage(sink), until=None,
        on_ack=ack, reporter=LogReporter(), queue_events=8, join_up_to=4,
    )  # fmt: skip
    assert [e.document_key["_id"] for e in sink.events] == list(range(9))  # in order, each once
    assert len(sizes) < 6 and max(sizes) <= 4, sizes  # joined, never past the limit
    assert acked[-1].cluster_time == Timestamp(1000, 8) and result.events == 9


@pytest.mark.parametrize("seed", range(5))
async def test_read_ahead_with_joins_loses_nothing_and_keeps_the_order(seed: int) -> None:
    import random

    from replicator.source.pump import read_ahead

    rng = random.Random(seed)
    items = [[i] for i in range(200)]

    async def source() -> AsyncIterator[list[int]]:
        for item in items:
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() / 1000)
            yield item

    def join(a: list[int], b: list[int]) -> list[int] | None:
        return a + b if len(a) + len(b) <= 7 else None

    got: list[list[int]] = []
    async for item in read_ahead(source(), rng.randint(2, 10), join):  # a buffer of one has nothing to join
        got.append(item)
        if rng.random() < 0.5:
            await asyncio.sleep(rng.random() / 500)
    assert [i for item in got for i in item] == list(range(200))
    assert max(len(item) for item in got) <= 7 and len(got) < 200  # joined, within the limit


async def test_a_replay_that_fails_stops_its_read_ahead_at_once() -> None:
    """The read-ahead task ends with the replay that failed, not when its generator is garbage-collected
    (asyncio then reports "Task was destroyed but it is pending!")."""

    class Fail(MemorySink):
        async def write(self, batch: Sequence[ChangeEvent]) -> None:
            raise ConnectionError("target went away")

    async def ack(batch: Batch, events: object) -> None:
        pass

    with pytest.raises(ConnectionError):
        await replay(
            FakeStream([[i] for i in range(50)]), _stage(Fail()), until=None,
            on_ack=ack, reporter=LogReporter(), queue_events=4,
        )  # fmt: skip
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()] == []
