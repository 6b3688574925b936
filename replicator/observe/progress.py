"""What a run shows a person while it works: snapshot progress (documents done of the total, docs/s,
ETA), the replay's events/s and lag, and one-line messages. Everything shown passes through
:func:`~replicator.settings.uri.redact`.

Two faces over the same counts (:mod:`replicator.observe.tally`): :class:`RichReporter` draws bars on a
terminal, :class:`LogReporter` writes log lines at a steady pace.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from bson.timestamp import Timestamp

from replicator.observe.tally import (
    Clock,
    CollectionProgress,
    ReplayTally,
    SnapshotTally,
    listing,
    plural,
    read_cap,
)
from replicator.settings.uri import redact

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

log = logging.getLogger("mcdc")

#: a log line at least this often, and at each further tenth of a snapshot
LOG_EVERY_S = 5.0
LOG_PARTS = 10
#: a replay that applied nothing since its last line says it is alive this often (an idle tail stays quiet)
IDLE_LOG_EVERY_S = 300.0


class Reporter(Protocol):
    """Receives progress from the pipeline; implementations must be cheap (called per batch)."""

    def info(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def snapshot_begin(self, collections: Iterable[CollectionProgress]) -> None:
        """A copy starts (again, after a retry): what each collection holds and what is done already."""

    def snapshot_totals(self, totals: Mapping[str, int]) -> None:
        """Counts that came in after the begin (collections not counted when planned)."""

    def snapshot_copied_before(self, ns: str, docs: int) -> None:
        """Documents of ``ns`` an earlier run copied in partitions this copy goes on with (counted after the
        begin): done, but not by this copy."""

    def snapshot_advance(self, ns: str, docs: int) -> None:
        """The sink acknowledged ``docs`` more documents of ``ns``."""

    def snapshot_collection_done(self, ns: str) -> None:
        """Every partition of ``ns`` is copied."""

    def snapshot_end(self, complete: bool) -> None:
        """The copy ended: ``complete``, or stopped with partitions left for the next run."""

    def replay_begin(self) -> None: ...
    def replay_advance(self, events: int, lag_s: float | None) -> None: ...
    def replay_end(self) -> None: ...
    def close(self) -> None: ...


def lag_seconds(last: Timestamp | None) -> float | None:
    """How far the last applied cluster time is behind this machine's clock."""
    return None if last is None else max(0.0, time.time() - last.time)


class _Pace:
    """Due once ``every_s`` passed since it last was, or when the share done reaches a further one of
    ``parts`` (short of the whole: the end has a line of its own)."""

    def __init__(self, clock: Clock, every_s: float, parts: int = 1) -> None:
        self._clock = clock
        self._every = every_s
        self._parts = parts
        self._last = clock()
        self._steps = 0

    def due(self, fraction: float | None = None) -> bool:
        now = self._clock()
        steps = self._steps
        if fraction is not None and fraction < 1:
            steps = math.floor(fraction * self._parts + 1e-9)  # 0.3 * 10 may be 2.999...
        if now - self._last >= self._every or steps > self._steps:
            self._last, self._steps = now, steps
            return True
        return False


class LogReporter:
    """Log lines (no terminal, ``--json`` or ``--no-progress``): during a snapshot, done/total, percent,
    docs/s and ETA every few seconds and at each further tenth, and a line at its end; during a replay,
    events/s and lag every few seconds while events are applied (every few minutes while none are), and
    events/s over the whole replay at its end."""

    def __init__(
        self,
        every_s: float = LOG_EVERY_S,
        clock: Clock = time.monotonic,
        idle_every_s: float = IDLE_LOG_EVERY_S,
        *,
        max_read_rate: float = 0,
    ) -> None:
        self._cap = read_cap(max_read_rate)
        self._every = every_s
        self._idle_every = idle_every_s
        self._clock = clock
        self._snapshot: SnapshotTally | None = None
        self._snapshot_pace = _Pace(clock, every_s, LOG_PARTS)
        self._replay: ReplayTally | None = None
        self._replay_pace = _Pace(clock, every_s)
        self._idle_pace = _Pace(clock, idle_every_s)
        self._logged_events = 0  # the replay's events at its last line

    def info(self, message: str) -> None:
        log.info(redact(message))

    def warn(self, message: str) -> None:
        log.warning(redact(message))

    def snapshot_begin(self, collections: Iterable[CollectionProgress]) -> None:
        self._snapshot = tally = SnapshotTally(collections, self._clock, cap=self._cap)
        self._snapshot_pace = _Pace(self._clock, self._every, LOG_PARTS)
        if tally.resumed:
            names = sorted(tally.resumed)
            log.info(
                f"snapshot: {len(names)} of {plural(len(tally.collections), 'collection')} already copied: "
                f"{listing(names)}"
            )

    def _tally(self) -> SnapshotTally:
        if self._snapshot is None:
            self._snapshot = SnapshotTally(clock=self._clock, cap=self._cap)
        return self._snapshot

    def snapshot_totals(self, totals: Mapping[str, int]) -> None:
        for ns, total in totals.items():
            self._tally().count(ns, total)

    def snapshot_copied_before(self, ns: str, docs: int) -> None:
        self._tally().copied_before(ns, docs)

    def snapshot_advance(self, ns: str, docs: int) -> None:
        tally = self._tally()
        tally.advance(ns, docs)
        if self._snapshot_pace.due(tally.fraction()):
            log.info("snapshot: " + tally.status())

    def snapshot_collection_done(self, ns: str) -> None:
        self._tally().finish(ns)

    def snapshot_end(self, complete: bool) -> None:
        if self._snapshot is not None:
            log.info("snapshot: " + self._snapshot.end(complete))
            self._snapshot = None

    def replay_begin(self) -> None:
        self._replay = ReplayTally(self._clock)
        self._replay_pace = _Pace(self._clock, self._every)
        self._idle_pace = _Pace(self._clock, self._idle_every)
        self._logged_events = 0

    def replay_advance(self, events: int, lag_s: float | None) -> None:
        if self._replay is None:
            self.replay_begin()
        replay = self._replay
        assert replay is not None
        replay.advance(events, lag_s)
        busy = replay.events > self._logged_events
        if (self._replay_pace if busy else self._idle_pace).due():
            log.info("replay: " + (replay.status() if busy else replay.idle()))
            self._logged_events = replay.events
            self._replay_pace, self._idle_pace = _Pace(self._clock, self._every), _Pace(self._clock, self._idle_every)

    def replay_end(self) -> None:
        if self._replay is not None:
            log.info("replay: " + self._replay.end())
            self._replay = None

    def close(self) -> None:
        pass


class RichReporter:
    """Rich progress on stderr: an overall snapshot bar (documents, docs/s, ETA), a row per collection
    (every one when there are few, else those being copied), and a replay row with events/s and lag."""

    MAX_ROWS = 20  # more collections than this: rows only for those being copied

    def __init__(
        self, console: Console | None = None, clock: Clock = time.monotonic, *, max_read_rate: float = 0
    ) -> None:
        # rich is imported when bars are drawn: a cron run (no terminal) never pays for it
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._cap = read_cap(max_read_rate)
        self.console = console if console is not None else Console(stderr=True)
        self._clock = clock
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[text]}"),
            console=self.console,
            transient=False,
        )
        self._snapshot: SnapshotTally | None = None
        self._overall: TaskID | None = None
        self._rows: dict[str, TaskID] = {}
        self._replay: ReplayTally | None = None
        self._replay_row: TaskID | None = None
        self._progress.start()

    def info(self, message: str) -> None:
        self._progress.console.print(redact(message), markup=False, highlight=False)

    def warn(self, message: str) -> None:
        self._progress.console.print("warning: " + redact(message), style="yellow", markup=False)

    def snapshot_begin(self, collections: Iterable[CollectionProgress]) -> None:
        self._snapshot = SnapshotTally(collections, self._clock, cap=self._cap)
        self._show_snapshot(self._snapshot.collections)

    def _tally(self) -> SnapshotTally:
        if self._snapshot is None:
            self._snapshot = SnapshotTally(clock=self._clock, cap=self._cap)
        return self._snapshot

    def snapshot_totals(self, totals: Mapping[str, int]) -> None:
        tally = self._tally()
        for ns, total in totals.items():
            tally.count(ns, total)
        self._show_snapshot(totals)

    def snapshot_copied_before(self, ns: str, docs: int) -> None:
        self._tally().copied_before(ns, docs)
        self._show_snapshot([ns])

    def snapshot_advance(self, ns: str, docs: int) -> None:
        self._tally().advance(ns, docs)
        self._show_snapshot([ns])

    def snapshot_collection_done(self, ns: str) -> None:
        self._tally().finish(ns)
        self._show_snapshot([ns])

    def snapshot_end(self, complete: bool) -> None:
        if self._snapshot is not None:
            text = self._snapshot.end(complete, notes=False)  # the rows say which are done or empty
            self._show_snapshot(self._snapshot.collections)
            assert self._overall is not None
            self._progress.update(self._overall, text=text)
        self._snapshot = None

    def _show_snapshot(self, names: Iterable[str]) -> None:
        tally = self._tally()
        if self._overall is None:  # above the collections' rows
            self._overall = self._progress.add_task("snapshot", total=None, text="")
        many = len(tally.collections) > self.MAX_ROWS
        for ns in names:
            done, total = tally.of(ns)
            copying = done > 0 and not tally.collections[ns].finished
            row = self._rows.get(ns)
            if row is None:
                row = self._rows[ns] = self._progress.add_task(ns, total=total, text="", visible=False)
            self._progress.update(
                row, completed=done, total=total, text=tally.describe(ns), visible=copying or not many
            )
        done, total = tally.totals()
        self._progress.update(self._overall, completed=done, total=total, text=tally.status())

    def replay_begin(self) -> None:
        self._replay = ReplayTally(self._clock)

    def replay_advance(self, events: int, lag_s: float | None) -> None:
        if self._replay is None:
            self.replay_begin()
        assert self._replay is not None
        self._replay.advance(events, lag_s)
        self._show_replay(self._replay.status())

    def replay_end(self) -> None:
        if self._replay is not None:
            self._show_replay(self._replay.end())
            self._replay = None

    def _show_replay(self, text: str) -> None:
        assert self._replay is not None
        if self._replay_row is None:
            self._replay_row = self._progress.add_task("replay", total=None, text="")
        self._progress.update(self._replay_row, completed=self._replay.events, text=text)

    def close(self) -> None:
        self._progress.stop()


def make_reporter(show_progress: bool, *, max_read_rate: float = 0) -> Reporter:
    """Bars when asked for and stderr is a terminal; log lines otherwise. ``max_read_rate``: the cap the
    snapshot's line shows (0: none)."""
    if show_progress and sys.stderr.isatty():
        return RichReporter(max_read_rate=max_read_rate)
    return LogReporter(max_read_rate=max_read_rate)
