"""Replay converges through unique secondary indexes: keys swapped, rotated, freed and taken again, in
one batch or across a kill -9, with and without looked-up full documents."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.compare import assert_identical
from tests.test_sync import run_job
from tests.test_tail import _abort_abandoned_transactions, _converged, _stop, _tail, _wait
from tests.test_tail import _no_stray_processes as _no_stray_processes  # autouse: a failed test leaves no tail

pytestmark = pytest.mark.integration

FULL_DOCUMENT = ["updateLookup", "default"]


def _users(uri: str, n: int) -> pymongo.collection.Collection[Any]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
    users = client.app.users
    users.create_index("email", unique=True)
    users.insert_many([{"_id": i, "email": f"u{i}@x", "n": 0} for i in range(n)])
    return users


@pytest.mark.parametrize("full_document", FULL_DOCUMENT)
async def test_swapped_emails_replay(source_uri: str, target_uri: str, tmp_path: Path, full_document: str) -> None:
    users = _users(source_uri, 4)
    cp = tmp_path / "cp.json"
    await run_job(source_uri, target_uri, cp, full_document=full_document)
    users.update_one({"_id": 0}, {"$set": {"email": "tmp"}})  # A -> tmp, B -> a, A -> b
    users.update_one({"_id": 1}, {"$set": {"email": "u0@x"}})
    users.update_one({"_id": 0}, {"$set": {"email": "u1@x", "n": 1}})
    await run_job(source_uri, target_uri, cp, command="catch-up", full_document=full_document)
    assert_identical(source_uri, target_uri)
    await run_job(source_uri, target_uri, cp, command="catch-up", full_document=full_document)  # rerun: fine too
    assert_identical(source_uri, target_uri)


@pytest.mark.parametrize("full_document", FULL_DOCUMENT)
async def test_rotated_emails_and_a_key_freed_then_taken(
    source_uri: str, target_uri: str, tmp_path: Path, full_document: str
) -> None:
    users = _users(source_uri, 5)
    cp = tmp_path / "cp.json"
    await run_job(source_uri, target_uri, cp, full_document=full_document)
    # a cycle of three: 0 -> u1, 1 -> u2, 2 -> u0
    users.update_one({"_id": 0}, {"$set": {"email": "tmp"}})
    users.update_one({"_id": 2}, {"$set": {"email": "tmp2"}})
    users.update_one({"_id": 1}, {"$set": {"email": "u2@x"}})
    users.update_one({"_id": 0}, {"$set": {"email": "u1@x"}})
    users.update_one({"_id": 2}, {"$set": {"email": "u0@x"}})
    # delete + re-insert of the same key, and a key taken by a new document after its holder moved on
    users.delete_one({"_id": 3})
    users.insert_one({"_id": 30, "email": "u3@x"})
    users.update_one({"_id": 4}, {"$set": {"email": "moved"}})
    users.insert_one({"_id": 40, "email": "u4@x"})
    users.replace_one({"_id": 4}, {"email": "u4-again@x"})
    await run_job(source_uri, target_uri, cp, command="catch-up", full_document=full_document)
    assert_identical(source_uri, target_uri)


async def test_a_swap_inside_a_transaction(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    users = _users(source_uri, 2)
    cp = tmp_path / "cp.json"
    await run_job(source_uri, target_uri, cp)
    with users.database.client.start_session() as session, session.start_transaction():
        users.update_one({"_id": 0}, {"$set": {"email": "tmp"}}, session=session)
        users.update_one({"_id": 1}, {"$set": {"email": "u0@x"}}, session=session)
        users.update_one({"_id": 0}, {"$set": {"email": "u1@x"}}, session=session)
    await run_job(source_uri, target_uri, cp, command="catch-up")
    assert_identical(source_uri, target_uri)


def _swap(users: pymongo.collection.Collection[Any], a: int, b: int, rng: random.Random) -> None:
    ea, eb = users.find_one({"_id": a})["email"], users.find_one({"_id": b})["email"]  # type: ignore[index]
    users.update_one({"_id": a}, {"$set": {"email": f"tmp{rng.random()}"}})
    users.update_one({"_id": b}, {"$set": {"email": ea}})
    users.update_one({"_id": a}, {"$set": {"email": eb, "n": rng.random()}})


def test_bursts_of_swaps_under_tail_with_kill_9(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    users = _users(source_uri, 20)
    cp = tmp_path / "cp.json"
    proc = _tail(source_uri, target_uri, cp)
    _wait(_converged(source_uri, target_uri), what="the snapshot")
    rng = random.Random(7)
    for burst in range(3):
        for _ in range(50):
            a, b = rng.sample(range(20), 2)
            _swap(users, a, b, rng)
        time.sleep(rng.uniform(0.05, 0.5))
        proc.kill()  # kill -9 while the burst is being applied
        proc.wait()
        _abort_abandoned_transactions(target_uri)  # what MongoDB's reaper does to its open transaction
        assert "Traceback" not in (proc.stderr.read() if proc.stderr else ""), f"burst {burst}"
        saved = cp.stat().st_mtime_ns
        proc = _tail(source_uri, target_uri, cp)
    try:
        _wait(_converged(source_uri, target_uri), timeout=120, what="convergence after the bursts")
        # the last tail is up (it saved the checkpoint) before it is stopped: a SIGTERM before Python set
        # its handlers would kill it
        _wait(lambda: cp.stat().st_mtime_ns != saved, what="the last tail's first save")
    finally:
        if proc.poll() is not None:
            print(proc.stderr.read() if proc.stderr else "")
    code, _, err = _stop(proc)
    assert code == 0, err


async def test_a_swap_under_a_case_insensitive_unique_index(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        users = client.app.people
        users.create_index("email", unique=True, collation={"locale": "en", "strength": 2})
        users.insert_many([{"_id": 0, "email": "A@x"}, {"_id": 1, "email": "B@x"}])
        cp = tmp_path / "cp.json"
        await run_job(source_uri, target_uri, cp)
        users.update_one({"_id": 0}, {"$set": {"email": "tmp"}})
        users.update_one({"_id": 1}, {"$set": {"email": "a@X"}})
        users.update_one({"_id": 0}, {"$set": {"email": "b@X"}})
    await run_job(source_uri, target_uri, cp, command="catch-up")
    assert_identical(source_uri, target_uri)
