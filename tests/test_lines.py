"""--target stdout / jsonl:PATH: JSON lines a consumer can rebuild the source from; quiet exit into `head`."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pymongo
import pytest

from replicator.events import CollectionSpec, Namespace
from replicator.events.normalize import snapshot_read
from replicator.settings.config import Settings
from replicator.settings.resolve import resolve
from replicator.sinks.lines import LineSink
from tests.support.corpus import load_bulk, load_corpus
from tests.support.rebuild import assert_same, rebuild_lines, server_docs


def _mcdc(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args, "--no-progress"], capture_output=True, timeout=timeout
    )


async def test_jsonl_file_is_fsynced_per_batch_and_a_cut_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"op":"r","whole":1}\n{"op":"r","cut sh')  # a crash in the middle of a line
    settings = resolve({"source": "mongodb://a:1", "target": f"jsonl:{path}"}, env={})
    sink = LineSink(settings.target, settings)
    async with sink:
        await sink.write([snapshot_read(Namespace("d", "c"), {"_id": i, "v": "x"}) for i in range(3)])
    lines = path.read_bytes().splitlines()
    assert lines[0] == b'{"op":"r","whole":1}' and len(lines) == 4 and sink.lines == 3
    expected = [f'{{"_id":{{"$numberInt":"{i}"}},"v":"x"}}' for i in range(3)]
    records = [json.loads(line) for line in lines[1:]]
    assert [r["value"]["after"] for r in records] == expected
    assert {r["topic"] for r in records} == {"mcdc.d.c"} and records[0]["key"] == {"id": '{"$numberInt":"0"}'}


def _jsonl_settings(path: Path, cp: Path, *, drop_target: bool = False) -> Settings:
    return resolve(
        {"source": "mongodb://a:1", "target": f"jsonl:{path}", "checkpoint": cp, "drop_target": drop_target}, env={}
    )


_NS = Namespace("d", "c")


async def test_a_jsonl_file_with_records_met_by_a_new_checkpoint_is_named_as_holding_data(tmp_path: Path) -> None:
    path, cp = tmp_path / "events.jsonl", tmp_path / "cp.json"
    path.write_bytes(b'{"a":1}\n{"a":2}\n')
    sink = LineSink(f"jsonl:{path}", _jsonl_settings(path, cp))
    async with sink:
        assert await sink.existing([_NS, Namespace("d", "e")]) == [Namespace(str(path))]  # sync refuses, naming it
        await sink.prepare([CollectionSpec(_NS, "collection", {})], drop_existing=False)
    assert path.read_bytes() == b'{"a":1}\n{"a":2}\n'
    empty = tmp_path / "empty.jsonl"
    async with LineSink(f"jsonl:{empty}", _jsonl_settings(empty, cp)) as fresh:
        assert await fresh.existing([_NS]) == []
    stdout = resolve({"source": "mongodb://a:1", "target": "stdout"}, env={})
    async with LineSink("stdout", stdout) as out:
        assert await out.existing([_NS]) == []


async def test_drop_target_truncates_the_file_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, cp = tmp_path / "events.jsonl", tmp_path / "cp.json"
    path.write_bytes(b'{"a":1}\n')
    sink = LineSink(f"jsonl:{path}", _jsonl_settings(path, cp, drop_target=True))
    async with sink:
        with caplog.at_level(logging.INFO, logger="mcdc"):
            await sink.prepare([CollectionSpec(_NS, "collection", {})], drop_existing=True)
        assert path.read_bytes() == b""
        await sink.write([snapshot_read(_NS, {"_id": 1})])
    assert len(path.read_bytes().splitlines()) == 1
    assert any(str(path) in r.getMessage() and "--drop-target" in r.getMessage() for r in caplog.records)


async def test_a_jsonl_file_continued_under_its_own_checkpoint_is_appended_to(tmp_path: Path) -> None:
    path, cp = tmp_path / "events.jsonl", tmp_path / "cp.json"
    path.write_bytes(b'{"a":1}\n')
    cp.write_text("{}")  # the checkpoint of the run that wrote the file: catch-up, tail, a resumed snapshot
    for drop_target in (False, True):
        sink = LineSink(f"jsonl:{path}", _jsonl_settings(path, cp, drop_target=drop_target))
        async with sink:
            assert await sink.existing([_NS]) == []  # a new snapshot under it (history lost) appends too
            # what a resumed snapshot prepares: the namespaces created since it began
            await sink.prepare([CollectionSpec(_NS, "collection", {})], drop_existing=True)
            await sink.prepare([], drop_existing=True)
            await sink.write([snapshot_read(_NS, {"_id": 1})])
    assert len(path.read_bytes().splitlines()) == 3


@pytest.mark.integration
def test_a_second_snapshot_into_a_jsonl_file_needs_drop_target(source_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.work.a.insert_many([{"_id": i} for i in range(5)])
    path = tmp_path / "events.jsonl"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    sync = ("sync", "-s", source_uri, "-t", f"jsonl:{path}")
    assert _mcdc(*sync, "-c", str(first)).returncode == 0
    assert len(path.read_bytes().splitlines()) == 5
    with pymongo.MongoClient(source_uri) as client:
        client.work.a.insert_one({"_id": 5})
    out = _mcdc("catch-up", "-s", source_uri, "-t", f"jsonl:{path}", "-c", str(first))
    assert out.returncode == 0, out.stderr
    assert len(path.read_bytes().splitlines()) == 6  # the same checkpoint appends
    before = path.read_bytes()

    out = _mcdc(*sync, "-c", str(second))  # another migration into the file the first one writes: refused
    lines = [line for line in out.stderr.decode().splitlines() if line.strip()]
    assert out.returncode == 2 and lines[-1].startswith("mcdc: error: ") and "Traceback" not in out.stderr.decode()
    assert f"--checkpoint {first}" in lines[-1] and "--snapshot always" in lines[-1] and "delete" not in lines[-1]
    assert path.read_bytes() == before and not second.exists()

    out = _mcdc(*sync, "-c", str(first), "--snapshot", "always")  # the advice: that migration, copied again
    assert out.returncode == 0, out.stderr
    assert path.read_bytes().startswith(before) and len(path.read_bytes().splitlines()) == 12  # its reads, after

    out = _mcdc(*sync, "-c", str(second), "--drop-target")  # another one's --drop-target: still refused
    assert out.returncode == 2 and f"--checkpoint {first}" in out.stderr.decode()
    assert len(path.read_bytes().splitlines()) == 12
    before = path.read_bytes()

    first.unlink()  # its owner ends the first migration
    out = _mcdc(*sync, "-c", str(second))  # a second snapshot would mix with the first one's records
    lines = [line for line in out.stderr.decode().splitlines() if line.strip()]
    assert out.returncode == 2 and lines[-1].startswith("mcdc: error: ") and "Traceback" not in out.stderr.decode()
    assert str(path) in lines[-1] and "--drop-target" in lines[-1]
    assert path.read_bytes() == before

    out = _mcdc(*sync, "-c", str(second), "--drop-target")
    assert out.returncode == 0, out.stderr
    assert f"truncated {path}" in out.stderr.decode()
    values = [json.loads(line)["value"] for line in path.read_bytes().splitlines()]
    assert len(values) == 6 and {v["op"] for v in values} == {"r"}


@pytest.mark.integration
def test_sync_to_stdout_then_catch_up_rebuilds_the_source_exactly(source_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_corpus(client, mixed_count=300)
    cp = str(tmp_path / "cp.json")
    first = _mcdc("sync", "-s", source_uri, "-t", "stdout", "-c", cp)
    assert first.returncode == 0, first.stderr.decode()
    assert b"sync finished" in first.stderr  # the summary goes to stderr when events own stdout
    with pymongo.MongoClient(source_uri) as client:
        coll = client.corpus.mixed_ids
        some = [d["_id"] for d in coll.find({}, {"_id": 1}).limit(30)]
        coll.update_one({"_id": some[0]}, {"$set": {"changed": True}})
        coll.delete_one({"_id": some[1]})
        coll.replace_one({"_id": some[2]}, {"replaced": 1})
        with client.start_session() as s, s.start_transaction():
            coll.insert_one({"_id": "in-txn"}, session=s)
            coll.delete_one({"_id": some[3]}, session=s)
        # system databases never reach a sink (mongod leaves them out of the stream; some servers do not)
        for system in (client.admin, client.config):
            system.mcdc_probe.insert_one({"_id": 1})
            system.mcdc_probe.drop()
    second = _mcdc("catch-up", "-s", source_uri, "-t", "-", "-c", cp)
    assert second.returncode == 0, second.stderr.decode()
    lines = first.stdout.splitlines() + second.stdout.splitlines()
    ops = [json.loads(line)["value"]["op"] for line in second.stdout.splitlines()]
    assert ops.count("u") == 2 and ops.count("d") == 2 and ops.count("c") == 1
    assert b"mcdc_probe" not in second.stdout
    assert_same(rebuild_lines(lines), server_docs(source_uri))


@pytest.mark.integration
def test_tail_into_head_exits_0_quietly(source_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i, "pad": "x" * 2000} for i in range(3000)])
    cmd = [sys.executable, "-m", "replicator.cli", "tail", "-s", source_uri, "-t", "-", "-c", str(tmp_path / "cp")]
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", " ".join(f"'{a}'" for a in cmd) + " --no-progress | head -n 3"],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout.splitlines()) == 3 and all(
        json.loads(line)["value"]["op"] == "r" for line in proc.stdout.splitlines()
    )
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr and b"error" not in proc.stderr


@pytest.mark.integration
def test_plain_format_lines(source_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1, "n": 2})
    out = _mcdc("sync", "-s", source_uri, "-t", "stdout", "-c", str(tmp_path / "cp"), "--format", "plain")
    assert out.returncode == 0, out.stderr.decode()
    [line] = out.stdout.splitlines()
    event = json.loads(line)
    assert event["op"] == "r" and event["ns"] == "db.c"
    assert event["document"] == {"_id": {"$numberInt": "1"}, "n": {"$numberInt": "2"}}


@pytest.mark.integration
def test_pre_images_fill_before(source_uri: str, tmp_path: Path) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
        client.db.c.insert_many([{"_id": 1, "v": "old"}, {"_id": 2, "v": "gone"}])
    cp = str(tmp_path / "cp")
    assert _mcdc("sync", "-s", source_uri, "-t", "stdout", "-c", cp).returncode == 0
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.update_one({"_id": 1}, {"$set": {"v": "new"}})
        client.db.c.delete_one({"_id": 2})
    out = _mcdc("catch-up", "-s", source_uri, "-t", "stdout", "-c", cp, "--pre-images", "whenAvailable")
    assert out.returncode == 0, out.stderr.decode()
    values = [json.loads(line)["value"] for line in out.stdout.splitlines()]
    befores = {v["op"]: json.loads(v["before"]) for v in values}
    assert befores == {"u": {"_id": {"$numberInt": "1"}, "v": "old"}, "d": {"_id": {"$numberInt": "2"}, "v": "gone"}}


async def test_a_failed_write_leaves_no_half_batch_and_a_full_disk_is_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from replicator.errors import SinkUnavailable
    from replicator.sinks import lines as lines_module

    path = tmp_path / "events.jsonl"
    settings = resolve({"source": "mongodb://a:1", "target": f"jsonl:{path}"}, env={})
    sink = LineSink(settings.target, settings)
    real_write = os.write
    calls = {"n": 0}

    def full_disk_after_10_bytes(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")

    events = [snapshot_read(Namespace("d", "c"), {"_id": i}) for i in range(3)]
    async with sink:
        await sink.write(events[:1])
        before = path.read_bytes()
        monkeypatch.setattr(lines_module.os, "write", full_disk_after_10_bytes)
        with pytest.raises(SinkUnavailable, match="No space left"):
            await sink.write(events[1:])
        assert path.read_bytes() == before  # the 10 bytes written are gone again
        monkeypatch.setattr(lines_module.os, "write", real_write)
        await sink.write(events[1:])  # the retry
    assert [json.loads(line)["key"] for line in path.read_bytes().splitlines()] == [
        {"id": f'{{"$numberInt":"{i}"}}'} for i in range(3)
    ]


async def test_deprecated_bson_types_reach_the_lines_in_the_specs_canonical_form(tmp_path: Path) -> None:
    """Symbol, Undefined and DBPointer in a document, through the line sink's whole encoding. The test
    server cannot show them end to end: it stores them as a string, null and a DBRef document (checked
    with plain pymongo), so the raw document is given to the sink as the stream would hand it over."""
    from replicator.bsonkit.rawbson import RAW_CODEC, RawDocument
    from replicator.events import ChangeEvent, Namespace, Op, Position

    body = (
        b"\x10_id\x00" + (1).to_bytes(4, "little")
        + b"\x0esym\x00\x04\x00\x00\x00abc\x00"
        + b"\x06und\x00"
        + b"\x0cptr\x00\x02\x00\x00\x00b\x00" + bytes.fromhex("56e1fc72e0c917e9c4714161")
    )  # fmt: skip
    doc = RawDocument((len(body) + 5).to_bytes(4, "little") + body + b"\x00", RAW_CODEC)
    path = tmp_path / "events.jsonl"
    settings = resolve({"source": "mongodb://a:1", "target": f"jsonl:{path}"}, env={})
    event = ChangeEvent(Op.INSERT, Namespace("old", "types"), key={"_id": 1}, document=doc, position=Position())
    async with LineSink(f"jsonl:{path}", settings) as sink:
        await sink.write([event])
    after = json.loads(json.loads(path.read_text().splitlines()[0])["value"]["after"])
    assert after == {
        "_id": {"$numberInt": "1"}, "sym": {"$symbol": "abc"}, "und": {"$undefined": True},
        "ptr": {"$dbPointer": {"$ref": "b", "$id": {"$oid": "56e1fc72e0c917e9c4714161"}}},
    }  # fmt: skip


@pytest.mark.integration
def test_the_snapshots_final_read_alone_is_marked_last_as_debezium_marks_it(source_uri: str, tmp_path: Path) -> None:
    """Several collections copied at once, one in several _id ranges, empty ones among them (copied last,
    being smallest): the one read written last says ``snapshot: last``, every other ``true``."""
    with pymongo.MongoClient(source_uri) as client:
        client.shop.big.insert_many([{"_id": i, "n": i} for i in range(600)])
        client.shop.small.insert_many([{"_id": i} for i in range(3)])
        for name in ("empty1", "empty2"):
            client.shop.create_collection(name)
    cp = str(tmp_path / "cp.json")
    args = ("--split", "always", "--partition-docs", "150", "--batch-docs", "40", "--workers", "3")
    run = _mcdc("sync", "-s", source_uri, "-t", "stdout", "-c", cp, "--include", r"shop\..*", *args)
    assert run.returncode == 0, run.stderr.decode()
    values = [json.loads(line)["value"] for line in run.stdout.splitlines()]
    marks = [v["source"]["snapshot"] for v in values if v is not None and v["op"] == "r"]
    assert len(marks) == 603 and marks.count("last") == 1 and marks[-1] == "last"
    assert {v["source"]["ord"] for v in values if v is not None and v["op"] == "r"} == {-1}


@pytest.mark.integration
def test_a_snapshot_killed_and_resumed_marks_the_last_read_of_the_resumed_copy(source_uri: str, tmp_path: Path) -> None:
    """kill -9 mid-snapshot into a jsonl file, run again: the file's final read is the one marked last, and
    no other (the killed run never reached its end)."""
    with pymongo.MongoClient(source_uri) as client:
        load_bulk(client, "crash", "a", 6000, doc_size=200)
        load_bulk(client, "crash", "b", 2000, doc_size=200, seed=1)
    cp, out = tmp_path / "cp.json", tmp_path / "records.jsonl"
    args = [sys.executable, "-m", "replicator.cli", "sync", "-s", source_uri, "-t", f"jsonl:{out}", "-c", str(cp)]
    args += ["--partition-docs", "1000", "--split", "always", "--batch-docs", "100", "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (cp.exists() and len(json.loads(cp.read_text() or "{}").get("snapshot", {}).get("done", [])) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the snapshot ended before the kill point"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads(cp.read_text())["snapshot"]["status"] == "in_progress"
    again = subprocess.run(args, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()
    values = [json.loads(line)["value"] for line in out.read_text().splitlines()]
    marks = [v["source"]["snapshot"] for v in values if v is not None and v["op"] == "r"]
    assert marks.count("last") == 1 and marks[-1] == "last"
    read = {(v["source"]["collection"], v["after"]) for v in values if v is not None and v["op"] == "r"}
    assert len(read) == 8000  # every document (some twice: the killed run's last batches are sent again)
