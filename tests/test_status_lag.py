"""The lag of a checkpoint that records none (issue 41): one saved mid-snapshot, or one an older mcdc wrote
(made here by removing the field from a real one). ``status --checkpoint`` alone has no source to measure
it against: it says the lag is unknown, and the position's time, never a number against this machine's
clock (which grows on an idle source that is caught up). With ``--source`` it is measured against the
source's time. ``canCommit`` is one answer whichever way status finds the checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.corpus import load_bulk
from tests.test_cli import _mcdc

pytestmark = pytest.mark.integration


def _status(*args: str) -> dict[str, Any]:
    result = _mcdc("status", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _shown_lag(*args: str) -> str:
    result = _mcdc("status", *args)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("lag ")]
    return line


def _both_ways(pair: tuple[str, ...], cp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """status of ``cp`` found by --checkpoint alone, and given the source too."""
    alone = _status("-c", str(cp))
    measured = _status("-c", str(cp), "-s", pair[1])
    assert alone["checkpoint"] == measured["checkpoint"] == str(cp)
    return alone, measured


def _unknown_alone(alone: dict[str, Any], cp: Path) -> None:
    """Alone: no lag, no clock; the line says as of when its position is, and how to measure it."""
    assert alone["lag_s"] is None and alone["progress"]["lagTimeSeconds"] is None, alone
    assert alone["lag_measured_against"] is None, alone
    line = _shown_lag("-c", str(cp))
    assert "local clock" not in line and line.split()[1] == "unknown:", line
    assert alone["position"]["time"] in line and "--source" in line, line


def _idle_past(cp: Path) -> None:
    """Until this machine's clock is three seconds past the checkpoint's position."""
    position = json.loads(cp.read_text())["position"]["cluster_time"]["t"]
    deadline = time.monotonic() + 60
    while time.time() < position + 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_an_older_checkpoint_without_a_recorded_lag_is_unknown_alone_measured_with_the_source_and_one_can_commit(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(20)])
    cp = tmp_path / "cp.json"
    pair = ("-s", source_uri, "-t", target_uri, "-c", str(cp))
    assert _mcdc("sync", *pair, "--no-progress").returncode == 0
    older = json.loads(cp.read_text())
    assert older.pop("lag_s") == 0  # as an mcdc before the field wrote it
    cp.write_text(json.dumps(older))
    _idle_past(cp)

    alone, measured = _both_ways(pair, cp)
    _unknown_alone(alone, cp)
    assert measured["lag_measured_against"] == "source" and measured["lag_s"] is not None, measured
    assert "(against the source" in _shown_lag("-c", str(cp), "-s", source_uri)
    # the measure is status's, not the run's: canCommit waits for a run to record one, either way
    assert alone["progress"]["canCommit"] is measured["progress"]["canCommit"] is False
    for found in (alone, measured):
        assert "catch-up" in found["progress"]["info"], found["progress"]

    assert _mcdc("catch-up", *pair, "--no-progress").returncode == 0  # records it
    alone, measured = _both_ways(pair, cp)
    for found in (alone, measured):
        assert found["lag_s"] == 0 and found["lag_measured_against"] == "last save", found
    assert alone["progress"]["canCommit"] is measured["progress"]["canCommit"] is True


def test_a_checkpoint_saved_mid_snapshot_is_unknown_alone_measured_with_the_source(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.mid.a.drop()
        load_bulk(client, "mid", "a", 3000, doc_size=200)
    cp = tmp_path / "cp.json"
    args = [sys.executable, "-m", "replicator.cli", "sync", "-s", source_uri, "-t", target_uri, "-c", str(cp)]
    args += ["--no-progress", "--workers", "1", "--split", "always", "--partition-docs", "500"]
    proc = subprocess.Popen([*args, "--max-read-rate", "500"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:  # a partition done, the snapshot not
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            saved = json.loads(cp.read_text()) if cp.exists() else None
            if saved is not None and saved["snapshot"]["done"]:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    saved = json.loads(cp.read_text())
    assert saved["snapshot"]["status"] == "in_progress" and saved["lag_s"] is None, saved
    _idle_past(cp)

    alone, measured = _both_ways(("-s", source_uri), cp)
    _unknown_alone(alone, cp)
    assert measured["lag_measured_against"] == "source" and measured["lag_s"] >= 0, measured
    assert alone["progress"]["canCommit"] is measured["progress"]["canCommit"] is False
