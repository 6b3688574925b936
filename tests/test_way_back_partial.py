"""The way back of a migration of part of a collection (``--filter``) or of part of each document
(``--field-exclude``): it carries the new side's writes to the migration's documents and fields back, and
never deletes, strips or replaces what the migration did not copy (issue 48)."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.servers import LocalServer, ServerPair
from tests.test_cli import _assert_one_line_error, _mcdc

ORDERS_FILTER = 'shop\\.orders={"total": {"$gte": 100}}'
MATCHES = {"total": {"$gte": 100}}


def _orders(client: pymongo.MongoClient[Any]) -> None:
    """200 orders, 100 of them under 100 (outside the filter), each with an ssn."""
    client.shop.orders.insert_many([{"_id": i, "total": i, "ssn": f"s{i}", "note": "x"} for i in range(50, 250)])


def _migrate(source_uri: str, target_uri: str, tmp_path: Path, *selection: str) -> tuple[Path, str]:
    """sync, then cutover: the reverse checkpoint and the way back's command as cutover printed it."""
    cp, back = tmp_path / "mig.json", tmp_path / "back.json"
    synced = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress", *selection)
    assert synced.returncode == 0, synced.stderr
    done = _mcdc("cutover", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--reverse-checkpoint", str(back),
                 "--json", "--no-progress", *selection)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return back, json.loads(done.stdout)["reverse_command"]


def _way_back(command: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The way back's command as cutover printed it, run as a catch-up (it exits once caught up)."""
    argv = shlex.split(command)
    assert argv[:2] == ["mcdc", "tail"], argv
    return _mcdc("catch-up", *argv[2:], "--no-progress", *extra, timeout=timeout)


def _docs(uri: str, query: dict[str, Any] | None = None) -> dict[Any, dict[str, Any]]:
    with pymongo.MongoClient(uri) as client:
        return {d["_id"]: d for d in client.shop.orders.find(query or {})}


@pytest.mark.integration
def test_a_filtered_way_back_after_a_coll_mod_on_the_new_side_keeps_every_document_the_migration_did_not_copy(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
    unmigrated = _docs(source_uri, {"total": {"$lt": 100}})
    assert len(unmigrated) == 50
    _back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\.orders", "--filter", ORDERS_FILTER)
    assert "--filter" in command  # the way back is filtered as the migration was
    with pymongo.MongoClient(target_uri) as client:  # the application, on the new side
        client.shop.command("collMod", "orders", validator={"total": {"$exists": True}})
        client.shop.orders.insert_one({"_id": 1000, "total": 500, "note": "new"})
        client.shop.orders.update_one({"_id": 150}, {"$set": {"note": "paid"}})
    ran = _way_back(command)
    assert ran.returncode == 0, ran.stderr
    old = _docs(source_uri)
    assert {i: old.get(i) for i in unmigrated} == unmigrated  # every one kept, byte for byte
    assert old[1000]["note"] == "new" and old[150]["note"] == "paid"
    checked = _mcdc("verify", *shlex.split(command)[2:])
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.integration
def test_a_field_exclude_way_back_after_a_coll_mod_on_the_new_side_keeps_every_excluded_field(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
    before = _docs(source_uri)
    _back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\.orders",
                             "--field-exclude", "shop.orders.ssn")  # fmt: skip
    with pymongo.MongoClient(target_uri) as client:
        assert client.shop.orders.count_documents({"ssn": {"$exists": True}}) == 0
        client.shop.command("collMod", "orders", validator={"total": {"$exists": True}})
        client.shop.orders.insert_one({"_id": 1000, "total": 500, "note": "new"})
        client.shop.orders.update_one({"_id": 150}, {"$set": {"note": "paid"}})
        client.shop.orders.replace_one({"_id": 60}, {"_id": 60, "total": 61, "note": "y"})
    ran = _way_back(command)
    assert ran.returncode == 0, ran.stderr
    old = _docs(source_uri)
    assert all(old[i]["ssn"] == f"s{i}" for i in before)  # every excluded field kept
    assert old[150] == {**before[150], "note": "paid"}  # in its place
    assert list(old[60]) == ["_id", "total", "ssn", "note"] and old[60]["total"] == 61
    assert old[1000] == {"_id": 1000, "total": 500, "note": "new"}
    checked = _mcdc("verify", *shlex.split(command)[2:])
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.integration
def test_a_unique_key_clash_on_a_filtered_way_back_never_deletes_a_document_the_migration_did_not_copy(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.users.insert_many([{"_id": i, "email": f"u{i}@x", "active": i % 2 == 0} for i in range(100)])
        client.shop.users.create_index("email", unique=True)
    _back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\.users",
                             "--filter", 'shop\\.users={"active": true}')  # fmt: skip
    with pymongo.MongoClient(target_uri) as client:  # legal on the new side: inactive user 77 was never copied
        client.shop.users.insert_one({"_id": 1000, "email": "u77@x", "active": True})
    refused = _way_back(command)
    _assert_one_line_error(refused, 2, "target", "shop.users", "77", "did not copy")
    with pymongo.MongoClient(source_uri) as client:
        assert client.shop.users.find_one({"_id": 77}) == {"_id": 77, "email": "u77@x", "active": False}
        # the advice, followed: the old side's user 77 is the user's to move; here it takes another address
        client.shop.users.update_one({"_id": 77}, {"$set": {"email": "u77-old@x"}})
    ran = _way_back(command)
    assert ran.returncode == 0, ran.stderr
    with pymongo.MongoClient(source_uri) as client:
        assert client.shop.users.find_one({"_id": 1000}) == {"_id": 1000, "email": "u77@x", "active": True}
        assert client.shop.users.count_documents({"active": False}) == 50
    checked = _mcdc("verify", *shlex.split(command)[2:])
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture
def small_oplog_target(servers: ServerPair, tmp_path: Path) -> Iterator[str]:
    """A target of the test's own whose oplog keeps 1,000 entries: the new side of a migration whose way
    back falls off it."""
    if servers.external:
        pytest.skip("needs a server of the test's own, with a small oplog")
    server = LocalServer(tmp_path / "small-oplog", oplog_entries=1000)
    server.start()
    try:
        yield server.uri
    finally:
        server.kill()


@pytest.mark.integration
@pytest.mark.parametrize("part", ["filter", "field-exclude"])
def test_the_history_lost_advice_on_a_partial_way_back_keeps_what_the_migration_did_not_copy(
    source_uri: str, small_oplog_target: str, tmp_path: Path, part: str
) -> None:
    target_uri = small_oplog_target
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
    before = _docs(source_uri)
    rule = ["--filter", ORDERS_FILTER] if part == "filter" else ["--field-exclude", "shop.orders.ssn"]
    _back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\.orders", *rule)
    with pymongo.MongoClient(target_uri) as client:
        client.shop.orders.update_one({"_id": 200}, {"$set": {"note": "first"}})
    first = _way_back(command)
    assert first.returncode == 0, first.stderr
    with pymongo.MongoClient(target_uri) as client:  # more writes than the new side's oplog keeps
        for n in range(2105):
            client.shop.orders.update_one({"_id": 100 + n % 100}, {"$set": {"note": f"w{n}"}})
        client.shop.orders.delete_one({"_id": 101})
        client.shop.orders.insert_one({"_id": 2000, "total": 300, "note": "late"})
    lost = _way_back(command)
    _assert_one_line_error(lost, 4, "no longer in the source's oplog", "--snapshot always")
    again = _mcdc("sync", *shlex.split(command)[2:], "--snapshot", "always", "--no-progress")  # as the advice says
    assert again.returncode == 0, again.stderr
    old = _docs(source_uri)
    for i, doc in before.items():
        if part == "filter" and doc["total"] < 100:
            assert old[i] == doc  # never copied: untouched
        elif part == "field-exclude" and i != 101:
            assert old[i]["ssn"] == doc["ssn"]  # its excluded field kept
    assert 101 not in old and old[2000]["note"] == "late" and old[199]["note"] == "w2099"
    checked = _mcdc("verify", *shlex.split(command)[2:])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _move_unmigrated(uri: str) -> list[dict[str, Any]]:
    """What the refusals advise, done: the old side's documents the migration did not copy, moved elsewhere."""
    with pymongo.MongoClient(uri) as client:
        kept = list(client.shop.orders.find({"total": {"$lt": 100}}))
        client.archive.orders.insert_many(kept)
        client.shop.orders.delete_many({"total": {"$lt": 100}})
    return kept


@pytest.mark.integration
@pytest.mark.parametrize("when", ["before-the-way-back", "during-the-way-back"])
@pytest.mark.parametrize("ddl", ["drop", "rename"])
def test_a_drop_or_rename_on_the_new_side_is_refused_while_the_old_collection_holds_unmigrated_documents(
    source_uri: str, target_uri: str, tmp_path: Path, when: str, ddl: str
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
        client.shop.users.insert_one({"_id": 1})
    unmigrated = _docs(source_uri, {"total": {"$lt": 100}})
    _back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\..*", "--filter", ORDERS_FILTER)
    if when == "during-the-way-back":
        assert _way_back(command).returncode == 0
    with pymongo.MongoClient(target_uri) as client:
        if ddl == "drop":
            client.shop.orders.drop()
        else:
            client.shop.orders.rename("orders_2025")
    refused = _way_back(command)
    _assert_one_line_error(refused, 2, "target", "shop.orders", "did not copy", "the way back stops")
    assert _docs(source_uri, {"total": {"$lt": 100}}) == unmigrated  # untouched
    moved = _move_unmigrated(source_uri)  # as the refusal advises
    ran = _way_back(command)
    assert ran.returncode == 0, ran.stderr
    with pymongo.MongoClient(source_uri) as client:
        assert sorted(client.shop.list_collection_names()) == (["users"] if ddl == "drop" else ["orders_2025", "users"])
        assert list(client.archive.orders.find()) == moved
    checked = _mcdc("verify", *shlex.split(command)[2:])
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.integration
def test_a_drop_on_the_new_side_of_a_field_exclude_migration_drops_the_old_collection_with_its_documents(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
    _back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\..*",
                              "--field-exclude", "shop.orders.ssn")  # fmt: skip
    with pymongo.MongoClient(target_uri) as client:  # every document was the migration's: deleted, as by deletes
        client.shop.orders.drop()
    ran = _way_back(command)
    assert ran.returncode == 0, ran.stderr
    with pymongo.MongoClient(source_uri) as client:
        assert "orders" not in client.shop.list_collection_names()


@pytest.mark.integration
def test_a_time_only_position_older_than_the_new_sides_oplog_is_history_lost_not_a_silent_gap(
    source_uri: str, small_oplog_target: str, tmp_path: Path
) -> None:
    target_uri = small_oplog_target  # the new side: its oplog keeps 1,000 entries
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
    back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\.orders")
    assert json.loads(back.read_text())["position"]["resume_token"] is None  # a time, no token
    with pymongo.MongoClient(target_uri) as client:  # the application's writes, past the oplog's bound
        client.shop.orders.insert_many([{"_id": 10_000 + n, "total": n} for n in range(2100)], ordered=True)
        oldest = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
        assert oldest is not None and oldest["ts"] > json_ts(back)  # the server pruned past the position
    lost = _way_back(command)
    _assert_one_line_error(lost, 4, "no longer in the source's oplog")
    assert _docs(source_uri).keys() == _docs(source_uri, {"_id": {"$lt": 10_000}}).keys()  # nothing half-applied


def json_ts(path: Path) -> Any:
    from bson.timestamp import Timestamp

    saved = json.loads(path.read_text())["position"]["cluster_time"]
    return Timestamp(saved["t"], saved["i"])


@pytest.mark.integration
def test_the_spark_data_sources_stream_from_a_time_older_than_the_oplog_is_history_lost(
    small_oplog_target: str,
) -> None:
    from bson.timestamp import Timestamp

    from replicator.errors import HistoryLost
    from replicator.events import Position
    from replicator.settings.resolve import settings_from_strings
    from replicator.spark_datasource.changes import RawChangeStream

    with pymongo.MongoClient(small_oplog_target) as client:
        start = client.admin.command("ping")["operationTime"]
        client.shop.orders.insert_many([{"_id": n} for n in range(2100)])
        settings = settings_from_strings({"source": small_oplog_target}, command="status")
        stream = RawChangeStream(client, settings)  # type: ignore[arg-type]
        with pytest.raises(HistoryLost, match="no longer in the source's oplog"):
            stream.open(Position(cluster_time=Timestamp(start.time, start.inc)))


@pytest.mark.integration
def test_a_way_back_started_with_another_checkpoint_names_cutovers_and_advises_no_deletion(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
    back, command = _migrate(source_uri, target_uri, tmp_path, "--include", "shop\\.orders")
    other = tmp_path / "my-back.json"  # as the docs' step 6 said: not the checkpoint cutover wrote
    refused = _mcdc("catch-up", "-s", target_uri, "-t", source_uri, "-c", str(other), "--include", "shop\\.orders",
                    "--no-progress")  # fmt: skip
    _assert_one_line_error(refused, 2, "way back", str(back), f"--checkpoint {back}")
    assert "delete" not in refused.stderr and back.exists() and not other.exists()
    with pymongo.MongoClient(target_uri) as client:
        client.shop.orders.insert_one({"_id": 5000, "total": 1})
    ran = _mcdc("catch-up", "-s", target_uri, "-t", source_uri, "-c", str(back), "--no-progress")  # as advised
    assert ran.returncode == 0, ran.stderr
    checked = _mcdc("verify", *shlex.split(command)[2:])
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.integration
def test_a_second_migration_over_a_stopped_ones_namespaces_is_first_offered_that_migration_again(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        _orders(client)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(first), "--no-progress").returncode == 0
    refused = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(second), "--no-progress")
    _assert_one_line_error(refused, 2, "shop.orders", f"--checkpoint {first}", "--snapshot always")
    assert "delete" not in refused.stderr and not second.exists()
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.update_one({"_id": 60}, {"$set": {"note": "again"}})
    again = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(first), "--snapshot", "always", "--no-progress")
    assert again.returncode == 0, again.stderr  # as advised: that migration, copied again
    checked = _mcdc("verify", "-s", source_uri, "-t", target_uri, "-c", str(first))
    assert checked.returncode == 0, checked.stdout + checked.stderr
