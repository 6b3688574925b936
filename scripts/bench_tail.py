"""Benchmark: ``mcdc tail`` against the naive change-stream replay of a well-known article, on the same two servers.

    python scripts/bench_tail.py [--events 30000] [--rate 200] [--duration 20] [--json]
    python scripts/bench_tail.py --source mongodb://... --target mongodb://...

One run measures three things:

1. Throughput on a backlog. The source's operation time T is read (``ping``), then ``--events`` change events
   are made on ``bench.events`` with insert_many / bulk_write: inserts, ``$set`` updates, replaces and deletes,
   and last a marker document. Every event sets the field ``v`` to its sequence number, so the collection's
   count and sum of ``v`` tell when a replica has applied all of them. Then, into the same target:

   a. naive: the replay of "MongoDB Master-Slave Replication by Change Stream" (finisky.github.io), in process
      with pymongo's sync client: ``watch(full_document="updateLookup", start_at_operation_time=T)`` over the
      deployment, one ``replace_one({_id}, fullDocument, upsert=True)`` per insert/update/replace event and
      one ``delete_one`` per delete (write concern w:1, retryable writes off: see ``_writer``), timed from
      opening the stream until the marker is applied;
   b. ``mcdc tail --start-at T`` with a fresh checkpoint into the wiped target, timed from process start until
      the target's count and sum of ``v`` equal the source's; then SIGTERM, which should exit 0.

   Each target is then compared with the source document by document (raw BSON, by ``_id``).
2. Lag at a steady write rate: ``mcdc tail --snapshot never`` with a fresh checkpoint into a wiped target. Once
   its checkpoint file exists and one warm-up document written on the source shows on the target, one thread
   inserts and updates ``bench.lag`` documents carrying ``seq`` and ``written_at`` (wall clock) at ``--rate``
   writes/s for ``--duration`` s on an absolute schedule, and a change stream on the TARGET collection records
   when each ``seq`` arrives. lag = arrival - written_at: p50, p99 (nearest rank) and max.
3. The tail's RSS (children included, sampled every 50 ms) during phase 2: the peak, and the median over the
   first and over the last second of the writes, whose difference should stay flat.

Prints a table and PASS/FAIL for the targets (events/s mcdc/naive >= 10, lag p99 < 1 s, RSS growth < 20 MB,
both targets identical to the source, exit 0 on SIGTERM, every write arrived); exits 0 whatever they say: it
is a measurement. Exits 1 only when something crashed: ``mcdc tail`` is missing or died, a replay never
reached the final state, a write failed.

Without ``--source/--target`` it starts two local SecantusDB servers (a Python MongoDB-compatible server,
several times slower than mongod) in a temporary directory: figures are for that server, not for MongoDB;
the ratios within one run are what count. With them, the ``bench`` database is dropped on both; note that
``mcdc tail`` follows every database of the source, so other writes there during the run reach the target.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import bson
import harness
import psutil
import pymongo
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo import DeleteOne, ReplaceOne, UpdateOne
from pymongo.collection import Collection

from tests.support.compare import RAW
from tests.support.servers import connect

DB = harness.DB  # the bench database, dropped by harness.reset_target
EVENTS = "events"
LAG = "lag"
WARMUP = "warmup"
MARKER_ID = "marker"
ROUND = 500  # inserts per round, then as many updates, replaces and deletes (fewer for a small backlog)
OP_WEIGHTS = {"update": 55, "replace": 25, "delete": 20}
TAGS = ("red", "green", "blue", "cyan", "magenta", "yellow", "black", "white")
NAIVE_BATCH = 2000  # the article's BatchSize

RATIO_TARGET = 10.0
P99_TARGET_S = 1.0
RSS_GROWTH_TARGET_MB = 20.0
POLL_S = 0.05  # target polling period while waiting for a replay to finish
RSS_WINDOW_S = 1.0  # RSS "at the start" / "at the end": the median over this long
STOP_TIMEOUT_S = 30.0  # SIGTERM -> exit
WARMUP_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 15.0  # after the last write, how long the lag phase waits for stragglers
_MB = 1024 * 1024

Client = pymongo.MongoClient[dict[str, Any]]
Coll = Collection[dict[str, Any]]


def _writer(uri: str) -> Client:
    """A client for the benchmark's own writes (the backlog, the naive replay, the steady writer).

    Without retryable writes: SecantusDB keeps every retryable write's reply for 30 minutes and, past
    10,000 of them, sorts them all on each write (about 15 ms), a cost mongod does not have. A loop of
    30,000 single writes would measure that instead of itself; mcdc's own client is left as it is.
    """
    return pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000, retryWrites=False)


def _per_s(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _mb(size: float) -> float:
    return round(size / _MB, 1)


# -- the backlog ------------------------------------------------------------------------------------------


@dataclass
class Backlog:
    """The change events made on the source for phase 1, and the state they leave."""

    start: Timestamp  # the source's operation time read before the first write
    events: int
    mix: dict[str, int]  # events per operation type
    docs: int  # documents left in bench.events
    v_sum: int  # their sum of v (every event changes it)
    build_s: float


def _doc(_id: int, seq: int, rng: random.Random) -> dict[str, Any]:
    """One document of about 180 BSON bytes; ``v`` is the sequence number of the event that wrote it."""
    return {
        "_id": _id,
        "v": seq,
        "name": f"item-{_id:07d}",
        "qty": rng.randrange(1000),
        "price": round(rng.uniform(1, 500), 2),
        "tags": rng.sample(TAGS, 2),
        "pad": "x" * 64,
    }


def make_backlog(uri: str, events: int, seed: int = 0, *, drop: bool = True) -> Backlog:
    """Drop ``bench`` on the source (unless ``drop`` is False: the caller emptied it), read its operation
    time, then make exactly ``events`` change events."""
    rng = random.Random(seed)
    kinds, weights = list(OP_WEIGHTS), list(OP_WEIGHTS.values())
    with _writer(uri) as client:
        if drop:
            client.drop_database(DB)
        coll = client[DB][EVENTS]
        start: Timestamp = client.admin.command("ping")["operationTime"]
        started = time.perf_counter()
        state: dict[Any, int] = {}  # _id -> v, the expected final state
        live: list[int] = []  # ids present, for O(1) random picks and removals
        mix: Counter[str] = Counter()
        seq = next_id = 0
        body = events - 1  # the marker is the last event
        per_round = max(1, min(ROUND, body // 40))  # about 20 rounds at least: every kind, even in a small run
        while seq < body:
            docs = [_doc(next_id + k, seq + k, rng) for k in range(min(per_round, body - seq))]
            coll.insert_many(docs)
            for doc in docs:
                state[doc["_id"]] = doc["v"]
                live.append(doc["_id"])
            next_id += len(docs)
            seq += len(docs)
            mix["insert"] += len(docs)
            ops: list[UpdateOne | ReplaceOne[dict[str, Any]] | DeleteOne] = []
            round_mix: Counter[str] = Counter()
            for _ in range(min(per_round, body - seq)):
                kind = rng.choices(kinds, weights)[0]
                slot = rng.randrange(len(live))
                _id = live[slot]
                if kind == "delete":
                    live[slot] = live[-1]
                    live.pop()
                    del state[_id]
                    ops.append(DeleteOne({"_id": _id}))
                elif kind == "update":  # v always changes, so every update is one event
                    ops.append(UpdateOne({"_id": _id}, {"$set": {"v": seq, "qty": rng.randrange(1000)}}))
                    state[_id] = seq
                else:
                    ops.append(ReplaceOne({"_id": _id}, _doc(_id, seq, rng)))
                    state[_id] = seq
                round_mix[kind] += 1
                seq += 1
            if ops:
                result = coll.bulk_write(ops)
                if (result.modified_count, result.deleted_count) != (
                    round_mix["update"] + round_mix["replace"],
                    round_mix["delete"],
                ):
                    raise harness.BenchError(
                        f"the backlog's bulk_write did not change what it should: {result.bulk_api_result}"
                    )
                mix.update(round_mix)
        coll.insert_one({"_id": MARKER_ID, "v": seq})
        state[MARKER_ID] = seq
        mix["marker (insert)"] += 1
        build_s = time.perf_counter() - started
        backlog = Backlog(start, sum(mix.values()), dict(mix), len(state), sum(state.values()), round(build_s, 2))
        if _fingerprint(coll) != (backlog.docs, backlog.v_sum):
            raise harness.BenchError(f"the source's {DB}.{EVENTS} does not hold what the backlog wrote")
    return backlog


def _fingerprint(coll: Coll) -> tuple[int, int]:
    """(documents, sum of v): equal to the source's only once every event has been applied."""
    group = {"$group": {"_id": None, "n": {"$sum": 1}, "v": {"$sum": "$v"}}}
    rows = list(coll.aggregate([group]))
    return (int(rows[0]["n"]), int(rows[0]["v"])) if rows else (0, 0)


# -- comparing a target with the source ---------------------------------------------------------------------


@dataclass
class Diff:
    """How one target collection differs from the source's, document by document (raw BSON by _id)."""

    docs: int
    missing: int
    extra: int
    changed: int

    @property
    def identical(self) -> bool:
        return not (self.missing or self.extra or self.changed)

    def text(self) -> str:
        if self.identical:
            return f"identical ({self.docs:,} documents, byte for byte)"
        return f"{self.missing:,} missing, {self.extra:,} extra, {self.changed:,} changed of {self.docs:,}"


def _raw_docs(uri: str, coll: str) -> dict[bytes, bytes]:
    with connect(uri) as client:
        found = client.get_database(DB, codec_options=RAW)[coll].find()
        return {bson.encode({"_id": doc["_id"]}): bytes(cast(RawBSONDocument, doc).raw) for doc in found}


def compare(source: str, target: str, coll: str) -> Diff:
    want, got = _raw_docs(source, coll), _raw_docs(target, coll)
    changed = sum(1 for key in want.keys() & got.keys() if want[key] != got[key])
    return Diff(len(want), len(want.keys() - got.keys()), len(got.keys() - want.keys()), changed)


# -- the naive replay (the baseline) -----------------------------------------------------------------------


@dataclass
class Replay:
    """One replay of the backlog into the target."""

    kind: str  # "naive" | "mcdc"
    events: int
    wall_s: float
    events_per_s: float
    first_write_s: float | None = None  # mcdc: process start -> first document on the target
    steady_events_per_s: float | None = None  # mcdc: events / (finished - first write): start-up excluded
    peak_rss_mb: float | None = None
    exit_code: int | None = None  # mcdc: after SIGTERM (None: killed after STOP_TIMEOUT_S)
    stop_s: float | None = None
    diff: dict[str, Any] = field(default_factory=dict)


def naive_replay(source: str, target: str, backlog: Backlog, timeout: float) -> Replay:
    """The article's loop, in Python: every change applied on its own, one round trip each, in order."""
    seen = 0
    with connect(source) as src, _writer(target) as dst:
        started = time.perf_counter()
        deadline, report_at = started + timeout, started + 5.0
        stream = src.watch(
            full_document="updateLookup",
            start_at_operation_time=backlog.start,
            batch_size=NAIVE_BATCH,
            max_await_time_ms=500,
        )
        with stream:
            while True:
                change = stream.try_next()
                now = time.perf_counter()
                if now > deadline:
                    raise harness.BenchError(
                        f"the naive replay did not reach the marker in {timeout:.0f} s ({seen:,} events)"
                    )
                if now > report_at:
                    print(f"  {seen:>8,} / {backlog.events:,} events  ({_per_s(seen, now - started):,.0f}/s)")
                    report_at = now + 5.0
                if change is None:
                    continue
                op, ns = change["operationType"], change.get("ns", {})
                if op not in ("insert", "update", "replace", "delete"):
                    continue  # the article prints "Unknown type" and goes on
                seen += 1
                coll = dst[ns["db"]][ns["coll"]]
                if op == "delete":
                    coll.delete_one({"_id": change["documentKey"]["_id"]})
                    continue
                doc = change.get("fullDocument")
                if doc is None:  # deleted since the update: its delete event follows (as the article notes)
                    continue
                coll.replace_one({"_id": doc["_id"]}, doc, upsert=True)
                if doc["_id"] == MARKER_ID and ns == {"db": DB, "coll": EVENTS}:
                    break
        wall = time.perf_counter() - started
    return Replay("naive", seen, round(wall, 3), round(_per_s(backlog.events, wall)))


# -- mcdc tail -----------------------------------------------------------------------------------------------


def tail_argv(source: str, target: str, checkpoint: Path, *options: str) -> list[str]:
    """The mcdc tail command the benchmark runs (``options``: --start-at / --snapshot and --mcdc-arg's)."""
    return harness.mcdc(
        "tail",
        "--source", source,
        "--target", target,
        "--checkpoint", str(checkpoint),
        "--no-progress",
        *options,
    )  # fmt: skip


def check_tail_exists() -> None:
    """Fail early, before the long baseline, when this checkout has no ``mcdc tail``."""
    probe = subprocess.run(harness.mcdc("tail", "--help"), capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise harness.BenchError(
            f"`{harness.show(harness.mcdc('tail', '--help'))}` failed: no mcdc tail here?\n{probe.stderr[-1000:]}"
        )


class Tail:
    """One running ``mcdc tail``: output to files in ``logdir``, tree RSS sampled every 50 ms by a thread.

    As a context manager it makes sure the process is gone on the way out, whatever happened.
    """

    def __init__(self, argv: Sequence[str], logdir: Path, name: str) -> None:
        self.argv = list(argv)
        self.out_path, self.err_path = logdir / f"{name}.out", logdir / f"{name}.err"
        self.samples: list[tuple[float, int]] = []  # (perf_counter, tree RSS bytes)
        self.started = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop_sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name=f"rss-{name}", daemon=True)

    def __enter__(self) -> Tail:
        print(f"$ {harness.show(self.argv)}", flush=True)
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.started = time.perf_counter()
            self._proc = subprocess.Popen(self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self._sampler.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._stop_sampling.set()
        self._sampler.join()

    def _sample(self) -> None:
        assert self._proc is not None
        try:
            watched = psutil.Process(self._proc.pid)
        except psutil.Error:
            return
        while not self._stop_sampling.is_set():
            rss = harness.tree_rss(watched)
            if rss:
                self.samples.append((time.perf_counter(), rss))
            self._stop_sampling.wait(harness.SAMPLE_S)

    def stderr_tail(self, size: int = 3000) -> str:
        return self.err_path.read_text(errors="replace")[-size:]

    def check_alive(self) -> None:
        """Raise BenchError with its stderr when the process exited before it was asked to."""
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            raise harness.BenchError(f"mcdc tail exited {code} before it was stopped:\n{self.stderr_tail()}")

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM, then wait: (exit code or None when it had to be killed, seconds it took to exit)."""
        assert self._proc is not None
        self.check_alive()
        asked = time.perf_counter()
        self._proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self._proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            code = None
        stop_s = time.perf_counter() - asked
        self._stop_sampling.set()
        self._sampler.join()
        if code != 0:
            print(f"  mcdc tail exited {code} on SIGTERM; its stderr ends with:\n{self.stderr_tail(1500)}")
        return code, round(stop_s, 2)

    def peak_rss(self, since: float = 0.0, until: float = math.inf) -> int:
        return max((rss for at, rss in self.samples if since <= at <= until), default=0)

    def median_rss(self, since: float, until: float) -> int:
        window = [rss for at, rss in self.samples if since <= at <= until]
        return int(statistics.median(window)) if window else 0


@dataclass
class Looks:
    """What looks at the target saw of a replay (perf_counter seconds): its first document, the marker (the
    last event), and its finish: the marker's look when the state matched then, else the first look after
    it that matched."""

    first_write: float | None = None
    marker_seen: float | None = None
    finished: float | None = None
    looks: int = 0

    def look(
        self, now: float, *, any_document: Callable[[], bool], marker: Callable[[], bool], matches: Callable[[], bool]
    ) -> None:
        """One look at ``now``. A replay may land whole between the look for any document and the look for
        the marker: that look is then its first write as well."""
        if self.first_write is None and any_document():
            self.first_write = now
        if self.marker_seen is None and marker():
            self.marker_seen = now
            if self.first_write is None:
                self.first_write = now
        if self.marker_seen is not None:
            self.looks += 1
            if matches():
                self.finished = self.marker_seen if self.looks == 1 else now


def mcdc_replay(
    source: str, target: str, backlog: Backlog, workdir: Path, extra: Sequence[str], timeout: float
) -> Replay:
    """``mcdc tail --start-at T`` into the wiped target, timed from process start to the source's final state.

    The finish is the moment the marker was seen when the state matched at the first look after it (the
    marker is the last event), else the start of the first look that matched.
    """
    harness.reset_target(target)
    checkpoint = harness.fresh_checkpoint(workdir, "tail-backlog.json", ending="tail-*")
    start_at = f"{backlog.start.time},{backlog.start.inc}"
    argv = tail_argv(source, target, checkpoint, "--start-at", start_at, *extra)
    want = (backlog.docs, backlog.v_sum)
    with connect(target) as dst, Tail(argv, workdir, "tail-backlog") as tail:
        coll = dst[DB][EVENTS]
        seen = Looks()
        report_at = tail.started + 5.0
        while seen.finished is None:
            time.sleep(POLL_S)
            tail.check_alive()
            now = time.perf_counter()
            if now - tail.started > timeout:
                raise harness.BenchError(f"mcdc tail did not reach the source's final state in {timeout:.0f} s")
            if now > report_at:
                print(f"  {now - tail.started:5.1f} s: {coll.estimated_document_count():,} documents on the target")
                report_at = now + 5.0
            seen.look(
                now,
                any_document=lambda: coll.find_one({}, {"_id": 1}) is not None,
                marker=lambda: coll.find_one({"_id": MARKER_ID}, {"_id": 1}) is not None,
                matches=lambda: _fingerprint(coll) == want,
            )
        code, stop_s = tail.stop()
        peak = tail.peak_rss()
    first_write, finished = seen.first_write, seen.finished
    assert first_write is not None and finished is not None
    wall = finished - tail.started
    return Replay(
        "mcdc",
        backlog.events,
        round(wall, 3),
        round(_per_s(backlog.events, wall)),
        first_write_s=round(first_write - tail.started, 3),
        steady_events_per_s=round(_per_s(backlog.events, finished - first_write)),
        peak_rss_mb=_mb(peak),
        exit_code=code,
        stop_s=stop_s,
    )


# -- lag at a steady rate ------------------------------------------------------------------------------------


@dataclass
class Lag:
    """Phase 2 (lag at a fixed write rate) and phase 3 (the tail's RSS meanwhile)."""

    rate: float
    duration_s: float
    writes: int
    arrived: int
    unattributed: int  # target events without a seq (should be 0)
    write_s: float  # how long the writes took (rate x duration should match)
    max_slip_ms: float  # the writer's worst lateness against its schedule
    warmup_s: float  # tail start -> first warm-up document on the target
    p50_ms: float
    p99_ms: float
    max_ms: float
    rss_start_mb: float
    rss_end_mb: float
    rss_growth_mb: float
    peak_rss_mb: float
    exit_code: int | None
    stop_s: float


class _Arrivals(threading.Thread):
    """Reads the target collection's change stream; records the wall time each ``seq`` first arrives."""

    def __init__(self, coll: Coll) -> None:
        super().__init__(name="arrivals", daemon=True)
        self.seen: dict[int, float] = {}
        self.unattributed = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._stream = coll.watch(max_await_time_ms=100)  # opened now: nothing written after this is missed

    def run(self) -> None:
        try:
            with self._stream:
                while not self._halt.is_set():
                    change = self._stream.try_next()
                    arrived = time.time()
                    if change is None:
                        continue
                    # mcdc may apply a write as an insert, an update ($set) or a replace
                    doc = change.get("fullDocument") or change.get("updateDescription", {}).get("updatedFields", {})
                    seq = doc.get("seq")
                    if isinstance(seq, int):
                        self.seen.setdefault(seq, arrived)
                    else:
                        self.unattributed += 1
        except BaseException as exc:  # re-raised by the main thread
            self.error = exc

    def stop(self) -> None:
        self._halt.set()
        self.join()
        if self.error is not None:
            raise harness.BenchError(f"the change stream on the target failed: {self.error!r}")


def _wait_until_tailing(source: Client, target: Client, tail: Tail, checkpoint: Path) -> float:
    """Wait for the checkpoint file (the start position is fixed), then write ONE warm-up document on the source
    and wait until it shows on the target: the tail is streaming. One write, then quiet: a stream that only
    closes a batch when the source goes quiet still delivers it."""
    while not checkpoint.exists():
        tail.check_alive()
        if time.perf_counter() - tail.started > WARMUP_TIMEOUT_S:
            raise harness.BenchError(f"mcdc tail wrote no checkpoint within {WARMUP_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    source[DB][WARMUP].insert_one({"_id": 0, "at": time.time()})
    while target[DB][WARMUP].find_one({}, {"_id": 1}) is None:
        tail.check_alive()
        if time.perf_counter() - tail.started > WARMUP_TIMEOUT_S:
            raise harness.BenchError(f"the warm-up document did not reach the target within {WARMUP_TIMEOUT_S:.0f} s")
        time.sleep(0.02)
    return time.perf_counter() - tail.started


def _write_steadily(
    coll: Coll, rate: float, total: int, sent: dict[int, tuple[int, float]]
) -> tuple[float, float, float]:
    """``total`` writes at ``rate`` per second on an absolute schedule (no drift): half inserts, half ``$set``
    updates of documents inserted before, each carrying its ``seq`` and ``written_at``; ``sent`` gets
    seq -> (_id, written_at). Returns (start, end) perf_counter times and the worst lateness in seconds."""
    rng = random.Random(1)
    inserted: list[int] = []
    slip = 0.0
    started = time.perf_counter()
    for seq in range(total):
        delay = started + seq / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            slip = max(slip, -delay)
        written_at = time.time()
        if len(inserted) < 10 or rng.random() < 0.5:
            _id = seq
            coll.insert_one({"_id": _id, "seq": seq, "written_at": written_at, "pad": "x" * 100})
            inserted.append(_id)
        else:
            _id = rng.choice(inserted)
            coll.update_one({"_id": _id}, {"$set": {"seq": seq, "written_at": written_at}})
        sent[seq] = (_id, written_at)
    return started, time.perf_counter(), slip


def _arrivals_by_seq(sent: dict[int, tuple[int, float]], seen: dict[int, float]) -> dict[int, float]:
    """When each write reached the target. A write also counts as arrived when a later write to the same
    document did: mcdc may apply an update as the document looked up after it, which carries the later seq."""
    by_id: dict[int, list[int]] = {}
    for seq, (_id, _at) in sent.items():
        by_id.setdefault(_id, []).append(seq)
    arrived: dict[int, float] = {}
    for seqs in by_id.values():
        earliest = math.inf
        for seq in sorted(seqs, reverse=True):
            earliest = min(earliest, seen.get(seq, math.inf))
            if earliest < math.inf:
                arrived[seq] = earliest
    return arrived


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 for none)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def measure_lag(source: str, target: str, workdir: Path, rate: float, duration: float, extra: Sequence[str]) -> Lag:
    """``mcdc tail --snapshot never`` into a wiped target while one thread writes at a steady rate."""
    harness.reset_target(target)
    with connect(source) as src:
        src[DB][LAG].drop()
        src[DB][WARMUP].drop()
    checkpoint = harness.fresh_checkpoint(workdir, "tail-lag.json", ending="tail-*")
    argv = tail_argv(source, target, checkpoint, "--snapshot", "never", *extra)
    total = max(1, round(rate * duration))
    sent: dict[int, tuple[int, float]] = {}
    with _writer(source) as src, connect(target) as dst, Tail(argv, workdir, "tail-lag") as tail:
        warmup_s = _wait_until_tailing(src, dst, tail, checkpoint)
        print(f"  streaming: the first warm-up document reached the target {warmup_s:.2f} s after start")
        arrivals = _Arrivals(dst[DB][LAG])
        arrivals.start()
        try:
            print(f"  writing {total:,} times at {rate:g}/s ...", flush=True)
            began, ended, slip = _write_steadily(src[DB][LAG], rate, total, sent)
            drain_until = time.perf_counter() + DRAIN_TIMEOUT_S
            while time.perf_counter() < drain_until and arrivals.is_alive():
                if len(_arrivals_by_seq(sent, dict(arrivals.seen))) == total:
                    break
                tail.check_alive()
                time.sleep(POLL_S)
            code, stop_s = tail.stop()
        finally:
            arrivals.stop()
        window = min(RSS_WINDOW_S, (ended - began) / 4)
        rss_start = tail.median_rss(began, began + window)
        rss_end = tail.median_rss(ended - window, ended)
        peak = tail.peak_rss(began, ended)
    arrived = _arrivals_by_seq(sent, arrivals.seen)
    lags = sorted(arrived[seq] - at for seq, (_id, at) in sent.items() if seq in arrived)
    return Lag(
        rate=rate,
        duration_s=duration,
        writes=total,
        arrived=len(lags),
        unattributed=arrivals.unattributed,
        write_s=round(ended - began, 2),
        max_slip_ms=_ms(slip),
        warmup_s=round(warmup_s, 2),
        p50_ms=_ms(_percentile(lags, 0.50)),
        p99_ms=_ms(_percentile(lags, 0.99)),
        max_ms=_ms(lags[-1] if lags else 0.0),
        rss_start_mb=_mb(rss_start),
        rss_end_mb=_mb(rss_end),
        rss_growth_mb=_mb(rss_end - rss_start),
        peak_rss_mb=_mb(peak),
        exit_code=code,
        stop_s=stop_s,
    )


# -- report -------------------------------------------------------------------------------------------------


def figures(
    backlog: Backlog,
    naive: Replay,
    tool: Replay,
    lag: Lag,
    args: argparse.Namespace,
    server: str,
    commands: dict[str, str],
) -> dict[str, Any]:
    """Everything printed, as one JSON-able dict."""
    ratio = tool.events_per_s / naive.events_per_s if naive.events_per_s else 0.0
    steady = (tool.steady_events_per_s or 0) / naive.events_per_s if naive.events_per_s else 0.0
    exits = (tool.exit_code, lag.exit_code)
    return {
        "server": server,
        "note": "measured on " + server + ": ratios within one run are what count",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "mcdc_code": harness.code_version(),
        "backlog": {**asdict(backlog), "start": [backlog.start.time, backlog.start.inc]},
        "naive": asdict(naive),
        "mcdc": asdict(tool),
        "ratio": round(ratio, 2),
        "ratio_excluding_startup": round(steady, 2),
        "lag": asdict(lag),
        "targets": {
            f"events/s mcdc/naive >= {RATIO_TARGET:g}": ratio >= RATIO_TARGET,
            f"lag p99 < {P99_TARGET_S:g} s": lag.arrived > 0 and lag.p99_ms < P99_TARGET_S * 1000,
            f"RSS growth over the sustained phase < {RSS_GROWTH_TARGET_MB:g} MB": lag.rss_growth_mb
            < RSS_GROWTH_TARGET_MB,
            "naive target identical to the source": bool(naive.diff.get("identical")),
            "mcdc target identical to the source": bool(tool.diff.get("identical")),
            "mcdc tail exits 0 on SIGTERM": exits == (0, 0),
            "every lag-phase write arrived": lag.arrived == lag.writes,
        },
        "args": {"events": args.events, "rate": args.rate, "duration": args.duration, "mcdc_arg": args.mcdc_arg},
        "commands": commands,
    }


def print_report(data: dict[str, Any]) -> None:
    backlog, naive, tool, lag = data["backlog"], data["naive"], data["mcdc"], data["lag"]
    harness.heading(f"Results, measured on {data['server']}: ratios within one run are what count")
    print(f"{data['cpus']} CPUs, Python {data['python']}; mcdc code: {data['mcdc_code']}")
    mix = ", ".join(f"{count:,} {kind}" for kind, count in backlog["mix"].items())
    print(f"backlog: {backlog['events']:,} events on {DB}.{EVENTS} ({mix}); {backlog['docs']:,} documents left")
    print()
    print(f"{'replay of the backlog':<30}{'wall s':>9}{'events/s':>10}   notes")
    print(f"{'naive (article, pymongo)':<30}{naive['wall_s']:>9.2f}{naive['events_per_s']:>10,}   one write per event")
    print(
        f"{'mcdc tail --start-at':<30}{tool['wall_s']:>9.2f}{tool['events_per_s']:>10,}   from process start; first "
        f"write after {tool['first_write_s']:.2f} s, {tool['steady_events_per_s']:,} events/s from there"
    )
    print("(mcdc writes with w:majority, j:true unless the target URI sets a write concern; the naive loop w:1)")
    print(
        f"ratio mcdc/naive  {data['ratio']:>8.2f}   ({data['ratio_excluding_startup']:.2f} excluding mcdc's start-up)"
    )
    print(f"naive target: {naive['diff']['text']}")
    print(f"mcdc target:  {tool['diff']['text']}")
    print(f"mcdc tail on SIGTERM: exit {tool['exit_code']} after {tool['stop_s']:.2f} s", end="; ")
    print(f"peak RSS {tool['peak_rss_mb']} MB")
    print()
    print(
        f"lag at {lag['rate']:g} writes/s for {lag['duration_s']:g} s: {lag['arrived']:,} of {lag['writes']:,} "
        f"writes arrived (writes took {lag['write_s']:.2f} s, worst slip {lag['max_slip_ms']} ms)"
    )
    print(f"lag p50  {lag['p50_ms']:>9.1f} ms")
    print(f"lag p99  {lag['p99_ms']:>9.1f} ms")
    print(f"lag max  {lag['max_ms']:>9.1f} ms")
    print(
        f"tail RSS during the writes: peak {lag['peak_rss_mb']} MB; first second {lag['rss_start_mb']} MB, "
        f"last second {lag['rss_end_mb']} MB: growth {lag['rss_growth_mb']:+.1f} MB"
    )
    print(f"mcdc tail on SIGTERM: exit {lag['exit_code']} after {lag['stop_s']:.2f} s")
    print()
    harness.print_verdicts(data["targets"], data["commands"])


# -- main ---------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    check_tail_exists()
    with harness.bench_setup("bench_tail", args, "mcdc-bench-tail-") as (workdir, source, target, server):
        harness.heading(f"Phase 1: a backlog of {args.events:,} change events on {DB}.{EVENTS}")
        backlog = make_backlog(source, args.events)
        start = f"{backlog.start.time},{backlog.start.inc}"
        print(f"made in {backlog.build_s:.1f} s after the source's operation time {start}: {backlog.mix}")

        harness.heading("Phase 1a: naive replay (watch + one replace_one/delete_one per event, as in the article)")
        harness.reset_target(target)
        naive = naive_replay(source, target, backlog, timeout=max(600.0, args.events / 10))
        diff = compare(source, target, EVENTS)
        naive.diff = {**asdict(diff), "identical": diff.identical, "text": diff.text()}
        print(f"{naive.wall_s:.2f} s, {naive.events_per_s:,} events/s; target {diff.text()}")

        harness.heading("Phase 1b: mcdc tail --start-at the same operation time, fresh checkpoint, wiped target")
        tool = mcdc_replay(source, target, backlog, workdir, args.mcdc_arg, timeout=max(120.0, 3 * naive.wall_s))
        diff = compare(source, target, EVENTS)
        tool.diff = {**asdict(diff), "identical": diff.identical, "text": diff.text()}
        print(f"{tool.wall_s:.2f} s, {tool.events_per_s:,} events/s; target {diff.text()}; exit {tool.exit_code}")

        harness.heading(
            f"Phase 2+3: lag and RSS at {args.rate:g} writes/s for {args.duration:g} s (mcdc tail --snapshot never)"
        )
        lag = measure_lag(source, target, workdir, args.rate, args.duration, args.mcdc_arg)
        print(f"p50 {lag.p50_ms} ms, p99 {lag.p99_ms} ms, max {lag.max_ms} ms; RSS growth {lag.rss_growth_mb:+.1f} MB")

        commands = {
            "bench": harness.show([sys.executable, *sys.argv]),
            "naive": f"in-process pymongo: watch(full_document='updateLookup', start_at_operation_time=T, "
            f"batch_size={NAIVE_BATCH}) -> replace_one(upsert=True) / delete_one per event, w:1, retryWrites=false",
            "mcdc (backlog)": harness.show(
                tail_argv(source, target, workdir / "tail-backlog.json", "--start-at", "T,I")
            ),
            "mcdc (lag)": harness.show(tail_argv(source, target, workdir / "tail-lag.json", "--snapshot", "never")),
        }
        return figures(backlog, naive, tool, lag, args, server, commands)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(parser, events=(30_000, "change events in the backlog"))
    parser.add_argument("--rate", type=float, default=200.0, help="writes per second in the lag phase (default 200)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of writes in the lag phase (default 20)")
    harness.add_server_options(
        parser, "one more argument for both mcdc tail runs (repeatable), e.g. --mcdc-arg=--verbose"
    )
    parser.error_if(
        lambda a: a.events < 2 or a.rate <= 0 or a.duration <= 0,
        "--events must be at least 2, --rate and --duration positive",
    )
    return harness.main("bench_tail", parser, argv, bench, print_report)


if __name__ == "__main__":
    sys.exit(main())
