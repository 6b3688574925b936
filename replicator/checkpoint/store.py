"""Checkpoint files: versioned JSON, written atomically, never ahead of what the sink acknowledged.

A write goes to a temporary file (mode 0600), every byte of it (a short write is continued), is fsync'd
and read back to compare; only then is the current file hard-linked to ``<name>.backup`` (the previous
version, for a person to fall back on) and the temporary file renamed over the current one; the directory
is fsync'd last. Every step is atomic, so at any instant the file is either the old or the new version,
whole, and a disk too full to take the new one leaves the old one and its backup as they were.

A checkpoint path that is a symbolic link stays one: the lock, backup and temporary files sit beside the
file it points to, which is the file replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicator.bsonkit.extjson import from_jsonable, to_jsonable
from replicator.errors import CheckpointError, CheckpointLocked, ConfigError, quoted
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


class CheckpointStore:
    """Reads and atomically writes one checkpoint file, and holds its lock."""

    def __init__(self, path: Path) -> None:
        self.path = path  # as the user named it, for messages
        # the file itself: a link's target (resolved once, so the lock and the saves agree on it)
        self.real = Path(os.path.realpath(path))
        self.backup = self.real.with_name(self.real.name + ".backup")
        self._lock_fd: int | None = None
        self._owner: tuple[str, str] | None = None  # (source, target) identities of the run: see claim()
        self._pair: str | None = None
        #: what the run's sink holds on the target now, recorded with each save (Sink.held_ttls)
        self.held: Callable[[], dict[str, dict[str, Any]] | None] = lambda: None

    def load(self) -> Checkpoint | None:
        """The saved checkpoint, or None when there is none yet."""
        try:
            raw = self.real.read_bytes()
        except FileNotFoundError:
            if self.backup.exists():  # deleted by hand? starting over silently from the backup would surprise
                raise CheckpointError(
                    f"checkpoint {self.path} is missing but {self.backup.name} exists: rename the backup to "
                    "resume from it, or delete it to start over"
                ) from None
            return None
        except OSError as exc:
            raise CheckpointError(f"checkpoint {self.path} cannot be read: {exc.strerror}") from None
        try:
            return Checkpoint.from_json(json.loads(raw.decode()))
        # UnicodeDecodeError is a ValueError; a field of the wrong type fails as Attribute/Type/KeyError
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            previous = f" (the previous version is {self.backup.name})" if self.backup.exists() else ""
            raise CheckpointError(f"checkpoint {self.path} is corrupt ({reason}); fix or remove it{previous}") from None

    def claim(
        self, checkpoint: Checkpoint | None, *, source: str, target: str, source_name: str, pair: str | None = None
    ) -> None:
        """Refuse a checkpoint written for another source or target, before anything is written; from then
        on every save records this run's identities (so an older checkpoint without them gets them), and
        ``pair`` (Settings.pair_key) when given.

        ``source_name`` is the weaker tie in the ``source`` field, all an older checkpoint can be checked by.
        """
        if checkpoint is not None:
            ours: dict[str, str | None] = {"source": source, "target": target}
            theirs = {"source": checkpoint.source_identity, "target": checkpoint.target_identity}
            if checkpoint.source_identity is None and checkpoint.target_identity is None:
                theirs["source"] = checkpoint.source_id  # an older checkpoint: the replica set name only
                differ = ["source"] if checkpoint.source_id != source_name else []
            else:
                differ = [role for role, identity in theirs.items() if identity is not None and identity != ours[role]]
            if differ:
                raise ConfigError(
                    f"checkpoint {self.path} belongs to {_roles(theirs, differ)}, not this run's "
                    f"{_roles(ours, differ)}: pass another --checkpoint, or delete {self.path} to start over"
                )
        self._owner = (source, target)
        self._pair = pair

    @property
    def owner(self) -> tuple[str, str] | None:
        """The (source, target) identities :meth:`claim` took, None before."""
        return self._owner

    def save(self, checkpoint: Checkpoint) -> None:
        checkpoint.updated_at = time.time()
        if self._owner is not None:
            checkpoint.source_identity, checkpoint.target_identity = self._owner
        if self._pair is not None:
            checkpoint.pair = self._pair
        if (held := self.held()) is not None:
            checkpoint.held = held
        payload = json.dumps(checkpoint.to_json(), indent=1, sort_keys=True).encode()
        real = self.real
        tmp = real.with_name(f".{real.name}.{os.getpid()}.tmp")
        try:
            real.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, payload)
                os.fsync(fd)
                _verify(fd, payload)
            finally:
                os.close(fd)
            if real.exists():
                self._keep_backup()
            os.replace(tmp, real)
            fsync_dir(real.parent)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise CheckpointError(
                f"checkpoint {self.path} cannot be written: {exc.strerror or exc}; the previous version is kept"
            ) from None

    def _keep_backup(self) -> None:
        """Point ``<name>.backup`` at the current version without a moment where neither file exists."""
        staged = self.backup.with_name(f".{self.backup.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
        try:
            try:
                os.link(self.real, staged)
            except OSError:  # a file system without hard links
                shutil.copy2(self.real, staged)
            os.replace(staged, self.backup)
        except OSError:
            with contextlib.suppress(OSError):
                staged.unlink()
            raise

    def check_writable(self) -> None:
        """Fail before any work starts when the checkpoint's directory cannot take a file."""
        directory = self.real.parent
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise CheckpointError(f"checkpoint directory {directory} cannot be created: {exc.strerror}") from None
        if not os.access(directory, os.W_OK) or (self.real.exists() and not os.access(self.real, os.W_OK)):
            raise CheckpointError(f"checkpoint {self.path} is not writable")
        if self.real.is_dir():
            raise CheckpointError(f"checkpoint {self.path} is a directory")

    def in_use(self) -> bool:
        """Does a running mcdc hold this checkpoint's lock? (asked without taking it for long)"""
        try:
            fd = os.open(self.real.with_name(self.real.name + ".lock"), os.O_RDWR)
        except OSError:
            return False  # no lock file: no run holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
        finally:
            os.close(fd)  # closing lets a lock it took go
        return False

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on ``<checkpoint>.lock`` (beside the real file, when the checkpoint path is a
        link) for the duration; a second holder fails at once. The lock file is removed on release, so a run
        leaves nothing behind but its checkpoint (none, when it was refused before saving one)."""
        self.check_writable()
        lock_path = self.real.with_name(self.real.name + ".lock")
        fd = _lock(lock_path, self.path)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)  # still locked: a run that opened it meanwhile sees a removed file
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _lock(lock_path: Path, checkpoint: Path) -> int:
    """An open descriptor of ``lock_path`` holding its exclusive lock. A holder removes the file as it
    releases it: a lock taken on a file no longer at ``lock_path`` is let go and taken again on the new one."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise CheckpointLocked(
                    f"checkpoint {checkpoint} is in use by another mcdc process; not starting a second run"
                ) from None
            raise CheckpointError(f"cannot lock checkpoint {checkpoint}: {exc.strerror}") from None
        try:
            current = os.stat(lock_path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _roles(identities: dict[str, str | None], roles: list[str]) -> str:
    return " and ".join(f"{role} {quoted(identities[role])}" for role in roles)


def write_all(fd: int, payload: bytes) -> None:
    """Write every byte: a write may take only part of them (a nearly full disk, a file size limit)."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _verify(fd: int, payload: bytes) -> None:
    """Read the written file back: a device that acknowledged bytes it did not keep fails here, before
    the file replaces the current checkpoint."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, max(len(payload), 1) + 1):
        chunks.append(chunk)
    if b"".join(chunks) != payload:
        raise OSError(errno.EIO, "the file read back differs from what was written")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
