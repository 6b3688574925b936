"""What the way back of a partial migration never touches on the old side. Pure: no I/O.

A migration of part of a collection (``--filter``) or of part of each document (``--field-exclude``)
leaves, on the old side, what it did not copy: the documents its filter did not find, and the excluded
fields of every document. After a cutover the old side is the way back's target. Its copy of the
migration's part follows the new side; the rest is not the way back's, and stays as it was:

* **documents outside the filter**: the way back's writes to a filtered collection are conditional on the
  old side's document matching the filter. A replacement is an upsert of ``{_id, $and: [filter]}`` and a
  delete deletes ``{_id, $and: [filter]}``, so a document the filter does not find is never replaced or
  deleted. The way back is filtered as the migration was (a new-side document outside the filter is not
  carried back), so every document of the old side that the filter does not find is one the migration did
  not copy. An upsert that meets one (the new side wrote a document with its ``_id``) fails on the ``_id``
  index, and the way back stops in one line instead of replacing it;
* **excluded fields**: each document the way back writes takes the old side's values of the excluded
  fields, in their places (:meth:`~replicator.settings.fields.FieldEditor.kept`); the new side's values of
  those fields, if it has any, are not written.

Data DDL (a drop, a rename, a dropped database) and a copy made again replace a whole collection: on a
collection that holds either, they are refused, or (a copy) made as a merge that replaces only the
migration's documents. See docs/how-to/migrate-a-cluster.md, "the way back of a partial migration".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from replicator.events import Namespace
from replicator.settings.fields import FieldEditor, FieldRules
from replicator.settings.filters import DocumentFilters


class TargetGuard:
    """The old side's part a way back never touches: ``protect``, the migration's ``--filter`` rules (by the
    old side's names, which the way back writes to), and ``keep``, its ``--field-exclude`` rules."""

    def __init__(
        self,
        protect: Sequence[str] = (),
        keep: Sequence[str] = (),
        *,
        filter_names: str = "source",
        by: Callable[[Namespace], Namespace] | None = None,
    ) -> None:
        """``filter_names``: which side the run's ``--filter`` patterns name (recorded.Recorded's);
        ``by``: the name a target namespace's ``protect`` rule is found by, where it is not its own."""
        self.protect = tuple(protect)
        self.keep = tuple(keep)
        self.filter_names = filter_names
        self._filters = DocumentFilters(self.protect, by=by)
        self._fields = FieldRules(exclude=self.keep)
        self._paths: dict[Namespace, list[str]] = {}

    def __bool__(self) -> bool:
        return bool(self.protect or self.keep)

    def __repr__(self) -> str:
        return f"TargetGuard(protect={self.protect!r}, keep={self.keep!r})"

    def where(self, ns: Namespace) -> Mapping[str, Any] | None:
        """The query that finds the migration's documents of target ``ns`` (None: all of them)."""
        return self._filters.where(ns) if self.protect else None

    def kept(self, ns: Namespace) -> FieldEditor | None:
        """The editor of target ``ns``'s fields that the migration did not copy (None: none)."""
        return self._fields.for_namespace(ns) if self.keep else None

    def guards(self, ns: Namespace) -> bool:
        """Does target ``ns`` hold anything the migration did not copy?"""
        return self.where(ns) is not None or self.kept(ns) is not None

    def condition(self, ns: Namespace, key: Mapping[str, Any]) -> Mapping[str, Any]:
        """A write's filter by document ``key``, narrowed to the migration's documents."""
        where = self.where(ns)
        return key if where is None else {**key, "$and": [where]}

    def kept_paths(self, ns: Namespace) -> list[str]:
        """The dotted paths of target ``ns``'s fields the migration did not copy."""
        if ns not in self._paths:
            editor = self.kept(ns)
            self._paths[ns] = editor.excluded_paths() if editor is not None else []
        return self._paths[ns]

    def unmigrated(self, ns: Namespace) -> Mapping[str, Any] | None:
        """The query that finds target ``ns``'s documents holding what the migration did not copy: outside
        its filter, or with a field it excluded (None: ``ns`` is not guarded)."""
        outside = self.outside(ns)
        either: list[Mapping[str, Any]] = [outside] if outside is not None else []
        either += [{path: {"$exists": True}} for path in self.kept_paths(ns)]
        if not either:
            return None
        return either[0] if len(either) == 1 else {"$or": either}

    def outside(self, ns: Namespace) -> Mapping[str, Any] | None:
        """The query that finds target ``ns``'s documents outside the migration's filter (None: no filter)."""
        where = self.where(ns)
        return {"$nor": [where]} if where is not None else None

    def what(self, ns: Namespace) -> str:
        """What the migration did not copy of target ``ns``, for a message."""
        parts = []
        if self.where(ns) is not None:
            parts.append("documents outside its --filter")
        paths = self.kept_paths(ns)
        if paths:
            parts.append(f"the fields it excluded ({', '.join(paths)})")
        return " and ".join(parts)


def renamed_filter_fields(
    guard: TargetGuard, filters: DocumentFilters, fields: FieldRules, namespaces: Iterable[Namespace]
) -> str | None:
    """Why a way back cannot decide its filter on these (source) namespaces, or None: its filter names the old
    side's fields, and is decided on the new side's documents, so it may not read a field a field rename
    renamed (its documents carry another name there)."""
    if guard.filter_names != "target" or not filters or not fields:
        return None
    for ns in namespaces:
        query, editor = filters.for_namespace(ns), fields.for_namespace(ns)
        if query is None or editor is None:
            continue
        both = sorted(query.fields() & editor.renamed_fields())
        if both:
            return (
                f"source: the way back's --filter on {ns} reads {', '.join(both)}, which its migration's "
                "--field-rename renamed: the new side's documents name it otherwise, so the way back cannot tell "
                "which of them the migration copied, and is refused; a migration whose --filter reads no field "
                "its --field-rename renames has a way back"
            )
    return None
