"""The embedded verifier's pure parts: the replay clock, re-check rounds and their verdicts, what events
make a round prove nothing, and the state kept in the checkpoint."""

from __future__ import annotations

import json

import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp

from replicator.checking.recheck import (
    AGAIN,
    COUNT,
    DOC,
    MISMATCH,
    RESOLVED,
    SCHEMA,
    Entry,
    RecheckList,
    ReplayClock,
    key_of,
)
from replicator.checking.sweep_state import Mismatches, SweepState, verification_of
from replicator.events import ChangeEvent, Namespace, Op, Position

NS = Namespace("shop", "orders")
DST = Namespace("archive", "orders")


def _event(op: Op, _id: object, ns: Namespace = NS, to: Namespace | None = None) -> ChangeEvent:
    key = None if op.is_ddl else {"_id": _id}
    return ChangeEvent(op=op, ns=ns, key=key, to=to, position=Position(cluster_time=Timestamp(5, 1)))


def test_the_clock_passes_a_read_by_an_applied_event_or_by_a_later_empty_poll() -> None:
    clock = ReplayClock()
    assert not clock.passed(Timestamp(10, 1), 100.0)
    clock.acked(Timestamp(10, 0))
    assert not clock.passed(Timestamp(10, 1), 100.0)
    clock.acked(Timestamp(10, 1))
    assert clock.passed(Timestamp(10, 1), 100.0)
    idle = ReplayClock()
    idle.acked(None, idle_since=99.0)  # a poll that began before the read ended proves nothing
    assert not idle.passed(Timestamp(10, 1), 100.0)
    idle.acked(None, idle_since=100.5)
    assert idle.passed(Timestamp(10, 1), 100.0)
    idle.acked(None, idle_since=50.0)  # never goes back
    assert idle.caught_up_at == 100.5


def test_a_round_resolves_when_equal_and_is_a_mismatch_only_when_nothing_touched_it() -> None:
    clock = ReplayClock()
    entry = Entry(NS, DST, DOC, key_of(1))
    entry.reading()
    entry.read_source(b"digest-a", Timestamp(20, 1), 10.0)
    assert not entry.due(clock)
    clock.acked(Timestamp(20, 1))
    assert entry.due(clock)
    assert entry.verdict(same=True) == RESOLVED
    assert entry.verdict(same=False) == AGAIN and not entry.read  # confirmed by a second quiet round
    entry.reading()
    entry.read_source(b"digest-a", Timestamp(20, 1), 10.0)
    assert entry.verdict(same=False) == MISMATCH
    entry.touched = True
    assert entry.verdict(same=False, now=50.0) == AGAIN and not entry.read  # a new round: the source again,
    assert not entry.ready(50.3) and entry.ready(50.4)  # after a wait that doubles with the rounds (2 so far)
    entry.reading()
    assert not entry.touched and entry.rounds == 2 and entry.differed == 0


def test_events_touch_the_documents_and_namespaces_they_change() -> None:
    rechecks = RecheckList(10)
    doc = Entry(NS, DST, DOC, key_of(1))
    int64 = Entry(NS, DST, DOC, key_of(Int64(2)))
    other = Entry(Namespace("shop", "users"), Namespace("shop", "users"), DOC, key_of(1))
    count = Entry(Namespace("shop", "metrics"), Namespace("shop", "metrics"), COUNT)
    schema = Entry(NS, DST, SCHEMA)
    for entry in (doc, int64, other, count, schema):
        assert rechecks.add(entry)
    rechecks.seen([_event(Op.UPDATE, 1), _event(Op.INSERT, 2)])  # Int32 2 is another _id than Int64 2
    assert doc.touched and not int64.touched and not other.touched and not count.touched and not schema.touched
    rechecks.seen([_event(Op.INSERT, 7, ns=Namespace("shop", "metrics"))])
    assert count.touched
    rechecks.seen([_event(Op.CREATE_INDEXES, None)])
    assert schema.touched and int64.touched and not other.touched
    rechecks.seen([_event(Op.DROP_DATABASE, None, ns=Namespace("shop"))])
    assert other.touched
    renamed = RecheckList(10)
    into = Entry(Namespace("shop", "new"), Namespace("shop", "new"), DOC, key_of(1))
    renamed.add(into)
    renamed.seen([_event(Op.RENAME, None, ns=Namespace("shop", "old"), to=Namespace("shop", "new"))])
    assert into.touched
    copied = RecheckList(10)
    again = Entry(NS, DST, DOC, key_of(3))
    copied.add(again)
    copied.namespace_changed(Namespace("shop"))  # a database copied again
    assert again.touched


def test_the_list_is_bounded_and_removes_what_it_holds() -> None:
    rechecks = RecheckList(2)
    first, second = Entry(NS, DST, DOC, key_of(1)), Entry(NS, DST, DOC, key_of(2))
    assert rechecks.add(first) and rechecks.add(second) and rechecks.add(Entry(NS, DST, DOC, key_of(1)))
    assert not rechecks.add(Entry(NS, DST, DOC, key_of(3))) and rechecks.room == 0
    rechecks.remove(first)
    assert len(rechecks) == 1 and rechecks.room == 1
    rechecks.seen([_event(Op.UPDATE, 1)])  # no longer watched
    assert not first.touched


def test_the_state_survives_the_checkpoint_and_counts_mismatches_once() -> None:
    state = SweepState(current="shop.orders", plan=[{"x": 1}], parts_done=3, scanned=300, total_scanned=900)
    entry = Entry(NS, DST, DOC, key_of(Int64(7)))
    assert state.found.add(entry, "differs") and not state.found.add(entry, "differs")
    rechecks = RecheckList(5)
    rechecks.add(Entry(NS, DST, SCHEMA))
    rechecks.add(entry)
    state.recheck = rechecks.to_json()
    saved = json.loads(json.dumps(state.to_json()))
    back = SweepState.from_json(saved)
    assert (back.current, back.plan, back.parts_done, back.scanned) == ("shop.orders", [{"x": 1}], 3, 300)
    assert back.mismatches == 1
    assert back.first_mismatches(5) == [
        {"namespace": "archive.orders", "_id": {"$numberLong": "7"}, "detail": "differs"}
    ]
    loaded = RecheckList(5)
    loaded.load(back.recheck)
    assert sorted(e.ident for e in loaded) == sorted(e.ident for e in rechecks)
    progress = verification_of(saved)
    assert (progress.phase, progress.rechecking, progress.pass_ranges) == ("scanning", 2, 3)  # as /progress said

    assert not back.pass_completed(at=1000.0)  # a mismatch: not clean
    assert back.passes == 1 and back.clean_passes == 0 and back.mismatches == 1  # the last pass's still count
    assert back.current is None and back.scanned == 0 and back.total_scanned == 900
    back.found.add(entry)  # found again in the next pass: still one
    assert back.mismatches == 1
    back.found = Mismatches()
    assert back.pass_completed(at=1001.0) and back.clean_passes == 1 and back.mismatches == 0


def test_changes_since_a_pass_keep_keys_and_mark_ddl_and_overflow_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from replicator.checking import cutover_check
    from replicator.checking.cutover_check import Changes

    changes = Changes()
    users = Namespace("shop", "users")
    changes.note([_event(Op.UPDATE, 1), _event(Op.DELETE, 2), _event(Op.UPDATE, 1), _event(Op.INSERT, 1, ns=users)])
    assert changes.scope(NS) == {key_of(1), key_of(2)} and changes.documents == 3
    changes.note([_event(Op.CREATE_INDEXES, None, ns=users)])
    assert changes.scope(users) is None and changes.scope(Namespace("shop", "quiet")) == set()
    changes.note([_event(Op.DROP_DATABASE, None, ns=Namespace("shop"))])
    assert changes.scope(NS) is None
    changes.add_rechecks([Entry(Namespace("b", "c"), Namespace("b", "c"), DOC, key_of(9))])
    assert changes.scope(Namespace("b", "c")) == {key_of(9)}

    monkeypatch.setattr(cutover_check, "KEY_CAP", 2)
    capped = Changes()  # past the cap, the namespace with the most keys is compared whole
    capped.note([_event(Op.UPDATE, i) for i in range(3)] + [_event(Op.UPDATE, 1, ns=users)])
    assert capped.scope(NS) is None and capped.scope(users) == {key_of(1)}


def test_a_raw_documents_key_is_cut_from_its_bytes_as_encoding_its_id_would_make_it() -> None:
    import datetime

    import bson
    from bson import Binary, Code, Decimal128, MaxKey, MinKey, ObjectId, Regex
    from bson.raw_bson import RawBSONDocument

    from replicator.checking.recheck import raw_key

    values = [1, Int64(5), -0.0, "abc", "é", ObjectId(), True, None, datetime.datetime(2020, 1, 1)]
    values += [Decimal128("1.5"), Timestamp(1, 2), MinKey(), MaxKey(), {"a": [1, {}]}, Binary(b"xy", 4), [1, 2]]
    for value in values:
        raw = bson.encode({"_id": value, "x": 1})
        assert raw_key(raw) == key_of(RawBSONDocument(raw)["_id"]), value
    for value in (Regex("a", "i"), Code("x")):  # rare _id types: decoded instead
        assert raw_key(bson.encode({"_id": value})) is None
    assert raw_key(bson.BSON.encode({"x": 1})) is None  # no _id first
