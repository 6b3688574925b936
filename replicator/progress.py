"""What a run shows a person: rich progress bars per collection during the snapshot, a lag readout
during replay, and one-line messages. Everything shown passes through :func:`~replicator.uri.redact`."""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from typing import Protocol

from bson.timestamp import Timestamp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from .uri import redact

log = logging.getLogger("mcdc")


class Reporter(Protocol):
    """Receives progress from the pipeline; implementations must be cheap (called per batch)."""

    def info(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def snapshot_totals(self, totals: dict[str, int]) -> None: ...
    def snapshot_advance(self, ns: str, docs: int) -> None: ...
    def replay_advance(self, events: int, lag_s: float | None) -> None: ...
    def close(self) -> None: ...


def lag_seconds(last: Timestamp | None) -> float | None:
    """How far the last applied cluster time is behind this machine's clock."""
    return None if last is None else max(0.0, time.time() - last.time)


class Rate:
    """Events per second over a sliding window of a few seconds."""

    def __init__(self, window_s: float = 5.0) -> None:
        self._window = window_s
        self._marks: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, n: int) -> float:
        now = time.monotonic()
        self._total += n
        self._marks.append((now, self._total))
        while len(self._marks) > 2 and now - self._marks[0][0] > self._window:
            self._marks.popleft()
        first_t, first_n = self._marks[0]
        return (self._total - first_n) / (now - first_t) if now > first_t else 0.0


class LogReporter:
    """Plain log lines (no TTY, --json, or --no-progress): one line per collection and at most one
    replay line every few seconds."""

    def __init__(self, every_s: float = 5.0) -> None:
        self._every = every_s
        self._last = 0.0
        self._events = 0
        self._totals: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._rate = Rate()

    def info(self, message: str) -> None:
        log.info(redact(message))

    def warn(self, message: str) -> None:
        log.warning(redact(message))

    def snapshot_totals(self, totals: dict[str, int]) -> None:
        self._totals.update(totals)

    def snapshot_advance(self, ns: str, docs: int) -> None:
        self._done[ns] = self._done.get(ns, 0) + docs
        self._tick(f"snapshot: {sum(self._done.values())} documents copied")

    def replay_advance(self, events: int, lag_s: float | None) -> None:
        self._events += events
        rate = self._rate.add(events)
        lag = "-" if lag_s is None else f"{lag_s:.1f}s"
        self._tick(f"replay: {self._events} events applied, {rate:,.0f} events/s, lag {lag}")

    def _tick(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            log.info(message)

    def close(self) -> None:
        pass


class RichReporter:
    """Rich progress bars on stderr: one per collection (docs, docs/s, ETA) and a replay line with lag."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._started: dict[str, float] = {}
        self._replay: TaskID | None = None
        self._events = 0
        self._rate = Rate()
        self._progress.start()

    def info(self, message: str) -> None:
        self._progress.console.print(redact(message), markup=False, highlight=False)

    def warn(self, message: str) -> None:
        self._progress.console.print("warning: " + redact(message), style="yellow", markup=False)

    def snapshot_totals(self, totals: dict[str, int]) -> None:
        for ns, total in totals.items():  # 0: not counted (yet)
            task = self._tasks.get(ns)
            if task is None:
                self._tasks[ns] = self._progress.add_task(ns, total=total or None, rate="")
            elif total:
                self._progress.update(task, total=max(total, self._progress.tasks[task].completed))

    def snapshot_advance(self, ns: str, docs: int) -> None:
        task = self._tasks.get(ns)
        if task is None:
            self.snapshot_totals({ns: 0})
            task = self._tasks[ns]
        started = self._started.setdefault(ns, time.monotonic())  # rate from the first batch, not the plan
        self._progress.advance(task, docs)
        done = self._progress.tasks[task].completed
        total = self._progress.tasks[task].total
        if total is not None and done > total:  # documents inserted since the count
            self._progress.update(task, total=done)
        rate = done / max(time.monotonic() - started, 1e-3)
        self._progress.update(task, rate=f"{rate:,.0f} docs/s")

    def replay_advance(self, events: int, lag_s: float | None) -> None:
        self._events += events
        if self._replay is None:
            self._replay = self._progress.add_task("replay", total=None, rate="")
        rate = self._rate.add(events)
        lag = "-" if lag_s is None else f"{lag_s:.1f}s"
        self._progress.update(self._replay, completed=self._events, rate=f"{rate:,.0f} events/s, lag {lag}")

    def close(self) -> None:
        self._progress.stop()


def make_reporter(show_progress: bool) -> Reporter:
    if show_progress and sys.stderr.isatty():
        return RichReporter()
    return LogReporter()
