"""Retries: which errors are worth retrying, and the backoff between attempts (from Settings).

Debezium's semantics for the attempt limit: -1 retries forever, 0 never retries, N gives up after N
consecutive failed attempts. Progress (an acknowledged batch) resets the count.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

#: Server codes that mean "this node is going away / not primary now": retry elsewhere or later.
_TRANSIENT_CODES = frozenset({6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 50})
_TRANSIENT_LABELS = ("ResumableChangeStreamError", "RetryableWriteError", "TransientTransactionError")


def is_retryable(exc: BaseException) -> bool:
    """Would the same operation likely succeed later (network, election, restart, overload)?"""
    if isinstance(exc, asyncio.CancelledError):
        return False
    if isinstance(exc, ConnectionFailure):  # AutoReconnect, NotPrimaryError, NetworkTimeout, selection timeouts
        return True
    if isinstance(exc, PyMongoError) and any(exc.has_error_label(label) for label in _TRANSIENT_LABELS):
        return True
    if isinstance(exc, OperationFailure):
        return exc.code in _TRANSIENT_CODES
    return isinstance(exc, (ConnectionError, TimeoutError))  # plug-in sinks speaking other protocols


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: initial_s, doubled per attempt, capped at max_s."""

    initial_s: float = 1.0
    max_s: float = 120.0
    max_retries: int = 16  # -1: forever, 0: never

    def gives_up(self, attempt: int) -> bool:
        """After ``attempt`` consecutive failures, is it time to stop?"""
        return self.max_retries >= 0 and attempt > self.max_retries

    def delay(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * 2.0 ** max(attempt - 1, 0))
        return base * random.uniform(0.8, 1.0)  # jitter keeps several replicators from retrying in step


async def sleep_or_stop(delay: float, stop: asyncio.Event | None) -> bool:
    """Sleep ``delay`` seconds; return True at once if ``stop`` is set meanwhile."""
    if stop is None:
        await asyncio.sleep(delay)
        return False
    try:
        await asyncio.wait_for(stop.wait(), timeout=delay)
        return True
    except TimeoutError:
        return False
