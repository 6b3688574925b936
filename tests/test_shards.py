"""Per-shard change streams: discovery (unit) and two independent servers acting as two shards of one
source (integration), including documents that move from one shard to the other."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest

from replicator.source.shards import parse_shards, shard_uri
from tests.support.compare import server_state
from tests.support.workload import two_shard_workload, wait_past_cluster_time


def test_shard_uris_keep_credentials_and_options() -> None:
    mongos = "mongodb://app:s3cret@mongos1:27017,mongos2:27017/?authSource=admin&tls=true&directConnection=false"
    reply = {
        "shards": [
            {"_id": "shardB", "host": "rsB/b1:27018,b2:27018", "state": 1},
            {"_id": "shardA", "host": "rsA/a1:27018", "state": 1},
        ]
    }
    shards = parse_shards(reply, mongos)
    assert [s.name for s in shards] == ["shardA", "shardB"]
    assert shards[0].uri == "mongodb://app:s3cret@a1:27018/?authSource=admin&tls=true&replicaSet=rsA"
    assert shards[1].uri == "mongodb://app:s3cret@b1:27018,b2:27018/?authSource=admin&tls=true&replicaSet=rsB"
    assert "s3cret" not in str(shards[0])
    assert shard_uri("h1:1", "mongodb+srv://cluster.example.net/") == "mongodb://h1:1/"


def _merged(*uris: str) -> dict[str, Any]:
    docs: dict[bytes, bytes] = {}
    for uri in uris:
        docs.update(server_state(uri).get("db.c", {}).get("docs", {}))
    return docs


def _wait_converged(target: str, *shards: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        want, got = _merged(*shards), server_state(target).get("db.c", {}).get("docs", {})
        if want == got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not converged: {len(want)} wanted, {len(got)} on the target")
        time.sleep(0.3)


@pytest.mark.integration
def test_two_shards_converge_in_order(source_uri: str, target_uri: str, second_shard: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    args = [sys.executable, "-m", "replicator.cli", "tail", "-s", source_uri, "-t", target_uri, "-c", str(cp)]
    args += ["--shard", source_uri, "--shard", second_shard, "--snapshot", "never", "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not cp.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        two_shard_workload(source_uri, second_shard)
        _wait_converged(target_uri, source_uri, second_shard)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        saved = json.loads(cp.read_text())
        assert len(saved["shards"]) == 2 and all(p["resume_token"] for p in saved["shards"].values())

        with pymongo.MongoClient(second_shard) as b:  # while stopped; the next run resumes each shard
            b.db.c.insert_one({"_id": "later"})
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_converged(target_uri, source_uri, second_shard)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
async def test_a_shard_added_while_tailing_is_followed(
    source_uri: str, target_uri: str, second_shard: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source plays a mongos (its hello answer and listShards are stood in for: the test server is
    not one); the shard list grows while tail runs, and the new shard's writes arrive."""
    import asyncio

    import replicator.job.phases as sync_module
    from replicator.observe.progress import LogReporter
    from replicator.settings.resolve import resolve
    from replicator.source.shards import Shard

    listed = [Shard("shardA", source_uri, source_uri)]
    _as_mongos(monkeypatch, listed)
    settings = resolve(
        {"source": source_uri, "target": target_uri, "checkpoint": tmp_path / "cp.json", "snapshot": "never",
         "shard_refresh_s": 0.3, "progress": False},
        env={},
    )  # fmt: skip
    stop = asyncio.Event()
    job = asyncio.create_task(sync_module.SyncJob(settings, LogReporter(), command="tail", stop=stop).run())
    with pymongo.MongoClient(target_uri) as target:

        async def arrived(n: int) -> None:
            for _ in range(300):
                if target.db.c.count_documents({}) >= n:
                    return
                assert not job.done(), job.result()
                await asyncio.sleep(0.1)
            raise AssertionError(f"{n} documents never arrived")

        while not (tmp_path / "cp.json").exists():
            await asyncio.sleep(0.05)
        with pymongo.MongoClient(source_uri) as a:
            a.db.c.insert_many([{"_id": i} for i in range(10)])
        await arrived(10)
        listed.append(Shard("shardB", second_shard, second_shard))  # a shard joins the cluster...
        # (as in the migration test: these servers share no cluster time, so b's writes wait for the wall
        # clock to pass a's to be later than the listing that missed b)
        await asyncio.to_thread(wait_past_cluster_time, source_uri)
        with pymongo.MongoClient(second_shard) as b:
            b.db.c.insert_many([{"_id": i} for i in range(10, 20)])  # ...and takes writes at once
        await arrived(20)
    stop.set()
    await asyncio.wait_for(job, timeout=30)
    saved = json.loads((tmp_path / "cp.json").read_text())
    assert sorted(saved["shards"]) == ["shardA", "shardB"]


def _as_mongos(monkeypatch: pytest.MonkeyPatch, listed: list[Any]) -> None:
    """The source plays a mongos listing ``listed`` (a shard's host is its URI here: the test servers are
    independent replica sets, reached directly)."""
    import replicator.job.phases as sync_module
    from replicator.source import topology as topology_module
    from replicator.source.connection import ServerInfo

    real_probe = sync_module.probe

    async def mongos_probe(*args: Any) -> ServerInfo:
        info = await real_probe(*args)
        return ServerInfo("sharded", None, info.process_id, info.max_wire_version)

    async def list_shards(client: object, uri: str) -> list[Any]:
        return list(listed)

    monkeypatch.setattr(sync_module, "probe", mongos_probe)
    monkeypatch.setattr(topology_module, "discover", list_shards)
    monkeypatch.setattr(topology_module, "shard_uri", lambda host, mongos: host)


@pytest.mark.integration
async def test_a_shard_removed_while_mcdc_was_down_is_read_to_its_end(
    source_uri: str, target_uri: str, second_shard: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from replicator.job.phases import SyncJob
    from replicator.observe.progress import LogReporter
    from replicator.settings.resolve import resolve
    from replicator.source.shards import Shard

    listed = [Shard("shardA", source_uri, source_uri), Shard("shardB", second_shard, second_shard)]
    _as_mongos(monkeypatch, listed)
    cp = tmp_path / "cp.json"
    settings = resolve(
        {"source": source_uri, "target": target_uri, "checkpoint": cp, "snapshot": "never", "progress": False},
        env={},
    )  # fmt: skip

    async def tail_until(count: int) -> None:
        stop = asyncio.Event()
        job = asyncio.create_task(SyncJob(settings, LogReporter(), command="tail", stop=stop).run())
        with pymongo.MongoClient(target_uri) as target:
            for _ in range(300):
                if target.db.c.count_documents({}) >= count:
                    break
                assert not job.done(), job.result()
                await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(job, timeout=30)

    with pymongo.MongoClient(source_uri) as a, pymongo.MongoClient(second_shard) as b:
        await tail_until(0)  # the checkpoint follows both shards
        a.db.c.insert_many([{"_id": i} for i in range(5)])
        wait_past_cluster_time(source_uri)  # these servers share no cluster time: b's writes come later
        b.db.c.insert_many([{"_id": i} for i in range(5, 10)])  # taken while mcdc is down...
    listed.pop()  # ...and the shard is removed before it starts again
    wait_past_cluster_time(second_shard)  # (a real cluster's time is past b's writes by now)
    await tail_until(10)
    with pymongo.MongoClient(target_uri) as target:
        assert sorted(d["_id"] for d in target.db.c.find()) == list(range(10))


@pytest.mark.integration
async def test_a_shard_added_during_the_snapshot_is_followed_from_before_it(
    source_uri: str, target_uri: str, second_shard: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    from collections.abc import Iterable

    from replicator.job.phases import SyncJob
    from replicator.observe.progress import LogReporter
    from replicator.observe.tally import CollectionProgress
    from replicator.settings.resolve import resolve
    from replicator.source.shards import Shard

    listed = [Shard("shardA", source_uri, source_uri)]
    _as_mongos(monkeypatch, listed)

    class AddShardMidSnapshot(LogReporter):
        def snapshot_begin(self, collections: Iterable[CollectionProgress]) -> None:
            super().snapshot_begin(collections)
            listed.append(Shard("shardB", second_shard, second_shard))
            wait_past_cluster_time(source_uri)
            with pymongo.MongoClient(second_shard) as b:
                b.db.c.insert_many([{"_id": i} for i in range(100, 105)])  # the new shard takes writes at once
            wait_past_cluster_time(second_shard)  # the snapshot goes on: its end is later than those writes

    with pymongo.MongoClient(source_uri) as a:
        a.db.c.insert_many([{"_id": i} for i in range(5)])
    settings = resolve(
        {"source": source_uri, "target": target_uri, "checkpoint": tmp_path / "cp.json", "shard_refresh_s": 0.3,
         "progress": False},
        env={},
    )  # fmt: skip
    stop = asyncio.Event()
    job = asyncio.create_task(SyncJob(settings, AddShardMidSnapshot(), command="tail", stop=stop).run())
    with pymongo.MongoClient(target_uri) as target:
        for _ in range(200):
            if target.db.c.count_documents({}) >= 10:
                break
            assert not job.done(), job.result()
            await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(job, timeout=30)
    with pymongo.MongoClient(target_uri) as target:
        assert sorted(d["_id"] for d in target.db.c.find()) == [*range(5), *range(100, 105)]
