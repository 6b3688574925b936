"""--field-exclude / --field-rename end to end: snapshot, inserts, updates (looked up and deltas) and
pre-images, into MongoDB and into Kafka. Every field that is not excluded stays byte-exact.

The expected documents are made here from the source's, with plain dict edits: code that shares nothing
with replicator.settings.fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from bson import Int64
from bson.codec_options import CodecOptions, DatetimeConversion

from tests.support.kafka import KafkaBroker, consume_all, list_topics
from tests.support.rebuild import _dump, assert_same, rebuild
from tests.test_sync import run_job

pytestmark = pytest.mark.integration

RULES: dict[str, Any] = {
    "field_exclude": ("shop.customers.card.number", "shop.customers.pwd", "shop.customers.items.cost"),
    "field_rename": ("shop.customers.name=full_name",),
}
LOSSLESS: CodecOptions[dict[str, Any]] = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def _customer(i: int) -> dict[str, Any]:
    return {
        "_id": i, "name": f"c{i}", "card": {"number": f"4111-{i}", "exp": "12/30"}, "pwd": "secret",
        "items": [{"sku": "a", "cost": 1.5}, {"sku": "b", "cost": -0.0}], "n": Int64(i), "z": -0.0,
    }  # fmt: skip


def _expected(doc: dict[str, Any]) -> dict[str, Any]:
    """The source document as the rules want it on the target."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "pwd":
            continue
        if key == "card" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "number"}
        if key == "items" and isinstance(value, list):
            value = [
                {k: v for k, v in item.items() if k != "cost"} if isinstance(item, dict) else item for item in value
            ]
        out["full_name" if key == "name" else key] = value
    return out


def _source_docs(uri: str, coll: str) -> dict[Any, dict[str, Any]]:
    with pymongo.MongoClient(uri) as client:
        return {d["_id"]: d for d in client.shop.get_collection(coll, codec_options=LOSSLESS).find()}


def _load(uri: str) -> None:
    with pymongo.MongoClient(uri) as client:
        client.shop.create_collection("customers", changeStreamPreAndPostImages={"enabled": True})
        client.shop.customers.insert_many([_customer(i) for i in range(30)])
        client.shop.orders.insert_many([{"_id": i, "pwd": "not a customer", "name": "kept"} for i in range(5)])


def _change(uri: str) -> None:
    with pymongo.MongoClient(uri) as client:
        customers = client.shop.customers
        customers.insert_one(_customer(100))
        customers.update_one({"_id": 1}, {"$set": {"pwd": "new", "card.number": "5500", "n": Int64(-1)}})
        customers.update_one({"_id": 2}, {"$set": {"items.0.cost": 9, "name": "renamed", "items.1.sku": "B"}})
        customers.update_one({"_id": 3}, {"$unset": {"card.number": "", "name": ""}})
        customers.update_one({"_id": 4}, {"$set": {"card": {"number": "1", "exp": "01/31"}}})
        customers.replace_one({"_id": 5}, {"pwd": "p", "name": "replaced", "extra": [1, {"price": 2}]})
        customers.delete_one({"_id": 6})
        client.shop.orders.update_one({"_id": 1}, {"$set": {"pwd": "still kept"}})


@pytest.mark.parametrize("full_document", ["updateLookup", "default"])
async def test_field_rules_into_mongodb(source_uri: str, target_uri: str, tmp_path: Path, full_document: str) -> None:
    _load(source_uri)
    cp = tmp_path / "cp.json"
    await run_job(source_uri, target_uri, cp, full_document=full_document, **RULES)
    _change(source_uri)
    await run_job(source_uri, target_uri, cp, command="catch-up", full_document=full_document, **RULES)
    for coll, edit in (("customers", _expected), ("orders", dict)):
        want = {k: bson.encode(edit(v)) for k, v in _source_docs(source_uri, coll).items()}
        with pymongo.MongoClient(target_uri, document_class=bson.raw_bson.RawBSONDocument) as client:
            got = {d["_id"]: d.raw for d in client.shop[coll].find()}
        assert got == want, coll


async def test_field_rules_into_kafka(source_uri: str, kafka: KafkaBroker, tmp_path: Path) -> None:
    _load(source_uri)
    cp = tmp_path / "cp.json"
    target = f"kafka://{kafka.bootstrap}"
    flags = {"pre_images": "whenAvailable", "schemas": True, **RULES}
    await run_job(source_uri, target, cp, **flags)
    _change(source_uri)
    await run_job(source_uri, target, cp, command="catch-up", **flags)

    topics = sorted(t for t in await list_topics(kafka.bootstrap) if t.startswith("mcdc.shop."))
    records = await consume_all(kafka.bootstrap, topics)
    values = [json.loads(r.value)["payload"] for r in records if r.value is not None]
    customers = [v for v in values if v["source"]["collection"] == "customers"]
    assert any(v.get("before") for v in customers), "pre-images were asked for"
    for value in customers:
        for part in ("after", "before"):
            text = value.get(part) or ""
            assert '"pwd"' not in text and '"number"' not in text and '"cost"' not in text, text
            assert '"name"' not in text, text
        update = value.get("updateDescription") or {}
        assert all(f.split(".")[0] not in ("pwd", "name") for f in update.get("removedFields") or []), update
        assert '"pwd"' not in (update.get("updatedFields") or ""), update

    rebuilt = rebuild((json.loads(r.key) if r.key else None, json.loads(r.value)) for r in records if r.value)
    expected = {
        "shop.customers": {_dump(k): _dump(_expected(v)) for k, v in _source_docs(source_uri, "customers").items()},
        "shop.orders": {_dump(k): _dump(v) for k, v in _source_docs(source_uri, "orders").items()},
    }
    assert_same(rebuilt, expected)


async def test_verify_compares_the_source_as_the_field_rules_want_it(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    from replicator.checking.verify import verify
    from replicator.settings.resolve import resolve

    _load(source_uri)
    await run_job(source_uri, target_uri, tmp_path / "cp.json", **RULES)
    settings = resolve({"source": source_uri, "target": target_uri, **RULES}, env={})
    assert (await verify(settings)).ok
    plain = resolve({"source": source_uri, "target": target_uri}, env={})
    assert not (await verify(plain)).ok  # without the rules, every customer differs
