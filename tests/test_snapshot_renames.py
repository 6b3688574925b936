"""``mcdc sync`` (the asyncio engine) with a collection renamed while its snapshot copies: paused once the
checkpoint shows the first partition copied, the source renames ``shop.z`` (and changes it), then the copy
goes on. Into MongoDB the target is then the source's, and ``mcdc verify`` says so; into an event sink
(jsonl) the records, folded with their renames and drops, rebuild the source."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.compare import assert_identical
from tests.support.rebuild import assert_same, rebuild_lines, server_docs

pytestmark = pytest.mark.integration

Db = Any  # a pymongo Database


def _renamed(db: Db) -> None:
    db.z.rename("z_renamed")
    db.z_renamed.update_one({"_id": 7}, {"$set": {"v": "after the rename"}})
    db.z_renamed.insert_one({"_id": "new", "v": "after the rename"})


def _rotated(db: Db) -> None:
    """Renamed, and a new ``z`` whose ``_id``s fall in the old one's last range (past its last ``_id``): a
    copy reading by name meets them there."""
    db.z.rename("z_renamed")
    db.create_collection("z")
    db.z.insert_many([{"_id": 1000 + i, "v": "new z"} for i in range(20)])


def _dropped_and_made_again(db: Db) -> None:
    db.z.drop()
    db.create_collection("z")
    db.z.insert_many([{"_id": 1000 + i, "v": "new z"} for i in range(20)])


CHANGES: dict[str, Callable[[Db], None]] = {
    "renamed": _renamed,
    "renamed-and-made-again": _rotated,
    "dropped-and-made-again": _dropped_and_made_again,
}


def _mcdc(*args: str) -> list[str]:
    return [sys.executable, "-m", "replicator.cli", *args]


def _copy_paused_after_its_first_partition(source: str, target: str, cp: Path, change: Callable[[Db], None]) -> str:
    """A sync copying 400 documents of shop.a, then 400 of shop.z, 40 a partition in batches of 10, paused
    (SIGSTOP) once its checkpoint shows a partition done, ``change`` made, then run to its end. Its log."""
    with pymongo.MongoClient(source) as client:
        for coll in ("a", "z"):
            client.shop.create_collection(coll)
            client.shop[coll].insert_many([{"_id": i, "coll": coll, "pad": "x" * 200} for i in range(400)])
        args = ("-s", source, "-t", target, "-c", str(cp), "--include", r"shop\..*", "--split", "always")
        tuning = ("--partition-docs", "40", "--batch-docs", "10", "--workers", "1", "--no-progress")
        proc = subprocess.Popen(_mcdc("sync", *args, *tuning), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not _done(cp):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no partition copied within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGSTOP)
        try:
            snapshot = json.loads(cp.read_text())["snapshot"]
            assert snapshot["status"] == "in_progress" and not [p for p in snapshot["done"] if p.startswith("shop.z")]
            change(client.shop)
        finally:
            proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        return err.decode()


def _done(cp: Path) -> bool:
    try:
        return bool(json.loads(cp.read_text())["snapshot"]["done"])
    except (FileNotFoundError, ValueError, KeyError):
        return False


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_collection_renamed_mid_copy_into_mongodb_is_copied_again_and_verifies(
    source_uri: str, target_uri: str, tmp_path: Path, name: str
) -> None:
    log = _copy_paused_after_its_first_partition(source_uri, target_uri, tmp_path / "cp.json", CHANGES[name])
    assert "copying again from the source: " in log  # the DDL window's copy of the namespaces it touched
    assert_identical(source_uri, target_uri)
    verify = subprocess.run(
        _mcdc("verify", "-s", source_uri, "-t", target_uri, "--include", r"shop\..*"), capture_output=True, timeout=120
    )
    assert verify.returncode == 0, verify.stdout.decode() + verify.stderr.decode()


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_collection_renamed_mid_copy_into_an_event_sink_rebuilds_the_source(
    source_uri: str, tmp_path: Path, name: str
) -> None:
    path = tmp_path / "events.jsonl"
    log = _copy_paused_after_its_first_partition(source_uri, f"jsonl:{path}", tmp_path / "cp.json", CHANGES[name])
    if name != "dropped-and-made-again":
        assert "shop.z_renamed: copied" in log  # the replay copied the collection renamed within the selection
    assert_same(rebuild_lines(path.read_bytes().splitlines()), server_docs(source_uri, ["shop"]))
