"""Settings' one resolution path: flags > MCDC_* environment > TOML file > defaults.

The options that set Settings' fields are declared once in options.py; this module reads every layer
through that table (:func:`resolve`, and :func:`settings_from_strings` for engines that pass options as
text). Nothing else reads the environment or the config file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from replicator.errors import ConfigError, quoted
from replicator.settings.config import Settings, field_kind, parse_start_at
from replicator.settings.fields import FieldRules
from replicator.settings.filters import DocumentFilters, needs_lookup
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
from replicator.settings.shard_target import ShardTargets
from replicator.settings.uri import check_mongo_uri, host_set, is_mongo_uri, kafka_bootstrap, redact

_log = logging.getLogger("mcdc.config")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _parse(option: Option, value: Any, origin: str, *, split: bool = False) -> Any:
    """``value`` as ``option``'s field wants it, from a flag, the config file, MCDC_* or a strings map.

    Text is parsed by the field's type; ``split`` reads a repeatable option's text as a list (comma-separated,
    or a JSON array when an item holds a comma). ``origin`` names where the value came from in the error."""
    kind = field_kind(option.field)
    if kind is tuple:
        items = (_split(value, option.commas) if split else [value]) if isinstance(value, str) else value
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


def _split(text: str, commas: bool = True) -> list[str]:
    """A repeatable option's value in one string: ``a,b``, or ``["a{1,3}", "b"]`` when an item holds a comma.
    Without ``commas`` (an option whose items are full of them, as a JSON query is), the text is one item
    unless it is a JSON array."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            pass
        else:
            if isinstance(items, list) and all(isinstance(v, str) for v in items):
                return items
    if not commas:
        return [text.strip()] if text.strip() else []
    return [item.strip() for item in text.split(",") if item.strip()]


def _invalid(origin: str, problem: str, value: Any) -> ConfigError:
    shown = quoted(value) if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return ConfigError(f"{origin} {problem}, got {shown}")


def _format(value: Any, commas: bool = True) -> str:
    """The text :func:`_parse` reads back as ``value`` (``commas``: the option's, see :func:`_split`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        whole = any("," in v for v in value) or (not commas and len(value) > 1)
        return json.dumps(list(value)) if whole else ",".join(value)
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
            out[option.name] = _format(value, option.commas)
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


#: commands that connect to no source or target of their own (status reads a checkpoint; dev-server serves)
_UNCONNECTED = ("status", "dev-server")


def _build(merged: dict[str, Any], command: str | None) -> Settings:
    if not merged.get("source") and command not in _UNCONNECTED:
        raise ConfigError("no source: pass --source URI (or set MCDC_SOURCE)")
    return validate(Settings(**{"source": "", **merged}), command=command)


def validate(s: Settings, *, command: str | None = None) -> Settings:
    """Check values and cross-field rules; returns the settings with selection/renamer compiled.
    ``status`` needs neither a source nor a target (a --checkpoint is enough)."""
    for option in OPTIONS:  # flags, MCDC_* and the file were checked as they were read; Settings made in code
        value = getattr(s, option.field)
        if value is not None:
            _check(option, value, option.flag)
    if s.oplog_hours <= 0:
        raise _invalid("--oplog-hours", "must be more than 0", s.oplog_hours)
    if command == "dev-server":  # it serves: no source or target of its own to check
        return s
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
    ShardTargets.from_rules(s.shard_target)
    if s.shard_target and s.target and not is_mongo_uri(s.target):
        raise ConfigError(
            f"--shard-target shards a MongoDB target's collections: --target {redact(s.target)} is not one"
        )
    filters = DocumentFilters(s.filter)  # a bad filter fails now too
    if filters and needs_lookup(s.full_document):
        # a filter decides an update by its full document: the stream must carry one
        # (docs/how-to/partial-replication.md); updateLookup is the default, so this is a run that asked for less
        _log.info("--filter: the change stream reads updates with fullDocument updateLookup, not %s", s.full_document)
        s = replace(s, full_document="updateLookup")
    selection = Selection.from_patterns(s.include, s.exclude)
    renamer = Renamer.from_rules(s.rename)
    return replace(s, selection=selection, renamer=renamer, filters=filters)


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


#: the targets the Spark engine's executors write to (a refusal names them all)
SPARK_TARGETS = ("mongodb://", "kafka://", "delta:", "iceberg:")


def _validate_engine(s: Settings) -> None:
    for item in s.spark_conf:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():  # never echo the value: it may be a secret
            raise ConfigError(f"--spark-conf {key.strip() or '?'}: expected KEY=VALUE (e.g. spark.executor.memory=2g)")
    if s.engine == "spark" and (s.target in ("-", "stdout") or s.target.lower().startswith("jsonl:")):
        raise ConfigError(
            f"--engine spark writes from its executors, and --target {s.target} exists only on this machine's "
            f"driver: use --engine asyncio for stdout or jsonl:, or a target the Spark engine takes "
            f"({', '.join(SPARK_TARGETS[:-1])} or {SPARK_TARGETS[-1]})"
        )


def _validate_event_options(s: Settings) -> None:
    if s.extended_json == "debezium" and s.envelope != "debezium":
        raise ConfigError(
            f"--extended-json debezium writes Debezium 3.6's records: it goes with --envelope debezium, "
            f"not {s.envelope} (drop one of them)"
        )
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
