"""Frozen settings and their one resolution path: flags > MCDC_* environment > TOML file > defaults.

Every default lives here. Nothing else reads the environment or the config file.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bson.timestamp import Timestamp

from .errors import ConfigError
from .filters import Renamer, Selection
from .uri import check_mongo_uri, host_set, is_mongo_uri, kafka_bootstrap, redact

SNAPSHOT_MODES = ("initial", "always", "never", "when_needed")
SPLIT_MODES = ("auto", "always", "never")
HISTORY_LOST_MODES = ("fail", "resnapshot")
LOG_FORMATS = ("text", "json")
ENVELOPES = ("debezium", "debezium-legacy", "plain")
EXTENDED_JSON_MODES = ("canonical", "relaxed")
PRE_IMAGE_MODES = ("off", "whenAvailable", "required")


def parse_start_at(text: str) -> Timestamp:
    """``--start-at``: ``SECONDS,INCREMENT`` (a BSON timestamp) or an ISO-8601 time (UTC when no zone)."""
    if "," in text:
        secs, _, inc = text.partition(",")
        try:
            ts = Timestamp(int(secs), int(inc))
        except (ValueError, TypeError, OverflowError):
            raise ConfigError(f"--start-at {text!r}: SECONDS,INCREMENT must be two whole numbers") from None
        return ts
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--start-at {text!r} is neither an ISO-8601 time nor SECONDS,INCREMENT") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    # increment 1: the first operation of that second (increments start at 1)
    return Timestamp(int(when.timestamp()), 1)


FULL_DOCUMENT_MODES = ("updateLookup", "whenAvailable", "required", "default")


@dataclass(frozen=True)
class Settings:
    """Everything one mcdc run needs. Build it with :func:`resolve`; pass it to constructors."""

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
    snapshot: str = "initial"
    snapshot_only: bool = False
    drop_target: bool = False
    full_document: str = "updateLookup"
    # replay: events applied per bulk_write, and the bound of the stream read-ahead
    replay_batch: int = 1_000
    max_queue_events: int = 8_192
    # retries (Debezium's defaults: 1 s initial, 120 s max, 16 attempts; -1 = forever, 0 = never)
    retry_initial_s: float = 1.0
    retry_max_s: float = 120.0
    max_retries: int = 16
    connect_timeout_s: float = 10.0
    # tail
    start_at: str | None = None  # ISO-8601 time or SECONDS,INCREMENT (startAtOperationTime)
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
    # event sinks (Kafka, stdout, jsonl); Debezium's property names in brackets
    topic_prefix: str = "mcdc"  # [topic.prefix] topics are <prefix>.<db>.<collection>
    topic_routes: tuple[str, ...] = ()  # REGEX=TOPIC on "db.collection" (first match wins; \1 = group 1)
    sanitize_names: bool = False  # Avro-safe topic names: [A-Za-z0-9_] only
    envelope: str = "debezium"  # debezium | debezium-legacy (after/patch/filter) | plain (mcdc's own event)
    schemas: bool = False  # wrap key and value in {schema, payload} like Kafka Connect's JsonConverter
    extended_json: str = "canonical"  # canonical (lossless) | relaxed
    tombstones: str = "on"  # [tombstones.on.delete] a null-value message after each delete
    tx_metadata: bool = False  # [provide.transaction.metadata] BEGIN/END to <prefix>.transaction
    heartbeat_interval_s: float = 0.0  # [heartbeat.interval.ms] 0: off
    kafka_opts: tuple[str, ...] = ()  # [kafka.producer.*] KEY=VALUE producer settings
    pre_images: str = "off"  # fullDocumentBeforeChange: off | whenAvailable | required ("before")
    field_exclude: tuple[str, ...] = ()  # [field.exclude.list] db.coll.path: dropped from documents and updates
    field_rename: tuple[str, ...] = ()  # [field.renames] db.coll.path=newname
    selection: Selection = field(default_factory=Selection, compare=False)
    renamer: Renamer = field(default_factory=Renamer, compare=False)

    def checkpoint_path(self) -> Path:
        """The checkpoint file: --checkpoint, else one per (source, target) pair under the state dir."""
        if self.checkpoint is not None:
            return self.checkpoint
        key = "|".join(sorted(host_set(self.source))) + "->" + redact(self.target)
        if not is_mongo_uri(self.target):  # event sinks: another topic prefix is another destination
            key += "#" + self.topic_prefix
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        return base / "mcdc" / f"checkpoint-{digest}.json"


_FIELDS = {f.name: f for f in fields(Settings) if f.name not in ("selection", "renamer")}
_TUPLE_FIELDS = {
    *("include", "exclude", "rename", "shards", "topic_routes", "kafka_opts", "field_exclude", "field_rename"),
}
_BOOL_FIELDS = {"snapshot_only", "drop_target", "json_output", "progress", "sanitize_names", "schemas", "tx_metadata"}
_INT_FIELDS = {
    "workers",
    "partition_docs",
    "batch_docs",
    "batch_bytes",
    "queue_batches",
    "replay_batch",
    "max_queue_events",
    "max_retries",
    "verify_sample",
    "metrics_port",
}
_FLOAT_FIELDS = {"retry_initial_s", "retry_max_s", "connect_timeout_s", "shard_refresh_s", "heartbeat_interval_s"}


def _coerce(name: str, value: Any, origin: str) -> Any:
    flag = "--" + name.replace("_", "-")
    try:
        if name in _TUPLE_FIELDS:
            if isinstance(value, str):
                return tuple(v for v in value.split(",") if v) if origin == "env" else (value,)
            return tuple(str(v) for v in value)
        if name in _BOOL_FIELDS:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off", ""):
                    return False
                raise ValueError(value)
            return bool(value)
        if name in _INT_FIELDS:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if name in _FLOAT_FIELDS:
            return float(value)
        if name == "checkpoint":
            return Path(value).expanduser()
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} ({origin}) has an invalid value {value!r}") from None


def load_toml(path: Path) -> dict[str, Any]:
    """Read a config file: top-level keys named like the long flags (dashes or underscores)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in _FIELDS:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        out[name] = _coerce(name, value, "config file")
    return out


def load_env(env: Mapping[str, str]) -> dict[str, Any]:
    out = {}
    for name in _FIELDS:
        value = env.get("MCDC_" + name.upper())
        if value is not None:
            out[name] = _coerce(name, value, f"MCDC_{name.upper()}")
    return out


def resolve(
    flags: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    need_target: bool = True,
) -> Settings:
    """Merge flags (only those the user set: None means unset), MCDC_* variables and a TOML file."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(load_toml(config_file))
    merged.update(load_env(os.environ if env is None else env))
    merged.update({k: _coerce(k, v, "flag") for k, v in flags.items() if v is not None and v != ()})
    if not merged.get("source"):
        raise ConfigError("no source: pass --source URI (or set MCDC_SOURCE)")
    settings = Settings(**merged)
    return validate(settings, need_target=need_target)


def validate(s: Settings, *, need_target: bool = True) -> Settings:
    """Check values and cross-field rules; returns the settings with selection/renamer compiled."""
    check_mongo_uri(s.source, "--source")
    if need_target:
        if not s.target:
            raise ConfigError("no target: pass --target URI (or set MCDC_TARGET)")
        if s.target.lower().startswith("kafka:"):
            kafka_bootstrap(s.target)
        if s.target.lower().startswith("jsonl:") and not s.target[len("jsonl:") :]:
            raise ConfigError("--target jsonl:PATH needs a file path, e.g. jsonl:/var/lib/mcdc/events.jsonl")
        if is_mongo_uri(s.target):
            check_mongo_uri(s.target, "--target")
            if host_set(s.source) & host_set(s.target) and not s.rename:
                raise ConfigError(f"target {redact(s.target)} is the source server; replicate to a different server")
    if s.snapshot not in SNAPSHOT_MODES:
        raise ConfigError(f"--snapshot must be one of {', '.join(SNAPSHOT_MODES)}, got {s.snapshot!r}")
    if s.on_history_lost not in HISTORY_LOST_MODES:
        raise ConfigError(f"--on-history-lost must be one of {', '.join(HISTORY_LOST_MODES)}")
    if s.oversize not in ("fail", "skip"):
        raise ConfigError("--oversize must be fail or skip")
    if s.log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
    if s.start_at is not None:
        parse_start_at(s.start_at)
    if s.metrics_port is not None and not 0 <= s.metrics_port <= 65535:
        raise ConfigError("--metrics-port must be between 0 and 65535")
    for shard in s.shards:
        check_mongo_uri(shard, "--shard")
    if s.split not in SPLIT_MODES:
        raise ConfigError(f"--split must be one of {', '.join(SPLIT_MODES)}, got {s.split!r}")
    if s.full_document not in FULL_DOCUMENT_MODES:
        raise ConfigError(f"--full-document must be one of {', '.join(FULL_DOCUMENT_MODES)}")
    for name in ("workers", "partition_docs", "batch_docs", "batch_bytes", "queue_batches", "replay_batch"):
        if getattr(s, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    _validate_event_options(s)
    if s.max_retries < -1:
        raise ConfigError("--max-retries must be -1 (forever), 0 (never) or a positive count")
    selection = Selection.from_patterns(s.include, s.exclude)
    renamer = Renamer.from_rules(s.rename)
    return _replace(s, selection=selection, renamer=renamer)


def _choice(value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")


def _validate_event_options(s: Settings) -> None:
    _choice(s.envelope, ENVELOPES, "--envelope")
    _choice(s.extended_json, EXTENDED_JSON_MODES, "--extended-json")
    _choice(s.tombstones, ("on", "off"), "--tombstones")
    _choice(s.pre_images, PRE_IMAGE_MODES, "--pre-images")
    if not s.topic_prefix or any(c in s.topic_prefix for c in "/\\ \t\n"):
        raise ConfigError(f"--topic-prefix {s.topic_prefix!r} is not a usable topic name prefix")
    if s.heartbeat_interval_s < 0:
        raise ConfigError("--heartbeat-interval must be 0 (off) or a number of seconds")
    for route in s.topic_routes:
        pattern, sep, topic = route.partition("=")
        if not sep or not pattern or not topic:
            raise ConfigError(f"--topic-route {route!r} must be REGEX=TOPIC (e.g. 'shop\\.orders_.*=shop.orders')")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"--topic-route {route!r}: bad regular expression: {exc}") from None
    for opt in s.kafka_opts:
        key, sep, _ = opt.partition("=")
        if not sep or not key.strip():
            # never echo the value: it may be a password
            raise ConfigError(f"--kafka-opt {key.strip() or '?'}: expected KEY=VALUE (e.g. linger.ms=5)")


def _replace(s: Settings, **changes: Any) -> Settings:
    from dataclasses import replace

    return replace(s, **changes)
