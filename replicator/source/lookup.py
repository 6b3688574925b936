"""Reading documents again from the source by ``_id``, shaped as the target holds them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..events import ChangeEvent, Namespace
from ..filters import Scope
from ..normalize import snapshot_read
from ..sinks.base import SourceLookup
from .connection import Client


def source_lookup(client: Client, scope: Scope, transform: Callable[[ChangeEvent], ChangeEvent | None]) -> SourceLookup:
    """A :data:`~replicator.sinks.base.SourceLookup` on ``client``: the target namespace is mapped back
    to its source through ``scope``, and each document read goes through ``transform`` (the same
    filter/rename stage as the stream's events)."""

    async def lookup(target: Namespace, ids: Sequence[Any]) -> list[Mapping[str, Any]]:
        origin = scope.source_of(target)
        if origin is None:
            return []
        docs: list[Mapping[str, Any]] = []
        async for doc in client[origin.db][origin.coll or ""].find({"_id": {"$in": list(ids)}}):
            event = transform(snapshot_read(origin, doc))
            if event is not None and event.document is not None:
                docs.append(event.document)
        return docs

    return lookup
