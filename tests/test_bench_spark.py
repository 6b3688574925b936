"""Smoke test of scripts/bench_spark.py: a tiny run end to end on its own local servers and local[2] Spark."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.scripts import run_script
from tests.support.spark import quick_jvm_conf

pytestmark = pytest.mark.integration


def test_bench_spark_small_run_prints_both_engines_and_the_targets() -> None:
    quick = [f"--mcdc-arg={arg}" for arg in quick_jvm_conf()]  # its Spark runs start a JVM each
    result = run_script("bench_spark.py", "--docs", "1000", "--events", "200", "--json", *quick, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for engine in ("asyncio", "spark"):
        assert re.search(rf"^snapshot {engine}\s+1,000\s", out, re.MULTILINE), out
    assert re.search(r"^ratio spark/asyncio docs/s\s+\d+\.\d\d", out, re.MULTILINE), out
    assert re.search(r"^spark start overhead\s+-?\d+\.\d\d s", out, re.MULTILINE), out
    assert re.search(r"^(PASS|FAIL)  spark/asyncio docs/s with start >= 0.8$", out, re.MULTILINE), out
    assert re.search(r"^(PASS|FAIL)  spark/asyncio catch-up events/s with start >= 1.0$", out, re.MULTILINE), out
    assert re.search(r"^ratio spark/asyncio events/s\s+\d+\.\d\d with start", out, re.MULTILINE), out
    assert re.search(r"^(PASS|FAIL)  spark driver peak RSS < 300 MB$", out, re.MULTILINE), out
    assert "mcdc sync --source" in out and "--engine spark --spark-master 'local[2]'" in out
    data = json.loads(out[out.rindex("\n{\n") + 1 :])
    spark = next(run for run in data["snapshot"] if run["engine"] == "spark")
    assert spark["memory"]["driver_mb"] > 0 and spark["memory"]["jvm_mb"] > 0  # the JVM is measured apart
    tails = {run["engine"] for run in data["tail"]}
    assert tails == {"asyncio", "spark"} and not data["tail_skipped"]  # the Spark replay ran
    assert all(run["count"] >= 200 for run in data["tail"])
