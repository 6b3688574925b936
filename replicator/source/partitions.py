"""Snapshot partitions: plain, picklable ``_id`` ranges that split a collection for parallel copying.

MongoDB compares values of different types by *type bracket* (MinKey < null < numbers < strings <
objects < binary < ObjectId < bool < date < timestamp < MaxKey), and a range query such as
``{_id: {$gte: 5}}`` only matches its own bracket. So ranges never span brackets: a collection's ``_id``
order is cut where the bracket changes and every ``partition_docs`` keys inside a bracket, and each range
is queried with ``$type`` plus its bounds. A catch-all partition takes the ``_id`` types no bracket names.

A time-series collection is cut by time instead (TIME ranges of its time field, always a date): its
measurements may share an ``_id``, MongoDB bounds a time range by its buckets' own time bounds (an ``_id``
range reads every bucket), and a range copied again is first deleted from the target by the same filter.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bson.binary import Binary
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.mongo_client import AsyncMongoClient
from pymongo.errors import OperationFailure
from pymongo.read_preferences import _ServerMode

from replicator.bsonkit.extjson import from_jsonable, to_jsonable
from replicator.events import CollectionSpec, Namespace
from replicator.settings.filters import filtered

#: the find() filter of a namespace's replicated documents (``--filter``'s query), or None: all of them
Where = Callable[[Namespace], Mapping[str, Any] | None]

#: bracket name -> the $type aliases it covers, in BSON order.
BRACKETS: dict[str, tuple[str, ...]] = {
    "minKey": ("minKey",),
    "null": ("null",),
    "number": ("double", "int", "long", "decimal"),
    "string": ("string", "symbol"),
    "object": ("object",),
    "binData": ("binData",),
    "objectId": ("objectId",),
    "bool": ("bool",),
    "date": ("date",),
    "timestamp": ("timestamp",),
    "maxKey": ("maxKey",),
}
#: $type aliases of the _id types no bracket names (an OTHER partition's, or where ALL goes past the brackets);
#: mongod refuses some of them as an _id, which does no harm here.
UNBRACKETED = ("undefined", "array", "regex", "dbPointer", "javascript", "javascriptWithScope")
ALL = "*"  # a whole collection in one partition
OTHER = "other"  # every _id type no range of the plan names
TIME = "time"  # a range of a time-series collection's time field


def bracket_of(value: Any) -> str | None:
    """The type bracket of a decoded ``_id`` value; None for types not in BRACKETS."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, Int64, Decimal128)):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, ObjectId):
        return "objectId"
    if isinstance(value, (bytes, Binary)):
        return "binData"
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return "date"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, MinKey):
        return "minKey"
    if isinstance(value, MaxKey):
        return "maxKey"
    if isinstance(value, Mapping):
        return "object"
    return None


def _is_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    return isinstance(value, Decimal128) and value.to_decimal().is_nan()


@dataclass(frozen=True)
class Resume:
    """Where a partition's copy goes on: after ``last_id``, the end of what the sink acknowledged. For a
    partition that clears on retry, any Resume only says that an earlier attempt began it.

    A wrapper rather than the bare value, since None is an ``_id`` too."""

    last_id: Any


@dataclass(frozen=True)
class Partition:
    """One range of one collection: ``lower`` inclusive, ``upper`` exclusive, None = open. The range is of
    ``field``: ``_id``, or a time-series collection's time field (bracket TIME, or ALL).

    ``index`` orders the partitions of a namespace; ``(ns, index)`` identifies it in the checkpoint.
    """

    ns: Namespace
    index: int
    bracket: str  # a BRACKETS key, ALL, OTHER or TIME
    lower: Any = None
    upper: Any = None
    excluded: tuple[str, ...] = ()  # for OTHER: the brackets the plan's ranges cover
    estimated_docs: int = 0
    ordered: bool = False  # insertion order matters (capped): one writer, batches in read order
    keyed: bool = True  # _id is unique (not a time-series collection's): a copy can go on after an _id
    field: str = "_id"  # what the range is of
    # the source's documents of the range that are replicated (--filter's query; None: all): reads of the
    # source add it to the range (find_filter), the target's copy of the range is the range alone
    where: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)

    @property
    def id(self) -> str:
        return f"{self.ns}#{self.index}"

    @property
    def resumable(self) -> bool:
        """Can a failed copy go on after its last acknowledged ``_id`` (read in ``_id`` order)? Not a capped
        collection's (read in insertion order), a time-series one's (measurements may share an ``_id``)
        nor OTHER's (types without a bracket): those start over."""
        return self.keyed and not self.ordered and self.bracket != OTHER

    @property
    def clears_on_retry(self) -> bool:
        """Must what an earlier attempt wrote be deleted from the target before the partition is copied
        again? A time-series collection's (not keyed): inserting a measurement never replaces one, so a
        second copy would keep both. The delete is of :meth:`query`, this partition's own range."""
        return not self.keyed

    def query(self, after: Resume | None = None) -> dict[str, Any]:
        """The find() filter that selects exactly this partition's documents; with ``after``, those past
        its ``last_id`` in ``_id`` order (a partition that is not :attr:`resumable` starts over)."""
        if after is not None and self.resumable:
            return self._query_after(after.last_id)
        if self.bracket == ALL:
            return {}
        if self.bracket == TIME:  # a time field holds dates only: no bracket to name, nor NaN to mind
            bounds = {"$gte": self.lower, "$lt": self.upper}
            return {self.field: {op: value for op, value in bounds.items() if value is not None}}
        if self.bracket == OTHER:
            types = [t for b in self.excluded for t in BRACKETS[b]]
            return {"_id": {"$not": {"$type": types}}} if types else {}
        cond: dict[str, Any] = {"$type": list(BRACKETS[self.bracket])}
        if self.lower is not None:
            cond["$gte"] = self.lower
        if self.upper is not None:
            if self.lower is None:
                # "not >= upper" rather than "< upper": NaN sorts first among numbers but is not "< x"
                cond["$not"] = {"$gte": self.upper}
            else:
                cond["$lt"] = self.upper
        return {"_id": cond}

    def find_filter(self, after: Resume | None = None) -> Mapping[str, Any]:
        """The find() filter that reads this partition's replicated documents from the source: its range
        (:meth:`query`), and its query when a ``--filter`` applies."""
        return filtered(self.query(after), self.where)

    def _query_after(self, last: Any) -> dict[str, Any]:
        bracket = self.bracket if self.bracket != ALL else bracket_of(last)
        if bracket is None:  # an _id type with no bracket: no "after" to express, copy it all again
            return self.query()
        cond: dict[str, Any] = {"$type": list(BRACKETS[bracket])}
        # NaN sorts first among numbers but matches no $gt: after it comes every number but NaN
        cond.update({"$gte": float("-inf")} if _is_nan(last) else {"$gt": last})
        if self.bracket != ALL:
            if self.upper is not None:
                cond["$lt"] = self.upper
            return {"_id": cond}
        # a whole collection goes on past last's bracket: every later bracket, and the unbracketed types
        # wherever they sort (copying one twice is harmless, missing one is not)
        names = list(BRACKETS)
        later = [t for b in names[names.index(bracket) + 1 :] for t in BRACKETS[b]] + list(UNBRACKETED)
        return {"$or": [{"_id": cond}, {"_id": {"$type": later}}]}

    def to_json(self) -> dict[str, Any]:
        return {
            "db": self.ns.db,
            "coll": self.ns.coll,
            "index": self.index,
            "bracket": self.bracket,
            "lower": to_jsonable(self.lower) if self.lower is not None else None,
            "upper": to_jsonable(self.upper) if self.upper is not None else None,
            "excluded": list(self.excluded),
            "estimated_docs": self.estimated_docs,
            "ordered": self.ordered,
            "keyed": self.keyed,
            "field": self.field,
            **({"where": to_jsonable(self.where)} if self.where is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Partition:
        return cls(
            ns=Namespace(data["db"], data["coll"]),
            index=int(data["index"]),
            bracket=str(data["bracket"]),
            lower=from_jsonable(data["lower"]) if data.get("lower") is not None else None,
            upper=from_jsonable(data["upper"]) if data.get("upper") is not None else None,
            excluded=tuple(data.get("excluded") or ()),
            estimated_docs=int(data.get("estimated_docs") or 0),
            ordered=bool(data.get("ordered")),
            keyed=bool(data.get("keyed", True)),
            field=str(data.get("field") or "_id"),
            where=from_jsonable(data["where"]) if data.get("where") is not None else None,
        )


async def ranges_use_index(coll: AsyncCollection[Any], field: str = "_id", low: Any = 0, high: Any = 1) -> bool:
    """Is a range of ``field`` (``low`` to ``high``, values of its type) read through an index, so that N
    partitions cost one pass and not N?

    True on MongoDB for ``_id`` (the ``_id`` index or a clustered index bounds the scan), and for a
    time-series collection's time field where its buckets are clustered by time (6.3+) or indexed. A
    server whose plan for a range is a collection scan would read the whole collection once per
    partition: then it is not split.
    """
    command = {"find": coll.name, "filter": {field: {"$gte": low, "$lt": high}}}
    try:  # queryPlanner verbosity: plan the query without running it
        plan = await coll.database.command("explain", command, verbosity="queryPlanner")
    except OperationFailure:
        return True  # explain refused (permissions): assume the index, as every MongoDB has one on _id
    return _uses_index(plan.get("queryPlanner", plan))


def _uses_index(node: Any) -> bool:
    if isinstance(node, Mapping):
        stage = node.get("stage")
        if isinstance(stage, str) and any(s in stage for s in ("IXSCAN", "IDHACK")):
            return True
        return any(_uses_index(v) for k, v in node.items() if k != "rejectedPlans")
    if isinstance(node, list):
        return any(_uses_index(v) for v in node)
    return False


class RangeCutter:
    """Cuts a collection's ``_id``s, fed in ascending order, into partitions: at every bracket change and
    every ``partition_docs`` keys inside a bracket. Pure: the engines feed it from their own reads."""

    def __init__(self, ns: Namespace, partition_docs: int) -> None:
        self.ns = ns
        self.partition_docs = partition_docs
        self._ranges: list[list[Any]] = []  # [bracket, lower bound or None, docs]
        self._unknown = 0

    def add(self, value: Any) -> None:
        """The next ``_id`` in ascending order."""
        bracket = bracket_of(value)
        if bracket is None:
            self._unknown += 1
            return
        last = self._ranges[-1] if self._ranges else None
        if last is None or last[0] != bracket:
            last = [bracket, None, 0]
            self._ranges.append(last)
        elif last[2] >= self.partition_docs:
            last = [bracket, value, 0]
            self._ranges.append(last)
        last[2] += 1

    def partitions(self) -> list[Partition]:
        """The plan: one range per cut (upper bound: the next range's lower bound in the same bracket),
        plus a catch-all for ``_id`` types no bracket names; one whole partition when nothing was cut."""
        if not self._ranges:
            return [Partition(self.ns, 0, ALL, estimated_docs=self._unknown)]
        parts: list[Partition] = []
        for i, (bracket, lower, docs) in enumerate(self._ranges):
            nxt = self._ranges[i + 1] if i + 1 < len(self._ranges) else None
            upper = nxt[1] if nxt is not None and nxt[0] == bracket else None
            parts.append(Partition(self.ns, len(parts), bracket, lower, upper, estimated_docs=docs))
        if self._unknown:
            covered = tuple(dict.fromkeys(p.bracket for p in parts))
            parts.append(Partition(self.ns, len(parts), OTHER, excluded=covered, estimated_docs=self._unknown))
        return parts


def with_catch_all(plan: Sequence[Partition]) -> list[Partition]:
    """The plan as verify compares it: its ranges, plus one for every ``_id`` type none of them names.
    The ranges were cut from the source's ``_id``s, so a document of another type on the target alone
    would be in none of them (on the source, the catch-all reads what was inserted since the plan)."""
    if not plan or any(p.bracket in (ALL, OTHER, TIME) for p in plan):
        return list(plan)
    covered = tuple(dict.fromkeys(p.bracket for p in plan))
    return [*plan, Partition(plan[0].ns, len(plan), OTHER, excluded=covered)]


async def plan_collection(
    coll: AsyncCollection[Any], ns: Namespace, partition_docs: int, *, capped: bool = False, split: str = "auto"
) -> list[Partition]:
    """Split one collection. Small collections are one partition; larger ones are cut by a sorted scan
    of ``_id`` keys (an index-only read), every ``partition_docs`` keys and at each bracket change.

    Every document that exists when the scan runs is in one of the ranges, and documents inserted later
    come through the change stream (its position was captured before), so the catch-all OTHER partition
    is only needed for ``_id`` types the scan saw but BRACKETS does not name.

    A capped collection is never split: one reader in natural order keeps its insertion order, which
    decides what it evicts next. ``split``: "auto" also keeps whole a collection whose ranges would each
    be a collection scan; "always" splits regardless; "never" does not split."""
    if capped or split == "never" or (split == "auto" and not await ranges_use_index(coll)):
        # not counted: on some servers a count is a full scan, and a whole collection does not need it
        return [Partition(ns, 0, ALL, ordered=capped)]
    estimated = await coll.estimated_document_count()
    if estimated <= partition_docs:
        return [Partition(ns, 0, ALL, estimated_docs=estimated)]
    cutter = RangeCutter(ns, partition_docs)
    async for doc in coll.find({}, {"_id": 1}, batch_size=10_000).sort("_id", 1):
        cutter.add(doc["_id"])
    return cutter.partitions()


def _millis(value: Any) -> int:
    return int(value) if isinstance(value, DatetimeMS) else int(DatetimeMS(value))


def _date(millis: int) -> Any:
    """A BSON date as the source's client decodes it: a datetime, or a DatetimeMS outside its range."""
    try:
        return DatetimeMS(millis).as_datetime()
    except (OverflowError, ValueError):
        return DatetimeMS(millis)


def time_ranges(ns: Namespace, field: str, first: Any, last: Any, count: int, partition_docs: int) -> list[Partition]:
    """A time-series collection's plan: its ``count`` measurements, timed from ``first`` to ``last`` (dates),
    cut into equal spans of time, of about ``partition_docs`` measurements each when they come at an even
    pace. The first range is open below and the last open above, so ranges never leave a gap nor overlap
    whatever the pace; one whole partition when there is nothing to cut. Pure."""
    whole = [Partition(ns, 0, ALL, estimated_docs=count, keyed=False, field=field)]
    if count <= partition_docs or bracket_of(first) != "date" or bracket_of(last) != "date":
        return whole
    low, high = _millis(first), _millis(last)
    pieces = math.ceil(count / partition_docs)
    cuts = sorted({low + (high - low) * i // pieces for i in range(1, pieces)} - {low})
    if not cuts:  # every measurement at one instant
        return whole
    bounds = [None, *map(_date, cuts), None]
    each = count // (len(cuts) + 1)
    return [
        Partition(ns, i, TIME, lower, upper, estimated_docs=each, keyed=False, field=field)
        for i, (lower, upper) in enumerate(itertools.pairwise(bounds))
    ]


async def plan_timeseries(
    coll: AsyncCollection[Any], ns: Namespace, field: str, partition_docs: int, *, split: str = "auto"
) -> list[Partition]:
    """Split a time-series collection by its time ``field`` (see :func:`time_ranges`); ``split`` as for
    :func:`plan_collection`. Counting a time-series collection reads its buckets, so it is kept whole
    without a count where it will not be split anyway."""
    whole = [Partition(ns, 0, ALL, keyed=False, field=field)]
    epoch = datetime.datetime(1970, 1, 1)
    if split == "never" or (
        split == "auto" and not await ranges_use_index(coll, field, epoch, epoch + datetime.timedelta(seconds=1))
    ):
        return whole
    count = await coll.estimated_document_count()
    if count <= partition_docs:
        return [replace(whole[0], estimated_docs=count)]
    ends = [await coll.find_one({}, {field: 1, "_id": 0}, sort=[(field, way)]) for way in (1, -1)]
    if ends[0] is None or ends[1] is None:  # emptied meanwhile
        return whole
    return time_ranges(ns, field, ends[0].get(field), ends[1].get(field), count, partition_docs)


async def plan_spec(
    client: AsyncMongoClient[Any], spec: CollectionSpec, partition_docs: int, *, split: str = "auto",
    split_time: bool = True, read_preference: _ServerMode | None = None, where: Where | None = None,
) -> list[Partition]:  # fmt: skip
    """One collection's partitions: ``_id`` ranges, or a time-series collection's time ranges (whole unless
    ``split_time``: where the target cannot delete a time range again, see Sink.deletes_time_ranges).
    ``read_preference``: where its scan of the ``_id`` index goes (--read-preference; default: the client's).
    ``where``: the query of the namespace's replicated documents (--filter), read with each range."""
    plan = await _plan_spec(
        client, spec, partition_docs, split=split, split_time=split_time, read_preference=read_preference
    )
    query = where(spec.ns) if where is not None else None
    return plan if query is None else [replace(part, where=query) for part in plan]


async def _plan_spec(
    client: AsyncMongoClient[Any], spec: CollectionSpec, partition_docs: int, *, split: str, split_time: bool,
    read_preference: _ServerMode | None,
) -> list[Partition]:  # fmt: skip
    coll = client[spec.ns.db].get_collection(spec.ns.coll or "", read_preference=read_preference)
    if spec.kind == "timeseries" or spec.options.get("timeseries"):
        field = str((spec.options.get("timeseries") or {}).get("timeField") or "")
        if not field:  # not said: copied whole (deleted whole before it is copied again)
            return [Partition(spec.ns, 0, ALL, keyed=False)]
        return await plan_timeseries(coll, spec.ns, field, partition_docs, split=split if split_time else "never")
    capped = bool(spec.options.get("capped"))
    return await plan_collection(coll, spec.ns, partition_docs, capped=capped, split=split)


async def plan_specs(
    client: AsyncMongoClient[Any], specs: Sequence[CollectionSpec], partition_docs: int, *, split: str = "auto",
    split_time: bool = True, read_preference: _ServerMode | None = None, where: Where | None = None,
) -> list[Partition]:  # fmt: skip
    """The snapshot's partitions of every collection in ``specs`` (views have no documents of their own)."""
    plan: list[Partition] = []
    for spec in specs:
        if not spec.is_view:
            plan.extend(
                await plan_spec(
                    client, spec, partition_docs, split=split, split_time=split_time,
                    read_preference=read_preference, where=where,
                )
            )  # fmt: skip
    return plan
