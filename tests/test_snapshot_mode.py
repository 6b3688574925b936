"""The snapshot decision (Debezium's snapshot.mode) is a pure function of the checkpoint and the options."""

from __future__ import annotations

import pytest

from replicator.snapshot.mode import Checkpointed, Start, decide, drops_target

NONE = None
RUNNING = Checkpointed("in_progress", True)
COPIED = Checkpointed("copied", True)
DONE = Checkpointed("done", True)
REPLAYING = Checkpointed("none", True)  # --snapshot never / --start-at: a position and no snapshot
EMPTY = Checkpointed("none", False)  # --snapshot-only of a standalone: no position


@pytest.mark.parametrize(
    ("saved", "mode", "expected"),
    [
        (NONE, "initial", Start.FRESH), (DONE, "initial", Start.REPLAY), (EMPTY, "initial", Start.FRESH),
        (RUNNING, "initial", Start.RESUME), (COPIED, "initial", Start.RESUME),
        (NONE, "always", Start.FRESH), (DONE, "always", Start.FRESH), (RUNNING, "always", Start.RESUME),
        (NONE, "never", Start.REPLAY), (DONE, "never", Start.REPLAY), (EMPTY, "never", Start.REPLAY),
        (NONE, "when_needed", Start.FRESH), (DONE, "when_needed", Start.CHECK_HISTORY),
        (REPLAYING, "when_needed", Start.CHECK_HISTORY), (RUNNING, "when_needed", Start.RESUME),
    ],
)  # fmt: skip
def test_each_mode_against_each_checkpoint(saved: Checkpointed | None, mode: str, expected: Start) -> None:
    assert decide(saved, mode=mode) is expected


def test_start_at_only_without_a_checkpoint_and_force_wins_over_everything() -> None:
    assert decide(NONE, mode="initial", start_at=True) is Start.START_AT
    assert decide(DONE, mode="initial", start_at=True) is Start.REPLAY  # the checkpoint's position wins
    for saved in (NONE, RUNNING, COPIED, DONE):
        assert decide(saved, mode="never", start_at=True, force=True) is Start.FRESH
    assert decide(DONE, mode="never", snapshot_only=True) is Start.FRESH


def test_what_a_new_snapshot_may_drop() -> None:
    assert not drops_target(NONE, drop_target=False)
    assert drops_target(NONE, drop_target=True)
    assert drops_target(DONE, drop_target=False)  # --snapshot always over its own finished copy
    assert drops_target(EMPTY, drop_target=False, force=True)
    assert not drops_target(REPLAYING, drop_target=False)
