"""--engine spark's start without a cluster: Java and PySpark checks, the master, the settings, and the
errors a user sees (one line, non-zero exit)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from replicator.engines.spark import session
from replicator.errors import ConfigError, McdcError
from replicator.settings.resolve import resolve


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_392"', 8),
        ("no version here", None),
    ],
)
def test_java_version_is_read_from_java_dash_version(text: str, major: int | None) -> None:
    assert session.parse_java_version(text) == major


def test_a_local_master_gets_task_retries() -> None:
    assert session.master_url("local[*]") == "local[*,4]"
    assert session.master_url("local[2]") == "local[2,4]"
    assert session.master_url("local") == "local[1,4]"
    assert session.master_url("local[2,3]") == "local[2,3]"
    assert session.master_url("spark://h:7077") == "spark://h:7077"


def test_spark_conf_overrides_the_defaults() -> None:
    s = resolve(
        {"source": "mongodb://a", "target": "mongodb://b", "spark_conf": ("spark.sql.shuffle.partitions=3",)}, env={}
    )
    conf = session.spark_conf(s)
    assert conf["spark.sql.shuffle.partitions"] == "3" and conf["spark.ui.showConsoleProgress"] == "false"


def test_a_local_master_starts_its_jvm_with_quick_options_unless_told_otherwise() -> None:
    local = {"source": "mongodb://a", "target": "mongodb://b", "spark_master": "local[2]"}
    assert session.spark_conf(resolve(local, env={}))["spark.driver.extraJavaOptions"] == session.QUICK_JVM
    own = resolve({**local, "spark_conf": ("spark.driver.extraJavaOptions=-Xmx2g",)}, env={})
    assert session.spark_conf(own)["spark.driver.extraJavaOptions"] == "-Xmx2g"
    cluster = resolve({**local, "spark_master": "spark://h:7077"}, env={})
    assert "spark.driver.extraJavaOptions" not in session.spark_conf(cluster)


def test_no_pyspark_is_a_hint_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'mcdc\[spark\]'"):
        session.require_pyspark()


def test_no_java_or_an_old_java_names_java_17(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"Java 17\+"):
        session.check_java()
    old = tmp_path / "old" / "bin"
    old.mkdir(parents=True)
    java = old / "java"
    java.write_text("#!/bin/sh\necho 'java version \"1.8.0_392\"' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "old"))
    with pytest.raises(ConfigError, match=r"needs Java 17\+: .* is Java 8"):
        session.check_java()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize("target", ["stdout", "jsonl:/tmp/x.jsonl"])
def test_a_driver_only_target_is_refused_in_one_line(target: str) -> None:
    done = _cli("sync", "--engine", "spark", "-s", "mongodb://127.0.0.1:1", "-t", target)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "exists only on this machine's driver" in lines[0], done.stderr
    assert done.returncode == 2, done.stderr
    # issue 41: the message forgot delta and iceberg; it names every target the Spark engine takes
    for taken in ("mongodb://", "kafka://", "delta:", "iceberg:"):
        assert taken in lines[0], lines[0]


def test_a_bad_spark_conf_is_one_line_without_its_value() -> None:
    done = _cli("sync", "--engine", "spark", "-s", "mongodb://a", "-t", "mongodb://b", "--spark-conf", "secret")
    assert done.returncode != 0 and "KEY=VALUE" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_no_java_is_one_line_from_the_cli(tmp_path: Path) -> None:
    env = {"JAVA_HOME": str(tmp_path / "nowhere"), "PATH": "/nonexistent"}
    done = _cli("verify", "--engine", "spark", "-s", "mongodb://127.0.0.1:1", "-t", "mongodb://127.0.0.1:2", env=env)
    assert done.returncode != 0
    assert "Java 17+" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_cli_names_spark_s_log_when_a_run_fails_and_removes_it_when_one_succeeds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replicator import cli

    log = tmp_path / "mcdc-spark-1.log"
    log.write_text("ERROR Executor: Exception in task 0.0 in stage 0.0 (TID 0)\n")
    monkeypatch.setattr(session, "_console_logs", {log})  # as a Spark started by this process leaves it

    async def fail() -> None:
        raise McdcError("the snapshot failed on Spark: boom")

    async def succeed() -> int:
        return 1

    with pytest.raises(typer.Exit):
        cli._run(fail)
    assert capsys.readouterr().err == f"mcdc: error: the snapshot failed on Spark: boom (Spark's log: {log})\n"
    assert log.exists()
    assert cli._run(succeed) == 1
    assert not log.exists()
    with pytest.raises(typer.Exit):  # no log (asyncio, --verbose, spark-submit): the line alone
        cli._run(fail)
    assert capsys.readouterr().err == "mcdc: error: the snapshot failed on Spark: boom\n"
