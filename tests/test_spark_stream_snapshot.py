"""``readStream.format("mcdc").option("snapshot", "initial")`` in processes of their own, killed with -9 at
random micro-batches while the source changes (collections renamed and dropped during the snapshot among
it), then run to the end: every document once as an ``r`` row, every later event once, and the rows folded
by ``sequence`` (renames and drops applied) give the source's documents."""

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
from tests.support.stream_query import fold, read_batches

pytestmark = pytest.mark.integration

OPTIONS = (r"include=shop\..*", "snapshot=initial", "partition-docs=10", "split=always", "extended-json=relaxed")
#: small micro-batches while the query is killed (many of them, in the snapshot and in the stream); the last
#: run, which reads what the writes left, takes bigger ones (a read limit is the micro-batch's own)
SMALL, LAST = "max-batch-size=15", "max-batch-size=1000"


def _query(source: str, work: Path, trigger: str, limit: str = SMALL) -> subprocess.Popen[bytes]:
    log = open(work / f"query-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115 - the process owns it
    argv = [sys.executable, "-m", "tests.support.stream_query", source, str(work / "cp"), str(work / "out"), trigger]
    return subprocess.Popen([*argv, *OPTIONS, limit], stdout=log, stderr=subprocess.STDOUT)


def _last_log(work: Path) -> str:
    """The end of the last query's log: why it ended, when it ended too soon."""
    logs = sorted(work.glob("query-*.log"))
    return logs[-1].read_text(errors="replace")[-3000:] if logs else "(no log)"


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


def _source_state(source: str, db: str = "shop") -> dict[tuple[str, str], Any]:
    """Every document of ``db``'s collections, as :func:`fold` gives them: (namespace, key) -> document."""
    with pymongo.MongoClient(source) as client:
        return {
            (f"{db}.{coll}", dumps_str({"_id": doc["_id"]})): json.loads(dumps_str(doc, relaxed=True))
            for coll in client[db].list_collection_names()
            for doc in client[db][coll].find()
        }


def _wait_for(what: str, done: Any, proc: subprocess.Popen[bytes], work: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, f"the query ended before {what}:\n{_last_log(work)}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.1)


@pytest.mark.timeout(600)
def test_a_collection_renamed_during_the_snapshot_has_every_document_delivered(source_uri: str, tmp_path: Path) -> None:
    """Three collections of 100 documents read 10 a partition, one partition a micro-batch: ``shop.z``'s
    partitions come last, after it was renamed and one of its documents updated. Folded by ``sequence``
    (the rename moving ``z``'s rows), the rows are the source's 300 documents, each read once."""
    with pymongo.MongoClient(source_uri) as client:
        for coll in ("x", "y", "z"):
            client.shop.create_collection(coll)
            client.shop[coll].insert_many([{"_id": i, "coll": coll} for i in range(100)])
        proc = _query(source_uri, tmp_path, "live")
        try:
            _wait_for("3 micro-batches", lambda: _batches(tmp_path) >= 3, proc, tmp_path)
            client.shop.z.rename("z_renamed")
            client.shop.z_renamed.update_one({"_id": 7}, {"$set": {"v": 1}})
            updated = lambda: any(r["op"] == "u" for r in read_batches(tmp_path / "out"))  # noqa: E731
            _wait_for("the update's row", updated, proc, tmp_path)
        finally:
            proc.kill()
            proc.wait()
    rows = read_batches(tmp_path / "out")
    reads = [(r["coll"], r["key"]) for r in rows if r["op"] == "r"]
    assert len(reads) == len(set(reads)) == 300
    assert [r["op"] for r in rows if r["op"] != "r"] == ["rename", "u"]
    state = fold(rows)
    assert len(state) == 300
    assert state == _source_state(source_uri)


def _stream_tokens(source: str, since: Timestamp) -> list[str]:
    """The source's change events of ``shop`` from ``since`` on, as resume tokens in stream order."""
    with (
        pymongo.MongoClient(source) as client,
        client.watch(start_at_operation_time=since, show_expanded_events=True) as stream,
    ):
        tokens = []
        while (change := stream.try_next()) is not None:
            if (change.get("ns") or {}).get("db") == "shop":
                tokens.append(dumps_str(change["_id"]))
        return tokens


def test_the_stream_after_the_snapshot_has_every_event_from_the_snapshot_s_time_on(
    source_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write lands just before the query reads the source's time (at that very time, as a ping's operation
    time is the last write's) and one just after it, before the query would know where its stream stands:
    both are events from the snapshot's time on, so both are rows after the snapshot's. The reader runs
    in this process (the driver's and the executors' parts in turn), the writes made as it reads the time."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from replicator.events.rows import NAMES
    from replicator.spark_datasource import stream

    with pymongo.MongoClient(source_uri) as client:
        client.shop.create_collection("orders")
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
        real_time, written = stream.source_time, list[Any]()

        def writing_around(reader_client: Any) -> Timestamp:
            reader_client.admin.command("ping")  # connected first: the time read next is the write's
            written.append(client.shop.orders.insert_one({"_id": "just before"}).inserted_id)
            at = real_time(reader_client)
            written.append(client.shop.orders.insert_one({"_id": "just after"}).inserted_id)
            return at

        monkeypatch.setattr(stream, "source_time", writing_around)
        reader = stream.ChangeStreamReader({"source": source_uri, "include": r"shop\..*", "snapshot": "initial"})
        start = reader.initialOffset()
        monkeypatch.setattr(stream, "source_time", real_time)
        rows: list[dict[str, Any]] = []
        for _ in range(2):  # the snapshot's partitions, then the stream's events
            end = reader.latestOffset(start, ReadAllAvailable())
            for part in reader.partitions(start, end):
                rows += [dict(zip(NAMES, row, strict=True)) for row in reader.read(part)]
            start = end
    assert written == ["just before", "just after"]  # the time read once
    ((t, i),) = {(r["sequence"]["t"], r["sequence"]["i"]) for r in rows if r["op"] == "r"}
    events = [json.loads(r["key"])["_id"] for r in rows if r["op"] != "r"]
    assert events in (written, written[1:])  # "just before" where it is at the time read (as a rule it is)
    assert [r["resume_token"] for r in rows if r["op"] != "r"] == _stream_tokens(source_uri, Timestamp(t, i))


class Moves:
    """Renames and drops during the snapshot, each once the query delivered a number of micro-batches:
    ``x_archive`` renamed (a document updated before, one added after), renamed again and a new
    ``x_archive`` made (with the updated document's ``_id``: the update's looked-up document, read after
    the snapshot, would be the new one's); ``w_tmp`` dropped; ``v_log`` dropped and made again. Their
    partitions come after ``orders``'s and ``users``'s in the plan."""

    def __init__(self, client: pymongo.MongoClient[dict[str, Any]]) -> None:
        self.db = client.shop
        self.steps = [(2, self._rename), (4, self._drop), (6, self._drop_and_make_again), (8, self._rotate)]

    def due(self, batches: int) -> None:
        """The moves due once ``batches`` micro-batches were delivered (all of them: ``batches`` None)."""
        while self.steps and self.steps[0][0] <= batches:
            self.steps.pop(0)[1]()

    def _rename(self) -> None:
        self.db.x_archive.update_one({"_id": 2}, {"$set": {"v": "updated before the rename"}})
        self.db.x_archive.rename("x_archive_1")
        self.db.x_archive_1.insert_one({"_id": 1001, "v": "after the rename"})

    def _drop(self) -> None:
        self.db.w_tmp.drop()

    def _drop_and_make_again(self) -> None:
        self.db.v_log.drop()
        self.db.create_collection("v_log")
        self.db.v_log.insert_many([{"_id": 500 + i, "v": "new log"} for i in range(10)])

    def _rotate(self) -> None:
        self.db.x_archive_1.rename("x_archive_2")
        self.db.create_collection("x_archive")
        self.db.x_archive.insert_many([{"_id": i, "v": "new archive"} for i in [2, *range(700, 710)]])


@pytest.mark.timeout(900)  # four Spark processes: minutes on a loaded machine
def test_a_stream_with_the_snapshot_first_killed_at_random_micro_batches_delivers_everything_once(
    source_uri: str, tmp_path: Path
) -> None:
    rng = random.Random(26)
    planned = ("orders", "users", "v_log", "w_tmp", "x_archive")
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(source_uri)
    for coll in planned:
        client.shop.create_collection(coll)
        client.shop[coll].insert_many([{"_id": i, "v": 0, "coll": coll} for i in range(0, 60, 2)])
    moves = Moves(client)
    writes = Writes(source_uri, 26)
    writes.start()
    try:
        for _ in range(3):  # killed after a random number of micro-batches: in the snapshot, then in the stream
            proc = _query(source_uri, tmp_path, "live")
            goal = _batches(tmp_path) + rng.randrange(1, 5)
            deadline = time.monotonic() + 180
            while _batches(tmp_path) < goal and proc.poll() is None and time.monotonic() < deadline:
                moves.due(_batches(tmp_path))
                time.sleep(0.1)
            assert proc.poll() is None, f"the query ended before it was killed:\n{_last_log(tmp_path)}"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert _batches(tmp_path) < 3 * len(planned)  # the snapshot's 15 partitions, one a micro-batch, not all read
        moves.due(1_000_000)  # those not done yet: still in the snapshot
    finally:
        writes.halt.set()
        writes.join()
    final = _query(source_uri, tmp_path, "available-now", LAST)
    assert final.wait(300) == 0, f"the last run did not finish:\n{_last_log(tmp_path)}"

    rows = read_batches(tmp_path / "out")
    reads = [r for r in rows if r["op"] == "r"]
    events = [r for r in rows if r["op"] != "r"]
    snapshot_at = {tuple(r["sequence"].values()) for r in reads}
    assert len(snapshot_at) == 1  # every document of the snapshot at its one read time
    ((t, i, shard, n),) = snapshot_at
    assert (shard, n) == ("", -1)
    read_keys = [(r["coll"], r["key"]) for r in reads]
    assert len(read_keys) == len(set(read_keys))  # every document once, under its name at the snapshot's time
    assert {c for c, _ in read_keys} <= set(planned)
    archive = {json.loads(key)["_id"]["$numberInt"] for c, key in read_keys if c == "x_archive"}
    assert archive == {str(i) for i in [*range(0, 60, 2), 1001]}  # read where it went, none of the new one's
    assert not [key for c, key in read_keys if c == "v_log" and int(json.loads(key)["_id"]["$numberInt"]) >= 500]
    (looked_up,) = [r for r in events if r["op"] == "u" and r["coll"] == "x_archive"]
    assert looked_up["document"] is None  # the name holds another collection: the delta alone
    assert [r["resume_token"] for r in events] == _stream_tokens(source_uri, Timestamp(t, i))  # all, once, in order
    assert {"rename", "drop", "create"} <= {r["op"] for r in events}
    assert min(tuple(r["sequence"].values()) for r in events) > (t, i, "", -1)
    state = fold(rows)  # Auto CDC's SCD type 1 with the DDL applied: renames move documents, drops remove them
    assert state == _source_state(source_uri)
    assert {ns for ns, _ in state} == {f"shop.{c}" for c in ("orders", "users", "v_log", "x_archive", "x_archive_2")}
    client.close()
