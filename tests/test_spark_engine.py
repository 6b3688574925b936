"""--engine spark end to end: snapshot partitions as Spark tasks, the replay as a streaming query, and
verify's ranges as tasks, against the real test servers and the session's local SparkSession."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
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

from replicator.config import resolve
from replicator.engines.spark.snapshot import JOB_GROUP
from replicator.progress import LogReporter
from replicator.sync import SyncJob
from tests.support.compare import assert_identical
from tests.support.corpus import load_bulk, load_corpus
from tests.support.spark import quick_jvm_conf
from tests.support.workload import random_workload, two_shard_workload

pytestmark = pytest.mark.integration


async def run_job(source: str, target: str, checkpoint: Path, command: str = "sync", **flags: Any) -> dict[str, Any]:
    settings = resolve(
        {"source": source, "target": target, "checkpoint": checkpoint, "engine": "spark", **flags}, env={}
    )
    summary = await SyncJob(settings, LogReporter(), command=command).run()
    return summary.to_json()


async def test_sync_on_spark_copies_every_bson_type_byte_exact(
    spark: Any, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        info = load_corpus(client)
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP))
    summary = await run_job(source_uri, target_uri, tmp_path / "cp.json", partition_docs=500, split="always")
    assert summary["snapshot"] == "completed"
    state = assert_identical(source_uri, target_uri)
    assert len(state["corpus.mixed_ids"]["docs"]) == info["namespaces"]["corpus.mixed_ids"]
    checkpoint = json.loads((tmp_path / "cp.json").read_text())
    assert checkpoint["snapshot"]["status"] == "done"
    mixed = [p for p in checkpoint["snapshot"]["plan"] if p["coll"] == "mixed_ids"]
    assert len({p["bracket"] for p in mixed}) >= 8
    assert len(checkpoint["snapshot"]["done"]) == len(checkpoint["snapshot"]["plan"])
    # one Spark job per partition: the copy ran as Spark tasks
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP)) - jobs_before >= len(
        checkpoint["snapshot"]["plan"]
    )


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


def _checkpoint(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


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


def p_id(part: dict[str, Any]) -> str:
    from replicator.source.partitions import Partition

    return Partition.from_json(part).id


def _python_workers() -> list[Any]:
    """The session's Python worker processes (forked by pyspark.daemon), not the daemon itself."""
    import psutil

    workers = []
    for proc in psutil.Process().children(recursive=True):
        try:
            parent = proc.parent()
            if parent is not None and "pyspark.daemon" in " ".join(parent.cmdline()):
                workers.append(proc)
        except psutil.Error:
            continue
    return workers


def _failed_tasks(spark: Any, jobs: set[int]) -> int:
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in jobs:
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else ():
            stage_info = tracker.getStageInfo(stage)
            failed += stage_info.numFailedTasks if stage_info else 0
    return failed


async def _sync_killing_a_busy_worker(spark: Any, source_uri: str, target_uri: str, cp: Path) -> dict[str, Any]:
    """A sync during which the Python process running a task dies in the middle of it: Spark retries that
    task. The tasks write to the target through a proxy that keeps the reply to the first insert: the task
    that sent it is waiting for it, so the worker holding that connection is surely busy with a task
    (no guess from CPU use, which a loaded machine made unreliable). Asserts the task was retried."""
    import psutil

    from tests.support.proxy import wire_proxy

    before = set(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP))
    killed: list[int] = []
    with wire_proxy(target_uri) as proxy:
        proxy.swallow_reply(b"insert\x00")

        def kill_the_waiting_worker() -> None:
            if not proxy.swallowed_event.wait(120):
                return
            workers = {w.pid: w for w in _python_workers()}
            for conn in psutil.net_connections(kind="tcp"):
                if conn.laddr and tuple(conn.laddr)[:2] == proxy.swallowed_from and conn.pid in workers:
                    workers[conn.pid].kill()
                    killed.append(conn.pid)
                    return

        killer = threading.Thread(target=kill_the_waiting_worker)
        killer.start()
        try:
            summary = await run_job(source_uri, proxy.uri, cp, partition_docs=250, split="always", batch_docs=50)
        finally:
            proxy.swallowed_event.set()  # a run that failed before any insert: let the killer go
            killer.join()
    assert killed, "the insert whose reply was kept did not come from a Python worker"
    jobs = set(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP)) - before
    assert _failed_tasks(spark, jobs) >= 1
    assert summary["snapshot"] == "completed"
    return summary


async def test_a_task_that_fails_is_retried_and_the_target_is_identical(
    spark: Any, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "retry", "a", 6000, doc_size=300)
    await _sync_killing_a_busy_worker(spark, source_uri, target_uri, tmp_path / "cp.json")
    assert_identical(source_uri, target_uri)


async def test_a_time_series_task_retried_by_spark_keeps_each_measurement_once(
    spark: Any, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Spark's next attempt at a time-series partition (its task's attempt number says so) deletes what the
    dead attempt wrote in its time range before copying it again: measurements, whose ``_id``s repeat and
    whose inserts never replace, are not kept twice. (SecantusDB lets the ``_id``s of a collection created
    with ``timeseries`` options repeat, as MongoDB does.)"""
    from collections import Counter

    from tests.support.compare import RAW

    start = datetime.datetime(2024, 1, 1)
    with pymongo.MongoClient(source_uri) as client:
        client.retry.create_collection("m", timeseries={"timeField": "ts"})
        client.retry.m.insert_many(
            [{"_id": i % 50, "ts": start + datetime.timedelta(seconds=i), "pad": "x" * 300} for i in range(6000)]
        )
    cp = tmp_path / "cp.json"
    await _sync_killing_a_busy_worker(spark, source_uri, target_uri, cp)
    assert {p["bracket"] for p in json.loads(cp.read_text())["snapshot"]["plan"]} == {"time"}

    def measurements(uri: str) -> Counter[bytes]:
        with pymongo.MongoClient(uri) as client:
            return Counter(d.raw for d in client.get_database("retry", codec_options=RAW).m.find())

    assert measurements(target_uri) == measurements(source_uri)


async def test_verify_on_spark_reports_what_asyncio_reports(
    spark: Any, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    from replicator.engines.spark.verify import verify_on_spark
    from replicator.verify import verify

    with pymongo.MongoClient(source_uri) as client:
        load_corpus(client, mixed_count=600)
    await run_job(source_uri, target_uri, tmp_path / "cp.json", partition_docs=200, split="always")
    flags = {"source": source_uri, "target": target_uri, "partition_docs": 200, "split": "always"}

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        on_asyncio = (await verify(resolve(flags, env={}))).to_json()
        on_spark = (await verify_on_spark(resolve({**flags, "engine": "spark"}, env={}))).to_json()
        for report in (on_asyncio, on_spark):
            report.pop("elapsed_s", None)
        return on_asyncio, on_spark

    same, same_spark = await both()
    assert same["ok"] is True and same == same_spark
    with pymongo.MongoClient(target_uri) as client:
        first, second = client.corpus.mixed_ids.find({}, {"_id": 1}).limit(2)
        client.corpus.mixed_ids.delete_one({"_id": first["_id"]})
        client.corpus.mixed_ids.update_one({"_id": second["_id"]}, {"$set": {"changed": 1}})
        client.corpus.mixed_ids.insert_one({"_id": "only-on-target"})
    changed, changed_spark = await both()
    assert changed["ok"] is False and changed == changed_spark
    kinds = {d["kind"] for d in changed["differences"]}
    assert {"missing", "extra", "changed"} <= kinds


async def test_catch_up_on_spark_reaches_now(spark: Any, source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i, "v": 0} for i in range(300)])
    await run_job(source_uri, target_uri, cp, partition_docs=100, split="always")
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.delete_many({"_id": {"$lt": 20}})
        client.db.c.update_many({"_id": {"$gte": 200}}, {"$inc": {"v": 1}})
        client.db.c.insert_many([{"_id": f"new{i}"} for i in range(50)])
        with client.start_session() as session, session.start_transaction():
            client.db.c.update_one({"_id": 50}, {"$set": {"txn": 1}}, session=session)
            client.db.d.insert_one({"_id": "txn"}, session=session)
        client.db.c.create_index("v")
        client.db.e.insert_one({"_id": 1})
        client.db.e.rename("f")
        written = client.admin.command("ping")["operationTime"]  # just after the last write
    summary = await run_job(source_uri, target_uri, cp, command="catch-up", replay_batch=25)
    assert summary["snapshot"] == "skipped" and summary["events"] >= 20 + 100 + 50 + 2
    assert_identical(source_uri, target_uri)
    saved = json.loads(cp.read_text())
    assert saved["position"]["cluster_time"]["t"] >= written.time - 1  # the rename, the last event, is in
    again = await run_job(source_uri, target_uri, cp, command="catch-up")
    assert again["events"] == 0  # nothing read twice


def test_tail_on_spark_converges_under_writes_exits_0_on_sigterm_and_leaves_no_log_behind(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A run that succeeds (a tail stopped by SIGTERM exits 0) removes the file Spark's console went to."""
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i} for i in range(200)])
    proc = _tail(source_uri, target_uri, cp, env={**os.environ, "TMPDIR": str(tmp_path)})
    spark_log = tmp_path / f"mcdc-spark-{proc.pid}.log"
    try:
        _until(proc, lambda: (_checkpoint(cp) or {}).get("snapshot", {}).get("status") == "done", "the snapshot")
        assert spark_log.exists()  # Spark's console goes there while the tail runs
        random_workload(source_uri, rounds=300, seed=7)
        _until(proc, _identical(source_uri, target_uri), "convergence")
        _sigterm(proc)
        assert not list(tmp_path.glob("mcdc-spark-*.log"))
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_sync_on_spark_to_kafka_writes_from_the_executors_and_rebuilds_exactly(
    spark: Any, source_uri: str, kafka: Any, tmp_path: Path
) -> None:
    from tests.support.kafka import consume_all, list_topics
    from tests.support.rebuild import assert_same, rebuild, server_docs

    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i, "d": 1.5, "big": 2**40} for i in range(400)])
        client.shop.mixed.insert_many([{"_id": v} for v in ("a", 1, 2.5, None, True, b"\x01")])
    cp = tmp_path / "cp.json"
    summary = await run_job(source_uri, f"kafka://{kafka.bootstrap}", cp, partition_docs=100, split="always")
    assert summary["snapshot"] == "completed" and summary["documents"] == 406
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.delete_one({"_id": 3})
        client.shop.orders.update_one({"_id": 4}, {"$set": {"n": -1}})
    await run_job(source_uri, f"kafka://{kafka.bootstrap}", cp, command="catch-up")
    topics = sorted(t for t in await list_topics(kafka.bootstrap) if t.startswith("mcdc.shop."))
    records = await consume_all(kafka.bootstrap, topics)
    decoded = [(json.loads(r.key) if r.key else None, json.loads(r.value) if r.value else None) for r in records]
    assert_same(rebuild(decoded), server_docs(source_uri))


async def test_tail_on_spark_follows_two_shards_in_order(
    spark: Any, source_uri: str, target_uri: str, second_shard: str, tmp_path: Path
) -> None:
    """On the session's Spark, stopped as SIGTERM stops ``mcdc tail``: SIGTERM sets this same event, which
    test_tail_on_spark_converges_under_writes_exits_0_on_sigterm_and_leaves_no_log_behind proves of a Spark
    tail in a process of its own."""
    from tests.test_shards import _wait_converged

    cp = tmp_path / "cp.json"
    settings = resolve(
        {"source": source_uri, "target": target_uri, "checkpoint": cp, "engine": "spark",
         "shards": (source_uri, second_shard), "snapshot": "never"}, env={},
    )  # fmt: skip
    stop = asyncio.Event()
    job = asyncio.create_task(SyncJob(settings, LogReporter(), command="tail", stop=stop).run())
    try:
        deadline = time.monotonic() + 60
        while not cp.exists():
            assert not job.done(), job.result()
            assert time.monotonic() < deadline, "timed out waiting for the first checkpoint"
            await asyncio.sleep(0.1)
        await asyncio.to_thread(two_shard_workload, source_uri, second_shard)
        await asyncio.to_thread(_wait_converged, target_uri, source_uri, second_shard, timeout=120)
    finally:
        stop.set()
        await asyncio.wait_for(job, timeout=60)
    saved = json.loads(cp.read_text())
    assert len(saved["shards"]) == 2 and all(p["resume_token"] for p in saved["shards"].values())


def test_kill_9_of_a_spark_tail_then_a_restart_converges(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    args = ("--snapshot", "never", "--max-batch-size", "20")
    proc = _tail(source_uri, target_uri, cp, *args)
    try:
        _until(proc, cp.exists, "the first checkpoint", timeout=60)
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
        _until(proc, cp.exists, "the first checkpoint", timeout=60)
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


async def test_a_tail_on_spark_from_start_at_moves_each_shards_checkpoint(
    spark: Any, source_uri: str, target_uri: str, second_shard: str, tmp_path: Path
) -> None:
    """--start-at leaves no per-shard entry in the checkpoint; the first acknowledged events make them."""
    from tests.test_shards import _wait_converged

    starts = []
    for uri in (source_uri, second_shard):  # the earlier: these servers share no cluster time (see the workload)
        with pymongo.MongoClient(uri) as client:
            starts.append(client.admin.command("ping")["operationTime"])
    start = min(starts)
    two_shard_workload(source_uri, second_shard)
    cp = tmp_path / "cp.json"
    shards = {"shards": (source_uri, second_shard)}
    settings = resolve(
        {"source": source_uri, "target": target_uri, "checkpoint": cp, "engine": "spark",
         "start_at": f"{start.time},{start.inc}", "snapshot": "never", **shards}, env={},
    )  # fmt: skip
    stop = asyncio.Event()
    job = asyncio.create_task(SyncJob(settings, LogReporter(), command="tail", stop=stop).run())
    try:
        await asyncio.to_thread(_wait_converged, target_uri, source_uri, second_shard, timeout=120)
        deadline = time.monotonic() + 30
        while len((_checkpoint(cp) or {}).get("shards") or {}) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await job
    saved = json.loads(cp.read_text())
    assert len(saved["shards"]) == 2 and all(p["resume_token"] for p in saved["shards"].values()), saved
    assert saved["position"]["cluster_time"]["t"] >= start.time


async def test_a_collection_renamed_into_the_selection_after_the_snapshot_is_copied_on_spark(
    spark: Any, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """The Spark replay gave its after-write hook events already transformed, in which a rename into the
    selection had become a drop: shop.live was never copied."""
    cp = tmp_path / "cp.json"
    flags = {"exclude": (r"shop\.staging",)}
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
        client.shop.staging.insert_many([{"_id": i, "staged": True} for i in range(30)])
    await run_job(source_uri, target_uri, cp, **flags)
    with pymongo.MongoClient(source_uri) as client:
        client.shop.staging.rename("live")
        client.shop.live.update_one({"_id": 3}, {"$set": {"live": True}})
    await run_job(source_uri, target_uri, cp, command="catch-up", **flags)
    state = assert_identical(source_uri, target_uri)
    assert len(state["shop.live"]["docs"]) == 30
