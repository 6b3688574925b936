"""A time-series collection's measurements compared by content, not by count. Pure but for the reading.

Measurements have no unique ``_id`` to match one by one (two may share one), and MongoDB hands them back
unpacked from their buckets, fields in an order of its own. So each side is folded into one value that no
order of reading changes: the count, and the sum (modulo 2**128) of each measurement's digest, taken over
its top-level fields sorted by name. A measurement changed in place, one missing and another extra, or one
twice in place of two, changes the sum. Memory holds the two sums, whatever the collection's size: no
sort on the server, none here.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import bson
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit.rawbson import RAW_CODEC

_MOD = 1 << 128


def canonical(doc: RawBSONDocument) -> bytes:
    """The measurement's bytes with its top-level fields sorted by name (their values as they are)."""
    return bson.encode(dict(sorted(doc.items())), codec_options=RAW_CODEC)


@dataclass
class Measurements:
    """One side's measurements, folded: how many, and the sum of their digests."""

    count: int = 0
    total: int = 0

    def add(self, docs: Iterable[RawBSONDocument]) -> None:
        for doc in docs:
            self.count += 1
            digest = hashlib.blake2b(canonical(doc), digest_size=16).digest()
            self.total = (self.total + int.from_bytes(digest, "big")) % _MOD

    @classmethod
    async def of(cls, batches: AsyncIterator[list[RawBSONDocument]]) -> Measurements:
        folded = cls()
        async for batch in batches:
            folded.add(batch)
        return folded

    def differs(self, other: Measurements) -> str | None:
        """How ``other`` (the target's) differs from these (the source's), in words; None when it does not."""
        if self.count != other.count:
            return f"{self.count} measurements on the source, {other.count} on the target"
        if self.total != other.total:
            return f"the {self.count} measurements differ in content (time-series: compared as a whole)"
        return None
