"""Frozen settings and their one resolution path: flags > MCDC_* environment > TOML file > defaults.

Every default lives here, on :class:`Settings`. The options that set its fields are declared once in
options.py; this module reads every layer through that table (:func:`resolve`, and
:func:`settings_from_strings` for engines that pass options as text). Nothing else reads the environment
or the config file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import UnionType
from typing import Any, get_args, get_origin, get_type_hints

import orjson
from bson.timestamp import Timestamp

from replicator.errors import ConfigError, quoted
from replicator.settings.fields import FieldRules
from replicator.settings.options import (
    BY_ENV,
    BY_FIELD,
    BY_NAME,
    ENV_CONFIG,
    OPTIONS,
    OTHER_ENV,
    OTHER_ENV_PREFIXES,
    Option,
    closest,
)
from replicator.settings.selection import Renamer, Selection
from replicator.settings.uri import check_mongo_uri, host_set, is_mongo_uri, kafka_bootstrap, redact

_log = logging.getLogger("mcdc.config")


def parse_start_at(text: str) -> Timestamp:
    """``--start-at``: ``SECONDS,INCREMENT`` (a BSON timestamp) or an ISO-8601 time (UTC when no zone)."""
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
    # increment 1: the first operation of that second (increments start at 1)
    return Timestamp(int(when.timestamp()), 1)


@dataclass(frozen=True)
class Settings:
    """Everything one mcdc run needs. Build it with :func:`resolve`; pass it to constructors.

    Every field but ``selection`` and ``renamer`` (compiled from include/exclude/rename) is set by one
    option of options.py: its flag, MCDC_* variable and config-file key."""

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
    max_retries: int | None = None  # None: 16, and only tail waits for a server unreachable at start
    connect_timeout_s: float = 10.0
    io_timeout_s: float = 300.0  # an answer that never comes (a request lost by a restarted server) is an outage
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
    verify: bool = False  # tail: the embedded verifier (verifier.py) sweeps beside the replay
    verify_interval_s: float = 60.0  # tail --verify: a pass begins at most this often
    block_writes: bool = False  # cutover: setUserWriteBlockMode on the source first
    control: bool = False  # tail: POST /commit on the metrics port stops the tail and cuts over
    full_verify: bool = False  # cutover: compare everything, even after a clean pass of tail --verify
    reverse_checkpoint: Path | None = None  # cutover: where the way back's checkpoint goes (default: its pair's)
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
    lake_opts: tuple[str, ...] = ()  # KEY=VALUE: Delta storage options / Iceberg catalog properties
    lake_columns: str = "lossless"  # lossless | typed (top-level fields as typed columns of the state tables)
    lake_compact_every: int = 500  # commits to a lake table between compactions (0: never)
    pre_images: str = "off"  # fullDocumentBeforeChange: off | whenAvailable | required ("before")
    field_exclude: tuple[str, ...] = ()  # [field.exclude.list] db.coll.path: dropped from documents and updates
    field_rename: tuple[str, ...] = ()  # [field.renames] db.coll.path=newname
    engine: str = "asyncio"  # or "spark": snapshot partitions and the replay's writes as Spark tasks
    spark_master: str = "local[*]"  # ignored under spark-submit, whose session is used
    spark_conf: tuple[str, ...] = ()  # KEY=VALUE Spark settings
    replay_partitions: int = 0  # --engine spark: tasks per replayed batch (0: the cluster's cores)
    verbose: bool = False  # mcdc's debug lines
    debug_driver: bool = False  # pymongo's debug lines (commands, server selection)
    selection: Selection = field(default_factory=Selection, compare=False)
    renamer: Renamer = field(default_factory=Renamer, compare=False)

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
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "mcdc"
        # "-" is another spelling of stdout: one checkpoint (a file made under "-" before is still found)
        spellings = ("stdout", "-") if self.target in ("stdout", "-") else (self.target,)
        paths = [base / f"checkpoint-{self._digest(target)}.json" for target in spellings]
        # before the default had the selection in it, a pair had one: still found where it copied this one
        paths += [base / f"checkpoint-{self._digest(target, pair_only=True)}.json" for target in spellings]
        found = [path for path in paths[1:] if path.exists() and _copies(path, self)]
        return paths[0] if paths[0].exists() or not found else found[0]

    def _digest(self, target: str, *, pair_only: bool = False, copies: dict[str, list[str]] | None = None) -> str:
        key = "|".join(sorted(host_set(self.source))) + "->" + redact(target)
        if not is_mongo_uri(target):  # event sinks: another topic prefix is another destination
            key += "#" + self.topic_prefix
        copies = _copied(self) if copies is None else copies
        if copies and not pair_only:  # all of it by default: the key of every checkpoint made before
            key += "|" + json.dumps(copies, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def pair_checkpoints(self) -> list[tuple[Path, dict[str, list[str]]]]:
        """The default checkpoints of this source and target, whatever they copy: each one's path and what
        it copies (its recorded selection, renames and field rules), found by name in the state dir."""
        found = []
        base = self.checkpoint_path().parent if self.checkpoint is None else None
        for path in sorted(base.glob("checkpoint-*.json")) if base is not None else ():
            try:
                recorded = json.loads(path.read_text()).get("recorded") or {}
            except (OSError, ValueError, AttributeError):
                continue
            copies = {name: sorted(recorded.get(name.replace("_", "-")) or ()) for name in _COPIES}
            copies = {name: values for name, values in copies.items() if values}
            spellings = ("stdout", "-") if self.target in ("stdout", "-") else (self.target,)
            names = {self._digest(t, copies=copies) for t in spellings}
            names |= {self._digest(t, pair_only=True) for t in spellings}  # a pair's one, made before
            if path.name.removeprefix("checkpoint-").removesuffix(".json") in names:
                found.append((path, copies))
        return found


#: The options that decide what a migration copies (recorded.Recorded's): part of its default checkpoint.
_COPIES = ("include", "exclude", "rename", "field_exclude", "field_rename")


def _copied(s: Settings) -> dict[str, list[str]]:
    """What ``s`` copies, where it is not everything as it is (order does not matter)."""
    return {name: sorted(getattr(s, name)) for name in _COPIES if getattr(s, name)}


def _copies(path: Path, s: Settings) -> bool:
    """Does the checkpoint at ``path`` copy what ``s`` copies? (one that cannot be read is not taken)"""
    try:
        recorded = json.loads(path.read_text()).get("recorded")
    except (OSError, ValueError, AttributeError):
        return False
    if recorded is None:
        return not _copied(s)
    saved = {name: sorted(recorded.get(name.replace("_", "-")) or ()) for name in _COPIES}
    return {name: values for name, values in saved.items() if values} == _copied(s)


def _kind(hint: Any) -> Any:
    """How a field's value is read: its type without ``| None`` (tuple: a repeatable option)."""
    if get_origin(hint) is UnionType:
        (hint,) = (a for a in get_args(hint) if a is not type(None))
    return get_origin(hint) or hint


_KINDS = {name: _kind(hint) for name, hint in get_type_hints(Settings).items()}


def field_kind(name: str) -> Any:
    """The type a Settings field's option reads: bool (a flag), int, float, str, Path, or tuple (repeatable)."""
    return _KINDS[name]


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _parse(option: Option, value: Any, origin: str, *, split: bool = False) -> Any:
    """``value`` as ``option``'s field wants it, from a flag, the config file, MCDC_* or a strings map.

    Text is parsed by the field's type; ``split`` reads a repeatable option's text as a list (comma-separated,
    or a JSON array when an item holds a comma). ``origin`` names where the value came from in the error."""
    kind = _KINDS[option.field]
    if kind is tuple:
        items = (_split(value) if split else [value]) if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
            raise _invalid(origin, "must be a string or a list of strings", value)
        return tuple(items)
    if isinstance(value, str) and kind is not str:
        value = value.strip()
    if kind is bool:
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            value = value.lower() in _TRUE
        if not isinstance(value, bool):
            raise _invalid(origin, "must be true or false", value)
    elif kind is int:
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value):
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _invalid(origin, "must be a whole number", value)
    elif kind is float:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise _invalid(origin, "must be a number", value)
        value = float(value)
    elif kind is Path:
        if not isinstance(value, str | os.PathLike) or not str(value):
            raise _invalid(origin, "must be a file path", value)
        value = Path(value).expanduser()
    elif not isinstance(value, str):
        raise _invalid(origin, "must be a string", value)
    _check(option, value, origin)
    return value


def _check(option: Option, value: Any, origin: str) -> None:
    """The option's own bounds: its choices, its minimum and maximum."""
    if option.choices and value not in option.choices:
        raise _invalid(origin, f"must be one of {', '.join(option.choices)}", value)
    if option.minimum is not None and value < option.minimum:
        raise _invalid(origin, f"must be at least {option.minimum}", value)
    if option.maximum is not None and value > option.maximum:
        raise _invalid(origin, f"must be at most {option.maximum}", value)


def _split(text: str) -> list[str]:
    """A repeatable option's value in one string: ``a,b``, or ``["a{1,3}", "b"]`` when an item holds a comma."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            pass
        else:
            if isinstance(items, list) and all(isinstance(v, str) for v in items):
                return items
    return [item.strip() for item in text.split(",") if item.strip()]


def _invalid(origin: str, problem: str, value: Any) -> ConfigError:
    shown = quoted(value) if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return ConfigError(f"{origin} {problem}, got {shown}")


def _format(value: Any) -> str:
    """The text :func:`_parse` reads back as ``value``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value)) if any("," in v for v in value) else ",".join(value)
    return str(value)


def _named(key: str) -> Option | None:
    """The option a config-file or strings-map key names: its long flag name, with dashes or underscores."""
    return BY_NAME.get(key.replace("_", "-"))


def _unknown(what: str, word: str, render: Callable[[Option], str]) -> str:
    option = closest(word)
    return f"{what} {quoted(word)}" + (f" (did you mean {quoted(render(option))}?)" if option is not None else "")


def load_toml(path: Path) -> dict[str, Any]:
    """Read a config file: top-level keys are the long flag names (dashes or underscores)."""
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
        option = _named(key)
        if option is None:
            raise ConfigError(f"config file {path}: " + _unknown("unknown setting", key, lambda o: o.name))
        out[option.field] = _parse(option, value, f"config file {path}: {key}")
    return out


def load_env(env: Mapping[str, str], warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The MCDC_* variables that name options; any other MCDC_* variable is a warning (a typo would
    otherwise be ignored without a word)."""
    out = {}
    for name, value in env.items():
        if not name.startswith("MCDC_"):
            continue
        option = BY_ENV.get(name)
        if option is not None:
            out[option.field] = _parse(option, value, name, split=True)
        elif name not in OTHER_ENV and not name.startswith(OTHER_ENV_PREFIXES):
            (warn or _log.warning)(_unknown("ignoring the unknown variable", name, lambda o: o.env))
    return out


def settings_from_strings(options: Mapping[str, str], *, command: str | None = None) -> Settings:
    """Settings from option names and text values, as Spark passes options: ``{"source": "mongodb://...",
    "max-batch-size": "500", "include": "shop\\..*,crm\\.customers"}``. Names are the long flag names;
    repeatable options are comma-separated (or a JSON array). No environment, no config file."""
    merged = {}
    for key, value in options.items():
        option = _named(key)
        if option is None:
            raise ConfigError(_unknown("unknown option", key, lambda o: o.name))
        merged[option.field] = _parse(option, value, f"option {key}", split=True)
    return _build(merged, command)


def settings_to_strings(settings: Settings) -> dict[str, str]:
    """The options that :func:`settings_from_strings` turns back into ``settings`` (unset ones left out)."""
    out = {}
    for option in OPTIONS:
        value = getattr(settings, option.field)
        if value is not None:
            out[option.name] = _format(value)
    return out


def resolve(
    flags: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    command: str | None = None,
    warn: Callable[[str], None] | None = None,
) -> Settings:
    """Merge flags (keyed by Settings field; None means not given), MCDC_* variables and a TOML file
    (``config_file``, else $MCDC_CONFIG) over the defaults. ``command`` relaxes what ``status`` needs
    (neither source nor target); ``warn`` receives the warnings (default: logged)."""
    env = os.environ if env is None else env
    if config_file is None and env.get(ENV_CONFIG):
        config_file = Path(env[ENV_CONFIG]).expanduser()
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(load_toml(config_file))
    merged.update(load_env(env, warn))
    for name, value in flags.items():
        if value is None or (isinstance(value, list | tuple) and not value):
            continue
        option = BY_FIELD[name]
        merged[name] = _parse(option, tuple(value) if isinstance(value, list) else value, option.flag)
    return _build(merged, command)


def _build(merged: dict[str, Any], command: str | None) -> Settings:
    if not merged.get("source") and command != "status":
        raise ConfigError("no source: pass --source URI (or set MCDC_SOURCE)")
    return validate(Settings(**{"source": "", **merged}), command=command)


def validate(s: Settings, *, command: str | None = None) -> Settings:
    """Check values and cross-field rules; returns the settings with selection/renamer compiled.
    ``status`` needs neither a source nor a target (a --checkpoint is enough)."""
    for option in OPTIONS:  # flags, MCDC_* and the file were checked as they were read; Settings made in code
        value = getattr(s, option.field)
        if value is not None:
            _check(option, value, option.flag)
    if s.source or command != "status":
        check_mongo_uri(s.source, "--source")
    if s.target or command != "status":
        _validate_target(s)
    if s.start_at is not None:
        parse_start_at(s.start_at)
    for shard in s.shards:
        check_mongo_uri(shard, "--shard")
    _validate_event_options(s)
    _validate_engine(s)
    FieldRules(s.field_exclude, s.field_rename)  # a bad rule fails now, before any connection
    selection = Selection.from_patterns(s.include, s.exclude)
    renamer = Renamer.from_rules(s.rename)
    return replace(s, selection=selection, renamer=renamer)


def _validate_target(s: Settings) -> None:
    if not s.target:
        raise ConfigError("no target: pass --target URI (or set MCDC_TARGET)")
    if s.target.lower().startswith("kafka:"):
        kafka_bootstrap(s.target)
    if s.target.lower().startswith("jsonl:") and not s.target[len("jsonl:") :]:
        raise ConfigError("--target jsonl:PATH needs a file path, e.g. jsonl:/var/lib/mcdc/events.jsonl")
    if is_mongo_uri(s.target):
        check_mongo_uri(s.target, "--target")
        if s.source and host_set(s.source) & host_set(s.target) and not s.rename:
            raise ConfigError(f"target {redact(s.target)} is the source server; replicate to a different server")


def _validate_engine(s: Settings) -> None:
    for item in s.spark_conf:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():  # never echo the value: it may be a secret
            raise ConfigError(f"--spark-conf {key.strip() or '?'}: expected KEY=VALUE (e.g. spark.executor.memory=2g)")
    if s.engine == "spark" and (s.target in ("-", "stdout") or s.target.lower().startswith("jsonl:")):
        raise ConfigError(
            f"--engine spark writes from its executors, and --target {s.target} exists only on this machine's "
            "driver: use --engine asyncio for stdout or jsonl:, or a mongodb:// or kafka:// target"
        )


def _validate_event_options(s: Settings) -> None:
    if not s.topic_prefix or any(c in s.topic_prefix for c in "/\\ \t\n"):
        raise ConfigError(f"--topic-prefix {quoted(s.topic_prefix)} is not a usable topic name prefix")
    for route in s.topic_routes:
        pattern, sep, topic = route.partition("=")
        if not sep or not pattern or not topic:
            raise ConfigError(
                f"--topic-route {quoted(route)} must be REGEX=TOPIC (e.g. 'shop\\.orders_.*=shop.orders')"
            )
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"--topic-route {quoted(route)}: bad regular expression: {exc}") from None
    for opt in s.kafka_opts:
        key, sep, _ = opt.partition("=")
        if not sep or not key.strip():
            # never echo the value: it may be a password
            raise ConfigError(f"--kafka-opt {key.strip() or '?'}: expected KEY=VALUE (e.g. linger.ms=5)")
