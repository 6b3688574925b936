"""A disk too full for the next checkpoint stops the run with one line and keeps the last good checkpoint
and its backup (simulated with a file size limit, RLIMIT_FSIZE, on the mcdc process)."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import connect

pytestmark = pytest.mark.integration

#: Larger than the checkpoint of a one-partition sync, smaller than a plan of one partition per document.
FILE_SIZE_LIMIT = 8192


def _mcdc(*args: str, file_size_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit_file_size() -> None:
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args],
        capture_output=True, text=True, timeout=120, preexec_fn=limit_file_size,
    )  # fmt: skip


def test_checkpoint_too_large_for_the_disk_keeps_the_previous_one(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with connect(source_uri) as client:
        client.db.c.insert_many([{"_id": i, "v": "x" * 10} for i in range(200)])
    cp = tmp_path / "cp.json"
    backup = tmp_path / "cp.json.backup"
    common = ("--source", source_uri, "--target", target_uri, "--checkpoint", str(cp), "--no-progress")
    first = _mcdc("sync", *common)
    assert first.returncode == 0, first.stderr
    before = cp.read_bytes(), backup.read_bytes()
    assert len(before[0]) < FILE_SIZE_LIMIT
    big = _mcdc(
        "sync", *common, "--snapshot", "always", "--drop-target", "--partition-docs", "1", "--split", "always",
        file_size_limit=FILE_SIZE_LIMIT,
    )  # fmt: skip
    assert big.returncode == 2, big.stderr
    errors = [line for line in big.stderr.splitlines() if line.startswith("mcdc: error:")]
    assert "Traceback" not in big.stderr and len(errors) == 1, big.stderr
    assert "cannot be written: File too large" in errors[0] and str(cp) in errors[0]
    assert (cp.read_bytes(), backup.read_bytes()) == before
    json.loads(cp.read_bytes())
    json.loads(backup.read_bytes())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json", "cp.json.backup"]
    with connect(target_uri) as client:  # refused before --drop-target dropped anything
        assert client.db.c.count_documents({}) == 200
