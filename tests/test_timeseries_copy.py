"""Time-series collections in the snapshot, without a server: their plan (ranges of the time field), and a
partition copied again after a failure, by either engine's copier, holding each measurement exactly once.

The test servers cannot show a time-series collection's semantics: SecantusDB reports one as a plain
collection and deletes by any filter whatever the version it claims. So the target here is a MongoDB-shaped
fake (:class:`FakeTimeseries`) under the real MongoSink: inserts never refuse nor replace a repeated
``_id``, nothing upserts or replaces by ``_id``, and ``delete_many`` takes a time range as MongoDB 7.0 does
(or, as 5.1 to 6.x, only ``{}``). The source is a fake ``read_partition`` over a list of measurements.
"""

from __future__ import annotations

import datetime
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from pymongo.errors import AutoReconnect, OperationFailure
from pymongo.write_concern import WriteConcern

from replicator.errors import SinkError
from replicator.events import Namespace
from replicator.observe.progress import LogReporter
from replicator.settings.resolve import resolve
from replicator.settings.selection import Scope, Selection
from replicator.sinks.mongo.sink import MongoSink
from replicator.snapshot.copy import CopyLimits, copy_partitions
from replicator.source.connection import ServerInfo
from replicator.source.partitions import ALL, TIME, Partition, Resume, plan_timeseries, time_ranges

NS = Namespace("metrics", "cpu")
START = datetime.datetime(2024, 1, 1)
LIMITS = CopyLimits(workers=3, batch_docs=25, batch_bytes=1 << 20, queue_batches=2)
INVALID_OPTIONS = 72  # MongoDB 5.1 to 6.x: a delete on a time-series collection by more than its meta field


def measurements(n: int) -> list[bytes]:
    """``n`` measurements one second apart whose ``_id``s repeat (as a time-series collection allows)."""
    return [bson.encode({"_id": i % 7, "ts": START + datetime.timedelta(seconds=i), "v": i}) for i in range(n)]


def matches(where: Mapping[str, Any], raw: bytes) -> bool:
    """The filters a time-series partition uses: ``{}``, or one range of one field."""
    if not where:
        return True
    ((field, cond),) = where.items()
    assert set(cond) <= {"$gte", "$lt"}, f"the fake knows time ranges only, not {where}"
    value = bson.decode(raw)[field]
    return ("$gte" not in cond or value >= cond["$gte"]) and ("$lt" not in cond or value < cond["$lt"])


class FakeTimeseries:
    """A time-series collection as the copy sees it. ``fail_insert``: that insert (counted from 1) lands,
    then its acknowledgement is lost."""

    def __init__(self, *, range_deletes: bool = True, fail_insert: int | None = None) -> None:
        self.docs: list[bytes] = []
        self.range_deletes = range_deletes
        self.fail_insert = fail_insert
        self.inserts = 0
        self.deletes: list[dict[str, Any]] = []

    name = NS.coll
    write_concern = WriteConcern()

    @property
    def database(self) -> Any:
        """Where the sink sends its insert commands (sinks/mongo/commands); no other command."""
        fake = self

        class Database:
            client = SimpleNamespace(topology_description=SimpleNamespace(server_descriptions=dict))

            async def command(self, command: Mapping[str, Any], **_: Any) -> dict[str, Any]:
                assert "insert" in command, f"the copy sent {dict(command)} to a time-series collection"
                await fake.insert(command["documents"])
                return {"n": len(command["documents"]), "ok": 1.0}

        return Database()

    async def insert(self, docs: list[RawBSONDocument]) -> None:
        self.inserts += 1
        self.docs.extend(bytes(doc.raw) for doc in docs)  # a repeated _id is just another measurement
        if self.inserts == self.fail_insert:
            raise AutoReconnect("connection closed before the reply")

    async def delete_many(self, where: Mapping[str, Any], **_: Any) -> Any:
        if where and not self.range_deletes:
            raise OperationFailure("Cannot perform a delete with a non-empty query on a time-series collection "
                                   "that does not exclusively use the metaField", code=INVALID_OPTIONS)  # fmt: skip
        self.deletes.append(dict(where))
        kept = [doc for doc in self.docs if not matches(where, doc)]
        gone, self.docs = len(self.docs) - len(kept), kept

        class Result:
            deleted_count = gone

        return Result()

    def __getattr__(self, name: str) -> Any:  # bulk_write, replace_one, update_one...: never by _id here
        raise AssertionError(f"the copy called {name} on a time-series collection")


class FakeClient:
    def __init__(self, colls: dict[Namespace, FakeTimeseries]) -> None:
        self.colls = colls

    def __getitem__(self, db: str) -> Any:
        colls = self.colls

        class Database:
            def __getitem__(self, coll: str) -> FakeTimeseries:
                return colls[Namespace(db, coll)]

        return Database()

    async def close(self) -> None:
        pass


def fake_sink(
    colls: dict[Namespace, FakeTimeseries], *, wire_version: int = 21, scope: Scope | None = None
) -> MongoSink:
    """The real MongoSink writing into fake collections (``wire_version`` 21: MongoDB 7.0)."""

    class Sink(MongoSink):
        async def start(self) -> None:
            self.server = ServerInfo("replicaset", "rs0", None, wire_version)

    sink = Sink("mongodb://127.0.0.1:1", scope=scope)
    sink._client = FakeClient(colls)  # type: ignore[assignment]
    sink.server = ServerInfo("replicaset", "rs0", None, wire_version)
    return sink


def fake_source(monkeypatch: pytest.MonkeyPatch, docs: list[bytes]) -> None:
    """read_partition over ``docs``, selecting each partition's documents by its query, as the server would."""
    import replicator.snapshot.copy as pipeline

    async def read(
        client: object,
        part: Partition,
        *,
        batch_docs: int,
        batch_bytes: int,
        after: Resume | None = None,
        reads: object = None,
    ) -> AsyncIterator[list[RawBSONDocument]]:
        assert after is None or part.resumable  # a time-series partition never goes on from a point
        mine = [RawBSONDocument(doc) for doc in docs if matches(part.query(), doc)]
        for first in range(0, len(mine), batch_docs):
            yield mine[first : first + batch_docs]

    monkeypatch.setattr(pipeline, "read_partition", read)


def plan(count: int, per: int) -> list[Partition]:
    last = START + datetime.timedelta(seconds=count - 1)
    return time_ranges(NS, "ts", START, last, count, per)


async def copy_like_a_sync(sink: MongoSink, parts: list[Partition], *, attempts: int = 3) -> dict[str, Resume]:
    """Copy as SyncJob does: a failed attempt goes on from the checkpoint (partitions done are skipped, the
    others start again with their entries); returns the entries left."""
    resume: dict[str, Resume] = {}  # the checkpoint's
    done: set[str] = set()

    async def start(part: Partition) -> None:
        resume[part.id] = Resume(None)

    async def finished(part: Partition, docs: int) -> None:
        resume.pop(part.id, None)
        done.add(part.id)

    for _ in range(attempts):
        try:
            await copy_partitions(
                None, sink, [p for p in parts if p.id not in done], limits=LIMITS, rename=lambda ns: ns,  # type: ignore[arg-type]
                on_done=finished, reporter=LogReporter(), resume=dict(resume), on_start=start,
            )  # fmt: skip
            return resume
        except AutoReconnect:
            continue
    raise AssertionError("still failing")


def test_time_ranges_cut_equal_spans_with_no_gap_nor_overlap() -> None:
    parts = plan(1000, 300)
    assert [p.bracket for p in parts] == [TIME] * 4 and [p.index for p in parts] == [0, 1, 2, 3]
    assert parts[0].lower is None and parts[-1].upper is None
    assert all(a.upper == b.lower for a, b in itertools.pairwise(parts))
    assert [p.lower for p in parts[1:]] == [START + datetime.timedelta(seconds=s) for s in (249.75, 499.5, 749.25)]
    assert all(not p.resumable and p.clears_on_retry and p.field == "ts" for p in parts)
    assert parts[0].query() == {"ts": {"$lt": parts[0].upper}}
    assert parts[1].query() == {"ts": {"$gte": parts[1].lower, "$lt": parts[1].upper}}
    assert parts[-1].query() == {"ts": {"$gte": parts[-1].lower}}
    docs = measurements(1000)
    assert [sum(1 for d in docs if matches(p.query(), d)) for p in parts] == [250] * 4
    assert [Partition.from_json(p.to_json()) for p in parts] == parts  # as the checkpoint keeps them
    assert Partition.from_json({k: v for k, v in parts[0].to_json().items() if k != "field"}).field == "_id"


def test_time_ranges_keep_whole_what_there_is_no_cutting() -> None:
    small = plan(100, 300)
    one_instant = time_ranges(NS, "ts", START, START, 1000, 300)
    not_dates = time_ranges(NS, "ts", 1, 2, 1000, 300)  # never on MongoDB: a time field holds dates
    for parts in (small, one_instant, not_dates):
        assert [(p.bracket, p.query(), p.clears_on_retry) for p in parts] == [(ALL, {}, True)]


async def test_auto_splits_a_time_series_collection_only_where_its_time_ranges_are_bounded() -> None:
    """--split auto: whole, uncounted (a count reads every bucket), where a time range is a collection scan;
    cut by time where the buckets are clustered by time (MongoDB 6.3+) or the time field is indexed."""

    class Coll:
        name = "cpu"

        def __init__(self, stage: str) -> None:
            self.stage = stage
            self.counted = False
            self.database = self

        async def command(self, name: str, command: dict[str, Any], **_: Any) -> dict[str, Any]:
            assert list(command["filter"]) == ["ts"]
            return {"queryPlanner": {"winningPlan": {"stage": self.stage}}}

        async def estimated_document_count(self) -> int:
            self.counted = True
            return 1000

        async def find_one(self, where: Any, projection: Any, *, sort: list[tuple[str, int]]) -> dict[str, Any]:
            return {"ts": START + datetime.timedelta(seconds=0 if sort[0][1] == 1 else 999)}

    scan, clustered = Coll("COLLSCAN"), Coll("CLUSTERED_IXSCAN")
    assert [p.bracket for p in await plan_timeseries(scan, NS, "ts", 300)] == [ALL]  # type: ignore[arg-type]
    assert not scan.counted
    assert [p.bracket for p in await plan_timeseries(clustered, NS, "ts", 300)] == [TIME] * 4  # type: ignore[arg-type]
    assert [p.bracket for p in await plan_timeseries(scan, NS, "ts", 300, split="always")] == [TIME] * 4  # type: ignore[arg-type]


async def test_a_partition_copied_again_after_a_lost_ack_holds_each_measurement_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asyncio copier: the 6th insert lands but is not acknowledged; the retry deletes the ranges that
    were begun, each by its own time range, and copies them again; the ranges done are left alone."""
    source = measurements(600)
    fake_source(monkeypatch, source)
    target = FakeTimeseries(fail_insert=6)
    parts = plan(600, 200)
    left = await copy_like_a_sync(fake_sink({NS: target}), parts)
    assert Counter(target.docs) == Counter(source) and len(target.docs) == 600
    assert left == {}
    assert target.deletes and all(where in [p.query() for p in parts] for where in target.deletes)


async def test_a_whole_partition_copied_again_is_deleted_whole_first(monkeypatch: pytest.MonkeyPatch) -> None:
    source = measurements(120)
    fake_source(monkeypatch, source)
    target = FakeTimeseries(fail_insert=2)
    await copy_like_a_sync(fake_sink({NS: target}), [Partition(NS, 0, ALL, keyed=False, field="ts")])
    assert Counter(target.docs) == Counter(source) and target.deletes == [{}]


async def test_a_first_copy_deletes_nothing_and_is_recorded_as_begun_before_it_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = measurements(300)
    fake_source(monkeypatch, source)
    target = FakeTimeseries()
    begun: list[tuple[str, int]] = []

    async def start(part: Partition) -> None:
        begun.append((part.id, target.inserts))

    async def done(part: Partition, docs: int) -> None:
        pass

    parts = plan(300, 100)
    await copy_partitions(
        None, fake_sink({NS: target}), parts, limits=LIMITS, rename=lambda ns: ns, on_done=done,  # type: ignore[arg-type]
        reporter=LogReporter(), on_start=start,
    )  # fmt: skip
    assert Counter(target.docs) == Counter(source) and target.deletes == []
    assert sorted(pid for pid, _ in begun) == sorted(p.id for p in parts)
    assert begun[0][1] == 0  # the first was recorded before any insert


async def test_a_spark_task_attempt_after_a_failed_one_deletes_its_range_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Spark copier's task (run here without Spark): Spark's second attempt at a partition the driver
    saw begin for the first time finds the first attempt's writes and deletes only its own range; a first
    attempt deletes nothing."""
    from replicator.engines.spark import tasks

    source = measurements(600)
    fake_source(monkeypatch, source)
    parts = plan(600, 200)
    target = FakeTimeseries()
    others = [d for d in source if not matches(parts[1].query(), d)]  # the other ranges, copied already
    target.docs = others + [d for d in source if matches(parts[1].query(), d)][:60]  # the failed attempt's
    monkeypatch.setattr(tasks, "open_sink", lambda settings: fake_sink({NS: target}))
    settings = resolve({"source": "mongodb://127.0.0.1:1", "target": "mongodb://127.0.0.1:2",
                        "checkpoint": tmp_path / "cp.json"}, env={})  # fmt: skip
    task = tasks.CopyTask(settings, parts[1], None, "rs0", LIMITS, lambda ns: ns, None)
    assert await tasks._copy(task, retried=True) == (200, [])
    assert Counter(target.docs) == Counter(source) and target.deletes == [parts[1].query()]

    target.docs, target.deletes = list(others), []
    assert await tasks._copy(task) == (200, [])  # a first attempt
    assert Counter(target.docs) == Counter(source) and target.deletes == []
    begun = tasks.CopyTask(settings, parts[1], Resume(None), "rs0", LIMITS, lambda ns: ns, None)
    target.docs = others + [d for d in source if matches(parts[1].query(), d)][:60]
    assert await tasks._copy(begun) == (200, [])  # begun by an earlier run, as the driver's checkpoint says
    assert Counter(target.docs) == Counter(source) and target.deletes == [parts[1].query()]


def test_a_target_that_cannot_delete_time_ranges_gets_time_series_collections_whole() -> None:
    assert fake_sink({}, wire_version=21).deletes_time_ranges  # MongoDB 7.0
    assert not fake_sink({}, wire_version=17).deletes_time_ranges  # 6.0: by the meta field only


async def test_a_refused_delete_stops_the_copy_with_the_reason_and_nothing_is_inserted_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = measurements(600)
    fake_source(monkeypatch, source)
    target = FakeTimeseries(range_deletes=False, fail_insert=6)
    with pytest.raises(SinkError, match=r"time range of one 7\.0"):
        await copy_like_a_sync(fake_sink({NS: target}, wire_version=17), plan(600, 200))
    assert set(Counter(target.docs).values()) == {1}


async def test_nothing_is_deleted_outside_the_selections_target_namespaces() -> None:
    keep = Namespace("other", "cpu")
    target = FakeTimeseries()
    target.docs = measurements(10)
    sink = fake_sink({keep: target}, scope=Scope(Selection.from_patterns([r"metrics\..*"])))
    with pytest.raises(SinkError, match="outside the selection"):
        await sink.discard(keep, {})
    assert len(target.docs) == 10
