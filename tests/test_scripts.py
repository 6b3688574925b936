"""Smoke tests of scripts/: the demo and the benchmark run end to end on their own local servers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.scripts import run_script

pytestmark = pytest.mark.integration


def test_bench_sync_small_run_prints_a_ratio() -> None:
    result = run_script("bench_sync.py", "--docs", "2000", "--workers", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^ratio mcdc/baseline\s+\d+\.\d\d", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^(PASS|FAIL)  peak RSS < 300 MB$", result.stdout, re.MULTILINE), result.stdout
    assert "mcdc sync --source" in result.stdout


def test_bench_kafka_small_run_measures_all_three_parts() -> None:
    result = run_script("bench_kafka.py", "--events", "300", "--repeat", "1", "--cpu-rounds", "1", "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for ratio in ("write/raw", "send/raw", "mcdc/bare"):
        assert re.search(rf"^   ratio {ratio}\s+\d+\.\d\d", out, re.MULTILINE), out
    assert re.search(r"^   debezium\s+\d+\.\d\d", out, re.MULTILINE), out
    assert len(re.findall(r"^(PASS|FAIL)  ", out, re.MULTILINE)) == 3, out
    data = json.loads(out[out.rindex("\n{\n") + 1 :])
    assert {run["kind"] for run in data["delivery"]["runs"]} == {"mcdc write", "mcdc send", "raw aiokafka"}
    mix = data["events"]["mix"]
    for run in data["drain"]["runs"]:  # each verified by the script: every change event written once
        assert sum(run["data_lines"].values()) == sum(mix.values()) == 300


def test_demo_syncs_catches_up_and_verifies(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = run_script("demo.py", "--workdir", str(workdir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "identical: the target is a byte-exact copy" in result.stdout
    assert (workdir / "checkpoint.json").is_file()


def test_demo_refuses_to_wipe_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = run_script("demo.py", "--workdir", str(tmp_path))
    assert result.returncode != 0
    assert "not made by this demo" in result.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
