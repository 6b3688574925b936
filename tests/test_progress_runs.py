"""What a person sees from real runs without a terminal: the snapshot's log lines (done/total, rate,
ETA), a resumed sync's collections done before, catch-up's events/s, and the --json summary."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.compare import assert_identical
from tests.support.corpus import load_bulk
from tests.test_crash import _kill_when

pytestmark = pytest.mark.integration

RUNNING = re.compile(r"snapshot: ([\d,]+)/([\d,]+) documents \((\d+)%\), ([\d,]+|-) docs/s, ETA (\S+)$")
#: a line before there is a window of progress to measure a rate over: no rate, no ETA
ESTIMATING = re.compile(r"snapshot: ([\d,]+)/([\d,]+) documents \((\d+)%\), estimating…$")
END = re.compile(r"snapshot: ([\d,]+)/([\d,]+) documents \(100%\), ([\d,]+) docs/s, done in ([\d.]+)s \((.*)\)$")
REPLAY_END = re.compile(r"replay: ([\d,]+) events applied in ([\d.]+)s, ([\d,]+|-) events/s$")


def _mcdc(*args: str) -> list[str]:
    return [sys.executable, "-m", "replicator.cli", *args]


def _sync(source: str, target: str, cp: Path, *extra: str) -> list[str]:
    return _mcdc(
        "sync", "--source", source, "--target", target, "--checkpoint", str(cp), "--workers", "2",
        "--batch-docs", "100", "--json", *extra,
    )  # fmt: skip


def _messages(stderr: str, prefix: str) -> list[str]:
    """The messages of the log lines that start with ``prefix`` (after the time, level and logger)."""
    found = (re.search(r" INFO mcdc: (.*)$", line) for line in stderr.splitlines())
    return [m.group(1) for m in found if m and m.group(1).startswith(prefix)]


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _within_rounding(rate: int, count: int, seconds: float) -> bool:
    """Is ``rate`` count/seconds, with seconds shown to a tenth?"""
    return count / (seconds + 0.05) - 1 <= rate <= count / max(seconds - 0.05, 0.01) + 1


def _run(args: list[str]) -> tuple[dict[str, Any], str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)  # stderr a pipe: no terminal
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_snapshot_log_lines_show_done_of_total_rate_and_eta(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    total = 8000
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "prog", "docs", total, doc_size=300)
    summary, stderr = _run(_sync(source_uri, target_uri, tmp_path / "cp.json"))
    lines = _messages(stderr, "snapshot: ")
    running = [RUNNING.match(line) or ESTIMATING.match(line) for line in lines[:-1]]
    assert len(running) >= 3 and all(running), lines  # at each further tenth, however quick the copy
    done = [_number(m.group(1)) for m in running if m]
    assert done == sorted(done) and all(_number(m.group(2)) == total for m in running if m), lines
    measured = [m for m in running if m and m.re is RUNNING]
    assert all(m.group(4) != "-" and m.group(5) != "-" for m in measured), lines  # a rate, then an ETA from it
    for m in measured:  # a rate rests on two seconds at least: never more than all done over them
        assert _number(m.group(4)) <= _number(m.group(1)) / 2
    end = END.match(lines[-1])
    assert end, lines
    assert _number(end.group(1)) == _number(end.group(2)) == total == summary["documents"]
    assert _within_rounding(_number(end.group(3)), total, float(end.group(4)))
    assert summary["docs_per_s"] == pytest.approx(total / summary["snapshot_s"], rel=0.01)


def test_catch_up_reports_events_per_second_over_the_replay_and_a_json_position(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.prog.events.insert_one({"_id": "first"})
    _run(_sync(source_uri, target_uri, cp))
    events = 3000
    with pymongo.MongoClient(source_uri) as client:
        for start in range(0, events, 500):
            client.prog.events.insert_many([{"_id": i, "v": "x" * 50} for i in range(start, start + 500)])
    summary, stderr = _run(_mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--json"))
    assert summary["events"] == events and summary["documents"] == 0
    assert 0 < summary["replay_s"] <= summary["elapsed_s"]
    assert summary["events_per_s"] == pytest.approx(events / summary["replay_s"], rel=0.01)
    assert summary["events_per_s"] >= events / summary["elapsed_s"]
    [line] = _messages(stderr, "replay: ")[-1:]
    end = REPLAY_END.match(line)
    assert end and _number(end.group(1)) == events, stderr
    assert _within_rounding(_number(end.group(3)), events, float(end.group(2)))
    position = summary["position"]
    assert set(position) == {"t", "i"} and all(type(v) is int for v in position.values())
    assert position == json.loads(cp.read_text())["position"]["cluster_time"]
    assert_identical(source_uri, target_uri)


def test_resumed_sync_shows_collections_done_before_and_counts_only_its_own_documents(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "crash", "a", 3000, doc_size=300)  # copied first (two of the same-sized partitions)
        load_bulk(client, "crash", "b", 9000, doc_size=300, seed=1)
    cp = tmp_path / "cp.json"
    args = _sync(source_uri, target_uri, cp, "--partition-docs", "1500", "--split", "always")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_at = _kill_when(proc, cp, lambda s: {"crash.a#0", "crash.a#1"} <= set(s["snapshot"]["done"]))
    assert killed_at["snapshot"]["status"] == "in_progress"
    b_done = sum(1 for pid in killed_at["snapshot"]["done"] if pid.startswith("crash.b#"))
    assert b_done < 6
    summary, stderr = _run(args)
    assert summary["snapshot"] == "resumed"
    assert 0 < summary["documents"] <= 9000 - 1500 * b_done  # crash.a and b's done partitions not counted
    assert "snapshot: 1 of 2 collections already copied: crash.a" in _messages(stderr, "snapshot: ")
    end = END.match(_messages(stderr, "snapshot: ")[-1])
    assert end and _number(end.group(1)) == 12000 and end.group(5) == "2 collections: 1 done before", stderr
    assert_identical(source_uri, target_uri)
