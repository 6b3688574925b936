"""--engine spark on a real standalone cluster (a master and a worker started from the pip package): the
snapshot's partitions and verify's ranges run in executor processes the worker launched, with the venv's
Python, and the target is byte-identical to the source."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.compare import assert_identical
from tests.support.corpus import load_corpus
from tests.support.servers import connect
from tests.support.spark import quick_jvm_conf
from tests.support.spark_cluster import Cluster, cluster_environment

pytestmark = pytest.mark.integration

#: One ``mcdc`` run on the cluster: its driver's JVM, an application whose executor JVM the worker launches,
#: the executor's Python workers (its tasks wait for them), then the work (20-30 s each alone, up to three
#: times that beside two burners).
RUN_TIMEOUT_S = 180
#: The test: the cluster's two daemons coming up (the module's fixture, counted in the first test's time), then
#: three runs, each an application of its own; pytest's 300 s default was reached in the third beside two
#: burners (issue 40), where every step had only been slow.
TEST_TIMEOUT_S = 2 * 60 + 3 * RUN_TIMEOUT_S + 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One master and one 2-core worker for the module, stopped at its end."""
    started = Cluster(tmp_path_factory.mktemp("spark-cluster"), cores=2, memory="2g")
    started.start()
    try:
        yield started
    finally:
        started.stop()


class ProcessWatch:
    """Samples the worker's descendants while a driver runs: the executor JVMs and their Python workers."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.executors: set[int] = set()
        self.pythons: dict[int, list[str]] = {}  # pid -> argv of each pyspark daemon / worker seen
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            try:
                children = self.root.children(recursive=True)
            except psutil.Error:
                continue
            for proc in children:
                try:
                    argv = proc.cmdline()
                except psutil.Error:
                    continue
                if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv:
                    self.executors.add(proc.pid)
                elif any("pyspark" in arg for arg in argv):
                    self.pythons[proc.pid] = argv


def _mcdc(command: str, cluster: Cluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    argv = [
        sys.executable, "-m", "replicator.cli", command, "--engine", "spark", "--spark-master", cluster.url,
        "--spark-conf", "spark.driver.host=127.0.0.1", "--spark-conf", "spark.ui.enabled=false",
        "--spark-conf", "spark.executor.memory=1g", *quick_jvm_conf(), *args,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT_S, env=cluster_environment(), check=False)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_sync_and_verify_run_on_the_clusters_executors(
    cluster: Cluster, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with connect(source_uri) as client:
        info = load_corpus(client)
    assert cluster.worker.pid is not None
    with ProcessWatch(cluster.worker.pid) as watch:
        synced = _mcdc(
            "sync", cluster, "--source", source_uri, "--target", target_uri, "--checkpoint", str(tmp_path / "cp.json"),
            "--split", "always", "--partition-docs", "300", "--no-progress", "--json",
        )  # fmt: skip
    assert synced.returncode == 0, synced.stderr.decode()[-4000:]
    summary = json.loads(synced.stdout)
    assert summary["snapshot"] == "completed"
    state = assert_identical(source_uri, target_uri)
    assert len(state["corpus.mixed_ids"]["docs"]) == info["namespaces"]["corpus.mixed_ids"]
    checkpoint = json.loads((tmp_path / "cp.json").read_text())
    assert len({p["bracket"] for p in checkpoint["snapshot"]["plan"] if p["coll"] == "mixed_ids"}) >= 8

    # The tasks ran in executor JVMs the worker launched, whose Python workers are this venv's interpreter.
    assert watch.executors, "no CoarseGrainedExecutorBackend process was seen under the worker"
    assert watch.pythons, "no pyspark Python process was seen under the worker"
    assert {argv[0] for argv in watch.pythons.values()} == {sys.executable}
    executor_dirs = cluster.worker.executor_dirs()
    assert executor_dirs, f"no app-*/<executor> directory under {cluster.worker.work_dir}"
    executor_log = "".join((d / "stderr").read_text(errors="replace") for d in executor_dirs)
    assert "Running task" in executor_log

    verified = _mcdc("verify", cluster, "--source", source_uri, "--target", target_uri, "--split", "always",
                     "--partition-docs", "300")  # fmt: skip
    assert verified.returncode == 0, verified.stdout.decode()[-2000:] + verified.stderr.decode()[-4000:]
    assert len(cluster.worker.executor_dirs()) > len(executor_dirs)  # verify's own application, its own executor

    # The replay's writes run on the cluster's executors too: a catch-up of changes, unique keys swapped
    # between documents and a transaction among them, is applied by tasks and leaves the target identical.
    with connect(source_uri) as client:
        client.replay.u.insert_many([{"_id": i, "k": i} for i in range(40)])
        client.replay.u.create_index("k", unique=True)
        for i in range(0, 40, 2):
            client.replay.u.update_one({"_id": i}, {"$set": {"k": -1 - i}})
            client.replay.u.update_one({"_id": i + 1}, {"$set": {"k": i}})
            client.replay.u.update_one({"_id": i}, {"$set": {"k": i + 1}})
        with client.start_session() as session, session.start_transaction():
            client.replay.u.update_many({}, {"$set": {"t": 1}}, session=session)
            client.corpus.txn.insert_one({"_id": 1}, session=session)
    before = set(cluster.worker.executor_dirs())
    # (--spark-start-after 0: a backlog this small would otherwise be replayed on the driver, Spark never started)
    caught_up = _mcdc("catch-up", cluster, "--source", source_uri, "--target", target_uri, "--checkpoint",
                      str(tmp_path / "cp.json"), "--no-progress", "--json", "--spark-start-after", "0")  # fmt: skip
    assert caught_up.returncode == 0, caught_up.stderr.decode()[-4000:]
    assert json.loads(caught_up.stdout)["events"] >= 40 + 60 + 41
    assert_identical(source_uri, target_uri)
    replay_dirs = set(cluster.worker.executor_dirs()) - before
    assert replay_dirs, "the catch-up ran no executor"
    assert "Running task" in "".join((d / "stderr").read_text(errors="replace") for d in replay_dirs)
