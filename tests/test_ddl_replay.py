"""DDL replayed from any saved checkpoint converges (issue 16, defects 1, 2 and 5).

Events are applied twice in normal operation: the checkpoint is saved at most once a second, a retried
batch is applied again, and a restored older copy of the checkpoint replays a long suffix onto a target
that is already past it. A rename, drop or dropDatabase re-applied then must not move or destroy the data
of a later incarnation of the same name.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pymongo
import pytest

from replicator.job.phases import SyncJob
from replicator.observe.progress import LogReporter
from replicator.settings.resolve import resolve
from tests.support.compare import assert_identical

pytestmark = pytest.mark.integration


async def run_job(source: str, target: str, checkpoint: Path, command: str = "sync", **flags: Any) -> dict[str, Any]:
    settings = resolve({"source": source, "target": target, "checkpoint": checkpoint, **flags}, env={})
    summary = await SyncJob(settings, LogReporter(), command=command).run()
    return summary.to_json()


def _keep(cp: Path, copy: Path) -> None:
    shutil.copyfile(cp, copy)


def _restore(copy: Path, cp: Path) -> None:
    """What a lost save amounts to: the older version of the checkpoint is the file again."""
    shutil.copyfile(copy, cp)


async def test_a_rename_applied_again_from_an_older_checkpoint_keeps_the_archive(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, before = tmp_path / "cp.json", tmp_path / "before.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.a.insert_many([{"_id": i, "gen": 1} for i in range(20)])
    await run_job(source_uri, target_uri, cp)
    _keep(cp, before)
    with pymongo.MongoClient(source_uri) as client:
        client.shop.a.rename("b")
        client.shop.a.insert_many([{"_id": i, "gen": 2} for i in range(5)])
    await run_job(source_uri, target_uri, cp, command="catch-up")
    assert_identical(source_uri, target_uri)
    _restore(before, cp)
    await run_job(source_uri, target_uri, cp, command="catch-up")
    state = assert_identical(source_uri, target_uri)
    assert len(state["shop.b"]["docs"]) == 20 and len(state["shop.a"]["docs"]) == 5


async def test_drop_database_then_a_rename_into_it_applied_again(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, before = tmp_path / "cp.json", tmp_path / "before.json"
    with pymongo.MongoClient(source_uri) as client:
        client.one.x.insert_many([{"_id": i, "in": "one"} for i in range(10)])
        client.two.y.insert_many([{"_id": i, "in": "two"} for i in range(10, 30)])
    await run_job(source_uri, target_uri, cp)
    _keep(cp, before)
    with pymongo.MongoClient(source_uri) as client:
        client.drop_database("one")
        client.admin.command("renameCollection", "two.y", to="one.x")
        client.two.y.insert_one({"_id": "new y"})
    await run_job(source_uri, target_uri, cp, command="catch-up")
    assert_identical(source_uri, target_uri)
    _restore(before, cp)
    await run_job(source_uri, target_uri, cp, command="catch-up")
    state = assert_identical(source_uri, target_uri)
    assert len(state["one.x"]["docs"]) == 20


async def test_a_drop_applied_again_does_not_lose_what_a_later_rename_brought(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, before = tmp_path / "cp.json", tmp_path / "before.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.x.insert_many([{"_id": i, "v": "x"} for i in range(5)])
        client.shop.y.insert_many([{"_id": i, "v": "y"} for i in range(50)])
    await run_job(source_uri, target_uri, cp)
    _keep(cp, before)
    with pymongo.MongoClient(source_uri) as client:
        client.shop.x.drop()
        client.shop.y.update_one({"_id": 3}, {"$set": {"touched": True}})
        client.shop.y.rename("x")
    await run_job(source_uri, target_uri, cp, command="catch-up")
    assert_identical(source_uri, target_uri)
    _restore(before, cp)
    await run_job(source_uri, target_uri, cp, command="catch-up")
    state = assert_identical(source_uri, target_uri)
    assert len(state["shop.x"]["docs"]) == 50 and "shop.y" not in state


async def test_every_checkpoint_of_a_rotation_replays_to_the_source(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Log rotation: the same _ids live in several incarnations of one collection name. A catch-up from
    each checkpoint saved on the way, restored in turn, converges."""
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.churn.log.insert_many([{"_id": i, "gen": 0, "v": 0} for i in range(5)])
    await run_job(source_uri, target_uri, cp)
    copies = []
    with pymongo.MongoClient(source_uri) as client:
        for gen in range(1, 5):
            client.churn.log.update_one({"_id": 0}, {"$set": {"touch": gen}})
            client.churn.log.rename(f"log_{gen}")
            client.churn.log.insert_many([{"_id": i, "gen": gen} for i in range(3)])
            client.churn.log.update_one({"_id": 1}, {"$inc": {"v": 1}})
            await run_job(source_uri, target_uri, cp, command="catch-up")
            copies.append(tmp_path / f"cp{gen}.json")
            _keep(cp, copies[-1])
    assert_identical(source_uri, target_uri)
    for copy in reversed(copies):
        _restore(copy, cp)
        await run_job(source_uri, target_uri, cp, command="catch-up")
        assert_identical(source_uri, target_uri)
    _restore(copies[0], cp)
    await run_job(source_uri, target_uri, cp, command="catch-up", full_document="default")
    assert_identical(source_uri, target_uri)


async def test_drop_database_keeps_a_collection_renamed_in_from_another_database(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """--rename legacy.users=app.users_legacy: the target's app.users_legacy holds legacy.users, so a
    source dropDatabase of app must not drop it."""
    cp = tmp_path / "cp.json"
    flags = {"rename": ("legacy.users=app.users_legacy",)}
    with pymongo.MongoClient(source_uri) as client:
        client.legacy.users.insert_many([{"_id": i} for i in range(10)])
        client.app.orders.insert_many([{"_id": i} for i in range(3)])
    await run_job(source_uri, target_uri, cp, **flags)
    with pymongo.MongoClient(source_uri) as client:
        client.drop_database("app")
    await run_job(source_uri, target_uri, cp, command="catch-up", **flags)
    with pymongo.MongoClient(target_uri) as client:
        assert client.app.users_legacy.count_documents({}) == 10
        assert "orders" not in client.app.list_collection_names()


async def test_two_sources_renamed_onto_one_target_are_refused_before_a_write(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    from replicator.errors import ConfigError

    with pymongo.MongoClient(source_uri) as client:
        client.legacy.users.insert_one({"_id": 1})
        client.app.users_legacy.insert_one({"_id": 2})
    with pytest.raises(ConfigError, match=r"app\.users_legacy would be written to app\.users_legacy"):
        await run_job(source_uri, target_uri, tmp_path / "cp.json", rename=("legacy.users=app.users_legacy",))
    with pymongo.MongoClient(target_uri) as client:
        assert [d for d in client.list_database_names() if d not in ("admin", "local", "config")] == []


async def test_a_widened_selection_copies_the_namespaces_it_adds(
    source_uri: str, target_uri: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.app.sessions.insert_many([{"_id": i} for i in range(5)])
        client.app.users.insert_many([{"_id": i, "v": 0} for i in range(49)])
    await run_job(source_uri, target_uri, cp, include=(r"app\.sessions",))
    with pymongo.MongoClient(source_uri) as client:
        client.app.users.update_one({"_id": 3}, {"$set": {"v": 1}})
        client.app.sessions.insert_one({"_id": "late"})
    caplog.set_level(logging.INFO, logger="mcdc")
    await run_job(source_uri, target_uri, cp, command="catch-up", include=(r"app\.sessions", r"app\.users"))
    assert_identical(source_uri, target_uri)
    assert any("now includes app.users: copying" in r.getMessage() for r in caplog.records)
    with pymongo.MongoClient(source_uri) as client:
        client.app.sessions.delete_one({"_id": 0})
        client.app.users.delete_one({"_id": 0})
    await run_job(source_uri, target_uri, cp, command="catch-up", include=(r"app\.users",))
    assert any("no longer includes app.sessions" in r.getMessage() for r in caplog.records)
    with pymongo.MongoClient(target_uri) as client:
        assert client.app.users.count_documents({}) == 48 and client.app.sessions.count_documents({}) == 6


@pytest.mark.parametrize(
    ("first", "then", "message"),
    [
        ({"rename": ("app=app_v2",)}, {"rename": ("app=app_v3",)}, r"--rename app=app_v2, this run has --rename app="),
        ({}, {"field_exclude": ("app.users.secret",)}, r"written with no --field-exclude, this run has --field-exc"),
    ],
)
async def test_a_changed_rename_or_field_rule_is_refused_with_the_fix(
    source_uri: str, target_uri: str, tmp_path: Path, first: dict[str, Any], then: dict[str, Any], message: str
) -> None:
    from replicator.errors import ConfigError

    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.app.users.insert_many([{"_id": i, "secret": i} for i in range(3)])
    await run_job(source_uri, target_uri, cp, **first)
    with pytest.raises(ConfigError, match=message + r".*--snapshot always"):
        await run_job(source_uri, target_uri, cp, command="catch-up", **then)
    await run_job(source_uri, target_uri, cp, snapshot="always", drop_target=True, **then)


async def test_a_stale_delta_in_a_source_transaction_replays_from_an_older_checkpoint(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, before = tmp_path / "cp.json", tmp_path / "before.json"
    flags = {"full_document": "default"}
    with pymongo.MongoClient(source_uri) as client:
        client.shop.c.insert_many([{"_id": 1, "a": {}}, {"_id": 2, "n": 0}])
    await run_job(source_uri, target_uri, cp, **flags)
    _keep(cp, before)
    with pymongo.MongoClient(source_uri) as client:
        with client.start_session() as s, s.start_transaction():
            client.shop.c.update_one({"_id": 1}, {"$set": {"a.b": 1}}, session=s)
            client.shop.c.update_one({"_id": 2}, {"$set": {"n": 1}}, session=s)
        client.shop.c.update_one({"_id": 1}, {"$set": {"a": 5}})
    await run_job(source_uri, target_uri, cp, command="catch-up", **flags)
    _restore(before, cp)
    await run_job(source_uri, target_uri, cp, command="catch-up", **flags)
    assert_identical(source_uri, target_uri)
