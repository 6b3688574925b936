"""The counts behind what a run shows, and how they read: rates over the last few seconds (never over a
few milliseconds), a snapshot's documents done of its total with docs/s and ETA, a replay's events/s.

Plain classes with an injectable clock, apart from the two faces that show them
(:mod:`replicator.observe.progress`: rich bars or log lines), so tests need no terminal and no waiting."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from bson.timestamp import Timestamp

Clock = Callable[[], float]

#: a rate measured over less time than this is noise (one batch acknowledged right after another)
MIN_INTERVAL_S = 0.25
#: rates shown while work goes on cover about this many of the last seconds
RATE_WINDOW_S = 5.0
#: no rate (nor an ETA) is shown before the first acknowledged units are this old: :data:`ESTIMATING` instead
MIN_WINDOW_S = 2.0
#: what a line shows in place of a rate and an ETA before there is a window of progress to measure them over
ESTIMATING = "estimating…"


def per_second(count: int, seconds: float) -> float | None:
    """``count / seconds``, or None when ``seconds`` is too short to mean anything."""
    return count / seconds if seconds >= MIN_INTERVAL_S else None


def format_ts(ts: Timestamp) -> str:
    """A cluster time as a person reads it and ``--start-at`` takes it back: ``SECONDS,INCREMENT (UTC time)``."""
    return f"{ts.time},{ts.inc} ({datetime.fromtimestamp(ts.time, UTC):%Y-%m-%dT%H:%M:%SZ})"


def listing(names: Sequence[object], most: int = 10) -> str:
    """Up to ``most`` names for a message, then how many more: ``a.b, a.c and 3 more``."""
    listed = ", ".join(str(name) for name in names[:most])
    return listed + (f" and {len(names) - most} more" if len(names) > most else "")


def average(count: int, seconds: float) -> float | None:
    """The rate of a whole phase, however short it was (a rate while it runs needs :func:`per_second`'s
    longer interval); None when it took no time at all."""
    return count / seconds if seconds > 0 else None


def format_rate(value: float | None) -> str:
    """A rate as shown: ``8,100``, or ``-`` when none could be measured."""
    return "-" if value is None else f"{value:,.0f}"


def plural(n: int, noun: str) -> str:
    """``1 collection``, ``2 collections``, ``1,200 documents``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def duration(seconds: float, *, precise: bool = False) -> str:
    """``8s``, ``2m05s``, ``1h02m``; ``precise``: tenths under a minute (``0.4s``)."""
    if seconds < 60:
        return f"{seconds:.1f}s" if precise else f"{math.ceil(seconds)}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


class Rate:
    """Units per second over the last few seconds, once a window of progress exists: from the first unit
    acknowledged (not from the start: the wait for the first batch, a Spark session starting or cursors
    opening, is no progress; that batch's units are the window's base, as their reading began before
    it), over at least ``min_window_s``. None until then (:data:`ESTIMATING` is shown instead): a figure
    never rests on one batch acknowledged just after another, nor on a wait."""

    def __init__(
        self, clock: Clock = time.monotonic, window_s: float = RATE_WINDOW_S, min_window_s: float = MIN_WINDOW_S
    ) -> None:
        self._clock = clock
        self._window = window_s
        self._min_window = min_window_s
        self.total = 0
        self._first: float | None = None  # when the first units were acknowledged
        self._samples: deque[tuple[float, int]] = deque()  # (time, total then), from the first units on

    def add(self, n: int) -> None:
        self.total += n
        now = self._clock()
        if self._first is None:
            if not n:
                return  # nothing yet: the window has not begun
            self._first = now
            self._samples.append((now, self.total))
        elif now - self._samples[-1][0] >= self._window / 10:  # a few dozen samples, however fast the batches
            self._samples.append((now, self.total))
        self._trim(now)

    def per_s(self) -> float | None:
        now = self._clock()
        if self._first is None or now - self._first < self._min_window:
            return None
        self._trim(now)
        since, total_then = self._samples[0]
        return per_second(self.total - total_then, now - since)

    def _trim(self, now: float) -> None:
        while len(self._samples) > 1 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()


@dataclass
class CollectionProgress:
    """One collection of a snapshot: its estimated documents (None: not counted yet), the documents done
    (before the copy began: those of the partitions the checkpoint marks done) and whether all are."""

    ns: str
    total: int | None = None
    done: int = 0
    finished: bool = False


def read_cap(rate: float) -> str:
    """--max-read-rate as progress shows it: ``read rate capped at 2,000 docs/s`` ("" for no cap)."""
    return f"read rate capped at {rate:,.0f} docs/s" if rate > 0 else ""


class SnapshotTally:
    """The counts of one copy and how they read: done of total, percent, docs/s, ETA.

    ``done`` includes what was copied before the copy began (a resumed snapshot), so the total and the
    percent are the snapshot's; rates and the ETA only count what this copy writes. The sums are kept
    as collections change (a snapshot may hold thousands, and each batch asks for them)."""

    def __init__(
        self, collections: Iterable[CollectionProgress] = (), clock: Clock = time.monotonic, *, cap: str = ""
    ) -> None:
        self._clock = clock
        self.cap = cap  # --max-read-rate, as read_cap() says it ("": none)
        self.started = clock()
        self.rate = Rate(clock)
        self.collections: dict[str, CollectionProgress] = {}
        self._done, self._total, self._uncounted = 0, 0, 0
        for c in collections:
            self.collections[c.ns] = replace(c)
            self._sum(c.ns, +1)
        self.resumed = {ns for ns, c in self.collections.items() if c.finished}

    def count(self, ns: str, total: int) -> None:
        self._take(ns).total = total
        self._sum(ns, +1)

    def advance(self, ns: str, docs: int) -> None:
        self._take(ns).done += docs
        self._sum(ns, +1)
        self.rate.add(docs)

    def copied_before(self, ns: str, docs: int) -> None:
        """Documents an earlier run copied: done, not part of this copy's rate."""
        self._take(ns).done += docs
        self._sum(ns, +1)

    def finish(self, ns: str) -> None:
        self._take(ns).finished = True
        self._sum(ns, +1)

    def _take(self, ns: str) -> CollectionProgress:
        """The collection, its share out of the sums until it changed (a collection the begin did not
        list, such as a copy of a renamed one, is added)."""
        if ns not in self.collections:
            self.collections[ns] = CollectionProgress(ns)
        else:
            self._sum(ns, -1)
        return self.collections[ns]

    def _sum(self, ns: str, sign: int) -> None:
        done, total = self.of(ns)
        self._done += sign * done
        self._total += sign * (total or 0)
        self._uncounted += sign * (total is None)

    def of(self, ns: str) -> tuple[int, int | None]:
        """Documents done and the total (None: not counted yet) of one collection. A finished one is
        whole: its count when the documents seen are fewer (copied before this copy: a partition resumed
        halfway, or done before and not counted when planned)."""
        c = self.collections[ns]
        if c.finished:
            whole = max(c.done, c.total or 0)
            return whole, whole
        return c.done, None if c.total is None else max(c.total, c.done)  # inserted since the count

    def totals(self) -> tuple[int, int | None]:
        """Documents done and the total of all collections (None while one is not counted)."""
        return self._done, None if self._uncounted else self._total

    def fraction(self) -> float | None:
        done, total = self.totals()
        return None if total is None else (done / total if total else 1.0)

    def describe(self, ns: str) -> str:
        """One collection's state: ``1,200/3,000``, ``3,000 done``, ``3,000 (done before)``, ``empty``."""
        done, total = self.of(ns)
        if total == 0 and (self.collections[ns].finished or not done):
            return "empty"
        if ns in self.resumed:
            return f"{done:,} (done before)"
        if self.collections[ns].finished:
            return f"{done:,} done"
        return f"{done:,}" if total is None else f"{done:,}/{total:,}"

    def _head(self) -> str:
        done, total = self.totals()
        if total is None:
            return f"{done:,} documents ({plural(self._uncounted, 'collection')} not counted yet)"
        percent = 100 if done >= total else int(100 * done / total)  # 100% only when done
        return f"{done:,}/{total:,} documents ({percent}%)"

    def status(self) -> str:
        """While copying: ``52,000/120,000 documents (43%), 8,100 docs/s, ETA 8s``; under --max-read-rate,
        ``..., 1,990 docs/s (read rate capped at 2,000 docs/s), ETA 40s``; before a window of progress
        (:class:`Rate`), ``2,000/120,000 documents (1%), estimating…``."""
        done, total = self.totals()
        rate = self.rate.per_s()
        capped = f" ({self.cap})" if self.cap else ""
        if rate is None:
            return f"{self._head()}, {ESTIMATING}{capped}"
        eta = "-"
        if total is not None and rate:
            eta = duration(max(total - done, 0) / rate)
        return f"{self._head()}, {format_rate(rate)} docs/s{capped}, ETA {eta}"

    def end(self, complete: bool, *, notes: bool = True) -> str:
        """At the end: ``120,000/120,000 documents (100%), 8,100 docs/s, done in 14.8s (5 collections: 2
        done before, 1 empty)``; the rate is this copy's documents over its whole time. ``complete``: every
        collection is then whole, whatever its count said. ``notes``: the part in parentheses."""
        if complete:
            for ns in self.collections:
                self.finish(ns)
        elapsed = self._clock() - self.started
        rate = average(self.rate.total, elapsed)
        ended = "done in" if complete else "stopped after"
        shown = "" if rate is None else f", {format_rate(rate)} docs/s"
        text = f"{self._head()}{shown}, {ended} {duration(elapsed, precise=True)}"
        if not notes:
            return text
        kinds = [f"{len(self.resumed)} done before"] if self.resumed else []
        empty = sum(1 for ns in self.collections if self.of(ns)[1] == 0)
        if empty:
            kinds.append(f"{empty} empty")
        return f"{text} ({plural(len(self.collections), 'collection')}{': ' if kinds else ''}{', '.join(kinds)})"


class ReplayTally:
    """The counts of one replay: events applied, events/s, lag behind the source."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        self.rate = Rate(clock)
        self.lag_s: float | None = None

    @property
    def events(self) -> int:
        return self.rate.total

    def advance(self, events: int, lag_s: float | None) -> None:
        self.rate.add(events)
        self.lag_s = lag_s

    def status(self) -> str:
        """While replaying: ``5,000 events applied, 2,380 events/s, lag 0.3s`` (``estimating…`` in place of
        the rate before a window of progress)."""
        lag = "-" if self.lag_s is None else f"{self.lag_s:.1f}s"
        rate = self.rate.per_s()
        shown = ESTIMATING if rate is None else f"{format_rate(rate)} events/s"
        return f"{plural(self.events, 'event')} applied, {shown}, lag {lag}"

    def idle(self) -> str:
        """While no event came for a while: ``idle; 5,000 events applied so far, lag 0.3s``."""
        lag = "-" if self.lag_s is None else f"{self.lag_s:.1f}s"
        return f"idle; {plural(self.events, 'event')} applied so far, lag {lag}"

    def end(self) -> str:
        """At the end: ``5,000 events applied in 2.1s, 2,380 events/s`` (events over the replay's whole time)."""
        elapsed = self._clock() - self.started
        applied = f"{plural(self.events, 'event')} applied in {duration(elapsed, precise=True)}"
        rate = average(self.events, elapsed)
        return f"{applied}, {format_rate(rate)} events/s" if self.events and rate is not None else applied


class Throttle:
    """True at most once per ``every_s`` seconds (checkpoint saves during a fast replay)."""

    def __init__(self, every_s: float) -> None:
        self._every = every_s
        self._last = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            return True
        return False
