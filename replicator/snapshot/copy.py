"""Copying snapshot partitions into a sink, as both engines do (the Spark engine runs it for one partition
in each task): ``workers`` concurrent workers, each reading one partition ahead into a queue of
``queue_batches`` batches, so memory is bounded by workers x queue_batches x batch_bytes whatever the
collection size. A partition is marked done only after the sink acknowledged its last batch. One whose
documents cannot be written twice over themselves (a time-series collection's) is recorded as begun before
its first write, and copied again only after its range is deleted from the target.

The snapshot's last record: a sink that ``marks_snapshot_end`` (Debezium records: ``source.snapshot`` is
``last`` on the snapshot's final read, ``true`` on the others) gets its final batch with ``last=True``. Which
batch that is is known only once every partition was read, and an empty partition may end last: so the final
batch of each partition waits in one slot (:class:`_Tail`) until the next partition ends, which writes it
(as any other) and puts its own there; when the copy ends, the batch in the slot is written after every other
as the last. A partition is done only once its held batch is acknowledged: a kill before re-copies it, and a
resumed snapshot marks the last record of what it copies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replicator.events import Namespace, Position
from replicator.observe.progress import Reporter
from replicator.settings.fields import FieldEditor, FieldRules
from replicator.sinks.base import Sink
from replicator.snapshot.watermark import Watermark
from replicator.source.connection import Client
from replicator.source.partitions import Partition, Resume
from replicator.source.pump import read_ahead
from replicator.source.reads import ReadPolicy, SourceReads
from replicator.source.snapshot import read_partition


@dataclass(frozen=True)
class CopyLimits:
    workers: int
    batch_docs: int
    batch_bytes: int
    queue_batches: int
    #: where the source is read and how fast (a Spark task's: its share of the rate)
    reading: ReadPolicy = ReadPolicy()  # noqa: RUF009 - frozen: one shared default is safe


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
    mark_last: bool = False,
) -> int:
    """Copy partitions with ``workers`` concurrent readers sharing ``workers`` write slots, so a last big
    partition still writes with all of them. Returns the number of documents written (also added to
    ``result`` as they are). Once ``stop`` is set, no new partition starts (those running finish, so they
    can be marked done).

    A partition with an entry in ``resume`` (by id) goes on after it. ``on_progress(partition, resume
    point)`` runs each time a resumable partition's acknowledged prefix of batches grows. ``fields``: the
    field rules documents go through (the stream's events go through the same, in the transform stage).
    ``on_start(partition)``: see :func:`begin`. ``at``: the position of the documents read
    (:func:`replicator.events.positions.snapshot_position` of the source's time before the copy began).
    ``mark_last``: these partitions are the snapshot's (not a copy made again by the stream's replay), so the
    final batch is written with ``last=True`` to a sink that ``marks_snapshot_end``."""
    todo: asyncio.Queue[Partition] = asyncio.Queue()
    for part in sorted(partitions, key=lambda p: -p.estimated_docs):  # biggest first: shorter tail
        todo.put_nowait(part)
    slots = asyncio.Semaphore(limits.workers)
    result = result if result is not None else CopyResult()
    before = result.documents
    # one bucket for every worker; no read older than the snapshot's time, where it may reach a secondary
    reads = SourceReads.start(limits.reading, at.cluster_time if at is not None else None)
    tail = _Tail(on_done) if mark_last and sink.marks_snapshot_end else None

    async def worker() -> None:
        while stop is None or not stop.is_set():
            try:
                part = todo.get_nowait()
            except asyncio.QueueEmpty:
                return
            after = await begin(part, resume, on_start)
            editor = fields.for_namespace(part.ns) if fields else None
            docs, held = await _copy_one(
                client, sink, part, limits, rename(part.ns), reporter, slots, result, after, on_progress, editor, at,
                reads, hold=tail is not None,
            )  # fmt: skip
            if tail is not None and held is not None:
                await tail.hold(part, docs, held)
            else:
                await on_done(part, docs)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(limits.workers, len(partitions)) or 1):
                group.create_task(worker())
    except ExceptionGroup as failed:  # the first failure stopped the others: report it, not the group
        raise failed.exceptions[0] from None
    if tail is not None:
        await tail.release(last=todo.empty())  # every partition copied: the snapshot's last batch
    return result.documents - before


#: Writes a partition's held final batch (``last``: as the snapshot's last) and returns its size.
_Held = Callable[[bool], Awaitable[int]]


class _Tail:
    """The one slot where the final batch of the partition that ended last waits (see the module's doc)."""

    def __init__(self, on_done: Callable[[Partition, int], Awaitable[None]]) -> None:
        self._on_done = on_done
        self._slot: tuple[Partition, int, _Held] | None = None

    async def hold(self, part: Partition, docs: int, held: _Held) -> None:
        """Put ``part``'s final batch in the slot; the one there before is written, as any batch."""
        previous, self._slot = self._slot, (part, docs, held)
        if previous is not None:
            await self._write(previous, last=False)

    async def release(self, *, last: bool) -> None:
        """The copy ended: write the batch in the slot (``last``: every partition was copied)."""
        previous, self._slot = self._slot, None
        if previous is not None:
            await self._write(previous, last=last)

    async def _write(self, entry: tuple[Partition, int, _Held], *, last: bool) -> None:
        part, docs, held = entry
        await self._on_done(part, docs + await held(last))


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
    reads: SourceReads | None = None,
    *,
    hold: bool = False,
) -> tuple[int, _Held | None]:
    """Read one partition ahead and write its batches, several at once unless its order matters. Returns the
    documents written, and with ``hold`` the partition's final batch unwritten, as a function that writes it
    (None when the partition is empty).

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

    async def write(docs: list[Any], number: int, last: bool = False) -> None:
        nonlocal written
        try:
            edited = docs if editor is None else [editor.document(doc) for doc in docs]
            if last:
                await sink.write_copy(ns, edited, at, last=True)
            else:
                await sink.write_copy(ns, edited, at)
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
            for task in done:  # every failure retrieved, not only the one raised
                if not task.cancelled():
                    task.exception()
            for task in done:
                task.result()  # a failed write fails the partition

    batches = read_partition(
        client, part, batch_docs=limits.batch_docs, batch_bytes=limits.batch_bytes, after=after, reads=reads
    )
    final: list[Any] | None = None  # with hold: the batch read last, written once the next one comes
    try:
        # closed as the copy ends, failed or not: a read-ahead left to the garbage collector keeps its reading
        # task (and what it holds) alive until then
        async with contextlib.aclosing(read_ahead(batches, limits.queue_batches)) as ahead:
            async for batch in ahead:
                docs: list[Any] | None = batch
                if hold:
                    docs, final = final, batch
                if docs is None:
                    continue
                await settle(most)
                await slots.acquire()
                number = acked.sent(docs[-1]["_id"]) if acked is not None else 0
                in_flight.add(asyncio.create_task(write(docs, number)))
        await settle(1)
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
    if final is None:
        return written, None
    held_docs = final

    async def write_final(last: bool) -> int:
        await slots.acquire()
        await write(held_docs, acked.sent(held_docs[-1]["_id"]) if acked is not None else 0, last)
        return len(held_docs)

    return written, write_final
