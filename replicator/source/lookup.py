"""Reading documents again from the source by ``_id``, shaped as the target holds them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bson.timestamp import Timestamp

from replicator.events import Namespace
from replicator.events.normalize import snapshot_read
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.selection import Scope, make_transform
from replicator.source.connection import Client
from replicator.source.reads import ReadPolicy, SourceReads


def source_lookup(client: Client, settings: Settings) -> Callable[..., Awaitable[list[Mapping[str, Any]]]]:
    """A :data:`~replicator.sinks.base.SourceLookup` on ``client``: the target namespace is mapped back
    to its source through the run's selection and renames, and each document read goes through the same
    filter/rename stage as the stream's events (field rules included). The driver's sink and each Spark
    task's get one (:class:`replicator.sinks.base.SourceLookup`'s shape; structural, so the source does not
    import the sinks). Reads go where --read-preference says, no older than ``after``."""
    scope = Scope(settings.selection, settings.renamer)
    fields = FieldRules(settings.field_exclude, settings.field_rename)
    transform = make_transform(settings.selection, settings.renamer, fields=fields, filters=settings.filters or None)
    reads = SourceReads(ReadPolicy.of(settings))  # not paced: --max-read-rate is the snapshot's and verify's

    async def lookup(
        target: Namespace, ids: Sequence[Any], *, after: Timestamp | None = None
    ) -> list[Mapping[str, Any]]:
        origin = scope.source_of(target)
        if origin is None:
            return []
        docs: list[Mapping[str, Any]] = []
        async with reads.session(client, after) as session:
            async for doc in reads.collection(client, origin).find({"_id": {"$in": list(ids)}}, session=session):
                event = transform(snapshot_read(origin, doc))
                if event is not None and event.document is not None:
                    docs.append(event.document)
        return docs

    return lookup
