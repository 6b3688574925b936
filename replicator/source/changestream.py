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

from replicator.errors import ConfigError
from replicator.events import Position
from replicator.events.positions import Numbering
from replicator.observe.tally import format_ts
from replicator.settings.stream_match import Match, StreamFilter, next_tick
from replicator.source.batching import OVERSIZE_FLAG, BatchAssembler, Fragments, merge_fragments, plain_token
from replicator.source.batching import (
    Batch as Batch,  # re-exported, with token_timestamp: the reader's callers import them here
)
from replicator.source.batching import token_timestamp as token_timestamp
from replicator.source.connection import DICT_CODEC, Client
from replicator.source.pump import Pump, stop_pumps
from replicator.source.stream_errors import (
    _TOO_LARGE_CODES,
    OversizePlan,
    after_refusal,
    check_in_oplog,
    reopen_options,
)
from replicator.source.stream_errors import _history_error as _history_error  # re-exported

# the names the Spark data source's synchronous reader (spark_datasource/changes.py) imports from here
_OVERSIZE_FLAG = OVERSIZE_FLAG
_assemble = merge_fragments
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


class ChangeStreamReader:
    """Reads the whole deployment's change stream (all databases but admin, local and config), or with
    ``database`` that one database's, filtered on the server by the selection's ``$match``
    (settings/stream_match.py): what the selection cannot use is never read.

    ``stream_filter`` says which match reads which stretch of the stream: a stream opened in an earlier
    stretch reads it with that stretch's match up to its last cluster time, then goes on with the next one
    from just after that time (opened there by time). A position read in an earlier stretch never claims a
    time past its end, so a position is always in the stretch it was read in.

    MongoDB leaves admin, local and config out of a deployment's change stream, so the match does not name
    them; should a server send such an event anyway, the selection (filters.py) drops it.

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
        stream_filter: StreamFilter | None = None,
    ) -> None:
        """``track_time``: stamp batches with local read and poll times (``Batch.read_at`` and
        ``Batch.idle_since``), which merging several streams needs. ``oversize``: what to do with a
        change event over 16 MB where the server cannot split it ("fail" or "skip", logged). ``pre_images``:
        fullDocumentBeforeChange ("off", "whenAvailable" or "required"). ``rs``: the replica set's name,
        stamped on every event. ``shard``: the stream's name among a cluster's shards (None for a replica
        set), stamped on every event's position. ``database``: read that database's stream, not the
        deployment's. ``stream_filter``: the stream's matches (see the class's docs; None: unfiltered)."""
        self.client = client
        self.stream_filter = stream_filter or StreamFilter()
        self._match: Match | None = None  # the open stream's $match
        self._switch_at: Timestamp | None = None  # the last cluster time it reads (None: to the end)
        self._until: Timestamp | None = None  # where the open stream's bounded read stops (see open)
        self._idle_token: Any = None  # the post-batch token of the last poll that found nothing
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

    async def open(self, start: Position, *, until: Timestamp | None = None) -> None:
        """Open the stream at ``start``; ``until``: the time a bounded read (batches(until=...)) stops at,
        which the server's filter lets through the first event after, so that such a read ends even while
        the server scans what the filter leaves out (an event later than ``until`` is never handed out)."""
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
        now = start.resume_token is None and start.cluster_time is None
        self._match, self._switch_at = self.stream_filter.segment(start.cluster_time, now=now)
        self._until = until
        self._idle_token = None
        await self._watch(kwargs, start)

    async def _watch(self, kwargs: dict[str, Any], start: Position | None) -> AsyncChangeStream[Any]:
        while True:
            try:
                watched = self.client if self._database is None else self.client[self._database]
                match = self._server_match()
                stages = [{"$match": match}] if match is not None else []  # before any split
                self._stream = await watched.watch([*stages, *self._plan.stages()], **kwargs)
                return self._stream
            except OperationFailure as exc:
                after_refusal(self._plan, exc, kwargs, start)

    def _server_match(self) -> Match | None:
        """The open stream's $match on the server: its stretch's, and every event after the end of a bounded
        read (its stretch's end, or ``until``): the first one tells the read it has passed it."""
        if self._match is None:
            return None
        ends = [t for t in (self._switch_at, self._until) if t is not None]
        if not ends:
            return self._match
        after = {"clusterTime": {"$gt": min(ends)}}
        if list(self._match) == ["$or"]:
            return {"$or": [*self._match["$or"], after]}
        return {"$or": [self._match, after]}

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
        while True:
            switch_at = self._switch_at
            switching = switch_at is not None and (until is None or switch_at < until)
            async with contextlib.aclosing(self._read(switch_at if switching else until, switch_at)) as batches:
                async for batch in batches:
                    yield batch
            if not switching:
                return
            assert switch_at is not None
            log.info("the stream's match changes after %s: reading on with the new one", format_ts(switch_at))
            await self.open(Position(cluster_time=next_tick(switch_at)), until=self._until)

    async def _read(self, until: Timestamp | None, cap: Timestamp | None) -> AsyncGenerator[Batch, None]:
        """:meth:`batches` with the open stream's match, up to ``until``; an idle batch's position claims no
        time past ``cap`` (the end of the match's stretch)."""
        if self._reader is None:
            self._reader = Pump(self._read_replies(), READ_AHEAD)
        reader = self._reader
        assembler = BatchAssembler(
            batch_size=self._batch_size, until=until, rs=self._rs, fragments=self._fragments,
            numbering=self._numbering, shard=self._shard, cap=cap,
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
                        # an empty poll of an earlier stretch's match says nothing of the next one's events
                        if self._track_time and assembler.empty and cap is None:
                            poll_started = reply.poll_started
                        # filtered, the server may answer before it scanned all it holds: not idle unless
                        # the token stayed where the previous empty poll left it
                        settled = self._match is None or (reply.token is not None and reply.token == self._idle_token)
                        self._idle_token = reply.token
                        ready = assembler.nothing_more(reply.token, settled=settled)
                        continue
                    self._idle_token = None
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
