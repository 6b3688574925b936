"""Where a snapshot partition's copy may resume: plain bookkeeping, apart from the I/O that feeds it.

A partition's batches are written several at a time, so they are acknowledged out of order. The resume
point is a low watermark: the end of the longest prefix of batches all acknowledged (MongoShake's
lowest-checkpoint rule, per partition). Batches after a gap wait until the gap is acknowledged, so a
resumed copy never skips a batch that was still in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from replicator.source.partitions import Resume


class Watermark:
    """Batches are numbered as they are sent (:meth:`sent`, with the ``_id`` of their last document);
    :meth:`acked` returns the new low watermark when an acknowledgement moved it, else None."""

    def __init__(self) -> None:
        self._ends: dict[int, Any] = {}  # batch number -> its last _id, while unacknowledged or after a gap
        self._acked: set[int] = set()
        self._next = 0  # number of the next batch sent
        self._low = 0  # first batch not acknowledged

    def sent(self, last_id: Any) -> int:
        """Record a batch about to be written; returns its number for :meth:`acked`."""
        number = self._next
        self._ends[number] = last_id
        self._next += 1
        return number

    def acked(self, number: int) -> Resume | None:
        """Record batch ``number`` as acknowledged; the new watermark if that moved it."""
        self._acked.add(number)
        if number != self._low:
            return None
        last = None
        while self._low in self._acked:
            self._acked.discard(self._low)
            last = self._ends.pop(self._low)
            self._low += 1
        return Resume(last)

    @property
    def pending(self) -> int:
        """Batches sent and not under the watermark yet."""
        return self._next - self._low


class SavePace:
    """Paces checkpoint saves so that they take at most ``share`` of the time, and come at most once every
    ``every_s``: a save costs more as the plan grows (it is written whole), and a batch's acknowledgement
    should not wait behind it. A save every second bounds what a kill loses to a second of copying (copied
    again, idempotently); saves any more often cost CPU for nothing (dozens a second, each the whole plan
    as JSON and an fsync, while a slow server answered)."""

    def __init__(self, share: float = 0.1, clock: Callable[[], float] = time.monotonic, every_s: float = 1.0) -> None:
        self._share = share
        self._clock = clock
        self._every = every_s
        self._next = 0.0
        self.owed = False  # a change was not saved yet

    def due(self) -> bool:
        """Is it time for a save? (False marks the change as owed to the next one.)"""
        due = self._clock() >= self._next
        self.owed = not due
        return due

    def saved(self, took_s: float) -> None:
        """A save took ``took_s`` seconds: the next is due ``took_s / share`` from now, a second at least."""
        self.owed = False
        self._next = self._clock() + max(took_s / self._share, self._every)
