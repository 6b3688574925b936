"""Spark's Auto CDC semantics as plain Python, for checking the rows mcdc gives it (pyspark 4.3's
Scd1BatchProcessor / Scd2BatchProcessor, read and run on these machines):

* SCD type 1: per key, the row with the greatest sequence wins; a delete removes the key (an upsert that
  ties with a delete wins, and an upsert older than a delete is dropped).
* SCD type 2: every upsert opens a version at its sequence (``start``); a version ends at the next row's
  sequence (``end``; None while current), a delete ends the current version and opens none; consecutive
  upserts whose tracked values are equal are one version; at one sequence, a delete beats an upsert, and
  of two upserts one (undefined which) is kept.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Row = Mapping[str, Any]


def scd1(rows: Iterable[Row], *, key: str = "key", sequence: str = "sequence", is_delete: Any = None) -> dict[Any, Row]:
    """The SCD type 1 table: key -> its last row (deleted keys left out)."""
    deleted = is_delete or (lambda row: row["op"] == "d")
    last: dict[Any, tuple[Any, bool, Row]] = {}
    for row in rows:
        seq = _order(row[sequence])
        have = last.get(row[key])
        # at one sequence an upsert beats a delete (the target's MERGE: delete only when strictly newer)
        if have is None or seq > have[0] or (seq == have[0] and have[1] and not deleted(row)):
            last[row[key]] = (seq, deleted(row), row)
    return {k: row for k, (_, gone, row) in last.items() if not gone}


@dataclass(frozen=True)
class Version:
    """One SCD type 2 row: the tracked values, from ``start`` to ``end`` (None: the current version)."""

    key: Hashable
    values: tuple[Any, ...]
    start: Any
    end: Any


def scd2(
    rows: Iterable[Row],
    tracked: tuple[str, ...],
    *,
    key: str = "key",
    sequence: str = "sequence",
    is_delete: Any = None,
) -> list[Version]:
    """The SCD type 2 table's rows."""
    deleted = is_delete or (lambda row: row["op"] == "d")
    by_key: dict[Any, dict[Any, Row]] = {}
    for row in rows:
        events = by_key.setdefault(row[key], {})
        seq = _order(row[sequence])
        if seq not in events or deleted(row):  # a delete beats an upsert at the same sequence
            events[seq] = row
    versions = []
    for k, events in by_key.items():
        current: tuple[tuple[Any, ...], Any] | None = None  # (values, start)
        for seq in sorted(events):
            row = events[seq]
            if deleted(row):
                if current is not None:
                    versions.append(Version(k, current[0], current[1], seq))
                current = None
                continue
            values = tuple(row[name] for name in tracked)
            if current is not None and current[0] == values:
                continue  # nothing tracked changed: the same version
            if current is not None:
                versions.append(Version(k, current[0], current[1], seq))
            current = (values, seq)
        if current is not None:
            versions.append(Version(k, current[0], current[1], None))
    return versions


def _order(value: Any) -> Any:
    """A sequence as something Python orders as Spark does (a struct field by field)."""
    if isinstance(value, Mapping):
        return tuple(_order(v) for v in value.values())
    if isinstance(value, list | tuple):
        return tuple(_order(v) for v in value)
    return value
