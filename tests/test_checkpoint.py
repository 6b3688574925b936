"""Checkpoint files round-trip exactly, are written atomically with a backup, and lock."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from bson import Binary, Int64
from bson.timestamp import Timestamp

from replicator.checkpoint import Checkpoint, CheckpointStore, SnapshotProgress
from replicator.errors import CheckpointError, CheckpointLocked
from replicator.events import Namespace, Position
from replicator.source.partitions import Partition


def _sample() -> Checkpoint:
    part = Partition(Namespace("db", "c"), 1, "number", lower=Int64(5), upper=7.5, estimated_docs=3)
    return Checkpoint(
        "rs:rs0",
        position=Position(resume_token={"_data": "8265AB"}, cluster_time=Timestamp(1700000000, 7)),
        snapshot=SnapshotProgress(status="in_progress", plan=[part.to_json()], done={"db.c#0"}),
    )


def test_round_trip_is_exact(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    store.save(_sample())
    loaded = store.load()
    assert loaded is not None
    assert loaded.position.cluster_time == Timestamp(1700000000, 7)
    assert loaded.position.resume_token == {"_data": "8265AB"}
    assert loaded.snapshot.done == {"db.c#0"}
    part = Partition.from_json(loaded.snapshot.plan[0])
    assert isinstance(part.lower, Int64) and part.lower == 5 and part.upper == 7.5
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600


def test_binary_token_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    cp = _sample()
    cp.position = Position(resume_token={"_data": Binary(b"\x01\x02", 0)})
    store.save(cp)
    loaded = store.load()
    assert loaded is not None and loaded.position.resume_token == {"_data": b"\x01\x02"}


def test_previous_version_kept_as_backup(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    cp = _sample()
    store.save(cp)
    cp.snapshot.done.add("db.c#1")
    store.save(cp)
    backup = json.loads(store.backup.read_text())
    assert backup["snapshot"]["done"] == ["db.c#0"]
    current = store.load()
    assert current is not None and current.snapshot.done == {"db.c#0", "db.c#1"}
    # a checkpoint deleted by hand while its backup remains: say so rather than resume from the backup
    store.path.unlink()
    with pytest.raises(CheckpointError, match=r"missing but cp\.json\.backup exists"):
        store.load()


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="is corrupt"):
        CheckpointStore(path).load()
    path.write_text(json.dumps({"format": "mcdc-checkpoint", "version": 99}))
    with pytest.raises(CheckpointError, match="version 99"):
        CheckpointStore(path).load()


def test_unwritable_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot be created"):
        CheckpointStore(Path("/proc/mcdc/cp.json")).check_writable()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        store = CheckpointStore(ro / "cp.json")
        if os.access(ro, os.W_OK):  # running as root: permissions do not bind
            pytest.skip("root ignores directory permissions")
        with pytest.raises(CheckpointError, match="not writable"):
            store.check_writable()
    finally:
        ro.chmod(0o700)


def test_second_holder_is_refused(tmp_path: Path) -> None:
    a = CheckpointStore(tmp_path / "cp.json")
    b = CheckpointStore(tmp_path / "cp.json")
    with a.locked(), pytest.raises(CheckpointLocked, match="in use by another mcdc process"), b.locked():
        pass
    with b.locked():
        pass
