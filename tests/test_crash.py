"""kill -9 at any moment, run the same command again: the target ends identical, finished partitions are
not copied again."""

from __future__ import annotations

import json
import os
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
from tests.support.corpus import load_bulk

pytestmark = pytest.mark.integration


def mcdc(*args: str) -> list[str]:
    return [sys.executable, "-m", "replicator.cli", *args]


def _checkpoint(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _sync_args(source: str, target: str, cp: Path) -> list[str]:
    return mcdc(
        "sync", "--source", source, "--target", target, "--checkpoint", str(cp),
        "--partition-docs", "1500", "--split", "always", "--batch-docs", "100", "--workers", "2",
        "--no-progress", "--json",
    )  # fmt: skip


def _kill_when(
    proc: subprocess.Popen[bytes], cp: Path, ready: Callable[[dict[str, Any]], bool], timeout: float = 60.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _checkpoint(cp)
        if state is not None and ready(state):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return state
        assert proc.poll() is None, f"sync ended before the kill point: {proc.communicate()}"
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("kill point never reached")


def test_kill_9_mid_snapshot_then_resume(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "crash", "a", 9000, doc_size=400)
        load_bulk(client, "crash", "b", 3000, doc_size=400, seed=1)
    cp = tmp_path / "cp.json"
    proc = subprocess.Popen(_sync_args(source_uri, target_uri, cp), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_at = _kill_when(proc, cp, lambda s: len(s["snapshot"]["done"]) >= 2)
    assert killed_at["snapshot"]["status"] == "in_progress"
    with pymongo.MongoClient(source_uri) as client:  # the source moves on while mcdc is down
        client.crash.a.delete_many({"_id": {"$lt": 50}})
        client.crash.b.update_many({}, {"$set": {"after_crash": True}})
    done = subprocess.run(_sync_args(source_uri, target_uri, cp), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert summary["snapshot"] == "resumed"
    assert summary["documents"] < 12000 - 1500  # finished partitions were not copied again
    assert_identical(source_uri, target_uri)


def test_kill_9_repeatedly_at_any_moment(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "crash", "a", 6000, doc_size=300)
    cp = tmp_path / "cp.json"
    for delay in (0.4, 0.9, 1.5, 2.2):
        proc = subprocess.Popen(
            _sync_args(source_uri, target_uri, cp), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        time.sleep(delay)
        with pymongo.MongoClient(source_uri) as client:
            client.crash.a.insert_one({"_id": f"w{delay}", "v": delay})
            client.crash.a.update_one({"_id": int(delay * 100)}, {"$set": {"k": delay}})
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = _checkpoint(cp)
        assert state is None or state["format"] == "mcdc-checkpoint"  # never a torn file
    done = subprocess.run(_sync_args(source_uri, target_uri, cp), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert_identical(source_uri, target_uri)


def test_kill_9_mid_partition_copies_again_only_the_batches_in_flight(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """One whole-collection partition, killed partway: the rerun starts after the last acknowledged _id
    (then goes on into the string _ids, a later type bracket), not from zero."""
    from replicator.bsonkit.extjson import from_jsonable

    total, strings, workers, batch = 20_000, 500, 2, 100
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "crash", "big", total, doc_size=200)
        client.crash.big.insert_many([{"_id": f"s{i:04d}", "v": i} for i in range(strings)])
    cp = tmp_path / "cp.json"
    args = mcdc(
        "sync", "--source", source_uri, "--target", target_uri, "--checkpoint", str(cp), "--split", "never",
        "--batch-docs", str(batch), "--workers", str(workers), "--no-progress", "--json",
    )  # fmt: skip

    def acked(state: dict[str, Any]) -> int:
        value = (state["snapshot"].get("resume") or {}).get("crash.big#0")
        return -1 if value is None else int(from_jsonable(value))

    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # a quarter in: checkpoint saves come once a second, and an idle machine copies the rest in two (the
    # second half alone could pass between two saves)
    killed_at = _kill_when(proc, cp, lambda s: acked(s) >= total // 4, timeout=120)
    with pymongo.MongoClient(source_uri) as client:  # on both sides of the resume point, while mcdc is down
        client.crash.big.update_many({"_id": {"$in": [3, total - 3]}}, {"$set": {"after_crash": True}})
        client.crash.big.delete_one({"_id": 7})
    done = subprocess.run(args, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert summary["snapshot"] == "resumed"
    not_acked = total - (acked(killed_at) + 1) + strings
    assert summary["documents"] <= not_acked + workers * workers * batch
    # what the first run copied is counted as copied before (the delete of _id 7 came after it), not as this
    # run's: the progress starts where the first run stopped
    assert summary["copied_before"] == acked(killed_at)
    first_line = next(line for line in done.stderr.decode().splitlines() if "snapshot: " in line and "/" in line)
    assert int(first_line.split("snapshot: ")[1].split("/")[0].replace(",", "")) >= acked(killed_at), first_line
    assert_identical(source_uri, target_uri)
