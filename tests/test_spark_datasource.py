"""The ``mcdc`` Spark data source against the real test servers and the session's local SparkSession:
batch read of every BSON type, streaming reads with availableNow (per-shard token offsets, no re-read,
no skip), micro-batch bounds, and writes back to MongoDB byte for byte."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from bson.raw_bson import RawBSONDocument

from replicator.events.rows import NAMES, SCHEMA
from replicator.spark import register
from tests.support.compare import RAW
from tests.support.corpus import load_corpus
from tests.support.servers import Clients
from tests.support.spark import QUERY_LIMIT_S, ended

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).parent.parent / "examples" / "spark" / "changes_to_parquet.py"


@pytest.fixture
def mcdc(spark: Any) -> Any:
    register(spark)
    return spark


def raw_docs(uri: str, ns: str) -> dict[bytes, bytes]:
    """{encoded _id: raw document} of one collection."""
    db, coll = ns.split(".", 1)
    with pymongo.MongoClient(uri) as client:
        docs = client.get_database(db, codec_options=RAW)[coll].find()
        return {bson.encode({"_id": d["_id"]}, codec_options=RAW): d.raw for d in docs}


def stream_rows(
    spark: Any, source: str, checkpoint: Path, **options: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One availableNow run of the change stream: (its rows in order, the end offset of each micro-batch
    the query's checkpoint holds)."""
    rows: list[dict[str, Any]] = []
    reader = spark.readStream.format("mcdc").option("source", source)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda df, _: rows.extend(r.asDict() for r in df.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    ended(query)
    ends = []
    for path in sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name)):
        ends.append(json.loads(path.read_text().splitlines()[-1]))
    return rows, ends


def test_batch_read_gives_every_document_of_the_corpus_byte_exact(mcdc: Any, clients: Clients, source_uri: str) -> None:
    info = load_corpus(clients.source)
    df = (
        mcdc.read.format("mcdc")
        .option("source", source_uri)
        .option("include", "corpus\\.(types|mixed_ids|validated_view)")
        .option("partition-docs", "1000")
        .option("split", "always")
        .load()
    )
    assert tuple(df.columns) == NAMES
    assert df.rdd.getNumPartitions() >= 8  # the mixed _ids are split per type bracket
    rows = df.collect()
    assert {r.op for r in rows} == {"r"} and {r.change for r in rows} == {None}
    for ns in ("corpus.types", "corpus.mixed_ids"):
        got = {
            bson.encode({"_id": RawBSONDocument(bytes(r.bson), RAW)["_id"]}, codec_options=RAW): bytes(r.bson)
            for r in rows
            if f"{r.db}.{r.coll}" == ns
        }
        assert got == raw_docs(source_uri, ns)
        assert len(got) == info["namespaces"][ns]
    assert not [r for r in rows if r.coll == "validated_view"]  # a view has no documents of its own
    one = next(r for r in rows if r.coll == "types")
    assert json.loads(one.document)["_id"] == json.loads(one.key)["_id"]


def shop_changes(client: pymongo.MongoClient[dict[str, Any]]) -> None:
    """An insert, an update, a delete, a two-insert transaction, and a write outside the selection."""
    orders = client.shop.orders
    orders.insert_one({"_id": 1, "qty": 1})
    orders.update_one({"_id": 1}, {"$set": {"qty": 2}})
    orders.delete_one({"_id": 0})
    with client.start_session() as session, session.start_transaction():
        orders.insert_one({"_id": 2}, session=session)
        orders.insert_one({"_id": 3}, session=session)
    client.other.skipped.insert_one({"_id": 9})


def test_stream_available_now_reads_each_change_once_in_order_with_token_offsets(
    mcdc: Any, clients: Clients, source_uri: str, tmp_path: Path
) -> None:
    clients.source.shop.orders.insert_one({"_id": 0})  # before the stream: never a row
    options = {"include": "shop\\..*"}
    first, offsets = stream_rows(mcdc, source_uri, tmp_path / "cp", **options)
    assert first == [] and len(offsets) == 1  # the start is recorded, though nothing happened yet

    shop_changes(clients.source)
    rows, offsets = stream_rows(mcdc, source_uri, tmp_path / "cp", **options)
    got = [(r["op"], json.loads(r["key"])["_id"]) for r in rows]
    one, two = {"$numberInt": "1"}, {"$numberInt": "2"}
    assert got == [("c", one), ("u", one), ("d", {"$numberInt": "0"}), ("c", two), ("c", {"$numberInt": "3"})]
    assert {r["db"] for r in rows} == {"shop"} and {r["shard"] for r in rows} == {None}
    assert json.loads(rows[1]["document"]) == {"_id": one, "qty": two}  # updateLookup
    assert rows[2]["document"] is None and rows[2]["bson"] is None  # a delete is a row with its key
    assert rows[3]["txn"] is not None and rows[3]["txn"] == rows[4]["txn"] and rows[0]["txn"] is None
    assert all(r["change"] is not None and r["cluster_time"] is not None for r in rows)
    for end in offsets:  # per-shard resume tokens, never clock seconds
        assert set(end["shards"]) == {""} and set(end["shards"][""]) <= {"token", "t", "i", "n"}
    last = offsets[-1]["shards"][""]
    assert last["token"] is not None and last["token"] != rows[-1]["resume_token"]  # moved over other.skipped

    clients.source.shop.orders.insert_one({"_id": 4})
    third, _ = stream_rows(mcdc, source_uri, tmp_path / "cp", **options)
    assert [(r["op"], json.loads(r["key"])["_id"]) for r in third] == [("c", {"$numberInt": "4"})]


def test_the_driver_reads_each_micro_batch_once_and_its_tasks_do_not_read_it_again(
    clients: Clients, source_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events latestOffset read go with the micro-batch's partition: its task makes the rows from them
    without opening the stream. A partition another driver process planned (nothing kept) reads it."""
    import dataclasses
    import pickle

    from replicator.spark_datasource.changes import RawChangeStream
    from replicator.spark_datasource.stream import ChangeStreamReader

    options = {"source": source_uri, "include": "shop\\..*"}
    clients.source.shop.orders.insert_one({"_id": 0})  # before the stream
    reader = ChangeStreamReader(options)
    start = reader.initialOffset()
    shop_changes(clients.source)
    opened: list[Any] = []
    real_open = RawChangeStream.open

    def counting_open(self: RawChangeStream, position: Any) -> None:
        opened.append(position)
        real_open(self, position)

    monkeypatch.setattr(RawChangeStream, "open", counting_open)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert len(opened) == 1
    (planned,) = reader.partitions(start, end)
    assert planned.events is not None and len(planned.events) == 6  # other.skipped too: the offset moves over it
    rows = list(reader.read(pickle.loads(pickle.dumps(planned))))  # as an executor gets it
    assert len(opened) == 1  # not read again
    assert [r[NAMES.index("op")] for r in rows] == ["c", "u", "d", "c", "c"]
    again = list(reader.read(dataclasses.replace(planned, events=None)))  # a task reading the stream itself
    assert len(opened) == 2 and again == rows
    (replanned,) = ChangeStreamReader(options).partitions(start, end)  # a restarted query's driver
    assert replanned.events is None and replanned.end == planned.end


def test_max_batch_size_bounds_each_micro_batch(mcdc: Any, clients: Clients, source_uri: str, tmp_path: Path) -> None:
    sizes: list[int] = []
    checkpoint = str(tmp_path / "cp")

    def run() -> None:
        query = (
            mcdc.readStream.format("mcdc")
            .option("source", source_uri)
            .option("max-batch-size", "2")
            .load()
            .writeStream.foreachBatch(lambda df, _: sizes.append(df.count()))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        ended(query)

    run()
    clients.source.shop.orders.insert_many([{"_id": i} for i in range(5)], ordered=True)
    sizes.clear()
    run()
    assert sizes == [2, 2, 1]


def test_batch_write_of_a_read_collection_is_byte_exact(
    mcdc: Any, clients: Clients, source_uri: str, target_uri: str
) -> None:
    load_corpus(clients.source)
    namespaces = ("corpus.types", "corpus.mixed_ids")
    selected = ",".join([*namespaces, "corpus_other\\.things"])
    df = mcdc.read.format("mcdc").option("source", source_uri).option("include", selected).load()
    (
        df.write.format("mcdc")
        .option("target", target_uri)
        .option("exclude", "corpus_other\\..*")
        .option("rename", "corpus=copy")
        .mode("append")
        .save()
    )
    for ns in namespaces:
        assert raw_docs(target_uri, ns.replace("corpus.", "copy.")) == raw_docs(source_uri, ns)
    assert not {"corpus", "corpus_other"} & set(clients.target.list_database_names())
    with pytest.raises(Exception, match="unknown option 'max-batch'"):
        df.write.format("mcdc").option("target", target_uri).option("max-batch", "5").mode("append").save()


#: What a user does wrong -> mcdc's one line: each fails as soon as Spark hands the options over (load(), a
#: write's save() or start()), before any connection
_MISTAKES: dict[str, tuple[Callable[[Any, str, Path], object], str]] = {
    "read, a bad value": (
        lambda spark, uri, _: spark.read.format("mcdc").option("source", uri).option("workers", "x").load(),
        "mcdc: option workers must be a whole number, got 'x'",
    ),
    "readStream, a misspelled name": (
        lambda spark, uri, _: spark.readStream.format("mcdc").option("source", uri).option("max-batch", "5").load(),
        "mcdc: unknown option 'max-batch' (did you mean 'max-batch-size'?)",
    ),
    "read, no source": (
        lambda spark, uri, _: spark.read.format("mcdc").option("include", "shop\\..*").load(),
        'mcdc: no source: pass .option("source", "mongodb://...") to the mcdc data source',
    ),
    "write, a bad value": (
        lambda spark, uri, _: (
            spark.createDataFrame([], SCHEMA)
            .write.format("mcdc")
            .option("target", uri)
            .option("split", "sometimes")
            .mode("append")
            .save()
        ),
        "mcdc: option split must be one of auto, always, never, got 'sometimes'",
    ),
    "write, mode overwrite": (
        lambda spark, uri, _: (
            spark.createDataFrame([], SCHEMA).write.format("mcdc").option("target", uri).mode("overwrite").save()
        ),
        'mcdc: the mcdc data source writes change events idempotently: use mode("append") (overwrite would '
        "have to drop target data it has no event for)",
    ),
    "writeStream, a bad value": (  # Spark makes a streaming write's sink in the query, not at start()
        lambda spark, uri, cp: (
            spark.readStream.format("rate")
            .load()
            .writeStream.format("mcdc")
            .option("target", uri)
            .option("max-batch-size", "0")
            .option("checkpointLocation", str(cp))
            .start()
            .awaitTermination(QUERY_LIMIT_S)
        ),
        "mcdc: option max-batch-size must be at least 1, got 0",
    ),
}


@pytest.mark.parametrize("mistake", list(_MISTAKES))
def test_a_bad_option_fails_with_mcdc_s_one_line_first(
    mcdc: Any, source_uri: str, tmp_path: Path, mistake: str
) -> None:
    action, expected = _MISTAKES[mistake]
    with pytest.raises(Exception) as caught:  # Spark's AnalysisException, around the data source's error
        action(mcdc, source_uri, tmp_path / "cp")
    text = str(caught.value)
    first = text.splitlines()[0]
    # Spark's error class and its few words first ("[PYTHON_DATA_SOURCE_ERROR] Failed to ...: "; a query
    # adds its own, with its ids), then mcdc's line, whole, and no traceback anywhere
    assert first.endswith(": " + expected), text
    spark_prefix = re.sub(
        r"^\[STREAM_FAILED\] Query \[[^]]*\] terminated with exception: ", "", first[: -len(expected)]
    )
    assert spark_prefix.startswith("[") and len(spark_prefix) < 90, text
    assert "Traceback" not in text, text


def test_stream_write_converges_the_target_on_the_source(
    mcdc: Any, clients: Clients, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    clients.source.shop.create_collection("orders")

    def run() -> None:
        query = (
            mcdc.readStream.format("mcdc")
            .option("source", source_uri)
            .load()
            .writeStream.format("mcdc")
            .option("target", target_uri)
            .option("include", "shop\\..*")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        ended(query)

    run()
    clients.source.shop.orders.insert_one({"_id": 0, "gone": True})
    shop_changes(clients.source)
    run()
    assert raw_docs(target_uri, "shop.orders") == raw_docs(source_uri, "shop.orders")
    assert len(raw_docs(target_uri, "shop.orders")) == 3
    assert "other" not in clients.target.list_database_names()  # outside the writer's selection


def test_example_lands_changes_in_parquet_and_keeps_the_latest_state(
    mcdc: Any, clients: Clients, source_uri: str, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("changes_to_parquet", EXAMPLE)
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    out = tmp_path / "out"
    clients.source.shop.orders.insert_one({"_id": 0})
    job.run(mcdc, source_uri, out, options={"include": "shop\\..*"})
    shop_changes(clients.source)
    job.run(mcdc, source_uri, out, options={"include": "shop\\..*"})
    assert mcdc.read.parquet(str(out / "changes")).count() == 5
    latest = {json.loads(r.key)["_id"]["$numberInt"]: bytes(r.bson) for r in job.read_latest(mcdc, out).collect()}
    # the document deleted was never in the stream's window; 1 updated, 2 and 3 from the transaction
    assert latest == {str(RawBSONDocument(v, RAW)["_id"]): v for v in raw_docs(source_uri, "shop.orders").values()}
    assert sorted(latest) == ["1", "2", "3"]


def test_stream_rows_carry_a_sequence_in_stream_order_the_same_whatever_the_micro_batches(
    mcdc: Any, clients: Clients, source_uri: str, tmp_path: Path
) -> None:
    """A transaction's events share a cluster time: ``sequence`` (time, shard, place) orders them, and a
    query reading the same events in other micro-batches gives each the same sequence."""
    # started before shop has a collection: the selection names what is created later
    options = {"include": "shop\\..*", "max-batch-size": "2", "allow-unmatched": "true"}
    _, ends = stream_rows(mcdc, source_uri, tmp_path / "cp", **options)
    shop_changes(clients.source)
    with clients.source.start_session() as session, session.start_transaction():
        for i in range(10, 15):
            clients.source.shop.orders.insert_one({"_id": i}, session=session)
    rows, _ = stream_rows(mcdc, source_uri, tmp_path / "cp", **options)
    sequences = [tuple(r["sequence"].asDict().values()) for r in rows]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(rows) == 9
    last = [s for s in sequences if s[:2] == sequences[-1][:2]]
    assert [s[3] for s in last] == [0, 1, 2, 3, 4] and {s[2] for s in last} == {""}
    assert all(r["sequence"]["t"] == r["cluster_time"]["t"] for r in rows)
    start = json.dumps(ends[0])  # the same events from the same start, in one micro-batch
    again, _ = stream_rows(mcdc, source_uri, tmp_path / "cp2", **{"include": "shop\\..*", "start-positions": start})
    assert [tuple(r["sequence"].asDict().values()) for r in again] == sequences


def test_relaxed_extended_json_gives_from_json_typed_values(
    mcdc: Any, clients: Clients, source_uri: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    clients.source.shop.users.insert_one({"_id": 1, "name": "ada", "age": 36, "score": 1.5})
    df = (
        mcdc.read.format("mcdc").option("source", source_uri).option("include", "shop\\.users")
        .option("extended-json", "relaxed").load()
    )  # fmt: skip
    typed = df.select(F.from_json("document", "_id INT, name STRING, age INT, score DOUBLE").alias("d")).collect()
    assert [row["d"].asDict() for row in typed] == [{"_id": 1, "name": "ada", "age": 36, "score": 1.5}]
    canonical = mcdc.read.format("mcdc").option("source", source_uri).option("include", "shop\\.users").load()
    assert canonical.select(F.from_json("document", "age INT").alias("d")).collect()[0]["d"]["age"] is None
    (row,) = canonical.collect()
    assert row["sequence"]["n"] == -1 and row["cluster_time"] is None  # at the snapshot's read time


def test_batch_read_takes_the_read_preference_and_the_read_rate(mcdc: Any, clients: Clients, source_uri: str) -> None:
    """Both are data source options (each partition reads at its share of the rate: test_read_policy.py
    checks the commands a partition's read sends)."""
    from tests.test_read_policy import replica_set_uri

    clients.source.rp.c.insert_many([{"_id": i} for i in range(900)])
    df = (
        mcdc.read.format("mcdc")
        .option("source", replica_set_uri(source_uri))
        .option("include", "rp\\.c")
        .option("read-preference", "secondaryPreferred")
        .option("max-read-rate", "20000")
        .option("partition-docs", "300")
        .option("split", "always")
        .load()
    )
    keys = [r.key for r in df.select("key").collect()]
    assert len(keys) == len(set(keys)) == 900


def test_the_spark_data_source_reads_writes_and_streams_the_matches_only(
    mcdc: Any, clients: Clients, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Its ``filter`` option: a batch read gives find(QUERY)'s documents, and so does a writer with it of an
    unfiltered read; in a stream, a document that comes
    to match is a whole row, one that stops matching a "d" row, an insert that does not match no row (an
    update that leaves a document outside is a "d" too: without a pre-image, it may have matched before)."""
    from bson import json_util

    from tests.test_doc_filter import FILTER, QUERY, seed_source

    seed_source(source_uri)
    options = {"include": "flt\\.orders", "filter": FILTER}
    reader = mcdc.read.format("mcdc").option("source", source_uri)
    for key, value in {**options, "partition-docs": "10", "split": "always"}.items():
        reader = reader.option(key, value)
    ids = sorted(json_util.loads(row["key"])["_id"] for row in reader.load().collect())
    assert ids == sorted(d["_id"] for d in clients.source.flt.orders.find(QUERY)) and ids
    whole = mcdc.read.format("mcdc").option("source", source_uri).option("include", "flt\\.orders").load()
    whole.write.format("mcdc").option("target", target_uri).option("filter", FILTER).mode("append").save()
    assert raw_docs(target_uri, "flt.orders") == {
        k: v for k, v in raw_docs(source_uri, "flt.orders").items() if bson.decode(k)["_id"] in ids
    }

    first, _ = stream_rows(mcdc, source_uri, tmp_path / "cp", **options)
    assert first == []
    orders = clients.source.flt.orders
    orders.insert_one({"_id": "never", "region": "US"})
    orders.insert_one({"_id": "leaves", "region": "EU"})
    orders.update_one({"_id": "leaves"}, {"$set": {"region": "US"}})
    orders.update_one({"_id": "never"}, {"$inc": {"n": 1}})
    orders.insert_one({"_id": "enters", "region": "US"})
    orders.update_one({"_id": "enters"}, {"$set": {"region": "UK"}})
    rows, _ = stream_rows(mcdc, source_uri, tmp_path / "cp", **options)
    got = [(r["op"], json_util.loads(r["key"])["_id"]) for r in rows]
    assert got == [("c", "leaves"), ("d", "leaves"), ("d", "never"), ("replace", "enters")], got
    assert json_util.loads(rows[3]["document"]) == {"_id": "enters", "region": "UK"}
