"""A change event's delta (UpdateDescription) as MongoDB update operators. Pure: no I/O.

The one builder behind every writer of a delta as MongoDB updates: the MongoDB write plan
(``sinks/mongo/plan``) sends its steps, the Debezium legacy envelope (``sinks/records/envelope``) carries them
as its ``patch``.

MongoDB refuses an update document in which one path is a prefix of another (ConflictingUpdateOperators),
and a delta often holds such pairs: an array truncated (``truncatedArrays``) while elements of it change
(``updatedFields`` ``arr.0``), which is what a ``$push`` with ``$slice`` or a ``$pull`` reports; or an
array truncated inside another truncated array (an update pipeline). So a delta becomes ordered steps:
the truncations first, as the server applies them (an array is resized before its elements change), each
as ``$push: {field: {$each: [], $slice: n}}``, in as few steps as keep their paths apart; then one
``$set`` / ``$unset``. An array truncated whose every remaining element is set is the whole new array:
it becomes one ``$set`` of it, so the common ``$push`` with ``$slice`` stays one update.

Paths are taken as the change stream reports them: a field name holding a dot is indistinguishable from
a path there. Top-level ``$``-prefixed field names cannot be written by operators at all; the MongoDB
sink sets those with ``$setField`` (``sinks.mongo.plan.literal_ops``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replicator.events import UpdateDescription

#: the order of operators in one update document (as the Debezium legacy patch always had them)
_ORDER = ("$set", "$unset", "$push")


def update_steps(update: UpdateDescription, *, unset_value: Any = "") -> list[dict[str, Any]]:
    """The update documents that replay ``update``, to apply in order; none of them holds two paths
    one inside the other. ``unset_value``: the value under each ``$unset`` field (ignored by the
    server; Debezium's legacy patch writes ``true``)."""
    updated: Mapping[str, Any] = update.updated_fields
    truncated = list(update.truncated_arrays)
    whole = _whole_arrays(update)
    if whole:
        merged = {k: v for k, v in updated.items() if not any(_inside(k, f) for f in whole)}
        merged.update((f, [updated[f"{f}.{i}"] for i in range(n)]) for f, n in whole.items())
        updated = merged
        truncated = [(f, n) for f, n in truncated if f not in whole]
    steps: list[dict[str, Any]] = []
    placed: list[tuple[str, int]] = []  # (path, step) of each truncation
    for field, size in sorted(truncated, key=lambda t: t[0].count(".")):  # enclosing arrays first
        # in the step after the last one holding a path in conflict with this one
        step = max((s + 1 for p, s in placed if _conflict(p, field)), default=0)
        if step == len(steps):
            steps.append({"$push": {}})
        steps[step]["$push"][field] = {"$each": [], "$slice": size}
        placed.append((field, step))
    change: dict[str, Any] = {}
    if updated:
        change["$set"] = updated
    if update.removed_fields:
        change["$unset"] = dict.fromkeys(update.removed_fields, unset_value)
    if change:
        steps.append(change)
    return steps


def update_document(update: UpdateDescription, *, unset_value: Any = "") -> dict[str, Any] | None:
    """``update`` as one update document, or None where MongoDB cannot take it as one (some paths of
    its steps are one inside the other: apply :func:`update_steps` in order instead)."""
    steps = update_steps(update, unset_value=unset_value)
    paths = [path for step in steps for fields in step.values() for path in fields]
    if any(_conflict(a, b) for i, a in enumerate(paths) for b in paths[i + 1 :]):
        return None
    merged: dict[str, Any] = {}
    for op in _ORDER:
        for step in steps:
            if op in step:
                merged.setdefault(op, {}).update(step[op])
    return merged


def _whole_arrays(update: UpdateDescription) -> dict[str, int]:
    """The truncated arrays whose every remaining element the delta sets (and nothing inside them
    besides): {field: new size}."""
    out: dict[str, int] = {}
    for field, size in update.truncated_arrays:
        if size <= 0:
            continue
        inside = {k for k in update.updated_fields if _inside(k, field)}
        if inside != {f"{field}.{i}" for i in range(size)}:
            continue
        if any(_inside(k, field) or k == field for k in update.removed_fields):
            continue
        out[field] = size
    return out


def _inside(path: str, field: str) -> bool:
    return path.startswith(field + ".")


def _conflict(a: str, b: str) -> bool:
    """Would MongoDB refuse ``a`` and ``b`` in one update document (equal, or one inside the other)?"""
    return a == b or _inside(a, b) or _inside(b, a)
