"""The way back's guard (settings.guard) and the kept fields' merge (FieldEditor.kept): pure, no server."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument

from replicator.events import Namespace
from replicator.replay.recorded import Recorded
from replicator.settings.fields import FieldRules, KeptFieldConflict
from replicator.settings.filters import DocumentFilters
from replicator.settings.guard import TargetGuard, renamed_filter_fields

NS = Namespace("shop", "orders")


def _raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


def _kept(rules: list[str], old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any]]:
    editor = FieldRules(exclude=rules).for_namespace(NS)
    assert editor is not None
    return list(bson.decode(bytes(editor.kept(_raw(old), _raw(new)).raw)).items())  # type: ignore[attr-defined]


def test_kept_fields_take_their_place_after_the_field_before_them_and_the_new_sides_own_value_is_dropped() -> None:
    old = {"_id": 1, "total": 5, "ssn": "s", "a": {"x": 1, "pin": 9}, "note": "x"}
    new = {"_id": 1, "note": "y", "total": 7, "a": {"x": 2}, "ssn": "NEW"}
    got = _kept(["shop.orders.ssn", "shop.orders.a.pin"], old, new)
    assert got == [("_id", 1), ("note", "y"), ("total", 7), ("ssn", "s"), ("a", {"x": 2, "pin": 9})]


def test_kept_fields_inside_an_array_of_documents_follow_each_element_while_its_length_stays() -> None:
    old = {"_id": 1, "items": [{"n": 1, "cost": 3}, {"n": 2, "cost": 4}]}
    got = _kept(["shop.orders.items.cost"], old, {"_id": 1, "items": [{"n": 1}, {"n": 5}]})
    assert got == [("_id", 1), ("items", [{"n": 1, "cost": 3}, {"n": 5, "cost": 4}])]
    with pytest.raises(KeptFieldConflict) as refused:
        _kept(["shop.orders.items.cost"], old, {"_id": 1, "items": [{"n": 1}]})
    assert refused.value.path == "items"


def test_a_kept_field_whose_parent_is_no_longer_a_document_has_no_place() -> None:
    with pytest.raises(KeptFieldConflict) as refused:
        _kept(["shop.orders.a.pin"], {"_id": 1, "a": {"pin": 9}}, {"_id": 1, "a": 5})
    assert refused.value.path == "a"
    assert _kept(["shop.orders.a.pin"], {"_id": 1, "a": {"x": 1}}, {"_id": 1, "a": 5}) == [("_id", 1), ("a", 5)]
    with pytest.raises(KeptFieldConflict) as gone:  # the parent is gone from the new document
        _kept(["shop.orders.a.pin"], {"_id": 1, "a": {"pin": 9}}, {"_id": 1, "b": 5})
    assert gone.value.path == "a"


def test_the_guard_narrows_writes_to_the_filters_documents_and_finds_what_was_not_copied() -> None:
    guard = TargetGuard(['shop\\.orders={"total": {"$gte": 100}}'], ["shop.orders.ssn"])
    assert guard.condition(NS, {"_id": 1}) == {"_id": 1, "$and": [{"total": {"$gte": 100}}]}
    assert guard.unmigrated(NS) == {"$or": [{"$nor": [{"total": {"$gte": 100}}]}, {"ssn": {"$exists": True}}]}
    assert guard.outside(NS) == {"$nor": [{"total": {"$gte": 100}}]}
    other = Namespace("shop", "users")
    assert not guard.guards(other) and guard.condition(other, {"_id": 1}) == {"_id": 1}


def test_a_way_backs_guard_comes_from_the_migrations_filter_and_excluded_fields_and_round_trips() -> None:
    forward = Recorded(
        include=("shop\\..*",), filter=('shop\\.orders={"total": 1}',), field_exclude=("shop.orders.ssn",)
    )
    back = forward.way_back()
    assert back.guard and back.keep == ("shop.orders.ssn",) and back.field_exclude == ()
    assert Recorded.from_json(back.to_json()) == back
    again = back.way_back()  # the migration going forward again excludes those fields again
    assert again.field_exclude == ("shop.orders.ssn",) and again.keep == () and again.filter == forward.filter


def test_a_way_back_refuses_a_filter_on_a_field_its_migration_renamed() -> None:
    guard = TargetGuard(['shop\\.orders={"a": 1}'], filter_names="target")
    filters = DocumentFilters(['shop\\.orders={"a": 1}'])
    fields = FieldRules(rename=["shop.orders.b=a"])  # the way back's: the migration renamed a to b
    refusal = renamed_filter_fields(guard, filters, fields, [NS])
    assert refusal is not None and "shop.orders" in refusal and "reads a" in refusal
    assert renamed_filter_fields(guard, DocumentFilters(['shop\\.orders={"c": 1}']), fields, [NS]) is None
    forward = TargetGuard()  # a migration's own filter is decided on its source's documents
    assert renamed_filter_fields(forward, filters, fields, [NS]) is None
