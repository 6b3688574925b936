"""A run stopped by a signal in the middle of its snapshot says so (issue 41): where it stood, what it copied
so far, that the checkpoint is saved and what the same command does next; never "snapshot skipped". The
same command then finishes the migration, and verify finds the target identical."""

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

pytestmark = pytest.mark.integration

_COLLECTIONS = ("a", "b", "c")
_DOCS = 1000  # per collection; at --max-read-rate 500, six seconds of copy


def _args(command: str, source: str, target: str, cp: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "replicator.cli", command, "-s", source, "-t", target, "-c", str(cp),
        "--no-progress", "--workers", "1", "--split", "never", "--batch-docs", "50", *extra,
    ]  # fmt: skip


def _checkpoint(cp: Path) -> dict[str, Any] | None:
    try:
        return json.loads(cp.read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _until_mid_snapshot(proc: subprocess.Popen[str], cp: Path, target: str) -> None:
    """Until the copy is under way: a partition done (so the checkpoint records it) and documents of another
    one on the target, the snapshot not finished."""
    deadline = time.monotonic() + 120
    with pymongo.MongoClient(target) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the run ended before the stop point: {proc.communicate()}"
            state = _checkpoint(cp)
            copied = sum(client.stopped[name].estimated_document_count() for name in _COLLECTIONS)
            if state is not None and state["snapshot"]["done"] and copied > _DOCS:
                assert state["snapshot"]["status"] == "in_progress", state["snapshot"]
                return
            time.sleep(0.05)
    raise AssertionError("the copy never got under way")


def _stopped_mid_snapshot(args: list[str], sig: signal.Signals, cp: Path, target: str) -> tuple[int, str, str]:
    """Run ``args`` with a read rate cap that makes its copy last seconds, and send ``sig`` mid-copy."""
    capped = [*args, "--max-read-rate", "500"]
    proc = subprocess.Popen(capped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _until_mid_snapshot(proc, cp, target)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def _stopped_lines(out: str, command: str, cp: Path) -> list[str]:
    """The summary of a run stopped during its snapshot: it says where it stopped, what it copied so far
    (a collection of three, and more documents than one holds) and what running it again does."""
    assert "snapshot skipped" not in out, out
    assert "finished" not in out.splitlines()[0], out
    lines = out.splitlines()
    assert lines[0].startswith(f"{command} stopped by a signal after "), out
    assert "during the snapshot" in lines[0], out
    done = len(json.loads(cp.read_text())["snapshot"]["done"])  # one partition a collection (--split never)
    assert 1 <= done < len(_COLLECTIONS) and f"{done} of 3 collections" in lines[0], out
    copied = int(lines[0].split(" documents copied so far")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert _DOCS < copied < len(_COLLECTIONS) * _DOCS, out
    said = [line for line in lines if "run the same command again" in line]
    assert len(said) == 1 and "checkpoint" in said[0] and "snapshot" in said[0], out
    return lines


def _verify(source: str, target: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "verify", "-s", source, "-t", target, "--include", r"stopped\..*"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def _load(source: str) -> None:
    with pymongo.MongoClient(source) as client:
        for seed, name in enumerate(_COLLECTIONS):
            client.stopped.create_collection(name)
            load_bulk(client, "stopped", name, _DOCS, doc_size=200, seed=seed)


@pytest.mark.parametrize(
    ("command", "sig"), [("sync", signal.SIGTERM), ("sync", signal.SIGINT), ("catch-up", signal.SIGTERM)]
)
def test_a_bounded_run_stopped_mid_snapshot_says_what_it_copied_and_the_same_command_finishes_it(
    command: str, sig: signal.Signals, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _load(source_uri)
    cp = tmp_path / "cp.json"
    args = _args(command, source_uri, target_uri, cp)
    code, out, err = _stopped_mid_snapshot(args, sig, cp, target_uri)
    assert code == 130, (code, out, err)  # interrupted: not done, not a failure
    _stopped_lines(out, command, cp)
    assert json.loads(cp.read_text())["snapshot"]["status"] == "in_progress"

    again = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["snapshot"] == "resumed" and summary["stopped"] is None, summary
    _verify(source_uri, target_uri)


def test_a_tail_stopped_mid_snapshot_says_what_it_copied_and_the_same_command_finishes_it(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A tail stopped by a signal exits 0 (its ordinary end), and says the snapshot was stopped."""
    _load(source_uri)
    cp = tmp_path / "cp.json"
    args = _args("tail", source_uri, target_uri, cp)
    code, out, err = _stopped_mid_snapshot(args, signal.SIGTERM, cp, target_uri)
    assert code == 0, (out, err)
    _stopped_lines(out, "tail", cp)

    again = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while (state := _checkpoint(cp)) is None or state["snapshot"]["status"] != "done":
            assert again.poll() is None and time.monotonic() < deadline, again.communicate()
            time.sleep(0.1)
        again.send_signal(signal.SIGTERM)
        out, err = again.communicate(timeout=60)
    finally:
        if again.poll() is None:
            again.kill()
            again.communicate()
    assert again.returncode == 0, err
    assert out.startswith("tail finished in "), out
    _verify(source_uri, target_uri)
