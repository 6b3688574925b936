"""The events' total order at a lake target, end to end: a transaction whose events straddle a DDL event
reaches the tables whole through a live tail, on both engines and both formats, and every change table
holds each event once, in ``sequence`` order."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from tests.support.lake import collections, read_table, source_bytes, state_bytes
from tests.support.spark import quick_jvm_conf

pytestmark = pytest.mark.integration

TRANSACTIONS = 5


def _tail(source: str, target: str, cp: Path, engine: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "replicator.cli", "tail", "-s", source, "-t", target, "-c", str(cp), "--no-progress"]
    argv += ["--retry-initial-delay", "0.2", "--retry-max-delay", "1", "--include", r"d\..*"]
    if engine == "spark":
        argv += ["--engine", "spark", "--spark-master", "local[2]", "--replay-partitions", "2", *quick_jvm_conf()]
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _wait(condition: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _holds(condition):
        if proc.poll() is not None:
            raise AssertionError(
                f"mcdc exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _holds(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except Exception:  # a table being made (an Iceberg catalog not there yet) holds nothing yet
        return False


def _saved_time(cp: Path) -> Timestamp | None:
    try:
        position = json.loads(cp.read_text())["position"]
    except (OSError, ValueError, KeyError):
        return None
    ct = position.get("cluster_time")
    return Timestamp(ct["t"], ct["i"]) if ct else None


def _transactions_around_a_create(client: pymongo.MongoClient[dict[str, Any]]) -> None:
    """Five transactions, each: an insert into d.a, a collection created, an insert into it, an insert into
    d.a again (MongoDB 4.4+ creates collections inside transactions)."""
    for k in range(TRANSACTIONS):
        with client.start_session() as session, session.start_transaction():
            client.d.a.insert_one({"_id": f"before-{k}"}, session=session)
            client.d.create_collection(f"t{k}", session=session)
            client.d[f"t{k}"].insert_one({"_id": k}, session=session)
            client.d.a.insert_one({"_id": f"after-{k}"}, session=session)


def stream_events(source: str, db: str, since: Timestamp) -> list[dict[str, Any]]:
    """The source's change events of ``db`` after ``since``, in stream order."""
    with (
        pymongo.MongoClient(source) as client,
        client.watch(start_at_operation_time=Timestamp(since.time, since.inc + 1), show_expanded_events=True) as stream,
    ):
        events = []
        while (change := stream.try_next()) is not None:
            if (change.get("ns") or {}).get("db") == db:
                events.append(change)
        return events


def assert_every_event_once_in_order(kind: str, root: Path, source: str, db: str, since: Timestamp) -> None:
    """Each change table of ``db`` holds the source stream's document events of its collection after
    ``since`` exactly once, and sorted by ``sequence`` they come in the stream's order."""
    from replicator.bsonkit.extjson import dumps_str

    expected: dict[str, list[str]] = {}
    for change in stream_events(source, db, since):
        if change["operationType"] in ("insert", "update", "replace", "delete"):
            expected.setdefault(change["ns"]["coll"], []).append(dumps_str(change["_id"]))
    for coll in collections(source, db):
        table = read_table(kind, root, "changes", db, coll)
        assert table is not None, f"{db}.{coll} has no change table"
        rows = sorted(
            (r for r in table.to_pylist() if r["op"] in ("c", "u", "replace", "d")),
            key=lambda r: tuple(r["sequence"].values()),
        )
        got = [r["resume_token"] for r in rows if Timestamp(r["cluster_time"]["t"], r["cluster_time"]["i"]) > since]
        assert got == expected.get(coll, []), f"{db}.{coll}: the change table's events differ from the stream's"


@pytest.mark.parametrize("engine", ["asyncio", "spark"])
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_transaction_around_a_create_reaches_the_lake_whole_through_a_live_tail(
    kind: str, engine: str, source_uri: str, tmp_path: Path
) -> None:
    root, cp, log = tmp_path / "lake", tmp_path / "cp.json", tmp_path / "tail.log"
    with pymongo.MongoClient(source_uri) as client:
        client.d.create_collection("a")
        client.d.a.insert_one({"_id": "first"})
        proc = _tail(source_uri, f"{kind}:{root}", cp, engine, log)
        try:
            _wait(lambda: state_bytes(kind, root, "d", "a") != [], "snapshot", proc, log, 240)
            since = client.admin.command("ping")["operationTime"]
            # a write acknowledged once the live replay runs: what comes after it is past the replay's DDL
            # window (the stream opened before it), so DDL is applied as it comes, not settled by a copy
            client.d.a.insert_one({"_id": "live"})
            live = stream_events(source_uri, "d", since)[-1]["clusterTime"]
            _wait(lambda: (_saved_time(cp) or Timestamp(0, 0)) >= live, "the live replay", proc, log, 240)
            _transactions_around_a_create(client)
            last = stream_events(source_uri, "d", since)[-1]["clusterTime"]
            _wait(lambda: (_saved_time(cp) or Timestamp(0, 0)) >= last, "acknowledged transactions", proc, log, 240)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
        assert code == 0, log.read_text()[-3000:]
    for coll in collections(source_uri, "d"):
        assert state_bytes(kind, root, "d", coll) == source_bytes(source_uri, "d", coll), f"d.{coll}"
    assert len(state_bytes(kind, root, "d", "a")) == 2 + 2 * TRANSACTIONS
    assert "copying again" not in log.read_text()  # the transactions' DDL was past the window: applied
    assert_every_event_once_in_order(kind, root, source_uri, "d", since)
