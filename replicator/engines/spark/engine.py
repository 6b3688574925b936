"""The Spark engine as the job drives it: snapshot partitions as Spark tasks (:mod:`.snapshot`), the
replay's writes as Spark tasks (:mod:`.apply`), the embedded verifier's ranges as tasks (:mod:`.verify`).
The session is started here, or spark-submit's is used (and then left running)."""

from __future__ import annotations

import asyncio
from typing import Any

from replicator.checking.verify import RangeDiffer
from replicator.engines.driver import Driver
from replicator.replay.stage import Apply
from replicator.settings.config import Settings
from replicator.sinks.base import Sink

#: Sink batches (``--max-batch-size`` events) a task of the replay writes at once. A Spark job costs about
#: 0.2 s to schedule, ship and collect on a local master, whatever its size: 4 batches a task make it a
#: small share of the job (a 20,000-event backlog on local[2] and the test servers: jobs of 1,800 events
#: took 0.7-0.9 s each, jobs of 8,000 events 2.5-3.1 s).
TASK_BATCHES = 4


class SparkEngine(Driver):
    """The replay reads the stream once, on the driver, as the asyncio engine does (same reader, retries
    and acknowledgements); only its writes run as Spark tasks."""

    spark: Any = None  # the SparkSession, once started
    _before: Any = None  # the session that ran before this job (spark-submit's): not stopped

    async def start(self) -> None:
        from replicator.engines.spark.session import existing, session
        from replicator.engines.spark.snapshot import SparkCopier

        self._before = existing()
        if self._before is None:
            self.reporter.info(f"starting Spark ({self.s.spark_master})")
        self.spark = await asyncio.to_thread(session, self.s)
        self.copier = SparkCopier(self.s, self.spark)  # the driver's own until now

    def batch_events(self) -> int:
        """About ``TASK_BATCHES`` x ``--max-batch-size`` events per task, when that many wait to be written:
        a Spark job per batch costs its scheduling."""
        return self.s.replay_batch * self.partitions() * TASK_BATCHES

    def partitions(self) -> int:
        """The tasks a replayed batch is spread over (--replay-partitions, else the cluster's cores)."""
        return self.s.replay_partitions or max(1, int(self.spark.sparkContext.defaultParallelism))

    def apply_with(self, sink: Sink) -> Apply:
        """Each batch spread over Spark tasks that write from the executors (see :mod:`.apply`)."""
        from replicator.engines.spark.apply import SparkApply

        return SparkApply(self.s, self.spark, sink, partitions=self.partitions())

    def differ(self, settings: Settings) -> tuple[RangeDiffer | None, int]:
        """The ranges hashed as Spark tasks, a few at once."""
        from replicator.engines.spark.verify import SparkDiffer

        return SparkDiffer(settings, self.spark), int(self.spark.sparkContext.defaultParallelism)

    async def close(self) -> None:
        if self.spark is not None:
            from replicator.engines.spark.session import stop_owned

            await asyncio.to_thread(stop_owned, self.spark, self._before)
