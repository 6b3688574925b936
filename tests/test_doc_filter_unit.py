"""--filter without a server: parsing, the stream's event transform (with a stand-in matcher where the rule
is about the transform, not the query language), and where the query goes (partitions, checkpoints)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.errors import ConfigError
from replicator.events import ChangeEvent, Namespace, Op, Position, UpdateDescription
from replicator.replay.recorded import Recorded, refused_change
from replicator.settings.fields import FieldRules
from replicator.settings.filters import DocumentFilters, filter_event, filtered
from replicator.settings.resolve import resolve, settings_from_strings
from replicator.settings.selection import Renamer, Selection, make_transform
from replicator.source.partitions import Partition, Resume

NS = Namespace("shop", "orders")
EU = {"_id": 1, "region": "EU", "n": 1}
US = {"_id": 1, "region": "US", "n": 2}
SOURCE = "mongodb://localhost:27017/?replicaSet=rs0"


class _Region:
    """A stand-in matcher: region == "EU" (the transform's rules do not depend on the query language)."""

    spec: Mapping[str, Any] = {"region": "EU"}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return doc.get("region") == "EU"

    def fields(self) -> frozenset[str]:
        return frozenset({"region"})


def _raw(doc: Mapping[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


def _event(op: Op, doc: Mapping[str, Any] | None = None, **kw: Any) -> ChangeEvent:
    position = Position(cluster_time=Timestamp(10, 1), index=0)
    key = kw.pop("key", {"_id": 1})
    return ChangeEvent(op, NS, key=key, document=_raw(doc) if doc is not None else None, position=position, **kw)


# -- the stream's transform ------------------------------------------------------------------------
def test_an_insert_or_snapshot_read_that_does_not_match_is_dropped_and_one_that_does_passes() -> None:
    for op in (Op.INSERT, Op.READ):
        assert filter_event(_event(op, US), _Region()) is None
        kept = _event(op, EU)
        assert filter_event(kept, _Region()) is kept


def test_a_replace_that_stops_matching_is_a_delete_of_its_key_keeping_position_and_pre_image() -> None:
    event = _event(Op.REPLACE, US, before=_raw(EU), txn=None)
    out = filter_event(event, _Region())
    assert out is not None and out.op is Op.DELETE
    assert out.key == {"_id": 1} and out.document is None and out.update is None
    assert out.position == event.position and out.before == event.before  # an event sink's "before"


def test_an_update_that_stops_matching_or_whose_document_is_gone_is_a_delete() -> None:
    update = UpdateDescription({"region": "US"})
    for doc in (US, None):
        out = filter_event(_event(Op.UPDATE, doc, update=update), _Region())
        assert out is not None and (out.op, out.document, out.update) == (Op.DELETE, None, None)


def test_an_update_that_matches_is_written_whole_as_a_replace() -> None:
    """Without a pre-image mcdc cannot know the target holds the document (it may just have come to match):
    the looked-up document replaces it, and no delta goes out."""
    out = filter_event(_event(Op.UPDATE, EU, update=UpdateDescription({"region": "EU"})), _Region())
    assert out is not None and out.op is Op.REPLACE and out.update is None
    assert out.document is not None and out.document["region"] == "EU"


def test_an_update_whose_pre_image_matched_too_stays_an_update() -> None:
    event = _event(Op.UPDATE, {**EU, "n": 3}, update=UpdateDescription({"n": 3}), before=_raw(EU))
    assert filter_event(event, _Region()) is event


def test_an_update_into_the_filter_with_a_pre_image_outside_it_is_a_replace() -> None:
    event = _event(Op.UPDATE, EU, update=UpdateDescription({"region": "EU"}), before=_raw(US))
    out = filter_event(event, _Region())
    assert out is not None and out.op is Op.REPLACE


def test_deletes_and_ddl_pass_through() -> None:
    delete = _event(Op.DELETE)
    assert filter_event(delete, _Region()) is delete
    drop = ChangeEvent(Op.DROP, NS)
    assert filter_event(drop, _Region()) is drop


def test_the_filter_is_idempotent_on_what_it_made() -> None:
    """The Spark data source filters its rows and its writer filters them again: the same events."""
    events = [
        _event(Op.INSERT, EU), _event(Op.REPLACE, US), _event(Op.UPDATE, EU, update=UpdateDescription({})),
        _event(Op.UPDATE, None, update=UpdateDescription({})), _event(Op.DELETE),
    ]  # fmt: skip
    for event in events:
        once = filter_event(event, _Region())
        assert once is None or filter_event(once, _Region()) == once


# -- parsing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("shop.orders", "must look like REGEX=QUERY"),
        ('={"a": 1}', "must look like REGEX=QUERY"),
        ('shop\\.(orders={"a": 1}', "is not a valid regular expression"),
        ('shop\\.orders={"a": 1', "is not valid Extended JSON"),
        ('shop\\.orders={"a": {"$numberLong": "x"}}', "is not valid Extended JSON"),
        ('shop\\.orders={"a": {"$oid": "zz"}}', "is not valid Extended JSON"),
        ('shop\\.orders={"a": {"$numberDecimal": "x"}}', "is not valid Extended JSON"),
    ],
)
def test_a_bad_filter_is_one_line_naming_it(rule: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        DocumentFilters([rule])
    text = str(refused.value)
    assert message in text and "--filter" in text and "\n" not in text


def test_an_operator_the_matcher_cannot_decide_is_refused_at_start_naming_it() -> None:
    with pytest.raises(ConfigError) as refused:
        resolve({"source": SOURCE, "target": "stdout", "filter": ('shop\\.orders={"$where": "true"}',)}, env={})
    assert "$where" in str(refused.value) and "\n" not in str(refused.value)


def test_the_regex_is_on_the_whole_namespace_and_every_matching_filter_applies() -> None:
    filters = DocumentFilters(['shop\\..*={"region": "EU"}', 'shop\\.orders={"n": {"$gt": 1}}'])
    assert filters.where(Namespace("shop", "orders")) == {"$and": [{"region": "EU"}, {"n": {"$gt": 1}}]}
    assert filters.where(Namespace("shop", "users")) == {"region": "EU"}
    assert filters.where(Namespace("shopx", "orders")) is None  # fullmatch, as --include
    assert filters.where(Namespace("shop")) is None  # a database's events have no documents
    query = filters.for_namespace(Namespace("shop", "orders"))
    assert query is not None
    assert query.matches({"_id": 1, "region": "EU", "n": 2}) and not query.matches({"_id": 1, "region": "EU", "n": 1})


def test_extended_json_values_keep_their_bson_types() -> None:
    filters = DocumentFilters(['a\\.b={"n": {"$numberLong": "5"}, "at": {"$date": "2024-01-01T00:00:00Z"}}'])
    where = filters.where(Namespace("a", "b"))
    assert where is not None and type(where["n"]).__name__ == "Int64"


def test_the_environment_variable_and_spark_option_take_one_filter_whose_query_holds_commas() -> None:
    rule = 'shop\\.orders={"region": "EU", "n": 1}'
    from_env = resolve({}, env={"MCDC_SOURCE": SOURCE, "MCDC_TARGET": "stdout", "MCDC_FILTER": rule})
    assert from_env.filter == (rule,)
    two = settings_from_strings({"source": SOURCE, "target": "stdout", "filter": json.dumps([rule, "a\\.b={}"])})
    assert two.filter == (rule, "a\\.b={}") and two.filters.where(Namespace("a", "b")) == {}


def test_a_filter_makes_the_stream_carry_full_documents() -> None:
    for mode in ("default", "whenAvailable"):
        s = resolve(
            {"source": SOURCE, "target": "stdout", "filter": ('a\\.b={"x": 1}',), "full_document": mode}, env={}
        )
        assert s.full_document == "updateLookup"
    kept = resolve(
        {"source": SOURCE, "target": "stdout", "filter": ('a\\.b={"x": 1}',), "full_document": "required"}, env={}
    )
    assert kept.full_document == "required"
    alone = resolve({"source": SOURCE, "target": "stdout", "full_document": "default"}, env={})
    assert alone.full_document == "default"


# -- the transform stage -------------------------------------------------------------------------------
def test_the_filter_reads_the_source_document_before_field_rules_and_renames() -> None:
    """A filter on a field the target never gets (--field-exclude), of a collection written under another
    name (--rename): decided on the source's document, by the source's name."""
    filters = DocumentFilters(['shop\\.orders={"region": "EU"}'])
    transform = make_transform(
        Selection(), Renamer.from_rules(["shop.orders=shop.eu_orders"]),
        fields=FieldRules(["shop.orders.region"]), filters=filters,
    )  # fmt: skip
    out = transform(_event(Op.INSERT, EU))
    assert out is not None and out.ns == Namespace("shop", "eu_orders")
    assert out.document is not None and "region" not in out.document
    assert transform(_event(Op.INSERT, US)) is None
    gone = transform(_event(Op.UPDATE, US, update=UpdateDescription({"region": "US"})))
    assert gone is not None and gone.op is Op.DELETE and gone.ns == Namespace("shop", "eu_orders")
    other = ChangeEvent(Op.INSERT, Namespace("shop", "users"), key={"_id": 1}, document=_raw(US))
    assert transform(other) is not None  # no filter there


# -- where the query goes ------------------------------------------------------------------------------
def test_a_partition_reads_its_range_and_the_query_and_keeps_both_in_the_checkpoint() -> None:
    part = Partition(NS, 0, "number", lower=0, upper=10, where={"region": "EU"})
    assert part.find_filter() == {"$and": [part.query(), {"region": "EU"}]}
    after = part.find_filter(Resume(4))
    assert after == {"$and": [part.query(Resume(4)), {"region": "EU"}]}
    again = Partition.from_json(part.to_json())
    assert again.where == {"region": "EU"} and again.find_filter() == part.find_filter()
    whole = Partition(NS, 0, "*", where={"region": "EU"})
    assert whole.find_filter() == {"region": "EU"}
    assert Partition(NS, 0, "*").find_filter() == {} and "where" not in Partition(NS, 0, "*").to_json()
    assert filtered({"_id": 1}, None) == {"_id": 1}


def test_a_changed_filter_on_a_checkpoint_is_refused_with_the_fix() -> None:
    saved = Recorded(filter=('a\\.b={"x": 1}',))
    now = Recorded(filter=('a\\.b={"x": 2}',))
    reason = refused_change(saved, now, "cp.json")
    assert reason is not None and "--filter" in reason and "--snapshot always" in reason
    assert refused_change(saved, Recorded(filter=('a\\.b={"x": 1}',)), "cp.json") is None
    assert Recorded.from_json(saved.to_json()) == saved
    back = saved.way_back()  # the way back is of the migration's part: filtered as it was, and guarded
    assert back.filter == saved.filter and back.guard and back.filter_names == "target"
    assert back.way_back().filter == saved.filter and back.way_back().filter_names == "source"


def test_the_filter_is_part_of_the_migration_a_default_checkpoint_names() -> None:
    plain = resolve({"source": SOURCE, "target": "stdout"}, env={})
    one = resolve({"source": SOURCE, "target": "stdout", "filter": ('a\\.b={"x": 1}',)}, env={})
    assert plain.checkpoint_path() != one.checkpoint_path()


def test_a_filtered_collection_s_progress_total_is_counted_from_its_matches_not_the_plan_s_estimates() -> None:
    from replicator.job.copy import progress_plan

    plan = [
        Partition(NS, 0, "number", upper=10, estimated_docs=10, where={"region": "EU"}),
        Partition(NS, 1, "number", lower=10, estimated_docs=10, where={"region": "EU"}),
        Partition(Namespace("shop", "users"), 0, "number", upper=5, estimated_docs=5),
    ]
    collections, uncounted = progress_plan(plan, {plan[0].id, plan[2].id})
    orders, users = collections
    assert orders.total is None and orders.done == 0 and not orders.finished  # counted with the query, later
    assert users.total == 5 and users.done == 5 and users.finished
    assert uncounted == [NS]


def test_the_stream_s_documents_as_they_come_are_matched() -> None:
    """The change stream's documents are RawDocuments over the reply's bytes, a memoryview (what the
    real test server's events gave the chaos harness): the real matcher takes them as they are."""
    from replicator.bsonkit.rawbson import RawDocument

    query = DocumentFilters(['shop\\.orders={"region": {"$in": ["EU", "UK"]}, "n": {"$gte": 1}}']).for_namespace(NS)
    assert query is not None
    large = {"_id": 1, "pad": "x" * 200_000, "region": "EU", "n": 3}  # one the matcher reads field by field
    for doc, kept in ((EU, True), (US, False), ({"_id": 1, "region": ["US", "UK"], "n": 5}, True), (large, True)):
        view = RawDocument(memoryview(bson.encode(doc)))
        event = ChangeEvent(Op.INSERT, NS, key={"_id": 1}, document=view)
        assert (filter_event(event, query) is not None) is kept, doc


def test_the_settings_pickle_into_spark_tasks_with_their_filters() -> None:
    import pickle

    s = resolve({"source": SOURCE, "target": "stdout", "filter": ('shop\\.orders={"region": "EU"}',)}, env={})
    assert s.filters.for_namespace(NS) is not None  # compiled here first: the copy must not need the matchers
    again = pickle.loads(pickle.dumps(s))
    query = again.filters.for_namespace(NS)
    assert query is not None and query.matches(EU) and not query.matches(US)
    assert again.filters.where(NS) == {"region": "EU"}
