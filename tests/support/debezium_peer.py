"""Debezium's own MongoDB connector (3.6, embedded through ``pydbzengine``) as a peer to compare records with.

Run as a process of its own (``python -m tests.support.debezium_peer URI OUT ...``), so the test process
loads no JVM: it writes each record Debezium hands its consumer as one JSON line ``{"topic", "key",
"value"}`` (key and value as Kafka Connect's JsonConverter writes them, without schemas unless
``--schemas``) to OUT, flushed per batch, until it is terminated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def properties(
    uri: str, workdir: Path, prefix: str, include: str, *, schemas: bool, tx_metadata: bool, pre_images: bool = False
) -> dict[str, str]:
    """The embedded engine's configuration: mcdc's defaults where mcdc mirrors a Debezium option."""
    return {
        "name": "mcdc-peer",
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("uri")
    parser.add_argument("out", type=Path)
    parser.add_argument("--prefix", default="mcdc")
    parser.add_argument("--include", required=True, help="collection.include.list")
    parser.add_argument("--schemas", action="store_true")
    parser.add_argument("--tx-metadata", action="store_true")
    parser.add_argument("--pre-images", action="store_true", help="capture.mode ..._with_pre_image")
    args = parser.parse_args(argv)

    args.out = args.out.resolve()
    out = args.out.open("a", encoding="utf-8")
    os.chdir(args.out.parent)  # Debezium's log4j writes logs/pydbzengine.log under the working directory

    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    def text(value: Any) -> Any:
        return None if value is None else json.loads(str(value))

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:
            for record in records:
                line = {"topic": str(record.destination()), "key": text(record.key()), "value": text(record.value())}
                out.write(json.dumps(line) + "\n")
            out.flush()

    workdir = args.out.parent
    props = properties(
        args.uri, workdir, args.prefix, args.include,
        schemas=args.schemas, tx_metadata=args.tx_metadata, pre_images=args.pre_images,
    )  # fmt: skip
    DebeziumJsonEngine(properties=props, handler=Handler()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
