"""Smoke tests of scripts/: the demo and the benchmark run end to end on their own local servers."""

from __future__ import annotations

import json
import re
import sys
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


def test_bench_verify_small_run_prints_the_ratios_and_the_goals() -> None:
    result = run_script("bench_verify.py", "--docs", "2000", "--events", "500", "--json", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for kind in ("two cursors", "mcdc verify", "mcdc tail --verify"):
        assert re.search(rf"^{kind}\s+2,000\s", out, re.MULTILINE), out
    for ratio in ("embedded/mcdc verify docs/s", "embedded/two cursors docs/s", "replay verify/no-verify ev/s"):
        assert re.search(rf"^{re.escape(ratio)}\s+\d+\.\d\d", out, re.MULTILINE), out
    assert re.search(r"^(PASS|FAIL)  tail --verify peak RSS < 300 MB$", out, re.MULTILINE), out
    assert re.search(r"^(PASS|FAIL)  replay slowdown with --verify < 20%$", out, re.MULTILINE), out
    assert "mcdc tail --source" in out and "--verify --verify-interval 0" in out
    data = json.loads(out[out.rindex("\n{\n") + 1 :])
    assert [run["kind"] for run in data["replays"]] == ["warm-up", "no verify", "verify", "no verify again"]
    assert all(run["events"] == 500 for run in data["replays"])  # each replay applied the whole backlog
    after = data["replays"][2]["verifier"]  # the --verify replay: its verifier followed until two passes ended
    assert after["next_pass"]["passes"] >= after["at_end"]["passes"] + 2 and after["next_pass"]["rechecking"] == 0
    assert data["embedded"]["verification"]["passes"] >= 1
    assert data["tail_verify_peak_rss_mb"] > 0


def test_bench_lake_small_run_prints_the_ratio_and_the_replay_rate() -> None:
    result = run_script("bench_lake.py", "--docs", "2000", "--events", "300", "--json", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"^  ratio sync / write_deltalake\s+\d+\.\d\d", out, re.MULTILINE), out
    assert re.search(r"^(PASS|FAIL)  sync >= 0.7x write_deltalake$", out, re.MULTILINE), out
    assert re.search(r"^(PASS|FAIL)  replay >= 5,000 events/s$", out, re.MULTILINE), out
    data = json.loads(out[out.rindex("\n{\n") + 1 :])
    assert data["mcdc_sync_docs_per_s"] > 0 and data["replay_events_per_s"] > 0


def test_bench_kafka_small_run_measures_all_three_parts() -> None:
    result = run_script("bench_kafka.py", "--events", "300", "--repeat", "1", "--cpu-rounds", "1", "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for ratio in ("write/raw", "send/raw", "mcdc/bare-dict", "mcdc/bare-raw"):
        assert re.search(rf"^   ratio {ratio}\s+\d+\.\d\d\s+\(median \d+\.\d\d\)", out, re.MULTILINE), out
    for envelope, sizes in (("debezium", 2), ("debezium-legacy", 1), ("plain", 2)):  # small, and large for two
        assert len(re.findall(rf"^   {envelope}\s+\d+\.\d\d", out, re.MULTILINE)) == sizes, out
    verdicts = re.findall(r"^(?:PASS|FAIL)  (\w+): .*$", out, re.MULTILINE)
    assert verdicts == ["delivery", "CPU", "drain"], out
    assert re.search(r"^(PASS|FAIL)  delivery: .*, median of 1 repeat\(s\): \d+\.\d\d", out, re.MULTILINE), out
    data = json.loads(out[out.rindex("\n{\n") + 1 :])
    assert {run["kind"] for run in data["delivery"]["runs"]} == {"mcdc write", "mcdc send", "raw aiokafka"}
    steps = data["cpu"]["small"]["steps"]  # the C steps inside normalize + encode, per event, and their sum
    assert set(steps) == {"top_level", "decode_documents", "deprecated_search", "orjson", "sum"}
    assert all(us > 0 for us in steps.values()) and steps["sum"] == pytest.approx(
        sum(us for name, us in steps.items() if name != "sum"), abs=0.05
    )
    assert re.search(r"^   of which C steps any Python path runs \(µs/event\): top level \d+\.\d\d", out, re.MULTILINE)
    large = data["cpu"]["large"]
    assert large["events"] == 300 and large["documents"]["avg_doc_bytes"] > 15_000
    assert set(large["envelopes"]) == {"debezium", "debezium, Debezium's JSON", "plain"}
    mix = data["events"]["mix"]
    runs = data["drain"]["runs"]
    assert [run["kind"] for run in runs] == ["mcdc catch-up", "bare pymongo (dict)", "bare pymongo (raw)"]
    for run in runs:  # each verified by the script: every change event written (mcdc) or counted (bare) once
        assert sum(run["counted"].values()) == sum(mix.values()) == 300
    for run in runs[1:]:
        assert run["counted"] == mix and run["lines"] is None and run["inner_s"] is not None
    assert set(data["drain"]["bare_loops"]) == {"BARE_DICT_LOOP", "BARE_RAW_LOOP"}
    assert "python -c BARE_RAW_LOOP" in data["commands"]["bare pymongo (raw)"]
    assert "document_class=RawBSONDocument" in data["drain"]["bare_loops"]["BARE_RAW_LOOP"]


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


def test_under_load_runs_a_command_beside_burners_and_stops_at_the_first_failure() -> None:
    ok = run_script("under_load.py", "--burners", "1", "--times", "2", "--", sys.executable, "-c", "pass")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("with 1 burners: exit 0") == 2
    failing = run_script("under_load.py", "--times", "3", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert failing.returncode == 3 and failing.stdout.count("exit 3") == 1


def test_bench_cpu_small_run_prints_the_steady_cpu_ratios() -> None:
    done = run_script(
        "bench_cpu.py", "--docs", "2000", "--events", "600", "--repeat", "2", "--narrow-events", "150", "--json",
        timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout[done.stdout.rindex('\n{\n  "server"') :])
    assert data["docs"] == [200, 2000] and data["events"] == [60, 600]
    # sizes this small measure noise (a loaded machine can make the small run cost more): the figures are
    # there, their values are the full run's business
    assert all(isinstance(data["ratios"][k], float) for k in ("cpu_per_doc", "cpu_per_event", "replay_rate"))
    assert len(data["repeats"]) == 2  # each repeat copied and replayed both sizes again
    for run in data["repeats"]:
        assert run["replay"]["big"]["mcdc"]["cpu_s"] > 0 and run["copy"]["big"]["plain"]["cpu_s"] > 0
    per_event = [run["ratios"]["cpu_per_event"] for run in data["repeats"]]
    assert data["ratios"]["cpu_per_event"] == pytest.approx(sum(per_event) / 2)  # the median of two
    assert "steady CPU per doc" in done.stdout and "steady CPU per event <= 1.3x" in done.stdout
    # the start figures (issue 41): mcdc's --version and --help against a plain client's, an idle catch-up
    assert all(data["start_ratios"][k] > 0 for k in ("version", "help", "idle_catch_up"))
    assert data["start_cpu_s"]["idle_catch_up"] > data["start_cpu_s"]["mcdc"]  # it connects, reads, saves
    assert "mcdc --help's CPU <= 1.5x" in done.stdout and "nothing to replay < 0.5 s" in done.stdout
    # issue 50's narrow selection: each repeat's two catch-ups, and their ratio
    narrow = data["narrow"]
    assert len(narrow["runs"]) == 2 and all(r["alone_cpu_s"] > 0 and r["busy_cpu_s"] > 0 for r in narrow["runs"])
    assert "one collection among ten busy ones <= 1.15x" in done.stdout


def test_bench_big_txn_small_run_sees_the_transaction_atomic() -> None:
    done = run_script("bench_big_txn.py", "--docs", "600", "--doc-size", "300", "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout[done.stdout.rindex('\n{\n  "server"') :])
    assert data["atomic"] and set(data["runs"]["txn"]["counts_seen"]) <= {0, 600}
    assert data["runs"]["txn"]["peak_rss_mb"] > 0 and "one unit on the target" in done.stdout


@pytest.mark.filterwarnings("ignore")
def test_bench_cpu_profile_stages_name_files_that_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_cpu --profile sums CPU by stage from each file's path: a path the tree no longer has (a module
    moved) would send its time to "other mcdc" without a word."""
    root = Path(__file__).resolve().parent.parent
    monkeypatch.syspath_prepend(str(root / "scripts"))
    import bench_cpu

    files = [p.relative_to(root).as_posix() for p in (root / "replicator").rglob("*.py")]
    stale = [
        part for part, _ in bench_cpu.STAGES if part.startswith("replicator/") and not any(part in f for f in files)
    ]
    assert not stale, f"bench_cpu.STAGES names paths that no file has: {stale}"
    hot = (
        "events/normalize.py",
        "replay/stage.py",
        "replay/ddl_window.py",
        "settings/selection.py",
        "sinks/mongo/plan.py",
    )
    assert all(bench_cpu.stage_of(f"/x/replicator/{f}") != "other mcdc" for f in hot)


def test_bench_read_rate_windows_hold_the_replies_of_each_5_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's arithmetic, on made-up replies (the script itself is run by hand: it takes minutes)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_read_rate

    replies = [(10.0, 1000), (11.0, 1000), (14.9, 1000), (15.0, 3000), (16.0, 500), (21.0, 100)]
    # the densest window: (10.0, 15.0] holds 1,000 + 1,000 + 3,000 (the one ending at 15.0)
    assert bench_read_rate.max_window(replies) == 5000 / 5
    # windows end at 15.0, 15.5, ... 21.0: (10, 15] holds 5,000; (16, 21] holds 100
    rates = bench_read_rate.windows(replies)
    assert rates[0] == 5000 / 5 and rates[-1] == 100 / 5 and len(rates) == 13
    assert bench_read_rate.windows(replies[:3]) == []  # shorter than 5 s: no window
    run = bench_read_rate.measure("capped", [*replies, (22.0, 0)], 30.0)  # an empty last reply is not counted
    assert (run.docs, run.read_s, run.overall) == (6600, 11.0, 600.0)


def test_suite_cost_adds_up_the_cpu_of_a_commands_processes_by_kind(tmp_path: Path) -> None:
    """scripts/suite_cost.py on a command that starts an mcdc process and a busy Python one."""
    busy = "import subprocess, sys; subprocess.run([sys.executable, '-m', 'replicator' + '.cli', '--version']); "
    busy += "sum(i * i for i in range(3_000_000))"  # its own command line does not read as mcdc's
    result = run_script("suite_cost.py", "--interval", "0.1", "--json", "--", sys.executable, "-c", busy)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["exit"] == 0 and figures["waited_cpu_s"] > 0.1
    assert figures["polled_cpu_s"] > 0.05 and "other (shells, scripts, tools)" in figures["by_kind"]
