"""The migrations this machine's mcdc runs keep, per target: who writes which target namespaces.

Two migrations must never write one target namespace: each would undo the other's writes, and one's
rename or drop would take the other's documents with it. A checkpoint says what its own migration
writes, but not which other migrations write the same target; this file does. Every run of sync,
catch-up or tail records its migration (its checkpoint, its target's identity, its selection and the target
namespaces it maps) under an exclusive lock, after it has compared itself with the migrations already
recorded. Two runs started at the same moment take the lock in turn, so the second sees the first.

A migration stays recorded while its checkpoint exists (it can be resumed) and has not been cut over, or
while a run holds its checkpoint's lock (one that has not saved its checkpoint yet). The file lives in the
state directory (``$XDG_STATE_HOME/mcdc``): runs on other machines, or under other users, record theirs in
their own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from replicator.checkpoint.store import Checkpoint, CheckpointStore, fsync_dir, write_all
from replicator.errors import CheckpointError

FORMAT = "mcdc-migrations"


@dataclass(frozen=True)
class Lease:
    """One migration as the registry records it."""

    checkpoint: str  # the checkpoint file (its real path)
    target: str  # the target's identity (as the checkpoint's ``target_identity``)
    source: str  # the source's identity
    recorded: dict[str, Any] = field(default_factory=dict)  # its selection (replay.recorded.Recorded's JSON)
    targets: tuple[str, ...] = ()  # the target namespaces it mapped when it last started
    #: target namespaces its copies wrote beyond its first snapshot (a widened selection's): its own, even
    #: after an older version of its checkpoint, which does not know of them, is restored
    owned: tuple[str, ...] = ()
    #: other names of its target (job.preflight.target_keys): a target found under any is the same target
    keys: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> Lease | None:
        try:
            return cls(
                checkpoint=str(data["checkpoint"]),
                target=str(data["target"]),
                source=str(data["source"]),
                recorded=dict(data.get("recorded") or {}),
                targets=tuple(str(ns) for ns in data.get("targets") or ()),
                owned=tuple(str(ns) for ns in data.get("owned") or ()),
                keys=tuple(str(key) for key in data.get("keys") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # an entry this mcdc cannot read is dropped, not fatal


@dataclass(frozen=True)
class Held:
    """A recorded migration that still holds its target namespaces, as its checkpoint says now."""

    lease: Lease
    running: bool
    checkpoint: Checkpoint | None  # None: a run holds the lock but saved nothing yet

    @property
    def recorded(self) -> dict[str, Any]:
        """Its selection: the checkpoint's (a later run may have changed it), else the one recorded."""
        if self.checkpoint is not None and self.checkpoint.recorded is not None:
            return self.checkpoint.recorded
        return self.lease.recorded


class Registry:
    """The registry file, ``migrations.json`` in ``directory``, and its lock."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "migrations.json"
        self._lock = directory / "migrations.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[list[Lease]]:
        """The recorded migrations, under an exclusive lock (waited for: other runs hold it only for the
        moment they compare and record)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CheckpointError(f"the migrations file {self.path} cannot be opened: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self._load()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _load(self) -> list[Lease]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            return []  # unreadable: rebuilt from the runs that record themselves from now on
        entries = data.get("migrations") if isinstance(data, dict) else None
        leases = [Lease.from_json(entry) for entry in entries or ()]
        return [lease for lease in leases if lease is not None]

    def save(self, leases: list[Lease]) -> None:
        """Write the registry (only while :meth:`locked`): atomically, as checkpoints are."""
        payload = json.dumps(
            {"format": FORMAT, "migrations": [asdict(lease) for lease in leases]}, indent=1, sort_keys=True
        ).encode()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, payload)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise CheckpointError(f"the migrations file {self.path} cannot be written: {exc.strerror}") from None


def held(lease: Lease) -> Held | None:
    """Does this recorded migration still hold its target namespaces? None once its checkpoint is gone
    (and no run holds its lock) or was cut over; a checkpoint that cannot be read still holds them."""
    store = CheckpointStore(Path(lease.checkpoint))
    running = store.in_use()
    if not running and not store.real.exists():
        return None  # deleted (its backup, if kept, is a person's to restore)
    try:
        cp = store.load()
    except CheckpointError:
        return Held(lease, running, None)
    if cp is None:
        return Held(lease, running, None)  # running: it has not saved its checkpoint yet
    if cp.cutover is not None:
        return None
    return Held(lease, running, cp)
