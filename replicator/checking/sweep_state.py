"""The embedded verifier's place, as kept in the checkpoint (``Checkpoint.verifier``): where the sweeps
are, and the mismatches of this pass and the last. Pure: no I/O (the re-check rounds are recheck.py's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import to_json_value
from replicator.bsonkit.rawbson import DICT_CODEC
from replicator.checking.recheck import Entry
from replicator.events import ts_from_json, ts_to_json
from replicator.observe.migration import Verification

#: mismatches kept by name per pass (the count goes on past it)
KEPT_MISMATCHES = 1000


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
    """A checkpoint's verifier state as /progress showed it where its run stopped (``mcdc status``): one
    vocabulary for both, the phase where the verifier stands (whether a run goes on is ``state``'s to say).
    Between passes ``idle``; in a pass ``scanning``, or ``rechecking`` once its last step was taken."""
    state = SweepState.from_json(saved)
    in_pass = state.pass_started_at is not None or state.current is not None or bool(state.done)
    phase = "idle" if not in_pass else "rechecking" if state.extra_checked else "scanning"
    return state.verification(phase, len(state.recheck))
