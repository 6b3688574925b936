"""``readStream.format("mcdc").option("snapshot", "initial")`` in processes of their own, killed with -9 at
random micro-batches while the source changes, then run to the end: every document once as an ``r`` row,
every later event once, and the rows folded by ``sequence`` give the source's documents."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import dumps_str
from tests.support.stream_query import read_batches

pytestmark = pytest.mark.integration

OPTIONS = (r"include=shop\..*", "snapshot=initial", "partition-docs=10", "split=always", "extended-json=relaxed")
#: small micro-batches while the query is killed (many of them, in the snapshot and in the stream); the last
#: run, which reads what the writes left, takes bigger ones (a read limit is the micro-batch's own)
SMALL, LAST = "max-batch-size=15", "max-batch-size=1000"


def _query(source: str, work: Path, trigger: str, limit: str = SMALL) -> subprocess.Popen[bytes]:
    log = open(work / f"query-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115 - the process owns it
    argv = [sys.executable, "-m", "tests.support.stream_query", source, str(work / "cp"), str(work / "out"), trigger]
    return subprocess.Popen([*argv, *OPTIONS, limit], stdout=log, stderr=subprocess.STDOUT)


def _batches(work: Path) -> int:
    return len(list((work / "out").glob("[0-9]*.json")))


class Writes(threading.Thread):
    """Inserts, updates, deletes and transactions (a delete and a re-insert of one _id among them) on the
    source until stopped."""

    def __init__(self, source: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(source)
        self.rng = random.Random(seed)
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            n += 1
            coll = self.client.shop[self.rng.choice(["orders", "users"])]
            _id = self.rng.randrange(60)
            kind = self.rng.random()
            if kind < 0.4:
                coll.update_one({"_id": _id}, {"$set": {"v": n}}, upsert=True)
            elif kind < 0.6:
                coll.delete_one({"_id": _id})
            elif kind < 0.8:
                coll.replace_one({"_id": _id}, {"r": n}, upsert=True)
            else:
                with self.client.start_session() as s, s.start_transaction():
                    coll.delete_one({"_id": _id}, session=s)
                    coll.insert_one({"_id": _id, "again": n}, session=s)
                    coll.update_one({"_id": (_id + 1) % 60}, {"$inc": {"c": 1}}, upsert=True, session=s)
            time.sleep(self.rng.uniform(0.01, 0.1))


def _source_json(source: str) -> dict[tuple[str, str], str]:
    with pymongo.MongoClient(source) as client:
        return {
            (coll, dumps_str({"_id": doc["_id"]})): dumps_str(doc, relaxed=True)
            for coll in ("orders", "users")
            for doc in client.shop[coll].find()
        }


def _stream_tokens(source: str, since: Timestamp) -> list[str]:
    """The source's change events of ``shop`` from ``since`` on, as resume tokens in stream order."""
    with pymongo.MongoClient(source) as client, client.watch(start_at_operation_time=since) as stream:
        tokens = []
        while (change := stream.try_next()) is not None:
            if (change.get("ns") or {}).get("db") == "shop":
                tokens.append(dumps_str(change["_id"]))
        return tokens


@pytest.mark.timeout(900)  # four Spark processes: minutes on a loaded machine
def test_a_stream_with_the_snapshot_first_killed_at_random_micro_batches_delivers_everything_once(
    source_uri: str, tmp_path: Path
) -> None:
    rng = random.Random(26)
    with pymongo.MongoClient(source_uri) as client:
        for coll in ("orders", "users"):
            client.shop.create_collection(coll)
            client.shop[coll].insert_many([{"_id": i, "v": 0, "coll": coll} for i in range(0, 60, 2)])
    writes = Writes(source_uri, 26)
    writes.start()
    try:
        for _ in range(3):  # killed after a random number of micro-batches: in the snapshot, then in the stream
            proc = _query(source_uri, tmp_path, "live")
            goal = _batches(tmp_path) + rng.randrange(1, 5)
            deadline = time.monotonic() + 180
            while _batches(tmp_path) < goal and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert proc.poll() is None, "the query ended before it was killed"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    finally:
        writes.halt.set()
        writes.join()
    final = _query(source_uri, tmp_path, "available-now", LAST)
    assert final.wait(300) == 0, "the last run did not finish"

    rows = read_batches(tmp_path / "out")
    reads = [r for r in rows if r["op"] == "r"]
    events = [r for r in rows if r["op"] != "r"]
    snapshot_at = {tuple(r["sequence"].values()) for r in reads}
    assert len(snapshot_at) == 1  # every document of the snapshot at its one read time
    ((t, i, shard, n),) = snapshot_at
    assert (shard, n) == ("", -1)
    read_keys = [(r["coll"], r["key"]) for r in reads]
    assert len(read_keys) == len(set(read_keys)) >= 60  # every document once (some inserted since, too)
    assert [r["resume_token"] for r in events] == _stream_tokens(source_uri, Timestamp(t, i))  # all, once, in order
    assert min(tuple(r["sequence"].values()) for r in events) > (t, i, "", -1)
    ordered = sorted(rows, key=lambda r: tuple(r["sequence"].values()))
    state: dict[tuple[str, str], str] = {}
    for row in ordered:  # Auto CDC's SCD type 1: the last row by sequence wins, a delete removes the key
        if row["op"] == "d":
            state.pop((row["coll"], row["key"]), None)
        elif row["document"] is not None:
            state[(row["coll"], row["key"])] = row["document"]
    assert {k: json.loads(v) for k, v in state.items()} == {
        k: json.loads(v) for k, v in _source_json(source_uri).items()
    }
