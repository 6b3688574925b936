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
