"""The mcdc data source's rows, offsets and options, without Spark or a server: rows are lossless (every
ChangeEvent comes back from its row), offsets are per-shard tokens, options fail like the CLI's."""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
import traceback
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import dumps_str
from replicator.errors import ConfigError
from replicator.events import ChangeEvent, Namespace, Op
from replicator.events.normalize import normalize_change
from replicator.events.rows import COLUMNS, NAMES, bson_bytes, event_from_row, event_row, snapshot_row
from replicator.source.connection import RAW_CODEC
from replicator.spark_datasource import offsets
from replicator.spark_datasource.offsets import ShardOffset
from replicator.spark_datasource.options import START_POSITIONS, OptionError, one_line, settings_for
from tests.support.corpus import bson_corpus_documents

LSID = {"id": Binary(b"\x9a" * 16, 4)}


def raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc, codec_options=RAW_CODEC), RAW_CODEC)


def change(op: str, n: int, **fields: Any) -> RawBSONDocument:
    doc: dict[str, Any] = {
        "_id": {"_data": f"82{n:08x}"},
        "operationType": op,
        "clusterTime": Timestamp(1_700_000_000, n),
        "wallTime": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000),
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": Int64(n)},
    }
    doc.update(fields)
    return raw(doc)


def as_mapping(row: tuple[Any, ...]) -> dict[str, Any]:
    assert len(row) == len(COLUMNS)
    return dict(zip(NAMES, row, strict=True))


def same_event(got: ChangeEvent, want: ChangeEvent) -> None:
    """Equal, documents compared by their bytes."""
    for name in ("op", "ns", "update", "position", "wall_time_ms", "txn", "rs", "ddl", "to"):
        assert getattr(got, name) == getattr(want, name), name
    for name in ("key", "document", "before"):
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), name
        if g is not None:
            assert bson_bytes(g) == bson_bytes(w), name


EVENTS = {
    "insert": change("insert", 1, fullDocument={"_id": Int64(1), "x": -0.0}),
    "update_delta": change(
        "update",
        2,
        updateDescription={
            "updatedFields": {"a.b": Int64(5), "d": datetime.datetime(1969, 1, 1)},
            "removedFields": ["gone"],
            "truncatedArrays": [{"field": "arr", "newSize": 2}],
        },
    ),
    "update_lookup": change(
        "update",
        3,
        updateDescription={"updatedFields": {"x": 1}, "removedFields": [], "truncatedArrays": []},
        fullDocument={"_id": Int64(3), "x": 1},
    ),
    "replace": change("replace", 4, fullDocument={"_id": Int64(4), "y": "z"}),
    "delete": change("delete", 5, fullDocumentBeforeChange={"_id": Int64(5), "old": True}),
    "in_transaction": change("insert", 6, fullDocument={"_id": Int64(6)}, lsid=LSID, txnNumber=Int64(7)),
}


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_a_change_row_gives_back_the_exact_event_from_its_change_column(name: str) -> None:
    doc = EVENTS[name]
    event = normalize_change(doc, "rs1", 2, "shard1")
    assert event is not None
    row = as_mapping(event_row(event, bson_bytes(doc)))
    assert row["change"] == doc.raw and row["shard"] == "rs1"
    assert row["resume_token"] == dumps_str(doc["_id"])
    assert row["cluster_time"] == {"t": 1_700_000_000, "i": doc["clusterTime"].inc}
    assert row["sequence"] == {"t": 1_700_000_000, "i": doc["clusterTime"].inc, "shard": "shard1", "n": 2}
    assert row["wall_time"] == datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
    same_event(event_from_row(row), event)


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_a_change_row_without_its_change_column_gives_the_same_event(name: str) -> None:
    event = normalize_change(EVENTS[name], None, 1)
    assert event is not None
    row = as_mapping(event_row(event)) | {"change": None}
    same_event(event_from_row(row), event)


def test_change_row_columns_are_canonical_extended_json() -> None:
    event = normalize_change(EVENTS["update_delta"])
    assert event is not None
    row = as_mapping(event_row(event))
    assert row["op"] == "u" and (row["db"], row["coll"]) == ("shop", "orders")
    assert json.loads(row["key"]) == {"_id": {"$numberLong": "2"}}
    assert json.loads(row["update"]) == {
        "updatedFields": {"a.b": {"$numberLong": "5"}, "d": {"$date": {"$numberLong": "-31536000000"}}},
        "removedFields": ["gone"],
        "truncatedArrays": [{"field": "arr", "newSize": {"$numberInt": "2"}}],
    }
    assert row["document"] is None and row["bson"] is None and row["txn"] is None and row["shard"] is None
    txn_event = normalize_change(EVENTS["in_transaction"])
    assert txn_event is not None
    txn = json.loads(as_mapping(event_row(txn_event))["txn"])
    assert txn["txnNumber"] == {"$numberLong": "7"} and txn["lsid"]["id"]["$binary"]["subType"] == "04"


def test_cluster_time_keeps_unsigned_32_bit_halves() -> None:
    doc = change("delete", 1, clusterTime=Timestamp(2**32 - 1, 2**32 - 1))
    event = normalize_change(doc, None, 0)
    assert event is not None
    row = as_mapping(event_row(event, bson_bytes(doc)))
    assert row["cluster_time"] == {"t": 2**32 - 1, "i": 2**32 - 1}
    assert "bigint" in dict(COLUMNS)["cluster_time"]
    assert event_from_row(row | {"change": None}).position == event.position


def test_assembled_fragments_are_stored_as_one_change_document() -> None:
    parts = {**bson.decode(EVENTS["insert"].raw, RAW_CODEC)}  # a dict, as _assemble makes
    stored = bson_bytes(parts)
    assert RawBSONDocument(stored) == EVENTS["insert"]


def test_snapshot_rows_of_every_bson_type_keep_their_bytes() -> None:
    ns = Namespace("corpus", "types")
    for doc in bson_corpus_documents():
        document = raw(doc)
        row = as_mapping(snapshot_row(ns, document))
        assert row["op"] == "r" and row["bson"] == document.raw and row["change"] is None
        assert row["key"] == dumps_str({"_id": document["_id"]}) and row["document"] == dumps_str(document)
        event = event_from_row(row)
        assert event.op is Op.READ and event.ns == ns and bson_bytes(event.document or {}) == document.raw


def test_ddl_rows_need_their_change_column() -> None:
    with pytest.raises(ValueError, match=r"drop row of shop\.orders needs its change column"):
        event_from_row({"op": "drop", "db": "shop", "coll": "orders"})


def test_a_spark_timestamp_read_back_as_naive_local_time_is_the_same_instant() -> None:
    event = normalize_change(EVENTS["delete"])
    assert event is not None
    row = as_mapping(event_row(event)) | {"change": None}
    row["wall_time"] = row["wall_time"].astimezone().replace(tzinfo=None)
    assert event_from_row(row).wall_time_ms == event.wall_time_ms


def test_offsets_round_trip_as_per_shard_tokens() -> None:
    token = {"_data": "8265A1B2C3000000012B"}
    state = {"": ShardOffset.of(token, Timestamp(5, 6)), "sh1": ShardOffset(None, 7, 8)}
    data = offsets.to_json(state)
    assert data == {
        "shards": {
            "": {"token": '{"_data":"8265A1B2C3000000012B"}', "t": 5, "i": 6},
            "sh1": {"token": None, "t": 7, "i": 8},
        }
    }
    assert offsets.from_json(json.loads(json.dumps(data))) == state
    assert state[""].resume_token == token and state[""].position().cluster_time == Timestamp(5, 6)


def test_a_shard_new_to_an_offset_starts_at_the_earliest_time_of_the_others() -> None:
    state = {"a": ShardOffset('{"_data":"x"}', 9, 1), "b": ShardOffset(None, 4, 2)}
    assert offsets.start_of(state, "b") == state["b"]
    assert offsets.start_of(state, "c") == ShardOffset(None, 4, 2)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nope", "is not JSON"),
        ('{"positions": {}}', "must look like"),
        ('{"shards": {"": {"token": null}}}', "neither a resume token nor a cluster time"),
    ],
)
def test_bad_start_positions_are_config_errors(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        offsets.parse(text, START_POSITIONS)


def test_options_are_mcdc_options_parsed_like_the_cli() -> None:
    s = settings_for(
        {"source": "mongodb://h1/", "include": "shop\\..*,crm\\.x", "max-batch-size": "7", "checkpointLocation": "/x"},
        "source",
    )
    assert s.include == ("shop\\..*", "crm\\.x") and s.replay_batch == 7
    with pytest.raises(ConfigError, match="unknown option 'max-batch'"):
        settings_for({"source": "mongodb://h1/", "max-batch": "7"}, "source")
    with pytest.raises(ConfigError, match="option max-batch-size must be a whole number"):
        settings_for({"source": "mongodb://h1/", "max-batch-size": "lots"}, "source")
    with pytest.raises(ConfigError, match=r'no target: pass \.option\("target"'):
        settings_for({"source": "mongodb://h1/"}, "target")


def test_an_option_mistake_prints_as_mcdc_s_line_and_hides_the_traceback_only_in_a_spark_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", env)
    with pytest.raises(OptionError) as caught, one_line():
        settings_for({"workers": "x"})
    # what Spark's worker prints of it, after its own prefix
    assert traceback.format_exception_only(caught.type, caught.value) == [
        "mcdc: option workers must be a whole number, got 'x'\n"
    ]
    assert isinstance(caught.value, ConfigError) and env == {}  # the user's own process is left as it is
    env["SPARK_PYTHON_RUNTIME"] = "PYTHON_WORKER"
    with pytest.raises(OptionError), one_line():
        settings_for({"source": "mongodb://h1/"}, "target")
    assert env["SPARK_HIDE_TRACEBACK"] == "1"  # read by the worker as it formats the error, before it exits


def test_importing_without_pyspark_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith(("replicator.spark.", "replicator.spark_datasource"))] + [
        "replicator.spark"
    ]:
        monkeypatch.delitem(sys.modules, name, raising=False)  # not imported yet when this file runs alone
    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(ImportError, match=r"pip install 'mcdc\[spark\]'"):
        importlib.import_module("replicator.spark")
