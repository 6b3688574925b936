"""The embedded verifier's pure parts (``mcdc tail --verify``): its re-check list, the replay clock it
waits on, and the state it keeps in the checkpoint.

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
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.timestamp import Timestamp

from .events import ChangeEvent, Namespace, ts_from_json, ts_to_json
from .extjson import to_json_value
from .migration import Verification
from .rawbson import DICT_CODEC, RAW_CODEC

DOC, SCHEMA, COUNT = "document", "schema", "count"
#: verdicts of a round
RESOLVED, MISMATCH, AGAIN = "resolved", "mismatch", "again"
#: quiet rounds in a row that must find a difference before it is a mismatch
CONFIRMING_ROUNDS = 2
#: the longest wait between two rounds of an entry whose document keeps changing
MAX_WAIT_S = 10.0
#: mismatches kept by name per pass (the count goes on past it)
KEPT_MISMATCHES = 1000


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


@dataclass
class Mismatches:
    """Persistent mismatches of one pass: the first KEPT_MISMATCHES by name, and how many in all."""

    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # ident text -> {"namespace", "_id"|"detail"}
    count: int = 0

    def has(self, entry: Entry) -> bool:
        return _name(entry) in self.kept

    def add(self, entry: Entry, detail: str = "") -> bool:
        """Record one; False when it was recorded in this pass already."""
        name = _name(entry)
        if name in self.kept:
            return False
        self.count += 1
        if len(self.kept) < KEPT_MISMATCHES:
            item: dict[str, Any] = {"namespace": str(entry.dst)}
            if entry.key is not None:
                item["_id"] = loads_id(entry.key)
            if detail:
                item["detail"] = detail
            self.kept[name] = item
        return True

    def union_count(self, other: Mismatches) -> int:
        """How many differ in this pass or ``other`` (one found in both counts once, when kept by name)."""
        return self.count + other.count - len(self.kept.keys() & other.kept.keys())

    def to_json(self) -> dict[str, Any]:
        return {"kept": self.kept, "count": self.count}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Mismatches:
        data = data or {}
        return cls({str(k): dict(v) for k, v in (data.get("kept") or {}).items()}, int(data.get("count", 0)))


def _name(entry: Entry) -> str:
    return f"{entry.dst}|{entry.kind}|{entry.key.hex() if entry.key else ''}"


def loads_id(key: bytes) -> Any:
    """A :func:`key_of`'s value as canonical extended JSON (``{"$numberInt": "1"}``, ...)."""
    return to_json_value(bson.decode(key, codec_options=DICT_CODEC)["_id"])


def _ns_json(ns: Namespace) -> list[str | None]:
    return [ns.db, ns.coll]


def _ns_from_json(data: Any) -> Namespace:
    db, coll = data
    return Namespace(str(db), None if coll is None else str(coll))


@dataclass
class SweepState:
    """Where the sweeps are, as kept in the checkpoint (``Checkpoint.verifier``): a restarted tail goes
    on with the current pass at the range after the last one compared.

    ``done``: source namespaces compared in this pass; ``current``/``plan``/``parts_done``: the namespace
    being compared, its ranges (Partition JSON, fixed when it began) and how many of them are compared.
    ``unchecked``: differences not re-checked in this pass (the list was full); they keep it from
    being clean."""

    passes: int = 0
    clean_passes: int = 0
    pass_started_at: float | None = None
    done: list[str] = field(default_factory=list)
    current: str | None = None
    plan: list[dict[str, Any]] = field(default_factory=list)
    parts_done: int = 0
    scanned: int = 0
    total_scanned: int = 0
    unchecked: int = 0
    found: Mismatches = field(default_factory=Mismatches)  # this pass's
    last: Mismatches = field(default_factory=Mismatches)  # the last completed pass's
    recheck: list[dict[str, Any]] = field(default_factory=list)
    extra_checked: bool = False  # the pass looked for namespaces only on the target (its last step)
    pass_from: Timestamp | None = None  # the source's time when the pass under way began
    #: the source's time when the last pass began, if it was clean: every document unchanged since then
    #: is proven identical (cutover compares only the others); None after a pass that was not
    proven_since: Timestamp | None = None
    last_pass_at: float | None = None  # when the last pass completed (wall time)

    @property
    def mismatches(self) -> int:
        return self.found.union_count(self.last) + self.unchecked

    def first_mismatches(self, n: int) -> list[dict[str, Any]]:
        seen = {**self.found.kept, **self.last.kept}
        return list(seen.values())[:n]

    def verification(self, phase: str, rechecking: int, *, shown: int = 5) -> Verification:
        """What /progress and status show of it."""
        return Verification(
            phase=phase,
            scanned_documents=self.total_scanned,
            mismatches=self.mismatches,
            rechecking=rechecking,
            passes=self.passes,
            clean_passes=self.clean_passes,
            first_mismatches=self.first_mismatches(shown),
            pass_scanned=self.scanned,
            pass_namespaces=len(self.done),
            pass_ranges=self.parts_done,
        )

    def pass_completed(self, at: float) -> bool:
        """The pass is over (its re-checks too): True when it was clean."""
        clean = self.found.count == 0 and self.unchecked == 0
        self.proven_since, self.pass_from = (self.pass_from if clean else None), None
        self.passes += 1
        self.clean_passes = self.clean_passes + 1 if clean else 0
        self.last, self.found = self.found, Mismatches()
        self.done, self.current, self.plan, self.parts_done, self.extra_checked = [], None, [], 0, False
        self.scanned, self.unchecked = 0, 0
        self.pass_started_at, self.last_pass_at = None, at
        return clean

    def to_json(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "clean_passes": self.clean_passes,
            "pass_started_at": self.pass_started_at,
            "last_pass_at": self.last_pass_at,
            "done": list(self.done),
            "current": self.current,
            "plan": list(self.plan),
            "parts_done": self.parts_done,
            "scanned": self.scanned,
            "total_scanned": self.total_scanned,
            "unchecked": self.unchecked,
            "found": self.found.to_json(),
            "last": self.last.to_json(),
            "recheck": list(self.recheck),
            "extra_checked": self.extra_checked,
            "pass_from": ts_to_json(self.pass_from),
            "proven_since": ts_to_json(self.proven_since),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SweepState:
        data = data or {}
        return cls(
            passes=int(data.get("passes", 0)),
            clean_passes=int(data.get("clean_passes", 0)),
            pass_started_at=data.get("pass_started_at"),
            last_pass_at=data.get("last_pass_at"),
            done=[str(n) for n in data.get("done") or []],
            current=data.get("current"),
            plan=[dict(p) for p in data.get("plan") or []],
            parts_done=int(data.get("parts_done", 0)),
            scanned=int(data.get("scanned", 0)),
            total_scanned=int(data.get("total_scanned", 0)),
            unchecked=int(data.get("unchecked", 0)),
            found=Mismatches.from_json(data.get("found")),
            last=Mismatches.from_json(data.get("last")),
            recheck=[dict(e) for e in data.get("recheck") or []],
            extra_checked=bool(data.get("extra_checked", False)),
            pass_from=ts_from_json(data.get("pass_from")),
            proven_since=ts_from_json(data.get("proven_since")),
        )


def verification_of(saved: Mapping[str, Any]) -> Verification:
    """A checkpoint's verifier state as /progress shows it when no tail runs (``mcdc status``)."""
    state = SweepState.from_json(saved)
    return state.verification("stopped", len(state.recheck))
