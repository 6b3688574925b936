"""Retries: which errors are worth retrying, and the backoff between attempts (from Settings).

Debezium's semantics for the attempt limit: -1 retries forever, 0 never retries, N gives up after N
consecutive failed attempts. Progress (an acknowledged batch) resets the count.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

from replicator.errors import ServerUnavailable
from replicator.source.connection import server_message

log = logging.getLogger("mcdc.retry")

if TYPE_CHECKING:
    from replicator.observe.metrics import Metrics
    from replicator.observe.progress import Reporter
    from replicator.settings.config import Settings

#: Server codes that mean "this node is going away / not primary now": retry elsewhere or later; and
#: a read's cursor or plan killed under it (a restart, a dropped index, killCursors): read it again.
_TRANSIENT_CODES = frozenset({6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 50, 43, 175, 237})
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


#: --max-retries when not given (Debezium's errors.max.retries default)
DEFAULT_MAX_RETRIES = 16


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: initial_s, doubled per attempt, capped at max_s."""

    initial_s: float = 1.0
    max_s: float = 120.0
    max_retries: int = DEFAULT_MAX_RETRIES  # -1: forever, 0: never

    @classmethod
    def of(cls, settings: Settings) -> Backoff:
        """The run's --retry-initial-delay, --retry-max-delay and --max-retries."""
        retries = DEFAULT_MAX_RETRIES if settings.max_retries is None else settings.max_retries
        return cls(settings.retry_initial_s, settings.retry_max_s, retries)

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


class Retrier:
    """One retry budget, shared by everything one phase retries: counts consecutive failed attempts,
    logs each retry ("...; retrying in 2.0s (attempt 2/16)") and waits with backoff; :meth:`progress`
    (an acknowledged batch) resets the count. Gives up with ServerUnavailable (exit 75) past ``max_retries``."""

    def __init__(
        self, backoff: Backoff, reporter: Reporter, *, stop: asyncio.Event | None = None, metrics: Metrics | None = None
    ) -> None:
        self.backoff = backoff
        self.reporter = reporter
        self.stop = stop
        self.metrics = metrics
        self.retries = 0  # in all
        self._attempt = 0  # in a row
        self.patience_s = 0.0  # how long an attempt may wait for a server (--connect-timeout); 0: unknown

    @classmethod
    def of(
        cls,
        settings: Settings,
        reporter: Reporter,
        *,
        stop: asyncio.Event | None = None,
        metrics: Metrics | None = None,
    ) -> Retrier:
        """A retry budget with the run's backoff (:meth:`Backoff.of`)."""
        retrier = cls(Backoff.of(settings), reporter, stop=stop, metrics=metrics)
        retrier.patience_s = settings.connect_timeout_s
        return retrier

    def progress(self) -> None:
        """Something was acknowledged: the next failure starts the backoff again."""
        self._attempt = 0

    async def wait(self, exc: Exception, source: str, *, quiet: bool = False) -> bool:
        """Back off after the retryable failure ``exc``; True when asked to stop meanwhile. ``source``
        labels the retries metric when the error came from reading the source ("sink" otherwise);
        ``quiet``: the attempt is logged at debug level (the caller said once what it waits for)."""
        self._attempt += 1
        self.retries += 1
        reason = _reason(exc)
        if self.backoff.gives_up(self._attempt):
            if self.metrics is not None:
                self.metrics.error("gave_up")
            raise ServerUnavailable(
                f"gave up after {self._attempt - 1} retries (--max-retries {self.backoff.max_retries}): {reason}"
            ) from None
        if self.metrics is not None:
            self.metrics.retry(source if from_source(exc) else "sink")
            self.metrics.set_state("retrying")
        delay = self.backoff.delay(self._attempt)
        limit = "" if self.backoff.max_retries < 0 else f"/{self.backoff.max_retries}"
        # the attempt starts after the delay; a server that does not answer holds it up to the timeout
        waits = self.patience_s and isinstance(exc, ConnectionFailure | ServerUnavailable)
        patience = f", then waits up to {self.patience_s:g}s for an answer" if waits else ""
        message = f"{reason}; retrying in {delay:.1f}s (attempt {self._attempt}{limit}{patience})"
        if quiet:
            log.debug(message)
        else:
            self.reporter.warn(message)
        return await sleep_or_stop(delay, self.stop)

    def budget(self) -> str:
        """How long the retries go on, for a message: ``up to 16 retries (--max-retries)``."""
        if self.backoff.max_retries < 0:
            return "until it answers (--max-retries -1)"
        return f"up to {self.backoff.max_retries} retries (--max-retries)"


def _reason(exc: Exception) -> str:
    if isinstance(exc, PyMongoError):  # a server selection timeout goes on with the whole topology: cut it
        return server_message(exc).split(", Timeout: ")[0]
    return str(exc) or type(exc).__name__


_SOURCE_DIR = os.path.join(os.path.dirname(__file__), "")  # this module lives in source/


def from_source(exc: BaseException) -> bool:
    """Best effort for the retries metric: was the error raised reading the source (code under source/)?"""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_SOURCE_DIR):
            return True
        tb = tb.tb_next
    return False
