"""Time-series collections in the snapshot, without a server: their plan, ranges of the time field."""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Mapping
from typing import Any

import bson

from replicator.events import Namespace
from replicator.source.partitions import ALL, TIME, Partition, plan_timeseries, time_ranges

NS = Namespace("metrics", "cpu")
START = datetime.datetime(2024, 1, 1)


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


def plan(count: int, per: int) -> list[Partition]:
    last = START + datetime.timedelta(seconds=count - 1)
    return time_ranges(NS, "ts", START, last, count, per)


def test_time_ranges_cut_equal_spans_with_no_gap_nor_overlap() -> None:
    parts = plan(1000, 300)
    assert [p.bracket for p in parts] == [TIME] * 4 and [p.index for p in parts] == [0, 1, 2, 3]
    assert parts[0].lower is None and parts[-1].upper is None
    assert all(a.upper == b.lower for a, b in itertools.pairwise(parts))
    assert [p.lower for p in parts[1:]] == [START + datetime.timedelta(seconds=s) for s in (249.75, 499.5, 749.25)]
    assert all(not p.resumable and p.field == "ts" for p in parts)
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
        assert [(p.bracket, p.query(), p.keyed) for p in parts] == [(ALL, {}, False)]


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
