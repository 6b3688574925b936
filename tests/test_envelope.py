"""ChangeEvent -> Debezium-compatible records (no server): keys, envelopes, tombstones, transactions, DDL."""

from __future__ import annotations

import datetime
import json
from typing import Any

import bson
import pytest
from bson import json_util
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.bsonkit.extjson import CANONICAL
from replicator.errors import ConfigError
from replicator.events import ChangeEvent, Namespace, Op
from replicator.events.normalize import normalize_change, snapshot_read
from replicator.settings.resolve import resolve
from replicator.sinks.kafka.options import producer_config
from replicator.sinks.records.envelope import Encoder, EnvelopeOptions, Message, transaction_id
from replicator.sinks.records.topics import TopicNamer, avro_name

NOW = 1_800_000_000.123
LSID = {"id": bson.Binary(bytes(range(16)), 4), "uid": bson.Binary(b"\x00" * 32, 0)}


def raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


def change(op: str, **fields: Any) -> ChangeEvent:
    doc = {
        "_id": {"_data": "82"},
        "operationType": op,
        "clusterTime": Timestamp(1_700_000_000, 7),
        "wallTime": datetime.datetime(2023, 11, 14, 22, 13, 20),
        "ns": {"db": "shop", "coll": "orders"},
        **fields,
    }
    event = normalize_change(raw(doc), "rs0")
    assert event is not None
    return event


def encoder(style: str = "debezium", **kw: Any) -> Encoder:
    return Encoder(EnvelopeOptions(style=style, **kw), TopicNamer("fulfillment"), clock=lambda: NOW)


def decode(message: Message) -> tuple[dict[str, Any], dict[str, Any] | None]:
    assert message.key is not None
    return json.loads(message.key), json.loads(message.value) if message.value is not None else None


def ext(text: str) -> Any:
    """An extended JSON string -> BSON values (canonical)."""
    return json_util.loads(text, json_options=CANONICAL)


OID = bson.ObjectId("596e275826f08b2730779e1f")
DOC = {"_id": OID, "n": bson.Int64(5), "price": bson.Decimal128("1.10"), "at": datetime.datetime(2020, 1, 1)}


def test_insert_is_debezium_create_with_canonical_after_and_key() -> None:
    [msg] = encoder().encode([change("insert", documentKey={"_id": OID}, fullDocument=DOC)])
    key, value = decode(msg)
    assert msg.topic == "fulfillment.shop.orders"
    assert key == {"id": '{"$oid":"596e275826f08b2730779e1f"}'}
    assert value is not None and value["op"] == "c" and value["ts_ms"] == int(NOW * 1000)
    after = ext(value["after"])
    assert after == DOC and isinstance(after["n"], bson.Int64) and isinstance(after["price"], bson.Decimal128)
    assert value["before"] is None and value["updateDescription"] is None and value["transaction"] is None
    source = value["source"]
    assert source["connector"] == "mongodb" and source["name"] == "fulfillment" and source["rs"] == "rs0"
    assert (source["db"], source["collection"], source["snapshot"]) == ("shop", "orders", "false")
    assert source["ord"] == 7 and source["ts_ms"] == 1_700_000_000_000 and source["wallTime"] == 1_700_000_000_000
    assert source["lsid"] is None and source["txnNumber"] is None


def test_update_carries_update_description_and_lookup_after() -> None:
    event = change(
        "update",
        documentKey={"_id": 1},
        fullDocument={"_id": 1, "a": 2},
        updateDescription={
            "updatedFields": {"a": 2, "d": bson.Decimal128("NaN")},
            "removedFields": ["gone"],
            "truncatedArrays": [{"field": "arr", "newSize": 1}],
        },
    )
    key, value = decode(encoder().encode([event])[0])
    assert key == {"id": '{"$numberInt":"1"}'}
    assert value is not None and value["op"] == "u"
    update = value["updateDescription"]
    assert ext(update["updatedFields"]) == {"a": 2, "d": bson.Decimal128("NaN")}
    assert update["removedFields"] == ["gone"] and update["truncatedArrays"] == [{"field": "arr", "size": 1}]
    assert ext(value["after"]) == {"_id": 1, "a": 2}


def test_replace_is_an_update_with_after_and_before_when_pre_images_on() -> None:
    event = change(
        "replace", documentKey={"_id": "x"}, fullDocument={"_id": "x", "v": 2}, fullDocumentBeforeChange={"_id": "x"}
    )
    _, value = decode(encoder().encode([event])[0])
    assert value is not None and value["op"] == "u" and value["updateDescription"] is None
    assert ext(value["after"]) == {"_id": "x", "v": 2} and ext(value["before"]) == {"_id": "x"}


def test_delete_is_followed_by_a_tombstone_with_the_same_key_unless_off() -> None:
    event = change("delete", documentKey={"_id": OID})
    delete, tombstone = encoder().encode([event])
    assert decode(delete)[1] is not None and decode(delete)[1]["op"] == "d"  # type: ignore[index]
    assert tombstone.key == delete.key and tombstone.value is None and tombstone.topic == delete.topic
    assert len(encoder(tombstones=False).encode([event])) == 1


def test_snapshot_read_is_op_r_with_snapshot_true_and_the_source_name() -> None:
    enc = encoder()
    enc.source_name = "rs9"
    _, value = decode(enc.encode([snapshot_read(Namespace("shop", "orders"), raw(DOC))])[0])
    assert value is not None and value["op"] == "r"
    assert value["source"]["snapshot"] == "true" and value["source"]["rs"] == "rs9"
    assert value["source"]["ts_ms"] == int(NOW * 1000)


def test_source_carries_debezium_3_ts_us_and_ts_ns_of_the_same_instant_in_debeziums_order() -> None:
    """Debezium 2.6+: source.ts_us/ts_ns after sequence; a change's from its wallTime (milliseconds), a
    snapshot read's from the time it was read (to the microsecond); the envelope itself has neither (as
    Debezium 3.6's MongoDB connector writes it)."""
    for direct in (True, False):
        enc = Encoder(EnvelopeOptions(), TopicNamer("fulfillment"), clock=lambda: NOW, direct=direct)
        insert = change("insert", documentKey={"_id": 1}, fullDocument={"_id": 1})
        no_wall = change("insert", documentKey={"_id": 2}, fullDocument={"_id": 2}, wallTime=None)
        read = snapshot_read(Namespace("shop", "orders"), raw(DOC))
        values = [decode(m)[1] for m in enc.encode([insert, no_wall, read])]
        sources = [v["source"] for v in values if v is not None]
        assert [(s["ts_ms"], s["ts_us"], s["ts_ns"]) for s in sources] == [
            (1_700_000_000_000, 1_700_000_000_000_000, 1_700_000_000_000_000_000),
            (1_700_000_000_000, 1_700_000_000_000_000, 1_700_000_000_000_000_000),  # the cluster time's seconds
            (1_800_000_000_123, int(NOW * 1_000_000), int(NOW * 1_000_000) * 1000),
        ]
        assert sources[2]["ts_us"] // 1000 == sources[2]["ts_ms"]
        order = [k for k in sources[0] if k != "rs"]
        assert order == ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us", "ts_ns",
                         "collection", "ord", "lsid", "txnNumber", "wallTime"]  # fmt: skip
        assert all(list(v) == ["before", "after", "updateDescription", "source", "op", "ts_ms", "transaction"]
                   for v in values if v is not None)  # fmt: skip


def test_snapshot_read_has_ord_minus_one_as_debezium_3_and_a_change_its_increment() -> None:
    for direct in (True, False):
        enc = Encoder(EnvelopeOptions(), TopicNamer("p"), clock=lambda: NOW, direct=direct)
        read = snapshot_read(Namespace("shop", "orders"), raw(DOC))
        insert = change("insert", documentKey={"_id": 1}, fullDocument={"_id": 1})
        [r, c] = [decode(m)[1] for m in enc.encode([read, insert])]
        assert r is not None and c is not None
        assert (r["source"]["ord"], c["source"]["ord"]) == (-1, 7)
        assert r["source"]["wallTime"] is None and r["source"]["snapshot"] == "true"


def test_legacy_envelope_keeps_debezium_1_source_without_ts_us() -> None:
    read = snapshot_read(Namespace("shop", "orders"), raw(DOC))
    [msg] = encoder("debezium-legacy").encode([read])
    _, value = decode(msg)
    assert value is not None and "ts_us" not in value["source"] and value["source"]["ord"] == 0


def test_relaxed_extended_json_on_request() -> None:
    [msg] = encoder(relaxed=True).encode([change("insert", documentKey={"_id": 1}, fullDocument={"_id": 1, "n": 2})])
    key, value = decode(msg)
    assert key == {"id": "1"} and value is not None and json.loads(value["after"]) == {"_id": 1, "n": 2}


def test_legacy_envelope_has_after_patch_and_filter() -> None:
    enc = encoder("debezium-legacy")
    insert, update, delete, _ = enc.encode(
        [
            change("insert", documentKey={"_id": 1}, fullDocument={"_id": 1, "a": 1}),
            change(
                "update",
                documentKey={"_id": 1},
                updateDescription={"updatedFields": {"a": 2}, "removedFields": ["b"], "truncatedArrays": []},
            ),
            change("delete", documentKey={"_id": 1}),
        ]
    )
    _, v = decode(insert)
    assert v is not None and ext(v["after"]) == {"_id": 1, "a": 1} and v["patch"] is None and v["filter"] is None
    assert v["source"]["snapshot"] is False and "stxnid" in v["source"]
    _, v = decode(update)
    assert v is not None and ext(v["patch"]) == {"$set": {"a": 2}, "$unset": {"b": True}}
    assert ext(v["filter"]) == {"_id": 1} and v["after"] is None
    _, v = decode(delete)
    assert v is not None and v["op"] == "d" and ext(v["filter"]) == {"_id": 1}


def legacy_patch(**update_description: Any) -> Any:
    desc = {"updatedFields": {}, "removedFields": [], "truncatedArrays": [], **update_description}
    [msg] = encoder("debezium-legacy").encode([change("update", documentKey={"_id": 1}, updateDescription=desc)])
    _, value = decode(msg)
    assert value is not None
    return ext(value["patch"])


def test_legacy_patch_of_a_push_with_slice_is_one_update_mongodb_accepts() -> None:
    # [1, 2, 3] after $push: {arr: {$each: [4], $slice: -2}} is [3, 4]: both elements set, the array cut to 2;
    # "$set arr.0" beside "$push arr" is refused by MongoDB (ConflictingUpdateOperators)
    patch = legacy_patch(updatedFields={"arr.0": 3, "arr.1": 4}, truncatedArrays=[{"field": "arr", "newSize": 2}])
    assert patch == {"$set": {"arr": [3, 4]}}


def test_legacy_patch_keeps_a_truncation_beside_unrelated_fields_in_one_update() -> None:
    patch = legacy_patch(updatedFields={"a": 1}, removedFields=["b"], truncatedArrays=[{"field": "arr", "newSize": 1}])
    assert patch == {"$set": {"a": 1}, "$unset": {"b": True}, "$push": {"arr": {"$each": [], "$slice": 1}}}


def test_legacy_patch_that_no_single_update_can_hold_is_its_steps_in_order() -> None:
    # [1, 2, 3, 3] after $pull: {arr: 2} is [1, 3, 3]: only arr.1 changed, then the array was cut to 3
    patch = legacy_patch(updatedFields={"arr.1": 3}, truncatedArrays=[{"field": "arr", "newSize": 3}])
    assert patch == [{"$push": {"arr": {"$each": [], "$slice": 3}}}, {"$set": {"arr.1": 3}}]


def test_transaction_metadata_wraps_a_transaction_in_begin_and_end() -> None:
    txn = {"lsid": LSID, "txnNumber": bson.Int64(4)}
    events = [
        change("insert", documentKey={"_id": 1}, fullDocument={"_id": 1}, **txn),
        change("insert", documentKey={"_id": 2}, fullDocument={"_id": 2}, ns={"db": "shop", "coll": "items"}, **txn),
        change("delete", documentKey={"_id": 1}, **txn),
        change("insert", documentKey={"_id": 3}, fullDocument={"_id": 3}),
    ]
    messages = encoder(tx_metadata=True).encode(events)
    topics = [m.topic for m in messages]
    assert topics[0] == topics[5] == "fulfillment.transaction"
    begin, end = decode(messages[0])[1], decode(messages[5])[1]
    # as Debezium 3.6 names a transaction: its lsid in the Java driver's strict JSON, then the txnNumber
    lsid = '{"id": {"$binary": "AAECAwQFBgcICQoLDA0ODw==","$type": "04"},"uid": {"$binary": "%s","$type": "00"}}' % (
        "A" * 43 + "="
    )
    tx_id = f"{lsid}:4"
    assert transaction_id(events[0].txn) == "00010203-0405-0607-0809-0a0b0c0d0e0f:4"  # type: ignore[arg-type]
    assert begin == {
        "status": "BEGIN",
        "id": tx_id,
        "event_count": None,
        "data_collections": None,
        "ts_ms": 1_700_000_000_000,
    }
    assert end is not None and end["status"] == "END" and end["event_count"] == 3
    assert end["data_collections"] == [
        {"data_collection": "shop.orders", "event_count": 2},
        {"data_collection": "shop.items", "event_count": 1},
    ]
    blocks = [decode(m)[1]["transaction"] for m in messages[1:5] if m.value is not None]  # type: ignore[index]
    assert blocks == [
        {"id": tx_id, "total_order": 1, "data_collection_order": 1},
        {"id": tx_id, "total_order": 2, "data_collection_order": 1},
        {"id": tx_id, "total_order": 3, "data_collection_order": 2},
    ]
    assert decode(messages[1])[1]["source"]["txnNumber"] == 4  # type: ignore[index]
    assert {decode(m)[1]["source"]["lsid"] for m in messages[1:4] if m.value} == {lsid}  # type: ignore[index]
    slow = Encoder(EnvelopeOptions(tx_metadata=True), TopicNamer("fulfillment"), clock=lambda: NOW, direct=False)
    assert slow.encode(events) == messages
    assert decode(messages[-1])[1]["transaction"] is None  # type: ignore[index]


def test_ddl_goes_to_the_ddl_topic_keyed_by_database() -> None:
    event = change(
        "rename", to={"db": "shop", "coll": "archive"}, operationDescription={"to": {"db": "shop", "coll": "archive"}}
    )
    [msg] = encoder().encode([event])
    key, value = decode(msg)
    assert msg.topic == "fulfillment.ddl" and key == {"db": "shop"}
    assert value is not None and value["op"] == "rename" and value["to"] == {"db": "shop", "collection": "archive"}
    assert encoder().encode([change("invalidate")]) == []


def test_schemas_wrap_key_and_value_like_the_json_converter() -> None:
    [msg] = encoder(schemas=True).encode([change("insert", documentKey={"_id": 1}, fullDocument={"_id": 1})])
    key, value = decode(msg)
    assert key["schema"]["name"] == "fulfillment.shop.orders.Key" and key["payload"] == {"id": '{"$numberInt":"1"}'}
    assert value is not None and value["schema"]["name"] == "fulfillment.shop.orders.Envelope"
    fields = {f["field"]: f for f in value["schema"]["fields"]}
    assert set(fields) == set(value["payload"])
    assert fields["source"]["name"] == "io.debezium.connector.mongo.Source"
    assert {f["field"] for f in fields["source"]["fields"]} == set(value["payload"]["source"])
    assert [f["field"] for f in fields["source"]["fields"]] == list(value["payload"]["source"])
    snapshot = next(f for f in fields["source"]["fields"] if f["field"] == "snapshot")
    assert list(snapshot) == ["type", "optional", "name", "version", "parameters", "default", "field"]
    assert snapshot["parameters"]["allowed"].split(",") == [
        "true", "first", "first_in_data_collection", "last_in_data_collection", "last", "false", "incremental"
    ]  # fmt: skip


def test_plain_format_is_mcdcs_own_event_with_extended_json_objects() -> None:
    [msg] = encoder("plain").encode(
        [change("insert", documentKey={"_id": 1}, fullDocument={"_id": 1, "n": bson.Int64(2)})]
    )
    _, value = decode(msg)
    assert value is not None and value["op"] == "c" and value["ns"] == "shop.orders"
    assert value["document"] == {"_id": {"$numberInt": "1"}, "n": {"$numberLong": "2"}}
    assert value["clusterTime"] == {"t": 1_700_000_000, "i": 7} and value["rs"] == "rs0"


def test_heartbeat_record_and_its_pace() -> None:
    paced = Encoder(EnvelopeOptions(), TopicNamer("fulfillment"), heartbeat_s=3600, clock=lambda: NOW)
    assert paced.due_heartbeat() is not None and paced.due_heartbeat() is None  # one per interval
    assert encoder().due_heartbeat() is None  # off by default
    msg = encoder().heartbeat()
    assert msg.topic == "__debezium-heartbeat.fulfillment"
    assert decode(msg) == ({"serverName": "fulfillment"}, {"ts_ms": int(NOW * 1000)})


def test_topic_names_routes_and_sanitizing() -> None:
    plain = TopicNamer("app", ("shop\\.orders_(\\d+)=shop.orders", "logs\\..*=logs"))
    assert plain.data(Namespace("shop", "orders_2024")) == "shop.orders"
    assert plain.data(Namespace("logs", "x")) == "logs"
    assert plain.data(Namespace("my-db", "a b$c")) == "app.my-db.a_b_c"  # Kafka-illegal characters
    avro = TopicNamer("1app", sanitize=True)
    assert avro.data(Namespace("my-db", "9lives")) == "_1app.my_db._9lives"
    assert avro_name("ok_Name1") == "ok_Name1"
    assert (plain.transaction, plain.ddl, plain.heartbeat) == ("app.transaction", "app.ddl", "__debezium-heartbeat.app")


def test_producer_settings_pass_through_and_refuse_what_would_lose_data() -> None:
    config = producer_config(("linger.ms=20", "compression.type=gzip", "client.id=mcdc-1"), ["b:9092"])
    assert config["acks"] == "all" and config["enable_idempotence"] is True
    assert (config["linger_ms"], config["compression_type"], config["client_id"]) == (20, "gzip", "mcdc-1")
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cret";'
    sasl = producer_config(
        ("security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN", f"sasl.jaas.config={jaas}"), ["b:1"]
    )
    assert (sasl["sasl_plain_username"], sasl["sasl_plain_password"]) == ("u", "s3cret")
    with pytest.raises(ConfigError, match="acks=all"):
        producer_config(("acks=1",), ["b:1"])
    with pytest.raises(ConfigError, match="not a producer setting"):
        producer_config(("no.such=1",), ["b:1"])
    with pytest.raises(ConfigError) as err:
        producer_config(("sasl.jaas.config=garbage-s3cret",), ["b:1"])
    assert "s3cret" not in str(err.value)


def test_event_sink_settings_are_validated() -> None:
    base = {"source": "mongodb://a:1", "target": "kafka://b:9092"}
    s = resolve({**base, "tombstones": "off", "envelope": "debezium-legacy"}, env={})
    assert s.tombstones == "off" and s.envelope == "debezium-legacy"
    for bad, message in [
        ({"target": "kafka://nohost"}, "HOST:PORT"),
        ({"target": "kafka://u:p@b:1"}, "sasl.username"),
        ({"envelope": "avro"}, "--envelope"),
        ({"tombstones": "maybe"}, "--tombstones"),
        ({"topic_routes": ("nope",)}, "REGEX=TOPIC"),
        ({"topic_routes": ("(=x",)}, "bad regular expression"),
        ({"kafka_opts": ("sasl.password",)}, "KEY=VALUE"),
        ({"target": "jsonl:"}, "file path"),
    ]:
        with pytest.raises(ConfigError, match=message):
            resolve({**base, **bad}, env={})
    assert ChangeEvent(op=Op.READ, ns=Namespace("a", "b"), document={"_id": 1}).document_key == {"_id": 1}


def test_plain_format_covers_ddl_too() -> None:
    event = change("drop")
    [msg] = encoder("plain").encode([event])
    assert msg.topic == "fulfillment.ddl"
    assert json.loads(msg.value or b"") == {
        "op": "drop",
        "ns": "shop.orders",
        "clusterTime": {"t": 1_700_000_000, "i": 7},
        "wallTime": 1_700_000_000_000,
        "rs": "rs0",
    }


def test_partitioner_matches_kafkas_default() -> None:
    import random

    from aiokafka.partitioner import DefaultPartitioner, murmur2

    from replicator.sinks.kafka.partitioner import murmur2 as fast_murmur2
    from replicator.sinks.kafka.partitioner import partition

    rng = random.Random(7)
    reference = DefaultPartitioner()
    for size in [*range(40), 200]:
        for _ in range(50):
            key = bytes(rng.randrange(256) for _ in range(size))
            assert fast_murmur2(key) == murmur2(key)
            for count in (1, 3, 12):
                assert partition(key, count) == reference(key, list(range(count)), list(range(count)))


def test_a_snapshot_batch_that_ends_the_snapshot_marks_its_final_read_last() -> None:
    reads = [snapshot_read(Namespace("shop", "orders"), raw({"_id": i})) for i in range(3)]
    for schemas in (False, True):
        made = [
            Encoder(EnvelopeOptions(schemas=schemas), TopicNamer("p"), clock=lambda: NOW, direct=direct)
            for direct in (True, False)
        ]
        fast, slow = ([decode(m)[1] for m in enc.iter_copy(reads, last=True)] for enc in made)
        assert fast == slow
        marks = [(v["payload"] if schemas else v)["source"]["snapshot"] for v in fast if v is not None]
        assert marks == ["true", "true", "last"]
        unmarked = [decode(m)[1] for m in made[0].iter_copy(reads, last=False)]
        assert [(v["payload"] if schemas else v)["source"]["snapshot"] for v in unmarked if v] == ["true"] * 3
    legacy = [decode(m)[1] for m in encoder("debezium-legacy").iter_copy(reads, last=True)]
    assert [v["source"]["snapshot"] for v in legacy if v is not None] == [True, True, True]  # 1.x: no mark


def test_interleaved_batches_keep_each_ones_time_in_all_three_units() -> None:
    """The snapshot's workers encode batches at once (the Kafka sink encodes in slices between sends): a
    read's source.ts_us/ts_ns are its own batch's time, as its ts_ms is."""
    for direct in (True, False):
        clock = iter([1_800_000_000.1234567, 1_800_000_007.7654321]).__next__  # one call per batch
        enc = Encoder(EnvelopeOptions(), TopicNamer("p"), clock=clock, direct=direct)
        reads = [snapshot_read(Namespace("shop", "orders"), raw({"_id": i})) for i in range(4)]
        first, second = enc.iter_encode(reads[:2]), enc.iter_encode(reads[2:])
        messages = [next(first), next(second), next(first), next(second)]
        for message in messages:
            source = decode(message)[1]["source"]  # type: ignore[index]
            assert source["ts_us"] // 1000 == source["ts_ms"] and source["ts_ns"] == source["ts_us"] * 1000
        assert {decode(m)[1]["source"]["ts_us"] for m in messages} == {1_800_000_000_123_456, 1_800_000_007_765_432}  # type: ignore[index]
