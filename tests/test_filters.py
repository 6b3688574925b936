"""Selection and renaming are pure functions of a namespace."""

from __future__ import annotations

from replicator.events import ChangeEvent, Namespace, Op
from replicator.filters import Renamer, Selection, make_transform


def test_default_selection_skips_system_namespaces() -> None:
    sel = Selection()
    assert sel(Namespace("shop", "orders"))
    for ns in (Namespace("admin", "x"), Namespace("local", "oplog.rs"), Namespace("config", "c")):
        assert not sel(ns)
    assert not sel(Namespace("shop", "system.views"))


def test_include_exclude_match_whole_namespace() -> None:
    sel = Selection.from_patterns(include=[r"shop\..*"], exclude=[r"shop\.tmp_.*"])
    assert sel(Namespace("shop", "orders"))
    assert not sel(Namespace("shop", "tmp_1"))
    assert not sel(Namespace("shopping", "orders"))
    assert not Selection.from_patterns(include=["shop"])(Namespace("shop", "orders"))  # fullmatch


def test_renames_collection_rules_win_over_database_rules() -> None:
    r = Renamer.from_rules(["shop=store", "shop.orders=archive.old_orders"])
    assert r(Namespace("shop", "orders")) == Namespace("archive", "old_orders")
    assert r(Namespace("shop", "users")) == Namespace("store", "users")
    assert r(Namespace("other", "x")) == Namespace("other", "x")
    assert r.inverse()(Namespace("store", "users")) == Namespace("shop", "users")


def test_transform_filters_renames_and_defers_index_ddl() -> None:
    t = make_transform(Selection(), Renamer.from_rules(["a=b"]), skip_index_ddl=True)
    ev = ChangeEvent(Op.INSERT, Namespace("a", "c"), key={"_id": 1}, document={"_id": 1})
    out = t(ev)
    assert out is not None and out.ns == Namespace("b", "c") and out.document is ev.document
    assert t(ChangeEvent(Op.CREATE_INDEXES, Namespace("a", "c"), ddl={"indexes": []})) is None
    assert t(ChangeEvent(Op.INSERT, Namespace("admin", "c"))) is None
    rename = ChangeEvent(Op.RENAME, Namespace("a", "c"), to=Namespace("a", "d"))
    out = t(rename)
    assert out is not None and out.to == Namespace("b", "d")
    view = ChangeEvent(Op.CREATE, Namespace("a", "v"), ddl={"viewOn": "c", "viewPipeline": []})
    t2 = make_transform(Selection(), Renamer.from_rules(["a.c=a.c2"]))
    out = t2(view)
    assert out is not None and out.ddl is not None and out.ddl["viewOn"] == "c2"
