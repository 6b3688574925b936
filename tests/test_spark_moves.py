"""A Spark snapshot partition read after its collection was renamed or dropped (spark_datasource/moves.py),
and a plan made again when a collection moved while it was made: against the real test server, without
a Spark session (the data source's functions run in the test's process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from replicator.events import Namespace
from replicator.source.partitions import ALL, Partition
from replicator.spark_datasource.changes import sync_client
from replicator.spark_datasource.moves import documents, uuid_now
from replicator.spark_datasource.options import settings_for
from replicator.spark_datasource.snapshot import plan_steadily

pytestmark = pytest.mark.integration

Z = Namespace("shop", "z")
RANGE = Partition(Z, 1, "number", 10, 30)  # _id 10 to 29 of 0..49


def _now(client: pymongo.MongoClient[Any]) -> Timestamp:
    return client.admin.command("ping")["operationTime"]  # type: ignore[no-any-return]


Change = Callable[[pymongo.MongoClient[Any]], Any]


def _read(source: str, plan: Partition, change: Change, **options: str) -> list[Any]:
    """The partition's ``_id``s read after ``change``, planned (UUID, time) before it."""
    s = settings_for({"source": source, **options}, "source")
    with pymongo.MongoClient(source) as client, sync_client(source, 10) as reader:
        client.shop.create_collection("z")
        client.shop.z.insert_many([{"_id": i} for i in range(50)])
        at, uuid = _now(client), uuid_now(reader, Z)
        change(client)
        return [doc["_id"] for doc in documents(reader, s, plan, uuid, at)]


def _rotate(client: pymongo.MongoClient[Any]) -> None:
    client.shop.z.rename("z_1")
    client.shop.z.insert_many([{"_id": i, "new": True} for i in range(50)])  # a new z, with the same _ids


def _drop_and_make_again(client: pymongo.MongoClient[Any]) -> None:
    client.shop.z.drop()
    client.shop.z.insert_many([{"_id": i, "new": True} for i in range(50)])


@pytest.mark.parametrize(
    ("change", "found"),
    [
        (lambda c: c.shop.z.rename("z_1"), True),
        (_rotate, True),  # the planned collection, not the new one under its name
        (lambda c: (c.shop.z.rename("z_1"), c.shop.z_1.rename("z_2")), True),
        (lambda c: c.admin.command("renameCollection", "shop.z", to="archive.z"), True),
        (lambda c: c.shop.z.drop(), False),
        (_drop_and_make_again, False),  # the new z has its own events after the drop
        (lambda c: c.drop_database("shop"), False),
    ],
    ids=[
        "renamed",
        "renamed-and-made-again",
        "renamed-twice",
        "renamed-to-another-db",
        "dropped",
        "dropped-and-made-again",
        "database-dropped",
    ],
)
def test_a_partition_is_read_where_its_collection_went_or_not_at_all(
    source_uri: str, change: Change, found: bool
) -> None:
    assert _read(source_uri, RANGE, change) == (list(range(10, 30)) if found else [])


def test_a_rename_far_into_the_stream_is_found_past_the_empty_batches_of_the_filtered_stream(source_uri: str) -> None:
    """Thousands of other events first: a stream filtered on the server answers with empty batches while it
    scans them (the test server scans a few hundred a batch), which are not its end."""

    def busy_then_renamed(client: pymongo.MongoClient[Any]) -> None:
        client.shop.other.insert_many([{"_id": i} for i in range(3000)])
        client.shop.other.update_many({}, {"$set": {"v": 1}})
        client.shop.z.rename("z_1")

    assert _read(source_uri, RANGE, busy_then_renamed) == list(range(10, 30))


def test_a_collection_renamed_while_its_partition_is_read_is_read_on_under_its_new_name_once(source_uri: str) -> None:
    s = settings_for({"source": source_uri, "batch-docs": "5"}, "source")  # the rename kills the cursor after 5
    with pymongo.MongoClient(source_uri) as client, sync_client(source_uri, 10) as reader:
        client.shop.z.insert_many([{"_id": i} for i in range(50)])
        at, uuid = _now(client), uuid_now(reader, Z)
        read = []
        for doc in documents(reader, s, RANGE, uuid, at):
            read.append(doc["_id"])
            if len(read) == 7:
                client.shop.z.rename("z_1")
        assert read == list(range(10, 30))
        client.shop.z_1.rename("z")  # a partition not read in _id order cannot go on: its task fails
        client.shop.other.insert_one({})  # the plan's time comes after the rename (a plan would be made again)
        at, uuid = _now(client), uuid_now(reader, Z)
        whole = Partition(Z, 0, ALL, ordered=True)
        stopped = r"shop.z was renamed \(shop.z_2 now\) while its partition shop.z#0 was read"
        with pytest.raises(RuntimeError, match=stopped):
            for i, _ in enumerate(documents(reader, s, whole, uuid, at)):
                if i == 7:
                    client.shop.z.rename("z_2")


def test_a_snapshot_planned_while_a_collection_is_renamed_is_planned_again(source_uri: str) -> None:
    """The plan must name the collections as they were at its time: a rename between that time and the
    plan's end (here just after the time is taken) makes it plan again from a new time."""
    s = settings_for({"source": source_uri, "include": r"shop\..*", "partition-docs": "10"}, "source")
    times: list[Timestamp] = []
    with pymongo.MongoClient(source_uri) as client, sync_client(source_uri, 10) as reader:
        client.shop.z.insert_many([{"_id": i} for i in range(50)])

        def begin() -> Timestamp:
            times.append(_now(client))
            if len(times) == 1:
                client.shop.z.rename("z_1")
            return times[-1]

        at, plan = plan_steadily(s, begin)
        assert len(times) == 2 and at == times[1]
        uuid = uuid_now(reader, Namespace("shop", "z_1"))
        assert uuid is not None and {(p["coll"], p["uuid"]) for p in plan} == {("z_1", uuid.hex())}
