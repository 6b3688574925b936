"""Benchmark: the Kafka sink's delivery, the CPU cost of normalize + encode per event, and draining a backlog.

    python scripts/bench_kafka.py [--events 50000] [--repeat 3] [--batch 1000] [--cpu-rounds 5] [--json]
    python scripts/bench_kafka.py --source mongodb://... --bootstrap HOST:PORT
    python scripts/bench_kafka.py --skip-delivery --skip-drain    # part 2 alone (no server, no broker)

Each part can be left out with its ``--skip-delivery`` / ``--skip-cpu`` / ``--skip-drain``; the others then
run as in a full run, so their figures stay comparable.

The change events: ``--events`` operations on ``bench_kafka.events`` planned with a fixed seed, in rounds of
inserts followed by as many updates and deletes of live documents: 50 % inserts, 35 % ``$set`` updates (of
4 fields, one nested), 15 % deletes. A document is about 300 BSON bytes: an ObjectId ``_id``, strings, an
int32, an Int64, a double, a bool, a date, a subdocument and an array. For parts 1 and 2 they are built in
memory as the raw change-stream documents a server sends (resume token, clusterTime, wallTime, ns,
documentKey, fullDocument as ``updateLookup`` gives it, updateDescription), BSON-encoded once.

One run measures three things:

1. Delivery into the broker, acks=all and idempotent (the sink's defaults). The events are normalized
   (``normalize_change`` on RawBSONDocuments, untimed), then, per repeat and in alternating order, into
   topics of their own (one ``--topic-prefix`` per contender and repeat, deleted afterwards):

   a. ``KafkaSink.write()`` of the events in batches of ``--batch``: encoding included;
   b. ``KafkaSink.send()`` of the same records pre-encoded (``sink.encoder.encode()`` beforehand, untimed):
      the sink's delivery alone;
   c. a raw ``aiokafka.AIOKafkaProducer(acks="all", enable_idempotence=True)`` with the linger and batch
      settings of the sink's producer defaults, ``send()``-ing the same pre-encoded records and awaiting
      every future per batch.

   Each contender starts its producer and sends one warm-up record (which creates its topic) before the
   clock starts; the clock stops when the broker acknowledged the last batch. The broker's end offsets are
   then checked: every record arrived. Reported: events/s (records include a tombstone per delete), best
   and median over ``--repeat``, and the ratios against the raw producer, best and median. Target: write/raw
   >= 0.8, median of the repeats.
2. CPU per event without I/O, in this process: ``normalize_change`` on fresh RawBSONDocuments of the raw
   change documents (decoding included), ``Encoder.encode`` of the results, and both in one pass. Batch by
   batch (``--batch``) as the pipeline goes, each batch timed on its own (its input prepared untimed), the sum
   over all events the figure, best of ``--cpu-rounds``. Two document sizes:

   a. small: the events above, for the envelopes debezium (the default), debezium-legacy, plain, and
      debezium with relaxed extended JSON and with Debezium's own JSON (``--extended-json debezium``);
   b. large: the same kind of operations on documents of about 16 KB of BSON (the small document's fields
      and 135 line items: subdocuments of strings, an int, a double, a date, a bool and a nested
      subdocument), ``--events`` / 10 of them but at least 1,000 (at most ``--events``), for debezium and
      plain only, to keep the part short.

   Target: normalize + encode <= 10 µs/event, debezium, small documents (the large ones are informational).
   For the small documents it also times, the same way, the steps inside that are pymongo's and orjson's C
   code, which any Python path runs (a fused normalize + encode too): ``rawbson.top_level`` of the change
   documents, their documents (fullDocument, updatedFields) decoded into extended JSON values, the search for
   deprecated BSON types in them, and orjson writing them; each per event, and their sum.
3. Draining a backlog from the source. ``bench_kafka`` is dropped and its collection created; ``mcdc sync
   --target stdout`` of the empty collection makes a checkpoint; then the same operations run on the source
   (insert_many / bulk_write of UpdateOne and DeleteOne), making ``--events`` change events. Then, per repeat
   in rotating order (each contender first, second and third in turn), each from process start to exit:

   a. ``mcdc catch-up --target stdout`` from a copy of that checkpoint, output to a file;
   b. ``bare pymongo (dict)``: a loop in ``python -c`` (``BARE_DICT_LOOP``), ``pymongo.MongoClient(uri,
      document_class=dict)`` (pymongo's default decoding), ``client.watch(full_document="updateLookup",
      resume_after=<the checkpoint's resume token>)``, no output: it only counts the changes it reads;
   c. ``bare pymongo (raw)``: the same loop (``BARE_RAW_LOOP``) with ``document_class=RawBSONDocument``,
      changes left as raw BSON (reading only ``operationType`` and ``ns.db``).

   Each is checked against the planned mix: mcdc's output lines with ``value.op`` c/u/d (deletes make no
   tombstone line on stdout), and the insert/update/delete changes of ``bench_kafka`` each bare loop counted
   until it had seen all, which it prints at exit as one JSON line on stderr with its in-process seconds:
   ``{"seen": {"insert": ..., ...}, "elapsed_s": ...}``. Reported: events/s from process start, the time each
   reports in-process (mcdc's summary ``elapsed_s``; a bare loop's from after its imports), the CPU seconds
   of the process (user + system) and, for a local source, of the source server meanwhile; and the ratios
   mcdc/bare-dict (target >= 0.8, best; the median shown) and mcdc/bare-raw (informational), best and median.

Prints a table, PASS/FAIL for the targets with their figures, and the commands measured (this one for parts
1 and 2; the bare loops' sources are in ``--json`` under ``drain.bare_loops``); exits 0 whatever the targets
say: it is a measurement. Exits 1 only when something crashed: a broker or a server did not start, a command
failed, records, lines or changes are missing.

Without ``--source`` it starts local SecantusDB servers (a Python MongoDB-compatible server, several times
slower than mongod) in a temporary directory; without ``--bootstrap`` a local noida-db broker (a small
Kafka-protocol server, not Kafka). Figures are for those, on this machine: only the ratios within one run
mean anything. With ``--source``, only its ``bench_kafka`` database is dropped and written; all drains
watch the whole deployment, ``mcdc catch-up`` writes only ``bench_kafka.events`` (``--include``) and the bare
loops count only ``bench_kafka``'s changes. With ``--bootstrap``, topics named ``mcdc-bench-*`` are
created and deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import bson
import harness
import orjson
import psutil
import pymongo
from bson import json_util
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo import DeleteOne, UpdateOne

from replicator.bsonkit.deprecated import CANDIDATE
from replicator.bsonkit.extjson import _CANONICAL_DECODE
from replicator.bsonkit.extjson_types import _decode_bson
from replicator.bsonkit.rawbson import top_level
from replicator.checkpoint.store import CheckpointStore
from replicator.cli import GC_THRESHOLDS
from replicator.events import ChangeEvent, Namespace
from replicator.events.normalize import normalize_change
from replicator.settings.config import Settings
from replicator.settings.resolve import resolve
from replicator.sinks.kafka.options import producer_config
from replicator.sinks.kafka.sink import KafkaSink
from replicator.sinks.records.envelope import Encoder, EnvelopeOptions, Message
from replicator.sinks.records.topics import TopicNamer
from replicator.source.connection import RAW_CODEC

DB = "bench_kafka"
COLL = "events"
NS = Namespace(DB, COLL)
INCLUDE = r"bench_kafka\.events"
RS_NAME = "rs0"  # the replica set name the encoders put in source.rs
TOPIC_BASE = "mcdc-bench"  # topics: <base>-<contender>-<repeat>-<run id>.bench_kafka.events

ROUND = 1_000  # inserts per round, then as many updates and deletes (fewer in a small run)
UPDATE_SHARE = 0.7  # of the non-insert operations: 50 % inserts, 35 % updates, 15 % deletes overall
RATIO_TARGET = 0.8
CPU_TARGET_US = 10.0
LARGE_LINES = 135  # line items of a large document: about 16 KB of BSON with make_doc's fields
LARGE_MIN_EVENTS = 1_000  # the large-document variant of part 2: --events / 10, at least this (at most --events)
LARGE_ENVELOPES = ("debezium", "plain", "debezium, Debezium's JSON")
DELIVERY_KINDS = ("mcdc write", "mcdc send", "raw aiokafka")
DRAIN_KINDS = ("mcdc catch-up", "bare pymongo (dict)", "bare pymongo (raw)")
ENVELOPES: dict[str, dict[str, Any]] = {
    "debezium": {"style": "debezium"},
    "debezium-legacy": {"style": "debezium-legacy"},
    "plain": {"style": "plain"},
    "debezium, relaxed JSON": {"style": "debezium", "relaxed": True},
    "debezium, Debezium's JSON": {"style": "debezium", "json": "debezium"},  # --extended-json debezium
}
ADJECTIVES = ("compact", "deluxe", "sturdy", "portable", "classic", "modern", "rugged", "silent")
NOUNS = ("widget", "gadget", "bracket", "sprocket", "valve", "sensor", "adapter", "housing")
CATEGORIES = ("hardware", "electronics", "garden", "kitchen", "outdoor", "office")
TAGS = ("red", "green", "blue", "cyan", "magenta", "yellow", "black", "white", "sale", "new")
EPOCH = datetime(2024, 3, 1, tzinfo=UTC)
_MB = 1024 * 1024

#: The baselines of part 3: a bare change stream read to its end and nothing else, no output. The only
#: difference between the two is the client's document_class; what they saw goes to stderr, one JSON line.
_BARE_LOOP = """\
import json, sys, time
import pymongo
from bson import json_util{imports}
started = time.perf_counter()
uri, start, db, want = sys.argv[1], json_util.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
seen = {{}}
count = 0
with pymongo.MongoClient(uri, document_class={document_class}) as client:
    with client.watch(full_document="updateLookup", **start) as stream:
        for change in stream:
            kind = change["operationType"]
            if kind in ("insert", "update", "delete") and change["ns"]["db"] == db:
                seen[kind] = seen.get(kind, 0) + 1
                count += 1
                if count == want:
                    break
print(json.dumps({{"seen": seen, "elapsed_s": round(time.perf_counter() - started, 3)}}), file=sys.stderr)
"""
BARE_DICT_LOOP = _BARE_LOOP.format(imports="", document_class="dict")  # pymongo's default decoding
BARE_RAW_LOOP = _BARE_LOOP.format(
    imports="\nfrom bson.raw_bson import RawBSONDocument", document_class="RawBSONDocument"
)
BARE_LOOPS = {
    "bare pymongo (dict)": ("BARE_DICT_LOOP", BARE_DICT_LOOP),
    "bare pymongo (raw)": ("BARE_RAW_LOOP", BARE_RAW_LOOP),
}


def _per_s(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


# -- the change events ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One planned write: an insert of ``doc``, a ``$set`` of ``fields``, or a delete, of document ``_id``."""

    kind: str  # insert | update | delete
    _id: ObjectId
    doc: dict[str, Any] | None = None
    fields: dict[str, Any] | None = None


def _when(seq: int) -> datetime:
    return EPOCH + timedelta(milliseconds=37 * seq)  # whole milliseconds: BSON dates keep no more


def make_doc(oid: ObjectId, seq: int, rng: random.Random) -> dict[str, Any]:
    """A document of about 300 BSON bytes."""
    user = rng.randrange(100_000)
    return {
        "_id": oid,
        "sku": f"SKU-{seq:08d}",
        "name": f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {seq}",
        "category": rng.choice(CATEGORIES),
        "qty": rng.randrange(1000),
        "stock": Int64(rng.randrange(1 << 40)),
        "price": round(rng.uniform(1, 500), 2),
        "active": rng.random() < 0.8,
        "created": _when(seq),
        "owner": {"name": f"user {user:06d}", "email": f"user{user:06d}@example.com", "level": rng.randrange(10)},
        "tags": rng.sample(TAGS, 3),
        "notes": f"shelf {rng.randrange(40):02d}-{rng.randrange(500):03d}",
        "v": seq,
    }


def make_large_doc(oid: ObjectId, seq: int, rng: random.Random) -> dict[str, Any]:
    """A document of about 16 KB of BSON: make_doc's fields and an order's ``LARGE_LINES`` line items, each a
    subdocument of strings, an int, a double, a date, a bool and a nested subdocument."""
    doc = make_doc(oid, seq, rng)
    doc["lines"] = [
        {
            "sku": f"SKU-{rng.randrange(100_000_000):08d}",
            "qty": rng.randrange(1, 50),
            "price": round(rng.uniform(1, 500), 2),
            "shipped": _when(seq + line),
            "gift": rng.random() < 0.1,
            "attrs": {"color": rng.choice(TAGS), "size": rng.randrange(30, 50)},
        }
        for line in range(LARGE_LINES)
    ]
    return doc


DocMaker = Callable[[ObjectId, int, random.Random], dict[str, Any]]


def plan_ops(events: int, seed: int = 0, make: DocMaker = make_doc) -> list[Op]:
    """``events`` operations: rounds of inserts (documents by ``make``), then as many updates (70 %) and deletes
    (30 %) of live ones."""
    rng = random.Random(seed)
    ops: list[Op] = []
    live: list[ObjectId] = []
    per_round = max(1, min(ROUND, events // 40))  # about 20 rounds at least: every kind, even in a small run
    while len(ops) < events:
        for _ in range(min(per_round, events - len(ops))):
            seq = len(ops)
            oid = ObjectId(int(EPOCH.timestamp()).to_bytes(4, "big") + seq.to_bytes(8, "big"))
            ops.append(Op("insert", oid, doc=make(oid, seq, rng)))
            live.append(oid)
        for _ in range(min(per_round, events - len(ops))):
            seq = len(ops)
            slot = rng.randrange(len(live))
            if rng.random() < UPDATE_SHARE:
                fields = {"qty": rng.randrange(1000), "owner.level": rng.randrange(10), "updated": _when(seq), "v": seq}
                ops.append(Op("update", live[slot], fields=fields))
            else:
                ops.append(Op("delete", live[slot]))
                live[slot] = live[-1]
                live.pop()
    return ops


def _token(seq: int) -> str:
    """A resume token's ``_data`` of realistic length (a KeyString in hex)."""
    when = f"{1_709_251_200 + seq // 1000:08X}{seq % 1000 + 1:08X}"
    return f"82{when}2B042C0100296E5A1004{seq:032X}46645F69640064{seq:024X}0004"


def change_documents(ops: Sequence[Op]) -> list[bytes]:
    """The raw change-stream document of each operation, as a server would send it (fullDocument looked up)."""
    state: dict[ObjectId, dict[str, Any]] = {}
    out: list[bytes] = []
    for seq, op in enumerate(ops):
        change: dict[str, Any] = {
            "_id": {"_data": _token(seq)},
            "operationType": op.kind,
            "clusterTime": Timestamp(1_709_251_200 + seq // 1000, seq % 1000 + 1),
            "wallTime": _when(seq),
        }
        if op.kind == "insert":
            assert op.doc is not None
            state[op._id] = dict(op.doc)
            change["fullDocument"] = state[op._id]
        elif op.kind == "update":
            assert op.fields is not None
            doc = state[op._id]
            for path, value in op.fields.items():
                if path == "owner.level":
                    doc["owner"] = {**doc["owner"], "level": value}
                else:
                    doc[path] = value
            change["fullDocument"] = doc
        change["ns"] = {"db": DB, "coll": COLL}
        change["documentKey"] = {"_id": op._id}
        if op.kind == "update":
            change["updateDescription"] = {"updatedFields": op.fields, "removedFields": [], "truncatedArrays": []}
        if op.kind == "delete":
            del state[op._id]
        out.append(bson.encode(change))  # a snapshot: later updates of the same dict do not show
    return out


def describe(ops: Sequence[Op], raws: Sequence[bytes]) -> dict[str, Any]:
    """The count and mix of the events, and the average size of their documents and raw change documents."""
    docs = [op.doc for op in ops if op.doc is not None]
    return {
        "count": len(ops),
        "mix": dict(Counter(op.kind for op in ops)),
        "avg_doc_bytes": round(sum(len(bson.encode(d)) for d in docs) / len(docs)),
        "avg_change_bytes": round(sum(len(r) for r in raws) / len(raws)),
    }


def normalize_all(raws: Sequence[bytes]) -> list[ChangeEvent]:
    """ChangeEvents from fresh RawBSONDocuments (as the change stream reader hands them over)."""
    events = [normalize_change(RawBSONDocument(raw, RAW_CODEC)) for raw in raws]
    kept = [event for event in events if event is not None]
    if len(kept) != len(raws):
        raise harness.BenchError("normalize_change dropped a data event")
    return kept


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# -- part 2: CPU per event --------------------------------------------------------------------------------


def _best_of(
    rounds: int, raws: Sequence[Any], batch: int, timed: Callable[[Any], Any], prepare: Callable[[Any], Any] | None
) -> float:
    """The shortest of ``rounds`` passes over ``raws`` in batches, each pass the sum of ``timed(prepare(chunk))``
    (prepare is not timed). Batch by batch, as the pipeline goes: only one batch's events are alive at a time."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        total = 0.0
        for chunk in _chunks(raws, batch):
            arg = prepare(chunk) if prepare is not None else chunk
            started = time.perf_counter()
            timed(arg)
            total += time.perf_counter() - started
            del arg
        best = min(best, total)
    return best


def _encoder(options: dict[str, Any], prefix: str = "mcdc") -> Encoder:
    return Encoder(EnvelopeOptions(**options), TopicNamer(prefix), source_name=RS_NAME)


def _cost(seconds: float, events: int) -> dict[str, float]:
    return {"us_per_event": round(seconds / events * 1e6, 2), "events_per_s": round(_per_s(events, seconds))}


def cpu_costs(raws: Sequence[bytes], batch: int, rounds: int, envelopes: Sequence[str]) -> dict[str, Any]:
    """µs/event of normalize, of encode per envelope, and of both in one pass (best of ``rounds``)."""
    n = len(raws)
    normalize_s = _best_of(rounds, raws, batch, normalize_all, None)
    print(f"  normalize_change: {normalize_s / n * 1e6:.2f} µs/event")
    costs: dict[str, Any] = {}
    for name in envelopes:
        encoder = _encoder(ENVELOPES[name])

        def both(chunk: Sequence[bytes], encoder: Encoder = encoder) -> None:
            encoder.encode(normalize_all(chunk))

        encode_s = _best_of(rounds, raws, batch, encoder.encode, normalize_all)
        both_s = _best_of(rounds, raws, batch, both, None)
        records = values = value_bytes = 0
        for chunk in _chunks(raws, batch):  # batch by batch: a large document's records take room
            messages = encoder.encode(normalize_all(chunk))
            records += len(messages)
            values += sum(m.value is not None for m in messages)
            value_bytes += sum(len(m.value or b"") for m in messages)
        costs[name] = {
            "encode": _cost(encode_s, n),
            "normalize_and_encode": _cost(both_s, n),
            "records": records,
            "avg_value_bytes": round(value_bytes / values) if values else 0,
        }
        print(f"  {name}: encode {encode_s / n * 1e6:.2f} µs/event, both in one pass {both_s / n * 1e6:.2f} µs/event")
    return {"events": n, "rounds": rounds, "normalize": _cost(normalize_s, n), "envelopes": costs}


def _documents(raws: Sequence[bytes]) -> list[bytes]:
    """The documents an encoder converts to extended JSON: each fullDocument, and an update's updatedFields."""
    docs = []
    for raw in raws:
        top = top_level(raw) or {}
        if (doc := top.get("fullDocument")) is not None:
            docs.append(doc.start)
        if (desc := top.get("updateDescription")) is not None:
            docs.append((top_level(desc.start) or {})["updatedFields"].start)
    return docs


def step_costs(raws: Sequence[bytes], batch: int, rounds: int) -> dict[str, float]:
    """µs per event of the steps inside normalize + encode that are pymongo's and orjson's C code, which any
    Python path (a fused one too) runs: the change document's top level; its documents decoded into extended
    JSON values (pymongo's decoder, its type converters included); the search for deprecated BSON types
    (Symbol, Undefined, DBPointer) in those documents; orjson writing them. Best of ``rounds``, by batch."""
    n = len(raws)
    docs = _documents(raws)
    per_event = len(raws) / len(docs)  # documents and events are batched alike: each step's cost per event

    def each(f: Callable[[Any], Any]) -> Callable[[Sequence[Any]], None]:
        def run(chunk: Sequence[Any]) -> None:
            for x in chunk:
                f(x)

        return run

    def decode(doc: bytes) -> Any:
        return _decode_bson(doc, _CANONICAL_DECODE)

    values = [decode(d) for d in docs]
    doc_batch = max(1, round(batch / per_event))
    costs = {
        "top_level": _best_of(rounds, raws, batch, each(top_level), None) / n,
        "decode_documents": _best_of(rounds, docs, doc_batch, each(decode), None) / n,
        "deprecated_search": _best_of(rounds, docs, doc_batch, each(CANDIDATE.search), None) / n,
        "orjson": _best_of(rounds, values, doc_batch, each(orjson.dumps), None) / n,
    }
    result = {name: round(seconds * 1e6, 2) for name, seconds in costs.items()}
    result["sum"] = round(sum(costs.values()) * 1e6, 2)
    print(
        "  C steps any Python path runs: " + ", ".join(f"{name} {us:.2f}" for name, us in result.items()) + " µs/event"
    )
    return result


# -- part 1: delivery into Kafka -----------------------------------------------------------------------------


@dataclass
class DeliveryRun:
    """One timed delivery of every event."""

    kind: str  # one of DELIVERY_KINDS
    repeat: int
    topic: str
    events: int
    records: int
    wall_s: float
    events_per_s: float


def _settings(bootstrap: str, prefix: str) -> Settings:
    """The Settings of a run with ``--target kafka://BOOTSTRAP --topic-prefix PREFIX`` and nothing else."""
    flags = {"source": "mongodb://127.0.0.1/", "target": f"kafka://{bootstrap}", "topic_prefix": prefix}
    return resolve(flags, env={})


def _retopic(batches: Sequence[list[Message]], prefix: str) -> list[list[Message]]:
    """The same records (key and value bytes) on the topics of another prefix."""
    cut = len(TOPIC_BASE)
    return [[Message(prefix + m.topic[cut:], m.key, m.value) for m in batch] for batch in batches]


async def _count_and_delete(bootstrap: str, topic: str) -> int:
    """How many records ``topic`` holds (end minus beginning offsets over its partitions); then delete it."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="mcdc-bench")
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
        ids = sorted(p["partition"] for t in described if not t["error_code"] for p in t["partitions"])
        partitions = [TopicPartition(topic, p) for p in ids]
        total = 0
        if partitions:
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id="mcdc-bench", group_id=None)
            await consumer.start()
            try:
                ends = await consumer.end_offsets(partitions)
                starts = await consumer.beginning_offsets(partitions)
                total = sum(ends[tp] - starts[tp] for tp in partitions)
            finally:
                await consumer.stop()
        await admin.delete_topics([topic])  # keeps the broker's state small: noida-db rewrites it every second
        return total
    finally:
        await admin.close()


async def _timed_sink(
    bootstrap: str, prefix: str, deliver: Callable[[KafkaSink], Awaitable[None]], topic: str
) -> tuple[float, int]:
    """Start a KafkaSink, send one warm-up record, then time ``deliver(sink)``; (seconds, records sent)."""
    sink = KafkaSink(f"kafka://{bootstrap}", _settings(bootstrap, prefix))
    sink.source_name = RS_NAME
    await sink.start()
    try:
        await sink.send([Message(topic, b'{"id":"warm-up"}', b"{}")])
        sent_before = sink.records
        started = time.perf_counter()
        await deliver(sink)
        wall = time.perf_counter() - started
        return wall, sink.records - sent_before
    finally:
        await sink.close()


async def _timed_raw(bootstrap: str, batches: Sequence[list[Message]], topic: str) -> tuple[float, int]:
    """A bare AIOKafkaProducer with the sink's acks, idempotence, linger and batch settings."""
    from aiokafka import AIOKafkaProducer

    defaults = producer_config((), [bootstrap])
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=defaults["linger_ms"],
        max_batch_size=defaults["max_batch_size"],
        max_request_size=defaults["max_request_size"],
        request_timeout_ms=defaults["request_timeout_ms"],
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"{}", key=b'{"id":"warm-up"}')
        sent = 0
        started = time.perf_counter()
        for batch in batches:
            futures = [await producer.send(m.topic, m.value, key=m.key) for m in batch]
            await asyncio.gather(*futures)
            sent += len(futures)
        return time.perf_counter() - started, sent
    finally:
        await producer.stop()


async def delivery(
    bootstrap: str, raws: Sequence[bytes], batch: int, repeat: int, run_id: str
) -> tuple[list[DeliveryRun], int]:
    """Every contender ``repeat`` times in alternating order; returns the runs and the records per run."""
    # the records, encoded once by the sink's own encoder (its settings, a base prefix)
    base_sink = KafkaSink(f"kafka://{bootstrap}", _settings(bootstrap, TOPIC_BASE))
    base_sink.encoder.source_name = RS_NAME
    encoded = [base_sink.encoder.encode(chunk) for chunk in _chunks(normalize_all(raws), batch)]
    records = sum(len(b) for b in encoded)
    runs: list[DeliveryRun] = []
    for rep in range(1, repeat + 1):
        order = DELIVERY_KINDS if rep % 2 else DELIVERY_KINDS[::-1]
        for kind in order:
            prefix = f"{TOPIC_BASE}-{kind.split()[-1]}-{rep}-{run_id}"
            topic = TopicNamer(prefix).data(NS)
            if kind == "mcdc write":
                events = normalize_all(raws)  # fresh events, untimed

                async def write(sink: KafkaSink, events: list[ChangeEvent] = events) -> None:
                    for chunk in _chunks(events, batch):
                        await sink.write(chunk)

                wall, sent = await _timed_sink(bootstrap, prefix, write, topic)
            elif kind == "mcdc send":
                batches = _retopic(encoded, prefix)

                async def send(sink: KafkaSink, batches: list[list[Message]] = batches) -> None:
                    for messages in batches:
                        await sink.send(messages)

                wall, sent = await _timed_sink(bootstrap, prefix, send, topic)
            else:
                wall, sent = await _timed_raw(bootstrap, _retopic(encoded, prefix), topic)
            on_broker = await _count_and_delete(bootstrap, topic)
            if sent != records or on_broker != records + 1:  # + the warm-up record
                raise harness.BenchError(
                    f"{kind}: {sent:,} records sent and {on_broker:,} on {topic}, expected {records:,} (+1 warm-up)"
                )
            run = DeliveryRun(kind, rep, topic, len(raws), sent, round(wall, 3), round(_per_s(len(raws), wall)))
            runs.append(run)
            print(f"  {rep}/{repeat} {kind:<14} {wall:7.2f} s  {run.events_per_s:>9,} events/s")
    return runs, records


# -- part 3: draining a backlog ------------------------------------------------------------------------------


@dataclass
class DrainRun:
    """One timed drain of the backlog, from process start to exit."""

    kind: str  # one of DRAIN_KINDS
    repeat: int
    wall_s: float
    events_per_s: float
    inner_s: float | None  # as the process reports it: mcdc's elapsed_s, a bare loop's time after its imports
    cpu_s: float  # the process's user + system time
    server_cpu_s: float | None  # the local source server's user + system time meanwhile
    lines: int | None  # mcdc's stdout lines; None for the bare loops, which write nothing
    counted: dict[str, int]  # the data events: mcdc's lines by value.op, the bare loops' own count by operationType


def _writer(uri: str) -> pymongo.MongoClient[dict[str, Any]]:
    """Without retryable writes: SecantusDB keeps and sorts every retryable write's reply (see bench_tail)."""
    return pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000, retryWrites=False)


def make_backlog(uri: str, ops: Sequence[Op]) -> float:
    """Apply ``ops`` on the source: runs of inserts with insert_many, the rest with bulk_write."""
    started = time.perf_counter()
    report_at = started + 10.0
    with _writer(uri) as client:
        coll = client[DB][COLL]
        i = 0
        while i < len(ops):
            j = i
            if ops[i].kind == "insert":
                while j < len(ops) and ops[j].kind == "insert":
                    j += 1
                coll.insert_many([op.doc for op in ops[i:j] if op.doc is not None], ordered=True)
            else:
                writes: list[UpdateOne | DeleteOne] = []
                while j < len(ops) and ops[j].kind != "insert":
                    op = ops[j]
                    writes.append(UpdateOne({"_id": op._id}, {"$set": op.fields}) if op.kind == "update" else
                                  DeleteOne({"_id": op._id}))  # fmt: skip
                    j += 1
                result = coll.bulk_write(writes, ordered=True)
                kinds = Counter(op.kind for op in ops[i:j])
                if (result.modified_count, result.deleted_count) != (kinds["update"], kinds["delete"]):
                    raise harness.BenchError(
                        f"the backlog's bulk_write did not change what it should: {result.bulk_api_result}"
                    )
            i = j
            if time.perf_counter() > report_at:
                print(f"  {i:>9,} / {len(ops):,} operations", flush=True)
                report_at += 10.0
    return time.perf_counter() - started


def sync_argv(source: str, checkpoint: Path) -> list[str]:
    return harness.mcdc("sync", "--source", source, "--target", "stdout", "--checkpoint", str(checkpoint),
                        "--include", INCLUDE, "--no-progress")  # fmt: skip


def catch_up_argv(source: str, checkpoint: Path) -> list[str]:
    return harness.mcdc("catch-up", "--source", source, "--target", "stdout", "--checkpoint", str(checkpoint),
                        "--include", INCLUDE, "--no-progress", "--json")  # fmt: skip


def _run_timed(argv: Sequence[str], out_path: Path, err_path: Path, timeout: float, what: str) -> tuple[float, float]:
    """Run a command with stdout and stderr to files; (seconds from start to exit, its CPU seconds). Raises on
    failure."""
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise harness.BenchError(f"{what} did not finish within {timeout:.0f} s") from None
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # only this child was reaped meanwhile
    if code != 0:
        raise harness.BenchError(f"{what} exited {code}:\n{err_path.read_text(errors='replace')[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _local_server(uri: str) -> psutil.Process | None:
    """The source server process when this script started it (a child listening on the URI's port)."""
    port = str(urlsplit(uri).port)
    for child in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            argv = child.cmdline()
            if "--port" in argv[:-1] and argv[argv.index("--port") + 1] == port:
                return child
    return None


def _cpu(proc: psutil.Process | None) -> float | None:
    if proc is None:
        return None
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


def _count_mcdc(path: Path) -> tuple[int, dict[str, int]]:
    """(lines, lines per data op letter) of mcdc's stdout (debezium envelope lines)."""
    ops: Counter[str] = Counter()
    lines = 0
    with open(path, "rb") as out:
        for line in out:
            lines += 1
            op = orjson.loads(line).get("value", {}).get("op")
            if op in ("c", "u", "d", "r"):
                ops[op] += 1
    return lines, dict(ops)


def _bare_report(err_path: Path) -> tuple[dict[str, int], float | None]:
    """What a bare loop saw and its in-process seconds: the JSON line it ends its stderr with."""
    lines = err_path.read_text(errors="replace").splitlines()
    try:
        said = orjson.loads(lines[-1])
        return {k: int(v) for k, v in said["seen"].items()}, float(said["elapsed_s"])
    except (IndexError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise harness.BenchError(f"a bare loop ended without its report on stderr: {lines[-5:]}") from None


def _summary_elapsed(err_path: Path) -> float | None:
    """mcdc's --json summary (indented JSON, last thing on stderr when events own stdout): its elapsed_s."""
    text = err_path.read_text(errors="replace")
    start = text.rfind("\n{\n") + 1 if not text.startswith("{\n") else 0
    try:
        return float(orjson.loads(text[start:])["elapsed_s"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _bare_start(checkpoint: Path) -> str:
    """The checkpoint's position as keyword arguments of watch(), canonical extended JSON."""
    saved = CheckpointStore(checkpoint).load()
    if saved is None:
        raise harness.BenchError(f"mcdc sync wrote no checkpoint at {checkpoint}")
    position = saved.position
    if position.resume_token is not None:
        start: dict[str, Any] = {"resume_after": position.resume_token}
    elif position.cluster_time is not None:
        start = {"start_at_operation_time": position.cluster_time}
    else:
        raise harness.BenchError(f"the checkpoint {checkpoint} holds no stream position")
    return json_util.dumps(start, json_options=json_util.CANONICAL_JSON_OPTIONS)


def drain(source: str, workdir: Path, ops: Sequence[Op], repeat: int, server: psutil.Process | None) -> dict[str, Any]:
    """Checkpoint, backlog, then mcdc catch-up and the two bare loops, ``repeat`` times in rotating order."""
    mix = dict(Counter(op.kind for op in ops))
    want_mcdc = {"c": mix.get("insert", 0), "u": mix.get("update", 0), "d": mix.get("delete", 0)}
    want_mcdc = {k: v for k, v in want_mcdc.items() if v}
    checkpoint = workdir / "drain.json"
    for stale in workdir.glob("drain.json*"):
        stale.unlink()
    with _writer(source) as client:
        client.drop_database(DB)
        client[DB].create_collection(COLL)
    argv = sync_argv(source, checkpoint)
    print(f"$ {harness.show(argv)} > /dev/null")
    sync_s, _ = _run_timed(argv, Path(os.devnull), workdir / "sync.err", 300, "mcdc sync")
    start = _bare_start(checkpoint)
    saved = workdir / "drain.json.saved"
    shutil.copyfile(checkpoint, saved)
    print(f"checkpoint made in {sync_s:.2f} s; making the backlog of {len(ops):,} change events ({mix})", flush=True)
    build_s = make_backlog(source, ops)
    print(f"backlog made in {build_s:.1f} s")
    timeout = max(600.0, len(ops) / 20)
    runs: list[DrainRun] = []
    mcdc_argv = catch_up_argv(source, checkpoint)
    bare_args = [source, start, DB, str(len(ops))]
    commands = {"mcdc": harness.show(mcdc_argv) + " > FILE"}
    for kind, (name, _) in BARE_LOOPS.items():
        commands[kind] = (
            harness.show(["python", "-c", name, *bare_args]) + f" > /dev/null  ({name}: drain.bare_loops in --json)"
        )
    for rep in range(1, repeat + 1):
        shift = (rep - 1) % len(DRAIN_KINDS)  # each contender first, second and third in turn
        for kind in DRAIN_KINDS[shift:] + DRAIN_KINDS[:shift]:
            step = f"drain-{rep}-{DRAIN_KINDS.index(kind)}"
            out_path, err_path = workdir / f"{step}.out", workdir / f"{step}.err"
            server_before = _cpu(server)
            if kind == "mcdc catch-up":
                for stale in workdir.glob("drain.json*"):
                    if stale != saved:
                        stale.unlink()
                shutil.copyfile(saved, checkpoint)
                wall, cpu = _run_timed(mcdc_argv, out_path, err_path, timeout, "mcdc catch-up")
                inner = _summary_elapsed(err_path)
                lines, counted = _count_mcdc(out_path)
                out_path.unlink()  # tens of MB
                want: dict[str, int] = want_mcdc
                said = f"{lines:,} lines"
            else:
                bare_argv = [sys.executable, "-c", BARE_LOOPS[kind][1], *bare_args]
                wall, cpu = _run_timed(bare_argv, Path(os.devnull), err_path, timeout, kind)
                counted, inner = _bare_report(err_path)
                lines, want, said = None, mix, "no output"
            server_after = _cpu(server)
            if counted != want:
                raise harness.BenchError(f"{kind} counted these data events: {counted}, expected {want}")
            server_cpu = None if server_before is None or server_after is None else server_after - server_before
            run = DrainRun(
                kind, rep, round(wall, 3), round(_per_s(len(ops), wall)), inner, round(cpu, 2),
                None if server_cpu is None else round(server_cpu, 2), lines, counted,
            )  # fmt: skip
            runs.append(run)
            print(f"  {rep}/{repeat} {kind:<19} {wall:7.2f} s  {run.events_per_s:>9,} events/s  ({said})")
    return {
        "events": len(ops),
        "mix": mix,
        "checkpoint_s": round(sync_s, 2),
        "backlog_build_s": round(build_s, 2),
        "runs": [asdict(r) for r in runs],
        "commands": commands,
        "bare_loops": dict(BARE_LOOPS.values()),
    }


# -- report ---------------------------------------------------------------------------------------------------


def _summarize(runs: Sequence[dict[str, Any]], kinds: Sequence[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        mine = [r for r in runs if r["kind"] == kind]
        best = max(mine, key=lambda r: r["events_per_s"])
        out[kind] = {
            "best_events_per_s": best["events_per_s"],
            "median_events_per_s": round(statistics.median(r["events_per_s"] for r in mine)),
            "best_wall_s": best["wall_s"],
        }
    return out


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def figures(parts: dict[str, Any], args: argparse.Namespace, command: str, server: str, broker: str) -> dict[str, Any]:
    """Everything printed, as one JSON-able dict."""
    targets: dict[str, bool] = {}
    data: dict[str, Any] = {
        "note": f"source: {server}; broker: {broker}; only same-run ratios mean anything",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "aiokafka": importlib.metadata.version("aiokafka"),
        "mcdc_code": harness.code_version(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "events": parts["events"],
    }
    if "delivery" in parts:
        d = parts["delivery"]
        summary = _summarize(d["runs"], DELIVERY_KINDS)
        raw = summary["raw aiokafka"]
        d["summary"] = summary
        d["ratio_write_raw"] = _ratio(summary["mcdc write"]["best_events_per_s"], raw["best_events_per_s"])
        d["ratio_write_raw_median"] = _ratio(summary["mcdc write"]["median_events_per_s"], raw["median_events_per_s"])
        d["ratio_send_raw"] = _ratio(summary["mcdc send"]["best_events_per_s"], raw["best_events_per_s"])
        d["ratio_send_raw_median"] = _ratio(summary["mcdc send"]["median_events_per_s"], raw["median_events_per_s"])
        median, best = d["ratio_write_raw_median"], d["ratio_write_raw"]
        repeats = data["args"]["repeat"]
        targets[
            f"delivery: events/s KafkaSink.write / raw aiokafka >= {RATIO_TARGET:g}, median of {repeats} repeat(s): "
            f"{median:.2f} (best {best:.2f})"
        ] = median >= RATIO_TARGET
        data["delivery"] = d
    if "cpu" in parts:
        c = parts["cpu"]
        total = c["small"]["envelopes"]["debezium"]["normalize_and_encode"]["us_per_event"]
        size = c["small"]["documents"]["avg_doc_bytes"]
        targets[
            f"CPU: normalize + encode (debezium, small ~{size} B documents) <= {CPU_TARGET_US:g} µs/event: "
            f"{total:.2f} µs"
        ] = total <= CPU_TARGET_US
        data["cpu"] = c
    if "drain" in parts:
        r = parts["drain"]
        summary = _summarize(r["runs"], DRAIN_KINDS)
        r["summary"] = summary
        mcdc_s = summary["mcdc catch-up"]
        for bare, key in (("bare pymongo (dict)", "ratio_bare_dict"), ("bare pymongo (raw)", "ratio_bare_raw")):
            r[key] = _ratio(mcdc_s["best_events_per_s"], summary[bare]["best_events_per_s"])
            r[f"{key}_median"] = _ratio(mcdc_s["median_events_per_s"], summary[bare]["median_events_per_s"])
        best, median = r["ratio_bare_dict"], r["ratio_bare_dict_median"]
        targets[
            f"drain: events/s mcdc catch-up / bare pymongo (dict) >= {RATIO_TARGET:g}, best: {best:.2f} "
            f"(median {median:.2f})"
        ] = best >= RATIO_TARGET
        data["drain"] = r
    data["targets"] = targets
    data["commands"] = {"benchmark": command}  # parts 1 and 2 run in it; part 3 runs these:
    if "drain" in data:
        data["commands"].update(data["drain"].pop("commands"))
    return data


def _print_cpu(title: str, c: dict[str, Any]) -> None:
    """One document size of part 2: normalize, then a row per envelope."""
    docs, n = c["documents"], c["normalize"]
    print(f"   {title}")
    print(f"   documents ~{docs['avg_doc_bytes']:,} BSON bytes, raw change events ~{docs['avg_change_bytes']:,} bytes")
    print(f"   normalize_change (RawBSONDocument -> ChangeEvent): {n['us_per_event']:.2f} µs/event, "
          f"{n['events_per_s']:,} events/s")  # fmt: skip
    print(f"   {'envelope':<24}{'encode µs':>10}{'events/s':>11}{'normalize+encode µs':>21}{'events/s':>11}"
          f"{'value bytes':>13}")  # fmt: skip
    for name, e in c["envelopes"].items():
        enc, both = e["encode"], e["normalize_and_encode"]
        print(
            f"   {name:<24}{enc['us_per_event']:>10.2f}{enc['events_per_s']:>11,}{both['us_per_event']:>21.2f}"
            f"{both['events_per_s']:>11,}{e['avg_value_bytes']:>13,}"
        )


def print_report(data: dict[str, Any]) -> None:
    ev = data["events"]
    harness.heading("Results")
    print(data["note"])
    print(f"{data['cpus']} CPUs, Python {data['python']}, aiokafka {data['aiokafka']}; mcdc code: {data['mcdc_code']}")
    print(f"in-process parts run with mcdc's GC thresholds {GC_THRESHOLDS} (python -m replicator.cli sets them)")
    mix = ", ".join(f"{n:,} {kind}" for kind, n in ev["mix"].items())
    print(
        f"change events: {ev['count']:,} on {DB}.{COLL} ({mix}); documents ~{ev['avg_doc_bytes']} BSON bytes, "
        f"raw change events ~{ev['avg_change_bytes']} bytes"
    )
    if "delivery" in data:
        d = data["delivery"]
        print()
        print(
            f"1. delivery into Kafka: {ev['count']:,} events = {d['records']:,} records (a tombstone per delete), "
            f"batches of {data['args']['batch']:,},"
        )
        print(f"   acks=all, idempotent, linger_ms {d['linger_ms']}, max_batch_size {d['max_batch_size']:,}")
        print(f"   {'contender':<42}{'best ev/s':>11}{'median ev/s':>13}{'best wall s':>13}")
        labels = {
            "mcdc write": "KafkaSink.write (encoding included)",
            "mcdc send": "KafkaSink.send (pre-encoded)",
            "raw aiokafka": "raw AIOKafkaProducer (pre-encoded)",
        }
        for kind, s in d["summary"].items():
            print(
                f"   {labels[kind]:<42}{s['best_events_per_s']:>11,}{s['median_events_per_s']:>13,}"
                f"{s['best_wall_s']:>13.2f}"
            )
        print(f"   ratio write/raw {d['ratio_write_raw']:>6.2f}   (median {d['ratio_write_raw_median']:.2f})")
        print(f"   ratio send/raw  {d['ratio_send_raw']:>6.2f}   (median {d['ratio_send_raw_median']:.2f})")
    if "cpu" in data:
        c = data["cpu"]
        print()
        print(f"2. CPU per event, no I/O, in process: best of {c['small']['rounds']} rounds")
        large_n = c["large"]["events"]
        _print_cpu(f"small documents: {c['small']['events']:,} events (--events)", c["small"])
        steps = c["small"]["steps"]
        print(
            "   of which C steps any Python path runs (µs/event): "
            + ", ".join(f"{name.replace('_', ' ')} {us:.2f}" for name, us in steps.items())
        )
        _print_cpu(
            f"large documents: {large_n:,} events (--events / 10, at least {LARGE_MIN_EVENTS:,}, at most --events)",
            c["large"],
        )
    if "drain" in data:
        r = data["drain"]
        print()
        print(
            f"3. drain of a backlog of {r['events']:,} change events from process start to exit, in rotating order "
            f"(checkpoint by mcdc sync in {r['checkpoint_s']:.2f} s, backlog made in {r['backlog_build_s']:.1f} s)"
        )
        print(
            f"   {'contender':<44}{'best ev/s':>11}{'median ev/s':>13}{'best wall s':>13}{'in-process s':>14}"
            f"{'CPU s':>8}{'server CPU s':>14}"
        )
        labels = {
            "mcdc catch-up": "mcdc catch-up --target stdout (to a file)",
            "bare pymongo (dict)": "bare pymongo watch(), dict, no output",
            "bare pymongo (raw)": "bare pymongo watch(), raw BSON, no output",
        }
        for kind, s in r["summary"].items():
            best = max((x for x in r["runs"] if x["kind"] == kind), key=lambda x: x["events_per_s"])
            inner = "-" if best["inner_s"] is None else f"{best['inner_s']:.2f}"
            server = "-" if best["server_cpu_s"] is None else f"{best['server_cpu_s']:.2f}"
            print(
                f"   {labels[kind]:<44}{s['best_events_per_s']:>11,}{s['median_events_per_s']:>13,}"
                f"{s['best_wall_s']:>13.2f}{inner:>14}{best['cpu_s']:>8.2f}{server:>14}"
            )
        print(f"   ratio mcdc/bare-dict {r['ratio_bare_dict']:>6.2f}   (median {r['ratio_bare_dict_median']:.2f})")
        print(f"   ratio mcdc/bare-raw  {r['ratio_bare_raw']:>6.2f}   (median {r['ratio_bare_raw_median']:.2f})")
        print(
            "   (of the best run: in-process = mcdc's summary elapsed_s, a bare loop's time after its imports; "
            "CPU = the process's user + system; server CPU = the local source server's meanwhile)"
        )
    print()
    harness.print_verdicts(data["targets"], data["commands"])


# -- main ---------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace, command: str) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    ops = plan_ops(args.events)
    raws = change_documents(ops)
    events = describe(ops, raws)
    parts: dict[str, Any] = {"events": events}
    server = broker = "not used"
    with ExitStack() as stack:
        workdir = stack.enter_context(harness.work_dir(args.logdir, "mcdc-bench-kafka-"))
        if not args.skip_delivery:
            if args.bootstrap:
                bootstrap, broker = args.bootstrap, f"the Kafka broker at {args.bootstrap}"
            else:
                harness.heading("Starting a local noida-db Kafka-protocol broker")
                bootstrap = stack.enter_context(harness.local_kafka(workdir / "kafka"))
                broker = f"noida-db {importlib.metadata.version('noida-db')} (a small Kafka-protocol server)"
            print(f"bootstrap: {bootstrap}")
            harness.heading(
                f"Part 1: delivery of {len(raws):,} events into Kafka, batches of {args.batch:,}, "
                f"{args.repeat} repeat(s) in alternating order"
            )
            runs, records = asyncio.run(delivery(bootstrap, raws, args.batch, args.repeat, run_id))
            defaults = producer_config((), [bootstrap])
            parts["delivery"] = {
                "records": records,
                "linger_ms": defaults["linger_ms"],
                "max_batch_size": defaults["max_batch_size"],
                "runs": [asdict(r) for r in runs],
            }
        if not args.skip_cpu:
            large_n = min(len(ops), max(LARGE_MIN_EVENTS, len(ops) // 10))
            harness.heading(
                f"Part 2: CPU of normalize + encode, best of {args.cpu_rounds} rounds over {len(raws):,} events of "
                f"small documents, then {large_n:,} of large ones"
            )
            print(f"  small documents (~{events['avg_doc_bytes']:,} BSON bytes):")
            small = cpu_costs(raws, args.batch, args.cpu_rounds, tuple(ENVELOPES))
            small["steps"] = step_costs(raws, args.batch, args.cpu_rounds)
            large_ops = plan_ops(large_n, make=make_large_doc)
            large_raws = change_documents(large_ops)
            large_events = describe(large_ops, large_raws)
            del large_ops  # the timed passes see raw bytes: the large documents' dicts are not left to the GC
            print(f"  large documents (~{large_events['avg_doc_bytes']:,} BSON bytes):")
            large = cpu_costs(large_raws, args.batch, args.cpu_rounds, LARGE_ENVELOPES)
            del large_raws
            parts["cpu"] = {"small": {**small, "documents": events}, "large": {**large, "documents": large_events}}
        if not args.skip_drain:
            if args.source:
                source, server = args.source, "the given MongoDB"
            else:
                harness.heading("Starting local SecantusDB servers")
                pair = stack.enter_context(harness.local_servers(workdir / "servers"))
                source = pair.source_uri
                server = f"SecantusDB {importlib.metadata.version('SecantusDB')}, a Python server"
            print(f"source: {source}")
            harness.heading(
                f"Part 3: drain of a backlog of {len(ops):,} change events, {args.repeat} repeat(s) in rotating order"
            )
            parts["drain"] = drain(source, workdir, ops, args.repeat, None if args.source else _local_server(source))
        return figures(parts, args, command, server, broker)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(parser, events=(50_000, "change events"))
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each contender (default 3)")
    parser.add_argument("--batch", type=int, default=1_000, help="events per write/send batch (default 1000)")
    parser.add_argument("--cpu-rounds", type=int, default=5, help="rounds of part 2, the best counts (default 5)")
    parser.add_argument("--source", help="use this MongoDB (replica set) as the source: only bench_kafka is touched")
    parser.add_argument("--bootstrap", help="use this Kafka broker (HOST:PORT): topics mcdc-bench-* are made")
    parser.add_argument("--skip-delivery", action="store_true", help="skip part 1 (delivery into Kafka)")
    parser.add_argument("--skip-cpu", action="store_true", help="skip part 2 (CPU per event)")
    parser.add_argument("--skip-drain", action="store_true", help="skip part 3 (drain of a backlog)")
    parser.add_argument("--logdir", type=Path, help="keep outputs and the checkpoint here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.error_if(
        lambda a: a.events < 2 or a.repeat < 1 or a.batch < 1 or a.cpu_rounds < 1,
        "--events must be at least 2; --repeat, --batch and --cpu-rounds at least 1",
    )
    gc.set_threshold(*GC_THRESHOLDS)  # the in-process parts run with the GC settings of mcdc's CLI
    command = harness.show(["python", "scripts/bench_kafka.py", *(sys.argv[1:] if argv is None else argv)])
    return harness.main("bench_kafka", parser, argv, lambda parsed: bench(parsed, command), print_report)


if __name__ == "__main__":
    sys.exit(main())
