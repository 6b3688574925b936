"""The source catalog: selected collections and views with their options and indexes."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from replicator.errors import ConfigError, quoted
from replicator.events import CollectionSpec, Namespace
from replicator.observe.tally import listing
from replicator.settings.selection import Selection
from replicator.settings.unmatched import near
from replicator.source.connection import DICT_CODEC

#: listIndexes fields the server assigns; everything else is the index's definition.
_SERVER_INDEX_FIELDS = ("v", "ns")


def clean_index(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in _SERVER_INDEX_FIELDS}


def clean_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as create() takes them back (clusteredIndex comes back with a version field)."""
    out = dict(options)
    clustered = out.get("clusteredIndex")
    if isinstance(clustered, Mapping):
        out["clusteredIndex"] = {k: v for k, v in clustered.items() if k != "v"}
    return out


async def list_databases(client: AsyncMongoClient[Any], selection: Selection) -> list[str]:
    """The source's databases that ``selection`` may select. When its --include patterns name their
    databases literally, those, without asking the server: listDatabases is a cluster-wide privilege.
    Otherwise listDatabases with ``authorizedDatabases``, which a user without that privilege may run
    too: MongoDB then answers with the databases the user may read."""
    named = selection.databases()
    if named is not None:
        return list(named)
    cursor = await client.list_databases(nameOnly=True, authorizedDatabases=True)
    names = [info["name"] for info in await cursor.to_list()]
    return sorted(n for n in names if selection.database(n))


async def list_namespaces(client: AsyncMongoClient[Any], within: Selection | None = None) -> list[Namespace]:
    """Every collection and view of every user database, selected or not (``system.*`` left out); only
    of the databases ``within`` names literally, when it does (see :func:`list_databases`)."""
    return list(await list_kinds(client, within))


async def list_kinds(client: AsyncMongoClient[Any], within: Selection | None = None) -> dict[Namespace, str]:
    """:func:`list_namespaces` with each one's kind ("collection", "view", "timeseries"), from the same
    name-only listing."""
    out: dict[Namespace, str] = {}
    for db_name in await list_databases(client, within or Selection()):
        cursor = await client[db_name].list_collections(nameOnly=True)
        for info in await cursor.to_list():
            name = str(info["name"])
            if not name.startswith("system."):
                out[Namespace(db_name, name)] = str(info.get("type") or "collection")
    return out


def refuse_unfollowed(kinds: Mapping[Namespace, str], selection: Selection, command: str) -> None:
    """Refuse to follow a selection that holds a time-series collection: MongoDB's change streams report
    no write to one (its writes change its system.buckets collection, which they leave out), so ``command``
    would copy it and then silently fall behind. It can be copied once its writes have stopped."""
    unfollowed = sorted((ns for ns, kind in kinds.items() if kind == "timeseries" and selection(ns)), key=str)
    if not unfollowed:
        return
    one = len(unfollowed) == 1
    patterns = " ".join(f"--exclude {quoted(re.escape(str(ns)))}" for ns in unfollowed[:5])
    includes = " ".join(f"--include {quoted(re.escape(str(ns)))}" for ns in unfollowed[:5])
    what = "is a time-series collection" if one else "are time-series collections"
    raise ConfigError(
        f"source: {listing(unfollowed, 5)} {what}, whose writes MongoDB's change streams do not report: mcdc "
        f"{command} cannot follow {'it' if one else 'them'}, refused. Leave {'it' if one else 'them'} out "
        f"({patterns}) and copy {'it' if one else 'them'} once the writes have stopped (mcdc sync "
        f"--snapshot-only {includes}, with a checkpoint of its own)"
    )


def unmatched(selection: Selection, namespaces: Sequence[Namespace]) -> str | None:
    """What of ``selection`` matches nothing among the source's ``namespaces`` (from
    :func:`list_namespaces`), said in one line; None when it selects something and each --include
    pattern matches a namespace. Pure, so every engine can ask it."""
    names = [str(ns) for ns in namespaces]
    for pattern in selection.include:
        if not any(pattern.fullmatch(name) for name in names):
            hint = near(pattern.pattern, names)
            return f"--include {quoted(pattern.pattern)} matches no namespace on the source{hint}"
    if any(selection(ns) for ns in namespaces):
        return None
    if not namespaces:
        return "the source holds no collection (admin, local, config and system.* are never copied)"
    return "--exclude leaves no namespace of the source selected"


async def describe(client: AsyncMongoClient[Any], selection: Selection) -> list[CollectionSpec]:
    """Every selected collection and view, collections first, in a stable order."""
    specs: list[CollectionSpec] = []
    for db_name in await list_databases(client, selection):
        db = client.get_database(db_name, codec_options=DICT_CODEC)
        cursor = await db.list_collections()
        for info in await cursor.to_list():
            ns = Namespace(db_name, info["name"])
            if selection(ns):
                specs.append(await _spec(db, ns, info))
    specs.sort(key=lambda s: (s.is_view, s.ns.db, s.ns.coll or ""))
    return specs


async def describe_one(client: AsyncMongoClient[Any], ns: Namespace) -> CollectionSpec | None:
    """The spec of one namespace, or None when it does not exist (anymore)."""
    db = client.get_database(ns.db, codec_options=DICT_CODEC)
    cursor = await db.list_collections(filter={"name": ns.coll})
    infos = await cursor.to_list()
    if not infos:
        return None
    return await _spec(db, ns, infos[0])


async def _spec(db: AsyncDatabase[Any], ns: Namespace, info: Mapping[str, Any]) -> CollectionSpec:
    kind = info.get("type", "collection")
    indexes: tuple[dict[str, Any], ...] = ()
    if kind != "view":
        index_cursor = await db[info["name"]].list_indexes()
        indexes = tuple(clean_index(ix) for ix in await index_cursor.to_list())
    return CollectionSpec(ns=ns, kind=kind, options=clean_options(info.get("options") or {}), indexes=indexes)
