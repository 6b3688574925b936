"""What the job asks of an engine: the loop-specific parts of a run. The job (:mod:`replicator.job`) keeps
the order of phases, the checkpoint and the progress; an engine copies partitions, replays the stream and
compares ranges its own way, through the same stages."""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..checkpoint import Checkpoint, CheckpointStore
from ..config import Settings
from ..metrics import Metrics
from ..progress import Reporter
from ..replay_stage import Apply, ReplayStage
from ..sinks.base import Sink
from ..source.topology import Reader, StreamTopology
from ..summary import Summary
from ..verify import RangeDiffer
from .asyncio.pipeline import Copier


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
        from .spark.engine import SparkEngine

        return SparkEngine(settings, store, reporter, stop=stop, metrics=metrics)
    from .asyncio.engine import AsyncioEngine

    return AsyncioEngine(settings, store, reporter, stop=stop, metrics=metrics)
