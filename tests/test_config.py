"""Settings resolution: flags > MCDC_* environment > TOML file > defaults, and validation; one name per
option (the long flag) for the command line, MCDC_* variables, config-file keys and strings maps."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path

import pytest

from replicator.errors import ConfigError
from replicator.settings.config import Settings
from replicator.settings.options import BY_NAME, OPTIONS, for_command
from replicator.settings.resolve import resolve, settings_from_strings, settings_to_strings
from replicator.settings.uri import redact

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SRC = "mongodb://a.example:27017/?replicaSet=rs0"
DST = "mongodb://b.example:27017"


def test_defaults_and_flags() -> None:
    s = resolve({"source": SRC, "target": DST, "workers": 8}, env={})
    assert s.workers == 8
    assert s.snapshot == "initial"
    assert s.batch_docs == 1000


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    cfg = tmp_path / "mcdc.toml"
    cfg.write_text(f'source = "{SRC}"\ntarget = "{DST}"\nworkers = 2\nbatch-docs = 10\nexclude = ["x\\\\..*"]\n')
    env = {"MCDC_WORKERS": "3", "MCDC_BATCH_DOCS": "20"}
    s = resolve({"workers": 5}, env=env, config_file=cfg)
    assert (s.workers, s.batch_docs, s.exclude) == (5, 20, ("x\\..*",))
    s = resolve({}, env=env, config_file=cfg)
    assert s.workers == 3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"source": "http://x", "target": DST}, "--source must be a mongodb://"),
        ({"source": SRC, "target": SRC}, "is the source server"),
        ({"source": SRC, "target": DST, "include": ("a[",)}, "not a valid regular expression"),
        ({"source": SRC, "target": DST, "snapshot": "sometimes"}, "--snapshot must be one of"),
        ({"source": SRC, "target": DST, "workers": 0}, "--workers must be at least 1"),
        ({"source": SRC, "target": DST, "rename": ("a.b=c",)}, "maps a collection to a database"),
        ({"source": SRC}, "no target"),
        ({}, "no source"),
    ],
)
def test_bad_input_is_one_clear_error(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(flags, env={})


def test_a_regex_is_echoed_as_typed() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve({"source": SRC, "target": DST, "include": ("ap\\.users[",)}, env={})
    assert str(caught.value).startswith("--include 'ap\\.users[' is not a valid regular expression"), caught.value


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="MCDC_WORKERS"):
        resolve({"source": SRC, "target": DST}, env={"MCDC_WORKERS": "many"})


def test_bad_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("workers = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve({"source": SRC, "target": DST}, env={}, config_file=cfg)
    cfg.write_text("wrokers = 3")
    with pytest.raises(ConfigError, match="unknown setting 'wrokers' \\(did you mean 'workers'\\?\\)"):
        resolve({"source": SRC, "target": DST}, env={}, config_file=cfg)


def test_default_checkpoint_is_per_pair_and_credential_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    a = resolve({"source": "mongodb://u:secret@a.example/", "target": DST}, env={}).checkpoint_path()
    b = resolve({"source": "mongodb://u:other@a.example/", "target": DST}, env={}).checkpoint_path()
    c = resolve({"source": SRC, "target": "mongodb://c.example"}, env={}).checkpoint_path()
    assert a == b != c
    assert a.parent == tmp_path / "mcdc" and "secret" not in str(a)


def test_stdout_and_dash_share_a_default_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    dash = resolve({"source": SRC, "target": "-"}, env={}).checkpoint_path()
    word = resolve({"source": SRC, "target": "stdout"}, env={}).checkpoint_path()
    assert dash == word != resolve({"source": SRC, "target": "jsonl:/tmp/x"}, env={}).checkpoint_path()
    # a checkpoint an earlier mcdc made for "-" under its own name is still found by both spellings
    old = dash.with_name("checkpoint-" + resolve({"source": SRC, "target": "-"}, env={})._digest("-") + ".json")
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    assert resolve({"source": SRC, "target": "stdout"}, env={}).checkpoint_path() == old
    assert resolve({"source": SRC, "target": "-"}, env={}).checkpoint_path() == old


def test_redact_hides_credentials_everywhere() -> None:
    text = "failed: mongodb://admin:s3cr%40t@h1:27017,h2/?authSource=admin&password=x and kafka://u:p@b:9092"
    out = redact(text)
    assert "s3cr" not in out and "password=x" not in out and "u:p@" not in out
    assert "mongodb://***@h1:27017,h2/" in out


def test_tail_settings() -> None:
    from bson.timestamp import Timestamp

    from replicator.settings.config import parse_start_at

    s = resolve({"source": SRC, "target": DST}, env={"MCDC_METRICS_PORT": "9464", "MCDC_MAX_RETRIES": "-1"})
    assert (s.metrics_port, s.max_retries, s.metrics_host) == (9464, -1, "127.0.0.1")
    assert parse_start_at("1700000000,5") == Timestamp(1700000000, 5)
    assert parse_start_at("2023-11-14T22:13:20Z") == Timestamp(1700000000, 1)
    assert parse_start_at("2023-11-14T22:13:20") == Timestamp(1700000000, 1)  # no zone: UTC
    for bad, message in (("yesterday", "neither an ISO-8601"), ("1,x", "two whole numbers")):
        with pytest.raises(ConfigError, match=message):
            resolve({"source": SRC, "target": DST, "start_at": bad}, env={})
    with pytest.raises(ConfigError, match="--on-history-lost"):
        resolve({"source": SRC, "target": DST, "on_history_lost": "ignore"}, env={})
    with pytest.raises(ConfigError, match="--metrics-port"):
        resolve({"source": SRC, "target": DST, "metrics_port": 70000}, env={})


#: Every option, with a value other than its default, as text (lists comma-separated).
SAMPLE = {
    "source": "mongodb://src.example:27017/?replicaSet=rs0",
    "target": "mongodb://dst.example:27017",
    "checkpoint": "/var/lib/mcdc/sample.json",
    "connect-timeout": "2.5",
    "io-timeout": "60",
    "include": "shop\\..*,crm\\.customers",
    "exclude": "shop\\.tmp_.*",
    "rename": "crm=crm_replica",
    "field-exclude": "crm.customers.ssn",
    "field-rename": "shop.orders.total=amount",
    "filter": 'shop\\.orders={"region": "EU", "total": {"$gte": 10}}',
    "allow-unmatched": "true",
    "list": "true",
    "forget": "/var/lib/mcdc/old.json",
    "snapshot": "always",
    "snapshot-only": "true",
    "drop-target": "true",
    "shard-target": 'shop\\.orders={"region": 1}',
    "start-at": "2024-05-01T00:00:00Z",
    "start-after-debezium-offset": "@/var/lib/mcdc/debezium-offset.json",
    "workers": "8",
    "partition-docs": "10000",
    "split": "never",
    "batch-docs": "500",
    "batch-bytes": "4194304",
    "queue-batches": "2",
    "read-preference": "secondaryPreferred",
    "max-read-rate": "2000",
    "full-document": "required",  # (kept under --filter, which raises whenAvailable to updateLookup)
    "pre-images": "whenAvailable",
    "max-batch-size": "250",
    "max-queue-size": "4096",
    "on-history-lost": "resnapshot",
    "oversize": "skip",
    "shard": "mongodb://shard0.example/?replicaSet=sh0,mongodb://shard1.example/?replicaSet=sh1",
    "shard-refresh-interval": "5",
    "max-retries": "-1",
    "retry-initial-delay": "0.5",
    "retry-max-delay": "60",
    "topic-prefix": "prod",
    "topic-route": "shop\\.orders_.*=shop.orders",
    "sanitize-names": "true",
    "envelope": "plain",
    "schemas": "true",
    "extended-json": "relaxed",
    "tombstones": "off",
    "tx-metadata": "true",
    "heartbeat-interval": "10",
    "kafka-opt": "compression.type=zstd,linger.ms=5",
    "lake-opt": "AWS_REGION=eu-west-1",
    "lake-compact-every": "50",
    "lake-columns": "typed",
    "engine": "spark",
    "spark-master": "spark://spark.example:7077",
    "replay-partitions": "6",
    "spark-start-after": "2.5",
    "spark-conf": "spark.executor.memory=2g,spark.executor.cores=2",
    "metrics-port": "9464",
    "metrics-host": "0.0.0.0",
    "verify-sample": "10",
    "verify": "true",
    "verify-interval": "30",
    "full-verify": "true",
    "control": "true",
    "block-writes": "true",
    "reverse-checkpoint": "/var/lib/mcdc/back.json",
    "release-only": "true",
    "json": "true",
    "progress": "false",
    "log-format": "json",
    "verbose": "true",
    "debug-driver": "true",
    "oplog-entries": "5000",
    "oplog-hours": "2.5",
}


def test_every_settings_field_has_one_option_and_every_option_one_name() -> None:
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    assert sorted(o.field for o in OPTIONS) == sorted(set(fields) - {"selection", "renamer", "filters", "guard"})
    assert len({o.name for o in OPTIONS}) == len(OPTIONS)
    for option in OPTIONS:
        assert re.fullmatch(r"[a-z][a-z-]*[a-z]", option.name), option.name
        assert option.env == "MCDC_" + option.name.upper().replace("-", "_")
        assert option.commands and set(option.commands) <= {
            "sync", "catch-up", "tail", "verify", "status", "cutover", "dev-server"
        }  # fmt: skip
        assert "<" not in option.metavar and "list[" not in option.metavar
    assert set(SAMPLE) == set(BY_NAME)
    for option in OPTIONS:  # the sample really differs from every default
        assert getattr(settings_from_strings(SAMPLE), option.field) != fields[option.field].default, option.name


def test_every_option_reads_the_same_from_a_strings_map_the_environment_and_a_config_file(tmp_path: Path) -> None:
    from_strings = settings_from_strings(SAMPLE)
    assert from_strings.replay_batch == 250 and from_strings.retry_initial_s == 0.5 and from_strings.json_output
    assert from_strings.include == ("shop\\..*", "crm\\.customers")
    assert from_strings.checkpoint == Path(SAMPLE["checkpoint"])
    assert resolve({}, env={o.env: SAMPLE[o.name] for o in OPTIONS}) == from_strings
    cfg = tmp_path / "all.toml"
    lines = []
    for option in OPTIONS:
        value = getattr(from_strings, option.field)
        lines.append(f"{option.name} = {_toml(value)}")
    cfg.write_text("\n".join(lines) + "\n")
    assert resolve({}, env={}, config_file=cfg) == from_strings
    underscored = [key.replace("-", "_") + " " + rest for key, rest in (line.split(" ", 1) for line in lines)]
    cfg.write_text("\n".join(underscored) + "\n")
    assert resolve({}, env={}, config_file=cfg) == from_strings


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string (quotes and backslashes escaped)


def test_settings_round_trip_through_strings() -> None:
    s = resolve({"source": SRC, "target": DST, "include": ("a{1,3}\\.b", "c\\..*"), "workers": 3}, env={})
    strings = settings_to_strings(s)
    assert strings["include"] == '["a{1,3}\\\\.b", "c\\\\..*"]'  # an item holds a comma: a JSON array
    assert settings_from_strings(strings) == s
    assert settings_from_strings(settings_to_strings(settings_from_strings(SAMPLE))) == settings_from_strings(SAMPLE)


def test_examples_are_valid_and_the_main_one_shows_every_option() -> None:
    for example in sorted(EXAMPLES.glob("*.toml")):
        resolve({}, env={}, config_file=example)
    text = (EXAMPLES / "mcdc.toml").read_text()
    shown = set(re.findall(r"^#? ?([a-z][a-z-]+) = ", text, re.MULTILINE))
    assert shown == set(BY_NAME)
    uncommented = re.sub(r"^# ([a-z][a-z-]+ = )", r"\1", text, flags=re.MULTILINE)
    tomllib.loads(uncommented)  # the commented lines are valid settings too
    assert set(tomllib.loads(uncommented)) == set(BY_NAME)


def test_older_field_names_point_to_the_option(tmp_path: Path) -> None:
    cfg = tmp_path / "old.toml"
    renamed = {
        "replay-batch": "max-batch-size",
        "retry_initial_s": "retry-initial-delay",
        "kafka-opts": "kafka-opt",
        "json_output": "json",
        "topic-routes": "topic-route",
    }
    for old, new in renamed.items():
        cfg.write_text(f"{old} = 1\n")
        with pytest.raises(ConfigError, match=f"unknown setting '{old}' \\(did you mean '{new}'\\?\\)"):
            resolve({"source": SRC, "target": DST}, env={}, config_file=cfg)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MCDC_MAX_BATCH_SIZE": "abc"}, "MCDC_MAX_BATCH_SIZE must be a whole number, got 'abc'"),
        ({"MCDC_WORKERS": "0"}, "MCDC_WORKERS must be at least 1, got 0"),
        ({"MCDC_RETRY_INITIAL_DELAY": "soon"}, "MCDC_RETRY_INITIAL_DELAY must be a number, got 'soon'"),
        ({"MCDC_DROP_TARGET": "maybe"}, "MCDC_DROP_TARGET must be true or false, got 'maybe'"),
        ({"MCDC_SNAPSHOT": "sometimes"}, "MCDC_SNAPSHOT must be one of initial, always, never, when_needed"),
        ({"MCDC_METRICS_PORT": "70000"}, "MCDC_METRICS_PORT must be at most 65535, got 70000"),
    ],
)
def test_a_bad_environment_value_is_one_line_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as error:
        resolve({"source": SRC, "target": DST}, env=env)
    assert named in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('max-batch-size = "abc"', "max-batch-size must be a whole number, got 'abc'"),
        ("workers = 2.5", "workers must be a whole number, got 2.5"),
        ("progress = 1", "progress must be true or false, got 1"),
        ('include = [1, "a"]', "include must be a string or a list of strings"),
        ('envelope = "avro"', "envelope must be one of debezium, debezium-legacy, plain, got 'avro'"),
        ("shard-refresh = 5", "unknown setting 'shard-refresh' (did you mean 'shard-refresh-interval'?)"),
        ("config = 'x.toml'", "unknown setting 'config'"),
    ],
)
def test_a_bad_config_key_or_value_is_one_line_naming_it(toml: str, named: str, tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml + "\n")
    with pytest.raises(ConfigError) as error:
        resolve({"source": SRC, "target": DST}, env={}, config_file=cfg)
    assert f"config file {cfg}: " in str(error.value) and named in str(error.value) and "\n" not in str(error.value)


def test_a_bad_strings_key_or_value_is_one_line_naming_it() -> None:
    with pytest.raises(ConfigError, match="unknown option 'max_batch' \\(did you mean 'max-batch-size'\\?\\)"):
        settings_from_strings({"source": SRC, "target": DST, "max_batch": "5"})
    with pytest.raises(ConfigError, match="option max-batch-size must be a whole number, got 'lots'"):
        settings_from_strings({"source": SRC, "target": DST, "max-batch-size": "lots"})


def test_unknown_mcdc_variables_warn_with_the_closest_option() -> None:
    warnings: list[str] = []
    env = {
        "MCDC_WROKERS": "3",
        "MCDC_REPLAY_BATCH": "9",  # an older field-derived name
        "MCDC_TEST_SOURCE_URI": "mongodb://x",  # the test suite's and the scripts' own: known
        "MCDC_VENV": "/opt/venv",
        "MCDC_CONFIG": "",
        "MCDCX": "not ours",
    }
    s = resolve({"source": SRC, "target": DST}, env=env, warn=warnings.append)
    assert s.workers == 4 and s.replay_batch == 1000
    assert warnings == [
        "ignoring the unknown variable 'MCDC_WROKERS' (did you mean 'MCDC_WORKERS'?)",
        "ignoring the unknown variable 'MCDC_REPLAY_BATCH' (did you mean 'MCDC_MAX_BATCH_SIZE'?)",
    ]


def test_environment_lists_are_comma_separated_or_a_json_array(tmp_path: Path) -> None:
    env = {"MCDC_INCLUDE": "a\\..*, b\\.c", "MCDC_KAFKA_OPT": '["sasl.jaas.config=x a,b", "acks=all"]'}
    s = resolve({"source": SRC, "target": DST}, env=env)
    assert s.include == ("a\\..*", "b\\.c")
    assert s.kafka_opts == ("sasl.jaas.config=x a,b", "acks=all")


def test_mcdc_config_names_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "mcdc.toml"
    cfg.write_text(f'source = "{SRC}"\ntarget = "{DST}"\nmax-batch-size = 77\n')
    assert resolve({}, env={"MCDC_CONFIG": str(cfg)}).replay_batch == 77


def test_status_needs_neither_source_nor_target() -> None:
    s = resolve({"checkpoint": Path("/tmp/cp.json")}, env={}, command="status")
    assert (s.source, s.target, s.checkpoint_path()) == ("", "", Path("/tmp/cp.json"))
    with pytest.raises(ConfigError, match="--source must be a mongodb://"):
        resolve({"source": "localhost"}, env={}, command="status")


def test_messages_name_flags_that_exist() -> None:
    """Every --flag a message of mcdc's names is a flag of some command (no --replay-batch)."""
    flags = {o.flag for o in OPTIONS} | {a for o in OPTIONS for a in o.aliases}
    flags |= {"--no-progress", "--config", "--help", "--version"}
    flags |= {"--conf"}  # spark-submit's, named by the data source's advice on a worker Python without mcdc
    root = Path(__file__).resolve().parent.parent / "replicator"
    for path in root.rglob("*.py"):
        if path.name in (
            "cli.py",
            "flags.py",
            "options.py",
            "devserver.py",
        ):  # where flags are made; secantusd-py's
            continue
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", path.read_text()):
            assert flag in flags, f"{path.name} names {flag}, which no command has"
    assert all(for_command(command) for command in ("sync", "catch-up", "tail", "verify", "status"))
