"""Retry classification and backoff (Debezium's max-retries semantics)."""

from __future__ import annotations

import asyncio

from pymongo.errors import AutoReconnect, DuplicateKeyError, NotPrimaryError, OperationFailure

from replicator.retry import Backoff, is_retryable, sleep_or_stop


def test_classification() -> None:
    assert is_retryable(AutoReconnect("connection reset"))
    assert is_retryable(NotPrimaryError("not primary"))
    assert is_retryable(OperationFailure("shutting down", code=91))
    assert is_retryable(OperationFailure("x", code=1, details={"errorLabels": ["ResumableChangeStreamError"]}))
    assert is_retryable(ConnectionError("broker gone"))
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
