"""What ``mcdc --version`` and ``mcdc --help`` import: only what they need (issue 41), so that starting mcdc
costs about what ``python -c "import pymongo"`` costs. The CPU itself is measured by scripts/bench_cpu.py (a
timed assertion would fail on a busy machine); these tests name the modules instead, so that a module-level
import of a heavy package (the driver, rich, the metrics server, a sink's client, Spark) cannot come back
without a test saying which command pulled it in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: packages a command's help or mcdc's version never needs: each is imported where a command runs
HEAVY = (
    "pymongo",
    "bson",
    "replicator.events",
    "replicator.settings.resolve",
    "typer.rich_utils",
    "rich",
    "prometheus_client",
    "pyspark",
    "aiokafka",
    "deltalake",
    "pyiceberg",
    "pyarrow",
    "asyncio",
    "replicator.job.phases",
    "replicator.sinks.registry",
)

_PROBE = """
import json, sys
sys.argv = ["mcdc", *sys.argv[1:]]
from replicator.cli import main
try:
    main()
except SystemExit:
    pass
print("\\n" + json.dumps(sorted(sys.modules)))
"""


def _modules_after(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)


@pytest.mark.parametrize(
    "args", [("--version",), ("version",), ("--help",), ("sync", "--help"), ("dev-server", "--help")]
)
def test_version_and_help_import_no_heavy_package(args: tuple[str, ...]) -> None:
    modules = _modules_after(*args)
    assert "replicator.cli" in modules  # the probe ran mcdc's own entry point
    assert not _heavy(modules), f"mcdc {' '.join(args)} imported {_heavy(modules)}"


def test_a_command_hands_its_flags_to_resolve_without_typer_coercing_them(tmp_path: Path) -> None:
    """typer coerces each option's value through a pydantic TypeAdapter it builds on every run (~0.1 s of
    CPU for a command's 60 options); mcdc's values stay text until resolve parses them, so none is built."""
    missing = tmp_path / "none.json"
    modules = _modules_after("status", "--checkpoint", str(missing), "--json")
    assert "replicator.settings.resolve" in modules  # the command ran as far as its settings
    assert not any(m.split(".")[0] in ("pydantic", "pydantic_core") for m in modules)


@pytest.mark.integration
def test_a_catch_up_with_nothing_to_replay_imports_no_progress_bars_metrics_or_spark(
    source_uri: str, target_uri: str, clients: Any, tmp_path: Path
) -> None:
    """A cron catch-up on an idle source, without a terminal or --metrics-port, draws no bars and serves no
    metrics: rich and prometheus_client stay unimported (and Spark, under the asyncio engine, and the
    event sinks' clients, for a MongoDB target)."""
    clients.source["app"].create_collection("c")
    clients.source["app"]["c"].insert_many([{"i": i} for i in range(10)])
    args = ("-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--no-progress")
    first = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "sync", *args], capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr[-2000:]
    modules = _modules_after("catch-up", *args)
    assert "replicator.job.phases" in modules  # it ran the job
    assert clients.target["app"]["c"].count_documents({}) == 10
    unneeded = ("rich", "prometheus_client", "pyspark", "pydantic", "aiokafka", "deltalake", "pyiceberg", "pyarrow")
    loaded = sorted(m for m in modules if m.split(".")[0] in unneeded)
    assert not loaded, f"an idle catch-up imported {loaded}"
