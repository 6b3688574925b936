"""How the source's collections are sharded, read through its mongos, for a sharded target to shard them alike.

``config.collections`` gives each sharded collection's key, ``unique`` and uuid (an entry marked
``dropped`` (before 5.0) or ``unsplittable`` (a tracked unsharded collection, 8.0) is not a sharded one);
``config.chunks`` gives its chunk bounds, by the collection's uuid from 5.0 (whose entries carry a
``timestamp``) and by namespace before. :func:`shard_spec` and :func:`with_sharding` are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import OperationFailure

from replicator.errors import ConfigError
from replicator.events import CollectionSpec, Namespace, ShardSpec
from replicator.settings.shard_target import ShardTargets
from replicator.source.connection import DICT_CODEC, Client, server_message

#: split points sent at most per collection: enough to spread the copy over the shards from its start
#: (the balancer splits and moves further); a source with more chunks gives every n-th bound
MOST_SPLITS = 1024
#: config.collections entries of sharded collections: not dropped (before 5.0), not tracked unsharded (8.0)
SHARDED = {"dropped": {"$ne": True}, "unsplittable": {"$ne": True}}


def is_mongos(client: Client) -> bool:
    """Is the (connected) client talking to a mongos?"""
    return any(d.server_type_name == "Mongos" for d in client.topology_description.server_descriptions().values())


async def read_sharding(
    client: Client, namespaces: Sequence[Namespace], *, bounds: bool = True
) -> dict[Namespace, ShardSpec]:
    """The sharded ones among the source's ``namespaces``, each with its key (and its chunk bounds)."""
    if not namespaces:
        return {}
    config = client.get_database("config", codec_options=DICT_CODEC)
    query = {"_id": {"$in": [str(ns) for ns in namespaces]}, **SHARDED}
    try:
        entries = await (config["collections"].find(query)).to_list()
        found: dict[Namespace, ShardSpec] = {}
        for entry in entries:
            lows = []
            if bounds:
                by = {"uuid": entry["uuid"]} if "timestamp" in entry and "uuid" in entry else {"ns": entry["_id"]}
                cursor = config["chunks"].find(by, {"min": 1, "_id": 0}).sort("min", 1)
                lows = [chunk["min"] for chunk in await cursor.to_list()]
            db, _, coll = str(entry["_id"]).partition(".")
            found[Namespace(db, coll)] = shard_spec(entry, lows)
    except OperationFailure as exc:
        raise ConfigError(
            f"source: reading config.collections and config.chunks (how the source is sharded, for the sharded "
            f"target) was refused: {server_message(exc)}; grant the source user clusterMonitor"
        ) from None
    return found


def shard_spec(entry: Mapping[str, Any], bounds: Sequence[Mapping[str, Any]]) -> ShardSpec:
    """A config.collections entry and its chunks' lower bounds as a ShardSpec: a hashed key keeps the
    number of chunks, a range key its bounds (the first chunk's MinKey bound left out), at most
    :data:`MOST_SPLITS` of them, evenly picked."""
    key = dict(entry["key"])
    spec = ShardSpec(key=key, unique=bool(entry.get("unique", False)), chunks=len(bounds))
    if spec.hashed:
        return spec
    points = [b for b in bounds if not any(isinstance(v, (MinKey, MaxKey)) for v in b.values())]
    if len(points) > MOST_SPLITS:
        step = len(points) / MOST_SPLITS
        points = [points[int(i * step)] for i in range(MOST_SPLITS)]
    return replace(spec, split_points=tuple(dict(p) for p in points))


def with_sharding(
    specs: Sequence[CollectionSpec], source: Mapping[Namespace, ShardSpec], declared: ShardTargets
) -> list[CollectionSpec]:
    """Each collection's spec with how its target is sharded: a --shard-target key when one matches its
    namespace, else its source's sharding (``source``, from :func:`read_sharding`). Views and time-series
    collections are left as they are."""
    out = []
    for spec in specs:
        if spec.kind != "collection":
            out.append(spec)
            continue
        key = declared(spec.ns)
        shard = ShardSpec(key=dict(key), declared=True) if key is not None else source.get(spec.ns)
        out.append(replace(spec, shard=shard) if shard is not None else spec)
    return out


async def shard_specs(
    client: Client, specs: Sequence[CollectionSpec], rules: Sequence[str], *, target_shards: bool
) -> list[CollectionSpec]:
    """``specs`` with how a target shards them: --shard-target's ``rules``, and (``target_shards``: the
    target is a sharded cluster) the source's sharding, read through its mongos."""
    if not (target_shards or rules):
        return list(specs)
    collections = [x.ns for x in specs if x.kind == "collection"]
    source = await read_sharding(client, collections) if target_shards and is_mongos(client) else {}
    return with_sharding(specs, source, ShardTargets.from_rules(rules))


async def with_shard_keys(client: Client, specs: Sequence[CollectionSpec]) -> list[CollectionSpec]:
    """``specs`` of a mongos's collections with their shard keys (no chunk bounds), so that a comparison
    knows the index a target's key needs for its own; as they are on another deployment, or where
    config.collections may not be read (the index then shows as a difference: never a difference missed)."""
    if not is_mongos(client):
        return list(specs)
    try:
        found = await read_sharding(client, [s.ns for s in specs if s.kind == "collection"], bounds=False)
    except ConfigError:
        return list(specs)
    return [replace(spec, shard=found[spec.ns]) if spec.ns in found else spec for spec in specs]
