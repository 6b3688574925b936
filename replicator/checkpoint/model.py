"""What a checkpoint holds (:class:`Checkpoint`) and its versioned JSON form; :mod:`.store` writes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replicator.bsonkit.extjson import from_jsonable, to_jsonable
from replicator.events import Position, ts_from_json, ts_to_json
from replicator.settings.stream_match import StreamFilter

FORMAT = "mcdc-checkpoint"
VERSION = 1


@dataclass
class SnapshotProgress:
    """The snapshot's state: ``none`` (not started), ``in_progress`` or ``done``.

    ``plan`` is the partition list (JSON form, see source.partitions) fixed when the snapshot started, so a
    resumed run copies exactly the partitions not in ``done``. ``prepared`` lists target namespaces whose
    collection (with options) was already created; ``drop_target``: the snapshot replaces what the target
    holds, so a namespace not prepared yet is dropped first. ``resume`` maps a partition not done to the
    ``_id`` (extended JSON) of the end of its acknowledged batches, where its copy goes on; for a partition
    that cannot go on (a time-series collection's) an entry (null) says only that its copy began: it is
    copied again once its range is deleted from the target.
    """

    status: str = "none"
    plan: list[dict[str, Any]] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    prepared: set[str] = field(default_factory=set)
    drop_target: bool = False
    resume: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True)
class StreamScope:
    """The change stream a checkpoint's positions belong to: the whole deployment's (``database`` None), or
    one database's (``db.watch``, for a source user with ``read`` on that database only). A resume token and
    the events' places at a cluster time belong to one stream, so a checkpoint keeps its scope for life."""

    database: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.database is None:
            return {"scope": "deployment"}
        return {"scope": "database", "database": self.database}

    @classmethod
    def from_json(cls, data: Any) -> StreamScope:
        if isinstance(data, dict) and data.get("scope") == "deployment":
            return cls()
        if isinstance(data, dict) and data.get("scope") == "database" and isinstance(data.get("database"), str):
            return cls(data["database"])
        raise ValueError(f"unknown change stream scope {data!r}")

    def __str__(self) -> str:
        return "the whole deployment" if self.database is None else f"database {self.database}"


#: The scope of a checkpoint written before mcdc recorded one: the deployment's stream, all it read then.
DEPLOYMENT = StreamScope()


@dataclass
class Checkpoint:
    """In-memory form of one checkpoint file.

    ``source_id`` (the file's ``source``) is the replica set name, the only tie checkpoints written before
    the identities had. ``source_identity`` and ``target_identity`` say which deployments the positions
    belong to (see :meth:`CheckpointStore.claim`); None in such an older checkpoint until its next save.
    """

    source_id: str
    position: Position = field(default_factory=Position)
    snapshot: SnapshotProgress = field(default_factory=SnapshotProgress)
    updated_at: float = 0.0
    shards: dict[str, Position] = field(default_factory=dict)  # per-shard stream positions
    source_identity: str | None = None
    target_identity: str | None = None
    #: the selection, renames and field rules the target's copies were made with (recorded.Recorded's
    #: JSON); None in a checkpoint written before mcdc recorded them
    recorded: dict[str, Any] | None = None
    #: a discovered shard's listShards host, so a shard removed while mcdc was down can still be read
    shard_hosts: dict[str, str] = field(default_factory=dict)
    #: set by ``mcdc cutover`` once the target was proven identical at a quiet source: the cutover point
    #: (``cluster_time``), when, the evidence and the reverse checkpoint written; None before
    cutover: dict[str, Any] | None = None
    #: the embedded verifier's place (sweep_state.SweepState's JSON): a restarted ``tail --verify`` goes on
    #: with its pass; None when no run verified
    verifier: dict[str, Any] | None = None
    #: how far the acknowledged position was behind the source's writes when the replay saved this version
    #: (0: it had caught up); None before any replay saved it (what mcdc status reports of a stopped run)
    lag_s: float | None = None
    #: in a reverse checkpoint, set by the cutover that wrote it: the forward checkpoint (its file) and the
    #: position written, so that no other migration's cutover replaces it, nor this one's once it moved on
    reverse_of: dict[str, Any] | None = None
    #: target namespaces this migration wrote that its recorded selection does not cover: the copies a
    #: widened selection began (until it is recorded) and those a narrowed one left on the target. A later
    #: widening may copy over them; target data of any other namespace it refuses to replace
    owned: set[str] = field(default_factory=set)
    #: the migration this checkpoint belongs to, made when its first version was: a copy of the file (a
    #: backup, an older version kept aside) has the same, and is that migration, not another one
    migration_id: str | None = None
    #: the change stream its positions belong to; None while no stream was read for it (a reverse checkpoint
    #: cutover wrote holds only a cluster time): the next run decides and records it
    stream: StreamScope | None = None
    #: which $match read which stretch of its streams (settings/stream_match.py): an event's place at its
    #: cluster time is counted among what its match lets through. None while no run recorded one (a new
    #: checkpoint before its first position, a reverse checkpoint cutover wrote): the next run records its
    #: own; absent from a checkpoint written before mcdc filtered on the server, which read them unfiltered
    stream_filter: StreamFilter | None = None
    #: the source and target it was last run between (Settings.pair_key), so that status and cutover find a
    #: default checkpoint whose selection changed since its file was named; None before a run recorded it
    pair: str | None = None
    #: the source's TTLs behind those its target holds (sinks/mongo/ttl.py): {"db.coll": {index or "": s}};
    #: None while no run held them (the first run holds the TTLs the target has then)
    held: dict[str, dict[str, Any]] | None = None
    #: a start after a Debezium connector's offset (debezium_offset.DebeziumOffset's JSON): while the position
    #: is still its token, a transaction Debezium had begun writing is continued; None for any other start
    handover: dict[str, Any] | None = None

    def acknowledge(
        self, position: Position, shard_positions: Mapping[str, Position] | None = None, *, applied: bool = True
    ) -> None:
        """The sink acknowledged everything up to ``position`` (and, for merged shard streams, each shard
        up to its entry in ``shard_positions``): move there, never backwards in what is known. With shard
        streams the overall position moves only with applied events (an idle poll moves just its shard)."""
        for name, shard_position in (shard_positions or {}).items():
            self.shards[name] = advance(self.shards.get(name), shard_position)
        if shard_positions is None or applied:
            self.position = advance(self.position, position)

    def add_shard(self, name: str, since: Position) -> None:
        """Follow a shard that appeared: from ``since`` unless it is known already."""
        self.shards.setdefault(name, since)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "source": self.source_id,
            "source_identity": self.source_identity,
            "target_identity": self.target_identity,
            "recorded": self.recorded,
            "updated_at": self.updated_at,
            "position": _position_json(self.position),
            "shards": {name: _position_json(pos) for name, pos in sorted(self.shards.items())},
            "shard_hosts": dict(sorted(self.shard_hosts.items())),
            "cutover": self.cutover,
            "verifier": self.verifier,
            "reverse_of": self.reverse_of,
            "lag_s": self.lag_s,
            "owned": sorted(self.owned),
            "migration_id": self.migration_id,
            "pair": self.pair,
            "held": self.held,
            "handover": self.handover,
            "stream": self.stream.to_json() if self.stream is not None else None,
            "stream_filter": self.stream_filter.to_json() if self.stream_filter is not None else None,
            "snapshot": {
                "status": self.snapshot.status,
                "plan": self.snapshot.plan,
                "done": sorted(self.snapshot.done),
                "prepared": sorted(self.snapshot.prepared),
                "drop_target": self.snapshot.drop_target,
                "resume": dict(self.snapshot.resume),
                "started_at": self.snapshot.started_at,
                "finished_at": self.snapshot.finished_at,
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> Checkpoint:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not an mcdc checkpoint")
        if data.get("version") != VERSION:
            raise ValueError(f"checkpoint version {data.get('version')!r} is not supported (expected {VERSION})")
        snap = data.get("snapshot") or {}
        return cls(
            source_id=str(data["source"]),
            source_identity=_optional_str(data.get("source_identity")),
            target_identity=_optional_str(data.get("target_identity")),
            recorded=dict(data["recorded"]) if data.get("recorded") is not None else None,
            position=_position_from_json(data.get("position")),
            shards={str(k): _position_from_json(v) for k, v in (data.get("shards") or {}).items()},
            shard_hosts={str(k): str(v) for k, v in (data.get("shard_hosts") or {}).items()},
            cutover=dict(data["cutover"]) if data.get("cutover") is not None else None,
            verifier=dict(data["verifier"]) if data.get("verifier") is not None else None,
            reverse_of=dict(data["reverse_of"]) if data.get("reverse_of") is not None else None,
            lag_s=float(data["lag_s"]) if data.get("lag_s") is not None else None,
            owned={str(ns) for ns in data.get("owned") or ()},
            migration_id=_optional_str(data.get("migration_id")),
            pair=_optional_str(data.get("pair")),
            held={str(k): dict(v) for k, v in data["held"].items()} if isinstance(data.get("held"), dict) else None,
            handover=dict(data["handover"]) if data.get("handover") is not None else None,
            # absent from a checkpoint written before scopes were recorded: the deployment's stream
            stream=StreamScope.from_json(data["stream"])
            if data.get("stream") is not None
            else (None if "stream" in data else DEPLOYMENT),
            stream_filter=StreamFilter.from_json(data["stream_filter"])
            if data.get("stream_filter") is not None
            else (None if "stream_filter" in data else StreamFilter()),
            snapshot=SnapshotProgress(
                status=str(snap.get("status", "none")),
                plan=list(snap.get("plan") or []),
                done=set(snap.get("done") or []),
                prepared=set(snap.get("prepared") or []),
                drop_target=bool(snap.get("drop_target")),
                resume=dict(snap.get("resume") or {}),
                started_at=snap.get("started_at"),
                finished_at=snap.get("finished_at"),
            ),
            updated_at=float(data.get("updated_at") or 0.0),
        )


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def advance(old: Position | None, new: Position) -> Position:
    """The newer position; a post-batch token carries no time, so the last known time (with the index of
    the event at it) stays."""
    if old is None:
        return new
    if new.cluster_time is None:
        return Position(new.resume_token or old.resume_token, old.cluster_time, old.index, old.shard)
    return Position(new.resume_token or old.resume_token, new.cluster_time, new.index, new.shard)


def _position_json(position: Position) -> dict[str, Any]:
    token = position.resume_token
    data: dict[str, Any] = {
        "resume_token": to_jsonable(token) if token is not None else None,
        "cluster_time": ts_to_json(position.cluster_time),
    }
    if position.index is not None:  # the event's place at its cluster time: the stream numbers on from it
        data["index"] = position.index
    if position.shard is not None:
        data["shard"] = position.shard
    return data


def _position_from_json(data: Any) -> Position:
    data = data or {}
    token = data.get("resume_token")
    index, shard = data.get("index"), data.get("shard")
    return Position(
        resume_token=from_jsonable(token) if token is not None else None,
        cluster_time=ts_from_json(data.get("cluster_time")),
        index=int(index) if index is not None else None,
        shard=str(shard) if shard is not None else None,
    )
