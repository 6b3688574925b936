"""The change stream's ``$match`` for a selection, and which ``$match`` read which stretch of a checkpoint's
stream. Pure: no I/O.

The source pays for the selection only: the stream is filtered on the server, so an event the selection
cannot use is never read, transformed or looked up (MongoDB 5.1 and later rewrite a ``$match`` on ``ns``,
``to`` and ``operationType`` into the oplog scan; fullDocument's lookup comes after it). The match is a
superset of what the selection keeps, never narrower: the selection still filters what comes through.
It lets through

* every event of a selected namespace (documents, and its DDL: create, drop, collMod, index DDL, a rename
  out of the selection);
* a rename whose ``to`` is selected (into the selection);
* ``dropDatabase`` of a database that may hold a selected namespace;
* ``invalidate`` (a database's stream ends with one when the database is dropped).

A pattern that names its namespace literally (``shop\\.orders``) selects that namespace on the server; one
that names only its database literally (``shop\\.orders_.*``) selects the database; a pattern that names no
database literally (``.*\\.orders``), or no ``--include`` at all, leaves the stream unfiltered.

An event's place among the events at its cluster time (``n``, events/positions.py) is counted among the
events the stream lets through, so a checkpoint's positions belong to the match they were read with.
:class:`StreamFilter` keeps that straight when the selection changes: the stream up to the source's time
when the new match was first used is read with the old one, and from just after it with the new one, so
every cluster time is read with one match, the same whichever saved checkpoint the stream is read from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp

from replicator.events import ts_from_json, ts_to_json
from replicator.settings.selection import Image, Selection, target_databases

Match = dict[str, Any]


def change_match(selection: Selection) -> Match | None:
    """The ``$match`` of the change stream that ``selection`` reads (see the module's docs); None where it
    cannot be narrowed on the server."""
    spots = _spots(selection)
    if spots is None:
        return None
    literal: dict[str, list[str]] = {}
    whole: set[str] = set()
    for db, coll in spots:
        if coll is None:
            whole.add(db)
        else:
            literal.setdefault(db, []).append(coll)
    for db in whole:
        literal.pop(db, None)
    clauses: list[Match] = []
    renames: list[Match] = []
    for side, out in (("ns", clauses), ("to", renames)):
        out.extend({f"{side}.db": db} for db in sorted(whole))
        for db, colls in sorted(literal.items()):
            names = sorted(set(colls))
            out.append({f"{side}.db": db, f"{side}.coll": names[0] if len(names) == 1 else {"$in": names}})
    databases = sorted(whole | set(literal))
    if renames:
        clauses.append({"operationType": "rename", "$or": renames})
    if databases:
        clauses.append({"operationType": "dropDatabase", "ns.db": {"$in": databases}})
    clauses.append({"operationType": "invalidate"})
    return {"$or": clauses}


def _spots(selection: Selection) -> list[tuple[str, str | None]] | None:
    """What the selection may hold, as (database, collection) with None for a whole database; None when
    that cannot be said without reading the catalog."""
    if isinstance(selection, Image):  # a way back: the databases its migration wrote into
        named = target_databases(selection.of.selection, selection.of.renamer)
        dbs = named.databases() if named.include else None
        return None if dbs is None else [(db, None) for db in dbs]
    if not selection.include:
        return None
    spots: list[tuple[str, str | None]] = []
    for pattern in selection.include:
        one = Selection((pattern,), selection.exclude)
        dbs = one.databases()
        if dbs is None:
            return None
        names = one.named()
        if names:
            spots.extend((ns.db, ns.coll) for ns in names)
        else:
            spots.extend((db, None) for db in dbs)
    return spots


def next_tick(ts: Timestamp) -> Timestamp:
    """The cluster time just after ``ts`` (startAtOperationTime includes its own time)."""
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


@dataclass(frozen=True)
class StreamFilter:
    """Which ``$match`` reads which stretch of a checkpoint's stream: ``before`` holds the earlier matches,
    each with the last cluster time it reads (oldest first), and ``match`` reads everything after them.
    None as a match: the stream unfiltered (as every mcdc before this record read it)."""

    match: Match | None = None
    before: tuple[tuple[Match | None, Timestamp], ...] = ()

    def segment(self, at: Timestamp | None, *, now: bool = False) -> tuple[Match | None, Timestamp | None]:
        """The match a stream opened at cluster time ``at`` reads with, and the last cluster time it reads
        with it (None: to the end). A position without a time is at the first stretch, unless it is
        ``now`` (a stream opened at the source's present time, past every stretch)."""
        if not now:
            for match, until in self.before:
                if at is None or at <= until:
                    return match, until
        return self.match, None

    def toward(self, wanted: Match | None, now: Timestamp) -> StreamFilter:
        """This filter once a run wants to read with ``wanted`` from now on: the stream up to ``now`` (the
        source's time, past anything any earlier run can have read) keeps its matches."""
        if wanted == self.match:
            return self
        return StreamFilter(wanted, (*self.before, (self.match, now)))

    def passed(self, times: Iterable[Timestamp | None]) -> StreamFilter:
        """Without the stretches that every stream position (``times``, a checkpoint's) has passed."""
        known = list(times)
        if not known or any(t is None for t in known):
            return self
        oldest = min(t for t in known if t is not None)
        kept = tuple((match, until) for match, until in self.before if until >= oldest)
        return self if len(kept) == len(self.before) else StreamFilter(self.match, kept)

    def to_json(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "before": [{"match": match, "until": ts_to_json(ts)} for match, ts in self.before],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamFilter:
        before = []
        for item in data.get("before") or ():
            until = ts_from_json(item.get("until"))
            if until is None:
                raise ValueError(f"a stretch of the stream's matches has no end: {item!r}")
            before.append((item.get("match"), until))
        return cls(data.get("match"), tuple(before))
