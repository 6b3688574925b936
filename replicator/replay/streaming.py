"""Replaying the change stream into a sink from the checkpoint, through outages.

One loop for ``catch-up`` (up to a cluster time) and ``tail`` (until asked to stop): open the stream at
the checkpoint's position, apply batches (pipeline.replay), move the checkpoint after each acknowledged
batch. A retryable failure of the source or the sink (network, election, restart, outage) closes the
stream, waits with backoff and reopens it at the last acknowledged position: events after it are read
again and re-applied idempotently, none is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence

from bson.timestamp import Timestamp
from pymongo.errors import PyMongoError

from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.events import ChangeEvent
from replicator.observe.metrics import Metrics
from replicator.observe.progress import Reporter
from replicator.observe.tally import Throttle, duration
from replicator.replay.loop import ReplayResult, replay
from replicator.replay.stage import ReplayStage
from replicator.settings.config import Settings
from replicator.source.changestream import Batch, ChangeStreamReader, current_time, oplog_window
from replicator.source.retry import Retrier, is_retryable
from replicator.source.shards import MergedReader

log = logging.getLogger("mcdc.stream")

#: warn when the checkpoint is older than this share of the source's oplog window
OPLOG_WARN_FRACTION = 0.8
_MIN_RISK_AGE_S = 60  # under a minute behind is a fresh server or a checkpoint just saved, not a risk


class StreamApplier:
    """Applies one change stream to a sink and keeps the checkpoint at the last acknowledged batch."""

    def __init__(
        self,
        reader: ChangeStreamReader | MergedReader,
        store: CheckpointStore,
        checkpoint: Checkpoint,
        *,
        settings: Settings,
        reporter: Reporter,
        stop: asyncio.Event | None = None,
        metrics: Metrics | None = None,
        join_up_to: int | None = None,
    ) -> None:
        """``join_up_to``: batches waiting in the read-ahead queue are written as one, up to this many events
        (default ``--max-batch-size``)."""
        self.reader = reader
        self.store = store
        self.cp = checkpoint
        self.reporter = reporter
        self.stop = stop
        self.metrics = metrics
        self._retrier = Retrier.of(settings, reporter, stop=stop, metrics=metrics)
        self.join_up_to = join_up_to or settings.replay_batch
        # --max-queue-size bounds memory, whatever the join: it also bounds how many events a joined write
        # can gather (a Spark job's, on a large cluster)
        self.queue_events = settings.max_queue_events
        self._save = Throttle(1.0)
        self._window_check = Throttle(300.0)
        self._window_check()  # the first check runs when the stream opens
        self._window_task: asyncio.Task[None] | None = None
        self._stage: ReplayStage | None = None

    @property
    def retries(self) -> int:
        """Retries made so far."""
        return self._retrier.retries

    async def run(self, stage: ReplayStage, *, until: Timestamp | None = None, to_now: bool = False) -> ReplayResult:
        """Replay up to ``until`` (``to_now``: the source's time when this call starts), or until ``stop``
        is set when neither is given. Returns what was applied."""
        result = ReplayResult()
        self._stage = stage
        try:
            await self._replay(stage, result, until, to_now=to_now)
            stopped = self.stop is not None and self.stop.is_set()
            if self._window_task is not None and not stopped:  # its warning, if any, before the run ends
                await self._window_task
        finally:
            if self._window_task is not None and not self._window_task.done():
                self._window_task.cancel()
        self.store.save(self.cp)
        return result

    async def _replay(self, stage: ReplayStage, result: ReplayResult, until: Timestamp | None, *, to_now: bool) -> None:
        """Open the stream at the checkpoint and replay; after a retryable failure, wait and open it again."""
        while True:
            try:
                if to_now and until is None:
                    until = await current_time(self.reader.client)
                self._check_window_beside()
                await stage.opened()
                if isinstance(self.reader, MergedReader):
                    await self.reader.open(self.cp.shards, self.cp.position, until=until)
                else:
                    await self.reader.open(self.cp.position, until=until)
                await replay(
                    self.reader, stage, until=until, on_ack=self._ack, reporter=self.reporter,
                    queue_events=self.queue_events, stop=self.stop, result=result, join_up_to=self.join_up_to,
                )  # fmt: skip
                break
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                if await self._retrier.wait(exc, "stream"):
                    break
            finally:
                await self.reader.close()

    async def _ack(self, batch: Batch, events: Sequence[ChangeEvent]) -> None:
        self._retrier.progress()
        self.cp.acknowledge(batch.position, batch.shard_positions, applied=bool(events))
        last = self.cp.position.cluster_time
        # the source had nothing more (or a batch reached its end): caught up; else the last event's age
        self.cp.lag_s = 0.0 if batch.caught_up or not events or last is None else max(0.0, time.time() - last.time)
        if self._stage is not None:
            self._stage.acked(self.cp.position.cluster_time, idle_since=None if batch.events else batch.idle_since)
        if self.metrics is not None:
            self._measure(events)
        if self._save():
            self.store.save(self.cp)
        if self._window_check():
            self._check_window_beside()

    def _check_window_beside(self) -> None:
        """Check the oplog window beside the replay, not before it: the check only warns, and some servers
        take seconds to find the oldest entry of a large oplog."""
        if self._window_task is None or self._window_task.done():
            self._window_task = asyncio.create_task(self._check_quietly())

    async def _check_quietly(self) -> None:
        try:
            await self._check_oplog_window()
        except PyMongoError as exc:  # the replay meets an outage of the source itself, and retries
            log.debug("could not read the source's oplog window: %s", exc)

    async def _check_oplog_window(self) -> None:
        """Warn while the checkpoint can still be saved: its position is close to falling off the oplog."""
        position = self.cp.position.cluster_time
        if position is None or isinstance(self.reader, MergedReader):
            return
        # a position under a minute old is never at risk: skip reading the oplog's ends (a ping is cheap,
        # while some servers scan the oplog to find its first entry)
        if (await current_time(self.reader.client)).time - position.time <= _MIN_RISK_AGE_S:
            return
        window = await oplog_window(self.reader.client)
        if window is None:
            return
        oldest, newest = window
        span, age = newest.time - oldest.time, newest.time - position.time
        if span > 0 and age > max(OPLOG_WARN_FRACTION * span, _MIN_RISK_AGE_S):
            self.reporter.warn(
                f"the checkpoint's position is {duration(age)} behind the source and its oplog holds "
                f"{duration(span)}: once it falls off, the events in between are gone (catch up, or enlarge "
                "the oplog with replSetResizeOplog)"
            )

    def _measure(self, events: Sequence[ChangeEvent]) -> None:
        """The metrics of one acknowledged batch (``events`` empty: the server had nothing more)."""
        metrics = self.metrics
        assert metrics is not None
        metrics.set_state("streaming")
        if not events:  # the server had nothing more: caught up
            metrics.heartbeat()
            metrics.set_lag(0.0)
            return
        counts = Counter((e.op.value, str(e.ns)) for e in events)
        for (op, ns), n in counts.items():
            metrics.events(op, ns, n)
        metrics.batch_applied()
        last = self.cp.position.cluster_time
        if last is not None:
            metrics.set_last_event_time(float(last.time))
            metrics.set_lag(max(0.0, time.time() - last.time))
