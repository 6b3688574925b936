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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from replicator.checkpoint.model import (
    DEPLOYMENT,
    FORMAT,
    VERSION,
    Checkpoint,
    SnapshotProgress,
    StreamScope,
    advance,
)
from replicator.errors import CheckpointError, CheckpointLocked, ConfigError, quoted

#: what a checkpoint holds, re-exported where its file is written (the name its importers use)
__all__ = [
    "DEPLOYMENT", "FORMAT", "VERSION", "Checkpoint", "CheckpointStore", "SnapshotProgress", "StreamScope", "advance",
    "fsync_dir", "write_all",
]  # fmt: skip


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
