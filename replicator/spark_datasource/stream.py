"""``spark.readStream.format("mcdc")``: the source's change streams as micro-batches.

With ``snapshot=initial``, the selected collections come first, as ``r`` rows: the snapshot's partitions
are planned when the query begins (as the batch read plans them, after the source's time is read) and
read a few per micro-batch, then every stream goes on from that time (snapshot.py, offsets.py). A
partition whose collection was renamed or dropped before it was read is read where the collection went,
or not at all (moves.py): its rows come before the rename's or drop's row in the stream's order.

Offsets are per-shard resume tokens (offsets.py). On the driver, ``latestOffset`` reads each shard's
stream after the start (raw events, nothing decoded) up to the read limit and the end of what the server
has now, and never ends inside a multi-document transaction or a split event. The events it read are
kept (up to :data:`PLANNED_BYTES` in all) and sent with the micro-batch's partitions, so the stream is read
once: on the executors, one task per shard that moved turns them into rows. A partition planned by
another driver process (a restarted query re-plans a micro-batch from Spark's checkpoint), or whose
events were over that size, reads its stream again from the start and yields exactly the events up to
the end token, in stream order. Events outside the selection make no row, but offsets move over every
event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from replicator.bsonkit.extjson import dumps_str
from replicator.errors import ConfigError
from replicator.events.positions import Numbering
from replicator.events.rows import Row, bson_bytes
from replicator.observe.tally import format_ts
from replicator.settings.config import Settings, parse_start_at
from replicator.settings.uri import redact
from replicator.source.changestream import operation_time, refuse_later_start, token_timestamp
from replicator.source.connection import make_client, probe
from replicator.source.shards import discover, explicit_shards
from replicator.spark_datasource import offsets
from replicator.spark_datasource.change_rows import rows_of
from replicator.spark_datasource.changes import (
    RawChangeStream,
    SyncClient,
    sync_client,
    transaction_of,
)
from replicator.spark_datasource.offsets import REPLICA_SET, ShardOffset, SnapshotOffset
from replicator.spark_datasource.options import START_POSITIONS, one_line, settings_for
from replicator.spark_datasource.snapshot import Range, check_source, plan_steadily, read_next, snapshot_first
from replicator.spark_datasource.snapshot import read_range as read_snapshot_range
from replicator.spark_datasource.variant import VARIANT, as_variant, document_type

log = logging.getLogger("mcdc.spark")

#: How long a task waits for events its range holds before it says the stream lost them.
READ_PATIENCE_S = 120.0
#: The most bytes of events the driver keeps from planning a micro-batch, to send them with its partitions.
PLANNED_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ShardRange(InputPartition):
    """One shard's events of a micro-batch: after ``start`` up to and including ``end``'s token."""

    shard: str
    uri: str
    start: dict[str, Any]
    end: dict[str, Any]
    events: tuple[Mapping[str, Any], ...] | None = None  # read when the driver planned the range: not again


class ChangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``mcdc`` source's stream reader. It is pickled to the executors with its option strings only:
    the events the driver read while planning go with each micro-batch's partitions, not with it.

    ``match``: a ``$match`` on the change-stream documents, filtered on the server (a Lakeflow table reads
    its one collection's events): offsets then move over the events it lets through, and each event is
    numbered among them, the same on every read."""

    match: Mapping[str, Any] | None = None
    #: the selection's rules were checked against the source by the caller (a Lakeflow table's reader: its
    #: connector checked the whole selection, of which the table's is a part)
    checked: bool = False

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        settings_for(self.options, "source")  # a bad option fails now, on the driver
        self._shards: dict[str, str] | None = None
        self._until: Timestamp | None = None  # Trigger.AvailableNow: the source's time when the query began
        self._initial: dict[str, Any] | None = None
        # what latestOffset read, per shard: (its start, its end) -> the raw events in between
        self._planned: dict[str, tuple[str, str, list[Mapping[str, Any]]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_planned": {}}

    @property
    def settings(self) -> Settings:
        return settings_for(self.options, "source")

    # --- driver ---------------------------------------------------------------------------------------------

    def shards(self) -> dict[str, str]:
        """Shard name -> URI of each stream: ``""`` -> the source for a replica set."""
        if self._shards is None:
            self._shards = asyncio.run(stream_uris(self.settings))
        return self._shards

    def initialOffset(self) -> dict[str, Any]:
        """``start-positions`` (an offset: mcdc's checkpoint), else ``start-at``, else each stream's now (and
        with ``snapshot=initial``, the snapshot's plan from then). Always the same answer: Spark asks again
        when it plans the first micro-batch."""
        if self._initial is None:
            with one_line():
                self._initial = self._first_offset()
        return self._initial

    def _first_offset(self) -> dict[str, Any]:
        text = self.options.get(START_POSITIONS)
        if text:
            return offsets.to_json(offsets.parse(text, START_POSITIONS), initial=True)
        s = self.settings
        if s.start_at is not None:
            ts = parse_start_at(s.start_at)
            # of several shards (which share no clock), the latest: later than every one is in the future
            refuse_later_start(
                s.start_at, ts, max(self._times()), option="option start-at",
                otherwise="the stream then starts at the source's time when the query first runs",
            )  # fmt: skip
            return offsets.to_json({name: ShardOffset(None, ts.time, ts.inc) for name in self.shards()}, initial=True)
        start: dict[str, ShardOffset] = {}
        snapshot = None
        if snapshot_first(self.options, s):
            # Every stream from the snapshot's time itself (startAtOperationTime), not from a position taken
            # after that time was read: the rows sit before every event at that time or later, so the
            # events at it (a ping's time is the last write's) and those until the position was taken must
            # come after them too. The documents, read later still, may show them already: a consumer
            # folding by sequence applies them again, as it does every later event.
            at, plan = plan_steadily(s, self._time_now, check=not self.checked)  # each plan reads the time again
            start = {name: ShardOffset(None, at.time, at.inc) for name in self.shards()}
            snapshot = SnapshotOffset(at.time, at.inc, tuple(plan))
            log.info("mcdc stream reads a snapshot of %d partitions first, at %s", len(plan), at)
        else:
            if not self.checked:
                asyncio.run(check_source(s))
            for name, uri in self.shards().items():
                with sync_client(uri, s.connect_timeout_s, s.io_timeout_s, role=_role(name)) as client:
                    start[name] = position_now(client, s)
        log.info("mcdc stream starts at %s", start)
        return offsets.to_json(start, initial=True, snapshot=snapshot)

    def _time_now(self) -> Timestamp:
        """The earliest of the streams' times now (the snapshot's: every stream starts there)."""
        return min(self._times())

    def _times(self) -> list[Timestamp]:
        """Each stream's time now."""
        s = self.settings
        times: list[Timestamp] = []
        for name, uri in self.shards().items():
            with sync_client(uri, s.connect_timeout_s, s.io_timeout_s, role=_role(name)) as client:
                times.append(source_time(client))
        return times

    @property
    def until(self) -> Timestamp | None:
        """The latest cluster time read (None: no end): Trigger.AvailableNow's, or a Lakeflow table's drain's."""
        return self._until

    @until.setter
    def until(self, value: Timestamp | None) -> None:
        self._until = value

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.settings.replay_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        s = self.settings
        with one_line(), sync_client(s.source, s.connect_timeout_s, s.io_timeout_s) as client:
            self._until = source_time(client)
        log.info("mcdc stream: available now = up to %s", self._until)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Each shard's end: at most its share of the read limit, never past the earliest end of a shard
        cut by the limit (so no shard's later event is applied before another shard's earlier one, which
        a later micro-batch would bring: a document moving between shards keeps its order), never past
        the availableNow time. A shard with nothing new moves to its post-batch token (idle)."""
        with one_line():
            return self._latest(start, limit)

    def _latest(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets.from_json(start)
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None  # None: ReadAllAvailable
        snapshot = offsets.snapshot_of(start)
        if snapshot is not None and not snapshot.finished:  # the snapshot's next partitions; the streams wait
            done = read_next(snapshot.plan, snapshot.done, rows)
            return offsets.to_json(begin, snapshot=SnapshotOffset(snapshot.t, snapshot.i, snapshot.plan, done))
        shards = self.shards()
        if rows is not None:  # a share each: a busy shard cannot starve the others
            rows = max(1, rows // max(1, len(shards)))
        end = dict(begin)
        more: set[str] = set()
        for name in shards:
            end[name], cut = self._advance(name, begin, rows, self._until)
            if cut:
                more.add(name)
        common = offsets.common_end(end, more)
        if common is not None and len(shards) > 1:
            for name in shards:
                ts = end[name].cluster_time
                if ts is not None and ts > common and not end[name].idle:
                    until = common if self._until is None else min(common, self._until)
                    end[name], _ = self._advance(name, begin, rows, until)
        return offsets.to_json(end)

    def _advance(
        self, name: str, begin: offsets.Offsets, rows: int | None, until: Timestamp | None
    ) -> tuple[ShardOffset, bool]:
        """One shard's end (see :func:`advance`), or its post-batch token when it had no event."""
        s = self.settings
        with sync_client(self.shards()[name], s.connect_timeout_s, s.io_timeout_s, role=_role(name)) as client:
            stream = RawChangeStream(client, s, match=self.match)
            first = offsets.start_of(begin, name)
            stream.open(first.position())
            try:
                read: list[Mapping[str, Any]] = []
                end, cut = advance(stream, first, limit=rows, until=until, read=read)
                if end == first and not cut:
                    end = idle_end(first, stream.resume_token, until)
                self._planned[name] = (_key(first), _key(end), read)
                return end, cut
            finally:
                stream.close()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ShardRange | Range]:
        """One task per snapshot partition the micro-batch reads, or per shard that has events in it (an
        idle shard's move has none)."""
        snapshot, before = offsets.snapshot_of(end), offsets.snapshot_of(start)
        if snapshot is not None:
            begun = before.done if before is not None else 0
            parts = snapshot.plan[begun : snapshot.done]
            return [Range(part, snapshot.t, snapshot.i, len(parts)) for part in parts]
        begin, finish = offsets.from_json(start), offsets.from_json(end)
        shards = self.shards()
        planned, self._planned = self._planned, {}
        kept = 0
        ranges: list[ShardRange | Range] = []
        for name in sorted(finish):
            first = offsets.start_of(begin, name)
            if name not in shards or finish[name] == first or finish[name].idle:
                continue
            events = None
            if name in planned and planned[name][:2] == (_key(first), _key(finish[name])):
                kept += sum(len(bson_bytes(raw)) for raw in planned[name][2])
                events = tuple(planned[name][2]) if kept <= PLANNED_BYTES else None
            ranges.append(ShardRange(name, shards[name], first.to_json(), finish[name].to_json(), events))
        return ranges

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("mcdc stream: Spark committed %s", end)  # stateless: the offsets are Spark's checkpoint

    # --- executors ------------------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Row]:
        with one_line():
            rows = self._read(partition)
            yield from as_variant(rows) if document_type(self.options) == VARIANT else rows

    def _read(self, partition: InputPartition) -> Iterator[Row]:
        s = self.settings
        if isinstance(partition, Range):
            yield from read_snapshot_range(s, partition)
            return
        assert isinstance(partition, ShardRange)
        first = ShardOffset.from_json(partition.start)
        events: Sequence[Mapping[str, Any]] | None = partition.events  # read by the driver as it planned
        if events is None:
            with sync_client(partition.uri, s.connect_timeout_s, s.io_timeout_s, role=_role(partition.shard)) as client:
                stream = RawChangeStream(client, s, match=self.match)
                stream.open(first.position())
                try:
                    events = read_range(stream, partition.shard, ShardOffset.from_json(partition.end))
                finally:
                    stream.close()
        yield from rows_of(events, partition.shard, s, first.position())


def advance(
    stream: RawChangeStream,
    start: ShardOffset,
    *,
    limit: int | None,
    until: Timestamp | None,
    read: list[Mapping[str, Any]] | None = None,
) -> tuple[ShardOffset, bool]:
    """How far an opened stream goes now: up to ``limit`` events (more only to finish a transaction),
    none later than ``until``, and no further than what the server has right now. The start when nothing
    new came. Also whether events were left after the end (cut by the limit or ``until``). The events up
    to the end are appended to ``read``."""
    end = start
    last_txn: tuple[bytes, int] | None = None
    count = 0
    numbering = Numbering(start.position())
    while True:
        raw = stream.poll()
        if raw is None:
            return end, False
        txn = transaction_of(raw)
        ts = raw.get("clusterTime")
        if last_txn is None or txn != last_txn:  # the transaction we are in is always finished
            if limit is not None and count >= limit:
                return end, True
            if until is not None and ts is not None and ts > until:
                return end, True
        count += 1
        end, last_txn = ShardOffset.of(raw["_id"], ts, n=numbering.next(ts)), txn
        if read is not None:
            read.append(raw)


def idle_end(start: ShardOffset, token: Any, until: Timestamp | None) -> ShardOffset:
    """Where a shard with no new event moves: its stream's post-batch token (idle), so the checkpoint of an
    idle source keeps up; not past ``until`` (availableNow must come to an end), not when it says nothing."""
    ts = token_timestamp(token)
    if token is None or ts is None or (until is not None and ts > until):
        return start
    if start.cluster_time is not None and ts <= start.cluster_time:
        return start
    return ShardOffset.of(token, ts, idle=True)


def read_range(stream: RawChangeStream, shard: str, end: ShardOffset) -> list[Mapping[str, Any]]:
    """The events of an opened stream up to and including ``end``'s token (at most a micro-batch's: held,
    as the driver's are, so that their rows are made once all were looked up)."""
    read: list[Mapping[str, Any]] = []
    stop = end.cluster_time
    deadline = time.monotonic() + READ_PATIENCE_S
    while True:
        raw = stream.poll()
        if raw is None:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the change stream{_of(shard)} did not reach the micro-batch's end {end.token} within "
                    f"{READ_PATIENCE_S:.0f} s: its events are no longer there"
                )
            continue
        token = dumps_str(raw["_id"])
        ts = raw.get("clusterTime")
        if token != end.token and stop is not None and ts is not None and ts > stop:
            raise RuntimeError(
                f"the change stream{_of(shard)} passed the micro-batch's end ({end.token} at {format_ts(stop)}) "
                f"without meeting it (it is at {format_ts(ts)}): the stream changed since the offset was planned"
            )
        read.append(raw)
        if token == end.token:
            return read


def _key(offset: ShardOffset) -> str:
    return json.dumps(offset.to_json(), sort_keys=True)


def _of(shard: str) -> str:
    return f" of shard {shard}" if shard else ""


def _role(shard: str) -> str:
    """How a message names the server of ``shard``'s stream."""
    return f"shard {shard}" if shard else "source"


def source_time(client: SyncClient) -> Timestamp:
    """The source's latest operation time (a cluster-wide "now")."""
    return operation_time(client.admin.command("ping"))


def position_now(client: SyncClient, s: Settings) -> ShardOffset:
    """A stream's position now: the post-batch resume token of a stream opened without a start, with the
    operation time read just before it (never later than the token)."""
    ts = source_time(client)
    stream = RawChangeStream(client, s)
    stream.open(offsets.ShardOffset().position())
    try:
        return ShardOffset.of(stream.resume_token, ts)
    finally:
        stream.close()


async def stream_uris(s: Settings) -> dict[str, str]:
    """Shard name -> URI of each change stream to read: the ``shard`` option's replica sets (named as the
    asyncio engine's checkpoint names them), else a mongos's shards, else the source itself under ``""``."""
    if s.shards:
        return {shard.name: shard.uri for shard in await explicit_shards(s.shards, s.connect_timeout_s)}
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        info = await probe(client, s.source, "source")
        if info.kind == "sharded":
            return {shard.name: shard.uri for shard in await discover(client, s.source)}
        if not info.has_change_streams:
            raise ConfigError(f"source {redact(s.source)} is a standalone server: it has no change stream to read")
        return {REPLICA_SET: s.source}
    finally:
        await client.close()
