"""The chaos plans' fail point steps: MongoDB's ``failCommand`` armed on mcdc's reads of the source and on
its writes to a MongoDB target, as MongoDB tests its drivers (tests/support/failpoint.py).

A step reads ``fail SIDE FAULT xN`` (the next N of the side's matching commands fail) or ``fail SIDE FAULT
for S.Ss`` (every one fails for S.S seconds, then the fail point is turned off), SIDE being ``source`` or
``target`` and FAULT a fault's name with dashes for spaces (``error-10107``, ``writeConcernError-64``,
``block-1500-ms``, ``closeConnection``). The source's reads draw from READ_FAULTS, the target's writes
from WRITE_FAULTS; only mcdc's clients are struck (``appName`` "mcdc", which the Spark engine's driver and
tasks use too), never the harness's workload or its comparisons.

A fail point lives in the server's memory: a restart turns it off (:meth:`FailPoints.reset`), and the
harness turns every one off before it checks the target and when a plan ends however it ends
(:meth:`FailPoints.disarm_all`).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pymongo.errors import PyMongoError

from tests.support.failpoint import READ_FAULTS, SOURCE_READS, TARGET_WRITES, WRITE_FAULTS, Fault, arm, disarm

#: what each side's fail points strike, and with what
SIDES: dict[str, tuple[tuple[Fault, ...], tuple[str, ...]]] = {
    "source": (READ_FAULTS, SOURCE_READS),
    "target": (WRITE_FAULTS, TARGET_WRITES),
}
#: every fault by its name in a step
FAULTS = {fault.name.replace(" ", "-"): fault for fault in (*WRITE_FAULTS, *READ_FAULTS)}
#: "a few times": how many matching commands fail
TIMES = (1, 5)
#: "for a while": how many seconds every matching command fails
SECONDS = (0.5, 4.0)


def sides_of(sink: str) -> tuple[str, ...]:
    """The sides a plan's fail points strike: the source always, the target when it is MongoDB."""
    return ("source", "target") if sink == "mongo" else ("source",)


@dataclass(frozen=True)
class FailStep:
    """One fail point: ``fault`` on ``side``'s commands, ``times`` times, or (None) for ``seconds``."""

    side: str
    fault: Fault
    times: int | None = None
    seconds: float = 0.0

    @classmethod
    def parse(cls, step: str) -> FailStep:
        """The step ``fail SIDE FAULT xN`` or ``fail SIDE FAULT for S.Ss``."""
        verb, side, name, *rest = step.split()
        if verb != "fail" or side not in SIDES or name not in FAULTS:
            raise ValueError(f"not a fail point step: {step!r}")
        if rest and rest[0].startswith("x"):
            return cls(side, FAULTS[name], times=int(rest[0][1:]))
        return cls(side, FAULTS[name], seconds=float(rest[1].rstrip("s")))

    @property
    def commands(self) -> tuple[str, ...]:
        return SIDES[self.side][1]

    def __str__(self) -> str:
        name = self.fault.name.replace(" ", "-")
        return f"fail {self.side} {name} " + (f"x{self.times}" if self.times is not None else f"for {self.seconds}s")


def draw(rng: random.Random, sides: tuple[str, ...]) -> str:
    """One fail point step: a side, one of its faults, and a few times or a while."""
    side = rng.choice(sides)
    fault = rng.choice(SIDES[side][0])
    if rng.random() < 0.5:
        return str(FailStep(side, fault, times=rng.randint(*TIMES)))
    return str(FailStep(side, fault, seconds=round(rng.uniform(*SECONDS), 1)))


def is_fail(step: str) -> bool:
    """Is ``step`` a fail point step?"""
    return step.startswith("fail ")


class FailPoints:
    """The fail points one runner armed: a while's is turned off by a timer, a later one on the same server
    replaces it (a server holds one ``failCommand``), a restart ends it, and :meth:`disarm_all` ends them all."""

    def __init__(self, uris: dict[str, Callable[[], str]]) -> None:
        """``uris``: each side's server URI."""
        self._uris = uris
        self._lock = threading.Lock()
        self._armed: dict[str, int] = {}  # side -> generation of its fail point, while armed
        self._generation = 0
        self._timers: list[threading.Timer] = []
        self._touched: set[str] = set()  # the sides ever armed
        self.count = 0  # armed in all

    def mark(self) -> tuple[int, bool]:
        """Where the fail points stand as a run begins: how many were armed, and whether one is now."""
        return self.count, bool(self._armed)

    def since(self, mark: tuple[int, bool]) -> bool:
        """Could a fail point have struck a run that began at ``mark``: one armed then, or since?"""
        return mark[1] or self.count > mark[0] or bool(self._armed)

    def arm(self, step: FailStep) -> None:
        """Arm ``step`` on its side's server now; a while's is disarmed by a timer."""
        with self._lock:
            arm(self._uris[step.side](), step.fault, step.commands, times=step.times)
            self._generation += 1
            self._armed[step.side] = generation = self._generation
            self._touched.add(step.side)
            self.count += 1
        if step.times is None:
            timer = threading.Timer(step.seconds, self._expire, (step.side, generation))
            timer.daemon = True
            self._timers.append(timer)
            timer.start()

    def _expire(self, side: str, generation: int) -> None:
        with self._lock:
            if self._armed.get(side) == generation:  # not replaced since, nor reset by a restart
                self._off(side, strict=False)

    def _off(self, side: str, *, strict: bool) -> None:
        # a server paused right now answers once resumed (within the admin client's server selection
        # timeout); one stopped comes back without it. Not strict: what failed stays to be turned off later
        try:
            disarm(self._uris[side]())
        except PyMongoError:
            if strict:
                raise
            return
        self._armed.pop(side, None)

    def reset(self, side: str) -> None:
        """``side``'s server restarted: its fail point is gone."""
        with self._lock:
            self._armed.pop(side, None)

    def disarm(self, side: str) -> None:
        """Turn ``side``'s fail point off now (a bounded run it struck is over)."""
        with self._lock:
            if side in self._armed:
                self._off(side, strict=True)

    def disarm_all(self, *, strict: bool = True) -> None:
        """Turn every side's fail point off that was ever armed, and cancel the timers: nothing armed reaches
        the checks. ``strict``: a server that cannot be told raises (not so when a failed plan ends)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        with self._lock:
            for side in sorted(self._touched):
                self._off(side, strict=strict)
