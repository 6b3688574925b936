"""Field-level selection (--field-exclude / --field-rename) is pure: raw BSON in, raw BSON out."""

from __future__ import annotations

import datetime
from typing import Any

import bson
import pytest
from bson import Decimal128, Int64
from bson.binary import Binary
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.raw_bson import RawBSONDocument

from replicator.errors import ConfigError
from replicator.events import ChangeEvent, Namespace, Op, UpdateDescription
from replicator.settings.fields import FieldRules, transform_fields

NS = Namespace("shop", "customers")
RAW = CodecOptions(document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc), RAW)


def editor(exclude: tuple[str, ...] = (), rename: tuple[str, ...] = (), ns: Namespace = NS) -> Any:
    found = FieldRules(exclude, rename).for_namespace(ns)
    assert found is not None
    return found


AWKWARD = {  # values whose bytes a decode / re-encode could change
    "n": Int64(7), "z": -0.0, "d": Decimal128("1.10"), "u": Binary(b"\x01" * 16, 4),
    "old": DatetimeMS(-62135596800001), "when": datetime.datetime(2020, 1, 1),
}  # fmt: skip


def test_excluded_and_renamed_fields_leave_every_other_byte_in_place() -> None:
    doc = raw({"_id": 1, "card": {"number": "4111", "exp": "12/30", **AWKWARD}, "pwd": "x", **AWKWARD, "tail": 1})
    out = editor(("shop.customers.card.number", "shop.customers.pwd"), ("shop.customers.card.exp=expiry",)).document(
        doc
    )
    expected = {"_id": 1, "card": {"expiry": "12/30", **AWKWARD}, **AWKWARD, "tail": 1}
    assert out.raw == bson.encode(expected)


def test_paths_go_through_arrays_and_arrays_of_arrays() -> None:
    doc = raw({"_id": 1, "items": [{"sku": "a", "cost": 1}, 5, {"cost": 2}, [{"cost": 3, "k": 1}]]})
    out = editor(("shop.customers.items.cost",)).document(doc)
    assert out.raw == bson.encode({"_id": 1, "items": [{"sku": "a"}, 5, {}, [{"k": 1}]]})


def test_a_document_without_the_fields_is_returned_as_is() -> None:
    doc = raw({"_id": 1, "name": "x"})
    assert editor(("shop.customers.secret",)).document(doc) is doc


def test_wildcards_and_collection_names_with_dots() -> None:
    rules = FieldRules(("shop.*.secret", "logs.events.2024.ip"))
    assert rules.for_namespace(Namespace("shop", "anything")) is not None
    assert rules.for_namespace(Namespace("other", "anything")) is None
    dotted = rules.for_namespace(Namespace("logs", "events.2024"))
    assert dotted is not None
    assert dotted.document(raw({"_id": 1, "ip": "1.2.3.4", "v": 1})).raw == bson.encode({"_id": 1, "v": 1})
    plain = rules.for_namespace(Namespace("logs", "events"))  # there, the rule names field "ip" inside "2024"
    assert plain is not None
    assert plain.document(raw({"_id": 1, "2024": {"ip": 1, "k": 2}})).raw == bson.encode({"_id": 1, "2024": {"k": 2}})
    assert not FieldRules()


def test_update_descriptions_drop_excluded_paths_and_rename_renamed_ones() -> None:
    ed = editor(("shop.customers.card.number", "shop.customers.pwd", "shop.customers.items.cost"),
                ("shop.customers.name=full_name",))  # fmt: skip
    update = UpdateDescription(
        raw(
            {
                "pwd": "new",
                "card.number": "5",
                "card": {"number": "6", "exp": "1"},
                "items.3.cost": 4,
                "items.3": {"cost": 1, "sku": "b"},
                "name": "Ann",
                "name.first": "A",
                "v": Int64(2),
            }
        ),
        removed_fields=("pwd", "card.number", "name", "other"),
        truncated_arrays=(("items", 2), ("name", 1)),
    )
    out = ed.update(update)
    assert out.updated_fields.raw == bson.encode(
        {"card": {"exp": "1"}, "items.3": {"sku": "b"}, "full_name": "Ann", "full_name.first": "A", "v": Int64(2)}
    )
    assert out.removed_fields == ("full_name", "other")
    assert out.truncated_arrays == (("items", 2), ("full_name", 1))


def test_events_have_document_pre_image_and_update_edited_but_not_the_key() -> None:
    stage = transform_fields(FieldRules(("shop.customers.pwd",)))
    key = raw({"_id": 1})
    event = ChangeEvent(
        Op.UPDATE, NS, key=key, document=raw({"_id": 1, "pwd": "a", "v": 2}), before=raw({"_id": 1, "pwd": "b"}),
        update=UpdateDescription(raw({"pwd": "a", "v": 2})),
    )  # fmt: skip
    out = stage(event)
    assert out.key is key
    assert out.document is not None and out.document.raw == bson.encode({"_id": 1, "v": 2})  # type: ignore[attr-defined]
    assert out.before is not None and out.before.raw == bson.encode({"_id": 1})  # type: ignore[attr-defined]
    assert out.update is not None and out.update.updated_fields.raw == bson.encode({"v": 2})  # type: ignore[attr-defined]
    other = ChangeEvent(Op.INSERT, Namespace("shop", "orders"), document=raw({"_id": 1, "pwd": "a"}))
    assert stage(other) is other


@pytest.mark.parametrize(
    ("exclude", "rename", "message"),
    [
        (("shop.customers",), (), "must look like db.collection.field"),
        (("shop..x",), (), "must look like"),
        (("shop.customers._id",), (), "_id is the document key"),
        (("shop.customers._id.x",), (), "_id is the document key: it and the fields inside it"),
        ((), ("shop.customers._id.x=z",), "_id is the document key"),
        ((), ("shop.customers._id.x:z",), "_id is the document key"),
        ((), ("shop.customers.a",), "must look like db.collection.field=newname"),
        ((), ("shop.customers.a=b.c",), "one field name"),
        ((), ("shop.customers.a=$b",), "one field name"),
    ],
)
def test_bad_rules_are_one_line_errors(exclude: tuple[str, ...], rename: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FieldRules(exclude, rename)


def test_a_rule_that_names_id_through_a_dotted_collection_name_is_refused() -> None:
    """``db.a.b._id`` is a field inside ``a`` of collection ``b``... or ``_id`` of collection ``a.b``: where
    such a collection exists, the rule is refused; elsewhere it means what it says."""
    rules = FieldRules(("db.a.b._id",), ("db.c.x._id.k=z",))
    with pytest.raises(ConfigError, match=r"in db\.a\.b this names _id, but _id is the document key"):
        rules.check([Namespace("db", "other"), Namespace("db", "a.b")])
    with pytest.raises(ConfigError, match=r"--field-rename 'db\.c\.x\._id\.k=z': in db\.c\.x this names _id\.k"):
        rules.for_namespace(Namespace("db", "c.x"))
    nested = rules.for_namespace(Namespace("db", "a"))  # here: field _id inside b, not the key
    assert nested is not None
    doc = raw({"_id": 1, "b": {"_id": 2, "v": 3}})
    assert nested.document(doc).raw == bson.encode({"_id": 1, "b": {"v": 3}})  # type: ignore[attr-defined]


def test_debezium_colon_form_of_a_rename() -> None:
    out = editor(rename=("shop.customers.a:b",)).document(raw({"_id": 1, "a": 1}))
    assert out.raw == bson.encode({"_id": 1, "b": 1})


def test_a_unique_index_on_an_edited_field_is_named_and_its_event_stops_the_stream() -> None:
    rules = FieldRules(["shop.people.ssn", "shop.*.address.zip"], ["shop.people.name=full"])
    people = Namespace("shop", "people")
    unique = {"key": {"ssn": 1}, "name": "ssn_1", "unique": True}
    said = rules.unique_refusal(people, [unique])
    assert said is not None and said.startswith("source: shop.people's unique index ssn_1 is on ssn, which ")
    assert "--field-exclude 'shop.people.ssn' drops" in said
    assert "rule" in str(rules.unique_refusal(people, [{"key": {"full": 1, "name": 1}, "name": "n", "unique": True}]))
    assert rules.unique_refusal(people, [{"key": {"address": 1}, "name": "a", "unique": True}]) is not None
    # kept: not unique, sparse on that one field, on a field no rule edits, in another collection
    assert rules.unique_refusal(people, [{"key": {"ssn": 1}, "name": "s"}]) is None
    assert rules.unique_refusal(people, [{**unique, "sparse": True}]) is None
    assert rules.unique_refusal(people, [{"key": {"email": 1}, "name": "e", "unique": True}]) is None
    assert rules.unique_refusal(Namespace("crm", "people"), [unique]) is None
    apply = transform_fields(rules)
    event = ChangeEvent(Op.CREATE_INDEXES, people, ddl={"indexes": [unique]})
    with pytest.raises(ConfigError, match="unique index ssn_1"):
        apply(event)
    plain = ChangeEvent(
        Op.CREATE_INDEXES, people, ddl={"indexes": [{"key": {"email": 1}, "name": "e", "unique": True}]}
    )
    assert apply(plain) is plain
