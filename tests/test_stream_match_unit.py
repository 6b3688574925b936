"""The change stream's $match for a selection, and the record of which match read which stretch (settings/
stream_match.py), without a server; the reader moving from one match to the next against an in-memory stream.

(Against the real server: tests/test_stream_match.py.)"""

from __future__ import annotations

import json
from typing import Any

import bson
import pytest
from bson.timestamp import Timestamp
from pymongo.errors import PyMongoError

from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument
from replicator.checkpoint.store import Checkpoint
from replicator.events import Namespace, Position
from replicator.events.normalize import normalize_change
from replicator.settings.selection import Image, Renamer, Scope, Selection, keep_event
from replicator.settings.stream_match import StreamFilter, change_match, next_tick
from replicator.source.changestream import ChangeStreamReader
from tests.test_changestream_unit import FakeClient, FakeStream, token


def _field(doc: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _matches(doc: dict[str, Any], match: dict[str, Any] | None) -> bool:
    """The few operators change_match writes, as the server reads them."""
    if match is None:
        return True
    for key, want in match.items():
        if key == "$or":
            if not any(_matches(doc, clause) for clause in want):
                return False
        elif isinstance(want, dict) and "$in" in want:
            if _field(doc, key) not in want["$in"]:
                return False
        elif _field(doc, key) != want:
            return False
    return True


def _event(op: str, db: str, coll: str | None = None, to: tuple[str, str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": token(1), "operationType": op, "clusterTime": Timestamp(1, 1), "ns": {"db": db}}
    if coll is not None:
        doc["ns"]["coll"] = coll
        doc["documentKey"] = {"_id": 1}
    if to is not None:
        doc["to"] = {"db": to[0], "coll": to[1]}
    return doc


NAMES = [("shop", "orders"), ("shop", "users"), ("shop", "orders_2024"), ("crm", "orders"), ("other", "x")]
EVENTS = [
    *(_event(op, db, coll) for db, coll in NAMES for op in ("insert", "update", "delete", "create", "drop", "modify")),
    *(_event("createIndexes", db, coll) for db, coll in NAMES),
    *(_event("rename", a[0], a[1], to=b) for a in NAMES for b in NAMES if a != b),
    *(_event("dropDatabase", db) for db in ("shop", "crm", "other")),
]
SELECTIONS = [
    ([r"shop\.orders"], []),
    ([r"shop\.orders", r"shop\.users"], []),
    ([r"shop\..*"], [r"shop\.users"]),
    ([r"shop\.orders_.*", r"crm\.orders"], []),
    ([r"shop\.orders"], [r"shop\.orders"]),
]


def _holds(selection: Selection, db: str) -> bool:
    """May ``db`` hold a selected namespace? (a dropDatabase of any other drops nothing of the target's)"""
    return any(selection(Namespace(d, c)) for d, c in NAMES if d == db)


@pytest.mark.parametrize(("include", "exclude"), SELECTIONS)
def test_the_match_lets_through_every_event_the_selection_keeps(include: list[str], exclude: list[str]) -> None:
    selection = Selection.from_patterns(include, exclude)
    match = change_match(selection)
    assert match is not None
    json.dumps(match)  # plain data: recorded in the checkpoint as it is
    kept = 0
    for doc in EVENTS:
        event = normalize_change(RawDocument(bson.encode(doc), RAW_CODEC), None, 0)
        if keep_event(event, selection) and (event.ns.coll is not None or _holds(selection, event.ns.db)):
            assert _matches(doc, match), f"{doc} is kept by the selection, not let through by {match}"
            kept += 1
    assert kept or not any(selection(Namespace(*name)) for name in NAMES)
    assert _matches({"operationType": "invalidate", "_id": token(2)}, match)


def test_a_literal_selection_is_matched_by_name_and_leaves_the_other_collections_out() -> None:
    match = change_match(Selection.from_patterns([r"shop\.orders", r"shop\.users"]))
    assert match == {
        "$or": [
            {"ns.db": "shop", "ns.coll": {"$in": ["orders", "users"]}},
            {"operationType": "rename", "$or": [{"to.db": "shop", "to.coll": {"$in": ["orders", "users"]}}]},
            {"operationType": "dropDatabase", "ns.db": {"$in": ["shop"]}},
            {"operationType": "invalidate"},
        ]
    }
    others = (_event("insert", "shop", "carts"), _event("insert", "crm", "orders"), _event("dropDatabase", "crm"))
    for left_out in others:
        assert not _matches(left_out, match)
    assert not _matches(_event("rename", "shop", "orders", to=("x", "y")), {"$or": match["$or"][1:]})  # by ns only


UNNAMED = [([], []), ([], [r"shop\.x"]), ([r".*\.orders"], []), ([r"(a|b)\.c"], [])]


@pytest.mark.parametrize(("include", "exclude"), UNNAMED)
def test_a_selection_without_literal_databases_leaves_the_stream_unfiltered(
    include: list[str], exclude: list[str]
) -> None:
    assert change_match(Selection.from_patterns(include, exclude)) is None


def test_a_way_back_matches_the_databases_its_migration_wrote() -> None:
    forward = Scope(Selection.from_patterns([r"shop\.orders", r"crm\..*"]), Renamer.from_rules(["crm=crm2"]))
    match = change_match(Image(of=forward))
    assert match is not None
    assert {"ns.db": "crm2"} in match["$or"] and {"ns.db": "shop"} in match["$or"]
    assert not _matches(_event("insert", "crm", "x"), match)


def test_each_stretch_is_read_with_its_match_and_a_move_keeps_what_came_before() -> None:
    a, b = {"ns.db": "a"}, {"ns.db": "b"}
    first = StreamFilter(a)
    assert first.toward(a, Timestamp(50, 0)) is first  # the same match: nothing moves
    moved = first.toward(b, Timestamp(50, 3))
    assert moved == StreamFilter(b, ((a, Timestamp(50, 3)),))
    assert moved.segment(Timestamp(40, 1)) == (a, Timestamp(50, 3))
    assert moved.segment(Timestamp(50, 3)) == (a, Timestamp(50, 3))  # its last time is the earlier match's
    assert moved.segment(next_tick(Timestamp(50, 3))) == (b, None)
    assert moved.segment(None) == (a, Timestamp(50, 3))  # no time: from the first stretch on
    assert moved.segment(None, now=True) == (b, None)
    assert next_tick(Timestamp(7, 0xFFFFFFFF)) == Timestamp(8, 0)
    assert moved.passed([Timestamp(50, 3)]) is moved  # a position at its last time may have more to read
    assert moved.passed([Timestamp(50, 4), None]) is moved  # a stream without a time: not known to be past
    assert moved.passed([Timestamp(50, 4), Timestamp(60, 1)]) == StreamFilter(b)
    again = moved.toward(None, Timestamp(70, 0))
    assert again.segment(Timestamp(60, 0)) == (b, Timestamp(70, 0)) and again.segment(Timestamp(71, 0)) == (None, None)
    assert StreamFilter.from_json(json.loads(json.dumps(again.to_json()))) == again


def test_a_checkpoint_keeps_its_streams_matches_and_an_older_one_read_them_unfiltered() -> None:
    cp = Checkpoint("rs", stream_filter=StreamFilter({"ns.db": "a"}, (({"ns.db": "b"}, Timestamp(5, 1)),)))
    assert Checkpoint.from_json(json.loads(json.dumps(cp.to_json()))).stream_filter == cp.stream_filter
    undecided = Checkpoint("rs").to_json()
    assert Checkpoint.from_json(undecided).stream_filter is None  # the next run records its own
    del undecided["stream_filter"]  # written by an mcdc before the record: its stream was read unfiltered
    assert Checkpoint.from_json(undecided).stream_filter == StreamFilter()


def _at(n: int, coll: str = "c") -> RawDocument:
    doc = {"_id": token(n), "operationType": "insert", "clusterTime": Timestamp(100, n),
           "ns": {"db": "db", "coll": coll}, "documentKey": {"_id": n}, "fullDocument": {"_id": n}}  # fmt: skip
    return RawDocument(bson.encode(doc), RAW_CODEC)


class _NoOplog:
    def __getitem__(self, name: str) -> _NoOplog:
        return self

    async def find_one(self, *args: Any, **kwargs: Any) -> None:
        raise PyMongoError("no access to the oplog")


class _Client(FakeClient):
    def get_database(self, name: str, **kwargs: Any) -> _NoOplog:
        return _NoOplog()


class _IdleAfter(FakeStream):
    """Its events, then empty polls whose post-batch token is ``idle``'s."""

    def __init__(self, events: list[RawDocument], idle: int) -> None:
        super().__init__(events)
        self._idle = idle

    def take(self) -> RawDocument | None:
        event = super().take()
        if event is None:
            self.resume_token = token(self._idle)
        return event


async def test_the_reader_reads_an_earlier_stretch_with_its_match_then_the_next_from_just_after_it() -> None:
    """Events 1-3 are the old match's stretch (up to 100:3); what the old stream holds after it (4) is never
    handed out: the new match's stream is opened at 100:4 and hands out 4 and 5."""
    a, b = {"ns.db": "db", "ns.coll": "c"}, {"ns.db": "db"}
    client = _Client(FakeStream([_at(1), _at(2), _at(3), _at(4, "x")]), FakeStream([_at(4, "other"), _at(5)]))
    reader = ChangeStreamReader(
        client,  # type: ignore[arg-type]
        full_document="default", batch_size=2, stream_filter=StreamFilter(b, ((a, Timestamp(100, 3)),)),
    )  # fmt: skip
    try:
        await reader.open(Position(resume_token=token(0), cluster_time=Timestamp(100, 0)), until=Timestamp(100, 5))
        got: list[tuple[int, str]] = []
        async for batch in reader.batches(until=Timestamp(100, 5)):
            got.extend((e.key["_id"], e.ns.coll or "") for e in batch.events if e.key is not None)
    finally:
        await reader.close()
    assert got == [(1, "c"), (2, "c"), (3, "c"), (4, "other"), (5, "c")]
    (old, old_options), (new, new_options) = client.calls
    # each lets through what follows the end of its read: the first such event says the read passed it
    assert old == [{"$match": {"$or": [a, {"clusterTime": {"$gt": Timestamp(100, 3)}}]}}]
    assert old_options["resume_after"] == token(0)
    assert new == [{"$match": {"$or": [b, {"clusterTime": {"$gt": Timestamp(100, 5)}}]}}]
    assert new_options["start_at_operation_time"] == Timestamp(100, 4)
    assert "resume_after" not in new_options


async def test_an_idle_position_of_an_earlier_stretch_claims_no_time_past_its_end() -> None:
    """The old match's stream may have scanned past its stretch: its post-batch token is kept, its time is
    the stretch's end, so a checkpoint saved there opens in the old stretch again (and moves on at once)."""
    a = {"ns.db": "db", "ns.coll": "c"}
    client = _Client(_IdleAfter([], idle=9))
    reader = ChangeStreamReader(
        client,  # type: ignore[arg-type]
        full_document="default", batch_size=5, stream_filter=StreamFilter(None, ((a, Timestamp(100, 3)),)),
    )  # fmt: skip
    try:
        await reader.open(Position(resume_token=token(0), cluster_time=Timestamp(100, 0)))
        positions = []
        async for batch in reader.batches(until=Timestamp(100, 2)):
            positions.append(batch.position)
    finally:
        await reader.close()
    assert positions[-1].resume_token == token(9) and positions[-1].cluster_time == Timestamp(100, 3)
    assert StreamFilter(None, ((a, Timestamp(100, 3)),)).segment(positions[-1].cluster_time)[0] == a
