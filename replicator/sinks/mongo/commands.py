"""Unordered writes sent as ``insert``, ``update`` and ``delete`` commands of their statements.

pymongo's ``insert_many`` and ``bulk_write`` check each write in Python (its documents' types against the
Mapping ABCs, a ReplaceOne's replacement) and queue it as a bulk operation: about 1 µs of client CPU per
write, as much as the rest of replaying an event. The writes mcdc sends unordered need none of it: a
snapshot batch's documents and a change event's key and full document are the source's raw BSON, which
the C encoder copies into the command as they are, byte for byte, as those methods do. The statements are
the ones ``bulk_write`` sends for InsertOne, ``ReplaceOne(key, doc, upsert=True)`` and ``DeleteOne(key)``.

What those methods do besides, this does too: commands cut to the server's limits (writes per command,
the size of a command), the collection's write concern, and write errors raised as a
:class:`~pymongo.errors.BulkWriteError`, with their indexes in the whole list, once every command was
sent. It does not retry a command by itself: a failed batch is written again, idempotently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from bson import encode
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from replicator.bsonkit.rawbson import DICT_CODEC, raw_of
from replicator.events import ChangeEvent
from replicator.sinks.mongo.concern import with_concern

#: :func:`replace_unordered` or :func:`delete_unordered`
UnorderedWrites = Callable[[AsyncCollection[Any], Sequence[ChangeEvent]], Awaitable[None]]

#: MongoDB's limits since 3.6, where the driver does not know the server's own: a document's size (a
#: command may exceed it by 16 KiB, which is room for a command's other fields) and the writes per command
MAX_BSON_SIZE = 16 * 1024 * 1024
MAX_WRITE_BATCH = 100_000
#: an array element's bytes besides its document: its type and its key (the index as a C string)
_ELEMENT = 8
#: a statement's bytes besides its documents: its own document's and its fields' (``q``, ``u``, ``upsert``)
_STATEMENT = 32


def chunks(sizes: Sequence[int], max_bytes: int, max_count: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` ranges of consecutive writes of these sizes, each range at most ``max_count``
    writes and, as array elements, at most ``max_bytes`` bytes; a write bigger than that alone."""
    start, size = 0, 0
    for at, write_size in enumerate(sizes):
        if at > start and (at - start >= max_count or size + write_size + _ELEMENT > max_bytes):
            yield start, at
            start, size = at, 0
        size += write_size + _ELEMENT
    if start < len(sizes):
        yield start, len(sizes)


async def insert_unordered(coll: AsyncCollection[Any], docs: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``docs`` (raw BSON documents, or mappings with an ``_id``) into ``coll``."""
    await _send(coll, "insert", "documents", docs, [_size(doc) for doc in docs])


async def replace_unordered(coll: AsyncCollection[Any], events: Sequence[ChangeEvent]) -> None:
    """Each event's full document upserted by its document key: ``ReplaceOne(key, doc, upsert=True)``."""
    updates, sizes = [], []
    for event in events:
        key, doc = event.document_key, event.document
        updates.append({"q": key, "u": doc, "upsert": True})
        sizes.append(_size(key) + _size(doc) + _STATEMENT)
    await _send(coll, "update", "updates", updates, sizes)


async def delete_unordered(coll: AsyncCollection[Any], events: Sequence[ChangeEvent]) -> None:
    """Each event's document deleted by its document key: ``DeleteOne(key)``."""
    deletes, sizes = [], []
    for event in events:
        key = event.document_key
        deletes.append({"q": key, "limit": 1})
        sizes.append(_size(key) + _STATEMENT)
    await _send(coll, "delete", "deletes", deletes, sizes)


async def _send(coll: AsyncCollection[Any], name: str, field: str, writes: Sequence[Any], sizes: list[int]) -> None:
    """The writes as unordered ``name`` commands with ``coll``'s write concern and without document
    validation; BulkWriteError, as ``bulk_write`` raises it, when a write or the write concern failed."""
    concern = coll.write_concern
    write_errors: list[dict[str, Any]] = []
    concern_errors: list[dict[str, Any]] = []
    counts = {"n": 0, "nModified": 0}
    upserted: list[dict[str, Any]] = []
    for start, stop in chunks(sizes, *_limits(coll)):
        command: dict[str, Any] = {
            name: coll.name,
            field: writes[start:stop] if start or stop < len(writes) else writes,
            "ordered": False,
            "bypassDocumentValidation": True,
        }
        reply = await coll.database.command(with_concern(command, concern), codec_options=DICT_CODEC)
        for count in counts:
            counts[count] += int(reply.get(count, 0))
        upserted += ({**up, "index": start + int(up["index"])} for up in reply.get("upserted", ()))
        write_errors += ({**error, "index": start + int(error["index"])} for error in reply.get("writeErrors", ()))
        if "writeConcernError" in reply:
            concern_errors.append(reply["writeConcernError"])
    if write_errors or concern_errors:
        n, upserts = counts["n"], len(upserted)
        raise BulkWriteError(
            {
                "writeErrors": write_errors,
                "writeConcernErrors": concern_errors,
                "nInserted": n if name == "insert" else 0,
                "nUpserted": upserts,
                "nMatched": n - upserts if name == "update" else 0,
                "nModified": counts["nModified"],
                "nRemoved": n if name == "delete" else 0,
                "upserted": upserted,
            }
        )


def _size(doc: Mapping[str, Any] | None) -> int:
    """A document's BSON size: its bytes' length for raw BSON (read in C: ``isinstance`` of the Mapping ABC
    that RawBSONDocument is would cost more than the rest of a statement)."""
    try:
        return len(raw_of(doc))
    except AttributeError:
        return len(encode(doc)) if doc is not None else 0


def _limits(coll: AsyncCollection[Any]) -> tuple[int, int]:
    """The writable server's document size and writes per command, as the driver last heard them."""
    for server in coll.database.client.topology_description.server_descriptions().values():
        if server.is_writable:
            return server.max_bson_size, server.max_write_batch_size
    return MAX_BSON_SIZE, MAX_WRITE_BATCH
