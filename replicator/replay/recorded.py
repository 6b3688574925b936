"""What a checkpoint remembers of the options that decide what the target holds, and what a later run
with other options must do about it. Pure: no I/O.

A checkpoint's position says "the target holds the selected namespaces, as renamed and edited by the
field rules, up to here". A run with another selection, renames or field rules on the same checkpoint
would otherwise go on silently from there:

* a **widened** selection: the namespaces it adds were never copied; their events from the checkpoint on
  would make partial collections. They are copied from the source first (as a collection renamed into
  the selection is; Debezium's incremental snapshot is the anchor), and named in the log;
* a **narrowed** selection: the namespaces it leaves are no longer followed (their target copies stay
  as they are, never ours to drop); said once;
* a changed ``--rename`` or field rule: the target's existing copies were written under the old rules,
  and later events would land beside them. Refused, with the change and the fix (``--snapshot always``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from replicator.events import Namespace
from replicator.settings.selection import Selection


@dataclass(frozen=True)
class Recorded:
    """The selection, renames and field rules a checkpoint's target copies were made with."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    rename: tuple[str, ...] = ()
    field_exclude: tuple[str, ...] = ()
    field_rename: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Any) -> Recorded:
        """From a run's Settings."""
        return cls(*(tuple(getattr(settings, name)) for name in _FIELDS))

    def to_json(self) -> dict[str, list[str]]:
        return {name.replace("_", "-"): list(getattr(self, name)) for name in _FIELDS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recorded:
        return cls(*(tuple(str(v) for v in data.get(name.replace("_", "-")) or ()) for name in _FIELDS))

    @property
    def selection(self) -> Selection:
        return Selection.from_patterns(self.include, self.exclude)


_FIELDS = ("include", "exclude", "rename", "field_exclude", "field_rename")
#: the options whose change cannot be followed without a new snapshot, with their flags
_REWRITING = {"rename": "--rename", "field_exclude": "--field-exclude", "field_rename": "--field-rename"}


def refused_change(saved: Recorded, now: Recorded, checkpoint: str) -> str | None:
    """Why this run cannot go on from a checkpoint written with ``saved``: a rename or field rule differs
    (the order of rules does not matter). None when it can."""
    for name, flag in _REWRITING.items():
        before, after = sorted(getattr(saved, name)), sorted(getattr(now, name))
        if before != after:
            return (
                f"checkpoint {checkpoint} was written with {_shown(flag, before)}, this run has "
                f"{_shown(flag, after)}: the target's copies follow the old rules. Run with --snapshot always "
                f"to copy again under the new ones (with --drop-target where the target holds data), or use "
                f"the old {flag}"
            )
    return None


def _shown(flag: str, rules: list[str]) -> str:
    return " ".join(f"{flag} {rule}" for rule in rules) if rules else f"no {flag}"


def widened(saved: Recorded, now: Selection, namespaces: Iterable[Namespace]) -> list[Namespace]:
    """The source's namespaces this run selects and the checkpoint's selection did not."""
    before = saved.selection
    return sorted((ns for ns in namespaces if now(ns) and not before(ns)), key=str)


def narrowed(saved: Recorded, now: Selection, namespaces: Iterable[Namespace]) -> list[Namespace]:
    """The source's namespaces the checkpoint's selection had and this run's leaves out."""
    before = saved.selection
    return sorted((ns for ns in namespaces if before(ns) and not now(ns)), key=str)
