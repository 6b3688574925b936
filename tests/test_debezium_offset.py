"""--start-after-debezium-offset: reading a Debezium MongoDB connector's offset as Kafka Connect stores it, and
the offsets mcdc refuses, each in one line (exit 2; a token that left the oplog: exit 4, as a checkpoint's).

The parser's tests need no server; the refusals run ``mcdc`` itself, against a mongos stand-in for a sharded
source (tests/support/mongos.py) and a dev server with a small oplog for a token that left it.
"""

from __future__ import annotations

import base64
import json
import signal
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from bson.timestamp import Timestamp

from replicator.checkpoint.debezium_offset import DebeziumOffset, parse, read_option
from replicator.errors import ConfigError
from tests.support.mongos import mongos
from tests.support.servers import free_port
from tests.test_cli import _assert_one_line_error, _mcdc
from tests.test_devserver import DevServer

TOKEN = {"_data": "8263A1B2C3000000012B022C0100296E5A1004"}
TOKEN_B64 = base64.b64encode(bson.encode(TOKEN)).decode()
VALUE = {"sec": 1700000000, "ord": 3, "resume_token": TOKEN_B64}
KEY = '["dbz-connector",{"server_id":"mcdc"}]'


def test_the_value_alone_gives_the_token_and_the_cluster_time() -> None:
    offset = parse(json.dumps(VALUE), prefix="mcdc")
    assert offset.position.resume_token == TOKEN and offset.position.cluster_time == Timestamp(1700000000, 3)
    assert offset.transaction is None and offset.server_id is None and offset.replica_set is None


def test_offsets_topic_lines_take_the_last_value_of_each_key_and_a_tombstone_removes_one() -> None:
    later = {**VALUE, "ord": 9, "transaction_id": "tx:1", "transaction_data_collection_order_shop.orders": 2}
    other = '["dbz-connector",{"server_id":"elsewhere"}]'
    lines = [f"{KEY}\t{json.dumps(VALUE)}", f"{other}\t{json.dumps(VALUE)}", f"{KEY}\t{json.dumps(later)}"]
    offset = parse("\n".join(lines) + f"\n{other}\tnull\n", prefix="mcdc")
    assert offset.position.cluster_time == Timestamp(1700000000, 9) and offset.server_id == "mcdc"
    assert offset.transaction is not None and offset.transaction.id == "tx:1"
    assert offset.transaction.counts == (("shop.orders", 2),) and offset.transaction.total == 2
    assert DebeziumOffset.from_json(offset.to_json()) == offset  # as a checkpoint records it


def test_kafka_connects_rest_answer_of_the_connectors_offsets_is_read_too() -> None:
    """GET /connectors/NAME/offsets (Kafka Connect 3.6+, KIP-875)."""
    answer = {"offsets": [{"partition": {"server_id": "mcdc"}, "offset": VALUE}]}
    offset = parse(json.dumps(answer), prefix="mcdc")
    assert offset.position.resume_token == TOKEN and offset.server_id == "mcdc"
    with pytest.raises(ConfigError, match=r"topic\.prefix mcdc"):
        parse(json.dumps(answer), prefix="shop")


def test_a_token_of_a_snapshot_only_offset_has_no_time_and_an_old_offsets_token_is_its_data() -> None:
    offset = parse(json.dumps({"sec": -1, "ord": -1, "resume_token": TOKEN_B64}), prefix="mcdc")
    assert offset.position.cluster_time is None and offset.position.resume_token == TOKEN
    old = parse(json.dumps({"sec": 5, "ord": 1, "resume_token": TOKEN["_data"]}), prefix="mcdc")
    assert old.position.resume_token == TOKEN  # ResumeTokens.fromData: the _data string as it was stored


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("not json", ("line 1 is not JSON",)),
        ("[1, 2]", ("must be a JSON object",)),
        (f"[1, 2]\t{json.dumps(VALUE)}", ("line 1's key is not a Kafka Connect offset key",)),
        (json.dumps({**VALUE, "initsync": True}), ("initial snapshot (initsync)", "let the connector finish")),
        (json.dumps({"sec": 0, "ord": 0}), ("no resume token and no time",)),
        (json.dumps({"sec": 0, "ord": 0, "h": 5}), ("Debezium 1.x's oplog offset",)),
        (json.dumps({**VALUE, "resume_token": "*not a token*"}), ("neither a token's BSON",)),
        (json.dumps({**VALUE, "sec": "soon"}), ("sec is not a whole number",)),
        (f'["c",{{"server_id":"shop"}}]\t{json.dumps(VALUE)}', ("topic.prefix shop", "--topic-prefix shop")),
        (
            f'["c",{{"server_id":"mcdc","rs":"rs0"}}]\t{json.dumps(VALUE)}\n'
            f'["c",{{"server_id":"mcdc","rs":"rs1"}}]\t{json.dumps(VALUE)}',
            ("per replica set (rs0, rs1)", "take a new snapshot"),
        ),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "not-a-key",
        "initsync",
        "no-position",
        "oplog-offset",
        "bad-token",
        "bad-sec",
        "prefix",
        "per-rs",
    ],
)
def test_an_offset_that_cannot_be_used_is_refused_in_one_line(text: str, words: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(text, prefix="mcdc")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("--start-after-debezium-offset")
    assert all(word in message for word in words), message


def test_the_offset_is_read_from_a_file_given_with_an_at_sign(tmp_path: Path) -> None:
    path = tmp_path / "offset.txt"
    path.write_text(f"{KEY}\t{json.dumps(VALUE)}\n")
    assert read_option(f"@{path}") == path.read_text() and read_option("{}") == "{}"
    with pytest.raises(ConfigError, match="cannot read the file"):
        read_option(f"@{tmp_path / 'missing.txt'}")


def _tail(source: str, tmp_path: Path, offset: str, *extra: str) -> Any:
    args = ["catch-up", "-s", source, "-t", "stdout", "-c", str(tmp_path / "cp.json"), "--no-progress"]
    return _mcdc(*args, "--start-after-debezium-offset", offset, *extra, timeout=120)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ((), ("--envelope debezium --extended-json debezium",)),
        (("--extended-json", "debezium", "--start-at", "1700000000,1"), ("--start-at", "drop one")),
        (("--extended-json", "debezium", "-t", "mongodb://127.0.0.1:2"), ("not an event target",)),
        (("--extended-json", "debezium", "--engine", "spark", "-t", "kafka://127.0.0.1:9"), ("--engine asyncio",)),
    ],
    ids=["canonical-keys", "start-at", "mongodb-target", "spark"],
)
def test_what_would_not_continue_debeziums_topics_is_refused_before_any_connection(
    tmp_path: Path, extra: tuple[str, ...], words: tuple[str, ...]
) -> None:
    result = _tail("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300", tmp_path, json.dumps(VALUE), *extra)
    _assert_one_line_error(result, 2, "--start-after-debezium-offset", *words)
    assert not (tmp_path / "cp.json").exists()


@pytest.mark.integration
def test_a_per_replica_set_offset_through_mongos_is_refused(source_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri, directConnection=True) as client:
        set_name = client.admin.command("hello")["setName"]
    text = f'["c",{{"server_id":"mcdc","rs":"{set_name}"}}]\t{json.dumps(VALUE)}'
    with mongos(source_uri) as stand_in:
        result = _tail(stand_in.uri, tmp_path, text, "--extended-json", "debezium")
    _assert_one_line_error(result, 2, "per-replica-set offset", "mongos", "take a new snapshot")
    assert not (tmp_path / "cp.json").exists()


@pytest.mark.integration
def test_an_offset_of_another_replica_set_or_from_a_later_time_is_refused(source_uri: str, tmp_path: Path) -> None:
    text = f'["c",{{"server_id":"mcdc","rs":"elsewhere"}}]\t{json.dumps(VALUE)}'
    result = _tail(source_uri, tmp_path, text, "--extended-json", "debezium")
    _assert_one_line_error(result, 2, "replica set elsewhere", "another source's offset")
    later = json.dumps({**VALUE, "sec": 4_000_000_000})
    result = _tail(source_uri, tmp_path, later, "--extended-json", "debezium")
    _assert_one_line_error(result, 2, "later than the source's current time", "another source's")
    assert not (tmp_path / "cp.json").exists()


@pytest.mark.integration
def test_a_token_that_left_the_oplog_ends_the_run_with_exit_4(tmp_path: Path) -> None:
    server = DevServer(free_port(), tmp_path / "data", tmp_path / "stderr.log", "--oplog-entries", "100")
    try:
        uri = server.uri()  # read once: the server prints it once
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
            things = client.trial.create_collection("things")
            with things.watch() as stream:
                things.insert_one({"_id": "first"})
                change = stream.next()
            for batch in range(15):  # past the oplog's 100 entries: the change's entry is pruned
                things.insert_many([{"_id": batch * 100 + n} for n in range(100)])
        ct = change["clusterTime"]
        value = {"sec": ct.time, "ord": ct.inc, "resume_token": base64.b64encode(bson.encode(change["_id"])).decode()}
        result = _tail(uri, tmp_path, json.dumps(value), "--extended-json", "debezium")
        _assert_one_line_error(result, 4)
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.close()


@pytest.mark.parametrize(("name", "value"), [("extended-json", "debezium"), ("start-after-debezium-offset", "{}")])
def test_the_spark_data_source_refuses_debeziums_options_it_does_not_follow(name: str, value: str) -> None:
    """Its rows hold canonical or relaxed Extended JSON: taking these and writing something else would be a slip."""
    from replicator.spark_datasource.options import settings_for

    with pytest.raises(ConfigError, match=f"option {name}: .*the data source's rows"):
        settings_for({"source": "mongodb://127.0.0.1:1", name: value})
