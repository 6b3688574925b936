"""The DDL window and the looked-up documents check are pure: events in, decisions out."""

from __future__ import annotations

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, Namespace, Op, Position, UpdateDescription
from replicator.replay.ddl_window import DdlWindow
from replicator.settings.selection import Selection
from replicator.source.incarnations import keep_own_lookups, looked_up, uuids_from

A, B, C = Namespace("shop", "a"), Namespace("shop", "b"), Namespace("shop", "c")


def at(i: int, op: Op, ns: Namespace, **kw: object) -> ChangeEvent:
    return ChangeEvent(op, ns, position=Position(cluster_time=Timestamp(100, i)), **kw)  # type: ignore[arg-type]


def doc(i: int, ns: Namespace) -> ChangeEvent:
    return at(i, Op.INSERT, ns, key={"_id": i}, document={"_id": i})


def window(horizon: int) -> DdlWindow:
    w = DdlWindow(Selection.from_patterns([r"shop\..*"]))
    w.opened(Timestamp(100, horizon))
    return w


def test_ddl_past_the_horizon_is_applied_as_it_is() -> None:
    w = window(5)
    events = [doc(6, A), at(7, Op.RENAME, A, to=B), doc(8, A)]
    assert w.split(events) == (events, None)
    assert not w.pending


def test_ddl_inside_the_horizon_marks_its_namespaces_and_their_documents_wait() -> None:
    w = window(10)
    rename = at(3, Op.RENAME, A, to=B)
    now, rest = w.split([doc(2, A), rename, doc(4, A), doc(5, B), doc(6, C)])
    assert [e.position.cluster_time.inc for e in now if e.position and e.position.cluster_time] == [2, 6]
    assert rest is None and w.pending  # the checkpoint must stay before the rename
    later = [doc(9, C), doc(11, A), doc(12, C)]
    now, rest = w.split(later)
    assert now == [later[0]] and rest == later[1:]  # past the horizon: copy again before going on
    todo = w.take()
    assert todo.data == {A, B} and not w.pending
    w.copied(todo.data, Timestamp(100, 20))
    # the copies are newer than what follows: documents apply, DDL on them is inside their horizon again
    drop_a = at(21, Op.DROP, A)
    now, rest = w.split([doc(13, A), at(14, Op.DROP, B), drop_a])
    assert now == [doc(13, A)] and rest == [drop_a]  # B's copy is due before the stream passes 20
    assert w.take().data == {B}
    assert w.split(rest) == ([drop_a], None)  # past A's horizon: applied as it is


def test_catalog_ddl_inside_the_horizon_reconciles_without_skipping_documents() -> None:
    w = window(10)
    index = at(3, Op.CREATE_INDEXES, A, ddl={"indexes": [{"key": {"x": 1}, "name": "x_1"}]})
    now, _ = w.split([index, doc(4, A)])
    assert now == [doc(4, A)]
    todo = w.take()
    assert todo.catalog == {A} and not todo.data


def test_drop_database_inside_the_horizon_waits_for_the_whole_database() -> None:
    w = window(10)
    now, _ = w.split([at(3, Op.DROP_DATABASE, Namespace("shop")), doc(4, A), doc(5, Namespace("other", "x"))])
    assert [e.ns for e in now] == [Namespace("other", "x")]
    assert w.take().databases == {"shop"}


def test_a_rename_into_the_selection_is_always_copied() -> None:
    w = window(1)
    into = at(5, Op.RENAME, Namespace("scratch", "tmp"), to=A)
    now, _ = w.split([into])
    assert now == [] and w.take().data == {A}
    outside = at(6, Op.RENAME, Namespace("scratch", "x"), to=Namespace("scratch", "y"))
    assert w.split([outside]) == ([outside], None)  # not ours: the transform drops it


def test_a_looked_up_document_of_another_incarnation_keeps_only_its_delta() -> None:
    update = UpdateDescription({"touch": 4})
    old = at(1, Op.UPDATE, A, key={"_id": 0}, document={"_id": 0, "gen": 13}, update=update, uuid=b"old")
    same = at(2, Op.UPDATE, B, key={"_id": 0}, document={"_id": 0, "v": 1}, update=update, uuid=b"bbb")
    assert looked_up([old, same]) == {A, B}
    uuids = uuids_from(
        "shop", {"a", "b"}, [{"name": "a", "info": {"uuid": b"new"}}, {"name": "b", "info": {"uuid": b"bbb"}}]
    )
    out = keep_own_lookups([old, same], uuids)
    assert out[0].document is None and out[0].update == update
    assert out[1] is same
    gone = keep_own_lookups([old], uuids_from("shop", {"a"}, []))
    assert gone[0].document is None
