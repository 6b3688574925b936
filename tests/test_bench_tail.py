"""Smoke test of scripts/bench_tail.py: a tiny run end to end on its own local servers."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.support.scripts import REPO_ROOT, run_script

pytestmark = pytest.mark.integration


def _tail_missing() -> bool:
    probe = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "tail", "--help"], cwd=REPO_ROOT, capture_output=True, check=False
    )
    return probe.returncode != 0


@pytest.mark.skipif(_tail_missing(), reason="`mcdc tail --help` fails: this checkout has no mcdc tail command yet")
def test_bench_tail_small_run_prints_a_ratio_and_p99() -> None:
    result = run_script("bench_tail.py", "--events", "500", "--rate", "50", "--duration", "3", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^ratio mcdc/naive\s+\d+\.\d\d", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^lag p99\s+\d+\.\d ms$", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^(PASS|FAIL)  lag p99 < 1 s$", result.stdout, re.MULTILINE), result.stdout
    assert "mcdc tail --source" in result.stdout


def _bench_tail(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))  # where the script finds its harness
    return importlib.import_module("bench_tail")


def test_a_backlog_landing_between_two_looks_still_has_a_first_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI once saw the whole backlog land between the look for any document and the look for the marker:
    the run finished with no first write, and the script failed."""
    looks = _bench_tail(monkeypatch).Looks()
    looks.look(1.0, any_document=lambda: False, marker=lambda: False, matches=lambda: False)
    looks.look(2.0, any_document=lambda: False, marker=lambda: True, matches=lambda: True)
    assert (looks.first_write, looks.marker_seen, looks.finished) == (2.0, 2.0, 2.0)


def test_the_finish_is_the_first_look_after_the_marker_that_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    looks = _bench_tail(monkeypatch).Looks()
    looks.look(1.0, any_document=lambda: True, marker=lambda: False, matches=lambda: False)
    looks.look(2.0, any_document=lambda: True, marker=lambda: True, matches=lambda: False)
    unfinished = looks.finished
    assert unfinished is None
    looks.look(3.0, any_document=lambda: True, marker=lambda: True, matches=lambda: True)
    assert (looks.first_write, looks.marker_seen, looks.finished) == (1.0, 2.0, 3.0)
