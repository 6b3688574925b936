"""The Lakeflow Connect source's pure parts, without a server: its options' one-line errors, table names,
the records made of the data source's rows, and when an idle stream's offset may move."""

from __future__ import annotations

import datetime
from typing import Any

import bson
import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument
from replicator.events import ChangeEvent, Namespace, Op, Position, Transaction
from replicator.events.positions import snapshot_position
from replicator.events.rows import event_row, snapshot_row
from replicator.lakeflow import SCHEMA, LakeflowError, MongoLakeflowConnect
from replicator.lakeflow.connect import _hold_idle
from replicator.lakeflow.records import mcdc_options, metadata, namespace_of, record_of, shard_fields

URI = "mongodb://127.0.0.1:1/?directConnection=true"
NS = Namespace("shop", "orders")


def _raw(doc: dict[str, Any]) -> RawDocument:
    return RawDocument(bson.encode(doc, codec_options=RAW_CODEC), RAW_CODEC)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"source": URI, "max-batch-siz": "5"}, "unknown option 'max-batch-siz' (did you mean 'max-batch-size'?)"),
        ({"source": URI, "max-batch-size": "lots"}, "max-batch-size"),
        ({"include": "shop\\..*"}, "no source"),
        ({"source": URI, "full-document": "default"}, "full-document default gives updates without their document"),
        ({"source": "http://user:secret@host"}, "source"),
    ],
)
def test_a_mistake_in_the_options_is_one_line_at_construction(options: dict[str, str], message: str) -> None:
    with pytest.raises(LakeflowError) as caught:
        MongoLakeflowConnect(options)
    text = str(caught.value)
    assert message in text and "\n" not in text and "secret" not in text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained traceback
    assert type(caught.value).__qualname__ == "mcdc"  # Spark shows it as "mcdc: <message>"


def test_the_framework_s_own_options_are_left_to_it() -> None:
    options = {
        "source": URI,
        "tableName": "shop.orders",
        "isDeleteFlow": "true",
        "databricks.connection": "mongo",
        "sourceName": "mcdc",
        "externalOptionsAllowList": "max-batch-size",
        "max-batch-size": "7",
    }
    assert mcdc_options(options) == {"source": URI, "max-batch-size": "7"}
    MongoLakeflowConnect(options)  # no error, no connection


@pytest.mark.parametrize("name", ["__nonexistent_table_$$_9z9z9z__", "shop.", ".orders", ""])
def test_a_table_is_named_db_dot_collection(name: str) -> None:
    with pytest.raises(Exception, match=r"name it as db\.collection"):
        namespace_of(name)
    assert namespace_of("shop.orders.2026") == Namespace("shop", "orders.2026")


def test_metadata_keys_by_id_orders_by_sequence_with_deletes() -> None:
    assert metadata() == {"primary_keys": ["_id"], "cursor_field": "sequence", "ingestion_type": "cdc_with_deletes"}
    assert {"_id", "sequence"} <= set(SCHEMA.fieldNames())
    assert not SCHEMA["_id"].nullable and not SCHEMA["sequence"].nullable


def test_records_of_snapshot_rows_and_events_keep_the_key_lossless_and_the_sequence() -> None:
    oid = ObjectId()
    snap = record_of(snapshot_row(NS, _raw({"_id": oid, "n": Int64(5)}), snapshot_position(Timestamp(10, 2))))
    assert snap is not None
    assert snap["_id"] == f'{{"$oid":"{oid}"}}' and snap["op"] == "r"
    assert snap["document"] == f'{{"_id":{{"$oid":"{oid}"}},"n":{{"$numberLong":"5"}}}}'
    assert snap["sequence"] == {"t": 10, "i": 2, "shard": "", "n": -1} and snap["cluster_time"] is None

    at = Position({"_data": "01"}, Timestamp(11, 1), 3)
    txn = Transaction(_raw({"id": bson.Binary(b"1" * 16, 4)}), 7)
    wall = 1_795_000_000_123
    update = ChangeEvent(Op.UPDATE, NS, key=_raw({"_id": 1}), document=_raw({"_id": 1, "v": 2}), position=at,
                         wall_time_ms=wall, txn=txn)  # fmt: skip
    record = record_of(event_row(update))
    assert (
        record is not None and record["_id"] == '{"$numberInt":"1"}' and record["key"] == '{"_id":{"$numberInt":"1"}}'
    )
    assert record["sequence"] == {"t": 11, "i": 1, "shard": "", "n": 3}
    assert record["wall_time"] == datetime.datetime.fromtimestamp(wall / 1000, datetime.UTC).isoformat()
    assert record["txn"] is not None and record["document"] == '{"_id":{"$numberInt":"1"},"v":{"$numberInt":"2"}}'

    delete = record_of(event_row(ChangeEvent(Op.DELETE, NS, key=_raw({"_id": "1"}), position=at)))
    assert delete is not None and delete["op"] == "d" and delete["_id"] == '"1"' and delete["document"] is None


def test_an_update_without_its_document_and_ddl_make_no_record() -> None:
    at = Position({"_data": "01"}, Timestamp(11, 1), 0)
    assert record_of(event_row(ChangeEvent(Op.UPDATE, NS, key=_raw({"_id": 1}), position=at))) is None
    assert record_of(event_row(ChangeEvent(Op.DROP, NS, position=at))) is None


def _offset(t: int, *, idle: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"token": f'{{"_data":"{t:08x}"}}', "t": t, "i": 1}
    if idle:
        entry["idle"] = True
    return {"shards": {"": entry}}


def test_an_idle_stream_s_offset_moves_only_after_the_interval() -> None:
    start = _offset(1000)
    assert _hold_idle(start, _offset(1030, idle=True), 60) == start  # the clock moved: no new offset
    assert _hold_idle(start, _offset(1060, idle=True), 60) == _offset(1060, idle=True)  # keeps inside the oplog
    assert _hold_idle(start, _offset(1001), 60) == _offset(1001)  # an event: always


def test_a_sharded_collection_s_key_is_its_shard_key_then_id_the_same_from_a_row_and_from_an_event() -> None:
    shard_key = ("region", "loc.zip")
    doc = {"_id": 7, "loc": {"zip": "75001", "city": "Paris"}, "region": "eu", "n": 1}
    snap = record_of(snapshot_row(NS, _raw(doc), snapshot_position(Timestamp(10, 1))), shard_key)
    at = Position({"_data": "01"}, Timestamp(11, 1), 0)
    # the server's documentKey: shard key fields by their (dotted) paths, in whatever order it writes them
    document_key = _raw({"_id": 7, "loc.zip": "75001", "region": "eu"})
    delete = record_of(event_row(ChangeEvent(Op.DELETE, NS, key=document_key, position=at)), shard_key)
    assert snap is not None and delete is not None
    assert snap["key"] == delete["key"] == '{"region":"eu","loc.zip":"75001","_id":{"$numberInt":"7"}}'
    assert snap["_id"] == delete["_id"] == '{"$numberInt":"7"}'
    lacking = record_of(snapshot_row(NS, _raw({"_id": 8}), snapshot_position(Timestamp(10, 1))), shard_key)
    assert lacking is not None and lacking["key"] == '{"region":null,"loc.zip":null,"_id":{"$numberInt":"8"}}'
    assert metadata(shard_key)["primary_keys"] == ["key"] and metadata(())["primary_keys"] == ["_id"]
    assert shard_fields({"_id": "hashed"}) == () and shard_fields({"region": 1, "_id": 1}) == ("region",)
