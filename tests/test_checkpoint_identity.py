"""A checkpoint belongs to one source and one target: reused against another target, or with source and
target swapped, it is refused before anything is written; a checkpoint written before the identities were
recorded is still accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import LocalServer, connect, user_databases

pytestmark = pytest.mark.integration


def _mcdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args, "--no-progress"], capture_output=True, text=True, timeout=120
    )


def _status(cp: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "status", "-c", str(cp), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcdc: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def _docs(uri: str) -> dict[str, list[dict[str, Any]]]:
    with connect(uri) as client:
        return {
            f"{db}.{coll}": list(client[db][coll].find().sort("_id", 1))
            for db in user_databases(client)
            for coll in client[db].list_collection_names()
        }


@pytest.fixture
def synced(source_uri: str, target_uri: str, tmp_path: Path) -> Path:
    """A checkpoint of a finished sync from the source to the target."""
    with connect(source_uri) as client:
        client.db.c.insert_many([{"_id": i, "v": i} for i in range(20)])
    cp = tmp_path / "cp.json"
    first = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp))
    assert first.returncode == 0, first.stderr
    return cp


@pytest.fixture
def other_server(tmp_path: Path) -> Iterator[LocalServer]:
    """A second, empty target server: a replica set of the same name as the target's."""
    server = LocalServer(tmp_path / "other")
    server.spawn()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_checkpoint_records_and_shows_both_identities(synced: Path, source_uri: str, target_uri: str) -> None:
    status = _status(synced)
    data = json.loads(synced.read_text())
    assert status["source_identity"] == data["source_identity"] and status["target_identity"] == data["target_identity"]
    assert status["source_identity"] != status["target_identity"]
    human = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "status", "-c", str(synced)], capture_output=True, text=True
    )
    assert data["source_identity"] in human.stdout and data["target_identity"] in human.stdout


def test_checkpoint_reused_for_an_event_target_is_refused(synced: Path, source_uri: str, tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    before = synced.read_bytes()
    result = _mcdc("catch-up", "-s", source_uri, "-t", f"jsonl:{out}", "-c", str(synced))
    error = _one_error(result)
    target_id = json.loads(before)["target_identity"]
    assert f"target '{target_id}'" in error and f"target 'jsonl:{out}#mcdc'" in error
    assert "another --checkpoint" in error
    assert not out.exists()  # not even created
    assert synced.read_bytes() == before


def test_checkpoint_reused_for_another_target_server_is_refused(
    synced: Path, source_uri: str, target_uri: str, other_server: LocalServer
) -> None:
    """Both targets are replica sets of the same name: the name alone would let the copy start."""
    before = synced.read_bytes()
    for command, extra in (("catch-up", ()), ("sync", ("--snapshot", "always", "--drop-target"))):
        result = _mcdc(command, "-s", source_uri, "-t", other_server.uri, "-c", str(synced), *extra)
        error = _one_error(result)
        assert json.loads(before)["target_identity"] in error and str(other_server.port) in error, error
    assert _docs(other_server.uri) == {}
    assert synced.read_bytes() == before


def test_swapped_source_and_target_never_replace_data(synced: Path, source_uri: str, target_uri: str) -> None:
    with connect(source_uri) as client:  # the source moved on: the target is behind
        client.db.c.delete_many({"_id": {"$lt": 10}})
        client.db.c.insert_one({"_id": "new"})
    source_before = _docs(source_uri)
    before = synced.read_bytes()
    for extra in ((), ("--snapshot", "always", "--drop-target")):
        result = _mcdc("sync", "-s", target_uri, "-t", source_uri, "-c", str(synced), *extra)
        error = _one_error(result)
        assert "source" in error and "target" in error and "another --checkpoint" in error
    assert _docs(source_uri) == source_before
    assert synced.read_bytes() == before


def test_checkpoint_written_before_identities_is_accepted(synced: Path, source_uri: str, target_uri: str) -> None:
    data = json.loads(synced.read_text())
    old = {k: v for k, v in data.items() if k not in ("source_identity", "target_identity")}
    synced.write_text(json.dumps(old))
    assert _status(synced)["target_identity"] is None
    with connect(source_uri) as client:
        client.db.c.insert_one({"_id": "late"})
    result = _mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(synced))
    assert result.returncode == 0, result.stderr
    assert _docs(target_uri) == _docs(source_uri)
    filled = json.loads(synced.read_text())
    assert (filled["source_identity"], filled["target_identity"]) == (data["source_identity"], data["target_identity"])
