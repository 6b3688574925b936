"""The Lakeflow Connect source against the real test server, driven as Databricks' framework drives it:
each table's two flows (``read_table``, ``read_table_deletes``) paged from their last committed offset
until it comes back unchanged, the records applied by key in ``sequence`` order, deletes as tombstones.
Plus Databricks Labs' own conformance suite, when a checkout of it is at hand (LAKEFLOW_REPO)."""

from __future__ import annotations

import gc
import json
import os
import random
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from bson import json_util
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit.extjson import CANONICAL, dumps_str
from replicator.bsonkit.rawbson import RAW_CODEC
from replicator.lakeflow import LakeflowError, MongoLakeflowConnect
from tests.support.mongos import mongos
from tests.support.scripts import run_script
from tests.support.servers import connect
from tests.support.workload import random_workload

pytestmark = pytest.mark.integration

TABLES = ("work.a", "work.b")
Seq = tuple[int, int, str, int]


class Table:
    """A Lakeflow table as Auto CDC (SCD type 1) keeps it: per key, the highest sequence applied and the
    document (None: deleted, kept as a tombstone so an older upsert arriving later cannot bring it back)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[Seq, str | None]] = {}
        self.seen: set[str] = set()  # the ops applied, "txn" for a record of a transaction

    def apply(self, record: dict[str, Any], *, delete: bool) -> None:
        self.seen |= {record["op"], "txn"} if record["txn"] is not None else {record["op"]}
        s = record["sequence"]
        seq = (s["t"], s["i"], s["shard"], s["n"])
        held = self.rows.get(record["key"])
        if held is None or seq > held[0]:
            self.rows[record["key"]] = (seq, None if delete else record["document"])

    def documents(self) -> dict[str, bytes]:
        """key -> the document's BSON, from its canonical Extended JSON (types and field order kept)."""
        return {
            key: bson.encode(json_util.loads(doc, json_options=CANONICAL), codec_options=RAW_CODEC)
            for key, (_, doc) in self.rows.items()
            if doc is not None
        }


class Flow:
    """One of the framework's flows of a table: its committed offset, stored as JSON between pages."""

    def __init__(self, table: str, method: str) -> None:
        self.table, self.method = table, method
        self.offset: str = "null"

    def read(self, connector: MongoLakeflowConnect) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        read: Callable[..., Any] = getattr(connector, self.method)
        records, end = read(self.table, json.loads(self.offset), {})
        return list(records), end


def _source_documents(uri: str, table: str) -> dict[str, bytes]:
    db, coll = table.split(".", 1)
    with pymongo.MongoClient(uri, document_class=RawBSONDocument) as client:
        return {dumps_str({"_id": doc["_id"]}): bytes(doc.raw) for doc in client[db][coll].find()}


def _stream_keys(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["key"], json.dumps(r["sequence"])) for r in records]


def test_pages_with_kills_between_them_under_a_workload_equal_the_source(own_source: str) -> None:
    seed = 3901
    rng = random.Random(seed)
    with connect(own_source) as client:
        for name in ("a", "b", "c"):
            client.work.create_collection(name)
        client.work.a.insert_many([{"_id": i, "v": i, "arr": [i]} for i in range(0, 200, 2)])
        client.work.b.insert_many([{"_id": i, "w": str(i)} for i in range(1, 200, 3)])
    options = {"source": own_source, "include": r"work\.(a|b)", "partition-docs": "15", "split": "always",
               "max-batch-size": "25"}  # fmt: skip
    workload = threading.Thread(target=random_workload, args=(own_source, 400, seed), kwargs={"ddl": False})
    tables = {name: Table() for name in TABLES}
    flows = [Flow(name, method) for name in TABLES for method in ("read_table", "read_table_deletes")]
    assert MongoLakeflowConnect(options).list_tables() == list(TABLES)
    workload.start()
    crashes = rereads = during = 0
    while True:
        ended = not workload.is_alive()  # this run begins after the workload's last write
        connector = MongoLakeflowConnect(options)  # a pipeline update: the framework makes a new connector
        paging, moved = list(flows), False
        for _ in range(200):  # each flow pages until its offset comes back unchanged, writes going on or not
            for flow in list(paging):
                records, end = flow.read(connector)
                during += bool(records) and not ended
                if rng.random() < 0.25:
                    # the process dies after the page was read, before its offset was committed: a new one
                    # reads the page again from the same offset (Spark's readBetweenOffsets reads from the
                    # start and keeps the end it logged)
                    crashes += 1
                    connector = MongoLakeflowConnect(options)
                    again, _ = flow.read(connector)
                    if records and records[0]["cluster_time"] is not None:  # a stream page: the same first
                        assert _stream_keys(again)[: len(records)] == _stream_keys(records)
                        rereads += 1
                    records = again
                for record in records:
                    tables[flow.table].apply(record, delete=flow.method == "read_table_deletes")
                if json.dumps(end, sort_keys=True) == json.dumps(json.loads(flow.offset), sort_keys=True):
                    paging.remove(flow)
                else:
                    moved = True
                flow.offset = json.dumps(end)
            if not paging:
                break
        else:
            pytest.fail("a run's paging never ended: an offset kept moving")
        if ended and not moved:
            break
    workload.join()
    assert crashes and rereads and during > 5, (crashes, rereads, during)
    for name in TABLES:
        source = _source_documents(own_source, name)
        assert source, f"{name} is empty: the workload wrote nothing"
        assert tables[name].documents() == source, name
        assert {"r", "c", "u", "replace", "d", "txn"} <= tables[name].seen, (name, tables[name].seen)


def test_a_page_read_again_from_its_offset_gives_the_same_records_and_reading_ends(source_uri: str) -> None:
    with connect(source_uri) as client:
        client.shop.create_collection("orders")
        client.shop.orders.insert_many([{"_id": i} for i in range(10)])
    connector = MongoLakeflowConnect({"source": source_uri, "include": r"shop\..*", "max-batch-size": "4"})
    records, offset = connector.read_table("shop.orders", None, {})
    assert list(records) == [] and offset  # the first call plans the snapshot: its offset, no record yet
    with connect(source_uri) as client:  # after the snapshot's time, before its pages: they follow
        for i in range(10):
            client.shop.orders.update_one({"_id": i}, {"$set": {"v": i}})
    snapshot, offset = connector.read_table("shop.orders", offset, {})
    assert sorted(r["_id"] for r in snapshot) == sorted(f'{{"$numberInt":"{i}"}}' for i in range(10))
    seen: list[dict[str, Any]] = []
    for _ in range(20):
        page, end = connector.read_table("shop.orders", offset, {})
        page = list(page)
        fresh = MongoLakeflowConnect({"source": source_uri, "include": r"shop\..*", "max-batch-size": "4"})
        again, end_again = fresh.read_table("shop.orders", json.loads(json.dumps(offset)), {})
        assert list(again) == page and end_again == end
        seen += page
        if end == offset:
            break
        offset = end
    else:
        pytest.fail("read_table never gave its offset back unchanged")
    # the stream starts at the snapshot's time itself: the last insert, made at that time, comes again
    assert [r["op"] for r in seen if r["op"] != "c"] == ["u"] * 10 and len(seen) <= 11
    sequences = [tuple(r["sequence"].values()) for r in seen]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(seen)


def test_paging_ends_while_writes_go_on_and_the_next_paging_goes_on_from_there(source_uri: str) -> None:
    with connect(source_uri) as client:
        client.shop.create_collection("orders")
    stop = threading.Event()

    def write() -> None:
        with connect(source_uri) as client:
            n = 0
            while not stop.is_set():
                client.shop.orders.insert_one({"_id": n})
                n += 1

    writer = threading.Thread(target=write)
    connector = MongoLakeflowConnect({"source": source_uri, "max-batch-size": "10"})

    def drain(offset: Any) -> tuple[Any, int]:
        """Pages until the offset comes back unchanged (Trigger.AvailableNow's end), and the records read."""
        count = 0
        for _ in range(500):
            records, end = connector.read_table("shop.orders", offset, {})
            count += len(list(records))
            if end == offset:
                return end, count
            offset = end
        pytest.fail("paging never ended while the writes went on")

    writer.start()
    try:
        with connect(source_uri) as client:  # the writes have begun
            while client.shop.orders.estimated_document_count() < 20:
                pass
        offset, first = drain(None)
        assert writer.is_alive()
        offset, second = drain(offset)  # the next run reads what came since
        assert writer.is_alive() and first >= 20 and second > 0
    finally:
        stop.set()
        writer.join()


def test_a_table_s_options_override_the_connector_s_and_a_mistake_in_them_is_one_line(source_uri: str) -> None:
    with connect(source_uri) as client:
        client.shop.create_collection("orders")
    connector = MongoLakeflowConnect({"source": source_uri, "max-batch-size": "100", "tableName": "shop.orders"})
    _, offset = connector.read_table("shop.orders", None, {})
    with connect(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
    _, offset = connector.read_table("shop.orders", offset, {})  # the snapshot, then the inserts' events
    small = {"max-batch-size": "2", "isDeleteFlow": "true"}
    sizes = []
    for _ in range(10):
        records, end = connector.read_table("shop.orders", offset, small)
        if end == offset:
            break
        sizes.append(len(list(records)))
        offset = end
    assert sizes == [2, 2, 1], sizes
    with pytest.raises(LakeflowError, match="unknown option 'max-batch'") as caught:
        connector.read_table("shop.orders", offset, {"max-batch": "2"})
    assert "\n" not in str(caught.value)


def test_deletes_start_at_the_oldest_oplog_entry_or_now_said_in_the_log_where_it_cannot_be_read(
    source_uri: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with connect(source_uri) as client:
        client.shop.create_collection("orders")
        oldest = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]
    connector = MongoLakeflowConnect({"source": source_uri})
    _, offset = connector.read_table_deletes("shop.orders", None, {})
    assert offset["shards"][""] == {"token": None, "t": oldest.time, "i": oldest.inc}

    async def unreadable(client: Any) -> None:
        return None

    monkeypatch.setattr("replicator.lakeflow.connect.oplog_window", unreadable)
    _, offset = connector.read_table_deletes("shop.orders", None, {})
    assert offset["shards"][""]["token"] is not None  # the stream's position now
    assert "deletes start now" in caplog.text and "127.0.0.1" not in caplog.text


def test_list_tables_is_the_selection_and_an_unknown_table_is_one_line(source_uri: str) -> None:
    with connect(source_uri) as client:
        for name in ("orders", "carts", "tmp_x"):
            client.shop.create_collection(name)
        client.crm.create_collection("people")
        client.shop.command({"create": "big_orders", "viewOn": "orders", "pipeline": []})
    connector = MongoLakeflowConnect({"source": source_uri, "include": r"shop\..*", "exclude": r".*\.tmp_.*"})
    assert connector.list_tables() == ["shop.carts", "shop.orders"]  # no view, nothing excluded or unselected
    for call in (
        lambda: connector.get_table_schema("shop.order", {}),
        lambda: connector.read_table_metadata("crm.people", {}),
        lambda: connector.read_table("shop.tmp_x", {}, {}),
        lambda: connector.read_table_deletes("shop.big_orders", {}, {}),
    ):
        with pytest.raises(LakeflowError, match="is not a selected collection of the source") as caught:
            call()
        assert "\n" not in str(caught.value)
    with pytest.raises(LakeflowError, match=r"did you mean 'shop\.orders'"):
        connector.read_table_metadata("shop.order", {})


@pytest.mark.parametrize(("wrong", "said"), [("set", "replica set"), ("port", "unreachable")])
def test_a_source_it_cannot_use_is_one_line_without_credentials(source_uri: str, wrong: str, said: str) -> None:
    host = "127.0.0.1:1" if wrong == "port" else source_uri.split("/")[2]
    query = "replicaSet=elsewhere" if wrong == "set" else "directConnection=true"
    uri = f"mongodb://reader:s3cret@{host}/?{query}&serverSelectionTimeoutMS=1500"
    connector = MongoLakeflowConnect({"source": uri})
    with pytest.raises(LakeflowError) as caught:
        connector.list_tables()
    text = str(caught.value)
    assert said in text and "s3cret" not in text and "\n" not in text, text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_collection_sharded_on_other_fields_is_keyed_by_its_shard_key_and_id(source_uri: str) -> None:
    with connect(source_uri) as client:
        for name in ("orders", "users"):
            client.shop.create_collection(name)
        client.shop.orders.insert_many([{"_id": i, "region": ["eu", "us"][i % 2], "n": i} for i in range(6)])
        client.shop.users.insert_one({"_id": 1})
    keys = _sharded_keys(source_uri)
    # the stand-in's connection tasks, cancelled as it stopped, are reported with a traceback as they are
    # collected: collected here, the report cannot land inside another test's ast.parse (Python 3.11's
    # tracebacks parse their lines: "SystemError: AST constructor recursion depth mismatch")
    gc.collect()
    assert keys == sorted(f'{{"region":"{["eu", "us"][i % 2]}","_id":{{"$numberInt":"{i}"}}}}' for i in range(6))


def _sharded_keys(source_uri: str) -> list[str]:
    """The keys of ``shop.orders``'s snapshot records, read through a mongos stand-in in front of the
    server (its one shard given by ``shard``), ``shop.orders`` sharded on region and ``shop.users`` on a
    hashed ``_id``."""
    with mongos(source_uri) as stand_in:
        stand_in.shard_source("shop.orders", {"region": 1, "_id": 1})
        stand_in.shard_source("shop.users", {"_id": "hashed"})
        connector = MongoLakeflowConnect({"source": stand_in.uri, "shard": source_uri, "include": r"shop\..*"})
        assert connector.read_table_metadata("shop.orders", {})["primary_keys"] == ["key"]
        assert connector.read_table_metadata("shop.users", {})["primary_keys"] == ["_id"]
        _, offset = connector.read_table("shop.orders", None, {})
        records, _ = connector.read_table("shop.orders", offset, {})
        return sorted(r["key"] for r in records)


_REPO = os.environ.get("LAKEFLOW_REPO")


@pytest.mark.skipif(
    not _REPO,
    reason="LAKEFLOW_REPO names no checkout of databrickslabs/lakeflow-community-connectors (its conformance "
    "suite is not on PyPI): scripts/lakeflow_conformance.py runs it",
)
def test_databricks_labs_conformance_suite_passes_live_and_through_their_spark_data_source() -> None:
    result = run_script("lakeflow_conformance.py", str(Path(_REPO or "")), timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    theirs = ("test_list_tables", "test_invalid_table_name", "test_get_table_schema", "test_read_table_metadata",
              "test_read_table ", "test_read_table_deletes ", "test_read_terminates ")  # fmt: skip
    ours = ("test_read_table_records", "test_read_table_deletes_records", "test_both_flows_stream_through_their_spark")
    for name in (*theirs, *ours):
        assert re.search(rf"::{name}.* PASSED", out), f"{name} did not pass:\n{out[-6000:]}"
    assert "FAILED" not in out


def test_the_docs_example_runs_as_written(source_uri: str) -> None:
    """docs/how-to/databricks.md's block, its source URI put in: the tables it says, and a first page."""
    with connect(source_uri) as client:
        client.shop.customers.insert_one({"_id": 1})
        client.shop.orders.insert_many([{"_id": i} for i in range(3)])
    page = (Path(__file__).resolve().parent.parent / "docs" / "how-to" / "databricks.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", page, re.S)
    names: dict[str, Any] = {}
    exec(block.replace("mongodb://src/?replicaSet=rs0", source_uri), names)  # the docs' own code
    assert names["source"].list_tables() == ["shop.customers", "shop.orders"]
    assert list(names["records"]) == [] and names["offset"]  # the first call: the snapshot's offset
