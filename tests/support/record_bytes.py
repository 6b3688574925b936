"""mcdc's Kafka records against Debezium's, byte for byte, and the BSON corpus as documents and as ``_id`` s.

Records are paired by topic, key bytes and the key's n-th record (one key's records keep their order in both;
across keys the two interleave differently). Keys must be equal bytes (a key only one side wrote is a
difference), and so must values, but for what cannot be the same, masked in both before comparing (the list
of docs/how-to/switch-from-debezium.md):

* ``source.version``: each writer's own version;
* the envelope's ``ts_ms``: when the record was made;
* a snapshot read's ``source.ts_ms``/``ts_us``/``ts_ns`` (when it was read) and ``source.snapshot``'s
  ``last`` (which read is written last: compared over the whole snapshot by the value comparison);
* a transaction's END: Debezium writes it when the next event comes, with that one's time, and lists its
  collections in a hash map's order (compared as values by the peer test).

Partitions: each of mcdc's records must be on the partition Debezium's Java client chose for the same key
among as many (``partition6``, on topics of 6 partitions).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from pymongo.errors import PyMongoError

from tests.support.corpus import OPTIONAL_IDS, bson_corpus_documents, mixed_id_values

#: (topic, key, value, partition): a record as bytes (value None: a tombstone)
Raw = tuple[str, bytes | None, bytes | None, int | None]

_VERSION = re.compile(rb'"version":"[^"]*"')
_RECORD_TIME = re.compile(rb'("op":"[rcud]","ts_ms":)\d+')
_READ_TIMES = re.compile(rb'("ts_(?:ms|us|ns)":)\d+')


def masked(topic: str, value: bytes | None) -> bytes | None:
    """``value`` with what cannot be equal masked (see the module's docstring); None for an END."""
    if value is None:
        return None
    if topic.endswith(".transaction"):
        return None if b'"status":"END"' in value else value
    value = _RECORD_TIME.sub(rb"\1~", _VERSION.sub(b'"version":"~"', value))
    if b'"op":"r"' in value:
        value = _READ_TIMES.sub(rb"\1~", value).replace(b'"snapshot":"last"', b'"snapshot":"true"')
    return value


def byte_diffs(mine: list[Raw], theirs: list[Raw]) -> tuple[list[str], int]:
    """The differences (empty: equal), and how many records were compared byte for byte."""
    a, b = _by_key(mine), _by_key(theirs)
    diffs = [f"only debezium wrote key {k!r}" for k in sorted(set(b) - set(a))]
    diffs += [f"only mcdc wrote key {k!r}" for k in sorted(set(a) - set(b))]
    compared = 0
    for key in sorted(set(a) & set(b)):
        ours, their = a[key], b[key]
        if len(ours) != len(their):
            diffs.append(f"{key!r}: mcdc wrote {len(ours)} records, debezium {len(their)}")
        for n, ((value, partition), (other, partition6)) in enumerate(zip(ours, their, strict=False)):
            compared += 1
            if partition6 is not None and partition != partition6:
                diffs.append(f"{key!r} #{n}: mcdc's partition {partition}, debezium's producer's {partition6}")
            left, right = masked(key[0], value), masked(key[0], other)
            if left != right:
                diffs.append(f"{key!r} #{n}:\n  mcdc     {left!r:.1500}\n  debezium {right!r:.1500}")
    return diffs, compared


def _by_key(records: list[Raw]) -> dict[tuple[str, bytes], list[tuple[bytes | None, int | None]]]:
    paired: dict[tuple[str, bytes], list[tuple[bytes | None, int | None]]] = defaultdict(list)
    for topic, key, value, partition in records:
        paired[(topic, key or b"")].append((value, partition))
    return paired


def load_corpus(db: Any, documents: str, ids: str) -> int:
    """The BSON corpus (but its 16 MB document, over a Kafka record's size) into collection ``documents``,
    and every value of it and every kind of ``_id`` as the ``_id`` of a document of ``ids`` (one of values
    MongoDB holds equal, and what the server refuses as an ``_id``, left out). Returns the documents written."""
    corpus = [doc for doc in bson_corpus_documents() if doc["_id"] != "big"]
    written = 0
    for doc in corpus:
        try:
            db[documents].insert_one(doc)
            written += 1
        except PyMongoError:
            assert doc["_id"] in OPTIONAL_IDS, doc["_id"]  # legal BSON a server may refuse
    values = [*mixed_id_values(), *(v for doc in corpus for v in doc.values())]
    for value in values:
        if isinstance(value, list | re.Pattern) or type(value).__name__ == "Regex":
            continue  # never an _id
        try:
            db[ids].insert_one({"_id": value, "n": written})
            written += 1
        except PyMongoError:
            continue  # equal to one written already, or not an _id this server takes
    return written
