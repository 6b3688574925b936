"""The target's own TTL monitor deletes nothing while a migration writes it: every TTL is held at MongoDB's
largest expireAfterSeconds on the target, the source's value recorded, until cutover gives it back (or
``cutover --release-only``, for a migration abandoned). mongosync and Percona ClusterSync do the same."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pymongo
import pytest

from replicator.sinks.mongo.ttl import HOLD
from tests.support.failpoint import arm, disarm, error
from tests.support.servers import LocalServer, ServerPair
from tests.test_cli import _assert_one_line_error, _mcdc

#: the test target's TTL monitor runs this often (mongod's every 60 s; ttlMonitorSleepSecs)
SWEEP_S = 1.0


@pytest.fixture
def swept_target(servers: ServerPair, tmp_path: Path) -> Iterator[str]:
    """A target whose TTL monitor runs every second."""
    if servers.external:
        pytest.skip("needs a server of the test's own, with a quick TTL monitor")
    server = LocalServer(tmp_path / "swept", ttl_sweep_s=SWEEP_S)
    server.start()
    try:
        yield server.uri
    finally:
        server.kill()


def _ttls(uri: str, db: str = "app") -> dict[str, Any]:
    with pymongo.MongoClient(uri) as client:
        return {
            f"{coll}.{ix['name']}": ix["expireAfterSeconds"]
            for coll in sorted(client[db].list_collection_names())
            for ix in client[db][coll].list_indexes()
            if "expireAfterSeconds" in ix
        }


def _sessions(uri: str, n: int, age_s: float) -> None:
    """``n`` sessions last seen ``age_s`` ago, expiring 120 s after that."""
    seen = datetime.now(UTC) - timedelta(seconds=age_s)
    with pymongo.MongoClient(uri) as client:
        client.app.sessions.insert_many([{"_id": i, "lastSeen": seen} for i in range(n)])
        client.app.sessions.create_index("lastSeen", expireAfterSeconds=120, name="lastSeen_ttl")


@pytest.mark.integration
def test_a_lagging_cron_migration_never_lets_the_targets_ttl_monitor_delete_what_the_source_holds(
    source_uri: str, swept_target: str, tmp_path: Path
) -> None:
    target_uri, cp = swept_target, tmp_path / "cp.json"
    _sessions(source_uri, 200, age_s=116)  # about to expire
    run = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress")
    assert _mcdc("sync", *run).returncode == 0
    assert _ttls(target_uri) == {"sessions.lastSeen_ttl": HOLD}  # held on the target
    with pymongo.MongoClient(source_uri) as client:  # the application keeps 100 of them alive
        client.app.sessions.update_many({"_id": {"$lt": 100}}, {"$set": {"lastSeen": datetime.now(UTC)}})
    status = _mcdc("status", "-c", str(cp), "--json")
    held = json.loads(status.stdout)["progress"]["heldTTLs"]
    assert held == [{"namespace": "app.sessions", "index": "lastSeen_ttl", "sourceExpireAfterSeconds": 120}]
    deadline = time.monotonic() + 8 * SWEEP_S + 6  # past the documents' expiry, through several sweeps
    with pymongo.MongoClient(source_uri) as src, pymongo.MongoClient(target_uri) as dst:
        while time.monotonic() < deadline:  # the cron job has not run yet: the target was not told
            on_source = {d["_id"] for d in src.app.sessions.find({}, {"_id": 1})}
            on_target = {d["_id"] for d in dst.app.sessions.find({}, {"_id": 1})}
            assert on_source <= on_target, f"the target deleted {sorted(on_source - on_target)[:5]} on its own"
            time.sleep(0.5)
        assert dst.app.sessions.count_documents({}) == 200
        src.app.sessions.update_many({}, {"$set": {"lastSeen": datetime.now(UTC)}})  # none expires at cutover
    assert _mcdc("catch-up", *run).returncode == 0
    done = _mcdc("cutover", *run, "--json", "--reverse-checkpoint", str(tmp_path / "back.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["restored"] == ["app.sessions index lastSeen_ttl"]
    assert _ttls(target_uri) == _ttls(source_uri) == {"sessions.lastSeen_ttl": 120}  # the source's, given back
    assert "heldTTLs" not in json.loads(_mcdc("status", "-c", str(cp), "--json").stdout)["progress"]
    checked = _mcdc("verify", "-s", source_uri, "-t", target_uri, "-c", str(cp))
    assert checked.returncode == 0, checked.stdout


@pytest.mark.integration
def test_a_ttl_changed_on_the_source_updates_the_record_not_the_target_and_cutover_gives_it_back(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp = tmp_path / "cp.json"
    _sessions(source_uri, 10, age_s=0)
    run = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress")
    assert _mcdc("sync", *run).returncode == 0
    with pymongo.MongoClient(source_uri) as client:
        client.app.command("collMod", "sessions", index={"name": "lastSeen_ttl", "expireAfterSeconds": 300})
        client.app.events.insert_one({"_id": 1, "at": datetime.now(UTC)})
        client.app.events.create_index("at", expireAfterSeconds=60)  # a TTL index made during the replay
    assert _mcdc("catch-up", *run).returncode == 0
    assert _ttls(target_uri) == {"events.at_1": HOLD, "sessions.lastSeen_ttl": HOLD}
    held = json.loads(_mcdc("status", "-c", str(cp), "--json").stdout)["progress"]["heldTTLs"]
    assert {(h["namespace"], h["sourceExpireAfterSeconds"]) for h in held} == {
        ("app.sessions", 300),
        ("app.events", 60),
    }
    verified = _mcdc("verify", "-s", source_uri, "-t", target_uri)  # a held TTL is taken for the source's
    assert verified.returncode == 0, verified.stdout
    arm(target_uri, error(2), ["collMod"], times=1, skip=1)  # a cutover cut short between two TTLs given back
    try:
        cut = _mcdc("cutover", *run, "--reverse-checkpoint", str(tmp_path / "back.json"))
    finally:
        disarm(target_uri)
    _assert_one_line_error(cut, 2, "target", "run cutover again")
    assert sorted(_ttls(target_uri).values()) in ([60, HOLD], [300, HOLD])  # one given back, one still held
    done = _mcdc("cutover", *run, "--reverse-checkpoint", str(tmp_path / "back.json"))  # run again
    assert done.returncode == 0, done.stderr
    assert _ttls(target_uri) == _ttls(source_uri) == {"events.at_1": 60, "sessions.lastSeen_ttl": 300}


@pytest.mark.integration
def test_release_only_gives_an_abandoned_migrations_ttls_back_and_changes_nothing_else(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp = tmp_path / "cp.json"
    _sessions(source_uri, 10, age_s=0)
    run = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress")
    assert _mcdc("sync", *run).returncode == 0
    before = json.loads(cp.read_text())
    released = _mcdc("cutover", *run, "--release-only", "--json")
    assert released.returncode == 0, released.stderr
    assert json.loads(released.stdout)["restored"] == ["app.sessions index lastSeen_ttl"]
    assert _ttls(target_uri) == {"sessions.lastSeen_ttl": 120}
    after = json.loads(cp.read_text())
    assert after["cutover"] is None and after["position"] == before["position"] and after["held"] == {}
    assert not (tmp_path / "back.json").exists()
    again = _mcdc("cutover", *run, "--release-only")
    assert again.returncode == 0 and "nothing held" in again.stdout


@pytest.mark.integration
def test_a_way_backs_first_run_holds_the_old_sides_ttls_and_its_cutover_gives_them_back(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, back = tmp_path / "cp.json", tmp_path / "back.json"
    _sessions(source_uri, 10, age_s=0)
    run = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress")
    assert _mcdc("sync", *run).returncode == 0
    assert _mcdc("cutover", *run, "--reverse-checkpoint", str(back)).returncode == 0
    with pymongo.MongoClient(target_uri) as client:
        client.app.sessions.insert_one({"_id": 100, "lastSeen": datetime.now(UTC)})
    way_back = ("-s", target_uri, "-t", source_uri, "-c", str(back), "--no-progress")
    assert _mcdc("catch-up", *way_back).returncode == 0
    assert _ttls(source_uri) == {"sessions.lastSeen_ttl": HOLD}  # the old side's own monitor waits too
    rollback = _mcdc("cutover", *way_back, "--reverse-checkpoint", str(tmp_path / "again.json"))
    assert rollback.returncode == 0, rollback.stderr
    assert _ttls(source_uri) == _ttls(target_uri) == {"sessions.lastSeen_ttl": 120}


@pytest.mark.integration
def test_a_clustered_collections_own_ttl_is_held_and_given_back(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.app.command({"create": "events", "clusteredIndex": {"key": {"_id": 1}, "unique": True},
                            "expireAfterSeconds": 600})  # fmt: skip
        client.app.events.insert_one({"_id": datetime.now(UTC)})
    run = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress")
    assert _mcdc("sync", *run).returncode == 0

    def ttl(uri: str) -> Any:
        with pymongo.MongoClient(uri) as client:
            return client.app.command("listCollections", filter={"name": "events"})["cursor"]["firstBatch"][0][
                "options"
            ]["expireAfterSeconds"]

    assert ttl(target_uri) == HOLD
    held = json.loads(_mcdc("status", "-c", str(cp), "--json").stdout)["progress"]["heldTTLs"]
    assert held == [{"namespace": "app.events", "index": None, "sourceExpireAfterSeconds": 600}]
    done = _mcdc("cutover", *run, "--json", "--reverse-checkpoint", str(tmp_path / "back.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["restored"] == ["app.events (the collection's TTL)"] and ttl(target_uri) == 600
