"""Rules that name namespaces must match one (issue 49): a typo in ``--filter`` or ``--exclude`` would
otherwise copy what the rule was written to keep out. Every such rule (``--exclude``, ``--filter``,
``--rename``, ``--field-exclude``, ``--field-rename``, ``--shard-target``, in every form: flags, MCDC_*
variables, a config file) that matches no namespace of the source is refused before anything is written,
in one line naming the near namespace; ``--allow-unmatched`` lets a rule wait for a namespace created later.
Against the real servers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pymongo
import pytest

from tests.support.cli import mcdc, one_line_error

pytestmark = pytest.mark.integration

#: each rule with a typo (``order`` for ``orders``, ``secret`` for ``secrets``), and the name it meant
TYPOS = [
    ("--filter", 'shop\\.order={"pii": false}', "shop.orders"),
    ("--exclude", "shop\\.secret", "shop.secrets"),
    ("--rename", "shop.order=shop.archive", "shop.orders"),
    ("--field-exclude", "shop.order.ssn", "shop.orders"),
    ("--field-rename", "shop.order.ssn=tax_id", "shop.orders"),
    ("--shard-target", 'shop\\.order={"_id": "hashed"}', "shop.orders"),
]


def _shop(uri: str) -> None:
    """shop.orders: 100 documents, the 50 odd ones personal (``pii``); shop.secrets: 3 documents."""
    with pymongo.MongoClient(uri) as client:
        client.shop.orders.insert_many([{"_id": i, "pii": i % 2 == 1, "ssn": f"s{i}"} for i in range(100)])
        client.shop.secrets.insert_many([{"_id": i, "key": "k"} for i in range(3)])


def _written(uri: str) -> list[str]:
    with pymongo.MongoClient(uri) as client:
        return [name for name in client.list_database_names() if name not in ("admin", "local", "config")]


@pytest.mark.parametrize(("flag", "rule", "near"), TYPOS, ids=[t[0] for t in TYPOS])
def test_a_rule_that_matches_no_namespace_is_refused_naming_the_near_one(
    source_uri: str, target_uri: str, tmp_path: Path, flag: str, rule: str, near: str
) -> None:
    _shop(source_uri)
    cp = tmp_path / "cp.json"
    refused = mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), flag, rule, "--no-progress")
    one_line_error(refused, 2, flag, "matches no", "on the source", f"did you mean '{near}'?", "--allow-unmatched")
    assert _written(target_uri) == []  # nothing written
    assert list(tmp_path.iterdir()) == []  # neither a checkpoint nor a lock file


def test_the_rules_of_variables_and_config_files_are_refused_too(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _shop(source_uri)
    env = {**os.environ, "MCDC_FILTER": 'shop\\.order={"pii": false}'}
    by_variable = mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "a.json"), env=env)
    one_line_error(by_variable, 2, "--filter", "did you mean 'shop.orders'?")
    config = tmp_path / "mcdc.toml"
    config.write_text('exclude = ["shop\\\\.secret"]\n')
    by_file = mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "b.json"), "--config", str(config))
    one_line_error(by_file, 2, "--exclude 'shop\\.secret'", "did you mean 'shop.secrets'?")
    assert _written(target_uri) == []


def test_allow_unmatched_lets_a_rule_wait_for_a_namespace_created_later(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """The documented opt-in: a filter for shop.returns, which the source creates after the first run."""
    _shop(source_uri)
    rule = 'shop\\.returns={"pii": false}'
    uris = ("-s", source_uri, "-t", target_uri)
    first = mcdc("sync", *uris, "--filter", rule, "--allow-unmatched", "--no-progress")
    assert first.returncode == 0, first.stderr
    assert "WARNING" in first.stderr and "--filter 'shop\\.returns=" in first.stderr
    with pymongo.MongoClient(source_uri) as client:
        client.shop.create_collection("returns")
        client.shop.returns.insert_many([{"_id": i, "pii": i % 2 == 1} for i in range(10)])
    later = mcdc("catch-up", *uris, "--filter", rule, "--allow-unmatched", "--no-progress")
    assert later.returncode == 0, later.stderr
    with pymongo.MongoClient(target_uri) as client:
        assert sorted(d["_id"] for d in client.shop.returns.find()) == [0, 2, 4, 6, 8]
        assert client.shop.orders.count_documents({}) == 100
    verified = mcdc("verify", *uris, "--filter", rule, "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["differences"] == []


@pytest.mark.parametrize("change", ["drop", "rename"])
def test_a_rule_whose_namespace_goes_away_later_warns_and_goes_on(
    source_uri: str, target_uri: str, tmp_path: Path, change: str
) -> None:
    """As docs/how-to/select-and-rename.md says: a rule is checked against the source when its migration
    begins; a later run whose rule matches nothing any more (the collection dropped, or renamed to a name
    the rule does not match) warns and goes on. A collection renamed before the run's stream opened is
    copied again under its new name's rules (none here), as partial-replication.md says."""
    _shop(source_uri)
    rule = 'shop\\.orders={"pii": false}'
    uris = ("-s", source_uri, "-t", target_uri)
    assert mcdc("sync", *uris, "--filter", rule, "--no-progress").returncode == 0
    with pymongo.MongoClient(source_uri) as client:
        if change == "drop":
            client.shop.orders.drop()
        else:
            client.shop.orders.rename("orders_old")
            client.shop.orders_old.insert_one({"_id": 100, "pii": True})
    later = mcdc("catch-up", *uris, "--filter", rule, "--no-progress")
    assert later.returncode == 0, later.stderr
    assert "WARNING" in later.stderr and "--filter 'shop\\.orders=" in later.stderr
    with pymongo.MongoClient(target_uri) as client:
        assert "orders" not in client.shop.list_collection_names()
        if change == "rename":  # made before this run's stream opened: copied again under its new name's rules
            assert sorted(d["_id"] for d in client.shop.orders_old.find()) == list(range(101))
    verified = mcdc("verify", *uris, "--filter", rule)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_spark_data_source_refuses_them_before_it_reads(source_uri: str) -> None:
    """The data source's planning (on the driver, no JVM needed): a batch read, a stream with its snapshot,
    and a stream without one each refuse a rule that matches nothing, in mcdc's one line."""
    from replicator.spark_datasource.options import OptionError
    from replicator.spark_datasource.snapshot import SnapshotReader
    from replicator.spark_datasource.stream import ChangeStreamReader

    _shop(source_uri)
    typo = {"source": source_uri, "filter": 'shop\\.order={"pii": false}'}
    with pytest.raises(OptionError, match=r"--filter .*did you mean 'shop\.orders'\?.*option\(\"allow-unmatched\""):
        SnapshotReader(typo).partitions()
    with pytest.raises(OptionError, match=r"did you mean 'shop\.orders'\?"):
        ChangeStreamReader({**typo, "snapshot": "initial"}).initialOffset()
    with pytest.raises(OptionError, match=r"--exclude 'shop\\\.secret' .*did you mean 'shop\.secrets'\?"):
        ChangeStreamReader({"source": source_uri, "exclude": "shop\\.secret", "snapshot": "never"}).initialOffset()
    allowed = SnapshotReader({**typo, "allow-unmatched": "true"}).partitions()
    assert {f"{p.partition['db']}.{p.partition['coll']}" for p in allowed} == {"shop.orders", "shop.secrets"}


def test_a_lakeflow_connector_refuses_them_when_it_lists_its_tables(source_uri: str) -> None:
    """The connector checks its whole selection once; a table's read (its collection selected alone) is not
    refused for a rule that names another of its tables."""
    from replicator.lakeflow.connect import LakeflowError, MongoLakeflowConnect

    _shop(source_uri)
    with pytest.raises(LakeflowError, match=r"--field-exclude 'shop\.order\.ssn' .*did you mean 'shop\.orders'\?"):
        MongoLakeflowConnect({"source": source_uri, "field-exclude": "shop.order.ssn"}).list_tables()
    connector = MongoLakeflowConnect({"source": source_uri, "field-exclude": "shop.orders.ssn"})
    assert connector.list_tables() == ["shop.orders", "shop.secrets"]
    records, offset = connector.read_table("shop.secrets", None, {})
    assert list(records) == [] and offset  # the first call plans its snapshot: not refused
    records, _ = connector.read_table("shop.secrets", offset, {})
    assert sorted(r["_id"] for r in records) == [f'{{"$numberInt":"{i}"}}' for i in range(3)]
