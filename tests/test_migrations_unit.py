"""Unit tests (no server) of what decides between migrations: a way back's selection, the namespaces two
migrations would both write, and the registry that records who writes what."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replicator.checkpoint.registry import Lease, Registry, held
from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.events import Namespace
from replicator.job.cutover import reverse_command, reversed_settings
from replicator.replay.recorded import Recorded
from replicator.settings.resolve import resolve
from replicator.settings.selection import Image, Renamer, Scope, Selection, shared_targets

N = Namespace


def test_a_way_back_without_renames_selects_the_same_patterns_with_field_renames_inverted() -> None:
    forward = Recorded(include=(r"a\..*",), exclude=(r"a\.tmp",), field_rename=("a.x.pwd=hash",))
    back = forward.way_back()
    assert back == Recorded(include=(r"a\..*",), exclude=(r"a\.tmp",), field_rename=("a.x.hash=pwd",))
    assert not isinstance(back.selection, Image)


def test_a_way_back_through_renames_selects_exactly_what_the_migration_wrote() -> None:
    forward = Recorded(
        include=(r"shop\..*", r"crm\.users"),
        exclude=(r"shop\.tmp",),
        rename=("shop=shop2", "crm.users=shop2.people"),
        field_rename=("shop.orders.a.b=c", "crm.users.pwd=hash"),
    )
    back = forward.way_back()
    assert back.rename == ("shop2=shop", "shop2.people=crm.users")
    assert back.field_rename == ("shop2.orders.a.c=b", "shop2.people.hash=pwd")
    selected = back.selection
    assert isinstance(selected, Image)
    for ns, want in [
        (N("shop2", "orders"), True),
        (N("shop2", "people"), True),
        (N("shop2", "tmp"), False),  # excluded by the migration: never written
        (N("shop", "orders"), False),  # the old name: not on the new side
        (N("crm", "users"), False),
        (N("other", "keep"), False),
        (N("shop2", "system.views"), False),
    ]:
        assert selected(ns) is want, ns
    renamer = Renamer.from_rules(back.rename)
    assert renamer(N("shop2", "orders")) == N("shop", "orders") and renamer(N("shop2", "people")) == N("crm", "users")
    assert Recorded.from_json(json.loads(json.dumps(back.to_json()))) == back
    assert back.way_back().selection(N("shop", "orders")) and not back.way_back().selection(N("shop2", "orders"))


def test_a_way_backs_options_compare_in_any_order_and_ignore_what_its_image_is_of() -> None:
    back = Recorded(rename=("a2=a", "b2=b"), image_of=Recorded(rename=("a=a2", "b=b2")))
    assert back.same_options(Recorded(rename=("b2=b", "a2=a")))
    assert not back.same_options(Recorded(rename=("a2=a",)))


def test_reverse_settings_and_command_carry_the_reversed_selection(tmp_path: Path) -> None:
    settings = resolve({"source": "mongodb://old/", "target": "mongodb://new/", "include": (r"a\..*",),
                        "exclude": ("a\\.tmp",), "reverse_checkpoint": str(tmp_path / "back me.json")})  # fmt: skip
    back = reversed_settings(settings)
    assert (back.source, back.target, back.include, back.exclude) == ("mongodb://new/", "mongodb://old/",
                                                                      (r"a\..*",), ("a\\.tmp",))  # fmt: skip
    command = reverse_command(settings, tmp_path / "back me.json")
    assert command.endswith(f"--checkpoint '{tmp_path / 'back me.json'}' --include 'a\\..*' --exclude 'a\\.tmp'")
    renamed = resolve({"source": "mongodb://old/", "target": "mongodb://new/", "rename": ("a=a2",)})
    assert reverse_command(renamed, tmp_path / "b.json").endswith("--rename a2=a")
    assert isinstance(reversed_settings(renamed).selection, Image)


def test_include_patterns_name_the_namespaces_they_match_literally() -> None:
    named = Selection.from_patterns([r"a\.x", r"a\..*", "shop.orders", r"a\.\d", r"b\.y"], [r"b\.y"]).named()
    assert named == [N("a", "x"), N("shop", "orders")]


@pytest.mark.parametrize(
    ("mine", "theirs", "shared"),
    [
        ((r"a\..*",), (r"a\.x",), ["a.x"]),
        ((r"a\.x",), (r"a\..*",), ["a.x"]),
        ((r"a\..*",), (r"b\..*",), []),
        ((r"a\.y",), (r"a\..*",), ["a.y"]),  # a.y does not exist yet: named by the pattern
    ],
)
def test_two_selections_share_the_target_namespaces_both_map(
    mine: tuple[str, ...], theirs: tuple[str, ...], shared: list[str]
) -> None:
    source = [N("a", "x"), N("b", "z")]
    one, two = Scope(Selection.from_patterns(mine)), Scope(Selection.from_patterns(theirs))
    assert [str(ns) for ns in shared_targets(one, one.mapped(source), two, two.mapped(source))] == shared


def test_renames_onto_another_migrations_namespaces_are_shared() -> None:
    one = Scope(Selection.from_patterns([r"a\..*"]))
    two = Scope(Selection.from_patterns([r"b\..*"]), Renamer.from_rules(["b=a"]))
    assert shared_targets(one, one.mapped([N("a", "x")]), two, two.mapped([N("b", "x"), N("b", "y")])) == [
        N("a", "x"),
        N("a", "y"),  # not on the source yet, but the first one's selection takes it
    ]


def test_the_registry_keeps_what_a_lock_holder_wrote_and_forgets_gone_or_cut_over_checkpoints(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    kept, gone, cut = tmp_path / "kept.json", tmp_path / "gone.json", tmp_path / "cut.json"
    CheckpointStore(kept).save(Checkpoint("rs0"))
    CheckpointStore(cut).save(Checkpoint("rs0", cutover={"point": {"t": 1, "i": 1}}))
    leases = [Lease(str(path), "target", "source", {}, ("a.x",)) for path in (kept, gone, cut)]
    with registry.locked() as found:
        assert found == []
        registry.save(leases)
    with registry.locked() as found:
        assert found == leases
        assert [h.lease.checkpoint for lease in found if (h := held(lease)) is not None] == [str(kept)]
    with CheckpointStore(gone).locked():  # a run that has not saved its checkpoint yet still holds it
        holder = held(leases[1])
        assert holder is not None and holder.running and holder.checkpoint is None
