"""A snapshot partition's collection found where it is when the partition is read: followed through the
renames and drops the source made since the snapshot's time.

A snapshot names each collection as it was at its read time ``T`` (its rows sit there in the stream's
order), and reads its partitions later, a few per micro-batch. By then ``z`` may have been renamed to
``z2``, dropped, or dropped and made again. The rows keep the planned name: they come before the
rename's row in ``sequence``, which moves them to ``z2``, and before a drop's row, which removes them.
So a partition is read from wherever its collection is now:

* the planned name still holds the collection's UUID as the plan read it: nothing happened to it (the
  usual case: one listCollections);
* else the source's renames, drops and dropDatabases since ``T`` are read (a change stream filtered on the
  server) and the name is followed through them. Renamed, the collection is read under its new name;
  dropped (or its database, or replaced by a rename onto its name), nothing is read: its documents must
  not come back, and a new collection of the same name has its own events after the drop.

UUIDs alone would not do: MongoDB keeps a collection's UUID through a rename inside its database but
not through one to another database, and other servers speaking the protocol give a renamed collection
a new one. The events say where it went whatever the UUIDs do; a UUID only says that nothing happened.
For that, the plan must name the collections as they were at ``T``: :func:`moved_since` tells the planner
when one was renamed or dropped between ``T`` and the plan's end, and the plan is then made again.

A rename or drop kills the cursors reading the collection, so a partition read when one comes goes on
under the new name after its last ``_id`` (or stops, dropped). A partition not read in ``_id`` order (a
capped collection's, the catch-all of unbracketed ``_id`` types) cannot go on where it stopped: its task
fails, to be read again whole (Spark discards what a failed task produced).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo.client_session import ClientSession
from pymongo.cursor import Cursor
from pymongo.errors import OperationFailure

from replicator.events import Namespace, Position
from replicator.settings.config import Settings
from replicator.source.batching import token_timestamp
from replicator.source.changestream import operation_time
from replicator.source.connection import kind_of
from replicator.source.incarnations import by_database, uuids_from
from replicator.source.partitions import Partition, Resume
from replicator.source.reads import SourceReads
from replicator.spark_datasource.changes import RawChangeStream, SyncClient

#: The events that move or remove a collection's documents.
MOVES = ("rename", "drop", "dropDatabase")


def _namespace(part: Any) -> Namespace | None:
    return Namespace(part["db"], part.get("coll")) if part is not None else None


def followed(ns: Namespace | None, change: Mapping[str, Any]) -> Namespace | None:
    """Where the collection named ``ns`` is after one change event: its new name after a rename, None
    once it is gone (dropped, its database dropped, or replaced by a rename onto its name). Pure."""
    where = _namespace(change.get("ns"))
    if ns is None or where is None:
        return ns
    op = change.get("operationType")
    if op == "dropDatabase":
        return None if where.db == ns.db else ns
    if op == "drop":
        return None if where == ns else ns
    if op == "rename":
        to = _namespace(change.get("to"))
        if where == ns:
            return to
        if to == ns:
            return None
    return ns


class Moves:
    """The source's renames, drops and dropDatabases from a cluster time on, read as far as the source has
    them each time they are asked for."""

    def __init__(self, client: SyncClient, s: Settings, since: Timestamp) -> None:
        self._client = client
        self._s = s
        self._at = Position(cluster_time=since)  # where the next read goes on

    def read(self) -> Iterator[Mapping[str, Any]]:
        """The events since the last read, up to the source's time now.

        Filtered on the server, a stream answers with empty batches while it scans what matches nothing,
        so an empty batch is not its end. The end is the first event at or after now (let through the
        filter), or where the batches' resume token tells a time past now (MongoDB's tokens do), or, on
        a source where neither comes (an idle one whose tokens tell no time), where the token stops
        moving."""
        now = operation_time(self._client.admin.command("ping"))
        moves = {"operationType": {"$in": list(MOVES)}}
        stream = RawChangeStream(self._client, self._s, match={"$or": [moves, {"clusterTime": {"$gte": now}}]})
        stream.open(self._at)
        try:
            last: Any = object()
            while True:
                change = stream.poll()
                if change is not None:
                    self._at = Position(change["_id"])
                    if change.get("operationType") in MOVES:
                        yield change
                    ts = change.get("clusterTime")
                    if ts is not None and ts >= now:
                        return
                    continue
                token = stream.resume_token
                reached = token_timestamp(token)
                if (reached is not None and reached >= now) or token == last:
                    self._at = Position(token) if token is not None else self._at
                    return
                last = token
        finally:
            stream.close()


def uuids_now(client: SyncClient, namespaces: Collection[Namespace]) -> dict[Namespace, bytes | None]:
    """The UUID of each collection named in ``namespaces`` on the source now (None: none there)."""
    out: dict[Namespace, bytes | None] = {}
    for db, names in by_database(namespaces).items():
        infos = list(client[db].list_collections(filter={"name": {"$in": sorted(names)}}))
        out.update(uuids_from(db, names, infos))
    return out


def uuid_now(client: SyncClient, ns: Namespace) -> bytes | None:
    """The UUID of the collection named ``ns`` on the source now (None: none there)."""
    return uuids_now(client, (ns,))[ns]


def has_history(client: SyncClient) -> bool:
    """Does the source keep the history of its changes (a replica set, a mongos; not a standalone)?"""
    return kind_of(client.admin.command("hello")) != "standalone"


def moved_since(client: SyncClient, s: Settings, since: Timestamp, namespaces: Collection[Namespace]) -> list[str]:
    """The renames and drops since ``since`` that touched any of ``namespaces``, said as ``op ns`` (none
    known on a standalone: it keeps no history, and nothing can follow a collection there)."""
    if not has_history(client):
        return []
    return [
        f"{change.get('operationType')} {_namespace(change.get('ns'))}"
        for change in Moves(client, s, since).read()
        if any(followed(ns, change) != ns for ns in namespaces)
    ]


class Whereabouts:
    """Where a planned collection is: its planned name while that holds its UUID, else followed through
    the source's :class:`Moves` since the snapshot's time."""

    def __init__(self, client: SyncClient, s: Settings, planned: Namespace, uuid: bytes, since: Timestamp) -> None:
        self._client = client
        self._s = s
        self._since = since
        self.name: Namespace | None = planned
        self._uuid: bytes | None = uuid  # the UUID the collection has under ``name``
        self._moves: Moves | None = None

    def holds(self) -> bool:
        """Does :attr:`name` still hold the collection (no rename or drop touched it since it was found)?"""
        return self.name is not None and uuid_now(self._client, self.name) == self._uuid

    def follow(self) -> Namespace | None:
        """Where the collection is now, after the renames and drops the source made (None: gone). On a
        standalone, which keeps no history to follow it through, its name: read as it is there."""
        if self._moves is None:
            if not has_history(self._client):
                self._uuid = uuid_now(self._client, self.name) if self.name is not None else None
                return self.name
            self._moves = Moves(self._client, self._s, self._since)
        while True:
            for change in self._moves.read():
                self.name = followed(self.name, change)
            if self.name is None:
                return None
            found = self.name
            self._uuid = uuid_now(self._client, found)
            for change in self._moves.read():  # moved again as its UUID was read: that UUID may be another's
                self.name = followed(self.name, change)
            if self.name == found:
                return found


def documents(
    client: SyncClient,
    s: Settings,
    plan: Partition,
    uuid: bytes | None,
    since: Timestamp | None,
    reads: SourceReads | None = None,
) -> Iterator[RawBSONDocument]:
    """A planned partition's documents, from wherever its collection is now (see the module's docstring);
    by its planned name alone where the plan has no UUID for it (a plan made before they were kept, a
    collection whose server reports none) or no read time. ``reads``: where they are read, from when (the
    snapshot's time) and how fast (see replicator.source.reads)."""
    reads = reads if reads is not None else SourceReads()
    with reads.sync_session(client) as session:
        yield from _documents(client, s, plan, uuid, since, reads, session)


def _documents(
    client: SyncClient,
    s: Settings,
    plan: Partition,
    uuid: bytes | None,
    since: Timestamp | None,
    reads: SourceReads,
    session: ClientSession | None,
) -> Iterator[RawBSONDocument]:
    batch = reads.chunk(s.batch_docs)
    if uuid is None or since is None:
        cursor = _find(client, plan.ns, plan, None, batch, reads, session)
        try:
            yield from _paced(cursor, reads, batch)
        finally:
            cursor.close()
        return
    where = Whereabouts(client, s, plan.ns, uuid, since)
    last: Resume | None = None
    read = 0
    ns: Namespace | None = plan.ns
    while ns is not None:
        cursor = _find(client, ns, plan, last, batch, reads, session)
        paced = _paced(cursor, reads, batch)
        try:
            first = next(paced, None)  # the find's reply: from our collection if the name still holds it
            if where.holds():
                while first is not None:
                    yield first
                    read += 1
                    if plan.resumable:
                        last = Resume(first["_id"])
                    first = next(paced, None)
                return  # a rename or drop during the read would have killed the cursor
        except OperationFailure:
            if where.holds():
                raise  # not a rename's or a drop's doing
        finally:
            cursor.close()
        ns = where.follow()
        if ns is not None and read and not plan.resumable:
            raise RuntimeError(
                f"{plan.ns} was renamed ({ns} now) while its partition {plan.id} was read, which cannot go "
                "on where it stopped (not read in _id order): the partition is to be read again"
            )


def _find(
    client: SyncClient,
    ns: Namespace,
    plan: Partition,
    after: Resume | None,
    batch: int,
    reads: SourceReads,
    session: ClientSession | None,
) -> Cursor[RawBSONDocument]:
    """A cursor over the partition's documents in collection ``ns`` (``after``: past that ``_id``)."""
    sort = [("_id", 1)] if plan.resumable else None
    coll = reads.sync_collection(client, ns)
    return coll.find(plan.find_filter(after), sort=sort, batch_size=batch, session=session)


def _paced(cursor: Iterator[RawBSONDocument], reads: SourceReads, chunk: int) -> Iterator[RawBSONDocument]:
    """The cursor's documents, ``chunk`` (its batch size: one reply) at a time once the bucket allows."""
    if reads.bucket is None:
        yield from cursor
        return
    while True:
        reads.sync_pace(chunk)
        got = 0
        for doc in itertools.islice(cursor, chunk):
            got += 1
            yield doc
        reads.unused(chunk - got)
        if got < chunk:
            return
