"""mcdc sync end to end against real MongoDB-compatible servers."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pymongo
import pytest

from replicator.job.phases import SyncJob
from replicator.observe.progress import LogReporter
from replicator.observe.tally import CollectionProgress
from replicator.settings.resolve import resolve
from tests.support.compare import assert_identical
from tests.support.corpus import load_bulk, load_corpus
from tests.support.servers import Clients

pytestmark = pytest.mark.integration


async def run_job(source: str, target: str, checkpoint: Path, command: str = "sync", **flags: Any) -> dict[str, Any]:
    settings = resolve({"source": source, "target": target, "checkpoint": checkpoint, **flags}, env={})
    summary = await SyncJob(settings, LogReporter(), command=command).run()
    return summary.to_json()


async def test_sync_copies_every_bson_type_byte_exact(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        info = load_corpus(client)
    summary = await run_job(source_uri, target_uri, tmp_path / "cp.json", partition_docs=500, workers=3, split="always")
    assert summary["snapshot"] == "completed"
    state = assert_identical(source_uri, target_uri)
    assert (
        "corpus.mixed_ids" in state and len(state["corpus.mixed_ids"]["docs"]) == info["namespaces"]["corpus.mixed_ids"]
    )
    assert state["corpus.validated_view"]["kind"] == "view"
    assert not any(ns.split(".")[0] in ("admin", "local", "config") for ns in state)
    checkpoint = json.loads((tmp_path / "cp.json").read_text())
    assert checkpoint["snapshot"]["status"] == "done"
    mixed_parts = [p for p in checkpoint["snapshot"]["plan"] if p["coll"] == "mixed_ids"]
    assert len({p["bracket"] for p in mixed_parts}) >= 8  # split per type bracket


async def test_sync_again_only_replays(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i} for i in range(10)])
    cp = tmp_path / "cp.json"
    await run_job(source_uri, target_uri, cp)
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.delete_one({"_id": 3})
        client.db.c.update_one({"_id": 4}, {"$set": {"x": 1}})
    summary = await run_job(source_uri, target_uri, cp, command="catch-up")
    assert summary["snapshot"] == "skipped" and summary["events"] >= 2
    assert_identical(source_uri, target_uri)


async def test_refuses_to_mix_into_a_target_holding_data_and_says_what_drop_target_replaced(
    source_uri: str, target_uri: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from replicator.errors import ConfigError

    with pymongo.MongoClient(source_uri) as src, pymongo.MongoClient(target_uri) as dst:
        src.db.c.insert_one({"_id": 1, "v": "source"})
        src.db.new_here.insert_one({"_id": 1})
        dst.db.c.insert_one({"_id": 2, "v": "stale"})
    with pytest.raises(ConfigError, match=r"already holds data in db\.c"):
        await run_job(source_uri, target_uri, tmp_path / "cp.json")
    caplog.set_level(logging.INFO, logger="mcdc")
    await run_job(source_uri, target_uri, tmp_path / "cp.json", drop_target=True)
    assert_identical(source_uri, target_uri)
    dropped = [r.getMessage() for r in caplog.records if "replacing" in r.getMessage()]
    assert dropped == ["--drop-target: replacing the target's data in db.c"]  # not db.new_here: the target held none


async def _workload(uri: str, stop: asyncio.Event) -> int:
    """Inserts, updates, deletes, transactions, a rename and a drop while a sync runs."""
    ops = 0
    client: pymongo.AsyncMongoClient[dict[str, Any]] = pymongo.AsyncMongoClient(uri)
    db = client.live
    try:
        await db.scratch.insert_many([{"_id": i} for i in range(20)])
        i = 0
        while not stop.is_set() or i < 60:
            await db.big.insert_one({"_id": f"new-{i}", "i": i})
            await db.big.update_one(
                {"_id": i}, {"$set": {"touched": i, "nested.deep": [i, {"x": i}]}, "$unset": {"pad": ""}}
            )
            await db.big.replace_one({"_id": i + 1000}, {"replaced": True, "i": i})
            await db.big.delete_one({"_id": i + 2000})
            async with client.start_session() as session, await session.start_transaction():
                await db.big.insert_one({"_id": f"txn-{i}"}, session=session)
                await db.other.update_one({"_id": i}, {"$inc": {"n": 1}}, upsert=True, session=session)
            if i == 10:
                await db.scratch.rename("scratch_renamed")
            if i == 20:
                await db.scratch_renamed.drop()
            if i == 30:
                await db.big.create_index([("touched", 1)], name="touched_1")
            ops += 6
            i += 1
            await asyncio.sleep(0.01)
    finally:
        await client.close()
    return ops


async def test_sync_while_source_takes_writes(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "live", "big", 6000, doc_size=300)
    stop = asyncio.Event()
    writer = asyncio.create_task(_workload(source_uri, stop))
    await asyncio.sleep(0.3)
    cp = tmp_path / "cp.json"
    await run_job(source_uri, target_uri, cp, partition_docs=1000, batch_docs=100, workers=2, split="always")
    stop.set()
    await writer
    await run_job(source_uri, target_uri, cp, command="catch-up")
    state = assert_identical(source_uri, target_uri)
    assert "live.scratch_renamed" not in state and "live.scratch" not in state
    assert "touched_1" in state["live.big"]["indexes"]


class RenameWhenCopyStarts(LogReporter):
    """Renames a source collection after mcdc listed it and before it reads it: the worst moment."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        self.uri = uri
        self.renamed = False

    def snapshot_begin(self, collections: Iterable[CollectionProgress]) -> None:
        super().snapshot_begin(collections)
        if self.renamed:  # the copy of the renamed collection begins too
            return
        self.renamed = True
        with pymongo.MongoClient(self.uri) as client:
            client.live.before.rename("after")
            client.live.after.insert_one({"_id": "post-rename"})


async def test_collection_renamed_mid_snapshot_is_not_lost(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.live.before.insert_many([{"_id": i, "v": i} for i in range(500)])
    settings = resolve({"source": source_uri, "target": target_uri, "checkpoint": tmp_path / "cp.json"}, env={})
    await SyncJob(settings, RenameWhenCopyStarts(source_uri)).run()
    state = assert_identical(source_uri, target_uri)
    assert len(state["live.after"]["docs"]) == 501


async def test_standalone_source_needs_snapshot_only(
    source_uri: str, target_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standalone has no change stream (the test server always acts as a replica set, so its hello
    answer is rewritten to a standalone's)."""
    import replicator.job.phases as sync_module
    from replicator.errors import TopologyError
    from replicator.source.connection import ServerInfo

    real_probe = sync_module.probe

    async def standalone_probe(*args: Any) -> ServerInfo:
        info = await real_probe(*args)
        return ServerInfo("standalone", None, info.process_id, info.max_wire_version)

    monkeypatch.setattr(sync_module, "probe", standalone_probe)
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i, "x": -i} for i in range(100)])
        client.db.c.create_index("x", unique=True)
    with pytest.raises(TopologyError, match=r"standalone server.*--snapshot-only"):
        await run_job(source_uri, target_uri, tmp_path / "cp.json")
    summary = await run_job(source_uri, target_uri, tmp_path / "cp.json", snapshot_only=True)
    assert summary["documents"] == 100 and summary["events"] == 0
    assert_identical(source_uri, target_uri)


async def test_include_and_rename_then_verify(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    from replicator.checking.verify import verify

    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(50)])
        client.shop.orders.create_index("x", name="by_x")
        client.shop.create_collection("open_orders", viewOn="orders", pipeline=[{"$match": {"_id": {"$lt": 5}}}])
        client.shop.tmp_scratch.insert_one({"_id": 1})
        client.crm.people.insert_one({"_id": 1})
    flags: dict[str, Any] = {"include": (r"shop\..*",), "exclude": (r"shop\.tmp_.*",), "rename": ("shop=shop_v2",)}
    await run_job(source_uri, target_uri, tmp_path / "cp.json", **flags)
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_one({"_id": "late"})
    await run_job(source_uri, target_uri, tmp_path / "cp.json", command="catch-up", **flags)
    with pymongo.MongoClient(target_uri) as client:
        assert "shop_v2" in client.list_database_names() and "crm" not in client.list_database_names()
        assert sorted(client.shop_v2.list_collection_names()) == ["open_orders", "orders"]
        assert client.shop_v2.orders.count_documents({}) == 51
        assert "by_x" in client.shop_v2.orders.index_information()
    settings = resolve({"source": source_uri, "target": target_uri, **flags}, env={})
    report = await verify(settings)
    assert report.ok, report.lines()


async def test_views_on_views_and_collection_options(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        db = client.opts
        db.create_collection("base", validator={"n": {"$type": "int"}}, validationLevel="strict")
        db.base.insert_many([{"_id": i, "n": i} for i in range(20)])
        db.create_collection("a_second", viewOn="z_first", pipeline=[{"$match": {"n": {"$lt": 5}}}])
        db.create_collection("z_first", viewOn="base", pipeline=[{"$project": {"n": 1}}])
        db.base.create_index([("n", -1)], name="n_desc", sparse=True)
        db.base.create_index([("exp", 1)], name="ttl", expireAfterSeconds=3600)
    await run_job(source_uri, target_uri, tmp_path / "cp.json")
    state = assert_identical(source_uri, target_uri)
    assert state["opts.a_second"]["kind"] == "view" and {"n_desc", "ttl"} <= set(state["opts.base"]["indexes"])
    with pymongo.MongoClient(target_uri) as client:
        assert [d["_id"] for d in client.opts.a_second.find().sort("_id", 1)] == [0, 1, 2, 3, 4]


def test_a_catch_up_that_copies_collections_again_moves_its_position_and_names_them(
    clients: Clients, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """The position printed and saved follows the events applied, also when the last batch waited for a
    copy made again (a collection renamed into the selection, an index made: the replay's DDL window), and
    the summary says what was copied again."""
    import subprocess
    import sys

    cp = tmp_path / "cp.json"

    def run(command: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "replicator.cli", command, "-s", source_uri, "-t", target_uri, "-c", str(cp),
             "--include", r"shop\..*", "--no-progress", "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    clients.source.shop.orders.insert_many([{"_id": i} for i in range(20)])
    synced = run("sync")
    since = clients.source.admin.command("ping")["operationTime"]
    clients.source.outside.archive.insert_many([{"_id": i} for i in range(5)])
    clients.source.admin.command("renameCollection", "outside.archive", to="shop.archive")
    clients.source.shop.orders.create_index("x")
    for i in range(10):
        clients.source.shop.orders.update_one({"_id": i}, {"$set": {"x": i}})
    with clients.source.watch(start_at_operation_time=since) as stream:
        last = None
        while (change := stream.try_next()) is not None:
            last = change["clusterTime"]
    caught_up = run("catch-up")
    assert last is not None and caught_up["position"] != synced["position"]
    assert caught_up["position"] == {"t": last.time, "i": last.inc}  # the last event's, printed
    assert json.loads(cp.read_text())["position"]["cluster_time"] == caught_up["position"]  # and saved
    assert caught_up["recopied"] == ["shop.archive"] and caught_up["reconciled"] == ["shop.orders"]
    assert_identical(source_uri, target_uri, only=lambda ns: ns.startswith("shop."))


def test_a_catch_up_summary_counts_collections_copied_again_and_dropped_apart(
    clients: Clients, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Issue 41: a catch-up that copied a collection again read "0 collections, ... documents copied (snapshot
    skipped)", and one renamed into the selection then dropped was "copied again from the source"."""
    import subprocess
    import sys

    cp = tmp_path / "cp.json"

    def run(command: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "replicator.cli", command, "-s", source_uri, "-t", target_uri, "-c", str(cp),
             "--include", r"shop\..*", "--no-progress"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    clients.source.shop.orders.insert_many([{"_id": i} for i in range(20)])
    run("sync")
    clients.source.outside.archive.insert_many([{"_id": i} for i in range(5)])
    clients.source.admin.command("renameCollection", "outside.archive", to="shop.archive")
    clients.source.outside.gone.insert_many([{"_id": i} for i in range(3)])
    clients.source.admin.command("renameCollection", "outside.gone", to="shop.gone")
    clients.source.shop.gone.drop()
    lines = run("catch-up")
    assert lines[0].startswith("catch-up finished in "), lines
    said = lines[0].split(": ", 1)[1]
    assert said.startswith("snapshot skipped, 1 collection copied again (5 documents, "), lines
    assert ", 1 collection dropped as on the source, " in said, lines
    assert "copied again from the source: shop.archive" in lines, lines
    assert "dropped as on the source (gone from it): shop.gone" in lines, lines
    assert_identical(source_uri, target_uri, only=lambda ns: ns.startswith("shop."))
