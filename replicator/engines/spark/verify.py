"""``mcdc verify --engine spark``: each namespace's ranges hashed and compared as Spark tasks (one job
per namespace, one task per range); the report and exit codes are :mod:`replicator.checking.verify`'s."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from replicator.checking import verify as verifying
from replicator.checking.verify import DocumentDiff, VerifyReport
from replicator.engines.spark import tasks
from replicator.engines.spark.failures import failing_in_one_line
from replicator.engines.spark.session import existing, session, stop_owned
from replicator.events import Namespace
from replicator.settings.config import Settings
from replicator.source.partitions import Partition
from replicator.source.reads import SourceReads


class SparkDiffer:
    def __init__(self, settings: Settings, spark: Any) -> None:
        self.s = settings
        self.spark = spark

    async def __call__(self, plan: Sequence[Partition], dst: Namespace, reads: SourceReads) -> list[DocumentDiff]:
        # tasks share no bucket: each of those running at once reads at its share of --max-read-rate
        running = max(1, min(len(plan), int(self.spark.sparkContext.defaultParallelism)))
        policy, since = reads.policy.shared(running), reads.since
        work = [tasks.DiffTask(self.s, p, dst.db, dst.coll or "", policy, since) for p in plan]
        return await asyncio.to_thread(self._run, work)

    def _run(self, work: list[tasks.DiffTask]) -> list[DocumentDiff]:
        if not work:
            return []
        sc = self.spark.sparkContext
        sc.setJobDescription(f"mcdc verify {work[0].target_db}.{work[0].target_coll}")
        with failing_in_one_line("verify"):
            return list(sc.parallelize(work, len(work)).map(tasks.diff).collect())  # in plan order


async def verify_on_spark(settings: Settings, *, held: bool = True) -> VerifyReport:
    before = existing()
    spark = await asyncio.to_thread(session, settings)
    try:
        return await verifying.verify(settings, SparkDiffer(settings, spark), held=held)
    finally:
        await asyncio.to_thread(stop_owned, spark, before)
