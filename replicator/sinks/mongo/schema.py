"""Schema on a MongoDB target: collections with their options, views, indexes, and replayed DDL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import bson
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure, WriteConcernError

from replicator.errors import SinkError
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op
from replicator.settings.selection import Scope
from replicator.sinks.mongo.concern import check_reply, concern_failed, with_concern
from replicator.sinks.mongo.sharding import same_key
from replicator.sinks.mongo.ttl import COLLECTION, Held, held_index, held_options
from replicator.source.catalog import clean_index, clean_options
from replicator.source.connection import DICT_CODEC, server_message
from replicator.source.privileges import UNAUTHORIZED, command_refusal

log = logging.getLogger("mcdc.sink.mongo")

NAMESPACE_EXISTS = 48
NAMESPACE_NOT_FOUND = 26
INDEX_NOT_FOUND = 27
INDEX_CONFLICTS = frozenset({85, 86})  # IndexOptionsConflict, IndexKeySpecsConflict
DUPLICATE_KEY = 11000
_ID_INDEX = "_id_"
#: the collection options collMod sets
_COLL_MOD = frozenset(
    {"validator", "validationLevel", "validationAction", "changeStreamPreAndPostImages", "expireAfterSeconds"}
)


def _encoded(options: Mapping[str, Any], key: str) -> bytes | None:
    return bson.encode({"v": options[key]}) if key in options else None


def same_index(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Index specs are equal when their BSON is: key order and value types matter."""
    if a is None or b is None:
        return a is b
    return bson.encode(a) == bson.encode(b)


def _create_command(ns: Namespace, options: Mapping[str, Any]) -> dict[str, Any]:
    cmd: dict[str, Any] = {"create": ns.coll}
    cmd.update(clean_options({k: v for k, v in options.items() if k not in ("idIndex", "viewPipeline")}))
    if "viewPipeline" in options:  # change events name a view's pipeline so
        cmd["pipeline"] = options["viewPipeline"]
    return cmd


class MongoSchema:
    """Creates and reconciles collections, views and indexes on the target, and replays DDL events."""

    def __init__(
        self, client: AsyncMongoClient[Any], *, index_concurrency: int = 4, scope: Scope | None = None
    ) -> None:
        """``scope``: the target namespaces DDL may touch (None: all, for callers that filtered already)."""
        self._client = client
        self._index_slots = asyncio.Semaphore(index_concurrency)
        self.scope = scope
        #: the TTLs this target holds, with the source's values (ttl.py)
        self.held = Held()

    def _held_index(self, ns: Namespace, spec: Mapping[str, Any]) -> dict[str, Any]:
        """An index spec as created on the target: a TTL held, its source's value recorded."""
        if "expireAfterSeconds" not in spec:
            return dict(spec)
        self.held.hold(str(ns), str(spec["name"]), spec["expireAfterSeconds"])
        return held_index(spec)

    async def create(self, ns: Namespace, options: Mapping[str, Any]) -> None:
        if "expireAfterSeconds" in options:  # a clustered collection's TTL
            self.held.hold(str(ns), COLLECTION, options["expireAfterSeconds"])
            options = held_options(options)
        try:
            await self._command(ns, ns.db, _create_command(ns, options))
        except OperationFailure as exc:
            if exc.code != NAMESPACE_EXISTS:
                raise

    async def has_data(self, ns: Namespace) -> bool:
        coll = self._client[ns.db][ns.coll or ""]
        return await coll.find_one({}, {"_id": 1}) is not None

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:
        """Collections first (with their options), then views in dependency order."""
        for spec in specs:
            if drop_existing:
                await self._client[spec.ns.db].drop_collection(spec.ns.coll or "")
                self.held.forget(str(spec.ns))
            if not spec.is_view:
                await self.create(spec.ns, spec.options)
        pending = [s for s in specs if s.is_view]
        while pending:  # a view on a view waits for the view it reads
            waiting = {str(v.ns) for v in pending}
            ready = [v for v in pending if f"{v.ns.db}.{v.options.get('viewOn')}" not in waiting] or pending
            for view in ready:
                await self.create(view.ns, view.options)
            pending = [v for v in pending if v not in ready]

    async def reconcile(self, spec: CollectionSpec) -> bool:
        """The collection's options and indexes made ``spec``'s, where its kind is and collMod can make its
        options so (byte for byte); False otherwise (only a new copy can change them all)."""
        if not await self.align_options(spec):
            return False
        if not spec.is_view:
            await self._reconcile_one(spec)
        return True

    async def _options(self, ns: Namespace) -> tuple[str, dict[str, Any]] | None:
        db = self._client.get_database(ns.db, codec_options=DICT_CODEC)
        infos = await (await db.list_collections(filter={"name": ns.coll})).to_list()
        return (infos[0].get("type", "collection"), clean_options(infos[0].get("options") or {})) if infos else None

    async def align_options(self, spec: CollectionSpec) -> bool:
        """Make the existing collection's options ``spec``'s, byte for byte, with collMod where only options
        it changes differ (a validator, change stream pre-images, a clustered collection's TTL). False when
        the collection is missing, of another kind, or only a new one can take the options."""
        found = await self._options(spec.ns)
        if found is None or found[0] != spec.kind:
            return False
        have, want = found[1], held_options(clean_options(spec.options))
        if bson.encode(have) == bson.encode(want):
            return True
        differ = {k for k in {**have, **want} if _encoded(have, k) != _encoded(want, k)}
        if spec.is_view or not differ <= _COLL_MOD or not differ <= set(want):
            return False
        await self._command(spec.ns, spec.ns.db, {"collMod": spec.ns.coll, **{k: want[k] for k in sorted(differ)}})
        found = await self._options(spec.ns)
        return found is not None and bson.encode(found[1]) == bson.encode(want)

    async def reconcile_indexes(self, specs: Sequence[CollectionSpec]) -> None:
        """Make each target collection's indexes match the spec: build missing ones (all of a
        collection's in one createIndexes, so the server scans once), rebuild changed ones, drop extra."""
        await asyncio.gather(*(self._reconcile_one(s) for s in specs if not s.is_view))

    async def _reconcile_one(self, spec: CollectionSpec) -> None:
        async with self._index_slots:
            coll = self._client[spec.ns.db].get_collection(spec.ns.coll or "", codec_options=DICT_CODEC)
            current = {ix["name"]: clean_index(ix) for ix in await (await coll.list_indexes()).to_list()}
            wanted = {ix["name"]: held_index(ix) for ix in spec.indexes}
            shard_key = spec.shard.key if spec.shard is not None and spec.shard.key else None
            for name, ix in current.items():
                if shard_key is not None and name not in wanted and same_key(ix["key"], shard_key):
                    continue  # the index a sharded collection's key needs (built by shardCollection)
                if name != _ID_INDEX and not same_index(wanted.get(name), ix):
                    await coll.drop_index(name)
            missing = [ix for name, ix in wanted.items() if name != _ID_INDEX and not same_index(current.get(name), ix)]
            if missing:
                await self._create_indexes(spec.ns, missing)
            for source_ix in spec.indexes:  # the source's value of each TTL held, built now or before
                self._held_index(spec.ns, source_ix)

    async def create_indexes(self, ns: Namespace, indexes: Sequence[Mapping[str, Any]]) -> None:
        """The source's indexes on the target, TTLs held."""
        await self._create_indexes(ns, [self._held_index(ns, clean_index(ix)) for ix in indexes])

    async def _create_indexes(self, ns: Namespace, specs: Sequence[dict[str, Any]]) -> None:
        db = self._client[ns.db]
        try:
            await self._command(ns, ns.db, {"createIndexes": ns.coll, "indexes": specs})
            return
        except OperationFailure as exc:
            if len(specs) == 1 and exc.code == DUPLICATE_KEY and specs[0].get("unique"):
                raise SinkError(
                    f"target: the unique index {specs[0].get('name')} on {ns} cannot be built: its key repeats in "
                    f"the target's documents ({server_message(exc)}), which the source's do not; the target "
                    "no longer holds what the source does (a field rule on the index's field?)"
                ) from None
            if len(specs) == 1 and exc.code not in INDEX_CONFLICTS:
                log.warning("index %s on %s not created: %s", specs[0].get("name"), ns, exc.details or exc)
                return
            if len(specs) == 1:  # same name, other definition: the source's newer definition wins
                await db[ns.coll or ""].drop_index(specs[0]["name"])
                await self._command(ns, ns.db, {"createIndexes": ns.coll, "indexes": specs})
                return
        for spec in specs:  # one failed: build them one by one so the others still exist
            await self._create_indexes(ns, [spec])

    async def apply(self, event: ChangeEvent) -> None:
        """Replay one DDL event idempotently (replaying it twice leaves the same state). DDL on a
        namespace outside the scope is refused with a warning: it is never ours to change."""
        ns, ddl = event.ns, event.ddl or {}
        db = self._client[ns.db]
        outside = self.scope.outside(event) if self.scope is not None else None
        if outside is not None:
            log.warning("not replaying %s: %s is outside the selection's target namespaces", event.op.value, outside)
            return
        try:
            if event.op is Op.CREATE:
                await self.create(ns, ddl)
            elif event.op is Op.DROP:
                await db.drop_collection(ns.coll or "")
                self.held.forget(str(ns))
            elif event.op is Op.DROP_DATABASE:
                await self._drop_database((event.origin or ns).db, ns.db)
                self.held.forget_database(ns.db)
            elif event.op is Op.RENAME and event.to is not None:
                await self._command(ns, "admin", {"renameCollection": str(ns), "to": str(event.to), "dropTarget": True})
                self.held.moved(str(ns), str(event.to))
            elif event.op is Op.CREATE_INDEXES:
                await self.create_indexes(ns, ddl.get("indexes") or [])
            elif event.op is Op.DROP_INDEXES:
                for ix in ddl.get("indexes") or []:
                    await self._drop_index(ns, ix["name"])
                    self.held.forget(str(ns), str(ix["name"]))
            elif event.op is Op.MODIFY:
                await self._coll_mod(ns, ddl)
        except WriteConcernError as exc:  # from the driver's drop helpers
            raise concern_failed(ns, exc.details or {}) from None
        except OperationFailure as exc:
            if exc.code != NAMESPACE_NOT_FOUND:
                raise

    async def _command(self, ns: Namespace, db: str, command: dict[str, Any]) -> None:
        """A schema command on ``db`` (about ``ns``), with the client's write concern, as the driver's own
        helpers send theirs (see .concern)."""
        reply = await self._client[db].command(
            with_concern(command, self._client.write_concern), codec_options=DICT_CODEC
        )
        check_reply(ns, reply)

    async def _drop_database(self, source_db: str, name: str) -> None:
        """A source database was dropped: drop what the selection mapped from it, never the whole
        target database (it may hold collections that are not ours)."""
        if self.scope is None:
            await self._client.drop_database(name)
            return
        names = await self._client[name].list_collection_names()
        for ns in self.scope.database_drops(source_db, name, names):
            await self._client[name].drop_collection(ns.coll or "")

    async def _drop_index(self, ns: Namespace, name: str) -> None:
        try:
            await self._client[ns.db][ns.coll or ""].drop_index(name)
        except OperationFailure as exc:
            if exc.code not in (INDEX_NOT_FOUND, NAMESPACE_NOT_FOUND):
                raise

    async def _held_coll_mod(self, ns: Namespace, ddl: Mapping[str, Any]) -> Mapping[str, Any]:
        """A collMod as the target takes it: a TTL it sets held there, and recorded as the source's."""
        index = ddl.get("index")
        if isinstance(index, Mapping) and "expireAfterSeconds" in index:
            name = index.get("name")
            if name is None:  # named by its key: the target's index of that key
                coll = self._client[ns.db].get_collection(ns.coll or "", codec_options=DICT_CODEC)
                found = [
                    ix for ix in await (await coll.list_indexes()).to_list() if same_key(ix["key"], index["keyPattern"])
                ]
                name = found[0]["name"] if found else None
            if name is not None:
                self.held.hold(str(ns), str(name), index["expireAfterSeconds"])
            ddl = {**ddl, "index": held_index(index)}
        if "expireAfterSeconds" in ddl:
            self.held.hold(str(ns), COLLECTION, ddl["expireAfterSeconds"])
            ddl = held_options(ddl)
        return ddl

    async def _coll_mod(self, ns: Namespace, ddl: Mapping[str, Any]) -> None:
        ddl = await self._held_coll_mod(ns, ddl)
        cmd: dict[str, Any] = {"collMod": ns.coll}
        cmd.update({k: v for k, v in ddl.items() if k not in ("viewOn", "viewPipeline")})
        if "viewPipeline" in ddl:
            cmd.update(viewOn=ddl.get("viewOn"), pipeline=ddl["viewPipeline"])
        try:
            await self._command(ns, ns.db, cmd)
        except OperationFailure as exc:
            if exc.code == NAMESPACE_NOT_FOUND:
                raise
            if exc.code == UNAUTHORIZED:
                log.warning("collMod on %s not replayed: %s", ns, command_refusal("target", "collMod", ns.db))
                return
            log.warning("collMod on %s not replayed: %s", ns, exc.details or exc)
