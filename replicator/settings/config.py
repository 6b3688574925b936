"""Frozen settings: every default lives here, on :class:`Settings`, with what follows from them (the default
checkpoint's name). How options become Settings (flags > MCDC_* environment > TOML file > defaults) is
:mod:`.resolve`'s."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, get_args, get_origin, get_type_hints

from replicator.errors import ConfigError, quoted

if TYPE_CHECKING:
    from bson.timestamp import Timestamp

    from replicator.settings.filters import DocumentFilters
    from replicator.settings.guard import TargetGuard
    from replicator.settings.selection import Renamer, Selection

_log = logging.getLogger("mcdc.config")


def parse_start_at(text: str) -> Timestamp:
    """``--start-at``: ``SECONDS,INCREMENT`` (a BSON timestamp) or an ISO-8601 time (UTC when no zone)."""
    from bson.timestamp import Timestamp

    if "," in text:
        secs, _, inc = text.partition(",")
        try:
            ts = Timestamp(int(secs), int(inc))
        except (ValueError, TypeError, OverflowError):
            raise ConfigError(f"--start-at {quoted(text)}: SECONDS,INCREMENT must be two whole numbers") from None
        return ts
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--start-at {quoted(text)} is neither an ISO-8601 time nor SECONDS,INCREMENT") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:  # increment 1: the first operation of that second (increments start at 1)
        return Timestamp(int(when.timestamp()), 1)
    except ValueError:
        raise ConfigError(f"--start-at {quoted(text)} is outside what a cluster time holds (1970 to 2106)") from None


def state_dir() -> Path:
    """Where mcdc keeps its state by default: the default checkpoints and the migrations of each target."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "mcdc"


# the fields compiled from options: their classes (the query compiler, BSON codecs) load with a Settings, not
# with --help
def _everything() -> Selection:
    from replicator.settings.selection import Selection

    return Selection()


def _no_renames() -> Renamer:
    from replicator.settings.selection import Renamer

    return Renamer()


def _no_filters() -> DocumentFilters:
    from replicator.settings.filters import DocumentFilters

    return DocumentFilters()


def _no_guard() -> TargetGuard:
    from replicator.settings.guard import TargetGuard

    return TargetGuard()


@dataclass(frozen=True)
class Settings:
    """Everything one mcdc run needs. Build it with :func:`resolve`; pass it to constructors.

    Every field but ``selection``, ``renamer`` and ``filters`` (compiled from include/exclude/rename/filter) and
    ``guard`` (a way back's, from its checkpoint) is set by one option of options.py: its flag, MCDC_* variable
    and config-file key."""

    source: str
    target: str = ""
    checkpoint: Path | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    rename: tuple[str, ...] = ()
    workers: int = 4
    # snapshot: a collection with more documents than this is split into _id ranges of about this size
    partition_docs: int = 50_000
    # split large collections into _id ranges: auto (when a range read is index-bounded), always, never
    split: str = "auto"
    batch_docs: int = 1_000
    batch_bytes: int = 8 * 1024 * 1024
    queue_batches: int = 4  # per snapshot worker: bounded read-ahead
    read_preference: str = "primary"  # the snapshot's, the lookups' and verify's source reads
    max_read_rate: int = 0  # documents/s read from the source by the snapshot and verify (0: no cap)
    snapshot: str = "initial"
    snapshot_only: bool = False
    drop_target: bool = False
    shard_target: tuple[str, ...] = ()  # REGEX=KEY: a sharded target's shard key for source db.coll
    full_document: str = "updateLookup"
    # replay: events applied per bulk_write, and the bound of the stream read-ahead
    replay_batch: int = 1_000
    max_queue_events: int = 8_192
    # retries (Debezium's defaults: 1 s initial, 120 s max, 16 attempts; -1 = forever, 0 = never)
    retry_initial_s: float = 1.0
    retry_max_s: float = 120.0
    max_retries: int | None = None  # None: 16, and only tail waits for a server unreachable at start
    connect_timeout_s: float = 10.0
    io_timeout_s: float = 300.0  # an answer that never comes (a request lost by a restarted server) is an outage
    # tail
    start_at: str | None = None  # ISO-8601 time or SECONDS,INCREMENT (startAtOperationTime)
    start_after_debezium_offset: str | None = None  # a Debezium offset's JSON, or @FILE (checkpoint.debezium_offset)
    on_history_lost: str = "fail"  # or "resnapshot"
    oversize: str = "fail"  # or "skip": change events over 16 MB where the server cannot split them
    shards: tuple[str, ...] = ()  # explicit shard replica set URIs, one change stream each
    shard_refresh_s: float = 30.0  # tail of a mongos: how often shards added or removed are looked for
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    log_format: str = "text"
    json_output: bool = False
    progress: bool = True
    verify_sample: int = 5  # differing _ids listed per namespace
    verify: bool = False  # tail: the embedded verifier (verifier.py) sweeps beside the replay
    verify_interval_s: float = 60.0  # tail --verify: a pass begins at most this often
    block_writes: bool = False  # cutover: setUserWriteBlockMode on the source first
    control: bool = False  # tail: POST /commit on the metrics port stops the tail and cuts over
    full_verify: bool = False  # cutover: compare everything, even after a clean pass of tail --verify
    reverse_checkpoint: Path | None = None  # cutover: where the way back's checkpoint goes (default: its pair's)
    release_only: bool = False  # cutover: only give back the target's TTLs the migration holds (sinks/mongo/ttl.py)
    list_migrations: bool = False  # status: list the migrations recorded in the state directory
    forget: Path | None = None  # status: forget this finished migration (its checkpoint and record)
    # event sinks (Kafka, stdout, jsonl); Debezium's property names in brackets
    topic_prefix: str = "mcdc"  # [topic.prefix] topics are <prefix>.<db>.<collection>
    topic_routes: tuple[str, ...] = ()  # REGEX=TOPIC on "db.collection" (first match wins; \1 = group 1)
    sanitize_names: bool = False  # Avro-safe topic names: [A-Za-z0-9_] only
    envelope: str = "debezium"  # debezium | debezium-legacy (after/patch/filter) | plain (mcdc's own event)
    schemas: bool = False  # wrap key and value in {schema, payload} like Kafka Connect's JsonConverter
    extended_json: str = "canonical"  # canonical (lossless) | relaxed | debezium (Debezium 3.6's bytes)
    tombstones: str = "on"  # [tombstones.on.delete] a null-value message after each delete
    tx_metadata: bool = False  # [provide.transaction.metadata] BEGIN/END to <prefix>.transaction
    heartbeat_interval_s: float = 0.0  # [heartbeat.interval.ms] 0: off
    kafka_opts: tuple[str, ...] = ()  # [kafka.producer.*] KEY=VALUE producer settings
    lake_opts: tuple[str, ...] = ()  # KEY=VALUE: Delta storage options / Iceberg catalog properties
    lake_columns: str = "lossless"  # lossless | typed (top-level fields as typed columns of the state tables)
    lake_compact_every: int = 500  # commits to a lake table between compactions (0: never)
    pre_images: str = "off"  # fullDocumentBeforeChange: off | whenAvailable | required ("before")
    field_exclude: tuple[str, ...] = ()  # [field.exclude.list] db.coll.path: dropped from documents and updates
    field_rename: tuple[str, ...] = ()  # [field.renames] db.coll.path=newname
    filter: tuple[str, ...] = ()  # REGEX=QUERY: only the documents of db.coll that match (settings.filters)
    allow_unmatched: bool = False  # a rule that names no namespace of the source yet: a warning, not a refusal
    engine: str = "asyncio"  # or "spark": snapshot partitions and the replay's writes as Spark tasks
    spark_master: str = "local[*]"  # ignored under spark-submit, whose session is used
    spark_conf: tuple[str, ...] = ()  # KEY=VALUE Spark settings
    replay_partitions: int = 0  # --engine spark: tasks per replayed batch (0: the cluster's cores)
    spark_start_after_s: float = 10.0  # --engine spark: a catch-up's seconds on the driver before Spark starts
    verbose: bool = False  # mcdc's debug lines
    debug_driver: bool = False  # pymongo's debug lines (commands, server selection)
    # dev-server: the trial server's oplog bounds, above a 1,000,000-document trial (issue 41: SecantusDB's
    # own 100,000 entries made a load of 200,000 documents leave another migration's checkpoint behind)
    oplog_entries: int = 2_000_000
    oplog_hours: float = 24.0
    selection: Selection = field(default_factory=_everything, compare=False)
    renamer: Renamer = field(default_factory=_no_renames, compare=False)
    filters: DocumentFilters = field(default_factory=_no_filters, compare=False)
    #: a way back's: what its target holds that the migration did not copy (recorded.Recorded.applied)
    guard: TargetGuard = field(default_factory=_no_guard, compare=False)

    def waits_at_start(self, command: str) -> bool:
        """Is a server unreachable at start waited for (under --max-retries)? tail's always is; sync's and
        catch-up's only when --max-retries was given (a cron job's run otherwise exits 75 at once)."""
        return command == "tail" or self.max_retries is not None

    def checkpoint_path(self) -> Path:
        """The checkpoint file: --checkpoint, else one per migration under the state dir: per source, target
        and what is copied (the selection, renames and field rules), so that two migrations between one
        pair of servers keep their own positions and ways back."""
        if self.checkpoint is not None:
            return self.checkpoint
        base = state_dir()
        # "-" is another spelling of stdout: one checkpoint (a file made under "-" before is still found)
        spellings = ("stdout", "-") if self.target in ("stdout", "-") else (self.target,)
        paths = [base / f"checkpoint-{self._digest(target)}.json" for target in spellings]
        # before the default had the selection in it, a pair had one: still found where it copied this one
        paths += [base / f"checkpoint-{self._digest(target, pair_only=True)}.json" for target in spellings]
        found = [path for path in paths[1:] if path.exists() and _copies(path, self)]
        return paths[0] if paths[0].exists() or not found else found[0]

    def _digest(self, target: str, *, pair_only: bool = False, copies: dict[str, list[str]] | None = None) -> str:
        from replicator.settings.uri import host_set, is_mongo_uri, redact  # pymongo's parser: not for --help

        key = "|".join(sorted(host_set(self.source))) + "->" + redact(target)
        if not is_mongo_uri(target):  # event sinks: another topic prefix is another destination
            key += "#" + self.topic_prefix
        copies = _copied(self) if copies is None else copies
        if copies and not pair_only:  # all of it by default: the key of every checkpoint made before
            key += "|" + json.dumps(copies, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def pair_key(self) -> str:
        """This source and target, whatever is copied (a checkpoint's ``pair``): the default checkpoint's
        name records the selection it was made with, which a run given its --checkpoint may change since."""
        return self._digest("stdout" if self.target == "-" else self.target, pair_only=True)

    def copies(self) -> dict[str, list[str]]:
        """What this run copies where it is not everything as it is: as pair_checkpoints says a checkpoint's."""
        return _copied(self)

    def pair_checkpoints(self) -> list[tuple[Path, dict[str, list[str]]]]:
        """The default checkpoints of this source and target, whatever they copy: each one's path and what
        it copies (its recorded selection, renames and field rules), found in the state dir by the pair
        they record, or (one no run recorded it in) by name."""
        found: list[tuple[Path, dict[str, list[str]]]] = []
        if self.checkpoint is not None:
            return found
        base = self.checkpoint_path().parent
        spellings = ("stdout", "-") if self.target in ("stdout", "-") else (self.target,)
        pairs = {self._digest(t, pair_only=True) for t in spellings}
        for path in sorted(base.glob("checkpoint-*.json")):
            try:
                data = json.loads(path.read_text())
                recorded, pair = data.get("recorded") or {}, data.get("pair")
            except (OSError, ValueError, AttributeError):
                continue
            copies = _recorded_copies(recorded)
            names = {self._digest(t, copies=copies) for t in spellings} | pairs  # pairs: a pair's one, made before
            named = path.name.removeprefix("checkpoint-").removesuffix(".json") in names
            if (pair in pairs) if pair else named:
                found.append((path, copies))
        return found


def _kind(hint: Any) -> Any:
    """How a field's value is read: its type without ``| None`` (tuple: a repeatable option)."""
    if get_origin(hint) is UnionType:
        (hint,) = (a for a in get_args(hint) if a is not type(None))
    return get_origin(hint) or hint


#: (the fields compiled from options are no option's: their classes need not be imported to name the others)
_KINDS = {
    name: _kind(hint)
    for name, hint in get_type_hints(
        Settings, localns={"Selection": Any, "Renamer": Any, "DocumentFilters": Any, "TargetGuard": Any}
    ).items()
}


def field_kind(name: str) -> Any:
    """The type a Settings field's option reads: bool (a flag), int, float, str, Path, or tuple (repeatable)."""
    return _KINDS[name]


#: The options that decide what a migration copies (recorded.Recorded's): part of its default checkpoint.
_COPIES = ("include", "exclude", "rename", "field_exclude", "field_rename", "filter")
#: a way back's record of the migration whose image it selects (replay.recorded.Recorded's JSON key)
_IMAGE = "image-of"


def _copied(s: Settings) -> dict[str, list[str]]:
    """What ``s`` copies, where it is not everything as it is (order does not matter): a way back's image of
    its migration's selection too."""
    from replicator.settings.selection import Image

    copies = {name: sorted(getattr(s, name)) for name in _COPIES if getattr(s, name)}
    if isinstance(s.selection, Image):
        copies[_IMAGE] = [s.selection.origin]
    return copies


def _recorded_copies(recorded: dict[str, Any]) -> dict[str, list[str]]:
    """What a checkpoint's ``recorded`` selection copies, as :func:`_copied` says it."""
    copies = {name: sorted(recorded.get(name.replace("_", "-")) or ()) for name in _COPIES}
    if isinstance(recorded.get(_IMAGE), dict):
        copies[_IMAGE] = [json.dumps(recorded[_IMAGE], sort_keys=True)]
    return {name: values for name, values in copies.items() if values}


def _copies(path: Path, s: Settings) -> bool:
    """Does the checkpoint at ``path`` copy what ``s`` copies? (one that cannot be read is not taken)"""
    try:
        recorded = json.loads(path.read_text()).get("recorded")
    except (OSError, ValueError, AttributeError):
        return False
    if recorded is None:
        return not _copied(s)
    return _recorded_copies(recorded) == _copied(s)
