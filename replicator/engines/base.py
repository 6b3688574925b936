"""What the job asks of an engine: the loop-specific parts of a run. The job (:mod:`replicator.job`) keeps
the order of phases, the checkpoint and the progress; an engine copies partitions, replays the stream and
compares ranges its own way, through the same stages."""

from __future__ import annotations

from typing import Protocol

from replicator.checking.verify import RangeDiffer
from replicator.checkpoint.store import Checkpoint
from replicator.observe.summary import Summary
from replicator.replay.stage import Apply, ReplayStage
from replicator.settings.config import Settings
from replicator.sinks.base import Sink
from replicator.snapshot.copy import Copier
from replicator.source.topology import Reader, StreamTopology


class Engine(Protocol):
    #: copies snapshot partitions (:func:`replicator.snapshot.copy.copy_partitions`'s signature)
    copier: Copier

    #: a line on how the run used the engine, once closed (None: nothing to say)
    note: str | None

    async def start(self, *, replay_only: bool = False) -> None:
        """Start what the engine runs on; called once every check of the run has passed. ``replay_only``: the
        run is expected to replay up to now and copy nothing (a catch-up); the Spark engine then starts Spark
        only if the replay lasts longer than Spark takes to start."""

    async def ready(self) -> object:
        """Wait until what :meth:`start` started can take work (a Spark session comes up beside the run)."""

    async def replay(
        self, reader: Reader, topology: StreamTopology, cp: Checkpoint, stage: ReplayStage, summary: Summary,
        *, follow: bool,
    ) -> None:  # fmt: skip
        """Replay from ``cp`` through ``stage`` up to the source's time (``follow``: until stopped),
        acknowledging in ``cp``; adds the events applied and retries taken to ``summary``."""

    def apply_with(self, sink: Sink) -> Apply:
        """How the replay writes a transformed batch into ``sink`` and waits for its acknowledgement."""

    async def differ(self, settings: Settings) -> tuple[RangeDiffer | None, int]:
        """How the embedded verifier compares ranges (None: in this process), and how many at once."""

    async def close(self) -> None:
        """Stop what :meth:`start` started."""
