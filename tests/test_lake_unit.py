"""The lake sink's pure parts: rows, folding events into a state table's changes, duplicates."""

from __future__ import annotations

import bson
import pyarrow as pa
from bson.int64 import Int64
from bson.timestamp import Timestamp

from replicator.bsonkit.rawbson import DICT_CODEC
from replicator.events import ChangeEvent, Namespace, Op, Position, UpdateDescription
from replicator.sinks.lake.backend import duplicates
from replicator.sinks.lake.fold import apply_update, fold, needs_base
from replicator.sinks.lake.tables import CHANGE_SCHEMA, TableRef, change_table, cluster_time_of, id_json, state_table

NS = Namespace("d", "c")


def _at(t: int, i: int = 1, n: int = 0) -> Position:
    return Position({"_data": f"{t:08x}{i:08x}{n:04x}"}, Timestamp(t, i), n)


def _ev(op: Op, _id: object, t: int, i: int = 1, n: int = 0, **kw: object) -> ChangeEvent:
    return ChangeEvent(op=op, ns=NS, key={"_id": _id}, position=_at(t, i, n), **kw)  # type: ignore[arg-type]


def _update(
    set_: dict[str, object], removed: tuple[str, ...] = (), truncated: tuple[tuple[str, int], ...] = ()
) -> UpdateDescription:
    return UpdateDescription(updated_fields=set_, removed_fields=removed, truncated_arrays=truncated)  # type: ignore[arg-type]


def test_apply_update_sets_paths_removes_fields_and_truncates_arrays_first() -> None:
    raw = bson.encode({"_id": 1, "a": {"b": 1}, "arr": [1, 2, 3, 4], "gone": True, "n": Int64(5)})
    out = bson.decode(
        apply_update(raw, _update({"a.c": 2, "arr.1": 9, "new.deep": "x"}, ("gone",), (("arr", 2),))), DICT_CODEC
    )
    assert out == {"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 9], "n": 5, "new": {"deep": "x"}}
    assert isinstance(out["n"], Int64)  # types survive the round trip


def test_fold_keeps_each_documents_last_state_in_order() -> None:
    doc = bson.encode({"_id": 1, "v": 1})
    events = [
        _ev(Op.INSERT, 1, 10, document=bson.decode(doc)),
        _ev(Op.UPDATE, 1, 11, update=_update({"v": 2})),  # a delta on the row the insert just set
        _ev(Op.DELETE, 2, 12),
        _ev(Op.UPDATE, 3, 13, update=_update({"w": 1})),  # needs the table's row
        _ev(Op.UPDATE, 4, 14, update=_update({"w": 1})),  # no row anywhere: the document is gone
    ]
    assert needs_base(events) == {id_json(3), id_json(4)}
    folded = fold(events, {id_json(3): bson.encode({"_id": 3})})
    ups = {k: (bson.decode(b), v) for k, b, _, v in folded.upserts()}
    assert ups == {
        id_json(1): ({"_id": 1, "v": 2}, cluster_time_of(events[1])),
        id_json(3): ({"_id": 3, "w": 1}, cluster_time_of(events[3])),
    }
    assert sorted(folded.deletes()) == sorted([id_json(2), id_json(4)])


def test_change_rows_carry_each_events_place_in_the_stream() -> None:
    events = [_ev(Op.INSERT, i, 20, 1, i, document={"_id": i}) for i in range(3)] + [_ev(Op.DELETE, 0, 21)]
    table = change_table(events)
    assert table.schema == CHANGE_SCHEMA
    assert [s["n"] for s in table["sequence"].to_pylist()] == [0, 1, 2, 0]
    assert table["sequence"].to_pylist()[3] == {"t": 21, "i": 1, "shard": "", "n": 0}
    assert table["cluster_time"].to_pylist()[3] == {"t": 21, "i": 1}
    assert cluster_time_of(events[3]) == (21, 1)


def test_duplicates_keep_one_row_per_key_and_only_r_rows_of_a_change_table() -> None:
    state = state_table([("1", b"a", "{}", None), ("1", b"a", "{}", None), ("2", b"b", "{}", None)])
    column, keys, keep = duplicates(TableRef("state", NS), state)
    assert (column, keys, keep["_id"].to_pylist()) == ("_id", ["1"], ["1"])
    changes = pa.table({"key": ["k", "k", "k", "j"], "op": ["r", "r", "u", "u"]})
    column, keys, keep = duplicates(TableRef("changes", NS), changes)
    assert (column, keys, keep.num_rows) == ("key", ["k"], 1)
    assert duplicates(TableRef("changes", NS), pa.table({"key": ["k", "k"], "op": ["u", "d"]}))[1] == []


def test_duplicates_keep_the_rows_of_two_copies_made_at_different_times() -> None:
    first, later = {"t": 5, "i": 1, "shard": "", "n": -1}, {"t": 9, "i": 2, "shard": "", "n": -1}
    changes = pa.table(
        {"key": ["k", "k", "k", "j"], "op": ["r", "r", "r", "r"], "sequence": [first, later, first, later]}
    )
    column, keys, keep = duplicates(TableRef("changes", NS), changes)
    assert (column, keys) == ("key", ["k"])
    assert keep["sequence"].to_pylist() == [first, later]  # the copy written twice once; the later copy kept
    assert duplicates(TableRef("changes", NS), changes.slice(1, 3))[1] == []


def test_a_snapshot_batchs_rows_are_the_ones_the_general_row_functions_make() -> None:
    from bson import ObjectId

    from replicator.events.normalize import snapshot_read
    from replicator.sinks.lake.fold import fold
    from replicator.sinks.lake.tables import snapshot_tables

    docs = [{"_id": 1, "a": [1.5, {"b": "c"}]}, {"_id": ObjectId(), "s": 'q"uote'}, {"_id": {"k": 2}, "n": None}]
    events = [snapshot_read(NS, bson.decode(bson.encode(d))) for d in docs]
    state, changes = snapshot_tables(NS, events)
    assert state.equals(state_table(fold(events, {}).upserts()))
    assert changes.equals(change_table(events))


def test_the_id_key_column_has_the_ids_own_type_where_they_share_one() -> None:
    import datetime

    from bson import ObjectId

    from replicator.sinks.lake import typed

    oid = ObjectId()
    when = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    cases = [([1, Int64(10), 2], "int64"), (["b", "a"], "string"), ([oid], "objectid"), ([when], "date")]
    for ids, kind in cases:
        kinds, _ = typed.learn({}, [{"_id": i} for i in ids], fields=False)
        assert kinds == {typed.KEY: kind}
    mixed, became = typed.learn({typed.KEY: "int64"}, [{"_id": "x"}], fields=False)
    assert mixed == {typed.KEY: typed.JSON} and became == {typed.KEY}
    rows = state_table([(id_json(i), bson.encode({"_id": i}), "{}", None) for i in (10, 2, 1)])
    keyed = typed.with_columns(rows, {typed.KEY: "int64"})
    assert keyed[typed.KEY].to_pylist() == [10, 2, 1] and keyed.schema.field(typed.KEY).type == pa.int64()
    assert typed.column_name("_id_key") == "_id_key_"  # a field named like it keeps a column of its own
