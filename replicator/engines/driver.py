"""The driver of a run, shared by both engines: the change streams read and replayed on this process's event
loop, through the same stage, acknowledged into the same checkpoint."""

from __future__ import annotations

import asyncio

from replicator.checking.verify import RangeDiffer
from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.observe.metrics import Metrics
from replicator.observe.progress import Reporter
from replicator.observe.summary import Summary
from replicator.replay.stage import Apply, ReplayStage
from replicator.replay.streaming import StreamApplier
from replicator.settings.config import Settings
from replicator.sinks.base import Sink
from replicator.snapshot.copy import Copier, copy_partitions
from replicator.source.shards import MergedReader
from replicator.source.topology import Reader, StreamTopology


class Driver:
    """What either engine does on the driver, and the asyncio engine does whole: copies with
    :func:`replicator.snapshot.copy.copy_partitions` and writes with the sink, in this process; replays the
    change streams with :class:`replicator.replay.streaming.StreamApplier`, with a new stream for each change of a
    discovered cluster's shard set. The Spark engine sends the copies, the writes and the verify ranges to
    its executors instead."""

    copier: Copier = staticmethod(copy_partitions)

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

    #: a line on how the run used the engine, once closed (the Spark engine's: that it never started Spark)
    note: str | None = None

    async def start(self, *, replay_only: bool = False) -> None:
        return None

    async def ready(self) -> object:
        return None

    async def replay(
        self, reader: Reader, topology: StreamTopology, cp: Checkpoint, stage: ReplayStage, summary: Summary,
        *, follow: bool,
    ) -> None:  # fmt: skip
        while True:
            merged = reader if follow and isinstance(reader, MergedReader) and topology.discovered else None
            local_stop = asyncio.Event()  # set by the watcher: on the user's stop, or when shards change
            stop = local_stop if merged is not None else self.stop
            watcher = None
            if merged is not None:
                watcher = asyncio.create_task(topology.watch(merged, local_stop, self.stop))
            applier = StreamApplier(
                reader, self.store, cp, settings=self.s, reporter=self.reporter, stop=stop, metrics=self.metrics,
                join_up_to=self.batch_events(),
            )  # fmt: skip
            try:
                result = await applier.run(stage, to_now=not follow)
            finally:
                if watcher is not None and not watcher.done():
                    watcher.cancel()
            summary.events += result.events
            summary.retries += applier.retries
            if merged is None or watcher is None or (self.stop is not None and self.stop.is_set()):
                return
            await topology.apply(merged, cp, watcher.result())  # then go on with the new set

    def batch_events(self) -> int:
        """The most events the replay writes at once (the read-ahead queue's batches joined)."""
        return self.s.replay_batch

    def apply_with(self, sink: Sink) -> Apply:
        return sink.write

    async def differ(self, settings: Settings) -> tuple[RangeDiffer | None, int]:
        return None, 1

    async def close(self) -> None:
        return None
