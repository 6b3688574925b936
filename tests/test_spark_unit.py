"""The Spark replay's pure parts, without Spark or a server: the start offset from a checkpoint, each
shard's acknowledged position in a micro-batch, the merge across shards, and what a failed query (or
job) means."""

from __future__ import annotations

import json

from bson.timestamp import Timestamp

from replicator.checkpoint import Checkpoint
from replicator.engines.spark.failures import reason
from replicator.engines.spark.replay import StreamOutage, batch_positions, merged_order, start_positions, stream_error
from replicator.events import ChangeEvent, Namespace, Op, Position
from replicator.retry import is_retryable
from replicator.spark_datasource import offsets

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
    # the line shown is the first Python error; the outage may be further down the chain (a restarted source)
    chained = (
        "Traceback (most recent call last):\n  File x\nOSError: connection closed\n\nThe above exception was the "
        "direct cause of the following exception:\n\npymongo.errors.AutoReconnect: connection closed\n  at org"
    )
    assert isinstance(stream_error(chained), StreamOutage)


def test_a_failed_job_is_the_error_its_task_raised_else_spark_s_reason_without_the_attempts() -> None:
    raised = (
        "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n  File x\n"
        '    raise ConnectionFailed("cannot reach the target")\n'
        "replicator.errors.ConnectionFailed: cannot reach the target\n"
    )
    assert reason(raised) == "replicator.errors.ConnectionFailed: cannot reach the target"
    jvm = (  # py4j's text of a job whose executors could not start Python
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 "
        "times, most recent failure: Lost task 0.3 in stage 0.0 (TID 3) (192.0.2.2 executor driver): "
        'java.io.IOException: Cannot run program "/no/python": error=2, No such file or directory\n'
        "\tat org.apache.spark.api.python.PythonWorkerFactory.startDaemon(PythonWorkerFactory.scala:371)\n"
    )
    assert reason(jvm) == (
        'a task failed 4 times: java.io.IOException: Cannot run program "/no/python": error=2, No such file or '
        "directory"
    )


def test_history_lost_in_a_reader_task_is_history_lost() -> None:
    """So --on-history-lost resnapshot applies and the exit code is 4, as on the asyncio engine."""
    from replicator.errors import HistoryLost

    trace = (
        "An exception was thrown from the Python worker.\nTraceback (most recent call last):\n  File x\n"
        "replicator.errors.HistoryLost: the checkpoint's position is no longer in the source's oplog: the "
        "events since then are gone.\n  at org.apache"
    )
    lost = stream_error(trace)
    assert isinstance(lost, HistoryLost) and lost.exit_code == 4
    assert str(lost).startswith("the checkpoint's position is no longer in the source's oplog")


def test_every_shard_stops_at_the_earliest_end_of_a_shard_cut_by_the_limit() -> None:
    """Shard a was cut by the read limit at t=5; b reached the end of what it has at t=9. Taking b up to 9
    now would apply b's t=7 before a's t=6 (next micro-batch): b is held at 5 too."""
    ends = {
        "a": offsets.ShardOffset("x", 5, 0),
        "b": offsets.ShardOffset("y", 9, 0),
        "c": offsets.ShardOffset("z", 2, 0),
    }
    assert offsets.common_end(ends, {"a"}) == Timestamp(5, 0)
    assert offsets.common_end(ends, {"a", "c"}) == Timestamp(2, 0)
    assert offsets.common_end(ends, set()) is None  # every shard is at its end: nothing earlier to come


def test_an_idle_shard_moves_to_its_post_batch_token_and_is_acknowledged() -> None:
    from replicator.engines.spark.replay import _idle_positions
    from replicator.spark_datasource.stream import idle_end

    start = offsets.ShardOffset('{"_data":"8200000005000000012B"}', 5, 1)
    token = {"_data": "8200000009000000012B0429"}
    moved = idle_end(start, token, None)
    assert moved.idle and moved.cluster_time == Timestamp(9, 1) and moved.resume_token == token
    assert idle_end(start, token, Timestamp(8, 0)) == start  # availableNow: not past its time
    assert idle_end(start, None, None) == start and idle_end(start, {"_data": "other"}, None) == start
    end = offsets.to_json({"a": moved, "b": offsets.ShardOffset("t", 3, 3)})
    assert offsets.from_json(end)["a"] == moved  # the flag survives Spark's checkpoint
    progress = {"sources": [{"endOffset": json.dumps(end)}]}
    assert _idle_positions(progress) == {"a": moved.position()}
    assert _idle_positions(None) == {} and _idle_positions({"sources": []}) == {}
