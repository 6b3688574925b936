"""mcdc never drops, renames or overwrites a target namespace its selection does not map to, and a
collection renamed into the selection after the snapshot is copied, not lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest

from tests.test_sync import run_job

pytestmark = pytest.mark.integration


def _docs(uri: str, db: str, coll: str) -> dict[bytes, bytes]:
    with pymongo.MongoClient(uri, document_class=bson.raw_bson.RawBSONDocument) as client:
        return {bson.encode({"_id": d["_id"]}): d.raw for d in client[db][coll].find()}


def _names(uri: str, db: str) -> list[str]:
    with pymongo.MongoClient(uri) as client:
        return sorted(client[db].list_collection_names())


async def _sync(source: str, target: str, cp: Path, **flags: Any) -> dict[str, Any]:
    # the exclude names a database the source creates after the first run: --allow-unmatched says so
    return await run_job(
        source, target, cp, include=(r"sel\..*",), exclude=(r"keepme\..*",), allow_unmatched=True, **flags
    )


async def test_drop_database_of_an_unselected_database_keeps_the_targets(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(target_uri) as client:
        client.keepme.precious.insert_many([{"_id": i, "mine": True} for i in range(5)])
    with pymongo.MongoClient(source_uri) as client:
        client.sel.a.insert_many([{"_id": i} for i in range(3)])
    cp = tmp_path / "cp.json"
    await _sync(source_uri, target_uri, cp)
    with pymongo.MongoClient(source_uri) as client:
        client.keepme.precious.insert_one({"_id": "source's own"})
        client.keepme.other.insert_one({"_id": 1})
        client.drop_database("keepme")
        client.sel.a.insert_one({"_id": "after"})
    await _sync(source_uri, target_uri, cp, command="catch-up")
    assert len(_docs(target_uri, "keepme", "precious")) == 5
    assert _docs(target_uri, "sel", "a") == _docs(source_uri, "sel", "a")


async def test_drop_database_of_a_selected_database_drops_only_what_it_mapped(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(3)])
        client.shop.tmp.insert_one({"_id": 1})
    with pymongo.MongoClient(target_uri) as client:
        client.shop_v2.theirs.insert_one({"_id": "not ours"})  # in the renamed database, but not selected
    cp = tmp_path / "cp.json"
    flags = {"include": (r"shop\.orders",), "rename": ("shop=shop_v2",)}
    await run_job(source_uri, target_uri, cp, **flags)
    assert _names(target_uri, "shop_v2") == ["orders", "theirs"]
    with pymongo.MongoClient(source_uri) as client:
        client.drop_database("shop")
    await run_job(source_uri, target_uri, cp, command="catch-up", **flags)
    assert _names(target_uri, "shop_v2") == ["theirs"]


async def test_rename_out_of_the_selection_never_replaces_a_target_only_collection(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(target_uri) as client:
        client.other.keep.insert_many([{"_id": i, "theirs": True} for i in range(4)])
    with pymongo.MongoClient(source_uri) as client:
        client.sel.a.insert_many([{"_id": i} for i in range(3)])
    cp = tmp_path / "cp.json"
    await _sync(source_uri, target_uri, cp)
    with pymongo.MongoClient(source_uri) as client:
        client.admin.command("renameCollection", "sel.a", to="other.keep")
    await _sync(source_uri, target_uri, cp, command="catch-up")
    assert [d["theirs"] for d in pymongo.MongoClient(target_uri).other.keep.find()] == [True] * 4
    assert "a" not in _names(target_uri, "sel")  # it left the selection: no longer mirrored


async def test_collection_renamed_into_the_selection_after_the_snapshot_is_copied(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.sel.a.insert_one({"_id": 1})
        client.staging.load.insert_many([{"_id": i, "v": i * 1.5} for i in range(250)])
        client.staging.load.create_index("v", unique=True)
    cp = tmp_path / "cp.json"
    await _sync(source_uri, target_uri, cp)
    assert "staging" not in pymongo.MongoClient(target_uri).list_database_names()
    with pymongo.MongoClient(source_uri) as client:
        client.admin.command("renameCollection", "staging.load", to="sel.loaded")
        client.sel.loaded.update_one({"_id": 3}, {"$set": {"after": True}})
    summary = await _sync(source_uri, target_uri, cp, command="catch-up")
    assert _docs(target_uri, "sel", "loaded") == _docs(source_uri, "sel", "loaded")
    assert summary["documents"] == 250
    with pymongo.MongoClient(target_uri) as client:
        assert "v_1" in client.sel.loaded.index_information()


def _mcdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args, "--no-progress"], capture_output=True, text=True, timeout=120
    )


def test_a_copy_within_one_deployment_never_writes_over_the_source(source_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.scratch.a.insert_many([{"_id": i, "a": i} for i in range(10)])
        client.scratch.b.insert_many([{"_id": i, "b": i} for i in range(7)])
    before = {name: _docs(source_uri, "scratch", name) for name in ("a", "b")}
    same = ("--source", source_uri, "--target", source_uri, "--checkpoint", str(tmp_path / "cp.json"))
    refused = [
        (r"scratch\..*", "scratch.a=scratch.a_copy"),  # scratch.b maps onto itself: --drop-target emptied it
        (r"scratch\.a", "scratch.a=scratch.b"),  # onto another source namespace
        (r"scratch\..*", "scratch=scratch"),
    ]
    for include, rename in refused:
        done = _mcdc("sync", *same, "--include", include, "--rename", rename, "--drop-target")
        assert done.returncode == 2, done.stderr
        assert "same deployment" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    assert {name: _docs(source_uri, "scratch", name) for name in ("a", "b")} == before
    assert _names(source_uri, "scratch") == ["a", "b"]

    done = _mcdc("sync", *same, "--include", r"scratch\.a", "--rename", "scratch.a=scratch.a_copy")
    assert done.returncode == 0, done.stderr
    with pymongo.MongoClient(source_uri) as client:
        client.scratch.a.update_one({"_id": 1}, {"$set": {"changed": True}})
        client.scratch.a.delete_one({"_id": 2})
    done = _mcdc("catch-up", *same, "--include", r"scratch\.a", "--rename", "scratch.a=scratch.a_copy")
    assert done.returncode == 0, done.stderr
    assert _docs(source_uri, "scratch", "a_copy") == _docs(source_uri, "scratch", "a")
    assert _docs(source_uri, "scratch", "b") == before["b"]
