"""Selection and renaming are pure functions of a namespace."""

from __future__ import annotations

import pytest

from replicator.errors import ConfigError
from replicator.events import ChangeEvent, Namespace, Op
from replicator.settings.selection import Renamer, Scope, Selection, make_transform, renamed_into_selection


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


def test_scope_is_what_the_selection_maps_to() -> None:
    scope = Scope(Selection.from_patterns([r"shop\..*"]), Renamer.from_rules(["shop=shop_v2", "shop.a=arch.a"]))
    assert scope(Namespace("shop_v2", "orders"))
    assert scope.source_of(Namespace("arch", "a")) == Namespace("shop", "a")
    assert not scope(Namespace("shop_v2", "a"))  # shop.a goes to arch.a, not here
    assert not scope(Namespace("shop", "orders"))  # the source's name is not a target name when renamed
    assert not scope(Namespace("other", "x"))
    assert not scope(Namespace("shop_v2", "system.views"))
    drops = scope.database_drops("shop", "shop_v2", ["orders", "a", "x", "system.views"])
    assert drops == [Namespace("shop_v2", "orders"), Namespace("shop_v2", "x")]
    assert scope.database_drops("shop", "arch", ["a", "b"]) == [Namespace("arch", "a")]
    merged = Scope(Selection(), Renamer.from_rules(["a=c", "b=c"]))
    assert merged.database_drops("a", "c", ["x"]) == [Namespace("c", "x")]
    assert (
        Scope(Selection.from_patterns([r"a\.x"]), Renamer.from_rules(["a=c", "b=c"])).database_drops("b", "c", ["x"])
        == []
    )  # c.x is a.x's copy: dropping database b leaves it


def test_renames_across_the_selection_edge_become_drops_of_the_selected_side() -> None:
    sel = Selection.from_patterns([r"sel\..*"])
    t = make_transform(sel, Renamer())
    inside = t(ChangeEvent(Op.RENAME, Namespace("sel", "a"), to=Namespace("sel", "b")))
    assert inside is not None and inside.op is Op.RENAME
    out = t(ChangeEvent(Op.RENAME, Namespace("sel", "a"), to=Namespace("other", "keep")))
    assert out is not None and (out.op, out.ns, out.to) == (Op.DROP, Namespace("sel", "a"), None)
    into = ChangeEvent(Op.RENAME, Namespace("staging", "x"), to=Namespace("sel", "x"))
    dropped = t(into)
    assert dropped is not None and (dropped.op, dropped.ns) == (Op.DROP, Namespace("sel", "x"))
    assert renamed_into_selection(into, sel)
    assert not renamed_into_selection(ChangeEvent(Op.RENAME, Namespace("sel", "a"), to=Namespace("sel", "b")), sel)
    assert t(ChangeEvent(Op.RENAME, Namespace("x", "a"), to=Namespace("y", "b"))) is None


def test_a_copy_within_one_deployment_never_maps_onto_the_source() -> None:
    import pytest

    from replicator.errors import ConfigError
    from replicator.settings.selection import check_copy_within

    existing = [Namespace("scratch", "a"), Namespace("scratch", "b"), Namespace("other", "c")]
    sel = Selection.from_patterns([r"scratch\..*"])
    no_copy = Selection.from_patterns([r"scratch\..*"], [r"scratch\.a_copy"])
    rename = Renamer.from_rules(["scratch.a=scratch.a_copy"])
    with pytest.raises(ConfigError, match=r"scratch\.b is not renamed"):  # --drop-target would empty it
        check_copy_within([Namespace("scratch", "a"), Namespace("scratch", "b")], existing, no_copy, rename)
    with pytest.raises(ConfigError, match="selection also reads"):
        check_copy_within([Namespace("scratch", "a")], existing, sel, Renamer.from_rules(["scratch.a=scratch.a_copy"]))
    with pytest.raises(ConfigError, match="exists on the source"):
        check_copy_within([Namespace("scratch", "a")], existing, sel, Renamer.from_rules(["scratch.a=other.c"]))
    only_a = Selection.from_patterns([r"scratch\.a"])
    check_copy_within([Namespace("scratch", "a")], existing, only_a, Renamer.from_rules(["scratch.a=scratch.a_copy"]))
    check_copy_within([Namespace("scratch", "a")], existing, only_a, Renamer.from_rules(["scratch=backup"]))


def test_a_target_named_by_a_collection_rule_belongs_to_that_rule_alone() -> None:
    renamer = Renamer.from_rules(["legacy.users=app.users_legacy"])
    scope = Scope(Selection(), renamer)
    assert scope.source_of(Namespace("app", "users_legacy")) == Namespace("legacy", "users")
    assert renamer.shadowed(Namespace("app", "users_legacy")) and not renamer.shadowed(Namespace("legacy", "users"))
    assert scope.database_drops("app", "app", ["users_legacy", "orders"]) == [Namespace("app", "orders")]
    assert scope.database_drops("legacy", "legacy", ["users"]) == []  # its image lives in app
    shadow = ChangeEvent(Op.INSERT, Namespace("app", "users_legacy"), key={"_id": 1})
    assert make_transform(Selection(), renamer)(shadow) is None


@pytest.mark.parametrize(
    ("rules", "selected", "message"),
    [
        (["legacy.users=app.users_legacy"], ["legacy.users", "app.users_legacy"], "gives to legacy.users"),
        (["a=c", "b=c"], ["a.x", "b.x"], r"a\.x and b\.x would both be written to c\.x"),
    ],
)
def test_two_sources_onto_one_target_are_refused(rules: list[str], selected: list[str], message: str) -> None:
    from replicator.settings.selection import check_collisions

    namespaces = [Namespace(*name.split(".", 1)) for name in selected]
    with pytest.raises(ConfigError, match=message):
        check_collisions(namespaces, Renamer.from_rules(rules))
    check_collisions(namespaces[:1], Renamer.from_rules(rules))
