"""A MongoDB target's TTLs held still while a migration writes it, as mongosync and Percona ClusterSync do.

A TTL index (``expireAfterSeconds``) or a clustered collection's TTL makes the target's own TTL monitor
delete documents on the target's clock, whatever the source says: between two runs of a cron migration,
documents the source keeps alive (the application refreshed them, the target not told yet) are deleted
on the target, and a verify or a cutover's proof compares against a target that changed on its own.

So every TTL mcdc creates or changes on the target gets :data:`HOLD`, MongoDB's largest
``expireAfterSeconds``, and the source's value is recorded (:class:`Held`, in the checkpoint): the
source's own TTL deletes reach the target as change events, as every delete does. A collMod of a TTL on
the source updates the record, not the target. ``mcdc cutover`` restores the source's values once it has
proven the target (:func:`restore`); so does ``mcdc cutover --release-only`` for a migration abandoned
rather than cut over. Until then, verify takes a held value for the source's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pymongo.errors import OperationFailure

from replicator.errors import ConfigError, SinkError
from replicator.events import Namespace
from replicator.sinks.mongo.concern import check_reply, with_concern
from replicator.source.connection import DICT_CODEC, Client, server_message
from replicator.source.privileges import UNAUTHORIZED, command_refusal

#: MongoDB's largest expireAfterSeconds (a 32-bit int): a document would expire in 68 years
HOLD = 2_147_483_647
#: the key of a clustered collection's own TTL in a namespace's record (index names are never empty)
COLLECTION = ""
_TTL = "expireAfterSeconds"


def is_held(value: Any) -> bool:
    return type(value) is int and value == HOLD


def held_index(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An index spec as the target gets it: a TTL index's expireAfterSeconds held (in its place)."""
    return {k: (HOLD if k == _TTL else v) for k, v in spec.items()}


def held_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Collection options as the target gets them: a clustered collection's TTL held."""
    return {k: (HOLD if k == _TTL else v) for k, v in options.items()}


def as_source(found: Mapping[str, Any], want: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A target's index spec or options with a held TTL taken for ``want``'s (the source's) value, where
    the source has one: what verify compares while a migration holds the target's TTLs."""
    if want is None or _TTL not in want or not is_held(found.get(_TTL)):
        return found
    return {k: (want[_TTL] if k == _TTL else v) for k, v in found.items()}


class Held:
    """The source's TTL values behind what the target holds: ``{"db.coll": {index name or "": seconds}}``."""

    def __init__(self, record: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.record: dict[str, dict[str, Any]] = {ns: dict(v) for ns, v in (record or {}).items()}

    def __bool__(self) -> bool:
        return any(self.record.values())

    def hold(self, ns: str, name: str, seconds: Any) -> None:
        self.record.setdefault(ns, {})[name] = seconds

    def forget(self, ns: str, name: str | None = None) -> None:
        """An index (or, ``name`` None, the whole collection) is gone from the target."""
        if name is None:
            self.record.pop(ns, None)
        elif ns in self.record:
            self.record[ns].pop(name, None)
            if not self.record[ns]:
                del self.record[ns]

    def moved(self, ns: str, to: str) -> None:
        if ns in self.record:
            self.record[to] = self.record.pop(ns)

    def forget_database(self, db: str) -> None:
        for ns in [ns for ns in self.record if ns.partition(".")[0] == db]:
            del self.record[ns]

    def lines(self) -> list[str]:
        """Each held TTL, for status: ``db.coll index NAME: 120 s on the source``."""
        out = []
        for ns in sorted(self.record):
            for name, seconds in sorted(self.record[ns].items()):
                what = "the collection's TTL" if name == COLLECTION else f"index {name}"
                out.append(f"{ns} {what}: {seconds} s on the source, held at {HOLD} on the target")
        return out

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {ns: {name: _plain(v) for name, v in names.items()} for ns, names in self.record.items() if names}


def _plain(value: Any) -> Any:
    return int(value) if isinstance(value, int) else float(value)


async def hold_existing(client: Client, namespaces: Sequence[Namespace], held: Held) -> None:
    """Hold the TTLs these target namespaces have now (the old side's, when a way back first writes it; an
    older mcdc's target), recording their values as the source's."""
    for ns in namespaces:
        db = client.get_database(ns.db, codec_options=DICT_CODEC)
        infos = await (await db.list_collections(filter={"name": ns.coll})).to_list()
        if not infos or infos[0].get("type", "collection") != "collection":
            continue
        seconds = (infos[0].get("options") or {}).get(_TTL)
        if seconds is not None and not is_held(seconds):
            await _coll_mod(client, ns, {_TTL: HOLD})
            held.hold(str(ns), COLLECTION, seconds)
        for index in await (await db[ns.coll or ""].list_indexes()).to_list():
            if _TTL in index and not is_held(index[_TTL]):
                await _coll_mod(client, ns, {"index": {"name": index["name"], _TTL: HOLD}})
                held.hold(str(ns), str(index["name"]), index[_TTL])


async def restore(client: Client, namespaces: Sequence[Namespace], values: Held) -> list[str]:
    """Give each held TTL of these target namespaces its value in ``values`` (the source's), as a cutover
    does once it proved the target. Idempotent: a run cut short goes on where it stopped. Returns what it
    restored; raises ConfigError naming a held TTL whose value nobody knows."""
    done: list[str] = []
    for ns in namespaces:
        db = client.get_database(ns.db, codec_options=DICT_CODEC)
        infos = await (await db.list_collections(filter={"name": ns.coll})).to_list()
        if not infos or infos[0].get("type", "collection") != "collection":
            continue
        known = values.record.get(str(ns), {})
        if is_held((infos[0].get("options") or {}).get(_TTL)):
            await _coll_mod(client, ns, {_TTL: _known(known, ns, COLLECTION)})
            done.append(f"{ns} (the collection's TTL)")
        for index in await (await db[ns.coll or ""].list_indexes()).to_list():
            if is_held(index.get(_TTL)):
                name = str(index["name"])
                await _coll_mod(client, ns, {"index": {"name": name, _TTL: _known(known, ns, name)}})
                done.append(f"{ns} index {name}")
    return done


def _known(known: Mapping[str, Any], ns: Namespace, name: str) -> Any:
    if name not in known:
        what = "its TTL" if name == COLLECTION else f"index {name}'s TTL"
        raise ConfigError(
            f"target: {ns} holds {what} at {HOLD} s and neither the source nor the checkpoint says its value: "
            f"set it with collMod (expireAfterSeconds) on the target"
        )
    return known[name]


async def _coll_mod(client: Client, ns: Namespace, change: Mapping[str, Any]) -> None:
    db = client.get_database(ns.db, codec_options=DICT_CODEC)
    try:
        check_reply(ns, await db.command(with_concern({"collMod": ns.coll, **change}, client.write_concern)))
    except OperationFailure as exc:
        if exc.code == UNAUTHORIZED:
            raise ConfigError(command_refusal("target", "collMod", ns.db)) from None
        raise SinkError(
            f"target: {ns} refused the collMod of a held TTL ({server_message(exc)}): run cutover again, it "
            "gives back what is still held"
        ) from None
