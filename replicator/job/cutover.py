"""``mcdc cutover``: end a migration. With the source quiet (``--block-writes``, or the application
stopped), catch the target up, prove it identical, prove the source took no write meanwhile, and leave a
reverse checkpoint so that ``mcdc tail --source TARGET --target SOURCE`` carries the new side's writes back.

mongosync's ``/commit`` and reverse sync are the model. The order matters:

1. the checkpoint's snapshot must be done (a cutover ends a migration, it does not start one);
2. ``--block-writes``: ``setUserWriteBlockMode`` on the source (MongoDB 6.0+);
3. a catch-up to the source's current time;
4. a verify of the selection (documents, indexes, options): of what changed since the last clean pass of
   ``tail --verify`` when the checkpoint holds one (cutover_check), else of everything;
5. a second catch-up, which must find no change to apply: a write to the selection since the first means
   the proof is stale, and the cutover is refused (exit 5); its end position is the cutover point;
6. the target's current time becomes the reverse checkpoint's position (snapshot done), and the forward
   checkpoint records the cutover, so a second run only says it again.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from replicator.checking.cutover_check import changes_between, proven_since
from replicator.checking.recheck import Entry
from replicator.checking.sweep_state import SweepState
from replicator.checking.verify import VerifyReport, verify
from replicator.checkpoint.store import Checkpoint, CheckpointStore, SnapshotProgress
from replicator.errors import CheckpointLocked, ConfigError, CutoverRefused, SourceNotQuiet
from replicator.events import Position, ts_from_json, ts_to_json
from replicator.job.migrations import followed, record_way_back
from replicator.job.phases import SyncJob
from replicator.job.preflight import source_name
from replicator.job.release import release_ttls
from replicator.observe.progress import Reporter
from replicator.observe.tally import duration, format_ts, listing, plural
from replicator.replay.recorded import Recorded
from replicator.settings.config import Settings
from replicator.settings.uri import is_mongo_uri, redact
from replicator.source.changestream import current_time
from replicator.source.connection import DICT_CODEC, Client, deployment_identity, make_client, probe
from replicator.source.partitions import Partition
from replicator.source.privileges import UNAUTHORIZED, advice

#: what a cutover that compared only the changes since the embedded verifier's last clean pass verified
CHANGES_ONLY = "changes since the verifier's last clean pass"
#: setUserWriteBlockMode's answer on a server that does not have it (CommandNotFound)
_NO_COMMAND = 59


@dataclass
class CutoverResult:
    """What a cutover proved and left, printed as lines or, with --json, as JSON."""

    point: Timestamp  # the source time up to which the target is proven identical
    documents: int  # documents compared
    seconds: float
    reverse_checkpoint: str
    reverse_command: str
    writes_blocked: bool
    already: bool = False  # an earlier run cut over: nothing was done again
    #: "full", or "changes since the verifier's last clean pass" (the rest was proven by that pass)
    verified: str = "full"
    #: for the changes: how many _ids and whole namespaces that was
    detail: str = ""
    #: when the proof was made (the second catch-up found nothing), this machine's clock, ISO 8601 UTC; the
    #: point is the source's last write, earlier when the source was idle ("" in an older cutover's record)
    proven_at: str = ""
    #: the TTLs the migration held on the target, given back their source's values (sinks/mongo/ttl.py)
    restored: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["point"] = ts_to_json(self.point)
        return data

    def lines(self) -> list[str]:
        head = "already cut over" if self.already else "cut over"
        proven = _epoch(self.proven_at)
        idle = proven is not None and proven - self.point.time >= 1
        when = self.proven_at if idle else format_ts(self.point)
        last_write = (
            [f"the source's last write: at or before {format_ts(self.point)}, {duration(proven - self.point.time)} "
             "before the proof (the target has every write up to it, and none came since)"]
            if idle and proven is not None else []
        )  # fmt: skip
        return [
            f"{head} at {when}: the target is identical to the source "
            f"({self.documents:,} documents compared in {self.seconds:.1f} s"
            + ("" if self.verified == "full" else f"; {self.verified}: {self.detail or 'see the log'}")
            + ("" if self.verified == "full" else "; an _id deleted on both sides has no document to compare")
            + ")",
            *last_write,
            *([f"restored the source's TTLs on the target: {listing(self.restored, 20)}"] if self.restored else []),
            f"reverse checkpoint {self.reverse_checkpoint}: to carry the target's writes back to the source, run",
            f"  {self.reverse_command}",
        ]


async def cutover(settings: Settings, reporter: Reporter) -> CutoverResult:
    """The steps of the module's docstring; raises CutoverRefused (exit 1) or SourceNotQuiet (exit 5)."""
    if not is_mongo_uri(settings.target):
        raise ConfigError(f"cutover moves to a MongoDB target: --target {redact(settings.target)} is not mongodb://")
    settings = followed(settings, "cutover")  # the migration's own selection, when none is given
    store = CheckpointStore(settings.checkpoint_path())
    if store.in_use():
        raise CheckpointLocked(
            f"checkpoint {store.path} is in use by a running mcdc: stop it (Ctrl-C or SIGTERM) and run cutover "
            "again, or cut over through it: a tail started with --control answers POST /commit on its metrics port"
        )
    cp = store.load()
    if cp is None:
        raise ConfigError(
            f"no checkpoint at {store.path}: a cutover ends what mcdc sync or tail began; pass the --checkpoint "
            "they used (and the same --include, --rename ...), or run mcdc sync first"
        )
    if cp.cutover is not None:
        return _already(cp, settings)
    if cp.snapshot.status != "done":
        raise ConfigError(
            f"the snapshot of {store.path} is {cp.snapshot.status}, not done: let sync, catch-up or tail finish it"
        )
    _may_write_reverse(settings, store)  # refused before anything else is done
    started = time.monotonic()
    source = make_client(settings.source, timeout_s=settings.connect_timeout_s, io_timeout_s=settings.io_timeout_s)
    try:
        await probe(source, settings.source, "source")
        if settings.block_writes:
            await block_writes(source)
            reporter.info("writes to the source are blocked (setUserWriteBlockMode)")
        reporter.info("catching up to the source's current time")
        await SyncJob(settings, reporter, command="catch-up").run()
        report, scope, detail = await _verify(settings, reporter, source, store.load())
        # the proof holds if nothing changed since the catch-up: a second one must find nothing to apply
        # (asked first: writes during the verify also explain differences it found)
        again = await SyncJob(settings, reporter, command="catch-up").run()
        proven_at = time.time()  # the proof's moment: nothing changed from the first catch-up until now
        if again.events:
            raise SourceNotQuiet(
                f"the source took {again.events} change(s) to the selection while the target was verified: "
                "not cut over; stop the application's writes (or pass --block-writes) and run cutover again"
            )
        if not report.ok:
            raise CutoverRefused(
                f"the target differs from the source ({listing([d.ns for d in report.differences])}): "
                "not cut over; mcdc verify names the differences"
            )
        cp = store.load()
        assert cp is not None
        point = cp.position.cluster_time
        if point is None:
            raise CutoverRefused("the checkpoint holds no cluster time after the catch-up; run cutover again")
        restored = await release_ttls(settings, source, cp)  # proven: the target's own TTLs run again
        if restored:
            reporter.info(f"restored the source's TTLs on the target: {listing(restored, 20)}")
        reverse = await _write_reverse(settings, cp, store)
    finally:
        await source.close()
    result = CutoverResult(
        point=point,
        documents=report.documents,
        seconds=round(time.monotonic() - started, 3),
        reverse_checkpoint=str(reverse),
        reverse_command=reverse_command(settings, reverse),
        writes_blocked=settings.block_writes,
        verified=scope,
        detail=detail,
        proven_at=_iso(proven_at),
        restored=restored,
    )
    with store.locked():
        cp = store.load()
        assert cp is not None
        cp.cutover = {**result.to_json(), "at": time.time()}
        cp.held = {}
        store.save(cp)
    return result


async def _verify(
    settings: Settings, reporter: Reporter, source: Client, cp: Checkpoint | None
) -> tuple[VerifyReport, str, str]:
    """Compare what a clean pass of ``tail --verify`` has not proven (see cutover_check), else everything
    (as Spark tasks under --engine spark). Also says which it was, and (for the changes) how many."""
    state = None if cp is None or cp.verifier is None or settings.full_verify else SweepState.from_json(cp.verifier)
    since = proven_since(state) if state is not None else None
    if state is not None and since is not None:
        info = await probe(source, settings.source, "source")
        database = cp.stream.database if cp is not None and cp.stream is not None else None
        now = await current_time(source)
        changes = await changes_between(settings, reporter, source, info, since, now, database=database)
        if changes is not None:
            changes.add_rechecks(Entry.from_json(item) for item in state.recheck)
            what = f"{plural(changes.documents, '_id')} changed, {plural(len(changes.whole), 'namespace')} whole"
            reporter.info(
                f"verifying what changed since the verifier's last clean pass began ({format_ts(since)}): "
                f"{what}, and every namespace's kind, options and indexes"
            )
            return await verify(settings, scope=changes.scope), CHANGES_ONLY, what
        reporter.info("the verifier's last clean pass began before the oldest entry of the oplog")
    reporter.info("verifying the target against the source")
    if settings.engine == "spark":
        from replicator.engines.spark.verify import verify_on_spark

        return await verify_on_spark(settings), "full", ""
    return await verify(settings), "full", ""


async def block_writes(client: Client) -> None:
    """Block user writes on the source (MongoDB 6.0+): mcdc's own reads go on, the application's writes
    fail until ``setUserWriteBlockMode: false``."""
    try:
        await client.admin.command({"setUserWriteBlockMode": 1, "global": True}, codec_options=DICT_CODEC)
    except OperationFailure as exc:
        if exc.code == _NO_COMMAND:
            raise ConfigError(
                "the source cannot block writes (setUserWriteBlockMode needs MongoDB 6.0+): stop the "
                "application's writes, then run cutover without --block-writes"
            ) from None
        if exc.code == UNAUTHORIZED:
            raise ConfigError(
                "source: the user may not run setUserWriteBlockMode, so the source refused to block writes "
                f"(grant {advice('source', 'setUserWriteBlockMode', 'admin')}), or run cutover without "
                "--block-writes once the application's writes are stopped"
            ) from None
        raise ConfigError(f"the source refused to block writes: {exc.details or exc}") from None


async def _write_reverse(settings: Settings, cp: Checkpoint, forward: CheckpointStore) -> Path:
    """The reverse checkpoint: source and target swapped, at the target's current time, snapshot done,
    recording the migration's selection reversed (which the way back follows). One this migration's cutover
    wrote before and a reverse run moved on since is kept as it is; another migration's is never replaced
    (:func:`_may_write_reverse`)."""
    back = reversed_settings(settings)
    path = back.checkpoint_path()
    target = make_client(settings.target, timeout_s=settings.connect_timeout_s, side="target")
    try:
        info = await probe(target, settings.target, "target")
        now = await current_time(target)
    finally:
        await target.close()
    # just after the target's last operation (startAtOperationTime includes its own time): mcdc's own
    # last write there came from the source, and is not the new side's
    start = Timestamp(now.time, now.inc + 1)
    reverse = Checkpoint(
        source_id=source_name(info, settings.target),
        position=Position(cluster_time=start),
        snapshot=SnapshotProgress(status="done", finished_at=time.time()),
        source_identity=deployment_identity(info, settings.target),
        target_identity=cp.source_identity,
        reverse_of={"checkpoint": str(forward.real), "position": ts_to_json(start)},
        recorded=Recorded.of(back).to_json(),
        migration_id=uuid.uuid4().hex,
        # caught up by construction (just after the new source's last operation): status says lag 0 whether it
        # finds this checkpoint by --source and --target or by --checkpoint alone, not a clock's distance
        lag_s=0.0,
        pair=back.pair_key(),
    )
    store = CheckpointStore(path)
    with store.locked():
        existing = store.load()
        refusal = _not_ours(existing, forward, path)
        if refusal is not None:
            raise ConfigError(refusal)
        if existing is None or not _moved(existing):
            store.save(reverse)
    if reverse.source_identity and reverse.target_identity:  # the old side's namespaces have a writer again
        written = {Partition.from_json(p).ns for p in cp.snapshot.plan}
        record_way_back(path, back, source=reverse.source_identity, target=reverse.target_identity, targets=written)
    return path


def _may_write_reverse(settings: Settings, forward: CheckpointStore) -> None:
    """Refuse a cutover whose reverse checkpoint's file holds another migration's way back."""
    path = reversed_settings(settings).checkpoint_path()
    refusal = _not_ours(CheckpointStore(path).load(), forward, path)
    if refusal is not None:
        raise ConfigError(refusal)


def _not_ours(existing: Checkpoint | None, forward: CheckpointStore, path: Path) -> str | None:
    """Why the reverse checkpoint at ``path`` is not this migration's to write, or None when it may be."""
    if existing is None:
        return None
    origin = (existing.reverse_of or {}).get("checkpoint")
    if origin == str(forward.real):
        return None
    whose = f"the way back of {origin}" if origin else "a checkpoint that no cutover of this migration wrote"
    return (
        f"reverse checkpoint {path} is {whose}: not replaced; pass --reverse-checkpoint PATH to write this "
        "migration's elsewhere"
    )


def _moved(cp: Checkpoint) -> bool:
    """Has a reverse run moved this reverse checkpoint on from where its cutover wrote it?"""
    written = ts_from_json((cp.reverse_of or {}).get("position"))
    return cp.position.cluster_time != written or cp.position.resume_token is not None


def reversed_settings(settings: Settings) -> Settings:
    """The settings of the way back: source and target swapped, at --reverse-checkpoint, selecting what the
    migration wrote (its selection reversed: see Recorded.way_back)."""
    swapped = dataclasses.replace(
        settings, source=settings.target, target=settings.source, checkpoint=settings.reverse_checkpoint
    )
    return Recorded.of(settings).way_back().applied(swapped)


def reverse_command(settings: Settings, path: Path) -> str:
    """The command a person runs to carry the new side's writes back: the way back's checkpoint and its
    selection options (what a selection through renames cannot say, the checkpoint records)."""
    parts = ["mcdc tail", f'--source "{redact(settings.target)}"', f'--target "{redact(settings.source)}"']
    parts.append(f"--checkpoint {shlex.quote(str(path))}")
    for name, values in Recorded.of(settings).way_back().options.items():
        parts += [f"--{name.replace('_', '-')} {shlex.quote(value)}" for value in values]
    return " ".join(parts)


def _already(cp: Checkpoint, settings: Settings) -> CutoverResult:
    recorded = cp.cutover or {}
    point = ts_from_json(recorded.get("point")) or Timestamp(0, 0)
    path = Path(str(recorded.get("reverse_checkpoint") or reversed_settings(settings).checkpoint_path()))
    return CutoverResult(
        point=point,
        documents=int(recorded.get("documents") or 0),
        seconds=float(recorded.get("seconds") or 0.0),
        reverse_checkpoint=str(path),
        reverse_command=reverse_command(settings, path),
        writes_blocked=bool(recorded.get("writes_blocked")),
        already=True,
        verified=str(recorded.get("verified") or "full"),
        detail=str(recorded.get("detail") or ""),
        # an older cutover's record: when it was recorded, just after the proof
        proven_at=str(recorded.get("proven_at") or (_iso(float(recorded["at"])) if recorded.get("at") else "")),
    )


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _epoch(iso: str) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None
