"""The replay's writes on the executors: each transformed batch is cut at its DDL (applied alone, on the
driver) and the runs between are spread over Spark tasks (:mod:`.spread`) that write to the target
themselves, all at once. The batch counts as acknowledged, and the checkpoint may move past it, only once
every task of it returned; a task's failure fails the batch, which the replay writes again (idempotently)
as it does any batch its sink failed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from replicator.engines.spark import tasks
from replicator.engines.spark.failures import failing_in_one_line
from replicator.engines.spark.spread import runs, spread
from replicator.events import ChangeEvent
from replicator.settings.config import Settings
from replicator.sinks.base import Sink

#: The Spark job group of the replay's jobs (cancelled together when the run is).
JOB_GROUP = "mcdc-replay"


class SparkApply:
    """Writes a transformed batch into ``sink``'s target from Spark tasks (see the module)."""

    def __init__(self, settings: Settings, spark: Any, sink: Sink, *, partitions: int) -> None:
        self.s = settings
        self.spark = spark
        self.sink = sink  # the driver's: DDL, and every batch of a sink that does not spread
        self.partitions = partitions

    async def __call__(self, events: Sequence[ChangeEvent]) -> None:
        if self.sink.spreads is None:
            await self.sink.write(events)
            return
        for barrier, run in runs(events):
            if barrier:
                await self.sink.write(run)
            else:
                await self._spread(run)

    async def _spread(self, events: list[ChangeEvent]) -> None:
        shares = spread(events, self.partitions, by="namespace" if self.sink.spreads == "namespace" else "document")
        work = [tasks.ApplyTask(self.s, self.sink.source_name, share) for share in shares]
        try:
            failures = await asyncio.to_thread(self._run, work)
        except asyncio.CancelledError:  # a second signal: the run stops now, so do its tasks
            self.spark.sparkContext.cancelJobGroup(JOB_GROUP)
            raise
        for failure in failures:
            if failure is not None:
                raise failure

    def _run(self, work: list[tasks.ApplyTask]) -> list[BaseException | None]:
        sc = self.spark.sparkContext
        sc.setJobGroup(JOB_GROUP, f"mcdc replay of {sum(len(w.events) for w in work)} events", interruptOnCancel=True)
        with failing_in_one_line("the replay"):
            return list(sc.parallelize(work, len(work)).map(tasks.apply).collect())
