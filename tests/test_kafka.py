"""--target kafka://: consume everything back, rebuild every collection in partition order, compare exactly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pymongo
import pytest
from aiokafka.partitioner import DefaultPartitioner

from tests.support.corpus import load_corpus
from tests.support.kafka import KafkaBroker, Record, consume_all, create_topic, list_topics
from tests.support.rebuild import (
    assert_same,
    data_records,
    decode,
    rebuild,
    rebuilt_from_topics,
    server_docs,
    unordered,
)
from tests.support.workload import random_workload

pytestmark = pytest.mark.integration


def _mcdc(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _tail(
    source: str, bootstrap: str, cp: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "replicator.cli", "tail", "-s", source, "-t", f"kafka://{bootstrap}", "-c", str(cp)]
    return subprocess.Popen(
        [*args, "--no-progress", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MCDC_RETRY_INITIAL_DELAY": "0.2", **(env or {})},
    )


async def _wait_rebuilt_equals(
    bootstrap: str,
    source: str,
    proc: subprocess.Popen[str] | None = None,
    timeout: float = 90,
    skip: tuple[str, ...] = (),
    ordered: bool = True,
) -> None:
    """Wait until the collections rebuilt from the topics equal the source (less the ``skip`` _ids).
    ``ordered=False``: field order is not compared (rebuilt from update deltas alone)."""
    deadline = time.monotonic() + timeout
    expected = {ns: {k: v for k, v in docs.items() if k not in skip} for ns, docs in server_docs(source).items()}
    if not ordered:
        expected = unordered(expected)
    while True:
        if proc is not None and proc.poll() is not None:
            err = proc.communicate()[1]
            raise AssertionError(f"mcdc exited with {proc.returncode}: {err[-3000:]}")
        got = await rebuilt_from_topics(bootstrap, ordered=ordered)
        if got == expected:
            return
        if time.monotonic() > deadline:
            assert_same(got, expected)  # names the differences
            raise AssertionError("rebuilt state differs")
        await asyncio.sleep(0.5)


async def _wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait until ``path`` exists, failing early if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"mcdc exited with {proc.returncode}: {proc.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} not written within {timeout} s")
        await asyncio.sleep(0.05)


def _workload(uri: str, rounds: int, seed: int) -> None:
    """The random workload without DDL: the consumers rebuild collections from the data topics alone, which
    cannot follow a rename or a drop."""
    random_workload(uri, rounds, seed, ids=150, ddl=False)


def _stop(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def _check_records(records: list[Record]) -> dict[str, int]:
    """Every data record has the documented key and envelope; every delete is followed by its tombstone."""
    by_partition: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for r in records:
        by_partition[(r.topic, r.partition)].append(r)
    counts: dict[str, int] = defaultdict(int)
    for (topic, _), recs in by_partition.items():
        for i, r in enumerate(recs):
            assert r.key is not None
            key = json.loads(r.key)
            assert list(key) == ["id"] and isinstance(key["id"], str), key
            if r.value is None:
                counts["tombstone"] += 1
                before = json.loads(recs[i - 1].value or b"null") if i else None
                assert before is not None and before["op"] == "d" and recs[i - 1].key == r.key, (
                    f"stray tombstone in {topic}"
                )
                continue
            value = json.loads(r.value)
            assert set(value) == {"before", "after", "updateDescription", "source", "op", "ts_ms", "transaction"}
            assert value["op"] in ("r", "c", "u", "d")
            source = value["source"]
            assert source["connector"] == "mongodb" and source["name"] == "mcdc"
            assert topic == f"mcdc.{source['db']}.{source['collection']}"
            counts[value["op"]] += 1
            if value["op"] == "d":
                assert i + 1 < len(recs) and recs[i + 1].value is None and recs[i + 1].key == r.key, "no tombstone"
            if value["op"] in ("r", "c"):
                after = json.loads(value["after"])
                assert json.dumps(after["_id"], separators=(",", ":")) == key["id"]  # the key is the _id
    return counts


async def test_corpus_and_live_workload_with_transactions_rebuild_exactly(
    source_uri: str, kafka: KafkaBroker, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_corpus(client, mixed_count=500)
    for coll in ("a", "b"):  # several partitions: order must hold per key, not per topic
        await create_topic(kafka.bootstrap, f"mcdc.work.{coll}", 3)
    # the corpus's 16 MB document makes a ~20 MB record, over Kafka's (and the test broker's) 1 MB limit
    cp = tmp_path / "cp.json"
    tail = _tail(source_uri, kafka.bootstrap, cp, "--tx-metadata", "--oversize", "skip")
    try:
        # the checkpoint is first saved once the stream position is captured, before the copy: writes made
        # after it reach Kafka as change events (and may still overlap the copy), not only as snapshot reads
        await _wait_for_file(cp, tail)
        await asyncio.to_thread(_workload, source_uri, 400, 1)
        await _wait_rebuilt_equals(kafka.bootstrap, source_uri, tail, skip=('"big"',))
    finally:
        code, err = _stop(tail)
    assert code == 0, err
    assert 'skipped the record for mcdc.corpus.types with key {"id":"\\"big\\""}' in err
    records = await data_records(kafka.bootstrap)
    counts = _check_records(records)
    assert counts["r"] > 500 and counts["u"] and counts["d"] and counts["tombstone"] == counts["d"]
    assert {r.partition for r in records if r.topic == "mcdc.work.a"} == {0, 1, 2}
    kafka_default = DefaultPartitioner()  # the partition any Kafka producer would pick for the key
    assert all(
        r.partition == kafka_default(r.key, [0, 1, 2], [0, 1, 2])
        for r in records
        if r.topic in ("mcdc.work.a", "mcdc.work.b")
    )
    # transaction metadata: BEGIN ... END around each transaction, END counting its data records
    tx = [json.loads(r.value) for r in await consume_all(kafka.bootstrap, ["mcdc.transaction"]) if r.value]
    ends = {t["id"]: t for t in tx if t["status"] == "END"}
    assert ends and {t["id"] for t in tx if t["status"] == "BEGIN"} == set(ends)
    in_tx: dict[str, int] = defaultdict(int)
    for _, value in decode(records):
        if value is not None and value["transaction"] is not None:
            in_tx[value["transaction"]["id"]] += 1
            assert value["source"]["lsid"] and value["source"]["txnNumber"] is not None
    assert {k: e["event_count"] for k, e in ends.items()} == dict(in_tx)


async def test_broker_restart_mid_stream_loses_nothing(source_uri: str, kafka: KafkaBroker, tmp_path: Path) -> None:
    if kafka.external:
        pytest.skip("restarts the broker")
    # no updateLookup: consumers rebuild updates from updateDescription alone, which gives every field and
    # value but cannot know where the server put a newly added field: compared without field order
    tail = _tail(source_uri, kafka.bootstrap, tmp_path / "cp.json", env={"MCDC_FULL_DOCUMENT": "default"})
    try:
        await asyncio.to_thread(_workload, source_uri, 150, 2)
        await _wait_rebuilt_equals(kafka.bootstrap, source_uri, tail, ordered=False)  # streaming, producer connected
        kafka.stop()
        outage = asyncio.create_task(asyncio.to_thread(_workload, source_uri, 150, 3))
        await asyncio.sleep(3)
        kafka.start()
        await outage
        await asyncio.to_thread(_workload, source_uri, 100, 4)
        await _wait_rebuilt_equals(kafka.bootstrap, source_uri, tail, ordered=False)
    finally:
        code, err = _stop(tail)
    assert code == 0, err
    counts = _check_records(await data_records(kafka.bootstrap))
    assert counts["u"] > 0


async def test_sync_legacy_envelope_with_schemas_and_ddl_topic(
    source_uri: str, kafka: KafkaBroker, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "v": i, "tags": ["x", "y", "z"]} for i in range(50)])
        client.shop.orders.insert_one({"_id": "wide", "pad": "x" * 600_000})  # a record over one 256 KB batch
    cp = str(tmp_path / "cp.json")
    flags = ("--envelope", "debezium-legacy", "--schemas", "--topic-prefix", "legacy")
    first = _mcdc("sync", "-s", source_uri, "-t", f"kafka://{kafka.bootstrap}", "-c", cp, *flags)
    assert first.returncode == 0, first.stderr
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.update_one({"_id": 1}, {"$set": {"v": "one"}, "$unset": {"tags": ""}})
        client.shop.orders.delete_one({"_id": 2})
        client.shop.orders.replace_one({"_id": 3}, {"replaced": True})
        client.shop.orders.create_index("v")
        client.shop.scratch.insert_one({"_id": 1})
        client.shop.scratch.drop()
    second = _mcdc(
        "catch-up",
        "-s",
        source_uri,
        "-t",
        f"kafka://{kafka.bootstrap}",
        "-c",
        cp,
        *flags,
        env={"MCDC_FULL_DOCUMENT": "default"},
    )
    assert second.returncode == 0, second.stderr
    records = await consume_all(kafka.bootstrap, ["legacy.shop.orders", "legacy.shop.scratch"])
    pairs = decode(records)
    for key, value in pairs:
        assert key is not None and key["schema"]["name"].endswith(".Key") and "id" in key["payload"]
        if value is not None:
            assert value["schema"]["name"] in ("legacy.shop.orders.Envelope", "legacy.shop.scratch.Envelope")
            assert {f["field"] for f in value["schema"]["fields"]} == set(value["payload"])
    update = next(
        v["payload"]
        for _, v in pairs
        if v is not None and v["payload"]["op"] == "u" and v["payload"]["patch"] and "$set" in v["payload"]["patch"]
    )
    assert json.loads(update["patch"]) == {"$set": {"v": "one"}, "$unset": {"tags": True}}
    assert rebuild(pairs).get("shop.orders") == server_docs(source_uri)["shop.orders"]
    ddl = [json.loads(r.value)["payload"] for r in await consume_all(kafka.bootstrap, ["legacy.ddl"]) if r.value]
    ops = {(d["op"], d["collection"]) for d in ddl}
    assert ("drop", "scratch") in ops and ("createIndexes", "orders") in ops


async def test_heartbeats_routes_and_sanitized_names(source_uri: str, kafka: KafkaBroker, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client["my-db"]["orders_2024"].insert_one({"_id": 1})
        client["my-db"]["orders_2025"].insert_one({"_id": 2})
        client["my-db"]["9lives"].insert_one({"_id": 3})
    tail = _tail(
        source_uri, kafka.bootstrap, tmp_path / "cp.json",
        "--sanitize-names", "--topic-route", r"my-db\.orders_\d+=all.orders", "--heartbeat-interval", "0.2",
        "--kafka-opt", "compression.type=zstd",  # records compressed, still read back
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            topics = await list_topics(kafka.bootstrap)
            if {"all.orders", "mcdc.my_db._9lives", "__debezium-heartbeat.mcdc"} <= topics:
                break
            await asyncio.sleep(0.3)
        await asyncio.sleep(1)
    finally:
        code, err = _stop(tail)
    assert code == 0, err
    assert {"all.orders", "mcdc.my_db._9lives", "__debezium-heartbeat.mcdc"} <= await list_topics(kafka.bootstrap)
    orders = await consume_all(kafka.bootstrap, ["all.orders"])
    assert sorted(json.loads(r.value)["source"]["collection"] for r in orders if r.value) == [
        "orders_2024",
        "orders_2025",
    ]
    beats = await consume_all(kafka.bootstrap, ["__debezium-heartbeat.mcdc"])
    assert beats and all(json.loads(b.key or b"") == {"serverName": "mcdc"} for b in beats)


def _no_repr(stderr: str) -> None:
    """No Python repr of an aiokafka error, an address tuple or a class in what the user reads."""
    for marker in ("KafkaConnectionError", "Error(", "AddressFamily", "('127.0.0.1'", "<class", "Traceback"):
        assert marker not in stderr, f"{marker} in {stderr[-3000:]}"


def test_unreachable_broker_is_a_one_line_error(source_uri: str, tmp_path: Path) -> None:
    from tests.support.servers import free_port

    port = free_port()
    out = _mcdc(
        "sync", "-s", source_uri, "-t", f"kafka://127.0.0.1:{port}", "-c", str(tmp_path / "cp"), "--max-retries", "1",
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 75  # an outage: try again later
    _no_repr(out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    unreachable = f"Kafka kafka://127.0.0.1:{port} is unreachable: could not connect to the broker; check that"
    assert lines[-1].startswith("mcdc: error: gave up after 1 retries (--max-retries 1): " + unreachable), lines
    assert (
        sum("waiting for the target" in line for line in lines) == 1
    )  # sync retries the start too, under --max-retries


async def test_tail_waits_for_a_broker_that_is_not_up_yet(source_uri: str, kafka: KafkaBroker, tmp_path: Path) -> None:
    if kafka.external:
        pytest.skip("stops the broker")
    with pymongo.MongoClient(source_uri) as client:
        client.late.c.insert_many([{"_id": i} for i in range(5)])
    kafka.stop()
    tail = _tail(source_uri, kafka.bootstrap, tmp_path / "cp.json", "--max-retries", "-1")
    try:
        await asyncio.sleep(3)  # several attempts, each refused
        assert tail.poll() is None, tail.communicate()[1][-3000:]
        kafka.start()
        deadline = time.monotonic() + 60
        while len(await consume_all(kafka.bootstrap, ["mcdc.late.c"])) < 5:
            assert tail.poll() is None and time.monotonic() < deadline, "tail did not deliver once the broker was up"
            await asyncio.sleep(0.3)
    finally:
        code, err = _stop(tail)
    assert code == 0, err
    assert f"Kafka kafka://{kafka.bootstrap} is unreachable: could not connect to the broker" in err
    waiting = [line for line in err.splitlines() if "waiting for the target" in line]  # said once, not per attempt
    assert len(waiting) == 1 and "retrying until it answers (--max-retries -1)" in waiting[0], err
    assert "the target answered after" in err
    _no_repr(err)
