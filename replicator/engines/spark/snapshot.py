"""The snapshot's partitions as Spark tasks.

Each partition is its own Spark job of one task, submitted from a driver thread, with as many running
at once as the cluster has cores (``defaultParallelism``). So the driver learns of each partition as
its task returns, and marks it done in the checkpoint at once (a sink that writes on the executors and
commits on the driver, a Delta table's, has the partition's files committed first): a driver killed at
any moment loses only the partitions still running, and the same command copies only those again. A
task that fails is retried by Spark (``spark.task.maxFailures``; a local master gets 4 attempts): its
writes are idempotent upserts, so a partly written attempt is simply written again. A time-series
partition's are not (measurements never replace each other): the driver records it as begun before its
task runs, and a task that copies it again (a later run, or Spark's next attempt) first deletes its range
from the target.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from replicator.engines.spark import tasks
from replicator.engines.spark.failures import failing_in_one_line
from replicator.events import Namespace, Position
from replicator.observe.progress import Reporter
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.sinks.base import Sink
from replicator.snapshot.copy import CopyLimits, CopyResult, begin
from replicator.source.connection import Client
from replicator.source.partitions import Partition, Resume

#: The Spark job group of the snapshot's jobs (cancelled together when the run is).
JOB_GROUP = "mcdc-snapshot"


class SparkCopier:
    """A drop-in for :func:`replicator.snapshot.copy.copy_partitions` that runs each partition as a
    Spark task."""

    def __init__(self, settings: Settings, spark: Any) -> None:
        self.s = settings
        self.spark = spark

    async def __call__(
        self,
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
        """Copy ``partitions`` on the executors; ``client`` and ``sink`` (the driver's) are not used by the
        tasks, which open their own from the settings. Progress is per partition (``on_progress`` is not
        called: a task's partial progress stays on its executor). Each of the tasks running at once (at most
        the cluster's cores) reads at an equal share of ``--max-read-rate``. ``mark_last`` is not honoured:
        tasks write their partitions on the executors, none knowing which ends the snapshot (Debezium records
        copied by Spark carry ``snapshot: true`` only)."""
        sc = self.spark.sparkContext
        running = max(1, min(int(sc.defaultParallelism), len(partitions)))
        slots = asyncio.Semaphore(running)
        # tasks share no bucket: each of those running at once reads at its share of --max-read-rate
        limits = replace(limits, reading=limits.reading.shared(running))
        result = result if result is not None else CopyResult()
        before = result.documents

        async def one(part: Partition) -> None:
            async with slots:
                if stop is not None and stop.is_set():
                    return  # the next run copies it
                after = await begin(part, resume, on_start)  # on the driver: the checkpoint is here
                appends = sink.copies_append(rename(part.ns))
                task = tasks.CopyTask(self.s, part, after, sink.source_name, limits, rename, fields, appends, at)
                try:
                    docs, staged = await asyncio.to_thread(self._run, task)
                except asyncio.CancelledError:  # a second signal: the run stops now, so do its tasks
                    self.spark.sparkContext.cancelJobGroup(JOB_GROUP)
                    raise
                if staged:  # written by the executor, committed here before the partition counts as done
                    await sink.commit_staged(staged)
                result.documents += docs
                reporter.snapshot_advance(str(part.ns), docs)
                await on_done(part, docs)

        try:
            async with asyncio.TaskGroup() as group:
                for part in sorted(partitions, key=lambda p: -p.estimated_docs):  # biggest first
                    group.create_task(one(part))
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return result.documents - before

    def _run(self, task: tasks.CopyTask) -> tuple[int, list[Any]]:
        sc = self.spark.sparkContext
        sc.setJobGroup(JOB_GROUP, f"mcdc snapshot {task.partition.ns}", interruptOnCancel=True)
        rdd = sc.parallelize([task], 1).map(tasks.copy)
        with failing_in_one_line("the snapshot"):
            docs, staged = rdd.collect()[0]
            return int(docs), list(staged)
