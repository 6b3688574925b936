"""A field rule on a field a unique index is built on (issue 49, item 7): every target document lacks the
field (or has it under another name), so the index cannot be built on the target and verify could never
pass. Refused before anything is written, naming the index; an index made later stops the run in one line,
never a warning and exit 0. Against the real servers."""

from __future__ import annotations

from pathlib import Path

import pymongo
import pytest

from tests.support.cli import mcdc, one_line_error

pytestmark = pytest.mark.integration


def _people(uri: str, *, index: bool = True, **options: bool) -> None:
    with pymongo.MongoClient(uri) as client:
        client.shop.people.insert_many([{"_id": i, "ssn": f"s{i}", "address": {"zip": f"z{i}"}} for i in range(5)])
        if index:
            client.shop.people.create_index("ssn", unique=True, name="ssn_1", **options)
            client.shop.people.create_index("address.zip", unique=True, name="zip_1")


@pytest.mark.parametrize(
    ("flag", "rule", "index", "field"),
    [
        ("--field-exclude", "shop.people.ssn", "ssn_1", "ssn"),
        ("--field-rename", "shop.people.ssn=tax_id", "ssn_1", "ssn"),
        ("--field-exclude", "shop.*.address", "zip_1", "address.zip"),
    ],
)
def test_a_field_rule_on_a_uniquely_indexed_field_is_refused_before_anything_is_written(
    source_uri: str, target_uri: str, tmp_path: Path, flag: str, rule: str, index: str, field: str
) -> None:
    _people(source_uri)
    result = mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), flag, rule)
    one_line_error(result, 2, "source:", f"unique index {index}", f"on {field}", rule)
    with pymongo.MongoClient(target_uri) as client:
        assert "shop" not in client.list_database_names()


def test_a_sparse_unique_index_on_an_excluded_field_indexes_no_document_and_verify_agrees(
    source_uri: str, target_uri: str
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.people.insert_many([{"_id": i, "ssn": f"s{i}"} for i in range(5)])
        client.shop.people.create_index("ssn", unique=True, sparse=True, name="ssn_1")
    uris = ("-s", source_uri, "-t", target_uri, "--field-exclude", "shop.people.ssn")
    synced = mcdc("sync", *uris, "--no-progress")
    assert synced.returncode == 0 and "WARNING" not in synced.stderr, synced.stderr
    verified = mcdc("verify", *uris)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_unique_index_made_later_on_an_excluded_field_stops_the_run_in_one_line(
    source_uri: str, target_uri: str
) -> None:
    _people(source_uri, index=False)
    uris = ("-s", source_uri, "-t", target_uri, "--field-exclude", "shop.people.ssn")
    assert mcdc("sync", *uris, "--no-progress").returncode == 0
    with pymongo.MongoClient(source_uri) as client:
        client.shop.people.create_index("ssn", unique=True, name="ssn_1")
    later = mcdc("catch-up", *uris, "--no-progress")
    one_line_error(later, 2, "unique index ssn_1", "shop.people")


async def test_a_unique_index_the_target_s_documents_cannot_take_is_an_error_not_a_warning(target_uri: str) -> None:
    """Wherever a unique index comes to be built on documents that repeat its key (a stream's createIndexes,
    the indexes built after a copy), the run stops in one line: the target no longer holds the source."""
    from pymongo import AsyncMongoClient

    from replicator.errors import SinkError
    from replicator.events import Namespace
    from replicator.sinks.mongo.schema import MongoSchema

    with pymongo.MongoClient(target_uri) as client:
        client.shop.people.insert_many([{"_id": i} for i in range(3)])  # no ssn: null, three times
    target: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(target_uri)
    try:
        schema = MongoSchema(target)
        with pytest.raises(SinkError, match=r"^target: the unique index ssn_1 on shop\.people cannot be built"):
            await schema.create_indexes(
                Namespace("shop", "people"), [{"key": {"ssn": 1}, "name": "ssn_1", "unique": True}]
            )
        await schema.create_indexes(Namespace("shop", "people"), [{"key": {"ssn": 1}, "name": "plain"}])  # not unique
    finally:
        await target.close()
