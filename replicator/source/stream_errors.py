"""What the server may refuse on a change stream, and what mcdc does about it: an event over 16 MB (the
oversize plan: split it, or trim it on the server), an option or stage the server predates, and a resume
point no longer in the oplog (history lost). Shared by the asyncio reader (changestream.py) and the Spark
data source's synchronous one."""

from __future__ import annotations

import logging
from typing import Any

from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from replicator.errors import HistoryLost, OversizeEvent
from replicator.events import Position
from replicator.source.batching import OVERSIZE_FLAG

log = logging.getLogger("mcdc.source")

#: Server codes meaning "that resume point is gone from the oplog".
HISTORY_LOST_CODES = frozenset({136, 280, 286})
#: "unrecognized pipeline stage": $changeStreamSplitLargeEvent on a server before 7.0 / 6.0.9.
_UNKNOWN_STAGE_CODES = frozenset({40324})
#: BSONObjectTooLarge and friends: an event over 16 MB.
_TOO_LARGE_CODES = frozenset({10334, 17419, 16819})
_MAX_EVENT = 16 * 1024 * 1024 - 16 * 1024
#: --oversize skip without split support: mark events over the limit and drop their big parts on the
#: server, so the stream goes on and mcdc can log which document it skipped.
_TRIM_OVERSIZE: list[dict[str, Any]] = [
    {"$set": {OVERSIZE_FLAG: {"$gt": [{"$bsonSize": "$$ROOT"}, _MAX_EVENT]}}},
    {
        "$set": {
            field: {"$cond": [f"${OVERSIZE_FLAG}", "$$REMOVE", f"${field}"]}
            for field in ("fullDocument", "fullDocumentBeforeChange", "updateDescription")
        }
    },
]
_CANNOT_SPLIT = (
    "a change event over 16 MB stopped the stream and this server cannot split it "
    "($changeStreamSplitLargeEvent needs MongoDB 7.0 or 6.0.9): upgrade, or pass "
    "--oversize skip to skip such events (each is logged)"
)
#: "unknown field" / "unrecognized option" answers to an option the server predates.
_UNKNOWN_OPTION_CODES = frozenset({9, 40415})


class OversizePlan:
    """The stages a change stream carries for events over 16 MB, and what to do when one stops it.

    ``mode`` starts "plain" (no stage: MongoDB advises $changeStreamSplitLargeEvent only when strictly
    needed, it costs the server work on every event), becomes "split" once such an event stopped the
    stream, or "trim" (``--oversize skip``: marked and emptied on the server) where the server cannot
    split. Both the asyncio reader and the Spark data source's reader follow it."""

    def __init__(self, oversize: str) -> None:
        self.oversize = oversize
        self.mode = "plain"

    def stages(self) -> list[dict[str, Any]]:
        if self.mode == "split":
            return [{"$changeStreamSplitLargeEvent": {}}]
        if self.mode == "trim":
            return _TRIM_OVERSIZE
        return []

    def too_large(self) -> None:
        """An event over 16 MB stopped the stream: split from now on, or fail where that was tried."""
        if self.mode != "plain":
            raise OversizeEvent(_CANNOT_SPLIT)
        log.info("a change event over 16 MB: reading the stream on with $changeStreamSplitLargeEvent")
        self.mode = "split"

    def refused(self, code: int | None) -> bool:
        """The server refused the stream with ``code``: True when the plan changed and opening again may
        work (the server has no split stage: --oversize decides between failing and trimming)."""
        if code in _TOO_LARGE_CODES:  # the first reply already held such an event
            self.too_large()
            return True
        if code not in _UNKNOWN_STAGE_CODES or self.mode != "split":
            return False
        log.warning("the source has no $changeStreamSplitLargeEvent: --oversize %s applies", self.oversize)
        if self.oversize != "skip":
            raise OversizeEvent(_CANNOT_SPLIT)
        self.mode = "trim"
        return True


def after_refusal(plan: OversizePlan, exc: OperationFailure, kwargs: dict[str, Any], start: Position | None) -> None:
    """The server refused to open a stream: change what may let a next attempt work (the oversize plan,
    or no showExpandedEvents before MongoDB 6.0, dropped from ``kwargs``), or raise the error."""
    if plan.refused(exc.code):
        return
    if not (exc.code in _UNKNOWN_OPTION_CODES and kwargs.pop("show_expanded_events", False)):
        raise _history_error(exc, start) or exc from None
    # before MongoDB 6.0 there are no create/createIndexes/modify events: indexes and options are still
    # reconciled from the catalog at the end of a snapshot
    log.warning("the source has no showExpandedEvents (MongoDB < 6.0): index DDL is not streamed")


def reopen_options(opened: dict[str, Any], token: Any, *, key: str = "resume_after") -> dict[str, Any]:
    """watch()'s options to open a stream again right after the last event it handed out (its resume
    token, passed as ``key``; where it has none yet, where it was opened)."""
    if token is None:
        return dict(opened)
    kwargs = {k: v for k, v in opened.items() if k not in ("resume_after", "start_after", "start_at_operation_time")}
    kwargs[key] = token
    return kwargs


def check_in_oplog(start: Position, oldest: Timestamp | None) -> None:
    """Refuse a start from a time (no token) older than the oplog's ``oldest`` entry (None: not known): a
    server may start such a stream silently from that entry, a gap mongod would refuse."""
    time = start.cluster_time
    if start.resume_token is None and time is not None and oldest is not None and time < oldest:
        raise history_lost(start)


def _history_error(exc: OperationFailure, start: Position | None) -> HistoryLost | None:
    if exc.code not in HISTORY_LOST_CODES and "resume point may no longer be in the oplog" not in str(exc):
        return None
    return history_lost(start)


def history_lost(start: Position | None) -> HistoryLost:
    """The checkpoint's position left the source's oplog: what to do about it."""
    where = ""
    if start is not None and start.cluster_time is not None:
        where = f" (saved position {start.cluster_time.as_datetime():%Y-%m-%d %H:%M:%S} UTC)"
    return HistoryLost(
        f"the checkpoint's position{where} is no longer in the source's oplog: the events since then are "
        "gone. Copy the data again with `mcdc sync --snapshot always` (or, to follow the source, "
        "`mcdc tail --on-history-lost resnapshot`), and enlarge the oplog (replSetResizeOplog) so the next "
        "gap fits"
    )
