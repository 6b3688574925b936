"""Which rule matches no namespace of the source, and the near name it names (no server)."""

from __future__ import annotations

import dataclasses

from replicator.events import Namespace
from replicator.settings.config import Settings
from replicator.settings.filters import DocumentFilters
from replicator.settings.selection import Renamer, Selection
from replicator.settings.unmatched import refusal, unmatched_rule

SOURCE = [Namespace("shop", "orders"), Namespace("shop", "secrets"), Namespace("crm", "people.v2")]


def _settings(**options: tuple[str, ...]) -> Settings:
    s = Settings(source="mongodb://x", **options)  # type: ignore[arg-type]
    return dataclasses.replace(
        s,
        selection=Selection.from_patterns(s.include, s.exclude),
        renamer=Renamer.from_rules(s.rename),
        filters=DocumentFilters(s.filter),
    )


def test_rules_that_match_are_not_named() -> None:
    s = _settings(
        exclude=("shop\\.secrets",), filter=('shop\\.orders={"a": 1}',), rename=("crm=crm2", "shop.orders=o.x"),
        field_exclude=("crm.people.v2.ssn", "*.orders.pii"), field_rename=("shop.*.a=b",),
        shard_target=('.*\\.orders={"_id": 1}',),
    )  # fmt: skip
    assert unmatched_rule(s, SOURCE) is None


def test_exclude_is_matched_against_every_namespace_the_others_against_the_selected_ones() -> None:
    assert unmatched_rule(_settings(include=("crm\\..*",), exclude=("shop\\.secrets",)), SOURCE) is None
    said = unmatched_rule(_settings(include=("crm\\..*",), filter=('shop\\.orders={"a": 1}',)), SOURCE)
    assert said == "--filter 'shop\\.orders={\"a\": 1}' matches no selected namespace on the source"
    assert unmatched_rule(_settings(exclude=("shop\\.secret",)), SOURCE) == (
        "--exclude 'shop\\.secret' matches no namespace on the source (did you mean 'shop.secrets'?)"
    )


def test_each_kind_of_rule_names_its_near_name() -> None:
    cases = {
        "rename": (("shp=shop2",), "--rename 'shp=shop2' matches no database on the source (did you mean 'shop'?)"),
        "field_exclude": (("crm.people.v3.ssn",), "--field-exclude 'crm.people.v3.ssn' matches no selected "),
        "field_rename": (("shop.order.a=b",), "(did you mean 'shop.orders'?)"),
        "shard_target": (('shop\\.order={"_id": 1}',), "--shard-target 'shop\\.order={\"_id\": 1}' matches no"),
    }
    for option, (rules, said) in cases.items():
        found = unmatched_rule(_settings(**{option: rules}), SOURCE)
        assert found is not None and said in found, (option, found)
    nothing_near = unmatched_rule(_settings(rename=("zzz.q=a.b",)), SOURCE)
    assert nothing_near == "--rename 'zzz.q=a.b' matches no selected namespace on the source"
    assert refusal("X").endswith("pass --allow-unmatched if it names a namespace created later")
