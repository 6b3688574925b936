"""The loop: bounded queues between readers and the sink, workers, and checkpointing after acks.

Two flows, both ``source -> normalize -> transform -> sink -> checkpoint``:

* :func:`copy_partitions` copies snapshot partitions with ``workers`` concurrent workers. Each worker
  reads one partition ahead into a queue of ``queue_batches`` batches, so memory is bounded by
  workers x queue_batches x batch_bytes whatever the collection size. A partition is marked done only
  after the sink acknowledged its last batch. One whose documents cannot be written twice over themselves
  (a time-series collection's) is recorded as begun before its first write, and copied again only after
  its range is deleted from the target.
* :func:`replay` reads the change stream ahead into a bounded queue (a slow sink slows the reader) and
  applies batches in order, moving the checkpoint to a batch's position only after the sink acked it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, cast

from bson.timestamp import Timestamp

from replicator.checkpoint.store import advance
from replicator.events import ChangeEvent, Namespace, Position
from replicator.observe.progress import Reporter, lag_seconds
from replicator.replay.stage import ReplayStage
from replicator.replay.stage import Transform as Transform  # re-exported: the engines' stage type
from replicator.settings.fields import FieldEditor, FieldRules
from replicator.sinks.base import Sink
from replicator.snapshot.watermark import Watermark
from replicator.source.batching import joined
from replicator.source.changestream import Batch
from replicator.source.connection import Client
from replicator.source.partitions import Partition, Resume
from replicator.source.pump import DONE, get_or_raise, pump, stop_pumps
from replicator.source.snapshot import read_partition

T = TypeVar("T")


class BatchSource(Protocol):
    """Anything that yields change batches up to a cluster time (a change stream reader, a test fake)."""

    def batches(self, *, until: Timestamp | None = None) -> AsyncIterator[Batch]: ...


@dataclass(frozen=True)
class CopyLimits:
    workers: int
    batch_docs: int
    batch_bytes: int
    queue_batches: int


@dataclass
class CopyResult:
    """Documents a copy wrote, counted as their batches are acknowledged: a caller that retries after an
    error keeps the count of the failed attempt."""

    documents: int = 0


async def copy_partitions(
    client: Client,
    sink: Sink,
    partitions: Sequence[Partition],
    *,
    limits: CopyLimits,
    rename: Callable[[Namespace], Namespace],
    on_done: Callable[[Partition, int], Awaitable[None]],
    reporter: Reporter,
    stop: asyncio.Event | None = None,
    resume: Mapping[str, Resume] | None = None,
    on_progress: Callable[[Partition, Resume], Awaitable[None]] | None = None,
    result: CopyResult | None = None,
    fields: FieldRules | None = None,
    on_start: Callable[[Partition], Awaitable[None]] | None = None,
    at: Position | None = None,
) -> int:
    """Copy partitions with ``workers`` concurrent readers sharing ``workers`` write slots, so a last big
    partition still writes with all of them. Returns the number of documents written (also added to
    ``result`` as they are). Once ``stop`` is set, no new partition starts (those running finish, so they
    can be marked done).

    A partition with an entry in ``resume`` (by id) goes on after it. ``on_progress(partition, resume
    point)`` runs each time a resumable partition's acknowledged prefix of batches grows. ``fields``: the
    field rules documents go through (the stream's events go through the same, in the transform stage).
    ``on_start(partition)``: see :func:`begin`. ``at``: the position of the documents read
    (:func:`replicator.events.positions.snapshot_position` of the source's time before the copy began)."""
    todo: asyncio.Queue[Partition] = asyncio.Queue()
    for part in sorted(partitions, key=lambda p: -p.estimated_docs):  # biggest first: shorter tail
        todo.put_nowait(part)
    slots = asyncio.Semaphore(limits.workers)
    result = result if result is not None else CopyResult()
    before = result.documents

    async def worker() -> None:
        while stop is None or not stop.is_set():
            try:
                part = todo.get_nowait()
            except asyncio.QueueEmpty:
                return
            after = await begin(part, resume, on_start)
            editor = fields.for_namespace(part.ns) if fields else None
            docs = await _copy_one(
                client, sink, part, limits, rename(part.ns), reporter, slots, result, after, on_progress, editor, at
            )
            await on_done(part, docs)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(limits.workers, len(partitions)) or 1):
                group.create_task(worker())
    except ExceptionGroup as failed:  # the first failure stopped the others: report it, not the group
        raise failed.exceptions[0] from None
    return result.documents - before


#: copy_partitions' signature: how a job copies its snapshot partitions (--engine spark: as Spark tasks).
Copier = Callable[..., Awaitable[int]]


async def begin(
    part: Partition, resume: Mapping[str, Resume] | None, on_start: Callable[[Partition], Awaitable[None]] | None
) -> Resume | None:
    """Where a partition's copy starts, decided before it writes anything (by either engine's driver).

    A resumable partition goes on after its entry in ``resume``. One that clears on retry (a time-series
    collection's) and has an entry there was begun before: its copy starts over once its range is deleted
    from the target (see :func:`_copy_one`). One begun now is told to ``on_start``, which records it where
    a retry will find it (the checkpoint), durably, before the copy writes anything."""
    if part.resumable or part.clears_on_retry:
        after = (resume or {}).get(part.id)
        if after is None and part.clears_on_retry and on_start is not None:
            await on_start(part)
        return after
    return None


async def _copy_one(
    client: Client,
    sink: Sink,
    part: Partition,
    limits: CopyLimits,
    ns: Namespace,
    reporter: Reporter,
    slots: asyncio.Semaphore,
    result: CopyResult,
    after: Resume | None = None,
    on_progress: Callable[[Partition, Resume], Awaitable[None]] | None = None,
    editor: FieldEditor | None = None,
    at: Position | None = None,
) -> int:
    """Read one partition ahead and write its batches, several at once unless its order matters.

    A resumable partition keeps at most ``workers`` batches past its acknowledged prefix (in flight, or
    acknowledged after one still in flight), so a failure or a kill costs at most that many batches. One
    that clears on retry and was begun before (``after`` set) is first deleted from the target ``ns``:
    its own range only (its query, whose time field the target's documents keep: a time-series target
    refuses measurements without it)."""
    if part.clears_on_retry and after is not None:
        await sink.discard(ns, part.query())
        after = None
    written = 0
    in_flight: set[asyncio.Task[None]] = set()
    most = 1 if part.ordered else limits.workers
    acked = Watermark() if part.resumable and on_progress is not None else None

    async def write(docs: list[Any], number: int) -> None:
        nonlocal written
        try:
            await sink.write_copy(ns, docs if editor is None else [editor.document(doc) for doc in docs], at)
        finally:
            slots.release()
        written += len(docs)
        result.documents += len(docs)
        reporter.snapshot_advance(str(part.ns), len(docs))
        moved = acked.acked(number) if acked is not None else None
        if moved is not None and on_progress is not None:
            await on_progress(part, moved)

    async def settle(until_below: int) -> None:
        """Wait for writes until fewer than ``until_below`` are in flight or past the acknowledged prefix."""
        while in_flight and max(len(in_flight), acked.pending if acked is not None else 0) >= until_below:
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            in_flight.difference_update(done)
            for task in done:
                task.result()  # a failed write fails the partition

    batches = read_partition(client, part, batch_docs=limits.batch_docs, batch_bytes=limits.batch_bytes, after=after)
    try:
        async for docs in read_ahead(batches, limits.queue_batches):
            await settle(most)
            await slots.acquire()
            number = acked.sent(docs[-1]["_id"]) if acked is not None else 0
            in_flight.add(asyncio.create_task(write(docs, number)))
        await settle(1)
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
    return written


async def read_ahead(
    source: AsyncIterator[T], maxsize: int, join: Callable[[T, T], T | None] | None = None
) -> AsyncIterator[T]:
    """Iterate ``source`` from a separate task through a queue of ``maxsize`` items: reading overlaps the
    consumer's writes, and runs ahead of them by at most ``maxsize`` items (backpressure). The source's
    error is raised here; leaving the loop early cancels the reading task. ``join(a, b)``: items already
    waiting in the queue are joined to the one taken while it returns them as one (None: not these)."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=max(maxsize, 1))
    producer = asyncio.create_task(pump(source, queue))
    held: object | None = None  # taken from the queue, not joinable to the item before it
    try:
        while True:
            item = held if held is not None else await get_or_raise(queue, producer)
            held = None
            if item is DONE:
                break
            while join is not None and not queue.empty():
                after = queue.get_nowait()
                both = join(cast(T, item), cast(T, after)) if after is not DONE else None
                if both is None:
                    held = after
                    break
                item = both
            yield cast(T, item)
        await producer
    finally:
        if not producer.done():
            await stop_pumps([producer], [queue])


@dataclass
class ReplayResult:
    events: int = 0
    batches: int = 0
    last_time: Timestamp | None = None


async def replay(
    reader: BatchSource,
    stage: ReplayStage,
    *,
    until: Timestamp | None,
    on_ack: Callable[[Batch, Sequence[ChangeEvent]], Awaitable[None]],
    reporter: Reporter,
    queue_batches: int,
    stop: asyncio.Event | None = None,
    result: ReplayResult | None = None,
    join_up_to: int = 0,
) -> ReplayResult:
    """Apply change batches in order until the stream passed ``until``, or ``stop`` is set (None and
    None: until cancelled). Counts go into ``result`` as batches are acknowledged, so a caller that
    retries after an error keeps them.

    Each batch goes through ``stage`` (checks, DDL window, transform, sink); ``on_ack(batch, applied
    events)`` runs once the batch may be acknowledged. While namespaces wait to be copied again (the
    stage's DDL window), batches are applied but not acknowledged; the copy runs once the stream is
    caught up (or passed the window, or ends), and the last batch is acknowledged then. Batches that wait
    in the read-ahead queue are written as one, up to ``join_up_to`` events (0: never)."""
    result = result if result is not None else ReplayResult()
    owed: tuple[Batch, list[ChangeEvent]] | None = None  # applied, not acknowledged yet

    def join(first: Batch, then: Batch) -> Batch | None:
        return joined(first, then, join_up_to)

    async for batch in read_ahead(reader.batches(until=until), queue_batches, join if join_up_to else None):
        written = await stage.write(batch.events)
        events = written.events
        if owed is not None:  # acknowledged with the batches applied before it: their position carries on
            batch = carried(owed[0], batch)
        ackable = written.ackable or (batch.caught_up and await stage.settle())
        result.events += len(events)
        result.batches += 1
        if batch.events and batch.events[-1].position is not None:
            result.last_time = batch.events[-1].position.cluster_time or result.last_time
        # a batch without events is the server saying "nothing more": caught up, no lag
        reporter.replay_advance(len(events), lag_seconds(result.last_time) if batch.events else 0.0)
        if batch.position or batch.shard_positions:
            applied = events if owed is None else [*owed[1], *events]
            if ackable:
                await on_ack(batch, applied)
                owed = None
            else:
                owed = (batch, applied)
        if stop is not None and stop.is_set():
            break
    if owed is not None and not (stop is not None and stop.is_set()) and await stage.settle():
        await on_ack(*owed)
    return result


def carried(first: Batch, then: Batch) -> Batch:
    """``then`` as acknowledged together with ``first`` before it: where ``then`` brings no cluster time (an
    idle poll's post-batch token), the position keeps ``first``'s (its last event's), as each shard's does."""
    shards = dict(first.shard_positions or {})
    for name, position in (then.shard_positions or {}).items():
        shards[name] = advance(shards.get(name), position)
    return replace(then, position=advance(first.position, then.position), shard_positions=shards if shards else None)


class Throttle:
    """True at most once per ``every_s`` seconds (checkpoint saves during a fast replay)."""

    def __init__(self, every_s: float) -> None:
        self._every = every_s
        self._last = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            return True
        return False
