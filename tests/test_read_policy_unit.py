"""--read-preference and --max-read-rate without a server: the token bucket's arithmetic on a fake clock, the
read preference built from the option and the URI, the options' one-line refusals, the cap shown in progress
and /progress, and the rate reaching the bucket of each engine's readers."""

from __future__ import annotations

import heapq
import random
from types import SimpleNamespace
from typing import Any

import pytest
from pymongo.read_preferences import Nearest, Primary, PrimaryPreferred, Secondary, SecondaryPreferred

from replicator.errors import ConfigError
from replicator.events import Namespace
from replicator.observe.migration import Facts, progress_document
from replicator.observe.progress import LogReporter
from replicator.observe.tally import SnapshotTally, read_cap
from replicator.settings.resolve import resolve, settings_from_strings
from replicator.snapshot.copy import CopyLimits
from replicator.source.pace import BURST_S, TokenBucket, chunk_for, split_rate
from replicator.source.partitions import ALL, Partition
from replicator.source.reads import ReadPolicy, SourceReads, max_staleness

SOURCE = "mongodb://a:1/?replicaSet=rs0"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the bucket ---


def test_a_full_bucket_lets_a_burst_through_then_makes_readers_wait_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000, clock=clock)
    assert bucket.capacity == 1000 * BURST_S
    assert bucket.reserve(100) == 0.0  # the burst
    assert bucket.reserve(100) == pytest.approx(0.1)  # in debt: paid back at 1,000/s
    assert bucket.reserve(100) == pytest.approx(0.2)  # the next reader waits behind it
    clock.now += 0.2
    assert bucket.reserve(100) == pytest.approx(0.1)


def test_a_reservation_larger_than_the_bucket_still_goes_through_in_debt() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, clock=clock)  # holds one document
    assert bucket.capacity == 1
    wait = bucket.reserve(1000)
    assert wait == pytest.approx(99.9)  # finite: the reader goes on once the debt is paid
    clock.now += wait
    assert bucket.reserve(1) == pytest.approx(0.1)


def test_tokens_given_back_shorten_the_next_wait_but_never_overfill() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100, clock=clock)
    bucket.reserve(10)
    assert bucket.reserve(10) == pytest.approx(0.1)
    bucket.give_back(10)  # the reply held none of them
    assert bucket.reserve(10) == pytest.approx(0.1)
    clock.now += 60  # idle: refilled to the capacity, not to a minute's worth
    bucket.give_back(500)
    assert bucket.reserve(10) == 0.0
    assert bucket.reserve(10) == pytest.approx(0.1)


@pytest.mark.parametrize("seed", range(5))
def test_readers_sharing_a_bucket_hold_the_rate_over_every_5_second_window(seed: int) -> None:
    """Simulated readers (each: reserve a chunk, wait, read it, read on) with random reply sizes: the
    documents read in any 5-second window never exceed rate * 5 + the bucket's capacity."""
    rng = random.Random(seed)
    rate = rng.choice([50, 2000, 13_000])
    clock = FakeClock()
    bucket = TokenBucket(rate, clock=clock)
    chunk = chunk_for(rate, batch_docs=1000)
    readers = rng.randint(1, 8)
    reads: list[tuple[float, int]] = []
    ready = [(clock.now, n) for n in range(readers)]  # when each reader asks next
    heapq.heapify(ready)
    while ready and len(reads) < 3000:
        at, n = heapq.heappop(ready)
        clock.now = at
        wait = bucket.reserve(chunk)
        got = chunk if rng.random() > 0.1 else rng.randint(0, chunk)  # a short reply: the partition's end
        bucket.give_back(chunk - got)
        reads.append((at + wait, got))
        heapq.heappush(ready, (at + wait + rng.uniform(0, 0.05), n))  # the read's own time
    reads.sort()
    times = [t for t, _ in reads]
    assert times[-1] - times[0] > 5  # long enough to have whole windows
    bound = rate * 5 + bucket.capacity
    total, j = 0, 0
    for i in range(len(reads)):  # every window [t_i - 5, t_i]
        total += reads[i][1]
        while times[j] < times[i] - 5:
            total -= reads[j][1]
            j += 1
        assert total <= bound, (i, total, bound)


def test_the_chunk_is_a_tenth_of_a_second_of_documents_within_the_batch() -> None:
    assert chunk_for(2000, 1000) == 200
    assert chunk_for(1_000_000, 1000) == 1000
    assert chunk_for(3, 1000) == 1
    assert split_rate(2000, 4) == 500 and split_rate(0, 4) == 0 and split_rate(100, 0) == 100


def test_a_bucket_needs_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        TokenBucket(0)


# --- the read preference ---


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("primary", Primary),
        ("primaryPreferred", PrimaryPreferred),
        ("secondary", Secondary),
        ("secondaryPreferred", SecondaryPreferred),
        ("nearest", Nearest),
    ],
)
def test_each_mode_is_pymongos_with_the_uris_max_staleness(mode: str, kind: type) -> None:
    s = settings_from_strings(
        {"source": SOURCE + "&readPreference=nearest&maxStalenessSeconds=120", "read-preference": mode},
        command="status",
    )
    policy = ReadPolicy.of(s)
    preference = policy.preference
    assert isinstance(preference, kind)
    assert policy.causal is (mode != "primary")  # only a read that may reach a secondary waits for a time
    if mode != "primary":
        assert preference.max_staleness == 120
    assert ReadPolicy.of(settings_from_strings({"source": SOURCE}, command="status")).mode == "primary"  # the default


def test_max_staleness_is_read_from_the_uri_whatever_its_case() -> None:
    assert max_staleness("mongodb://a/?maxstalenessseconds=95&readPreference=nearest") == 95
    assert max_staleness("mongodb://a/?w=1") == -1
    assert max_staleness("mongodb://a") == -1


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("read-preference", "secondaryy", "option read-preference must be one of primary, primaryPreferred"),
        ("max-read-rate", "-5", "option max-read-rate must be at least 0"),
        ("max-read-rate", "fast", "option max-read-rate"),
    ],
)
def test_bad_values_are_refused_in_one_line(option: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_strings({"source": SOURCE, option: value}, command="status")
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_options_are_mcdc_variables_too() -> None:
    s = resolve({"source": SOURCE, "target": "-"}, env={"MCDC_READ_PREFERENCE": "nearest", "MCDC_MAX_READ_RATE": "700"})
    assert (s.read_preference, s.max_read_rate) == ("nearest", 700)


# --- the rate reaching the readers' buckets ---


def test_the_rate_reaches_the_bucket_the_snapshot_workers_share() -> None:
    from replicator.job.copy import SnapshotCopy

    s = settings_from_strings({"source": SOURCE, "target": "-", "max-read-rate": "2000"})
    limits = SnapshotCopy._limits(SimpleNamespace(s=s))  # type: ignore[arg-type]
    assert limits.reading == ReadPolicy("primary", -1, 2000.0)
    reads = SourceReads.start(limits.reading)
    assert reads.bucket is not None and reads.bucket.rate == 2000
    assert reads.chunk(1000) == 200
    unpaced = SourceReads.start(ReadPolicy())
    assert unpaced.bucket is None and unpaced.chunk(1000) == 1000


async def test_the_spark_engine_gives_each_task_running_at_once_an_equal_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from replicator.engines.spark.snapshot import SparkCopier
    from replicator.observe.progress import LogReporter

    s = settings_from_strings({"source": SOURCE, "target": "mongodb://b:2", "max-read-rate": "3000"})
    seen: list[Any] = []

    def run(self: SparkCopier, task: Any) -> tuple[int, list[Any]]:
        seen.append(task.limits.reading)
        return 0, []

    monkeypatch.setattr(SparkCopier, "_run", run)
    spark = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=3))
    parts = [Partition(Namespace("db", f"c{n}"), 0, ALL, estimated_docs=10) for n in range(5)]
    sink = SimpleNamespace(copies_append=lambda ns: False, source_name="")

    async def done(part: Partition, docs: int) -> None:
        pass

    await SparkCopier(s, spark)(
        None, sink, parts, limits=CopyLimits(2, 1000, 1 << 20, 2, ReadPolicy.of(s)), rename=lambda ns: ns,
        on_done=done, reporter=LogReporter(),
    )  # fmt: skip
    assert [p.rate for p in seen] == [1000.0] * 5  # 3 at once: a third each


# --- progress ---


def test_the_snapshot_line_and_progress_document_show_the_cap() -> None:
    assert read_cap(2000) == "read rate capped at 2,000 docs/s" and read_cap(0) == ""
    clock = FakeClock()
    tally = SnapshotTally(clock=clock, cap=read_cap(2000))
    tally.count("db.c", 40_000)
    tally.advance("db.c", 4000)
    clock.now += 2
    assert "docs/s (read rate capped at 2,000 docs/s), ETA" in tally.status()
    reporter = LogReporter(max_read_rate=2000)
    reporter.snapshot_begin([])
    assert reporter._tally().cap == "read rate capped at 2,000 docs/s"
    facts = Facts("SNAPSHOT", False, None, 0, 40_000, 4000, max_read_rate=2000)
    progress = progress_document(facts)["progress"]
    assert progress["collectionCopy"]["maxReadRate"] == 2000
    assert progress["info"] == "copying collections (read rate capped at 2,000 docs/s)"
    plain = progress_document(Facts("SNAPSHOT", False, None, 0, 40_000, 4000))["progress"]
    assert "maxReadRate" not in plain["collectionCopy"] and plain["info"] == "copying collections"
