"""The command line: help with examples, one-line errors with non-zero exits, no tracebacks, no secrets."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pymongo
import pytest
import typer
from typer.testing import CliRunner

import replicator
from replicator import __version__
from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.cli import app
from replicator.settings.config import Settings
from replicator.settings.options import BY_ENV, for_command
from replicator.settings.resolve import field_kind, settings_from_strings
from tests.test_config import SAMPLE

runner = CliRunner()
COMMANDS = ["sync", "catch-up", "tail", "status", "verify", "cutover", "version", "dev-server"]
SETTINGS_COMMANDS = ["sync", "catch-up", "tail", "verify", "status", "cutover"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and "mcdc " + command in result.output


@pytest.mark.parametrize("command", SETTINGS_COMMANDS)
def test_help_groups_options_in_panels_and_lists_the_exit_codes(command: str) -> None:
    from replicator.settings.options import OPTIONS, PANELS

    assert all(option.panel in PANELS for option in OPTIONS)
    out = runner.invoke(app, [command, "--help"], terminal_width=100).output
    headings = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    shown = [h for h in headings if h in (*PANELS, "General")]
    assert shown == [p for p in (*PANELS, "General") if p in shown] and shown[0] == "Source and target", headings
    assert "Options:" not in out  # every option sits in a panel
    for option in for_command(command):  # each under its own panel's heading
        section = out[out.index(option.panel + ":") :]
        assert option.flag in section.split("\n\n")[0] + section.split("\n\n")[1], (option.flag, option.panel)
    for code in ("0", "1", "2", "3", "4", "75", "130"):
        assert re.search(rf"^\s+{code}\s+\S", out[out.index("Exit codes:") :], re.MULTILINE), code


@pytest.mark.parametrize("command", SETTINGS_COMMANDS)
def test_help_is_conventional(command: str) -> None:
    text = runner.invoke(app, [command, "-h"], terminal_width=200).output
    assert text == runner.invoke(app, [command, "--help"], terminal_width=200).output
    assert "<" not in text.split("Source and target:")[1].split("Example")[0]  # TEXT, INTEGER, URI, not <list[str]>
    example = text.split("Example")[1]
    assert "mongodb://" in example and not re.search(r"(?<![\"'])mongodb://", example)  # URIs are quoted
    if command != "status":
        assert re.search(r"--workers INTEGER +.*\[default: 4\]", text)
        assert "--include REGEX" in text and "--rename SRC=DST" in text


def test_version_flag_and_verify_help_lists_only_mongodb_targets() -> None:
    assert runner.invoke(app, ["--version"]).output == f"mcdc {__version__}\n"
    assert runner.invoke(app, ["-h"]).exit_code == 0
    for command in ("verify", "cutover"):
        text = runner.invoke(app, [command, "-h"], terminal_width=200).output
        target = next(line for line in text.splitlines() if "-t, --target" in line)
        assert "mongodb://" in target or "MongoDB" in target
        assert not re.search("kafka|stdout|jsonl|delta", target), (command, target)


def test_each_commands_help_lists_the_targets_and_options_it_takes() -> None:
    sync = runner.invoke(app, ["sync", "-h"], terminal_width=200).output
    target = next(line for line in sync.splitlines() if "-t, --target" in line)
    assert all(scheme in target for scheme in ("mongodb://", "kafka://", "stdout", "jsonl:", "delta:", "iceberg:"))
    cutover = runner.invoke(app, ["cutover", "-h"], terminal_width=200).output
    for panel in ("Kafka and event targets:", "Snapshot:"):
        assert panel not in cutover or "--snapshot " not in cutover, panel
    assert not re.search(r"--(envelope|kafka-opt|lake-opt|snapshot|drop-target|start-at|metrics-port)\b", cutover)
    for needed in ("--max-batch-size", "--block-writes", "--reverse-checkpoint", "--engine", "--full-verify"):
        assert needed in cutover, needed
    status = runner.invoke(app, ["status", "-h"], terminal_width=200).output
    assert not re.search(r"--(workers|engine|envelope|snapshot)\b", status) and "--include" in status


#: Fields a command's code reads that it offers no flag for, and why.
_VERIFIER = "the embedded verifier runs beside a tail (cutover compares on its own)"
#: sync copies and tail follows on: Spark is worth its start at once (a catch-up's replay may be over sooner)
_SPARK_AT_ONCE = "only a catch-up, which may be over before Spark is up, defers its start"
NOT_APPLICABLE = {
    "sync": {
        "shard_refresh_s": "only tail follows shards being added or removed",
        "verify": _VERIFIER,
        "verify_interval_s": _VERIFIER,
        "control": "POST /commit stops a tail",
        "spark_start_after_s": _SPARK_AT_ONCE,
    },
    "catch-up": {
        "shard_refresh_s": "only tail follows shards being added or removed",
        "verify": _VERIFIER,
        "verify_interval_s": _VERIFIER,
        "control": "POST /commit stops a tail",
    },
    "tail": {
        "snapshot_only": "tail follows the stream: a copy without it is sync --snapshot-only",
        "spark_start_after_s": _SPARK_AT_ONCE,
    },
    "verify": {"topic_prefix": "the default checkpoint's name holds it for an event sink: verify's target is MongoDB"},
    "status": {},
    "cutover": {
        "shard_refresh_s": "only tail follows shards being added or removed",
        "snapshot_only": "a cutover replays changes: its checkpoint's snapshot is done",
        "verify": _VERIFIER,
        "verify_interval_s": _VERIFIER,
        **dict.fromkeys(
            ("snapshot", "drop_target", "start_at", "start_after_debezium_offset", "shard_target"),
            "a cutover's checkpoint has its snapshot done",
        ),
        "on_history_lost": "a cutover whose position left the oplog fails: it takes no new snapshot",
        **dict.fromkeys(
            (
                "pre_images",
                "topic_prefix",
                "topic_routes",
                "sanitize_names",
                "envelope",
                "schemas",
                "extended_json",
                "tombstones",
                "tx_metadata",
                "heartbeat_interval_s",
                "kafka_opts",
                "lake_opts",
                "lake_columns",
                "lake_compact_every",
            ),
            "a cutover moves to a MongoDB target: event sinks' and lakes' options do not apply",
        ),
        **dict.fromkeys(("metrics_port", "metrics_host"), "a cutover serves no metrics (tail --control does)"),
    },
}
ROOT = Path(replicator.__file__).parent
#: The code each command runs: modules, and the functions of cli.py on its way.
_NOT_THE_JOB = (
    "cli.py",
    "config.py",
    "resolve.py",
    "options.py",
    "verify.py",
    "status.py",
    "cutover.py",
    "devserver.py",
)
READERS = {
    "job": (
        [p for p in ROOT.rglob("*.py") if p.name not in _NOT_THE_JOB],
        ["_settings", "_replicate", "_print_summary"],  # run_control.py is among the modules
    ),
    "verify": (
        [
            ROOT / "checking" / "verify.py",
            ROOT / "engines" / "spark" / "verify.py",
            ROOT / "engines" / "spark" / "session.py",
            ROOT / "source" / "reads.py",  # --read-preference, --max-read-rate
            ROOT / "job" / "migrations.py",  # --checkpoint: what a migration copies
        ],
        ["_settings", "verify"],
    ),
    "status": ([ROOT / "job" / "status.py"], ["_settings", "status"]),
}
READERS["cutover"] = (
    [*READERS["job"][0], *READERS["verify"][0], ROOT / "job" / "cutover.py"],
    ["_settings", "cutover"],
)
FIELDS = {f.name for f in dataclasses.fields(Settings)}
DERIVED = {
    "selection": {"include", "exclude"},
    "renamer": {"rename"},
    "filters": {"filter"},
    "guard": {"filter", "field_exclude"},
}


def _reads(tree: ast.AST) -> set[str]:
    """The Settings fields read in ``tree``: attributes of ``s``, ``settings``, ``self.s``, and the fields
    behind ``selection``, ``renamer`` and ``checkpoint_path()``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if not (isinstance(owner, ast.Name) and owner.id in ("s", "settings", "self")) and not (
            isinstance(owner, ast.Attribute) and owner.attr == "s"
        ):
            continue
        if node.attr == "checkpoint_path":
            # checked below against its code
            out |= {"checkpoint", "source", "target", "topic_prefix", "include", "exclude", "rename"}
            out |= {"field_exclude", "field_rename", "filter"}
        elif node.attr in FIELDS and not (isinstance(owner, ast.Name) and owner.id == "self"):
            out |= DERIVED.get(node.attr, {node.attr})
    return out


def _fields_read(command: str) -> set[str]:
    modules, functions = READERS.get(command, READERS["job"])
    out = set().union(*(_reads(ast.parse(path.read_text())) for path in modules))
    cli = ast.parse((ROOT / "cli.py").read_text())
    defs = {node.name: node for node in cli.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    for name in functions:
        out |= _reads(defs[name])
    return out


def test_checkpoint_path_reads_what_the_walk_assumes() -> None:
    config = ast.parse((ROOT / "settings" / "config.py").read_text())
    methods = [
        n for n in ast.walk(config) if isinstance(n, ast.FunctionDef) and n.name in ("checkpoint_path", "_digest")
    ]
    reads = {
        n.attr for m in methods for n in ast.walk(m) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    assert reads & FIELDS == {"checkpoint", "source", "target", "topic_prefix"}


@pytest.mark.parametrize("command", SETTINGS_COMMANDS)
def test_every_command_has_a_flag_for_each_setting_it_reads_and_no_other(command: str) -> None:
    offered = {option.field for option in for_command(command)}
    needed = _fields_read(command) - set(NOT_APPLICABLE[command])
    assert needed - offered == set(), f"mcdc {command} reads these settings but has no flag for them"
    assert offered - needed == set(), f"mcdc {command} has flags for settings it never reads"
    assert set(NOT_APPLICABLE[command]) <= _fields_read(command)  # the exceptions are real ones
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    assert {p.name for p in click_command.params} == offered | {"config"}


def _args(command: str) -> list[str]:
    """Every flag ``mcdc COMMAND`` takes, with SAMPLE's value."""
    args = []
    for option in for_command(command):
        value, kind = SAMPLE[option.name], field_kind(option.field)
        if kind is bool:
            args.append(option.flag if value == "true" else f"--no-{option.name}")
        elif kind is tuple:
            for item in value.split(",") if option.commas else [value]:
                args += [option.flag, item]
        else:
            args += [option.flag, value]
    return args


@pytest.mark.parametrize("command", SETTINGS_COMMANDS)
def test_every_flag_reaches_the_settings(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in BY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("replicator.observe.logs.setup_logging", lambda *args, **kwargs: None)
    seen: list[Settings] = []

    async def library_call(settings: Settings, **_: Any) -> Any:
        seen.append(settings)
        return {} if command == "status" else VerifyReport(0, 0, [])

    from replicator.checking.verify import VerifyReport

    monkeypatch.setattr("replicator.cli._replicate", lambda name, settings: seen.append(settings))
    monkeypatch.setattr("replicator.checking.verify.verify", library_call)
    monkeypatch.setattr("replicator.engines.spark.verify.verify_on_spark", library_call)  # SAMPLE's engine
    monkeypatch.setattr("replicator.job.status.status", library_call)
    monkeypatch.setattr("replicator.job.migrations.followed", lambda settings, command: settings)  # no checkpoint

    async def cutover(settings: Settings, reporter: Any) -> Any:
        from bson.timestamp import Timestamp

        from replicator.job.cutover import CutoverResult

        seen.append(settings)
        return CutoverResult(Timestamp(1, 1), 0, 0.0, "back.json", "mcdc tail ...", writes_blocked=False)

    monkeypatch.setattr("replicator.job.cutover.cutover", cutover)
    monkeypatch.setattr("replicator.job.release.release_only", cutover)  # SAMPLE's --release-only
    result = runner.invoke(app, [command, *_args(command)])
    assert result.exit_code == 0, result.output
    expected = settings_from_strings({o.name: SAMPLE[o.name] for o in for_command(command)}, command=command)
    assert seen == [expected]
    assert seen[0].replay_batch == (250 if command in ("sync", "catch-up", "tail", "cutover") else 1000)


def _mcdc(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("mcdc: error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_unreachable_source_with_credentials_redacted(tmp_path: Path) -> None:
    result = _mcdc(
        "sync", "--source", "mongodb://admin:hunter2@127.0.0.1:1/?directConnection=true&serverSelectionTimeoutMS=300",
        "--target", "mongodb://127.0.0.1:2", "--checkpoint", str(tmp_path / "cp.json"), "--no-progress",
    )  # fmt: skip
    _assert_one_line_error(result, 75, "source", "unreachable", "***@127.0.0.1:1")
    assert "hunter2" not in result.stderr + result.stdout


_DOWN = "mongodb://127.0.0.1:1/?directConnection=true&serverSelectionTimeoutMS=300"
_FAST_RETRIES = ("--retry-initial-delay", "0.05", "--retry-max-delay", "0.1")


def test_an_outage_exits_75_and_a_mistake_exits_2(tmp_path: Path) -> None:
    """cron and orchestrators tell them apart: retry later, or page a person."""
    cp = str(tmp_path / "cp.json")
    outage = _mcdc("catch-up", "-s", _DOWN, "-t", "mongodb://127.0.0.1:2", "-c", cp, "--no-progress")
    _assert_one_line_error(outage, 75, "source mongodb://127.0.0.1:1", "is unreachable")
    assert "waiting" not in outage.stderr  # no --max-retries: a cron run does not wait
    mistake = _mcdc("catch-up", "-s", _DOWN, "-t", "mongodb://127.0.0.1:2", "-c", cp, "--workers", "none")
    _assert_one_line_error(mistake, 2, "--workers")
    assert list(tmp_path.iterdir()) == []  # neither left a file behind


@pytest.mark.parametrize("command", ["tail", "sync"])
def test_an_unreachable_source_at_start_is_waited_for_and_said_once(command: str, tmp_path: Path) -> None:
    """tail waits under --max-retries; sync does when --max-retries is given. Once the retries are spent,
    the outage exits 75."""
    args = (command, "-s", _DOWN, "-t", "mongodb://127.0.0.1:2", "-c", str(tmp_path / "cp.json"), *_FAST_RETRIES)
    result = _mcdc(*args, "--max-retries", "3")
    _assert_one_line_error(result, 75, "gave up after 3 retries (--max-retries 3)", "is unreachable")
    waiting = [line for line in result.stderr.splitlines() if "waiting for the source" in line]
    assert len(waiting) == 1 and "retrying up to 3 retries (--max-retries)" in waiting[0], result.stderr
    assert "retrying in" not in result.stderr  # said once, not per attempt


@pytest.mark.integration
def test_a_wrong_replica_set_name_is_named_against_the_real_one(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        real = client.admin.command("hello").get("setName")
    if not real:
        pytest.skip("the source is not a replica set")
    host = source_uri.split("//", 1)[1].split("/", 1)[0].split(",")[0]
    wrong = f"mongodb://{host}/?replicaSet=not-{real}&serverSelectionTimeoutMS=500"
    result = _mcdc("sync", "-s", wrong, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--no-progress")
    _assert_one_line_error(result, 2, f"names replica set 'not-{real}'", f"is a member of replica set '{real}'")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--source", "localhost:27017", "--target", "mongodb://b"], "--source must be a mongodb://"),
        (["--source", "mongodb://a", "--target", "mongodb://b", "--include", "(unclosed"], "regular expression"),
        (["--source", "mongodb://a:1", "--target", "mongodb://a:1"], "is the source server"),
        (["--source", "mongodb://a", "--target", "mongodb://b", "--snapshot", "maybe"], "--snapshot must be one of"),
        (["--source", "mongodb://a:bad_port", "--target", "mongodb://b"], "malformed"),
        (["--source", "mongodb://a", "--target", "kafka://b"], "is not HOST:PORT"),
        (["--source", "mongodb://a", "--target", "kafka://b:1", "--tombstones", "yes"], "--tombstones must be one of"),
        (["--source", "mongodb://a", "--target", "kafka://b:1", "--kafka-opt", "acks=0"], "acks=all"),
        (["--source", "mongodb://a", "--target", "-", "--envelope", "avro"], "--envelope must be one of"),
        (["--source", "mongodb://a", "--target", "nosuch://x"], "unknown scheme 'nosuch'"),
    ],
)
def test_bad_input(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = _mcdc("sync", *args, "--checkpoint", str(tmp_path / "cp.json"))
    _assert_one_line_error(result, 2, fragment)


def test_kafka_secrets_never_echoed(tmp_path: Path) -> None:
    result = _mcdc(
        "sync", "-s", "mongodb://a", "-t", "kafka://b:1", "--kafka-opt", "sasl.jaas.config=user=x hunter2",
        "-c", str(tmp_path / "cp.json"),
    )  # fmt: skip
    _assert_one_line_error(result, 2, "sasl.jaas.config")
    assert "hunter2" not in result.stderr + result.stdout


def test_verify_needs_a_mongodb_target() -> None:
    _assert_one_line_error(_mcdc("verify", "-s", "mongodb://a", "-t", "kafka://b:1"), 2, "is not mongodb://")


def test_history_lost_message_names_commands_and_flags_that_exist() -> None:
    import re

    from pymongo.errors import OperationFailure

    from replicator.events import Position
    from replicator.source.changestream import _history_error

    error = _history_error(OperationFailure("history lost", code=286), Position())
    assert error is not None
    commands = re.findall(r"`mcdc ([\w-]+)((?: --?[\w-]+(?: [\w-]+)?)*)`", str(error))
    assert commands, str(error)
    for command, args in commands:
        help_text = runner.invoke(app, [command, "--help"], terminal_width=200).output
        assert "Usage" in help_text, (command, help_text)
        for flag, value in re.findall(r"(--[\w-]+)(?: ([\w-]+))?", args):
            assert re.search(rf"{flag}(?![\w-])", help_text), f"mcdc {command} has no {flag}"
            assert not value or value in help_text, f"mcdc {command} {flag} does not take {value}"


def test_status_of_a_binary_garbage_checkpoint_is_one_line(tmp_path: Path) -> None:
    cp = tmp_path / "garbage.json"
    cp.write_bytes(b"\xff\xfe\x00\x80 not a checkpoint \xc3\x28")
    _assert_one_line_error(_mcdc("status", "--checkpoint", str(cp)), 2, "is corrupt")


@pytest.mark.integration
def test_corrupt_checkpoint(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    cp.write_text('{"format": "mcdc-checkpoint", "version": 1, "position": ')
    result = _mcdc("catch-up", "--source", source_uri, "--target", target_uri, "--checkpoint", str(cp))
    _assert_one_line_error(result, 2, "is corrupt")
    assert cp.read_text().endswith('"position": ')  # left as it was for the user to inspect


@pytest.mark.integration
def test_a_first_catch_up_takes_the_snapshot_as_sync_would(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "none.json"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i} for i in range(5)])
    first = _mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["documents"] == 5 and json.loads(cp.read_text())["snapshot"]["status"] == "done"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 5})
    second = _mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["documents"] == 0
    with pymongo.MongoClient(target_uri) as client:
        assert sorted(d["_id"] for d in client.db.c.find()) == list(range(6))


@pytest.mark.integration
def test_overlapping_catch_up_exits_at_once(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1})
    first = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress")
    assert first.returncode == 0, first.stderr
    with CheckpointStore(cp).locked():  # as a running catch-up would hold it
        second = _mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp))
    _assert_one_line_error(second, 3, "in use by another mcdc process")
    third = _mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--json")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["command"] == "catch-up"


@pytest.mark.integration
def test_config_file_and_env(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cfg = tmp_path / "mcdc.toml"
    cfg.write_text(f'source = "{source_uri}"\ntarget = "{target_uri}"\nworkers = 2\n')
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1})
    result = _mcdc("sync", "--config", str(cfg), "-c", str(tmp_path / "cp.json"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["documents"] == 1


@pytest.mark.integration
def test_verify_exit_codes_after_sync(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    from tests.support.corpus import load_corpus

    with pymongo.MongoClient(source_uri) as client:
        load_corpus(client, mixed_count=500)
    synced = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--no-progress")
    assert synced.returncode == 0, synced.stderr
    same = _mcdc("verify", "-s", source_uri, "-t", target_uri)
    assert same.returncode == 0, same.stdout + same.stderr
    with pymongo.MongoClient(target_uri) as client:
        # a change undone leaves the same bytes: not a difference
        doc = client.corpus.mixed_ids.find_one({"_id": {"$type": "string"}})
        assert doc is not None
        client.corpus.mixed_ids.update_one({"_id": doc["_id"]}, {"$set": {"probe": 1}})
        client.corpus.mixed_ids.update_one({"_id": doc["_id"]}, {"$unset": {"probe": ""}})
        # one byte of one document: "3" -> "4"
        client.corpus_other.things.update_one({"_id": 3}, {"$set": {"v": "4"}})
    differs = _mcdc("verify", "-s", source_uri, "-t", target_uri, "--json")
    assert differs.returncode == 1
    report = json.loads(differs.stdout)
    assert [(d["ns"], d["kind"], d["ids"]) for d in report["differences"]] == [
        ("corpus_other.things", "changed", ['{"$numberInt": "3"}'])
    ]


@pytest.mark.integration
def test_a_selection_that_matches_nothing(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    uris = ("-s", source_uri, "-t", target_uri)
    empty = _mcdc("verify", *uris)  # an empty source: nothing compared is not "identical"
    _assert_one_line_error(empty, 2, "nothing to verify", "no collection")
    with pymongo.MongoClient(source_uri) as client:
        client.shop.customers.insert_one({"_id": 1})
    typo = _mcdc("verify", *uris, "--include", r"shop\.custmers")
    _assert_one_line_error(typo, 2, r"--include 'shop\.custmers' matches no namespace", "shop.customers")
    excluded = _mcdc("verify", *uris, "--exclude", r"shop\..*")
    _assert_one_line_error(excluded, 2, "--exclude leaves no namespace")
    cp = tmp_path / "cp.json"
    refused = _mcdc("sync", *uris, "-c", str(cp), "--include", r"shop\.orders", "--no-progress")
    _assert_one_line_error(refused, 2, r"--include 'shop\.orders' matches no namespace on the source")
    assert list(tmp_path.iterdir()) == []  # a refused run leaves neither a checkpoint nor a lock file
    with pymongo.MongoClient(source_uri) as client:
        client.drop_database("shop")
    synced = _mcdc("sync", *uris, "-c", str(cp), "--no-progress")  # an empty source: a warning
    assert synced.returncode == 0, synced.stderr
    assert "WARNING" in synced.stderr and "the source holds no collection" in synced.stderr


@pytest.mark.integration
def test_status_finds_the_default_checkpoint(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1})
    synced = _mcdc("sync", "-s", source_uri, "-t", target_uri, "--no-progress", env=env)
    assert synced.returncode == 0, synced.stderr
    (default,) = (tmp_path / "mcdc").glob("checkpoint-*.json")
    status = _mcdc("status", "-s", source_uri, "-t", target_uri, "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["checkpoint"] == str(default)
    cfg = tmp_path / "mcdc.toml"
    cfg.write_text(f'source = "{source_uri}"\ntarget = "{target_uri}"\njson = true\n')
    from_config = _mcdc("status", "--config", str(cfg), env=env)
    assert json.loads(from_config.stdout)["checkpoint"] == str(default)
    _assert_one_line_error(_mcdc("status", env=env), 2, "pass --checkpoint PATH, or --source and --target")
    other = _mcdc("status", "-s", source_uri, "-t", "mongodb://elsewhere.example", env=env)
    _assert_one_line_error(other, 2, "no checkpoint at", "the default one of this source and target")


@pytest.mark.integration
def test_verbose_is_mcdc_and_the_driver_log_has_its_own_flag(source_uri: str, tmp_path: Path) -> None:
    from bson.timestamp import Timestamp

    from replicator.events import Position

    cp = tmp_path / "cp.json"  # a position and no recorded lag: status measures it against the source
    CheckpointStore(cp).save(Checkpoint("rs:x", position=Position(cluster_time=Timestamp(1, 1))))
    verbose = _mcdc("status", "-c", str(cp), "-s", source_uri, "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert " pymongo" not in verbose.stderr
    driver = _mcdc("status", "-c", str(cp), "-s", source_uri, "--debug-driver")
    assert driver.returncode == 0, driver.stderr
    assert " DEBUG pymongo." in driver.stderr


@pytest.mark.integration
def test_a_field_rule_on_an_id_is_refused_in_one_line_before_any_write(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """--field-exclude db.c._id.x at once; db.a.b._id once the source shows a collection named a.b."""
    with pymongo.MongoClient(source_uri) as client:
        client.db["a.b"].insert_one({"_id": {"x": 1}})
    base = ["sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--no-progress"]
    _assert_one_line_error(_mcdc(*base, "--field-exclude", "db.c._id.x"), 2, "_id is the document key")
    _assert_one_line_error(_mcdc(*base, "--field-rename", "db.a.b._id=z"), 2, "in db.a.b this names _id")
    with pymongo.MongoClient(target_uri) as client:
        assert "db" not in client.list_database_names()


@pytest.mark.integration
@pytest.mark.parametrize("command", ["catch-up", "sync"])
def test_a_start_at_later_than_the_source_s_time_is_refused_in_one_line(
    command: str, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Issue 41: a --start-at in the future was accepted, and the run waited for events that a replay from
    there would silently skip past when they came earlier."""
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1})
        now = client.admin.command("ping")["operationTime"]
    cp = tmp_path / "cp.json"
    later = f"{now.time + 3600},1"
    result = _mcdc(command, "-s", source_uri, "-t", target_uri, "-c", str(cp), "--start-at", later, "--no-progress")
    _assert_one_line_error(result, 2, f"--start-at {later}", "later than the source's current time", "--start-at")
    assert not cp.exists()  # no checkpoint at a position the source has not reached
    with pymongo.MongoClient(target_uri) as client:
        assert "db" not in client.list_database_names()
    in_the_future = "2199-01-01T00:00:00Z"
    result = _mcdc(command, "-s", source_uri, "-t", target_uri, "-c", str(cp), "--start-at", in_the_future)
    _assert_one_line_error(result, 2, f"--start-at '{in_the_future}'", "1970 to 2106")  # not a traceback


class _HttpServer:
    """A port that answers as an HTTP server does, whatever it is sent (issue 41's web server on the port)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        """An HTTP reply to whatever comes, the connection kept open until the client closes it."""
        with conn:
            try:
                while conn.recv(65536):
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()


@pytest.mark.integration
def test_a_port_that_answers_http_is_named_so_in_one_line(source_uri: str, tmp_path: Path) -> None:
    """Issue 41: "Message length (1347703880) is larger than server max message size", which is b"HTTP" read
    as a length."""
    http = _HttpServer()
    try:
        web = f"mongodb://127.0.0.1:{http.port}/?directConnection=true&serverSelectionTimeoutMS=20000"
        cp = str(tmp_path / "cp.json")
        as_source = _mcdc("sync", "-s", web, "-t", "mongodb://127.0.0.1:2", "-c", cp, "--no-progress")
        _assert_one_line_error(as_source, 2, f"source mongodb://127.0.0.1:{http.port}/", "other than MongoDB", "HTTP")
        assert "Message length" not in as_source.stderr
        as_target = _mcdc("sync", "-s", source_uri, "-t", web, "-c", cp, "--no-progress")
        _assert_one_line_error(as_target, 2, f"target mongodb://127.0.0.1:{http.port}/", "other than MongoDB")
        assert not (tmp_path / "cp.json").exists()
    finally:
        http.close()
