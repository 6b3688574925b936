"""The Spark engine as the job drives it: snapshot partitions as Spark tasks (:mod:`.snapshot`), the
replay as a Structured Streaming query (:mod:`.replay`), the embedded verifier's ranges as tasks
(:mod:`.verify`). The session is started here, or spark-submit's is used (and then left running)."""

from __future__ import annotations

import asyncio
from typing import Any

from ...checkpoint import Checkpoint, CheckpointStore
from ...config import Settings
from ...metrics import Metrics
from ...progress import Reporter
from ...replay_stage import ReplayStage
from ...source.topology import Reader, StreamTopology
from ...summary import Summary
from ...verify import RangeDiffer
from ..asyncio.pipeline import Copier, copy_partitions


class SparkEngine:
    def __init__(
        self,
        settings: Settings,
        store: CheckpointStore,
        reporter: Reporter,
        *,
        stop: asyncio.Event | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.s = settings
        self.store = store
        self.reporter = reporter
        self.stop = stop
        self.metrics = metrics
        self.copier: Copier = copy_partitions  # until start(): then the Spark copier
        self.spark: Any = None  # the SparkSession
        self._before: Any = None  # the session that ran before this job (spark-submit's): not stopped

    async def start(self) -> None:
        from .session import existing, session
        from .snapshot import SparkCopier

        self._before = existing()
        if self._before is None:
            self.reporter.info(f"starting Spark ({self.s.spark_master})")
        self.spark = await asyncio.to_thread(session, self.s)
        self.copier = SparkCopier(self.s, self.spark)

    async def replay(
        self, reader: Reader, topology: StreamTopology, cp: Checkpoint, stage: ReplayStage, summary: Summary,
        *, follow: bool,
    ) -> None:  # fmt: skip
        """A streaming query over the shards' streams (the shards it follows are fixed)."""
        from .replay import SparkReplay

        spark_replay = SparkReplay(self.s, self.spark, self.store, self.reporter, stop=self.stop, metrics=self.metrics)
        try:
            summary.events += await spark_replay.run(cp, stage, follow=follow)
        finally:
            summary.retries += spark_replay.retries

    def differ(self, settings: Settings) -> tuple[RangeDiffer | None, int]:
        """The ranges hashed as Spark tasks, a few at once."""
        from .verify import SparkDiffer

        return SparkDiffer(settings, self.spark), int(self.spark.sparkContext.defaultParallelism)

    async def close(self) -> None:
        if self.spark is not None:
            from .session import stop_owned

            await asyncio.to_thread(stop_owned, self.spark, self._before)
