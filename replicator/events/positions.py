"""Every event's place in one total order, and marks of how far a destination got. Pure.

A cluster time alone does not order the stream: every event of one transaction shares one, a batched
multi-document write can too, and two shards can stamp the same one. So an event's position is

    (t, i, shard, n)

* ``t, i``: its cluster time;
* ``shard``: the stream that reported it, by the name mcdc's checkpoint gives it ("" for a replica set's
  one stream), so events of two shards at one cluster time come in a fixed order (by name);
* ``n``: its place among its stream's events at that cluster time (0, 1, ...), counted by mcdc as it reads
  the stream (:class:`Numbering`). The count starts again from the position a stream is opened at, which
  the checkpoint keeps with its index, so an event gets the same ``n`` whichever saved checkpoint the stream
  is read from, one inside a transaction included.

A snapshot's rows sit at the snapshot's read time with ``n = -1``: before every event at that time or later.

MongoDB's resume token holds the same information (a transaction's op index, and on a sharded cluster
mongos orders its merged stream by token), but its layout is internal to the server and has changed
between releases, and not every server that speaks the protocol writes it so; mcdc counts instead, which
only needs the stream itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bson.timestamp import Timestamp

from replicator.bsonkit.rawbson import ts_parts
from replicator.events import ChangeEvent, Position

#: ``n`` of a snapshot's rows: before any event of the same cluster time.
SNAPSHOT_INDEX = -1


class Seq(NamedTuple):
    """A position as a sort key (tuples order field by field); the data source's ``sequence`` column."""

    t: int
    i: int
    shard: str
    n: int

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "i": self.i, "shard": self.shard, "n": self.n}


def seq_of(position: Position | None) -> Seq | None:
    """The sort key of a position that has a cluster time (None for one without: a bare resume token)."""
    if position is None or position.cluster_time is None:
        return None
    ts = position.cluster_time
    return Seq(ts.time, ts.inc, position.shard or "", position.index if position.index is not None else 0)


def snapshot_position(at: Timestamp | None) -> Position | None:
    """The position of a snapshot's rows read after the source's time ``at``."""
    return None if at is None else Position(cluster_time=at, index=SNAPSHOT_INDEX)


class Numbering:
    """Numbers one stream's events within their cluster time (``n``), as they are read from ``start``.

    ``start`` is where the stream was opened: an event's position (the next event at its cluster time
    is the next index), or a time to start at (its events are numbered from 0)."""

    def __init__(self, start: Position | None = None) -> None:
        ts = start.cluster_time if start is not None else None
        # the time as its (time, inc), compared in C: Timestamp's == is a Python call, once an event
        self._ts: tuple[int, int] | None = ts_parts(ts) if ts is not None else None
        index = start.index if start is not None else None
        self._n = index if index is not None else -1

    def next(self, ts: Timestamp | None) -> int | None:
        """The index of the next event read, at cluster time ``ts``."""
        if ts is None:
            return None
        parts = ts_parts(ts)
        if parts == self._ts:
            self._n += 1
        else:
            self._ts, self._n = parts, 0
        return self._n


#: One stream's part of a mark: ``(t, i, n)`` of the last event a destination holds.
Stamp = tuple[int, int, int]
#: ``n`` of a mark written before positions had one (a cluster time only): it covered every event at that time.
WHOLE_TIME = 2**62


@dataclass(frozen=True)
class Mark:
    """How far a destination (a lake table) got in each stream: the events at or before a stream's stamp
    are in it. A committed batch covers a prefix of every stream it holds events of, whatever the order in
    which shards' events were merged, so one stamp per stream is exact. ``fallback``: an old mark of a
    cluster time alone, for streams without a stamp of their own."""

    stamps: Mapping[str, Stamp] = field(default_factory=dict)
    fallback: Stamp | None = None

    def stamp(self, shard: str) -> Stamp | None:
        return self.stamps.get(shard, self.fallback)

    def covers(self, event: ChangeEvent) -> bool:
        """Is the event in the destination already? (one without a cluster time never is)"""
        seq = seq_of(event.position)
        if seq is None:
            return False
        stamp = self.stamp(seq.shard)
        return stamp is not None and (seq.t, seq.i, seq.n) <= stamp

    def __bool__(self) -> bool:
        return bool(self.stamps) or self.fallback is not None


def advanced(events: Iterable[ChangeEvent]) -> Mark | None:
    """The stamps that writing ``events`` (in stream order) moves; None when none has a cluster time."""
    stamps: dict[str, Stamp] = {}
    for event in events:
        seq = seq_of(event.position)
        if seq is not None:
            stamp = (seq.t, seq.i, seq.n)
            if stamp > stamps.get(seq.shard, (-1, -1, -1)):
                stamps[seq.shard] = stamp
    return Mark(stamps) if stamps else None


def stamp_of(event: ChangeEvent) -> Mark | None:
    """The mark of one event (a DDL event applied alone)."""
    return advanced([event])
