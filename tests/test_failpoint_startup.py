"""A run's checks of the source at start (members, privileges, the selection's namespaces) meet a retryable
error as its later reads do: retried, not the end of the run. Found by the chaos harness's fail points
(tests/chaos/failpoints.py): a tail restarted while the source's listCollections failed with
HostUnreachable exited 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pymongo
import pytest

from tests.support.compare import assert_identical
from tests.support.failpoint import HOST_UNREACHABLE, SHUTDOWN_IN_PROGRESS, close_connection, error, failing

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "fault", [error(HOST_UNREACHABLE), error(SHUTDOWN_IN_PROGRESS), close_connection()], ids=lambda f: f.name
)
def test_a_sync_whose_listing_of_the_source_fails_at_start_retries_it(
    source_uri: str, target_uri: str, tmp_path: Path, fault: object
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.app.users.insert_many([{"_id": i, "n": i} for i in range(20)])
    argv = [sys.executable, "-m", "replicator.cli", "sync", "-s", source_uri, "-t", target_uri]
    argv += ["-c", str(tmp_path / "cp.json"), "--no-progress", "--retry-initial-delay", "0.1"]
    with failing(source_uri, fault, ["listCollections"], times=2):  # type: ignore[arg-type]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "waiting for the source, retrying" in done.stderr and "Traceback" not in done.stderr
    assert "full error" not in done.stderr  # the server's message, in one line
    assert_identical(source_uri, target_uri)
