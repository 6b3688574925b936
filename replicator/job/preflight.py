"""What a run checks before its first write: that each server's user may do what the run needs, that the
target is not the source (or, for a copy within one deployment, that nothing is written over the source),
and what ties a checkpoint to its source and target."""

from __future__ import annotations

import os
from collections.abc import Iterable

from replicator.checkpoint.store import Checkpoint, StreamScope
from replicator.errors import ConfigError
from replicator.events import Namespace
from replicator.settings.config import Settings
from replicator.settings.selection import check_copy_within
from replicator.settings.uri import host_set, is_mongo_uri, redact
from replicator.sinks.base import Sink
from replicator.sinks.registry import scheme_of
from replicator.source import catalog
from replicator.source.connection import Client, ServerInfo, deployment_identity, grants, uri_identity
from replicator.source.privileges import (
    Grants,
    Need,
    missing,
    refusal,
    source_needs,
    stream_database,
    target_needs,
)  # fmt: skip


def refuse_lacking(side: str, granted: Grants | None, needs: Iterable[Need]) -> None:
    """A ConfigError naming the first of ``needs`` the user's ``granted`` privileges leave out, with the
    role to grant; nothing when they cover all, or when the server cannot tell (no authentication)."""
    if granted is None:
        return
    lacking = missing(needs, granted)
    if lacking:
        raise ConfigError(refusal(side, granted.user, lacking[0]))


async def check_source_privileges(client: Client, settings: Settings, cp: Checkpoint | None) -> StreamScope:
    """The source's user may read what the selection names and, unless --snapshot-only, open the change
    stream the run follows: checked before anything is read or written. That stream is the checkpoint's
    (``cp``: a resume token belongs to one stream), else the deployment's, else, for a user who may read
    only the one database the selection names, that database's (see :func:`stream_database`)."""
    granted = await grants(client)
    databases = settings.selection.databases()
    if cp is not None and cp.stream is not None:
        scope = cp.stream
        if scope.database is not None and databases != (scope.database,):
            raise ConfigError(
                f"checkpoint {settings.checkpoint_path()} follows the change stream of database {scope.database} "
                f"alone (its source user could read only that database), and the selection now reaches beyond "
                f"it: --include only {scope.database}'s collections, or begin another migration (another "
                "--checkpoint) with readAnyDatabase on the source"
            )
        stream_db = scope.database
    else:
        scope = StreamScope(stream_database(granted, databases))
        stream_db = scope.database
        one = databases[0] if databases is not None and len(databases) == 1 else None
        if (
            stream_db is None
            and granted is not None
            and one is not None
            and missing(source_needs(None, stream=True), granted)
        ):
            stream_db = one  # neither stream may be opened: the one database's is the least to grant
    needs = source_needs(databases, stream=not settings.snapshot_only, stream_db=stream_db)
    refuse_lacking("source", granted, needs)
    return scope


async def check_target_privileges(sink: Sink, settings: Settings, namespaces: Iterable[Namespace]) -> None:
    """A MongoDB target's user may write every database the selection maps to (``namespaces``: the
    source's, from which the selected ones are mapped), checked once the sink is started, before any write."""
    user_grants = getattr(sink, "user_grants", None)
    if user_grants is None:
        return
    databases = {settings.renamer(ns).db for ns in namespaces if settings.selection(ns)}
    for db in settings.selection.databases() or ():
        databases.add(settings.renamer(Namespace(db, None)).db)
    refuse_lacking("target", await user_grants(), target_needs(databases))


def same_deployment(source: ServerInfo, sink: Sink, settings: Settings) -> bool:
    """Is the target the source's own deployment? The host-name check misses aliases (a DNS name and its
    IP): compare the servers' identities too."""
    target = getattr(sink, "server", None)
    if not isinstance(target, ServerInfo):
        return False
    if target.process_id and target.process_id == source.process_id:
        return True
    if target.deployment_id and target.deployment_id == source.deployment_id:
        return True
    return bool(host_set(settings.source) & host_set(settings.target))


async def refuse_same_server(
    client: Client, source: ServerInfo, sink: Sink, settings: Settings, *, first_run: bool
) -> None:
    """A target that is the source's deployment is refused, unless ``--rename`` makes it a copy within
    it; then no selected namespace may be written over a namespace of the source (see
    :func:`~replicator.settings.selection.check_copy_within`). After the first run, the copies exist in the
    deployment too: they are this checkpoint's own, not the source's."""
    if not same_deployment(source, sink, settings):
        return
    if not settings.rename:
        raise ConfigError(f"target {redact(settings.target)} is the source server; replicate to a different server")
    selected = [spec.ns for spec in await catalog.describe(client, settings.selection)]
    existing = await catalog.list_namespaces(client) if first_run else []
    check_copy_within(selected, existing, settings.selection, settings.renamer)


def source_name(info: ServerInfo, uri: str) -> str:
    """The checkpoint's ``source`` field: the replica set name, else the host list. Every ``rs0`` looks alike
    by it, so it only serves older checkpoints, which carry nothing else (see CheckpointStore.claim)."""
    if info.set_name:
        return f"rs:{info.set_name}"
    return "hosts:" + ",".join(sorted(host_set(uri)))


def target_keys(sink: Sink, settings: Settings) -> tuple[str, ...]:
    """Every name of this run's target, beside :func:`target_identity`, by which another migration may have
    recorded the same target (checkpoint.registry): a MongoDB target's identity as an older mcdc made it
    (from the URI's hosts); a JSON-lines file by its real path, symlinks resolved, whatever the topic prefix
    (``file:``: one writer per file, whatever it selects); a local lake by its real path (its tables do not
    depend on the topic prefix)."""
    target = settings.target
    if is_mongo_uri(target):
        server = getattr(sink, "server", None)
        if not isinstance(server, ServerInfo):
            return ()
        return tuple(dict.fromkeys((deployment_identity(server, target), uri_identity(server, target))))
    scheme = scheme_of(target)
    rest = target[len(scheme) + 1 :]
    if scheme == "jsonl":
        return ("file:" + os.path.realpath(os.path.expanduser(rest)),)
    if scheme in ("delta", "iceberg"):
        return (f"{scheme}:" + (redact(rest) if "://" in rest else os.path.realpath(os.path.expanduser(rest))),)
    return ()


def target_identity(sink: Sink, settings: Settings) -> str | None:
    """What ties a checkpoint to its target: a MongoDB target's deployment identity (None until ``start()``
    has probed its server); for an event sink, its redacted URI (a file's absolute path) and topic prefix."""
    target = settings.target
    if is_mongo_uri(target):
        server = getattr(sink, "server", None)
        return deployment_identity(server, target) if isinstance(server, ServerInfo) else None
    scheme = scheme_of(target)
    if scheme == "stdout":
        target = "stdout"
    elif scheme == "jsonl":
        target = "jsonl:" + os.path.abspath(os.path.expanduser(target[len("jsonl:") :]))
    return f"{redact(target)}#{settings.topic_prefix}"
