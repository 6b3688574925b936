"""Spark's pure parts, without Spark or a server: what a failed job means, and the ``mcdc`` data source's
stream offsets (the earliest end of a shard cut by the read limit, an idle shard's move)."""

from __future__ import annotations

from typing import Any

from bson.timestamp import Timestamp

from replicator.engines.spark.failures import reason
from replicator.events import ChangeEvent, Namespace, Op, Position
from replicator.spark_datasource import offsets

NS = Namespace("db", "c")


def _event(i: int, ts: Timestamp, rs: str | None = None) -> ChangeEvent:
    return ChangeEvent(Op.INSERT, NS, key={"_id": i}, position=Position({"_data": f"{i:04d}"}, ts), rs=rs)


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
    from replicator.spark_datasource.stream import idle_end

    start = offsets.ShardOffset('{"_data":"8200000005000000012B"}', 5, 1)
    token = {"_data": "8200000009000000012B0429"}
    moved = idle_end(start, token, None)
    assert moved.idle and moved.cluster_time == Timestamp(9, 1) and moved.resume_token == token
    assert idle_end(start, token, Timestamp(8, 0)) == start  # availableNow: not past its time
    assert idle_end(start, None, None) == start and idle_end(start, {"_data": "other"}, None) == start
    end = offsets.to_json({"a": moved, "b": offsets.ShardOffset("t", 3, 3)})
    assert offsets.from_json(end)["a"] == moved  # the flag survives Spark's checkpoint
    assert offsets.idle_positions(end) == {"a": moved.position()}


def test_a_collection_is_followed_through_renames_and_lost_to_drops() -> None:
    from replicator.spark_datasource.moves import followed

    def ev(op: str, db: str, coll: str | None = None, to: tuple[str, str] | None = None) -> dict[str, Any]:
        change: dict[str, Any] = {"operationType": op, "ns": {"db": db, **({"coll": coll} if coll else {})}}
        if to is not None:
            change["to"] = {"db": to[0], "coll": to[1]}
        return change

    z = Namespace("shop", "z")
    assert followed(z, ev("rename", "shop", "z", ("shop", "z2"))) == Namespace("shop", "z2")
    assert followed(z, ev("rename", "shop", "z", ("arch", "z"))) == Namespace("arch", "z")  # to another database
    assert followed(z, ev("rename", "shop", "y", ("shop", "z"))) is None  # replaced (dropTarget)
    assert followed(z, ev("rename", "shop", "y", ("shop", "w"))) == z
    assert followed(z, ev("drop", "shop", "z")) is None
    assert followed(z, ev("drop", "shop", "zz")) == z
    assert followed(z, ev("dropDatabase", "shop")) is None
    assert followed(z, ev("dropDatabase", "shopping")) == z
    assert followed(None, ev("rename", "shop", "z", ("shop", "z2"))) is None  # gone stays gone
