"""The one event type that flows between stages, and stream positions.

Documents stay :class:`~bson.raw_bson.RawBSONDocument` end to end, so a document that no stage inspects
reaches the sink with the exact bytes the source sent (field order, Int64, -0.0, every binary subtype).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp


class Op(enum.StrEnum):
    """What happened; the values are Debezium's op letters where Debezium has one."""

    READ = "r"  # a snapshot read
    INSERT = "c"
    UPDATE = "u"
    REPLACE = "replace"
    DELETE = "d"
    # DDL
    CREATE = "create"
    DROP = "drop"
    DROP_DATABASE = "dropDatabase"
    RENAME = "rename"
    CREATE_INDEXES = "createIndexes"
    DROP_INDEXES = "dropIndexes"
    MODIFY = "modify"  # collMod
    # a stream that can no longer go on (collection/database stream only)
    INVALIDATE = "invalidate"

    #: hashed as its value, in C: Enum's own hash is a Python call (of its name), and every event's op is
    #: looked up in a set or two; a member equals its value, so they now hash alike too
    __hash__ = str.__hash__

    @property
    def is_ddl(self) -> bool:
        return self in _DDL


_DDL = frozenset({Op.CREATE, Op.DROP, Op.DROP_DATABASE, Op.RENAME, Op.CREATE_INDEXES, Op.DROP_INDEXES, Op.MODIFY})


@dataclass(frozen=True, slots=True)
class Namespace:
    """A database and an optional collection (None for database-wide events)."""

    db: str
    coll: str | None = None

    def __str__(self) -> str:
        return f"{self.db}.{self.coll}" if self.coll is not None else self.db

    @classmethod
    def parse(cls, text: str) -> Namespace:
        """``db.coll`` (the collection's name may hold dots) or ``db``: what :meth:`__str__` wrote."""
        db, dot, coll = text.partition(".")
        return cls(db, coll if dot else None)


@dataclass(slots=True, unsafe_hash=True)
class Position:
    """A point in the source's change stream: a resume token when known, else an operation time.

    Treated as immutable (hashable, compared by value): not a frozen dataclass only because every
    event builds one, and a frozen one's constructor cost three times as much.

    An event's position also says where it sits among events of the same cluster time (a transaction's
    events share one, and two shards can stamp the same one): ``index`` is its place among its stream's
    events at ``cluster_time`` (0, 1, ...; -1 for a snapshot's read time), and ``shard`` the stream that
    reported it (None for a replica set's one stream). :mod:`replicator.events.positions` orders them totally."""

    resume_token: Mapping[str, Any] | None = None
    cluster_time: Timestamp | None = None
    index: int | None = None
    shard: str | None = None

    def __bool__(self) -> bool:
        return self.resume_token is not None or self.cluster_time is not None


@dataclass(frozen=True, slots=True)
class Transaction:
    """The multi-document transaction an event belongs to (same lsid + txnNumber = applied together)."""

    lsid: Mapping[str, Any]
    txn_number: int

    @property
    def key(self) -> tuple[bytes, int]:
        lsid_id = self.lsid.get("id")
        raw = getattr(lsid_id, "bytes", None) or bytes(lsid_id or b"")
        return raw, self.txn_number


#: an update description's three parts: updatedFields, removedFields, truncatedArrays (field, new size)
UpdateParts = tuple[Mapping[str, Any], tuple[str, ...], tuple[tuple[str, int], ...]]


class UpdateDescription:
    """A delta update as the change stream reports it. Immutable; compared and hashed by its parts.

    Not a dataclass: a subclass (:mod:`.normalize`'s) reads its parts from the change document's bytes
    only when a stage first asks for one. The MongoDB sink applies an update's looked-up full document
    and never reads its delta, whose decoding cost about 2.6 us of CPU an update event."""

    __slots__ = ("_parts",)

    def __init__(
        self,
        updated_fields: Mapping[str, Any],
        removed_fields: tuple[str, ...] = (),
        truncated_arrays: tuple[tuple[str, int], ...] = (),
    ) -> None:
        self._parts: UpdateParts | None = (updated_fields, removed_fields, truncated_arrays)

    def parts(self) -> UpdateParts:
        """updatedFields, removedFields and truncatedArrays."""
        assert self._parts is not None
        return self._parts

    @property
    def updated_fields(self) -> Mapping[str, Any]:
        return self.parts()[0]

    @property
    def removed_fields(self) -> tuple[str, ...]:
        return self.parts()[1]

    @property
    def truncated_arrays(self) -> tuple[tuple[str, int], ...]:
        return self.parts()[2]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UpdateDescription):
            return NotImplemented
        return self.parts() == other.parts()

    def __hash__(self) -> int:
        return hash(self.parts())

    def __repr__(self) -> str:
        updated, removed, truncated = self.parts()
        return f"UpdateDescription({updated!r}, removed_fields={removed!r}, truncated_arrays={truncated!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return UpdateDescription, self.parts()


@dataclass(slots=True, eq=True)
class ChangeEvent:
    """One normalized change: a snapshot read, a document change, or DDL.

    Treated as immutable: a stage that changes an event makes a new one (``dataclasses.replace``). It is
    not a frozen dataclass only because building a frozen one (every field set through
    ``object.__setattr__``) cost a tenth of reading an event from the stream.

    ``document`` is the full document when known (insert, replace, snapshot read, and updates
    opened with updateLookup), ``before`` the pre-image when the stream asked for one; ``key`` is the
    change stream's documentKey (``{"_id": ...}``, plus the shard key on sharded collections).
    ``ddl`` holds the DDL event's details (operationDescription).
    """

    op: Op
    ns: Namespace
    key: Mapping[str, Any] | None = None
    document: Mapping[str, Any] | None = None
    update: UpdateDescription | None = None
    ddl: Mapping[str, Any] | None = None
    to: Namespace | None = None  # rename target
    position: Position | None = None
    wall_time_ms: int | None = None
    txn: Transaction | None = None
    before: Mapping[str, Any] | None = None  # fullDocumentBeforeChange, when pre-images are on
    rs: str | None = None  # the replica set (shard) whose change stream reported the event
    origin: Namespace | None = None  # the source namespace, when --rename gave ``ns`` another name
    uuid: bytes | None = None  # the collectionUUID: which incarnation of the namespace the event is about

    @property
    def change_time(self) -> Timestamp | None:
        """When the change happened (its cluster time); None for a snapshot read, whose position is the
        snapshot's read time, not a change's."""
        pos = self.position
        return None if pos is None or self.op is Op.READ else pos.cluster_time

    @property
    def document_key(self) -> Mapping[str, Any]:
        """The filter that selects this event's document."""
        if self.key is not None:
            return self.key
        if self.document is not None:
            return {"_id": self.document["_id"]}
        raise ValueError(f"{self.op.value} event on {self.ns} has no document key")


def by_namespace(events: Iterable[ChangeEvent]) -> dict[Namespace, list[ChangeEvent]]:
    """The events of each namespace, in their order. A run of events of one Namespace object (the stream
    reader makes one per namespace) is hashed once: Namespace's hash is a Python call."""
    groups: dict[Namespace, list[ChangeEvent]] = {}
    last: Namespace | None = None
    group: list[ChangeEvent] = []
    for event in events:
        ns = event.ns
        if ns is not last:
            group = groups.setdefault(ns, [])
            last = ns
        group.append(event)
    return groups


def ts_to_json(ts: Timestamp | None) -> dict[str, int] | None:
    return None if ts is None else {"t": ts.time, "i": ts.inc}


def ts_from_json(data: Any) -> Timestamp | None:
    if data is None:
        return None
    return Timestamp(int(data["t"]), int(data["i"]))


@dataclass(frozen=True)
class ShardSpec:
    """How a target collection is sharded: its source's shard key (config.collections) with the source's chunk
    bounds, or a key ``--shard-target`` declares. An empty declared key leaves the target as it is.

    ``split_points``: the source's chunk bounds, where a range key's target is split before the copy;
    ``chunks``: the source's chunk count, a hashed key's initial chunks."""

    key: Mapping[str, Any]
    unique: bool = False
    split_points: tuple[Mapping[str, Any], ...] = ()
    chunks: int = 0
    declared: bool = False  # from --shard-target, not the source

    @property
    def hashed(self) -> bool:
        return any(value == "hashed" for value in self.key.values())


@dataclass(frozen=True)
class CollectionSpec:
    """A collection or view as the source's catalog describes it: what a sink needs to recreate it.

    ``options`` are listCollections' options (create's options); ``indexes`` are listIndexes' specs
    without the server-assigned ``v``/``ns``; ``shard``: how a sharded target shards it (None: not at all).
    """

    ns: Namespace
    kind: str  # "collection" | "view" | "timeseries"
    options: Mapping[str, Any]
    indexes: tuple[Mapping[str, Any], ...] = ()
    shard: ShardSpec | None = None

    @property
    def is_view(self) -> bool:
        return self.kind == "view"
