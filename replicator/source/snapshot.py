"""Reading one snapshot partition as bounded batches of raw documents."""

from __future__ import annotations

from collections.abc import AsyncIterator

from bson.raw_bson import RawBSONDocument
from pymongo.asynchronous.client_session import AsyncClientSession

from replicator.bsonkit.rawbson import raw_of
from replicator.source.connection import Client
from replicator.source.partitions import Partition, Resume
from replicator.source.reads import SourceReads


async def read_partition(
    client: Client,
    partition: Partition,
    *,
    batch_docs: int,
    batch_bytes: int,
    after: Resume | None = None,
    reads: SourceReads | None = None,
) -> AsyncIterator[list[RawBSONDocument]]:
    """Yield the partition's documents in batches of at most ``batch_docs`` documents and about
    ``batch_bytes`` bytes (a single larger document is its own batch). Documents stay raw BSON.

    A resumable partition is read in ``_id`` order (an index scan on MongoDB), so that the end of its
    acknowledged batches is an ``_id`` to go on ``after``; a capped one in insertion order.

    ``reads``: where the reads go and from when (see :mod:`.reads`), and their pace: a paced reader takes
    its tokens before each reply, which holds at most :meth:`~.reads.SourceReads.chunk` documents."""
    reads = reads if reads is not None else SourceReads()
    async with reads.session(client) as session:
        async for batch in _read(client, partition, batch_docs, batch_bytes, after, reads, session):
            yield batch


async def _read(
    client: Client,
    partition: Partition,
    batch_docs: int,
    batch_bytes: int,
    after: Resume | None,
    reads: SourceReads,
    session: AsyncClientSession | None,
) -> AsyncIterator[list[RawBSONDocument]]:
    coll = reads.collection(client, partition.ns)
    sort = [("_id", 1)] if partition.resumable else None
    chunk = reads.chunk(batch_docs)
    cursor = coll.find(
        partition.find_filter(after), sort=sort, batch_size=chunk, no_cursor_timeout=False, session=session
    )
    batch: list[RawBSONDocument] = []
    size = 0
    try:
        # a server reply's documents taken at once (to_list): no coroutine step per document, and their sizes
        # summed in C; only a reply that does not fit whole is cut document by document
        while True:
            want = min(chunk, batch_docs - len(batch))
            await reads.pace(want)
            docs = await cursor.to_list(want)
            reads.unused(want - len(docs))
            if not docs:
                break
            sizes = list(map(len, map(raw_of, docs)))
            if size + sum(sizes) <= batch_bytes:
                batch += docs
                size += sum(sizes)
            else:
                for doc, doc_size in zip(docs, sizes, strict=True):
                    if batch and size + doc_size > batch_bytes:
                        yield batch
                        batch, size = [], 0
                    batch.append(doc)
                    size += doc_size
            if len(batch) >= batch_docs:  # full: written while the next reply is read
                yield batch
                batch, size = [], 0
        if batch:
            yield batch
    finally:
        await cursor.close()
