"""A random, reproducible write workload on a source server, for the end-to-end tail tests."""

from __future__ import annotations

import random
import time
from typing import Any

import pymongo
from bson.int64 import Int64

OP_KINDS = ("insert", "update", "unset", "replace", "delete", "txn", "many", "push")


def random_workload(uri: str, rounds: int, seed: int, *, ids: int = 200, ddl: bool = True) -> None:
    """Write ``rounds`` random operations to collections ``a`` and ``b`` of database ``work`` at ``uri``.

    Each round picks an ``_id`` below ``ids`` and one of: an upsert inserting ``{v, arr, n}``; a ``$set`` +
    ``$inc`` update; an ``$unset``; a ``$push`` with ``$slice``; a replace (upsert) with ``-0.0`` and an Int64
    field; a delete; an ``update_many`` over the lowest tenth of the ids; or a transaction that upserts into
    ``a``, deletes from ``b`` and inserts into ``c``.  The same ``seed`` gives the same operations.

    With ``ddl`` it also, at round ``rounds // 3``, creates, indexes and renames a collection ``tmp<seed>``,
    and at ``rounds // 2`` drops the renamed one and creates a capped ``fresh<seed>``.  Leave it off where
    collections are rebuilt from data events alone, which cannot follow renames and drops.
    """
    rng = random.Random(seed)
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
    with client:
        db = client.work
        for r in range(rounds):
            i = rng.randrange(ids)
            kind = rng.choice(OP_KINDS)
            coll = db[rng.choice(["a", "b"])]
            if kind == "insert":
                coll.update_one({"_id": i}, {"$setOnInsert": {"v": r, "arr": [1, 2, 3], "n": 0}}, upsert=True)
            elif kind == "update":
                coll.update_one({"_id": i}, {"$set": {"v": r, "sub.x": r}, "$inc": {"n": 1}})
            elif kind == "unset":
                coll.update_one({"_id": i}, {"$unset": {"v": ""}})
            elif kind == "push":
                coll.update_one({"_id": i}, {"$push": {"arr": {"$each": [r], "$slice": -2}}})
            elif kind == "replace":
                coll.replace_one({"_id": i}, {"r": r, "z": -0.0, "big": Int64(r)}, upsert=True)
            elif kind == "delete":
                coll.delete_one({"_id": i})
            elif kind == "many":
                coll.update_many({"_id": {"$lt": ids // 10}}, {"$inc": {"m": 1}})
            else:
                with client.start_session() as s, s.start_transaction():
                    db.a.update_one({"_id": i}, {"$set": {"t": r}}, upsert=True, session=s)
                    db.b.delete_one({"_id": i}, session=s)
                    db.c.insert_one({"r": r}, session=s)
            if ddl and r == rounds // 3:
                db[f"tmp{seed}"].insert_many([{"_id": k} for k in range(5)])
                db[f"tmp{seed}"].create_index("k")
                db[f"tmp{seed}"].rename(f"tmp{seed}_renamed")
            if ddl and r == rounds // 2:
                db[f"tmp{seed}_renamed"].drop()
                db.create_collection(f"fresh{seed}", capped=True, size=1 << 16)
                db[f"fresh{seed}"].insert_one({"_id": 1})


def two_shard_workload(a_uri: str, b_uri: str) -> None:
    """Writes to ``db.c`` on two servers acting as two shards of one source: each inserts half the
    ``_id``s, then a "chunk migration" moves documents from a to b, where they change again.

    The shards of a real cluster share a logical clock (cluster time gossip), so what b does after a has a
    later cluster time; these two independent servers do not (see :func:`wait_past_cluster_time`), so the
    move waits for the wall clock to pass a's cluster time to give the same order."""
    with pymongo.MongoClient(a_uri) as a, pymongo.MongoClient(b_uri) as b:
        a.db.c.insert_many([{"_id": i, "on": "a"} for i in range(0, 200, 2)])
        b.db.c.insert_many([{"_id": i, "on": "b"} for i in range(1, 200, 2)])
        moved = [a.db.c.find_one_and_delete({"_id": i}) for i in range(0, 60, 2)]
        wait_past_cluster_time(a_uri)
        b.db.c.insert_many([{**doc, "on": "b", "moved": True} for doc in moved if doc is not None])
        b.db.c.update_many({"moved": True}, {"$set": {"after_move": 1}})
        a.db.c.update_many({}, {"$set": {"touched": 1}})
        b.db.c.delete_many({"_id": {"$gt": 190}})


def wait_past_cluster_time(*uris: str) -> None:
    """Return once the wall clock's second is later than the cluster time of the last write on each server
    at ``uris``, so that what another server writes next is later than what these wrote before.

    The test servers are independent replica sets: they share no cluster time, only the wall clock, whose
    second stamps their writes; but a SecantusDB restarted a moment ago stamps its first writes a second
    ahead of the wall clock. Waiting for the next wall-clock second (what the tests did before) was not
    enough right after a test that restarted the session's source."""
    latest = 0
    for uri in uris:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
        with client:
            latest = max(latest, client.admin.command("ping")["operationTime"].time)
    while time.time() < latest + 1.05:
        time.sleep(0.02)
