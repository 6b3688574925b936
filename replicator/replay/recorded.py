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

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from replicator.events import Namespace
from replicator.settings.filters import DocumentFilters, needs_lookup
from replicator.settings.guard import TargetGuard
from replicator.settings.selection import Image, Renamer, Scope, Selection

S = TypeVar("S")


@dataclass(frozen=True)
class Recorded:
    """The selection, renames and field rules a checkpoint's target copies were made with.

    ``image_of``: in the checkpoint of a way back (written by ``mcdc cutover``), the migration it reverses,
    when that migration renamed namespaces: the way back then selects what that migration wrote (an
    :class:`~replicator.settings.selection.Image`), which no ``--include`` pattern can say in general."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    rename: tuple[str, ...] = ()
    field_exclude: tuple[str, ...] = ()
    field_rename: tuple[str, ...] = ()
    filter: tuple[str, ...] = ()
    image_of: Recorded | None = None
    #: a way back's: the target's documents outside ``filter`` are not its own (the migration did not copy
    #: them), nor are these fields (``db.coll.path``, by the target's names): see settings.guard
    guard: bool = False
    keep: tuple[str, ...] = ()
    #: which side's names ``filter``'s patterns name: "source" (a migration's own), or "target" (the way
    #: back of a migration that renamed collections names them as the migration's source did)
    filter_names: str = "source"

    @classmethod
    def of(cls, settings: Any) -> Recorded:
        """From a run's Settings."""
        selection = settings.selection
        image = cls.from_json(json.loads(selection.origin)) if isinstance(selection, Image) else None
        guard = settings.guard
        return cls(
            **{name: tuple(getattr(settings, name)) for name in FIELDS},
            image_of=image,
            guard=bool(guard.protect),
            keep=guard.keep,
            filter_names=guard.filter_names,
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {name.replace("_", "-"): list(getattr(self, name)) for name in FIELDS}
        if self.image_of is not None:
            data[_IMAGE] = self.image_of.to_json()
        if self.guard:
            data["guard"] = True
        if self.keep:
            data["keep"] = list(self.keep)
        if self.filter_names != "source":
            data["filter-names"] = self.filter_names
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recorded:
        image = data.get(_IMAGE)
        return cls(
            **{name: tuple(str(v) for v in data.get(name.replace("_", "-")) or ()) for name in FIELDS},
            image_of=cls.from_json(image) if isinstance(image, Mapping) else None,
            guard=bool(data.get("guard")),
            keep=tuple(str(v) for v in data.get("keep") or ()),
            filter_names="target" if data.get("filter-names") == "target" else "source",
        )

    @property
    def selection(self) -> Selection:
        if self.image_of is None:
            return Selection.from_patterns(self.include, self.exclude)
        forward = self.image_of
        origin = json.dumps(forward.to_json(), sort_keys=True)
        return Image(of=Scope(forward.selection, Renamer.from_rules(forward.rename)), origin=origin)

    @property
    def options(self) -> dict[str, tuple[str, ...]]:
        """The options a run gives to follow exactly this (as the Settings fields they set)."""
        return {name: getattr(self, name) for name in FIELDS}

    def same_options(self, other: Recorded) -> bool:
        """Do both give the same options (in any order)? What an image is of is not an option."""
        return all(sorted(getattr(self, name)) == sorted(getattr(other, name)) for name in FIELDS)

    def way_back(self) -> Recorded:
        """What the way back of a migration made with this selects: the namespaces it wrote, under their
        source names again (renames and field renames inverted). Without renames that is the same
        ``--include``/``--exclude``; with them, the image of this selection.

        The way back of a migration of part of a collection is of that part (settings.guard): it is
        filtered as the migration was, and the target's documents outside the filter, and the fields the
        migration excluded, are not its own (``guard``, ``keep``). Its own way back (the migration going
        forward again) excludes those fields again."""
        renames = tuple(f"{new}={old}" for old, _, new in (rule.partition("=") for rule in self.rename))
        fields = tuple(_reverse_field_rename(rule, Renamer.from_rules(self.rename)) for rule in self.field_rename)
        part: dict[str, Any] = {
            "field_exclude": self.keep,
            "filter": self.filter,
            "guard": bool(self.filter),
            "keep": self.field_exclude,
            "filter_names": ("target" if self.filter_names == "source" else "source") if self.filter else "source",
        }
        if not self.rename and self.image_of is None:
            return Recorded(self.include, self.exclude, field_rename=fields, **part)
        return Recorded(rename=renames, field_rename=fields, image_of=self, **part)

    def applied(self, settings: S) -> S:
        """``settings`` with exactly this selection, these renames, field rules and guard."""
        renamer = Renamer.from_rules(self.rename)
        by_target = self.filter_names == "target" and bool(renamer)
        by_source = self.filter_names == "source" and bool(renamer)
        guard = TargetGuard(
            self.filter if self.guard else (), self.keep, filter_names=self.filter_names,
            by=renamer.inverse() if by_source else None,
        )  # fmt: skip
        full_document = settings.full_document  # type: ignore[attr-defined]
        if (self.filter or self.keep) and needs_lookup(full_document):
            full_document = "updateLookup"  # the filter and the kept fields decide on whole documents
        return dataclasses.replace(
            settings,  # type: ignore[type-var]
            **self.options,
            selection=self.selection,
            renamer=renamer,
            filters=DocumentFilters(self.filter, by=renamer if by_target else None),
            guard=guard,
            full_document=full_document,
        )


#: the options a checkpoint records (the Settings fields they set)
FIELDS = ("include", "exclude", "rename", "field_exclude", "field_rename", "filter")
#: the key of :attr:`Recorded.image_of` in the JSON
_IMAGE = "image-of"
#: the options whose change cannot be followed without a new snapshot, with their flags
_REWRITING = {
    "rename": "--rename",
    "field_exclude": "--field-exclude",
    "field_rename": "--field-rename",
    "filter": "--filter",
}


def _reverse_field_rename(rule: str, renamer: Renamer) -> str:
    """``db.coll.path.old=new`` of a migration, as its way back names it: ``db2.coll2.path.new=old``, where
    the migration wrote ``db.coll`` to ``db2.coll2`` (a database given with ``*`` keeps its pattern; a plain
    one goes through a database rename)."""
    target, sep, new = rule.partition("=")
    if not sep:
        target, _, new = rule.rpartition(":")  # Debezium's path:newname
    db, _, rest = target.strip().partition(".")
    parts = rest.split(".")  # the collection's name (it may hold dots), then the path to the field
    old = parts.pop()
    for size in range(len(parts), 0, -1):
        hit = renamer.collections.get((db, ".".join(parts[:size])))
        if hit is not None:
            return ".".join([*hit, *parts[size:], new.strip()]) + "=" + old
    if "*" not in db:
        db = renamer.databases.get(db, db)
    return ".".join([db, *parts, new.strip()]) + "=" + old


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
