"""What the job asks of an engine: the loop-specific parts of a run. The job (:mod:`replicator.job`) keeps
the order of phases, the checkpoint and the progress; an engine copies partitions, replays the stream and
compares ranges its own way, through the same stages."""

from __future__ import annotations

import asyncio
from typing import Protocol

from replicator.checking.verify import RangeDiffer
from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.engines.asyncio.pipeline import Copier
from replicator.observe.metrics import Metrics
from replicator.observe.progress import Reporter
from replicator.observe.summary import Summary
from replicator.replay.stage import Apply, ReplayStage
from replicator.settings.config import Settings
from replicator.sinks.base import Sink
from replicator.source.topology import Reader, StreamTopology


class Engine(Protocol):
    #: copies snapshot partitions (:func:`replicator.engines.asyncio.pipeline.copy_partitions`'s signature)
    copier: Copier

    async def start(self) -> None:
        """Start what the engine runs on; called once every check of the run has passed."""

    async def replay(
        self, reader: Reader, topology: StreamTopology, cp: Checkpoint, stage: ReplayStage, summary: Summary,
        *, follow: bool,
    ) -> None:  # fmt: skip
        """Replay from ``cp`` through ``stage`` up to the source's time (``follow``: until stopped),
        acknowledging in ``cp``; adds the events applied and retries taken to ``summary``."""

    def apply_with(self, sink: Sink) -> Apply:
        """How the replay writes a transformed batch into ``sink`` and waits for its acknowledgement."""

    def differ(self, settings: Settings) -> tuple[RangeDiffer | None, int]:
        """How the embedded verifier compares ranges (None: in this process), and how many at once."""

    async def close(self) -> None:
        """Stop what :meth:`start` started."""


def open_engine(
    settings: Settings,
    store: CheckpointStore,
    reporter: Reporter,
    *,
    stop: asyncio.Event | None = None,
    metrics: Metrics | None = None,
) -> Engine:
    """The engine ``--engine`` names (Spark's modules are imported only when it is asked for)."""
    if settings.engine == "spark":
        from replicator.engines.spark.engine import SparkEngine

        return SparkEngine(settings, store, reporter, stop=stop, metrics=metrics)
    from replicator.engines.asyncio.engine import AsyncioEngine

    return AsyncioEngine(settings, store, reporter, stop=stop, metrics=metrics)
