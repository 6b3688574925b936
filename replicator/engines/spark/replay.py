"""The change replay on Spark: a Structured Streaming query over the ``mcdc`` data source's stream reader
(one change stream per shard, offsets = per-shard resume tokens), each micro-batch applied by the run's
sink and acknowledged in mcdc's checkpoint.

Where the position lives: in mcdc's checkpoint file only. Each run starts its query from the checkpoint's
per-shard positions, with a checkpointLocation of its own that is deleted when the run ends. A micro-batch
is applied through the same sink code as the asyncio engine (in order, idempotently), and only then does
the checkpoint move to its last event per shard. A driver killed at any moment restarts from the last
acknowledged micro-batch, whose events are applied again idempotently. The stream is read on the
executors; the micro-batch, at most ``--max-batch-size`` events per shard, is applied on the driver,
which keeps the events of each document in order across shards (merged by cluster time).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bson.timestamp import Timestamp

from ...checkpoint import Checkpoint, CheckpointStore
from ...config import Settings, settings_to_strings
from ...errors import HistoryLost, McdcError
from ...events import ChangeEvent, Position
from ...metrics import Metrics
from ...progress import Reporter, lag_seconds
from ...replay_stage import ReplayStage
from ...retry import Retrier, is_retryable
from ...spark_datasource import offsets
from ...spark_datasource.offsets import REPLICA_SET, ShardOffset
from ...uri import redact
from ..asyncio.streaming import measure
from .failures import HISTORY_LOST, reason

#: Options of the data source the replay sets itself (the run's settings give the rest).
_STREAM_OPTIONS = ("source", "shard", "full-document", "pre-images", "oversize", "max-batch-size", "connect-timeout")


def start_positions(cp: Checkpoint) -> dict[str, Any]:
    """The stream reader's start offset from the checkpoint: each shard's position, or the one position
    of a replica set."""
    positions = cp.shards if cp.shards else {REPLICA_SET: cp.position}
    return offsets.to_json({name: ShardOffset.of(p.resume_token, p.cluster_time) for name, p in positions.items()})


def batch_positions(events: Sequence[ChangeEvent]) -> dict[str, Position]:
    """Each shard's last event position in a micro-batch ("" for a replica set)."""
    last: dict[str, Position] = {}
    for event in events:
        if event.position is not None:
            last[event.rs or REPLICA_SET] = event.position
    return last


def merged_order(events: list[tuple[Timestamp, ChangeEvent]]) -> list[ChangeEvent]:
    """The shards' events in cluster-time order; a stable sort, so each shard's own order stays."""
    return [e for _, e in sorted(events, key=lambda pair: (pair[0].time, pair[0].inc))]


class SparkReplay:
    """Replays the source's changes into ``sink`` from the checkpoint, up to now (``follow=False``,
    ``Trigger.AvailableNow``) or until ``stop`` is set."""

    def __init__(
        self,
        settings: Settings,
        spark: Any,
        store: CheckpointStore,
        reporter: Reporter,
        *,
        stop: asyncio.Event | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.s = settings
        self.metrics = metrics
        self.spark = spark
        self.store = store
        self.reporter = reporter
        self.stop = stop
        self._retrier = Retrier.of(settings, reporter, stop=stop, metrics=metrics)
        self.events = 0

    @property
    def retries(self) -> int:
        return self._retrier.retries

    async def run(self, cp: Checkpoint, stage: ReplayStage, *, follow: bool) -> int:
        """Run queries until caught up (or stopped); a retryable failure of the sink or the source backs
        off and starts a new query from the checkpoint. Returns the events applied. Each micro-batch goes
        through ``stage``, as the asyncio engine's batches do."""
        while True:
            try:
                await stage.opened()
                await self._query(cp, stage, follow=follow)
                break
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                if await self._retrier.wait(exc, "stream"):
                    break
        self.store.save(cp)
        return self.events

    async def _query(self, cp: Checkpoint, stage: ReplayStage, *, follow: bool) -> None:
        from ...spark_datasource import register
        from ...spark_datasource.rows import event_from_row

        register(self.spark)
        loop = asyncio.get_running_loop()
        lock = threading.Lock()  # a micro-batch is applied whole, or not at all, around a stop
        stopping = threading.Event()
        failure: list[BaseException] = []

        owed: dict[str, Position] = {}  # positions of micro-batches applied but not acknowledged yet

        def acknowledge(positions: dict[str, Position], *, applied: bool = True) -> None:
            if cp.shards or any(name != REPLICA_SET for name in positions):  # shards (a --start-at run has
                # no per-shard entry yet: the first acknowledged events make them)
                times = [p.cluster_time for p in {**cp.shards, **positions}.values() if p.cluster_time is not None]
                overall = Position(cluster_time=min(times)) if times else Position()
                cp.acknowledge(overall, positions, applied=applied)
            elif REPLICA_SET in positions:
                cp.acknowledge(positions[REPLICA_SET])
            self.store.save(cp)

        async def apply(events: list[ChangeEvent]) -> None:
            written = await stage.write(events)
            await stage.sink.flush()
            owed.update(batch_positions(events))
            if written.ackable:
                acknowledge(owed)
                owed.clear()
                stage.acked(cp.position.cluster_time)
            self._retrier.progress()
            if self.metrics is not None:
                measure(self.metrics, written.events, cp)
            self.events += len(written.events)
            last = events[-1].position.cluster_time if events[-1].position else None
            self.reporter.replay_advance(len(written.events), lag_seconds(last))

        async def settle(progress: Any) -> None:
            """Between micro-batches, while the query is idle: copy again what the DDL window holds back,
            then acknowledge; and keep the checkpoint of shards with no events at their post-batch token
            (from the last micro-batch's end offset)."""
            if not await stage.settle():
                return
            if owed:
                acknowledge(owed)
                owed.clear()
            idle = _idle_positions(progress)
            if idle:
                acknowledge(idle, applied=False)
            stage.acked(cp.position.cluster_time, idle_since=_planned_at(progress))

        def each_batch(frame: Any, batch_id: int) -> None:
            with lock:
                if stopping.is_set() or failure:
                    raise RuntimeError("mcdc is stopping")  # not applied: the next run reads it again
                rows = frame.collect()
                timed = []
                for row in rows:
                    event = event_from_row(row.asDict(recursive=True))
                    ts = event.position.cluster_time if event.position else None
                    timed.append((ts or Timestamp(0, 0), event))
                if not timed:
                    return
                try:
                    asyncio.run_coroutine_threadsafe(apply(merged_order(timed)), loop).result()
                except BaseException as exc:
                    failure.append(exc)
                    raise

        location = tempfile.mkdtemp(prefix="mcdc-stream-")
        reader = self.spark.readStream.format("mcdc")
        for name, value in self._options(cp).items():
            reader = reader.option(name, value)
        writer = reader.load().writeStream.foreachBatch(each_batch).option("checkpointLocation", location)
        writer = writer.trigger(processingTime="500 milliseconds") if follow else writer.trigger(availableNow=True)
        query = await asyncio.to_thread(writer.start)
        try:
            await self._wait(query, lock=lock, stopping=stopping, settle=settle)
        except Exception as exc:  # the query failed: awaitTermination raised the JVM's wrapper
            if failure:
                raise failure[0] from None  # the sink's own error, retryable or not as it is
            raise stream_error(exc) from None
        finally:
            shutil.rmtree(location, ignore_errors=True)
        if failure:
            raise failure[0]
        if not stopping.is_set() and query.exception() is not None:
            raise stream_error(query.exception())
        if not stopping.is_set():
            await settle(query.lastProgress)

    def _options(self, cp: Checkpoint) -> dict[str, str]:
        options = {k: v for k, v in settings_to_strings(self.s).items() if k in _STREAM_OPTIONS}
        options["start-positions"] = json.dumps(start_positions(cp))
        return options

    async def _wait(
        self,
        query: Any,
        *,
        lock: threading.Lock,
        stopping: threading.Event,
        settle: Callable[[Any], Awaitable[None]],
    ) -> None:
        """Until the query ends (caught up) or ``stop`` is set; then stop it between two micro-batches.
        While it is idle (its last micro-batch read nothing), ``settle`` runs between micro-batches."""
        while True:
            ended = await asyncio.to_thread(query.awaitTermination, 0.5)
            if ended:
                return
            progress = query.lastProgress
            if progress is not None and not progress.get("numInputRows") and lock.acquire(blocking=False):
                try:
                    await settle(progress)
                finally:
                    lock.release()
            if self.stop is not None and self.stop.is_set():
                stopping.set()  # a micro-batch that starts from now on is not applied
                await asyncio.to_thread(_stop_between_batches, query, lock)
                return


def _idle_positions(progress: Any) -> dict[str, Position]:
    """The shards that moved without events in the query's last micro-batch (its end offset)."""
    try:
        end = progress["sources"][0]["endOffset"]
        return offsets.idle_positions(json.loads(end) if isinstance(end, str) else end)
    except (TypeError, KeyError, IndexError, ValueError):
        return {}


def _planned_at(progress: Any) -> float | None:
    """When a micro-batch that read nothing was triggered (its offsets were planned after), on the local
    monotonic clock; None when it read rows or its progress has no time."""
    try:
        if progress["numInputRows"]:
            return None
        wall = datetime.datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp()
    except (TypeError, KeyError, ValueError):
        return None
    return time.monotonic() - max(0.0, time.time() - wall)


def _stop_between_batches(query: Any, lock: threading.Lock) -> None:
    with lock:  # the micro-batch being applied, if any, is applied and acknowledged whole
        pass
    query.stop()


#: A failed reader task names pymongo's error class: those that mean "unreachable for now" are retried.
_OUTAGES = ("AutoReconnect", "ServerSelectionTimeoutError", "NetworkTimeout", "NotPrimaryError", "ConnectionFailure")


class StreamOutage(McdcError, ConnectionError):
    """The change stream's source went away during a micro-batch: retried like the asyncio engine's."""


def stream_error(exc: Any) -> McdcError:
    """The error a failed streaming query stands for, in one line: an outage (retried), the position
    gone from the oplog (HistoryLost: exit 4, and --on-history-lost resnapshot applies), or a failure."""
    line = redact(reason(exc))
    text = str(getattr(exc, "desc", None) or exc)  # the whole chain: the outage may be a cause of the line
    if any(name in text for name in _OUTAGES):
        return StreamOutage(f"the source is unreachable: {line}")
    if HISTORY_LOST in line:
        return HistoryLost(line.split(HISTORY_LOST, 1)[1].lstrip(": ") or line)
    return McdcError(f"the change stream on Spark failed: {line}")
