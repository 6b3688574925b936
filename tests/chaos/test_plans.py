"""The chaos plans as drawn, without servers: their fail point steps (tests/chaos/failpoints.py) cover
every fault of the source's reads and of a MongoDB target's writes on every kind of plan, and the harness's
bookkeeping of armed fail points turns each off when it should."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.chaos import failpoints
from tests.chaos.failpoints import FailPoints, FailStep
from tests.chaos.harness import ENGINES, MODES, SINKS, Plan
from tests.support.failpoint import READ_FAULTS, SOURCE_READS, TARGET_WRITES, WRITE_FAULTS

#: seeds enough for every fault of each side to come up in each plan kind, many times over
SEEDS = range(200)


def _fail_steps(plan: Plan) -> Iterator[FailStep]:
    for step in (*plan.steps, plan.opening, *plan.back_fails):
        if failpoints.is_fail(step):
            yield FailStep.parse(step)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("mode", MODES)
def test_plans_draw_every_fault_of_the_sources_reads_and_a_mongodb_targets_writes(
    engine: str, sink: str, mode: str
) -> None:
    """Over many seeds, each plan kind (filtered or not, as drawn) arms each of READ_FAULTS on the source's
    reads and, when its target is MongoDB, each of WRITE_FAULTS on the target's writes, a few times and for a
    while; a Kafka or lake plan's target is no MongoDB server, so it never draws the target's."""
    drawn: dict[tuple[str, str, bool], int] = {}
    for seed in SEEDS:
        for step in _fail_steps(Plan.draw(seed, mode=mode, engine=engine, sink=sink)):
            key = (step.side, step.fault.name, step.times is None)
            drawn[key] = drawn.get(key, 0) + 1
    want = {("source", fault.name, a_while) for fault in READ_FAULTS for a_while in (False, True)}
    if sink == "mongo":
        want |= {("target", fault.name, a_while) for fault in WRITE_FAULTS for a_while in (False, True)}
    assert set(drawn) == want


@pytest.mark.parametrize("sink", SINKS)
def test_every_plan_arms_a_fail_point_on_each_side_its_target_has(sink: str) -> None:
    for seed in SEEDS:
        plan = Plan.draw(seed, sink=sink)
        sides = {FailStep.parse(step).side for step in plan.steps if failpoints.is_fail(step)}
        assert sides == set(failpoints.sides_of(sink)), plan


def test_the_way_back_draws_fail_points_on_both_sides_and_filtered_plans_draw_them_too() -> None:
    """The way back (after a cutover; its target is the old side, a MongoDB server) arms them on either side;
    a filtered plan has its own in its steps."""
    back = [plan for plan in (Plan.draw(seed) for seed in SEEDS) if plan.back]
    assert back and all(plan.back_fails for plan in back)
    assert {FailStep.parse(step).side for plan in back for step in plan.back_fails} == {"source", "target"}
    assert not any(Plan.draw(seed).back_fails for seed in SEEDS if not Plan.draw(seed).back)
    filtered = Plan.draw(3, filtered=True)
    assert filtered.filter and any(failpoints.is_fail(step) for step in filtered.steps)


def test_a_plans_printout_shows_its_fail_points() -> None:
    """A failure prints the plan: every fail point in it, as ``soak.py --once --seed S`` draws it again."""
    plan = next(plan for plan in (Plan.draw(seed) for seed in SEEDS) if plan.opening and plan.back_fails)
    text = str(plan)
    for step in (*(s for s in plan.steps if failpoints.is_fail(s)), plan.opening, *plan.back_fails):
        assert step in text
    assert Plan.draw(plan.seed) == plan


def test_a_fail_step_reads_back_as_it_was_written() -> None:
    for fault in (*READ_FAULTS, *WRITE_FAULTS):
        for step in (FailStep("target", fault, times=3), FailStep("source", fault, seconds=2.5)):
            assert FailStep.parse(str(step)) == step
    assert FailStep.parse("fail source error-43 x2").commands == SOURCE_READS
    assert FailStep.parse("fail target writeConcernError-64 for 1.5s").commands == TARGET_WRITES
    with pytest.raises(ValueError):
        FailStep.parse("fail broker error-6 x1")


class _Servers:
    """Stands in for the servers' fail point commands: what is armed where."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: dict[str, str] = {}
        self.changed = threading.Condition()
        monkeypatch.setattr(failpoints, "arm", self._arm)
        monkeypatch.setattr(failpoints, "disarm", self._disarm)

    def _arm(self, uri: str, fault: object, commands: object, *, times: int | None) -> None:
        with self.changed:
            self.armed[uri] = f"{fault} {times}"
            self.changed.notify_all()

    def _disarm(self, uri: str) -> None:
        with self.changed:
            self.armed.pop(uri, None)
            self.changed.notify_all()

    def wait_off(self, uri: str) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: uri not in self.armed, timeout=30)


def test_a_while_ends_on_its_own_a_later_fail_point_outlives_the_earlier_ones_timer_and_all_end_before_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = _Servers(monkeypatch)
    points = FailPoints({"source": lambda: "S", "target": lambda: "T"})
    mark = points.mark()
    assert not points.since(mark)
    points.arm(FailStep.parse("fail source error-6 for 0.5s"))
    assert points.since(mark)
    servers.wait_off("S")  # its while is over
    points.arm(FailStep.parse("fail target error-91 for 0.5s"))
    earlier = points._timers[-1]
    points.arm(FailStep.parse("fail target closeConnection x2"))  # replaces it
    earlier.join(30)
    assert not earlier.is_alive() and "T" in servers.armed  # the earlier one's timer left the later one be
    points.arm(FailStep.parse("fail source error-6 for 60.0s"))
    points.reset("source")  # a restart: gone with the server's memory, but turned off all the same below
    assert points.count == 4
    timers = list(points._timers)
    points.disarm_all()
    assert servers.armed == {}
    for timer in timers:  # cancelled: none turns a later plan's fail point off
        timer.join(30)
        assert not timer.is_alive()


def test_partial_migrations_draw_a_way_back_with_filters_excluded_fields_and_unique_keys() -> None:
    """Plans of part of a collection (a --filter, chaos.u's among them: a unique index) and of part of each
    document (a --field-exclude, top-level and nested) are cut over and carried back too, on both engines."""
    plans = [Plan.draw(seed, mode=mode) for seed in SEEDS for mode in ("tail", "catch-up")]
    back = [plan for plan in plans if plan.back]
    assert any(plan.filter for plan in back) and any(plan.exclude for plan in back)
    assert any(plan.filter and plan.exclude for plan in back)
    assert any(plan.filter.startswith("chaos\\.u=") for plan in back)
    assert {plan.exclude for plan in back if plan.exclude} == {"chaos.a.t", "chaos.b.c", "chaos.a.sub.x"}
    assert not any(plan.exclude for plan in (Plan.draw(seed, sink="kafka") for seed in SEEDS))  # MongoDB only
