"""The MongoDB write plan's delta updates, without a server: which update documents replay a delta."""

from __future__ import annotations

from typing import Any

from pymongo import UpdateOne

from replicator.events import ChangeEvent, Namespace, Op, UpdateDescription
from replicator.events.update_ops import update_document, update_steps
from replicator.sinks.mongo.plan import literal_ops, write_ops

NS = Namespace("d", "c")


def delta(updated: dict[str, Any], removed: tuple[str, ...] = (), truncated: tuple[tuple[str, int], ...] = ()) -> Any:
    return UpdateDescription(updated, removed, truncated)


def docs(update: UpdateDescription) -> list[Any]:
    ops = write_ops(ChangeEvent(Op.UPDATE, NS, key={"_id": 1}, update=update))
    assert all(isinstance(op, UpdateOne) for op in ops)
    return [op._doc for op in ops]  # type: ignore[union-attr]


def test_a_truncation_goes_before_the_elements_set_inside_the_array() -> None:
    # [1, 2, 3, 3] after $pull: {arr: 2}: arr.1 changed, cut to 3 (one update document cannot hold both)
    assert docs(delta({"arr.1": 3}, truncated=(("arr", 3),))) == [
        {"$push": {"arr": {"$each": [], "$slice": 3}}},
        {"$set": {"arr.1": 3}},
    ]


def test_an_array_cut_with_every_remaining_element_set_is_one_set_of_the_array() -> None:
    # $push with $slice: [1, 2, 3] -> [3, 4]
    assert docs(delta({"arr.0": 3, "arr.1": 4, "v": 1}, truncated=(("arr", 2),))) == [{"$set": {"v": 1, "arr": [3, 4]}}]


def test_nested_truncations_go_in_separate_writes_the_enclosing_array_first() -> None:
    # [[1, 2], [3]] -> [[1]] by an update pipeline: both arrays cut. One $push holding "a" and "a.0" is
    # refused (ConflictingUpdateOperators), an error the stale-delta rule would then skip
    ops = docs(delta({}, truncated=(("a.0", 1), ("a", 1), ("b", 0))))
    assert ops == [
        {"$push": {"a": {"$each": [], "$slice": 1}, "b": {"$each": [], "$slice": 0}}},
        {"$push": {"a.0": {"$each": [], "$slice": 1}}},
    ]


def test_unrelated_truncations_and_fields_keep_their_two_writes() -> None:
    assert docs(delta({"x": 1}, ("y",), (("arr", 1),))) == [
        {"$push": {"arr": {"$each": [], "$slice": 1}}},
        {"$set": {"x": 1}, "$unset": {"y": ""}},
    ]


def test_literal_ops_share_the_plan_of_the_plain_fields() -> None:
    event = ChangeEvent(Op.UPDATE, NS, key={"_id": 1}, update=delta({"$p": 1, "arr.0": 3}, truncated=(("arr", 1),)))
    plain, pipeline = literal_ops(event)
    assert plain._doc == {"$set": {"arr": [3]}}  # type: ignore[union-attr]
    assert pipeline._doc[0]["$replaceWith"]["$setField"]["field"] == {"$literal": "$p"}  # type: ignore[index,union-attr]


def test_one_update_document_where_the_paths_allow_it() -> None:
    assert update_document(delta({"a": 1}, ("b",), (("arr", 1),)), unset_value=True) == {
        "$set": {"a": 1}, "$unset": {"b": True}, "$push": {"arr": {"$each": [], "$slice": 1}},
    }  # fmt: skip
    assert update_document(delta({"arr.1": 3}, truncated=(("arr", 3),))) is None
    assert update_document(delta({})) == {}


def test_a_removed_field_inside_a_cut_array_keeps_the_truncation_apart() -> None:
    # an array of documents: element 0 lost its "x" and the array was cut to 1
    steps = update_steps(delta({}, ("arr.0.x",), (("arr", 1),)))
    assert steps == [{"$push": {"arr": {"$each": [], "$slice": 1}}}, {"$unset": {"arr.0.x": ""}}]
