"""What a run needs from each server's user, and which built-in role grants it: pure, no I/O.

A server answers ``{connectionStatus: 1, showPrivileges: true}`` with the user's roles and privileges
(:func:`grants_of`). :func:`source_needs` and :func:`target_needs` say which actions a run needs on which
resources; :func:`missing` keeps those the grants leave out, and :func:`refusal` says the first in one
line, with the built-in role to grant. A refusal the server makes later (an Unauthorized reply to a
command mcdc sends) is explained by :func:`advice` from the command's name and database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: MongoDB's error code for a command the user is not allowed to run.
UNAUTHORIZED = 13
#: Databases a privilege on "every database" ({db: "", collection: ""}) leaves out, as MongoDB's
#: readAnyDatabase does.
_SPECIAL_DATABASES = frozenset({"local", "config"})

_READ = frozenset({"find", "listCollections", "listIndexes", "changeStream", "collStats", "dbStats", "killCursors"})
_READ_WRITE = _READ | {
    "insert", "update", "remove", "createCollection", "createIndex", "dropIndex", "dropCollection",
    "renameCollectionSameDB", "convertToCapped",
}  # fmt: skip
_DB_ADMIN = frozenset({
    "bypassDocumentValidation", "collMod", "collStats", "convertToCapped", "createCollection", "createIndex",
    "dbStats", "dropCollection", "dropDatabase", "dropIndex", "listCollections", "listIndexes",
    "renameCollectionSameDB",
})  # fmt: skip
_CLUSTER_MONITOR = frozenset({
    "listDatabases", "serverStatus", "replSetGetConfig", "replSetGetStatus", "listShards", "getShardMap",
    "hostInfo",
})  # fmt: skip


@dataclass(frozen=True)
class Privilege:
    """Actions on a resource: a database and collection ("" for any), the cluster (``db`` None), or with
    ``anything`` every resource (``{anyResource: true}``: the cluster, local and config included)."""

    db: str | None
    coll: str
    actions: frozenset[str]
    anything: bool = False

    def covers(self, action: str, db: str | None, coll: str = "") -> bool:
        if action not in self.actions:
            return False
        if self.anything:
            return True
        if self.db is None or db is None:
            return self.db is None and db is None
        if self.db == "":  # every database but local and config, as MongoDB's "any normal resource"
            return db not in _SPECIAL_DATABASES and (self.coll == "" or self.coll == coll)
        return self.db == db and (self.coll == "" or self.coll == coll)


@dataclass(frozen=True)
class Grants:
    """What a user may do: ``everything`` for root, else its privileges."""

    user: str
    privileges: tuple[Privilege, ...] = ()
    everything: bool = False

    def allows(self, action: str, db: str | None, coll: str = "") -> bool:
        return self.everything or any(p.covers(action, db, coll) for p in self.privileges)


def _builtin(role: str, db: str) -> tuple[Privilege, ...] | None:
    """The privileges of MongoDB's built-in ``role`` granted on ``db`` (the ones mcdc needs; None for a
    role this table does not know: a custom role)."""
    if role in ("read", "readWrite", "dbAdmin", "dbOwner"):
        actions = {"read": _READ, "readWrite": _READ_WRITE, "dbAdmin": _DB_ADMIN, "dbOwner": _READ_WRITE | _DB_ADMIN}
        return (Privilege(db, "", actions[role]),)
    if db != "admin":
        return None
    cluster_wide = {
        "readAnyDatabase": (_READ, {"listDatabases"}),
        "readWriteAnyDatabase": (_READ_WRITE, {"listDatabases"}),
        "dbAdminAnyDatabase": (_DB_ADMIN, {"listDatabases"}),
        "clusterMonitor": (frozenset(), _CLUSTER_MONITOR),
        # sharding a collection and splitting its chunks take privileges on its database (SERVER-11343)
        "clusterManager": (
            frozenset({"enableSharding", "splitChunk"}),
            {"replSetGetConfig", "replSetGetStatus", "listShards"},
        ),
    }
    if role not in cluster_wide:
        return None
    on_data, on_cluster = cluster_wide[role]
    out = [Privilege(None, "", frozenset(on_cluster))]
    if on_data:
        out.append(Privilege("", "", on_data))
    return tuple(out)


def grants_of(reply: Mapping[str, Any]) -> Grants | None:
    """What a connectionStatus reply (with showPrivileges) says the user may do; None when it cannot tell:
    a server without authentication (no user), or one that lists a role it does not expand into
    privileges and this table does not know either (a custom role)."""
    info = reply.get("authInfo") or {}
    users = info.get("authenticatedUsers") or []
    if not users:
        return None
    user = str(users[0].get("user", ""))
    roles = [(str(r.get("role")), str(r.get("db"))) for r in info.get("authenticatedUserRoles") or []]
    if any(role in ("root", "__system") and db == "admin" for role, db in roles):
        return Grants(user, everything=True)
    listed = info.get("authenticatedUserPrivileges") or []
    if listed:
        return Grants(user, tuple(_privilege(p) for p in listed))
    privileges: list[Privilege] = []
    for role, db in roles:  # a server that names the roles only: expand the built-in ones
        known = _builtin(role, db)
        if known is None:
            return None
        privileges.extend(known)
    return Grants(user, tuple(privileges))


def _privilege(listed: Mapping[str, Any]) -> Privilege:
    resource = listed.get("resource") or {}
    actions = frozenset(str(a) for a in listed.get("actions") or [])
    if resource.get("anyResource"):
        return Privilege("", "", actions, anything=True)
    if resource.get("cluster"):
        return Privilege(None, "", actions)
    return Privilege(str(resource.get("db", "")), str(resource.get("collection", "")), actions)


#: What the deployment-wide change stream is, in a refusal.
_STREAM = "open a change stream on the whole deployment: changeStream on every database"


@dataclass(frozen=True)
class Need:
    """An action a run needs on a database (None: the cluster; "": every database), what it is for, and
    the built-in roles that grant it."""

    action: str
    db: str | None
    what: str
    roles: str


def source_needs(databases: Sequence[str] | None, *, stream: bool, stream_db: str | None = None) -> list[Need]:
    """What the source's user needs: read on each database the selection names (``databases``; None when
    it names none literally: then every database is read, and the stream's need covers it), and with
    ``stream`` (sync, catch-up and tail without --snapshot-only) a change stream: on the whole deployment,
    which MongoDB grants with find and changeStream on every database (readAnyDatabase), or with
    ``stream_db`` on that one database (read on it)."""
    needs: list[Need] = []
    if stream and stream_db is not None:
        grant = f"read on {stream_db}, or readAnyDatabase"
        needs += [
            Need("changeStream", stream_db, f"open a change stream on {stream_db}: changeStream on {stream_db}", grant),
            Need("find", stream_db, f"read the change events of {stream_db}: find on {stream_db}", grant),
        ]
    elif stream:
        grant = "readAnyDatabase"
        if databases is not None and len(databases) > 1:
            grant += ": read on a database is enough only for a selection of that database alone"
        needs += [
            Need("changeStream", "", _STREAM, grant),
            Need("find", "", "read the whole deployment's change events: find on every database", grant),
        ]
    for db in databases or ():
        for action in ("find", "listCollections", "listIndexes"):
            needs.append(Need(action, db, f"run {action} on {db}", f"read on {db}, or readAnyDatabase"))
    return needs


def stream_database(granted: Grants | None, databases: Sequence[str] | None) -> str | None:
    """The one database whose change stream (``db.watch``) a run follows instead of the deployment's: when
    the user may not open the deployment's, the selection names exactly one database literally, and the
    user may read that database's changes. None: the deployment's stream, the default (also for a server
    without authentication, and a user whose privileges cannot be judged)."""
    if granted is None or not missing(source_needs(None, stream=True), granted):
        return None
    if databases is None or len(databases) != 1:
        return None
    (db,) = databases
    return None if missing(source_needs(None, stream=True, stream_db=db), granted) else db


def target_needs(databases: Iterable[str]) -> list[Need]:
    """What a MongoDB target's user needs on each database it writes: readWrite."""
    actions = ("insert", "update", "remove", "find", "createCollection", "createIndex", "dropCollection")
    return [
        Need(action, db, f"run {action} on {db}", f"readWrite on {db}, or readWriteAnyDatabase")
        for db in sorted(set(databases))
        for action in actions
    ]


def missing(needs: Iterable[Need], grants: Grants) -> list[Need]:
    """The needs ``grants`` leave out, in order."""
    return [need for need in needs if not grants.allows(need.action, need.db)]


def refusal(side: str, user: str, need: Need) -> str:
    """One line: the side, the user, what it may not do, the role to grant."""
    return f"{side}: user {user} may not {need.what} (grant {need.roles})"


#: The built-in role to grant for a command MongoDB refused, by command name; "{db}" is the command's
#: database. Commands not named here read ({db} read) on the source, and write (readWrite) on a target.
_COMMAND_ROLES = {
    "listDatabases": "clusterMonitor",
    "serverStatus": "clusterMonitor",
    "replSetGetConfig": "clusterMonitor",
    "replSetGetStatus": "clusterMonitor",
    "listShards": "clusterMonitor",
    "setUserWriteBlockMode": "backup",  # MongoDB grants it with backup, for cluster-to-cluster sync
    "collMod": "dbAdmin on {db}",
    "dropDatabase": "dbAdmin on {db}",
    "renameCollection": "readWrite on both databases (a rename within one database: readWrite on it)",
    "enableSharding": "clusterManager",  # a sharded target's collections: sinks.mongo.sharding
    "shardCollection": "clusterManager",
    "split": "clusterManager",
}


def advice(side: str, command: str, db: str) -> str:
    """The role that grants ``command`` (a command name as the driver sent it) on ``db`` to ``side``'s
    user: for an Unauthorized reply that came past the check made at start."""
    if command in _COMMAND_ROLES:
        return _COMMAND_ROLES[command].format(db=db)
    if command == "aggregate" and db == "admin":  # a change stream on the whole deployment
        return "readAnyDatabase"
    if side == "target":
        return f"readWrite on {db}, or readWriteAnyDatabase"
    return f"read on {db}, or readAnyDatabase"


def command_refusal(side: str, command: str, db: str) -> str:
    """One line for a command the server refused at run time."""
    if command == "aggregate" and db == "admin":
        what = _STREAM
    elif command == "renameCollection":
        what = "rename a collection"
    elif command in _COMMAND_ROLES and "{db}" not in _COMMAND_ROLES[command]:
        what = f"run {command} on the cluster"
    else:
        what = f"run {command} on {db}"
    return f"{side}: the user may not {what} (grant {advice(side, command, db)})"
