"""A migration's progress as one JSON document (``GET /progress``, ``mcdc status --json``): pure, from
:class:`Facts` that a running job's metrics or a checkpoint file give.

Field names are mongosync's wherever mongosync has the concept (``state``, ``canCommit``, ``canWrite``,
``info``, ``lagTimeSeconds``, ``collectionCopy``, ``totalEventsApplied``, ``verification``), so dashboards
and scripts written for its progress endpoint read this one too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replicator.observe.tally import read_cap

#: ``canCommit`` needs the target this close behind the source's writes, in seconds
COMMIT_LAG_S = 10.0

#: a run's state (metrics.STATES) as the progress document names it
STATES = {
    "starting": "STARTING",
    "snapshot": "SNAPSHOT",
    "streaming": "REPLAYING",
    "retrying": "RETRYING",
    "stopping": "STOPPING",
    "committing": "COMMITTING",
    "committed": "COMMITTED",
}
STOPPED, COMMITTED = "STOPPED", "COMMITTED"

_INFO = {
    "STARTING": "connecting to the source and the target",
    "SNAPSHOT": "copying collections",
    "REPLAYING": "applying change events",
    "RETRYING": "waiting for a server to answer again",
    "STOPPING": "saving the checkpoint",
    "COMMITTING": "cutting over: catching up, verifying, checking that the source is quiet",
    STOPPED: "no mcdc is running on this checkpoint",
    COMMITTED: "cut over: the target is the one to write to",
}


@dataclass
class Verification:
    """What the embedded verifier has found (``phase`` "off" when the run does not verify)."""

    phase: str = "off"  # off | scanning | rechecking | idle | failed (a checkpoint's: where its run stopped)
    scanned_documents: int = 0
    mismatches: int = 0  # documents or collections that still differ after their re-check
    rechecking: int = 0  # differences waiting for the replay to pass the time they were read at
    passes: int = 0  # sweeps completed
    clean_passes: int = 0  # of them, how many in a row ended with no persistent mismatch
    first_mismatches: list[dict[str, Any]] = field(default_factory=list)  # {"namespace", "_id"|"detail"}
    pass_scanned: int = 0  # documents compared in the pass under way
    pass_namespaces: int = 0  # namespaces compared in it
    pass_ranges: int = 0  # ranges compared in the namespace under way

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "scannedDocuments": self.scanned_documents,
            "mismatches": self.mismatches,
            "rechecking": self.rechecking,
            "passes": self.passes,
            "firstMismatches": self.first_mismatches,
            "cleanPasses": self.clean_passes,
            "currentPass": {
                "scannedDocuments": self.pass_scanned,
                "namespacesDone": self.pass_namespaces,
                "rangesDone": self.pass_ranges,
            },
        }


@dataclass
class Facts:
    """What the document is made of: a running job's (metrics) or a checkpoint's (status)."""

    state: str  # one of STATES' values, STOPPED or COMMITTED
    snapshot_done: bool
    lag_s: float | None
    events_applied: int | None  # None: not known (a checkpoint does not count them)
    estimated_documents: int | None
    copied_documents: int | None
    verification: Verification | None = None  # None: the run does not verify
    #: False: ``lag_s`` is status's measure of a checkpoint that records none (or unknown), not the run's
    #: own, and canCommit does not go by it (status given the checkpoint alone could not measure it)
    lag_from_run: bool = True
    reason: str = ""  # why it is retrying, when it is
    max_read_rate: float = 0  # --max-read-rate: documents/s the snapshot and verify read at most (0: no cap)
    #: the TTLs the target holds still while the migration writes it, with the source's values
    #: ({"db.coll": {index name, or "" for a clustered collection's: seconds}}; sinks/mongo/ttl.py)
    held: dict[str, dict[str, Any]] | None = None


def can_commit(facts: Facts) -> bool:
    """The snapshot is done, the target is within COMMIT_LAG_S of the source's writes (by the run's own
    lag), and, when the run verifies, a whole pass ended with no persistent mismatch (and nothing waits to
    be re-checked)."""
    if facts.state == COMMITTED:
        return False  # done already
    if not facts.snapshot_done or not facts.lag_from_run or facts.lag_s is None or facts.lag_s > COMMIT_LAG_S:
        return False
    v = facts.verification
    if v is None:
        return True
    return v.phase != "failed" and v.clean_passes > 0 and v.mismatches == 0 and v.rechecking == 0


def progress_document(facts: Facts) -> dict[str, Any]:
    """``{"progress": {...}}``, the answer of ``GET /progress``."""
    info = _INFO.get(facts.state, facts.state.lower())
    if facts.reason:
        info += f": {facts.reason}"
    copy: dict[str, Any] = {}
    if facts.max_read_rate > 0:
        copy["maxReadRate"] = facts.max_read_rate
        if facts.state == "SNAPSHOT":
            info += f" ({read_cap(facts.max_read_rate)})"
    if facts.estimated_documents is not None:
        copy["estimatedTotalDocuments"] = facts.estimated_documents
    if facts.copied_documents is not None:
        copy["copiedDocuments"] = facts.copied_documents
    progress: dict[str, Any] = {
        "state": facts.state,
        "canCommit": can_commit(facts),
        "canWrite": facts.state == COMMITTED,
        "info": info,
        "lagTimeSeconds": None if facts.lag_s is None else round(facts.lag_s, 3),
        "collectionCopy": copy,
        "snapshotDone": facts.snapshot_done,
        "verification": (facts.verification or Verification()).to_json(),
    }
    if facts.events_applied is not None:
        progress["totalEventsApplied"] = facts.events_applied
    if facts.held:
        progress["heldTTLs"] = [
            {"namespace": ns, "index": name or None, "sourceExpireAfterSeconds": seconds}
            for ns, names in sorted(facts.held.items())
            for name, seconds in sorted(names.items())
        ]
    return {"progress": progress}
