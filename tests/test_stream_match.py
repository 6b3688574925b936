"""The source pays for the selection only (issue 50): the change stream is filtered on the server by the
selection's $match, against the real test servers.

* a narrow selection reads no event of the namespaces it leaves out, but every DDL that brings one in or
  takes one out;
* a checkpoint saved under another $match (a widened selection) resumes exactly: no change row twice;
* an idle selection on a busy source: its position keeps up, and never falls off the oplog.

(Without a server: tests/test_stream_match_unit.py.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from bson.timestamp import Timestamp

from replicator.checkpoint.store import CheckpointStore
from replicator.events import Namespace, Op, Position
from replicator.observe.progress import LogReporter
from replicator.settings.config import Settings
from replicator.settings.selection import Selection
from replicator.source.changestream import token_timestamp
from replicator.source.connection import make_client, probe
from replicator.source.topology import StreamTopology
from tests.support.lake import duplicate_changes, read_table
from tests.support.servers import LocalServer, ServerPair

pytestmark = pytest.mark.integration


def _mcdc(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args, "--no-progress"], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


async def test_a_narrow_selection_reads_no_event_of_the_namespaces_it_leaves_out(source_uri: str) -> None:
    """Read through the run's own streams (StreamTopology), every event that arrives is the selection's, or a
    rename into it, or the drop of a database that holds it; the events of the busy namespaces beside it
    never arrive."""
    with pymongo.MongoClient(source_uri) as client:
        for name in ("orders", "carts", "old", "moving"):
            client.shop.create_collection(name)
        client.crm.create_collection("orders")
        start = client.admin.command("ping")["operationTime"]
        for n in range(30):
            client.shop.orders.insert_one({"_id": n})
            client.shop.carts.insert_one({"_id": n})
            client.crm.orders.insert_one({"_id": n})
        client.shop.orders.update_one({"_id": 1}, {"$set": {"v": 1}})
        client.shop.carts.update_one({"_id": 1}, {"$set": {"v": 1}})
        client.shop.old.rename("archive")  # into the selection
        client.shop.moving.insert_one({"_id": 1})
        client.shop.orders.create_index("v")
        client.shop.carts.create_index("v")
        client.drop_database("crm")
        until = client.admin.command("ping")["operationTime"]
    include = (r"shop\.orders", r"shop\.archive")
    settings = Settings(source=source_uri, include=include, selection=Selection.from_patterns(include))
    source = make_client(source_uri)
    try:
        info = await probe(source, source_uri, "source")
        reader = await StreamTopology(settings, LogReporter(), source).reader(info, max_await_ms=100)
        assert not hasattr(reader, "readers")  # one replica set: one stream
        await reader.open(Position(cluster_time=start))  # type: ignore[union-attr]
        events = [e async for batch in reader.batches(until=until) for e in batch.events]
        await reader.close()
    finally:
        await source.close()
    outside = [
        f"{e.op.value} {e.ns}" for e in events if not (settings.selection(e.ns) and e.ns.coll is not None)
        and not (e.to is not None and settings.selection(e.to)) and not (e.op is Op.DROP_DATABASE and e.ns.db == "shop")
    ]  # fmt: skip
    assert outside == [], f"events of namespaces the selection leaves out were read: {outside[:10]}"
    orders = Namespace("shop", "orders")
    assert sum(e.ns == orders and e.op is Op.INSERT for e in events) == 30
    assert any(e.ns == orders and e.op is Op.UPDATE for e in events)
    assert any(e.ns == orders and e.op is Op.CREATE_INDEXES for e in events)  # the selection's DDL
    assert any(e.op is Op.RENAME and e.to == Namespace("shop", "archive") for e in events)  # into the selection


def _token_time(token: Any) -> Timestamp:
    """The cluster time a resume token stands for: MongoDB's KeyString, or this test server's BSON (an INFRA
    quirk, read only here)."""
    known = token_timestamp(token)
    if known is not None:
        return known
    decoded = bson.decode(bytes.fromhex(token["_data"]))
    return decoded["t"]  # type: ignore[no-any-return]


@pytest.fixture
def small_oplog_source(servers: ServerPair, tmp_path: Path) -> Any:
    """A source of the test's own whose oplog keeps 1,000 entries."""
    if servers.external:
        pytest.skip("needs a server of the test's own, with a small oplog")
    server = LocalServer(tmp_path / "small-oplog", oplog_entries=1000)
    server.start()
    try:
        yield server.uri
    finally:
        server.kill()


def test_an_idle_selection_on_a_busy_source_keeps_up_and_never_falls_off_the_oplog(
    small_oplog_source: str, target_uri: str, tmp_path: Path
) -> None:
    """While other collections take three times what the oplog keeps, the tail of one quiet collection moves
    its checkpoint with the source (the post-batch resume tokens of the polls that found nothing); stopped,
    then more of the same, it still resumes where it was, and the target is exact."""
    source_uri = small_oplog_source
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.create_collection("orders")
        client.shop.create_collection("busy")
        client.other.create_collection("busy")
        client.shop.orders.insert_many([{"_id": n} for n in range(5)])
    common = ["-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", r"shop\.orders"]
    assert _mcdc("sync", *common).returncode == 0
    tail = subprocess.Popen(
        [sys.executable, "-m", "replicator.cli", "tail", *common, "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with pymongo.MongoClient(source_uri) as client:
            for n in range(1500):
                client.shop.busy.insert_one({"_id": n})
                client.other.busy.insert_one({"_id": n})
            last = client.admin.command("ping")["operationTime"]
        deadline = time.monotonic() + 120
        while True:  # the checkpoint's position passes the busy writes, with no write of its own
            saved = CheckpointStore(cp).load()
            token = saved.position.resume_token if saved is not None else None
            if token is not None and _token_time(token) >= last:
                break
            assert tail.poll() is None, tail.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"the checkpoint's position stayed behind {last}: {token}"
            time.sleep(0.2)
    finally:
        tail.terminate()
        _, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err[-3000:]
    with pymongo.MongoClient(source_uri) as client:
        for n in range(1500, 2500):  # what the tail stopped at leaves the oplog
            client.other.busy.insert_one({"_id": n})
        client.shop.orders.insert_one({"_id": 99})
    caught_up = _mcdc("catch-up", *common)
    assert caught_up.returncode == 0, caught_up.stderr[-3000:]
    with pymongo.MongoClient(target_uri) as client:
        assert client.shop.orders.find_one({"_id": 99}) == {"_id": 99}
        assert client.shop.list_collection_names() == ["orders"] and "other" not in client.list_database_names()
    verify = [sys.executable, "-m", "replicator.cli", "verify", *common]
    checked = subprocess.run(verify, capture_output=True, text=True, timeout=180)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_checkpoint_saved_under_another_match_resumes_exactly(source_uri: str, tmp_path: Path) -> None:
    """A transaction writes the selected collection and one beside it, which share its cluster time. Replayed
    into a lake under ``--include m.x``; then an older copy of the checkpoint runs again under a selection
    that takes the other collection in too (a wider $match, which counts the transaction's events
    differently). The change table of m.x holds each event once, as after one run."""
    lake = tmp_path / "lake"
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.m.create_collection("x")
        client.m.create_collection("y")
        client.m.x.insert_one({"_id": "before"})
    narrow = ["-s", source_uri, "-t", f"delta:{lake}", "-c", str(cp), "--include", r"m\.x"]
    done = _mcdc("sync", *narrow)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.copy(cp, tmp_path / "older.json")
    with pymongo.MongoClient(source_uri) as client, client.start_session() as session:
        with session.start_transaction():
            for n in range(4):
                client.m.y.insert_one({"_id": f"y{n}"}, session=session)
                client.m.x.insert_one({"_id": f"x{n}"}, session=session)
        client.m.y.update_one({"_id": "y1"}, {"$set": {"v": 1}})  # m.x's table is marked at the transaction
    done = _mcdc("catch-up", *narrow)
    assert done.returncode == 0, done.stderr[-3000:]
    first = read_table("delta", lake, "changes", "m", "x")
    assert first is not None
    shutil.copy(tmp_path / "older.json", cp)  # the older checkpoint, as a killed run would have left it
    wider = [*narrow, "--include", r"m\.y"]
    done = _mcdc("catch-up", *wider)
    assert done.returncode == 0, done.stderr[-3000:]
    again = read_table("delta", lake, "changes", "m", "x")
    assert again is not None

    assert duplicate_changes(again) == []
    assert again.num_rows == first.num_rows == 1 + 4  # the copy's row, the transaction's
    with pymongo.MongoClient(source_uri) as client:  # and the stream goes on under the wider match
        client.m.x.insert_one({"_id": "after"})
        client.m.y.insert_one({"_id": "after"})
    done = _mcdc("catch-up", *wider)
    assert done.returncode == 0, done.stderr[-3000:]
    final = read_table("delta", lake, "changes", "m", "x")
    assert final is not None and final.num_rows == 6 and duplicate_changes(final) == []
    saved = CheckpointStore(cp).load()
    assert saved is not None and saved.stream_filter is not None and len(saved.stream_filter.before) == 1
    assert _mcdc("catch-up", *wider).returncode == 0  # its position past the older match's stretch: forgotten
    saved = CheckpointStore(cp).load()
    assert saved is not None and saved.stream_filter is not None and not saved.stream_filter.before
