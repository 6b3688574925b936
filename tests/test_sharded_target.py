"""Sharded targets: the target collection is sharded like its source (or as --shard-target says) before
anything is copied into it. Unit tests of the commands, then integration tests against mongos stand-ins
(tests/support/mongos.py) in front of the test servers: no mongos runs here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson.min_key import MinKey

from replicator.errors import ConfigError
from replicator.events import CollectionSpec, Namespace, ShardSpec
from replicator.settings.shard_target import ShardTargets
from replicator.sinks.mongo.sharding import same_key, shard_command, split_commands
from replicator.source.sharding import MOST_SPLITS, shard_spec, with_sharding
from tests.support.mongos import MongosStandIn, mongos

NS = Namespace("db", "c")
WIRE_5_0, WIRE_7_0, WIRE_8_0 = 13, 21, 25


# ---- unit: no server


def test_a_range_key_is_split_at_the_source_chunk_bounds_without_its_minkey() -> None:
    bounds = [{"r": MinKey()}, {"r": 10}, {"r": 20}]
    spec = shard_spec({"_id": "db.c", "key": {"r": 1}, "unique": True}, bounds)
    assert spec.split_points == ({"r": 10}, {"r": 20}) and spec.unique and spec.chunks == 3
    assert split_commands(NS, spec) == [{"split": "db.c", "middle": {"r": 10}}, {"split": "db.c", "middle": {"r": 20}}]


def test_a_source_with_very_many_chunks_gives_at_most_most_splits_bounds() -> None:
    bounds = [{"r": MinKey()}, *({"r": i} for i in range(1, 10_000))]
    spec = shard_spec({"_id": "db.c", "key": {"r": 1}}, bounds)
    assert len(spec.split_points) == MOST_SPLITS and spec.split_points[0] == {"r": 1}


def test_a_hashed_key_takes_the_source_chunk_count_as_initial_chunks_until_mongodb_7_2() -> None:
    spec = shard_spec({"_id": "db.c", "key": {"_id": "hashed"}}, [{"_id": MinKey()}, {"_id": 5}, {"_id": 9}])
    assert spec.hashed and spec.split_points == () and split_commands(NS, spec) == []
    assert shard_command(NS, spec, {}, WIRE_7_0) == {"shardCollection": "db.c", "key": {"_id": "hashed"},
                                                     "numInitialChunks": 3}  # fmt: skip
    assert "numInitialChunks" not in shard_command(NS, spec, {}, WIRE_8_0)  # 7.2+ spread them themselves
    compound = ShardSpec({"region": 1, "_id": "hashed"}, chunks=3)  # hashed, not first: no initial chunks
    assert "numInitialChunks" not in shard_command(NS, compound, {}, WIRE_7_0)


def test_a_collection_with_a_default_collation_is_sharded_with_the_simple_one() -> None:
    spec = ShardSpec({"r": 1}, unique=True)
    command = shard_command(NS, spec, {"collation": {"locale": "fr", "strength": 2}}, WIRE_8_0)
    assert command == {"shardCollection": "db.c", "key": {"r": 1}, "unique": True, "collation": {"locale": "simple"}}
    assert "collation" not in shard_command(NS, spec, {"collation": {"locale": "simple"}}, WIRE_8_0)


def test_an_index_only_the_target_shard_key_needs_is_no_difference() -> None:
    from replicator.checking.verify import schema_differences

    key_index = {"key": {"region": 1, "_id": 1}, "name": "region_1__id_1"}
    want = CollectionSpec(NS, "collection", {})
    found = CollectionSpec(NS, "collection", {}, (key_index,), shard=ShardSpec({"region": 1, "_id": 1}))
    assert schema_differences("db.c", want, found) == []
    unsharded = CollectionSpec(NS, "collection", {}, (key_index,))
    assert [d.kind for d in schema_differences("db.c", want, unsharded)] == ["index"]


def test_shard_keys_compare_in_order_and_by_value() -> None:
    assert same_key({"a": 1, "b": "hashed"}, {"a": 1.0, "b": "hashed"})
    assert not same_key({"a": 1, "b": 1}, {"b": 1, "a": 1})


def test_shard_target_rules_first_match_wins_and_bad_ones_are_one_line_errors() -> None:
    rules = ShardTargets.from_rules([r'shop\.orders={"region": 1, "_id": "hashed"}', r"shop\..*={}"])
    assert rules(Namespace("shop", "orders")) == {"region": 1, "_id": "hashed"}
    assert rules(Namespace("shop", "items")) == {}
    assert rules(Namespace("other", "orders")) is None
    for bad, says in [
        ("shop", "must look like REGEX=KEY"),
        ('(={"a": 1}', "is not a valid regular expression"),
        ('x={"a": 2}', 'must be 1 (a range) or "hashed"'),
        ('x={"a": "hashed", "b": "hashed"}', "at most one hashed"),
        ("x={a: 1}", "KEY is not valid Extended JSON"),
        ('x={"a": {"$numberDecimal": "x"}}', "KEY is not valid Extended JSON"),
    ]:
        with pytest.raises(ConfigError, match="--shard-target") as info:
            ShardTargets.from_rules([bad])
        assert says in str(info.value) and "\n" not in str(info.value)


def test_a_declared_key_wins_over_the_source_sharding_and_views_are_left_alone() -> None:
    coll = CollectionSpec(NS, "collection", {})
    view = CollectionSpec(Namespace("db", "v"), "view", {"viewOn": "c"})
    source = {NS: ShardSpec({"r": 1})}
    assert with_sharding([coll, view], source, ShardTargets())[0].shard == ShardSpec({"r": 1})
    declared = with_sharding([coll, view], source, ShardTargets.from_rules(['db\\..*={"k": 1}']))
    assert declared[0].shard == ShardSpec({"k": 1}, declared=True) and declared[1].shard is None


def test_a_target_user_without_clustermanager_is_refused_before_anything_is_written() -> None:
    from replicator.sinks.mongo.sharding import lacking
    from replicator.source.privileges import Grants, Privilege, grants_of

    hashed = CollectionSpec(NS, "collection", {}, shard=ShardSpec({"_id": "hashed"}))
    ranged = CollectionSpec(Namespace("db", "r"), "collection", {}, shard=ShardSpec({"r": 1}, split_points=({"r": 5},)))
    writer = Grants("app", (Privilege("db", "", frozenset({"insert", "find", "createCollection"})),))
    line = lacking(writer, [hashed])
    assert line == ("target: user app may not shard collections of db (enableSharding, shardCollection) "
                    "(grant clusterManager)")  # fmt: skip
    may_shard = Grants("app", (*writer.privileges, Privilege(None, "", frozenset({"enableSharding"}))))
    assert lacking(may_shard, [hashed]) is None  # a hashed key is not split
    assert "split db.r" in str(lacking(may_shard, [ranged]))
    assert lacking(None, [ranged]) is None  # a server that does not say
    reply = {"authInfo": {"authenticatedUsers": [{"user": "ops", "db": "admin"}],
                          "authenticatedUserRoles": [{"role": "clusterManager", "db": "admin"}]}}  # fmt: skip
    assert lacking(grants_of(reply), [hashed, ranged]) is None  # the built-in role, from its name alone
    leave = CollectionSpec(NS, "collection", {}, shard=ShardSpec({}, declared=True))
    assert lacking(writer, [leave]) is None  # '{}' shards nothing


def test_the_stand_in_answers_config_reads_as_the_server_would_filter_them() -> None:
    """The stand-in's own query matching (tests/support/mongos.py), for the filters mcdc sends."""
    from tests.support.mongos import matches

    entry = {"_id": "db.c", "key": {"r": 1}, "uuid": b"u", "timestamp": 1}
    assert matches(entry, {"_id": {"$in": ["db.a", "db.c"]}, "dropped": {"$ne": True}, "unsplittable": {"$ne": True}})
    assert not matches({**entry, "dropped": True}, {"dropped": {"$ne": True}})
    assert matches(entry, {"$or": [{"uuid": b"x"}, {"_id": "db.c"}]}) and not matches(entry, {"ns": "db.c"})
    with pytest.raises(ValueError, match="does not know \\$gt"):
        matches(entry, {"timestamp": {"$gt": 0}})


# ---- integration: mongos stand-ins in front of the test servers


@pytest.fixture
def source_mongos(source_uri: str) -> Iterator[MongosStandIn]:
    """The source server behind a mongos whose one shard is that server."""
    with mongos(source_uri) as stand_in:
        stand_in.shards = [{"_id": "shard0", "host": source_uri.split("://", 1)[1].split("/", 1)[0], "state": 1}]
        yield stand_in


@pytest.fixture
def target_mongos(target_uri: str) -> Iterator[MongosStandIn]:
    with mongos(target_uri, wire_version=WIRE_7_0) as stand_in:
        yield stand_in


def _sync(source: str, target: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "replicator.cli", "sync", "-s", source, "-t", target, "-c", str(tmp_path / "cp.json")]
    return subprocess.run([*args, "--no-progress", *extra], capture_output=True, text=True, timeout=180)


def _errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The run's error lines (one, for a refusal; the log lines before it say what it did)."""
    return [line for line in done.stderr.splitlines() if "error" in line.lower()]


def _seed(uri: str, count: int = 50, **create: Any) -> None:
    with pymongo.MongoClient(uri) as client:
        client.db.create_collection("c", **create)
        client.db.c.insert_many([{"_id": i, "region": ["EU", "US", "APAC"][i % 3], "n": i} for i in range(count)])


def _sharded_before_copied(stand_in: MongosStandIn, ns: str) -> dict[str, Any]:
    """The one shardCollection of ``ns``, checked to come before its first document write."""
    (shard,) = stand_in.commands("shardCollection", ns)
    first = stand_in.first_write(ns)
    assert first is not None and shard.seq < first.seq, (shard, first)
    return dict(shard.body)


@pytest.mark.integration
def test_a_range_sharded_source_is_sharded_and_split_on_the_target_before_the_copy(
    source_mongos: MongosStandIn, target_mongos: MongosStandIn, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 60)
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.create_index([("region", 1), ("n", 1)], unique=True, name="by_region")
    bounds = [{"region": "EU", "n": 0}, {"region": "US", "n": MinKey()}]
    source_mongos.shard_source("db.c", {"region": 1, "n": 1}, unique=True, bounds=bounds, by_uuid=False)
    target_mongos.wire_version = WIRE_5_0  # before 6.0: shardCollection needs enableSharding first
    done = _sync(source_mongos.uri, target_mongos.uri, tmp_path)
    assert done.returncode == 0, done.stderr
    shard = _sharded_before_copied(target_mongos, "db.c")
    assert shard["key"] == {"region": 1, "n": 1} and shard["unique"] is True
    assert "collation" not in shard and "numInitialChunks" not in shard
    enable = target_mongos.commands("enableSharding", "db")
    assert enable and enable[0].seq < target_mongos.commands("shardCollection")[0].seq
    splits = target_mongos.commands("split", "db.c")
    assert [dict(c.body)["middle"] for c in splits] == [{"region": "EU", "n": 0}]  # the MinKey bound is no value
    first = target_mongos.first_write("db.c")
    assert first is not None and all(c.seq < first.seq for c in splits)
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 60
        # the key's index is the source's own (built before shardCollection), kept by the index build
        assert client.db.c.index_information()["by_region"]["unique"] is True


@pytest.mark.integration
def test_a_hashed_source_key_is_pre_split_with_the_source_chunk_count_and_a_simple_collation(
    source_mongos: MongosStandIn, target_mongos: MongosStandIn, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 30, collation={"locale": "fr", "strength": 2})
    bounds = [{"_id": -(2**62)}, {"_id": 0}, {"_id": 2**62}]  # hashed values
    source_mongos.shard_source("db.c", {"_id": "hashed"}, bounds=bounds, collation={"locale": "fr", "strength": 2})
    done = _sync(source_mongos.uri, target_mongos.uri, tmp_path)
    assert done.returncode == 0, done.stderr
    shard = _sharded_before_copied(target_mongos, "db.c")
    assert shard["key"] == {"_id": "hashed"} and shard["numInitialChunks"] == 4
    assert shard["collation"] == {"locale": "simple"} and "unique" not in shard
    assert target_mongos.commands("split") == []
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 30


@pytest.mark.integration
def test_shard_target_shards_an_unsharded_source_and_its_key_index_survives_the_index_build(
    source_uri: str, target_mongos: MongosStandIn, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 40)
    with pymongo.MongoClient(source_uri) as client:
        client.db.create_collection("other")
        client.db.other.insert_one({"_id": 1})
    done = _sync(source_uri, target_mongos.uri, tmp_path, "--shard-target", r'db\.c={"region": 1, "_id": 1}')
    assert done.returncode == 0, done.stderr
    shard = _sharded_before_copied(target_mongos, "db.c")
    assert shard["key"] == {"region": 1, "_id": 1}
    assert target_mongos.commands("shardCollection", "db.other") == []  # an unsharded source, no rule: as it is
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 40
        keys = [dict(ix["key"]) for ix in client.db.c.index_information().values()]
        assert {"region": 1, "_id": 1} in keys  # shardCollection's index, not dropped as "not on the source"
    # verify knows that index for the target's own: the copy is identical
    args = [sys.executable, "-m", "replicator.cli", "verify", "-s", source_uri, "-t", target_mongos.uri]
    verified = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.integration
def test_shard_target_into_a_replica_set_target_is_refused(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    _seed(source_uri, 3)
    done = _sync(source_uri, target_uri, tmp_path, "--shard-target", r'db\.c={"_id": "hashed"}')
    assert done.returncode == 2
    (line,) = _errors(done)
    assert "is not a mongos" in line and "db.c" in line
    with pymongo.MongoClient(target_uri) as client:
        assert "c" not in client.db.list_collection_names()


@pytest.mark.integration
def test_a_sharded_source_into_an_existing_unsharded_target_is_refused_unless_said_otherwise(
    source_mongos: MongosStandIn, target_mongos: MongosStandIn, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 20)
    source_mongos.shard_source("db.c", {"region": 1})
    with pymongo.MongoClient(target_uri) as client:
        client.db.create_collection("c")  # there already, empty and unsharded
    done = _sync(source_mongos.uri, target_mongos.uri, tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = _errors(done)
    assert "target collection db.c exists unsharded" in line
    assert "--drop-target" in line and "--shard-target" in line
    assert target_mongos.commands("shardCollection") == [] and target_mongos.first_write("db.c") is None

    # '{}' says: write into it as it is
    done = _sync(source_mongos.uri, target_mongos.uri, tmp_path / "b", "--shard-target", r"db\.c={}")
    assert done.returncode == 0, done.stderr
    assert target_mongos.commands("shardCollection") == []
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 20


@pytest.mark.integration
def test_a_target_sharded_on_another_key_is_refused_and_drop_target_makes_it_again(
    source_mongos: MongosStandIn, target_mongos: MongosStandIn, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 20)
    source_mongos.shard_source("db.c", {"region": 1})
    with pymongo.MongoClient(target_mongos.uri) as client:
        client.db.create_collection("c")
        client.admin.command({"shardCollection": "db.c", "key": {"n": 1}})
    done = _sync(source_mongos.uri, target_mongos.uri, tmp_path)
    assert done.returncode == 2
    (line,) = _errors(done)
    assert 'target collection db.c is sharded on {"n": 1}, not on {"region": 1}' in line
    assert target_mongos.first_write("db.c") is None

    target_mongos.collections.clear()  # what a drop does on a mongos (the stand-in passes the drop on)
    done = _sync(source_mongos.uri, target_mongos.uri, tmp_path / "b", "--drop-target")
    assert done.returncode == 0, done.stderr
    assert [dict(c.body)["key"] for c in target_mongos.commands("shardCollection")][-1] == {"region": 1}


@pytest.mark.integration
def test_a_run_killed_between_sharding_and_copying_converges_when_run_again(
    source_uri: str, target_mongos: MongosStandIn, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 50)
    rule = ("--shard-target", r'db\.c={"_id": "hashed"}')
    target_mongos.hold_writes()  # the copy waits...
    args = [sys.executable, "-m", "replicator.cli", "sync", "-s", source_uri, "-t", target_mongos.uri]
    proc = subprocess.Popen([*args, "-c", str(tmp_path / "cp.json"), "--no-progress", *rule],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert target_mongos.sharded_event.wait(60), proc.stderr
        deadline = time.monotonic() + 60
        while target_mongos.first_write("db.c") is None:  # ...until mcdc tries to copy: then it dies
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 0  # sharded, nothing copied
    target_mongos.release_writes()
    done = _sync(source_uri, target_mongos.uri, tmp_path, *rule)
    assert done.returncode == 0, done.stderr
    assert len(target_mongos.commands("shardCollection", "db.c")) == 1  # found sharded on that key: left so
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 50


@pytest.mark.integration
def test_a_collection_copied_again_during_the_replay_is_sharded_before_its_copy(
    source_uri: str, target_mongos: MongosStandIn, target_uri: str, tmp_path: Path
) -> None:
    """A selection widened on a running migration copies the new collection during the replay (resync):
    on a sharded target it is sharded before that copy too."""
    _seed(source_uri, 10)
    with pymongo.MongoClient(source_uri) as client:
        client.db.create_collection("a")
        client.db.a.insert_one({"_id": 1})
    done = _sync(source_uri, target_mongos.uri, tmp_path, "--include", r"db\.a")
    assert done.returncode == 0, done.stderr
    assert target_mongos.commands("shardCollection") == []
    rule = r'db\.c={"n": 1}'
    done = _sync(source_uri, target_mongos.uri, tmp_path, "--include", r"db\.(a|c)", "--shard-target", rule)
    assert done.returncode == 0, done.stderr
    assert _sharded_before_copied(target_mongos, "db.c")["key"] == {"n": 1}
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 10


@pytest.mark.integration
def test_a_target_user_who_may_not_shard_is_told_the_role_in_one_line(
    source_uri: str, target_mongos: MongosStandIn, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 5)
    target_mongos.unauthorized = {"shardcollection"}
    done = _sync(source_uri, target_mongos.uri, tmp_path, "--shard-target", r'db\.c={"_id": "hashed"}')
    assert done.returncode == 2
    (line,) = _errors(done)
    assert line.startswith("mcdc: error: target:") and "shardCollection" in line and "clusterManager" in line
    assert target_mongos.first_write("db.c") is None


@pytest.mark.integration
def test_shard_target_shards_an_existing_empty_unsharded_target_collection(
    source_mongos: MongosStandIn, target_mongos: MongosStandIn, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _seed(source_uri, 20)
    source_mongos.shard_source("db.c", {"region": 1})
    with pymongo.MongoClient(target_uri) as client:
        client.db.create_collection("c")
    done = _sync(source_mongos.uri, target_mongos.uri, tmp_path, "--shard-target", r'db\.c={"n": 1}')
    assert done.returncode == 0, done.stderr
    assert _sharded_before_copied(target_mongos, "db.c")["key"] == {"n": 1}  # the declared key, not the source's
    with pymongo.MongoClient(target_uri) as client:
        assert client.db.c.count_documents({}) == 20


@pytest.mark.integration
def test_a_tail_without_snapshot_shards_the_target_before_its_first_replayed_write(
    source_uri: str, target_mongos: MongosStandIn, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.db.create_collection("c")
    cp = tmp_path / "cp.json"
    args = [sys.executable, "-m", "replicator.cli", "tail", "-s", source_uri, "-t", target_mongos.uri, "-c", str(cp)]
    args += ["--snapshot", "never", "--no-progress", "--shard-target", r'db\.c={"_id": "hashed"}']
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not cp.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        with pymongo.MongoClient(source_uri) as client:
            client.db.c.insert_many([{"_id": i} for i in range(10)])
        with pymongo.MongoClient(target_uri) as client:
            while client.db.c.count_documents({}) < 10:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _sharded_before_copied(target_mongos, "db.c")["key"] == {"_id": "hashed"}


@pytest.mark.integration
def test_on_an_auth_target_a_user_who_may_not_shard_is_refused_before_any_write(
    source_uri: str, tmp_path: Path
) -> None:
    """Against the test server with --auth behind the stand-in: the users-and-roles check at start covers
    sharding; no credential appears in any output. (The test server has no clusterManager role: the run that
    shards is root's; that clusterManager grants it is unit-tested above.)"""
    from tests.support.secure import PASSWORD, admin_client, start_with_users

    _seed(source_uri, 30)
    rw = {"role": "readWrite", "db": "db"}
    target = start_with_users(tmp_path / "auth", {"tgt_rw": [rw]})
    try:
        with mongos(target.uri, admin_uri=target.user_uri("admin")) as stand_in:

            def through(user: str) -> str:
                return target.user_uri(user).replace(f":{target.port}/", f":{stand_in.port}/")

            rule = ("--shard-target", r'db\.c={"_id": "hashed"}')
            refused = _sync(source_uri, through("tgt_rw"), tmp_path / "a", *rule)
            assert refused.returncode == 2, refused.stderr
            (line,) = _errors(refused)
            assert line == ("mcdc: error: target: user tgt_rw may not shard collections of db (enableSharding, "
                            "shardCollection) (grant clusterManager)")  # fmt: skip
            assert stand_in.first_write("db.c") is None and stand_in.commands("create") == []
            done = _sync(source_uri, through("admin"), tmp_path / "b", *rule)
            assert done.returncode == 0, done.stderr
            assert _sharded_before_copied(stand_in, "db.c")["key"] == {"_id": "hashed"}
            for output in (refused.stdout, refused.stderr, done.stdout, done.stderr):
                assert PASSWORD not in output
        with admin_client(target) as client:
            assert client.db.c.count_documents({}) == 30
    finally:
        target.stop()
