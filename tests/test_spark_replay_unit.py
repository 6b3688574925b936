"""The Spark replay's pure parts, without Spark or a server: the start offset from a checkpoint, each
shard's acknowledged position in a micro-batch, the merge across shards, and what a failed query means."""

from __future__ import annotations

from bson.timestamp import Timestamp

from replicator.checkpoint import Checkpoint
from replicator.engines.spark.replay import StreamOutage, batch_positions, merged_order, start_positions, stream_error
from replicator.events import ChangeEvent, Namespace, Op, Position
from replicator.retry import is_retryable
from replicator.spark import offsets

NS = Namespace("db", "c")


def _event(i: int, ts: Timestamp, rs: str | None = None) -> ChangeEvent:
    return ChangeEvent(Op.INSERT, NS, key={"_id": i}, position=Position({"_data": f"{i:04d}"}, ts), rs=rs)


def test_the_start_offset_is_the_checkpoints_position() -> None:
    cp = Checkpoint("rs0", position=Position({"_data": "82AB"}, Timestamp(100, 2)))
    start = offsets.from_json(start_positions(cp))
    assert list(start) == [offsets.REPLICA_SET]
    assert start[""].position() == cp.position
    sharded = Checkpoint("", shards={"a": Position(None, Timestamp(5, 1)), "b": Position({"_data": "01"}, None)})
    start = offsets.from_json(start_positions(sharded))
    assert start["a"].cluster_time == Timestamp(5, 1) and start["a"].token is None
    assert start["b"].resume_token == {"_data": "01"}


def test_each_shard_acknowledges_its_last_event() -> None:
    events = [_event(1, Timestamp(1, 1), "a"), _event(2, Timestamp(1, 2), "b"), _event(3, Timestamp(2, 1), "a")]
    assert batch_positions(events) == {"a": events[2].position, "b": events[1].position}
    assert batch_positions([_event(9, Timestamp(3, 1))]) == {"": Position({"_data": "0009"}, Timestamp(3, 1))}


def test_shards_merge_by_cluster_time_keeping_each_shards_order() -> None:
    a = [_event(1, Timestamp(1, 1), "a"), _event(2, Timestamp(5, 0), "a"), _event(3, Timestamp(5, 0), "a")]
    b = [_event(4, Timestamp(2, 0), "b"), _event(5, Timestamp(5, 0), "b")]
    timed = [(e.position.cluster_time, e) for e in a + b if e.position and e.position.cluster_time]
    merged = merged_order(timed)
    assert [e.key["_id"] for e in merged if e.key] == [1, 4, 2, 3, 5]


def test_a_failed_query_is_one_line_and_an_outage_is_retried() -> None:
    trace = (
        "An exception was thrown from the Python worker.\nTraceback (most recent call last):\n  File x\n"
        "pymongo.errors.ServerSelectionTimeoutError: mongodb://u:secret@h:1: [Errno 111] refused\n  at org.apache"
    )
    outage = stream_error(trace)
    assert isinstance(outage, StreamOutage) and is_retryable(outage)
    assert "\n" not in str(outage) and "secret" not in str(outage) and "ServerSelectionTimeoutError" in str(outage)
    other = stream_error("ValueError: the row's change column holds an event mcdc does not replay")
    assert not is_retryable(other) and str(other).endswith("does not replay")
