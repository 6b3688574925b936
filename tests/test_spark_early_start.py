"""--engine spark starts a session of its own beside the run (engines/spark/engine.py): until it is up, the
replay's batches are written from the driver; from then on, through Spark's tasks. Without a JVM: the
session's start is a future the test settles."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from replicator.checkpoint.store import CheckpointStore
from replicator.engines.spark import apply as spark_apply
from replicator.engines.spark.engine import SparkEngine
from replicator.errors import McdcError
from replicator.events import ChangeEvent, Namespace, Op
from replicator.observe.progress import LogReporter
from replicator.settings.config import Settings
from replicator.sinks.memory import MemorySink


class Spreading(MemorySink):
    spreads = "document"


def _event(i: int) -> ChangeEvent:
    return ChangeEvent(Op.INSERT, Namespace("db", "c"), key={"_id": i}, document={"_id": i})


def _engine(tmp_path: Path, starting: asyncio.Future[Any]) -> SparkEngine:
    engine = SparkEngine(Settings(source="mongodb://s", target="mongodb://t"), CheckpointStore(tmp_path / "cp.json"),
                         LogReporter())  # fmt: skip
    engine._starting = starting  # type: ignore[assignment]
    return engine


async def test_batches_go_through_the_driver_until_the_session_is_up_then_through_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spread: list[tuple[Any, int, int]] = []

    class Recorded:
        def __init__(self, settings: Settings, spark: Any, sink: Any, *, partitions: int) -> None:
            self.spark, self.partitions = spark, partitions

        async def __call__(self, events: Sequence[ChangeEvent]) -> None:
            spread.append((self.spark, self.partitions, len(events)))

    monkeypatch.setattr(spark_apply, "SparkApply", Recorded)
    starting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    engine = _engine(tmp_path, starting)
    sink = Spreading()
    apply = engine.apply_with(sink)
    await apply([_event(1), _event(2)])
    assert engine.starting() and len(sink.events) == 2 and not spread  # written by the driver's sink
    spark = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=3))
    starting.set_result(spark)
    await apply([_event(3)])
    assert spread == [(spark, 3, 1)] and len(sink.events) == 2  # through Spark's tasks, on its cores
    assert not engine.starting()


async def test_a_session_that_could_not_start_fails_the_next_batch_in_one_line(tmp_path: Path) -> None:
    from py4j.protocol import Py4JError

    starting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    engine = _engine(tmp_path, starting)
    apply = engine.apply_with(Spreading())
    starting.set_exception(Py4JError("An error occurred while calling o1.x\nJava gateway process exited"))
    with pytest.raises(McdcError, match=r"^starting Spark failed on Spark: Java gateway process exited$"):
        await apply([_event(1)])


async def test_a_run_that_ended_before_its_session_was_up_still_fails_when_it_could_not_start(tmp_path: Path) -> None:
    from py4j.protocol import Py4JError

    starting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    engine = _engine(tmp_path, starting)
    starting.set_exception(Py4JError("Java gateway process exited"))
    with pytest.raises(McdcError, match="starting Spark failed on Spark"):
        await engine.close()


def test_a_python_worker_that_cannot_start_is_left_for_the_runs_own_first_job_to_report() -> None:
    """The session comes up with its workers started by a job that does nothing; that job's failure (an
    executor's Python missing) is not the start's: the run's first job fails with its own message."""
    from replicator.engines.spark.engine import _come_up

    class Context:
        defaultParallelism = 2

        def parallelize(self, data: object, slices: int) -> Any:
            raise RuntimeError("Cannot run program no-python")

    spark = SimpleNamespace(sparkContext=Context())
    assert _come_up(Settings(source="mongodb://s", target="mongodb://t"), lambda s: spark) is spark


def _replaying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: float) -> tuple[SparkEngine, list[Any]]:
    """An engine of a run with no session of its own yet (no spark-submit's), whose session, once started,
    is a stand-in: the list records each start."""
    from replicator.engines.spark import engine as spark_engine
    from replicator.engines.spark import session

    started: list[Any] = []

    def launch_and_come_up(settings: Settings) -> Any:
        started.append(_Session())
        return started[-1]

    monkeypatch.setattr(session, "active_session", lambda settings: None)
    monkeypatch.setattr(session, "check_java", lambda: None)
    monkeypatch.setattr(spark_engine, "_launch_and_come_up", launch_and_come_up)
    settings = Settings(source="mongodb://s", target="mongodb://t", spark_start_after_s=after)
    return SparkEngine(settings, CheckpointStore(tmp_path / "cp.json"), LogReporter()), started


async def test_a_replay_only_run_over_before_spark_would_be_up_never_starts_it_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, started = _replaying(tmp_path, monkeypatch, after=600)
    await engine.start(replay_only=True)
    sink = Spreading()
    await engine.apply_with(sink)([_event(1), _event(2)])
    assert len(sink.events) == 2 and engine.starting()  # written by the driver
    await engine.close()
    assert started == [] and engine.spark is None
    assert engine.note is not None and engine.note.endswith(
        "on the driver in 0.0 s, less than Spark takes to start (--spark-start-after 600 s): Spark was not started"
    )


async def test_a_replay_only_run_still_replaying_after_the_delay_starts_spark_whose_tasks_take_the_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spread: list[int] = []

    class Recorded:
        def __init__(self, settings: Settings, spark: Any, sink: Any, *, partitions: int) -> None:
            pass

        async def __call__(self, events: Sequence[ChangeEvent]) -> None:
            spread.append(len(events))

    monkeypatch.setattr(spark_apply, "SparkApply", Recorded)
    engine, started = _replaying(tmp_path, monkeypatch, after=0.05)
    await engine.start(replay_only=True)
    sink = Spreading()
    apply = engine.apply_with(sink)
    await apply([_event(1)])
    assert engine._starting is None and len(sink.events) == 1  # a batch before the delay: from the driver
    await asyncio.sleep(0.06)
    await apply([_event(2)])  # a batch after it: Spark starts, the driver writes this one meanwhile
    assert engine._starting is not None and len(sink.events) == 2
    await engine._starting
    await apply([_event(3)])
    assert len(started) == 1 and spread == [1] and len(sink.events) == 2  # through Spark's tasks
    await engine.close()
    assert engine.note is None and started[0].stopped


async def test_what_needs_the_session_starts_it_at_once_and_a_run_that_copies_starts_it_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, started = _replaying(tmp_path, monkeypatch, after=600)
    await engine.start(replay_only=True)
    assert await engine.ready() is started[0]  # a copy a lost history made due, say
    await engine.close()
    assert len(started) == 1 and started[0].stopped and engine.note is None
    from replicator.engines.spark import session

    launched: list[Settings] = []
    monkeypatch.setattr(session, "launch", launched.append)
    monkeypatch.setattr(session, "create", lambda settings: _Session())
    eager, _ = _replaying(tmp_path, monkeypatch, after=600)
    await eager.start(replay_only=False)  # a sync, a tail, a catch-up that copies
    assert launched and eager._starting is not None
    await eager.close()
    assert eager.spark.stopped and eager.note is None


class _Idle:
    defaultParallelism = 1

    def parallelize(self, data: object, slices: int) -> Any:
        raise RuntimeError("no workers here")


class _Session:
    """A session stand-in: its cores, and whether it was stopped."""

    def __init__(self) -> None:
        self.sparkContext, self.stopped = _Idle(), False

    def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize(
    ("saved", "mode", "flags", "copying"),
    [
        (None, "initial", {}, True),  # a first run
        (("done", True), "initial", {}, False),  # the cron job's catch-up
        (("none", True), "never", {}, False),
        (("in_progress", True), "initial", {}, True),  # a snapshot to finish
        (("copied", True), "initial", {}, False),  # its window to replay, its indexes to build
        (("done", True), "always", {}, True),
        (("done", True), "when_needed", {}, False),  # unless its position left the oplog: found later
        (None, "never", {}, False),
        (None, "initial", {"start_at": True}, False),
        (("done", True), "initial", {"snapshot_only": True}, True),
    ],
)
def test_which_runs_copy_as_far_as_their_start_can_tell(
    saved: tuple[str, bool] | None, mode: str, flags: dict[str, bool], copying: bool
) -> None:
    from replicator.snapshot.mode import Checkpointed, copies

    assert copies(Checkpointed(*saved) if saved else None, mode=mode, **flags) is copying


async def test_a_replay_only_run_with_no_batch_after_the_delay_never_starts_spark_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark starts for writes to hand over: a run that outlasts the delay without a batch left (its time spent
    reading, or waiting for the source) starts none."""
    engine, started = _replaying(tmp_path, monkeypatch, after=0.05)
    await engine.start(replay_only=True)
    await engine.apply_with(Spreading())([_event(1)])
    await asyncio.sleep(0.06)
    await engine.close()
    assert started == [] and engine.note is not None
    assert "with no batch left to write (--spark-start-after 0.05 s): Spark was not started" in engine.note
