"""``mcdc ... --engine spark`` as a user runs it: a process with a local[2] Spark of its own, for what only
a process shows: its exit code and one-line errors, SIGTERM, kill -9 and the same command run again, and the
file Spark's console goes to. (The engine's work itself is tested in the session's SparkSession, in
test_spark_engine.py: a JVM starts here for each run.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.compare import assert_identical
from tests.support.corpus import load_bulk
from tests.support.servers import free_port
from tests.support.spark import quick_jvm_conf
from tests.support.workload import random_workload
from tests.test_cutover import _progress
from tests.test_progress_runs import END, ESTIMATING, RUNNING, _messages, _number, _within_rounding
from tests.test_spark_engine import _checkpoint

#: each test runs one or two ``mcdc --engine spark`` processes, each a JVM: a minute or two alone, up to four
#: minutes beside two burners (the kill -9 tests; issue 40), where pytest's default is 300 s
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _sync_args(source: str, target: str, cp: Path) -> list[str]:
    return _spark_cli(
        "sync", "--source", source, "--target", target, "--checkpoint", str(cp),
        "--partition-docs", "500", "--split", "always", "--batch-docs", "100", "--json",
    )  # fmt: skip


def test_a_spark_run_that_fails_names_spark_s_log_in_its_one_line_and_keeps_it(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i} for i in range(10)])
    # the executors' Python cannot start: each attempt at the snapshot's task fails
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYSPARK_PYTHON": str(tmp_path / "no-python")}
    argv = _spark_cli("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    logs = list(tmp_path.glob("mcdc-spark-*.log"))
    assert done.returncode == 2 and len(logs) == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mcdc: error: the snapshot failed on Spark: "), done.stderr
    assert last.endswith(f" (Spark's log: {logs[0]})") and "no-python" in last, last
    assert "Exception in task" in logs[0].read_text()  # each attempt's failure, at length


def _spark_cli(command: str, *args: str) -> list[str]:
    """``mcdc COMMAND --engine spark`` on its own local[2] Spark, as a user runs it (with a JVM that starts
    sooner)."""
    return [
        sys.executable, "-m", "replicator.cli", command, "--engine", "spark", "--spark-master", "local[2]",
        "--spark-conf", "spark.ui.enabled=false", "--spark-conf", "spark.driver.host=127.0.0.1", *quick_jvm_conf(),
        *(["--no-progress"] if command != "verify" else []), *args,
    ]  # fmt: skip


def _tail(source: str, target: str, cp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    argv = _spark_cli("tail", "-s", source, "-t", target, "-c", str(cp), *args)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def _until(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Poll ``ready`` until it holds; ``proc`` must stay up meanwhile."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _identical(source: str, target: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            assert_identical(source, target)
            return True
        except (AssertionError, pymongo.errors.PyMongoError):
            return False

    return check


def _served(port: int) -> dict[str, Any]:
    """The tail's /progress, or {} before it listens."""
    try:
        return _progress(port)
    except OSError:
        return {}


def _sigterm(proc: subprocess.Popen[str]) -> str:
    """SIGTERM: exit 0, no traceback; returns stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return err


def test_kill_9_of_the_driver_mid_snapshot_then_the_same_command(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "crash", "a", 8000, doc_size=300)
    cp = tmp_path / "cp.json"
    proc = subprocess.Popen(_sync_args(source_uri, target_uri, cp), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    killed_at = None
    while time.monotonic() < deadline:
        state = _checkpoint(cp)
        if state is not None and len(state["snapshot"]["done"]) >= 3:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_at = _checkpoint(cp)  # the last save before the kill
            break
        assert proc.poll() is None, f"sync ended before the kill point: {proc.communicate()}"
        time.sleep(0.02)
    assert killed_at is not None, "kill point never reached"
    assert killed_at["snapshot"]["status"] == "in_progress"
    plan = {p_id(p): p["estimated_docs"] for p in killed_at["snapshot"]["plan"]}
    copied_before = sum(plan[pid] for pid in killed_at["snapshot"]["done"])
    assert 0 < copied_before < 8000
    done = subprocess.run(_sync_args(source_uri, target_uri, cp), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert summary["snapshot"] == "resumed"
    assert summary["documents"] == 8000 - copied_before  # finished partitions were not copied again
    assert_identical(source_uri, target_uri)
    assert b"Traceback" not in done.stderr and b"WARN" not in done.stderr  # Spark's console noise stays out


def test_a_spark_sync_s_progress_starts_with_its_copy_and_its_end_agrees_with_the_summary(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Issue 41: lines said "2 docs/s" and ETAs of 24 minutes while Spark started, of copies the summary put at
    thousands of documents a second. The session's start is not the copy's: no line counts it, and the
    snapshot's last line and the summary measure the same copy."""
    total = 4000
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "prog", "docs", total, doc_size=300)
    done = subprocess.run(
        _sync_args(source_uri, target_uri, tmp_path / "cp.json"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    lines = _messages(done.stderr, "snapshot: ")
    assert all(RUNNING.match(line) or ESTIMATING.match(line) for line in lines[:-1]), lines
    end = END.match(lines[-1])
    assert end and _number(end.group(1)) == total == summary["documents"], lines
    assert float(end.group(4)) == pytest.approx(summary["snapshot_s"], abs=0.1), (lines[-1], summary)
    assert _within_rounding(round(summary["docs_per_s"]), total, float(end.group(4))), (lines[-1], summary)
    assert_identical(source_uri, target_uri)


def p_id(part: dict[str, Any]) -> str:
    from replicator.source.partitions import Partition

    return Partition.from_json(part).id


def test_tail_on_spark_converges_under_writes_exits_0_on_sigterm_and_leaves_no_log_behind(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A run that succeeds (a tail stopped by SIGTERM exits 0) removes the file Spark's console went to.
    With --verify: the embedded verifier hashes its ranges as Spark tasks, finds no mismatch while the
    writes run, and finds a difference made on the target alone."""
    cp, port = tmp_path / "cp.json", free_port()
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i} for i in range(200)])
    verify = ["--verify", "--verify-interval", "0", "--metrics-port", str(port)]
    proc = _tail(source_uri, target_uri, cp, *verify, env={**os.environ, "TMPDIR": str(tmp_path)})
    spark_log = tmp_path / f"mcdc-spark-{proc.pid}.log"
    try:
        _until(proc, lambda: (_checkpoint(cp) or {}).get("snapshot", {}).get("status") == "done", "the snapshot")
        assert spark_log.exists()  # Spark's console goes there while the tail runs
        random_workload(source_uri, rounds=300, seed=7)
        _until(proc, _identical(source_uri, target_uri), "convergence")
        _until(proc, lambda: _served(port).get("canCommit", False), "a clean verify pass")
        assert _progress(port)["verification"]["mismatches"] == 0
        with pymongo.MongoClient(target_uri) as client:
            client.db.c.insert_one({"_id": "only-here"})
        _until(proc, lambda: _served(port).get("verification", {}).get("mismatches") == 1, "the mismatch")
        assert not _progress(port)["canCommit"]
        assert 'verify: db.c _id "only-here" only on the target' in _sigterm(proc)
        assert not list(tmp_path.glob("mcdc-spark-*.log"))
    finally:
        if proc.poll() is None:
            proc.kill()


def test_kill_9_of_a_spark_tail_then_a_restart_converges(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    args = ("--snapshot", "never", "--max-batch-size", "20")
    proc = _tail(source_uri, target_uri, cp, *args)
    try:
        _until(proc, cp.exists, "the first checkpoint")
        first = json.loads(cp.read_text())["position"]
        writer = threading.Thread(target=random_workload, args=(source_uri, 400, 11), kwargs={"ddl": False})
        writer.start()
        # killed once some micro-batches are acknowledged
        _until(proc, lambda: (_checkpoint(cp) or {}).get("position") != first, "an acknowledged micro-batch")
        proc.kill()
        proc.wait()
        writer.join()
        proc = _tail(source_uri, target_uri, cp, *args)
        _until(proc, _identical(source_uri, target_uri), "convergence after the restart")
        _sigterm(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tail_on_spark_rides_out_a_source_restart_and_a_target_outage(
    servers: Any, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    if servers.source is None or servers.target is None:
        pytest.skip("external servers cannot be restarted by the tests")
    cp = tmp_path / "cp.json"
    proc = _tail(
        source_uri, target_uri, cp, "--snapshot", "never", "--max-retries", "-1", "--retry-initial-delay", "0.2",
        "--retry-max-delay", "1", "--connect-timeout", "1",
    )  # fmt: skip
    identical = _identical(source_uri, target_uri)
    try:
        _until(proc, cp.exists, "the first checkpoint")
        random_workload(source_uri, 50, 1, ddl=False)
        _until(proc, identical, "convergence")
        servers.source.restart()  # the source goes away and comes back
        random_workload(source_uri, 50, 2, ddl=False)
        _until(proc, identical, "convergence after a source restart")
        servers.target.stop()  # the target goes away for a while; the source keeps taking writes
        random_workload(source_uri, 50, 3, ddl=False)
        time.sleep(3)
        servers.target.start()
        _until(proc, identical, "convergence after a target outage")
        assert "retrying in" in _sigterm(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_spark_tail_into_delta_killed_three_times_then_catch_up_leaves_no_duplicate_and_equal_state(
    source_uri: str, tmp_path: Path
) -> None:
    from tests.support.lake import duplicate_changes, read_table
    from tests.test_lake import _assert_state_equals_source

    root, cp = tmp_path / "lake", tmp_path / "cp.json"
    target = f"delta:{root}"
    with pymongo.MongoClient(source_uri) as client:
        client.work.a.insert_many([{"_id": i, "v": 0} for i in range(300)])
    args = ("--partition-docs", "100", "--split", "always", "--max-batch-size", "20", "--lake-columns", "typed")

    def saved() -> dict[str, Any]:
        return _checkpoint(cp) or {"snapshot": {"done": []}, "position": {}}

    proc = _tail(source_uri, target, cp, *args)
    try:
        # killed mid-snapshot (a partition committed, others not), then twice mid-replay
        _until(proc, lambda: len(saved()["snapshot"].get("done") or []) >= 1, "a partition copied", timeout=180)
        random_workload(source_uri, 100, 0)  # CRUD, transactions, renames, drops, a capped collection
        proc.kill()
        proc.wait()
        for seed in (1, 2):
            proc = _tail(source_uri, target, cp, *args)
            _until(proc, lambda: saved()["snapshot"].get("status") == "done", "the snapshot's end", timeout=180)
            first = saved()["position"]
            writer = threading.Thread(target=random_workload, args=(source_uri, 100, seed))
            writer.start()
            _until(proc, lambda at=first: saved()["position"] != at, "an acknowledged micro-batch", timeout=180)
            proc.kill()
            proc.wait()
            writer.join()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    argv = _spark_cli("catch-up", "-s", source_uri, "-t", target, "-c", str(cp), "--lake-columns", "typed")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _assert_state_equals_source("delta", root, source_uri, ["work"])
    changes = read_table("delta", root, "changes", "work", "a")
    assert changes is not None and {"r", "c", "u", "d"} <= set(changes["op"].to_pylist())
    assert duplicate_changes(changes) == []
    state = read_table("delta", root, "state", "work", "a")  # typed columns, written by the driver
    assert state is not None and "v" in state.column_names


def test_a_spark_sync_into_iceberg_commits_the_tasks_files_on_the_driver(source_uri: str, tmp_path: Path) -> None:
    from tests.support.lake import read_table
    from tests.test_lake import _assert_state_equals_source

    root = tmp_path / "lake"
    with pymongo.MongoClient(source_uri) as client:
        client.work.a.insert_many([{"_id": i, "v": i % 7} for i in range(400)])
        client.work.b.insert_many([{"_id": f"k{i}", "s": "x" * i} for i in range(50)])
    argv = _spark_cli("sync", "-s", source_uri, "-t", f"iceberg:{root}", "-c", str(tmp_path / "cp.json"),
                      "--partition-docs", "100", "--split", "always")  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _assert_state_equals_source("iceberg", root, source_uri, ["work"])
    changes = read_table("iceberg", root, "changes", "work", "a")
    assert changes is not None and changes.num_rows == 400
    assert list((root / "work" / "a" / "data").glob("mcdc-*.parquet"))  # the tasks' own files, committed


def test_a_spark_that_cannot_start_is_a_one_line_error_before_anything_is_copied(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A master Spark cannot launch on fails mcdc's start, in one line naming Spark's log (it was a traceback)."""
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i} for i in range(10)])
    argv = [
        sys.executable, "-m", "replicator.cli", "sync", "-s", source_uri, "-t", target_uri,
        "-c", str(tmp_path / "cp.json"), "--engine", "spark", "--spark-master", "nowhere://at-all", "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mcdc: error: starting Spark failed on Spark: "), done.stderr
    assert last.endswith(f" (Spark's log: {next(tmp_path.glob('mcdc-spark-*.log'))})"), last
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.estimated_document_count() == 0


def test_a_spark_tail_replays_from_the_driver_while_its_session_starts_then_through_spark(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """The session starts beside the run: the backlog the tail opens on is replayed as it comes (from the
    driver while the session is not up), and what follows once it is up, by Spark's tasks. Both converge."""
    cp, log = tmp_path / "cp.json", tmp_path / "stderr.log"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i, "v": 0} for i in range(100)])
    first = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "sync", "-s", source_uri, "-t", target_uri, "-c", str(cp),
         "--no-progress"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    random_workload(source_uri, rounds=200, seed=21, ddl=False)  # the backlog
    with log.open("w") as err:
        proc = subprocess.Popen(_spark_cli("tail", "-s", source_uri, "-t", target_uri, "-c", str(cp)),
                                stdout=subprocess.DEVNULL, stderr=err, text=True)  # fmt: skip
    try:
        _until(proc, _identical(source_uri, target_uri), "the backlog replayed")
        assert "starting Spark (local[2]); the replay writes from here until it is up" in log.read_text()
        round_ = 0
        while "Spark is up: its tasks take the writes from here" not in log.read_text():  # writes, until one
            round_ += 1  # batch finds the session up
            with pymongo.MongoClient(source_uri) as client:
                client.db.c.update_one({"_id": round_ % 100}, {"$inc": {"v": 1}})
            _until(proc, _identical(source_uri, target_uri), "a write replayed")
        random_workload(source_uri, rounds=200, seed=22, ddl=False)  # written by Spark's tasks
        _until(proc, _identical(source_uri, target_uri), "convergence on Spark")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _asyncio_cli(command: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "replicator.cli", command, *(["--no-progress"] if command != "verify" else []), *args]


def _recording_java(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose JAVA_HOME's java writes down each time it is run (then runs the real one), and
    the file it writes to: Spark launches its JVM with JAVA_HOME's java."""
    real = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if "JAVA_HOME" in os.environ else None
    real = real if real is not None and real.exists() else Path(shutil.which("java") or "java").resolve()
    runs, java = tmp_path / "java-runs.txt", tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f'#!/bin/sh\necho "$*" >> {runs}\nexec {real} "$@"\n')
    java.chmod(0o755)
    return {**os.environ, "JAVA_HOME": str(java.parent.parent), "TMPDIR": str(tmp_path)}, runs


def _jvms(runs: Path) -> list[str]:
    """The JVMs the recording java started (``java -version``, the check that Java is there, is none)."""
    lines = runs.read_text().splitlines() if runs.exists() else []
    return [line for line in lines if line.strip() != "-version"]


def _synced(source_uri: str, target_uri: str, tmp_path: Path, documents: int) -> Path:
    """The checkpoint of an asyncio sync of ``documents`` new documents of db.c."""
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i, "v": 0} for i in range(documents)])
    first = subprocess.run(_asyncio_cli("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp)),
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stderr
    return cp


def test_an_idle_spark_catch_up_replays_on_the_driver_and_never_starts_spark(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A catch-up whose backlog the driver replays before Spark could have started replays it there and says
    so: no JVM is launched (the file its console would go to is never made), and the target converges."""
    cp = _synced(source_uri, target_uri, tmp_path, 20)
    with pymongo.MongoClient(source_uri) as client:
        for i in range(12):
            client.db.c.update_one({"_id": i}, {"$inc": {"v": 1}})
    env, runs = _recording_java(tmp_path)
    argv = _spark_cli("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--json")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert runs.exists() and _jvms(runs) == [], done.stderr  # Java was checked for, and never started
    assert "starting Spark" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if "Spark was not started" in line]
    assert len(said) == 1 and "catch-up replayed 12 events on the driver in " in said[0], done.stderr
    assert "less than Spark takes to start (--spark-start-after 10 s)" in said[0], said
    summary = json.loads(done.stdout)
    assert summary["events"] == 12 and "Spark was not started" in summary["engine_note"], summary
    assert_identical(source_uri, target_uri)
    verified = subprocess.run(_asyncio_cli("verify", "-s", source_uri, "-t", target_uri),
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_spark_catch_up_longer_than_spark_takes_to_start_hands_its_writes_to_spark(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """--spark-start-after 0.5: a catch-up still replaying half a second in (its batches of 10 written slowly:
    each write answered 2 s late, until Spark is up) starts Spark beside the run, whose tasks take the writes
    once it is up; the target converges."""
    from tests.support.failpoint import arm, block, disarm

    cp, log = _synced(source_uri, target_uri, tmp_path, 100), tmp_path / "stderr.log"
    with pymongo.MongoClient(source_uri) as client:
        for i in range(300):  # the backlog: 30 batches, a minute of writes at 2 s each
            client.db.c.update_one({"_id": i % 100}, {"$inc": {"v": 1}})
    argv = _spark_cli("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--spark-start-after", "0.5",
                      "--max-batch-size", "10", "--max-queue-size", "10")  # fmt: skip
    env, runs = _recording_java(tmp_path)
    arm(target_uri, block(2000), ["update"])
    try:
        with log.open("w") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)
        deadline = time.monotonic() + 300
        while proc.poll() is None and "Spark is up: its tasks take the writes from here" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        disarm(target_uri)  # the rest goes at full speed
        assert proc.wait(timeout=300) == 0, log.read_text()
    finally:
        disarm(target_uri)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert re.search(r"starting Spark \(local\[2\]\) after \d+\.\d s of replaying on the driver", text), text
    assert "Spark is up: its tasks take the writes from here" in text and "Spark was not started" not in text, text
    assert any("org.apache.spark.deploy.SparkSubmit" in jvm for jvm in _jvms(runs)), runs.read_text()  # Spark's
    assert_identical(source_uri, target_uri)
