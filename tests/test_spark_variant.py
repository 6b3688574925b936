"""``option("document-type", "variant")``: the ``mcdc`` data source's ``document`` and ``before`` columns as
Spark's VARIANT, read with ``variant_get`` and ``document:path::type`` in Spark SQL and compared with the
source's values, for a batch read and a stream (with pre-images); against the real test server and the
session's SparkSession."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from replicator.spark import register
from tests.support.servers import Clients
from tests.test_spark_datasource import stream_rows

pytestmark = pytest.mark.integration

OID = ObjectId("65f0a1b2c3d4e5f601234567")
WHEN = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=datetime.UTC)
DOCUMENT = {
    "_id": OID,
    "i": 42,
    "l": Int64(2**40 + 1),
    "d": 2.5,
    "s": "héllo",
    "sub": {"name": "inner", "n": 7, "deeper": {"ok": True}},
    "arr": [1, "two", {"three": 3}],
    "when": WHEN,
    "price": Decimal128("12.345"),
    "ts": Timestamp(1700000000, 3),
    "nothing": None,
}
#: (SQL expression, the value Spark gives for DOCUMENT): both syntaxes, every type the table of
#: docs/how-to/spark-data-source.md names.
READS = {
    "variant_get(document, '$._id', 'string')": str(OID),
    "document:i::int": 42,
    "variant_get(document, '$.l', 'bigint')": 2**40 + 1,
    "document:d::double": 2.5,
    "document:s::string": "héllo",
    "document:sub.name::string": "inner",
    "variant_get(document, '$.sub.n', 'int')": 7,
    "document:sub.deeper.ok::boolean": True,
    "document:arr[0]::int": 1,
    "document:arr[1]::string": "two",
    "variant_get(document, '$.arr[2].three', 'int')": 3,
    "document:when::timestamp": WHEN,
    "document:price::decimal(10,3)": decimal.Decimal("12.345"),
    "document:ts['$timestamp'].t::bigint": 1700000000,
    "document:nothing::string": None,
    "is_variant_null(document:nothing)": True,
    "document:missing::int": None,
}


@pytest.fixture
def mcdc(spark: Any) -> Iterator[Any]:
    register(spark)
    # Spark hands timestamps to Python in the session's time zone: compare them in UTC
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    yield spark
    spark.conf.set("spark.sql.session.timeZone", zone)


def _values(spark: Any, view: str, where: str = "true") -> dict[str, Any]:
    columns = ", ".join(f"{expr} AS c{i}" for i, expr in enumerate(READS))
    (row,) = spark.sql(f"SELECT {columns} FROM {view} WHERE {where}").collect()
    values = {expr: row[f"c{i}"] for i, expr in enumerate(READS)}
    when = values["document:when::timestamp"]
    values["document:when::timestamp"] = when.replace(tzinfo=datetime.UTC) if when is not None else None
    return values


def test_a_batch_read_gives_variant_documents_that_sql_reads_as_the_source_s_values(
    mcdc: Any, clients: Clients, source_uri: str
) -> None:
    clients.source.shop.things.insert_one(DOCUMENT)
    df = mcdc.read.format("mcdc").option("source", source_uri).option("document-type", "variant").load()
    assert df.schema["document"].dataType.typeName() == "variant"
    assert df.schema["before"].dataType.typeName() == "variant"
    assert df.schema["key"].dataType.typeName() == "string"  # the rest of the row is as with json
    df.createOrReplaceTempView("things")
    assert _values(mcdc, "things") == READS


def test_a_stream_gives_variant_documents_and_pre_images(
    mcdc: Any, clients: Clients, source_uri: str, tmp_path: Path
) -> None:
    """The snapshot first (``r`` rows, read by the stream's own snapshot tasks), then the changes."""
    clients.source.shop.create_collection("things", changeStreamPreAndPostImages={"enabled": True})
    clients.source.shop.things.insert_one({"_id": "early", "when": WHEN})
    options = {"document-type": "variant", "full-document": "updateLookup", "pre-images": "whenAvailable"}
    checkpoint = tmp_path / "cp"
    first, _ = stream_rows(mcdc, source_uri, checkpoint, snapshot="initial", **options)  # the snapshot
    clients.source.shop.things.insert_one(DOCUMENT)
    clients.source.shop.things.update_one({"_id": OID}, {"$set": {"i": 43}})
    rows, _ = stream_rows(mcdc, source_uri, checkpoint, snapshot="initial", **options)
    schema = mcdc.readStream.format("mcdc").option("source", source_uri).options(**options).load().schema
    assert schema["document"].dataType.typeName() == "variant"
    assert [row["op"] for row in rows] == ["c", "u"]
    assert [row["op"] for row in first] == ["r"]
    mcdc.createDataFrame([*first, *rows], schema).createOrReplaceTempView("changes")
    query = "SELECT document:_id::string AS id, document:when::timestamp AS t FROM changes WHERE op = 'r'"
    (read,) = mcdc.sql(query).collect()
    assert read["id"] == "early" and read["t"].replace(tzinfo=datetime.UTC) == WHEN
    assert _values(mcdc, "changes", "op = 'c'") == READS
    assert _values(mcdc, "changes", "op = 'u'") == {**READS, "document:i::int": 43}
    (before,) = mcdc.sql("SELECT before:i::int AS i, before:when::timestamp AS t FROM changes WHERE op = 'u'").collect()
    assert before["i"] == 42 and before["t"].replace(tzinfo=datetime.UTC) == WHEN


def test_a_document_type_mcdc_does_not_know_is_one_line(mcdc: Any, source_uri: str) -> None:
    with pytest.raises(Exception) as caught:
        mcdc.read.format("mcdc").option("source", source_uri).option("document-type", "xml").load()
    text = str(caught.value)
    assert text.splitlines()[0].endswith(": mcdc: option document-type must be one of json, variant, got 'xml'"), text
    assert "Traceback" not in text
