"""How a replayed batch is split into Spark tasks (pure): DDL cuts it, a document's events and a
transaction's stay in one task in source order, and applying the tasks' shares in any order ends where
applying the batch in order does."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from replicator.engines.spark.spread import group_key, runs, spread
from replicator.events import ChangeEvent, Namespace, Op, Transaction

NAMESPACES = [Namespace("db", "a"), Namespace("db", "b"), Namespace("other", "a")]


def _batch(rng: random.Random, size: int) -> list[ChangeEvent]:
    events: list[ChangeEvent] = []
    txn_number = 0
    while len(events) < size:
        roll = rng.random()
        if roll < 0.05:
            events.append(ChangeEvent(Op.DROP, rng.choice(NAMESPACES)))
            continue
        txn = None
        count = 1
        if roll < 0.2:  # a transaction over several documents, maybe several collections
            txn_number += 1
            txn = Transaction({"id": b"session"}, txn_number)
            count = rng.randint(2, 5)
        for _ in range(count):
            op = rng.choice([Op.INSERT, Op.UPDATE, Op.REPLACE, Op.DELETE])
            doc_id = rng.choice([rng.randint(0, 30), f"s{rng.randint(0, 5)}"])
            document = None if op is Op.DELETE else {"_id": doc_id, "v": len(events)}
            events.append(ChangeEvent(op, rng.choice(NAMESPACES), key={"_id": doc_id}, document=document, txn=txn))
    return events


def _state(events: list[ChangeEvent]) -> dict[tuple[Namespace, object], object]:
    """A toy target: each document's last value (a delete removes it)."""
    state: dict[tuple[Namespace, object], object] = {}
    for e in events:
        key = (e.ns, e.document_key["_id"])
        if e.op is Op.DELETE:
            state.pop(key, None)
        else:
            assert e.document is not None
            state[key] = e.document["v"]
    return state


@pytest.mark.parametrize("seed", range(30))
def test_shares_keep_documents_and_transactions_whole_and_in_order(seed: int) -> None:
    rng = random.Random(seed)
    batch = _batch(rng, rng.randint(1, 300))
    parts = rng.randint(1, 6)
    rebuilt: list[ChangeEvent] = []
    for barrier, run in runs(batch):
        if barrier:
            assert len(run) == 1 and run[0].op.is_ddl
            rebuilt.extend(run)
            continue
        assert not any(e.op.is_ddl for e in run)
        shares = spread(run, parts)
        assert 1 <= len(shares) <= parts and all(shares)
        assert sorted(id(e) for s in shares for e in s) == sorted(id(e) for e in run)  # each event once
        position = {id(e): i for i, e in enumerate(run)}
        owner: dict[object, int] = {}
        for n, share in enumerate(shares):
            assert [position[id(e)] for e in share] == sorted(position[id(e)] for e in share)  # source order
            for e in share:
                for link in (group_key(e, "document"), e.txn.key if e.txn is not None else None):
                    if link is not None:
                        assert owner.setdefault(link, n) == n  # a document's, a transaction's: one share
        assert spread(run, parts) == shares  # the same split every time
        # the shares applied one after another, in any order, end where the run in order does
        shuffled = shares[:]
        rng.shuffle(shuffled)
        assert _state([e for s in shuffled for e in s]) == _state(run)
        rebuilt.extend(run)
    assert rebuilt == batch  # barriers and runs in the batch's order


def test_a_namespace_sink_gets_each_collection_in_one_share() -> None:
    batch = _batch(random.Random(7), 200)
    run = [e for e in batch if not e.op.is_ddl]
    shares = spread(run, 4, by="namespace")
    for share in shares:
        txns = {e.txn.key for e in share if e.txn is not None}
        namespaces = {e.ns for e in share}
        others = [e for s in shares if s is not share for e in s]
        assert not namespaces & {e.ns for e in others}
        assert not txns & {e.txn.key for e in others if e.txn is not None}


def test_documents_spread_over_the_parts() -> None:
    run = [ChangeEvent(Op.INSERT, NAMESPACES[0], key={"_id": i}, document={"_id": i, "v": i}) for i in range(1000)]
    sizes = [len(s) for s in spread(run, 4)]
    assert len(sizes) == 4 and min(sizes) > 150  # a stable hash, roughly even
    counts: defaultdict[int, int] = defaultdict(int)
    for s in spread(run, 1):
        counts[len(s)] += 1
    assert counts == {1000: 1}
