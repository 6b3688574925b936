"""A batch's document writes are made durable by one barrier at its end (sinks/mongo/durable.py): against the
real server, which write concern each command carried; without a server, what the barrier decides."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bson
import pymongo
import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import monitoring
from pymongo.server_type import SERVER_TYPE

from replicator.errors import SinkUnavailable
from replicator.events import ChangeEvent, Namespace, Op, UpdateDescription
from replicator.sinks.mongo.durable import APPLIED, Durability, barrier_applies, writer
from replicator.sinks.mongo.sink import MongoSink
from replicator.source.retry import is_retryable
from tests.support.servers import LocalServer, external_uris

A, B = Namespace("durabledb", "a"), Namespace("durabledb", "b")
NOTHING: dict[str, Any] = {"_id": {"$in": []}}


def raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


class Writes(monitoring.CommandListener):
    """The write commands sent to the durabledb database: (command name, collection, write concern, filter
    of a delete)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any], Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.database_name != "durabledb" or event.command_name not in ("insert", "update", "delete"):
            return
        command = bson.decode(bson.encode(event.command))
        deletes = command.get("deletes") or [{}]
        self.seen.append(
            (event.command_name, command[event.command_name], command.get("writeConcern") or {}, deletes[0].get("q"))
        )

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture
def writes() -> Iterator[Writes]:
    listener = Writes()
    monitoring.register(listener)  # clients made from now on report to it (MongoSink's own)
    try:
        yield listener
    finally:
        monitoring._LISTENERS.command_listeners.remove(listener)


def batch() -> list[ChangeEvent]:
    return [
        ChangeEvent(Op.INSERT, A, key=raw({"_id": 1}), document=raw({"_id": 1, "v": 1})),
        ChangeEvent(Op.DELETE, A, key=raw({"_id": 2})),
        ChangeEvent(Op.UPDATE, B, key=raw({"_id": 1}), update=UpdateDescription(raw({"v": 2}))),
        ChangeEvent(Op.INSERT, B, key=raw({"_id": 3}), document=raw({"_id": 3})),
    ]


@pytest.mark.integration
async def test_a_batch_writes_applied_then_waits_once_for_a_durable_barrier(target_uri: str, writes: Writes) -> None:
    with pymongo.MongoClient[dict[str, Any]](target_uri) as client:
        client.durabledb.a.insert_many([{"_id": 2}])
        client.durabledb.b.insert_one({"_id": 1, "v": 1})
    writes.seen.clear()
    async with MongoSink(target_uri) as sink:
        await sink.write(batch())
    *applied, barrier = writes.seen
    assert {(name, coll) for name, coll, _, _ in applied} == {("delete", "a"), ("update", "a"), ("update", "b")}
    assert all(concern == {"w": 1} for _, _, concern, _ in applied), applied
    assert barrier[0] == "delete" and barrier[3] == NOTHING
    assert barrier[2] == {"w": "majority", "j": True}
    with pymongo.MongoClient[dict[str, Any]](target_uri) as client:  # the barrier changed nothing
        assert list(client.durabledb.a.find()) == [{"_id": 1, "v": 1}]
        assert list(client.durabledb.b.find().sort("_id", 1)) == [{"_id": 1, "v": 2}, {"_id": 3}]


@pytest.mark.integration
async def test_a_write_concern_in_the_uri_goes_with_every_write_and_no_barrier(target_uri: str, writes: Writes) -> None:
    uri = f"{target_uri}&w=1&journal=true"
    async with MongoSink(uri) as sink:
        await sink.write(batch())
    assert writes.seen and all(concern == {"w": 1, "j": True} for _, _, concern, _ in writes.seen), writes.seen
    assert all(q != NOTHING for *_, q in writes.seen)


def test_barriers_apply_to_a_replica_set_or_standalone_with_mcdcs_write_concern() -> None:
    assert barrier_applies("mongodb://h/?directConnection=true", "replicaset")
    assert barrier_applies("mongodb://h/", "standalone")
    assert not barrier_applies("mongodb://h/", "sharded")  # a barrier reaches one shard, not all
    assert not barrier_applies("mongodb://h/?w=2", "replicaset")
    assert not barrier_applies("mongodb://h/?journal=false", "replicaset")


def server(kind: int, address: tuple[str, int], election: Any = None, process: Any = "pid1") -> Any:
    version = None if process is None else {"processId": process, "counter": 0}
    return SimpleNamespace(server_type=kind, address=address, election_id=election, topology_version=version)


def test_the_writer_is_the_primary_or_the_standalone() -> None:
    primary = server(SERVER_TYPE.RSPrimary, ("p", 1), "e2")
    assert writer([server(SERVER_TYPE.RSSecondary, ("s", 1)), primary]) == (("p", 1), "e2", "pid1")
    assert writer([server(SERVER_TYPE.Standalone, ("h", 1))]) == (("h", 1), None, "pid1")
    assert writer([server(SERVER_TYPE.Standalone, ("h", 1), process=None)]) is None  # before MongoDB 4.4
    assert writer([server(SERVER_TYPE.Unknown, ("p", 1)), server(SERVER_TYPE.RSSecondary, ("s", 1))]) is None


class FakeClient:
    """The parts of an AsyncMongoClient Durability uses: the driver's servers (changed by a test between
    writes) and collections whose delete_one records the barrier."""

    def __init__(self, *servers: Any) -> None:
        self.servers = list(servers)
        self.barriers: list[tuple[str, Any]] = []
        self.topology_description = SimpleNamespace(server_descriptions=lambda: {s.address: s for s in self.servers})

    def __getitem__(self, db: str) -> FakeDb:
        return FakeDb(self)


class FakeDb:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    def __getitem__(self, name: str) -> FakeCollection:
        return FakeCollection(self.client, name)

    def get_collection(self, name: str, write_concern: Any = None) -> FakeCollection:
        return FakeCollection(self.client, name, write_concern)


class FakeCollection:
    def __init__(self, client: FakeClient, name: str, concern: Any = None) -> None:
        self.client, self.name, self.concern = client, name, concern

    async def delete_one(self, where: Any) -> None:
        self.client.barriers.append((self.name, where))


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient(server(SERVER_TYPE.RSPrimary, ("p", 1), "e1"))


async def test_a_barrier_ends_a_batch_that_wrote_and_only_such_a_batch(fake: FakeClient) -> None:
    durability = Durability(fake)  # type: ignore[arg-type]
    durability.enable("mongodb://h/", "replicaset")
    assert durability.enabled
    durability.begin()
    await durability.settle()
    assert fake.barriers == []  # nothing written: nothing to wait for
    durability.begin()
    durability.collection(A)
    durability.collection(B)
    await durability.settle()
    assert fake.barriers == [("b", NOTHING)]


async def test_a_primary_that_changed_during_a_batch_makes_it_written_again(fake: FakeClient) -> None:
    durability = Durability(fake)  # type: ignore[arg-type]
    durability.enable("mongodb://h/", "replicaset")
    durability.begin()
    durability.collection(A)  # written on the primary of election e1
    fake.servers = [server(SERVER_TYPE.RSSecondary, ("p", 1)), server(SERVER_TYPE.RSPrimary, ("q", 1), "e2")]
    with pytest.raises(SinkUnavailable, match="primary changed"):
        await durability.settle()
    durability.begin()  # the batch again, all of it on the new primary
    durability.collection(A)
    await durability.settle()
    # the same node elected again is another election: its w:1 writes may have been rolled back meanwhile
    durability.begin()
    durability.collection(A)
    fake.servers = [server(SERVER_TYPE.RSPrimary, ("q", 1), "e3")]
    with pytest.raises(SinkUnavailable):
        await durability.settle()
    # a server restarted (a standalone has no elections) may have lost the w:1 writes it had not journaled
    fake.servers = [server(SERVER_TYPE.Standalone, ("h", 1))]
    durability.begin()
    durability.collection(A)
    fake.servers = [server(SERVER_TYPE.Standalone, ("h", 1), process="pid2")]
    with pytest.raises(SinkUnavailable):
        await durability.settle()


def test_no_barrier_where_the_driver_cannot_tell_a_restart() -> None:
    durability = Durability(FakeClient(server(SERVER_TYPE.Standalone, ("h", 1), process=None)))  # type: ignore[arg-type]
    durability.enable("mongodb://h/", "standalone")
    assert not durability.enabled


async def test_batches_written_at_once_by_several_tasks_each_end_with_their_own_barrier(fake: FakeClient) -> None:
    """A snapshot's copy workers write batches through one sink at once: each task's batch is its own."""
    durability = Durability(fake)  # type: ignore[arg-type]
    durability.enable("mongodb://h/", "replicaset")
    first_wrote, second_began = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        durability.begin()
        durability.collection(A)
        first_wrote.set()
        await second_began.wait()  # the other task begins its batch between this one's write and barrier
        await durability.settle()

    async def second() -> None:
        await first_wrote.wait()
        durability.begin()
        second_began.set()
        durability.collection(B)
        await durability.settle()

    await asyncio.gather(asyncio.create_task(first()), asyncio.create_task(second()))
    assert sorted(fake.barriers) == [("a", NOTHING), ("b", NOTHING)]


def test_a_write_outside_a_batch_keeps_the_durable_write_concern(fake: FakeClient) -> None:
    durability = Durability(fake)  # type: ignore[arg-type]
    durability.enable("mongodb://h/", "replicaset")
    assert durability.enabled
    outside: Any = durability.collection(A)
    assert outside.concern is None  # the client's own collection: its durable write concern
    durability.begin()
    inside: Any = durability.collection(A)
    assert inside.concern is APPLIED


@pytest.mark.integration
async def test_a_target_restarted_between_a_batchs_writes_and_its_barrier_has_the_batch_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The w:1 writes a restarted server had not journaled may be gone while the barrier succeeds on the new
    process: write() must fail (retryably: the batch is written again), never return as if it were durable."""
    if external_uris() is not None:
        pytest.skip("restarts a server of its own")
    server = LocalServer(tmp_path / "target")
    server.start()
    settle = Durability.settle

    async def restart_first(self: Durability) -> None:
        await asyncio.to_thread(server.restart)  # after the batch's w:1 writes, before its barrier
        await settle(self)

    try:
        async with MongoSink(server.uri) as sink:
            monkeypatch.setattr(Durability, "settle", restart_first)
            with pytest.raises(Exception) as raised:
                await sink.write(batch())
            assert is_retryable(raised.value), raised.value
            monkeypatch.setattr(Durability, "settle", settle)
            await sink.write(batch())  # written again on the new process: durable this time
        with pymongo.MongoClient[dict[str, Any]](server.uri) as client:
            assert list(client.durabledb.a.find()) == [{"_id": 1, "v": 1}]
    finally:
        server.kill()
