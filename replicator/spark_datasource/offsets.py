"""Streaming offsets of the ``mcdc`` source: per-shard resume tokens, never clock seconds. Pure.

An offset is the JSON dict Spark keeps in the query's checkpointLocation::

    {"shards": {"<shard name, or "" for a replica set>": {"token": "<resume token as canonical Extended
     JSON, or null>", "t": <cluster time seconds or null>, "i": <increment or null>, "n": <index>}},
     "snapshot": {"t": ..., "i": ..., "plan": [<partition>, ...], "done": <partitions read>}}

A shard's entry is where its stream goes on: after ``token`` when there is one (the last event read, or
the stream's post-batch token), else at the cluster time ``t,i`` (startAtOperationTime). ``n`` is the
index of the event at ``token`` among its stream's events at ``t,i`` (replicator.events.positions), so the events
after it are numbered as before. ``"idle": true`` marks an entry that moved to a post-batch token with no
event in between: its range holds nothing to read, but the position is worth keeping (an idle stream's
checkpoint must not fall off the oplog).

``snapshot`` (option ``snapshot=initial``) is there until the snapshot's partitions are all read: its read
time, its plan (``Partition.to_json`` of each with its collection's ``uuid``, fixed when the query began)
and how many are read. Each shard's entry is the snapshot's read time until then (a cluster time, no
token: every event from that time on comes after the snapshot's rows). Where a planned
collection is when its partition is read (renamed, dropped) is found again from the source's events
after the read time (spark_datasource/moves.py), so a restarted query needs nothing more to read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import json_util
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import CANONICAL, dumps_str
from replicator.errors import ConfigError, quoted
from replicator.events import Position

REPLICA_SET = ""  # the one stream of a replica set, under this name


@dataclass(frozen=True)
class ShardOffset:
    """One shard's place in its change stream."""

    token: str | None = None  # canonical Extended JSON of the resume token
    t: int | None = None
    i: int | None = None
    idle: bool = False  # moved to a post-batch token: no event since the previous offset
    n: int | None = None  # the index of the event at ``token`` (None: not an event's, or not known)

    @classmethod
    def of(cls, token: Any, ts: Timestamp | None, *, idle: bool = False, n: int | None = None) -> ShardOffset:
        """From a resume token (a BSON document), a cluster time and the index of the event there."""
        text = dumps_str(token) if token is not None else None
        return cls(text, ts.time if ts else None, ts.inc if ts else None, idle, n)

    @property
    def cluster_time(self) -> Timestamp | None:
        return Timestamp(self.t, self.i) if self.t is not None and self.i is not None else None

    @property
    def resume_token(self) -> Any:
        return json_util.loads(self.token, json_options=CANONICAL) if self.token is not None else None

    def position(self) -> Position:
        return Position(self.resume_token, self.cluster_time, self.n)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"token": self.token, "t": self.t, "i": self.i}
        if self.n is not None:
            data["n"] = self.n
        if self.idle:
            data["idle"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardOffset:
        t, i, n = data.get("t"), data.get("i"), data.get("n")
        ts = (int(t) if t is not None else None, int(i) if i is not None else None)
        return cls(data.get("token"), *ts, bool(data.get("idle")), int(n) if n is not None else None)


Offsets = dict[str, ShardOffset]


@dataclass(frozen=True)
class SnapshotOffset:
    """The snapshot's part of an offset (option ``snapshot=initial``): its read time, its partitions and
    how many of them are read."""

    t: int
    i: int
    plan: tuple[Mapping[str, Any], ...]
    done: int = 0

    @property
    def at(self) -> Timestamp:
        return Timestamp(self.t, self.i)

    @property
    def finished(self) -> bool:
        return self.done >= len(self.plan)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "i": self.i, "plan": list(self.plan), "done": self.done}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SnapshotOffset:
        return cls(int(data["t"]), int(data["i"]), tuple(data.get("plan") or ()), int(data.get("done") or 0))


def to_json(
    offsets: Mapping[str, ShardOffset], *, initial: bool = False, snapshot: SnapshotOffset | None = None
) -> dict[str, Any]:
    """The offset dict Spark stores. ``initial`` marks a query's first offset, which no later offset
    equals: so Spark always runs a first (maybe empty) micro-batch and records where the stream started
    in the query's checkpoint. Without it, an availableNow run that found nothing new would record
    nothing, and the next run would start at its own "now", skipping what happened in between.
    ``snapshot``: a snapshot still being read."""
    data: dict[str, Any] = {"shards": {name: offsets[name].to_json() for name in sorted(offsets)}}
    if snapshot is not None:
        data["snapshot"] = snapshot.to_json()
    if initial:
        data["initial"] = True
    return data


def snapshot_of(data: Mapping[str, Any]) -> SnapshotOffset | None:
    """An offset's snapshot part, while it has one."""
    part = data.get("snapshot") if isinstance(data, Mapping) else None
    return SnapshotOffset.from_json(part) if isinstance(part, Mapping) else None


def from_json(data: Mapping[str, Any]) -> Offsets:
    """The inverse of :func:`to_json`; a malformed offset is a ConfigError naming what is wrong."""
    shards = data.get("shards") if isinstance(data, Mapping) else None
    if not isinstance(shards, Mapping) or not all(isinstance(v, Mapping) for v in shards.values()):
        raise ConfigError(f'a stream offset must look like {{"shards": {{NAME: {{"token", "t", "i"}}}}}}, got {data!r}')
    out = {str(name): ShardOffset.from_json(entry) for name, entry in shards.items()}
    for name, entry in out.items():
        if entry.token is None and entry.cluster_time is None:
            raise ConfigError(f"stream offset of shard {quoted(name)} has neither a resume token nor a cluster time")
    return out


def parse(text: str, option: str) -> Offsets:
    """An offset given as JSON text (the ``start-positions`` option)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"option {option} is not JSON: {exc}") from None
    return from_json(data)


def start_of(offsets: Mapping[str, ShardOffset], name: str) -> ShardOffset:
    """Where ``name``'s stream starts: its own entry, or for a shard the offset does not know yet (added
    since) the earliest cluster time of the others (a resume token belongs to one stream only)."""
    entry = offsets.get(name)
    if entry is not None:
        return entry
    times = [e.cluster_time for e in offsets.values() if e.cluster_time is not None]
    if not times:
        raise ConfigError(f"shard {quoted(name)} is new and the stream offset has no cluster time to start it at")
    earliest = min(times)
    return ShardOffset(None, earliest.time, earliest.inc)


def common_end(ends: Mapping[str, ShardOffset], more: set[str]) -> Timestamp | None:
    """The latest cluster time every shard's part of a micro-batch may reach: the earliest end of the
    shards that stopped with events left (``more``: cut by the read limit). A shard that reached the end
    of what its server has now holds nothing earlier to come. None when no shard was cut."""
    times = [ends[name].cluster_time for name in more if ends[name].cluster_time is not None]
    return min(times) if times else None  # type: ignore[type-var]


def idle_positions(offset: Mapping[str, Any]) -> dict[str, Position]:
    """The shards of an offset (a micro-batch's end) that moved without events, with their positions."""
    return {name: entry.position() for name, entry in from_json(offset).items() if entry.idle}
