"""Raw change-stream events as the ``mcdc`` source's rows: each numbered within its cluster time, those
outside the selection left out, and an update's looked-up document left out where it may be another
collection's.

``fullDocument: updateLookup`` reads the document by name when the server sends the event, and a stream
read late (after a snapshot of many micro-batches, or a query stopped for a while) meets names that were
taken over since: after ``rename log -> log_1`` and a new ``log``, an update of the old ``log`` carries
the new one's document. As the replay does (source/incarnations.py), the UUIDs of the updates'
collections are read once their events were (so after every lookup), and an update whose name now holds
another collection, or none, keeps only its delta (``update``; ``document``, ``bson`` and the
``change`` column's ``fullDocument`` are left out), which is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from replicator.events import ChangeEvent, Position
from replicator.events.normalize import normalize_change
from replicator.events.positions import Numbering
from replicator.events.rows import Row, bson_bytes, event_row
from replicator.settings.config import Settings
from replicator.settings.filters import transform_filters
from replicator.settings.selection import keep_event
from replicator.source.incarnations import keep_own_lookups, looked_up
from replicator.spark_datasource.changes import log_skipped, skipped, sync_client
from replicator.spark_datasource.moves import uuids_now

log = logging.getLogger("mcdc.spark")


def event_of(raw: Mapping[str, Any], shard: str, s: Settings, numbering: Numbering) -> ChangeEvent | None:
    """The event of one raw change, or None when it makes no row (outside the selection, skipped). Every
    event is numbered within its cluster time (``numbering``), as the asyncio reader numbers them."""
    index = numbering.next(raw.get("clusterTime"))
    if skipped(raw):
        log_skipped(raw)
        return None
    event = normalize_change(raw, shard or None, index, shard or None)
    if event is None or not keep_event(event, s.selection):
        return None
    return event


def row_of(raw: Mapping[str, Any], shard: str, s: Settings, numbering: Numbering) -> Row | None:
    """The row of one raw change event as it came (see :func:`event_of`), its lookup not checked."""
    event = event_of(raw, shard, s, numbering)
    return event_row(event, bson_bytes(raw), relaxed=s.extended_json == "relaxed") if event is not None else None


def rows_of(raws: Sequence[Mapping[str, Any]], shard: str, s: Settings, start: Position) -> Iterator[Row]:
    """The rows of a stream's events read after ``start``, the updates' looked-up documents checked (see
    the module's docstring): one listCollections per database of such updates."""
    numbering = Numbering(start)
    made = [(raw, event) for raw in raws if (event := event_of(raw, shard, s, numbering)) is not None]
    events = [event for _, event in made]
    suspects = looked_up(events)
    if suspects:
        with sync_client(s.source, s.connect_timeout_s, s.io_timeout_s) as client:
            events = keep_own_lookups(events, uuids_now(client, suspects))
    relaxed = s.extended_json == "relaxed"
    keep = transform_filters(s.filters) if s.filters else None
    for (raw, first), looked in zip(made, events, strict=True):
        # --filter: the row says what the filtered target sees (a document that stops matching is a "d"); its
        # change column stays the server's event, which the writer's transform filters the same way again
        event = keep(looked) if keep is not None else looked
        if event is None:
            continue
        change = raw if looked is first else {k: v for k, v in raw.items() if k != "fullDocument"}
        yield event_row(event, bson_bytes(change), relaxed=relaxed)
