"""--max-read-rate: a token bucket that paces the source's document reads. Pure logic: the clock is passed in,
the caller sleeps for the time it is told (``asyncio.sleep`` in the asyncio engine, ``time.sleep`` in a Spark
data source's reader), so both engines and the tests drive the same arithmetic.

Every reader of one run shares one bucket. A reader reserves tokens for the documents it is about to read
(at most :attr:`TokenBucket.chunk` at a time, the cursor's batch size), waits the time it is told, then
reads, and gives back what the reply did not use. The bucket may go into debt, so a reservation larger
than what is left still goes through: its reader waits until the debt is paid. Whatever the number of
readers, the documents reserved in any span of ``w`` seconds are then at most ``capacity + rate * w``; with
a capacity of a tenth of a second's documents, a 5-second window holds at most 2 % over the rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]

#: seconds of documents the bucket holds when full: the burst allowed after an idle spell
BURST_S = 0.1


def chunk_for(rate: float, batch_docs: int) -> int:
    """How many documents one read reserves (and the cursor's batch size) at ``rate`` documents/s: a
    burst's worth (:data:`BURST_S`), at most ``batch_docs``, at least one."""
    return max(1, min(batch_docs, math.floor(rate * BURST_S)))


class TokenBucket:
    """``rate`` documents per second, shared by every reader that holds it; ``capacity``: the burst (by
    default :data:`BURST_S` seconds of documents, at least one)."""

    def __init__(self, rate: float, *, capacity: float | None = None, clock: Clock = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("a token bucket needs a positive rate")
        self.rate = float(rate)
        self.capacity = max(1.0, capacity if capacity is not None else rate * BURST_S)
        self._clock = clock
        self._tokens = self.capacity  # full at the start
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def reserve(self, docs: int) -> float:
        """Take ``docs`` tokens, in debt if need be; returns the seconds to wait before reading them."""
        self._refill()
        self._tokens -= docs
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def give_back(self, docs: int) -> None:
        """Return tokens reserved for documents the reply did not hold (the end of a partition)."""
        if docs > 0:
            self._refill()
            self._tokens = min(self.capacity, self._tokens + docs)


def split_rate(rate: float, readers: int) -> float:
    """Each of ``readers`` independent readers' share of ``rate`` (0: no cap): the Spark engine's and data
    source's tasks, which share no bucket, each get an equal part."""
    return rate / max(1, readers) if rate > 0 else 0.0
