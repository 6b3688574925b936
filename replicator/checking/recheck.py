"""The embedded verifier's re-checks (``mcdc tail --verify``): its re-check list, and the replay clock it
waits on. Pure: no I/O (the state it keeps in the checkpoint is sweep_state.py's).

A difference a sweep finds may be the replay's lag, or a change made after the range was read. So it
goes onto the re-check list, and each entry goes through rounds until it has a verdict:

1. it is read on the source (a document, or a namespace's schema or count), and watched from then on;
2. once the replay has applied the source's writes up to that read (:meth:`ReplayClock.passed`), it is
   read on the target;
3. if the replay applied an event of that document, or DDL of its namespace, since step 1, the round
   proves nothing and another begins. Otherwise the two reads are of the same source state: equal, the
   entry is resolved; different in CONFIRMING_ROUNDS quiet rounds in a row, it is a persistent mismatch.

So a document that changes under writes is never reported, however often it changes, and a real
difference is reported after one quiet round.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bson
from bson.timestamp import Timestamp

from replicator.bsonkit.rawbson import RAW_CODEC
from replicator.events import ChangeEvent, Namespace

DOC, SCHEMA, COUNT = "document", "schema", "count"
#: verdicts of a round
RESOLVED, MISMATCH, AGAIN = "resolved", "mismatch", "again"
#: quiet rounds in a row that must find a difference before it is a mismatch
CONFIRMING_ROUNDS = 2
#: the longest wait between two rounds of an entry whose document keeps changing
MAX_WAIT_S = 10.0


#: BSON types whose value has a fixed size: double, ObjectId, bool, date, null, int32, timestamp, int64,
#: decimal128, minKey, maxKey
_FIXED = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16, 0xFF: 0, 0x7F: 0}
#: types led by an int32 length: what the value holds besides it (string: the length word; binary: it and
#: the subtype byte; document and array: the length counts itself)
_LENGTH_LED = {0x02: 4, 0x03: 0, 0x04: 0, 0x05: 5}


def raw_key(raw: bytes | memoryview) -> bytes | None:
    """:func:`key_of` of a raw document whose first field is ``_id`` (as servers store them), cut from its
    bytes without decoding it; None for another layout or type (decode it then)."""
    if bytes(raw[5:9]) != b"_id\x00":
        return None
    kind = raw[4]
    if kind in _FIXED:
        size = _FIXED[kind]
    elif kind in _LENGTH_LED:
        size = int.from_bytes(raw[9:13], "little", signed=True) + _LENGTH_LED[kind]
    else:
        return None
    element = bytes(raw[4 : 9 + size])  # type byte, "_id\0", value
    if size < 0 or len(element) != 5 + size:
        return None
    return (len(element) + 5).to_bytes(4, "little") + element + b"\x00"


def key_of(value: Any) -> bytes:
    """An ``_id`` value as the verifier keys it: ``{"_id": value}`` as BSON (type-exact)."""
    return bson.encode({"_id": value}, codec_options=RAW_CODEC)


class ReplayClock:
    """How far the replay has applied the source's writes, as the engines' acknowledgements say.

    ``applied``: cluster time of the last acknowledged event. ``caught_up_at``: a local monotonic time
    such that every write a stream poll begun then could see has been applied (an acknowledged empty
    poll). A read of the source at cluster time T that ended at local time M is passed once either
    reaches it."""

    def __init__(self) -> None:
        self.applied: Timestamp | None = None
        self.caught_up_at: float | None = None

    def acked(self, applied: Timestamp | None, *, idle_since: float | None = None) -> None:
        if applied is not None and (self.applied is None or applied > self.applied):
            self.applied = applied
        if idle_since is not None and (self.caught_up_at is None or idle_since > self.caught_up_at):
            self.caught_up_at = idle_since

    def passed(self, read_time: Timestamp, read_ended: float) -> bool:
        if self.applied is not None and self.applied >= read_time:
            return True
        return self.caught_up_at is not None and self.caught_up_at >= read_ended


@dataclass
class Entry:
    """One difference waiting for its verdict. ``key``: the document's :func:`key_of` (kind DOC), else
    None. A round in progress holds what the source read gave (``source``: a digest, a spec or a count;
    None when absent) and when the read was (``read_time`` on the source, ``read_ended`` locally)."""

    src: Namespace
    dst: Namespace
    kind: str
    key: bytes | None = None
    rounds: int = 0
    read: bool = False
    source: Any = None
    read_time: Timestamp | None = None
    read_ended: float = 0.0
    touched: bool = False
    not_before: float = 0.0  # a round that proved nothing: the next waits (local monotonic time)
    differed: int = 0  # quiet rounds in a row that found it different

    @property
    def ident(self) -> tuple[str, str, bytes | None]:
        return str(self.src), self.kind, self.key

    def reading(self) -> None:
        """Step 1 begins: watched from now on (before the read, so no event slips in between)."""
        self.touched = False
        self.read = False

    def read_source(self, source: Any, read_time: Timestamp, read_ended: float) -> None:
        """Step 1 done: what the source read gave, at source time ``read_time``, ended at ``read_ended``."""
        self.read, self.source, self.read_time, self.read_ended = True, source, read_time, read_ended
        self.rounds += 1

    def due(self, clock: ReplayClock) -> bool:
        """May the target be read (the replay passed the source read)?"""
        return self.read and self.read_time is not None and clock.passed(self.read_time, self.read_ended)

    def verdict(self, same: bool, now: float = 0.0) -> str:
        """Step 3, given whether the target read matched the source read: RESOLVED, MISMATCH, or AGAIN
        (the replay applied a change of it meanwhile: a new round, after a wait that doubles with each
        round up to MAX_WAIT_S, so a document that keeps changing costs few reads)."""
        if self.touched:
            self.read, self.differed = False, 0
            self.not_before = now + min(MAX_WAIT_S, 0.1 * 2 ** min(self.rounds, 10))
            return AGAIN
        if same:
            return RESOLVED
        self.differed += 1
        if self.differed < CONFIRMING_ROUNDS:  # once more, from a fresh source read, before saying so
            self.read = False
            return AGAIN
        return MISMATCH

    def ready(self, now: float) -> bool:
        """May a new round begin (the source be read)?"""
        return not self.read and now >= self.not_before

    def to_json(self) -> dict[str, Any]:  # a round in progress is not kept: it begins again after a restart
        out: dict[str, Any] = {"src": _ns_json(self.src), "dst": _ns_json(self.dst), "kind": self.kind}
        if self.key is not None:
            out["key"] = base64.b64encode(self.key).decode()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        key = data.get("key")
        return cls(
            _ns_from_json(data["src"]),
            _ns_from_json(data["dst"]),
            str(data["kind"]),
            base64.b64decode(key) if key is not None else None,
        )


class RecheckList:
    """The differences waiting for a verdict, at most ``capacity``; watches the replay's events for
    the documents and namespaces they name (:meth:`seen`)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: dict[tuple[str, str, bytes | None], Entry] = {}
        self._by_ns: dict[Namespace, dict[bytes | None, list[Entry]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Any:
        return iter(list(self._entries.values()))

    @property
    def room(self) -> int:
        return max(0, self.capacity - len(self._entries))

    def add(self, entry: Entry) -> bool:
        """Put ``entry`` on the list; False when it is full (an entry already there counts as added)."""
        if entry.ident in self._entries:
            return True
        if not self.room:
            return False
        self._entries[entry.ident] = entry
        self._by_ns.setdefault(entry.src, {}).setdefault(entry.key, []).append(entry)
        return True

    def remove(self, entry: Entry) -> None:
        self._entries.pop(entry.ident, None)
        keys = self._by_ns.get(entry.src, {})
        same = [e for e in keys.get(entry.key, []) if e is not entry]
        if same:
            keys[entry.key] = same
        else:
            keys.pop(entry.key, None)
        if not keys:
            self._by_ns.pop(entry.src, None)

    def seen(self, events: Sequence[ChangeEvent]) -> None:
        """The replay is about to apply ``events`` (as read from the source): rounds of what they touch
        prove nothing. Cheap when the list is empty or names none of their namespaces."""
        if not self._by_ns:
            return
        for event in events:
            for ns in (event.ns, event.to):
                if ns is None:
                    continue
                if event.op.is_ddl or ns.coll is None:
                    self.namespace_changed(ns)
                    continue
                keys = self._by_ns.get(ns)
                if keys is None:
                    continue
                for entry in keys.get(None, ()):  # a count changes with any document event
                    entry.touched = entry.touched or entry.kind == COUNT
                try:
                    key = key_of(event.document_key["_id"])
                except (ValueError, KeyError):
                    self.namespace_changed(ns)
                    continue
                for entry in keys.get(key, ()):
                    entry.touched = True

    def namespace_changed(self, ns: Namespace) -> None:
        """DDL, or a copy made again: every round of the namespace (a whole database's when ``ns`` names
        none) proves nothing."""
        for src, keys in self._by_ns.items():
            if src == ns or (ns.coll is None and src.db == ns.db):
                for entries in keys.values():
                    for entry in entries:
                        entry.touched = True

    def to_json(self) -> list[dict[str, Any]]:
        return [e.to_json() for e in self._entries.values()]

    def load(self, data: Iterable[Mapping[str, Any]]) -> None:
        for item in data:
            self.add(Entry.from_json(item))


def _ns_json(ns: Namespace) -> list[str | None]:
    return [ns.db, ns.coll]


def _ns_from_json(data: Any) -> Namespace:
    db, coll = data
    return Namespace(str(db), None if coll is None else str(coll))
