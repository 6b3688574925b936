"""The test support code itself: servers start and restart, and the corpus survives a round trip."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import bson
import pytest
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.write_concern import WriteConcern

from tests.support import servers
from tests.support.corpus import (
    BIG_DOCUMENT_SIZE,
    MIXED_ID_BRACKETS,
    OPTIONAL_IDS,
    bson_corpus_documents,
    load_bulk,
    load_corpus,
    mixed_id_documents,
    mixed_id_values,
)
from tests.support.servers import Clients

RAW: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
# $type names of every _id bracket (UUIDs are binData too).
ID_TYPES = {"minKey", "null", "int", "long", "double", "decimal", "string", "object", "binData", "objectId"}
ID_TYPES |= {"bool", "date", "timestamp", "maxKey"}


def _kinds(value: Any) -> set[str]:
    """Names of the BSON value kinds inside a decoded value (binary subtypes and code-with-scope apart)."""
    if isinstance(value, dict):
        return {"document"}.union(*(_kinds(v) for v in value.values()))
    if isinstance(value, list):
        return {"array"}.union(*(_kinds(v) for v in value))
    if isinstance(value, bytes):  # subtype 0 decodes to bytes, the others to Binary (a bytes subclass)
        return {f"binary_{getattr(value, 'subtype', 0)}"}
    if isinstance(value, Code):
        return {"code_w_scope" if value.scope is not None else "code"} | _kinds(value.scope or {})
    return {type(value).__name__}


def _raw(db: Database[Any], name: str) -> Collection[RawBSONDocument]:
    """The collection read as undecoded BSON, for byte-for-byte comparisons."""
    return cast("Collection[RawBSONDocument]", db.get_collection(name, codec_options=RAW))


@pytest.fixture
def corpus(clients: Clients) -> dict[str, Any]:
    return load_corpus(clients.source)


def test_corpus_is_deterministic_and_covers_every_type() -> None:
    first, second = bson_corpus_documents(), bson_corpus_documents()
    assert [bson.encode(d) for d in first] == [bson.encode(d) for d in second]
    decoded = [bson.decode(bson.encode(d), RAW.with_options(document_class=dict)) for d in first]
    kinds = set().union(*(_kinds(d) for d in decoded))
    expected = {"float", "str", "document", "array", "ObjectId", "bool", "datetime", "DatetimeMS", "NoneType"}
    expected |= {"Regex", "code", "code_w_scope", "int", "Timestamp", "Int64", "Decimal128", "MinKey", "MaxKey"}
    expected |= {"DBRef"} | {f"binary_{s}" for s in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 128)}
    assert expected <= kinds, expected - kinds
    assert max(len(bson.encode(d)) for d in first) == BIG_DOCUMENT_SIZE


def test_mixed_ids_are_distinct_and_cycle_through_brackets() -> None:
    docs = mixed_id_documents(500)
    assert len(mixed_id_values()) == len(MIXED_ID_BRACKETS)
    assert {d["bracket"] for d in docs} == set(MIXED_ID_BRACKETS)
    assert [d["n"] for d in docs] == list(range(500))


def test_corpus_loads(clients: Clients, corpus: dict[str, Any]) -> None:
    types_count = len(bson_corpus_documents()) - len(corpus["rejected_documents"])
    assert set(corpus["rejected_documents"]) <= OPTIONAL_IDS
    assert corpus["namespaces"] == {
        "corpus.capped": 100,
        "corpus.indexed": 200,
        "corpus.mixed_ids": 3000,
        "corpus.types": types_count,
        "corpus.validated": 4,
        "corpus.validated_view": 3,
        "corpus_other.dotted.name": 1,
        "corpus_other.things": 10,
    }
    assert all(("hashed" in s or "text" in s or "$**" in s) for s in corpus["skipped_indexes"])
    db = clients.source.corpus
    options = {c["name"]: c for c in db.list_collections()}
    assert options["capped"]["options"]["capped"] is True
    assert options["validated"]["options"]["validationLevel"] == "moderate"
    assert options["validated"]["options"]["collation"]["locale"] == "fr"
    assert options["validated_view"]["type"] == "view"
    indexes = db.indexed.index_information()
    assert indexes["sku_1_region_-1"]["unique"] is True
    assert "partialFilterExpression" in indexes["qty_1"]
    assert indexes["expires_at_1"]["expireAfterSeconds"] > 0
    assert indexes["optional_1"]["sparse"] is True
    assert indexes["location_2dsphere"]["key"] == [("location", "2dsphere")]
    assert indexes["created_-1"]["key"] == [("created", -1)]
    assert indexes["by_name_ci"]["collation"]["strength"] == 2


def test_types_read_back_byte_identical(clients: Clients, corpus: dict[str, Any]) -> None:
    types = _raw(clients.source.corpus, "types")
    checked = 0
    for doc in bson_corpus_documents():
        if isinstance(doc["_id"], str) and doc["_id"] in corpus["rejected_documents"]:
            continue
        stored = types.find_one({"_id": doc["_id"]})
        assert stored is not None, doc["_id"]
        assert stored.raw == bson.encode(doc, codec_options=RAW), doc["_id"]
        checked += 1
    assert checked == types.count_documents({})


def test_mixed_ids_have_every_type_bracket(clients: Clients, corpus: dict[str, Any]) -> None:
    coll = clients.source.corpus.mixed_ids
    by_type = {g["_id"]: g["n"] for g in coll.aggregate([{"$group": {"_id": {"$type": "$_id"}, "n": {"$sum": 1}}}])}
    assert set(by_type) == ID_TYPES
    assert sum(by_type.values()) == 3000
    for value in mixed_id_values():  # each kind of _id must be usable as an exact lookup key
        assert coll.count_documents({"_id": value}) == 1, value
    # mixed_id_values() is in MongoDB's cross-type sort order; the first documents hold those values
    fixed = coll.find({"n": {"$lt": len(MIXED_ID_BRACKETS)}}).sort("_id", 1)
    assert [d["bracket"] for d in fixed] == list(MIXED_ID_BRACKETS)


def test_load_bulk(clients: Clients) -> None:
    assert load_bulk(clients.source, "bench", "docs", 2500, doc_size=600) == 2500
    coll = _raw(clients.source.bench, "docs")
    assert coll.count_documents({}) == 2500
    sizes = [len(d.raw) for d in coll.find().limit(50)]
    assert all(abs(size - 600) <= 16 for size in sizes), sizes


def test_drop_user_databases_keeps_system_databases(source_uri: str) -> None:
    with servers.connect(source_uri) as client:
        client.scratch.things.insert_one({"_id": 1})
        assert "scratch" in servers.drop_user_databases(source_uri)
        names = client.list_database_names()
    assert set(names) <= servers.SYSTEM_DATABASES


def test_a_collection_dropped_while_collections_are_listed_stays_dropped(source_uri: str) -> None:
    """mongod lists collections from one snapshot, so a drop that races a listCollections stays a drop.
    SecantusDB minted a UUID for a listed name that was gone by then, which created the collection again,
    empty and with no change event; the test servers run with that mended (tests/support/secantus_server.py)."""
    stop = threading.Event()

    def list_all_along() -> None:
        with servers.connect(source_uri) as lister:
            while not stop.is_set():
                list(lister.ghosts.list_collections())

    thread = threading.Thread(target=list_all_along)
    thread.start()
    dropped: list[str] = []
    with servers.connect(source_uri) as client:
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                name = f"x_{len(dropped)}"
                client.ghosts[name].insert_one({"_id": 1})
                client.ghosts.drop_collection(name)
                dropped.append(name)
        finally:
            stop.set()
            thread.join()
        back = sorted(set(dropped) & set(client.ghosts.list_collection_names()))
        client.drop_database("ghosts")
    assert len(dropped) > 20
    assert not back, f"{len(back)} of {len(dropped)} dropped collections came back: {back[:5]}"


@pytest.mark.integration
@pytest.mark.parametrize("schema", ["drop a collection", "drop a view", "create an index", "drop an index"])
def test_a_journaled_schema_command_survives_a_kill_9_right_after_its_acknowledgement(
    tmp_path: Path, schema: str
) -> None:
    """A schema command acknowledged with ``j: true`` (mcdc's journaled majority) is in the journal, as on
    mongod, also when no write follows it before a kill -9. SecantusDB synced the journal for document
    writes only: such a drop or index build was lost (the chaos harness's "namespaces differ:
    ['chaos.view_64']", soak seed 3802); the test servers run with that mended (secantus_server.py)."""
    durable = WriteConcern(w="majority", j=True)
    with servers.LocalServer(tmp_path / "db") as server, servers.connect(server.uri) as client:
        db = client.get_database("ddl", write_concern=durable)
        db.create_collection("a")
        db.a.insert_one({"_id": 1, "v": 1})
        db.create_collection("gone")
        db.create_collection("gone_view", viewOn="a", pipeline=[{"$match": {"v": 1}}])
        db.a.create_index("old", name="old_1")
        db.a.insert_one({"_id": 2, "v": 2})  # a journaled write: all of the above is in the journal
        if schema == "drop a collection":
            db.drop_collection("gone")
        elif schema == "drop a view":
            db.drop_collection("gone_view")
        elif schema == "create an index":
            db.a.create_index("new", name="new_1")
        else:
            db.a.drop_index("old_1")
        server.kill()  # at once: nothing written after the acknowledgement
        server.start()
        names, indexes = set(db.list_collection_names()), set(db.a.index_information())
    dropped = {"drop a collection": {"gone"}, "drop a view": {"gone_view"}}.get(schema, set())
    assert {"a", "gone", "gone_view"} - names == dropped, names
    assert ("new_1" in indexes) == (schema == "create an index"), indexes
    assert ("old_1" in indexes) == (schema != "drop an index"), indexes


@pytest.mark.integration
def test_a_journaled_transaction_survives_a_kill_9_right_after_its_commit(tmp_path: Path) -> None:
    """A ``commitTransaction`` acknowledged with ``j: true`` is in the journal, as on mongod. SecantusDB
    left it in memory: a kill -9 right after the commit lost it (3 of 3 trials on the plain server), which
    lost replayed transactions behind a saved checkpoint (issue 48); the test servers run with that mended
    (secantus_server.py). Several transactions, each followed at once by the kill."""
    durable = WriteConcern(w="majority", j=True)
    with servers.LocalServer(tmp_path / "db") as server:
        for trial in range(3):
            with servers.connect(server.uri) as client:
                coll = client.get_database("txn", write_concern=durable).t
                if trial == 0:
                    coll.insert_one({"_id": "before"})  # the collection exists before any transaction
                with client.start_session() as session, session.start_transaction(write_concern=durable):
                    coll.insert_many([{"_id": f"{trial}-{n}"} for n in range(5)], session=session)
                server.kill()  # at once: nothing written after the acknowledgement
            server.start()
            with servers.connect(server.uri) as client:
                found = client.txn.t.count_documents({"_id": {"$regex": f"^{trial}-"}})
            assert found == 5, f"trial {trial}: the committed transaction lost {5 - found} of its 5 documents"


def test_a_clustered_collections_ttl_changed_by_coll_mod_is_stored(source_uri: str) -> None:
    """mongod 5.3+ sets a clustered collection's expireAfterSeconds with collMod; SecantusDB answered ok and
    kept the old value (the test servers run with that mended: secantus_server.py)."""
    with servers.connect(source_uri) as client:
        client.clustered.command(
            {"create": "c", "clusteredIndex": {"key": {"_id": 1}, "unique": True}, "expireAfterSeconds": 600}
        )
        client.clustered.command("collMod", "c", expireAfterSeconds=60)
        options = client.clustered.command("listCollections", filter={"name": "c"})["cursor"]["firstBatch"][0]
        client.drop_database("clustered")
    assert options["options"]["expireAfterSeconds"] == 60


@pytest.mark.integration
def test_local_server_restart_keeps_data(tmp_path: Path) -> None:
    with servers.LocalServer(tmp_path / "db") as server:
        port = server.port
        with servers.connect(server.uri) as client:
            client.keep.items.insert_many([{"_id": i} for i in range(10)], ordered=True)
            server.restart()
            assert server.port == port
            assert client.keep.items.count_documents({}) == 10
    assert not server.running
    assert (tmp_path / "db.log").exists()


def test_missing_server_executable_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="pip install SecantusDB"):
        servers.LocalServer(tmp_path / "db").start()


def test_external_uris(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(servers.TARGET_URI_ENV, raising=False)
    monkeypatch.setenv(servers.SOURCE_URI_ENV, "mongodb://src")
    assert servers.external_uris() is None
    monkeypatch.setenv(servers.TARGET_URI_ENV, "mongodb://dst")
    assert servers.external_uris() == ("mongodb://src", "mongodb://dst")
    assert 0 < servers.free_port() < 65536
