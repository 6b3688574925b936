"""The snapshot decision (Debezium's ``snapshot.mode``): pure, so both engines take it the same way."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Start(enum.Enum):
    """How a run begins."""

    RESUME = "resume"  # finish the snapshot the checkpoint records
    START_AT = "start-at"  # no snapshot: replicate from --start-at
    CHECK_HISTORY = "check-history"  # --snapshot when_needed: a new snapshot only if the position left the oplog
    REPLAY = "replay"  # no snapshot: replay from the checkpoint (from now when there is none)
    FRESH = "fresh"  # take a new snapshot


@dataclass(frozen=True)
class Checkpointed:
    """What the decision needs to know of the saved checkpoint (None: there is none)."""

    status: str  # the snapshot's: none | in_progress | copied | done
    has_position: bool


def decide(
    saved: Checkpointed | None, *, mode: str, snapshot_only: bool = False, start_at: bool = False, force: bool = False
) -> Start:
    """``mode``: initial | always | never | when_needed; ``force``: a new snapshot is due whatever the
    checkpoint says (its position fell off the oplog, --on-history-lost resnapshot)."""
    if saved is not None and saved.status in ("in_progress", "copied") and not force:
        return Start.RESUME
    if saved is None and start_at and not force:
        return Start.START_AT
    if force or snapshot_only or mode == "always":
        return Start.FRESH
    if mode in ("initial", "when_needed") and (saved is None or not saved.has_position):
        return Start.FRESH
    if saved is not None and mode == "when_needed":
        return Start.CHECK_HISTORY
    return Start.REPLAY


def copies(saved: Checkpointed | None, *, mode: str, snapshot_only: bool = False, start_at: bool = False) -> bool:
    """Whether a run that begins with this checkpoint copies (a new snapshot, or the rest of one in
    progress), as far as its start can tell: a saved position found to have left the oplog later
    (--snapshot when_needed, --on-history-lost resnapshot) still makes it copy."""
    start = decide(saved, mode=mode, snapshot_only=snapshot_only, start_at=start_at)
    return start is Start.FRESH or (start is Start.RESUME and saved is not None and saved.status == "in_progress")


def drops_target(saved: Checkpointed | None, *, drop_target: bool, force: bool = False) -> bool:
    """Does a new snapshot replace what the target holds? With --drop-target, when forced, and when it
    replaces a finished snapshot of the same checkpoint (--snapshot always): that data is this run's own."""
    return drop_target or force or (saved is not None and saved.status == "done")


def stopped_at(saved: Checkpointed | None, *, follows: bool) -> str | None:
    """Where a run a signal stopped stood, by its checkpoint (a key of the summary's ``STOPPED``): before
    any was saved, in the copy, in the copy's window, or in the replay; None for a run that ``follows``
    the stream (tail) stopped in its replay, its ordinary end."""
    if saved is None:
        return "start"
    if saved.status == "in_progress":
        return "snapshot"
    if saved.status == "copied":
        return "window"
    return None if follows else "replay"
