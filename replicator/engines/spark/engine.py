"""The Spark engine as the job drives it: snapshot partitions as Spark tasks (:mod:`.snapshot`), the
replay's writes as Spark tasks (:mod:`.apply`), the embedded verifier's ranges as tasks (:mod:`.verify`).
The session is started here, or spark-submit's is used (and then left running).

A session this run starts comes up beside the run: its JVM takes seconds to start (tens on a cluster that
allocates executors), and the replay does not wait for it. Until it is up, the replay's batches are written
from this process, as the asyncio engine writes them. The snapshot and the verifier wait for it.

A run that only replays up to now (a catch-up with no copy due) starts no session at first: its backlog is
replayed from this process, and only if it still has a batch to write ``--spark-start-after`` seconds in
(about what a session takes to start) does the session start beside it. An idle source's catch-up is over
before then, and never starts Spark. Anything that needs the session (a copy a lost history makes due)
starts it at once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from replicator.checking.verify import RangeDiffer
from replicator.checkpoint.store import Checkpoint
from replicator.engines.driver import Driver
from replicator.events import ChangeEvent
from replicator.observe.summary import Summary
from replicator.observe.tally import plural
from replicator.replay.stage import Apply, ReplayStage
from replicator.settings.config import Settings
from replicator.sinks.base import Sink
from replicator.source.topology import Reader, StreamTopology

log = logging.getLogger("mcdc.spark")


class SparkEngine(Driver):
    """The replay reads the stream once, on the driver, as the asyncio engine does (same reader, retries
    and acknowledgements); only its writes run as Spark tasks."""

    spark: Any = None  # the SparkSession, once up
    _before: Any = None  # the session that ran before this job (spark-submit's): not stopped
    _starting: asyncio.Task[Any] | None = None  # the session this run starts, coming up
    _deferring = False  # a replay-only run: its session starts only if a batch comes --spark-start-after in
    _began = 0.0  # when the run began to replay without a session (time.monotonic())
    _replayed = 0  # events replayed

    async def start(self, *, replay_only: bool = False) -> None:
        from replicator.engines.spark.session import active_session, check_java, create, launch

        self.copier = self._copy
        self._before = active_session(self.s)
        if self._before is not None:  # spark-submit's (or a test's): up already
            self.spark = self._before
            return
        await asyncio.to_thread(check_java)  # a missing Java fails the run now, not when the backlog is long
        after = self.s.spark_start_after_s
        if replay_only and after > 0:  # the replay writes from here; Spark starts only if it lasts
            self._deferring, self._began = True, time.monotonic()
            return
        self.reporter.info(f"starting Spark ({self.s.spark_master}); the replay writes from here until it is up")
        # the JVM first (a master it cannot start on fails the run before anything is written); the session on
        # it comes up beside the run (the longer part: 3.9 s of 5.7 on a busy local[2])
        await _started(asyncio.ensure_future(asyncio.to_thread(launch, self.s)))
        self._starting = asyncio.create_task(asyncio.to_thread(_come_up, self.s, create))

    def _launch(self, why: str) -> None:
        """Start the session beside the run, the JVM's launch too (see :func:`.session.launch`: its console
        goes to its own file, so this process's lines go on meanwhile)."""
        if self._starting is not None or self.spark is not None:
            return
        self.reporter.info(f"starting Spark ({self.s.spark_master}) {why}")
        self._starting = asyncio.create_task(asyncio.to_thread(_launch_and_come_up, self.s))

    def starting(self) -> bool:
        """Whether the session is not up yet (not started, or coming up): the replay then writes from this
        process."""
        return self.spark is None and (self._starting is None or not self._starting.done())

    async def ready(self) -> Any:
        """The session, once up (started now if it was not: the work that asks for it needs it); raises what
        stopped it from starting, in one line."""
        if self.spark is None:
            self._launch("now: the run needs it")
            assert self._starting is not None, "start() first"
            self.spark = await _started(self._starting)
            self.reporter.info("Spark is up: its tasks take the writes from here")
        return self.spark

    async def replay(
        self, reader: Reader, topology: StreamTopology, cp: Checkpoint, stage: ReplayStage, summary: Summary,
        *, follow: bool,
    ) -> None:  # fmt: skip
        before = summary.events
        try:
            await super().replay(reader, topology, cp, stage, summary, follow=follow)
        finally:
            self._replayed += summary.events - before

    async def _copy(self, *args: Any, **kwargs: Any) -> int:
        """The snapshot's partitions as Spark tasks, once the session is up (see :mod:`.snapshot`)."""
        from replicator.engines.spark.snapshot import SparkCopier

        return await SparkCopier(self.s, await self.ready())(*args, **kwargs)

    def batch_events(self) -> int:
        """As many events as wait in the read-ahead (``--max-queue-size``): a Spark job per batch costs
        about 0.2 s whatever its size (a 20,000-event backlog on local[2] and the test servers: jobs of
        1,800 events took 0.7-0.9 s each, jobs of 8,000 events 2.5-3.1 s)."""
        return max(self.s.replay_batch, self.s.max_queue_events)

    def partitions(self) -> int:
        """The tasks a replayed batch is spread over (--replay-partitions, else the cluster's cores)."""
        return self.s.replay_partitions or max(1, int(self.spark.sparkContext.defaultParallelism))

    def apply_with(self, sink: Sink) -> Apply:
        """Each batch spread over Spark tasks that write from the executors (see :mod:`.apply`); from this
        process while the session comes up."""
        from replicator.engines.spark.apply import SparkApply

        async def apply(events: Sequence[ChangeEvent]) -> None:
            if self._deferring and self._starting is None and sink.spreads is not None:
                took = time.monotonic() - self._began
                if took >= self.s.spark_start_after_s:  # the replay lasts: worth a session from here on
                    self._launch(
                        f"after {took:.1f} s of replaying on the driver; the replay writes from here until it is up"
                    )
            if self.starting() or sink.spreads is None:
                await sink.write(events)
                return
            spark = await self.ready()
            await SparkApply(self.s, spark, sink, partitions=self.partitions())(events)

        return apply

    async def differ(self, settings: Settings) -> tuple[RangeDiffer | None, int]:
        """The ranges hashed as Spark tasks, a few at once."""
        from replicator.engines.spark.verify import SparkDiffer

        spark = await self.ready()
        return SparkDiffer(settings, spark), int(spark.sparkContext.defaultParallelism)

    async def close(self) -> None:
        from replicator.engines.spark.session import stop_owned

        if self._deferring and self._starting is None and self.spark is None:  # over before Spark would be up
            took, after = time.monotonic() - self._began, self.s.spark_start_after_s
            than = "less than Spark takes to start" if took < after else "with no batch left to write"
            self.note = (
                f"replayed {plural(self._replayed, 'event')} on the driver in {took:.1f} s, {than} "
                f"(--spark-start-after {after:g} s): Spark was not started"
            )
        if self.spark is None and self._starting is not None:  # the run ended before its session was up:
            self.spark = await _started(self._starting)  # stopped once up; a failed start fails the run
        if self.spark is not None:
            await asyncio.to_thread(stop_owned, self.spark, self._before)


def _come_up(settings: Settings, create: Callable[[Settings], Any]) -> Any:
    """The session, with its Python workers started: a job of one task per core that does nothing, run while
    the driver still writes, so that the replay's first job does not wait for them (1.5 s on local[2]). A
    worker that cannot start is left for the run's own first job to report."""
    from replicator.engines.spark.tasks import warm

    spark = create(settings)
    sc = spark.sparkContext
    tasks = settings.replay_partitions or max(1, int(sc.defaultParallelism))
    try:
        sc.parallelize(range(tasks), tasks).map(warm).collect()
    except Exception as exc:
        log.debug("starting Spark's Python workers failed: %s", exc)
    return spark


def _launch_and_come_up(settings: Settings) -> Any:
    from replicator.engines.spark.session import create, launch

    launch(settings)
    return _come_up(settings, create)


async def _started(starting: asyncio.Future[Any]) -> Any:
    from replicator.engines.spark.failures import failing_in_one_line

    with failing_in_one_line("starting Spark"):
        return await starting
