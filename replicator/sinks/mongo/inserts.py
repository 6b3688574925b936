"""Snapshot copies sent as ``insert`` commands of their raw documents.

``insert_many`` checks each document in Python (its type against the Mapping ABCs, its ``_id``) and queues
it as a bulk operation: about 1 µs of client CPU per document, as much as the rest of copying it. A
snapshot batch needs none of that: its documents are the source's raw BSON, each with its ``_id``, and
the C encoder copies them into the command as they are, byte for byte, as ``insert_many`` does.

What ``insert_many`` does besides, this does too: commands cut to the server's limits (documents per
write, the size of a command), the collection's write concern, and write errors raised as a
:class:`~pymongo.errors.BulkWriteError` with their indexes in the whole batch. It does not retry a write
by itself: a failed batch fails its partition, which the copy retries from its acknowledged prefix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bson import encode
from bson.raw_bson import RawBSONDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from replicator.bsonkit.rawbson import DICT_CODEC

#: MongoDB's limits since 3.6, where the driver does not know the server's own: a document's size (a
#: command may exceed it by 16 KiB, which is room for an insert's other fields) and the writes per command
MAX_BSON_SIZE = 16 * 1024 * 1024
MAX_WRITE_BATCH = 100_000
#: an array element's bytes besides its document: its type and its key (the index as a C string)
_ELEMENT = 8


def chunks(sizes: Sequence[int], max_bytes: int, max_count: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` ranges of consecutive documents of these sizes, each range at most ``max_count``
    documents and, as array elements, at most ``max_bytes`` bytes; a document bigger than that alone."""
    start, size = 0, 0
    for at, doc_size in enumerate(sizes):
        if at > start and (at - start >= max_count or size + doc_size + _ELEMENT > max_bytes):
            yield start, at
            start, size = at, 0
        size += doc_size + _ELEMENT
    if start < len(sizes):
        yield start, len(sizes)


async def insert_unordered(coll: AsyncCollection[Any], docs: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``docs`` (raw BSON documents, or mappings with an ``_id``) into ``coll``, unordered, with its
    write concern and without document validation. Raises BulkWriteError, as ``insert_many`` does, when a
    write or the write concern failed, once every command was sent."""
    limits = _limits(coll)
    sizes = [len(doc.raw) if isinstance(doc, RawBSONDocument) else len(encode(doc)) for doc in docs]
    concern = coll.write_concern
    write_errors: list[dict[str, Any]] = []
    concern_errors: list[dict[str, Any]] = []
    inserted = 0
    for start, stop in chunks(sizes, *limits):
        command: dict[str, Any] = {
            "insert": coll.name,
            "documents": docs[start:stop] if start or stop < len(docs) else docs,
            "ordered": False,
            "bypassDocumentValidation": True,
        }
        if not concern.is_server_default:
            command["writeConcern"] = concern.document
        reply = await coll.database.command(command, codec_options=DICT_CODEC)
        inserted += int(reply.get("n", 0))
        for error in reply.get("writeErrors", ()):
            write_errors.append({**error, "index": start + int(error["index"])})
        if "writeConcernError" in reply:
            concern_errors.append(reply["writeConcernError"])
    if write_errors or concern_errors:
        raise BulkWriteError(
            {
                "writeErrors": write_errors,
                "writeConcernErrors": concern_errors,
                "nInserted": inserted,
                "nUpserted": 0,
                "nMatched": 0,
                "nModified": 0,
                "nRemoved": 0,
                "upserted": [],
            }
        )


def _limits(coll: AsyncCollection[Any]) -> tuple[int, int]:
    """The writable server's document size and writes per command, as the driver last heard them."""
    for server in coll.database.client.topology_description.server_descriptions().values():
        if server.is_writable:
            return server.max_bson_size, server.max_write_batch_size
    return MAX_BSON_SIZE, MAX_WRITE_BATCH
