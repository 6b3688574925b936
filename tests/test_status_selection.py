"""status and cutover find a migration by its selection (issue 49, item 2): asked with a selection that no
migration of the pair was run with, they say so in one line naming the pair's migrations (exit 2), never
another migration's state. Against the real servers."""

from __future__ import annotations

import json

import pymongo
import pytest

from tests.support.cli import mcdc, one_line_error

pytestmark = pytest.mark.integration


def test_status_and_cutover_of_a_selection_never_run_name_the_pair_s_migrations(
    source_uri: str, target_uri: str
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
        client.crm.people.insert_one({"_id": 1})
    uris = ("-s", source_uri, "-t", target_uri)
    assert mcdc("sync", *uris, "--no-progress").returncode == 0  # the pair's one migration: everything
    for command in (("status",), ("status", "--json"), ("cutover",)):
        asked = mcdc(*command, *uris, "--include", "zzz\\..*")
        line = one_line_error(asked, 2, "no migration of this source and target", "--include zzz\\..*", "(everything)")
        assert "checkpoint-" in line, line  # the migration there is, by its checkpoint
        assert asked.stdout == ""


def test_of_two_migrations_each_is_found_by_its_selection_and_a_third_by_none(source_uri: str, target_uri: str) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
        client.crm.people.insert_one({"_id": 1})
    uris = ("-s", source_uri, "-t", target_uri)
    for include in ("shop\\..*", "crm\\..*"):
        assert mcdc("sync", *uris, "--include", include, "--no-progress").returncode == 0
    shop = mcdc("status", *uris, "--include", "shop\\..*", "--json")
    crm = mcdc("status", *uris, "--include", "crm\\..*", "--json")
    assert shop.returncode == 0 and crm.returncode == 0, shop.stderr + crm.stderr
    assert json.loads(shop.stdout)["checkpoint"] != json.loads(crm.stdout)["checkpoint"]
    line = one_line_error(
        mcdc("status", *uris, "--include", "shop\\.orders"), 2, "--include shop\\..*", "--include crm"
    )
    assert line.count("checkpoint-") == 2, line
