"""``mcdc status``: what a checkpoint says, and how far behind the source it is."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bson.timestamp import Timestamp

from replicator.checking.sweep_state import verification_of
from replicator.checkpoint.store import CheckpointStore
from replicator.errors import ConfigError
from replicator.events import ts_to_json
from replicator.job import ledger
from replicator.job.migrations import find_migration
from replicator.observe.migration import COMMITTED, STATES, STOPPED, Facts, progress_document
from replicator.settings.config import Settings
from replicator.sinks.mongo.ttl import HOLD
from replicator.source.changestream import current_time
from replicator.source.connection import make_client, probe
from replicator.source.partitions import Partition


def _iso(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


async def checkpoint_status(path: Path, source: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """Position, age, lag, state and snapshot of a checkpoint.

    The lag is the one the replay recorded at its last save (0 when it had caught up), with when that was:
    a checkpoint no mcdc runs on is not falling behind by the clock, it is where it stopped. A checkpoint
    without one (written before mcdc recorded it, or still in its snapshot) is measured from its position
    against the source's latest operation time (``source``); without ``source`` it is unknown (this
    machine's clock would make an idle source that is caught up look behind). canCommit goes by a recorded
    lag only, so that it is one answer whichever way status found the checkpoint."""
    store = CheckpointStore(path)
    cp = store.load()
    if cp is None:
        raise ConfigError(f"no checkpoint at {path}")
    now = time.time()
    running = store.in_use()
    position_time: Timestamp | None = cp.position.cluster_time
    lag = cp.lag_s
    recorded = lag is not None
    against: str | None = "last save" if recorded else None
    if not recorded and source is not None and position_time is not None:
        client = make_client(source, timeout_s=timeout_s)
        try:
            await probe(client, source, "source")
            lag, against = max(0.0, (await current_time(client)).time - position_time.time), "source"
        finally:
            await client.close()
    plan = [Partition.from_json(p) for p in cp.snapshot.plan]
    snapshot_done = cp.snapshot.status in ("done", "none")
    facts = Facts(
        state=COMMITTED if cp.cutover is not None else _running_state(cp.snapshot.status) if running else STOPPED,
        snapshot_done=snapshot_done,
        lag_s=lag,
        lag_from_run=recorded,
        reason=_UNRECORDED if snapshot_done and not recorded and not running and cp.cutover is None else "",
        events_applied=None,  # a checkpoint does not count them
        estimated_documents=None,
        copied_documents=None,
        # the embedded verifier's place, as its last run left it ("phase" as /progress said it there)
        verification=None if cp.verifier is None else verification_of(cp.verifier),
        held=cp.held,
    )
    return {
        **progress_document(facts),
        "checkpoint": str(path),
        "running": running,
        "source": cp.source_id,
        # None in a checkpoint written before mcdc recorded them: the next run fills them in
        "source_identity": cp.source_identity,
        "target_identity": cp.target_identity,
        "position": {
            "cluster_time": ts_to_json(position_time),
            "time": _iso(position_time.time) if position_time else None,
            "has_resume_token": cp.position.resume_token is not None,
        },
        "updated_at": _iso(cp.updated_at),
        "age_s": round(now - cp.updated_at, 3),
        "lag_s": None if lag is None else round(lag, 3),
        "lag_measured_against": against,
        "snapshot": {
            "status": cp.snapshot.status,
            "partitions_done": len(cp.snapshot.done),
            "partitions_total": len(plan),
            "collections_total": len({p.ns for p in plan}),
            "collections_remaining": len({p.ns for p in plan if p.id not in cp.snapshot.done}),
        },
    }


#: why canCommit is false for a stopped checkpoint past its snapshot that records no lag
_UNRECORDED = (
    "it records no lag (no replay saved it since its snapshot, or an older mcdc wrote it): canCommit waits "
    "for one, which mcdc catch-up records"
)


def _running_state(snapshot: str) -> str:
    """What a run holding the checkpoint is doing, as far as its file tells."""
    return STATES["snapshot"] if snapshot in ("in_progress", "copied") else STATES["streaming"]


async def status(settings: Settings) -> dict[str, Any]:
    """``mcdc status``: the status of --checkpoint, else of the default checkpoint of --source and --target
    (the one sync, catch-up and tail use without --checkpoint); with --list, the migrations recorded in the
    state directory; with --forget, the one forgotten (see :mod:`.ledger`)."""
    if settings.forget is not None:
        return ledger.forget(settings.forget)
    if settings.list_migrations:
        return {"migrations": ledger.migrations()}
    if settings.checkpoint is None and not (settings.source and settings.target):
        raise ConfigError(
            "which checkpoint? pass --checkpoint PATH, or --source and --target (or a --config naming them) "
            "to read the default one"
        )
    path = settings.checkpoint_path()
    # given the two servers alone, the pair's migration of everything (the default checkpoint) is one of
    # them: with another one beside it, both are named
    if settings.checkpoint is None and (
        not path.exists() or (not settings.copies() and len(settings.pair_checkpoints()) > 1)
    ):
        path = find_migration(settings, path)
    return await checkpoint_status(path, settings.source or None, settings.connect_timeout_s)


def status_lines(status: dict[str, Any]) -> list[str]:
    if "migrations" in status:
        return ledger.listing_lines(status["migrations"])
    if "forgotten" in status:
        return [f"forgot the migration of checkpoint {status['forgotten']} ({status['state']}): its target's copies "
                "stay as they are, and are no migration's now"]  # fmt: skip
    snap = status["snapshot"]
    progress = status["progress"]
    unknown = "- (not recorded yet: the next run records it)"
    commit = "yes" if progress["canCommit"] else "no"
    lines = [
        f"checkpoint {status['checkpoint']}",
        f"state      {progress['state']}: {progress['info']} (canCommit: {commit})",
        f"source     {status['source_identity'] or status['source']}",
        f"target     {status['target_identity'] or unknown}",
        f"position   {status['position']['time'] or '-'} ({_shown_ts(status['position']['cluster_time'])})",
        f"lag        {_lag(status)}",
        f"updated    {status['updated_at']} ({status['age_s']:.1f} s ago)",
        f"snapshot   {snap['status']}: {snap['partitions_done']}/{snap['partitions_total']} partitions, "
        f"{snap['collections_remaining']}/{snap['collections_total']} collections remaining",
    ]
    for held in progress.get("heldTTLs", ()):
        what = f"index {held['index']}" if held["index"] else "the collection's TTL"
        lines.append(f"held TTL   {held['namespace']} {what}: {held['sourceExpireAfterSeconds']} s on the source "
                     f"(the target's is held at {HOLD} until cutover)")  # fmt: skip
    v = progress["verification"]
    if v["phase"] != "off":  # a tail --verify ran on it
        current = v["currentPass"]
        lines.append(
            f"verify     {v['passes']} passes ({v['cleanPasses']} clean in a row), {v['mismatches']} mismatches, "
            f"{v['rechecking']} to re-check; the pass under way: {current['namespacesDone']} namespaces, "
            f"{current['scannedDocuments']:,} documents"
        )
    return lines


def _lag(status: dict[str, Any]) -> str:
    lag = status["lag_s"]
    if lag is None:
        at = status["position"]["time"]
        if at is None:
            return "-"
        return (
            f"unknown: the checkpoint records none (saved mid-snapshot, or by an older mcdc); its position is "
            f"as of {at}: give --source to measure it against the source's time"
        )
    if status["lag_measured_against"] != "last save":
        return f"{lag:.1f} s (against the source's current time; the checkpoint records none)"
    caught_up = " (caught up)" if lag == 0 else ""
    return f"{lag:.1f} s{caught_up} at its last save, {status['age_s']:.1f} s ago"


def _shown_ts(data: dict[str, int] | None) -> str:
    """A cluster time as --start-at takes it back: SECONDS,INCREMENT."""
    return "no time" if data is None else f"{data['t']},{data['i']}"
