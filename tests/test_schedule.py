"""The suite's scheduler (tests/support/schedule.py) on pytest-xdist's own scope scheduling, with stand-in
workers that record what they are sent: the longest units go to free workers, a worker busy with a long
test gets a short one (which it needs before it runs its last), and Spark units wait for a Spark slot."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from tests.support.schedule import SPARK_AT_ONCE, SPARK_SESSION, SuiteScheduling, expected_seconds, is_spark

PIPELINES = (
    "tests/test_auto_cdc_example.py::test_spark_pipelines_runs_the_example_as_its_readme_says_into_scd1_and_scd2_tables"
)
CHURN = "tests/test_spark_churn.py::test_a_churning_tail_on_spark_converges_and_four_saved_checkpoints_replay"
DEBEZIUM = "tests/test_debezium_peer.py::test_records_equal_debeziums_on_the_same_writes"
SESSION = [
    "tests/test_spark_engine.py::test_catch_up_on_spark_reaches_now",
    "tests/test_spark_datasource.py::test_stream_write_converges_the_target_on_the_source",
]
SHORT = [f"tests/test_quick.py::test_{n}" for n in range(12)]
COLLECTION = [*SHORT[:6], PIPELINES, *SESSION, DEBEZIUM, CHURN, *SHORT[6:]]


class Worker:
    """What the scheduler sends a pytest-xdist worker: the collection's indices of its tests."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent: list[str] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += [COLLECTION[i] for i in indices]

    def send_runtest_all(self) -> None:
        self.sent += COLLECTION

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return self.name


def _scheduler(workers: list[Worker]) -> SuiteScheduling:
    scheduler = SuiteScheduling.__new__(SuiteScheduling)  # without the pytest config it reads its worker count from
    scheduler.numnodes = len(workers)
    scheduler.collection = None
    scheduler.workqueue = OrderedDict()
    scheduler.assigned_work = {}
    scheduler.registered_collections = {}
    scheduler.log = lambda *args: None  # type: ignore[assignment,method-assign]
    scheduler.config = type("Config", (), {"option": type("Option", (), {"loadscopereorder": True})()})()  # type: ignore[assignment]
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, COLLECTION)  # type: ignore[arg-type]
    scheduler.schedule()
    return scheduler


def _finish(scheduler: SuiteScheduling, worker: Worker, nodeid: str) -> None:
    scheduler.mark_test_complete(worker, COLLECTION.index(nodeid))  # type: ignore[arg-type]


def _long(nodeids: list[str]) -> list[str]:
    return [n for n in nodeids if expected_seconds(n) >= 10 or n in SESSION]


def test_no_long_test_is_queued_behind_another_and_spark_units_wait_for_a_slot() -> None:
    workers = [Worker(f"gw{n}") for n in range(3)]
    scheduler = _scheduler(workers)
    first: dict[str, Any] = {w.name: w.sent[0] for w in workers}
    assert sorted(first.values()) == sorted([PIPELINES, CHURN, DEBEZIUM])  # the longest first; Spark on two
    assert SPARK_AT_ONCE == 2
    for worker in workers:
        assert len(worker.sent) == 2  # one more, so that the worker runs its first: a short one
        assert _long(worker.sent) == [worker.sent[0]]
    assert SPARK_SESSION in scheduler.workqueue  # waits for a Spark slot, not behind a long test

    # the worker whose long test ends first takes the longest unit it may: the session's, as a Spark slot is free
    (freed,) = [w for w in workers if w.sent[0] == PIPELINES]
    _finish(scheduler, freed, PIPELINES)
    assert sorted(freed.sent[2:]) == sorted(SESSION)
    assert SPARK_SESSION not in scheduler.workqueue


def test_a_spark_test_without_spark_in_its_name_counts_as_spark() -> None:
    assert is_spark(
        "tests/test_auto_cdc.py::test_the_example_pipeline_keeps_scd1_and_scd2_tables_of_a_collection_and_its_changes"
    )
    assert is_spark(CHURN) and is_spark(SPARK_SESSION)
    assert not is_spark(DEBEZIUM) and not is_spark(SHORT[0])
