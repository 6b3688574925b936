"""The chaos harness's writes: a seeded mix of CRUD, transactions, unique-key swaps and DDL on a source.

Namespaces (all in the selection but ``chaos.ext_*``, which ``SELECTION`` excludes):

* ``chaos.a``, ``chaos.b``: inserts, ``$set``/``$inc``/``$unset``/``$push`` with ``$slice``, replaces,
  deletes, ``updateMany``, transactions over both, ``$``-prefixed fields, arrays of arrays, ~1 MB
  documents; index churn and views on ``a``; collMod of ``b``'s validator. Bursts of fresh documents
  into ``a`` (string ``_id``s no other write touches), for a target crashed right after they are acknowledged.
* ``chaos.u``: a unique index on ``k``, whose values documents swap.
* TTLs made before mcdc starts (a TTL index on ``b``, the clustered ``chaos.ttl_clustered``'s own), which no
  document meets: a migration holds them still on its target, and its cutover gives them back.
* ``chaos.log``: rotated (``log -> log_N``, a new ``log`` with the same ``_id``s), archives dropped later.
* ``chaos.c``: dropped and created again with other options (capped, a validator, plain).
* ``chaos.in_N`` / ``chaos.ext_N``: collections renamed into the selection from ``ext_*`` and out of it.
* ``chaos2.*``: a database dropped with ``dropDatabase``, and renamed from into ``chaos``.
* ``chaos3.w``: left alone; a widened selection takes it.
* ``side.*`` and ``chaos.ext_side`` (:data:`SIDE`): outside every selection; another application writes its
  own there on the target, and on the new side during the way back (:class:`SideWorkload`).
* ``chaos.t_N`` (lake plans): created inside a transaction that writes ``a`` and ``b`` before and after
  it, so the DDL event sits among the transaction's events at its one cluster time; and transactions of
  many events, more than a replay batch holds.

Two quirks of the test server shape the writes (real MongoDB does otherwise; mcdc does not code around
them): it leaves index options (``unique``, ``partialFilterExpression``, and ``sparse`` too) out of
createIndexes events (INFRA.md), so indexes made during the run are plain and the unique one is made
before mcdc starts
(``prepare``); and an update adds new fields in the order its operators and fields are written, where
MongoDB 5.0+ adds them in lexicographic order, so every update here names its fields in that order (a
delta replayed on the target then places them as the source did, as on MongoDB).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pymongo
from bson.int64 import Int64
from pymongo.errors import BulkWriteError, OperationFailure

#: mcdc's selection flags for the chaos namespaces.
SELECTION = ("--include", r"chaos2?\..*", "--exclude", r"chaos\.ext_.*")
IDS = 24
#: namespaces outside every selection the harness uses, which another application writes: on the target
#: during a migration, and on the new side during the way back (``chaos.ext_side`` sits among selected ones)
SIDE = ("side.keep", "side.other", "chaos.ext_side")
#: write kinds, each with its weight; ``ddl=False`` keeps the first group only (event sinks rebuilt from
#: data topics alone cannot follow DDL)
DATA_KINDS: dict[str, int] = {
    "upsert": 6, "update": 6, "unset": 2, "push": 2, "replace": 3, "delete": 3, "many": 1, "txn": 3,
    "dollar": 1, "nested": 1, "large": 1, "swap": 2,
}  # fmt: skip
DDL_KINDS: dict[str, int] = {
    "rotate": 2, "drop_archive": 1, "recreate": 1, "rename_in": 1, "rename_out": 1, "drop_database": 1,
    "from_other_db": 1, "coll_mod": 1, "index": 1, "drop_index": 1, "view": 1,
}  # fmt: skip
#: lake plans' own: a change table must keep every event of a transaction cut by a batch or by its DDL
LAKE_KINDS: dict[str, int] = {"txn_ddl": 2, "big_txn": 2}
#: filtered plans' own (harness.FILTERS): documents of ``a`` and ``b`` moved into and out of a filter on
#: ``region`` by updates, replaces, inserts and updateMany, with the values a query's semantics turn on:
#: arrays that hold the value or not, null, a missing field, another type; and ``u``'s unique keys moved
FLIP_KINDS: dict[str, int] = {"flip": 8, "flip_many": 1, "flip_insert": 2, "rekey": 2}
REGIONS: tuple[Any, ...] = ("EU", "US", "UK", ["US", "EU"], ["US"], None, 7)


def selected(ns: str) -> bool:
    """Is ``db.coll`` in the harness's selection (what the comparison looks at)?"""
    db, _, coll = ns.partition(".")
    return db in ("chaos", "chaos2") and not coll.startswith("ext_")


def prepare(uri: str) -> None:
    """The starting state: a few documents everywhere, and the unique index on ``chaos.u``."""
    with pymongo.MongoClient(uri) as client:
        for db in ("chaos", "chaos2", "chaos3", "side"):
            client.drop_database(db)
        chaos = client.chaos
        chaos.a.insert_many([{"_id": i, "v": 0, "arr": [[1, 2], [3]]} for i in range(IDS)])
        chaos.b.insert_many([{"_id": i, "n": Int64(i)} for i in range(IDS)])
        chaos.u.insert_many([{"_id": i, "k": i} for i in range(8)])
        chaos.u.create_index("k", unique=True, name="k_unique")
        # TTLs, which a migration holds still on its target until cutover (no document here ever expires:
        # no field ``expires``, and the clustered collection's _ids are no dates)
        chaos.b.create_index("expires", expireAfterSeconds=3600, name="ttl_expires")
        chaos.create_collection(
            "ttl_clustered", clusteredIndex={"key": {"_id": 1}, "unique": True}, expireAfterSeconds=86400
        )
        chaos.ttl_clustered.insert_many([{"_id": i, "n": i} for i in range(5)])
        chaos.log.insert_many([{"_id": i, "gen": 0} for i in range(4)])
        client.chaos2.x.insert_many([{"_id": i} for i in range(5)])
        client.chaos3.w.insert_many([{"_id": i, "widened": True} for i in range(7)])  # taken by a widened selection
        for ns in SIDE:  # outside every selection: never written on either side, nor on the way back
            db, _, coll = ns.partition(".")
            client[db][coll].insert_many([{"_id": i, "old side": True} for i in range(3)])


class ChaosWorkload:
    """Writes one random operation per :meth:`step`, all drawn from ``rng``."""

    def __init__(
        self, uri: str, rng: random.Random, *, ddl: bool = True, lake: bool = False, flips: bool = False
    ) -> None:
        """``flips``: writes that move documents across the filtered plans' filters (FLIP_KINDS) too."""
        self.uri = uri
        self.client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
        self.rng = rng
        kinds = {**DATA_KINDS, **(DDL_KINDS if ddl else {}), **(LAKE_KINDS if lake else {})}
        kinds.update(FLIP_KINDS if flips else {})
        self._kinds, self._weights = list(kinds), list(kinds.values())
        self._n = 0
        self.counts: dict[str, int] = {}

    def close(self) -> None:
        self.client.close()

    def steps(self, count: int, pace_s: float = 0.0) -> None:
        """``count`` operations, ``pace_s`` apart on average (so checkpoints are saved between them)."""
        for _ in range(count):
            self.step()
            if pace_s:
                time.sleep(self.rng.uniform(0, 2 * pace_s))

    def step(self) -> str:
        """One operation; returns its kind (``kind!`` when the server refused it, which is fine: the
        source stays what it is, and mcdc must follow whatever it is)."""
        self._n += 1
        kind = self.rng.choices(self._kinds, self._weights)[0]
        op: Callable[[], None] = getattr(self, f"_{kind}")
        try:
            op()
        except (OperationFailure, BulkWriteError):
            kind += "!"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return kind

    def burst(self, chunks: int, size: int, pace_s: float) -> None:
        """``chunks`` inserts of ``size`` fresh documents into ``chaos.a``, ``pace_s`` apart. No later write
        touches them (their ``_id``s are strings, the workload's others numbers), so one the target lost
        stays missing there. Its own client: it runs beside the harness's thread."""
        self._n += 1
        with pymongo.MongoClient[dict[str, Any]](self.uri, serverSelectionTimeoutMS=5000) as client:
            for chunk in range(chunks):
                docs = [
                    {"_id": f"burst-{self._n}-{chunk}-{i}", "burst": self._n, "pad": "x" * 100} for i in range(size)
                ]
                client.chaos.a.insert_many(docs)
                time.sleep(pace_s)
        self.counts["burst"] = self.counts.get("burst", 0) + 1

    # -- documents -------------------------------------------------------------------------------
    def _id(self) -> int:
        return self.rng.randrange(IDS)

    def _coll(self) -> Any:
        return self.client.chaos[self.rng.choice(["a", "b", "log"])]

    def _upsert(self) -> None:
        self._coll().update_one({"_id": self._id()}, {"$setOnInsert": {"v": self._n, "arr": [1, 2]}}, upsert=True)

    def _update(self) -> None:
        self._coll().update_one({"_id": self._id()}, {"$inc": {"c": 1}, "$set": {"sub.x": self._n, "v": self._n}})

    def _unset(self) -> None:
        self._coll().update_one({"_id": self._id()}, {"$unset": {"v": "", "sub.x": ""}})

    def _push(self) -> None:
        self._coll().update_one({"_id": self._id()}, {"$push": {"arr": {"$each": [self._n], "$slice": -3}}})

    def _replace(self) -> None:
        doc = {"r": self._n, "z": -0.0, "big": Int64(self._n), "when": self._n * 1.5}
        self._coll().replace_one({"_id": self._id()}, doc, upsert=True)

    def _delete(self) -> None:
        self._coll().delete_one({"_id": self._id()})

    def _many(self) -> None:
        self._coll().update_many({"_id": {"$lt": IDS // 3}}, {"$inc": {"m": 1}})

    def _txn(self) -> None:
        chaos, i = self.client.chaos, self._id()
        with self.client.start_session() as s, s.start_transaction():
            chaos.a.update_one({"_id": i}, {"$set": {"t": self._n}}, upsert=True, session=s)
            chaos.b.delete_one({"_id": (i + 1) % IDS}, session=s)
            chaos.b.update_one({"_id": i}, {"$inc": {"c": 1}, "$set": {"t": self._n}}, upsert=True, session=s)

    def _txn_ddl(self) -> None:
        """A collection created inside a transaction, among writes before and after it (MongoDB 4.4+)."""
        chaos, i, name = self.client.chaos, self._id(), f"t_{self._n}"
        with self.client.start_session() as s, s.start_transaction():
            chaos.a.update_one({"_id": i}, {"$set": {"t": self._n}}, upsert=True, session=s)
            chaos.create_collection(name, session=s)
            chaos[name].insert_one({"_id": i, "n": self._n}, session=s)
            chaos.b.update_one({"_id": i}, {"$set": {"t": self._n}}, upsert=True, session=s)
            chaos.a.delete_one({"_id": (i + 1) % IDS}, session=s)

    def _big_txn(self) -> None:
        """A transaction of more events than a replay batch (the lake plans' --max-batch-size) holds."""
        chaos = self.client.chaos
        with self.client.start_session() as s, s.start_transaction():
            for _ in range(self.rng.randrange(6, 20)):
                coll = chaos[self.rng.choice(["a", "b"])]
                coll.update_one({"_id": self._id()}, {"$set": {"big": self._n}}, upsert=True, session=s)

    def _region(self) -> Any:
        return self.rng.choice(REGIONS)

    def _flip(self) -> None:
        """One document of ``a`` or ``b`` moved across: ``region`` set or unset, or the document replaced."""
        coll, i, way = self.client.chaos[self.rng.choice(["a", "b"])], self._id(), self.rng.random()
        if way < 0.6:
            coll.update_one({"_id": i}, {"$set": {"region": self._region()}}, upsert=True)
        elif way < 0.8:
            coll.update_one({"_id": i}, {"$unset": {"region": ""}})
        else:
            coll.replace_one({"_id": i}, {"n": self._n, "region": self._region()}, upsert=True)

    def _flip_many(self) -> None:
        """Several documents across at once (one event each)."""
        low = self.rng.randrange(IDS)
        self.client.chaos[self.rng.choice(["a", "b"])].update_many(
            {"_id": {"$gte": low, "$lt": low + 6}}, {"$set": {"region": self._region()}}
        )

    def _flip_insert(self) -> None:
        """Fresh documents on both sides of the filter (``_id``s no other write touches)."""
        docs = [{"_id": f"f-{self._n}-{k}", "region": self._region(), "v": self._n} for k in range(3)]
        self.client.chaos[self.rng.choice(["a", "b"])].insert_many(docs)

    def _rekey(self) -> None:
        """A document of ``u`` takes another unique key (refused while another holds it): on the new side, the
        key of an old-side document its migration never copied, which the way back must not delete."""
        self.client.chaos.u.update_one({"_id": self.rng.randrange(8)}, {"$set": {"k": self.rng.randrange(10)}})

    def _dollar(self) -> None:
        value = {"$literal": {"$price": self._n}}
        stage = {"$replaceWith": {"$setField": {"field": {"$literal": "$cost"}, "input": "$$ROOT", "value": value}}}
        self.client.chaos.a.update_one({"_id": self._id()}, [stage], upsert=True)

    def _nested(self) -> None:
        arrays = [[self._n, [self._n, [self._n]]], [], [[{"x": [1, [2]]}]]]
        self.client.chaos.b.update_one({"_id": self._id()}, {"$set": {"nest": arrays}}, upsert=True)

    def _large(self) -> None:
        size = self.rng.choice([200_000, 1_000_000])
        self.client.chaos.a.replace_one({"_id": self._id()}, {"blob": "x" * size, "n": self._n}, upsert=True)

    def _swap(self) -> None:
        """Two documents trade their unique ``k`` through a free value, as an application does."""
        u = self.client.chaos.u
        x, y = self.rng.sample(range(8), 2)
        dx, dy = u.find_one({"_id": x}), u.find_one({"_id": y})
        if dx is None or dy is None:
            u.update_one({"_id": x}, {"$setOnInsert": {"k": 100 + x}}, upsert=True)
            return
        if self.rng.random() < 0.5:
            with self.client.start_session() as s, s.start_transaction():
                u.update_one({"_id": x}, {"$set": {"k": -1 - x}}, session=s)
                u.update_one({"_id": y}, {"$set": {"k": dx["k"]}}, session=s)
                u.update_one({"_id": x}, {"$set": {"k": dy["k"]}}, session=s)
        else:
            u.update_one({"_id": x}, {"$set": {"k": -1 - x}})
            u.update_one({"_id": y}, {"$set": {"k": dx["k"]}})
            u.update_one({"_id": x}, {"$set": {"k": dy["k"]}})

    # -- DDL ---------------------------------------------------------------------------------------
    def rotate(self) -> None:
        """A log rotation now, outside the drawn steps (it draws nothing: the seed's steps stay the same)."""
        self._n += 1
        self._rotate()
        self.counts["rotate"] = self.counts.get("rotate", 0) + 1

    def _rotate(self) -> None:
        chaos = self.client.chaos
        chaos.log.update_one({"_id": 0}, {"$set": {"touch": self._n}}, upsert=True)
        chaos.log.rename(f"log_{self._n}", dropTarget=True)
        chaos.log.insert_many([{"_id": i, "gen": self._n} for i in range(3)])
        chaos.log.update_one({"_id": 1}, {"$inc": {"v": 1}})

    def _drop_archive(self) -> None:
        archives = [n for n in self.client.chaos.list_collection_names() if n.startswith("log_")]
        if archives:
            self.client.chaos.drop_collection(self.rng.choice(sorted(archives)))

    def _recreate(self) -> None:
        chaos = self.client.chaos
        chaos.drop_collection("c")
        options: dict[str, Any] = self.rng.choice(
            [{}, {"capped": True, "size": 1 << 16, "max": 50}, {"validator": {"n": {"$type": "int"}}}]
        )
        chaos.create_collection("c", **options)
        chaos.c.insert_many([{"_id": i, "n": i, "gen": self._n} for i in range(5)])

    def _rename_in(self) -> None:
        chaos = self.client.chaos
        name = f"ext_{self._n}"
        chaos[name].insert_many([{"_id": i, "from": "outside", "at": self._n} for i in range(6)])
        chaos[name].update_one({"_id": 0}, {"$set": {"changed": True}})
        chaos[name].rename(f"in_{self._n}")
        chaos[f"in_{self._n}"].insert_one({"_id": "after", "n": self._n})

    def _rename_out(self) -> None:
        chaos = self.client.chaos
        inside = sorted(n for n in chaos.list_collection_names() if n.startswith("in_"))
        if inside:
            chaos[self.rng.choice(inside)].rename(f"ext_gone_{self._n}")

    def _drop_database(self) -> None:
        self.client.drop_database("chaos2")
        self.client.chaos2.x.insert_many([{"_id": i, "gen": self._n} for i in range(3)])

    def _from_other_db(self) -> None:
        chaos2 = self.client.chaos2
        chaos2.y.insert_many([{"_id": i, "from": "chaos2", "at": self._n} for i in range(4)])
        self.client.admin.command("renameCollection", "chaos2.y", to=f"chaos.from2_{self._n}")

    def _coll_mod(self) -> None:
        validator = {"n": {"$exists": self.rng.random() < 0.5}}
        self.client.chaos.command("collMod", "b", validator=validator, validationAction="warn")

    def _index(self) -> None:
        a = self.client.chaos.a
        field = self.rng.choice(["v", "c", "r", "sub.x"])
        direction = self.rng.choice([1, -1])
        self.rng.random()  # drew sparse or not, which the test server's events lose: kept, so seeds replay the same
        a.create_index([(field, direction)], name=f"ix_{field}_{direction}")

    def _drop_index(self) -> None:
        a = self.client.chaos.a
        names = sorted(n for n in a.index_information() if n.startswith("ix_"))
        if names:
            a.drop_index(self.rng.choice(names))

    def _view(self) -> None:
        chaos = self.client.chaos
        views = sorted(n for n in chaos.list_collection_names() if n.startswith("view_"))
        if views and self.rng.random() < 0.5:
            chaos.drop_collection(self.rng.choice(views))
            return
        pipeline = [{"$match": {"v": {"$gt": self.rng.randrange(50)}}}, {"$project": {"v": 1}}]
        chaos.create_collection(f"view_{self._n}", viewOn="a", pipeline=pipeline)


class SideWorkload:
    """Another application's writes to namespaces no selection takes (:data:`SIDE`), with DDL: inserts,
    updates, deletes, drops, a rename within its database and ``dropDatabase``. It keeps what each namespace
    must hold, so a test can tell that nobody else wrote them (:meth:`check`)."""

    def __init__(self, uri: str, rng: random.Random) -> None:
        # journaled: a "crash target" (kill -9) must not lose a write it believes made (an unjournaled delete
        # of side.keep's document came back after one: "side.keep ... was written")
        self.client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            uri, serverSelectionTimeoutMS=5000, journal=True
        )
        self.rng = rng
        self.expected: dict[str, dict[int, dict[str, Any]]] = {ns: {} for ns in SIDE}
        self._n = 0
        for ns in SIDE:
            for i in range(5):
                self._upsert(ns, i)

    def close(self) -> None:
        self.client.close()

    def _coll(self, ns: str) -> Any:
        db, _, coll = ns.partition(".")
        return self.client[db][coll]

    def _upsert(self, ns: str, i: int) -> None:
        self._n += 1
        doc = {"_id": i, "side": self._n}
        self._coll(ns).replace_one({"_id": i}, doc, upsert=True)
        self.expected.setdefault(ns, {})[i] = doc

    def steps(self, count: int) -> None:
        for _ in range(count):
            self.step()

    def step(self) -> None:
        kind = self.rng.choices(["upsert", "delete", "drop", "rename", "drop_database"], [8, 3, 1, 1, 1])[0]
        ns = self.rng.choice(SIDE)
        if kind == "upsert":
            self._upsert(ns, self.rng.randrange(8))
        elif kind == "delete":
            i = self.rng.randrange(8)
            self._coll(ns).delete_one({"_id": i})
            self.expected.get(ns, {}).pop(i, None)
        elif kind == "drop":
            self._coll(ns).drop()
            self.expected.pop(ns, None)
        elif kind == "rename":  # side.other over side.keep, as a log rotation would
            if self.expected.get("side.other"):
                self.client.side.other.rename("keep", dropTarget=True)
                self.expected["side.keep"] = self.expected.pop("side.other")
        else:
            self.client.drop_database("side")
            for name in [n for n in self.expected if n.startswith("side.")]:
                del self.expected[name]

    def check(self) -> None:
        """Each side namespace holds exactly what this workload left there (raises AssertionError)."""
        for ns in SIDE:
            got = {doc["_id"]: doc for doc in self._coll(ns).find()}
            want = self.expected.get(ns, {})
            if got != want:
                raise AssertionError(f"{ns}, which no selection takes, was written: {got} instead of {want}")
