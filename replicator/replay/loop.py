"""The replay loop, as the driver of either engine runs it: the change stream is read ahead into a bounded
queue (a slow sink slows the reader), batches are applied in order through the stage, and the checkpoint
moves to a batch's position only after the sink acknowledged it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent
from replicator.observe.progress import Reporter, lag_seconds
from replicator.replay.stage import ReplayStage
from replicator.source.batching import carried, joined
from replicator.source.changestream import Batch
from replicator.source.pump import read_ahead


class BatchSource(Protocol):
    """Anything that yields change batches up to a cluster time (a change stream reader, a test fake)."""

    def batches(self, *, until: Timestamp | None = None) -> AsyncIterator[Batch]: ...


@dataclass
class ReplayResult:
    events: int = 0
    batches: int = 0
    last_time: Timestamp | None = None


async def replay(
    reader: BatchSource,
    stage: ReplayStage,
    *,
    until: Timestamp | None,
    on_ack: Callable[[Batch, Sequence[ChangeEvent]], Awaitable[None]],
    reporter: Reporter,
    queue_events: int,
    stop: asyncio.Event | None = None,
    result: ReplayResult | None = None,
    join_up_to: int = 0,
) -> ReplayResult:
    """Apply change batches in order until the stream passed ``until``, or ``stop`` is set (None and
    None: until cancelled). Counts go into ``result`` as batches are acknowledged, so a caller that
    retries after an error keeps them.

    Each batch goes through ``stage`` (checks, DDL window, transform, sink); ``on_ack(batch, applied
    events)`` runs once the batch may be acknowledged. While namespaces wait to be copied again (the
    stage's DDL window), batches are applied but not acknowledged; the copy runs once the stream is
    caught up (or passed the window, or ends), and the last batch is acknowledged then. The read-ahead
    queue holds up to ``queue_events`` events; batches that wait in it are written as one, up to
    ``join_up_to`` events (0: never)."""
    result = result if result is not None else ReplayResult()

    def join(first: Batch, then: Batch) -> Batch | None:
        return joined(first, then, join_up_to)

    ahead = read_ahead(reader.batches(until=until), queue_events, join if join_up_to else None, weigh=_weight)
    async with contextlib.aclosing(ahead) as batches:  # closed on failure too, not by the garbage collector
        owed = await _apply(batches, stage, on_ack, reporter, stop, result)
    if owed is not None and not (stop is not None and stop.is_set()) and await stage.settle():
        await on_ack(*owed)
    return result


async def _apply(
    batches: AsyncIterator[Batch],
    stage: ReplayStage,
    on_ack: Callable[[Batch, Sequence[ChangeEvent]], Awaitable[None]],
    reporter: Reporter,
    stop: asyncio.Event | None,
    result: ReplayResult,
) -> tuple[Batch, list[ChangeEvent]] | None:
    """Apply ``batches`` (see :func:`replay`); what was applied and not acknowledged at the end."""
    owed: tuple[Batch, list[ChangeEvent]] | None = None  # applied, not acknowledged yet
    async for batch in batches:
        written = await stage.write(batch.events)
        events = written.events
        if owed is not None:  # acknowledged with the batches applied before it: their position carries on
            batch = carried(owed[0], batch)
        ackable = written.ackable or (batch.caught_up and await stage.settle())
        result.events += len(events)
        result.batches += 1
        if batch.events and batch.events[-1].position is not None:
            result.last_time = batch.events[-1].position.cluster_time or result.last_time
        # a batch without events is the server saying "nothing more": caught up, no lag
        reporter.replay_advance(len(events), lag_seconds(result.last_time) if batch.events else 0.0)
        if batch.position or batch.shard_positions:
            applied = events if owed is None else [*owed[1], *events]
            if ackable:
                await on_ack(batch, applied)
                owed = None
            else:
                owed = (batch, applied)
        if stop is not None and stop.is_set():
            break
    return owed


def _weight(batch: Batch) -> int:
    """A batch's share of the read-ahead queue: its events (an idle poll's empty batch counts one)."""
    return len(batch.events) or 1
