"""--filter against the real servers: after writes that move documents into and out of the filter (updates
that flip the filtered field, to arrays, null, another type or away; replaces; deletes; inserts on both
sides; updateMany; transactions), with kill -9 of mcdc in between, the target holds exactly what
``find(QUERY)`` finds on the source: a MongoDB target, Kafka topics rebuilt by a consumer, Delta tables,
and both engines. ``verify`` compares against the filtered source; a query mcdc cannot decide as the
server would is refused in one line."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import json_util

from tests.support.compare import assert_identical
from tests.support.kafka import KafkaBroker
from tests.support.lake import duplicate_changes, read_table, source_bytes, state_bytes
from tests.support.rebuild import assert_same, data_records, decode, rebuilt_from_topics, server_docs
from tests.support.servers import Clients
from tests.support.spark import quick_jvm_conf

pytestmark = pytest.mark.integration

QUERY: dict[str, Any] = {"region": {"$in": ["EU", "UK"]}}
FILTER = 'flt\\.orders={"region": {"$in": ["EU", "UK"]}}'
#: values of the filtered field that its semantics turn on: an array holding a match or not, null, a number
REGIONS: tuple[Any, ...] = ("EU", "US", "UK", ["US", "EU"], ["US"], None, 7)
IDS = 40


def where(ns: str) -> dict[str, Any] | None:
    """The source documents a filtered target holds of ``db.coll``."""
    return QUERY if ns == "flt.orders" else None


def only_flt(ns: str) -> bool:
    return ns.startswith("flt.")


def _mcdc(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _spawn(
    command: str, source: str, target: str, cp: Path, *extra: str, stderr: Any = subprocess.PIPE
) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "replicator.cli", command, "-s", source, "-t", target, "-c", str(cp)]
    args += ["--include", "flt\\..*", "--filter", FILTER, "--no-progress", "--partition-docs", "10", "--split"]
    args += ["always", "--retry-initial-delay", "0.2", "--retry-max-delay", "1", *extra]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr, text=True)


def seed_source(uri: str) -> None:
    """Documents on both sides of the filter, in two collections (``other`` has no filter)."""
    with pymongo.MongoClient(uri) as client:
        client.drop_database("flt")
        rng = random.Random(0)
        client.flt.orders.insert_many([{"_id": i, "region": rng.choice(REGIONS), "n": i} for i in range(IDS)])
        client.flt.other.insert_many([{"_id": i, "region": "US"} for i in range(10)])


def move_across(uri: str, rounds: int, seed: int) -> None:
    """``rounds`` writes that move ``flt.orders`` documents into and out of the filter (and others beside)."""
    rng = random.Random(seed)
    with pymongo.MongoClient(uri) as client:
        orders, other = client.flt.orders, client.flt.other
        for r in range(rounds):
            i, region, kind = rng.randrange(IDS), rng.choice(REGIONS), rng.randrange(9)
            if kind == 0:
                orders.update_one({"_id": i}, {"$setOnInsert": {"n": r, "region": region}}, upsert=True)
            elif kind in (1, 2):
                orders.update_one({"_id": i}, {"$set": {"region": region}})
            elif kind == 3:
                orders.update_one({"_id": i}, {"$unset": {"region": ""}})
            elif kind == 4:
                orders.update_one({"_id": i}, {"$inc": {"n": 1}})  # stays on its side
            elif kind == 5:
                orders.replace_one({"_id": i}, {"r": r, "region": region}, upsert=True)
            elif kind == 6:
                orders.delete_one({"_id": i})
            elif kind == 7:
                orders.update_many({"_id": {"$lt": 8}}, {"$set": {"region": region}})
            else:
                with client.start_session() as s, s.start_transaction():
                    orders.update_one({"_id": i}, {"$set": {"region": region}}, session=s)
                    other.update_one({"_id": i % 10}, {"$inc": {"t": 1}}, upsert=True, session=s)
                    orders.insert_one({"_id": f"t{seed}-{r}", "region": rng.choice(REGIONS)}, session=s)


def _wait_for(check: Callable[[], None], proc: subprocess.Popen[str] | None, timeout: float = 120) -> None:
    """Until ``check`` passes (the last failure is raised after ``timeout``); fails at once if mcdc exited."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"mcdc exited with {proc.returncode}: {proc.communicate()[1][-3000:]}")
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def _saved(cp: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cp.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint saved"
        time.sleep(0.05)


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return err


def _tail_with_a_kill(source: str, target: str, cp: Path, *extra: str) -> subprocess.Popen[str]:
    """A filtered tail under writes, kill -9 mid-way, writes while it is down, a new tail, more writes."""
    seed_source(source)
    proc = _spawn("tail", source, target, cp, *extra)
    _saved(cp, proc)
    move_across(source, 120, 1)
    time.sleep(random.Random(1).uniform(0.2, 1.5))
    _kill(proc)
    move_across(source, 60, 2)
    proc = _spawn("tail", source, target, cp, *extra)
    move_across(source, 120, 3)
    return proc


def test_a_mongodb_target_holds_exactly_the_matches_through_kill_9_and_verify_compares_them(
    source_uri: str, target_uri: str, clients: Clients, tmp_path: Path
) -> None:
    cp = tmp_path / "cp.json"
    proc = _tail_with_a_kill(source_uri, target_uri, cp, "--verify", "--verify-interval", "0")
    _wait_for(lambda: assert_identical(source_uri, target_uri, only=only_flt, where=where), proc)
    err = _stop(proc)
    assert "(confirmed by a re-check)" not in err  # the embedded verifier compares with the filtered source
    matches = clients.source.flt.orders.count_documents(QUERY)
    assert 0 < matches < clients.source.flt.orders.count_documents({})  # both sides of the filter hold some
    assert clients.target.flt.other.count_documents({}) == clients.source.flt.other.count_documents({})

    # a checkpoint made with one filter does not go on under another
    other = _mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", "flt\\..*",
                  "--filter", 'flt\\.orders={"region": "EU"}', "--no-progress")  # fmt: skip
    assert other.returncode == 2 and "--filter" in other.stderr and len(other.stderr.strip().splitlines()) == 1

    common = ("-s", source_uri, "-t", target_uri, "--include", "flt\\..*", "--json")
    cut = _mcdc("cutover", *common, "-c", str(cp), "--filter", FILTER, "--reverse-checkpoint", str(tmp_path / "b"))
    assert cut.returncode == 0, cut.stdout + cut.stderr  # its proof is a verify against the filtered source
    same = _mcdc("verify", *common, "--filter", FILTER)
    assert same.returncode == 0, same.stdout + same.stderr
    unfiltered = _mcdc("verify", *common)  # the whole source is not what the target holds
    assert unfiltered.returncode == 1 and "missing" in unfiltered.stdout
    clients.target.flt.orders.insert_one({"_id": "stray", "region": "US"})
    stray = _mcdc("verify", *common, "--filter", FILTER)
    assert stray.returncode == 1 and "stray" in stray.stdout


async def test_kafka_topics_rebuild_the_matches_and_carry_a_delete_for_a_document_that_stops_matching(
    source_uri: str, kafka: KafkaBroker, tmp_path: Path
) -> None:
    target = f"kafka://{kafka.bootstrap}"
    proc = _tail_with_a_kill(source_uri, target, tmp_path / "cp.json", "--topic-prefix", "flt")
    with pymongo.MongoClient(source_uri) as client:
        client.flt.orders.insert_one({"_id": "leaves", "region": "EU"})
        client.flt.orders.update_one({"_id": "leaves"}, {"$set": {"region": "US"}})
        client.flt.orders.insert_one({"_id": "enters", "region": "US"})  # no record: it does not match
        client.flt.orders.update_one({"_id": "enters"}, {"$set": {"region": ["UK"], "x": 1}})

    def rebuilt() -> None:
        got = asyncio.run(rebuilt_from_topics(kafka.bootstrap, "flt"))
        assert_same(got, server_docs(source_uri, ["flt"], where=where))

    await asyncio.to_thread(_wait_for, rebuilt, proc)
    _stop(proc)
    records = decode(await data_records(kafka.bootstrap, "flt"))
    of = {
        doc_id: [(key, value) for key, value in records if key is not None and json.loads(key["id"]) == doc_id]
        for doc_id in ("leaves", "enters")
    }
    ops = [value["op"] if value is not None else None for _, value in of["leaves"]]
    assert ops == ["c", "d", None], ops  # the converted delete, then its tombstone
    delete = of["leaves"][1][1]
    assert delete["before"] is None and delete["after"] is None and delete.get("updateDescription") is None
    assert delete["source"]["collection"] == "orders" and delete["source"]["db"] == "flt"
    assert delete["ts_ms"] > 0 and delete["source"]["ts_ms"] > 0
    entered = [value for _, value in of["enters"] if value is not None]
    assert [v["op"] for v in entered] == ["u"]  # written whole: after, no delta
    assert json_util.loads(entered[0]["after"]) == {"_id": "enters", "region": ["UK"], "x": 1}
    assert entered[0].get("updateDescription") is None


@pytest.mark.parametrize("kind", ["delta"])
def test_delta_state_tables_hold_the_matches_after_kill_9_and_catch_up(
    kind: str, source_uri: str, tmp_path: Path
) -> None:
    root, cp = tmp_path / "lake", tmp_path / "cp.json"
    target = f"{kind}:{root}"
    proc = _tail_with_a_kill(source_uri, target, cp, "--max-batch-size", "7")
    time.sleep(1.0)
    _kill(proc)
    done = _mcdc("catch-up", "-s", source_uri, "-t", target, "-c", str(cp), "--include", "flt\\..*",
                 "--filter", FILTER, "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    for coll in ("orders", "other"):
        expected = source_bytes(source_uri, "flt", coll, where(f"flt.{coll}"))
        assert state_bytes(kind, root, "flt", coll) == expected, coll
        changes = read_table(kind, root, "changes", "flt", coll)
        assert changes is not None and duplicate_changes(changes) == [], coll
    orders = read_table(kind, root, "changes", "flt", "orders")
    assert orders is not None and "d" in orders["op"].to_pylist()


def test_the_spark_engine_copies_and_replays_the_matches_through_kill_9(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp = tmp_path / "cp.json"
    seed_source(source_uri)
    spark = ("--engine", "spark", "--spark-master", "local[2]", "--replay-partitions", "2", *quick_jvm_conf())
    first = _spawn("sync", source_uri, target_uri, cp, *spark)
    move_across(source_uri, 80, 1)  # during the snapshot: its window replays them
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert_identical(source_uri, target_uri, only=only_flt, where=where)
    move_across(source_uri, 100, 2)
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        killed = _spawn("catch-up", source_uri, target_uri, cp, *spark, "--spark-start-after", "0", stderr=out)
    deadline = time.monotonic() + 300
    while killed.poll() is None and "starting Spark" not in log.read_text():  # killed as its session comes up
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(random.Random(2).uniform(0.0, 3.0))  # a random moment into the run
    _kill(killed)
    move_across(source_uri, 60, 3)
    last = _spawn("catch-up", source_uri, target_uri, cp, *spark)
    _, err = last.communicate(timeout=600)
    assert last.returncode == 0, err[-3000:]
    assert_identical(source_uri, target_uri, only=only_flt, where=where)


def test_an_operator_mcdc_cannot_decide_as_the_server_does_is_refused_in_one_line(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    for rule, named in (('flt\\.orders={"$where": "this.a == 1"}', "$where"), ("flt\\.orders={oops", "Extended JSON")):
        done = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--filter", rule)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mcdc: error: --filter") and named in lines[0], lines
        assert not (tmp_path / "cp.json").exists()


def test_a_filtered_sync_copies_and_counts_the_matches_only(
    source_uri: str, target_uri: str, clients: Clients, tmp_path: Path
) -> None:
    """The snapshot reads each partition with the query: the summary counts the matches, and the copy is
    what find(QUERY) finds (ranges split by _id, each ANDed with the query)."""
    seed_source(source_uri)
    done = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--include",
                 "flt\\..*", "--filter", FILTER, "--partition-docs", "7", "--split", "always", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    matches = clients.source.flt.orders.count_documents(QUERY)
    assert 0 < matches < IDS
    assert json.loads(done.stdout)["documents"] == matches + clients.source.flt.other.count_documents({})
    assert_identical(source_uri, target_uri, only=only_flt, where=where)


def test_a_filter_comparing_strings_on_a_collection_with_another_collation_is_refused(
    source_uri: str, target_uri: str, clients: Clients, tmp_path: Path
) -> None:
    """find() on a collection whose default collation is not the simple one compares strings by that
    collation ("eu" equals "EU" at strength 2); the stream's matcher compares bytes, so such a filter would
    let the target drift from find(QUERY): refused in one line naming the source side, before any write.
    The same filter on a number field is taken, and the copy is what find() finds."""
    clients.source.drop_database("flt")
    clients.source.flt.create_collection("orders", collation={"locale": "en", "strength": 2})
    clients.source.flt.orders.insert_many([{"_id": 1, "region": "eu", "n": 1}, {"_id": 2, "region": "US", "n": 2}])
    cp = tmp_path / "cp.json"
    done = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", "flt\\..*",
                 "--filter", FILTER)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcdc: error: source: --filter"), lines
    assert "flt.orders" in lines[0] and "collation" in lines[0] and "en" in lines[0], lines
    assert "flt" not in clients.target.list_database_names()
    by_number = 'flt\\.orders={"n": {"$gte": 2}}'
    done = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", "flt\\..*",
                 "--filter", by_number)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [d["_id"] for d in clients.target.flt.orders.find()] == [2]


@pytest.mark.integration
@pytest.mark.parametrize("command", ["catch-up", "tail"])
def test_an_update_followed_at_once_by_a_rename_under_a_filter_covering_both_names_stays_exact(
    source_uri: str, target_uri: str, tmp_path: Path, command: str
) -> None:
    """The update's lookup comes back empty (its collection has another name by the time it is read), which a
    filter takes for a document that stopped matching: the target lost it under the new name (issue 48)."""
    flt = 'shop\\.orders.*={"total": {"$gte": 100}}'
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "total": i * 10} for i in range(30)])
    run = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", "shop\\..*", "--filter", flt)
    run = (*run, "--no-progress")
    assert _mcdc("sync", *run).returncode == 0

    def writes() -> None:
        with pymongo.MongoClient(source_uri) as client:
            client.shop.orders.update_one({"_id": 12}, {"$set": {"note": "paid"}})
            client.shop.orders.rename("orders_2025")
            client.shop.orders_2025.update_one({"_id": 13}, {"$set": {"note": "later"}})

    if command == "catch-up":  # its stream opens after the rename: inside its DDL window
        writes()
        assert _mcdc("catch-up", *run).returncode == 0
    else:  # the tail's stream is open before the writes: the rename is replayed as it comes
        saved = cp.stat().st_mtime_ns
        with subprocess.Popen([sys.executable, "-m", "replicator.cli", "tail", *run], stderr=subprocess.PIPE) as tail:
            deadline = time.monotonic() + 120
            while cp.stat().st_mtime_ns == saved:  # replaying (a tail saves its position as it starts)
                assert time.monotonic() < deadline and tail.poll() is None, "the tail did not start"
                time.sleep(0.1)
            writes()
            with pymongo.MongoClient(target_uri) as client:
                while client.shop.orders_2025.find_one({"_id": 13, "note": "later"}) is None:
                    assert time.monotonic() < deadline and tail.poll() is None, "the tail did not converge"
                    time.sleep(0.2)
            tail.send_signal(signal.SIGTERM)
            assert tail.wait(60) == 0
    with pymongo.MongoClient(source_uri) as src, pymongo.MongoClient(target_uri) as dst:
        want = list(src.shop.orders_2025.find({"total": {"$gte": 100}}).sort("_id"))
        assert list(dst.shop.orders_2025.find().sort("_id")) == want
        assert "orders" not in dst.shop.list_collection_names()
    checked = _mcdc("verify", *run[:6], "--include", "shop\\..*", "--filter", flt)
    assert checked.returncode == 0, checked.stdout
