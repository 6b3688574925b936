"""Benchmark: the embedded verifier of ``mcdc tail --verify`` against ``mcdc verify`` and a plain two-cursor
comparison, and what it costs the replay beside it; on the same two servers, in one run.

    python scripts/bench_verify.py [--docs 500000] [--doc-size 200] [--events 20000] [--json]
    python scripts/bench_verify.py --source mongodb://... --target mongodb://...

1. Loads ``bench.docs`` (``--docs`` documents of about ``--doc-size`` bytes; an earlier matching load is
   reused, as scripts/bench_sync.py does) and scans it once; ``mcdc sync --include 'bench\\.docs'`` copies it
   into the wiped target with a fresh checkpoint (timed, for information). A copy of that checkpoint is put
   aside: every later tail starts from a fresh copy of it, at the position the sync ended at.
2. Two cursors: pymongo ``find().sort("_id")`` on the source and on the target (RawBSONDocument), merged,
   each pair compared byte for byte (``_id``s read only where the bytes differ), in this process. docs/s
   from connecting to the last document.
3. ``mcdc verify --include 'bench\\.docs' --json`` as a subprocess (its default --workers: ranges compared
   at once): docs/s by wall time (process start included) and by its own ``elapsed_s``.
4. The embedded verifier: ``mcdc tail --verify --verify-interval 0 --metrics-port P --include 'bench\\.docs'``
   from a copy of the checkpoint (nothing to replay). ``GET /progress`` is polled every 50 ms; the pass time
   runs from the first answer to the first with ``verification.passes`` 1, and docs/s is the documents it
   compared in between (``scannedDocuments`` less ``currentPass.scannedDocuments``, less what the first
   answer showed) over that time; by wall time, from process start. The peak RSS of the tail's process
   tree (sampled every 50 ms, start to stop) is the memory figure. Stopped with SIGTERM.
5. Replay slowdown. With no tail running, ``--events`` change events are made on ``bench.docs``: ``$inc`` of
   the field ``v``, one UpdateOne by ``_id`` per event (bulk_write, 1,000 a call), over runs of 100
   consecutive ``_id``s from random places, one run in ten a single random document (every event adds 1
   to one document's ``v``, so count and sum of ``v`` tell the final state). Not update_many over an ``_id``
   range: SecantusDB reads a range by a collection scan, about 8 s a call at 500,000 documents. Then four
   tails of that backlog, each from a fresh copy of the checkpoint put aside in step 1 (its position is
   before the backlog), into the same target, each stopped with SIGTERM once ``/progress``'s
   ``totalEventsApplied`` reaches the backlog:

   a. warm-up, without --verify (not compared: the first read of the backlog's oplog entries);
   b. without --verify;
   c. with ``--verify --verify-interval 0``: a pass of the whole collection begins with the tail, so the
      verifier sweeps throughout the replay, and what it finds the replay has not caught up with yet goes
      onto its re-check list: the work of a tail --verify catching up. Once all events are applied, the
      tail runs on (untimed) until the pass under way and the next one (begun on the caught-up target)
      are done; /progress's mismatches must then be 0;
   d. without --verify again: b and d bracket c, so a drift of the machine's speed (other processes on
      shared CPUs) shows as a difference between them instead of hiding in the ratio.

   Before each, the target is put back as the sync left it: ``$unset`` of ``v`` where it is set (the
   backlog only added ``v``, so the documents' bytes are the sync's again; checked by count and sum of
   ``v``). So every run replays the same events from the same position into the same target state; each
   update is written as the document the change stream looked up (updateLookup), the source's final
   version, so a document reaches its final state at its first event. events/s: the events applied between
   the first poll that shows any and the poll that shows all of them, over the time in between (process
   start-up excluded); also by wall time from process start. After each run the target's count and sum of
   ``v`` are checked against the source's. slowdown = 1 - c / mean(b, d).

Prints two tables, the ratios (embedded docs/s against mcdc verify and against the two cursors, replay
events/s with and without --verify), and PASS/FAIL for the goals (tail --verify peak RSS < 300 MB, replay
slowdown < 20%, no mismatch reported by step 4's pass nor after the replay in c); exits 0 whatever they
say: it is a measurement. Exits 1 only when a step fails: a command exits non-zero or dies, a target is
not identical to the source where it must be, a pass or a replay does not finish in time.

Without ``--source/--target`` it starts two local SecantusDB servers (a Python MongoDB-compatible server,
several times slower than mongod) in a temporary directory: figures are for that server, not for MongoDB;
the ratios within one run are what count. With them, only the ``bench`` database is touched (dropped on
the target; on the source, reloaded if its ``bench.meta`` marker does not match, else an earlier run's
backlog is taken out before the sync, and the backlog written).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import harness
import orjson
from bench_sync import mcdc_argv, run_mcdc
from bench_tail import Tail, _fingerprint, _writer, tail_argv
from bson.raw_bson import RawBSONDocument
from pymongo import UpdateOne

from tests.support.compare import RAW
from tests.support.servers import connect, free_port

DB, COLL, INCLUDE = harness.DB, harness.COLL, harness.INCLUDE  # the shared bench collection
RSS_TARGET_MB = 300.0
SLOWDOWN_TARGET = 0.20
RUN_IDS = 100  # consecutive _ids updated in a run of the backlog
ONE_IN = 10  # one run in this many is a single random document
BULK = 1_000  # backlog updates per bulk_write
#: the tails of step 5, in order (see the docstring)
WARM_UP, NO_VERIFY, WITH_VERIFY, NO_VERIFY_AGAIN = "warm-up", "no verify", "verify", "no verify again"
REPLAYS = (WARM_UP, NO_VERIFY, WITH_VERIFY, NO_VERIFY_AGAIN)
#: the embedded verifier's options: one pass after another, with no pause
VERIFY = ("--verify", "--verify-interval", "0")
POLL_S = 0.05  # /progress polling period
REPORT_S = 5.0
SHOWN_PASS_LINES = 4
_MB = 1024 * 1024

Progress = dict[str, Any]


def _per_s(count: float, seconds: float) -> float:
    return round(count / seconds) if seconds > 0 else 0.0


def _mb(size: float) -> float:
    return round(size / _MB, 1)


def _ratio(a: float | None, b: float | None) -> float:
    return round(a / b, 3) if a and b else 0.0


# -- comparisons of the whole collection ----------------------------------------------------------------------


@dataclass
class Scan:
    """One full comparison of bench.docs with the target's."""

    kind: str
    docs: int
    wall_s: float  # from start (for a subprocess: process start)
    docs_per_s: float
    own_s: float | None = None  # mcdc verify: its elapsed_s; tail --verify: the pass as /progress showed it
    own_docs_per_s: float | None = None
    peak_rss_mb: float | None = None
    differences: int = 0
    note: str = ""


def two_cursors(source: str, target: str) -> Scan:
    """The comparison a person would write first: both collections in _id order, merged, byte for byte."""
    started = time.perf_counter()
    compared = missing = extra = changed = 0
    with connect(source) as src, connect(target) as dst:
        ours = iter(src.get_database(DB, codec_options=RAW)[COLL].find({}, sort=[("_id", 1)]))
        theirs = iter(dst.get_database(DB, codec_options=RAW)[COLL].find({}, sort=[("_id", 1)]))
        a, b = next(ours, None), next(theirs, None)
        while a is not None or b is not None:
            if a is not None and b is not None and cast(RawBSONDocument, a).raw == cast(RawBSONDocument, b).raw:
                compared += 1
                a, b = next(ours, None), next(theirs, None)
                continue
            # the bytes differ: the _ids say which side is behind (bench.docs has int _ids only)
            if b is None or (a is not None and a["_id"] < b["_id"]):
                missing += 1
                compared += 1
                a = next(ours, None)
            elif a is None or b["_id"] < a["_id"]:
                extra += 1
                b = next(theirs, None)
            else:
                changed += 1
                compared += 1
                a, b = next(ours, None), next(theirs, None)
    wall = time.perf_counter() - started
    note = f"{missing:,} missing, {extra:,} extra, {changed:,} changed" if missing + extra + changed else ""
    return Scan(
        "two cursors",
        compared,
        round(wall, 3),
        _per_s(compared, wall),
        differences=missing + extra + changed,
        note=note,
    )


def mcdc_verify(source: str, target: str, docs: int, logdir: Path, extra: Sequence[str]) -> tuple[Scan, list[str]]:
    """``mcdc verify --json`` of bench.docs; exit 1 (differences) fails the step: the target must be identical."""
    argv = harness.mcdc("verify", "--source", source, "--target", target, "--include", INCLUDE, "--json", *extra)
    done = harness.run_measured(argv, "verify", logdir)
    report = orjson.loads(done.stdout)
    compared, elapsed = int(report["documents"]), float(report["elapsed_s"])
    if compared != docs:
        raise harness.BenchError(f"mcdc verify compared {compared:,} documents, not {docs:,}")
    scan = Scan(
        "mcdc verify",
        compared,
        round(done.wall_s, 3),
        _per_s(compared, done.wall_s),
        own_s=elapsed,
        own_docs_per_s=_per_s(compared, elapsed),
        peak_rss_mb=_mb(done.peak_rss),
    )
    return scan, argv


# -- mcdc tail and its /progress ------------------------------------------------------------------------------


def _progress(port: int) -> Progress | None:
    """The tail's ``GET /progress`` document, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=10) as reply:
            return cast(Progress, json.loads(reply.read())["progress"])
    except OSError:
        return None


def _watch(
    tail: Tail, port: int, done: Callable[[Progress], bool], timeout: float, say: Callable[[Progress], str]
) -> list[tuple[float, Progress]]:
    """Poll /progress every POLL_S until ``done``: every answer, with the perf_counter time of its request."""
    answers: list[tuple[float, Progress]] = []
    report_at = tail.started + REPORT_S
    while True:
        asked = time.perf_counter()
        progress = _progress(port)
        if progress is not None:
            answers.append((asked, progress))
            if done(progress):
                return answers
        tail.check_alive()
        if asked - tail.started > timeout:
            last = say(answers[-1][1]) if answers else "no answer from /progress"
            raise harness.BenchError(f"mcdc tail did not get there in {timeout:.0f} s: {last}")
        if asked > report_at and answers:
            print(f"  {asked - tail.started:6.1f} s: {say(answers[-1][1])}", flush=True)
            report_at = asked + REPORT_S
        time.sleep(POLL_S)


def _completed(v: Progress) -> int:
    """Documents compared by completed passes (scannedDocuments counts the pass under way too)."""
    return int(v["scannedDocuments"]) - int(v["currentPass"]["scannedDocuments"])


def _pass_lines(err_path: Path) -> list[str]:
    """The verifier's own log lines about its passes (their durations and counts)."""
    return re.findall(r"verify: pass \d+ done in .*", err_path.read_text(errors="replace"))


def _pass_budget(docs: int) -> float:
    """Seconds one pass may take before the benchmark gives up (a generous 100 documents/s)."""
    return max(600.0, docs / 100)


def _verification_text(v: dict[str, Any]) -> str:
    return (
        f"pass {v['passes'] + 1}, {v['currentPass']['scannedDocuments']:,} documents compared in it, "
        f"{v['rechecking']:,} re-checking, {v['mismatches']:,} mismatches, {v['cleanPasses']} clean passes "
        f"({v['phase']})"
    )


def _verifier_says(p: Progress) -> str:
    return _verification_text(p["verification"])


def embedded_pass(
    source: str, target: str, base: Path, docs: int, workdir: Path, extra: Sequence[str]
) -> tuple[Scan, dict[str, Any], list[str]]:
    """``mcdc tail --verify`` on the synced checkpoint: its first pass timed from /progress, its peak RSS."""
    checkpoint = harness.fresh_checkpoint(workdir, "tail-verify-pass.json")
    shutil.copyfile(base, checkpoint)
    port = free_port()
    argv = tail_argv(source, target, checkpoint, "--include", INCLUDE, "--metrics-port", str(port), *VERIFY, *extra)
    with Tail(argv, workdir, "tail-verify-pass") as tail:
        answers = _watch(tail, port, lambda p: p["verification"]["passes"] >= 1, _pass_budget(docs), _verifier_says)
        code, stop_s = tail.stop()
        peak = tail.peak_rss()
    (first_at, first), (end_at, end) = answers[0], answers[-1]
    v = end["verification"]
    compared = _completed(v)
    if compared != docs:
        raise harness.BenchError(f"the embedded verifier's first pass compared {compared:,} documents, not {docs:,}")
    own = end_at - first_at
    counted = compared - int(first["verification"]["scannedDocuments"])  # what the first answer showed done
    wall = end_at - tail.started
    note = next(iter(_pass_lines(tail.err_path)), "")
    scan = Scan(
        "mcdc tail --verify",
        compared,
        round(wall, 3),
        _per_s(compared, wall),
        own_s=round(own, 3),
        own_docs_per_s=_per_s(counted, own),
        peak_rss_mb=_mb(peak),
        differences=int(v["mismatches"]),
        note=note,
    )
    state = {
        "verification": v,
        "first_answer_s": round(first_at - tail.started, 3),
        "exit_code": code,
        "stop_s": stop_s,
    }
    return scan, state, argv


# -- the replay, with and without the verifier ------------------------------------------------------------------


@dataclass
class Backlog:
    """The change events made on bench.docs for step 5."""

    events: int
    runs: int  # runs of RUN_IDS consecutive _ids (or fewer, at the end)
    singles: int  # single random documents
    docs: int
    v_sum: int
    build_s: float


def make_backlog(uri: str, docs: int, events: int, seed: int = 0) -> Backlog:
    """``events`` $inc updates of existing documents' ``v``; the source's count and sum of ``v`` checked."""
    rng = random.Random(seed)
    ids: list[int] = []
    runs = singles = 0
    while len(ids) < events:
        if rng.randrange(ONE_IN) == 0:
            ids.append(rng.randrange(docs))
            singles += 1
            continue
        size = min(RUN_IDS, docs, events - len(ids))
        first = rng.randrange(docs - size + 1)
        ids.extend(range(first, first + size))
        runs += 1
    with _writer(uri) as client:  # without retryable writes, as bench_tail's backlog (see _writer)
        coll = client[DB][COLL]
        started = time.perf_counter()
        for at in range(0, events, BULK):
            chunk = [UpdateOne({"_id": _id}, {"$inc": {"v": 1}}) for _id in ids[at : at + BULK]]
            if coll.bulk_write(chunk).modified_count != len(chunk):
                raise harness.BenchError(f"a backlog bulk_write did not update each of its {len(chunk)} documents")
        build_s = time.perf_counter() - started
        backlog = Backlog(events, runs, singles, docs, events, round(build_s, 2))
        found = _fingerprint(coll)
        if found != (docs, events):
            raise harness.BenchError(
                f"the source's {DB}.{COLL} holds (documents, sum of v) {found}, not {(docs, events)}"
            )
    return backlog


@dataclass
class Replay:
    """One tail of the backlog from a copy of the synced checkpoint."""

    kind: str  # one of REPLAYS
    events: int  # totalEventsApplied at the end
    wall_s: float  # process start -> all applied
    wall_events_per_s: float
    first_s: float  # process start -> the first poll showing events applied
    steady_s: float  # that poll -> the one showing all
    events_per_s: float  # events applied between the two / steady_s
    peak_rss_mb: float
    exit_code: int | None
    stop_s: float
    verifier: Settling | None = None  # --verify: the verifier, then and after


@dataclass
class Settling:
    """The --verify replay's verifier: when all events were applied, and after (the tail runs on, untimed,
    until the pass under way then and the next one are done). Times are from all applied."""

    at_end: dict[str, Any]  # /progress's verification block when all were applied
    peak_rechecking: int  # the most differences waiting to be re-checked at once, over the whole run
    peak_mismatches: int  # the most mismatches /progress showed at once, over the whole run
    drained_s: float | None  # the first answer with nothing waiting to be re-checked
    pass_done_s: float  # the pass under way completed (its re-checks too)
    pass_done: dict[str, Any]
    next_pass_s: float  # the next pass, begun on the caught-up target, completed
    next_pass: dict[str, Any]  # its mismatches: what the last two passes confirmed
    pass_lines: list[str] = field(default_factory=list)  # the verifier's log lines about its passes


def _settle(tail: Tail, port: int, answers: list[tuple[float, Progress]], budget: float) -> Settling:
    """Follow the verifier after the replay: until the pass under way and the next one are done."""
    end_at, end = answers[-1]
    begun = int(end["verification"]["passes"])
    print("  all applied; the tail runs on (untimed) until the pass under way and the next are done", flush=True)
    later = _watch(
        tail, port, lambda p: p["verification"]["passes"] >= begun + 2, end_at - tail.started + budget, _verifier_says
    )
    every = [p["verification"] for _, p in answers + later]
    drained = next((at - end_at for at, p in later if p["verification"]["rechecking"] == 0), None)
    done_at, done = next((at, p) for at, p in later if p["verification"]["passes"] > begun)
    next_at, last = later[-1]
    return Settling(
        end["verification"],
        max(v["rechecking"] for v in every),
        max(v["mismatches"] for v in every),
        None if drained is None else round(drained, 3),
        round(done_at - end_at, 3),
        done["verification"],
        round(next_at - end_at, 3),
        last["verification"],
    )


def _applied(p: Progress) -> int:
    return int(p.get("totalEventsApplied") or 0)


def without_backlog(uri: str, docs: int) -> int:
    """Take the backlog out of a server's bench.docs (``v`` unset where it is): the documents as loaded
    and synced. Returns how many were changed."""
    with connect(uri) as client:
        coll = client[DB][COLL]
        changed = coll.update_many({"v": {"$exists": True}}, {"$unset": {"v": ""}}).modified_count
        found = _fingerprint(coll)
    if found != (docs, 0):
        raise harness.BenchError(
            f"{DB}.{COLL} without the backlog holds (documents, sum of v) {found}, not {(docs, 0)}"
        )
    return changed


def replay(
    source: str, target: str, base: Path, backlog: Backlog, kind: str, workdir: Path, extra: Sequence[str]
) -> tuple[Replay, list[str]]:
    """Tail the backlog from a fresh copy of ``base`` (``kind`` WITH_VERIFY: with the verifier, followed
    after the replay by :func:`_settle`), timed by /progress; then the target's count and sum of v are checked."""
    name = f"tail-replay-{kind.replace(' ', '-')}"
    checkpoint = harness.fresh_checkpoint(workdir, f"{name}.json")
    shutil.copyfile(base, checkpoint)
    port = free_port()
    verify = VERIFY if kind == WITH_VERIFY else ()
    argv = tail_argv(source, target, checkpoint, "--include", INCLUDE, "--metrics-port", str(port), *verify, *extra)
    with Tail(argv, workdir, name) as tail:
        answers = _watch(
            tail,
            port,
            lambda p: _applied(p) >= backlog.events,
            max(300.0, backlog.events / 20),
            lambda p: f"{_applied(p):,} / {backlog.events:,} events applied",
        )
        after = _settle(tail, port, answers, 2 * _pass_budget(backlog.docs)) if verify else None
        code, stop_s = tail.stop()
        peak = tail.peak_rss()
    end_at, end = answers[-1]
    first_at, first = next((at, p) for at, p in answers if _applied(p) > 0)
    steady = end_at - first_at
    wall = end_at - tail.started
    run = Replay(
        kind,
        _applied(end),
        round(wall, 3),
        _per_s(_applied(end), wall),
        round(first_at - tail.started, 3),
        round(steady, 3),
        _per_s(_applied(end) - _applied(first), steady),
        _mb(peak),
        code,
        stop_s,
        after,
    )
    if after is not None:
        after.pass_lines = _pass_lines(tail.err_path)
    with connect(target) as client:
        found = _fingerprint(client[DB][COLL])
    if found != (backlog.docs, backlog.v_sum):
        raise harness.BenchError(
            f"after the {kind} replay the target holds (documents, sum of v) {found}, "
            f"not {(backlog.docs, backlog.v_sum)}"
        )
    return run, argv


# -- report -----------------------------------------------------------------------------------------------------


def figures(
    sync: dict[str, Any],
    scans: list[Scan],
    embedded: dict[str, Any],
    backlog: Backlog,
    replays: list[Replay],
    args: argparse.Namespace,
    server: str,
    commands: dict[str, str],
) -> dict[str, Any]:
    """Everything printed, as one JSON-able dict."""
    cursors, verify, tail = scans
    plain = [r for r in replays if r.kind in (NO_VERIFY, NO_VERIFY_AGAIN)]
    checked = next(r for r in replays if r.kind == WITH_VERIFY)
    baseline = statistics.mean(r.events_per_s for r in plain)
    ratio = _ratio(checked.events_per_s, baseline)
    ratio_wall = _ratio(checked.wall_events_per_s, statistics.mean(r.wall_events_per_s for r in plain))
    after = checked.verifier
    mismatches = tail.differences + (int(after.next_pass["mismatches"]) if after is not None else 0)
    return {
        "server": server,
        "note": "measured on " + server + ": ratios within one run are what count",
        "docs": args.docs,
        "doc_size": args.doc_size,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "mcdc_code": harness.code_version(),
        "sync": sync,
        "scans": [asdict(s) for s in scans],
        "embedded": embedded,
        "backlog": asdict(backlog),
        "replays": [asdict(r) for r in replays],
        "ratio_embedded_verify": _ratio(tail.own_docs_per_s, verify.own_docs_per_s),
        "ratio_embedded_verify_wall": _ratio(tail.docs_per_s, verify.docs_per_s),
        "ratio_embedded_cursors": _ratio(tail.own_docs_per_s, cursors.docs_per_s),
        "ratio_replay_verify": ratio,
        "replay_slowdown": round(1 - ratio, 3),
        "replay_no_verify_spread": _ratio(
            max(r.events_per_s for r in plain) - min(r.events_per_s for r in plain), baseline
        ),
        "ratio_replay_verify_wall": ratio_wall,
        "replay_slowdown_wall": round(1 - ratio_wall, 3),
        "tail_verify_peak_rss_mb": tail.peak_rss_mb,
        "targets": {
            f"tail --verify peak RSS < {RSS_TARGET_MB:.0f} MB": (tail.peak_rss_mb or 0.0) < RSS_TARGET_MB,
            f"replay slowdown with --verify < {SLOWDOWN_TARGET:.0%}": 1 - ratio < SLOWDOWN_TARGET,
            "the embedded verifier reported no mismatch (its pass of step 4, and after the replay with it)": (
                mismatches == 0
            ),
        },
        "args": {"events": args.events, "mcdc_arg": args.mcdc_arg},
        "commands": commands,
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_settling(after: dict[str, Any]) -> None:
    drained = "never" if after["drained_s"] is None else f"{after['drained_s']:.2f} s later"
    print(f"    its verifier when all were applied: {_verification_text(after['at_end'])}")
    print(f"    nothing waited to be re-checked {drained}; at most {after['peak_rechecking']:,} waited at once, and")
    print(f"    /progress showed at most {after['peak_mismatches']:,} mismatches")
    print(
        f"    {after['pass_done_s']:.2f} s later the pass under way was done: {_verification_text(after['pass_done'])}"
    )
    print(f"    {after['next_pass_s']:.2f} s later the next one too: {_verification_text(after['next_pass'])}")
    lines = after["pass_lines"]
    for line in lines[:SHOWN_PASS_LINES]:
        print(f"    | {line}")
    if len(lines) > SHOWN_PASS_LINES:
        print(f"    | ... and {len(lines) - SHOWN_PASS_LINES} more passes (all in the JSON)")


def print_report(data: dict[str, Any]) -> None:
    backlog = data["backlog"]
    harness.heading(f"Results: {data['docs']:,} documents of ~{data['doc_size']} bytes, measured on {data['server']}")
    print(f"{data['cpus']} CPUs, Python {data['python']}; mcdc code: {data['mcdc_code']}")
    sync = data["sync"]
    print(
        f"mcdc sync (setup): {sync['wall_s']:.2f} s wall, {sync['docs_per_s']:,} docs/s, "
        f"peak RSS {sync['peak_rss_mb']} MB"
    )
    print()
    print(
        f"{'comparison of ' + DB + '.' + COLL:<22}{'docs':>10}{'wall s':>9}{'docs/s':>9}{'own s':>9}{'docs/s':>9}"
        f"{'peak RSS MB':>13}"
    )
    for s in data["scans"]:
        print(
            f"{s['kind']:<22}{s['docs']:>10,}{s['wall_s']:>9.2f}{s['docs_per_s']:>9,}{_num(s['own_s'], '.2f'):>9}"
            f"{_num(s['own_docs_per_s'], ','):>9}{_num(s['peak_rss_mb'], '.1f'):>13}"
        )
    print("(wall: from start, process start-up included; own: mcdc verify's elapsed_s, and for tail --verify its")
    print(" first pass from the first /progress answer to passes = 1; mcdc verify compares --workers ranges at once,")
    print(" the embedded verifier one)")
    for s in data["scans"]:
        if s["note"]:
            print(f"{s['kind']}: {s['note']}")
    print()
    print(
        f"backlog: {backlog['events']:,} $inc events on {DB}.{COLL} (UpdateOne by _id: {backlog['runs']:,} runs of "
        f"up to {RUN_IDS} consecutive _ids, {backlog['singles']:,} single documents), "
        f"made in {backlog['build_s']:.1f} s"
    )
    print(
        f"{'replay (mcdc tail)':<22}{'events':>8}{'wall s':>9}{'ev/s':>8}{'first s':>9}{'steady s':>10}{'ev/s':>8}"
        f"{'peak RSS MB':>13}{'exit':>6}"
    )
    for r in data["replays"]:
        print(
            f"{r['kind']:<22}{r['events']:>8,}{r['wall_s']:>9.2f}{r['wall_events_per_s']:>8,}{r['first_s']:>9.2f}"
            f"{r['steady_s']:>10.2f}{r['events_per_s']:>8,}{r['peak_rss_mb']:>13.1f}{_num(r['exit_code'], 'd'):>6}"
        )
        if r["verifier"] is not None:
            _print_settling(r["verifier"])
    print("(first: process start to the first events applied; steady: from there to all applied, the events/s")
    print(" the slowdown is measured on, against the mean of the two runs without --verify; warm-up: applies the")
    print(" backlog, not compared; before each run the target was put back as the sync left it)")
    print()
    print(
        f"embedded/mcdc verify docs/s    {data['ratio_embedded_verify']:>6.2f}   "
        f"({data['ratio_embedded_verify_wall']:.2f} by wall time, start-up included)"
    )
    print(f"embedded/two cursors docs/s    {data['ratio_embedded_cursors']:>6.2f}")
    print(f"tail --verify peak RSS         {data['tail_verify_peak_rss_mb']:>6.1f} MB")
    print(
        f"replay verify/no-verify ev/s   {data['ratio_replay_verify']:>6.2f}   slowdown {data['replay_slowdown']:.1%}"
        f"   (by wall time: {data['ratio_replay_verify_wall']:.2f}, {data['replay_slowdown_wall']:.1%})"
    )
    print(f"no-verify runs apart by        {data['replay_no_verify_spread']:>6.1%}   (of their mean: the noise)")
    embedded = data["embedded"]
    exits = [embedded["exit_code"]] + [r["exit_code"] for r in data["replays"]]
    if any(code != 0 for code in exits):
        print(f"note: mcdc tail exit codes on SIGTERM: {exits} (0 expected)")
    harness.print_verdicts(data["targets"], data["commands"])


# -- main -------------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    setup = harness.bench_setup("bench_verify", args, "mcdc-bench-verify-", load=True)
    with setup as (workdir, source, target, server):
        commands = {"bench": harness.show([sys.executable, *sys.argv])}
        if args.source:  # a load reused from an earlier run holds that run's backlog
            print(f"an earlier backlog taken out of the source: {without_backlog(source, args.docs):,} documents")

        harness.heading("Step 1: mcdc sync into the wiped target (the checkpoint every tail starts from)")
        harness.reset_target(target)
        synced = harness.fresh_checkpoint(workdir, "sync.json")
        argv = mcdc_argv(source, target, synced, 4, args.mcdc_arg)
        run = run_mcdc(argv, args.docs, 1, workdir)
        harness.check_target(target, args.docs, "mcdc sync")
        base = harness.fresh_checkpoint(workdir, "base.json")
        shutil.copyfile(synced, base)
        commands["sync"] = harness.show(argv)
        sync = {"wall_s": run.wall_s, "docs_per_s": run.docs_per_s, "peak_rss_mb": run.peak_rss_mb}
        print(f"{run.wall_s:.2f} s, {run.docs_per_s:,} docs/s")

        harness.heading("Step 2: two pymongo cursors (raw BSON, sorted by _id), merged and compared byte for byte")
        cursors = two_cursors(source, target)
        if cursors.differences or cursors.docs != args.docs:
            raise harness.BenchError(
                f"the two cursors compared {cursors.docs:,} documents after mcdc sync: {cursors.note}"
            )
        print(f"{cursors.wall_s:.2f} s, {cursors.docs_per_s:,} docs/s")

        harness.heading("Step 3: mcdc verify")
        verify, argv = mcdc_verify(source, target, args.docs, workdir, args.mcdc_arg)
        commands["verify"] = harness.show(argv)
        print(f"{verify.wall_s:.2f} s wall ({verify.own_s} s by its elapsed_s), {verify.docs_per_s:,} docs/s")

        harness.heading("Step 4: one pass of the embedded verifier (mcdc tail --verify, nothing to replay)")
        tail, embedded, argv = embedded_pass(source, target, base, args.docs, workdir, args.mcdc_arg)
        commands["tail --verify (pass)"] = harness.show(argv)
        print(
            f"pass 1: {tail.own_s:.2f} s by /progress, {tail.own_docs_per_s:,} docs/s; peak RSS {tail.peak_rss_mb} MB"
        )
        print(f"its log: {tail.note or '(no pass line found)'}")

        harness.heading(
            f"Step 5: a backlog of {args.events:,} updates on {DB}.{COLL}, replayed without and with --verify"
        )
        backlog = make_backlog(source, args.docs, args.events)
        print(
            f"made in {backlog.build_s:.1f} s: {backlog.runs:,} runs of up to {RUN_IDS} consecutive _ids, "
            f"{backlog.singles:,} single documents"
        )
        replays: list[Replay] = []
        for kind in REPLAYS:
            harness.heading(f"Step 5: replay of the backlog from a copy of the checkpoint: {kind}")
            print(f"target put back as the sync left it: {without_backlog(target, args.docs):,} documents changed")
            done, argv = replay(source, target, base, backlog, kind, workdir, args.mcdc_arg)
            commands[f"tail ({kind})"] = harness.show(argv)
            print(
                f"{done.steady_s:.2f} s from the first events applied, {done.events_per_s:,} events/s "
                f"({done.wall_s:.2f} s from start); peak RSS {done.peak_rss_mb} MB"
            )
            replays.append(done)
        return figures(sync, [cursors, verify, tail], embedded, backlog, replays, args, server, commands)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(
        parser, docs=(500_000, "documents to compare"), doc_size=200, events=(20_000, "update events in the backlog")
    )
    harness.add_server_options(parser)
    parser.error_if(lambda a: a.docs < 1 or a.events < 1, "--docs and --events must be at least 1")
    return harness.main("bench_verify", parser, argv, bench, print_report)


if __name__ == "__main__":
    sys.exit(main())
