"""What a person sees, without a server or a terminal: rates, snapshot and replay lines, their pace, the
rich display, and the end-of-run summary (a fake clock stands in for time)."""

from __future__ import annotations

import io
import logging
import re

import pytest
from bson.timestamp import Timestamp
from rich.console import Console

from replicator.events import Namespace
from replicator.job.copy import progress_plan as _progress_plan
from replicator.observe.progress import LogReporter, RichReporter
from replicator.observe.summary import Summary
from replicator.observe.tally import CollectionProgress, Rate, ReplayTally, SnapshotTally, per_second
from replicator.source.partitions import ALL, Partition

RUNNING = re.compile(r"snapshot: ([\d,]+)/([\d,]+) documents \((\d+)%\), ([\d,]+|-) docs/s, ETA (\S+)$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mcdc"]


def test_a_rate_over_a_few_milliseconds_is_not_shown(clock: FakeClock) -> None:
    rate = Rate(clock)
    clock.tick(0.003)
    rate.add(100)  # one batch acknowledged right after the start: 33,000/s would be noise
    assert rate.per_s() is None
    clock.tick(0.997)
    rate.add(100)
    assert rate.per_s() is None  # a second since the first batch: no window of progress yet
    clock.tick(1.003)
    rate.add(100)
    assert rate.per_s() == pytest.approx(100.0)  # from the first batch: the two after it over 2 s
    assert per_second(5, 0.01) is None and per_second(5, 0.5) == 10.0


def test_a_rate_follows_the_last_few_seconds(clock: FakeClock) -> None:
    rate = Rate(clock, window_s=5.0)
    for _ in range(200):  # 20 s at 1,000/s
        clock.tick(0.1)
        rate.add(100)
    assert rate.per_s() == pytest.approx(1000.0, rel=0.05)
    for _ in range(100):  # then 10 s at 100/s: the figure forgets the fast part
        clock.tick(0.1)
        rate.add(10)
    assert rate.per_s() == pytest.approx(100.0, rel=0.1)


def test_snapshot_status_reads_done_of_total_rate_and_eta(clock: FakeClock) -> None:
    tally = SnapshotTally([CollectionProgress("db.a", 100_000), CollectionProgress("db.b", 20_000)], clock)
    for _ in range(52):  # 52,000 documents in 6.5 s
        clock.tick(0.125)
        tally.advance("db.a", 1000)
    found = RUNNING.match("snapshot: " + tally.status())
    assert found, tally.status()
    assert found.groups() == ("52,000", "120,000", "43", "8,000", "9s")


def test_resumed_collections_show_as_done_and_do_not_speed_up_the_rate(clock: FakeClock) -> None:
    tally = SnapshotTally(
        [
            CollectionProgress("crash.a", 3000, done=3000, finished=True),  # done before this copy
            CollectionProgress("crash.b", 9000, done=1500),  # one partition of six done before
        ],
        clock,
    )
    clock.tick(1.0)
    tally.advance("crash.b", 750)
    clock.tick(2.0)
    tally.advance("crash.b", 1500)
    assert tally.totals() == (6750, 12000)
    assert tally.rate.per_s() == pytest.approx(750.0)  # not 3,375/s: what was there before is no speed
    assert tally.describe("crash.a") == "3,000 (done before)"
    assert tally.describe("crash.b") == "3,750/9,000"
    end = tally.end(complete=True)  # the partition resumed halfway: its earlier documents are in the count
    assert end.startswith("12,000/12,000 documents (100%), 750 docs/s, done in 3.0s (2 collections: 1 done before)")


def test_uncounted_and_empty_collections(clock: FakeClock) -> None:
    tally = SnapshotTally(
        [
            CollectionProgress("db.big", None),  # kept whole, not counted when planned
            CollectionProgress("db.none", 0),
            CollectionProgress("db.old", None, finished=True),  # done before, not counted either
        ],
        clock,
    )
    clock.tick(1.0)
    tally.advance("db.big", 500)
    assert tally.status() == "500 documents (1 collection not counted yet), estimating…"
    assert tally.describe("db.none") == "empty"
    tally.count("db.big", 2000)
    tally.count("db.old", 700)
    assert tally.totals() == (1200, 2700)
    assert tally.describe("db.old") == "700 (done before)"
    tally.finish("db.none")
    assert tally.describe("db.none") == "empty"
    assert tally.end(complete=True).endswith("(3 collections: 1 done before, 1 empty)")


def test_log_lines_come_every_few_seconds_and_at_each_tenth_then_one_at_the_end(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcdc")
    reporter = LogReporter(every_s=5.0, clock=clock)
    reporter.snapshot_begin([CollectionProgress("db.c", 1_000_000)])
    for _ in range(160):  # 20 s at 1,000 documents a second: 2% of the total
        clock.tick(0.125)
        reporter.snapshot_advance("db.c", 125)
    assert len(_lines(caplog)) == 4  # by time: at 5, 10, 15 and 20 s
    for _ in range(49):  # then 40 times faster: a tenth every 2.5 s, before 5 s pass
        clock.tick(0.5)
        reporter.snapshot_advance("db.c", 20_000)
    reporter.snapshot_collection_done("db.c")
    reporter.snapshot_end(complete=True)
    lines = _lines(caplog)
    running = [RUNNING.match(line) for line in lines[:-1]]
    assert all(running), lines
    assert [int(m.group(3)) for m in running if m] == [0, 1, 1, 2, 10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert lines[-1] == "snapshot: 1,000,000/1,000,000 documents (100%), 22,472 docs/s, done in 44.5s (1 collection)"


def test_the_begin_line_names_collections_copied_before(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcdc")
    reporter = LogReporter()
    reporter.snapshot_begin(
        [CollectionProgress("crash.a", 3000, done=3000, finished=True), CollectionProgress("crash.b", 9000)]
    )
    assert _lines(caplog) == ["snapshot: 1 of 2 collections already copied: crash.a"]


def test_replay_reports_events_over_the_whole_replay(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcdc")
    reporter = LogReporter(every_s=5.0, clock=clock)
    reporter.replay_begin()
    clock.tick(0.4)  # opening the stream
    reporter.replay_advance(1000, 2.0)
    clock.tick(0.002)  # a batch right behind: 500,000 events/s for an instant, which nobody should read
    reporter.replay_advance(1000, 0.5)
    clock.tick(0.6)
    reporter.replay_advance(0, 0.0)  # caught up
    reporter.replay_end()
    assert _lines(caplog) == ["replay: 2,000 events applied in 1.0s, 1,996 events/s"]


def test_an_idle_replay_logs_a_heartbeat_every_few_minutes(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcdc")
    reporter = LogReporter(every_s=5.0, clock=clock, idle_every_s=300.0)
    reporter.replay_begin()
    for _ in range(20):  # busy: a line every 5 s
        clock.tick(1.0)
        reporter.replay_advance(100, 0.5)
    assert len(_lines(caplog)) == 4
    caplog.clear()
    for _ in range(3600):  # an idle hour, polled every second: a line every 5 minutes, not every 5 s
        clock.tick(1.0)
        reporter.replay_advance(0, 0.2)
    assert _lines(caplog) == ["replay: idle; 2,000 events applied so far, lag 0.2s"] * 12
    caplog.clear()
    clock.tick(1.0)
    reporter.replay_advance(5, 0.1)  # events again: lines every 5 s again
    for _ in range(5):
        clock.tick(1.0)
        reporter.replay_advance(5, 0.1)
    assert len(_lines(caplog)) == 1 and _lines(caplog)[0].startswith("replay: 2,025 events applied")


def test_replay_lines_while_following_show_rate_and_lag(clock: FakeClock) -> None:
    tally = ReplayTally(clock)
    for _ in range(60):
        clock.tick(0.5)
        tally.advance(250, 1.25)
    assert tally.status() == "15,000 events applied, 500 events/s, lag 1.2s"


def test_rich_display_shows_overall_progress_resumed_and_empty_collections(clock: FakeClock) -> None:
    out = io.StringIO()
    reporter = RichReporter(Console(file=out, width=160, force_terminal=False), clock)
    reporter.snapshot_begin(
        [
            CollectionProgress("db.done", 3000, done=3000, finished=True),
            CollectionProgress("db.empty", 0),
            CollectionProgress("db.big", 9000),
        ]
    )
    for _ in range(9):
        clock.tick(0.5)
        reporter.snapshot_advance("db.big", 1000)
    reporter.snapshot_collection_done("db.big")
    reporter.snapshot_end(complete=True)
    reporter.close()
    text = out.getvalue()
    assert "3,000 (done before)" in text and "empty" in text and "9,000 done" in text
    assert "12,000/12,000 documents (100%), 2,000 docs/s, done in 4.5s" in text


def test_progress_plan_marks_partitions_done_before_and_collections_to_count() -> None:
    a, b, whole = Namespace("db", "a"), Namespace("db", "b"), Namespace("db", "w")
    plan = [
        Partition(a, 0, "number", None, 10, estimated_docs=10),
        Partition(a, 1, "number", 10, None, estimated_docs=5),
        Partition(b, 0, "number", estimated_docs=7),
        Partition(whole, 0, ALL),
    ]
    collections, uncounted = _progress_plan(plan, {plan[0].id, plan[2].id})
    assert collections == [
        CollectionProgress("db.a", 15, done=10, finished=False),
        CollectionProgress("db.b", 7, done=7, finished=True),
        CollectionProgress("db.w", None, done=0, finished=False),
    ]
    assert uncounted == [whole]


def test_json_summary_position_is_a_t_and_i_pair() -> None:
    summary = Summary("catch-up", "src", "dst", "cp.json", documents=0, events=3000, replay_s=1.5)
    summary.position = Timestamp(1_795_436_402, 1005)
    data = summary.to_json()
    assert data["position"] == {"t": 1_795_436_402, "i": 1005}
    assert data["events_per_s"] == 2000.0 and "docs_per_s" not in data  # no copy: no rate, not a null
    lines = summary.lines()
    assert "3,000 change events replayed in 1.5 s (2,000 events/s)" in lines[0]
    assert lines[2] == "checkpoint cp.json, position 1795436402,1005 (2026-11-23T12:20:02Z)"
    assert Summary("sync", "s", "t", "c").to_json()["position"] is None


def test_a_short_run_gets_rates_and_plurals_agree() -> None:
    """A copy of 0.05 s still has a rate (a number, not "-"), and one collection is not "1 collections"."""
    summary = Summary("sync", "src", "dst", "cp.json", collections=1, documents=100, snapshot_s=0.05, events=1)
    summary.replay_s = 0.01
    assert summary.to_json()["docs_per_s"] == 2000.0 and summary.to_json()["events_per_s"] == 100.0
    line = summary.lines()[0]
    assert ": 1 collection, 100 documents copied (snapshot skipped, 2,000 docs/s)" in line, line
    assert "1 change event replayed in 0.0 s (100 events/s)" in line and " - " not in line


def test_a_short_copy_and_replay_end_with_a_rate_not_a_dash(clock: FakeClock) -> None:
    tally = SnapshotTally([CollectionProgress("db.a", 100)], clock)
    tally.advance("db.a", 100)
    clock.tick(0.05)
    assert tally.end(complete=True, notes=False) == "100/100 documents (100%), 2,000 docs/s, done in 0.0s"
    replay = ReplayTally(clock)
    replay.advance(10, 0.0)
    clock.tick(0.1)
    assert replay.end() == "10 events applied in 0.1s, 100 events/s"


def test_no_rate_or_eta_before_a_window_of_progress_then_one_that_ignores_the_wait_before_it(clock: FakeClock) -> None:
    """Issue 41: an ETA of 24 minutes at the start of a copy of one. The time before the first batch (a
    Spark session starting, cursors opening) is no copying, and one batch over half a second is no rate."""
    tally = SnapshotTally([CollectionProgress("db.a", 120_000)], clock)
    clock.tick(30.0)  # nothing acknowledged for 30 s
    tally.advance("db.a", 2000)
    assert tally.status() == "2,000/120,000 documents (1%), estimating…"
    clock.tick(0.5)
    tally.advance("db.a", 1000)
    assert tally.status() == "3,000/120,000 documents (2%), estimating…"  # half a second: no window yet
    for _ in range(10):  # then 2,000 documents a second
        clock.tick(0.5)
        tally.advance("db.a", 1000)
    assert tally.status() == "13,000/120,000 documents (10%), 2,000 docs/s, ETA 54s"


def test_replay_lines_say_estimating_before_a_window(clock: FakeClock) -> None:
    tally = ReplayTally(clock)
    clock.tick(10.0)
    tally.advance(500, 2.0)
    assert tally.status() == "500 events applied, estimating…, lag 2.0s"


def test_capped_copy_before_a_window_still_names_its_cap(clock: FakeClock) -> None:
    tally = SnapshotTally([CollectionProgress("db.a", 1000)], clock, cap="read rate capped at 50 docs/s")
    tally.advance("db.a", 50)
    assert tally.status() == "50/1,000 documents (5%), estimating… (read rate capped at 50 docs/s)"


def test_log_lines_while_waiting_for_the_first_batch_show_no_rate(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 41: a line said "2 docs/s" of a copy the summary put at 2,105 docs/s."""
    caplog.set_level(logging.INFO, logger="mcdc")
    reporter = LogReporter(every_s=5.0, clock=clock)
    reporter.snapshot_begin([CollectionProgress("db.c", 21_050)])
    clock.tick(9.0)  # the first batch takes its time
    reporter.snapshot_advance("db.c", 20)
    for _ in range(100):  # then 2,105 documents a second for 10 s
        clock.tick(0.1)
        reporter.snapshot_advance("db.c", 210)
    rates = [m.group(4) for m in map(RUNNING.match, _lines(caplog)) if m]
    assert rates and all(_number(rate) > 1900 for rate in rates), _lines(caplog)
    assert all("estimating…" in line or RUNNING.match(line) for line in _lines(caplog)), _lines(caplog)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_a_summary_counts_collections_copied_again_not_a_snapshot_of_none() -> None:
    """Issue 41: "0 collections, 3,026 documents copied (snapshot skipped)" of a catch-up that copied one
    collection again."""
    summary = Summary("catch-up", "src", "dst", "cp.json", documents=3026, snapshot_s=1.44, events=12, replay_s=1.5)
    summary.recopied, summary.recopied_documents, summary.recopied_s = ["shop.a"], 3026, 1.44
    line = summary.lines()[0]
    assert "0 collections" not in line, line
    assert line.startswith("catch-up finished in 0.0 s: snapshot skipped, 1 collection copied again ("), line
    assert "copied again (3,026 documents, 2,101 docs/s), 12 change events replayed" in line, line
    assert summary.lines()[1] == "copied again from the source: shop.a"


def test_a_summary_says_a_collection_gone_from_the_source_was_dropped_not_copied_again() -> None:
    summary = Summary("catch-up", "src", "dst", "cp.json", events=3, replay_s=0.5)
    summary.dropped = ["shop.gone"]
    lines = summary.lines()
    assert lines[0].startswith("catch-up finished in 0.0 s: snapshot skipped, 1 collection dropped as on the source, ")
    assert "copied again" not in "\n".join(lines), lines
    assert lines[1] == "dropped as on the source (gone from it): shop.gone"
    assert summary.to_json()["dropped"] == ["shop.gone"]


def test_a_summary_of_a_snapshot_and_a_copy_again_counts_each() -> None:
    summary = Summary(
        "sync", "src", "dst", "cp.json", collections=3, documents=1100, snapshot_s=2.0, snapshot="completed"
    )
    summary.recopied, summary.recopied_documents, summary.recopied_s = ["db.x"], 100, 1.0
    line = summary.lines()[0]
    assert ": 3 collections, 1,000 documents copied (snapshot completed, 1,000 docs/s), " in line, line
    assert "1 collection copied again (100 documents, 100 docs/s)" in line, line
