"""Sink plug-ins: examples/sink-plugin (``sqlite:PATH``) found through its ``mcdc.sinks`` entry point.

The plug-in is made importable and discoverable without pip: a ``*.dist-info`` directory (METADATA and
entry_points.txt) next to a copy of the module, on PYTHONPATH, is all importlib.metadata needs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from bson import json_util
from bson.binary import Binary
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit.extjson import CANONICAL
from replicator.errors import ConfigError, SinkError
from replicator.events import ChangeEvent, Namespace, Op
from replicator.events.normalize import snapshot_read
from replicator.settings.resolve import resolve
from replicator.sinks.base import Sink
from replicator.sinks.registry import open_sink

pytestmark = pytest.mark.integration

PLUGIN = Path(__file__).resolve().parent.parent / "examples" / "sink-plugin" / "mcdc_sqlite_sink.py"
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})
LOSSLESS: CodecOptions[dict[str, Any]] = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)

Rows = dict[tuple[str, str], Any]  # (namespace, _id as compact canonical JSON) -> document, order-sensitive


def _dist_info(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[mcdc.sinks]\n{entry_points}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the sqlite plug-in and a broken one, on sys.path here and on PYTHONPATH for
    subprocesses."""
    site = tmp_path / "site"
    _dist_info(site, "mcdc_sqlite_sink", "sqlite = mcdc_sqlite_sink:SqliteSink")
    shutil.copy(PLUGIN, site / PLUGIN.name)
    _dist_info(site, "not_a_sink", "notasink = not_a_sink:make")
    (site / "not_a_sink.py").write_text("def make(uri, settings):\n    return object()\n")
    monkeypatch.syspath_prepend(str(site))  # also invalidates importlib's caches
    return site


def _mcdc(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _client(uri: str) -> pymongo.MongoClient[dict[str, Any]]:
    return pymongo.MongoClient(uri)


def _ordered(text: str) -> Any:
    """Parsed JSON that keeps field order in comparisons (objects become lists of pairs)."""
    return json.loads(text, object_pairs_hook=list)


def _key(ns: str, id_json: str) -> tuple[str, str]:
    return ns, json.dumps(json.loads(id_json), separators=(",", ":"))


def _sqlite_rows(path: Path) -> Rows:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT ns, id, doc FROM documents").fetchall()
    return {_key(ns, id_json): _ordered(doc) for ns, id_json, doc in rows}


def _source_rows(uri: str) -> Rows:
    rows: Rows = {}
    with _client(uri) as client:
        for name in client.list_database_names():
            if name in SYSTEM_DATABASES:
                continue
            db = client.get_database(name, codec_options=LOSSLESS)
            for coll in db.list_collection_names():
                if coll.startswith("system."):
                    continue
                for doc in db[coll].find():
                    id_json = json_util.dumps(doc["_id"], json_options=CANONICAL)
                    rows[_key(f"{name}.{coll}", id_json)] = _ordered(json_util.dumps(doc, json_options=CANONICAL))
    return rows


def _documents() -> list[dict[str, Any]]:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123000)
    return [
        {
            "_id": ObjectId("65f0c0ffee00000000000001"),
            "count": Int64(7),
            "big": Int64(2**40),
            "price": Decimal128("12.3400"),
            "when": when,
            "before_1970": dt.datetime(1901, 1, 1),
            "ratio": -0.0,
            "uuid": Binary(b"\x01" * 16, 4),
            "nested": {"z": 1, "a": [1, Int64(2), {"deep": [Decimal128("-0"), None, True]}], "m": {"n": "x"}},
        },
        {"_id": ObjectId("65f0c0ffee00000000000002"), "count": Int64(1), "price": Decimal128("1E+3"), "tags": []},
        {"_id": ObjectId("65f0c0ffee00000000000003"), "when": when, "note": "deleted later"},
        {"_id": ObjectId("65f0c0ffee00000000000004"), "note": "replaced later", "v": 1},
    ]


def test_sync_then_catch_up_keeps_the_latest_document_states(source_uri: str, site: Path, tmp_path: Path) -> None:
    oid = [d["_id"] for d in _documents()]
    with _client(source_uri) as client:
        shop = client.shop
        shop.orders.insert_many(_documents())
        shop.people.insert_many([{"_id": i, "name": f"p{i}", "age": Int64(20 + i)} for i in range(50)])
        shop.people.insert_one({"_id": "string-id", "name": "s"})
        shop.people.insert_one({"_id": {"k": 1, "a": "compound"}, "name": "doc id"})
        shop.scratch.insert_many([{"_id": i, "s": i} for i in range(5)])
        shop.gone.insert_many([{"_id": i} for i in range(5)])
        client.tmp.x.insert_many([{"_id": i} for i in range(5)])
    db = tmp_path / "out" / "state.db"
    cp = str(tmp_path / "cp.json")
    first = _mcdc(site, "sync", "-s", source_uri, "-t", f"sqlite:{db}", "-c", cp)
    assert first.returncode == 0, first.stderr
    assert _sqlite_rows(db) == _source_rows(source_uri)
    assert len(_sqlite_rows(db)) == 4 + 52 + 5 + 5 + 5
    old_cp = str(tmp_path / "cp-after-sync.json")
    shutil.copy(cp, old_cp)

    with _client(source_uri) as client:
        shop = client.shop
        shop.orders.update_one({"_id": oid[0]}, {"$set": {"nested.m.n": "y", "new": Decimal128("9.99")}})
        shop.orders.update_one({"_id": oid[1]}, {"$inc": {"count": Int64(41)}, "$unset": {"tags": ""}})
        shop.orders.replace_one({"_id": oid[3]}, {"v": 2, "replaced": dt.datetime(2030, 1, 1)})
        shop.orders.delete_one({"_id": oid[2]})
        shop.orders.insert_one({"_id": ObjectId("65f0c0ffee00000000000005"), "late": Int64(-1)})
        with client.start_session() as s, s.start_transaction():
            shop.people.insert_one({"_id": 100, "name": "in txn"}, session=s)
            shop.people.update_one({"_id": 1}, {"$set": {"name": "renamed in txn"}}, session=s)
            shop.people.delete_one({"_id": 2}, session=s)
            shop.orders.update_one({"_id": oid[0]}, {"$set": {"txn": True}}, session=s)
        shop.people.update_one({"_id": 3}, {"$set": {"gone": True}})
        shop.people.delete_one({"_id": 3})  # the update's lookup finds nothing: skipped, the delete applies
        shop.scratch.rename("scratch_renamed")
        shop.scratch_renamed.insert_one({"_id": 99, "s": "after rename"})
        shop.gone.drop()
        client.drop_database("tmp")
    second = _mcdc(site, "catch-up", "-s", source_uri, "-t", f"sqlite:{db}", "-c", cp)
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr
    expected = _source_rows(source_uri)
    assert _sqlite_rows(db) == expected
    namespaces = {ns for ns, _ in expected}
    assert namespaces == {"shop.orders", "shop.people", "shop.scratch_renamed"}
    assert "without a full document are skipped" in second.stderr

    # at-least-once: replaying every change again from the older checkpoint converges to the same rows
    again = _mcdc(site, "catch-up", "-s", source_uri, "-t", f"sqlite:{db}", "-c", old_cp)
    assert again.returncode == 0, again.stderr
    assert _sqlite_rows(db) == expected


def test_unknown_scheme_is_a_one_line_config_error(site: Path) -> None:
    settings = resolve({"source": "mongodb://a:1", "target": "bogus://somewhere/x"}, env={})
    with pytest.raises(ConfigError) as err:
        open_sink(settings)
    message = str(err.value)
    assert "\n" not in message and "unknown scheme 'bogus'" in message


def test_a_plugin_that_returns_no_sink_is_refused(site: Path) -> None:
    settings = resolve({"source": "mongodb://a:1", "target": "notasink:whatever"}, env={})
    with pytest.raises(ConfigError, match=r"not_a_sink:make.* is not a replicator Sink"):
        open_sink(settings)


def _reads(ns: Namespace, *ids: int) -> list[ChangeEvent]:
    return [snapshot_read(ns, RawBSONDocument(bson.encode({"_id": i, "v": i}))) for i in ids]


def _ids(path: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for (ns, id_json), _ in sorted(_sqlite_rows(path).items()):
        found.setdefault(ns, []).append(int(json.loads(id_json)["$numberInt"]))
    return {ns: sorted(ids) for ns, ids in found.items()}


async def test_sink_applies_changes_and_ddl_idempotently(
    site: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "unit.db"
    sink = open_sink(resolve({"source": "mongodb://a:1", "target": f"sqlite:{path}"}, env={}))
    assert isinstance(sink, Sink) and type(sink).__name__ == "SqliteSink"
    a, b, other = Namespace("shop", "a"), Namespace("shop", "b"), Namespace("shop2", "c")
    async with sink:
        await sink.write(_reads(a, 1, 2) + _reads(b, 7) + _reads(other, 3))
        assert await sink.existing([a, b, Namespace("shop", "none")]) == [a, b]
        rename = ChangeEvent(op=Op.RENAME, ns=a, to=b)
        await sink.write([rename])  # as renameCollection with dropTarget
        await sink.write([rename])  # delivered again after a crash: the moved rows stay
        assert _ids(path) == {"shop.b": [1, 2], "shop2.c": [3]}
        with caplog.at_level(logging.WARNING, logger="mcdc_sqlite_sink"):
            update = ChangeEvent(op=Op.UPDATE, ns=b, key={"_id": 1})  # no full document
            await sink.write([update, update])
            await sink.write([update])
        assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1
        await sink.write(
            [ChangeEvent(op=Op.DELETE, ns=b, key={"_id": 2}), ChangeEvent(op=Op.DELETE, ns=b, key={"_id": 2})]
        )
        assert _ids(path) == {"shop.b": [1], "shop2.c": [3]}
        await sink.write([ChangeEvent(op=Op.DROP_DATABASE, ns=Namespace("shop"))])  # not shop2
        assert _ids(path) == {"shop2.c": [3]}
        await sink.write([ChangeEvent(op=Op.DROP, ns=other)])
        assert _ids(path) == {}
    with pytest.raises(SinkError, match="not started"):
        await sink.write(_reads(a, 1))
