"""Sharding target collections on a mongos before a snapshot copies into them.

The commands are :func:`shard_command` and :func:`split_commands`' (pure); :class:`TargetSharding` sends
them and reads the target's ``config.collections``:

* ``enableSharding`` first: MongoDB before 6.0 requires it, later ones take it as a no-op;
* the source's own index on the shard key (its name and options) is built first, so the key's index is
  the source's; on an empty collection without one, ``shardCollection`` builds it;
* ``shardCollection`` with the key, ``unique``, and ``collation: {locale: "simple"}`` when the collection
  has another default collation (MongoDB requires it then); a hashed key first in the key takes
  ``numInitialChunks`` (the source's chunk count; MongoDB 7.2 and later ignore it and spread the chunks
  themselves), a range key is split at the source's chunk bounds (``split`` with ``middle``);
* a collection already sharded on the same key is left as it is (a run that stopped between sharding and
  copying goes on), on another key refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import bson
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure

from replicator.bsonkit.extjson import to_json_value
from replicator.errors import ConfigError, SinkError
from replicator.events import CollectionSpec, Namespace, ShardSpec
from replicator.source.connection import DICT_CODEC, server_message
from replicator.source.privileges import Grants, Need, refusal
from replicator.source.sharding import SHARDED

log = logging.getLogger("mcdc.sink.mongo")

ALREADY_INITIALIZED = 23
UNAUTHORIZED = 13
#: numInitialChunks must give fewer than 8192 chunks per shard (there is one shard at least)
MOST_INITIAL_CHUNKS = 8191
#: MongoDB 7.2's wire version: numInitialChunks is ignored from then on
_IGNORES_INITIAL_CHUNKS = 23


def key_text(key: Mapping[str, Any]) -> str:
    """A shard key as the user writes it: {"region": 1, "_id": "hashed"}."""
    return json.dumps(to_json_value(dict(key), relaxed=True))


def same_key(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Shard keys are the same when their BSON is (field order matters; 1 and 1.0 are one)."""

    def norm(key: Mapping[str, Any]) -> bytes:
        return bson.encode({k: (1 if v == 1 else v) for k, v in key.items()})

    return norm(a) == norm(b)


def non_simple_collation(options: Mapping[str, Any]) -> bool:
    collation = options.get("collation")
    return isinstance(collation, Mapping) and collation.get("locale") not in (None, "simple")


def shard_command(ns: Namespace, spec: ShardSpec, options: Mapping[str, Any], wire_version: int) -> dict[str, Any]:
    """The ``shardCollection`` of target ``ns`` (created with ``options``) for a server of ``wire_version``."""
    command: dict[str, Any] = {"shardCollection": str(ns), "key": dict(spec.key)}
    if spec.unique:
        command["unique"] = True
    if non_simple_collation(options):
        command["collation"] = {"locale": "simple"}
    first = next(iter(spec.key.values()), None)
    if first == "hashed" and spec.chunks > 1 and wire_version < _IGNORES_INITIAL_CHUNKS:
        command["numInitialChunks"] = min(spec.chunks, MOST_INITIAL_CHUNKS)
    return command


def split_commands(ns: Namespace, spec: ShardSpec) -> list[dict[str, Any]]:
    """A range key's ``split`` at each of the source's chunk bounds (a hashed key's are not values of it)."""
    if spec.hashed:
        return []
    return [{"split": str(ns), "middle": dict(point)} for point in spec.split_points]


def key_index(spec: CollectionSpec) -> Mapping[str, Any] | None:
    """The source's index on the target's shard key, when it has one."""
    if spec.shard is None:
        return None
    return next((ix for ix in spec.indexes if ix.get("name") != "_id_" and same_key(ix["key"], spec.shard.key)), None)


def lacking(granted: Grants | None, specs: Sequence[CollectionSpec]) -> str | None:
    """The first privilege sharding ``specs`` on the target takes that ``granted`` leaves out, in one line
    with the role to grant (clusterManager); None when they cover it, or the server does not say.
    ``enableSharding`` (which shardCollection takes too) is granted on the cluster or on a database,
    ``splitChunk`` on a database."""
    if granted is None:
        return None
    wanted = [s for s in specs if s.shard is not None and s.shard.key]
    role = "clusterManager"
    for db in sorted({s.ns.db for s in wanted}):
        if not (granted.allows("enableSharding", None) or granted.allows("enableSharding", db)):
            need = Need("enableSharding", db, f"shard collections of {db} (enableSharding, shardCollection)", role)
            return refusal("target", granted.user, need)
    for spec in wanted:
        assert spec.shard is not None
        if split_commands(spec.ns, spec.shard) and not granted.allows("splitChunk", spec.ns.db, spec.ns.coll or ""):
            need = Need("splitChunk", spec.ns.db, f"split {spec.ns} at the source's chunk bounds (split)", role)
            return refusal("target", granted.user, need)
    return None


class TargetSharding:
    """Shards a MongoDB target's collections (see the module's docstring)."""

    def __init__(self, client: AsyncMongoClient[Any], wire_version: int) -> None:
        self._client = client
        self._wire = wire_version

    async def sharded(self, namespaces: Sequence[Namespace]) -> dict[Namespace, Mapping[str, Any]]:
        """The target's config.collections entries of those of ``namespaces`` that are sharded."""
        if not namespaces:
            return {}
        config = self._client.get_database("config", codec_options=DICT_CODEC)
        query = {"_id": {"$in": [str(ns) for ns in namespaces]}, **SHARDED}
        try:
            entries = await config["collections"].find(query).to_list()
        except OperationFailure as exc:
            raise self._refused("reading config.collections", exc) from None
        out = {}
        for entry in entries:
            db, _, coll = str(entry["_id"]).partition(".")
            out[Namespace(db, coll)] = entry
        return out

    async def existing(self, namespaces: Sequence[Namespace]) -> set[Namespace]:
        """Which of ``namespaces`` exist on the target."""
        found: set[Namespace] = set()
        for db in sorted({ns.db for ns in namespaces}):
            names = set(await self._client[db].list_collection_names())
            found.update(ns for ns in namespaces if ns.db == db and ns.coll in names)
        return found

    async def unfit(self, specs: Sequence[CollectionSpec]) -> str | None:
        """Why these target collections cannot be written as they stand, in one line: one that exists
        unsharded while its source is sharded, or one sharded on another key than the one it is to have."""
        wanted = [s for s in specs if s.shard is not None and s.shard.key]
        if not wanted:
            return None
        sharded = await self.sharded([s.ns for s in wanted])
        exists = await self.existing([s.ns for s in wanted if s.ns not in sharded])
        for spec in wanted:
            assert spec.shard is not None
            key = key_text(spec.shard.key)
            entry = sharded.get(spec.ns)
            if entry is not None and not same_key(entry.get("key") or {}, spec.shard.key):
                return (
                    f"target collection {spec.ns} is sharded on {key_text(entry.get('key') or {})}, not on {key}: "
                    f"drop it (or pass --drop-target), or pass --shard-target with '{{}}' for it to write into it "
                    "as it is"
                )
            if entry is None and spec.ns in exists and not spec.shard.declared:
                return (
                    f"target collection {spec.ns} exists unsharded, and its source is sharded on {key}: drop it "
                    "(or pass --drop-target), or pass --shard-target for it (a KEY shards it, '{}' writes into "
                    "it unsharded)"
                )
        return None

    async def shard(self, specs: Sequence[CollectionSpec]) -> None:
        """Shard every collection of ``specs`` that has a key, before anything is copied into it."""
        wanted = [s for s in specs if s.shard is not None and s.shard.key]
        if not wanted:
            return
        sharded = await self.sharded([s.ns for s in wanted])
        enabled: set[str] = set()
        for spec in wanted:
            assert spec.shard is not None
            entry = sharded.get(spec.ns)
            if entry is None:
                if spec.ns.db not in enabled:
                    await self._enable(spec.ns.db)
                    enabled.add(spec.ns.db)
                await self._shard_one(spec)
            elif not same_key(entry.get("key") or {}, spec.shard.key):
                raise ConfigError(
                    f"target collection {spec.ns} is sharded on {key_text(entry.get('key') or {})}, not on "
                    f"{key_text(spec.shard.key)}: drop it (or pass --drop-target)"
                )
            await self._split(spec.ns, spec.shard)

    async def _enable(self, db: str) -> None:
        try:
            await self._client.admin.command({"enableSharding": db}, codec_options=DICT_CODEC)
        except OperationFailure as exc:
            if exc.code != ALREADY_INITIALIZED:  # "already enabled" (before 4.2)
                raise self._refused(f"enableSharding {db}", exc) from None

    async def _shard_one(self, spec: CollectionSpec) -> None:
        assert spec.shard is not None
        index = key_index(spec)
        if index is not None:  # the source's own index on the key, before shardCollection builds its own
            command = {"createIndexes": spec.ns.coll, "indexes": [dict(index)]}
            try:
                await self._client[spec.ns.db].command(command, codec_options=DICT_CODEC)
            except OperationFailure as exc:
                log.warning("index %s on %s not created before sharding it: %s", index.get("name"), spec.ns, exc)
        command = shard_command(spec.ns, spec.shard, spec.options, self._wire)
        try:
            await self._client.admin.command(command, codec_options=DICT_CODEC)
        except OperationFailure as exc:
            if exc.code == ALREADY_INITIALIZED:  # sharded meanwhile: fine when on this key
                entry = (await self.sharded([spec.ns])).get(spec.ns)
                if entry is not None and same_key(entry.get("key") or {}, spec.shard.key):
                    return
            raise self._refused(f"shardCollection {spec.ns} on {key_text(spec.shard.key)}", exc) from None
        log.info("sharded %s on %s", spec.ns, key_text(spec.shard.key))

    async def _split(self, ns: Namespace, spec: ShardSpec) -> None:
        """Pre-split at the source's bounds. A split that fails (a bound that is one already) leaves the
        collection as it is: the balancer splits it further as data arrives."""
        failed = 0
        commands = split_commands(ns, spec)
        for command in commands:
            try:
                await self._client.admin.command(command, codec_options=DICT_CODEC)
            except OperationFailure as exc:
                if exc.code == UNAUTHORIZED:
                    raise self._refused(f"split {ns}", exc) from None
                failed += 1
        if failed:
            log.warning("%s: %d of %d pre-splits at the source's chunk bounds failed", ns, failed, len(commands))

    @staticmethod
    def _refused(what: str, exc: OperationFailure) -> Exception:
        if exc.code == UNAUTHORIZED:
            message = f"target: {what} was refused ({server_message(exc)}): grant the target user clusterManager"
            return ConfigError(message)
        return SinkError(f"target: {what} failed: {server_message(exc)}")
