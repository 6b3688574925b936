"""The source's change stream: opened at a Position, read as bounded batches of ChangeEvents.

A batch never ends inside a multi-document transaction (events sharing lsid + txnNumber), so a sink can
apply a transaction as one unit.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import OperationFailure, PyMongoError

from replicator.errors import ConfigError, HistoryLost, OversizeEvent
from replicator.events import Position
from replicator.events.positions import Numbering
from replicator.observe.tally import format_ts
from replicator.source.batching import OVERSIZE_FLAG, BatchAssembler, Fragments, merge_fragments, plain_token
from replicator.source.batching import (
    Batch as Batch,  # re-exported, with token_timestamp: the reader's callers import them here
)
from replicator.source.batching import token_timestamp as token_timestamp
from replicator.source.connection import DICT_CODEC, Client
from replicator.source.pump import Pump, stop_pumps

#: Server codes meaning "that resume point is gone from the oplog".
HISTORY_LOST_CODES = frozenset({136, 280, 286})
#: "unrecognized pipeline stage": $changeStreamSplitLargeEvent on a server before 7.0 / 6.0.9.
_UNKNOWN_STAGE_CODES = frozenset({40324})
#: BSONObjectTooLarge and friends: an event over 16 MB.
_TOO_LARGE_CODES = frozenset({10334, 17419, 16819})
_MAX_EVENT = 16 * 1024 * 1024 - 16 * 1024
# the names the Spark data source's synchronous reader (spark/changes.py) imports from here
_OVERSIZE_FLAG = OVERSIZE_FLAG
_assemble = merge_fragments
#: --oversize skip without split support: mark events over the limit and drop their big parts on the
#: server, so the stream goes on and mcdc can log which document it skipped.
_TRIM_OVERSIZE: list[dict[str, Any]] = [
    {"$set": {OVERSIZE_FLAG: {"$gt": [{"$bsonSize": "$$ROOT"}, _MAX_EVENT]}}},
    {
        "$set": {
            field: {"$cond": [f"${OVERSIZE_FLAG}", "$$REMOVE", f"${field}"]}
            for field in ("fullDocument", "fullDocumentBeforeChange", "updateDescription")
        }
    },
]
_CANNOT_SPLIT = (
    "a change event over 16 MB stopped the stream and this server cannot split it "
    "($changeStreamSplitLargeEvent needs MongoDB 7.0 or 6.0.9): upgrade, or pass "
    "--oversize skip to skip such events (each is logged)"
)
#: "unknown field" / "unrecognized option" answers to an option the server predates.
_UNKNOWN_OPTION_CODES = frozenset({9, 40415})
log = logging.getLogger("mcdc.source")


async def current_time(client: Client) -> Timestamp:
    """The source's latest operation time, a cluster-wide "now"."""
    reply = await client.admin.command("ping", codec_options=DICT_CODEC)
    return operation_time(reply)


def refuse_later_start(given: str, at: Timestamp, now: Timestamp, *, option: str, otherwise: str) -> None:
    """A start position (``given``, parsed: ``at``) later than the source's time ``now`` (of several shards,
    which share no clock, the latest) would pass over every event written before the source reaches it:
    refused in one line naming ``option`` (``--start-at`` or the data source's ``option start-at``), with
    ``otherwise``: what leaving it out does."""
    if at > now:
        bare = option.removeprefix("option ")
        raise ConfigError(
            f"{option} {given} is later than the source's current time {format_ts(now)}: give a time at or "
            f"before it, or leave {bare} out ({otherwise})"
        )


def operation_time(reply: Mapping[str, Any]) -> Timestamp:
    """The operation time of a server's reply (a ping's: the source's "now")."""
    ts = reply.get("operationTime") or (reply.get("$clusterTime") or {}).get("clusterTime")
    if ts is None:
        raise RuntimeError("the source did not report an operation time")
    return ts  # type: ignore[no-any-return]


async def oplog_window(client: Client) -> tuple[Timestamp, Timestamp] | None:
    """The oldest and newest operation times in the source's oplog, or None where it cannot be read
    (a mongos, or no read access to the local database)."""
    oplog = client.get_database("local", codec_options=DICT_CODEC)["oplog.rs"]
    try:
        first = await oplog.find_one({}, {"ts": 1}, sort=[("$natural", 1)])
        last = await oplog.find_one({}, {"ts": 1}, sort=[("$natural", -1)])
    except PyMongoError:
        return None
    if not first or not last:
        return None
    return first["ts"], last["ts"]


class OversizePlan:
    """The stages a change stream carries for events over 16 MB, and what to do when one stops it.

    ``mode`` starts "plain" (no stage: MongoDB advises $changeStreamSplitLargeEvent only when strictly
    needed, it costs the server work on every event), becomes "split" once such an event stopped the
    stream, or "trim" (``--oversize skip``: marked and emptied on the server) where the server cannot
    split. Both the asyncio reader and the Spark data source's reader follow it."""

    def __init__(self, oversize: str) -> None:
        self.oversize = oversize
        self.mode = "plain"

    def stages(self) -> list[dict[str, Any]]:
        if self.mode == "split":
            return [{"$changeStreamSplitLargeEvent": {}}]
        if self.mode == "trim":
            return _TRIM_OVERSIZE
        return []

    def too_large(self) -> None:
        """An event over 16 MB stopped the stream: split from now on, or fail where that was tried."""
        if self.mode != "plain":
            raise OversizeEvent(_CANNOT_SPLIT)
        log.info("a change event over 16 MB: reading the stream on with $changeStreamSplitLargeEvent")
        self.mode = "split"

    def refused(self, code: int | None) -> bool:
        """The server refused the stream with ``code``: True when the plan changed and opening again may
        work (the server has no split stage: --oversize decides between failing and trimming)."""
        if code in _TOO_LARGE_CODES:  # the first reply already held such an event
            self.too_large()
            return True
        if code not in _UNKNOWN_STAGE_CODES or self.mode != "split":
            return False
        log.warning("the source has no $changeStreamSplitLargeEvent: --oversize %s applies", self.oversize)
        if self.oversize != "skip":
            raise OversizeEvent(_CANNOT_SPLIT)
        self.mode = "trim"
        return True


def after_refusal(plan: OversizePlan, exc: OperationFailure, kwargs: dict[str, Any], start: Position | None) -> None:
    """The server refused to open a stream: change what may let a next attempt work (the oversize plan,
    or no showExpandedEvents before MongoDB 6.0, dropped from ``kwargs``), or raise the error."""
    if plan.refused(exc.code):
        return
    if not (exc.code in _UNKNOWN_OPTION_CODES and kwargs.pop("show_expanded_events", False)):
        raise _history_error(exc, start) or exc from None
    # before MongoDB 6.0 there are no create/createIndexes/modify events: indexes and options are still
    # reconciled from the catalog at the end of a snapshot
    log.warning("the source has no showExpandedEvents (MongoDB < 6.0): index DDL is not streamed")


def reopen_options(opened: dict[str, Any], token: Any, *, key: str = "resume_after") -> dict[str, Any]:
    """watch()'s options to open a stream again right after the last event it handed out (its resume
    token, passed as ``key``; where it has none yet, where it was opened)."""
    if token is None:
        return dict(opened)
    kwargs = {k: v for k, v in opened.items() if k not in ("resume_after", "start_after", "start_at_operation_time")}
    kwargs[key] = token
    return kwargs


class ChangeStreamReader:
    """Reads the whole deployment's change stream (all databases but admin, local and config), or with
    ``database`` that one database's.

    MongoDB leaves those three databases out of a deployment's change stream, so no server-side filter is
    added for them (a $match costs the server work on every event); should a server send one anyway, the
    selection (filters.py) drops it.

    A database's stream (for a source user who may read only that database) ends with an ``invalidate``
    event when the database is dropped. The reader opens it again right after (``startAfter`` that event's
    token: ``resumeAfter`` refuses an invalidate's) and reads on: the events before and after are all read,
    once, and the invalidate itself is never handed out (it is no change; it gets no place among the
    events). Such a stream is always opened with ``startAfter``, which accepts every token of the stream, so
    a checkpoint saved just before the invalidate resumes through it the same way."""

    def __init__(
        self,
        client: Client,
        *,
        full_document: str,
        batch_size: int,
        max_await_ms: int = 500,
        track_time: bool = False,
        oversize: str = "fail",
        pre_images: str = "off",
        rs: str | None = None,
        shard: str | None = None,
        database: str | None = None,
    ) -> None:
        """``track_time``: stamp batches with local read and poll times (``Batch.read_at`` and
        ``Batch.idle_since``), which merging several streams needs. ``oversize``: what to do with a
        change event over 16 MB where the server cannot split it ("fail" or "skip", logged). ``pre_images``:
        fullDocumentBeforeChange ("off", "whenAvailable" or "required"). ``rs``: the replica set's name,
        stamped on every event. ``shard``: the stream's name among a cluster's shards (None for a replica
        set), stamped on every event's position. ``database``: read that database's stream, not the
        deployment's."""
        self.client = client
        self._database = database
        #: the option a resume token is passed with (see the class's docs)
        self._token_key = "resume_after" if database is None else "start_after"
        self._track_time = track_time
        self._full_document = full_document
        self._batch_size = batch_size
        self._max_await_ms = max_await_ms
        self._pre_images = pre_images
        self._rs = rs
        self._shard = shard
        self._plan = OversizePlan(oversize)
        self._kwargs: dict[str, Any] = {}
        self._fragments = Fragments()  # outlives one run of batches(), not the stream
        self._numbering = Numbering()  # the same
        self._stream: AsyncChangeStream[Any] | None = None
        # the replies read ahead (see batches()); their events not yet assembled outlive one run
        self._reader: Pump | None = None  # the replies read ahead, outliving one batches()
        self._pending: deque[Any] = deque()
        self._drained_after = False

    async def open(self, start: Position) -> None:
        kwargs: dict[str, Any] = {
            "batch_size": self._batch_size,
            "max_await_time_ms": self._max_await_ms,
            "show_expanded_events": True,
        }
        if self._full_document != "default":
            kwargs["full_document"] = self._full_document
        if self._pre_images != "off":
            kwargs["full_document_before_change"] = self._pre_images
        if start.resume_token is not None:
            kwargs[self._token_key] = start.resume_token
        elif start.cluster_time is not None:
            # a server may start a stream older than its oplog silently from the oplog's oldest entry: a time
            # before that entry is a gap, whatever the server says
            window = await oplog_window(self.client)
            check_in_oplog(start, window[0] if window is not None else None)
            kwargs["start_at_operation_time"] = start.cluster_time
        await self._stop_reading()
        self._fragments = Fragments()
        self._numbering = Numbering(start)
        self._kwargs = kwargs
        await self._watch(kwargs, start)

    async def _watch(self, kwargs: dict[str, Any], start: Position | None) -> AsyncChangeStream[Any]:
        while True:
            try:
                watched = self.client if self._database is None else self.client[self._database]
                self._stream = await watched.watch(self._plan.stages(), **kwargs)
                return self._stream
            except OperationFailure as exc:
                after_refusal(self._plan, exc, kwargs, start)

    async def _reopen_after_oversize(self, stream: AsyncChangeStream[Any]) -> AsyncChangeStream[Any]:
        """The stream opened again where ``stream`` stopped on an event over 16 MB, able to pass it."""
        self._plan.too_large()
        kwargs = reopen_options(self._kwargs, stream.resume_token, key=self._token_key)
        await stream.close()
        return await self._watch(kwargs, None)

    async def _reopen_after_invalidate(self, stream: AsyncChangeStream[Any], token: Any) -> AsyncChangeStream[Any]:
        """A database's stream opened again right after its ``invalidate`` event (``token``)."""
        log.info("the change stream of database %s was invalidated (dropped): opening it again", self._database)
        await stream.close()
        return await self._watch(reopen_options(self._kwargs, token, key="start_after"), None)

    async def position_now(self) -> Position:
        """The stream's position now: the post-batch resume token of a stream opened without a start
        (cheaper than startAtOperationTime, which makes the server seek its oplog), with the operation
        time read just before it, so the position is never later than the token."""
        start = await current_time(self.client)
        await self.open(Position())
        assert self._stream is not None
        return Position(resume_token=plain_token(self._stream.resume_token), cluster_time=start)

    async def close(self) -> None:
        await self._stop_reading()
        if self._stream is not None:
            await self._stream.close()
            self._stream = None

    async def batches(self, *, until: Timestamp | None = None) -> AsyncIterator[Batch]:
        """Yield batches until the stream has passed ``until`` (None: forever).

        Stops after the first batch for which the server had nothing more once it had reached
        ``until``, or when an event later than ``until`` arrives (that event is not yielded).

        The server's replies are read ahead by a task of their own (at most ``READ_AHEAD`` replies
        waiting): the next getMore is on its way while this batch is normalized, encoded and written, so
        the server works while mcdc does. What is read past ``until`` waits for the next run.
        """
        assert self._stream is not None, "open() first"
        if self._reader is None:
            self._reader = Pump(self._read_replies(), READ_AHEAD)
        reader = self._reader
        assembler = BatchAssembler(
            batch_size=self._batch_size, until=until, rs=self._rs, fragments=self._fragments,
            numbering=self._numbering, shard=self._shard,
        )  # fmt: skip
        pending = self._pending
        while True:
            poll_started: float | None = None
            ready = False
            while not ready:
                if not pending:
                    reply = await reader.get()
                    assert isinstance(reply, Reply), "the stream's reader ended"
                    if not reply.docs:
                        if self._track_time and assembler.empty:
                            poll_started = reply.poll_started
                        ready = assembler.nothing_more(reply.token)
                        continue
                    pending.extend(reply.docs)
                    self._drained_after = reply.drained
                raw = pending.popleft()
                ready = assembler.add(raw, drained=not pending and self._drained_after)
            yield assembler.take(read_at=time.monotonic(), poll_started=poll_started)
            if assembler.finished:
                return

    async def _read_replies(self) -> AsyncIterator[Reply]:
        """The replies of the open stream; opened again with the split stage where an event over 16 MB
        stopped it (the replies before it were all handed out: nothing is read twice or skipped), and, for a
        database's stream, right after an ``invalidate`` (the events before it handed out, not it)."""
        assert self._stream is not None
        stream = self._stream
        while True:
            try:
                invalidate: Any = None
                async with contextlib.aclosing(_replies(stream, max(self._batch_size, 1))) as replies:
                    async for reply in replies:
                        invalidate = _invalidate_token(reply) if self._database is not None else None
                        if invalidate is None:
                            yield reply
                            continue
                        if len(reply.docs) > 1:
                            yield Reply(reply.docs[:-1], drained=True)
                        break
                if invalidate is None:  # the replies never end but by an error: a stream is polled for ever
                    return
                stream = await self._reopen_after_invalidate(stream, invalidate)
            except _TooLarge:
                stream = await self._reopen_after_oversize(stream)

    async def _stop_reading(self) -> None:
        reader, self._reader = self._reader, None
        self._pending.clear()
        if reader is not None:
            await stop_pumps([reader])


def _invalidate_token(reply: Reply) -> Any:
    """The token of the ``invalidate`` event that ends ``reply`` (always the last event of its stream), or
    None."""
    if not reply.docs:
        return None
    last = reply.docs[-1]
    return last["_id"] if last.get("operationType") == "invalidate" else None


#: Replies of the server read ahead of the batch being assembled.
READ_AHEAD = 2


@dataclass(frozen=True)
class Reply:
    """What one poll of the stream gave: the events of one server reply (``drained``: the driver holds
    no more of it), or none, with the post-batch resume token and when the poll began."""

    docs: list[Any]
    drained: bool = False
    token: Any = None
    poll_started: float = 0.0


async def _replies(stream: AsyncChangeStream[Any], most: int) -> AsyncGenerator[Reply, None]:
    """The stream, one server reply at a time: the driver's buffered events are taken in one go (no I/O),
    so the next getMore is sent as soon as the previous reply is in. At most ``most`` events a Reply (a
    driver that does not show its buffer is read until it has nothing)."""
    while True:
        poll_started = time.monotonic()
        raw = await _next(stream)
        if raw is None:
            yield Reply([], token=stream.resume_token, poll_started=poll_started)
            continue
        docs = [raw]
        buffered = _take_buffered(stream, most - 1)
        if buffered is not None:
            docs.extend(buffered)
        else:
            try:
                while len(docs) < most and not _drained(stream) and (raw := await _next(stream)) is not None:
                    docs.append(raw)
            except _TooLarge:  # what came before the event over 16 MB is handed out first
                yield Reply(docs, drained=True)
                raise
        yield Reply(docs, drained=_drained(stream))
        if raw is None:  # a driver without the internal buffer: the poll found nothing after these
            yield Reply([], token=stream.resume_token, poll_started=poll_started)


class _TooLarge(Exception):
    """The server could not return the next event: it is over 16 MB."""


async def _next(stream: AsyncChangeStream[Any]) -> Any:
    try:
        return await stream.try_next()
    except OperationFailure as exc:
        if exc.code in _TOO_LARGE_CODES:
            raise _TooLarge from None
        raise _history_error(exc, None) or exc from None


def _take_buffered(stream: AsyncChangeStream[Any], most: int) -> list[Any] | None:
    """Up to ``most`` events of the server's last reply that the driver holds (no I/O), taken in one go and
    left as ``try_next`` leaves the stream after handing them out one by one: its resume token is the last
    one's ``_id``, or the reply's post-batch token once the reply is drained. ``try_next`` per event cost a
    few coroutines and a read of every event's ``_id``. None on a driver that does not show these (then
    events are read one by one)."""
    cursor: Any = getattr(stream, "_cursor", None)
    data = getattr(cursor, "_data", None)
    if data is None or not all(hasattr(stream, name) for name in _STATE) or not hasattr(cursor, "alive"):
        return None
    if most >= len(data):
        docs = list(data)
        data.clear()
    else:
        docs = [data.popleft() for _ in range(most)]
    if not docs:
        return docs
    token = docs[-1]["_id"]
    if not data and cursor._post_batch_resume_token:
        token = cursor._post_batch_resume_token
    stream._uses_start_after = False
    stream._uses_resume_after = True
    stream._resume_token = token
    stream._start_at_operation_time = None
    if not cursor.alive:
        stream._closed = True
    return docs


#: the change stream's state that try_next keeps, and _take_buffered keeps as it does (pymongo 4.x)
_STATE = ("_resume_token", "_uses_start_after", "_uses_resume_after", "_start_at_operation_time", "_closed")


def _drained(stream: AsyncChangeStream[Any]) -> bool:
    """Has the driver handed out every event of the server's last reply? (the next one needs a round
    trip). Unknown on a driver without the internal buffer: then batches close by size or on an empty
    reply, as before."""
    data = getattr(getattr(stream, "_cursor", None), "_data", None)
    return data is not None and len(data) == 0


def check_in_oplog(start: Position, oldest: Timestamp | None) -> None:
    """Refuse a start from a time (no token) older than the oplog's ``oldest`` entry (None: not known): a
    server may start such a stream silently from that entry, a gap mongod would refuse."""
    time = start.cluster_time
    if start.resume_token is None and time is not None and oldest is not None and time < oldest:
        raise history_lost(start)


def _history_error(exc: OperationFailure, start: Position | None) -> HistoryLost | None:
    if exc.code not in HISTORY_LOST_CODES and "resume point may no longer be in the oplog" not in str(exc):
        return None
    return history_lost(start)


def history_lost(start: Position | None) -> HistoryLost:
    """The checkpoint's position left the source's oplog: what to do about it."""
    where = ""
    if start is not None and start.cluster_time is not None:
        where = f" (saved position {start.cluster_time.as_datetime():%Y-%m-%d %H:%M:%S} UTC)"
    return HistoryLost(
        f"the checkpoint's position{where} is no longer in the source's oplog: the events since then are "
        "gone. Copy the data again with `mcdc sync --snapshot always` (or, to follow the source, "
        "`mcdc tail --on-history-lost resnapshot`), and enlarge the oplog (replSetResizeOplog) so the next "
        "gap fits"
    )
