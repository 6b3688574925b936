"""The event path's fast ways give the same bytes as the reference way (no server).

The fast ways: change documents read through ``rawbson.top_level`` with documents wrapped without a second
check (``normalize``), and keys and Debezium values written from byte templates (``templates.py``). The
reference: the same change documents read as Mappings (``normalize``'s fallback when pymongo has no
top-level decoder) and every record built as a dict for orjson (``Encoder(direct=False)``). Over a seeded,
randomized corpus of change documents (every op, odd BSON types, dotted and ``$`` field names, large
documents, updates with removed fields and truncated arrays, transactions, pre-images, DDL, names that need
escaping or hold a template marker's text), every envelope option and field rules, the records must be
equal byte for byte; a failure names its seed.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable
from itertools import product
from typing import Any

import bson
import orjson
import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.bsonkit import rawbson
from replicator.events import ChangeEvent, normalize
from replicator.settings.fields import FieldRules, transform_fields
from replicator.sinks.records.envelope import Encoder, EnvelopeOptions, Message
from replicator.sinks.records.templates import MARKERS, json_string
from replicator.sinks.records.topics import TopicNamer
from replicator.source.connection import RAW_CODEC
from tests.support.corpus import bson_corpus_documents

NOW = 1_800_000_000.123
NAMESPACES = [
    {"db": "shop", "coll": "orders"},
    {"db": "shop", "coll": 'we"ird\\na\u00efve \U0001f600'},
    {"db": "d" + MARKERS[3], "coll": "c" + MARKERS[0]},  # names holding a marker: the reference way is taken
    {"db": "shop", "coll": "items"},
]
RULES = FieldRules(["shop.orders.secret", "shop.*.owner.email", "shop.orders.lines.cost"], ["shop.orders.name=title"])
ODD = [d for d in bson_corpus_documents() if d["_id"] != "big"]  # every BSON type, dotted and $ names


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(12 if depth < 3 else 8)
    simple: list[Callable[[], Any]] = [
        lambda: rng.randrange(-(2**31), 2**31),
        lambda: Int64(rng.randrange(-(2**63), 2**63)),
        lambda: rng.choice([0.0, -0.0, 1.5, 1e300, float("inf"), float("nan"), rng.random()]),
        lambda: "".join(rng.choice('ab"\\\n\x00\x1f\u00e9\u2028\U0001f600/') for _ in range(rng.randrange(8))),
        lambda: rng.random() < 0.5,
        lambda: None,
        lambda: datetime.datetime(2020, 1, 1) + datetime.timedelta(milliseconds=rng.randrange(10**12)),
        lambda: ObjectId(rng.randbytes(12)),
    ]
    if kind < 8:
        return simple[kind]()
    if kind < 10:
        return {_name(rng): _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def _name(rng: random.Random) -> str:
    return rng.choice(["a", "b.c", "$d", "secret", "owner", "name", "lines", "x\u00ff", 'q"'])


def _document(rng: random.Random, _id: Any) -> dict[str, Any]:
    pick = rng.random()
    if pick < 0.2:
        return {**rng.choice(ODD), "_id": _id}
    doc: dict[str, Any] = {"_id": _id, "name": "n", "secret": "s", "owner": {"email": "e", "level": 3}}
    doc["lines"] = [{"sku": str(i), "cost": i * 1.5} for i in range(rng.randrange(3))]
    doc.update({_name(rng): _value(rng) for _ in range(rng.randrange(6))})
    if pick > 0.95:
        doc["big"] = [{"i": i, "s": "x" * 100} for i in range(2_000)]  # about 250 KB
    return doc


def _change(rng: random.Random, seq: int) -> dict[str, Any]:
    op = rng.choice(["insert", "update", "update", "replace", "delete", "drop", "rename", "createIndexes"])
    _id = rng.choice([ObjectId(rng.randbytes(12)), seq, f"id-{seq}", {"a": seq, "b": Int64(seq)}, 2.5])
    change: dict[str, Any] = {"_id": {"_data": f"82{seq:016X}"}, "operationType": op}
    if rng.random() < 0.9:
        change["clusterTime"] = Timestamp(1_700_000_000 + seq, rng.randrange(1, 50))
    if rng.random() < 0.9:
        change["wallTime"] = datetime.datetime(2024, 1, 1) + datetime.timedelta(milliseconds=seq * 37)
    change["ns"] = rng.choice(NAMESPACES)
    if rng.random() < 0.2:
        change["lsid"] = {"id": bson.Binary(rng.randbytes(16), 4), "uid": bson.Binary(b"\x00" * 32, 0)}
        change["txnNumber"] = Int64(rng.randrange(1, 4))
    if op in ("insert", "update", "replace", "delete"):
        change["documentKey"] = {"_id": _id}
    if op in ("insert", "replace") or (op == "update" and rng.random() < 0.7):
        change["fullDocument"] = _document(rng, _id)
    if op in ("update", "replace", "delete") and rng.random() < 0.3:
        change["fullDocumentBeforeChange"] = _document(rng, _id)
    if op == "update":
        change["updateDescription"] = {
            "updatedFields": {rng.choice(["a", "owner.email", "lines.1.cost", "x.y", "name"]): _value(rng)},
            "removedFields": rng.sample(["secret", "b", "owner.level", "name"], rng.randrange(3)),
            "truncatedArrays": [{"field": "lines", "newSize": rng.randrange(3)}] if rng.random() < 0.3 else [],
        }
    if op == "rename":
        change["to"] = {"db": "shop", "coll": "renamed"}
    if op == "createIndexes":
        change["operationDescription"] = {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}
    return change


def _corpus(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    return [bson.encode(_change(rng, seq)) for seq in range(n)]


def _events(raws: list[bytes], rules: FieldRules | None) -> list[ChangeEvent]:
    events = [normalize.normalize_change(RawBSONDocument(raw, RAW_CODEC), "rs0") for raw in raws]
    edit = transform_fields(rules) if rules else None
    return [edit(e) if edit else e for e in events if e is not None]


def _encoder(options: EnvelopeOptions, direct: bool) -> Encoder:
    return Encoder(options, TopicNamer("fulfillment"), source_name="rs-main", clock=lambda: NOW, direct=direct)


OPTIONS = [
    EnvelopeOptions(style, schemas, relaxed, tombstones, tx_metadata)
    for style, schemas, relaxed, tombstones, tx_metadata in product(
        ("debezium", "debezium-legacy", "plain"), (False, True), (False, True), (True, False), (False, True)
    )
]
OPTIONS += [  # Debezium 3.6's own bytes (--extended-json debezium): the debezium envelope only
    EnvelopeOptions("debezium", schemas, False, tombstones, tx_metadata, json="debezium")
    for schemas, tombstones, tx_metadata in product((False, True), (True, False), (False, True))
]


@pytest.mark.parametrize("seed", range(4))
def test_fast_event_path_writes_the_reference_bytes_for_every_envelope(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    raws = _corpus(seed, 150)
    for rules in (None, RULES):
        fast = _events(raws, rules)
        with monkeypatch.context() as m:
            m.setattr(rawbson, "top_level", lambda data: None)  # normalize reads the Mapping instead
            reference = _events(raws, rules)
        assert fast == reference, f"seed {seed}"
        for options in OPTIONS:
            got = _encoder(options, direct=True).encode(fast)
            want = _encoder(options, direct=False).encode(reference)
            assert len(got) == len(want), f"seed {seed}, {options}"
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert g == w, f"seed {seed}, {options}, rules {bool(rules)}, record {i}: {g!r} != {w!r}"


def test_templates_are_reused_across_events_of_one_namespace() -> None:
    raws = _corpus(7, 60)
    encoder = _encoder(EnvelopeOptions(), direct=True)
    first = encoder.encode(_events(raws, None))
    assert encoder.encode(_events(raws, None)) == first  # the second pass fills templates made by the first
    assert all(isinstance(m, Message) for m in first)


def test_json_text_as_a_string_is_what_orjson_writes_for_it() -> None:
    every_char = "".join(chr(c) for c in range(0x3000) if not 0xD800 <= c < 0xE000) + "\U0001f600\u2028\x7f"
    for value in (every_char, {'k"\\': [every_char, 1.5, None]}, "", '"', "\\"):
        text = orjson.dumps(value)
        assert json_string(text) == orjson.dumps(text.decode())
