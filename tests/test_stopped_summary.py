"""Unit tests (no server) of what a run stopped by a signal says: where it stood, by its checkpoint, and
what the same command does next (the integration tests are tests/test_stopped_runs.py)."""

from __future__ import annotations

from replicator.observe.summary import Summary
from replicator.snapshot.mode import Checkpointed, stopped_at


def test_where_a_stopped_run_stood_is_read_from_its_checkpoint() -> None:
    assert stopped_at(None, follows=False) == "start"
    assert stopped_at(Checkpointed("in_progress", True), follows=True) == "snapshot"
    assert stopped_at(Checkpointed("copied", True), follows=True) == "window"
    assert stopped_at(Checkpointed("done", True), follows=False) == "replay"
    assert stopped_at(Checkpointed("none", True), follows=False) == "replay"
    assert stopped_at(Checkpointed("done", True), follows=True) is None  # a tail's ordinary end


def test_a_run_stopped_mid_snapshot_counts_what_it_copied_and_never_says_skipped() -> None:
    summary = Summary("sync", "src", "dst", "cp.json", collections=1, documents=1500, snapshot_s=3.0)
    summary.snapshot, summary.collections_planned, summary.stopped = "stopped", 3, "snapshot"
    summary.copied_before = 200
    lines = summary.lines()
    assert lines[0] == (
        "sync stopped by a signal after 0.0 s during the snapshot: 1 of 3 collections, 1,500 documents copied so "
        "far (500 docs/s, after 200 an earlier run copied), 0 change events replayed"
    )
    assert lines[1].startswith("the checkpoint holds what the target acknowledged: run the same command again to go")
    assert "skipped" not in "\n".join(lines)
    assert summary.to_json()["stopped"] == "snapshot" and summary.to_json()["snapshot"] == "stopped"


def test_a_bounded_run_stopped_after_its_copy_says_what_is_left() -> None:
    window = Summary("catch-up", "src", "dst", "cp.json", collections=2, documents=10, snapshot="completed")
    window.stopped = "window"
    assert "before the changes made during it were replayed" in window.lines()[0]
    assert "run the same command again to replay them and build the indexes" in window.lines()[1]
    replay = Summary("sync", "src", "dst", "cp.json", events=4, stopped="replay")
    assert replay.lines()[0].startswith("sync stopped by a signal after 0.0 s before it replayed up to the source's")
    assert not Summary("tail", "src", "dst", "cp.json").lines()[1].startswith("the checkpoint holds")
