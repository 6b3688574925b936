"""Outages during the snapshot: the copy backs off, retries from each partition's last acknowledged _id, and
the run ends identical without a restart by hand."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest

from replicator.sinks.base import Sink
from tests.support.compare import assert_identical
from tests.support.corpus import load_bulk
from tests.support.servers import LocalServer, ServerPair, drop_user_databases

pytestmark = pytest.mark.integration

TOTAL, BATCH, WORKERS = 8_000, 10, 2
#: an outage longer than the connect timeout surfaces as an error to retry; small batches make a copy long
#: enough to stop a server in the middle of it (as variables: tail has no --batch-docs): 400 writes per
#: worker, seconds where a stop takes tenths (20,000 documents cost each test 6 s more, proving no more)
ENV = {"MCDC_CONNECT_TIMEOUT": "1", "MCDC_BATCH_DOCS": str(BATCH), "MCDC_WORKERS": str(WORKERS)}
RETRY = ("--retry-initial-delay", "0.2", "--retry-max-delay", "2")


@pytest.fixture
def local(servers: ServerPair) -> Iterator[tuple[LocalServer, LocalServer]]:
    """Both local servers, running again after the test whatever happened to them."""
    if servers.source is None or servers.target is None:
        pytest.skip("external servers cannot be stopped by the tests")
    yield servers.source, servers.target
    for server in (servers.source, servers.target):
        if not server.running:
            server.start()


Mcdc = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def mcdc() -> Iterator[Mcdc]:
    """Starts ``mcdc COMMAND -s SOURCE -t TARGET -c CHECKPOINT ...``; a run the test left behind is killed."""
    started: list[subprocess.Popen[str]] = []

    def run(command: str, source: str, target: str, cp: Path, *extra: str) -> subprocess.Popen[str]:
        args = [sys.executable, "-m", "replicator.cli", command, "-s", source, "-t", target, "-c", str(cp)]
        args += ["--no-progress", *RETRY, *extra]
        env = {**os.environ, **ENV}
        started.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        return started[-1]

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _load(source: str) -> None:
    with pymongo.MongoClient(source) as client:
        load_bulk(client, "outage", "big", TOTAL, doc_size=200)


def _wait(condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"mcdc ended before {what}: {proc.communicate()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def _copying(cp: Path) -> Callable[[], bool]:
    """True once the checkpoint records an acknowledged batch of the copy."""

    def check() -> bool:
        try:
            state: dict[str, Any] = json.loads(cp.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        return bool(state["snapshot"].get("resume")) and state["snapshot"]["status"] == "in_progress"

    return check


def _outage(server: LocalServer, seconds: float) -> None:
    server.stop()
    time.sleep(seconds)
    server.start()


@pytest.mark.parametrize(
    ("down", "seconds"),
    [
        ("target", 20),  # writes fail for 20 s
        ("source", 2),  # a restart: its open cursors are gone (CursorNotFound, or a closed connection)
    ],
)
def test_sync_rides_out_an_outage_mid_snapshot(
    local: tuple[LocalServer, LocalServer], mcdc: Mcdc, source_uri: str, target_uri: str, tmp_path: Path,
    down: str, seconds: int,
) -> None:  # fmt: skip
    _load(source_uri)
    cp = tmp_path / "cp.json"
    proc = mcdc("sync", source_uri, target_uri, cp, "--json")
    _wait(_copying(cp), proc, 60, "the copy")
    _outage(local[0] if down == "source" else local[1], seconds)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "retrying in" in err  # each attempt was logged, as the stream logs its own
    summary = json.loads(out)
    assert summary["snapshot"] == "completed" and summary["retries"] >= 1
    # each retry went on from the resume point: it wrote again at most the batches in flight (the
    # workers' write slots, each partition's batches past its acknowledged prefix)
    assert TOTAL <= summary["documents"] <= TOTAL + summary["retries"] * WORKERS * WORKERS * BATCH
    assert_identical(source_uri, target_uri)


def test_tail_first_snapshot_rides_out_a_target_outage(
    local: tuple[LocalServer, LocalServer], mcdc: Mcdc, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    _load(source_uri)
    cp = tmp_path / "cp.json"
    proc = mcdc("tail", source_uri, target_uri, cp, "--max-retries", "-1")
    _wait(_copying(cp), proc, 60, "the copy")
    _outage(local[1], 20)
    with pymongo.MongoClient(source_uri) as client:  # changes after the outage are followed too
        client.outage.big.update_one({"_id": 1}, {"$set": {"after": True}})

    def streaming() -> bool:
        state = json.loads(cp.read_text())
        return bool(state["snapshot"]["status"] == "done" and state["position"]["resume_token"])

    _wait(streaming, proc, 180, "the snapshot's end")
    deadline = time.monotonic() + 60
    while True:
        try:
            assert_identical(source_uri, target_uri)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "retrying in" in err


def test_each_resume_point_selects_exactly_the_rest_in_id_order(servers: ServerPair, source_uri: str) -> None:
    """Partition.query(after) against the server's own BSON order, for an _id of every type bracket (NaN,
    null, MinKey/MaxKey and booleans included), through the checkpoint's extended JSON, for the whole
    collection and for ranges of a split one."""
    from bson.codec_options import CodecOptions, DatetimeConversion
    from bson.raw_bson import RawBSONDocument

    from replicator.bsonkit.extjson import from_jsonable, to_jsonable
    from replicator.events import Namespace
    from replicator.source.partitions import ALL, Partition, Resume, bracket_of
    from tests.support.corpus import mixed_id_documents

    # SecantusDB sorts binary by length first, as MongoDB does, but its $gt compares the bytes alone: a
    # server quirk (mongod's $gt follows its sort order), so binary resume points are checked on mongod only
    quirky = {"binData"} if servers.source is not None else set()
    raw = CodecOptions(document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_AUTO)
    with pymongo.MongoClient(source_uri) as client:
        client.resume.mixed.insert_many(mixed_id_documents(120))
        coll = client.resume.get_collection("mixed", codec_options=raw)

        def ids(query: dict[str, Any]) -> list[bytes]:
            return [doc.raw for doc in coll.find(query, {"_id": 1}, sort=[("_id", 1)])]

        def check(part: Partition) -> None:
            docs = list(coll.find(part.query(), {"_id": 1}, sort=[("_id", 1)]))
            for k, doc in enumerate(docs):
                if bracket_of(doc["_id"]) in quirky:
                    continue
                after = Resume(from_jsonable(to_jsonable(doc["_id"])))  # as the checkpoint keeps it
                assert ids(part.query(after)) == [d.raw for d in docs[k + 1 :]], (part, doc["_id"])

        ns = Namespace("resume", "mixed")
        check(Partition(ns, 0, ALL))
        for number, bracket in enumerate(["number", "string", "objectId"]):
            values = [d["_id"] for d in coll.find(Partition(ns, 0, bracket).query(), sort=[("_id", 1)])]
            middle = values[len(values) // 2]
            check(Partition(ns, number * 2, bracket, upper=middle))
            check(Partition(ns, number * 2 + 1, bracket, lower=middle))


def _job(
    source: str, target: str, cp: Path, sink_class: type[Any], stop: asyncio.Event | None = None, **flags: Any
) -> Any:
    """An in-process SyncJob and, for it, a ``sink_class`` (a MongoSink with failures injected)."""
    from replicator.job.phases import SyncJob
    from replicator.observe.progress import LogReporter
    from replicator.settings.resolve import resolve
    from replicator.settings.selection import Scope

    settings = resolve({"source": source, "target": target, "checkpoint": cp, "retry_initial_s": 0.01, **flags}, env={})
    sink = sink_class(settings.target, timeout_s=2, scope=Scope(settings.selection, settings.renamer))
    job = SyncJob(settings, LogReporter(), command="sync", stop=stop)
    return job, sink


async def test_a_snapshot_failed_while_preparing_still_drops_what_it_had_not_prepared(
    source_uri: str, target_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --drop-target snapshot whose target failed after the first namespace was prepared: the same run
    retries it, and a later run without --drop-target resumes it; neither refuses the target it half
    prepared, and both drop the other namespace's old data before copying into it."""
    from pymongo.errors import AutoReconnect

    import replicator.job.phases
    from replicator.errors import ServerUnavailable
    from replicator.sinks.mongo.sink import MongoSink

    with pymongo.MongoClient(source_uri) as client:
        for name in ("a", "b"):
            client.prep[name].insert_many([{"_id": i, "v": name} for i in range(50)])

    class FailsMidPrepare(MongoSink):
        failures = 0

        async def prepare(self, specs: Any, *, drop_existing: bool) -> None:
            if len(specs) == 2 and FailsMidPrepare.failures < 1:
                FailsMidPrepare.failures += 1
                await super().prepare(specs[:1], drop_existing=drop_existing)
                raise AutoReconnect("target went away")
            await super().prepare(specs, drop_existing=drop_existing)

    for max_retries in (1, 0):
        drop_user_databases(target_uri)
        with pymongo.MongoClient(target_uri) as client:
            for name in ("a", "b"):
                client.prep[name].insert_one({"_id": "stale"})  # an earlier copy's document, gone from the source
        cp = tmp_path / f"cp{max_retries}.json"
        for over in tmp_path.glob("cp*.json"):  # the migration before (a wiped target's) is over
            over.unlink()
        FailsMidPrepare.failures = 0
        job, sink = _job(source_uri, target_uri, cp, FailsMidPrepare, drop_target=True, max_retries=max_retries)
        monkeypatch.setattr(replicator.job.phases, "open_sink", lambda settings, sink=sink: sink)
        if max_retries:
            summary = (await job.run()).to_json()  # retried within the run
            assert summary["retries"] == 1 and summary["snapshot"] == "completed"
        else:
            with pytest.raises(ServerUnavailable, match="gave up after 0 retries"):
                await job.run()
            job, sink = _job(source_uri, target_uri, cp, MongoSink, drop_target=False)  # the next run
            monkeypatch.setattr(replicator.job.phases, "open_sink", lambda settings, sink=sink: sink)
            assert (await job.run()).to_json()["snapshot"] == "resumed"
        assert FailsMidPrepare.failures == 1
        assert_identical(source_uri, target_uri)


async def test_a_stop_during_the_backoff_ends_the_run_at_once(
    source_uri: str, target_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while the snapshot waits to retry: the run ends without waiting the backoff out, and the
    checkpoint still holds the snapshot in progress for the next run."""
    from pymongo.errors import AutoReconnect

    import replicator.job.phases
    from replicator.sinks.mongo.sink import MongoSink

    with pymongo.MongoClient(source_uri) as client:
        client.stop.c.insert_many([{"_id": i} for i in range(100)])
    stop = asyncio.Event()

    class Down(MongoSink):
        write_copy = Sink.write_copy  # a snapshot batch through write(), which fails

        async def write(self, batch: Any) -> None:
            asyncio.get_running_loop().call_later(0.2, stop.set)
            raise AutoReconnect("target went away")

    cp = tmp_path / "cp.json"
    job, sink = _job(source_uri, target_uri, cp, Down, stop=stop, retry_initial_s=60, retry_max_s=60)
    monkeypatch.setattr(replicator.job.phases, "open_sink", lambda settings: sink)
    started = time.monotonic()
    summary = (await job.run()).to_json()
    assert time.monotonic() - started < 20 and summary["retries"] == 1
    assert json.loads(cp.read_text())["snapshot"]["status"] == "in_progress"


@pytest.mark.parametrize("reply", [b"insert\x00", b"getMore\x00"])
def test_a_request_the_server_never_answers_is_bounded_and_retried(
    mcdc: Mcdc, source_uri: str, target_uri: str, tmp_path: Path, reply: bytes
) -> None:
    """A server that took a write (or a read) and never answered, its connection left open and idle, as a
    target restarted mid-copy was seen to do: the copy hung forever. Every wait on I/O is bounded by
    --io-timeout: the operation counts as lost and the copy retries it."""
    from tests.support.proxy import wire_proxy

    _load(source_uri)
    cp = tmp_path / "cp.json"
    through = "target" if reply == b"insert\x00" else "source"  # a write, or a read of the source
    with wire_proxy(target_uri if through == "target" else source_uri) as proxy:
        source = proxy.uri if through == "source" else source_uri
        target = proxy.uri if through == "target" else target_uri
        proc = mcdc("sync", source, target, cp, "--json", "--io-timeout", "3")
        _wait(_copying(cp), proc, 60, "the copy")
        proxy.swallow_reply(reply)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert proxy.swallowed == 1
        said = "did not answer within 3 s" if through == "target" else "timed out"  # the driver's socket timeout
        assert json.loads(out)["retries"] >= 1 and said in err
    assert_identical(source_uri, target_uri)


def _measurements(uri: str, ns: str) -> Counter[bytes]:
    """Every document of ``ns`` as raw bytes, counted: measurements may share an ``_id``, so two copies of
    one would be a single entry in a map keyed by ``_id``."""
    from tests.support.compare import RAW

    db, coll = ns.split(".", 1)
    with pymongo.MongoClient(uri) as client:
        return Counter(doc.raw for doc in client.get_database(db, codec_options=RAW)[coll].find())


@pytest.mark.parametrize("max_retries", [1, 0])  # retried within the run; the next run (a kill -9 and rerun)
async def test_a_time_series_partition_copied_again_holds_each_measurement_once(
    source_uri: str, target_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_retries: int
) -> None:
    """A write into a time-series collection fails after it landed (its acknowledgement lost): the partition
    is copied again, and the target holds each measurement exactly once. Measurements' ``_id``s repeat and
    inserting them never replaces, so the range the failed attempt wrote must be deleted first; that delete
    touches neither the ranges already copied nor a target collection outside the selection.

    SecantusDB keeps the ``timeseries`` options of such a collection and, as MongoDB does, lets its ``_id``s
    repeat (it reports it as a plain collection: the planner reads the options)."""
    from pymongo.errors import AutoReconnect

    import replicator.job.phases
    from replicator.errors import ServerUnavailable
    from replicator.sinks.mongo.sink import MongoSink

    start = datetime.datetime(2024, 1, 1)
    with pymongo.MongoClient(source_uri) as client:
        client.ts.create_collection("m", timeseries={"timeField": "ts", "metaField": "sensor"})
        client.ts.m.insert_many(
            [{"_id": i % 40, "ts": start + datetime.timedelta(seconds=i), "sensor": i % 3, "v": i} for i in range(600)]
        )
        client.ts.plain.insert_many([{"_id": i, "ts": start + datetime.timedelta(seconds=i)} for i in range(100)])
    with pymongo.MongoClient(target_uri) as client:  # not ours: no delete may reach it
        client.keep.m.insert_many([{"_id": i, "ts": start + datetime.timedelta(seconds=i)} for i in range(600)])
    kept = _measurements(target_uri, "keep.m")

    discarded: list[tuple[str, dict[str, Any]]] = []

    class Recording(MongoSink):
        write_copy = Sink.write_copy  # a snapshot batch through write(), where the faults are

        async def discard(self, ns: Any, where: Any) -> None:
            discarded.append((str(ns), dict(where)))
            await super().discard(ns, where)

    class LosesOneAck(Recording):
        writes = 0

        async def write(self, batch: Any) -> None:
            await super().write(batch)
            if batch and str(batch[0].ns) == "ts.m":
                LosesOneAck.writes += 1
                if LosesOneAck.writes == 4:
                    raise AutoReconnect("the target went away before it acknowledged")

    cp = tmp_path / "cp.json"
    flags = {"split": "always", "partition_docs": 200, "batch_docs": 50, "workers": 2, "include": [r"ts\..*"]}
    job, sink = _job(source_uri, target_uri, cp, LosesOneAck, max_retries=max_retries, **flags)
    monkeypatch.setattr(replicator.job.phases, "open_sink", lambda settings: sink)
    if max_retries:
        summary = (await job.run()).to_json()
        assert summary["retries"] == 1 and summary["snapshot"] == "completed"
    else:
        with pytest.raises(ServerUnavailable, match="gave up after 0 retries"):
            await job.run()
        job, sink = _job(source_uri, target_uri, cp, Recording, **flags)  # the next run
        monkeypatch.setattr(replicator.job.phases, "open_sink", lambda settings: sink)
        assert (await job.run()).to_json()["snapshot"] == "resumed"
    assert LosesOneAck.writes >= 4
    plan = json.loads(cp.read_text())["snapshot"]["plan"]
    assert [p["bracket"] for p in plan if p["coll"] == "m"] == ["time"] * 3  # 600 measurements, 200 a range
    # the ranges the failed attempt had begun, and no other, were deleted before they were copied again
    assert discarded and all(ns == "ts.m" and list(where) == ["ts"] for ns, where in discarded)
    source, target = _measurements(source_uri, "ts.m"), _measurements(target_uri, "ts.m")
    assert sum(target.values()) == sum(source.values()) == 600
    assert target == source
    assert _measurements(target_uri, "ts.plain") == _measurements(source_uri, "ts.plain")
    assert _measurements(target_uri, "keep.m") == kept
