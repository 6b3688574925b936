"""--read-preference and --max-read-rate against the real test server: what the source's find and getMore
commands carry ($readPreference, readConcern.afterClusterTime, batchSize), seen by pymongo's command
monitoring, and the CLI end to end.

The test server is a single-member replica set: a secondary preference cannot be served by a real
secondary here. The modes that fall back to the primary are run end to end; ``secondary`` must be refused
in one line."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp
from pymongo import monitoring

from replicator.checking.verify import verify
from replicator.events import Namespace
from replicator.job.phases import SyncJob
from replicator.observe.progress import LogReporter
from replicator.settings.resolve import resolve
from replicator.source.connection import make_client
from replicator.source.lookup import source_lookup
from tests.support.compare import assert_identical

pytestmark = pytest.mark.integration

MODES = ["primaryPreferred", "secondaryPreferred", "nearest"]


class _Recorder(monitoring.CommandListener):
    """The read commands sent to one port while recording (registered once for the process: pymongo has
    no way to take a global listener back, so it records only inside :meth:`on`)."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def on(self, uri: str) -> _Recorder:
        self.port = int(uri.split("//", 1)[1].split("/", 1)[0].split(",")[0].rsplit(":", 1)[1])
        self.commands = []
        return self

    def off(self) -> None:
        self.port = None

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.port is None or event.connection_id[1] != self.port:
            return
        if event.command_name in ("find", "getMore", "count", "aggregate"):
            with self._lock:
                self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def finds(self, coll: str) -> list[dict[str, Any]]:
        return [c for name, c in self.commands if name == "find" and c["find"] == coll]


RECORDER = _Recorder()
monitoring.register(RECORDER)


def replica_set_uri(uri: str) -> str:
    """The source as a replica set (the test server's URIs connect directly, which reads its one server
    whatever the preference); a real server's URI is kept as it is."""
    with pymongo.MongoClient(uri) as client:
        name = client.admin.command("hello").get("setName")
    if not name:
        pytest.skip("the source is not a replica set")
    if "directConnection=true" not in uri:
        return uri
    return uri.replace("directConnection=true", f"replicaSet={name}")


def now(uri: str) -> Timestamp:
    with pymongo.MongoClient(uri) as client:
        return client.admin.command("ping")["operationTime"]  # type: ignore[no-any-return]


def _load(uri: str, n: int) -> None:
    with pymongo.MongoClient(uri) as client:
        client.rp.c.insert_many([{"_id": i, "v": "x" * 20} for i in range(n)])


@pytest.mark.parametrize("mode", MODES)
async def test_the_snapshot_and_verify_read_where_the_preference_says_no_older_than_their_start(
    mode: str, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _load(source_uri, 2500)
    source = replica_set_uri(source_uri)
    before = now(source_uri)
    flags = {"read_preference": mode, "partition_docs": 1000, "split": "always", "batch_docs": 400}
    settings = resolve({"source": source, "target": target_uri, "checkpoint": tmp_path / "cp.json", **flags}, env={})
    RECORDER.on(source)
    try:
        await SyncJob(settings, LogReporter(), command="sync").run()
    finally:
        RECORDER.off()
    assert_identical(source_uri, target_uri)
    finds = RECORDER.finds("c")
    assert {f["$readPreference"]["mode"] for f in finds} == {mode}  # the plan's scan of _ids too
    reads = [f for f in finds if f.get("projection") != {"_id": 1}]
    assert len(reads) >= 3  # one per _id range
    assert {f["readConcern"]["level"] for f in reads} == {"local"}  # shards filter orphans (MongoShake#392)
    starts = {f["readConcern"]["afterClusterTime"] for f in reads}
    assert len(starts) == 1  # every range read at the snapshot's one start...
    (start,) = starts
    assert before <= start <= now(source_uri)  # ...taken as this sync began

    before = now(source_uri)
    RECORDER.on(source)
    try:
        report = await verify(settings)
    finally:
        RECORDER.off()
    assert report.ok and report.documents == 2500
    finds = RECORDER.finds("c")
    assert finds and {f["$readPreference"]["mode"] for f in finds} == {mode}
    reads = [f for f in finds if f.get("projection") != {"_id": 1}]
    assert reads and all(f["readConcern"]["afterClusterTime"] >= before for f in reads)


async def test_primary_reads_are_sent_as_before(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    _load(source_uri, 300)
    source = replica_set_uri(source_uri)
    settings = resolve({"source": source, "target": target_uri, "checkpoint": tmp_path / "cp.json"}, env={})
    RECORDER.on(source)
    try:
        await SyncJob(settings, LogReporter(), command="sync").run()
    finally:
        RECORDER.off()
    finds = RECORDER.finds("c")
    assert finds and not any("$readPreference" in f or "readConcern" in f for f in finds)
    assert all(f["batchSize"] == settings.batch_docs for f in finds if f.get("projection") != {"_id": 1})


async def test_a_lookup_reads_no_older_than_its_event(source_uri: str, target_uri: str) -> None:
    _load(source_uri, 5)
    source = replica_set_uri(source_uri)
    settings = resolve({"source": source, "target": target_uri, "read_preference": "nearest"}, env={})
    at = now(source_uri)
    client = make_client(source)
    RECORDER.on(source)
    try:
        docs = await source_lookup(client, settings)(Namespace("rp", "c"), [1, 2], after=at)
    finally:
        RECORDER.off()
        await client.close()
    assert sorted(d["_id"] for d in docs) == [1, 2]
    (find,) = RECORDER.finds("c")
    assert find["$readPreference"]["mode"] == "nearest" and find["readConcern"]["afterClusterTime"] == at


async def test_the_read_rate_paces_the_finds_in_small_replies(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    """--max-read-rate reaches the readers: each reply holds a tenth of a second of documents (no timing
    is asserted here: scripts/bench_read_rate.py measures the rate)."""
    _load(source_uri, 1200)
    settings = resolve(
        {"source": source_uri, "target": target_uri, "checkpoint": tmp_path / "cp.json", "max_read_rate": 5000},
        env={},
    )
    RECORDER.on(source_uri)
    try:
        await SyncJob(settings, LogReporter(), command="sync").run()
    finally:
        RECORDER.off()
    assert_identical(source_uri, target_uri)
    finds = [f for f in RECORDER.finds("c") if f.get("projection") != {"_id": 1}]
    assert finds and all(f["batchSize"] == 500 for f in finds)
    more = [c for name, c in RECORDER.commands if name == "getMore" and c["collection"] == "c"]
    assert more and all(c["batchSize"] == 500 for c in more)


def test_the_data_sources_snapshot_read_takes_the_preference_its_time_and_its_share_of_the_rate(
    source_uri: str,
) -> None:
    import asyncio

    from replicator.spark_datasource.snapshot import Range, plan_snapshot, read_range

    _load(source_uri, 700)
    source = replica_set_uri(source_uri)
    settings = resolve(
        {"source": source, "target": "-", "read_preference": "secondaryPreferred", "max_read_rate": 4000}, env={}
    )
    at, plan = asyncio.run(plan_snapshot(settings))
    (part,) = [p for p in plan if p["coll"] == "c"]
    RECORDER.on(source)
    try:
        rows = list(read_range(settings, Range(part, at.time, at.inc, readers=2)))
    finally:
        RECORDER.off()
    assert len(rows) == 700
    (find,) = RECORDER.finds("c")
    assert find["$readPreference"]["mode"] == "secondaryPreferred"
    assert find["readConcern"]["afterClusterTime"] == at
    assert find["batchSize"] == 200  # its half of 4,000 docs/s: a tenth of a second of 2,000


def _mcdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True, timeout=120)


def _one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcdc: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.mark.parametrize("mode", MODES)
def test_sync_and_verify_exit_0_with_each_mode_that_falls_back_to_the_primary(
    mode: str, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _load(source_uri, 500)
    source = replica_set_uri(source_uri)
    common = ["-s", source, "-t", target_uri, "--read-preference", mode, "--max-read-rate", "100000"]
    synced = _mcdc("sync", *common, "-c", str(tmp_path / "cp.json"), "--no-progress")
    assert synced.returncode == 0, synced.stderr
    verified = _mcdc("verify", *common)
    assert verified.returncode == 0, verified.stderr + verified.stdout
    assert_identical(source_uri, target_uri)


@pytest.mark.parametrize("command", ["sync", "verify"])
def test_secondary_is_refused_in_one_line_where_no_secondary_can_serve_it(
    command: str, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    source = replica_set_uri(source_uri)
    extra = ["-c", str(tmp_path / "cp.json"), "--no-progress"] if command == "sync" else []
    one_member = _mcdc(command, "-s", source, "-t", target_uri, "--read-preference", "secondary", *extra)
    _one_line_error(one_member, 2, "--read-preference secondary", "has no secondary", "secondaryPreferred")
    if "directConnection=true" in source_uri:
        direct = _mcdc(command, "-s", source_uri, "-t", target_uri, "--read-preference", "secondary", *extra)
        _one_line_error(direct, 2, "--read-preference secondary", "connects directly to the primary", "replicaSet=")
    with pymongo.MongoClient(target_uri) as client:
        assert "rp" not in client.list_database_names()  # refused before anything was written


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--read-preference", "secondry"], "--read-preference must be one of primary, primaryPreferred, secondary"),
        (["--max-read-rate", "-1"], "--max-read-rate"),
    ],
)
def test_bad_values_are_refused_in_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = _mcdc("sync", "-s", "mongodb://a:1", "-t", "mongodb://b:2", "-c", str(tmp_path / "cp.json"), *args)
    _one_line_error(result, 2, fragment)
