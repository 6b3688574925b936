"""How a replayed batch is split into Spark tasks that apply it at once, in an order that converges (pure).

* DDL is a barrier: the batch is cut at each DDL event, which is applied alone, on the driver, after
  everything before it and before anything after it (:func:`runs`).
* Between two barriers, the events are grouped so that each group can be applied on its own
  (:func:`spread`): every event of one document (namespace and ``_id``) is in the same group, in source
  order, and so is every event of one transaction, whichever documents it touches. Two documents a
  transaction links are therefore in one group. Groups go to tasks by a stable hash, so the same document
  lands in the same task in every batch, on every worker.
* A sink that keeps each collection as one unit (a lake table, whose commits carry the position they
  cover) groups by namespace instead (``by="namespace"``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import Literal

import bson

from replicator.events import ChangeEvent

#: what keeps events together: one document (namespace and _id), or one namespace
By = Literal["document", "namespace"]


def runs(events: Sequence[ChangeEvent]) -> Iterator[tuple[bool, list[ChangeEvent]]]:
    """The batch cut at its barriers, in order: ``(True, [ddl])`` for each DDL event (or an event with no
    document key), ``(False, events)`` for each run of document events between them."""
    run: list[ChangeEvent] = []
    for event in events:
        if _barrier(event):
            if run:
                yield False, run
                run = []
            yield True, [event]
        else:
            run.append(event)
    if run:
        yield False, run


def _barrier(event: ChangeEvent) -> bool:
    return event.op.is_ddl or event.key is None or "_id" not in event.key


def group_key(event: ChangeEvent, by: By) -> bytes:
    """The bytes that place ``event``: its namespace, and for ``document`` its ``_id`` (not the whole
    document key: a shard key value can change between two events of one document)."""
    ns = f"{event.ns.db}\0{event.ns.coll or ''}".encode()
    if by == "namespace":
        return ns
    return ns + b"\0" + bson.encode({"_id": event.document_key["_id"]})


def spread(events: Sequence[ChangeEvent], parts: int, *, by: By = "document") -> list[list[ChangeEvent]]:
    """``events`` (no barrier among them) split into at most ``parts`` lists, each in source order, with
    a document's events, and a transaction's, never in two lists. Empty lists are left out."""
    parent = list(range(len(events)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        a, b = find(i), find(j)
        if a != b:
            parent[max(a, b)] = min(a, b)  # the root is the group's first event

    first: dict[object, int] = {}
    keys: list[bytes] = []
    for i, event in enumerate(events):
        key = group_key(event, by)
        keys.append(key)
        for link in (key, event.txn.key if event.txn is not None else None):
            if link is None:
                continue
            if link in first:
                union(i, first[link])
            else:
                first[link] = i
    out: list[list[ChangeEvent]] = [[] for _ in range(max(1, parts))]
    for i, event in enumerate(events):
        out[zlib.crc32(keys[find(i)]) % len(out)].append(event)
    return [part for part in out if part]
