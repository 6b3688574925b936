"""MongoDB as the source of Spark's Auto CDC (SCD type 1 and 2), from an existing collection on:

* the rows the ``mcdc`` data source makes of a real change stream, folded as Auto CDC folds them
  (tests/support/scd.py): SCD1 and SCD2's current rows are the source's documents, a delete and a re-insert
  of one ``_id`` in one transaction included; with exact post-images, SCD2 keeps one version per change;
* the example pipeline (examples/spark/auto_cdc) run as ``spark-pipelines run`` runs it, over a local Spark
  Connect server whose catalog takes MERGE (a test catalog compiled here: Delta's and Iceberg's jars cannot
  be had on these machines), twice: the collection's documents, then its changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from tests.support.rowlevel_catalog import compile_catalog
from tests.support.scd import scd1, scd2

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "spark" / "auto_cdc"
FIELDS = ("name", "age")


def _existing(client: pymongo.MongoClient[dict[str, Any]]) -> None:
    client.shop.create_collection("users")
    client.shop.users.insert_many([{"_id": i, "name": f"user{i}", "age": 20 + i} for i in range(10)])


def _changes(client: pymongo.MongoClient[dict[str, Any]]) -> None:
    """Inserts, updates, a replace, deletes, and transactions: one deletes and inserts again one _id."""
    users = client.shop.users
    users.insert_many([{"_id": 10, "name": "new", "age": 1}, {"_id": 11, "name": "newer", "age": 2}])
    users.update_one({"_id": 1}, {"$set": {"age": 40}})
    users.update_one({"_id": 2}, {"$set": {"age": 41}})
    users.update_one({"_id": 2}, {"$set": {"name": "renamed"}})
    users.delete_one({"_id": 3})
    users.replace_one({"_id": 4}, {"name": "replaced", "age": 44})
    with client.start_session() as session, session.start_transaction():
        users.delete_one({"_id": 5}, session=session)
        users.insert_one({"_id": 5, "name": "again", "age": 55}, session=session)
    with client.start_session() as session, session.start_transaction():
        users.update_one({"_id": 6}, {"$set": {"age": 60}}, session=session)
        users.delete_one({"_id": 7}, session=session)
        users.update_one({"_id": 6}, {"$set": {"age": 61}}, session=session)
    users.delete_one({"_id": 11})


def _source(uri: str) -> dict[str, tuple[Any, ...]]:
    """The source's users: canonical _id -> (name, age)."""
    from replicator.bsonkit.extjson import dumps_str

    with pymongo.MongoClient(uri) as client:
        return {dumps_str(d["_id"]): (d["name"], d["age"]) for d in client.shop.users.find()}


def _rows(uri: str, settings_options: dict[str, str]) -> tuple[list[dict[str, Any]], int]:
    """The rows readStream with snapshot=initial would give, made by the data source's own functions from
    a snapshot read and the change stream after it (no Spark needed); and how many changes there were."""
    from replicator.events.positions import Numbering, snapshot_position
    from replicator.events.rows import NAMES, snapshot_row
    from replicator.settings.resolve import settings_from_strings
    from replicator.spark_datasource.change_rows import row_of

    s = settings_from_strings({"source": uri, "extended-json": "relaxed", **settings_options}, command="status")
    rows = []
    with pymongo.MongoClient(uri, document_class=RawBSONDocument) as client:
        at: Timestamp = client.admin.command("ping")["operationTime"]
        for doc in client.shop.users.find():
            rows.append(dict(zip(NAMES, snapshot_row(_ns(), doc, snapshot_position(at), relaxed=True), strict=True)))
        with pymongo.MongoClient(uri) as plain:
            _changes(plain)
        numbering = Numbering(snapshot_position(at))
        with client.watch(start_at_operation_time=at, full_document="updateLookup") as stream:
            while (raw := stream.try_next()) is not None:
                row = row_of(raw, "", s, numbering)
                if row is not None:
                    rows.append(dict(zip(NAMES, row, strict=True)))
    return rows, sum(r["op"] != "r" for r in rows)


def _ns() -> Any:
    from replicator.events import Namespace

    return Namespace("shop", "users")


def _auto_cdc_row(row: dict[str, Any]) -> dict[str, Any]:
    """What auto_cdc_source makes of a row: key, sequence, op and the typed fields."""
    document = json.loads(row["document"]) if row["document"] is not None else {}
    key = json.loads(row["key"])["_id"]
    return {
        "key": json.dumps(key, separators=(",", ":")),
        "sequence": row["sequence"],
        "cluster_time": row["cluster_time"],
        "op": row["op"],
        **{name: document.get(name) for name in FIELDS},
    }


def test_rows_folded_as_auto_cdc_folds_them_give_the_source_and_with_post_images_one_version_per_change(
    source_uri: str,
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _existing(client)
    rows, changes = _rows(source_uri, {})
    assert changes == 13
    cdc = [_auto_cdc_row(r) for r in rows]
    source = _source(source_uri)
    # SCD type 1: the source's documents
    assert {_key(k): (r["name"], r["age"]) for k, r in scd1(cdc).items()} == source
    # SCD type 2: its current rows are the source's documents (the re-inserted _id 5 among them)
    assert {_key(str(v.key)): v.values for v in scd2(cdc, FIELDS) if v.end is None} == source
    # ... which a sequence of cluster times alone does not give: the delete and the insert of _id 5 in one
    # transaction tie, and the delete wins
    by_time = scd2([r for r in cdc if r["cluster_time"] is not None], FIELDS, sequence="cluster_time")
    assert '{"$numberInt":"5"}' not in {v.key for v in by_time if v.end is None}
    # with exact post-images (here: each update's delta applied in order, as the source applied it), SCD2
    # has one version per document row: the snapshot's, and each insert, update and replace
    exact = _post_images(cdc, rows)
    assert len(scd2(exact, FIELDS)) == sum(r["op"] != "d" for r in exact)
    # updateLookup reads a document when the event is read: two quick updates carry the second's values
    assert len(scd2(cdc, FIELDS)) < sum(r["op"] != "d" for r in cdc)


def _post_images(cdc: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as post-images would give them: each update's document is the one before it with the update's
    delta applied (updateLookup reads the document later, when two updates follow each other it reads the
    second's for both)."""
    import bson

    from replicator.events import UpdateDescription
    from replicator.sinks.lake.fold import apply_update

    state: dict[str, bytes] = {}
    out = []
    for row, raw in sorted(zip(cdc, rows, strict=True), key=lambda pair: tuple(pair[0]["sequence"].values())):
        if raw["op"] == "d":
            state.pop(row["key"], None)
            out.append(row)
            continue
        if raw["op"] == "u":
            update = json.loads(raw["update"])
            delta = UpdateDescription(bson.decode(bson.encode(update["updatedFields"])), tuple(update["removedFields"]))
            state[row["key"]] = apply_update(state[row["key"]], delta)
        else:
            state[row["key"]] = raw["bson"]
        document = bson.decode(state[row["key"]])
        out.append({**row, **{name: document.get(name) for name in FIELDS}})
    return out


@pytest.fixture(scope="module")
def catalog_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test catalog whose tables take MERGE, compiled against the installed PySpark's jars."""
    return compile_catalog(tmp_path_factory.mktemp("catalog"))


#: How long a run of the pipeline may take to write its tables' file (a JVM, a Connect server and Spark's
#: Python workers come up first): 197 s for the whole test beside two burners (issue 40).
RUN_WAIT_S = 420


def _wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float = RUN_WAIT_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {path.name} (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.mark.timeout(2 * RUN_WAIT_S + 120 + 60)  # two runs waited for, then the process's exit
def test_the_example_pipeline_keeps_scd1_and_scd2_tables_of_a_collection_and_its_changes(
    catalog_jar: Path, source_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _existing(client)
    pipeline = tmp_path / "pipeline"
    shutil.copytree(EXAMPLE / "transformations", pipeline / "transformations")
    spec = (EXAMPLE / "spark-pipeline.yml").read_text()
    spec = spec.replace("file:///tmp/mcdc-auto-cdc/storage", (tmp_path / "storage").as_uri())
    (pipeline / "spark-pipeline.yml").write_text(spec)
    out, log = tmp_path / "out", tmp_path / "pipeline.log"
    out.mkdir()
    argv = [sys.executable, "-m", "tests.support.auto_cdc_run", str(catalog_jar), str(tmp_path / "catalog")]
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*argv, str(pipeline / "spark-pipeline.yml"), str(out), "2"], cwd=REPO,
                                # SPARK_TESTING: an ephemeral port for the Connect server, not 15002,
                                # which another test's server may hold (pyspark's own tests, SPARK-42272)
                                env={**os.environ, "MCDC_SOURCE": source_uri, "SPARK_TESTING": "1"},
                                stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        first = _wait_for(out / "run-1.json", proc, log)
        assert _scd1(first) == _source(source_uri) == _current(first)  # the existing documents
        with pymongo.MongoClient(source_uri) as client:
            _changes(client)
        (out / "go-2").touch()
        second = _wait_for(out / "run-2.json", proc, log)
        assert proc.wait(120) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    source = _source(source_uri)
    assert _scd1(second) == source and _current(second) == source
    history = [r for r in second["users_history"] if json.loads(r["key"]) == {"$numberInt": "5"}]
    assert sorted((r["name"], r["__END_AT"] is None) for r in history) == [("again", True), ("user5", False)]
    assert "UNKNOWN_RESPONSE" not in log.read_text()


def _scd1(tables: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {_key(r["key"]): (r["name"], r["age"]) for r in tables["users"]}


def _current(tables: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {_key(r["key"]): (r["name"], r["age"]) for r in tables["users_history"] if r["__END_AT"] is None}


def _key(text: str) -> str:
    """auto_cdc_source's key (the _id's canonical Extended JSON, as Spark writes it) as _source names it."""
    from bson import json_util

    from replicator.bsonkit.extjson import CANONICAL, dumps_str

    return dumps_str(json_util.loads(text, json_options=CANONICAL))
