"""Documents with ``$``-prefixed top-level fields (legal since MongoDB 5.0, made with ``$setField``) are
copied, replayed and copied again after a crash, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pymongo
import pytest

from tests.support.compare import assert_identical
from tests.test_sync import run_job

pytestmark = pytest.mark.integration


def _set_field(name: str, value: object) -> list[dict[str, object]]:
    return [{"$replaceWith": {"$setField": {"field": {"$literal": name}, "input": "$$ROOT", "value": value}}}]


async def test_dollar_prefixed_fields_survive_sync_and_replay(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        coll = client.shop.items
        coll.insert_many([{"_id": i, "name": f"item{i}"} for i in range(20)])
        for i in range(0, 20, 2):
            coll.update_one({"_id": i}, _set_field("$price", {"$literal": i * 1.25}))
    cp = tmp_path / "cp.json"
    await run_job(source_uri, target_uri, cp)
    assert_identical(source_uri, target_uri)
    with pymongo.MongoClient(source_uri) as client:
        before = client.admin.command("ping")["operationTime"]
        coll = client.shop.items
        coll.update_one({"_id": 0}, _set_field("$price", {"$literal": 99}))  # an update with a looked-up document
        coll.update_one({"_id": 2}, {"$set": {"name": "renamed"}})
        coll.replace_one({"_id": 1}, {"name": "plain again"})
        coll.update_one({"_id": 1}, _set_field("$discount", {"$literal": 0.5}))
    await run_job(source_uri, target_uri, cp, command="catch-up")
    assert_identical(source_uri, target_uri)
    for full_document in ("default", "updateLookup"):  # the same events again over the result: idempotent
        for over in tmp_path.glob("*.json"):  # the migration before is over: one writer per target namespace
            over.unlink()
        again = tmp_path / f"{full_document}.json"
        start = f"{before.time},{before.inc}"
        await run_job(source_uri, target_uri, again, snapshot="never", start_at=start, full_document=full_document)
        assert_identical(source_uri, target_uri)
