"""Batch assembly for a change stream, with no I/O: raw change documents in, Batches out.

Whoever reads the stream (the asyncio reader today, a Spark task's synchronous change stream next) feeds
a BatchAssembler each raw document and each "the server had nothing" answer; the assembler reassembles
split events, skips oversize markers, normalizes, cuts batches (never inside a multi-document transaction)
and decides which position each batch may acknowledge.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import bson
from bson.timestamp import Timestamp

from replicator.bsonkit import rawbson
from replicator.bsonkit.rawbson import RawDocument, raw_of, ts_parts
from replicator.checkpoint.store import advance
from replicator.events import ChangeEvent, Position
from replicator.events.normalize import from_top_level, normalize_change
from replicator.events.positions import Numbering

#: Set by the server-side stage that trims an event over 16 MB (--oversize skip without split support).
OVERSIZE_FLAG = "mcdcOversize"
log = logging.getLogger("mcdc.source")


@dataclass(frozen=True)
class Batch:
    """Events read together, and the stream position after them (the post-batch resume token when the
    server sent no event, so an idle stream's checkpoint still moves)."""

    events: list[ChangeEvent]
    position: Position
    caught_up: bool  # the server had nothing more when this batch ended
    # when merging several streams (track_time): the local monotonic time the batch was read, and for
    # an empty batch, when the poll that found nothing started
    read_at: float = 0.0
    idle_since: float | None = None
    # merged shard streams: each shard's position after this batch (the checkpoint's per-shard entries)
    shard_positions: Mapping[str, Position] | None = None


def joined(first: Batch, then: Batch, most: int) -> Batch | None:
    """Two consecutive batches as one, when their events together are at most ``most`` (each holds whole
    transactions, so their concatenation does too); the state is the later one's, the position as
    :func:`carried` has it. None when they are too many. Pure: the replay joins batches that wait in its
    read-ahead queue while the sink is slower than the stream, so a sink pays its per-write cost (a commit,
    a round trip) once for them."""
    if len(first.events) + len(then.events) > most:
        return None
    return carried(first, replace(then, events=[*first.events, *then.events]))


def carried(first: Batch, then: Batch) -> Batch:
    """``then`` as acknowledged together with ``first`` before it: where ``then`` brings no cluster time (an
    idle poll's post-batch token), the position keeps ``first``'s (its last event's), as each shard's does."""
    shards = dict(first.shard_positions or {})
    for name, position in (then.shard_positions or {}).items():
        shards[name] = advance(shards.get(name), position)
    return replace(then, position=advance(first.position, then.position), shard_positions=shards if shards else None)


class Fragments:
    """The fragments of a change event split by $changeStreamSplitLargeEvent, until its last one is in.

    Belongs to the open stream, not to one run of batches: a run may end between two fragments, and
    the next run on the same stream must still see the whole event."""

    def __init__(self) -> None:
        self._parts: list[Mapping[str, Any]] = []

    def add(self, raw: Mapping[str, Any]) -> dict[str, Any] | None:
        """Keep one fragment; the whole event once this was the last one, else None."""
        self._parts.append(raw)
        if raw["splitEvent"]["fragment"] < raw["splitEvent"]["of"]:
            return None
        merged = merge_fragments(self._parts)
        self._parts = []
        return merged

    def __bool__(self) -> bool:
        return bool(self._parts)


class BatchAssembler:
    """Cuts one run of a change stream into Batches, up to ``until`` (None: forever).

    Feed it with :meth:`add` (a raw change document) and :meth:`nothing_more` (the server had nothing);
    each returns True when a batch is ready for :meth:`take`. After a take, :attr:`finished` says the run
    has passed ``until``. A batch never ends inside a multi-document transaction, and the first event
    past a cut is held back for the next batch (or, past ``until``, left unread for the next run)."""

    def __init__(
        self,
        *,
        batch_size: int,
        until: Timestamp | None = None,
        rs: str | None = None,
        fragments: Fragments | None = None,
        numbering: Numbering | None = None,
        shard: str | None = None,
        cap: Timestamp | None = None,
    ) -> None:
        """``rs``: the replica set's name, stamped on every event. ``fragments``: the stream's split-event
        buffer, and ``numbering`` its count of events within a cluster time, when they outlive this run
        (new ones otherwise). ``shard``: the stream's name in a merge of shards (None for a replica set),
        stamped on every event's position. ``cap``: the latest time an idle batch's position may claim (the
        end of the stream's stretch under one $match: see changestream.ChangeStreamReader)."""
        self._batch_size = batch_size
        self._cap = cap
        self._until = until
        self._until_parts = ts_parts(until) if until is not None else (0, 0)
        self._rs = rs
        self._shard = shard
        self._fragments = fragments if fragments is not None else Fragments()
        self._numbering = numbering if numbering is not None else Numbering()
        self._events: list[ChangeEvent] = []
        self._held: ChangeEvent | None = None
        self._caught_up = False
        self._idle = False  # the last poll found nothing, and the server had nothing more (see nothing_more)
        self._passed = False
        self._token: Any = None
        self.finished = False

    @property
    def empty(self) -> bool:
        """No event in the batch being assembled (a poll now may find the stream idle)."""
        return not self._events

    def add(self, raw: Mapping[str, Any], *, drained: bool = False) -> bool:
        """Take one raw change document; True when the batch is ready. ``drained``: the reader holds no
        more of the server's last reply, so a batch may close here rather than wait until it is full
        (under a steady trickle that wait is the lag)."""
        event = self._event(raw)
        if event is None:
            return False
        events = self._events
        ts = event.position.cluster_time if event.position is not None else None
        if self._until is not None and ts is not None and ts_parts(ts) > self._until_parts:
            if events and events[-1].txn is not None and event.txn == events[-1].txn:
                events.append(event)  # finish the transaction we are in
                return False
            self._passed = True
            self._held = event
            return True
        if len(events) >= self._batch_size and (events[-1].txn is None or event.txn != events[-1].txn):
            self._held = event
            return True
        events.append(event)
        return event.txn is None and drained

    def _event(self, raw: Mapping[str, Any]) -> ChangeEvent | None:
        """The event of one change document; None for a fragment of a split event (until its last), an
        oversize event skipped, or an event mcdc does not replay. A document that arrived as bytes has its
        top level decoded once (rawbson.top_level), a whole event marked as fragment 1 of 1 included. Every
        whole event is numbered within its cluster time, skipped ones too (so is every event the Spark data
        source reads: both count the same events)."""
        data = raw_of(raw) if type(raw) is RawDocument else getattr(raw, "raw", None)
        top = rawbson.top_level(data) if type(data) is bytes else None
        if top is not None:
            split = top.get("splitEvent")
            if (split is None or (not self._fragments and split.start == _ONE_OF_ONE)) and OVERSIZE_FLAG not in top:
                return from_top_level(top, self._rs, self._numbering.next(top.get("clusterTime")), self._shard)
        if "splitEvent" in raw:
            whole = self._fragments.add(raw)
            if whole is None:
                return None
            raw = whole
        index = self._numbering.next(raw.get("clusterTime"))
        if raw.get(OVERSIZE_FLAG):
            log.warning(
                "skipped a change event over 16 MB (--oversize skip): %s on %s.%s, %s",
                raw.get("operationType"), raw["ns"].get("db"), raw["ns"].get("coll"), raw.get("documentKey"),
            )  # fmt: skip
            return None
        return normalize_change(raw, self._rs, index, self._shard)

    def nothing_more(self, resume_token: Any, *, settled: bool = True) -> bool:
        """The server had no event; ``resume_token`` is the stream's post-batch token. True when the batch
        is ready: it holds events, or the stream has reached ``until``.

        ``settled``: the server has scanned all it holds (for a stream filtered on the server, a poll that
        found nothing may have stopped in the middle of a stretch it filters out: settled once a poll
        leaves the token where the previous one did). Unsettled, a poll is never idle, and a token whose
        time cannot be read has not reached ``until``."""
        token_time = token_timestamp(resume_token)
        # a token we can read must have reached `until`; one we cannot read means "now", once settled
        if token_time is None:
            self._caught_up = settled
        else:
            self._caught_up = self._until is None or token_time >= self._until
        self._idle = self._caught_up and settled
        self._token = resume_token
        return self._caught_up or bool(self._events)

    def take(self, *, read_at: float = 0.0, poll_started: float | None = None) -> Batch:
        """The batch assembled so far; the event held back starts the next one. ``read_at``: the local
        time now; ``poll_started``: when the last poll began (an idle batch's ``idle_since``)."""
        events = self._events
        if events:
            position = events[-1].position or Position()
        elif self._held is None and not self._fragments:
            # idle: the post-batch token, and its time where the token says it (MongoDB's KeyString)
            at = token_timestamp(self._token)
            if at is not None and self._cap is not None and at > self._cap:
                at = self._cap
            position = Position(resume_token=plain_token(self._token), cluster_time=at)
        else:
            # the stream's token is already past an event read but not yielded (held for the next
            # batch or run, or a fragment of a split event): acknowledging it would skip that event
            position = Position()
        idle_since = poll_started if self._idle and not events else None
        batch = Batch(
            events=events, position=position, caught_up=self._caught_up, read_at=read_at, idle_since=idle_since
        )
        self.finished = self._until is not None and (self._passed or self._caught_up)
        self._events = [self._held] if self._held is not None else []
        self._held = None
        self._caught_up = self._idle = False
        return batch


#: ``{fragment: 1, of: 1}`` as the server writes it (two int32s): a whole event (a server may mark every
#: event so); any other splitEvent goes the careful way
_ONE_OF_ONE = bson.encode({"fragment": 1, "of": 1})


def merge_fragments(fragments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One change event from all its $changeStreamSplitLargeEvent fragments; the last fragment's _id is
    the event's resume token."""
    merged: dict[str, Any] = {}
    for fragment in fragments:
        merged.update((k, fragment[k]) for k in fragment if k != "splitEvent")
    return merged


def token_timestamp(token: Any) -> Timestamp | None:
    """The cluster time inside a MongoDB resume token (KeyString: 0x82 then seconds and increment as
    big-endian uint32), or None when the token is in another format."""
    data = token.get("_data") if token is not None else None
    if not isinstance(data, str) or len(data) < 18 or not data.startswith("82"):
        return None
    try:
        return Timestamp(int(data[2:10], 16), int(data[10:18], 16))
    except ValueError:
        return None


def plain_token(token: Any) -> Any:
    """A resume token as a plain mapping (the driver may hand out a RawBSONDocument)."""
    if token is None:
        return None
    return dict(token.items()) if hasattr(token, "raw") else token
