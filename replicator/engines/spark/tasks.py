"""What runs in a Spark task: one snapshot partition copied, one share of a replayed batch applied, or one
verify range hashed, each through the asyncio engine's own code for one unit (one event loop per task).
Tasks open their own connections: nothing but settings and their unit of work crosses from the driver."""

from __future__ import annotations

import asyncio
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp

from replicator.checking.verify import DocumentDiff, diff_partition
from replicator.errors import McdcError, ServerUnavailable, SinkUnavailable
from replicator.events import ChangeEvent, Namespace, Position
from replicator.observe.tally import CollectionProgress
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.uri import redact
from replicator.sinks.registry import open_sink
from replicator.snapshot.copy import CopyLimits, copy_partitions
from replicator.source.connection import make_client
from replicator.source.lookup import source_lookup
from replicator.source.partitions import Partition, Resume
from replicator.source.reads import ReadPolicy, SourceReads


class QuietReporter:
    """Progress inside a task goes nowhere: the driver reports each partition as its task returns."""

    def info(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    def snapshot_begin(self, collections: Iterable[CollectionProgress]) -> None:
        pass

    def snapshot_totals(self, totals: Mapping[str, int]) -> None:
        pass

    def snapshot_copied_before(self, ns: str, docs: int) -> None:
        pass

    def snapshot_advance(self, ns: str, docs: int) -> None:
        pass

    def snapshot_collection_done(self, ns: str) -> None:
        pass

    def snapshot_end(self, complete: bool) -> None:
        pass

    def replay_begin(self) -> None:
        pass

    def replay_advance(self, events: int, lag_s: float | None) -> None:
        pass

    def replay_end(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class CopyTask:
    """One partition to copy: everything a task needs (pickled to the executor)."""

    settings: Settings
    partition: Partition
    after: Resume | None  # go on after this _id (the checkpoint's resume point for the partition; see begin)
    source_name: str  # the source's replica set name, for event sinks' source block
    limits: CopyLimits
    rename: Callable[[Namespace], Namespace]
    fields: FieldRules | None
    appends: bool = True  # the destination was made or emptied by this run (Sink.copies_append)
    at: Position | None = None  # the snapshot's read time: its rows' position


def copy(task: CopyTask) -> tuple[int, list[Any]]:
    """Copy the task's partition through the run's sink: the number of documents written, and what the sink
    wrote without committing (for the driver to commit; empty for a sink that commits its own writes)."""
    return asyncio.run(_copy(task, retried=_attempt() > 0))


def _attempt() -> int:
    """Which attempt at its task this is: Spark runs a failed task again (``spark.task.maxFailures``)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


async def _copy(task: CopyTask, *, retried: bool = False) -> tuple[int, list[Any]]:
    s = task.settings
    part = task.partition
    after = task.after
    if after is None and retried and part.clears_on_retry:
        after = Resume(None)  # the failed attempt may have written some of it: begun before
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    sink = open_sink(s)
    try:
        sink.source_name = task.source_name
        await sink.start()
        sink.attach_source(source_lookup(client, s))
        sink.stage(appends=task.appends)

        async def done(part: Partition, docs: int) -> None:
            pass

        written = await copy_partitions(
            client, sink, [part], limits=task.limits, rename=task.rename, on_done=done, reporter=QuietReporter(),
            resume={part.id: after} if after is not None else None, fields=task.fields, at=task.at,
        )  # fmt: skip
        await sink.flush()
        return written, sink.staged()
    finally:
        await sink.close()
        await client.close()


@dataclass(frozen=True)
class DiffTask:
    """One verify range: the source partition and the target namespace it is compared with."""

    settings: Settings
    partition: Partition
    target_db: str
    target_coll: str
    reading: ReadPolicy = ReadPolicy()  # noqa: RUF009 - frozen  # this task's share of the rate
    since: Timestamp | None = None  # the verify's start: no source read is older


def diff(task: DiffTask) -> DocumentDiff:
    return asyncio.run(_diff(task))


async def _diff(task: DiffTask) -> DocumentDiff:
    s = task.settings
    source = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    target = make_client(s.target, timeout_s=s.connect_timeout_s, side="target")
    try:
        part = task.partition
        fields = FieldRules(s.field_exclude, s.field_rename)
        reads = SourceReads.start(task.reading, task.since)
        return await diff_partition(
            s, source, target, part, Namespace(task.target_db, task.target_coll), fields, reads=reads
        )
    finally:
        await source.close()
        await target.close()


@dataclass(frozen=True)
class ApplyTask:
    """One task's share of a replayed batch (see :mod:`.spread`), already transformed on the driver."""

    settings: Settings
    source_name: str
    events: list[ChangeEvent]


def apply(task: ApplyTask) -> BaseException | None:
    """Write the task's events through a sink of its own; None once the target acknowledged them all.

    The sink's failure is returned, not raised, so that the driver's replay treats it as it treats its own
    sink's (a target that does not answer is retried from the checkpoint, a refused write ends the run),
    instead of Spark retrying the task into the same outage; a failure that does not pickle comes back as
    its line."""
    try:
        asyncio.run(_apply(task))
    except Exception as exc:
        return exc if _pickles(exc) else McdcError(redact(f"{type(exc).__name__}: {exc}"))
    return None


async def _apply(task: ApplyTask) -> None:
    s = task.settings
    sink = open_sink(s)
    client = None
    try:
        sink.source_name = task.source_name
        try:
            await sink.start()
        except ServerUnavailable as exc:  # the target went away after the run had started: retried
            raise SinkUnavailable(str(exc)) from None
        if sink.holds_state:
            client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
            sink.attach_source(source_lookup(client, s))
        await sink.write(task.events)
        await sink.flush()
    finally:
        await sink.close()
        if client is not None:
            await client.close()


def warm(_: int) -> int:
    """Nothing: a task that starts its Python worker, which imports this module (and mcdc with it) to run it."""
    return os.getpid()


def _pickles(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return False
    return True
