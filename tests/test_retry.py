"""Retry classification and backoff (Debezium's max-retries semantics)."""

from __future__ import annotations

import asyncio

import pytest
from pymongo.errors import AutoReconnect, DuplicateKeyError, NotPrimaryError, OperationFailure

from replicator.source.retry import Backoff, Retrier, is_retryable, sleep_or_stop


def test_classification() -> None:
    assert is_retryable(AutoReconnect("connection reset"))
    assert is_retryable(NotPrimaryError("not primary"))
    assert is_retryable(OperationFailure("shutting down", code=91))
    assert is_retryable(OperationFailure("x", code=1, details={"errorLabels": ["ResumableChangeStreamError"]}))
    assert is_retryable(ConnectionError("broker gone"))
    for killed in (43, 175, 237):  # CursorNotFound, QueryPlanKilled, CursorKilled: a snapshot read to redo
        assert is_retryable(OperationFailure("cursor gone", code=killed))
    assert not is_retryable(DuplicateKeyError("dup", code=11000))
    assert not is_retryable(OperationFailure("unauthorized", code=13))
    assert not is_retryable(ValueError("bug"))


def test_backoff_limits() -> None:
    b = Backoff(initial_s=1, max_s=8, max_retries=3)
    assert [b.gives_up(n) for n in (1, 3, 4)] == [False, False, True]
    assert all(0.8 * min(8, 2 ** (n - 1)) <= b.delay(n) <= min(8, 2 ** (n - 1)) for n in range(1, 8))
    assert not Backoff(max_retries=-1).gives_up(10_000)
    assert Backoff(max_retries=0).gives_up(1)


async def test_sleep_is_cut_short_by_stop() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await asyncio.wait_for(sleep_or_stop(30, stop), timeout=2) is True
    assert await sleep_or_stop(0.01, asyncio.Event()) is False


class _Warnings:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warn(self, message: str) -> None:
        self.lines.append(message)


async def test_retrier_logs_each_attempt_resets_on_progress_and_gives_up() -> None:
    from replicator.errors import ServerUnavailable

    log = _Warnings()
    retrier = Retrier(Backoff(initial_s=0.001, max_s=0.001, max_retries=2), log)  # type: ignore[arg-type]
    failure = AutoReconnect("127.0.0.1:1: connection closed")
    assert await retrier.wait(failure, "snapshot") is False
    assert await retrier.wait(failure, "snapshot") is False
    assert log.lines[-1].startswith("127.0.0.1:1: connection closed; retrying in 0.0s (attempt 2/2)")
    retrier.progress()  # an acknowledged batch: two more attempts
    assert await retrier.wait(failure, "snapshot") is False
    assert await retrier.wait(failure, "snapshot") is False
    with pytest.raises(ServerUnavailable, match=r"gave up after 2 retries \(--max-retries 2\)"):
        await retrier.wait(failure, "snapshot")
    assert retrier.retries == 5


async def test_retrier_stops_waiting_when_asked() -> None:
    stop = asyncio.Event()
    stop.set()
    retrier = Retrier(Backoff(initial_s=30, max_s=30, max_retries=-1), _Warnings(), stop=stop)  # type: ignore[arg-type]
    assert await asyncio.wait_for(retrier.wait(ConnectionError("down"), "snapshot"), timeout=2) is True


def test_errors_are_told_apart_by_where_they_were_raised() -> None:
    from replicator.source.partitions import Partition
    from replicator.source.retry import from_source

    try:
        Partition.from_json({})  # raised in replicator/source/: the source's side
    except KeyError as exc:
        assert from_source(exc)
    assert not from_source(ConnectionError("the sink's side"))


def test_every_error_code_the_fail_point_tests_inject_is_retried() -> None:
    """tests/test_fail_points.py strikes each path with one error code and one path with each: that holds only
    while every such code is classified alike, as here."""
    from tests.support import failpoint

    codes = {f.data["errorCode"] for f in (*failpoint.WRITE_FAULTS, *failpoint.READ_FAULTS) if "errorCode" in f.data}
    assert codes == {6, 43, 91, 189, 262, 10107, 11600}
    for code in codes:
        assert is_retryable(OperationFailure("injected", code=code)), code
